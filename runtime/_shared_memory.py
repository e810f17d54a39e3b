"""Tensor values in shared memory (Tensor.share_memory_): named segments that forked processes inherit and spawned
ones attach to by name when a shared tensor reaches them through multiprocessing's pickler
(runtime.multiprocessing registers the reductions).

The process that made a segment unlinks it when the last array over it is freed (or at exit); processes that
attached only close it.
"""
from __future__ import annotations

import os
import weakref
from multiprocessing import shared_memory

import numpy as np

# segment name -> [segment, first address, size in bytes, arrays over it still alive]
_segments: dict[str, list] = {}


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def share(array: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of `array` in a new shared segment."""
    segment = shared_memory.SharedMemory(create=True, size=max(array.nbytes, 1))
    shared = np.ndarray(array.shape, array.dtype, buffer=segment.buf)
    shared[...] = array
    _track(segment, shared, creator=os.getpid())
    return shared


def find(array: np.ndarray) -> tuple[str, int] | None:
    """(segment name, byte offset) of the shared segment holding `array`'s first element, or None."""
    if array.size == 0:
        return None
    address = _address(array)
    for name, (_, start, size, _) in _segments.items():
        if start <= address < start + size:
            return name, address - start
    return None


def attach(name: str, offset: int, shape: tuple, strides: tuple, dtype: str) -> np.ndarray:
    """The array another process shared, at `offset` bytes into segment `name`, over the same memory."""
    entry = _segments.get(name)
    if entry is not None:
        segment = entry[0]
    else:
        # NOTE: attaching registers the segment with multiprocessing's resource tracker again, a no-op: processes
        # that multiprocessing starts share their parent's tracker, which unlinks what is left only when they have
        # all ended, so the maker's unlink (which unregisters it) stays the only one
        segment = shared_memory.SharedMemory(name=name)
    array = np.ndarray(shape, np.dtype(dtype), buffer=segment.buf, offset=offset, strides=strides)
    _track(segment, array, creator=None)
    return array


def _track(segment: shared_memory.SharedMemory, array: np.ndarray, creator: int | None) -> None:
    entry = _segments.get(segment.name)
    if entry is None:
        start = _address(np.frombuffer(segment.buf, np.uint8))
        entry = _segments[segment.name] = [segment, start, segment.size, 0]
    entry[3] += 1
    weakref.finalize(array, _release, segment.name, creator)


def _release(name: str, creator: int | None) -> None:
    """One array over segment `name` is gone; with the last, close the segment (and unlink it in its maker)."""
    entry = _segments.get(name)
    if entry is None:
        return
    entry[3] -= 1
    if entry[3] > 0:
        return
    del _segments[name]
    segment = entry[0]
    try:
        segment.close()
    except BufferError:  # a view made elsewhere (np.frombuffer of the tensor) still exports the memory
        pass
    if creator == os.getpid():  # (a forked child inherits the maker's finalizers, and must not unlink)
        try:
            segment.unlink()
        except FileNotFoundError:
            pass
