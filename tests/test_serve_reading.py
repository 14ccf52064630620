"""What reading one uploaded file may take (documents.Budget): at most the queue's sentences and
characters, and FILE_READ_S seconds, checked as each format is read, so that a file past a bound
costs no more than the bound (an e-book of 64 MiB of tags had a file thread for 150 s, a text of
three million sentences for 10 s before its 413). And a large request's subwords are cut off the
loop. The tiny model of test_serve.py serves the server's cases."""
import threading

import pytest

aiohttp = pytest.importorskip("aiohttp", reason='needs the [serve] extra: pip install ".[serve]"')

from test_serve import model_dir  # noqa: E402,F401
from test_serve_files import _zip  # noqa: E402
from test_serve_fuzzed import _upload_form, serving  # noqa: E402
from transformer.serve.documents import Budget, TooMuch  # noqa: E402
from transformer.serve.formats import read  # noqa: E402

W = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'


def _docx(body):
    return _zip({"[Content_Types].xml": "<Types/>", "word/document.xml": f"<w:document {W}><w:body>{body}</w:body></w:document>"})


def _epub(chapter):
    return _zip({"META-INF/container.xml": "<container/>", "OEBPS/c1.xhtml": chapter})


def _srt(cues):
    return "".join(f"{i + 1}\n00:00:01,000 --> 00:00:02,000\n{cue}\n\n" for i, cue in enumerate(cues)).encode()


def _vtt(cues):
    return b"WEBVTT\n\n" + _srt(cues)


# a file of n sentences in each format, and the name that says its format
FILES = {
    "a.txt": lambda n: "\n".join(["the cat runs."] * n).encode(),
    "a.html": lambda n: "".join(["<p>the cat runs.</p>"] * n).encode(),
    "a.srt": lambda n: _srt(["the cat runs."] * n),
    "a.vtt": lambda n: _vtt(["the cat runs."] * n),
    "a.docx": lambda n: _docx("".join(["<w:p><w:r><w:t>the cat runs.</w:t></w:r></w:p>"] * n)),
    "a.epub": lambda n: _epub("<html><body>" + "".join(["<p>the cat runs.</p>"] * n) + "</body></html>"),
}


class Ticks:
    """A clock that moves a second each time it is read: a budget of s seconds allows some s
    checks, whatever the machine's speed."""

    def __init__(self):
        self.now = 0

    def __call__(self):
        self.now += 1
        return self.now


@pytest.mark.parametrize("name", FILES)
def test_each_format_stops_at_the_sentence_past_the_queue(name):
    assert len(read(FILES[name](8), name, "en", Budget(8, 10 ** 6, 10 ** 6)).sentences) == 8
    with pytest.raises(TooMuch, match=r"more than 8 sentences; the queue takes at most 8 \(--max-queue\)"):
        read(FILES[name](9), name, "en", Budget(8, 10 ** 6, 10 ** 6))


@pytest.mark.parametrize("name", FILES)
def test_each_format_stops_at_the_characters_past_the_bound(name):
    read(FILES[name](4), name, "en", Budget(100, 4 * len("the cat runs."), 10 ** 6))
    with pytest.raises(TooMuch, match=r"sentences hold more than 51 characters, more than the queue.s pieces can hold"):
        read(FILES[name](4), name, "en", Budget(100, 4 * len("the cat runs.") - 1, 10 ** 6))


@pytest.mark.parametrize("name", FILES)
def test_each_format_checks_the_clock_as_it_reads(name):
    """A budget of 50 ticks: a file of 200 sentences (lines, tags, cues, elements) is past it."""
    assert len(read(FILES[name](2), name, "en", Budget(10 ** 4, 10 ** 6, 50, clock=Ticks())).sentences) == 2
    with pytest.raises(TooMuch, match="reading the file takes more than 50 s"):
        read(FILES[name](200), name, "en", Budget(10 ** 4, 10 ** 6, 50, clock=Ticks()))


@pytest.mark.parametrize("name, data", [("a.epub", _epub("<b>" * 1000)), ("a.html", b"<b>" * 1000),
                                        ("a.docx", _docx("<w:p/>" * 1000)),
                                        ("a.epub", _epub("<" * 300_000)),     # one run of text
                                        ("a.docx", _docx("<w:p><w:t>" + "\n" * 300_000 + "</w:t></w:p>")),
                                        ("a.docx", _docx("<!---->" * 300_000)),
                                        ("a.docx", _docx("<?x?>" * 300_000))])
