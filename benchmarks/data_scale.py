"""Cost of the data path as the corpus grows: generate large corpora, measure a command on them.

    python benchmarks/data_scale.py generate --pairs N --out FILE.tsv
                                             [--source ../shared/data/bible-eng-spa.tsv.gz] [--seed 0]
    python benchmarks/data_scale.py measure --label LABEL --corpus FILE_OR_DIR --json OUT.jsonl
                                            [--python PY] [--pairs N] [--cwd DIR] [--keep-out]
                                            [--ranks N] -- ARGV...
    python benchmarks/data_scale.py encode-rate --corpus FILE --prepared DIR --json OUT.jsonl [--limit N]
    python benchmarks/data_scale.py suite --corpora DIR --json OUT.jsonl [--sizes 30k,300k,1m,3m,10m]
                                          [--steps 20] [--ranks 2]
    python benchmarks/data_scale.py table --json OUT.jsonl

`suite` is the issue's whole table for each size: the corpus generated when missing, `transformer
prepare` measured (label after-prepare), the tokenizers' own encode_batch on the corpus's first
pairs (encode-rate: the limit for preparation), `train --data PREPARED --max-steps 20` measured
(after-train), and the same training under `mpiexec -n 2` (ranks 2: the PSS of two ranks that
map the same files). `table` prints the table of benchmarks/notes/2026-11-29-data-scale.md from
the records, the `before` ones (today's path before prepared data, measured with
`measure --label before`) beside them.

`generate` writes a tab-separated corpus (header `eng<TAB>spa`) of N English-Spanish pairs made from
the Bible pairs (a gzip'd TSV with header `ref<TAB>eng<TAB>spa`, about 29.5 k verses). Only the
verses whose English side is at or below the median length in words are used (M of them, each
English and each Spanish text once); pair i joins two of them, `eng_a + " " + eng_b` and
`spa_a + " " + spa_b`, for an ordered pair (a, b), a != b. The pairs (a, b) are the images of
0, 1, 2, ... under a seeded permutation of the index space a*M + b (a keyed Feistel network with
cycle walking, computed in chunks with numpy), so no (a, b) comes twice, nothing of size N is held
in memory, and the same N and seed give byte-identical files. It prints the pairs, bytes and seconds.

`measure` runs `PY -m transformer ARGV...` as a subprocess; in ARGV, `{corpus}` becomes the corpus
path and `{out}` a fresh temporary directory (removed afterwards unless --keep-out). Every
SAMPLE_S (50 ms) until the command exits it samples the command's process and all its
descendants (found through the parent links in /proc/*/stat, so the ranks under mpiexec, its
grandchildren, count) and reads for each process:

    VmRSS   (/proc/PID/status)        resident memory, including mapped file pages it touched
    RssAnon (/proc/PID/status)        resident private (anonymous) memory: the heap, the arrays
    Pss     (/proc/PID/smaps_rollup)  resident memory with each shared page divided among the
                                      processes that map it (page-cache pages of a file mapped by
                                      two ranks count half to each)

VmRSS and RssAnon are counters the kernel keeps: reading them costs microseconds. Pss is not: the
kernel walks every page of the process to compute it (about 35 ms for a Python process with 4 GB
of heap in 4 KB pages, so reading it every 50 ms would take most of a core from the command it
measures on a 2-core machine). Pss is therefore read at the first sample and then no more often
than keeps the time spent reading it under PSS_CPU_SHARE (2%) of a core: every 50 ms for a small
process, every few seconds for one of 10 GB; `pss_samples` says how many samples read it. The set
of processes (the /proc walk, about 1 ms) is looked up again every TREE_REFRESH_S (0.5 s).

It appends one JSON line to OUT.jsonl (and prints it) with:

    bench, label, pairs, corpus, corpus_bytes, argv, returncode
    wall_s             seconds from starting the command to its exit
    first_step_s       seconds from starting the command until the training log {out}/log.jsonl
                       first showed step 1 (null if no log appeared)
    steps              the last step the log showed
    step_s             (time step N first seen - time step 1 first seen) / (N - 1) for that last
                       step N: the step time, evaluations included, at 50 ms resolution
    peak_rss_mb, peak_rss_anon_mb, peak_pss_mb
                       the peak over the samples of the largest single process's figure, in MB
                       (10^6 bytes)
    peak_rss_sum_mb, peak_rss_anon_sum_mb, peak_pss_sum_mb
                       the peak over the samples of the sum over the processes (the command and
                       its descendants at that instant)
    samples, pss_samples, max_processes, sampler_cpu_s
                       how many samples were taken (and how many of them read Pss), the most
                       processes seen in one, and the CPU seconds this script spent sampling
                       (what the sampling took from the machine)
    command_cpu_s      CPU seconds (user + system) of the command and the descendants it waited for
    other_cpu_s        CPU seconds the rest of the machine used meanwhile (/proc/stat's busy time
                       less the command's and this script's): what else ran, which the figures
                       above do not show; on a 2-core machine a few seconds of it slow the command
    cpu, cores, date   /proc/cpuinfo's model name with "family F model M", os.cpu_count(), and
                       the UTC time the command started
    stderr_tail        the last 2000 characters of the command's stderr, when it failed

Standard library and numpy only; Linux only for `measure` (it reads /proc). No timings are
asserted anywhere: this is a benchmark, not a test.
"""
import argparse
import datetime
import gzip
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

