"""The cores this process may use: its CPU affinity (taskset, a launcher's binding), and the CPU
limit of its cgroup: a container's `docker run --cpus`, a Kubernetes CPU limit, systemd's
CPUQuota. The limit is a quota of CPU time per period, not a set of cores, so the affinity still
shows every core of the host; OpenMP's default team is the affinity, and a team larger than the
quota is throttled: on a 2-core Zen 4 under a 1-CPU quota, real `tiny` runs took 179 ms a step
at the 2 threads the affinity gave and 148 ms at 1 (benchmarks/notes/2026-12-06-cpu-limit.md).

The default thread count (transformer/__init__.py) is therefore the smaller of the affinity and
the limit rounded up: under 1.5 CPUs two threads ran 1.31x faster than one, under 1.2 1.10x.

The limit is read as Go's runtime reads it (GOMAXPROCS since Go 1.25), in transformer/cgroups.py:
a file that is missing or unreadable counts as no limit, so this never fails."""
import math
import os

from .cgroups import cpu_limit


def affinity_cores():
    """The cores the process may be scheduled on (its affinity mask), at least 1."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def limit_cores(limit):
    """Threads worth running under a limit of `limit` CPUs: rounded up, at least 1 (None: no cap)."""
    return None if limit is None else max(1, math.ceil(limit))


def capped(threads, proc=None):
    """`threads`, or fewer where the cgroup's CPU limit rounded up is fewer."""
    cap = limit_cores(cpu_limit(proc))
    return threads if cap is None else min(threads, cap)


def usable_cores(proc=None):
    """The threads that can run at once without being throttled or taking turns: the affinity's
    cores, capped by the cgroup's CPU limit rounded up."""
    return capped(affinity_cores(), proc)


def describe(count, proc=None):
    """'the COUNT cores this process may run on', naming the cgroup's CPU limit when it is what caps
    them at COUNT (usable_cores' count)."""
    limit = cpu_limit(proc)
    cores = f"the {count} core{'s' if count != 1 else ''}"
    if limit is not None and limit_cores(limit) == count < affinity_cores():
        return f"{cores} this process may use (its cgroup's CPU limit is {limit:g} CPU{'s' if limit != 1 else ''})"
    return f"{cores} this process may run on"
