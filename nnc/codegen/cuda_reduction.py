"""CUDA reduction kernels: one block per kept position (output row), its threads striding over the reduced
positions, then a tree reduction in shared memory; thread 0 runs the epilogue and stores. When the last dim is kept
(a bias gradient: a sum over the batch), a block takes a warp's width of consecutive kept positions instead, so that
reads are coalesced, with groups of threads striding over the reduced positions; and rows of at most a warp's width
take a warp each, several a block (CudaReductionSchedule).

As on the CPU (cpu_reduction), one pass computes the elementwise prologue (storing the prologue values the kernel
outputs) and accumulates every sibling reduction of the kernel, each in its reducer's accumulator dtype (float32
sums in float64: the same answers as the CPU target), with its own shared-memory array. Blocks stride over the kept
positions when there are more than MAX_BLOCKS of them. With too few kept positions to fill the GPU (a loss's full
sum), the reduced range is split into chunks: the blocks of a first kernel each leave a partial result per kept
position and chunk, and a second kernel folds them and runs the epilogue.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..graph import Node
from .cpu_elementwise import indent
from .cpu_reduction import reduction_parts
from .cpu_elementwise import Array
from .cuda_elementwise import (MAX_BLOCKS, THREADS, WARP, CudaFunction, CudaKernelBuilder, Launch, elementwise_launch,
                               flat_view)
from .indexing import emit_offsets, shifted
from .scalar import Value, ctor

# Row groups of the column layout: a block is WARP kept positions x up to this many groups of reduced positions.
COLUMN_GROUPS = 8
# Kept positions (a warp each) per block of the warps layout (rows of at most a warp's width).
WARP_ROWS = 8
# A reduction with fewer than TARGET_BLOCKS blocks' worth of kept positions splits its reduced range into chunks
# (at most MAX_CHUNKS, each of at least CHUNK_ELEMENTS input elements a block) until it has about TARGET_BLOCKS.
TARGET_BLOCKS = 256
CHUNK_ELEMENTS = 8192
MAX_CHUNKS = 1024


@dataclass(frozen=True)
class CudaReductionSchedule:
    """How a CUDA reduction runs over `n_outer` kept positions and `n_red` reduced positions per kept position.

    layout "rows": one block per kept position (blocks stride over them past MAX_BLOCKS), its `threads` threads (a
      power of two) striding over the reduced positions, then a tree over the threads.
    layout "columns" (the last dim kept, e.g. a bias gradient): a block per tile of WARP consecutive kept positions,
      a thread per (kept position, row group): threadIdx.x walks the kept positions, so a warp reads consecutive
      memory, and `threads` row groups (threadIdx.y) stride over the reduced positions; then a tree over the groups.
    layout "warps" (rows of at most WARP reduced positions, many of them: a softmax over 10 classes): a warp per
      kept position, WARP_ROWS of them a block (threadIdx.y), so that short rows do not take a block each.
    chunks (> 1): the reduced range is split into `chunks` chunks of `chunk` positions, a block per (tile, chunk),
      leaving partial results that a second kernel (`combine_launch`) folds per kept position before the epilogue.
    """

    layout: str
    n_outer: int
    n_red: int
    threads: int
    chunks: int = 1
    chunk: int = 0

    @property
    def tiles(self) -> int:
        """Blocks' worth of kept positions: n_outer (rows) or tiles of WARP of them (columns)."""
        if self.layout == "rows":
            return self.n_outer
        return -(-self.n_outer // (WARP if self.layout == "columns" else WARP_ROWS))

    @property
    def launch(self) -> Launch:
        block = {"rows": (self.threads,), "columns": (WARP, self.threads), "warps": (WARP, WARP_ROWS)}[self.layout]
        return Launch((max(1, min(self.tiles * self.chunks, MAX_BLOCKS)),), block)

    @property
    def combine_launch(self) -> Launch:
        return elementwise_launch(self.n_outer)


def reduction_schedule(shape, dims) -> CudaReductionSchedule:
    """The schedule of a reduction over `shape` reducing `dims` (see CudaReductionSchedule): rows take a power of
    two between a warp and THREADS threads, columns up to COLUMN_GROUPS row groups."""
    n_outer = math.prod(s for d, s in enumerate(shape) if d not in dims)
    n_red = math.prod(shape[d] for d in dims)
    pow2 = 1 << max(0, n_red - 1).bit_length()  # the reduced positions, rounded up to a power of two
    if shape and (len(shape) - 1) not in dims and shape[-1] > 1 and n_red > 1:
        s = CudaReductionSchedule("columns", n_outer, n_red, min(COLUMN_GROUPS, pow2))
        width = min(WARP, n_outer)  # kept positions a block reads per reduced position
    elif n_red <= WARP and n_outer > WARP_ROWS:
        return CudaReductionSchedule("warps", n_outer, n_red, WARP)  # too little to split into chunks
    else:
        s = CudaReductionSchedule("rows", n_outer, n_red, min(THREADS, max(WARP, pow2)))
        width = 1
    chunks = min(MAX_CHUNKS, -(-TARGET_BLOCKS // s.tiles), n_red * width // CHUNK_ELEMENTS)
    if chunks <= 1:
        return s
    chunk = -(-n_red // chunks)
    return replace(s, chunks=-(-n_red // chunk), chunk=chunk)


def gen_reduction(kb: CudaKernelBuilder) -> None:
    """The reduction skeleton (see the module docstring)."""
    k = kb.kernel
    accs, prologue, epilogue = reduction_parts(kb)
    red_nodes = [a.node for a in accs]
    shape = tuple(k.shape)
    dims, out_shape = accs[0].dims, accs[0].out_shape
    prologue_set = set(prologue)
    pro_ins = [a for a in kb.reads if any(a.node in n.all_input_nodes for n in prologue + red_nodes)]
    epi_ins = [a for a in kb.reads if any(a.node in n.all_input_nodes for n in epilogue)]
    pro_outs = [a for a in kb.outs if a.node in prologue_set]
    epi_outs = [a for a in kb.outs if a.node not in prologue_set]
    kept = [d for d in range(len(shape)) if d not in dims]
    s = reduction_schedule(shape, dims)

    # the pass: prologue arrays at base(o) over the kept dims + offset(r) over the reduced dims
    pro_arrays = pro_ins + pro_outs
    strides = [a.strides_in(shape) for a in pro_arrays]
    o_lines, o_offs = emit_offsets([shape[d] for d in kept], [[st[d] for d in kept] for st in strides], "o", "o_")
    r_lines, r_offs = emit_offsets([shape[d] for d in dims], [[st[d] for d in dims] for st in strides], "r", "r_")
    refs = [f"{a.arg}[{shifted(' + '.join(t for t in (oo, ro) if t != '0') or '0', a.offset)}]"
            for a, oo, ro in zip(pro_arrays, o_offs, r_offs)]
    invariant = {k for k, ro in enumerate(r_offs[:len(pro_ins)]) if ro == "0"}  # loaded once per kept position
    o_loads, loads, pro_body, pro_stores, env = kb.scalar_pass(pro_ins, pro_outs, refs, invariant, prologue)
    o_lines = o_lines + o_loads
    combines = [f"{a.acc} = {_fold(kb, a, a.acc, _as_acc(kb, env[a.source], a))}" for a in accs]
    if s.chunks > 1:  # this chunk's part of the reduced range
        first, stop = f"c * {s.chunk} + ", f"min({s.n_red}, (c + 1) * {s.chunk})"
    else:
        first, stop = "", f"{s.n_red}"
    if s.layout == "rows":
        lane, group, sizes = "t", "t", f"{s.threads}"
        lines = ["t = cuda.threadIdx.x", f"for task in range(cuda.blockIdx.x, {s.n_outer * s.chunks}, cuda.gridDim.x):"]
        task = ["o = task" if s.chunks == 1 else f"o = task // {s.chunks}"]
        task += [] if s.chunks == 1 else [f"c = task % {s.chunks}"]
        task += o_lines + [f"{a.acc} = {a.identity}" for a in accs]
        task += [f"for r in range({first}t, {stop}, {s.threads}):"] + indent(r_lines + loads + pro_body + pro_stores
                                                                             + combines)
        partner = lambda step: f"t + {step}"  # noqa: E731
        last, done = "t == 0", "0"
    elif s.layout == "warps":
        lane, group, sizes = "ty, tx", "tx", f"({WARP_ROWS}, {WARP})"
        lines = ["tx = cuda.threadIdx.x", "ty = cuda.threadIdx.y",
                 f"for task in range(cuda.blockIdx.x, {s.tiles}, cuda.gridDim.x):"]
        task = [f"o = task * {WARP_ROWS} + ty"] + [f"{a.acc} = {a.identity}" for a in accs]
        task += [f"if o < {s.n_outer}:"] + indent(o_lines + [f"for r in range(tx, {s.n_red}, {WARP}):"]
                                                  + indent(r_lines + loads + pro_body + pro_stores + combines))
        partner = lambda step: f"ty, tx + {step}"  # noqa: E731
        last, done = f"tx == 0 and o < {s.n_outer}", "ty, 0"
    else:
        lane, group, sizes = "ty, tx", "ty", f"({s.threads}, {WARP})"
        lines = ["tx = cuda.threadIdx.x", "ty = cuda.threadIdx.y",
                 f"for task in range(cuda.blockIdx.x, {s.tiles * s.chunks}, cuda.gridDim.x):"]
        task = [f"o = task * {WARP} + tx" if s.chunks == 1 else f"o = (task // {s.chunks}) * {WARP} + tx"]
        task += [] if s.chunks == 1 else [f"c = task % {s.chunks}"]
        task += [f"{a.acc} = {a.identity}" for a in accs]
        task += [f"if o < {s.n_outer}:"] + indent(o_lines + [f"for r in range({first}ty, {stop}, {s.threads}):"]
                                                  + indent(r_lines + loads + pro_body + pro_stores + combines))
        partner = lambda step: f"ty + {step}, tx"  # noqa: E731
        last, done = f"ty == 0 and o < {s.n_outer}", "0, tx"
    lines = [f"{_shared(a)} = cuda.shared.array({sizes}, {ctor(a.acc_dtype)})" for a in accs] + lines
    task += [f"{_shared(a)}[{lane}] = {a.acc}" for a in accs] + ["cuda.syncthreads()"]
    step = s.threads // 2
    while step:  # the tree: halve the live row groups, each folding in its partner's partial result
        folds = [f"{_shared(a)}[{lane}] = {_fold(kb, a, f'{_shared(a)}[{lane}]', f'{_shared(a)}[{partner(step)}]')}"
                 for a in accs]
        task += [f"if {group} < {step}:"] + indent(folds) + ["cuda.syncthreads()"]
        step //= 2
    finishing = [f"{_shared(a)}[{done}]" for a in accs]
    if s.chunks == 1:
        task += [f"if {last}:"] + indent(_finish(kb, accs, out_shape, epilogue, epi_ins, epi_outs, env, finishing))
    else:  # leave this chunk's partial results for the combine kernel
        task += [f"if {last}:"] + indent([f"{_partial(a)}[o * {s.chunks} + c] = {value}"
                                          for a, value in zip(accs, finishing)])
    # NOTE: the next task overwrites the shared arrays: every thread waits until the finishing ones have read them
    task += ["cuda.syncthreads()"]
    lines += indent(task)
    partials = [Array(_partial(a), a.node, (s.n_outer * s.chunks,), a.acc_dtype) for a in accs]
    f = CudaFunction(kb.name, kb.ins + kb.outs + (partials if s.chunks > 1 else []), lines, s.launch)
    kb.functions.append(f)
    if s.chunks == 1:
        kb.launch = [f.launch_line()]
        return
    combine = _combine_function(kb, s, accs, partials, out_shape, epilogue, epi_ins, epi_outs, env)
    kb.functions.append(combine)
    views = lambda fn: [a.arg if a in partials else flat_view(a) for a in fn.args]  # noqa: E731
    kb.launch = [f"{a.arg} = cuda.device_array({a.shape[0]}, {ctor(a.dtype)})" for a in partials]
    kb.launch += [f.launch_line(views(f)), combine.launch_line(views(combine))]


def _combine_function(kb: CudaKernelBuilder, s: CudaReductionSchedule, accs, partials, out_shape, epilogue, epi_ins,
                      epi_outs, env) -> CudaFunction:
    """The second kernel of a chunked reduction: a thread per kept position folds its chunks' partial results in
    chunk order, then runs the epilogue and stores."""
    lines = [f"for o in range(cuda.grid(1), {s.n_outer}, cuda.gridsize(1)):"]
    body = [f"{a.acc} = {p.arg}[o * {s.chunks}]" for a, p in zip(accs, partials)]
    body += [f"for c in range(1, {s.chunks}):"]
    body += indent([f"{a.acc} = {_fold(kb, a, a.acc, f'{p.arg}[o * {s.chunks} + c]')}" for a, p in zip(accs, partials)])
    body += _finish(kb, accs, out_shape, epilogue, epi_ins, epi_outs, env, [a.acc for a in accs])
    return CudaFunction(f"{kb.name}_combine", partials + kb.ins + kb.outs, lines + indent(body), s.combine_launch)


def _partial(acc) -> str:
    """The device array of an accumulator's partial results per (kept position, chunk)."""
    return f"partial{acc.suffix}"


def _fold(kb: CudaKernelBuilder, acc, accumulated: str, value: str) -> str:
    """acc's reducer combining two expressions of its accumulator dtype."""
    return kb.body.fold(acc.reducer.combine, accumulated, value, acc.acc_dtype)


def _shared(acc) -> str:
    """The shared-memory array of an accumulator's per-thread partial results."""
    return f"shared{acc.suffix}"


def _as_acc(kb: CudaKernelBuilder, value: Value, acc) -> str:
    """A prologue value as its accumulator's dtype."""
    return value.name if value.dtype == acc.acc_dtype else kb.dialect.cast(value.name, acc.acc_dtype)


def _finish(kb: CudaKernelBuilder, accs, out_shape, epilogue, epi_ins, epi_outs, env: dict[Node, Value],
            results: list[str]) -> list[str]:
    """The finishing thread's lines for kept position o: the reductions' values (from the accumulator expressions
    `results`), the epilogue, the stores."""
    e_lines, e_offs = emit_offsets(out_shape, [a.strides_in(out_shape) for a in epi_ins + epi_outs], "o", "e_")
    lines = []
    for a, result in zip(accs, results):
        env[a.node] = Value(kb.value_name(a.node), a.out_dtype)
        lines.append(f"{kb.value_name(a.node)} = {kb.dialect.cast(result, a.out_dtype)}")
    lines += e_lines + [f"{kb.value_name(a.node)} = {a.arg}[{shifted(off, a.offset)}]"
                        for a, off in zip(epi_ins, e_offs)]
    for a in epi_ins:
        env[a.node] = Value(kb.value_name(a.node), a.dtype)
    lines += kb.body.emit(epilogue, env)
    lines += [f"{a.arg}[{off}] = {env[a.node].name}" for a, off in zip(epi_outs, e_offs[len(epi_ins):])]
    return lines
