"""docs/cli.md shows every command's --help as the package prints it (at 100 columns): a flag added
or changed without the page fails here. Regenerate the page with
`python tests/test_docs_cli.py > docs/cli.md.new && mv docs/cli.md.new docs/cli.md`."""
import contextlib
import io
import os
import re
import sys

PAGE = os.path.join(os.path.dirname(__file__), "..", "docs", "cli.md")
BLOCK = re.compile(r"## `(transformer[^`]*)`\n\n```text\n.*?```\n", re.S)


def help_of(words):
    from transformer.cli import build_parser

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        build_parser().parse_args(words + ["--help"])
    return out.getvalue()


def regenerated(text):
    """The page with every ```text block under a `## `transformer ...`` heading replaced by that
    command's --help at COLUMNS=100."""
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        return BLOCK.sub(lambda m: f"## `{m.group(1)}`\n\n```text\n{help_of(m.group(1).split()[1:])}```\n", text)
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous


def test_the_command_line_page_is_every_commands_help():
    with open(PAGE, encoding="utf-8") as f:
        text = f.read()
    assert len(BLOCK.findall(text)) >= 10
    fresh = regenerated(text)
    assert fresh == text, ("docs/cli.md differs from --help: regenerate it with "
                           "`python tests/test_docs_cli.py > docs/cli.md.new && mv docs/cli.md.new docs/cli.md`")


if __name__ == "__main__":
    with open(PAGE, encoding="utf-8") as f:
        sys.stdout.write(regenerated(f.read()))
