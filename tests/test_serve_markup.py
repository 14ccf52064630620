"""HTML's text runs (markup.py), read without a model: every byte of the markup kept in order,
what a browser shows translated and nothing else, and markup no end can be found for read in
time linear in its length (Python's html.parser reads it in quadratic time when asked to close)."""
import time

import pytest

from transformer.serve.markup import FEED, MarkupError, iter_runs, text_runs

MALFORMED = ["<", "a < b", "x <", "<<<", "</", "</a", "</a b='", "<!", "<!--", "<!--x>", "<!-- -- ", "<?", "<?x",
             "<a", "<a b='", '<a b="c', "<a\nb", "<a/", "<!DOCTYPE", "<!x", "&", "&amp", "&#", "&#x", "fish &amp",
             "<script>var s = '<b>'", "<p>the cat</p><!-- the dog", "<>", "</>", "<b>the cat</b", "\n<\n<"]


def texts(markup):
    return [text for _, text in text_runs(markup) if text is not None]


@pytest.mark.parametrize("markup", MALFORMED + [m * 3 + "<p>the cat.</p>" + m for m in MALFORMED])
def test_the_runs_are_the_markup_byte_for_byte(markup):
    assert "".join(raw for raw, _ in text_runs(markup)) == markup


def test_a_construct_never_ended_is_kept_with_all_that_follows_it_as_a_browser_shows_nothing_of_it():
    assert texts("<p>the cat.</p><!-- the dog. <b>red tree</b>") == ["the cat."]
    assert texts("<p>the cat.</p><a title='x>the dog") == ["the cat."]
    assert texts("the cat </p") == ["the cat "]
    assert texts("<p>the cat.</p><!--x>the dog.") == ["the cat."]


def test_text_at_the_end_is_translated_and_its_references_read():
    assert texts("<p>the cat</p>fish &amp") == ["the cat", "fish &"]
    assert texts("AT&T") == ["AT&T"]
    assert texts("the cat.") == ["the cat."]
    assert texts("<b>a</b> &lt; b") == ["a", " < b"]


def test_a_script_never_closed_is_kept():
    assert texts("<p>a</p><script>var s = 'the cat';") == ["a"]
    assert texts("<p>a</p><style>p { color: red }") == ["a"]


def test_a_bare_less_than_inside_text_is_text():
    assert texts("<p>a < b and c <d</p>") == ["a < b and c "]
    assert texts("1 < 2") == ["1 < 2"]


