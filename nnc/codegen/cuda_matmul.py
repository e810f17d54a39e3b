"""CUDA matmul kernels: a generated tiled matmul (TILE x TILE output tiles, one thread an output element, the
operands staged through shared memory a TILE-wide slice of the summed dim at a time) with the elementwise epilogue
fused: each thread runs the epilogue's scalar body on its product and stores, so the product never goes to memory
unless it is an output itself.

Shapes: linear (x[..., K] @ w[N, K]^T) and matmul with a 2-D right operand run as one M x N product over all rows
of the left operand; a batched matmul runs one product per batch position (grid z, broadcast batch dims read at
stride 0). Sums in the output dtype, as BLAS does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..graph import Node
from ..kernel import Kernel
from .cpu_elementwise import indent
from .cpu_matmul import _anchor
from .cuda_elementwise import CudaFunction, CudaKernelBuilder, Launch
from .indexing import broadcast_strides, emit_offsets
from .scalar import Unsupported, Value, ctor, node_dtype, node_shape

TILE = 16
MAX_GRID_YZ = 65535  # CUDA's limit on grid dims y and z


@dataclass(frozen=True)
class CudaMatmulSchedule:
    """A product of `batch` M x K by K x N matrices, as tiles of TILE x TILE outputs (grid x over N, y over M,
    z over the batch, striding past MAX_GRID_YZ). transposed: the right operand is a linear's weight [N, K]."""

    op: str
    batch: int
    m: int
    k: int
    n: int
    transposed: bool

    @property
    def launch(self) -> Launch:
        return Launch((-(-self.n // TILE), -(-self.m // TILE), min(self.batch, MAX_GRID_YZ)), (TILE, TILE))


def matmul_schedule(op_name: str, a_shape, b_shape, out_shape) -> CudaMatmulSchedule:
    """The schedule of `op_name` ("matmul" or "linear") on operands of these shapes."""
    if op_name == "linear" or len(b_shape) == 2:
        m, k = math.prod(a_shape[:-1]), a_shape[-1]
        n = b_shape[0] if op_name == "linear" else b_shape[1]
        schedule = CudaMatmulSchedule(op_name, 1, m, k, n, op_name == "linear")
    else:
        schedule = CudaMatmulSchedule(op_name, math.prod(out_shape[:-2]), a_shape[-2], a_shape[-1], b_shape[-1],
                                      False)
    if -(-schedule.m // TILE) > MAX_GRID_YZ:
        raise Unsupported(f"a product of {schedule.m} rows needs more than {MAX_GRID_YZ} blocks along grid y")
    return schedule


def matmul_schedule_of(kernel: Kernel) -> CudaMatmulSchedule:
    mm, op, (a, b) = _anchor(kernel)
    return matmul_schedule(op.name, node_shape(a), node_shape(b), node_shape(mm))


def gen_matmul(kb: CudaKernelBuilder) -> None:
    """A matmul kernel: the tiled product and the fused epilogue in one CUDA kernel."""
    k = kb.kernel
    mm, op, args = _anchor(k)
    by_node = {a.node: a for a in kb.ins}
    if any(a not in by_node for a in args):
        raise Unsupported(f"the operands of {mm.name} are not kernel inputs")
    a_arr, b_arr = by_node[args[0]], by_node[args[1]]
    mm_shape, dtype = node_shape(mm), node_dtype(mm)
    if dtype.kind not in "iuf" or a_arr.dtype != dtype or b_arr.dtype != dtype:
        raise Unsupported(f"the CUDA matmul takes operands of its output dtype (int or float), got "
                          f"{a_arr.dtype} @ {b_arr.dtype} -> {dtype}")
    epilogue = [n for n in k.nodes if n is not mm]
    for n in epilogue:
        if node_shape(n) != mm_shape:
            raise Unsupported(f"epilogue node {n.name} has shape {list(node_shape(n))}, not the matmul "
                              f"output shape {list(mm_shape)}")
    s = matmul_schedule(op.name, a_arr.shape, b_arr.shape, mm_shape)
    zero = kb.dialect.literal(0, dtype)
    lines = [f"tile_a = cuda.shared.array(({TILE}, {TILE + 1}), {ctor(dtype)})",
             f"tile_b = cuda.shared.array(({TILE}, {TILE + 1}), {ctor(dtype)})",
             "tx = cuda.threadIdx.x", "ty = cuda.threadIdx.y",
             f"n0 = cuda.blockIdx.x * {TILE}", f"i = cuda.blockIdx.y * {TILE} + ty", "j = n0 + tx"]
    product = [f"acc = {zero}", f"for k0 in range(0, {s.k}, {TILE}):"]
    a_at = " + ".join(t for t in ("a0" if s.batch > 1 else "", f"i * {s.k} + k0 + tx") if t)
    loads = [f"tile_a[ty, tx] = {a_arr.arg}[{a_at}] if i < {s.m} and k0 + tx < {s.k} else {zero}"]
    if s.transposed:  # weight rows n0.. are contiguous along k: read along k, store transposed
        loads.append(f"tile_b[tx, ty] = {b_arr.arg}[(n0 + ty) * {s.k} + k0 + tx] "
                     f"if n0 + ty < {s.n} and k0 + tx < {s.k} else {zero}")
    else:
        b_at = " + ".join(t for t in ("b0" if s.batch > 1 else "", f"(k0 + ty) * {s.n} + j") if t)
        loads.append(f"tile_b[ty, tx] = {b_arr.arg}[{b_at}] if k0 + ty < {s.k} and j < {s.n} else {zero}")
    product += indent(loads + ["cuda.syncthreads()", f"for kk in range({TILE}):",
                               "    acc += tile_a[ty, kk] * tile_b[kk, tx]", "cuda.syncthreads()"])
    flat = "z * {} + i * {} + j".format(s.m * s.n, s.n) if s.batch > 1 else f"i * {s.n} + j"
    product += [f"if i < {s.m} and j < {s.n}:"] + indent([f"flat = {flat}"]
                                                          + _epilogue(kb, mm, epilogue, dtype, mm_shape))
    if s.batch > 1:
        lines += [f"for z in range(cuda.blockIdx.z, {s.batch}, cuda.gridDim.z):"]
        lines += indent(_batch_bases(a_arr.shape, b_arr.shape, mm_shape, s) + product)
    else:
        lines += product
    f = CudaFunction(kb.name, kb.ins + kb.outs, lines, s.launch)
    kb.functions.append(f)
    kb.launch = [f.launch_line()]


def _batch_bases(a_shape, b_shape, out_shape, s: CudaMatmulSchedule) -> list[str]:
    """Lines setting a0 and b0, the operands' first elements for batch position z (broadcast batch dims: 0)."""
    batch = tuple(out_shape[:-2])
    a_st = [st * s.m * s.k for st in broadcast_strides(a_shape[:-2], batch)]
    b_st = [st * s.k * s.n for st in broadcast_strides(b_shape[:-2], batch)]
    lines, (a0, b0) = emit_offsets(batch, [a_st, b_st], "z", "z_")
    return lines + [f"a0 = {a0}", f"b0 = {b0}"]


def _epilogue(kb: CudaKernelBuilder, mm: Node, epilogue, dtype, mm_shape) -> list[str]:
    """The lines a thread runs on its product `acc` at flat output index `flat`: the epilogue inputs' loads, the
    epilogue's scalar body, the stores of every output."""
    env = {mm: Value(kb.value_name(mm), dtype)}
    ins = [a for a in kb.ins if any(a.node in n.all_input_nodes for n in epilogue)]
    arrays = ins + kb.outs
    index_lines, offs = emit_offsets(mm_shape, [broadcast_strides(a.shape, mm_shape) for a in arrays], "flat", "e_")
    lines = [f"{kb.value_name(mm)} = acc"] + index_lines
    for a, off in zip(ins, offs):
        env[a.node] = Value(kb.value_name(a.node), a.dtype)
        lines.append(f"{env[a.node].name} = {a.arg}[{off}]")
    lines += kb.body.emit(epilogue, env)
    lines += [f"{a.arg}[{off}] = {env[a.node].name}" for a, off in zip(kb.outs, offs[len(ins):])]
    return lines
