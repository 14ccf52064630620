"""A long document through `transformer serve` (issue 59): a ~200-page .docx sent to POST
/translate_file and downloaded, against the same paragraphs sent to POST /translate as one request,
and the server's peak resident memory during each.

The .docx is written here with zipfile (the three parts Word needs): PARAGRAPHS paragraphs, one
Bible verse each (about ten a page), every BOLD_EVERY-th with a bold run in the middle of a
sentence, so that the file path reads runs, joins them and spreads the translation back. The
server (step batching, the model of `config` with random weights and every output at most MAX_LEN
tokens, as bench/serve.py's) runs in a process of its own. Each round sends the file and the text,
each as one request (the limits a request raised for it: --max-texts, --char-limit, --max-body,
--max-file-size), each after the server's peak RSS is reset (/proc/PID/clear_refs "5"), so each
VmHWM is its own load's peak. Round 0 sends the file first, from the idle server; the order
alternates after.

A record a load and round: seconds (the file's: upload, translation, rendering and download, as a
client waits), RSS before and peak in MiB (memory a request freed stays in the process: glibc
keeps it). Then the summary: the mean seconds of each, their ratio (file / text: what reading and
writing the document costs over translating its text), the file's peak from the idle server, and
`same_text`: the paragraphs of the translated .docx whose text (its runs joined) is /translate's
answer for that paragraph.

Nothing here is timed in tests.
"""
import asyncio
import html
import io
import re
import shutil
import sys
import tempfile
import time
import zipfile

from .harness import cpu_model, emit as keep
from .serve import BIBLE, MAX_LEN, ServerProcess, _pairs, build_model

PARAGRAPHS = 2000
BOLD_EVERY = 5               # one paragraph in five has a bold run inside a sentence

_CONTENT_TYPES = ('<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
                  '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
                  '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
                  '<Default Extension="xml" ContentType="application/xml"/>'
                  '<Override PartName="/word/document.xml" ContentType="application/'
                  'vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/></Types>')
_RELS = ('<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
         '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
         '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/'
         'officeDocument" Target="word/document.xml"/></Relationships>')
_W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"


def _run(text, bold=False):
    props = "<w:rPr><w:b/></w:rPr>" if bold else ""
    return f'<w:r>{props}<w:t xml:space="preserve">{html.escape(text, quote=False)}</w:t></w:r>'


def make_docx(paragraphs):
    """A minimal valid .docx, one paragraph a text; every BOLD_EVERY-th has its middle words bold."""
    body = []
    for i, text in enumerate(paragraphs):
        words = text.split(" ")
        if i % BOLD_EVERY == 0 and len(words) >= 5:
            cut = len(words) // 2
            runs = _run(" ".join(words[:cut]) + " ") + _run(" ".join(words[cut:cut + 2]), bold=True) + \
                _run(" " + " ".join(words[cut + 2:]))
        else:
            runs = _run(text)
        body.append(f"<w:p>{runs}</w:p>")
    document = (f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n<w:document xmlns:w="{_W}"><w:body>'
                + "".join(body) + "</w:body></w:document>")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("[Content_Types].xml", _CONTENT_TYPES)
        archive.writestr("_rels/.rels", _RELS)
        archive.writestr("word/document.xml", document)
    return buffer.getvalue()


def docx_paragraphs(data):
    """Each paragraph's text of a .docx's document part, its runs joined."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        xml = archive.read("word/document.xml").decode("utf-8")
    return [html.unescape("".join(re.findall(r"<w:t(?:\s[^>]*)?>([^<]*)</w:t>", p)))
            for p in re.findall(r"<w:p[ >].*?</w:p>", xml, flags=re.S)]


def _memory(pid):
    """(VmHWM, VmRSS) of a process in MiB: its peak resident memory since the last reset, and now."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                fields[key] = int(value.split()[0]) / 1024      # kB
    return round(fields["VmHWM"], 1), round(fields["VmRSS"], 1)


