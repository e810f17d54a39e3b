"""Batched products of small matrices as a generated loop (matmul form "batched_rows"): Winograd's T*T products of
transformed tiles at a small batch, (T*T, O, C) @ (T*T, C, P) with C and P a few dozen, where OpenBLAS's per-call
cost is a large part of each product and numba (whole-graph mode) has no batched np.matmul.

One output row a task, serially: the row's kdim values of `a` are held in scalars, and the row is one loop along its
n_out columns whose body is the whole sum over k written out (as a few independent partial sums), reading the
product's `b` at constant offsets from one slice (so LLVM addresses every row of `b` from one pointer, and the loop
vectorizes along the columns with no output row reloaded per k).
"""
from __future__ import annotations

from dataclasses import dataclass

from .cpu_elementwise import Function

# The loop serves sums over at most MAX_K (the body writes every term out) into rows of at most MAX_COLUMNS, up to
# MAX_WORK multiply-adds; larger products go to BLAS. NOTE: 48, not 64: the loop has no store path (nnc.passes.stores
# places only np.matmul's and the batched_small loop's products in a cat's buffer), and attention's products at
# T = 64 (a sum over 64, or rows of 64) keep np.matmul and their stores.
# NOTE: measured on the MNIST CNN's conv2 at batch 1 with F(4x4) (36 products of 64 x 32 x 36, 2.65 M
# multiply-adds), one thread, loaded machine, minimums of 7 x 2000 calls: 61-63 us, against 57-63 us for
# np.matmul on OpenBLAS (Haswell kernels), 119-135 us for the batched_small loop (its rows reloaded per 4 k),
# 97-146 us for the sum written out with a pointer per row of `b` (their addresses spilled).
# NOTE: serial at every size: as a prange (2.65 M multiply-adds is above cpu_matmul.PARALLEL_MIN_WORK) the
# MNIST CNN's batch-1 forward in whole-graph mode took 23-31 ms a call on a loaded machine (load average 3-7 on 2
# cores; im2col 1.9-2.6 ms there); with the serial loop 0.68-11.7 ms (median 1.4 ms; im2col 0.71-19.7 ms, load 5.4);
# at load 1.8-2.5, tools/bench_compile.py --threads 2: 14.3-18.4 ms minimum as a prange, 170 us serial: a parallel
# region between OpenBLAS's calls (fc1's gemv) waits for descheduled threads (see
# cpu_matmul.PARALLEL_MIN_WORK's note).
MAX_K = 48
MAX_COLUMNS = 48
MAX_WORK = 2 ** 23


def takes_batched_rows(batch: int, rows: int, kdim: int, n_out: int) -> bool:
    """Whether a same-batch product of `batch` (rows x kdim) @ (kdim x n_out) matrices runs as this loop."""
    return 0 < kdim <= MAX_K and n_out <= MAX_COLUMNS and batch * rows * kdim * n_out <= MAX_WORK


# Partial sums of a row's sum over k, added at the end: independent FMA chains, so that one vector of columns does
# not wait out kdim FMA latencies in a row.
CHAINS = 4


def _sum_terms(kdim: int, n_out: int) -> str:
    """The sum over k of x_k * b[k, j], as CHAINS partial sums (every CHAINS-th term) added pairwise."""
    terms = [f"x{k} * bt[j + {k * n_out}]" if k else "x0 * bt[j]" for k in range(kdim)]
    parts = [" + ".join(terms[c::CHAINS]) for c in range(min(CHAINS, kdim))]
    while len(parts) > 1:
        parts = [f"({parts[i]}) + ({parts[i + 1]})" if i + 1 < len(parts) else parts[i]
                 for i in range(0, len(parts), 2)]
    return parts[0]


@dataclass
class ContractFunction(Function):
    """A generated function with FMA contraction but no reassociation, so the partial sums stay independent.
    NOTE: with reassociation LLVM rebuilt the sum as one chain of kdim FMAs (MNIST CNN conv2's products, one
    thread, thread CPU time: 68.3-68.5 us against 61.4-65.7 us with the chains kept)."""

    def source(self) -> str:
        text = super().source()
        return text.replace("fastmath={'reassoc', 'contract'}", "fastmath={'contract'}", 1)


def batched_rows_lines(batch: int, rows: int, kdim: int, n_out: int) -> list[str]:
    """out[p] = a[p] @ b[p] for the batch's products p, a (batch, rows, kdim), b (batch, kdim, n_out) and out,
    all flat and C-contiguous: one output row a task."""
    lines = [f"for task in range({batch * rows}):",
             f"    p = task // {rows}",
             f"    ar = a[task * {kdim}:task * {kdim} + {kdim}]",
             f"    bt = b[p * {kdim * n_out}:(p + 1) * {kdim * n_out}]",
             f"    orow = out[task * {n_out}:task * {n_out} + {n_out}]"]
    lines += [f"    x{k} = ar[{k}]" for k in range(kdim)]
    return lines + [f"    for j in range({n_out}):", f"        orow[j] = {_sum_terms(kdim, n_out)}"]
