"""CPU cat kernels: `cat` as one generated copy loop per input, each input read through its folded view (so a view
only a cat reads never runs as a step of its own) and written at its offset along the cat dim of the result.

nnc.kernel.is_plain_cat decides which cats come here: static shapes and one dtype, so every offset is a constant.
A loop over at least PARALLEL_MIN_ELEMENTS elements is a prange.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..kernel import Kernel
from .cpu_elementwise import PARALLEL_MIN_ELEMENTS, Array, Function, KernelBuilder, launch_line
from .indexing import c_strides, emit_offsets, shifted, view_strides
from .scalar import Unsupported, node_shape


@dataclass(frozen=True)
class CatSchedule:
    """How a cat kernel runs: one loop per input of `sizes` elements, the ones in `parallel` a prange."""

    sizes: tuple
    parallel: tuple

    @property
    def numel(self) -> int:
        return sum(self.sizes)


def cat_schedule_of(kernel: Kernel) -> CatSchedule:
    sizes = tuple(math.prod(node_shape(a)) for a in kernel.nodes[0].args)
    return CatSchedule(sizes, tuple(n >= PARALLEL_MIN_ELEMENTS for n in sizes))


def cat_pieces(kb: KernelBuilder) -> list[tuple[Array, int]]:
    """(the Array an input is read through, its start along the cat dim) per input of the kernel's one cat node."""
    if len(kb.kernel.nodes) != 1:
        raise Unsupported("a cat kernel has exactly one node")
    node = kb.kernel.nodes[0]
    dim, start, pieces = node.kwargs["dim"], 0, []
    for arg in node.args:
        pieces.append((kb.read_of(arg), start))
        start += node_shape(arg)[dim]
    return pieces


def gen_cat(kb: KernelBuilder) -> None:
    node, out = kb.kernel.nodes[0], kb.outs[0]
    dim, out_strides = node.kwargs["dim"], c_strides(out.shape)
    sched = cat_schedule_of(kb.kernel)
    lines = []
    for k, (a, start) in enumerate(cat_pieces(kb)):
        numel = sched.sizes[k]
        if numel == 0:
            continue
        loop = "prange" if sched.parallel[k] else "range"
        strides = [view_strides(a.shape, a.strides, a.shape), out_strides]
        index_lines, (src, dst) = emit_offsets(a.shape, strides, "i", f"i{k}_")
        lines += [f"for i in {loop}({numel}):"] + [f"    {line}" for line in index_lines]
        lines.append(f"    {out.arg}[{shifted(dst, start * out_strides[dim])}] = {a.arg}[{shifted(src, a.offset)}]")
    if not lines:
        lines = ["pass"]
    f = Function(kb.name, kb.arguments([a for a, _ in cat_pieces(kb)] + [out]), lines, any(sched.parallel))
    kb.functions.append(f)
    kb.launch = [launch_line(f)]
