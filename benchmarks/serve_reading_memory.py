"""What reading one hostile upload holds: each read as the server reads a file (formats.read, with
the Budget /translate_file gives it: --max-queue 4096, 128 positions, 10 s), in a fresh process of
its own; one JSON line per upload and build: the answer, the seconds, and the process's peak
resident memory while reading above what it held before (the upload's bytes already in it: the
uploads are made once, by the parent, and read from files; the imports' peak is reset first).

    python benchmarks/serve_reading_memory.py CODE [CODE ...] [--rounds N] [--only LABEL]

CODE: checkouts whose `transformer` package reads the files (their order is alternated by round).
Every upload is an archive under --max-file-size that unpacks to just under 64 MiB (the bound), the
kinds that once held the most, or a file thread the longest: elements never closed, tags, comments,
entities, runs, newlines, bare `<`.
"""
import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile

FILL = (64 << 20) - 4096


def zipped(members):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in members.items():
            archive.writestr(name, content)
    return buffer.getvalue()


def docx(body):
    return "a.docx", zipped({"[Content_Types].xml": b"<x/>", "word/document.xml":
                             b'<w:document xmlns:w="u"><w:body>' + body + b"</w:body></w:document>"})


def epub(chapter):
    return "a.epub", zipped({"META-INF/container.xml": b"<x/>", "c.xhtml": chapter})


def times(unit, size=FILL - 64):
    return unit * (size // len(unit))


UPLOADS = {
    "docx: <a> never closed": lambda: docx(b"<w:p>" + times(b"<a>")),
    "docx: CDATA newlines in a w:t": lambda: docx(b"<w:p><w:r><w:t><![CDATA[" + times(b"\n") + b"]]></w:t></w:r></w:p>"),
    "docx: one run of x": lambda: docx(b"<w:p><w:r><w:t>" + times(b"x") + b"</w:t></w:r></w:p>"),
    "docx: runs of x in one paragraph": lambda: docx(b"<w:p>" + times(b"<w:r><w:t>x</w:t></w:r>") + b"</w:p>"),
    "docx: <a/>": lambda: docx(b"<w:p>" + times(b"<a/>") + b"</w:p>"),
    "epub: <b> never closed": lambda: epub(times(b"<b>")),
    "epub: a<b> never closed": lambda: epub(times(b"a<b>")),
    "epub: <br/>": lambda: epub(times(b"<br/>")),
    "epub: <!---->": lambda: epub(times(b"<!---->")),
    "epub: bare <": lambda: epub(b"a" + times(b"< ")),
    "epub: &amp;": lambda: epub(times(b"&amp;")),
    "epub: x": lambda: epub(times(b"x")),
    "epub: newlines": lambda: epub(times(b"\n")),
}


def status_mb(field):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) >> 10 for line in status if line.startswith(field + ":"))


def read_one(label, path, code):
    with open(path, "rb") as upload:
        data = upload.read()
    sys.path.insert(0, code)
    from transformer.serve import formats
    from transformer.serve.documents import Budget

    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")                    # the peak so far (the imports') forgotten: VmHWM = VmRSS
    before = status_mb("VmRSS")
    began = time.perf_counter()
    try:
        formats.read(data, path, "en", budget=Budget(4096, 4096 * 128 * 4, 10.0))
        answer = "read"
    except Exception as exc:                # what the server answers 400 or 413
        answer = f"{type(exc).__name__}: {str(exc)[:100]}"
    took = time.perf_counter() - began
    return {"code": code, "upload": label, "upload_bytes": len(data), "seconds": round(took, 2),
            "peak_rss_above_mb": status_mb("VmHWM") - before, "answer": answer}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("codes", nargs="+")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--only", action="append", choices=list(UPLOADS))
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)      # LABEL PATH
    args = parser.parse_args()
    if args.one:
        print(json.dumps(read_one(*args.one, args.codes[0])), flush=True)
        return
    with tempfile.TemporaryDirectory() as folder:
        paths = {}
        for i, label in enumerate(args.only or UPLOADS):
            name, data = UPLOADS[label]()
            paths[label] = os.path.join(folder, f"{i}{name}")          # its extension says its format
            with open(paths[label], "wb") as upload:
                upload.write(data)
        for r in range(args.rounds):
            for label, path in paths.items():
                for code in args.codes[::-1] if r % 2 else args.codes:
                    subprocess.run([sys.executable, __file__, code, "--one", label, path], check=True)


if __name__ == "__main__":
    main()
