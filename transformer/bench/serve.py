"""Serving under load: `transformer serve` driven by N concurrent clients, against the limit and
against the usual ways of serving.

For each model size (random weights, BPE vocabularies learned on the Bible pairs' training split,
the sentences of its dev split as requests, every output at most MAX_LEN tokens so that every
engine does the same work: random weights seldom stop earlier) and each count of concurrent
clients, each client sending one sentence a request, one after the other:

    offline      the same texts through translate_texts, batched: the limit, no HTTP (each text cut
                 into sentences as the server cuts it, serve/documents.py, and joined back)
    step         our server as it ships: the sentences of concurrent requests decoded together,
                 joining and leaving the running batch between decoder steps (--batching step)
    batch        our server batching between batches (--batching batch): a batch decoded to its
                 end before the next starts
    unbatched    our server one sentence at a time (--batch-size 1): what the peers' servers do
    ctranslate2  CTranslate2 behind the same HTTP front (our aiohttp app and scheduler), its
                 Translator given every batch the scheduler collects: translate_batch of what is
                 waiting, at its int8 (or the asked) compute type, in a process of its own (its
                 OpenMP runtime is not ours), at its best thread layout for the count, tried at
                 start: one translator of N threads, or N translators of one (the batch split
                 among them by max_batch_size); records name it (ctranslate2_layout)

Each record: sentences/s and output tokens/s (the answers' tokens, counted by encoding them again
with the target tokenizer), and the p50 / p99 latency of a request; for our servers, `mismatches`:
the answers that differ from the offline translation of their own sentence (0, or the server is
wrong). Servers run in processes of their own; the clients, asyncio with aiohttp, in this one.

Then the workload iteration-level batching is for, "mixed" (step and batch, MIXED_CLIENTS
clients): every other request asks for at most SHORT_LEN output tokens (POST /v1/translate's
max_len), the others for MAX_LEN; the records give the short requests' p50 / p99 apart
(short_p50_s, short_p99_s). Batching between batches makes a short request wait for the long
ones of its batch, and of the batch before it.

Hostile mode (run_hostile; `transformer bench --what serve --hostile 8`): issue 58's load. One
server of ours (step batching) answers CLIENTS_HOSTILE well-formed clients, alone and while N
hostile clients (a process of their own) send what the hostile tests send: malformed JSON, JSON
nested 2,000 deep, forms of 1,000 fields, headers a byte a second, requests dropped mid-way,
unknown paths and 64 KB language fields, each at most HOSTILE_RATE requests a second (a client
that floods as fast as it can is a denial of service no server answers by parsing: --req-limit
is its answer). Rounds alternate the order (clean then hostile, then hostile then clean) so a drift
of the machine does not pass for the hostile clients' cost. With `baseline` (another checkout,
such as 572e4d1's), that checkout's server answers the same well-formed load in the same rounds.
Each record: sentences/s, p50 / p99; `accepted` (200s) and `refused` (any other status) of the
well-formed requests; `mismatches` (accepted answers that differ from the offline translation of
their own sentence); `answered_once`: the server's count of /translate 200s grew by exactly the
accepted requests (the hostile clients' drops go to /v1/translate, so they are not counted
there); and the hostile clients' outcomes by kind (a status, or what the connection did).

Nothing here is timed in tests.
"""
import asyncio
import json
import os
import random
import re
import shutil
import subprocess
import statistics
import sys
import tempfile
import time

import numpy as np

from ..serve.models import ServedModel
from .harness import free_port

