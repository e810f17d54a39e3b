"""Batched products of small matrices as a generated call (matmul form "batched_rows"): Winograd's T*T products of
transformed tiles at a small batch, (T*T, O, C) @ (T*T, C, P) with C and P a few dozen, where OpenBLAS's per-call
cost is a large part of each product and numba (whole-graph mode) has no batched np.matmul.

The kernel calls nnc.codegen.nowait.batched_rows: blocks of four output rows held in vector registers while the sum
runs over k (nnc.codegen.rows_kernel, LLVM vector FMAs), their chunks shared with nowait's helper thread on the other
core when it is awake (the caller never waits for it; the result is bit-identical to the serial loop).
"""
from __future__ import annotations

# The call serves sums over at most MAX_K into rows of at most MAX_COLUMNS (three vectors of float32), up to MAX_WORK
# multiply-adds; larger products go to BLAS. NOTE: 48, not 64: the call has no store path (nnc.passes.stores places
# only np.matmul's and the batched_small loop's products in a cat's buffer), and attention's products at T = 64 (a
# sum over 64, or rows of 64) keep np.matmul and their stores.
# NOTE: measured on the MNIST CNN's conv2 at batch 1 with F(4x4) (36 products of 64 x 32 x 36, 2.65 M
# multiply-adds), at quiet moments (load 0.7-1.5 on 2 cores): the earlier one-row-a-task loop 59.7-62.2 us and
# np.matmul on OpenBLAS (Haswell kernels) 58.8 us (minimums of 5 x 300 calls); rows_kernel alone 23.2 us median
# (22.9 min) and with the helper 16.0 us (15.2; it computed 32% of the chunks) in tools/bench_nowait.py --rows.
# NOTE: never a parallel region: as a prange (2.65 M multiply-adds is above cpu_matmul.PARALLEL_MIN_WORK) the
# MNIST CNN's batch-1 forward in whole-graph mode took 14-31 ms a call on a loaded machine against 0.17-1.4 ms with
# a serial loop: a parallel region between OpenBLAS's calls (fc1's gemv) waits for descheduled threads (see
# cpu_matmul.PARALLEL_MIN_WORK's note). nowait's helper never makes the caller wait.
MAX_K = 48
MAX_COLUMNS = 48
MAX_WORK = 2 ** 23


def takes_batched_rows(batch: int, rows: int, kdim: int, n_out: int) -> bool:
    """Whether a same-batch product of `batch` (rows x kdim) @ (kdim x n_out) matrices runs as this loop."""
    return 0 < kdim <= MAX_K and n_out <= MAX_COLUMNS and batch * rows * kdim * n_out <= MAX_WORK


def batched_rows_lines(batch: int, rows: int, kdim: int, n_out: int) -> list[str]:
    """out[p] = a[p] @ b[p] for the batch's products p, a (batch, rows, kdim), b (batch, kdim, n_out) and out,
    all flat and C-contiguous: rows_kernel's blocks of rows, shared with nowait's helper thread when it is awake
    (the call takes its sizes; the batch is out's size over rows * n_out)."""
    return [f"nowait_rows(a, b, out, {rows}, {kdim}, {n_out})  # {batch} products"]
