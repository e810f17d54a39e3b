"""Target-neutral index arithmetic: element offsets of broadcast inputs from a flat index.

Dims are merged where every array is contiguous across them (`collapse`); shapes are static, so the divisions
`emit_offsets` writes are by constants.
"""
from __future__ import annotations

import math

from runtime.ops import ShapeError, broadcast_shapes

from .scalar import Unsupported


def c_strides(shape) -> list[int]:
    """Element strides of a C-contiguous array of `shape`."""
    strides, step = [0] * len(shape), 1
    for k in reversed(range(len(shape))):
        strides[k], step = step, step * shape[k]
    return strides


def broadcast_strides(shape, full) -> list[int]:
    """Element strides of a C-contiguous array of `shape` read broadcast to `full` (0 along broadcast dims)."""
    return view_strides(shape, None, full)


def view_strides(shape, strides, full) -> list[int]:
    """Element strides of a value of `shape` stored with element `strides` (None: C-contiguous; a folded view's
    strides, nnc.passes.views) read broadcast to `full` (0 along broadcast dims and dims of size 1)."""
    shape, full = tuple(shape), tuple(full)
    pad = len(full) - len(shape)
    if pad < 0:
        raise Unsupported(f"shape {list(shape)} does not broadcast to {list(full)}")
    if strides is None:
        strides = c_strides(shape)
    padded = (1,) * pad + shape
    stored = (0,) * pad + tuple(strides)
    out = [0] * len(full)
    for k in range(len(full)):
        if padded[k] == full[k] and full[k] != 1:
            out[k] = stored[k]
        elif padded[k] != 1:
            raise Unsupported(f"shape {list(shape)} does not broadcast to {list(full)}")
    return out


def shifted(expr: str, offset: int) -> str:
    """An offset expression plus a constant element offset (a folded view's start in its base)."""
    if not offset:
        return expr
    return str(offset) if expr == "0" else f"{expr} + {offset}"


def broadcast_shape(a, b):
    """numpy's broadcast of two shapes, or None (symbolic sizes stay symbolic)."""
    try:
        return broadcast_shapes(tuple(a), tuple(b))
    except ShapeError:
        return None


def collapse(sizes, stride_lists):
    """Drop size-1 dims and merge neighbours that every array walks contiguously (same offsets, fewer divisions)."""
    keep = [k for k, s in enumerate(sizes) if s != 1]
    out_sizes = []
    out_strides = [[] for _ in stride_lists]
    for k in keep:
        if out_sizes and all(st[k] * sizes[k] == cur[-1] for st, cur in zip(stride_lists, out_strides)):
            out_sizes[-1] *= sizes[k]
            for st, cur in zip(stride_lists, out_strides):
                cur[-1] = st[k]
            continue
        out_sizes.append(sizes[k])
        for st, cur in zip(stride_lists, out_strides):
            cur.append(st[k])
    return out_sizes, out_strides


def emit_offsets(sizes, stride_lists, flat: str, prefix: str):
    """(lines, offset expressions): each array's element offset at flat index `flat` over `sizes`.

    A full contiguous array reads at `flat` itself, a broadcast scalar at 0; others from the mixed-radix digits of
    `flat` (constant divisors: the shapes are static).
    """
    sizes, strides = collapse(list(sizes), [list(s) for s in stride_lists])
    n = len(sizes)
    inner = [math.prod(sizes[k + 1:]) for k in range(n)]
    digits = {}
    for k in range(n):
        digit = flat if inner[k] == 1 else f"{flat} // {inner[k]}"
        if k > 0:  # the leading digit needs no modulo
            digit = f"{flat} % {sizes[k]}" if inner[k] == 1 else f"({digit}) % {sizes[k]}"
        digits[k] = digit
    exprs, needed = [], set()
    for st in strides:
        if not any(st):
            exprs.append("0")
        elif st == inner:
            exprs.append(flat)
        else:
            terms = []
            for k in range(n):
                if st[k]:
                    name = flat if digits[k] == flat else f"{prefix}{k}"
                    if name != flat:
                        needed.add(k)
                    terms.append(name if st[k] == 1 else f"{name} * {st[k]}")
            exprs.append(" + ".join(terms))
    return [f"{prefix}{k} = {digits[k]}" for k in sorted(needed)], exprs