@pytest.mark.parametrize("unit", ["<!--x>", "</", "<?", "<!", "<a b='", "<"])
def test_a_megabyte_of_constructs_never_ended_is_read_in_linear_time(unit):
    """A megabyte of `<!--x>`: 0.04 s here (Zen 3); close() searched the rest for each one's
    end, minutes. Bare `<`s: 2 s; joining the text by adding strings was quadratic, 20 s."""
    markup = unit * ((1 << 20) // len(unit))
    began = time.process_time()
    runs = text_runs(markup)
    assert time.process_time() - began < 8.0
    assert "".join(raw for raw, _ in runs) == markup


def test_markup_html_parser_gives_up_on_is_a_markup_error():
    with pytest.raises(MarkupError, match="html.parser cannot read it"):
        text_runs("<p>a<![foo[ x ]]>b</p>")


def test_runs_start_where_their_text_is_past_lines_of_any_length_and_number():
    """Offsets come from the parser's (line, column): lines counted on a block at a time, not
    from a table of every line's start (gigabytes for 64 million newlines)."""
    markup = ("<p>\n" * 70_000 + "<b>the cat</b><!--" + "x" * 200_000 + "-->\n<i>a &amp; b</i>" + "\n" * 3
              + "<p " + "\n" * 100_000 + ">red tree</p>")
    runs = text_runs(markup)
    assert "".join(raw for raw, _ in runs) == markup
    texts = [(raw, text) for raw, text in runs if text is not None and text.strip()]
    assert texts == [("the cat", "the cat"), ("a &amp; b", "a & b"), ("red tree", "red tree")]
    assert all(raw.startswith("<") or not raw.strip() for raw, text in runs if text is None)


def test_a_start_tag_past_a_mebibyte_is_refused_before_its_attributes_are_listed():
    """16 MB of `b=c ` in one tag held 3.3 GB as html.parser's list of pairs."""
    with pytest.raises(MarkupError, match="a start tag longer than 1048576 characters"):
        text_runs("<a " + "b=c " * (1 << 19) + ">t")
    image = '<img src="data:image/png;base64,' + "A" * 500_000 + '"><p>the cat</p>'
    assert texts(image) == ["the cat"]


def test_more_elements_open_at_once_than_max_open_are_refused_and_as_many_are_read(monkeypatch):
    """20 million `<b>` never closed held 1.1 GB of open elements within a file's 10 s."""
    from transformer.serve import markup

    assert markup.MAX_OPEN >= 1_000_000         # a long page's paragraphs without </p> stay open
    monkeypatch.setattr(markup, "MAX_OPEN", 1000)
    assert texts("<b>" * 1000 + "the cat") == ["the cat"]
    with pytest.raises(MarkupError, match="more than 1000 elements open at once"):
        text_runs("<p>" + "<b>" * 1000 + "the cat")
    closed = "<b>a</b>" * 1001 + "<br><img>" * 1001      # closed and void ones are not open
    assert len(texts(closed)) == 1001


def test_runs_are_given_as_the_markup_is_read_not_after():
    """A run is given once the next event starts: after the first piece, not the whole markup."""
    calls = []
    runs = iter_runs("<br/>" * 100_000, lambda: calls.append(1))
    assert next(runs) == ("<br/>", None)
    assert len(calls) <= FEED // 5 + 1, len(calls)          # one piece's tags
    assert sum(1 for _ in runs) == 100_000 - 1


def test_reading_a_chapter_of_tags_holds_memory_of_a_piece_not_of_its_tags():
    """Events and runs were held for the whole markup: about 45 bytes a byte of `<br/>` (some 200
    a tag), 11.4 MB traced for these 256 KiB (4.0 now); what is held now is the kept bytes and one piece's events."""
    import tracemalloc

    from transformer.serve.documents import of_html

    markup = "<br/>" * ((256 << 10) // 5)
    tracemalloc.start()
    try:
        document = of_html(markup, "en")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert document.render([]) == markup
    assert peak < 32 * len(markup), peak


def test_end_tags_of_elements_never_opened_are_read_in_linear_time():
    """`</i>` with 100,000 `<b>` open searched them all: quadratic (52 KB took 3 s)."""
    markup = "<b>" * 100_000 + "a" + "</i>" * 100_000 + "</b>" * 100_000 + "the cat"
    began = time.process_time()
    assert texts(markup) == ["a", "the cat"]
    assert time.process_time() - began < 8.0


def test_a_run_of_bare_less_thans_is_checked_as_it_grows():
    calls = []
    text_runs("<" * 100_000, lambda: calls.append(1))
    assert len(calls) >= 20


def _kept_merged(runs):
    out = []
    for raw, text in runs:
        if out and text is None and out[-1][1] is None:
            out[-1] = (out[-1][0] + raw, None)      # kept spans side by side: the same bytes kept
        else:
            out.append((raw, text))
    return out


@pytest.mark.parametrize("feed", [1, 3, 7])
def test_markup_fed_a_piece_at_a_time_reads_as_fed_whole(monkeypatch, feed):
    """The same runs to translate whatever the pieces (spans kept side by side may be cut
    differently; they are kept as they are either way)."""
    from transformer.serve import markup

    documents = MALFORMED + [
        '<!DOCTYPE html><p class="x" title="a>b">the big cat runs. a dog!<br><b>red &amp; tree</b></p>'
        '<!-- the dog --><script>var s = "</b>";</script><div translate="no">x <span translate="yes">y</span></div>',
        "<p>a < b &amp c &#x41;&nbsp;d</p><pre>kept</pre><textarea></textarea x>z",
    ]
    whole = [_kept_merged(text_runs(document)) for document in documents]
    monkeypatch.setattr(markup, "FEED", feed)
    assert [_kept_merged(text_runs(document)) for document in documents] == whole


def test_a_lines_offset_counted_on_from_the_last_is_the_tables():
    """Lines asked in order, some a few on (found one by one), some thousands on (counted in
    halves of a block), against a table of every line's start."""
    import random

    from transformer.serve.markup import _Runs

    rng = random.Random(0)
    markup = "".join(rng.choice(["\n", "a", "<b>", " " * 100, "\n" * 70, "\n" * 5000]) for _ in range(20_000))
    table = [0] + [i + 1 for i, ch in enumerate(markup) if ch == "\n"]
    runs, line = _Runs(markup), 1
    while line < len(table):
        assert runs._start_of(line) == table[line - 1], line
        line += rng.choice([0, 1, 2, 17, 65, 300, 4000, 70_000])
    block = "a" * 100 + "\n" * 100 + "b" * 10_000      # the block read holds just the newlines asked
    assert _Runs(block)._start_of(101) == 200
