"""A request's text as the model reads it: sentences to translate, and everything around them kept
as it is (line and paragraph breaks, the spaces between sentences, HTML's markup).

A model here was trained on sentences: a paragraph given to it whole comes back as one run-on
translation that drops what does not fit. So a text is cut into lines, each line into sentences
by sentencex (Wikimedia's rule-based splitter: about 300 languages, its rules in the package, no
model and nothing downloaded; pysbd, the common alternative, has had no release since 2021), and
each sentence is translated alone, as the scheduler batches every other. Joined back, a text's
answer holds each sentence's own translation in its place. HTML (format "html") gives its text
runs to the same splitter (markup.py).
"""
import html
import io
import re
import time

_WORD = re.compile(r"[^\W_]")         # a letter or digit: something to translate


_SEGMENT = []


class TooMuch(Exception):
    """A file past what reading it may take (Budget): HTTP 413, the message says which bound. Not
    a ValueError: the parsers' own ValueErrors mean markup they cannot read (HTTP 400)."""


# runs (differently styled pieces of a paragraph's text) an office file may hold for each sentence
# the queue takes: Word cuts a run at each style and edit session, some words apart
RUNS_PER_SENTENCE = 64
# things a file's markup may be read as (tags, elements, comments, declarations, and the pieces a
# parser gives a text in) for each sentence the queue takes: 64 MiB of `<br/>`, of `<!---->` or of
# newlines in a docx's CDATA (some 13 million things each) held a file thread the whole 10 s; an
# ordinary page holds some tens a sentence, a styled Word run 5 to 9 elements
EVENTS_PER_SENTENCE = 256


class Budget:
    """What reading one uploaded file may take, checked as it is read, so that a file past it
    costs no more than the bound: at most `sentences` sentences and `chars` characters of them
    (what the queue takes: more is refused after reading anyway, and the subwords of a text of
    tens of megabytes took minutes), runs and markup in proportion to the sentences (runs, read),
    and `seconds` of reading (the server has two file threads; a 64 MiB e-book chapter of tags,
    150 s), counted from start(): a file waiting for a file thread is not reading yet. clock:
    time.monotonic, or a test's."""

    def __init__(self, sentences, chars, seconds, clock=time.monotonic):
        self.max_sentences, self.max_chars, self.seconds, self.clock = sentences, chars, seconds, clock
        self.deadline = None
        self.sentences = self.chars = self.held_runs = self.events = 0

    def start(self):
        self.deadline = self.clock() + self.seconds

    def sentence(self, text):
        self.sentences += 1
        self.chars += len(text)
        if self.sentences > self.max_sentences:
            raise TooMuch(f"the file holds more than {self.max_sentences} sentences; the queue takes at most "
                          f"{self.max_sentences} (--max-queue)")
        if self.chars > self.max_chars:
            raise TooMuch(f"the file's sentences hold more than {self.max_chars} characters, more than the queue's "
                          "pieces can hold (--max-queue)")

    def runs(self, n):
        """n more runs of an office file's paragraphs held (office.py; n < 0: given back): a
        paragraph of millions of them held some 150 bytes each within the 10 s."""
        self.held_runs += n
        if self.held_runs > RUNS_PER_SENTENCE * self.max_sentences:
            raise TooMuch(f"the file's paragraphs hold more than {RUNS_PER_SENTENCE * self.max_sentences} runs of text "
                          f"({RUNS_PER_SENTENCE} for each sentence the queue takes, --max-queue)")

    def read(self, n=1):
        """n more things read from a file's markup (a tag or element, a comment, a piece of text),
        and the clock checked: past EVENTS_PER_SENTENCE for each sentence the queue takes, refused."""
        self.events += n
        if self.events > EVENTS_PER_SENTENCE * self.max_sentences:
            raise TooMuch(f"the file's markup holds more than {EVENTS_PER_SENTENCE * self.max_sentences} tags, "
                          f"comments and pieces of text ({EVENTS_PER_SENTENCE} for each sentence the queue takes, "
                          "--max-queue)")
        self.check()

    def check(self):
        if self.deadline is not None and self.clock() > self.deadline:
            raise TooMuch(f"reading the file takes more than {self.seconds:g} s (what the server gives a file)")


def _segment():
    if not _SEGMENT:
        try:
            from sentencex import segment
        except ImportError:
            raise ImportError('transformer serve needs sentencex: pip install "transformer-cpu[serve]"') from None
        _SEGMENT.append(segment)
    return _SEGMENT[0]


