"""Timing two implementations fairly on the same cores."""
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
