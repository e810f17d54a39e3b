"""torch.autograd.forward_ad: dual tensors (a primal with a tangent) and the Jacobian-vector products of what is
computed from them.

runtime has one autograd engine, reverse mode, so a dual is a primal that records a graph, and unpack_dual(y)
computes y's tangent as the derivative of a vector-Jacobian product: with u a zero cotangent of y's shape,
g(u) = u^T dy/dx is linear in u, and d/du [g(u) . tangent] = (dy/dx) tangent. That takes a backward through y's
graph and a double backward (every rule of the op table has one), which torch's forward mode does not need: the
same numbers at more cost. A dual's primal records a graph even where torch's would not require grad, and a tangent
carries no graph of its own (torch's can be differentiated again).
"""
from __future__ import annotations

import contextlib
from typing import NamedTuple

from .grad_mode import enable_grad


class UnpackedDualTensor(NamedTuple):
    """What unpack_dual returns: the primal, and its tangent (None where the tensor is not dual)."""

    primal: object
    tangent: object


_levels: list[list] = []  # per open level, its duals as (dual tensor, tangent)


def enter_dual_level() -> int:
    """Open a level that make_dual registers duals in (torch allows one at a time)."""
    if _levels:
        raise RuntimeError("Entering a new forward AD level but the current level (0) is not valid. Make sure "
                           "you did not modified it directly.")
    _levels.append([])
    return len(_levels) - 1


def exit_dual_level(*, level=None) -> None:
    """Close the current level: its duals' tangents are forgotten."""
    if not _levels or (level is not None and level != len(_levels) - 1):
        raise RuntimeError("Trying to exit a forward AD level that was not the last one that was created.")
    _levels.pop()


@contextlib.contextmanager
def dual_level():
    """with dual_level(): make_dual(...) and unpack_dual(...) inside."""
    level = enter_dual_level()
    try:
        yield level
    finally:
        exit_dual_level(level=level)


def _current(level, what: str) -> list:
    if not _levels or (level is not None and level != len(_levels) - 1):
        raise RuntimeError(f"{what} is only valid inside a forward AD level (with dual_level():)")
    return _levels[-1]


def make_dual(tensor, tangent, *, level=None):
    """A tensor with `tensor`'s values whose results carry the tangent's directional derivative."""
    duals = _current(level, "make_dual")
    if tuple(tangent.shape) != tuple(tensor.shape):
        raise RuntimeError(f"Trying to set a forward gradient that has a different size than that of the original "
                           f"Tensor, this is not supported. Tensor is of size {list(tensor.shape)} while the given "
                           f"forward gradient is of size {list(tangent.shape)}.")
    if not (tensor.dtype.is_floating_point or tensor.dtype.is_complex):
        raise ValueError(f"Expected primal to be floating point or complex, but got: {tensor.dtype}")
    with enable_grad():
        dual = tensor.view_as(tensor) if tensor.requires_grad else tensor.detach().requires_grad_(True)
    duals.append((dual, tangent.detach()))
    return dual


def unpack_dual(tensor, *, level=None) -> UnpackedDualTensor:
    """(primal, tangent) of a tensor computed from duals of the current level: its Jacobian-vector product with the
    duals' tangents; tangent None when it depends on none of them."""
    from . import grad as _grad

    duals = _current(level, "unpack_dual") if _levels else []
    if not duals or not getattr(tensor, "requires_grad", False):
        return UnpackedDualTensor(tensor, None)
    for dual, tangent in duals:
        if tensor is dual:
            return UnpackedDualTensor(tensor, tangent)
    roots, tangents = [d for d, _ in duals], [t for _, t in duals]
    with enable_grad():
        probe = tensor.detach().new_zeros(tuple(tensor.shape)).requires_grad_(True)
        pulled = _grad([tensor], roots, [probe], retain_graph=True, create_graph=True, allow_unused=True)
        terms = [(p * t).sum() for p, t in zip(pulled, tangents) if p is not None]
        if not terms:
            return UnpackedDualTensor(tensor, None)
        (pushed,) = _grad([sum(terms[1:], terms[0])], [probe], allow_unused=True)
    return UnpackedDualTensor(tensor, probe.detach() * 0 if pushed is None else pushed)