BENCH = "data_scale"
SAMPLE_S = 0.05               # the sampling period of memory and of the training log
TREE_REFRESH_S = 0.5          # how often the set of processes is looked up again in /proc
PSS_CPU_SHARE = 0.02          # at most this share of a core goes into reading smaps_rollup (Pss)
STDERR_TAIL_CHARS = 2000      # how much of a failed command's stderr the record keeps
MB = 1e6
DEFAULT_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data",
                              "bible-eng-spa.tsv.gz")
FEISTEL_ROUNDS = 4
CHUNK_PAIRS = 50_000          # pairs generated and written at a time
ENCODE_CHUNK = 16384          # transformer/corpus/preparation.py's CHUNK_PAIRS


# ----------------------------------------------------------------------------------------------
# generate
# ----------------------------------------------------------------------------------------------

def clean_field(text):
    """The text with tabs, carriage returns and newlines made spaces and the ends stripped."""
    return text.replace("\t", " ").replace("\r", " ").replace("\n", " ").strip()


def read_bible_pairs(source):
    """The (eng, spa) pairs of a plain or gzip'd TSV whose header names `eng` and `spa` columns.

    Fields are cleaned (clean_field); a line with an empty side or too few fields is skipped.
    """
    with open(source, "rb") as probe:
        gzipped = probe.read(2) == b"\x1f\x8b"
    opener = gzip.open if gzipped else open
    pairs = []
    with opener(source, "rt", encoding="utf-8", newline="\n") as lines:
        header = lines.readline().rstrip("\r\n").split("\t")
        try:
            eng_col, spa_col = header.index("eng"), header.index("spa")
        except ValueError:
            raise SystemExit(f"{source}: the header {header} names no `eng` and `spa` columns") from None
        for line in lines:
            fields = line.rstrip("\r\n").split("\t")
            if len(fields) <= max(eng_col, spa_col):
                continue
            eng, spa = clean_field(fields[eng_col]), clean_field(fields[spa_col])
            if eng and spa:
                pairs.append((eng, spa))
    return pairs


def short_distinct_verses(pairs):
    """The pairs whose English side is at or below the median length in words, each text once.

    A verse whose English or Spanish text came earlier is dropped, so that joining two different
    verses never gives the line another join gives.
    """
    lengths = np.array([len(eng.split()) for eng, _ in pairs])
    median = float(np.median(lengths))
    seen_eng, seen_spa, short = set(), set(), []
    for (eng, spa), length in zip(pairs, lengths):
        if length <= median and eng not in seen_eng and spa not in seen_spa:
            seen_eng.add(eng)
            seen_spa.add(spa)
            short.append((eng, spa))
    return short, median


