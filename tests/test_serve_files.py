"""Files as LibreTranslate translates them (issue 59): POST /translate_file and GET /download_file
for .txt, .srt, .vtt and .html, and `transformer translate --file` offline. The layout is kept
(the same lines, the same cue numbers and timings byte for byte, the markup), each sentence is its
offline translation, and whatever is malformed is a 4xx naming why, the server answering after."""
import asyncio
import io
import os
import re
import socket
import subprocess
import sys
import zipfile

import pytest

aiohttp = pytest.importorskip("aiohttp", reason='needs the [serve] extra: pip install ".[serve]"')

from test_serve import OUTSIDE, Running, _keys_file, model_dir, offline  # noqa: E402,F401

MAX_FILE = 200_000


@pytest.fixture(scope="module")
def server(model_dir):
    running = Running("--model", model_dir, "--api-keys", _keys_file(model_dir), "--max-file-size", str(MAX_FILE))
    yield running
    running.stop()


def _zip(members):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for name, content in members.items():
            archive.writestr(name, content)
    return buffer.getvalue()


def upload(url, name, data, fields=None, api_key="secret-1"):
    """(status, JSON body) of POST /translate_file with `data` as the file `name`."""
    async def go():
        form = aiohttp.FormData()
        for key, value in {"source": "en", "target": "es", **({"api_key": api_key} if api_key else {}),
                           **(fields or {})}.items():
            if value is not None:
                form.add_field(key, value)
        if name is not None:
            form.add_field("file", data, filename=name, content_type="application/octet-stream")
        async with aiohttp.ClientSession() as session:
            async with session.post(url + "/translate_file", data=form) as response:
                return response.status, await response.json(content_type=None)
    return asyncio.run(go())


def get(url):
    async def go():
        async with aiohttp.ClientSession() as session:
            async with session.get(url) as response:
                return response.status, await response.read()
    return asyncio.run(go())


def translated_file(server, name, data):
    status, body = upload(server.url, name, data)
    assert status == 200, body
    assert body["translatedFileUrl"].startswith(server.url + "/download_file/")
    status, content = get(body["translatedFileUrl"])
    assert status == 200
    return content


# Each format's file, and its expected translation built here from offline translations of the
# sentences (the test model's sentences have no punctuation: a line, a cue or a text run is one).
def _txt(t):
    lines = ["the big cat", "", "red tree", "  blue dog runs", "", "", "a"]
    data = "\r\n".join(lines) + "\r\n"
    want = "\r\n".join((line[:len(line) - len(line.lstrip())] + t(line.strip())) if line else "" for line in lines)
    return data, want + "\r\n"


def _srt(t):
    data = ("1\n00:00:01,000 --> 00:00:02,500\nthe small dog\nsleeps\n\n"
            "2\n00:00:03,000 --> 00:00:04,120\nred house\n\n"
            "3\n00:01:00,000 --> 00:01:02,000\na cat runs\n")
    want = ("1\n00:00:01,000 --> 00:00:02,500\n" + t("the small dog sleeps") + "\n\n"
            "2\n00:00:03,000 --> 00:00:04,120\n" + t("red house") + "\n\n"
            "3\n00:01:00,000 --> 00:01:02,000\n" + t("a cat runs") + "\n")
    return data, want


def _vtt(t):
    head = "WEBVTT - a test\n\nNOTE not translated\n\n"
    data = (head + "intro\n00:01.000 --> 00:02.000 align:start position:10%\n<i>the big tree</i> sleeps\n\n"
            "00:03.000 --> 00:04.000\nblue cat\nruns\n")
    want = (head + "intro\n00:01.000 --> 00:02.000 align:start position:10%\n<i>" + t("the big tree") + "</i> "
            + t("sleeps") + "\n\n00:03.000 --> 00:04.000\n" + t("blue cat runs") + "\n")
    return data, want


def _html(t):
    data = '<html><body><p title="a cat">the big cat</p>\n<ul><li>red tree</li></ul><code>a dog</code></body></html>'
    want = ('<html><body><p title="a cat">' + t("the big cat") + "</p>\n<ul><li>" + t("red tree")
            + "</li></ul><code>a dog</code></body></html>")
    return data, want


