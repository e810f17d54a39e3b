"""Devices: runtime.device('cpu') and runtime.device('cuda:0'); check_device turns a device argument into one."""
from __future__ import annotations

import numpy as np


class device:
    """Where a tensor lives: type 'cpu' or 'cuda' (with an index)."""

    __slots__ = ("type", "index")

    def __init__(self, spec, index=None):
        if isinstance(spec, device):
            spec, index = spec.type, spec.index if index is None else index
        if isinstance(spec, int) and not isinstance(spec, bool):
            spec, index = "cuda", spec  # torch: a bare ordinal names a CUDA device
        if not isinstance(spec, str):
            raise TypeError(f"device() expects a string such as 'cpu', got {spec!r}")
        kind, _, num = spec.partition(":")
        if kind not in ("cpu", "cuda", "meta"):
            raise RuntimeError(f"Expected one of cpu, cuda, meta device type at start of device string: {spec}")
        self.type = kind
        self.index = int(num) if num else index

    def __repr__(self) -> str:
        index = "" if self.index is None else f", index={self.index}"
        return f"device(type='{self.type}'{index})"

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __eq__(self, other) -> bool:
        if isinstance(other, str):
            other = device(other)
        return isinstance(other, device) and (self.type, self.index) == (other.type, other.index)

    def __hash__(self) -> int:
        return hash((self.type, self.index))

    def __enter__(self) -> "device":
        """`with torch.device('cuda'):` makes this the device factories put new tensors on, inside the block."""
        _entered.append(check_device(self))
        return self

    def __exit__(self, *exc) -> None:
        _entered.pop()


CPU = device("cpu")
CUDA = device("cuda", 0)

_entered: list = []  # the devices of the `with device(...)` blocks open, innermost last
_default: list = [CPU]  # set_default_device's


def set_default_device(spec) -> None:
    """The device factories (zeros, randn, tensor, ...) put new tensors on when given none (None: the CPU)."""
    _default[0] = CPU if spec is None else check_device(spec)


def get_default_device() -> device:
    return _entered[-1] if _entered else _default[0]


def check_device(spec) -> device:
    """None -> the default device (get_default_device: the CPU unless set); 'cpu' -> CPU; 'cuda', 'cuda:0' -> CUDA
    when runtime.cuda.is_available(); a clear error otherwise."""
    if spec is None:
        return get_default_device()
    d = spec if isinstance(spec, device) else device(spec)
    if d.type == "cpu":
        return CPU
    if d.type == "cuda":
        from . import cuda

        if not cuda.is_available():
            raise RuntimeError(f"device '{d}' is not available: runtime.cuda.is_available() is False (numba-cuda "
                               f"found no GPU; install the `cuda` extra on a machine with one, or set "
                               f"NUMBA_ENABLE_CUDASIM=1 before numba is imported to use numba's CUDA simulator)")
        if (d.index or 0) >= cuda.device_count():
            raise RuntimeError(f"CUDA error: invalid device ordinal (device '{d}'; runtime.cuda.device_count() is "
                               f"{cuda.device_count()})")
        if d.index:
            raise RuntimeError(f"device '{d}': runtime's CUDA tensors live on device 0 only")
        return CUDA
    raise RuntimeError(f"device '{d}' is not available: runtime tensors live on the CPU or on CUDA")


def device_of(array) -> device:
    """The device of a tensor's storage: host numpy arrays are on the CPU, numba device arrays on CUDA."""
    return CPU if isinstance(array, np.ndarray) else CUDA