class KeyedPermutation:
    """A seeded bijection of [0, size), evaluated on numpy arrays of uint64.

    A balanced Feistel network over 2^(2*half_bits) >= size (FEISTEL_ROUNDS rounds, each with a
    multiplicative hash of one half keyed from the seed) is a bijection of that power of two;
    values that land at or beyond `size` are sent through it again (cycle walking) until they
    land inside, which keeps it a bijection of [0, size). The keys come from blake2b of the seed,
    so the permutation is the same on every machine and numpy version.
    """

    MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)

    def __init__(self, size, seed):
        self.size = int(size)
        bits = max(2, (self.size - 1).bit_length())
        self.half_bits = (bits + 1) // 2
        self.mask = np.uint64((1 << self.half_bits) - 1)
        self.keys = [np.uint64(int.from_bytes(hashlib.blake2b(f"{seed}:{r}".encode(), digest_size=8).digest(),
                                              "little")) for r in range(FEISTEL_ROUNDS)]

    def _round_function(self, half, key):
        """A keyed hash of one half, reduced to half_bits bits."""
        mixed = (half ^ key) * self.MULTIPLIER               # wraps modulo 2^64, as intended
        return (mixed >> np.uint64(64 - self.half_bits)) & self.mask

    def _feistel(self, values):
        left, right = values >> np.uint64(self.half_bits), values & self.mask
        for key in self.keys:
            left, right = right, left ^ self._round_function(right, key)
        return (left << np.uint64(self.half_bits)) | right

    def __call__(self, indexes):
        """The images of `indexes` (each in [0, size))."""
        values = self._feistel(np.asarray(indexes, dtype=np.uint64))
        outside = values >= self.size
        while outside.any():
            values[outside] = self._feistel(values[outside])
            outside = values >= self.size
        return values


def pair_indexes(count, verses, seed):
    """Yield arrays (a, b) of verse indexes, CHUNK_PAIRS at a time, `count` in all, each (a, b) once.

    The ordered pairs are the permutation's images of 0, 1, 2, ... in the space a*M + b, with the
    pairs a == b left out.
    """
    m = verses
    if count > m * (m - 1):
        raise SystemExit(f"--pairs {count}: {m} verses make only {m * (m - 1)} distinct ordered pairs")
    permutation = KeyedPermutation(m * m, seed)
    produced, position = 0, 0
    while produced < count:
        want = min(CHUNK_PAIRS, count - produced)
        # a == b is about 1/M of the space: ask for a little more than wanted, then cut
        span = want + want // max(m - 1, 1) + 16
        images = permutation(np.arange(position, position + span, dtype=np.uint64))
        position += span
        a, b = np.divmod(images, np.uint64(m))
        keep = a != b
        a, b = a[keep][:want], b[keep][:want]
        if len(a):                                   # the indexes cut off come next time
            position -= span - int(np.flatnonzero(keep)[len(a) - 1]) - 1
        produced += len(a)
        yield a, b


def generate(pairs, out, source, seed):
    """Write `pairs` recombined Bible pairs to `out` (header `eng<TAB>spa`); returns (bytes, seconds)."""
    started = time.perf_counter()
    short, median = short_distinct_verses(read_bible_pairs(source))
    eng = [e for e, _ in short]
    spa = [s for _, s in short]
    print(f"{len(short)} verses with at most {median:g} English words (the median), each text once; "
          f"{len(short) * (len(short) - 1):,} ordered pairs of them", file=sys.stderr)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    partial = out + ".partial"
    with open(partial, "w", encoding="utf-8", newline="\n") as f:
        f.write("eng\tspa\n")
        for a, b in pair_indexes(pairs, len(short), seed):
            f.write("".join([f"{eng[i]} {eng[j]}\t{spa[i]} {spa[j]}\n" for i, j in zip(a.tolist(), b.tolist())]))
    os.replace(partial, out)
    return os.path.getsize(out), time.perf_counter() - started


