"""Hostile uploads against a real `transformer serve`: each sent alone while a client sends a small
/translate every 50 ms; one JSON line per upload: its answer and time, the small requests' worst
latency meanwhile (how long the server's loop was held), and the server's peak resident memory so
far (VmHWM: it only grows, so each upload's own peak shows where it rises).

    python benchmarks/serve_hostile_files.py SRC-TGT=MODEL_DIR [CODE]

CODE: a checkout whose `transformer` package the server runs (PYTHONPATH), to compare builds in one
run; default: the installed one. The uploads: HTML of constructs never ended and of bare `<`, an
e-book of tags, an e-book chapter without a sentence end, a .docx of 1.8 million paragraphs (each
within --max-file-size's 1 MiB, the last three unpacking to up to 64 MiB).
"""
import asyncio
import json
import os
import socket
import subprocess
import sys
import time

import aiohttp
from serve_reading_memory import zipped      # this folder's (sys.path[0])

MODEL = sys.argv[1]
CODE = sys.argv[2] if len(sys.argv) > 2 else None
SRC, TGT = MODEL.split("=", 1)[0].split("-")
SMALL = {"q": "the red cat runs.", "source": SRC, "target": TGT}


def epub(chapter):
    return zipped({"META-INF/container.xml": b"<x/>", "c.xhtml": chapter})


PARAGRAPHS = b"<w:p><w:r><w:t>x.</w:t></w:r></w:p>" * (((64 << 20) - 4096) // 36)
UPLOADS = [
    ("html: 256 KiB of <!--x>", "a.html", b"<!--x>" * ((256 << 10) // 6)),
    ("html: 1 MiB of bare <", "a.html", b"<" * ((1 << 20) - 16)),
    ("epub: 16 MiB of <b>", "a.epub", epub(b"<b>" * ((16 << 20) // 3))),
    ("epub: 4 MiB without a sentence end", "a.epub", epub(b"the cat runs " * ((4 << 20) // 13))),
    ("docx: 64 MiB of paragraphs", "a.docx", zipped({"[Content_Types].xml": b"<x/>", "word/document.xml":
                                                     b'<w:document xmlns:w="u"><w:body>' + PARAGRAPHS
                                                     + b"</w:body></w:document>"})),
]


def peak_rss_mb(pid):
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) // 1024 for line in status if line.startswith("VmHWM:"))


async def one(session, url, label, name, data):
    done, latencies = asyncio.Event(), []

    async def small():
        while not done.is_set():
            began = time.perf_counter()
            async with session.post(url + "/translate", json=SMALL) as response:
                await response.read()
            latencies.append(time.perf_counter() - began)
            await asyncio.sleep(0.05)
    task = asyncio.ensure_future(small())
    form = aiohttp.FormData()
    form.add_field("source", SRC)
    form.add_field("target", TGT)
    form.add_field("file", data, filename=name, content_type="application/octet-stream")
    began = time.perf_counter()
    async with session.post(url + "/translate_file", data=form) as response:
        status, answer = response.status, (await response.text())[:110]
    took = time.perf_counter() - began
    done.set()
    await task
    return {"code": CODE or "installed", "upload": label, "upload_bytes": len(data), "status": status,
            "seconds": round(took, 2), "small_requests": len(latencies),
            "small_worst_ms": round(1000 * max(latencies), 1) if latencies else None, "answer": answer}


async def main():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = dict(os.environ, **({"PYTHONPATH": CODE} if CODE else {}))
    server = subprocess.Popen([sys.executable, "-m", "transformer", "serve", "--model", MODEL, "--port", str(port),
                               "--threads", "1"], stderr=subprocess.PIPE, text=True, cwd="/tmp", env=env)
    for line in server.stderr:
        if line.startswith("listening on"):
            break
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:
            for _ in range(3):
                async with session.post(url + "/translate", json=SMALL) as response:
                    await response.read()
            print(json.dumps({"code": CODE or "installed", "idle_peak_rss_mb": peak_rss_mb(server.pid)}), flush=True)
            for upload in UPLOADS:
                record = await one(session, url, *upload)
                print(json.dumps({**record, "server_peak_rss_mb": peak_rss_mb(server.pid)}), flush=True)
    finally:
        server.terminate()
        server.wait(30)


asyncio.run(main())
