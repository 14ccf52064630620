"""safetensors files, read and written here (no pickle, no extra dependency).

Layout: 8 bytes little-endian unsigned header length N, then N bytes of JSON
{name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {str: str}},
then the raw little-endian data; offsets are relative to the end of the header and the tensors
tile the data area exactly. Writes go to a temporary file in the same directory, are fsync'ed and
renamed over the target (atomic). Reads check everything and raise ValueError naming the file,
float tensors holding NaN or inf included: no weights of ours are so, and a data area overwritten
with 0xFF bytes reads as NaN.
"""
import contextlib
import json
import os
import re
import shutil
import socket
import tempfile

import numpy as np

__all__ = ["save_file", "load_file", "read_metadata", "atomic_writer", "atomic_write_bytes",
           "remove_stale_temporaries", "path_argument", "fsync_directory"]

_DTYPES = {"F32": np.dtype("<f4"), "F64": np.dtype("<f8"), "F16": np.dtype("<f2"),
           "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"),
           "I8": np.dtype("i1"), "U8": np.dtype("u1"), "BOOL": np.dtype("?")}
_MAX_HEADER = 100 * 1024 * 1024


def path_argument(value, name):
    """A str path from str or os.PathLike, or TypeError naming the argument `name`."""
    try:
        path = os.fspath(value)
    except TypeError:
        path = None
    if not isinstance(path, str):
        raise TypeError(f"{name} must be a str or os.PathLike path, got {type(value).__name__}")
    return path


def _code(dtype):
    for code, dt in _DTYPES.items():
        if dt.kind == dtype.kind and dt.itemsize == dtype.itemsize:
            return code
    return None


@contextlib.contextmanager
def atomic_writer(path):
    """A binary file whose contents replace `path` only once the block completes: written to a
    temporary file in the same directory, fsync'ed, renamed over `path`, and the rename made
    durable. An exception (or a kill) at any moment leaves `path` as it was."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=_temporary_prefix(), dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_directory(directory)


def fsync_directory(directory):
    """Make the renames into `directory` durable (best effort: some file systems refuse)."""
    try:
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def _temporary_prefix(pid=None):
    """Temporary files are named after the host and process writing them, so a later run can
    tell the leftovers of a killed writer from a write in progress (remove_stale_temporaries)."""
    host = re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname())[:64] or "host"
    return f".tmp-{host}-{os.getpid() if pid is None else pid}-"


_TEMPORARY = re.compile(r"^\.tmp-(?P<host>[A-Za-z0-9_.]+)-(?P<pid>[0-9]+)-")


def remove_stale_temporaries(directory):
    """Delete the temporary files (and directories: a prepared corpus is written as one) that
    writers on this host left in `directory` when they were killed mid-write (SIGKILL, power loss):
    those whose process no longer exists. Those of live processes and of other hosts are left
    alone. Returns the paths removed."""
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    host = _temporary_prefix(0).split("-")[1]
    for name in names:
        match = _TEMPORARY.match(name)
        if not match or match["host"] != host:
            continue
        pid = int(match["pid"])
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
            continue                  # alive (or not ours to signal): maybe still writing
        except ProcessLookupError:
            pass
        except (PermissionError, OverflowError, OSError):
            continue
        path = os.path.join(directory, name)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed


def atomic_write_bytes(path, data):
    with atomic_writer(path) as f:
        f.write(data)


def save_file(tensors, path, metadata=None):
    """Write {name: ndarray} to `path` atomically. Arrays keep their dtype (one of _DTYPES)."""
    path = os.fspath(path)
    if not isinstance(tensors, dict):
        raise TypeError(f"tensors must be a dict, got {type(tensors).__name__}")
    header, arrays, offset = {}, [], 0
    if metadata is not None:
        if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                      for k, v in metadata.items()):
            raise TypeError("metadata must be a dict of str to str")
        header["__metadata__"] = dict(metadata)
    for name, arr in tensors.items():
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise ValueError(f"invalid tensor name {name!r}")
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"tensors[{name!r}] must be a numpy.ndarray, got {type(arr).__name__}")
        code = _code(arr.dtype)
        if code is None:
            raise TypeError(f"tensors[{name!r}] has unsupported dtype {arr.dtype}")
        arr = np.ascontiguousarray(arr, dtype=_DTYPES[code])
        header[name] = {"dtype": code, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + arr.nbytes]}
        arrays.append(arr)
        offset += arr.nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the data area starts 8-byte aligned, as safetensors does
    with atomic_writer(path) as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for arr in arrays:
            if arr.nbytes:
                f.write(memoryview(arr.reshape(-1)).cast("B"))


def read_metadata(path):
    """The "__metadata__" dict of a safetensors file ({} when it has none), reading only the
    header; ValueError (naming the file) when the header is damaged."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        header, _, _ = _read_header(f, path)
    return dict(header.get("__metadata__") or {})


