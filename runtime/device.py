"""Devices: runtime.device('cpu'); CUDA tensors are not available in the eager runtime."""
from __future__ import annotations


class device:
    """Where a tensor lives: type 'cpu' (or 'cuda', which tensors cannot use yet)."""

    __slots__ = ("type", "index")

    def __init__(self, spec, index=None):
        if isinstance(spec, device):
            spec, index = spec.type, spec.index if index is None else index
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


CPU = device("cpu")


def check_device(spec) -> device:
    """Accept None, 'cpu' or device('cpu'); a clear error for devices runtime tensors cannot use."""
    if spec is None:
        return CPU
    d = spec if isinstance(spec, device) else device(spec)
    if d.type != "cpu":
        raise RuntimeError(f"device '{d}' is not available: runtime tensors live on the CPU "
                           f"(runtime.cuda.is_available() is False)")
    return CPU
