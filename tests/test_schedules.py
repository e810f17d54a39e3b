"""CPU schedules as values: the loop layout each skeleton follows (elementwise rows or flat, reduction rows, chunks
or columns, matmul loop form or BLAS), checked directly instead of searching generated source for `prange`.

These are pure functions of shapes (and dtypes), so nothing here compiles; tests/test_codegen_cpu.py runs kernels of
each layout against the interpreter, and tests/test_golden_kernels.py locks the source they emit.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import nnc
import runtime as torch
from nnc.codegen import nowait
from nnc.codegen.cpu import schedule
from nnc.codegen.cpu_elementwise import PARALLEL_MIN_ELEMENTS, ElementwiseSchedule, elementwise_schedule
from nnc.codegen.cpu_matmul import FEW_COLUMNS, FEW_ROWS, WIDE_COLUMNS, MatmulSchedule, matmul_schedule
from nnc.codegen.cpu_reduction import ReductionSchedule, reduction_schedule
from nnc.graph import Graph
from nnc.kernel import Kernel
from nnc.passes import propagate_shapes
from nnc.prims import prims
from runtime import nn

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)


# ---------------------------------------------------------------------------------------------------------------
# Elementwise
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,others,want", [
    # nothing broadcasts: every array collapses to one dim, one flat loop
    ((6, 5), [(6, 5)], ElementwiseSchedule(30, False, 0, 30)),
    # a bias [N] and a scale [B, 1]: rows of the last dim
    ((16, 24), [(24,), (16, 1)], ElementwiseSchedule(384, False, 16, 24)),
    # dims every array walks contiguously merge: [4, 5, 6] + [6] is 20 rows of 6
    ((4, 5, 6), [(6,)], ElementwiseSchedule(120, False, 20, 6)),
    # parallel over rows
    ((512, 520), [(520,)], ElementwiseSchedule(512 * 520, True, 512, 520)),
    # parallel with too few rows to share out: one flat prange over the elements
    ((2, 160000), [(160000,)], ElementwiseSchedule(320000, True, 0, 320000)),
])
def test_elementwise_schedule(shape, others, want):
    got = elementwise_schedule(shape, [shape] + others)
    assert got == want
    assert got.nested == (want.rows > 0) and got.loop == ("prange" if want.parallel else "range")


def test_elementwise_goes_parallel_at_the_threshold():
    below = elementwise_schedule((PARALLEL_MIN_ELEMENTS - 1,), [(PARALLEL_MIN_ELEMENTS - 1,)])
    at = elementwise_schedule((PARALLEL_MIN_ELEMENTS,), [(PARALLEL_MIN_ELEMENTS,)])
    assert (below.parallel, at.parallel) == (False, True)


def _elementwise_nodes(numel: int, ops: list[str]):
    """A chain of unary elementwise ops (a draw first when "dropout" is asked) over `numel` float32 elements."""
    g = Graph()
    x = g.placeholder("x")
    value = x
    for op in ops:
        if op == "dropout":
            seed = g.call_function(prims.random_seed, ())
            draw = g.call_function(prims.philox_uniform, (seed,), {"shape": (numel,), "dtype": torch.float32,
                                                                    "stream": 0})
            value = g.call_function(prims.mul, (value, g.call_function(prims.ge, (draw, 0.1))))
        else:
            value = g.call_function(prims[op], (value,))
    g.output((value,))
    propagate_shapes(nnc.GraphModule(nn.Module(), g), torch.zeros(numel))
    return [n for n in g.nodes if n.op == "call_function" and n.target.op.name != "random_seed"]


@pytest.mark.parametrize("ops,parallel_from", [
    ([], PARALLEL_MIN_ELEMENTS),                     # a copy: the element threshold
    (["neg", "abs", "neg", "abs"], PARALLEL_MIN_ELEMENTS // 2),  # four cheap ops: twice a copy's work
    (["exp"], -(-PARALLEL_MIN_ELEMENTS * 4 // 12)),      # a transcendental: three cheap elements
    (["erf"], -(-PARALLEL_MIN_ELEMENTS * 4 // 32)),      # erf: eight
    (["dropout"], -(-PARALLEL_MIN_ELEMENTS * 4 // 70)),  # a Philox draw and the mask: about seventeen
])
def test_elementwise_goes_parallel_by_its_work_not_its_elements(ops, parallel_from):
    """Work per element counts: a gelu's erf or a dropout's draw makes a loop worth two threads at a fraction of
    the elements a copy needs (measured: tools/bench_parallel.py)."""
    below, at = parallel_from - 1, parallel_from
    got = [elementwise_schedule((n,), [(n,)], None, _elementwise_nodes(n, ops)).parallel for n in (below, at)]
    assert got == [False, True]


def test_a_row_kernels_passes_and_draws_count_towards_its_work():
    """Softmax with dropout (attention at batch 8: 8 x 2 x 64 rows of 64) goes parallel; its plain rows at the same
    size do not until three passes over them reach the threshold."""
    from nnc.codegen.cpu_rows import row_schedule

    shape = (1024, 64)
    assert not row_schedule(shape, (1,), 1).parallel
    assert row_schedule(shape, (1,), 3, along=_elementwise_nodes(64 * 1024, ["exp", "dropout"])).parallel
    assert row_schedule((PARALLEL_MIN_ELEMENTS // 3 // 64 + 1, 64), (1,), 3).parallel


# ---------------------------------------------------------------------------------------------------------------
# Reductions
# ---------------------------------------------------------------------------------------------------------------

ROWS = dict(layout="rows", chunks=1)


@pytest.mark.parametrize("shape,dims,want", [
    # serial rows, too short to block
    ((6, 7, 9), (2,), ReductionSchedule(parallel=False, n_outer=42, n_red=9, chunk=9, block=9, **ROWS)),
    # serial rows over non-adjacent dims
    ((6, 7, 9), (0, 2), ReductionSchedule(parallel=False, n_outer=7, n_red=54, chunk=54, block=54, **ROWS)),
    # long rows: the prologue in blocks a helper reduces
    ((256, 300), (1,), ReductionSchedule(parallel=False, n_outer=256, n_red=300, chunk=300, blocked=True, block=300,
                                         **ROWS)),
    # parallel rows, one task per row, blocks of 1024
    ((512, 2048), (1,), ReductionSchedule(parallel=True, n_outer=512, n_red=2048, chunk=2048, blocked=True,
                                          block=1024, **ROWS)),
    # a parallel full sum: chunks of whole blocks (320000 / 64 tasks -> 5000 -> 5120), partial results
    ((2, 160000), (0, 1), ReductionSchedule("rows", True, 1, 320000, chunks=63, chunk=5120, blocked=True, block=1024)),
    # a parallel reduction keeping the last dim, but too few columns for tiles: rows
    ((4096, 100), (0,), ReductionSchedule(parallel=True, n_outer=100, n_red=4096, chunk=4096, blocked=True,
                                          block=1024, **ROWS)),
    # a kept last dim of size 1 has no columns to sweep
    ((64, 1), (0,), ReductionSchedule(parallel=False, n_outer=1, n_red=64, chunk=64, blocked=True, block=64, **ROWS)),
    # columns: the last dim kept (a bias gradient), one tile of 48 accumulators
    ((64, 48), (0,), ReductionSchedule("columns", False, 48, 64, chunks=1, chunk=64, tile=48, tiles=1)),
    # columns when the kept dims are not one run (0 and 2)
    ((6, 7, 9), (1,), ReductionSchedule("columns", False, 54, 7, chunks=1, chunk=7, tile=54, tiles=1)),
    # parallel columns: one tile of 520, the 600 rows in 16 chunks of 38 (partial results)
    ((600, 520), (0,), ReductionSchedule("columns", True, 520, 600, chunks=16, chunk=38, tile=520, tiles=1)),
    # parallel columns: three balanced tiles of 704 (a multiple of 16), each 130 rows in 4 chunks of 33
    ((130, 2100), (0,), ReductionSchedule("columns", True, 2100, 130, chunks=4, chunk=33, tile=704, tiles=3)),
])
def test_reduction_schedule(shape, dims, want):
    got = reduction_schedule(shape, dims)
    assert got == want
    assert got.loop == ("prange" if math.prod(shape) >= PARALLEL_MIN_ELEMENTS else "range")
    assert got.tasks == (want.tiles if want.layout == "columns" else want.n_outer) * want.chunks
    assert got.chunk * got.chunks >= got.n_red > got.chunk * (got.chunks - 1)  # the chunks cover the reduced range


def test_reductions_without_block_helpers_are_never_blocked():
    assert reduction_schedule((256, 300), (1,), blockable=True).blocked
    assert not reduction_schedule((256, 300), (1,), blockable=False).blocked


def reduction_kernel(op, shape, dims, dtype=torch.float32):
    g = Graph()
    x = g.placeholder("x")
    value = g.call_function(prims.gt, (x, 0.0)) if dtype is torch.bool else x
    out = g.call_function(prims[op], (value,), {"dims": dims, "keepdim": False})
    g.output((out,))
    propagate_shapes(nnc.GraphModule(nn.Module(), g), torch.zeros(*shape))
    return Kernel(f"{op}_k", "reduction", [n for n in g.nodes if n.op == "call_function"], [x], [out], shape)


@pytest.mark.parametrize("op,blocked", [("sum", True), ("amax", True), ("prod", True), ("all", True),
                                        ("any", True)])
def test_schedule_of_a_reduction_kernel_asks_its_reducers(op, blocked):
    """A kernel's schedule blocks its rows only when every reducer has a block helper (all of them have one)."""
    dtype = torch.bool if op in ("all", "any") else torch.float32
    got = schedule(reduction_kernel(op, (8, 500), (1,), dtype))
    assert (got.layout, got.n_outer, got.n_red, got.blocked) == ("rows", 8, 500, blocked)


