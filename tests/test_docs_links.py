"""Every relative link in the user-facing Markdown resolves: the README, the guides in docs/, the
benchmarks' results page and its dated notes. A link names a file or folder of the checkout, and
an anchor (`#...`) names a heading of the file it points into (GitHub's rule for heading ids)."""

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted(
    [ROOT / "README.md", ROOT / "benchmarks" / "README.md"]
    + list((ROOT / "docs").glob("*.md"))
    + list((ROOT / "benchmarks" / "notes").glob("*.md"))
)

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~)")
INLINE_CODE = re.compile(r"`[^`\n]*`")


def prose(text):
    """The page without its fenced code blocks and inline code, where brackets are not links."""
    kept, fenced = [], False
    for line in text.split("\n"):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            kept.append("")
            continue
        kept.append("" if fenced else INLINE_CODE.sub("", line))
    return "\n".join(kept)


def heading_ids(path):
    """The ids GitHub gives a page's headings: lower case, punctuation dropped, spaces to
    hyphens, a repeated id numbered -1, -2, ..."""
    ids, seen, fenced = set(), {}, False
    for line in path.read_text(encoding="utf-8").split("\n"):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
        if fenced or not re.match(r"#{1,6} ", line):
            continue
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", line.lstrip("#").strip())
        slug = "".join(
            ch for ch in title.lower()
            if ch in " -_" or unicodedata.category(ch)[0] in "LN"
        ).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        ids.add(slug if n == 0 else f"{slug}-{n}")
    return ids


def broken_links(page):
    broken = []
    for target in LINK.findall(prose(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):      # http:, https:, mailto: ...
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in heading_ids(dest):
            broken.append(f"{target}: no heading with id {anchor!r}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = broken_links(page)
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


if __name__ == "__main__":
    failures = {str(p.relative_to(ROOT)): broken_links(p) for p in PAGES}
    for name, broken in failures.items():
        for b in broken:
            print(f"{name}: {b}")
    print(f"{len(PAGES)} pages, {sum(map(len, failures.values()))} broken links")
