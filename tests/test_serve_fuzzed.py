"""What a fuzzing session against `transformer serve` found (2026-12-06), each case held here: a body
aiohttp cannot decode, a key header that is not UTF-8, an integer past C's, a static path past the
file system's, a client gone mid-body (each was a 500); a file of a million kept runs (minutes of
CPU); uploads that together held gigabytes unpacked, a form of any number of fields, slow files on
the loop's default threads; a request of more pieces than the whole queue told to retry (429); a
second answer (408) to the late body of an answered request; aiohttp's own refusals in text/plain;
origins compared two ways; a format of 0 read as text. The tiny model of test_serve.py serves them:
in process where the log or the server's state is read, else as `transformer serve` (the
connection guard and aiohttp's parser sit in front of a real server only)."""
import asyncio
import io
import json
import logging
import socket
import time
import zipfile

import pytest

aiohttp = pytest.importorskip("aiohttp", reason='needs the [serve] extra: pip install ".[serve]"')

from test_serve import model_dir  # noqa: E402,F401
from test_serve_hostile import _answer_of  # noqa: E402
from transformer.checkpoint import load_for_inference  # noqa: E402
from transformer.serve import build, load_models  # noqa: E402
from transformer.serve import office  # noqa: E402
from transformer.serve.documents import of_html, of_text  # noqa: E402

ENG_SPA = {"source": "eng", "target": "spa"}
CRLF = b"\r\n"


def serving(model_dir, calls, caplog=None, **options):
    """Run `calls(client, port)` (a coroutine function) against the app build() makes of the tiny
    model; returns its result, and checks that nothing was logged as an internal error."""
    from aiohttp.test_utils import TestClient, TestServer

    app, scheduler = build(load_models([model_dir], load=load_for_inference), **options)

    async def go():
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            return await calls(client, client.server.port)
    try:
        if caplog is None:
            return asyncio.run(go())
        with caplog.at_level(logging.ERROR, logger="transformer.serve"):
            result = asyncio.run(go())
        assert not [r for r in caplog.records if "internal error" in r.getMessage()], caplog.text
        return result
    finally:
        scheduler.stop()