# ----------------------------------------------------------------------------------------------
# measure
# ----------------------------------------------------------------------------------------------

def parent_links():
    """{pid: ppid} for every process in /proc (processes that vanish while read are left out)."""
    links = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # the command name is in parentheses and may hold spaces: the fields after the last ")"
        fields = stat[stat.rfind(b")") + 2:].split()
        links[int(name)] = int(fields[1])
    return links


def process_tree(root):
    """The pid `root` and all its descendants alive now."""
    children = {}
    for pid, ppid in parent_links().items():
        children.setdefault(ppid, []).append(pid)
    tree, pending = [], [root]
    while pending:
        pid = pending.pop()
        tree.append(pid)
        pending.extend(children.get(pid, ()))
    return tree


def memory_of(pid, with_pss):
    """{"rss", "rss_anon"[, "pss"]} of one process in bytes, or None once it is gone (or a zombie)."""
    figures = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    figures["rss"] = int(line.split()[1]) * 1024
                elif line.startswith("RssAnon:"):
                    figures["rss_anon"] = int(line.split()[1]) * 1024
        if len(figures) < 2:          # a zombie has no memory lines
            return None
        if not with_pss:
            return figures
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    figures["pss"] = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError):
        return None
    return figures if len(figures) == 3 else None


class MemoryPeaks:
    """The peaks, over samples, of the largest process's and of the summed memory figures.

    Pss is read only when the time spent reading it so far allows (PSS_CPU_SHARE; see the module
    docstring), the process tree only every TREE_REFRESH_S.
    """

    QUANTITIES = ("rss", "rss_anon", "pss")

    def __init__(self, root):
        self.root = root
        self.single = dict.fromkeys(self.QUANTITIES, 0)
        self.summed = dict.fromkeys(self.QUANTITIES, 0)
        self.samples = 0
        self.pss_samples = 0
        self.max_processes = 0
        self.tree, self.tree_read_at = [], None
        self.next_pss_at = 0.0

    def sample(self, now):
        """Read the memory of the root process and its descendants now and update the peaks."""
        if self.tree_read_at is None or now - self.tree_read_at >= TREE_REFRESH_S:
            self.tree, self.tree_read_at = process_tree(self.root), now
        with_pss = now >= self.next_pss_at
        started = time.monotonic()
        figures = [m for m in (memory_of(pid, with_pss) for pid in self.tree) if m is not None]
        if with_pss:
            self.next_pss_at = now + max(SAMPLE_S, (time.monotonic() - started) / PSS_CPU_SHARE)
        if not figures:
            return
        self.samples += 1
        self.pss_samples += with_pss
        self.max_processes = max(self.max_processes, len(figures))
        for q in self.QUANTITIES if with_pss else self.QUANTITIES[:2]:
            self.single[q] = max(self.single[q], max(m[q] for m in figures))
            self.summed[q] = max(self.summed[q], sum(m[q] for m in figures))

    def record(self):
        """The peaks in MB, as the JSON record names them."""
        record = {}
        for q in self.QUANTITIES:
            record[f"peak_{q}_mb"] = round(self.single[q] / MB, 1)
        for q in self.QUANTITIES:
            record[f"peak_{q}_sum_mb"] = round(self.summed[q] / MB, 1)
        record["samples"] = self.samples
        record["pss_samples"] = self.pss_samples
        record["max_processes"] = self.max_processes
        return record


