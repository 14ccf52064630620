"""Hugging Face weight files read without torch and without running pickle code.

read_hf_weights(directory) gives {name: float32 ndarray} from model.safetensors (or its sharded
index), else from pytorch_model.bin (or its index). fp32, fp16 and bf16 tensors become float32;
any other dtype is a ValueError naming the tensor, and so is any damage (naming the file).

pytorch_model.bin is PyTorch's zip format: `<top>/data.pkl` pickles the state dict, each tensor
a call `torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride, ...)` whose storage
is a persistent id ("storage", torch.FloatStorage, key, location, numel) naming the raw
little-endian bytes `<top>/data/<key>` (`<top>/byteorder` says when they are big-endian). The
unpickler here resolves only those globals, to inert stand-ins, and refuses any other: a file
that names os.system (or anything else) is a ValueError before anything is called.
"""
import io
import json
import os
import pickle
import zipfile
import zlib

import numpy as np

from .serialization import load_file, path_argument as _path

__all__ = ["read_hf_weights", "read_safetensors", "read_pytorch_bin"]

SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PYTORCH_FILE = "pytorch_model.bin"
PYTORCH_INDEX = "pytorch_model.bin.index.json"


def _to_float32(arr, is_bfloat16):
    """A new C-contiguous native float32 array of arr's values (f4 or f2 of either byte order, or
    the uint16 bits of bf16, which are the high half of a float32: shifted up, exact)."""
    if is_bfloat16:
        bits = np.array(arr, dtype=np.uint32, order="C")
        bits <<= 16
        return bits.view(np.float32)
    return np.array(arr, dtype=np.float32, order="C")


def read_hf_weights(directory):
    """{name: float32 C-contiguous ndarray} of a Hugging Face model directory, names as in the file.

    Looks for model.safetensors, model.safetensors.index.json (shards), pytorch_model.bin,
    pytorch_model.bin.index.json, in that order."""
    directory = _path(directory, "directory")
    for name, reader in ((SAFETENSORS_FILE, read_safetensors), (SAFETENSORS_INDEX, None),
                         (PYTORCH_FILE, read_pytorch_bin), (PYTORCH_INDEX, None)):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return reader(path) if reader else _read_sharded(path)
    raise FileNotFoundError(f"{directory}: holds neither {SAFETENSORS_FILE} nor {PYTORCH_FILE} "
                            "(nor a sharded index of either)")


def _read_sharded(index_path):
    """All tensors of the shards an index.json's weight_map names, each checked against it."""
    try:
        with open(index_path, encoding="utf-8") as f:
            index = json.load(f)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{index_path}: not valid JSON ({exc})") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"{index_path}: no weight_map of tensor name to shard file")
    reader = read_safetensors if index_path.endswith(".safetensors.index.json") else read_pytorch_bin
    directory = os.path.dirname(index_path)
    out = {}
    for shard in dict.fromkeys(weight_map.values()):
        if os.path.basename(shard) != shard or shard in ("", ".", ".."):
            raise ValueError(f"{index_path}: shard {shard!r} is not a file name in the directory")
        path = os.path.join(directory, shard)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: shard named by {index_path} is missing")
        for name, arr in reader(path).items():
            if name in out:
                raise ValueError(f"{path}: tensor {name!r} is also in another shard")
            if weight_map.get(name) != shard:
                raise ValueError(f"{path}: tensor {name!r} is not mapped to this shard by {index_path}")
            out[name] = arr
    missing = [name for name in weight_map if name not in out]
    if missing:
        raise ValueError(f"{index_path}: tensors {missing[:5]} are in no shard")
    return out


# -- safetensors -------------------------------------------------------------------------------

def read_safetensors(path):
    """{name: float32 ndarray} of one safetensors file (F32, F16, BF16), in the header's order.
    The file is read and checked by serialization.load_file (BF16 as its uint16 bits), its values
    kept bit for bit, NaN and inf too, as read_pytorch_bin keeps them: the importer that maps them
    checks they are finite (marian.state_dict_from_marian), whichever file they came from."""
    path = _path(path, "path")
    raw = load_file(path, read_as={"BF16": np.dtype("<u2")}, finite=False)
    out = {}
    for name, arr in raw.items():
        if arr.dtype not in (np.float32, np.float16, np.uint16):   # load_file has no U16: uint16 is BF16
            raise ValueError(f"{path}: tensor {name!r} has dtype {arr.dtype}; "
                             "only F32, F16 and BF16 can be read as float32")
        out[name] = arr if arr.dtype == np.float32 else _to_float32(arr, arr.dtype == np.uint16)
    return out


# -- pytorch_model.bin (zip + restricted pickle) -----------------------------------------------

_MAX_PICKLE_BYTES = 256 * 1024 * 1024   # data.pkl holds only the layout: megabytes at most