def test_markup_without_a_sentence_is_bounded_by_the_clock(name, data):
    """Tags, elements, text, comments and instructions each count: 64 MiB of newlines in one
    w:t, without an element, was read for 21 s."""
    with pytest.raises(TooMuch, match="takes more than 50 s"):
        read(data, name, "en", Budget(10 ** 4, 10 ** 6, 50, clock=Ticks()))


def test_the_clock_starts_when_reading_starts_not_when_the_budget_is_made():
    clock = Ticks()
    budget = Budget(10 ** 4, 10 ** 6, 5, clock=clock)
    clock.now = 10 ** 6                     # a file waited for a file thread
    assert budget.check() is None
    read(b"the cat runs.", "a.txt", "en", budget)


def test_a_file_past_the_bounds_is_413_on_the_server_and_the_server_goes_on(model_dir, caplog, monkeypatch):
    """An e-book chapter of a million tags (3 MB unpacked, a 10 KB upload) read for 0.3 s, not
    the 7 s it takes; a text of 5,000 sentences refused at the 4,097th, not after the last."""
    from transformer.serve import app as app_module
    from transformer.serve import office

    monkeypatch.setattr(app_module, "FILE_READ_S", 0.3)
    tags = _epub("<html><body>" + "<b>" * 1_000_000 + "</body></html>")
    lines = "\n".join(["the cat runs."] * 5000).encode()

    async def calls(client, port):
        answers = []
        for data, name in ((tags, "a.epub"), (lines, "a.txt"), (b"red cat.", "a.txt")):
            response = await client.post("/translate_file", data=_upload_form(data, name))
            answers.append((response.status, await response.json()))
        return answers
    (slow, slow_body), (many, many_body), (fine, _) = serving(model_dir, calls, caplog)
    assert slow == 413 and slow_body["error"] == "file: reading the file takes more than 0.3 s (what the server gives a file)"
    assert office.held_unpacked() == 0      # the refused e-book's unpacked bytes given back
    assert many == 413 and "more than 4096 sentences; the queue takes at most 4096 (--max-queue)" in many_body["error"]
    assert fine == 200


def test_a_large_request_is_cut_into_sentences_and_subwords_off_the_loop_and_a_small_one_on_it(model_dir, caplog,
                                                                                                 monkeypatch):
    """Cutting a megabyte into subwords took the loop a second and a half, every other request
    waiting; into sentences, one more second."""
    from transformer.serve import app as app_module
    from transformer.serve.scheduler import Scheduler

    on_loop = []                    # (what, characters, on the loop's thread)
    pieces, of_text = Scheduler.pieces, app_module.of_text

    def spied_pieces(self, name, texts):
        on_loop.append(("subwords", sum(map(len, texts)), threading.current_thread() is threading.main_thread()))
        return pieces(self, name, texts)

    def spied_of_text(text, language):
        on_loop.append(("sentences", len(text), threading.current_thread() is threading.main_thread()))
        return of_text(text, language)
    monkeypatch.setattr(Scheduler, "pieces", spied_pieces)
    monkeypatch.setattr(app_module, "of_text", spied_of_text)
    monkeypatch.setattr(app_module, "OFF_LOOP_CHARS", 200)
    small, big = "the red cat runs.", " ".join(["the red cat runs."] * 20)

    async def calls(client, port):
        answers = []
        for q in (small, big):
            response = await client.post("/translate", json={"q": q, "source": "eng", "target": "spa"})
            answers.append((response.status, await response.json()))
        return answers
    answers = serving(model_dir, calls, caplog, max_queue=64)
    assert [status for status, _ in answers] == [200, 200], answers
    assert on_loop == [("sentences", len(small), True), ("subwords", len(small), True),
                       ("sentences", len(big), False), ("subwords", len(big) - 19, False)], on_loop


def test_a_docx_of_too_many_paragraphs_is_refused_at_the_one_past_the_queue_not_after_the_last(monkeypatch):
    """expat read the whole part before a paragraph was counted: 25 s for 1.8 million of them."""
    from transformer.serve import office

    monkeypatch.setattr(office, "READ_AT_ONCE", 4096)
    clock = Ticks()
    data = FILES["a.docx"](10_000)          # 40,000 elements
    with pytest.raises(TooMuch, match="more than 8 sentences"):
        read(data, "a.docx", "en", Budget(8, 10 ** 6, 10 ** 9, clock=clock))
    assert clock.now < 1000, clock.now      # the elements read: the first 4 KiB's, not the 40,000