CONFIGS = {
    "tiny": dict(sizes=dict(d_model=128, n_heads=4, d_ff=512, n_encoder_layers=2, n_decoder_layers=2), vocab=4000),
    "base": dict(sizes=dict(d_model=512, n_heads=8, d_ff=2048, n_encoder_layers=6, n_decoder_layers=6), vocab=8000),
}
CLIENTS = (1, 8, 64, 256)
MAX_LEN = 64                 # output tokens a sentence at most, for every engine
SHORT_LEN = 8                # the short requests of the mixed workload
MIXED_CLIENTS = 64
MAX_SOURCE = 120             # source tokens a sentence at most (longer dev sentences are left out)
# The Bible pairs as a checkout has them (../shared/data beside it): from the checkout's root, or
# beside the package when it is installed in place (pip install -e).
BIBLE_CANDIDATES = (os.path.join("..", "shared", "data", "bible-eng-spa.tsv.gz"),
                    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared", "data",
                                 "bible-eng-spa.tsv.gz"))
BIBLE = next((path for path in BIBLE_CANDIDATES if os.path.exists(path)), BIBLE_CANDIDATES[0])


def _pairs(path):
    from ..data import read_pairs, split_pairs

    if not os.path.exists(path):
        raise FileNotFoundError(f"{os.path.abspath(path)}: the Bible pairs are needed (../shared/data beside "
                                "the checkout: run the bench from the checkout's root)")
    pairs, _ = read_pairs(path, "eng", "spa")
    return split_pairs(pairs, dev_fraction=0.05, max_dev=500)


def build_model(name, directory, pairs, seed=0):
    """A model directory of size `name` with random weights and BPE vocabularies learned on the
    training pairs; returns the dev sentences it takes whole (at most MAX_SOURCE tokens)."""
    import transformer as T
    from ..checkpoint import save_inference_files
    from ..tokenizer import SubwordTokenizer

    train, dev = pairs
    c = CONFIGS[name]
    src_tok = SubwordTokenizer.train([s for s, _ in train], vocab_size=c["vocab"])
    tgt_tok = SubwordTokenizer.train([t for _, t in train], vocab_size=c["vocab"])
    cfg = T.ModelConfig(src_vocab_size=src_tok.vocab_size, tgt_vocab_size=tgt_tok.vocab_size, dropout=0.0,
                        max_len=MAX_SOURCE + 8, **c["sizes"])
    model = T.Seq2SeqTransformer(cfg, seed=seed)
    save_inference_files(directory, model, src_tok, tgt_tok, languages=("en", "es"))
    return [s for s, _ in dev if 0 < len(src_tok.encode(s)) <= MAX_SOURCE]


