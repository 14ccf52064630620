"""HTML's text runs, for format "html": the text between tags to translate, and the markup kept
byte for byte (tags with their attributes, entities, comments, the doctype).

Python's own html.parser reads the markup as browsers tokenise it (unclosed <p>, bare <, entities
without a semicolon); each event's start in the source (getpos) cuts the markup into raw spans,
so nothing is re-serialised. Left as they are, with what is inside them: <script>, <style>,
<code>, <pre>, <textarea>, any element with translate="no" (HTML's own attribute; translate="yes"
inside it translates again) or Google's class "notranslate". Attributes (title, alt) are not
translated, as LibreTranslate leaves them.
"""
from html.parser import HTMLParser

KEEP = frozenset(("script", "style", "code", "pre", "textarea", "kbd", "samp", "var"))
VOID = frozenset(("area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source",
                  "track", "wbr"))


class MarkupError(ValueError):
    """Markup html.parser cannot read: it gives up on some declarations (`<![foo[ ... ]]>` raises
    AssertionError in Python before 3.13), and such a text is the client's to fix (HTTP 400)."""


class _Runs(HTMLParser):
    def __init__(self, markup):
        super().__init__(convert_charrefs=True)
        self.lines = [0]
        for i, ch in enumerate(markup):
            if ch == "\n":
                self.lines.append(i + 1)
        self.events = []            # (start offset, translatable text or None)
        self.open = []              # (tag, translates) of the open elements

    def _offset(self):
        line, column = self.getpos()
        return self.lines[line - 1] + column

    def _translating(self):
        return self.open[-1][1] if self.open else True

    def handle_starttag(self, tag, attrs):
        self.events.append((self._offset(), None))
        if tag in VOID:
            return
        self.open.append((tag, self._translates(tag, dict(attrs))))

    def handle_startendtag(self, tag, attrs):
        self.events.append((self._offset(), None))

    def _translates(self, tag, attrs):
        if tag in KEEP:
            return False
        said = (attrs.get("translate") or "").strip().lower()
        if said in ("no", "yes"):
            return said == "yes"
        if "notranslate" in (attrs.get("class") or "").split():
            return False
        return self._translating()

    def handle_endtag(self, tag):
        self.events.append((self._offset(), None))
        for i in range(len(self.open) - 1, -1, -1):     # close it, and what was left open inside it
            if self.open[i][0] == tag:
                del self.open[i:]
                break

    def handle_data(self, data):
        translate = self._translating()
        if self.events and self.events[-1][1] is not None and translate:
            start, text = self.events[-1]               # text split by a bare "<": one run
            self.events[-1] = (start, text + data)
        else:
            self.events.append((self._offset(), data if translate else None))

    def _markup(self, *_):
        self.events.append((self._offset(), None))

    handle_comment = handle_decl = handle_pi = unknown_decl = _markup
    handle_entityref = handle_charref = _markup         # not called: convert_charrefs


def text_runs(markup):
    """[(raw, text)] covering `markup` in order: raw is the span of the source, text its
    unescaped text when it is to be translated, else None (kept as raw)."""
    parser = _Runs(markup)
    try:
        parser.feed(markup)
        parser.close()
    except (AssertionError, ValueError) as exc:    # the stdlib parser's ways of giving up
        raise MarkupError(f"html.parser cannot read it: {str(exc)[:80]}") from None
    events = parser.events
    runs = []
    for i, (start, text) in enumerate(events):
        end = events[i + 1][0] if i + 1 < len(events) else len(markup)
        if end > start:
            runs.append((markup[start:end], text))
    if events and events[0][0] > 0:
        runs.insert(0, (markup[:events[0][0]], None))
    if not events and markup:
        runs.append((markup, None))
    return runs
