"""The hook point a profiler (nnc.profile) uses to time eager ops; runtime itself never imports a profiler.

`Tensor._apply_op` (and the in-place ufunc path of `Tensor._inplace`) tests whether `op_observers` is non-empty and,
only then, times the op and calls each observer as `observer(op, arrays, out, start, end, inplace)`: the op's OpDef,
its operands (numpy arrays, scalars or None), the output array, `time.perf_counter()` at the op's start and end, and
whether the op wrote its first operand in place. The list is mutated in place, never rebound, so the name tensor.py
imported stays the live list. With no observer an op pays one test of an empty list.
"""
from __future__ import annotations

op_observers: list = []


def notify(op, arrays, out, start: float, end: float, inplace: bool) -> None:
    for observer in op_observers:
        observer(op, arrays, out, start, end, inplace)
