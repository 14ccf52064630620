"""Office files (.docx, .pptx, .odt) and e-books (.epub) as documents: the text of each paragraph
translated in place, every other byte of every XML part and every other member of the archive kept.
An e-book's chapters (XHTML) go through the markup path of format "html" (markup.py).

An office file is a zip of XML parts. In the parts that hold text (Word's document, headers,
footers and notes; PowerPoint's slides and notes; OpenDocument's content and styles) a paragraph
(w:p, a:p, text:p or text:h) holds its text in runs (w:t and a:t elements; OpenDocument's
character data, in text:span or not). expat reads each part and says where each run's text lies
in its bytes; only those bytes change, so tags, attributes, namespaces and styles stay as they
were. A paragraph's runs are read as one text, so a sentence cut by a bold word is translated as
one sentence (documents.py); its translation is spread back over the runs word by word, in
proportion to the runs' lengths (approximated: which words a style covers), the first run getting
what comes before its share.

A file is refused (FormatError: HTTP 400) when it is not a zip, lacks the part its format needs,
has more than MAX_MEMBERS members or more than MAX_UNPACKED bytes unpacked (a zip bomb: counted as
it is read, whatever the archive declares), or has a part that is not well-formed UTF-8 XML or
declares a DOCTYPE (entity expansion). An archive is held unpacked until its translation is
written; all the archives being translated at once hold at most UNPACKED_AT_ONCE bytes, and one
past what is left of it is refused (Busy: HTTP 503 with Retry-After), so that many small uploads
of 64 MB each unpacked cannot fill the server's memory.
"""
import html
import io
import re
import threading
import zipfile
from xml.parsers import expat

from .documents import Document, _segment, of_html
from .markup import MarkupError, Text

MAX_MEMBERS = 10_000
MAX_UNPACKED = 64 << 20          # bytes of every member together, unpacked
UNPACKED_AT_ONCE = 256 << 20     # bytes of every archive being translated, unpacked, all together
# elements nested deeper than this are refused: expat's stack and ours held 1.2 GB within a file's
# 10 s for 64 MiB of `<a>` never closed. libxml2 refuses past 256 unless told otherwise; an office
# file nests some tens deep.
MAX_DEPTH = 10_000

# (the parts translated (a pattern of names), the part that must be there, the paragraph
# elements, the text elements: None for every character data inside a paragraph)
KINDS = {
    ".docx": (re.compile(r"word/(document|header\d*|footer\d*|footnotes|endnotes)\.xml"), "word/document.xml",
              {"w:p"}, {"w:t"}),
    ".pptx": (re.compile(r"ppt/(slides/slide|notesSlides/notesSlide)\d+\.xml"), "ppt/presentation.xml",
              {"a:p"}, {"a:t"}),
    ".odt": (re.compile(r"(content|styles)\.xml"), "content.xml", {"text:p", "text:h"}, None),
    # an e-book's chapters are XHTML: the markup path (markup.py), its no-break space &#160;
    ".epub": (re.compile(r"(?i).+\.x?html?"), "META-INF/container.xml", None, None),
}
_WORDS = re.compile(r"\S+\s*|\s+")


class OfficeError(ValueError):
    pass


class Busy(RuntimeError):
    """The archives being translated hold UNPACKED_AT_ONCE bytes: this one waits for a retry."""


_held = [0]                     # bytes every OfficeDocument not yet released holds unpacked
_held_lock = threading.RLock()      # reentrant: a finalizer (__del__) may give back inside _hold


def _give(n):
    with _held_lock:
        _held[0] -= n


def held_unpacked():
    """Bytes the archives being translated hold unpacked now."""
    return _held[0]


def _hold(n, taken):
    """n more bytes held (fewer, for n < 0) by the archive whose count is taken[0]; Busy, nothing
    counted, when that passes UNPACKED_AT_ONCE."""
    with _held_lock:
        if n > 0 and _held[0] + n > UNPACKED_AT_ONCE:
            raise Busy(f"the files being translated hold {_held[0] >> 20} MiB unpacked, and this one "
                       f"would pass the {UNPACKED_AT_ONCE >> 20} MiB they may hold at once")
        _held[0] += n
    taken[0] += n


def _unpack(data):
    """[(ZipInfo, bytes)] of the archive, bounded (MAX_MEMBERS, MAX_UNPACKED), and its bytes counted
    as held (_hold; the caller gives them back): Busy past UNPACKED_AT_ONCE."""
    taken = [0]
    try:
        members = _read_members(data, taken)
    except BaseException:
        _give(taken[0])
        raise
    return members, taken[0]


