"""The harness every benchmark suite shares: timing ours and a reference fairly on the same
cores (interleaved batches, settling between engines, pinning), paired ratios, both engines'
thread counts, the fields a record starts with and the JSON lines a suite prints. Each suite
keeps only what it alone measures.
"""
import contextlib
import json
import os
import platform
import statistics
import time

import numpy as np


def time_pair(ours, ref, repeats, min_batch_s=0.004, settle_s=0.02):
    """((median, min), (median, min)) seconds per call of ours() and of ref(), batches interleaved.

    Ours and PyTorch use two different OpenMP runtimes; after a parallel region each runtime's
    idle workers spin for milliseconds before sleeping, and on a 2-core machine the other
    runtime's team then waits for a time slice (calls take ~8 ms instead of ~0.1 ms). So each
    batch starts after `settle_s` of sleep and one untimed call, which lets the other runtime's
    workers park and wakes this one's: both sides are measured warm, neither disturbed."""
    for _ in range(3):
        ours()
        ref()
    t0 = time.perf_counter()
    ours()
    ref()
    once = max(time.perf_counter() - t0, 1e-7)
    inner = max(1, int(min_batch_s / once))
    ours_t, ref_t = [], []
    for _ in range(repeats):
        for fn, times in ((ours, ours_t), (ref, ref_t)):
            time.sleep(settle_s)
            fn()
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            times.append((time.perf_counter() - t0) / inner)
    time_pair.last_spread = ([float(np.min(ours_t)), float(np.max(ours_t))],
                             [float(np.min(ref_t)), float(np.max(ref_t))])
    return ((float(np.median(ours_t)), float(np.min(ours_t))),
            (float(np.median(ref_t)), float(np.min(ref_t))))


def spread_fields():
    """{"ours_spread_s": [min, max], "ref_spread_s": [min, max]} of the last time_pair call."""
    ours, ref = time_pair.last_spread
    return {"ours_spread_s": ours, "ref_spread_s": ref}


def paired_ratio(ours, theirs):
    """The median over rounds of their time / ours in the same round (rounds alternate the
    engines, so each pair ran seconds apart): on a VM whose speed drifts by 1.5x within minutes
    (Zen 3, 2026-11-27: CTranslate2's tiny greedy took 99 ms in one run and 152 ms in the next),
    a steadier figure than the ratio of the medians, which can pair a fast stretch of one engine
    with a slow stretch of the other. Rounds one engine skipped (PyTorch after its first) are left out."""
    return statistics.median(t / o for o, t in zip(ours, theirs))


def bench_cpus(threads):
    """The CPUs a run of `threads` threads is held to: the first `threads` of those this process may
    use (all of them when it asks for more), or None where the OS cannot pin (not Linux)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    return sorted(os.sched_getaffinity(0))[:threads]


@contextlib.contextmanager
def pinned(cpus):
    """Every thread of this process held to `cpus` (None: left alone), and so every thread and
    process started meanwhile (affinity is inherited); the old sets come back after.

    Why: two vCPUs of one VM measured up to 1.4x apart on the same memory-bound decode, and swapped
    roles within minutes (Zen 3, 2026-11-27, benchmarks/notes/2026-11-27-paired-ratios.md). Unpinned, one
    engine can run a round on the fast core and the other on the slow one; pinned, both run
    every round on the same cores. Affinity is per thread on Linux, hence every task of the process."""
    if cpus is None:
        yield
        return
    tasks = [int(t) for t in os.listdir("/proc/self/task")]
    before = {}
    for tid in tasks:
        try:
            before[tid] = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, cpus)
        except OSError:          # a thread that ended meanwhile
            pass
    try:
        yield
    finally:
        for tid in [int(t) for t in os.listdir("/proc/self/task")]:
            try:
                os.sched_setaffinity(tid, before.get(tid, before.get(os.getpid(), cpus)))
            except OSError:
                pass


def call_seconds(decode, *args):
    """Seconds one call decode(*args) took: the engine's own measure (.seconds, set by the call:
    a translator in another process) when it has one, otherwise the wall time here."""
    start = time.perf_counter()
    decode(*args)
    elapsed = time.perf_counter() - start
    own = getattr(decode, "seconds", None)
    return own if own is not None else elapsed


def alternate(calls, args, repeats, settle_s):
    """{name: [seconds]}: every engine of `calls` ({name: fn}) called on `args` once per repeat, in
    order, each after `settle_s` of sleep (call_seconds: a translator's own measure)."""
    times = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            if settle_s:
                time.sleep(settle_s)
            times[name].append(call_seconds(call, *args))
    return times


@contextlib.contextmanager
def engine_threads(torch=None):
    """set_threads(n) sets ours' thread count (and torch's, when given) for the block; the counts
    from before come back after it."""
    from transformer import _C

    saved = (_C.get_num_threads(), torch.get_num_threads() if torch is not None else None)

    def set_threads(n):
        _C.set_num_threads(n)
        if torch is not None:
            torch.set_num_threads(n)
    try:
        yield set_threads
    finally:
        _C.set_num_threads(saved[0])
        if torch is not None:
            torch.set_num_threads(saved[1])


# -- peers in processes of their own ---------------------------------------------------------------

def free_port():
    """A TCP port of 127.0.0.1 free now (a peer server's, or a rendezvous)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- records ----------------------------------------------------------------------------------------

def cpu_model():
    """'AMD EPYC (family 25, model 1)': the name alone does not tell Zen 3, 4 and 5 apart."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "cpu family", "model") and key not in fields:
                    fields[key] = value.strip()
                if not line.strip() and fields:
                    break
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']}, model {fields['model']})"
    return name


def header_record(**fields):
    """The record a run's JSON lines start with: the CPU, the build, the time (UTC)."""
    import transformer as T

    return {"record": "header", "cpu": cpu_model(), "build": T.build_info(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **fields}


def kernel_record(kernel, shape, threads, ours, ref, nbytes, **extra):
    """A kernel's record against torch. ours, ref: (median, min) seconds per call, as time_pair
    gives them (called right after it: the spreads are its last); ratio uses the medians, GB/s
    the bytes the op must read and write once."""
    (ours_s, ours_min), (ref_s, ref_min) = ours, ref
    rec = {"kernel": kernel, "shape": list(shape), "threads": threads,
           "ours_s": ours_s, "ref_s": ref_s, "ratio": ref_s / ours_s,
           # best batch of each side: less sensitive to other processes on a shared machine
           "ours_min_s": ours_min, "ref_min_s": ref_min, "ratio_min": ref_min / ours_min,
           "ours_gbps": nbytes / ours_s / 1e9, "ref_gbps": nbytes / ref_s / 1e9,
           "reference": "torch", **spread_fields()}
    rec.update(extra)
    return rec


def emit(record, records=None, stream=None):
    """Keep `record` (in `records`) and print it as a JSON line to `stream`."""
    if records is not None:
        records.append(record)
    if stream is not None:
        print(json.dumps(record), file=stream, flush=True)
    return record


def print_records(records, stream=None):
    """A suite's `python -m` output: one JSON line per record."""
    for record in records:
        print(json.dumps(record), file=stream, flush=True)


def same_package(code):
    """`code` for `python -c` in a child that imports this very transformer package: `-c` puts the
    working directory first on sys.path, and in a checkout whose package is installed elsewhere
    (pip install .) its transformer/ folder has no compiled module."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return f"import sys; sys.path.insert(0, {root!r}); " + code