class Document:
    """A text as parts kept verbatim and sentences: render(translations) puts each sentence's
    translation in its place. markup: the translations are escaped for HTML (&, <, >); xml: for
    XHTML, whose no-break space is &#160; (XML knows no &nbsp;). budget: what reading it may take
    (Budget), or None."""

    def __init__(self, markup=False, xml=False, budget=None):
        self.budget = budget
        self.parts = []             # str (kept as it is) or int (a sentence's index)
        self._kept = None           # what keep() gathers until the next sentence
        self.sentences = []
        self.markup = markup
        self.nbsp = "&#160;" if xml else "&nbsp;"

    def keep(self, raw):
        """raw kept as it is. What is kept between two sentences is written to one buffer and
        becomes one part at the next sentence (or render): adding each to the last part copied it
        whole, and a file of a million blank lines or tags took minutes (quadratic); a part each
        would hold some 60 bytes for every 3-byte tag."""
        if raw:
            if self._kept is None:
                self._kept = io.StringIO()
            self._kept.write(raw)

    def _close_kept(self):
        if self._kept is not None:
            self.parts.append(self._kept.getvalue())
            self._kept = None

    def add_text(self, text, language, segment=None, escape=False):
        """The sentences of a plain text, and the whitespace around them kept (escaped for HTML
        with escape: the text came unescaped from markup, and a no-break space is &nbsp; again)."""
        segment = segment or _segment()
        keep = (lambda raw: self.keep(_escape(raw, self.nbsp))) if escape else self.keep
        for line in _lines(text):
            if self.budget is not None:
                self.budget.check()
            if not line.strip():
                keep(line)
                continue
            for piece in segment(language, line):
                core = piece.strip()
                if not _WORD.search(core):      # nothing to translate: "", "&", "...", an emoji
                    keep(piece)
                    continue
                start = len(piece) - len(piece.lstrip())
                keep(piece[:start])
                self._close_kept()
                if self.budget is not None:
                    self.budget.sentence(core)
                self.parts.append(len(self.sentences))
                self.sentences.append(core)
                keep(piece[start + len(core):])

    def render(self, translations):
        """The text with sentence i replaced by translations[i]."""
        self._close_kept()
        if self.markup:
            translations = [_escape(t, self.nbsp) for t in translations]
        return "".join(part if isinstance(part, str) else translations[part] for part in self.parts)


def _lines(text):
    """The text's lines and line breaks in turn ("a\nb" -> "a", "\n", "b"), one at a time: a list
    of them all held 64 bytes for each line of a chapter of 32 million."""
    start = 0
    while True:
        end = text.find("\n", start)
        if end < 0:
            yield text[start:]
            return
        yield text[start:end]
        yield "\n"
        start = end + 1


def _escape(text, nbsp="&nbsp;"):
    """Text for HTML: &, < and > escaped, a no-break space as &nbsp; (or `nbsp`)."""
    return html.escape(text, quote=False).replace("\u00a0", nbsp)


def of_text(text, language):
    """A plain text's Document (language: the source's two-letter code, for the splitter's rules)."""
    document = Document()
    document.add_text(text, language)
    return document


def of_html(markup, language, xml=False, budget=None):
    """An HTML text's Document: the text of its elements split into sentences, every tag,
    attribute, entity and comment kept, and the elements that are not to be translated left as
    they are (markup.py). xml: XHTML (an e-book's chapter), a no-break space written &#160;."""
    from .markup import iter_runs

    document = Document(markup=True, xml=xml, budget=budget)
    segment = _segment()
    for raw, text in iter_runs(markup, None if budget is None else budget.read):
        if text is None or not text.strip():
            document.keep(raw)
        else:
            document.add_text(text, language, segment, escape=True)
    return document


def translate_documents(texts, language, translate, fmt="text"):
    """The server's answers to `texts` the offline way: each text cut into sentences as the server
    cuts it, translate(list of sentences) -> their translations (translate_texts), joined back.
    What the tests and the bench check every answer against."""
    documents = [of_html(text, language) if fmt == "html" else of_text(text, language) for text in texts]
    flat = [sentence for document in documents for sentence in document.sentences]
    translated, out, position = translate(flat) if flat else [], [], 0
    for document in documents:
        out.append(document.render(translated[position:position + len(document.sentences)]))
        position += len(document.sentences)
    return out