def _read_members(data, taken):
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        infos = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise OfficeError(f"the file is not a zip archive ({str(exc)[:60]})") from None
    if len(infos) > MAX_MEMBERS:
        raise OfficeError(f"the archive has {len(infos)} members; at most {MAX_MEMBERS}")
    members, total = [], 0
    for info in infos:
        if info.file_size + total > MAX_UNPACKED:
            raise OfficeError(f"the archive unpacks to more than {MAX_UNPACKED} bytes (a zip bomb?)")
        _hold(info.file_size, taken)        # before reading: a refusal costs no unpacking
        try:
            with archive.open(info) as f:
                content = f.read(MAX_UNPACKED - total + 1)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError, RuntimeError) as exc:
            raise OfficeError(f"member {info.filename[:60]!r} cannot be read ({str(exc)[:60]})") from None
        total += len(content)
        if total > MAX_UNPACKED:
            raise OfficeError(f"the archive unpacks to more than {MAX_UNPACKED} bytes (a zip bomb?)")
        _hold(len(content) - info.file_size, taken)     # what the archive declared was not what it held
        members.append((info, content))
    return members


READ_AT_ONCE = 1 << 20           # bytes of a part expat reads before its finished paragraphs are given


def _paragraphs(xml, part, paragraph_tags, text_tags, check=None, held=None):
    """Each paragraph's runs [(start, end, text)], as byte offsets into `xml` and their text, in
    order, given as they are read (a megabyte at a time): a file of more paragraphs than the
    server takes is refused at the one past it, not after reading them all. check(n): told of n
    more things read, at each element (1), every 4096 other things (text, comments, instructions)
    and each megabyte (0); raises to stop the reading. held(n): told of n more runs held, or given
    back (n < 0) when a paragraph ends without text; raises to stop the reading."""
    if xml.startswith((b"\xff\xfe", b"\xfe\xff")) or re.match(rb"<\?xml[^>]*encoding=[\"'](?!utf-8)", xml, re.I):
        raise OfficeError(f"{part} is not UTF-8 XML")
    parser = expat.ParserCreate()
    paragraphs, stack, open_paragraphs = [], [], []
    run = []                # [start, Text] of the character data being read
    calls = [0]             # handler calls but the elements', for check(): 64 MiB of newlines in a
                            # w:t, or of comments, had no element to check at

    def checked():
        calls[0] += 1
        if check is not None and calls[0] % 4096 == 0:
            check(4096)

    def close(at):
        if run:
            start, text = run
            if open_paragraphs:
                paragraphs[open_paragraphs[-1]].append((start, at, text.value()))
                if held is not None:
                    held(1)
            run.clear()

    def start(tag, attrs):
        if check is not None:
            check(1)
        if len(stack) >= MAX_DEPTH:
            raise OfficeError(f"{part} nests elements more than {MAX_DEPTH} deep")
        close(parser.CurrentByteIndex)
        stack.append(tag)
        if tag in paragraph_tags:
            open_paragraphs.append(len(paragraphs))
            paragraphs.append([])

    def end(tag):
        close(parser.CurrentByteIndex)
        stack.pop()
        if tag in paragraph_tags:
            i = open_paragraphs.pop()
            if not any(text.strip() for _, _, text in paragraphs[i]):     # nothing to translate
                if held is not None and paragraphs[i]:
                    held(-len(paragraphs[i]))
                paragraphs[i] = []

    def data(text):
        checked()
        if not open_paragraphs or (text_tags is not None and (not stack or stack[-1] not in text_tags)):
            return
        if not run:
            run.extend([parser.CurrentByteIndex, Text(text)])
        else:
            run[1].add(text)

    def doctype(*_):
        raise OfficeError(f"{part} declares a DOCTYPE")

    def other(*_):
        checked()
        close(parser.CurrentByteIndex)

    parser.StartElementHandler, parser.EndElementHandler, parser.CharacterDataHandler = start, end, data
    parser.StartDoctypeDeclHandler = doctype
    parser.CommentHandler = parser.ProcessingInstructionHandler = other
    parser.StartCdataSectionHandler = parser.EndCdataSectionHandler = other
    given = 0                   # paragraphs before it are given (and dropped)
    for at in range(0, max(len(xml), 1), READ_AT_ONCE):
        if check is not None:
            check(0)
        try:
            parser.Parse(xml[at:at + READ_AT_ONCE], at + READ_AT_ONCE >= len(xml))
        except expat.ExpatError as exc:
            raise OfficeError(f"{part} is not well-formed XML ({exc})") from None
        finished = open_paragraphs[0] if open_paragraphs else len(paragraphs)  # in order: not past an open one
        for i in range(given, finished):
            runs, paragraphs[i] = paragraphs[i], None
            if runs:                # closed with text (end): the others were emptied
                yield runs
        given = finished


