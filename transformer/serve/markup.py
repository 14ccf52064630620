"""HTML's text runs, for format "html": the text between tags to translate, and the markup kept
byte for byte (tags with their attributes, entities, comments, the doctype).

Python's own html.parser reads the markup as browsers tokenise it (unclosed <p>, bare <, entities
without a semicolon); each event's start in the source (getpos) cuts the markup into raw spans,
so nothing is re-serialised. Only feed() reads it, a piece at a time, never close(): what feed
leaves unread is a construct never ended (a comment, tag or declaration without its end), kept as
it is (finish). Left as they are, with what is inside them: <script>, <style>, <code>, <pre>,
<textarea>, any element with translate="no" (HTML's own attribute; translate="yes" inside it
translates again) or Google's class "notranslate". Attributes (title, alt) are not translated, as
LibreTranslate leaves them.
"""
import collections
import html
import io
import re
from html.parser import HTMLParser

KEEP = frozenset(("script", "style", "code", "pre", "textarea", "kbd", "samp", "var"))
# Markup is fed a piece at a time, so that a start tag is seen growing: html.parser matches a whole
# tag's attributes with one regular expression, whose stack held 3.3 GB for 16 MB of `b=c `. One
# longer than MAX_TAG (an inline image's data URI fits) is refused.
FEED = 1 << 16
MAX_TAG = 1 << 20
_START_TAG = re.compile(r"<[a-zA-Z]")
# Elements open at once, past which markup is refused: 20 million `<b>` never closed held 1.1 GB of
# open elements within the 10 s a file is read. HTML's optional end tags (`<p>`, `<li>`, `<td>`
# without theirs) stay open here, so this counts a long page's unclosed paragraphs too: a million
# takes 3 MB of markup, more than --max-file-size, and e-books' XHTML closes them.
MAX_OPEN = 1_000_000
VOID = frozenset(("area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source",
                  "track", "wbr"))


class Text:
    """A text read in pieces, joined as it grows (a run of text between tags, an office run):
    held as a list, a million one-character pieces (newlines, bare `<`) took 8 bytes a character
    and more; joined every JOINED pieces into one buffer, about one. Adding to a string instead
    copied it each time: quadratic."""

    JOINED = 4096
    __slots__ = ("pieces", "buffer")

    def __init__(self, first):
        self.pieces, self.buffer = [first], None

    def add(self, piece):
        self.pieces.append(piece)
        if len(self.pieces) >= self.JOINED:
            if self.buffer is None:
                self.buffer = io.StringIO()
            self.buffer.write("".join(self.pieces))
            self.pieces.clear()

    def value(self):
        if self.buffer is None:
            return "".join(self.pieces)
        self.buffer.write("".join(self.pieces))     # not buffer + tail: one copy of the text fewer
        self.pieces.clear()
        return self.buffer.getvalue()


class MarkupError(ValueError):
    """Markup html.parser cannot read: it gives up on some declarations (`<![foo[ ... ]]>` raises
    AssertionError in Python before 3.13), and such a text is the client's to fix (HTTP 400)."""