def _read_header(f, path):
    size = os.fstat(f.fileno()).st_size

    def bad(why):
        return ValueError(f"{path}: not a valid safetensors file: {why}")

    if size < 8:
        raise bad(f"{size} bytes, shorter than the 8-byte header length")
    n = int.from_bytes(f.read(8), "little")
    if n < 2 or n > _MAX_HEADER or 8 + n > size:
        raise bad(f"header length {n} does not fit the file size {size} (truncated?)")
    raw = f.read(n)
    if len(raw) != n:
        raise bad("truncated header")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise bad(f"header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise bad("header is not a JSON object")
    metadata = header.get("__metadata__")
    if metadata is not None and not (isinstance(metadata, dict) and
                                     all(isinstance(v, str) for v in metadata.values())):
        raise bad("__metadata__ must map strings to strings")
    return header, n, size


def load_file(path, read_as=None, finite=True):
    """{name: ndarray} from a safetensors file; ValueError (naming the file) on any damage.
    read_as: {dtype code: numpy dtype} for codes beyond the ones this module writes, read as raw
    arrays of that dtype (hf_weights reads "BF16" as its uint16 bits).
    finite: a float tensor holding NaN or inf is damage too (False: read the bits as they are)."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        def bad(why):
            return ValueError(f"{path}: not a valid safetensors file: {why}")

        header, n, size = _read_header(f, path)
        header.pop("__metadata__", None)
        entries = []
        for name, info in header.items():
            if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
                raise bad(f"entry {name!r} must have exactly dtype, shape, data_offsets")
            dtype = {**_DTYPES, **(read_as or {})}.get(info["dtype"]) if isinstance(info["dtype"], str) else None
            if dtype is None:
                raise bad(f"entry {name!r} has unsupported dtype {info['dtype']!r}")
            shape = info["shape"]
            if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):
                raise bad(f"entry {name!r} has invalid shape {shape!r}")
            offs = info["data_offsets"]
            if (not isinstance(offs, list) or len(offs) != 2
                    or not all(type(o) is int and o >= 0 for o in offs) or offs[0] > offs[1]):
                raise bad(f"entry {name!r} has invalid data_offsets {offs!r}")
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            if offs[1] - offs[0] != nbytes:
                raise bad(f"entry {name!r}: data_offsets {offs} do not hold shape {shape} of {info['dtype']}")
            entries.append((offs[0], offs[1], name, dtype, tuple(shape)))
        entries.sort(key=lambda e: (e[0], e[1]))
        data_size = size - 8 - n
        expected = 0
        for begin, end, name, _, _ in entries:
            if begin != expected:
                raise bad(f"entry {name!r} starts at {begin}, expected {expected} (gap or overlap)")
            expected = end
        if expected != data_size:
            raise bad(f"tensors cover {expected} bytes but the data area has {data_size} (truncated or trailing bytes)")
        out = {}
        for begin, end, name, dtype, shape in entries:
            arr = np.empty(shape, dtype=dtype)
            if end > begin:
                got = f.readinto(memoryview(arr.reshape(-1)).cast("B"))
                if got != end - begin:
                    raise bad(f"entry {name!r} is truncated")
            # once per tensor, as it is read: every load of a file passes here; a model in memory
            # (training, load_state_dict) is never checked again
            if finite and dtype.kind == "f" and not np.isfinite(arr).all():
                raise ValueError(f"{path}: tensor {name!r} holds non-finite values (NaN or inf): "
                                 "the file is damaged")
            out[name] = arr.astype(dtype.newbyteorder("="), copy=False)
        # keep the writer's order (the order of the header), not the offset order
        return {name: out[name] for name in header}
