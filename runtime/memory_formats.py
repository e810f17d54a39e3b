"""Memory formats (runtime.channels_last, ...): the objects torch's memory_format= arguments take, and their strides."""
from __future__ import annotations

import numpy as np

from ._aligned import aligned_empty


class memory_format:
    """A layout of a tensor's elements in memory; `runtime.channels_last` etc. are the only instances."""

    __slots__ = ("name", "rank")

    def __init__(self, name: str, rank: int | None):
        self.name = name
        self.rank = rank  # the number of dims of the tensors a channels-last format is for (None: any)

    def __repr__(self) -> str:
        return f"runtime.{self.name}"

    def __reduce__(self):
        return (_format_by_name, (self.name,))


contiguous_format = memory_format("contiguous_format", None)
preserve_format = memory_format("preserve_format", None)
channels_last = memory_format("channels_last", 4)
channels_last_3d = memory_format("channels_last_3d", 5)
_FORMATS = {f.name: f for f in (contiguous_format, preserve_format, channels_last, channels_last_3d)}


def _format_by_name(name: str) -> memory_format:
    return _FORMATS[name]


def checked(fmt, caller: str, default: memory_format = preserve_format) -> memory_format:
    """fmt, or the default for None; torch's TypeError for anything else that is not a format."""
    if fmt is None:
        return default
    if not isinstance(fmt, memory_format):
        raise TypeError(f"{caller}(): argument 'memory_format' must be torch.memory_format, not {type(fmt).__name__}")
    return fmt


def check_rank(fmt: memory_format, ndim: int) -> None:
    if fmt.rank is not None and ndim != fmt.rank:
        raise RuntimeError(f"required rank {fmt.rank} tensor to use {fmt.name} format")


def _channels_last_order(ndim: int) -> tuple:
    """The dims from the fastest-varying in memory to the slowest: channels, the spatial dims from the last, batch."""
    return (1, *range(ndim - 1, 1, -1), 0)


def is_channels_last(fmt: memory_format, shape, strides) -> bool:
    """Whether element strides lay a tensor out in a channels-last format (is_contiguous(memory_format=fmt)); dims of
    size 1 may have any stride, as in torch, so a 1-channel C-contiguous image is channels-last as well."""
    if len(shape) != fmt.rank:
        return False
    expected = 1
    for d in _channels_last_order(len(shape)):
        if shape[d] != 1:
            if strides[d] != expected:
                return False
            expected *= shape[d]
    return True


def suggest(shape, strides) -> memory_format:
    """The format a tensor's strides suggest (torch's suggest_memory_format): a channels-last one where the strides
    grow in channels-last order; ambiguous layouts (a batch of 1x1x1 images, a size-0 dim) count as contiguous."""
    ndim = len(shape)
    if ndim not in (4, 5) or strides[1] == 0:
        return contiguous_format
    least = 0  # what the next dim's stride must reach
    for d in _channels_last_order(ndim):
        if shape[d] == 0 or strides[d] < least or (d == 0 and least == strides[1]):
            return contiguous_format
        least = strides[d] * max(shape[d], 1)
    return channels_last if ndim == 4 else channels_last_3d


def strides_for(fmt: memory_format, shape) -> tuple:
    """The element strides torch gives a new tensor of `shape` in an explicit format."""
    strides, stride = [0] * len(shape), 1
    if fmt.rank is None:
        for d in reversed(range(len(shape))):
            strides[d], stride = stride, stride * max(shape[d], 1)
    else:
        for d in _channels_last_order(len(shape)):
            strides[d], stride = stride, stride * shape[d]
    return tuple(strides)


def dense_strides_like(shape, strides) -> tuple:
    """Strides without gaps that keep the order of a tensor's dims in memory (torch's empty_like of a tensor that
    is not dense): dims ordered from the fastest, by stride, then by size; a zero stride leaves C order."""
    def compare(a, b):  # > 0: dim a is slower than dim b
        if strides[a] == 0 or strides[b] == 0:
            return 0
        return (strides[a] > strides[b]) - (strides[a] < strides[b]) or int(shape[a] > shape[b])

    order = list(reversed(range(len(shape))))  # fastest first
    for i in range(1, len(order)):  # insertion sort that stops at the first dim known to be faster
        j = i
        for k in range(i - 1, -1, -1):
            c = compare(order[k], order[j])
            if c < 0:
                break
            if c > 0:
                order[k], order[j] = order[j], order[k]
                j = k
    out, stride = [0] * len(shape), 1
    for d in order:
        out[d], stride = stride, stride * max(shape[d], 1)
    return tuple(out)


def strided_empty(shape, strides, np_dtype) -> np.ndarray:
    """An uninitialized array of `shape` with the given element strides (non-negative, not overlapping)."""
    np_dtype = np.dtype(np_dtype)
    extent = 1 + sum((n - 1) * s for n, s in zip(shape, strides)) if all(n > 0 for n in shape) else 0
    buffer = aligned_empty((extent,), np_dtype)
    return np.ndarray(tuple(shape), np_dtype, buffer=buffer, strides=tuple(s * np_dtype.itemsize for s in strides))