class _Inert:
    """Base of the stand-ins: a pickle's BUILD opcode may not set their attributes (the storage
    types are shared by every load in the process)."""
    __slots__ = ()

    def __setstate__(self, state):
        raise ValueError(f"refuses to set the state of {type(self).__name__}")


class _StorageType(_Inert):
    """Stand-in for torch.FloatStorage and its kind: only the element type it names."""
    __slots__ = ("name", "dtype", "is_bfloat16")

    def __init__(self, name, dtype, is_bfloat16=False):
        self.name, self.dtype, self.is_bfloat16 = name, dtype, is_bfloat16


class _Storage(_Inert):
    """A persistent id of data.pkl: `numel` elements of `storage_type` in the record data/<key>."""
    __slots__ = ("storage_type", "key", "numel")

    def __init__(self, storage_type, key, numel):
        self.storage_type, self.key, self.numel = storage_type, key, numel


class _TensorRecord(_Inert):
    """What _rebuild_tensor_v2 describes: a strided view into a storage (built with numpy later)."""
    __slots__ = ("storage", "offset", "size", "stride")

    def __init__(self, storage, offset, size, stride):
        self.storage, self.offset, self.size, self.stride = storage, offset, size, stride


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False, backward_hooks=None,
                       metadata=None):
    """torch._utils._rebuild_tensor_v2: the tensor is (storage, offset, size, stride)."""
    if not isinstance(storage, _Storage):
        raise ValueError("_rebuild_tensor_v2 without a storage")
    return _TensorRecord(storage, storage_offset, size, stride)


def _rebuild_parameter(data, requires_grad=False, backward_hooks=None, state=None):
    """torch._utils._rebuild_parameter(_with_state): nn.Parameter(data); the data is all we need."""
    if not isinstance(data, _TensorRecord):
        raise ValueError("_rebuild_parameter without a tensor")
    return data


class _OrderedDict(dict):
    """collections.OrderedDict (dicts keep order). A module's state_dict() carries `_metadata`
    (per-module versions) that pickle restores with BUILD: not needed for the weights, dropped."""
    __slots__ = ()

    def __setstate__(self, state):
        pass


_READABLE_STORAGES = {"FloatStorage": (np.dtype("<f4"), False), "HalfStorage": (np.dtype("<f2"), False),
                      "BFloat16Storage": (np.dtype("<u2"), True)}
# The other storage types torch writes: resolved so that the error can name the tensor.
_OTHER_STORAGES = ("DoubleStorage", "LongStorage", "IntStorage", "ShortStorage", "CharStorage",
                   "ByteStorage", "BoolStorage", "ComplexFloatStorage", "ComplexDoubleStorage",
                   "QInt8Storage", "QUInt8Storage", "QInt32Storage", "QUInt4x2Storage",
                   "QUInt2x4Storage", "UntypedStorage")