class ServerProcess:
    """A server in a process of its own, up once it says "listening on"."""

    def __init__(self, argv, checkout=None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # checkout: the directory whose `transformer` the process imports (another commit's), not
        # the one installed
        env = None if checkout is None else {**os.environ, "PYTHONPATH": os.path.abspath(checkout)}
        self.process = subprocess.Popen([*argv, "--port", str(self.port)], stderr=subprocess.PIPE, text=True,
                                        cwd=tempfile.gettempdir(), env=env)
        self.banner = lines = []
        for line in self.process.stderr:
            lines.append(line)
            if line.startswith("listening on"):
                return
        raise RuntimeError("the server did not start: " + "".join(lines))

    def stop(self):
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def ours(directory, threads, precision, beam, batch_size, batching="step", checkout=None):
    return ServerProcess([sys.executable, "-m", "transformer", "serve", "--model", directory, "--threads",
                          str(threads), "--precision", precision, "--beam", str(beam), "--max-len", str(MAX_LEN),
                          "--batch-size", str(batch_size), "--max-queue", "100000", "--batching", batching],
                         checkout=checkout)


def ctranslate2_server(directory, threads, compute_type, beam):
    code = ("from transformer.bench.serve import serve_ctranslate2; "
            f"serve_ctranslate2({directory!r}, {threads}, {compute_type!r}, {beam})")
    return ServerProcess([sys.executable, "-c", code])


class CTranslate2Served:
    """A ServedModel whose decode is CTranslate2's translate_batch of our weights (bench/decode.py
    writes them), behind our scheduler and HTTP front."""

    def __init__(self, directory, threads, compute_type, beam):
        import ctranslate2

        from ..checkpoint import load_for_inference
        from .decode import write_ctranslate2_model

        self.model, self.src_tokenizer, self.tgt_tokenizer = load_for_inference(directory)
        self.name, self.directory, self.source, self.target = "en-es", directory, "en", "es"
        ct2_dir = os.path.join(directory, "ctranslate2")
        os.makedirs(ct2_dir, exist_ok=True)
        self.vocab = write_ctranslate2_model(self.model, ct2_dir)
        self.defaults = {"beam": beam, "max_len": MAX_LEN, "no_repeat_ngram": 0, "precision": compute_type}
        # Its best setting for the threads, as the decode bench finds it: one translator of `threads`
        # OpenMP threads, or `threads` translators of one thread each (a batch split among them by
        # max_batch_size). On this 2-core VM the second decodes one sentence 19x faster (tiny, beam 4).
        trials = {}
        for layout, (intra, inter) in (("intra", (threads, 1)), ("inter", (1, threads))):
            self.translator = ctranslate2.Translator(ct2_dir, device="cpu", compute_type=compute_type,
                                                     intra_threads=intra, inter_threads=inter)
            self.inter = inter
            sample = [[4 + i % (len(self.vocab) - 4) for i in range(k, k + 24)] for k in range(16)]
            self.decode(sample[:1], beam, MAX_LEN, 0, compute_type)
            started = time.perf_counter()
            self.decode(sample[:1], beam, MAX_LEN, 0, compute_type)
            self.decode(sample, beam, MAX_LEN, 0, compute_type)
            trials[layout] = (time.perf_counter() - started, intra, inter)
            del self.translator
        self.layout = min(trials, key=lambda k: trials[k][0])
        _, intra, inter = trials[self.layout]
        self.inter = inter
        self.translator = ctranslate2.Translator(ct2_dir, device="cpu", compute_type=compute_type,
                                                 intra_threads=intra, inter_threads=inter)
        self.trials = {k: round(v[0], 3) for k, v in trials.items()}

    options = ServedModel.options       # the same requests share a batch

    def decode(self, pieces, beam, max_len, no_repeat_ngram, precision, **_):
        tokens = [[self.vocab[i] for i in ids] for ids in pieces]
        results = self.translator.translate_batch(tokens, beam_size=beam, max_decoding_length=max_len,
                                                  max_batch_size=-(-len(tokens) // self.inter))
        ids = [[int(token[1:]) for token in r.hypotheses[0] if token[:1] == "t"] for r in results]
        return [self.tgt_tokenizer.decode(hyp) for hyp in ids]


def serve_ctranslate2(directory, threads, compute_type, beam):
    """The CTranslate2 server's process (python -c ...): our app and scheduler, its Translator."""
    from ..serve import build, listen

    port = int(sys.argv[sys.argv.index("--port") + 1]) if "--port" in sys.argv else 8000
    served = CTranslate2Served(directory, threads, compute_type, beam)
    app, scheduler = build({"en-es": served}, max_queue=100000, batching="batch")   # its decode: translate_batch

    async def drain(app):
        scheduler.stop()
    app.on_cleanup.append(drain)
    listen(app, "127.0.0.1", port, banner=[f"ctranslate2 layout {served.layout} (trial seconds {served.trials})"])


async def _drive(url, texts, clients, max_lens=None, refused=None):
    """`clients` concurrent clients, each sending the next text alone until none is left: (wall
    seconds, latencies in text order, answers in text order). max_lens: each text's max_len, sent
    to POST /v1/translate (None: POST /translate, the server's defaults). refused: a list that
    takes (index, status) of each answer other than 200 (its answer stays None), instead of an
    error."""
    import aiohttp

    queue = list(enumerate(texts))
    answers, latencies = [None] * len(texts), [None] * len(texts)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def client():
            while queue:
                index, text = queue.pop(0)
                body = {"q": text, "source": "en", "target": "es"}
                path = "/translate"
                if max_lens is not None:
                    body["max_len"], path = max_lens[index], "/v1/translate"
                started = time.perf_counter()
                async with session.post(url + path, json=body) as r:
                    body = await r.json(content_type=None)
                    if r.status != 200 and refused is not None:
                        refused.append((index, r.status))
                        continue
                    if r.status != 200:
                        raise RuntimeError(f"{url}: {r.status} {body}")
                latencies[index] = time.perf_counter() - started
                answers[index] = body["translatedText"] if max_lens is None else \
                    body["translations"][0]["translatedText"]
        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        return time.perf_counter() - started, latencies, answers


def _percentile(values, q):
    return float(np.percentile(np.asarray(values), q))


def run(configs=("tiny", "base"), threads=2, clients=CLIENTS, precision="int8", beam=4, requests=None,
        engines=("offline", "step", "batch", "unbatched", "ctranslate2"), data=BIBLE, stream=None, mixed=True):
    """The records (one JSON-able dict per config, engine, workload and client count) and a summary
    per config."""
    from ..checkpoint import load_for_inference
    from ..serve.documents import translate_documents
    from ..train import translate_texts
    from .decode import ctranslate2_compute_type
    from .harness import cpu_model, emit as keep

    import transformer as T

    pairs = _pairs(data)
    records = []
    for name in configs:
        directory = tempfile.mkdtemp(prefix=f"serve-bench-{name}-")
        texts = build_model(name, directory, pairs)
        model, src_tok, tgt_tok = load_for_inference(directory)
        model.params.freeze()
        base = {"bench": "serve", "config": name, "threads": threads, "precision": precision, "beam": beam,
                "max_len": MAX_LEN, "cpu": cpu_model()}
        T.set_num_threads(threads)
        counts = [requests or max(4 * n, 64) for n in clients] + [requests or 256]
        texts = texts[:max(counts)]                 # every sample below cycles through these

        def emit(record):
            keep(record, records, stream)

        def tokens(answers):
            return sum(len(tgt_tok.encode(a)) for a in answers)

        def translate(sample, max_len=MAX_LEN):
            return translate_documents(sample, "en", lambda sentences: translate_texts(
                model, src_tok, tgt_tok, sentences, beam=beam, max_len=max_len, precision=precision))
        # the oracle of every answer of ours: each text's offline translation, at each max_len asked
        offline = {MAX_LEN: dict(zip(texts, translate(texts)))}
        if mixed:
            offline[SHORT_LEN] = dict(zip(texts, translate(texts, SHORT_LEN)))
        if "offline" in engines:
            sample = texts[:requests or 256]
            translate(sample[:8])
            started = time.perf_counter()
            answers = translate(sample)
            seconds = time.perf_counter() - started
            emit({**base, "engine": "offline", "clients": None, "sentences": len(sample),
                  "sentences_per_s": round(len(sample) / seconds, 2), "tokens_per_s": round(tokens(answers) / seconds, 1)})
        servers = []
        for engine, batch_size, batching in (("step", 64, "step"), ("batch", 64, "batch"), ("unbatched", 1, "step")):
            if engine in engines:
                servers.append((engine, lambda b=batch_size, m=batching: ours(directory, threads, precision, beam, b, m)))
        if "ctranslate2" in engines:
            compute_type, why = ctranslate2_compute_type(precision)
            if compute_type is None:
                emit({**base, "engine": "ctranslate2", "skipped": why})
            else:
                servers.append(("ctranslate2", lambda: ctranslate2_server(directory, threads, compute_type, beam)))
        for engine, start in servers:
            try:
                server = start()
            except (RuntimeError, ImportError) as exc:
                emit({**base, "engine": engine, "skipped": str(exc)[:300]})
                continue
            said = next((line.split(" ", 2)[2].strip() for line in server.banner
                         if line.startswith("ctranslate2 layout")), None)
            extra = {"ctranslate2_layout": said} if said else {}

            def drive(n, count, max_lens=None):
                sample = (texts * (count // len(texts) + 1))[:count]
                seconds, latencies, answers = asyncio.run(_drive(server.url, sample, n, max_lens))
                record = {**base, **extra, "engine": engine, "clients": n, "sentences": count,
                          "sentences_per_s": round(count / seconds, 2), "tokens_per_s": round(tokens(answers) / seconds, 1),
                          "p50_s": round(_percentile(latencies, 50), 4), "p99_s": round(_percentile(latencies, 99), 4)}
                if engine != "ctranslate2":     # another engine: its own translations
                    lens = max_lens or [MAX_LEN] * count
                    record["mismatches"] = sum(a != offline[m][t] for a, t, m in zip(answers, sample, lens))
                return record, latencies
            try:
                asyncio.run(_drive(server.url, texts[:8], 2))          # warm-up
                for n, count in zip(clients, counts):
                    emit({**drive(n, count)[0], "workload": "uniform"})
                if mixed and engine in ("step", "batch"):
                    count = counts[-1]
                    max_lens = [SHORT_LEN if i % 2 else MAX_LEN for i in range(count)]
                    record, latencies = drive(MIXED_CLIENTS, count, max_lens)
                    short = [s for s, m in zip(latencies, max_lens) if m == SHORT_LEN]
                    emit({**record, "workload": "mixed", "short_len": SHORT_LEN,
                          "short_p50_s": round(_percentile(short, 50), 4), "short_p99_s": round(_percentile(short, 99), 4)})
            finally:
                server.stop()
        emit(summary([r for r in records if r.get("config") == name and r["bench"] == "serve"], base))
        shutil.rmtree(directory, ignore_errors=True)
    return records


def summary(records, base):
    """The issue's targets read off one config's records: ours (step) at 64 clients against
    offline and against unbatched, p99 at 64 clients against the latency alone (1 client), and
    against CTranslate2 at the same client count; and the mixed workload's short requests, step
    against batch."""
    def at(engine, n, workload="uniform"):
        return next((r for r in records if r["engine"] == engine and r.get("clients") == n
                     and r.get("workload", "uniform") == workload and "skipped" not in r), None)
    out = {**base, "bench": "serve_summary"}
    offline, ours, batch, unbatched, ct2 = (at("offline", None), at("step", 64), at("batch", 64), at("unbatched", 64),
                                            at("ctranslate2", 64))
    alone = at("step", 1)
    if ours and offline:
        out["step_vs_offline_at_64"] = round(ours["sentences_per_s"] / offline["sentences_per_s"], 3)
    if ours and batch:
        out["step_vs_batch_at_64"] = round(ours["sentences_per_s"] / batch["sentences_per_s"], 3)
    if ours and unbatched:
        out["step_vs_unbatched_at_64"] = round(ours["sentences_per_s"] / unbatched["sentences_per_s"], 3)
    if ours and alone:
        out["p99_at_64_vs_alone"] = round(ours["p99_s"] / alone["p50_s"], 3)
    if ours and ct2:
        out["step_vs_ctranslate2_at_64"] = round(ours["sentences_per_s"] / ct2["sentences_per_s"], 3)
        out["p99_step_vs_ctranslate2_at_64"] = round(ours["p99_s"] / ct2["p99_s"], 3)
    step_mixed, batch_mixed = at("step", MIXED_CLIENTS, "mixed"), at("batch", MIXED_CLIENTS, "mixed")
    if step_mixed and batch_mixed:
        out["mixed_short_p50_step_vs_batch"] = round(step_mixed["short_p50_s"] / batch_mixed["short_p50_s"], 3)
        out["mixed_short_p99_step_vs_batch"] = round(step_mixed["short_p99_s"] / batch_mixed["short_p99_s"], 3)
        out["mixed_throughput_step_vs_batch"] = round(step_mixed["sentences_per_s"] / batch_mixed["sentences_per_s"], 3)
    out["mismatches"] = sum(r.get("mismatches", 0) for r in records)
    return out


def table(records):
    rows = ["| config | engine | workload | clients | sentences/s | tokens/s | p50 s | p99 s | short p50 / p99 s |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        if r["bench"] != "serve" or "skipped" in r:
            continue
        short = f"{r['short_p50_s']} / {r['short_p99_s']}" if "short_p50_s" in r else "-"
        rows.append(f"| {r['config']} | {r['engine']} | {r.get('workload', '-')} | {r['clients'] or '-'} | "
                    f"{r['sentences_per_s']} | {r['tokens_per_s']} | {r.get('p50_s', '-')} | {r.get('p99_s', '-')} | "
                    f"{short} |")
    return "\n".join(rows)


# -- hostile mode (issue 58) ------------------------------------------------------------------------

CLIENTS_HOSTILE = 64         # well-formed clients of the hostile mode
HOSTILE_RATE = 10.0          # requests a second per hostile client at most
# what each hostile client sends, dealt to the clients in turn (the 8th drops requests too: the
# kind that makes the scheduler work for nobody)
HOSTILE_KINDS = ("drop_mid_request", "malformed_json", "nested_2000_deep", "form_1000_fields", "header_byte_a_second",
                 "unknown_path", "language_64_kb")
HOSTILE_WORDS = "in the beginning god created the heaven and the earth and the earth was without form".split()


async def _hostile_request(kind, session, url, port, count, stop):
    """One hostile request of `kind`: its outcome (the status, or what became of the connection)."""
    import aiohttp

    translate = url + "/translate"
    if kind == "malformed_json":
        async with session.post(translate, data='{"q": "a", "source": "en",',
                                headers={"Content-Type": "application/json"}) as r:
            return r.status
    if kind == "nested_2000_deep":
        body = '{"q": ' + "[" * 2000 + "]" * 2000 + ', "source": "en", "target": "es"}'
        async with session.post(translate, data=body, headers={"Content-Type": "application/json"}) as r:
            return r.status
    if kind == "form_1000_fields":
        form = [("q", f"a{i}") for i in range(1000)] + [("source", "en"), ("target", "es")]
        async with session.post(translate, data=form) as r:
            return r.status
    if kind == "unknown_path":
        async with session.get(f"{url}/made-up/{count}?x={count}") as r:
            return r.status
    if kind == "language_64_kb":
        async with session.post(translate, json={"q": "a", "source": f"{count:05d}" + "x" * (64 * 1024 - 5),
                                                 "target": "es"}) as r:
            return r.status
    if kind == "drop_mid_request":      # five sentences, the connection dropped after 0-20 ms
        rng = random.Random(count)
        texts = [" ".join(rng.choices(HOSTILE_WORDS, k=rng.randint(3, 12))) for _ in range(5)]
        try:
            async with session.post(url + "/v1/translate", json={"q": texts, "source": "en", "target": "es"},
                                    timeout=aiohttp.ClientTimeout(total=0.001 + 0.02 * rng.random())) as r:
                await r.read()
                return r.status
        except asyncio.TimeoutError:
            return "dropped"
    if kind == "header_byte_a_second":  # until the server cuts it off (--header-timeout) or the run ends
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            while not stop.is_set():
                writer.write(b"X")
                await writer.drain()
                try:
                    line = await asyncio.wait_for(reader.readline(), 1.0)
                except asyncio.TimeoutError:
                    continue
                return line.split()[1].decode() if line.startswith(b"HTTP/") else "closed"
            return "unfinished"
        except ConnectionError:
            return "closed"
        finally:
            writer.close()
    raise ValueError(f"unknown hostile kind {kind!r}")


async def _hostile(url, clients, rate, stop):
    """`clients` hostile clients until `stop` is set: {kind: {outcome: count}}."""
    import aiohttp

    port = int(url.rsplit(":", 1)[1])
    outcomes = {}

    async def client(kind):
        counts = outcomes.setdefault(kind, {})
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            sent = 0
            while not stop.is_set():
                started = time.monotonic()
                try:
                    outcome = await _hostile_request(kind, session, url, port, sent, stop)
                except (aiohttp.ClientError, OSError) as exc:
                    outcome = type(exc).__name__
                sent += 1
                counts[str(outcome)] = counts.get(str(outcome), 0) + 1
                if rate:
                    try:
                        await asyncio.wait_for(stop.wait(), max(0.0, 1.0 / rate - (time.monotonic() - started)))
                    except asyncio.TimeoutError:
                        pass
    await asyncio.gather(*(client(HOSTILE_KINDS[i % len(HOSTILE_KINDS)]) for i in range(clients)))
    return outcomes


def hostile_clients(url, clients, rate):
    """The hostile clients' process (python -c ...): they run until its stdin closes, then it
    prints their outcomes as one JSON line."""
    import threading

    async def main():
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        threading.Thread(target=lambda: (sys.stdin.read(), loop.call_soon_threadsafe(stop.set)), daemon=True).start()
        return await _hostile(url, clients, rate, stop)
    print(json.dumps(asyncio.run(main())), flush=True)


class HostileClients:
    """The hostile clients in a process of their own (their event loop and interpreter are not the
    well-formed clients'), from start() to stop() (their outcomes)."""

    def __init__(self, url, clients, rate):
        code = f"from transformer.bench.serve import hostile_clients; hostile_clients({url!r}, {clients}, {rate})"
        env = {**os.environ, "PYTHONPATH": _checkout()}     # this `transformer`, wherever it was started
        # run outside the working directory: `-c` puts it first on the path, and a checkout's own
        # transformer/ folder (no compiled module when the package was installed) would shadow it
        self.process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, env=env, cwd=tempfile.gettempdir())

    def stop(self):
        out, _ = self.process.communicate("", timeout=60)
        return json.loads(out.strip().splitlines()[-1]) if out.strip() else {}


def _checkout():
    """The directory this `transformer` package is imported from."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _translate_200s(url):
    """The server's count of POST /translate answered 200 (GET /metrics)."""
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    found = re.search(r'transformer_requests_total\{endpoint="/translate",status="200"\} (\d+)', text)
    return int(found.group(1)) if found else 0


def run_hostile(config="tiny", threads=2, precision="int8", beam=4, clients=CLIENTS_HOSTILE, hostile=8,
                requests=512, rounds=2, rate=HOSTILE_RATE, baseline=None, data=BIBLE, stream=None, served=None):
    """The hostile mode's records (module docstring): per round, server and load one record, then a
    summary. baseline: the directory of another checkout whose server answers the same
    well-formed load (no hostile clients: an older server may answer them with 500s). served:
    (model directory, English texts) to serve instead of `config`'s model built with random
    weights (the tests' small model)."""
    from ..checkpoint import load_for_inference
    from ..serve.documents import translate_documents
    from ..train import translate_texts
    from .harness import cpu_model, emit as keep

    import transformer as T

    records = []

    def emit(record):
        keep(record, records, stream)
    directory = served[0] if served else tempfile.mkdtemp(prefix=f"serve-hostile-{config}-")
    try:
        texts = served[1] if served else build_model(config, directory, _pairs(data))
        model, src_tok, tgt_tok = load_for_inference(directory)
        model.params.freeze()
        T.set_num_threads(threads)
        sample = (texts * (requests // len(texts) + 1))[:requests]
        offline = dict(zip(sample, translate_documents(sample, "en", lambda sentences: translate_texts(
            model, src_tok, tgt_tok, sentences, beam=beam, max_len=MAX_LEN, precision=precision))))
        base = {"bench": "serve_hostile", "config": config, "threads": threads, "precision": precision,
                "beam": beam, "max_len": MAX_LEN, "clients": clients, "sentences": len(sample), "hostile_rate": rate,
                "cpu": cpu_model()}
        servers = {"ours": ours(directory, threads, precision, beam, 64, checkout=_checkout())}
        try:
            if baseline:
                try:
                    servers["baseline"] = ours(directory, threads, precision, beam, 64, checkout=baseline)
                except RuntimeError as exc:     # it did not start (not built, other flags): said, not fatal
                    emit({**base, "engine": "baseline", "checkout": baseline, "skipped": str(exc)[-300:]})
                    baseline = None
            for server in servers.values():
                asyncio.run(_drive(server.url, sample[:8], 2))        # warm-up
            loads = [("ours", 0), ("ours", hostile)] + ([("baseline", 0)] if baseline else [])
            for round_ in range(rounds):
                for name, attackers in (loads if round_ % 2 == 0 else loads[::-1]):
                    server = servers[name]
                    attack = HostileClients(server.url, attackers, rate) if attackers else None
                    if attack:
                        time.sleep(1.0)             # every hostile client under way
                    before = _translate_200s(server.url)
                    refused = []
                    seconds, latencies, answers = asyncio.run(_drive(server.url, sample, clients, refused=refused))
                    outcomes = attack.stop() if attack else None
                    accepted = [i for i, a in enumerate(answers) if a is not None]
                    record = {**base, "engine": name, "round": round_, "hostile": attackers,
                              "sentences_per_s": round(len(sample) / seconds, 2),
                              "p50_s": round(_percentile([latencies[i] for i in accepted] or [0], 50), 4),
                              "p99_s": round(_percentile([latencies[i] for i in accepted] or [0], 99), 4),
                              "accepted": len(accepted), "refused": len(refused),
                              "mismatches": sum(answers[i] != offline[sample[i]] for i in accepted),
                              "answered_once": _translate_200s(server.url) - before == len(accepted)}
                    if outcomes is not None:
                        record["hostile_outcomes"] = outcomes
                    emit(record)
        finally:
            for server in servers.values():
                server.stop()
    finally:
        if not served:
            shutil.rmtree(directory, ignore_errors=True)
    emit(hostile_summary(records, base))
    return records


def hostile_summary(records, base):
    """Throughput at `clients` with and without the hostile clients (means over the rounds), the
    ratio, and against the baseline's; every check summed."""
    runs = [r for r in records if "skipped" not in r]

    def mean(engine, attacked):
        values = [r["sentences_per_s"] for r in runs if r["engine"] == engine and bool(r["hostile"]) == attacked]
        return round(sum(values) / len(values), 2) if values else None
    out = {**base, "bench": "serve_hostile_summary"}
    clean, attacked, baseline = mean("ours", False), mean("ours", True), mean("baseline", False)
    out.update(ours_sentences_per_s=clean, ours_with_hostile_sentences_per_s=attacked)
    if clean and attacked:
        out["with_hostile_vs_without"] = round(attacked / clean, 3)
    if baseline:
        out["baseline_sentences_per_s"] = baseline
        out["without_hostile_vs_baseline"] = round(clean / baseline, 3)
        out["with_hostile_vs_baseline"] = round(attacked / baseline, 3)
        # each round's runs ran within seconds of each other: their ratios, paired, are steadier than
        # the ratio of the means when the machine's speed drifts between rounds
        paired = {}
        for r in runs:
            paired.setdefault(r["round"], {})[(r["engine"], bool(r["hostile"]))] = r["sentences_per_s"]
        for name, key in (("without_hostile", ("ours", False)), ("with_hostile", ("ours", True))):
            ratios = sorted(p[key] / p[("baseline", False)] for p in paired.values()
                            if key in p and ("baseline", False) in p)
            if ratios:
                out[f"{name}_vs_baseline_paired_median"] = round(statistics.median(ratios), 3)
                out[f"{name}_vs_baseline_paired_spread"] = [round(ratios[0], 3), round(ratios[-1], 3)]
    out["mismatches"] = sum(r["mismatches"] for r in runs)
    out["refused"] = sum(r["refused"] for r in runs)
    out["answered_once"] = all(r["answered_once"] for r in runs)
    out["hostile_5xx"] = sum(n for r in runs for kind in r.get("hostile_outcomes", {}).values()
                             for outcome, n in kind.items() if outcome.startswith("5"))
    return out