FORMATS = {"story.txt": _txt, "film.srt": _srt, "film.vtt": _vtt, "page.html": _html}

# Office files, made here with zipfile: (name, translated parts, the paragraphs' runs, the text
# element's tag or None for OpenDocument's character data)
W = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'
A = 'xmlns:a="http://schemas.openxmlformats.org/drawingml/2006/main"'
T = 'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0"'
BOLD = ' b="1"'
PARAGRAPHS = [["the big ", "cat", " runs"], ["red tree"], ["a ", "small dog", " sleeps"]]


def _office(kind):
    """(file bytes, {part: xml}) of a small .docx, .pptx or .odt holding PARAGRAPHS, a style on
    each paragraph's second run, an image and an empty paragraph."""
    if kind == ".docx":
        paragraph = lambda runs: "<w:p><w:pPr><w:jc w:val=\"left\"/></w:pPr>" + "".join(
            f'<w:r>{"<w:rPr><w:b/></w:rPr>" if i == 1 else ""}<w:t xml:space="preserve">{run}</w:t></w:r>'
            for i, run in enumerate(runs)) + "</w:p>"
        part, xml = "word/document.xml", (f'<?xml version="1.0" encoding="UTF-8"?>\n<w:document {W}><w:body>'
                                          + "".join(map(paragraph, PARAGRAPHS)) + "<w:p/></w:body></w:document>")
        extra = {"[Content_Types].xml": "<Types/>", "word/styles.xml": f"<w:styles {W}><w:t>kept</w:t></w:styles>"}
    elif kind == ".pptx":
        paragraph = lambda runs: "<a:p>" + "".join(
            f'<a:r><a:rPr lang="en-US"{BOLD if i == 1 else ""}/><a:t>{run}</a:t></a:r>'
            for i, run in enumerate(runs)) + "</a:p>"
        part = "ppt/slides/slide1.xml"
        xml = (f'<?xml version="1.0" encoding="UTF-8"?>\n<p:sld {A} xmlns:p="http://schemas.openxmlformats.org/'
               'presentationml/2006/main"><p:txBody>' + "".join(map(paragraph, PARAGRAPHS))
               + "<a:p/></p:txBody></p:sld>")
        extra = {"[Content_Types].xml": "<Types/>", "ppt/presentation.xml": "<p:presentation/>"}
    else:
        paragraph = lambda runs: '<text:p text:style-name="P1">' + "".join(
            f'<text:span text:style-name="T1">{run}</text:span>' if i == 1 else run
            for i, run in enumerate(runs)) + "</text:p>"
        part = "content.xml"
        xml = (f'<?xml version="1.0" encoding="UTF-8"?>\n<office:document-content {T} xmlns:office="urn:oasis:'
               'names:tc:opendocument:xmlns:office:1.0"><office:body>' + "".join(map(paragraph, PARAGRAPHS))
               + "<text:p/></office:body></office:document-content>")
        extra = {"mimetype": "application/vnd.oasis.opendocument.text", "META-INF/manifest.xml": "<manifest/>"}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in {**extra, part: xml, "media/image1.png": b"\x89PNG\r\n\x1a\n" + bytes(range(256))}.items():
            archive.writestr(name, content)
    return buffer.getvalue(), part


def _texts(xml, kind):
    """Each paragraph's text, as its runs hold it."""
    if kind == ".odt":
        return [re.sub(r"<[^>]*>", "", p) for p in re.findall(r"<text:p[^>/]*>(.*?)</text:p>", xml)]
    tag = "w" if kind == ".docx" else "a"
    return ["".join(re.findall(rf"<{tag}:t[^>]*>([^<]*)</{tag}:t>", p))
            for p in re.findall(rf"<{tag}:p>(.*?)</{tag}:p>", xml)]