def _reset_peak(pid):
    """Start VmHWM again from the current RSS (Linux >= 4.0), so a peak is the next load's alone."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


async def _text(url, texts):
    import aiohttp
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/translate", json={"q": texts, "source": "en", "target": "es"}) as r:
            body = await r.json()
            if r.status != 200:
                raise RuntimeError(f"/translate answered {r.status}: {body}")
            return body["translatedText"]


async def _file(url, name, data):
    import aiohttp
    form = aiohttp.FormData()
    form.add_field("source", "en")
    form.add_field("target", "es")
    form.add_field("file", data, filename=name, content_type="application/octet-stream")
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/translate_file", data=form) as r:
            body = await r.json()
            if r.status != 200:
                raise RuntimeError(f"/translate_file answered {r.status}: {body}")
        async with session.get(body["translatedFileUrl"]) as r:
            return await r.read()


def run(config="tiny", threads=2, precision="int8", beam=4, paragraphs=PARAGRAPHS, rounds=2, data=BIBLE,
        stream=None, served=None):
    """The records of the module docstring: one a load and round, then the summary (a warm-up
    before them). served: (model directory, English
    texts) to serve instead of `config`'s model built with random weights."""
    records = []
    directory = served[0] if served else tempfile.mkdtemp(prefix=f"serve-file-{config}-")
    try:
        if served:
            texts = served[1]
        else:
            train, dev = _pairs(data)
            build_model(config, directory, (train, dev))
            texts = [s for s, _ in train]
        texts = (texts * (paragraphs // max(len(texts), 1) + 1))[:paragraphs]
        document = make_docx(texts)
        server = ServerProcess([sys.executable, "-m", "transformer", "serve", "--model", directory, "--threads",
                                str(threads), "--precision", precision, "--beam", str(beam), "--max-len",
                                str(MAX_LEN), "--batch-size", "64", "--max-queue", "100000", "--char-limit", "0",
                                "--max-texts", "100000",
                                "--max-body", str(64 << 20), "--max-file-size", str(64 << 20)])
        base = {"bench": "serve_file", "format": "docx", "config": config, "threads": threads,
                "precision": precision, "beam": beam, "max_len": MAX_LEN, "paragraphs": len(texts),
                "bold_paragraphs": sum(1 for i, t in enumerate(texts)
                                       if i % BOLD_EVERY == 0 and len(t.split()) >= 5),
                "source_chars": sum(map(len, texts)), "docx_bytes": len(document), "cpu": cpu_model()}
        loads = {"file": lambda url: asyncio.run(_file(url, "bible.docx", document)),
                 "text": lambda url: asyncio.run(_text(url, texts))}
        answers = {}
        try:
            pid = server.process.pid
            asyncio.run(_text(server.url, texts[:4]))             # warm-up: first calls, caches
            asyncio.run(_file(server.url, "warm.docx", make_docx(texts[:4])))
            for round_ in range(rounds):
                # the file first in round 0, so its peak is measured from the idle server's RSS;
                # the order alternates after, so a drift of the machine does not pass for a cost
                for load in (("file", "text") if round_ % 2 == 0 else ("text", "file")):
                    _, before = _memory(pid)
                    _reset_peak(pid)
                    started = time.perf_counter()
                    answers[load] = loads[load](server.url)
                    seconds = time.perf_counter() - started
                    peak, _ = _memory(pid)
                    keep({**base, "load": load, "round": round_, "seconds": round(seconds, 3),
                          "rss_before_mib": before, "rss_peak_mib": peak}, records, stream)
        finally:
            server.stop()
        got = docx_paragraphs(answers["file"])

        def mean(load, key):
            values = [r[key] for r in records if r["load"] == load]
            return sum(values) / len(values)
        text_s, file_s = mean("text", "seconds"), mean("file", "seconds")
        first = {r["load"]: r for r in records if r["round"] == 0}
        keep({**base, "load": "summary", "rounds": rounds, "text_s": round(text_s, 3), "file_s": round(file_s, 3),
              "file_over_text": round(file_s / text_s, 3),
              "rss_idle_mib": first["file"]["rss_before_mib"], "rss_peak_file_mib": first["file"]["rss_peak_mib"],
              "rss_peak_mib": max(r["rss_peak_mib"] for r in records),
              "translated_docx_bytes": len(answers["file"]), "translated_paragraphs": len(got),
              "same_text": sum(a == b for a, b in zip(got, answers["text"]))}, records, stream)
    finally:
        if not served:
            shutil.rmtree(directory, ignore_errors=True)
    return records