_ALLOWED_GLOBALS = {
    ("collections", "OrderedDict"): _OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    **{("torch", name): _StorageType(name, dtype, is_bfloat16)
       for name, (dtype, is_bfloat16) in _READABLE_STORAGES.items()},
    **{("torch", name): _StorageType(name, None) for name in _OTHER_STORAGES},
}


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickles a torch state dict into the stand-ins above; any other global is a ValueError
    raised before it could be called."""

    def find_class(self, module, name):
        found = _ALLOWED_GLOBALS.get((module, name))
        if found is None:
            raise ValueError(f"refuses the global {module}.{name} (a weight file may only name "
                             "tensors and their storages)")
        return found

    def persistent_load(self, pid):
        # ("storage", storage type, key, location, numel), as torch.serialization writes it
        if (not isinstance(pid, tuple) or len(pid) != 5 or pid[0] not in ("storage", b"storage")
                or not isinstance(pid[1], _StorageType) or not isinstance(pid[2], str)
                or type(pid[4]) is not int or pid[4] < 0):
            raise ValueError(f"unexpected persistent id {pid!r:.200}")
        return _Storage(pid[1], pid[2], pid[4])


def read_pytorch_bin(path):
    """{name: float32 ndarray} of a torch.save'd state dict (zip format), in the pickle's order."""
    path = _path(path, "path")
    with open(path, "rb") as f:
        magic = f.read(4)
    if len(magic) < 4:
        raise ValueError(f"{path}: not a PyTorch weight file ({len(magic)} bytes, truncated?)")
    if magic[:2] != b"PK":
        raise ValueError(f"{path}: not a zip-format PyTorch file: the legacy torch.save format is not "
                         "supported; re-save it with a recent transformers (save_pretrained writes "
                         "model.safetensors)")
    try:
        with zipfile.ZipFile(path) as archive:
            return _read_archive(archive, path)
    # zipfile's own complaints: damage, a bad CRC, encryption (RuntimeError), an unknown compression
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, RuntimeError,
            NotImplementedError) as exc:
        raise ValueError(f"{path}: damaged or truncated PyTorch zip file ({exc})") from None


def _read_archive(archive, path):
    # One top folder ("archive/" or the saved file's stem) holds data.pkl, data/<key>, byteorder.
    pickles = [n for n in archive.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(pickles) != 1:
        raise ValueError(f"{path}: not a PyTorch zip file (expected one <folder>/data.pkl, "
                         f"found {len(pickles)})")
    prefix = pickles[0][:-len("data.pkl")]
    names = set(archive.namelist())
    byteorder = "little"   # what torch assumes when the record is absent
    if prefix + "byteorder" in names:
        byteorder = archive.read(prefix + "byteorder").decode("ascii", "replace").strip()
        if byteorder not in ("little", "big"):
            raise ValueError(f"{path}: unknown byteorder {byteorder!r}")
    if archive.getinfo(pickles[0]).file_size > _MAX_PICKLE_BYTES:
        raise ValueError(f"{path}: data.pkl of {archive.getinfo(pickles[0]).file_size} bytes is not a state dict")
    try:
        state = _RestrictedUnpickler(io.BytesIO(archive.read(pickles[0]))).load()
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    except (zipfile.BadZipFile, zlib.error, RuntimeError, MemoryError):
        raise
    except Exception as exc:   # anything else inside the pickle stream is damage to the file
        raise ValueError(f"{path}: damaged data.pkl ({type(exc).__name__}: {exc})") from None
    if not isinstance(state, dict):
        what = "a tensor" if isinstance(state, _TensorRecord) else f"a {type(state).__name__}"
        raise ValueError(f"{path}: data.pkl holds {what}, not a state dict of tensors")
    storages, out = {}, {}
    for name, record in state.items():
        if not isinstance(name, str):
            raise ValueError(f"{path}: state dict key {name!r} is not a string")
        if not isinstance(record, _TensorRecord):
            raise ValueError(f"{path}: {name!r} is a {type(record).__name__}, not a tensor "
                             "(a flat state dict {name: tensor} is expected)")
        base = _storage_array(archive, prefix, byteorder, storages, record.storage, name, path)
        out[name] = _strided_copy(base, record, name, path)
    return out


def _storage_array(archive, prefix, byteorder, storages, storage, name, path):
    """The 1-D array of one storage record, read once however many tensors view it."""
    storage_type = storage.storage_type
    if storage_type.dtype is None:
        raise ValueError(f"{path}: tensor {name!r} is stored as {storage_type.name}; only float32, "
                         "float16 and bfloat16 can be read as float32")
    key = storage.key
    if key in storages:
        array, first_type = storages[key]
        if first_type is not storage_type or array.size != storage.numel:
            raise ValueError(f"{path}: tensor {name!r}: storage {key!r} is declared twice differently")
        return array
    member = f"{prefix}data/{key}"
    try:
        info = archive.getinfo(member)
    except KeyError:
        raise ValueError(f"{path}: tensor {name!r}: storage record data/{key} is missing") from None
    dtype = storage_type.dtype.newbyteorder("<" if byteorder == "little" else ">")
    nbytes = storage.numel * dtype.itemsize
    if info.file_size != nbytes:
        raise ValueError(f"{path}: tensor {name!r}: storage data/{key} holds {info.file_size} bytes, "
                         f"expected {nbytes}")
    array = np.frombuffer(archive.read(member), dtype=dtype)
    if array.size != storage.numel:
        raise ValueError(f"{path}: tensor {name!r}: storage data/{key} is truncated")
    storages[key] = (array, storage_type)
    return array


def _strided_copy(base, record, name, path):
    """torch's as_strided(storage, size, stride, offset), bounds checked, as a float32 copy."""
    offset = record.offset
    size = tuple(record.size) if isinstance(record.size, (tuple, list)) else None
    stride = tuple(record.stride) if isinstance(record.stride, (tuple, list)) else None
    if (type(offset) is not int or offset < 0 or size is None or stride is None
            or len(size) != len(stride) or not all(type(v) is int and v >= 0 for v in size + stride)):
        raise ValueError(f"{path}: tensor {name!r} has an invalid layout (offset {offset!r}, "
                         f"size {record.size!r:.100}, stride {record.stride!r:.100})")
    elements = int(np.prod(size, dtype=object))
    if elements == 0:
        return np.zeros(size, dtype=np.float32)
    last = offset + sum((n - 1) * s for n, s in zip(size, stride))
    if last >= base.size:
        raise ValueError(f"{path}: tensor {name!r} reaches element {last} of a storage of {base.size}")
    if elements > base.size:   # a stride-0 (expanded) view: its copy could be any size
        raise ValueError(f"{path}: tensor {name!r} has {elements} elements over a storage of "
                         f"{base.size}: expanded (overlapping) views are not supported")
    itemsize = base.dtype.itemsize
    view = np.lib.stride_tricks.as_strided(base[offset:], shape=size,
                                           strides=tuple(s * itemsize for s in stride), writeable=False)
    return _to_float32(view, record.storage.storage_type.is_bfloat16)
