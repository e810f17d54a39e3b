"""CUDA cat kernels: a plain cat (nnc.kernel.is_plain_cat) as one grid-stride copy kernel per input, each input read
through its folded view (nnc.codegen.cpu_cat.cat_pieces, shared with the CPU skeleton) and written at its offset
along the cat dim; the launch configuration of each is a pure value of its input's size."""
from __future__ import annotations

import math

from .cpu_cat import cat_pieces
from .cuda_elementwise import CudaFunction, CudaKernelBuilder, elementwise_launch
from .indexing import c_strides, emit_offsets, shifted, view_strides


def gen_cat(kb: CudaKernelBuilder) -> None:
    node, out = kb.kernel.nodes[0], kb.outs[0]
    dim, out_strides = node.kwargs["dim"], c_strides(out.shape)
    for k, (a, start) in enumerate(cat_pieces(kb)):
        numel = math.prod(a.shape)
        if numel == 0:
            continue
        index_lines, (src, dst) = emit_offsets(a.shape, [view_strides(a.shape, a.strides, a.shape), out_strides],
                                               "i", "i_")
        lines = [f"for i in range(cuda.grid(1), {numel}, cuda.gridsize(1)):"]
        lines += [f"    {line}" for line in index_lines]
        lines.append(f"    {out.arg}[{shifted(dst, start * out_strides[dim])}] = {a.arg}[{shifted(src, a.offset)}]")
        f = CudaFunction(f"{kb.name}_{k}", kb.unique_args([a, out]), lines, elementwise_launch(numel))
        kb.functions.append(f)
        kb.launch.append(f.launch_line())
    if not kb.functions:
        kb.launch = ["pass"]
