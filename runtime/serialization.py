"""Saving and loading tensors without running code from files: runtime's zip format, safetensors, torch.save zips."""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import pickle
import pickletools
import reprlib
import secrets
import stat
import struct
import sys
import warnings
import zipfile
import zlib
from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from . import dtypes as dt
from ._aligned import memory_owner, ultimate_base
from .device import check_device
from .factories import from_numpy
from .tensor import Tensor

__all__ = ["save", "load", "save_safetensors", "load_safetensors", "UnreadableFileError"]

_PLAIN = (bool, int, float, str)
_DTYPES_BY_NAME = {d.name: d for d in dt.ALL_DTYPES}


class UnreadableFileError(RuntimeError):
    """A file that `load` or `load_safetensors` cannot read, whatever its bytes: damaged, truncated, hostile or
    in another format. The message names the function and the file and says what is wrong; `filename` and
    `reason` hold those two parts. Errors opening the file (missing, no permission) stay the usual OSError."""

    def __init__(self, message: str, filename: str = "", reason: str = ""):
        super().__init__(message)
        self.filename, self.reason = filename, reason


class _UnpicklingFileError(UnreadableFileError, pickle.UnpicklingError):
    """A torch data.pkl that is refused or malformed: also a pickle.UnpicklingError, as torch.load raises."""


class _FileError(Exception):
    """What is wrong with a file being read; the public functions re-raise it naming the file."""


class _BinaryModeError(TypeError):
    """The caller passed a text stream: a mistake in the call, not in the file."""


# ----------------------------------------------------------------------------------------------
# public API
# ----------------------------------------------------------------------------------------------

def save(obj, f) -> None:
    """Write a state dict (nested dicts, lists, tuples, tensors, numpy arrays and plain values) to a path or binary
    file, in torch.save's zip format when every value has a torch spelling (so real torch.load reads the file; the
    pickle it writes names only torch's tensor and storage rebuilders and OrderedDict), else in runtime's own zip
    format. runtime.load reads both. A numpy array (torch.save pickles one with numpy's code, which no loader here
    runs) takes runtime's format and loads back as a numpy array.

    Tensors keep their identity and memory sharing: a tensor referenced twice, or two views of one
    array, are stored once and come back shared.
    """
    try:
        pickled, storages = _TorchPickler.pickle(obj)
    except _NoTorchSpelling:
        _save_runtime(obj, f)
        return
    _write_torch_zip(pickled, storages, f)


def _save_runtime(obj, f) -> None:
    """runtime's own zip format: a JSON structure and the storages' bytes (numpy arrays stay arrays)."""
    encoder = _Encoder()
    structure = {"format": _FORMAT, "version": _VERSION, "byteorder": sys.byteorder,
                 "object": encoder.encode(obj, "obj"), "tensors": encoder.tensors,
                 "storages": [int(s.nbytes) for s in encoder.storages]}
    with _writing(f) as handle, zipfile.ZipFile(handle, "w", zipfile.ZIP_STORED) as archive:
        _write_entry(archive, _STRUCTURE, json.dumps(structure).encode())
        for index, storage in enumerate(encoder.storages):
            _write_entry(archive, f"{_PREFIX}storages/{index}", storage.data)


def load(f, map_location=None, *, weights_only=True):
    """Read a file written by `save` or by `torch.save` (zip format); never runs code from the file.

    `map_location` may name the CPU (or be a dict or callable, which runtime ignores: its tensors are
    always on the CPU); `weights_only` is accepted for torch compatibility and has no effect, since
    loading is always restricted to data. Any file it cannot read raises UnreadableFileError.
    """
    _check_map_location(map_location)
    name = _file_name(f)
    with _open_binary(f, "rb") as handle, _reporting("runtime.load", name):
        stream = _seekable(handle)
        with _Archive(stream) as archive:
            names = set(archive.zip.namelist())
            if _STRUCTURE in names:
                return _load_runtime(archive)
            entry = _torch_pickle_entry(names)
            if entry is not None:
                return _load_torch(archive, entry)
            raise _FileError("is a zip archive, but neither a runtime.save file nor a torch.save file "
                             "(it has no runtime_save/structure.json and no data.pkl)")


