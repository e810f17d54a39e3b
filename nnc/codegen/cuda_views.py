"""CUDA copies for view kernels: an opaque kernel of one reshape, permute or expand node (nnc.kernel.view_node)
materialised as a contiguous array, one thread an output element in a grid-stride loop reading the input at the
view's element offset. On the CPU these are numpy views (no code); numba's device arrays cannot take a permuted or
broadcast view, so a device executor copies them (a reshape of a contiguous array is free there too: `reshape`
on the device array; this copy is for a caller that wants a fresh array)."""
from __future__ import annotations

import math

from ..kernel import view_node
from .cpu_elementwise import indent
from .cuda_elementwise import CudaFunction, CudaKernelBuilder, elementwise_launch
from .indexing import broadcast_strides, emit_offsets
from .scalar import Unsupported, op_and_attrs


def view_strides(op_name: str, attrs: dict, in_shape, out_shape) -> list[int]:
    """The input element stride of each output dim of the view (0 along broadcast dims)."""
    if op_name == "reshape":
        return [math.prod(out_shape[d + 1:]) for d in range(len(out_shape))]  # the same flat order
    if op_name == "expand":
        return broadcast_strides(in_shape, out_shape)
    if op_name == "permute":
        ndim = len(in_shape)
        contiguous = [math.prod(in_shape[d + 1:]) for d in range(ndim)]
        return [contiguous[d % ndim] for d in attrs["dims"]]
    raise Unsupported(f"view op {op_name} has no CUDA copy kernel")


def gen_view(kb: CudaKernelBuilder) -> None:
    """A view kernel's copy: out0[i] = in0[offset of output element i in the input]."""
    node = view_node(kb.kernel)
    if node is None or len(kb.ins) != 1 or len(kb.outs) != 1:
        raise Unsupported("an opaque kernel other than one view of one tensor has no CUDA code generation "
                          "(run it as is)")
    op, _, attrs = op_and_attrs(node)
    src, out = kb.ins[0], kb.outs[0]
    numel = math.prod(out.shape)
    index_lines, (offset,) = emit_offsets(out.shape, [view_strides(op.name, attrs, src.shape, out.shape)], "i", "i_")
    lines = [f"for i in range(cuda.grid(1), {numel}, cuda.gridsize(1)):"]
    lines += indent(index_lines + [f"out0[i] = in0[{offset}]"])
    f = CudaFunction(kb.name, [src, out], lines, elementwise_launch(numel))
    kb.functions.append(f)
    kb.launch = [f.launch_line()]