class TrainingLogWatcher:
    """Follows a training log (one JSON object per line with a "step") and when each step first showed."""

    def __init__(self, path, started):
        self.path = path
        self.started = started
        self.offset = 0
        self.pending = b""
        self.first_seen = {}          # step -> seconds since `started` when a line of it first showed

    def poll(self, now):
        """Read what was appended since the last poll; lines not yet ended wait for the next."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        self.offset += len(data)
        *lines, self.pending = (self.pending + data).split(b"\n")
        for line in lines:
            try:
                step = json.loads(line).get("step")
            except (ValueError, AttributeError):
                continue
            if isinstance(step, int) and step not in self.first_seen:
                self.first_seen[step] = now - self.started

    def record(self):
        """first_step_s, steps and step_s (see the module docstring); None where the log says nothing."""
        if not self.first_seen:
            return {"first_step_s": None, "steps": None, "step_s": None}
        last = max(self.first_seen)
        first = self.first_seen.get(1)
        step_s = None
        if first is not None and last > 1:
            step_s = round((self.first_seen[last] - first) / (last - 1), 3)
        return {"first_step_s": None if first is None else round(first, 2), "steps": last, "step_s": step_s}


def cpu_model():
    """The CPU's model name with its family and model numbers, as /proc/cpuinfo gives them."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break                      # the first processor's block is enough
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        return None
    return f"{fields.get('model name', '?')}, family {fields.get('cpu family', '?')} model {fields.get('model', '?')}"


def machine_busy_seconds():
    """CPU seconds all cores have spent busy since boot (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")   # guest time is inside user time


def corpus_bytes(path):
    """The size of a corpus file, or the total size of the files under a directory."""
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(d, name)) for d, _, names in os.walk(path) for name in names)
    return os.path.getsize(path)


def count_pairs(path):
    """The lines of a (plain or gzip'd) TSV corpus less its header line; None for a directory."""
    if os.path.isdir(path):
        return None
    with open(path, "rb") as probe:
        gzipped = probe.read(2) == b"\x1f\x8b"
    lines = 0
    with (gzip.open if gzipped else open)(path, "rb") as f:
        while block := f.read(1 << 24):
            lines += block.count(b"\n")
    return lines - 1


def mpiexec_beside(python):
    """The mpiexec of the interpreter's environment (the [mpi] extra puts one there), else PATH's."""
    found = shutil.which("mpiexec", path=os.path.dirname(python) + os.pathsep + os.environ.get("PATH", ""))
    if found is None:
        raise SystemExit("--ranks needs mpiexec (pip install \".[mpi]\")")
    return found


def measure(label, corpus, json_path, python, pairs, argv, cwd=None, keep_out=False, ranks=1):
    """Run `python -m transformer argv` once (under `mpiexec -n ranks` when ranks > 1), sampling it;
    append its record to json_path and return it."""
    out_dir = tempfile.mkdtemp(prefix="data_scale-out-")
    argv = [arg.replace("{corpus}", corpus).replace("{out}", out_dir) for arg in argv]
    command = [python, "-m", "transformer", *argv]
    if ranks > 1:
        command = [mpiexec_beside(python), "-n", str(ranks), *command]
    stderr_file = tempfile.TemporaryFile()
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    sampler_cpu_before = time.process_time()
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    machine_before = machine_busy_seconds()
    started = time.monotonic()
    log = TrainingLogWatcher(os.path.join(out_dir, "log.jsonl"), started)
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr_file, cwd=cwd)
    peaks = MemoryPeaks(process.pid)
    try:
        while True:
            finished = process.poll() is not None
            now = time.monotonic()
            if not finished:
                peaks.sample(now)
            log.poll(now)
            if finished:
                break
            time.sleep(max(0.0, SAMPLE_S - (time.monotonic() - now)))
        wall_s = time.monotonic() - started
    except BaseException:
        process.kill()
        process.wait()
        raise
    sampler_cpu_s = time.process_time() - sampler_cpu_before
    children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    command_cpu_s = (children_after.ru_utime - children_before.ru_utime
                     + children_after.ru_stime - children_before.ru_stime)
    other_cpu_s = machine_busy_seconds() - machine_before - command_cpu_s - sampler_cpu_s
    record = {"bench": BENCH, "label": label, "ranks": ranks,
              "pairs": pairs if pairs is not None else count_pairs(corpus),
              "corpus": corpus, "corpus_bytes": corpus_bytes(corpus), "argv": argv,
              "returncode": process.returncode, "wall_s": round(wall_s, 2), **log.record(),
              **peaks.record(), "sampler_cpu_s": round(sampler_cpu_s, 2),
              "command_cpu_s": round(command_cpu_s, 2), "other_cpu_s": round(max(other_cpu_s, 0.0), 2),
              "cpu": cpu_model(), "cores": os.cpu_count(), "date": date}
    if process.returncode != 0:
        stderr_file.seek(0)
        record["stderr_tail"] = stderr_file.read().decode("utf-8", "replace")[-STDERR_TAIL_CHARS:]
    stderr_file.close()
    if keep_out:
        record["out"] = out_dir
    else:
        shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
    with open(json_path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps(record), flush=True)
    return record


