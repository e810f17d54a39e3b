"""Host arrays that start on a 64-byte cache line: what tensor factories and nnc's compiled kernels allocate."""
from __future__ import annotations

import math
import weakref

import numpy as np

# Arrays of at least this many bytes start on a cache line; smaller ones are plain np.empty.
ALIGNED_MIN_BYTES = 1 << 16
CACHE_LINE = 64


def aligned_empty(shape, dtype) -> np.ndarray:
    """np.empty(shape, dtype), starting on a 64-byte cache line when it is at least ALIGNED_MIN_BYTES long.

    NOTE: numpy's large allocations start 16 bytes into a page, so every 64-byte vector load or store of a kernel
    over them spans two cache lines. relu(x*w+b)+0.5*x over [4096, 1024] float32 writing such an output took
    1.5x the time of the same kernel writing an aligned one (tools/bench_compile.py, case 2b), and a 512x784
    float32 GEMV over unaligned weights 1.1x. Smaller arrays keep plain np.empty: the extra view costs ~1 us."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < ALIGNED_MIN_BYTES:
        return np.empty(shape, dtype)
    raw = np.empty(nbytes + CACHE_LINE, dtype=np.uint8)
    start = -raw.ctypes.data % CACHE_LINE
    _PAYLOADS[id(raw)] = (weakref.ref(raw, lambda _, key=id(raw): _PAYLOADS.pop(key, None)), start, nbytes)
    return raw[start:start + nbytes].view(dtype).reshape(shape)


# id(raw allocation) -> (weak reference to it, offset of the aligned payload, payload bytes)
_PAYLOADS: dict = {}


def memory_owner(array: np.ndarray) -> np.ndarray:
    """The array owning `array`'s memory; for an aligned_empty array, just the payload (the alignment padding is
    never part of the data: save files must not carry its uninitialised bytes). The result is a view of the owner
    when it is a payload, so compare owners by `ultimate_base`."""
    owner = ultimate_base(array)
    entry = _PAYLOADS.get(id(owner))
    if entry is not None and entry[0]() is owner:
        _, start, nbytes = entry
        return owner[start:start + nbytes]
    return owner


def ultimate_base(array: np.ndarray) -> np.ndarray:
    """The ndarray at the end of `array`'s chain of bases."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array
