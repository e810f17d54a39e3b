"""CUDA reduction kernels: one block per kept position (output row), its threads striding over the reduced
positions, then a tree reduction in shared memory; thread 0 runs the epilogue and stores.

As on the CPU (cpu_reduction), one pass computes the elementwise prologue (storing the prologue values the kernel
outputs) and accumulates every sibling reduction of the kernel, each in its reducer's accumulator dtype (float32
sums in float64: the same answers as the CPU target), with its own shared-memory array. Blocks stride over the kept
positions when there are more than MAX_BLOCKS of them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..graph import Node
from .cpu_elementwise import indent
from .cpu_reduction import _split_reduction_kernel, accumulators
from .cuda_elementwise import MAX_BLOCKS, THREADS, WARP, CudaFunction, CudaKernelBuilder, Launch
from .indexing import broadcast_strides, emit_offsets
from .scalar import Unsupported, Value, ctor, node_shape


@dataclass(frozen=True)
class CudaReductionSchedule:
    """How a CUDA reduction runs: `n_outer` kept positions, one block each (blocks stride over them past
    MAX_BLOCKS), `threads` threads per block (a power of two) striding over the `n_red` reduced positions."""

    n_outer: int
    n_red: int
    threads: int

    @property
    def launch(self) -> Launch:
        return Launch((max(1, min(self.n_outer, MAX_BLOCKS)),), (self.threads,))


def reduction_schedule(shape, dims) -> CudaReductionSchedule:
    """The schedule of a reduction over `shape` reducing `dims`: threads for the reduced positions, a power of two
    between a warp and THREADS."""
    n_outer = math.prod(s for d, s in enumerate(shape) if d not in dims)
    n_red = math.prod(shape[d] for d in dims)
    threads = min(THREADS, max(WARP, 1 << max(0, n_red - 1).bit_length()))
    return CudaReductionSchedule(n_outer, n_red, threads)


def gen_reduction(kb: CudaKernelBuilder) -> None:
    """The reduction skeleton (see the module docstring)."""
    k = kb.kernel
    accs = accumulators(k, kb.dialect)
    red_nodes = [a.node for a in accs]
    shape = tuple(k.shape)
    dims, out_shape = accs[0].dims, accs[0].out_shape
    prologue, epilogue = _split_reduction_kernel(k.nodes, red_nodes)
    prologue_set = set(prologue)
    for n in prologue:
        broadcast_strides(node_shape(n), shape)
    for n in epilogue:
        if node_shape(n) != out_shape:
            raise Unsupported(f"epilogue node {n.name} has shape {list(node_shape(n))}, not the reduced "
                              f"shape {list(out_shape)}")
        if any(a in prologue_set for a in n.all_input_nodes):
            raise Unsupported(f"epilogue node {n.name} reads a prologue value")
    pro_ins = [a for a in kb.ins if any(a.node in n.all_input_nodes for n in prologue + red_nodes)]
    epi_ins = [a for a in kb.ins if any(a.node in n.all_input_nodes for n in epilogue)]
    pro_outs = [a for a in kb.outs if a.node in prologue_set]
    epi_outs = [a for a in kb.outs if a.node not in prologue_set]
    kept = [d for d in range(len(shape)) if d not in dims]
    schedule = reduction_schedule(shape, dims)
    threads = schedule.threads

    # the pass: prologue arrays at base(o) over the kept dims + offset(r) over the reduced dims
    pro_arrays = pro_ins + pro_outs
    strides = [broadcast_strides(a.shape, shape) for a in pro_arrays]
    o_lines, o_offs = emit_offsets([shape[d] for d in kept], [[s[d] for d in kept] for s in strides], "o", "o_")
    r_lines, r_offs = emit_offsets([shape[d] for d in dims], [[s[d] for d in dims] for s in strides], "r", "r_")
    refs = [f"{a.arg}[{' + '.join(t for t in (oo, ro) if t != '0') or '0'}]"
            for a, oo, ro in zip(pro_arrays, o_offs, r_offs)]
    _, loads, pro_body, pro_stores, env = kb.scalar_pass(pro_ins, pro_outs, refs, set(), prologue)
    combines = [f"{a.acc} = {_fold(kb, a, a.acc, _as_acc(kb, env[a.source], a))}" for a in accs]
    lines = [f"{_shared(a)} = cuda.shared.array({threads}, {ctor(a.acc_dtype)})" for a in accs]
    lines += ["t = cuda.threadIdx.x", f"for o in range(cuda.blockIdx.x, {schedule.n_outer}, cuda.gridDim.x):"]
    row = o_lines + [f"{a.acc} = {a.identity}" for a in accs]
    row += [f"for r in range(t, {schedule.n_red}, {threads}):"]
    row += indent(r_lines + loads + pro_body + pro_stores + combines)
    row += [f"{_shared(a)}[t] = {a.acc}" for a in accs] + ["cuda.syncthreads()"]
    step = threads // 2
    while step:  # the tree: halve the live threads, each folding in its partner's partial result
        folds = [f"{_shared(a)}[t] = {_fold(kb, a, f'{_shared(a)}[t]', f'{_shared(a)}[t + {step}]')}" for a in accs]
        row += [f"if t < {step}:"] + indent(folds) + ["cuda.syncthreads()"]
        step //= 2
    row += ["if t == 0:"] + indent(_finish(kb, accs, out_shape, epilogue, epi_ins, epi_outs, env))
    # NOTE: the next row overwrites the shared arrays: every thread waits until thread 0 has read them
    row += ["cuda.syncthreads()"]
    lines += indent(row)
    f = CudaFunction(kb.name, kb.ins + kb.outs, lines, schedule.launch)
    kb.functions.append(f)
    kb.launch = [f.launch_line()]


def _fold(kb: CudaKernelBuilder, acc, accumulated: str, value: str) -> str:
    """acc's reducer combining two expressions of its accumulator dtype."""
    return kb.body.fold(acc.reducer.combine, accumulated, value, acc.acc_dtype)


def _shared(acc) -> str:
    """The shared-memory array of an accumulator's per-thread partial results."""
    return f"shared{acc.suffix}"


def _as_acc(kb: CudaKernelBuilder, value: Value, acc) -> str:
    """A prologue value as its accumulator's dtype."""
    return value.name if value.dtype == acc.acc_dtype else kb.dialect.cast(value.name, acc.acc_dtype)


def _finish(kb: CudaKernelBuilder, accs, out_shape, epilogue, epi_ins, epi_outs, env: dict[Node, Value]) -> list[str]:
    """Thread 0's lines for kept position o: the reductions' values, the epilogue, the stores."""
    e_lines, e_offs = emit_offsets(out_shape, [broadcast_strides(a.shape, out_shape) for a in epi_ins + epi_outs],
                                   "o", "e_")
    lines = []
    for a in accs:
        env[a.node] = Value(kb.value_name(a.node), a.out_dtype)
        lines.append(f"{kb.value_name(a.node)} = {kb.dialect.cast(f'{_shared(a)}[0]', a.out_dtype)}")
    lines += e_lines + [f"{kb.value_name(a.node)} = {a.arg}[{off}]" for a, off in zip(epi_ins, e_offs)]
    for a in epi_ins:
        env[a.node] = Value(kb.value_name(a.node), a.dtype)
    lines += kb.body.emit(epilogue, env)
    lines += [f"{a.arg}[{off}] = {env[a.node].name}" for a, off in zip(epi_outs, e_offs[len(epi_ins):])]
    return lines