# ---------------------------------------------------------------------------------------------------------------
# Matmul
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op,a,b,dtype,form,parallel", [
    ("linear", (4, 32), (16, 32), F32, "linear_few_rows", False),
    ("linear", (FEW_ROWS, 784), (512, 784), F32, "linear_few_rows", True),   # a batch-8 layer
    ("linear", (1, 784), (512, 784), F32, "linear_few_rows", False),      # < PARALLEL_MIN_WORK: serial
    ("linear", (1, 9216), (128, 9216), F32, "blas", False),               # >= GEMV_BLAS_MIN_WORK, weight unknown
    ("linear", (1, 1, 2048), (1030, 2048), F64, "blas", False),
    ("matmul", (2, 300), (300, 1000), F32, "matmul_few_rows", False),
    ("matmul", (8, 300), (300, 1000), F32, "matmul_few_rows", True),
    ("matmul", (4, 9), (9, 11), F64, "matmul_few_rows", False),
    ("matmul", (512, 8), (8, 784), F32, "short_sum", True),                # g^T @ x at batch 8
    ("matmul", (40, 3), (3, 17), F64, "short_sum", False),
    ("linear", (128, 512), (10, 512), F32, "linear_few_columns", False),   # a 10-class head at batch 128
    ("matmul", (128, 10), (10, 512), F32, "short_sum", False),             # its input gradient: serial
    ("matmul", (FEW_ROWS + 1, FEW_COLUMNS + 1), (FEW_COLUMNS + 1, 6), F32, "blas", False),
    ("matmul", (32, 9), (9, 43264), F32, "short_sum_wide", True),         # the MNIST CNN's first convolution
    ("matmul", (16, FEW_COLUMNS), (FEW_COLUMNS, WIDE_COLUMNS), F64, "short_sum_wide", False),
    ("matmul", (FEW_ROWS, 9), (9, 43264), F32, "matmul_few_rows", True),  # few rows: each row a sweep of b
    ("matmul", (32, FEW_COLUMNS + 1), (FEW_COLUMNS + 1, 43264), F32, "blas", False),
    ("linear", (512, 64), (128, 64), F32, "blas", False),
    ("matmul", (2, 8, 12), (2, 12, 10), F32, "batched_small", False),      # a small batched product: a loop
    ("matmul", (2, 64, 64), (2, 64, 256), F32, "blas", False),             # a larger one: np.matmul
    ("matmul", (1, 8, 12), (2, 12, 10), F32, "blas", False),               # batch dims broadcast: np.matmul
    ("matmul", (4, 5), (5, 6), np.dtype(np.int64), "blas", False),         # loops are for floats
    ("matmul", (4, 0), (0, 6), F32, "blas", False),                        # an empty sum
])
def test_matmul_schedule(op, a, b, dtype, form, parallel):
    got = matmul_schedule(op, a, b, dtype, dtype, dtype)
    assert (got.form, got.parallel) == (form, parallel)
    if form != "blas":
        rows, kdim = math.prod(a[:-1]), a[-1]
        batch_rows = a[-2] if form == "batched_small" else 0
        assert got == MatmulSchedule(form, parallel, rows, kdim, b[0] if op == "linear" else b[-1], batch_rows)


@pytest.mark.parametrize("weight_is_parameter", [False, True])
def test_a_large_one_row_linear_takes_the_helper_thread_only_with_a_parameter_weight(weight_is_parameter):
    """The MNIST CNN's fc1 at batch 1: OpenBLAS's gemv (whose threads join) unless nnc.codegen.nowait can read the
    weight after the call returns (a parameter) and the product fits its mailbox."""
    got = matmul_schedule("linear", (1, 9216), (128, 9216), F32, F32, F32, weight_is_parameter=weight_is_parameter)
    shared = weight_is_parameter and nowait.AVAILABLE
    assert got.form == ("linear_few_rows" if shared else "blas")
    too_long = matmul_schedule("linear", (1, nowait.MAX_K + 1), (128, nowait.MAX_K + 1), F32, F32, F32,
                               weight_is_parameter=weight_is_parameter)
    assert too_long.form == "blas"


def test_mixed_dtypes_go_to_blas():
    assert matmul_schedule("linear", (4, 32), (16, 32), F32, F64, F32).form == "blas"
