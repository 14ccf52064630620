"""HTML's text runs (markup.py), read without a model: every byte of the markup kept in order,
what a browser shows translated and nothing else, and markup no end can be found for read in
time linear in its length (Python's html.parser reads it in quadratic time when asked to close)."""
import time

import pytest

from transformer.serve.markup import MarkupError, text_runs

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
