"""CPU take kernels: torch.gather and scatter_add along one dim (kind "take"), as generated loops.

gather(x, index, dim) has index's shape: element i takes x at i with dim i_dim replaced by index[i]. scatter_add(x,
index, src, dim) is x with src[i] added at that place. A cross-entropy's pick of each row's target log-probability
and its gradient are these. Every input is read through its folded view (a reshaped target needs no step). A
serial pass checks every index first (eager's rule: [0, size), no wrap; RuntimeError otherwise, before anything is
written); then a gather runs a prange from PARALLEL_MIN_ELEMENTS elements, and a scatter runs serially in index
order, so repeated indices accumulate as numpy's add.at does. nnc.kernel.is_take says which nodes come here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..kernel import Kernel
from .cpu_elementwise import PARALLEL_MIN_ELEMENTS, Array, Function, KernelBuilder, ParallelLoop, launch_line
from .indexing import c_strides, emit_offsets, shifted, view_strides
from .scalar import Unsupported, node_shape


@dataclass(frozen=True)
class TakeSchedule(ParallelLoop):
    """How a take kernel runs: one loop over the `n` index elements, a prange when `parallel` (gathers only)."""

    op: str
    n: int
    parallel: bool


def take_schedule_of(kernel: Kernel) -> TakeSchedule:
    node = kernel.nodes[0]
    op, n = node.target.op.name, math.prod(node_shape(node.args[1]))
    return TakeSchedule(op, n, op == "gather" and n >= PARALLEL_MIN_ELEMENTS)


def _strides(a: Array) -> list[int]:
    return view_strides(a.shape, a.strides, a.shape)


def _check(index: Array, shape, dim: int, size: int, op: str) -> list[str]:
    """A serial pass raising eager's RuntimeError unless every index lies in [0, size)."""
    lines, (off,) = emit_offsets(shape, [_strides(index)], "t", "c_")
    return ([f"for t in range({math.prod(shape)}):"] + [f"    {line}" for line in lines]
            + [f"    j = {index.arg}[{shifted(off, index.offset)}]",
               f"    if j < 0 or j >= {size}:",
               f"        raise RuntimeError('{op}: an index is out of bounds for dimension {dim} with size {size}')"])


def gen_take(kb: KernelBuilder) -> None:
    if len(kb.kernel.nodes) != 1:
        raise Unsupported("a take kernel has exactly one node")
    node, out = kb.kernel.nodes[0], kb.outs[0]
    sched = take_schedule_of(kb.kernel)
    dim = node.kwargs["dim"] % len(out.shape)
    x, index = kb.read_of(node.args[0]), kb.read_of(node.args[1])
    shape = tuple(index.shape)
    lines = _check(index, shape, dim, x.shape[dim], sched.op)
    if sched.op == "gather":  # out has index's shape, written at t
        xs = _strides(x)
        picked = [0 if d == dim else s for d, s in enumerate(xs)]
        offsets, (i_off, x_off) = emit_offsets(shape, [_strides(index), picked], "t", "t_")
        lines += [f"for t in {sched.loop}({sched.n}):"] + [f"    {line}" for line in offsets]
        lines += [f"    j = {index.arg}[{shifted(i_off, index.offset)}]",
                  f"    {out.arg}[t] = {x.arg}[{shifted(x_off, x.offset)} + j * {xs[dim]}]"]
        arrays = [x, index, out]
    else:  # scatter_add: out = x, then src added at the indexed places, in index order
        src = kb.read_of(node.args[2])
        copy, (x_off,) = emit_offsets(out.shape, [_strides(x)], "e", "e_")
        lines += [f"for e in range({math.prod(out.shape)}):"] + [f"    {line}" for line in copy]
        lines += [f"    {out.arg}[e] = {x.arg}[{shifted(x_off, x.offset)}]"]
        os = c_strides(out.shape)
        placed = [0 if d == dim else s for d, s in enumerate(os)]
        offsets, (i_off, s_off, o_off) = emit_offsets(shape, [_strides(index), _strides(src), placed], "t", "t_")
        lines += [f"for t in range({sched.n}):"] + [f"    {line}" for line in offsets]
        lines += [f"    j = {index.arg}[{shifted(i_off, index.offset)}]",
                  f"    {out.arg}[{o_off} + j * {os[dim]}] += {src.arg}[{shifted(s_off, src.offset)}]"]
        arrays = [x, index, src, out]
    f = Function(kb.name, kb.arguments(arrays), lines, sched.parallel)
    kb.functions.append(f)
    kb.launch = [launch_line(f)]
