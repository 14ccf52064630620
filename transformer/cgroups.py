"""What the process's cgroups allow it: CPU time (a container's `docker run --cpus`, a Kubernetes
CPU limit, systemd's CPUQuota) and memory (`docker run --memory`, a Kubernetes memory limit,
systemd's MemoryMax). Neither shows anywhere else: the CPU affinity still lists every core of the
host, and sysconf every byte of its memory. transformer/cores.py caps the default threads by the
first; decoding refuses a request whose caches would pass the second (decoding/checks.py), where
the kernel would otherwise kill the process that grew into it.

The limits are read as Go's runtime reads the CPU's (GOMAXPROCS since Go 1.25) and the JVM its
memory: the process's cgroup from /proc/self/cgroup, where that hierarchy is mounted from
/proc/self/mountinfo, and then the limit files from the process's cgroup up to the mount's root,
the tightest of them.
- CPU: v2's cpu.max ("max 100000" or "QUOTA PERIOD"); v1's cpu.cfs_quota_us (-1: none) over
  cpu.cfs_period_us, in the hierarchy that holds the cpu controller.
- Memory: v2's memory.max ("max" or bytes); v1's memory.limit_in_bytes (no limit is the largest
  multiple of the page size, 9223372036854771712), in the memory controller's hierarchy.
A file that is missing or unreadable counts as no limit: this never fails, and off Linux there is
none."""
import os

# Where the kernel says which cgroups the process is in and what is mounted where; the tests point
# these at a fake tree.
PROC_SELF = "/proc/self"

# v1 writes "no memory limit" as the largest page multiple of a signed 64-bit count; anything past
# 2^62 bytes (4 EiB) is that, or as good as it
_NO_MEMORY_LIMIT = 1 << 62


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


def _groups(proc, controller):
    """{"v1": path of the cgroup holding `controller`, "v2": the unified path} as listed."""
    found = {}
    with open(os.path.join(proc, "cgroup"), encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.rstrip("\n").split(":", 2)
            if len(parts) != 3:
                continue
            ident, controllers, path = parts
            if ident == "0" and controllers == "":
                found["v2"] = path
            elif controller in controllers.split(","):
                found["v1"] = path
    return found


def _read(path):
    try:
        with open(path, encoding="ascii") as f:
            return f.read().split()
    except (OSError, UnicodeDecodeError):
        return None


def _cpu_level(directory, version):
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


def _memory_level(directory, version):
    """Bytes that one cgroup directory allows, or None: no limit or unreadable."""
    words = _read(os.path.join(directory, "memory.max" if version == "v2" else "memory.limit_in_bytes"))
    if not words or words[0] == "max":
        return None
    try:
        limit = int(words[0])
    except ValueError:
        return None
    return limit if 0 < limit < _NO_MEMORY_LIMIT else None


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


def _hierarchy_limit(path, root, mount_point, version, level):
    """The tightest of level(directory, version) from the process's cgroup up to the mount point."""
    directory, top = _cgroup_dir(path, root, mount_point), os.path.normpath(mount_point)
    limits = []
    while True:
        limit = level(directory, version)
        if limit is not None:
            limits.append(limit)
        parent = os.path.dirname(directory)
        if directory == top or parent == directory:
            break
        directory = parent
    return min(limits) if limits else None


def _limit(proc, controller, level):
    """The tightest limit of `controller` over the process's cgroups, v1 and v2, or None."""
    proc = proc or PROC_SELF
    try:
        groups, mounts = _groups(proc, controller), cgroup_mounts(proc)
    except OSError:
        return None
    limits = []
    for fstype, root, mount_point, options in mounts:
        version = "v2" if fstype == "cgroup2" else "v1"
        if version not in groups or (version == "v1" and controller not in options):
            continue
        limit = _hierarchy_limit(groups[version], root, mount_point, version, level)
        if limit is not None:
            limits.append(limit)
    return min(limits) if limits else None


def cpu_limit(proc=None):
    """The CPUs this process's cgroups allow it on average (quota / period, the tightest found), or
    None where there is no limit, or it cannot be read (not Linux, no cgroup file system)."""
    return _limit(proc, "cpu", _cpu_level)


def memory_limit(proc=None):
    """The bytes this process's cgroups allow it (the tightest found), or None where there is no
    limit, or it cannot be read."""
    return _limit(proc, "memory", _memory_level)


def physical_memory():
    """This machine's memory in bytes, or None where the system does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def usable_memory(proc=None):
    """(bytes, source): the memory this process may fill, the machine's capped by its cgroups'
    limit, and which of them sets it, "machine" or "cgroup"; (None, None) where neither is known."""
    total, limit = physical_memory(), memory_limit(proc)
    if limit is not None and (total is None or limit < total):
        return limit, "cgroup"
    return (total, "machine") if total is not None else (None, None)


def size_text(n):
    """Bytes as a message gives them: KiB below a MiB, MiB below a GiB, GiB with one decimal."""
    if n < 2**20:
        return f"{n / 2**10:,.0f} KiB"
    return f"{n / 2**20:,.0f} MiB" if n < 2**30 else f"{n / 2**30:,.1f} GiB"


def room_text(total, source):
    """usable_memory()'s answer in a message: "this machine's 23.5 GiB", or "the 512 MiB its
    cgroup's memory limit allows"."""
    if source == "machine":
        return f"this machine's {size_text(total)}"
    return f"the {size_text(total)} its cgroup's memory limit allows"