@pytest.mark.parametrize("kind", [".docx", ".pptx", ".odt"])
def test_office_files_keep_every_byte_but_their_text(server, model_dir, tmp_path, kind):
    data, part = _office(kind)
    got = translated_file(server, "report" + kind, data)
    source = tmp_path / ("report" + kind)
    source.write_bytes(data)
    out = tmp_path / ("out" + kind)
    done = subprocess.run([sys.executable, "-m", "transformer", "translate", "--model", model_dir, "--threads", "1",
                           "--file", str(source), "--out", str(out)], capture_output=True, text=True, timeout=120,
                          cwd=OUTSIDE)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == got
    before, after = zipfile.ZipFile(io.BytesIO(data)), zipfile.ZipFile(io.BytesIO(got))
    assert after.namelist() == before.namelist()
    for name in before.namelist():
        if name != part:
            assert after.read(name) == before.read(name), name
    old, new = before.read(part).decode(), after.read(part).decode()
    assert re.sub(r">[^<]*<", "><", new) == re.sub(r">[^<]*<", "><", old)      # only text changed
    sentences = ["".join(runs) for runs in PARAGRAPHS]
    assert _texts(new, kind) == offline(model_dir, sentences)         # a sentence cut by a style: one


def expected(model_dir, make):
    asked = []
    make(lambda text: asked.append(text) or "")
    done = dict(zip(asked, offline(model_dir, asked)))
    return make(done.__getitem__)


@pytest.mark.parametrize("name", list(FORMATS))
def test_each_format_through_the_server_keeps_its_layout_and_translates_each_sentence(server, model_dir, name):
    data, want = expected(model_dir, FORMATS[name])
    got = translated_file(server, name, data.encode("utf-8")).decode("utf-8")
    assert got == want
    if name.endswith(".txt"):
        assert got.count("\n") == data.count("\n")
    if name.endswith((".srt", ".vtt")):
        assert [line for line in got.splitlines() if "-->" in line] == [line for line in data.splitlines()
                                                                         if "-->" in line]


def test_offline_translate_file_writes_what_the_server_serves(server, model_dir, tmp_path):
    for name, make in FORMATS.items():
        data, _ = make(lambda text: text)
        source = tmp_path / name
        source.write_bytes(data.encode("utf-8"))
        out = tmp_path / ("out-" + name)
        done = subprocess.run([sys.executable, "-m", "transformer", "translate", "--model", model_dir, "--threads", "1",
                               "--file", str(source), "--out", str(out)], capture_output=True, text=True, timeout=120,
                              cwd=OUTSIDE)
        assert done.returncode == 0, done.stderr
        assert out.read_bytes() == translated_file(server, name, data.encode("utf-8")), name


def test_settings_say_files_are_translated(server):
    status, body = get(server.url + "/frontend/settings")
    assert status == 200
    import json
    settings = json.loads(body)
    assert settings["filesTranslation"] is True
    assert {".txt", ".srt", ".vtt", ".html"} <= set(settings["supportedFilesFormat"])