# ----------------------------------------------------------------------------------------------
# the tokenizer's own rate, the suite, the table
# ----------------------------------------------------------------------------------------------

def encode_rate(corpus, prepared, json_path, limit, src_col="eng", tgt_col="spa", corpus_pairs=None):
    """The rate of the tokenizers of `prepared` encoding the first `limit` pairs of `corpus` with
    their own batch encoder, both sides, the lines already in memory: the limit for preparation's
    encoding pass (which also reads, splits, flattens and writes). Timed as one call a side and in
    preparation's chunks; the record's rate is the faster (the reference at its fastest)."""
    from transformer.corpus import PreparedCorpus
    from transformer.data import iter_pairs

    tokenizers = PreparedCorpus(prepared, verify=False).tokenizers
    src, tgt = [], []
    for s, t in iter_pairs(corpus, src_col, tgt_col):
        src.append(s)
        tgt.append(t)
        if len(src) >= limit:
            break
    rates = {}
    for chunk in (len(src), ENCODE_CHUNK):       # one call a side, and preparation's chunks
        started = time.perf_counter()
        for side, texts in (("src", src), ("tgt", tgt)):
            for start in range(0, len(texts), chunk):
                tokenizers[side].encode_batch(texts[start:start + chunk])
        rates[chunk] = len(src) / (time.perf_counter() - started)
    best = max(rates, key=rates.get)           # the reference at its fastest setting
    record = {"bench": BENCH, "label": "tokenizer-encode-batch", "corpus": corpus,
              "pairs": corpus_pairs if corpus_pairs is not None else len(src), "encoded_pairs": len(src),
              "seconds": round(len(src) / rates[best], 2), "pairs_per_s": round(rates[best], 1),
              "chunk": best, "pairs_per_s_by_chunk": {str(k): round(v, 1) for k, v in rates.items()},
              "cpu": cpu_model(),
              "cores": os.cpu_count(),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    with open(json_path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps(record), flush=True)
    return record


SIZES = {"30k": 30_000, "300k": 300_000, "1m": 1_000_000, "3m": 3_000_000, "10m": 10_000_000}


def suite(sizes, corpora, json_path, python, steps, ranks, encode_limit):
    """For each size: generate the corpus if missing (corpora/bible-SIZE.tsv), prepare it
    (measured), the tokenizer's own rate on its first pairs, train on the prepared directory
    (measured), and with ranks > 1 the same training under mpiexec."""
    for size in sizes:
        pairs = SIZES[size]
        corpus = os.path.join(corpora, f"bible-{size}.tsv")
        if not os.path.exists(corpus):
            generate(pairs, corpus, DEFAULT_SOURCE, 0)
        prepared = os.path.join(corpora, f"prepared-{size}")
        measure("after-prepare", corpus, json_path, python, pairs,
                ["prepare", "--data", "{corpus}", "--src-col", "eng", "--tgt-col", "spa", "--out", prepared,
                 "--overwrite", "--quiet"])
        with open(os.path.join(prepared, "manifest.json"), encoding="utf-8") as f:
            manifest = json.load(f)
        phases = {"bench": BENCH, "label": "after-prepare-phases", "pairs": pairs, "corpus": corpus,
                  "seconds": manifest["seconds"], "counts": manifest["counts"], "bpe": manifest["bpe"],
                  "cpu": cpu_model(), "cores": os.cpu_count()}
        with open(json_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(phases) + "\n")
        encode_rate(corpus, prepared, json_path, min(pairs, encode_limit), corpus_pairs=pairs)
        train = ["train", "--data", "{corpus}", "--max-steps", str(steps), "--out", "{out}", "--quiet"]
        measure("after-train", prepared, json_path, python, pairs, train)
        if ranks > 1:
            measure("after-train", prepared, json_path, python, pairs, train, ranks=ranks)


def table(json_path):
    """The JSONL's latest records per (label, pairs, ranks) as the table of its note (benchmarks/notes/)."""
    latest = {}
    with open(json_path, encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            latest[(record["label"], record["pairs"], record.get("ranks", 1))] = record
    sizes = sorted({pairs for _, pairs, _ in latest})
    rows = ["| pairs | before: to step 1 | before: RssAnon | prepare | prepare pairs/s | tokenizer's own "
            "pairs/s | ratio | encoding pass pairs/s (ratio) | prepare peak RSS | after: to step 1 | after: step "
            "| after: RssAnon | after: RSS | 2 ranks: PSS sum / 1 rank's PSS |", "|" + "---|" * 14]

    def get(label, pairs, key, ranks=1, fmt="{:,.1f}"):
        record = latest.get((label, pairs, ranks))
        return fmt.format(record[key]) if record and record.get(key) is not None else "-"

    for pairs in sizes:
        prepare, own = latest.get(("after-prepare", pairs, 1)), latest.get(("tokenizer-encode-batch", pairs, 1))
        rate = pairs / prepare["wall_s"] if prepare else None
        ratio = f"{rate / own['pairs_per_s']:.2f}x" if prepare and own else "-"
        phases = latest.get(("after-prepare-phases", pairs, 1))
        encoding = "-"
        if phases and own:
            train_pairs = phases["counts"]["train"]
            pass_rate = train_pairs / phases["seconds"]["encode"]
            encoding = f"{pass_rate:,.0f} ({pass_rate / own['pairs_per_s']:.2f}x)"
        one, two = latest.get(("after-train", pairs, 1)), latest.get(("after-train", pairs, 2))
        shared = f"{two['peak_pss_sum_mb'] / one['peak_pss_mb']:.2f}x" if one and two else "-"
        rows.append(f"| {pairs:,} | {get('before', pairs, 'first_step_s')} s | {get('before', pairs, 'peak_rss_anon_mb')} MB "
                    f"| {get('after-prepare', pairs, 'wall_s')} s | {f'{rate:,.0f}' if rate else '-'} "
                    f"| {get('tokenizer-encode-batch', pairs, 'pairs_per_s', fmt='{:,.0f}')} | {ratio} | {encoding} "
                    f"| {get('after-prepare', pairs, 'peak_rss_mb')} MB | {get('after-train', pairs, 'first_step_s')} s "
                    f"| {get('after-train', pairs, 'step_s', fmt='{:.3f}')} s "
                    f"| {get('after-train', pairs, 'peak_rss_anon_mb')} MB | {get('after-train', pairs, 'peak_rss_mb')} MB "
                    f"| {shared} |")
    return "\n".join(rows)


# ----------------------------------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------------------------------

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    gen = commands.add_parser("generate", help="write a corpus of N distinct pairs made from the Bible pairs")
    gen.add_argument("--pairs", type=int, required=True, help="how many pairs to write")
    gen.add_argument("--out", required=True, help="the TSV file to write")
    gen.add_argument("--source", default=DEFAULT_SOURCE, help="the Bible pairs (TSV, header ref/eng/spa)")
    gen.add_argument("--seed", type=int, default=0, help="chooses which pairs of verses are joined")

    meas = commands.add_parser("measure", help="run `PY -m transformer ARGV...` and record its time and memory")
    meas.add_argument("--label", required=True, help="names the code path measured, e.g. before or after")
    meas.add_argument("--corpus", required=True, help="the corpus file or prepared directory; {corpus} in ARGV")
    meas.add_argument("--json", required=True, help="the JSONL file to append the record to")
    meas.add_argument("--python", default=sys.executable, help="the interpreter that runs -m transformer")
    meas.add_argument("--pairs", type=int, help="the corpus's pairs (default: its lines less the header)")
    meas.add_argument("--cwd", help="the command's working directory (default: this one)")
    meas.add_argument("--keep-out", action="store_true", help="keep {out} and name it in the record")
    meas.add_argument("--ranks", type=int, default=1, help="run it under mpiexec -n RANKS")
    meas.add_argument("argv", nargs=argparse.REMAINDER, help="-- then the transformer command's arguments")

    rate = commands.add_parser("encode-rate", help="the tokenizer's own encode_batch rate on a corpus's first pairs")
    rate.add_argument("--corpus", required=True)
    rate.add_argument("--prepared", required=True, help="the prepared directory whose tokenizers encode")
    rate.add_argument("--json", required=True)
    rate.add_argument("--limit", type=int, default=1_000_000, help="pairs encoded (default 1,000,000)")
    rate.add_argument("--pairs", type=int, help="the corpus's pairs, which the record is filed under (default: those encoded)")

    run = commands.add_parser("suite", help="generate, prepare, the tokenizer's rate, train: every size")
    run.add_argument("--sizes", default="30k,300k,1m,3m,10m", help=f"of {', '.join(SIZES)}")
    run.add_argument("--corpora", required=True, help="the folder of the corpora and prepared directories")
    run.add_argument("--json", required=True)
    run.add_argument("--python", default=sys.executable)
    run.add_argument("--steps", type=int, default=20, help="training steps of each run (default 20)")
    run.add_argument("--ranks", type=int, default=2, help="also train under mpiexec -n RANKS (1: not)")
    run.add_argument("--encode-limit", type=int, default=1_000_000,
                     help="pairs the tokenizer's own rate is measured on (default 1,000,000)")

    show = commands.add_parser("table", help="print the README's table from the records")
    show.add_argument("--json", required=True)

    args = parser.parse_args(argv)
    if args.command == "generate":
        if args.pairs < 1:
            parser.error("--pairs must be at least 1")
        size, seconds = generate(args.pairs, args.out, args.source, args.seed)
        print(json.dumps({"pairs": args.pairs, "out": args.out, "bytes": size, "seconds": round(seconds, 1),
                          "seed": args.seed}))
        return 0
    if args.command == "encode-rate":
        encode_rate(args.corpus, args.prepared, args.json, args.limit, corpus_pairs=args.pairs)
        return 0
    if args.command == "suite":
        unknown = [size for size in args.sizes.split(",") if size not in SIZES]
        if unknown:
            parser.error(f"--sizes: unknown {', '.join(unknown)} (of {', '.join(SIZES)})")
        suite(args.sizes.split(","), args.corpora, args.json, args.python, args.steps, args.ranks,
              args.encode_limit)
        print(table(args.json))
        return 0
    if args.command == "table":
        print(table(args.json))
        return 0
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not command:
        parser.error("measure: give the transformer command after --")
    record = measure(args.label, args.corpus, args.json, args.python, args.pairs, command,
                     cwd=args.cwd, keep_out=args.keep_out, ranks=args.ranks)
    return 0 if record["returncode"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
