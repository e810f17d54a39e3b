"""torch.finfo and torch.iinfo: the numeric limits of floating and integer dtypes."""
from __future__ import annotations

import numpy as np

from . import dtypes as dt

# bfloat16 has no numpy type: its limits, from its format (8 exponent bits as float32, 7 fraction bits)
_BFLOAT16 = {"bits": 16, "eps": 2.0 ** -7, "max": float((2 - 2.0 ** -7) * 2.0 ** 127), "tiny": 2.0 ** -126,
             "resolution": 0.01}


class finfo:  # noqa: N801 (torch's name)
    """Limits of a floating dtype (the default dtype when none is given): bits, eps, max, min, tiny (the smallest
    normal number, also as smallest_normal), resolution (10 ** -precision) and dtype (its name)."""

    def __init__(self, type=None):  # noqa: A002 (torch's parameter name)
        d = dt.get_default_dtype() if type is None else dt.as_dtype(type)
        if not d.is_floating_point:
            raise TypeError("torch.finfo() requires a floating point input type. Use torch.iinfo to handle "
                            "'torch.finfo'")
        if d is dt.bfloat16:
            limits = _BFLOAT16
        else:
            info = np.finfo(d.np)
            limits = {"bits": info.bits, "eps": float(info.eps), "max": float(info.max),
                      "tiny": float(info.smallest_normal), "resolution": 10.0 ** -int(info.precision)}
        self.bits, self.eps, self.max, self.min = limits["bits"], limits["eps"], limits["max"], -limits["max"]
        self.tiny = self.smallest_normal = limits["tiny"]
        self.resolution, self.dtype = limits["resolution"], d.name

    def __repr__(self) -> str:
        return (f"finfo(resolution={self.resolution:g}, min={self.min:g}, max={self.max:g}, eps={self.eps:g}, "
                f"smallest_normal={self.smallest_normal:g}, tiny={self.tiny:g}, dtype={self.dtype})")


class iinfo:  # noqa: N801 (torch's name)
    """Limits of an integer (or bool) dtype: bits, min, max and dtype (its name)."""

    def __init__(self, type):  # noqa: A002 (torch's parameter name)
        d = dt.as_dtype(type)
        if d.is_floating_point:
            raise TypeError("torch.iinfo() requires an integer input type. Use torch.finfo to handle 'torch.iinfo'")
        info = np.iinfo(np.uint8 if d is dt.bool_ else d.np)
        self.bits, self.min, self.max, self.dtype = info.bits, int(info.min), int(info.max), d.name

    def __repr__(self) -> str:
        return f"iinfo(min={self.min:g}, max={self.max:g}, dtype={self.dtype})"