@pytest.mark.parametrize("at_once", [1, 2, 3, 5, 7, 64])
def test_paragraphs_read_a_piece_at_a_time_are_those_read_at_once(monkeypatch, at_once):
    """Nested paragraphs given in order, byte offsets counted across the pieces, a character of
    several bytes cut between two pieces."""
    from transformer.serve import office

    xml = (f"<w:document {W}><w:body><w:p><w:t>é outer </w:t><w:p><w:t>inner ü</w:t></w:p><w:t>tail ✓</w:t></w:p>"
           "<w:p/><w:p><w:t>next</w:t></w:p></w:body></w:document>").encode()
    whole = [[(xml.index("é outer".encode()), xml.index(b"</w:t><w:p>"), "é outer "),
              (xml.index(b"tail"), xml.index("tail ✓".encode()) + len("tail ✓".encode()), "tail ✓")],
             [(xml.index(b"inner"), xml.index(b"inner") + len("inner ü".encode()), "inner ü")],
             [(xml.index(b"next"), xml.index(b"next") + 4, "next")]]
    monkeypatch.setattr(office, "READ_AT_ONCE", at_once)
    assert list(office._paragraphs(xml, "word/document.xml", {"w:p"}, {"w:t"})) == whole


def test_a_docx_nesting_elements_past_max_depth_is_refused_as_it_is_read_and_as_deep_is_read():
    """expat's stack and ours held 1.2 GB within 10 s for 64 MiB of `<a>` never closed."""
    from transformer.serve.formats import FormatError
    from transformer.serve.office import MAX_DEPTH

    deep = MAX_DEPTH - 3            # inside w:document, w:body and w:p
    body = "<w:p><w:r><w:t>the cat runs.</w:t></w:r>" + "<a>" * deep + "</a>" * deep + "</w:p>"
    assert read(_docx(body), "a.docx", "en").sentences == ["the cat runs."]
    clock = Ticks()
    with pytest.raises(FormatError, match=f"word/document.xml nests elements more than {MAX_DEPTH} deep"):
        read(_docx("<w:p>" + "<a>" * (40 * MAX_DEPTH)), "a.docx", "en", Budget(100, 10 ** 6, 10 ** 9, clock=clock))
    assert clock.now < MAX_DEPTH + 10, clock.now    # refused at the one past, not at the part's end


def test_an_e_book_chapter_of_more_elements_open_than_max_open_is_refused(monkeypatch):
    from transformer.serve import markup
    from transformer.serve.formats import FormatError

    monkeypatch.setattr(markup, "MAX_OPEN", 1000)
    with pytest.raises(FormatError, match="more than 1000 elements open at once"):
        read(_epub("<b>" * 1001 + "the cat runs."), "a.epub", "en")


def test_a_docx_holding_more_runs_than_the_queue_allows_is_refused_as_it_is_read(monkeypatch):
    """A paragraph of millions of runs held some 150 bytes each within the 10 s; runs are now
    bounded by 64 for each sentence the queue takes, those of paragraphs without text given back."""
    from transformer.serve import documents

    assert documents.RUNS_PER_SENTENCE == 64
    monkeypatch.setattr(documents, "EVENTS_PER_SENTENCE", 10 ** 6)     # the runs' bound, not the events'
    runs = lambda n, text: "<w:p>" + f"<w:r><w:t>{text}</w:t></w:r>" * n + "</w:p>"   # noqa: E731
    budget = Budget(8, 10 ** 6, 10 ** 9)                        # 512 runs
    assert read(_docx(runs(512, "x")), "a.docx", "en", budget).sentences == ["x" * 512]
    blank = runs(10, " ") * 100                                 # 1,000 runs, none of them held
    budget = Budget(8, 10 ** 6, 10 ** 9)
    assert read(_docx(blank + runs(500, "x")), "a.docx", "en", budget).sentences == ["x" * 500]
    assert budget.held_runs == 500
    with pytest.raises(TooMuch, match=r"more than 512 runs of text \(64 for each sentence the queue takes"):
        read(_docx(runs(513, "x")), "a.docx", "en", Budget(8, 10 ** 6, 10 ** 9))
    with pytest.raises(TooMuch, match="more than 512 runs"):
        read(_docx(runs(300, "x") + runs(300, "y")), "a.docx", "en", Budget(8, 10 ** 6, 10 ** 9))