def save_safetensors(tensors: dict, path, metadata: dict | None = None) -> None:
    """Write a flat dict of named tensors in the safetensors format, with optional str->str metadata."""
    _check_safetensors_args(tensors, metadata)
    header, arrays, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = dict(metadata)
    # NOTE: largest items first keeps every tensor aligned to its item size, as the reference writer does.
    for name, t in sorted(tensors.items(), key=lambda item: (-item[1].dtype.itemsize, item[0])):
        host = t._host()  # a CUDA tensor's values are copied to the host (they load as CPU tensors)
        array = host.astype(host.dtype.newbyteorder("<"), order="C", copy=False)
        header[name] = {"dtype": _SAFETENSORS_CODES[t.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}
        arrays.append(array)
        offset += array.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with _writing(path) as handle:
        handle.write(struct.pack("<Q", len(raw)))
        handle.write(raw)
        for array in arrays:
            handle.write(array.reshape(-1).view(np.uint8).data)


def load_safetensors(path) -> dict:
    """Read a safetensors file into a dict of tensors, validating its header against its contents.

    Any file it cannot read raises UnreadableFileError."""
    with open(path, "rb") as handle, _reporting("runtime.load_safetensors", _file_name(path)):
        size = os.fstat(handle.fileno()).st_size
        header_size = _read_header_size(handle, size)
        header = _parse_json(_read_exactly(handle, header_size), "header")
        buffer = bytearray(size - 8 - header_size)
        _read_into(handle, buffer)
        entries = _check_safetensors_header(header, len(buffer))
        return {name: _safetensors_tensor(buffer, *entry) for name, entry in entries.items()}


# ----------------------------------------------------------------------------------------------
# files and errors
# ----------------------------------------------------------------------------------------------

def _file_name(f) -> str:
    if isinstance(f, (str, os.PathLike)):
        return repr(os.fspath(f))
    name = getattr(f, "name", None)
    return f"<file object {name!r}>" if isinstance(name, str) else "<file object>"


@contextlib.contextmanager
def _open_binary(f, mode: str):
    if isinstance(f, (str, os.PathLike)):
        with open(f, mode) as handle:
            yield handle
    elif hasattr(f, "write" if "w" in mode else "read"):
        yield f
    else:
        raise TypeError(f"expected a path or a binary file object, got {type(f).__name__}")


@contextlib.contextmanager
def _writing(f):
    """A binary handle to write f through. A path is written atomically: into a temporary file beside it,
    flushed and fsynced, then renamed over it, so readers see the old file or the new one, never a part."""
    if not isinstance(f, (str, os.PathLike)):
        with _open_binary(f, "wb") as handle:
            yield handle
        return
    target = os.path.realpath(f)  # NOTE: through a symlink to its target, as open(path, "wb") writes
    directory, base = os.path.split(target)
    temporary = os.path.join(directory, f".{base}.{secrets.token_hex(8)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with open(fd, "wb") as handle:
            with contextlib.suppress(FileNotFoundError):  # an existing file keeps its permissions
                os.chmod(fd, stat.S_IMODE(os.stat(target).st_mode))
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable (not possible on every system)
        directory_fd = os.open(directory or ".", os.O_RDONLY)
        try:
            os.fsync(directory_fd)
        finally:
            os.close(directory_fd)


@contextlib.contextmanager
def _reporting(action: str, name: str):
    """Turn any failure to read the file, whatever its bytes, into one UnreadableFileError naming the function
    and the file. Only MemoryError (the data a valid file holds did not fit) and BaseExceptions pass through."""
    try:
        yield
    except _BinaryModeError:
        raise
    except _FileError as e:
        raise UnreadableFileError(f"{action}: {name} {e}", name, str(e)) from None
    except pickle.UnpicklingError as e:
        raise _UnpicklingFileError(f"{action}: {name}: {e}", name, str(e)) from None
    except RecursionError:
        reason = "is nested too deeply to read (corrupted or hostile)"
        raise UnreadableFileError(f"{action}: {name} {reason}", name, reason) from None
    except MemoryError:
        raise
    except Exception as e:  # NOTE: the bytes are untrusted: whatever a library raises on them is a file problem
        reason = f"is corrupted or truncated ({type(e).__name__}: {e})"
        raise UnreadableFileError(f"{action}: {name} {reason}", name, reason) from e


def _seekable(handle):
    """The handle itself, or its contents in memory when it cannot seek (zip reading needs to)."""
    if isinstance(handle, io.TextIOBase):
        raise _BinaryModeError("runtime.load: expected a binary file object (open the file with 'rb')")
    seekable = getattr(handle, "seekable", None)
    return handle if seekable is not None and seekable() else io.BytesIO(handle.read())


class _Archive:
    """A zip archive read without trusting its directory: entries must be stored (uncompressed), unencrypted
    and inside the file, and all entries read together may not claim more bytes than the file holds. So
    reading allocates no more than the file's size, however large the sizes the directory declares."""

    _LOCAL_HEADER = struct.Struct("<4s5H3L2H")

    def __init__(self, stream):
        start = stream.tell()
        head = stream.read(16)
        if not isinstance(head, bytes):
            raise _BinaryModeError("runtime.load: expected a binary file object (open the file with 'rb')")
        self.size = stream.seek(0, io.SEEK_END)
        stream.seek(start)
        try:
            self.zip = zipfile.ZipFile(stream)
        except zipfile.BadZipFile:
            raise _FileError(_describe_foreign(head)) from None
        self.stream, self.unread = stream, self.size

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.zip.close()

    def read(self, name: str) -> bytes:
        """The bytes of a small entry (a pickle, JSON or text)."""
        start, size, crc = self._locate(name)
        self.stream.seek(start)
        data = self.stream.read(size)
        self._check(name, data, size, crc)
        return data

    def read_storage(self, name: str, nbytes: int) -> np.ndarray:
        """A writable uint8 array with the bytes of one entry, which must hold exactly nbytes."""
        try:
            declared = self.zip.getinfo(name).file_size
        except KeyError:
            raise _FileError(f"has no entry {name!r}") from None
        if declared != nbytes:
            raise _FileError(f"has an entry {name!r} of {declared} bytes, but its tensors need {nbytes}")
        start, size, crc = self._locate(name)
        buffer = bytearray(size)
        self.stream.seek(start)
        _read_into(self.stream, buffer)
        self._check(name, buffer, size, crc)
        return np.frombuffer(buffer, np.uint8)

    def _locate(self, name: str) -> tuple:
        """(start, size, crc) of an entry's data, after checking it before anything is allocated for it."""
        try:
            info = self.zip.getinfo(name)
        except KeyError:
            raise _FileError(f"has no entry {name!r}") from None
        if info.flag_bits & 0x1:
            raise _FileError(f"has an encrypted entry {name!r}; runtime.save and torch.save never encrypt")
        if info.compress_type != zipfile.ZIP_STORED:
            raise _FileError(f"has a compressed entry {name!r} (zip method {info.compress_type}); runtime.save and "
                             f"torch.save store entries uncompressed, and runtime does not inflate them")
        size = info.file_size
        if info.compress_size != size:
            raise _FileError(f"has a damaged directory: stored entry {name!r} declares {info.compress_size} bytes "
                             f"stored for {size}")
        if not 0 <= info.header_offset <= self.size - self._LOCAL_HEADER.size:
            raise _FileError(f"has a damaged directory: entry {name!r} starts at byte {info.header_offset}, outside "
                             f"the {self.size}-byte file")
        self.stream.seek(info.header_offset)
        fields = self._LOCAL_HEADER.unpack(self.stream.read(self._LOCAL_HEADER.size))
        signature, method, name_size, extra_size = fields[0], fields[3], fields[9], fields[10]
        raw_name = self.stream.read(name_size)
        if signature != b"PK\x03\x04" or method != zipfile.ZIP_STORED or raw_name != _zip_name(info):
            raise _FileError(f"has a damaged zip entry {name!r}: its local header does not match the directory")
        start = info.header_offset + self._LOCAL_HEADER.size + name_size + extra_size
        if start + size > self.size:
            raise _FileError(f"has an entry {name!r} of {size} bytes that runs past the end of the "
                             f"{self.size}-byte file (truncated?)")
        if size > self.unread:
            raise _FileError(f"has entries that together claim more bytes than the {self.size}-byte file holds "
                             f"(overlapping entries)")
        self.unread -= size
        return start, size, info.CRC

    @staticmethod
    def _check(name: str, data, size: int, crc: int) -> None:
        if len(data) != size:
            raise _FileError(f"is truncated: entry {name!r} has {len(data)} of its {size} bytes")
        if zlib.crc32(data) != crc:
            raise _FileError(f"is corrupted or truncated (entry {name!r} fails its CRC-32 check)")


def _zip_name(info: zipfile.ZipInfo) -> bytes:
    return info.orig_filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437")


def _read_into(stream, buffer: bytearray) -> None:
    """Fill buffer from stream (stopping early at the end of the file) without a second copy of the data."""
    view, filled = memoryview(buffer), 0
    readinto = getattr(stream, "readinto", None)
    while filled < len(buffer):
        if readinto is not None:
            n = readinto(view[filled:filled + (1 << 26)])
        else:
            chunk = stream.read(min(len(buffer) - filled, 1 << 20))
            n = len(chunk)
            view[filled:filled + n] = chunk
        if not n:
            raise _FileError(f"is truncated: it ends {len(buffer) - filled} bytes into a stored entry")
        filled += n


def _read_exactly(handle, n: int) -> bytes:
    data = handle.read(n)
    if len(data) != n:
        raise _FileError(f"is truncated: it ends {n - len(data)} bytes early")
    return data


def _describe_foreign(head: bytes) -> str:
    if not head:
        return "is empty"
    if head.startswith(b"PK"):
        return "starts like a zip archive but its end is missing or damaged: the file is truncated or corrupted"
    if head[:1] == b"\x80":
        return ("is a raw pickle (torch's legacy format, or a plain pickle): runtime.load never unpickles "
                "those; re-save it with torch.save's default zip format")
    if head[8:9] == b"{":
        return "looks like a safetensors file: read it with runtime.load_safetensors"
    return "is not a runtime.save or torch.save file (not a zip archive)"


def _check_map_location(map_location) -> None:
    # NOTE: dicts and callables remap storages between devices; runtime's storages are on the CPU already.
    if map_location is None or callable(map_location):
        return
    targets = map_location.values() if isinstance(map_location, dict) else [map_location]
    for target in targets:
        try:
            check_device(str(target))  # str() also accepts torch.device objects
        except (RuntimeError, TypeError) as e:
            raise RuntimeError(f"runtime.load(map_location={map_location!r}): {e}") from None


def _write_entry(archive: zipfile.ZipFile, name: str, data) -> None:
    # NOTE: a fixed timestamp makes saving the same object twice give identical bytes.
    archive.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data)


def _parse_json(raw: bytes, what: str):
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:  # JSONDecodeError, and ints beyond Python's digit limit
        raise _FileError(f"has a corrupted {what}: not valid JSON ({e})") from None
    except RecursionError:
        raise _FileError(f"has a corrupted {what}: JSON nested too deeply") from None


# ----------------------------------------------------------------------------------------------
# arrays over stored bytes
# ----------------------------------------------------------------------------------------------

def _as_int(value, what: str) -> int:
    if type(value) is not int:
        raise _FileError(f"has a malformed {what}: expected an integer, got {reprlib.repr(value)}")
    return value


def _as_ints(value, what: str) -> list:
    if not isinstance(value, (list, tuple)):
        raise _FileError(f"has a malformed {what}: expected a list of integers, got {reprlib.repr(value)}")
    return [_as_int(v, what) for v in value]


def _extent(shape, strides, offset: int, itemsize: int) -> tuple:
    """The byte range [low, high) that an array's elements occupy (empty arrays occupy nothing)."""
    if 0 in shape:
        return offset, offset
    low = offset + sum(s * (n - 1) for n, s in zip(shape, strides) if s < 0)
    high = offset + sum(s * (n - 1) for n, s in zip(shape, strides) if s > 0) + itemsize
    return low, high


def _view(storage: np.ndarray, np_dtype: np.dtype, shape, offset: int, strides, what: str) -> np.ndarray:
    """An array of np_dtype over storage's bytes; a _FileError if the layout reaches outside them."""
    shape, strides, offset = _as_ints(shape, f"{what} shape"), _as_ints(strides, f"{what} stride"), \
        _as_int(offset, f"{what} offset")
    if len(shape) != len(strides) or any(n < 0 for n in shape):
        raise _FileError(f"has a malformed {what}: shape {shape} does not fit strides {strides}")
    if 0 in shape:
        return np.empty(shape, np_dtype)
    low, high = _extent(shape, strides, offset, np_dtype.itemsize)
    if low < 0 or high > storage.nbytes:
        raise _FileError(f"has a malformed {what}: shape {shape}, strides {strides} and offset {offset} reach "
                         f"bytes [{low}, {high}) of a {storage.nbytes}-byte storage")
    return np.ndarray(shape, np_dtype, buffer=storage, offset=offset, strides=strides)


def _new_tensor(array: np.ndarray, requires_grad, what: str) -> Tensor:
    t = from_numpy(array)
    if requires_grad is not False:
        if requires_grad is not True or not t.dtype.is_differentiable:
            raise _FileError(f"has a malformed {what}: requires_grad={requires_grad!r} for a {t.dtype.name} tensor")
        t.requires_grad_(True)
    return t


# ----------------------------------------------------------------------------------------------
# runtime's format: a zip with runtime_save/structure.json and one raw little-endian entry per storage
# ----------------------------------------------------------------------------------------------

_FORMAT, _VERSION = "runtime.save", 1
_PREFIX = "runtime_save/"
_STRUCTURE = _PREFIX + "structure.json"
_CONTAINER_TAGS = ("tensor", "ndarray", "list", "tuple", "dict", "ordered_dict")


class _Encoder:
    """Turns an object tree into JSON values, collecting its tensors and the memory they view.

    Containers become {"list": [...]}, {"tuple": [...]}, {"dict": [[key, value], ...]} or
    {"ordered_dict": [...], "metadata": ...}; a tensor becomes {"tensor": index into `tensors`}.
    """

    def __init__(self):
        self.tensors: list[dict] = []
        self.storages: list[np.ndarray] = []
        self._tensor_index: dict[int, int] = {}
        self._storage_index: dict[int, int] = {}
        self._open: set[int] = set()

    def encode(self, value, path: str):
        if value is None or isinstance(value, _PLAIN):
            return _plain(value)
        if isinstance(value, Tensor):
            return {"tensor": self._tensor(value)}
        if isinstance(value, np.ndarray):
            return {"ndarray": self._array(value, path)}
        if isinstance(value, (dict, list, tuple)):
            return self._container(value, path)
        raise TypeError(f"runtime.save: cannot save {type(value).__name__} at {path}: supported values are "
                        f"tensors, numpy arrays, dicts, lists, tuples, int, float, bool, str and None")

    def _container(self, value, path: str):
        if id(value) in self._open:
            raise ValueError(f"runtime.save: {path} contains itself (a reference cycle)")
        self._open.add(id(value))
        try:
            if isinstance(value, dict):
                return self._mapping(value, path)
            items = [self.encode(v, f"{path}[{i}]") for i, v in enumerate(value)]
            return {"tuple" if isinstance(value, tuple) else "list": items}
        finally:
            self._open.discard(id(value))

    def _mapping(self, value: dict, path: str) -> dict:
        pairs = [[_key(k, path), self.encode(v, f"{path}[{k!r}]")] for k, v in value.items()]
        if not isinstance(value, OrderedDict):
            return {"dict": pairs}
        encoded = {"ordered_dict": pairs}
        if hasattr(value, "_metadata"):  # nn.Module.state_dict's per-module versions
            encoded["metadata"] = self.encode(value._metadata, f"{path}._metadata")
        return encoded

    def _tensor(self, t: Tensor) -> int:
        index = self._tensor_index.get(id(t))
        if index is None:
            # NOTE: a CUDA tensor is written from a host copy of its values (it loads as a CPU tensor, as torch's
            # map_location="cpu" gives)
            storage, offset, strides = self._storage(t._host())
            index = self._tensor_index[id(t)] = len(self.tensors)
            self.tensors.append({"storage": storage, "dtype": t.dtype.name, "shape": list(t._data.shape),
                                 "strides": strides, "offset": offset, "requires_grad": t.requires_grad})
        return index

    def _array(self, array: np.ndarray, path: str) -> int:
        """A numpy array (a data script's `torch.save(array, ...)`) as a tensor record, which loads back as an array."""
        index = self._tensor_index.get(id(array))
        if index is None:
            try:
                dtype = dt.from_numpy_dtype(array.dtype)
            except TypeError as error:
                raise TypeError(f"runtime.save: cannot save the numpy array at {path}: {error}") from None
            storage, offset, strides = self._storage(array)
            index = self._tensor_index[id(array)] = len(self.tensors)
            self.tensors.append({"storage": storage, "dtype": dtype.name, "shape": list(array.shape),
                                 "strides": strides, "offset": offset, "requires_grad": False})
        return index

    def _storage(self, array: np.ndarray) -> tuple:
        """(storage index, byte offset, byte strides) of an array: a view into its owner's memory if it can be."""
        owner = _memory_owner(array)
        if owner is not None:
            offset = _address(array) - _address(owner)
            low, high = _extent(array.shape, array.strides, offset, array.itemsize)
            if 0 <= low and high <= owner.nbytes:
                key = id(ultimate_base(owner))
                if key not in self._storage_index:
                    self._storage_index[key] = len(self.storages)
                    self.storages.append(owner.ravel(order="K").view(np.uint8))
                return self._storage_index[key], offset, list(array.strides)
        copy = array.copy(order="C")
        self.storages.append(copy.reshape(-1).view(np.uint8))
        return len(self.storages) - 1, 0, list(copy.strides)


def _plain(value):
    """A plain value as its exact Python type (numpy scalars and int/float subclasses included)."""
    for kind in _PLAIN:
        if isinstance(value, kind):
            return kind(value)
    return value


def _key(key, path: str):
    if key is None or isinstance(key, _PLAIN):
        return _plain(key)
    raise TypeError(f"runtime.save: cannot save the dict key {key!r} ({type(key).__name__}) in {path}: "
                    f"keys must be str, int, float, bool or None")


def _memory_owner(array: np.ndarray):
    """The ndarray owning array's memory, if that memory is one dense block; None otherwise."""
    owner = memory_owner(array)
    return owner if owner.flags.c_contiguous or owner.flags.f_contiguous else None


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def _load_runtime(archive: _Archive):
    structure = _parse_json(archive.read(_STRUCTURE), _STRUCTURE)
    _check_structure(structure)
    storages = [archive.read_storage(f"{_PREFIX}storages/{i}", _as_int(n, "storage size"))
                for i, n in enumerate(structure["storages"])]
    tensors = [_decode_tensor(record, storages, i) for i, record in enumerate(structure["tensors"])]
    return _decode(structure["object"], tensors)


def _check_structure(structure) -> None:
    if not isinstance(structure, dict) or structure.get("format") != _FORMAT:
        raise _FileError(f"has a {_STRUCTURE} that does not describe a runtime.save file")
    version = structure.get("version")
    if version != _VERSION:
        raise _FileError(f"has format version {version!r}; this runtime reads version {_VERSION}")
    if structure.get("byteorder") != sys.byteorder:
        raise _FileError(f"was written on a {structure.get('byteorder')}-endian machine; this one is "
                         f"{sys.byteorder}-endian")
    for field in ("storages", "tensors"):
        if not isinstance(structure.get(field), list):
            raise _FileError(f"has a malformed {_STRUCTURE}: '{field}' is not a list")
    if "object" not in structure:
        raise _FileError(f"has a malformed {_STRUCTURE}: 'object' is missing")


def _decode_tensor(record, storages: list, index: int) -> Tensor:
    what = f"tensor {index}"
    if not isinstance(record, dict):
        raise _FileError(f"has a malformed {what}: expected an object, got {reprlib.repr(record)}")
    dtype = _DTYPES_BY_NAME.get(record.get("dtype")) if isinstance(record.get("dtype"), str) else None
    if dtype is None:
        raise _FileError(f"has a malformed {what}: unknown dtype {reprlib.repr(record.get('dtype'))}")
    storage = _as_int(record.get("storage"), f"{what} storage index")
    if not 0 <= storage < len(storages):
        raise _FileError(f"has a malformed {what}: storage {storage} does not exist ({len(storages)} stored)")
    array = _view(storages[storage], dtype.np, record.get("shape"), record.get("offset"), record.get("strides"), what)
    return _new_tensor(array, record.get("requires_grad", False), what)


def _decode(value, tensors: list):
    if value is None or isinstance(value, _PLAIN):
        return value
    tag = _tag(value)
    items = value[tag]
    if tag in ("tensor", "ndarray"):
        if type(items) is not int or not 0 <= items < len(tensors):
            raise _FileError(f"refers to tensor {reprlib.repr(items)}, which does not exist ({len(tensors)} stored)")
        return tensors[items] if tag == "tensor" else tensors[items]._data
    if not isinstance(items, list):
        raise _FileError(f"has a malformed '{tag}' entry: expected a list, got {reprlib.repr(items)}")
    if tag in ("list", "tuple"):
        decoded = [_decode(v, tensors) for v in items]
        return decoded if tag == "list" else tuple(decoded)
    if tag == "dict":
        return dict(_decode_pair(p, tensors) for p in items)
    mapping = OrderedDict(_decode_pair(p, tensors) for p in items)
    if "metadata" in value:
        mapping._metadata = _decode(value["metadata"], tensors)
    return mapping


def _tag(value) -> str:
    tags = [t for t in _CONTAINER_TAGS if isinstance(value, dict) and t in value]
    if len(tags) != 1:
        raise _FileError(f"has an unrecognised value in {_STRUCTURE}: {reprlib.repr(value)}")
    return tags[0]


def _decode_pair(pair, tensors: list) -> tuple:
    if not (isinstance(pair, list) and len(pair) == 2 and (pair[0] is None or isinstance(pair[0], _PLAIN))):
        raise _FileError(f"has a malformed dict entry in {_STRUCTURE}: {reprlib.repr(pair)}")
    return pair[0], _decode(pair[1], tensors)


# ----------------------------------------------------------------------------------------------
# torch.save's zip format: <archive>/data.pkl (a pickle) and <archive>/data/<key> (raw storages)
# ----------------------------------------------------------------------------------------------

# -- writing torch.save's format --------------------------------------------------------------------------------

_TORCH_STORAGE_NAMES = {dt.float64: "DoubleStorage", dt.float32: "FloatStorage", dt.float16: "HalfStorage",
                        dt.bfloat16: "BFloat16Storage", dt.int64: "LongStorage", dt.int32: "IntStorage",
                        dt.int16: "ShortStorage", dt.int8: "CharStorage", dt.uint8: "ByteStorage",
                        dt.bool_: "BoolStorage", dt.complex64: "ComplexFloatStorage",
                        dt.complex128: "ComplexDoubleStorage"}


class _NoTorchSpelling(Exception):
    """A value torch.save's weights-only format has no spelling for (a numpy array): runtime's format takes it."""


class _Global:
    """A global that a torch data.pkl names (torch._utils._rebuild_tensor_v2, torch.FloatStorage): written as a GLOBAL
    opcode by name, never looked up (torch need not be installed to write its format)."""

    __slots__ = ("module", "name")

    def __init__(self, module: str, name: str):
        self.module, self.name = module, name

    def __call__(self, *args):  # (pickle wants a reduce's callable to be callable)
        raise TypeError(f"{self.module}.{self.name} is only a name written into a torch data.pkl")


class _StorageRecord(NamedTuple):
    """A storage of the file: its key (data/<key>), dtype and element count."""

    key: str
    dtype: dt.dtype
    numel: int


_REBUILD_TENSOR = _Global("torch._utils", "_rebuild_tensor_v2")
_REBUILD_PARAMETER = _Global("torch._utils", "_rebuild_parameter")


class _TorchPickler(pickle._Pickler):
    """pickle's Python pickler writing torch's data.pkl: tensors as _rebuild_tensor_v2 over persistent storage ids,
    Parameters as _rebuild_parameter, protocol 2 (torch's)."""

    dispatch = pickle._Pickler.dispatch.copy()

    def __init__(self, file):
        super().__init__(file, protocol=2)
        self.storages: list[tuple[str, np.ndarray]] = []  # (key, its bytes)
        self._storage_of: dict = {}  # (id of the memory's owner, dtype) -> (record, owner address)

    @classmethod
    def pickle(cls, obj) -> tuple[bytes, list]:
        """(data.pkl's bytes, [(key, bytes)]); raises _NoTorchSpelling before anything is written."""
        buffer = io.BytesIO()
        pickler = cls(buffer)
        try:
            pickler.dump(obj)
        except RecursionError:
            raise ValueError("runtime.save: the object contains itself (a reference cycle)") from None
        return buffer.getvalue(), pickler.storages

    def _save_global_name(self, obj: _Global) -> None:
        self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode("utf-8"))
        self.memoize(obj)

    dispatch[_Global] = _save_global_name

    def persistent_id(self, obj):
        if isinstance(obj, _StorageRecord):
            return ("storage", _Global("torch", _TORCH_STORAGE_NAMES[obj.dtype]), obj.key, "cpu", obj.numel)
        return None

    def reducer_override(self, obj):
        if isinstance(obj, Tensor):
            return self._reduce_tensor(obj)
        if isinstance(obj, (dict, list, tuple, str, bytes, int, float, bool, type(None))):
            if isinstance(obj, (dict, list, tuple)) and type(obj) not in (dict, list, tuple, OrderedDict):
                raise _NoTorchSpelling(type(obj).__name__)
            return NotImplemented
        if isinstance(obj, (_StorageRecord, _Global)) or obj is OrderedDict:
            return NotImplemented
        raise _NoTorchSpelling(type(obj).__name__)  # numpy arrays and anything torch.load(weights_only) refuses

    def _reduce_tensor(self, t: Tensor):
        from .nn.parameter import Parameter

        if type(t) not in (Tensor, Parameter):
            raise _NoTorchSpelling(type(t).__name__)
        data = t._host()
        if type(t) is Parameter:
            return _REBUILD_PARAMETER, (Tensor._from_array(data), bool(t.requires_grad), OrderedDict())
        record, offset, strides = self._storage(data, t.dtype)
        return _REBUILD_TENSOR, (record, offset, tuple(data.shape), strides, bool(t.requires_grad), OrderedDict())

    def _storage(self, array: np.ndarray, dtype: dt.dtype) -> tuple:
        """(storage record, offset and strides in elements): a view into its owner's memory where torch can say it
        (a whole number of elements in, strides non-negative), else a copy of its own."""
        itemsize = array.itemsize
        owner = _memory_owner(array)
        if owner is not None and owner.nbytes % itemsize == 0 and all(s >= 0 and s % itemsize == 0
                                                                       for s in array.strides):
            offset = _address(array) - _address(owner)
            low, high = _extent(array.shape, array.strides, offset, itemsize)
            if offset % itemsize == 0 and 0 <= low and high <= owner.nbytes:
                key = (id(ultimate_base(owner)), dtype)
                if key not in self._storage_of:
                    record = _StorageRecord(str(len(self.storages)), dtype, owner.nbytes // itemsize)
                    self.storages.append((record.key, owner.ravel(order="K").view(np.uint8)))
                    self._storage_of[key] = record
                return (self._storage_of[key], offset // itemsize,
                        tuple(s // itemsize for s in array.strides))
        copy = array.copy(order="C")
        record = _StorageRecord(str(len(self.storages)), dtype, copy.size)
        self.storages.append((record.key, copy.reshape(-1).view(np.uint8)))
        return record, 0, tuple(s // itemsize for s in copy.strides)


def _write_torch_zip(pickled: bytes, storages: list, f) -> None:
    """torch's zip layout under archive/: data.pkl, the storages as data/<key>, the version records torch.load
    checks, and a serialization id (a hash of data.pkl and the storages' sizes, so equal saves give equal files;
    the zip's CRCs already cover the values)."""
    digest = hashlib.sha256(pickled)
    for key, data in storages:
        digest.update(f"{key}:{data.nbytes};".encode())
    with _writing(f) as handle, zipfile.ZipFile(handle, "w", zipfile.ZIP_STORED) as archive:
        _write_entry(archive, "archive/data.pkl", pickled)
        _write_entry(archive, "archive/.format_version", b"1")
        _write_entry(archive, "archive/byteorder", sys.byteorder.encode())
        for key, data in storages:
            _write_entry(archive, f"archive/data/{key}", data.data if data.flags.c_contiguous else data.tobytes())
        _write_entry(archive, "archive/version", b"3\n")
        _write_entry(archive, "archive/.data/serialization_id", digest.hexdigest()[:40].encode())


class _StorageType(NamedTuple):
    name: str
    dtype: dt.dtype


class _TorchStorage(NamedTuple):
    data: np.ndarray  # uint8, the storage's bytes
    dtype: dt.dtype


_TORCH_STORAGES = {"DoubleStorage": dt.float64, "FloatStorage": dt.float32, "HalfStorage": dt.float16,
                   "BFloat16Storage": dt.bfloat16,
                   "LongStorage": dt.int64, "IntStorage": dt.int32, "ShortStorage": dt.int16,
                   "CharStorage": dt.int8, "ByteStorage": dt.uint8, "BoolStorage": dt.bool_,
                   "ComplexFloatStorage": dt.complex64, "ComplexDoubleStorage": dt.complex128}
_TORCH_UNSUPPORTED_STORAGES: dict = {}  # (every torch storage type has a runtime dtype now)


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks, metadata=None):
    """torch._utils._rebuild_tensor_v2, over a storage read from the archive (offset and strides in elements)."""
    if not isinstance(storage, _TorchStorage):
        raise _FileError(f"has a tensor whose storage is {reprlib.repr(storage)}, not a stored storage")
    itemsize = storage.dtype.itemsize
    offset = _as_int(storage_offset, "tensor storage offset") * itemsize
    strides = [s * itemsize for s in _as_ints(stride, "tensor stride")]
    return _new_tensor(_view(storage.data, storage.dtype.np, size, offset, strides, "tensor"), requires_grad, "tensor")


def _rebuild_parameter(data, requires_grad, backward_hooks, state=None):
    """torch._utils._rebuild_parameter(_with_state): a runtime Parameter over the stored tensor's memory."""
    from .nn.parameter import Parameter

    if not isinstance(data, Tensor):
        raise _FileError(f"has a parameter whose data is {reprlib.repr(data)}, not a tensor")
    if not isinstance(requires_grad, bool):
        raise _FileError(f"has a parameter whose requires_grad is {reprlib.repr(requires_grad)}, not a bool")
    return Parameter(data, requires_grad=requires_grad)


_TORCH_GLOBALS = {("collections", "OrderedDict"): OrderedDict,
                  ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
                  ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
                  ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
                  **{("torch", name): _StorageType(name, dtype) for name, dtype in _TORCH_STORAGES.items()}}


class _WeightsUnpickler(pickle.Unpickler):
    """Unpickles a torch data.pkl allowing only the globals of weights-only state dicts; reads storages lazily."""

    def __init__(self, file, archive: _Archive, prefix: str, swap_bytes: bool):
        super().__init__(file)
        self._archive, self._prefix, self._swap_bytes = archive, prefix, swap_bytes
        self._storages: dict[str, np.ndarray] = {}

    def find_class(self, module: str, name: str):
        found = _TORCH_GLOBALS.get((module, name))
        if found is None and module == "torch" and name in _TORCH_UNSUPPORTED_STORAGES:
            raise _FileError(f"holds {_TORCH_UNSUPPORTED_STORAGES[name]} tensors (torch.{name}), which runtime "
                             f"does not support (supported: {', '.join(d.name for d in dt.ALL_DTYPES)})")
        if found is None:
            allowed = ", ".join(f"{m}.{n}" for m, n in _TORCH_GLOBALS)
            raise pickle.UnpicklingError(f"refusing to load the global '{module}.{name}' from data.pkl: only "
                                         f"{allowed} are allowed, and no code from the file is run")
        # NOTE: the BUILD opcode can set attributes on any object on the stack, so functions are
        # handed out as fresh wrappers that a malicious file cannot use to alter runtime's own.
        return (lambda *args: found(*args)) if callable(found) and not isinstance(found, type) else found

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _StorageType)):
            raise _FileError(f"has an unexpected persistent id {reprlib.repr(pid)} in data.pkl")
        _, storage_type, key, _location, numel = pid  # NOTE: the location is ignored: storages load on the CPU.
        if not isinstance(key, str):
            raise _FileError(f"has a malformed storage key {reprlib.repr(key)} in data.pkl")
        dtype = storage_type.dtype
        nbytes = _as_int(numel, "storage size") * dtype.itemsize
        data = self._storages.get(key)
        if data is None:
            data = self._storages[key] = self._archive.read_storage(f"{self._prefix}data/{key}", nbytes)
            if self._swap_bytes:
                data.view(dtype.np).byteswap(inplace=True)
        elif data.nbytes != nbytes:
            raise _FileError(f"uses storage {key!r} with two different sizes")
        return _TorchStorage(data, dtype)


def _torch_pickle_entry(names) -> str | None:
    entries = sorted(n for n in names if n == "data.pkl" or n.endswith("/data.pkl"))
    if len(entries) > 1:
        raise _FileError(f"has several data.pkl entries ({', '.join(entries)}); expected one")
    return entries[0] if entries else None


def _load_torch(archive: _Archive, entry: str):
    prefix = entry[: -len("data.pkl")]
    names = set(archive.zip.namelist())
    if prefix + "constants.pkl" in names:
        raise _FileError("is a TorchScript archive (torch.jit.save), not a torch.save file")
    byteorder = "little"
    if prefix + "byteorder" in names:
        byteorder = archive.read(prefix + "byteorder").decode("ascii", "replace").strip()
    if byteorder not in ("little", "big"):
        raise _FileError(f"has an unknown byte order {reprlib.repr(byteorder)}")
    pickled = archive.read(entry)
    _check_pickle(pickled, entry)
    unpickler = _WeightsUnpickler(io.BytesIO(pickled), archive, prefix, byteorder != sys.byteorder)
    try:
        return unpickler.load()
    except (_FileError, pickle.UnpicklingError, MemoryError, RecursionError):
        raise
    except Exception as e:  # NOTE: data.pkl is untrusted input; any failure to rebuild it is a file problem.
        raise _FileError(f"has a malformed {entry} ({type(e).__name__}: {e})") from None


_MEMO_PUTS = {"PUT", "BINPUT", "LONG_BINPUT"}


def _check_pickle(pickled: bytes, entry: str) -> None:
    """Walk the opcodes before unpickling: every argument must be present in full, and a memo index may not
    exceed the number of objects memoized so far. The C unpickler sizes its memo by the largest index and a
    bytes object by its declared length before reading it, so either could allocate gigabytes for a few bytes."""
    memoized = 0
    # NOTE: warnings off while walking: genops decodes a text STRING's escapes; the unpickler judges those itself
    with warnings.catch_warnings(action="ignore"):
        try:
            for opcode, arg, position in pickletools.genops(pickled):
                if opcode.name in _MEMO_PUTS:
                    if arg > memoized:
                        raise _FileError(f"has a malformed {entry}: memo index {arg} at byte {position}, but only "
                                         f"{memoized} objects were memoized before it")
                    memoized += 1
                elif opcode.name == "MEMOIZE":
                    memoized += 1
        except ValueError as e:  # genops: an unknown opcode, or an argument the data ends before
            raise _FileError(f"has a malformed {entry} ({e})") from None


# ----------------------------------------------------------------------------------------------
# safetensors: 8-byte little-endian header size, JSON header, then one byte buffer
# ----------------------------------------------------------------------------------------------

_SAFETENSORS_DTYPES = {"F16": dt.float16, "BF16": dt.bfloat16, "F32": dt.float32, "F64": dt.float64, "U8": dt.uint8,
                       "I8": dt.int8, "I16": dt.int16, "I32": dt.int32, "I64": dt.int64, "BOOL": dt.bool_}
_SAFETENSORS_CODES = {d: code for code, d in _SAFETENSORS_DTYPES.items()}
_MAX_HEADER_SIZE = 100_000_000  # the reference implementation's limit


def _check_safetensors_args(tensors, metadata) -> None:
    if not isinstance(tensors, dict):
        raise TypeError(f"save_safetensors: expected a dict of name -> tensor, got {type(tensors).__name__}")
    for name, t in tensors.items():
        if not isinstance(name, str) or name == "__metadata__":
            raise ValueError(f"save_safetensors: tensor names must be strings other than '__metadata__', got {name!r}")
        if not isinstance(t, Tensor):
            raise TypeError(f"save_safetensors: {name!r} is a {type(t).__name__}, not a tensor")
    if metadata is not None and not (isinstance(metadata, dict) and
                                     all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        raise TypeError(f"save_safetensors: metadata must be a dict of str -> str, got {reprlib.repr(metadata)}")


def _read_header_size(handle, file_size: int) -> int:
    if file_size < 8:
        raise _FileError(f"is {file_size} bytes long: too short for a safetensors header")
    (header_size,) = struct.unpack("<Q", _read_exactly(handle, 8))
    if header_size > min(_MAX_HEADER_SIZE, file_size - 8):
        raise _FileError(f"declares a {header_size}-byte header, but only {file_size - 8} bytes follow "
                         f"(truncated, or not a safetensors file)")
    return header_size


def _check_safetensors_header(header, buffer_size: int) -> dict:
    """name -> (dtype, shape, begin) for each tensor, after checking every entry and that they tile the buffer."""
    if not isinstance(header, dict):
        raise _FileError("has a header that is not a JSON object")
    metadata = header.get("__metadata__", {})
    if not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise _FileError(f"has malformed __metadata__ {reprlib.repr(metadata)}: expected str -> str")
    entries, spans = {}, []
    for name, info in header.items():
        if name != "__metadata__":
            dtype, shape, (begin, end) = _check_safetensors_entry(name, info, buffer_size)
            entries[name] = (dtype, shape, begin)
            spans.append((begin, end, name))
    _check_tiling(sorted(spans), buffer_size)
    return entries


def _check_safetensors_entry(name: str, info, buffer_size: int) -> tuple:
    what = f"header entry {name!r}"
    if not isinstance(info, dict):
        raise _FileError(f"has a malformed {what}: expected an object")
    code = info.get("dtype")
    dtype = _SAFETENSORS_DTYPES.get(code) if isinstance(code, str) else None
    if dtype is None:
        raise _FileError(f"has tensor {name!r} of dtype {reprlib.repr(code)}, which runtime does not support "
                         f"(supported: {', '.join(_SAFETENSORS_DTYPES)})")
    shape = _as_ints(info.get("shape"), f"{what} shape")
    offsets = _as_ints(info.get("data_offsets"), f"{what} data_offsets")
    if any(n < 0 for n in shape) or len(offsets) != 2 or not 0 <= offsets[0] <= offsets[1]:
        raise _FileError(f"has a malformed {what}: shape {shape}, data_offsets {offsets}")
    if offsets[1] > buffer_size:
        raise _FileError(f"has tensor {name!r} at bytes {offsets} beyond the {buffer_size}-byte data buffer "
                         f"(truncated file?)")
    nbytes = math.prod(shape) * dtype.itemsize
    if offsets[1] - offsets[0] != nbytes:
        raise _FileError(f"has tensor {name!r} of shape {shape} and dtype {info['dtype']} ({nbytes} bytes), "
                         f"but its data_offsets {offsets} span {offsets[1] - offsets[0]} bytes")
    return dtype, shape, offsets


def _check_tiling(spans: list, buffer_size: int) -> None:
    """The tensors' byte ranges must cover the buffer exactly: no overlaps, holes or trailing bytes."""
    position, previous = 0, None
    for begin, end, name in spans:
        if begin < position:
            raise _FileError(f"has overlapping tensors: {name!r} starts at byte {begin}, inside {previous!r}")
        if begin > position:
            raise _FileError(f"has bytes [{position}, {begin}) of the data buffer that no tensor uses")
        position, previous = end, name
    if position != buffer_size:
        raise _FileError(f"has {buffer_size - position} trailing bytes after the last tensor")


def _safetensors_tensor(buffer: bytearray, dtype: dt.dtype, shape: list, begin: int) -> Tensor:
    little = dtype.np.newbyteorder("<")
    array = np.frombuffer(buffer, little, count=math.prod(shape), offset=begin).reshape(shape)
    if begin % dtype.itemsize or not little.isnative:  # NOTE: copy misaligned or foreign-endian data once
        array = array.astype(dtype.np)
    return from_numpy(array)