def spread(translation, lengths):
    """`translation` cut into len(lengths) pieces, word by word, in proportion to `lengths`."""
    if len(lengths) == 1:
        return [translation]
    words = _WORDS.findall(translation)
    total = sum(lengths) or 1
    pieces, taken, position, cumulative = [], 0, 0, 0
    for i, length in enumerate(lengths):
        cumulative += length
        goal = len(translation) * cumulative / total if i < len(lengths) - 1 else len(translation) + 1
        piece = []
        while taken < len(words) and position + len(words[taken]) / 2 <= goal:
            piece.append(words[taken])
            position += len(words[taken])
            taken += 1
        pieces.append("".join(piece))
    return pieces


class OfficeDocument:
    """An office file's paragraphs: sentences, and render(translations) -> the file's bytes."""

    def __init__(self, data, ext, language, budget=None):
        self.held = 0
        self.members, self.held = _unpack(data)
        try:
            self._read(ext, language, budget)
        except BaseException:
            self.release()
            raise

    def release(self):
        """Its unpacked members no longer counted as held (UNPACKED_AT_ONCE): once it is rendered."""
        held, self.held = self.held, 0
        _give(held)

    def __del__(self):
        self.release()

    def _read(self, ext, language, budget):
        pattern, needed, paragraph_tags, text_tags = KINDS[ext]
        names = {info.filename for info, _ in self.members}
        if needed not in names:
            raise OfficeError(f"the archive has no {needed}: not a {ext} file")
        segment = _segment()
        self.sentences, self.parts = [], {}       # part name -> [(runs, Document, first sentence)]
        for info, content in self.members:
            if not pattern.fullmatch(info.filename):
                continue
            if paragraph_tags is None:
                self.parts[info.filename] = self._xhtml(content, info.filename, language, budget)
                continue
            paragraphs = []
            check, held = (None, None) if budget is None else (budget.read, budget.runs)
            for runs in _paragraphs(content, info.filename, paragraph_tags, text_tags, check, held):
                document = Document(budget=budget)
                document.add_text("".join(text for _, _, text in runs).replace("\n", " "), language, segment)
                paragraphs.append((runs, document, len(self.sentences)))
                self.sentences += document.sentences
            self.parts[info.filename] = paragraphs

    def _xhtml(self, content, part, language, budget):
        """An e-book's chapter: (its Document, its first sentence's index)."""
        try:
            text = content.decode("utf-8")
            document = of_html(text, language, xml=True, budget=budget)
        except UnicodeDecodeError:
            raise OfficeError(f"{part} is not UTF-8") from None
        except MarkupError as exc:
            raise OfficeError(f"{part} is not HTML the server can read ({exc})") from None
        first = len(self.sentences)
        self.sentences += document.sentences
        return document, first

    def text(self):
        return "\n".join(self.sentences)

    def render(self, translations):
        flat = [" ".join(t.splitlines()) for t in translations]
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as archive:
            for info, content in self.members:
                paragraphs = self.parts.get(info.filename)
                if isinstance(paragraphs, tuple):
                    document, first = paragraphs
                    content = document.render(flat[first:first + len(document.sentences)]).encode("utf-8")
                elif paragraphs:
                    content = self._part(content, paragraphs, flat)
                archive.writestr(info, content)
        return out.getvalue()

    @staticmethod
    def _part(content, paragraphs, flat):
        edits = []
        for runs, document, first in paragraphs:
            translated = document.render(flat[first:first + len(document.sentences)])
            for (start, end, _), piece in zip(runs, spread(translated, [len(text) for _, _, text in runs])):
                edits.append((start, end, html.escape(piece, quote=False).encode("utf-8")))
        pieces, at = [], 0
        for start, end, replacement in sorted(edits):
            pieces += [content[at:start], replacement]
            at = end
        pieces.append(content[at:])
        return b"".join(pieces)