async def raw(port, request):
    """The status line and body of the answer to the bytes `request` (Connection: close)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 20)
    writer.close()
    head, _, body = answer.partition(CRLF * 2)
    return head.split(CRLF)[0].decode(), head.decode("latin-1"), body


def http(method, path, headers, body=b""):
    lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: 127.0.0.1", b"Connection: close"]
    lines += headers + [b"Content-Length: %d" % len(body)]
    return CRLF.join(lines) + CRLF * 2 + body


def multipart(*parts):
    """A multipart body (boundary B) of raw parts: (headers lines, content)."""
    out = b""
    for headers, content in parts:
        out += b"--B" + CRLF + CRLF.join(headers) + CRLF * 2 + content + CRLF
    return out + b"--B--" + CRLF


FORM_PART = [b'Content-Disposition: form-data; name="q"']


@pytest.mark.parametrize("path, headers, body, says", [
    ("/translate", [b"Content-Type: application/json", b"Content-Encoding: deflate"], b"not deflate",
     "the request body cannot be read"),
    ("/translate", [b"Content-Type: application/x-www-form-urlencoded; charset=bogus-42"],
     b"q=a&source=eng&target=spa", "the form cannot be read"),
    ("/translate", [b"Content-Type: multipart/form-data"], b"xx", "the form cannot be read"),
    ("/detect", [b"Content-Type: multipart/form-data"], b"xx", "the form cannot be read"),
    ("/translate", [b"Content-Type: multipart/form-data; boundary=B"],
     multipart((FORM_PART + [b"Content-Type: text/plain", b"Content-Type: text/plain"], b"a")),
     "the form cannot be read"),
    ("/translate", [b"Content-Type: multipart/form-data; boundary=B"],
     multipart((FORM_PART + [b"Content-Transfer-Encoding: bogus"], b"a")), "the form cannot be read"),
    ("/translate", [b"Content-Type: multipart/form-data; boundary=B"],
     multipart((FORM_PART + [b"Content-Type: text/plain; charset=bogus"], b"a")), "the form cannot be read"),
    ("/translate_file", [b"Content-Type: multipart/form-data"], b"xx", "the multipart body cannot be read"),
    ("/translate_file", [b"Content-Type: multipart/form-data; boundary=B", b"Content-Encoding: deflate"],
     b"not deflate", "the multipart body cannot be read"),
])
def test_a_body_aiohttp_cannot_decode_is_400_naming_it_not_500(model_dir, caplog, path, headers, body, says):
    async def calls(client, port):
        return await raw(port, http("POST", path, headers, body))
    status, _, answer = serving(model_dir, calls, caplog)
    assert status.split()[1] == "400" and json.loads(answer)["error"].startswith(says), (status, answer)


@pytest.mark.parametrize("token", [b"\xff\xfe", "ünïcode-kéy".encode("latin-1"), "ünïcode-kéy".encode("utf-8")])
def test_a_bearer_key_of_any_bytes_is_403_invalid_on_every_route(model_dir, caplog, token):
    async def calls(client, port):
        auth = b"Authorization: Bearer " + token
        body = json.dumps({"q": "red cat", **ENG_SPA}).encode()
        posted = [await raw(port, http("POST", path, [auth, b"Content-Type: application/json"], body))
                  for path in ("/translate", "/detect", "/v1/translate")]
        return posted + [await raw(port, http("GET", path, [auth])) for path in ("/metrics", "/health")]
    for status, _, answer in serving(model_dir, calls, caplog, api_keys={"good-key"}):
        assert status.split()[1] == "403" and json.loads(answer)["error"] == "Invalid API key", (status, answer)


def test_no_repeat_ngram_past_any_integer_bans_nothing_as_0_does(model_dir, caplog):
    """An n-gram longer than the model's positions occurs in no output: 2 ** 63 and 10 ** 30 are
    honoured as such (the answer of no_repeat_ngram 0), not an OverflowError in the C loop."""
    async def calls(client, port):
        answers = []
        for n in (0, 2 ** 63, 10 ** 30):
            response = await client.post("/v1/translate", json={"q": ["red cat runs", "big dog"],
                                                                 "no_repeat_ngram": n, **ENG_SPA})
            body = await response.json()
            answers.append((response.status, body["translations"], body["options"]["no_repeat_ngram"]))
        return answers
    (status, plain, _), *past = serving(model_dir, calls, caplog)
    assert status == 200 and past == [(200, plain, 2 ** 63), (200, plain, 10 ** 30)], (plain, past)


def test_the_library_takes_a_no_repeat_ngram_past_the_positions_as_banning_nothing(model_dir):
    import numpy as np

    model = load_models([model_dir], load=load_for_inference)["en-es"].model
    src = np.array([[5, 6, 7, 8, 2]], np.int64)
    plain = model.beam_search(src, beam_size=3, no_repeat_ngram=0)
    assert model.beam_search(src, beam_size=3, no_repeat_ngram=2 ** 63) == plain
    assert model.greedy_decode(src, no_repeat_ngram=10 ** 30) == model.greedy_decode(src)


def test_a_static_path_past_the_file_system_s_names_is_404(model_dir, caplog):
    async def calls(client, port):
        return [await raw(port, http("GET", path, [])) for path in ("/static/" + "a" * 300, "/static/" + "a/" * 2000)]
    for status, _, _ in serving(model_dir, calls, caplog):
        assert status.split()[1] == "404", status


def test_a_client_gone_mid_body_is_counted_499_and_not_logged_as_ours(model_dir, caplog):
    async def calls(client, port):
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", port)) as connection:
                connection.sendall(b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                                   b"\r\nContent-Length: 1000\r\n\r\n{\"q\": \"red")
                await asyncio.sleep(0.2)
        await asyncio.sleep(0.3)
        ok = await client.post("/translate", json={"q": "red cat", **ENG_SPA})
        metrics = await client.get("/metrics")
        return ok.status, await metrics.text()
    status, metrics = serving(model_dir, calls, caplog)
    assert status == 200
    assert 'transformer_requests_total{endpoint="/translate",status="499"} 3' in metrics, metrics
    assert 'status="500"' not in metrics, metrics


def _docx(text, filler=0):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("word/document.xml", f"<w:document><w:p><w:t>{text}</w:t></w:p></w:document>")
        if filler:
            archive.writestr("word/media/filler.bin", bytes(filler))
    return buffer.getvalue()


def _upload_form(data, name="a.docx", extra=0):
    form = aiohttp.FormData()
    form.add_field("source", "eng")
    form.add_field("target", "spa")
    for i in range(extra):
        form.add_field(f"x{i}", "1")
    form.add_field("file", data, filename=name, content_type="application/octet-stream")
    return form


def test_archives_held_unpacked_are_bounded_all_together_and_given_back(model_dir, caplog, monkeypatch):
    """Each upload may unpack to 64 MiB; all those being translated at once hold at most
    UNPACKED_AT_ONCE: past it an upload gets 503 with Retry-After, and what each held is given back
    once it is answered, refused or fails."""
    monkeypatch.setattr(office, "UNPACKED_AT_ONCE", 200_000)

    async def calls(client, port):
        small = await client.post("/translate_file", data=_upload_form(_docx("red cat runs.")))
        big = await client.post("/translate_file", data=_upload_form(_docx("red cat runs.", filler=300_000)))
        broken = await client.post("/translate_file", data=_upload_form(_zip_without_document()))
        after = await client.post("/translate_file", data=_upload_form(_docx("big dog.", filler=100_000)))
        return [(r.status, await r.json(), r.headers.get("Retry-After")) for r in (small, big, broken, after)]
    small, big, broken, after = serving(model_dir, calls, caplog)
    assert small[0] == 200 and after[0] == 200, (small, after)
    assert big[0] == 503 and big[2] == "1", big
    assert "would pass the 0 MiB they may hold at once; retry later" in big[1]["error"], big
    assert broken[0] == 400 and "word/document.xml" in broken[1]["error"], broken
    assert office.held_unpacked() == 0


def _zip_without_document():
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("word/other.xml", "<x/>")
    return buffer.getvalue()


def test_uploads_held_at_once_are_counted_while_they_are_translated(model_dir, monkeypatch):
    """Two archives read at once hold the sum of their members; the second past the bound is Busy."""
    monkeypatch.setattr(office, "UNPACKED_AT_ONCE", 150_000)
    first = office.OfficeDocument(_docx("red cat.", filler=100_000), ".docx", "en")
    held = office.held_unpacked()
    assert held >= 100_000
    with pytest.raises(office.Busy):
        office.OfficeDocument(_docx("big dog.", filler=100_000), ".docx", "en")
    assert office.held_unpacked() == held
    first.release()
    assert office.held_unpacked() == 0
    office.OfficeDocument(_docx("big dog.", filler=100_000), ".docx", "en").release()
    assert office.held_unpacked() == 0


def test_a_form_of_more_than_32_fields_on_translate_file_is_400(model_dir, caplog):
    async def calls(client, port):
        many = await client.post("/translate_file", data=_upload_form(b"red cat.", "a.txt", extra=40))
        few = await client.post("/translate_file", data=_upload_form(b"red cat.", "a.txt", extra=5))
        return (many.status, await many.json()), few.status
    (status, body), few = serving(model_dir, calls, caplog)
    assert status == 400 and body["error"].startswith("the form has more than 32 fields"), body
    assert few == 200


def test_kept_runs_between_sentences_are_one_part_in_linear_time():
    """A million blank lines, or tags, between two sentences: one kept part, rendered back as sent
    (adding each run to the last part copied it whole: minutes for a 3 KB epub)."""
    text = "The cat sleeps.\n" + "\n" * 1_000_000 + "The dog runs.\n"
    began = time.process_time()
    document = of_text(text, "en")
    assert document.render(document.sentences) == text
    assert time.process_time() - began < 4.0       # 0.3 s here (Zen 3); quadratic, 16 s
    assert [type(p) for p in document.parts] == [int, str, int, str]
    html = "<p>The cat sleeps.</p>" + "<b>" * 100_000 + "<p>The dog runs.</p>"
    document = of_html(html, "en")
    assert len(document.sentences) == 2 and document.render(["A.", "B."]).count("<b>") == 100_000
    assert len(document.parts) <= 6


def test_texts_of_more_pieces_than_the_whole_queue_are_413_not_retry_later(model_dir, caplog):
    async def calls(client, port):
        many = await client.post("/translate", json={"q": ". ".join(["red cat runs"] * 6) + ".", **ENG_SPA})
        few = await client.post("/translate", json={"q": "red cat runs. big dog.", **ENG_SPA})
        return (many.status, await many.json(), many.headers.get("Retry-After")), few.status
    (status, body, retry), few = serving(model_dir, calls, caplog, max_queue=4)
    assert status == 413 and retry is None, body
    assert body["error"] == ("the texts make at least 5 pieces (sentences cut to the model's positions); the queue "
                             "takes at most 4 (--max-queue); send fewer or shorter texts"), body
    assert few == 200


@pytest.mark.parametrize("q, says", [("   ", "q holds only whitespace"), ([" ", ""], "q holds only whitespace"),
                                     (5, "q must be a string or a list of strings, got int")])
def test_detect_says_what_is_wrong_with_q(model_dir, q, says):
    async def calls(client, port):
        response = await client.post("/detect", json={"q": q})
        return response.status, await response.json()
    status, body = serving(model_dir, calls)
    assert status == 400 and body["error"].startswith(says), body


@pytest.mark.parametrize("value", [0, False, [], {}])
def test_a_format_that_is_not_a_string_is_400_not_read_as_text(model_dir, value):
    async def calls(client, port):
        response = await client.post("/translate", json={"q": "red cat", "format": value, **ENG_SPA})
        return response.status, await response.json()
    status, body = serving(model_dir, calls)
    assert status == 400 and "format is not supported (format: text or html)" in body["error"], body


def test_an_origin_gets_cors_wherever_it_gets_the_key_exemption():
    """Scheme and host are case-blind and a trailing / says nothing: --cors-origins compares origins
    as --require-api-key-origin does (one got the exemption, not the CORS headers)."""
    from transformer.serve.access import Access

    access = Access(cors_origins=("https://App.Example/",), key_origin="https://app.example")
    for origin in ("https://app.example", "HTTPS://APP.EXAMPLE/", " https://app.example"):
        assert not access.needs_key("translate", origin)
        assert access.cors_headers(origin)["Access-Control-Allow-Origin"] == origin
    assert access.cors_headers("https://app.example.evil") == {}
    assert access.needs_key("translate", "https://app.example.evil")


READING = 3.0   # seconds each upload's reading takes in the test below


def test_slow_files_wait_for_their_own_threads_and_detection_goes_on(model_dir, monkeypatch):
    """Eight uploads whose reading takes seconds each (an e-book of millions of tags takes a
    minute) held the loop's six default threads, and /detect waited for them: files now read on
    threads of their own (FILE_THREADS), and past FILE_JOBS uploads at once the next gets 503."""
    from transformer.serve import app as app_module

    read = app_module.read_file

    def slow(*args):
        time.sleep(READING)
        return read(*args)
    monkeypatch.setattr(app_module, "read_file", slow)
    monkeypatch.setattr(app_module, "FILE_JOBS", 6)

    async def calls(client, port):
        uploads = [asyncio.ensure_future(client.post("/translate_file", data=_upload_form(b"red cat.", "a.txt")))
                   for _ in range(7)]
        await asyncio.sleep(0.3)
        began = time.monotonic()
        detected = await client.post("/detect", json={"q": "red cat runs"})
        waited = time.monotonic() - began
        answers = [await u for u in uploads]
        return detected.status, waited, sorted(a.status for a in answers), [a.headers.get("Retry-After") for a in answers]
    status, waited, statuses, retry = serving(model_dir, calls)
    # Held behind the uploads, /detect would wait READING - 0.3 = 2.7 s or more (with the uploads put
    # back on the default threads, at 2.5 s a reading, it waited 2.66 s). Answered beside them it took
    # 0.41-0.49 s here (its first call) and 0.91 s once in CI's build without OpenMP, where a bound
    # of 0.9 s failed: 1.8 s stands apart from both.
    assert status == 200 and waited < 1.8, waited
    assert statuses == [200] * 6 + [503] and retry.count("1") == 1, statuses


def test_a_late_body_of_an_answered_request_gets_no_second_answer(model_dir):
    """GET /health with a Content-Length whose body comes a moment after the answer: those bytes are
    its body, not a new request's headers. The header clock took them for one and answered 408 to
    no request, --header-timeout later. The next request on the connection is answered as usual."""
    from test_serve import Running

    running = Running("--model", model_dir, "--header-timeout", "1")
    try:
        with socket.create_connection(("127.0.0.1", running.port), timeout=10) as connection:
            connection.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n\r\n")
            first = _answer_of(connection)
            time.sleep(0.3)
            connection.sendall(b"hello")
            connection.settimeout(2.0)
            try:
                extra = connection.recv(65536)
            except socket.timeout:
                extra = b""
            connection.settimeout(10)
            connection.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            second = _answer_of(connection)
    finally:
        running.stop()
    assert first.startswith(b"HTTP/1.1 200") and extra == b"" and second.startswith(b"HTTP/1.1 200"), (
        first[:40], extra[:120], second[:40])



@pytest.mark.parametrize("request_bytes", [
    b"FOO / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: abc\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Long: " + b"a" * 9000 + b"\r\n\r\n",
    b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
])
def test_what_aiohttp_s_parser_refuses_is_answered_in_the_error_form(model_dir, request_bytes):
    from test_serve import Running

    running = Running("--model", model_dir)
    try:
        with socket.create_connection(("127.0.0.1", running.port), timeout=10) as connection:
            connection.sendall(request_bytes)
            answer = _answer_of(connection)
        with socket.create_connection(("127.0.0.1", running.port), timeout=10) as connection:
            connection.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            after = _answer_of(connection)
    finally:
        running.stop()
    head, _, body = answer.partition(CRLF * 2)
    assert head.split(CRLF)[0].split()[1].startswith(b"4") and b"application/json" in head, answer[:300]
    assert json.loads(body)["error"].startswith("the request is not HTTP this server reads ("), body
    assert after.startswith(b"HTTP/1.1 200")