def test_a_run_of_a_million_pieces_is_held_about_as_its_characters_not_as_a_list_of_them():
    """expat gives a w:t's newlines one at a time (as html.parser gives bare `<`): a list of them
    held 8 bytes a character and more (64 MiB of them in a docx: some 512 MB)."""
    import tracemalloc

    from transformer.serve import office
    from transformer.serve.markup import Text

    n = 1_000_000
    xml = f"<w:document {W}><w:body><w:p><w:r><w:t>a" + "\n" * n + "b</w:t></w:r></w:p></w:body></w:document>"
    tracemalloc.start()
    try:
        paragraphs = list(office._paragraphs(xml.encode(), "word/document.xml", {"w:p"}, {"w:t"}))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert paragraphs == [[(xml.index("a\n"), xml.index("</w:t>"), "a" + "\n" * n + "b")]]
    assert peak < 5 * n, peak                   # a list: 10.5 MB
    text = Text("é")
    for piece in ["a", "\n", "✓"] * 10_000:
        text.add(piece)
    assert text.value() == "é" + "a\n✓" * 10_000


# Uploads that are nothing but things to read, each some ten times past 256 for each of 8 sentences
# (2,048): 64 MiB of any of these held a file thread for the whole 10 s before its 413 (some 13
# million tags, comments or text pieces), where a bound on what is read refuses it at the one past.
MANY = 20_000
READ_IN_PIECES = {
    "html: <br/>": ("a.html", ("<br/>" * MANY).encode()),
    "html: bare <": ("a.html", ("<p>a" + "< " * (MANY // 2)).encode()),      # two pieces each
    "epub: <!---->": ("a.epub", _epub("<html><body>" + "<!---->" * MANY + "</body></html>")),
    "vtt: a cue of <b>": ("a.vtt", _vtt(["<b>" * MANY + "the cat runs."])),
    "docx: <a/>": ("a.docx", _docx("<w:p>" + "<a/>" * MANY + "</w:p>")),
    "docx: CDATA newlines in a w:t": ("a.docx",
                                      _docx("<w:p><w:r><w:t><![CDATA[" + "\n" * MANY + "]]></w:t></w:r></w:p>")),
}


@pytest.mark.parametrize("upload", READ_IN_PIECES)
def test_a_file_of_more_tags_comments_or_text_pieces_than_256_a_sentence_is_refused_as_it_is_read(upload):
    from transformer.serve.documents import EVENTS_PER_SENTENCE

    assert EVENTS_PER_SENTENCE == 256
    name, data = READ_IN_PIECES[upload]
    clock = Ticks()
    with pytest.raises(TooMuch, match=r"the file's markup holds more than 2048 tags, comments and pieces of text "
                                      r"\(256 for each sentence the queue takes, --max-queue\)"):
        read(data, name, "en", Budget(8, 10 ** 6, 10 ** 9, clock=clock))
    assert clock.now < 2100, clock.now              # checks: refused at the one past, not at the file's end
    # within the bound (at 256 x 128 = 32,768), the same kinds of things are read
    sentences = {"html: bare <": ["a" + ("< " * (MANY // 2)).rstrip()], "vtt: a cue of <b>": ["the cat runs."]}
    assert read(data, name, "en", Budget(128, 10 ** 6, 10 ** 9)).sentences == sentences.get(upload, [])


def test_a_page_of_tags_and_text_within_256_a_sentence_is_read_whole():
    """An ordinary page holds some tens of tags a sentence: 8 sentences of 62 tags each (a cell, a
    link, bold, 28 empty spans) are read whole at a budget of 8 sentences (2,048 things)."""
    sentence = "<td><a href='x'><b>the cat runs.</b></a></td>" + "<span></span>" * 28
    page = ("<table><tr>" + sentence * 8 + "</tr></table>").encode()
    assert read(page, "a.html", "en", Budget(8, 10 ** 6, 10 ** 9)).sentences == ["the cat runs."] * 8


def test_a_file_of_more_markup_than_the_queue_allows_is_413_on_the_server(model_dir, caplog):
    """The bound counts 256 things a sentence of the server's own --max-queue: at 64, 16,384. A
    chapter of 20,000 `<br/>` is refused with the message; one of 10,000, read and answered."""
    many, few = (_epub("<html><body>" + "<br/>" * n + "<p>red cat.</p></body></html>") for n in (20_000, 10_000))

    async def calls(client, port):
        answers = []
        for data in (many, few):
            response = await client.post("/translate_file", data=_upload_form(data, "a.epub"))
            answers.append((response.status, await response.json()))
        return answers
    (refused, body), (fine, _) = serving(model_dir, calls, caplog, max_queue=64)
    assert refused == 413 and body["error"] == (
        "file: the file's markup holds more than 16384 tags, comments and pieces of text "
        "(256 for each sentence the queue takes, --max-queue)"), body
    assert fine == 200