@pytest.mark.parametrize("name, data, fields, status, says", [
    ("program.exe", b"MZ\x90\x00", None, 400, "file format .exe is not supported"),
    ("noext", b"hello", None, 400, "(no extension) is not supported"),
    ("empty.txt", b"", None, 400, "the file is empty"),
    ("latin1.txt", "caf\u00e9".encode("latin-1"), None, 400, "not UTF-8"),
    ("binary.txt", b"a\x00b", None, 400, "NUL"),
    ("film.srt", b"just some words\n", None, 400, "not SubRip"),
    ("film.vtt", b"00:01.000 --> 00:02.000\nhi\n", None, 400, "not WebVTT"),
    ("big.txt", b"a cat\n" * (MAX_FILE // 6 + 1), None, 413, "--max-file-size"),
    ("report.docx", b"PK\x03\x04 not a zip", None, 400, "not a zip archive"),
    ("report.pptx", _zip({"a.txt": b"x"}), None, 400, "has no ppt/presentation.xml"),
    ("report.odt", _zip({"content.xml": b"<text:p>unclosed"}), None, 400, "content.xml is not well-formed XML"),
    ("report.docx", _zip({"word/document.xml": b'<!DOCTYPE x [<!ENTITY a "aaaa">]><w:p>&a;</w:p>'}), None, 400,
     "declares a DOCTYPE"),
    ("bomb.docx", _zip({"word/document.xml": b"<w:p/>", "word/media/big.bin": bytes(65 << 20)}), None, 400,
     "unpacks to more than 67108864 bytes"),
    ("a.txt", b"a cat", {"target": ""}, 400, "missing target"),
    ("a.txt", b"a cat", {"source": None}, 400, "missing source"),
    ("a.txt", b"a cat", {"target": "deu"}, 400, "deu is not supported"),
    (None, None, None, 400, "missing file"),
])
def test_malformed_uploads_are_4xx_naming_why_and_the_server_answers_after(server, name, data, fields, status, says):
    got, body = upload(server.url, name, data, fields)
    assert got == status and says in body["error"], body
    assert get(server.url + "/health")[0] == 200


def test_a_key_is_needed_and_a_form_is(server):
    got, body = upload(server.url, "a.txt", b"a cat", api_key=None)
    assert got == 403, body
    async def go():
        async with aiohttp.ClientSession() as session:
            async with session.post(server.url + "/translate_file", json={"source": "en", "target": "es"}) as r:
                return r.status, await r.json(content_type=None)
    got, body = asyncio.run(go())
    assert got == 400 and "multipart/form-data" in body["error"], body


def _raw_get(server, path):
    """The status line of GET path, sent as is (no client normalises it)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer


@pytest.mark.parametrize("path", ["/download_file/0123456789abcdef0123456789abcdef.x.es.txt",
                                  "/download_file/..%2F..%2F..%2Fetc%2Fpasswd", "/download_file/%2e%2e%2fsecret",
                                  "/download_file/%2Fetc%2Fpasswd"])
def test_a_name_that_is_not_ours_is_404_and_never_a_path(server, path):
    answer = _raw_get(server, path)
    assert answer.split(b"\r\n")[0] == b"HTTP/1.1 404 Not Found", answer[:200]
    assert b"no such file: not a name this server gave" in answer and b"root:" not in answer


def test_file_characters_count_toward_the_limits_a_minute_and_a_slow_file_is_408(model_dir):
    running = Running("--model", model_dir, "--chars-per-minute", "30", "--body-timeout", "1")
    try:
        with socket.create_connection(("127.0.0.1", running.port), timeout=10) as s:     # a file sent too slowly
            s.sendall(b"POST /translate_file HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n"
                      b"Content-Type: multipart/form-data; boundary=XX\r\n\r\n--XX\r\nContent-Disposition: form-data; "
                      b'name="file"; filename="a.txt"\r\n\r\nthe big')
            answer = s.recv(65536)
        assert answer.startswith(b"HTTP/1.1 408") and b"--body-timeout" in answer, answer[:300]
        got, body = upload(running.url, "a.txt", b"the big cat\nred tree\n", api_key=None)   # 19 characters
        assert got == 200, body
        got, body = upload(running.url, "b.txt", b"the small dog sleeps\n", api_key=None)   # 20 more
        assert got == 429 and "characters per 1 minute" in body["error"], body
    finally:
        running.stop()


def test_a_translated_file_expires_and_the_folder_is_bounded(monkeypatch):
    from transformer.serve import files

    now = [0.0]
    store = files.Files(expiry=10.0, clock=lambda: now[0])
    try:
        name = store.put(b"hola", "../../a b.txt", "es", ".txt")
        assert "/" not in name and name.endswith(".a_b.es.txt")
        path = store.get(name)
        assert os.path.dirname(path) == store.folder and open(path, "rb").read() == b"hola"
        assert store.get("../" + name) is None and store.get(os.path.join(store.folder, name)) is None
        now[0] = 10.0
        assert store.get(name) is None and not os.path.exists(path)
        monkeypatch.setattr(files, "MAX_FILES", 3)
        names = [store.put(b"x", "f.txt", "es", ".txt") for _ in range(5)]
        assert [store.get(n) is not None for n in names] == [False, False, True, True, True]
        assert len(os.listdir(store.folder)) == 3
    finally:
        store.close()
    assert not os.path.exists(store.folder)


@pytest.mark.parametrize("argv, says", [
    (["--file", "x.txt"], "--file needs --out"),
    (["--out", "y.txt", "a cat"], "--out names where --file's translation goes"),
    (["--file", "x.exe", "--out", "y.exe"], "file format .exe is not supported"),
])
def test_translate_file_flags_are_checked(model_dir, tmp_path, argv, says):
    (tmp_path / "x.exe").write_bytes(b"MZ")
    (tmp_path / "x.txt").write_bytes(b"a cat")
    done = subprocess.run([sys.executable, "-m", "transformer", "translate", "--model", model_dir, *argv],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode != 0 and says in done.stderr, done.stderr


def test_files_and_texts_share_the_batches_and_auto_detects(server, model_dir):
    """A file sent with source auto, while /translate requests run: each answer its offline translation."""
    data, want = expected(model_dir, _srt)
    texts = ["the big cat", "red tree runs", "a small dog sleeps", "blue house"]
    offline_texts = offline(model_dir, texts)

    async def go():
        async with aiohttp.ClientSession() as session:
            async def text(q):
                body = {"q": q, "source": "en", "target": "es", "api_key": "secret-2"}
                async with session.post(server.url + "/translate", json=body) as r:
                    return (await r.json())["translatedText"]

            async def file():
                form = aiohttp.FormData()
                for key, value in {"source": "auto", "target": "es", "api_key": "secret-1"}.items():
                    form.add_field(key, value)
                form.add_field("file", data.encode("utf-8"), filename="film.srt")
                async with session.post(server.url + "/translate_file", data=form) as r:
                    url = (await r.json())["translatedFileUrl"]
                async with session.get(url) as r:
                    return (await r.read()).decode("utf-8")
            return await asyncio.gather(file(), *(text(q) for q in texts))
    got_file, *got_texts = asyncio.run(go())
    assert got_file == want
    assert got_texts == offline_texts


def test_an_epub_translates_its_chapters_and_keeps_the_rest(server, model_dir, tmp_path):
    head = '<?xml version="1.0" encoding="utf-8"?>\n<html xmlns="http://www.w3.org/1999/xhtml"><head><title>'
    chapter = head + "a cat</title></head><body><p>the big cat</p>\n<p>red tree&#160;</p><pre>a dog</pre></body></html>"
    members = {"mimetype": b"application/epub+zip", "META-INF/container.xml": b"<container/>",
               "OEBPS/content.opf": b"<package/>", "OEBPS/ch1.xhtml": chapter.encode(), "OEBPS/cover.jpg": bytes(300)}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in members.items():
            archive.writestr(name, content, compress_type=zipfile.ZIP_STORED if name == "mimetype" else None)
    data = buffer.getvalue()
    got = translated_file(server, "book.epub", data)
    source, out = tmp_path / "book.epub", tmp_path / "out.epub"
    source.write_bytes(data)
    done = subprocess.run([sys.executable, "-m", "transformer", "translate", "--model", model_dir, "--threads", "1",
                           "--file", str(source), "--out", str(out)], capture_output=True, text=True, timeout=120,
                          cwd=OUTSIDE)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == got
    after = zipfile.ZipFile(io.BytesIO(got))
    assert after.namelist() == list(members) and after.infolist()[0].compress_type == zipfile.ZIP_STORED
    for name, content in members.items():
        if name != "OEBPS/ch1.xhtml":
            assert after.read(name) == content, name
    a_cat, big_cat, red_tree = offline(model_dir, ["a cat", "the big cat", "red tree"])
    assert after.read("OEBPS/ch1.xhtml").decode() == (head + f"{a_cat}</title></head><body><p>{big_cat}</p>\n"
                                                      f"<p>{red_tree}&#160;</p><pre>a dog</pre></body></html>")
