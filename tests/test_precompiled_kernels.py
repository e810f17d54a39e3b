"""Kernels run by nnc.codegen.precompiled (compiled once for every shape): small serial column sums, row gathers and
row scatters. Each is checked bit for bit against the loops generated for the same kernel (what a whole graph still
runs), on the kernels real models make, and compiled against eager."""
import warnings

import numpy as np
import pytest

import nnc
import runtime
from nnc.codegen import precompiled
from nnc.codegen.cpu import compile_generated, generate
from nnc.codegen.cpu_gather import _geometry
from runtime import nn

from helpers import compiled_matches_eager


def _kernels(compiled):
    return [k for c in compiled.compilations for p in c.plans for k in p.kernels]


def _calling_precompiled(compiled) -> list:
    """The kernels of a compiled module whose launcher calls a precompiled function, with that function's name."""
    out = []
    for kernel in _kernels(compiled):
        if kernel.kind not in ("reduction", "gather"):
            continue
        generated = generate(kernel)
        if generated.precompiled:
            out.append((kernel, generated.precompiled[0]))
    return out


def _inputs(kernel, specs, rng) -> list:
    """Random inputs of the (shape, dtype) specs: floats, and for a gather's index any value of [-k, k)."""
    arrays = []
    k = _geometry(kernel)[4] if kernel.kind == "gather" else None
    for shape, dtype in specs:
        if np.dtype(dtype).kind in "iu":
            arrays.append(rng.integers(-k, k, shape).astype(dtype))
        else:
            arrays.append((rng.standard_normal(shape) * 100).astype(dtype))
    return arrays


def _same_as_generated_loops(kernel, rng) -> None:
    ours = compile_generated(kernel, generate(kernel))
    loops = compile_generated(kernel, generate(kernel, standalone=False))
    assert "nnc.codegen.precompiled" in ours.source and "nnc.codegen.precompiled" not in loops.source
    inputs = _inputs(kernel, ours.in_specs, rng)
    for got, want in zip(ours.run(inputs), loops.run(inputs)):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)  # bit for bit: the same additions in the same order


class Net(nn.Module):
    """An embedding into linear layers of three widths: row gathers, their scatter and bias column sums."""

    def __init__(self, dtype):
        super().__init__()
        self.emb = nn.Embedding(13, 24, dtype=dtype)
        self.fc1 = nn.Linear(24, 40, dtype=dtype)
        self.fc2 = nn.Linear(40, 1, dtype=dtype)

    def forward(self, idx):
        return self.fc2(runtime.tanh(self.fc1(self.emb(idx))))


@pytest.mark.parametrize("dtype,index_dtype", [(runtime.float32, np.int64), (runtime.float64, np.int32)])
def test_small_gathers_scatters_and_bias_sums_call_precompiled_functions(dtype, index_dtype):
    runtime.manual_seed(0)
    model = Net(dtype)
    idx = runtime.tensor(np.random.default_rng(0).integers(0, 13, (6, 5)).astype(index_dtype))
    compiled = compiled_matches_eager(model, idx, tol=1e-5 if dtype == runtime.float32 else 1e-12)
    names = {name for _, name in _calling_precompiled(compiled)}
    suffix = "f32" if dtype == runtime.float32 else "f64"
    assert names == {"gather_rows", "scatter_rows", f"column_sum_{suffix}"}
    rng = np.random.default_rng(1)
    for kernel, _ in _calling_precompiled(compiled):
        _same_as_generated_loops(kernel, rng)


