"""Files as documents: a file's bytes read as a Document (documents.py) of sentences to translate and
everything else kept byte for byte, and the translated file written back. What POST /translate_file
and `transformer translate --file` share.

    .txt   every line's sentences translated; the line breaks (\\n or \\r\\n), blank lines and the
           spaces around sentences kept: the same number of lines
    .srt   SubRip: each cue's number and timing line kept byte for byte, its text lines read as one
           text (a sentence is often cut over two lines) and its translation written on one line
    .vtt   WebVTT: the header, NOTE, STYLE and REGION blocks, cue identifiers and timing lines (with
           their settings) kept; a cue's text as .srt's, its tags (<i>, <v Speaker>) kept as markup.py
           keeps HTML's
    .html  (.htm) the markup path of format "html" (markup.py)
    .docx, .pptx, .odt  each paragraph's text runs translated in place, every other byte of the
           archive's XML and every other member kept (office.py)
    .epub  each chapter (.xhtml, .html) through the markup path, every other member kept (office.py)

A file is UTF-8 (a byte order mark kept); anything else, a NUL byte, a subtitle file without a cue
timing, a WebVTT file without its WEBVTT line or HTML that html.parser cannot read is a FormatError
naming why (HTTP 400). A translation never adds a line: a line break the model writes is a space.
"""
import os
import re

from .documents import Document, _segment, of_html
from .markup import MarkupError, text_runs

FORMATS = (".txt", ".srt", ".vtt", ".html", ".htm", ".docx", ".pptx", ".odt", ".epub")
BOM = "\ufeff"
_LINE = re.compile(r"[^\n]*\n|[^\n]+")
_TIMING = re.compile(r"^\s*(?:\d+:)?\d{1,2}:\d{2}[,.]\d{1,3}\s*-->\s*(?:\d+:)?\d{1,2}:\d{2}[,.]\d{1,3}")


class FormatError(ValueError):
    """A file that is not what its name says (HTTP 400, the message says why)."""


def extension(name):
    """A file name's format: its extension, lower case, if it is one of FORMATS; else FormatError."""
    ext = os.path.splitext(name or "")[1].lower()
    if ext not in FORMATS:
        raise FormatError(f"file format {ext or '(no extension)'} is not supported (supported: {', '.join(FORMATS)})")
    return ext


class FileDocument:
    """A file as a Document: sentences to translate, render(translations) -> the translated file's bytes."""

    def __init__(self, document, bom):
        self.document, self.bom = document, bom

    @property
    def sentences(self):
        return self.document.sentences

    def text(self):
        """The sentences' text, one a line (what detection reads for source "auto")."""
        return "\n".join(self.document.sentences)

    def render(self, translations):
        flat = [" ".join(t.splitlines()) for t in translations]     # no line a translation adds
        return ((BOM if self.bom else "") + self.document.render(flat)).encode("utf-8")


def read(data, name, language, budget=None):
    """The FileDocument of a file's bytes `data` named `name` (its extension says its format), its
    text split by the rules of `language` (a two-letter code). budget: what reading it may take
    (documents.Budget: TooMuch past it), or None."""
    ext = extension(name)
    if not data:
        raise FormatError("the file is empty")
    if budget is not None:
        budget.start()
    if ext in (".docx", ".pptx", ".odt", ".epub"):
        from .office import OfficeDocument, OfficeError

        try:
            return OfficeDocument(data, ext, language, budget)
        except OfficeError as exc:
            raise FormatError(str(exc)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(f"the file is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None
    if "\x00" in text:
        raise FormatError("the file holds a NUL byte: not a text file")
    bom = text.startswith(BOM)
    text = text[1:] if bom else text
    if ext == ".txt":
        document = Document(budget=budget)
        document.add_text(text, language)
    elif ext in (".html", ".htm"):
        try:
            document = of_html(text, language, budget=budget)
        except MarkupError as exc:
            raise FormatError(f"the file is not HTML the server can read ({exc})") from None
    else:
        document = _subtitles(text, language, ext == ".vtt", budget)
    return FileDocument(document, bom)


def _subtitles(text, language, vtt, budget=None):
    """A .srt or .vtt file's Document: blocks are runs of non-blank lines; in a block with a timing
    line, what follows it is the cue's text; every other line is kept as it is."""
    lines = _LINE.findall(text)
    if vtt and not (lines and lines[0].startswith("WEBVTT") and lines[0][6:7] in ("", " ", "\t", "\r", "\n")):
        raise FormatError("the file is not WebVTT: its first line is not WEBVTT")
    document = Document(markup=vtt, budget=budget)
    segment = _segment()
    cues, block = 0, []
    for line in lines + [""]:
        if line.strip():
            block.append(line)
            continue
        timing = next((i for i, raw in enumerate(block) if "-->" in raw), None)
        if timing is None or not _TIMING.match(block[timing]) or (vtt and block[0].startswith(("NOTE", "WEBVTT"))):
            document.keep("".join(block))
        else:
            cues += 1
            document.keep("".join(block[:timing + 1]))
            _cue_text(document, block[timing + 1:], language, segment, vtt)
        document.keep(line)
        block = []
    if not cues:
        raise FormatError(f"the file is not {'WebVTT' if vtt else 'SubRip'}: no cue timing line "
                          "(00:00:01,000 --> 00:00:02,000)")
    return document


def _cue_text(document, lines, language, segment, markup):
    """A cue's text lines as one line of sentences (markup: VTT's tags kept), then the last line's end."""
    if not lines:
        return
    text = " ".join(line.strip() for line in lines)
    last = lines[-1]
    ending = last[len(last.rstrip("\r\n")):]
    if not markup:
        document.add_text(text, language, segment)
    else:
        try:
            runs = text_runs(text, None if document.budget is None else document.budget.read)
        except MarkupError as exc:
            raise FormatError(f"a cue's text cannot be read ({exc})") from None
        for raw, run in runs:
            if run is None or not run.strip():
                document.keep(raw)
            else:
                document.add_text(run, language, segment, escape=True)
    document.keep(ending)
