"""CUDA tensor storage: numba device arrays, strided views of their memory, and copies between host and device.

A CUDA tensor's `_data` is a numba device array (numba-cuda's DeviceNDArray; under NUMBA_ENABLE_CUDASIM=1 the
simulator's FakeCUDAArray, which wraps a numpy array). View ops never copy: their shape, strides and offset are
computed by applying the op's numpy forward to a stand-in numpy array with the same layout over one element of
memory (`layout_of`), then the device array is re-viewed with that layout (`strided_view`).
"""
from __future__ import annotations

import numpy as np
from numba import config, cuda

SIMULATOR = bool(config.ENABLE_CUDASIM)
HOST_ARRAY = np.ndarray  # what a CPU tensor's storage is


def empty(shape, dtype) -> "cuda.devicearray.DeviceNDArray":
    return cuda.device_array(tuple(shape), dtype=_real_only(np.dtype(dtype)))


def to_device(host: np.ndarray):
    """A new device array holding a C-contiguous copy of a host array."""
    host = np.asarray(host)
    _real_only(host.dtype)
    return cuda.to_device(host if host.flags.c_contiguous else host.copy(order="C"))


def _real_only(dtype: np.dtype) -> np.dtype:
    if dtype.kind == "c":
        raise TypeError(f"CUDA tensors of dtype {dtype} are not supported: complex tensors stay on the CPU (the "
                        f"device kernels have no complex arithmetic)")
    return dtype


def is_c_contiguous(a) -> bool:
    if a.size <= 1:
        return True
    expected = a.dtype.itemsize
    for n, stride in zip(reversed(a.shape), reversed(a.strides)):
        if n != 1 and stride != expected:
            return False
        expected *= n
    return True


def is_writeable(a) -> bool:
    """Memory that no two elements share (an expanded view's stride-0 dims share it)."""
    return not any(stride == 0 and n > 1 for n, stride in zip(a.shape, a.strides))


def stand_in(a) -> np.ndarray:
    """A numpy array with a's shape, strides and dtype over one element of host memory: layout only, never read."""
    return np.lib.stride_tricks.as_strided(np.zeros(1, a.dtype), a.shape, a.strides)


def layout_of(view: np.ndarray, base: np.ndarray) -> tuple:
    """(shape, strides, byte offset) of a numpy view of a stand-in, relative to the stand-in."""
    offset = view.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    return tuple(view.shape), tuple(view.strides), offset


def strided_view(a, shape, strides, offset: int = 0, dtype=None):
    """A device array over a's memory with another layout (shape, byte strides, byte offset from a's start), and
    another dtype if given (the memory reinterpreted)."""
    shape, strides = tuple(int(s) for s in shape), tuple(int(s) for s in strides)
    dtype = a.dtype if dtype is None else np.dtype(dtype)
    if SIMULATOR:
        host = a._ary
        start = host.__array_interface__["data"][0] + offset
        return cuda.simulator.cudadrv.devicearray.FakeCUDAArray(_host_view(host, shape, strides, start, dtype))
    if not a.size or 0 in shape:
        return cuda.device_array(shape, dtype=dtype)
    return cuda.cudadrv.devicearray.DeviceNDArray(shape, strides, dtype, gpu_data=a.gpu_data.view(offset))


def typed_view(arena, shape, dtype):
    """A C-contiguous array of `shape` and `dtype` at the start of a byte arena (a uint8 device array)."""
    dtype = np.dtype(dtype)
    strides, step = [], dtype.itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return strided_view(arena, shape, tuple(reversed(strides)), 0, dtype)


class _Interface:
    """An object numpy turns into an array over given memory (keeping the owner of that memory alive)."""

    def __init__(self, owner, interface):
        self.base, self.__array_interface__ = owner, interface


def _host_view(host: np.ndarray, shape, strides, start: int, dtype=None) -> np.ndarray:
    typestr = (host.dtype if dtype is None else dtype).str
    interface = {"data": (start, False), "shape": shape, "strides": strides, "typestr": typestr,
                 "version": 3}
    return np.asarray(_Interface(host, interface))


def reshaped(a, shape):
    """A view of C-contiguous a with another shape."""
    strides, step = [], a.dtype.itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return strided_view(a, shape, tuple(reversed(strides)))


def _address(a) -> int:
    if SIMULATOR:
        return a._ary.__array_interface__["data"][0]
    return a.__cuda_array_interface__["data"][0]


def reads_elsewhere(dst, src) -> bool:
    """Whether src shares memory with dst other than element for element (same start, shape and strides): a
    kernel writing dst while reading src would then read values it has already overwritten."""
    if not dst.size or not src.size:
        return False
    a, b = _address(dst), _address(src)
    a_end = a + sum((n - 1) * s for n, s in zip(dst.shape, dst.strides)) + dst.dtype.itemsize
    b_end = b + sum((n - 1) * s for n, s in zip(src.shape, src.strides)) + src.dtype.itemsize
    if not (a < b_end and b < a_end):
        return False
    return not (a == b and tuple(dst.shape) == tuple(src.shape) and tuple(dst.strides) == tuple(src.strides))


def to_host(a) -> np.ndarray:
    """A host (numpy) copy of a device array, C-contiguous."""
    if not is_c_contiguous(a):
        from .dispatch import contiguous

        a = contiguous(a)
    if a.size == 0:
        return np.zeros(a.shape, a.dtype)
    return np.ascontiguousarray(a.copy_to_host()).reshape(a.shape)
