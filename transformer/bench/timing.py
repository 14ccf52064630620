"""Timing two implementations fairly on the same cores."""
import contextlib
import os
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
