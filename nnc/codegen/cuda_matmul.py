"""CUDA matmul kernels: a generated tiled matmul with the elementwise epilogue fused: each thread runs the
epilogue's scalar body on its products and stores, so the product never goes to memory unless it is an output.

Two tilings (CudaMatmulSchedule.blocked): products of at least BLOCKED_MIN rows and columns take BIG x BIG output
tiles, each of the 16 x 16 threads computing REG x REG outputs (strided by 16, so warps read shared memory without
bank conflicts and store coalesced) from operand slices of TILE along the summed dim staged through shared memory;
smaller ones (a batch of a few rows) take TILE x TILE tiles, one output a thread.

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
REG = 4              # outputs per thread along each dim of a blocked tile
BIG = TILE * REG     # a blocked tile's rows and columns
BLOCKED_MIN = BIG    # the blocked tiling from this many rows and columns
MAX_GRID_YZ = 65535  # CUDA's limit on grid dims y and z


@dataclass(frozen=True)
class CudaMatmulSchedule:
    """A product of `batch` M x K by K x N matrices, as tiles of TILE x TILE outputs (grid x over N, y over M,
    z over the batch, striding past MAX_GRID_YZ); blocked: BIG x BIG tiles, REG x REG outputs a thread.
    transposed: the right operand is a linear's weight [N, K]."""

    op: str
    batch: int
    m: int
    k: int
    n: int
    transposed: bool

    @property
    def blocked(self) -> bool:
        return self.m >= BLOCKED_MIN and self.n >= BLOCKED_MIN

    @property
    def tile(self) -> int:
        return BIG if self.blocked else TILE

    @property
    def launch(self) -> Launch:
        return Launch((-(-self.n // self.tile), -(-self.m // self.tile), min(self.batch, MAX_GRID_YZ)), (TILE, TILE))


def matmul_schedule(op_name: str, a_shape, b_shape, out_shape) -> CudaMatmulSchedule:
    """The schedule of `op_name` ("matmul" or "linear") on operands of these shapes."""
    if op_name == "linear" or len(b_shape) == 2:
        m, k = math.prod(a_shape[:-1]), a_shape[-1]
        n = b_shape[0] if op_name == "linear" else b_shape[1]
        schedule = CudaMatmulSchedule(op_name, 1, m, k, n, op_name == "linear")
    else:
        schedule = CudaMatmulSchedule(op_name, math.prod(out_shape[:-2]), a_shape[-2], a_shape[-1], b_shape[-1],
                                      False)
    if -(-schedule.m // schedule.tile) > MAX_GRID_YZ:
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
    if s.blocked:
        lines, product = _blocked_product(kb, s, a_arr, b_arr, mm, epilogue, dtype, mm_shape)
    else:
        lines, product = _simple_product(kb, s, a_arr, b_arr, mm, epilogue, dtype, mm_shape)
    if s.batch > 1:
        lines += [f"for z in range(cuda.blockIdx.z, {s.batch}, cuda.gridDim.z):"]
        lines += indent(_batch_bases(a_arr.shape, b_arr.shape, mm_shape, s) + product)
    else:
        lines += product
    f = CudaFunction(kb.name, kb.ins + kb.outs, lines, s.launch)
    kb.functions.append(f)
    kb.launch = [f.launch_line()]


def _simple_product(kb, s: CudaMatmulSchedule, a_arr, b_arr, mm, epilogue, dtype, mm_shape):
    """(lines before the batch loop, the product and epilogue): TILE x TILE tiles, one output a thread."""
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
                                                          + _epilogue(kb, mm, epilogue, dtype, mm_shape, "acc"))
    return lines, product


def _blocked_product(kb, s: CudaMatmulSchedule, a_arr, b_arr, mm, epilogue, dtype, mm_shape):
    """(lines before the batch loop, the product and epilogue): BIG x BIG tiles; thread (ty, tx) computes the
    outputs at rows ty + 16 p and columns tx + 16 q (p, q < REG) in registers."""
    zero, t = kb.dialect.literal(0, dtype), ctor(dtype)
    threads = TILE * TILE
    lines = [f"tile_a = cuda.shared.array(({TILE}, {BIG + 1}), {t})  # [k, row]",
             f"tile_b = cuda.shared.array(({TILE}, {BIG + 1}), {t})  # [k, column]",
             "tx = cuda.threadIdx.x", "ty = cuda.threadIdx.y", f"tid = ty * {TILE} + tx",
             f"m0 = cuda.blockIdx.y * {BIG}", f"n0 = cuda.blockIdx.x * {BIG}"]
    a0 = "a0 + " if s.batch > 1 else ""
    b0 = "b0 + " if s.batch > 1 else ""
    # each thread stages REG elements of each operand's slice: element e of the tile, read along k (a and a linear's
    # weight: rows contiguous in k) or along the columns (a matmul's right operand)
    loads = [f"e = tid + l * {threads}", f"row = e // {TILE}", f"col = e % {TILE}",
             f"tile_a[col, row] = {a_arr.arg}[{a0}(m0 + row) * {s.k} + k0 + col] "
             f"if m0 + row < {s.m} and k0 + col < {s.k} else {zero}"]
    if s.transposed:
        loads.append(f"tile_b[col, row] = {b_arr.arg}[(n0 + row) * {s.k} + k0 + col] "
                     f"if n0 + row < {s.n} and k0 + col < {s.k} else {zero}")
    else:
        loads += [f"kr = e // {BIG}", f"nc = e % {BIG}",
                  f"tile_b[kr, nc] = {b_arr.arg}[{b0}(k0 + kr) * {s.n} + n0 + nc] "
                  f"if k0 + kr < {s.k} and n0 + nc < {s.n} else {zero}"]
    product = [f"acc = cuda.local.array(({REG}, {REG}), {t})", f"b_reg = cuda.local.array({REG}, {t})",
               f"for p in range({REG}):", f"    for q in range({REG}):", f"        acc[p, q] = {zero}",
               f"for k0 in range(0, {s.k}, {TILE}):"]
    product += indent([f"for l in range({REG}):"] + indent(loads) + ["cuda.syncthreads()"])
    product += indent([f"for kk in range({TILE}):",
                       f"    for q in range({REG}):", f"        b_reg[q] = tile_b[kk, tx + q * {TILE}]",
                       f"    for p in range({REG}):", f"        a_val = tile_a[kk, ty + p * {TILE}]",
                       f"        for q in range({REG}):", "            acc[p, q] += a_val * b_reg[q]",
                       "cuda.syncthreads()"])
    flat = f"z * {s.m * s.n} + i * {s.n} + j" if s.batch > 1 else f"i * {s.n} + j"
    store = [f"if i < {s.m} and j < {s.n}:"] + indent([f"flat = {flat}"]
                                                      + _epilogue(kb, mm, epilogue, dtype, mm_shape, "acc[p, q]"))
    product += [f"for p in range({REG}):", f"    i = m0 + ty + p * {TILE}", f"    for q in range({REG}):",
                f"        j = n0 + tx + q * {TILE}"] + indent(store, 2)
    return lines, product


def _batch_bases(a_shape, b_shape, out_shape, s: CudaMatmulSchedule) -> list[str]:
    """Lines setting a0 and b0, the operands' first elements for batch position z (broadcast batch dims: 0)."""
    batch = tuple(out_shape[:-2])
    a_st = [st * s.m * s.k for st in broadcast_strides(a_shape[:-2], batch)]
    b_st = [st * s.k * s.n for st in broadcast_strides(b_shape[:-2], batch)]
    lines, (a0, b0) = emit_offsets(batch, [a_st, b_st], "z", "z_")
    return lines + [f"a0 = {a0}", f"b0 = {b0}"]


def _epilogue(kb: CudaKernelBuilder, mm: Node, epilogue, dtype, mm_shape, product: str) -> list[str]:
    """The lines a thread runs on its product (the expression `product`) at flat output index `flat`: the epilogue
    inputs' loads, the epilogue's scalar body, the stores of every output."""
    env = {mm: Value(kb.value_name(mm), dtype)}
    ins = [a for a in kb.ins if any(a.node in n.all_input_nodes for n in epilogue)]
    arrays = ins + kb.outs
    index_lines, offs = emit_offsets(mm_shape, [broadcast_strides(a.shape, mm_shape) for a in arrays], "flat", "e_")
    lines = [f"{kb.value_name(mm)} = {product}"] + index_lines
    for a, off in zip(ins, offs):
        env[a.node] = Value(kb.value_name(a.node), a.dtype)
        lines.append(f"{env[a.node].name} = {a.arg}[{off}]")
    lines += kb.body.emit(epilogue, env)
    lines += [f"{a.arg}[{off}] = {env[a.node].name}" for a, off in zip(kb.outs, offs[len(ins):])]
    return lines
