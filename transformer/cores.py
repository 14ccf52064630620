"""The cores this process may use: its CPU affinity (taskset, a launcher's binding), and the CPU
limit of its cgroup: a container's `docker run --cpus`, a Kubernetes CPU limit, systemd's
CPUQuota. The limit is a quota of CPU time per period, not a set of cores, so the affinity still
shows every core of the host; OpenMP's default team is the affinity, and a team larger than the
quota is throttled: on a 2-core Zen 4 under a 1-CPU quota, real `tiny` runs took 179 ms a step
at the 2 threads the affinity gave and 148 ms at 1 (benchmarks/notes/2026-12-06-cpu-limit.md).

The default thread count (transformer/__init__.py) is therefore the smaller of the affinity and
the limit rounded up: under 1.5 CPUs two threads ran 1.31x faster than one, under 1.2 1.10x.

The limit is read as Go's runtime reads it (GOMAXPROCS since Go 1.25): the process's cgroup from
/proc/self/cgroup, where that hierarchy is mounted from /proc/self/mountinfo, and then the limit
files from the process's cgroup up to the mount's root, the tightest of them: cgroup v2's cpu.max
("max 100000" or "QUOTA PERIOD"), v1's cpu.cfs_quota_us (-1: none) over cpu.cfs_period_us. A
file that is missing or unreadable counts as no limit: this never fails, and off Linux there is
none."""
import math
import os

# Where the kernel says which cgroups the process is in and what is mounted where; the tests point
# these at a fake tree.
PROC_SELF = "/proc/self"


def affinity_cores():
    """The cores the process may be scheduled on (its affinity mask), at least 1."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _unescape(field):
    """A mountinfo path: spaces, tabs, newlines and backslashes are written as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def cgroup_mounts(proc=None):
    """(fstype, root, mount point, super options) of every cgroup and cgroup2 mount the process
    sees (its mountinfo); OSError when that cannot be read."""
    proc = proc or PROC_SELF
    found = []
    with open(os.path.join(proc, "mountinfo"), encoding="utf-8", errors="replace") as f:
        for line in f:
            fields = line.split()
            if "-" not in fields[6:]:
                continue
            dash = fields.index("-", 6)
            if len(fields) < dash + 4 or fields[dash + 1] not in ("cgroup", "cgroup2"):
                continue
            found.append((fields[dash + 1], _unescape(fields[3]), _unescape(fields[4]), fields[dash + 3].split(",")))
    return found


def _groups(proc):
    """{"v1": path of the cgroup holding the cpu controller, "v2": the unified path} as listed."""
    found = {}
    with open(os.path.join(proc, "cgroup"), encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.rstrip("\n").split(":", 2)
            if len(parts) != 3:
                continue
            ident, controllers, path = parts
            if ident == "0" and controllers == "":
                found["v2"] = path
            elif "cpu" in controllers.split(","):
                found["v1"] = path
    return found


def _read(path):
    try:
        with open(path, encoding="ascii") as f:
            return f.read().split()
    except (OSError, UnicodeDecodeError):
        return None


def _level_limit(directory, version):
    """CPUs that one cgroup directory allows (quota / period), or None: no limit or unreadable."""
    try:
        if version == "v2":
            words = _read(os.path.join(directory, "cpu.max"))
            if not words or words[0] == "max":
                return None
            quota, period = int(words[0]), int(words[1]) if len(words) > 1 else 100000
        else:
            words = _read(os.path.join(directory, "cpu.cfs_quota_us"))
            period_words = _read(os.path.join(directory, "cpu.cfs_period_us"))
            if not words or not period_words:
                return None
            quota, period = int(words[0]), int(period_words[0])
    except (ValueError, IndexError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def _cgroup_dir(path, root, mount_point):
    """Where the cgroup `path` (as /proc/self/cgroup names it) is under a mount of the hierarchy
    from `root` down. A path outside the mount's root (a container's own cgroup mounted without a
    cgroup namespace, or one that climbs out with /..) is read at the mount point itself."""
    mount_point = os.path.normpath(mount_point)
    root = root.rstrip("/") or "/"
    if root == "/":
        rel = path
    elif path == root or path.startswith(root + "/"):
        rel = path[len(root):]
    else:
        rel = "/"
    directory = os.path.normpath(os.path.join(mount_point, rel.lstrip("/")))
    inside = directory == mount_point or directory.startswith(mount_point.rstrip("/") + "/")
    return directory if inside else mount_point


def _hierarchy_limit(path, root, mount_point, version):
    """The tightest limit from the process's cgroup up to the mount point."""
    directory, top = _cgroup_dir(path, root, mount_point), os.path.normpath(mount_point)
    limits = []
    while True:
        limit = _level_limit(directory, version)
        if limit is not None:
            limits.append(limit)
        parent = os.path.dirname(directory)
        if directory == top or parent == directory:
            break
        directory = parent
    return min(limits) if limits else None


def cpu_limit(proc=None):
    """The CPUs this process's cgroups allow it on average (quota / period, the tightest found), or
    None where there is no limit, or it cannot be read (not Linux, no cgroup file system)."""
    proc = proc or PROC_SELF
    try:
        groups, mounts = _groups(proc), cgroup_mounts(proc)
    except OSError:
        return None
    limits = []
    for fstype, root, mount_point, options in mounts:
        version = "v2" if fstype == "cgroup2" else "v1"
        if version not in groups or (version == "v1" and "cpu" not in options):
            continue
        limit = _hierarchy_limit(groups[version], root, mount_point, version)
        if limit is not None:
            limits.append(limit)
    return min(limits) if limits else None


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