class _Runs(HTMLParser):
    def __init__(self, markup, check=None):
        super().__init__(convert_charrefs=True)
        self.markup, self.check = markup, check
        self.line, self.line_start = 1, 0     # the last line an event was on, and its offset
        self.events = []            # (start offset, translatable Text or None)
        self.open = []              # (tag, translates) of the open elements
        self.opened = collections.Counter()   # tag -> how many of self.open

    def _offset(self):
        if self.check is not None:      # each event: a file's reading is bounded (documents.Budget)
            self.check()
        line, column = self.getpos()
        return (self.line_start if line == self.line else self._start_of(line)) + column

    def _start_of(self, line):
        """The offset of `line`'s first character, counted on from the last line asked (events
        come in order): a few lines on, found one by one; many, counted in halves of a block, so
        each character is read a bounded number of times. A table of every line's start held
        gigabytes for a chapter of 64 million newlines."""
        markup, k, at = self.markup, line - self.line, self.line_start
        while k > 64 and at < len(markup):
            end = min(at + min(64 * k, 1 << 20), len(markup))
            n = markup.count("\n", at, end)
            if n < k:                   # the line starts past this block
                k, at = k - n, end
                continue
            while k > 64 and end - at > 64:     # it starts in [at, end]: keep the half it starts in
                middle = (at + end) // 2
                n = markup.count("\n", at, middle)
                if n < k:
                    k, at = k - n, middle
                else:
                    end = middle
            break
        for _ in range(k):
            at = markup.index("\n", at) + 1
        self.line, self.line_start = line, at
        return at

    def _translating(self):
        return self.open[-1][1] if self.open else True

    def handle_starttag(self, tag, attrs):
        self.events.append((self._offset(), None))
        if tag in VOID:
            return
        if len(self.open) >= MAX_OPEN:
            raise MarkupError(f"more than {MAX_OPEN} elements open at once")
        self.open.append((tag, self._translates(tag, dict(attrs))))
        self.opened[tag] += 1

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
        if not self.opened[tag]:                        # not open: searching the open ones was quadratic
            return
        for i in range(len(self.open) - 1, -1, -1):     # close it, and what was left open inside it
            if self.open[i][0] == tag:
                for closed, _ in self.open[i:]:
                    self.opened[closed] -= 1
                del self.open[i:]
                break

    def handle_data(self, data):
        self._text(data, self._offset)

    def _text(self, data, offset):
        translate = self._translating()
        if self.events and self.events[-1][1] is not None and translate:
            # text split by a bare "<": one run, each piece checked (millions of bare "<")
            self.events[-1][1].add(data)
            if self.check is not None:
                self.check()
        else:
            self.events.append((offset(), Text(data) if translate else None))

    def finish(self, length):
        """What feed() left unread (rawdata) as events, in place of close(). feed leaves a construct
        whose end is nowhere after it (`<!--`, `<a b="`, `</a`, `<?`, `<!x` without their `-->` or
        `>`), and what follows it; close() would read it as text up to the next < or > and search the
        rest of the markup again for the next one's end: a megabyte of `<!--x>` took minutes
        (quadratic; Python's parser before its 2025 fixes, 3.11.7 here). HTML ends such a construct
        at the end of the document (the WHATWG tokenizer's EOF in a comment or a tag) and a browser
        shows nothing of it: so it is kept as it is, and what follows it. Text feed holds back (a
        character reference it may see cut at the end) is text; inside <script>, kept."""
        rest = self.rawdata
        if not rest:
            return
        if self.check is not None:
            self.check()
        start = length - len(rest)
        cut = rest.find("<")
        if cut != 0:
            if self.cdata_elem is not None:
                self.events.append((start, None))
                return
            self._text(html.unescape(rest if cut < 0 else rest[:cut]), lambda: start)
        if cut >= 0:
            self.events.append((start + cut, None))

    def _markup(self, *_):
        self.events.append((self._offset(), None))

    handle_comment = handle_decl = handle_pi = unknown_decl = _markup
    handle_entityref = handle_charref = _markup         # not called: convert_charrefs


def text_runs(markup, check=None):
    """[(raw, text)] covering `markup` in order: raw is the span of the source, text its
    unescaped text when it is to be translated, else None (kept as raw). check(): called at each
    tag, comment, declaration and piece of text read (documents.Budget.read counts them), raises
    to stop the reading."""
    return list(iter_runs(markup, check))


def iter_runs(markup, check=None):
    """text_runs' runs given as they are read, a piece (FEED) of the markup at a time: an event's
    run ends where the next one starts, so all but the last are given after each piece and
    dropped. Held as a list, each 5-byte tag of a 64 MiB chapter cost some 200 bytes (its event,
    then its run) within the 10 s a file is read."""
    parser = _Runs(markup, check)
    done = 0                        # the markup before it is given

    def given(final):
        nonlocal done
        events = parser.events
        last = len(events) if final else len(events) - 1     # the last one may still grow
        for i in range(last):
            start, text = events[i]
            events[i] = None        # its pieces not held while its run is read (a chapter's one text)
            end = events[i + 1][0] if i + 1 < len(events) else len(markup)
            if start > done:        # what comes before the first event
                yield markup[done:start], None
                done = start
            if end > done:
                run = (markup[done:end], None if text is None else text.value())
                text = None
                yield run
                done = end
        del events[:last]
        if final and done < len(markup):
            yield markup[done:], None

    try:
        at, size = 0, FEED
        while at < len(markup):
            piece = markup[at:at + size]
            parser.feed(piece)
            at += len(piece)
            held = len(parser.rawdata)      # what the parser waits on: a construct not ended yet
            if held > MAX_TAG and parser.cdata_elem is None and _START_TAG.match(parser.rawdata):
                raise MarkupError(f"a start tag longer than {MAX_TAG} characters")
            size = max(FEED, held)          # it reads what it holds again: pieces as large keep that linear
            yield from given(False)
    except MarkupError:
        raise
    except (AssertionError, ValueError) as exc:    # the stdlib parser's ways of giving up
        raise MarkupError(f"html.parser cannot read it: {str(exc)[:80]}") from None
    parser.finish(len(markup))
    yield from given(True)