class Rows(nn.Module):
    """index_select along dim 1 (rows of a middle dim: outer > 1) and its gradient, and rows assigned in forward (the
    last repeat wins)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(runtime.randn(3, 7, 5, dtype=runtime.float64))

    def forward(self, index, values):
        picked = self.w.index_select(1, index)
        x = self.w * 1.0
        x[:, index] = values
        return runtime.sin(picked).sum((0, 1)) + x.cos().sum((0, 1))


def test_middle_dim_gathers_and_assignments_match_generated_loops_bit_for_bit():
    runtime.manual_seed(1)
    model = Rows()
    index = runtime.tensor(np.array([6, -1, 0, 2, 6]))
    values = runtime.tensor(np.random.default_rng(2).standard_normal((3, 5, 5)))
    compiled = compiled_matches_eager(model, index, values)
    found = _calling_precompiled(compiled)
    assert {name for _, name in found} == {"gather_rows", "scatter_rows"} and len(found) >= 3
    rng = np.random.default_rng(3)
    for kernel, _ in found:
        _same_as_generated_loops(kernel, rng)


class ColumnSum(nn.Module):
    def forward(self, x):
        return x.sum(0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows,cols", [(2, 17), (600, 3), (200, 1100), (513, 16)])
def test_column_sums_match_generated_loops_across_spans_and_tiles(rows, cols, dtype):
    """Row counts across the 256-row spans, column counts across the 1024-column tile: bit for bit the generated
    loops' sums, and float32 ones within a span's float32 rounding of the exact sum."""
    rng = np.random.default_rng(rows)
    data = (rng.standard_normal((rows, cols)) * rng.uniform(0.1, 1e3, (rows, cols))).astype(dtype)
    compiled = nnc.compile(ColumnSum())
    got = compiled(runtime.tensor(data)).numpy()
    ((kernel, name),) = _calling_precompiled(compiled)
    assert name == ("column_sum_f32" if dtype == np.float32 else "column_sum_f64")
    _same_as_generated_loops(kernel, rng)
    exact = data.astype(np.float64).sum(axis=0)
    eps = float(np.finfo(dtype).eps)
    bound = 256 * eps * np.abs(data).astype(np.float64).sum(axis=0) + eps * np.abs(exact)
    assert got.dtype == dtype and np.all(np.abs(got - exact) <= bound)


def test_an_index_out_of_range_raises_before_anything_moves():
    table = np.arange(12.0).reshape(4, 3)
    out = np.full((2, 3), -1.0)
    assert precompiled.gather_rows(table.reshape(-1), 0, np.array([1, 4]), 0, out.reshape(-1), 1, 4, 2, 3) == 0
    assert (out == -1).all()
    assert precompiled.gather_rows(table.reshape(-1), 0, np.array([1, -4]), 0, out.reshape(-1), 1, 4, 2, 3) == 1
    np.testing.assert_array_equal(out, table[[1, -4]])
    grad = np.full(12, -1.0)
    assert precompiled.scatter_rows(table.reshape(-1), 0, np.ones(6), 0, np.array([0, -5]), 0, grad,
                                    1, 4, 2, 3, 1, 0) == 0
    assert (grad == -1).all()


def test_a_compiled_embedding_raises_torchs_error_for_a_bad_index():
    model = nn.Embedding(5, 3)
    compiled = nnc.compile(model)
    compiled(runtime.tensor(np.array([0, 4])))
    assert any(name == "gather_rows" for _, name in _calling_precompiled(compiled))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(IndexError, match=r"index out of range in self: .*\[-5, 5\) for dim 0 of size 5"):
            compiled(runtime.tensor(np.array([0, 5])))


def test_parallel_and_whole_graph_kernels_keep_their_own_loops():
    """Large work stays a generated, task-split kernel; a whole graph generates every kernel's loops."""
    runtime.manual_seed(2)
    big = nn.Linear(256, 512)
    compiled = nnc.compile(big)
    compiled(runtime.randn(1024, 256)).sum().backward()
    sums = [k for k in _kernels(compiled) if k.kind == "reduction"]
    assert sums and not any(generate(k).precompiled for k in sums)
    small = _calling_precompiled(compiled_matches_eager(Net(runtime.float64), runtime.tensor(np.array([[1, 2]]))))
    assert small
    for kernel, _ in small:
        assert not generate(kernel, standalone=False).precompiled
