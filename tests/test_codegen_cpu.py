"""nnc.codegen.cpu: compiled kernels agree with the interpreter (every templated elementwise op in float32/float64 at
serial and parallel sizes, broadcasting, reductions with prologues/epilogues, matmul epilogues), reuse out= buffers,
raise KernelCompileError clearly, and load from the on-disk cache in a second process.

Kernels are built by hand (no fusion pass). Compiling costs ~0.3-1 s per kernel, so the op sweep compiles one kernel
holding every op per (dtype, size) and each parametrized case checks its own output of it.
"""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from numba.core.registry import CPUDispatcher

import nnc
import runtime as torch
from nnc.codegen import cache
from nnc.codegen.cpu import KernelCompileError, compile_kernel, schedule
from nnc.codegen.cpu_elementwise import PARALLEL_MIN_ELEMENTS, ElementwiseSchedule, parallel_work
from nnc.codegen.cpu_matmul import FEW_COLUMNS, FEW_ROWS
from nnc.graph import Graph
from nnc.kernel import Kernel
from nnc.passes import propagate_shapes
from runtime import nn
from runtime.ops import OPS, Kind, apply

from helpers import call

# (the random draws, which take a seed and their element's index, have their own tests: test_dropout_compiled.py)
ELEMENTWISE_OPS = sorted(name for name, op in OPS.items() if op.kind == Kind.ELEMENTWISE and not op.needs_index)
SMALL, LARGE = (5, 7), (512, 520)
assert math.prod(SMALL) < PARALLEL_MIN_ELEMENTS <= math.prod(LARGE)
FLOAT = {"float32": torch.float32, "float64": torch.float64}
INT_FOR = {"float32": torch.int32, "float64": torch.int64}
# Tolerances: exp/log/log1p/tanh/sigmoid/erf use nnc/codegen/approx.py, whose stated bounds are <= 3.5e-7 relative
# in float32 and <= 1e-15 in float64 (erf also <= 1.5e-7 absolute in float32); numpy's own result is off by up to
# half an ulp more. The other ops differ by an ulp at most (libm's sin/cos/pow vs numpy's loops).
TOL = {"float32": dict(rtol=1e-6, atol=1e-7), "float64": dict(rtol=4e-15, atol=1e-15)}


pytestmark = pytest.mark.usefixtures("fresh_kernel_cache")  # compile, not load a cache an earlier run left


# ---------------------------------------------------------------------------------------------------------------
# Helpers: hand-built graphs and kernels
# ---------------------------------------------------------------------------------------------------------------

class Case:
    """A hand-built decomposed graph with shape meta, a Kernel over its compute nodes, and its example inputs."""

    def __init__(self, inputs: dict, build, kind="elementwise", shape=None, name="k"):
        self.graph = g = Graph()
        self.placeholders = {n: g.placeholder(n) for n in inputs}
        self.outputs = list(build(g, **self.placeholders))
        g.output(tuple(self.outputs))
        self.gm = nnc.GraphModule(nn.Module(), g)
        self.tensors = list(inputs.values())
        propagate_shapes(self.gm, *self.tensors)
        nodes = [n for n in g.nodes if n.op == "call_function"]
        used = [p for p in self.placeholders.values() if p.users]
        if shape is None:
            shape = self.outputs[-1].meta["shape"] if kind != "reduction" else None
        self.kernel = Kernel(name, kind, nodes, used, self.outputs, tuple(shape))
        self.inputs = [t.numpy() for t, p in zip(self.tensors, self.placeholders.values()) if p.users]

    def expected(self, tensors=None):
        result = nnc.Interpreter(self.gm).run(*(tensors or self.tensors))
        return [r.numpy() for r in result]


def assert_close(got, want, tol, what=""):
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    if got.dtype.kind == "f":
        np.testing.assert_allclose(got, want, equal_nan=True, err_msg=what, **tol)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


_compiled: dict = {}


def compiled(key, make):
    """Compile once per key for the whole module: (case, compiled kernel or the KernelCompileError)."""
    if key not in _compiled:
        case = make()
        try:
            _compiled[key] = (case, compile_kernel(case.kernel))
        except KernelCompileError as e:
            _compiled[key] = (case, e)
    case, result = _compiled[key]
    if isinstance(result, KernelCompileError):
        raise result
    return case, result


# ---------------------------------------------------------------------------------------------------------------
# Every elementwise op of the op table
# ---------------------------------------------------------------------------------------------------------------

# Example attribute values, by attribute name (an op with a new attribute fails below until one is added here).
EXAMPLE_ATTRS = {"min": -0.5, "max": 0.75, "dtype": torch.int32}


def operand_shapes(shape):
    """Operand shapes by position: the first is the full shape, the others broadcast into it ([N], [B, 1])."""
    return [shape, shape[-1:], (shape[0], 1)]


def _data(kind: str, dtype, shape, position, rng):
    if kind == "bool":
        return torch.from_numpy(rng.random(shape) < 0.5)
    if kind == "int":
        low, high = (-20, 21) if position == 0 else (1, 8)  # nonzero, non-negative divisors and exponents
        return torch.from_numpy(rng.integers(low, high, size=shape).astype(dtype.np))
    return torch.from_numpy((rng.standard_normal(shape) * 2).astype(dtype.np))


def operand_kinds(name: str, float_name: str):
    """The first operand recipe eager accepts for op `name`: all float, all int, or a bool condition + floats."""
    op = OPS[name]
    attrs = {a: EXAMPLE_ATTRS[a] for a in op.attr_names}
    for kinds in (["float"] * op.arity, ["int"] * op.arity, ["bool"] + ["float"] * (op.arity - 1)):
        dtypes = [FLOAT[float_name] if k == "float" else INT_FOR[float_name] for k in kinds]
        tensors = [_data(k, d, (2, 3), 1, np.random.default_rng(0)) for k, d in zip(kinds, dtypes)]
        try:
            apply(name, *tensors, **attrs)
        except (TypeError, RuntimeError):
            continue
        return kinds, dtypes, attrs
    raise AssertionError(f"no operand recipe fits op {name}; teach operand_kinds about it")


def sweep_case(float_name: str, shape, names=None) -> Case:
    """One kernel applying every op (or `names`) to broadcast operands: one output per op."""
    rng = np.random.default_rng(1)
    names = ELEMENTWISE_OPS if names is None else names
    recipes = {name: operand_kinds(name, float_name) for name in names}
    inputs = {}
    for kinds, dtypes, _ in recipes.values():
        for k, (kind, d) in enumerate(zip(kinds, dtypes)):
            key = f"{kind}{k}"
            if key not in inputs:
                inputs[key] = _data(kind, d, operand_shapes(shape)[k], k, rng)

    def build(g, **ph):
        out = []
        for name in names:
            kinds, _, attrs = recipes[name]
            out.append(call(g, name, *[ph[f"{kind}{k}"] for k, kind in enumerate(kinds)], **attrs))
        return out

    return Case(inputs, build, shape=shape, name=f"sweep_{float_name}_{math.prod(shape)}")


def test_every_elementwise_op_has_a_template():
    missing = [name for name in ELEMENTWISE_OPS if OPS[name].template is None]
    assert not missing, f"elementwise ops without a scalar template cannot be compiled: {missing}"


@pytest.mark.parametrize("size", ["small", "large"])
@pytest.mark.parametrize("float_name", ["float32", "float64"])
@pytest.mark.parametrize("name", ELEMENTWISE_OPS)
def test_elementwise_op_matches_interpreter(name, float_name, size):
    shape = SMALL if size == "small" else LARGE
    try:
        case, kernel = compiled(("sweep", float_name, shape), lambda: sweep_case(float_name, shape))
        position = ELEMENTWISE_OPS.index(name)
    except KernelCompileError:
        # the shared kernel failed: compile this op alone, so the failure names the op that broke it
        case, kernel = compiled(("sweep", float_name, shape, name), lambda: sweep_case(float_name, shape, [name]))
        position = 0
    assert kernel.parallel == (size == "large")
    if not hasattr(case, "results"):  # run the kernel and the interpreter once per shared kernel
        case.results = kernel.run(case.inputs), case.expected()
    got, want = case.results[0][position], case.results[1][position]
    assert_close(got, want, TOL[float_name], f"{name} {float_name} {shape}")


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool])
def test_int_and_bool_operands(dtype):
    """Every op eager accepts on int32 (or bool) operands, in one kernel: integer wraparound, bool arithmetic."""
    rng = np.random.default_rng(2)
    accepted = []
    kind = "int" if dtype is torch.int32 else "bool"
    for name in ELEMENTWISE_OPS:
        op = OPS[name]
        attrs = {a: EXAMPLE_ATTRS[a] for a in op.attr_names}
        for kinds in ([kind] * op.arity, ["bool"] + [kind] * (op.arity - 1)):  # all of dtype, or a bool condition
            try:
                apply(name, *[_data(k, dtype, (2, 3), i, rng) for i, k in enumerate(kinds)], **attrs)
            except (TypeError, RuntimeError):
                continue
            accepted.append((name, kinds, attrs))
            break
    assert len(accepted) > 10
    inputs = {f"{kind}{k}": _data(kind, dtype, operand_shapes(SMALL)[k], k, rng)
              for _, kinds, _ in accepted for k, kind in enumerate(kinds)}

    def build(g, **ph):
        return [call(g, name, *[ph[f"{kind}{k}"] for k, kind in enumerate(kinds)], **attrs)
                for name, kinds, attrs in accepted]

    case, kernel = compiled(("ints", dtype.name), lambda: Case(inputs, build, shape=SMALL, name=f"ints_{dtype.name}"))
    for (name, _, _), got, want in zip(accepted, kernel.run(case.inputs), case.expected()):
        assert_close(got, want, TOL["float32"], f"{name} on {dtype}")


def test_cast_between_every_dtype():
    """cast (template "{dtype}({0})") from and to bool, int32, int64, float32, float64: numpy's astype."""
    dtypes = [torch.bool, torch.int32, torch.int64, torch.float32, torch.float64]
    values = np.array([0.0, -0.0, 0.3, -1.7, 2.5, 7.0, -128.9, 1e3], np.float64)
    inputs = {f"x_{d.name}": torch.from_numpy(values.astype(d.np)) for d in dtypes}

    def build(g, **ph):
        return [call(g, "cast", ph[f"x_{a.name}"], dtype=b) for a in dtypes for b in dtypes]

    case, kernel = compiled("casts", lambda: Case(inputs, build, name="casts"))
    for k, (got, want) in enumerate(zip(kernel.run(case.inputs), case.expected())):
        assert_close(got, want, TOL["float64"], f"cast {dtypes[k // 5]} -> {dtypes[k % 5]}")


# ---------------------------------------------------------------------------------------------------------------
# An elementwise chain with broadcasting, Python scalars, casts; out= buffers; the source
# ---------------------------------------------------------------------------------------------------------------

def chain_case(float_name, shape):
    d = FLOAT[float_name]
    rng = np.random.default_rng(3)
    inputs = {"x": torch.from_numpy(rng.standard_normal(shape).astype(d.np)),
              "bias": torch.from_numpy(rng.standard_normal(shape[-1:]).astype(d.np)),
              "scale": torch.from_numpy(rng.standard_normal((shape[0], 1)).astype(d.np)),
              "zero_dim": torch.tensor(1.5, dtype=d)}

    def build(g, x, bias, scale, zero_dim):
        h = call(g, "add", x, bias)                        # bias [N] into [B, N]
        h = call(g, "mul", h, scale)                       # [B, 1] into [B, N]
        h = call(g, "sub", h, zero_dim)                    # a zero-dim tensor
        h = call(g, "mul", h, 0.5)                         # a Python float stays float32
        t = call(g, "tanh", h)
        r = call(g, "relu", call(g, "add", t, 0.25))
        c = call(g, "clamp", h, min=None, max=1.0)
        i = call(g, "cast", call(g, "mul", h, 10), dtype=torch.int32)
        m = call(g, "where", call(g, "gt", i, 2), r, call(g, "neg", c))
        return [r, i, m]

    return Case(inputs, build, name=f"chain_{float_name}_{math.prod(shape)}")


@pytest.mark.parametrize("float_name", ["float32", "float64"])
@pytest.mark.parametrize("shape", [SMALL, LARGE], ids=["small", "large"])
def test_elementwise_chain_with_broadcasting(float_name, shape):
    case, kernel = compiled(("chain", float_name, shape), lambda: chain_case(float_name, shape))
    assert kernel.parallel == (math.prod(shape) >= PARALLEL_MIN_ELEMENTS)
    for got, want in zip(kernel.run(case.inputs), case.expected()):
        assert_close(got, want, TOL[float_name], kernel.name)


def test_float32_stays_float32_in_the_source():
    case, kernel = compiled(("chain", "float32", SMALL), lambda: chain_case("float32", SMALL))
    src = kernel.source
    assert "np.float64" not in src, src  # no literal or operand silently promoted to float64
    assert "np.float32(0.5)" in src
    # broadcasting: a loop over rows, an inner loop along the last dim reading x at row base + j, the bias at j,
    # the [B, 1] scale at the row index, the zero-dim tensor at 0
    assert "for o in range(5):" in src and "for j in range(7):" in src
    assert "row_in0 = in0[b0:b0 + 7]" in src and "v_in0 = row_in0[j]" in src and "v_in1 = in1[j]" in src
    assert "v_in2 = in2[o]" in src and "v_in3 = in3[0]" in src
    large_case, _ = compiled(("chain", "float32", LARGE), lambda: chain_case("float32", LARGE))
    assert schedule(large_case.kernel) == ElementwiseSchedule(math.prod(LARGE), True, LARGE[0], LARGE[1])  # prange
    compile(src, "<kernel>", "exec")
    # the file holds the source below the legend (which names the graph nodes and is never cached)
    assert src.endswith(kernel.path.read_text()) and kernel.path.parent == cache.cache_dir()
    # same source in the same process: the module already imported, its launcher reused, no numba compilation
    module, _, already_loaded = cache.load_module(kernel.path.read_text())
    overloads = {name: len(f.overloads) for name, f in vars(module).items() if hasattr(f, "overloads")}
    again = compile_kernel(case.kernel)
    assert already_loaded and again.cache_hit and again.source == src and again._launch is kernel._launch
    assert {name: len(f.overloads) for name, f in vars(module).items() if hasattr(f, "overloads")} == overloads


@pytest.mark.parametrize("float_name", ["float32", "float64"])
def test_numba_types_every_float_value_in_its_own_dtype(float_name):
    """Where the source leaves out the cast of a result (float arithmetic on operands of one dtype), numba still types
    it in the node's dtype: every op of the sweep, as numba's type inference saw the kernel."""
    case, kernel = compiled(("sweep", float_name, SMALL), lambda: sweep_case(float_name, SMALL))
    module, _, _ = cache.load_module(kernel.path.read_text())
    (typemap,) = [cres.type_annotation.typemap for f in vars(module).values()
                  if isinstance(f, CPUDispatcher) and f.__module__ == module.__name__ for cres in f.overloads.values()]
    values = {int(m.group(1)): str(t) for name, t in typemap.items() if (m := re.fullmatch(r"v(\d+)_\w+", name))}
    want = {k: str(np.dtype(node.meta["dtype"].np)) for k, node in enumerate(case.kernel.nodes)}
    assert values == {k: "bool" if d == "bool" else d for k, d in want.items()}
    source = kernel.source[kernel.source.index("def k_"):]
    assert f"np.{float_name}(v_in0 + v_in1)" not in source and "v_in0 + v_in1" in source  # the cast left out


def shifted_empty(shape, dtype, shift: int) -> np.ndarray:
    """An uninitialised C-contiguous array starting `shift` elements into a larger buffer (so at any alignment)."""
    n = math.prod(shape)
    return np.empty(n + 64, dtype)[shift:shift + n].reshape(shape)


@pytest.mark.parametrize("float_name", ["float32", "float64"])
def test_large_kernels_read_bias_rows_from_copies_placed_beside_the_output(float_name):
    """A parallel kernel copies a row every row reads (the bias) next to the output's page offset before its loop,
    and gives the interpreter's results whatever the alignment of the output and of the bias."""
    case, kernel = compiled(("chain", float_name, LARGE), lambda: chain_case(float_name, LARGE))
    src = kernel.source
    length = LARGE[1]
    # the launch line copies it (nnc.codegen.tasks.placed_row) for the task function, which reads the copy
    assert f"placed_row(ins[1].reshape(-1), outs[0].reshape(-1), {length})" in src, src
    assert "v_in1 = bcast_in1[j]" in src and "bcast_in1 = task_array(" in src
    small_case, small = compiled(("chain", float_name, SMALL), lambda: chain_case(float_name, SMALL))
    assert "bcast_" not in small.source and "v_in1 = in1[j]" in small.source  # serial kernels read it in place
    want = case.expected()
    x, bias, *rest = case.inputs
    for shift in (0, 1, 3, 16, 17):
        moved_bias = shifted_empty(bias.shape, bias.dtype, (shift * 7) % 32)
        moved_bias[...] = bias
        outs = [shifted_empty(w.shape, w.dtype, shift) for w in want]
        kernel.run_into([x, moved_bias, *rest], outs)
        for got, w in zip(outs, want):
            assert_close(got, w, TOL[float_name], f"output shifted by {shift} elements")


@pytest.mark.parametrize("x_shape,y_shape,parallel", [
    ((6, 5), (6, 5), False),         # nothing broadcasts: one flat loop at the flat index
    ((2, 160000), (160000,), True),  # parallel with too few rows: flat, offsets by division
    ((3, 1, 30000), (4, 1), True),
])
def test_flat_loops(x_shape, y_shape, parallel):
    rng = np.random.default_rng(8)
    inputs = {"x": torch.from_numpy(rng.standard_normal(x_shape).astype(np.float32)),
              "y": torch.from_numpy(rng.standard_normal(y_shape).astype(np.float32))}
    case, kernel = compiled(("flat", x_shape, y_shape), lambda: Case(
        inputs, lambda g, x, y: [call(g, "sigmoid", call(g, "sub", x, y))], name="flat"))
    numel = math.prod(case.kernel.shape)
    assert schedule(case.kernel) == ElementwiseSchedule(numel, parallel, rows=0, length=numel)
    for got, want in zip(kernel.run(case.inputs), case.expected()):
        assert_close(got, want, TOL["float32"])


def test_out_buffers_are_written_and_returned():
    case, kernel = compiled(("chain", "float32", SMALL), lambda: chain_case("float32", SMALL))
    want = case.expected()
    bufs = [np.full(w.shape, 7, w.dtype) for w in want]
    bufs[2] = np.empty(want[2].shape[::-1], want[2].dtype).T  # not C-contiguous: still written
    result = kernel.run(case.inputs, out=bufs)
    assert all(r is b for r, b in zip(result, bufs))
    for b, w in zip(bufs, want):
        assert_close(b, w, TOL["float32"])
    with pytest.raises(ValueError, match="out buffer 0 must be"):
        kernel.run(case.inputs, out=[np.empty((1, 1), np.float32)] + bufs[1:])
    with pytest.raises(ValueError, match="input 0 must be"):
        kernel.run([case.inputs[0].astype(np.float64)] + case.inputs[1:])
    # non-contiguous inputs are accepted too
    x = np.asfortranarray(case.inputs[0])
    for got, w in zip(kernel.run([x] + case.inputs[1:]), want):
        assert_close(got, w, TOL["float32"])


def test_run_into_takes_any_layout_of_the_right_shapes():
    """The executor's fast path: non-contiguous and read-only inputs still give the right values; wrong dtypes
    still get run's clear error."""
    case, kernel = compiled(("chain", "float32", SMALL), lambda: chain_case("float32", SMALL))
    want = case.expected()
    fortran = np.asfortranarray(case.inputs[0])
    frozen = case.inputs[0].copy()
    frozen.flags.writeable = False
    for first in (case.inputs[0], fortran, frozen):
        outs = [np.empty(w.shape, w.dtype) for w in want]
        kernel.run_into([first] + case.inputs[1:], outs)
        for got, w in zip(outs, want):
            assert_close(got, w, TOL["float32"])
    with pytest.raises(ValueError, match="input 0 must be"):
        kernel.run_into([case.inputs[0].astype(np.float64)] + case.inputs[1:], [np.empty(w.shape, w.dtype)
                                                                               for w in want])


# ---------------------------------------------------------------------------------------------------------------
# Reductions: prologue, accumulator, epilogue
# ---------------------------------------------------------------------------------------------------------------

REDUCTIONS = [
    # op, shape, dims, keepdim, skeleton: serial (small; rows, columns, non-adjacent dims), then parallel: rows
    # (the prologue in vectorized blocks), columns (a tile of accumulators), few rows (chunked two-pass), full
    ("sum", (6, 7, 9), (2,), False, "row"),
    ("sum", (6, 7, 9), (0,), True, "column"),
    ("amax", (6, 7, 9), (0, 2), False, "row"),
    ("amin", (6, 7, 9), (1,), True, "column"),
    ("prod", (6, 7, 9), (2,), True, "row"),
    ("sum", (256, 300), (1,), False, "blocked"),
    ("amax", (300, 256), (0,), True, "column"),
    ("sum", (2, 160000), (0, 1), False, "chunked"),
    ("amin", (3, 120000), (1,), False, "chunked"),
    ("prod", (128, 600), (1,), False, "blocked"),
    ("amax", (64, 2500), (1,), False, "blocked"),  # blocks of 1024, 1024, 452
    ("sum", (600, 520), (0,), True, "column_chunked"),  # row chunks of one 520-column tile: partial sums
    ("amax", (130, 2100), (0,), False, "column_chunked"),  # three tiles x four row chunks
]


def skeleton_name(kernel) -> str:
    """The name REDUCTIONS gives the layout of the reduction kernel's schedule."""
    s = schedule(kernel)
    if s.layout == "columns":
        return "column_chunked" if s.chunks > 1 else "column"
    if s.chunks > 1:
        assert s.blocked and s.parallel, s  # chunks only split a parallel pass, in whole blocks
        return "chunked"
    return "blocked" if s.blocked else "row"


def reduction_inputs(shape, dims, keepdim, dtype, seed):
    """x of `shape`, w along its last dim (near 1), c along the reduced shape's last dim."""
    rng = np.random.default_rng(seed)
    out_shape = tuple(1 if i in dims else s for i, s in enumerate(shape)) if keepdim else \
        tuple(s for i, s in enumerate(shape) if i not in dims)
    return {"x": torch.from_numpy(rng.standard_normal(shape).astype(dtype.np)),
            "w": torch.from_numpy(rng.uniform(0.9, 1.1, shape[-1:]).astype(dtype.np)),
            "c": torch.from_numpy(rng.standard_normal(out_shape[-1:]).astype(dtype.np))}


def reduction_case(op, shape, dims, keepdim, dtype=torch.float32):
    inputs = reduction_inputs(shape, dims, keepdim, dtype, seed=4)

    def build(g, x, w, c):
        p = call(g, "mul", call(g, "add", call(g, "mul", x, 0.01), 1.0), w)  # prologue, w broadcast along x
        r = call(g, op, p, dims=dims, keepdim=keepdim)
        e = call(g, "sqrt", call(g, "abs", call(g, "sub", r, c)))           # epilogue, c broadcast along r
        return [r, e]

    return Case(inputs, build, kind="reduction", shape=shape, name=f"{op}_{'x'.join(map(str, shape))}")


@pytest.mark.parametrize("shape,spans", [((3000, 64), "column_sum_f32("),  # serial: nnc.codegen.precompiled's
                                          ((1000, 600), "for r0 in range(")])  # parallel with row chunks
def test_float32_column_sums_are_at_least_as_accurate_as_numpy(shape, spans):
    """Spans of float32 additions, then float64 totals: more accurate than numpy's row-after-row float32 sum, and
    within the bound of a float32 sum over one span (plus the float32 result's rounding)."""
    rng = np.random.default_rng(9)
    data = (rng.standard_normal(shape) * rng.uniform(0.1, 1e3, shape)).astype(np.float32)
    case = Case({"x": torch.from_numpy(data)}, lambda g, x: [call(g, "sum", x, dims=(0,), keepdim=False)],
                kind="reduction", shape=shape, name=f"colsum_{shape[0]}")
    kernel = compile_kernel(case.kernel)
    assert spans in kernel.source
    (got,) = kernel.run(case.inputs)
    exact = data.astype(np.float64).sum(axis=0)
    ours = np.abs(got.astype(np.float64) - exact)
    numpy_error = np.abs(data.sum(axis=0).astype(np.float64) - exact)
    assert got.dtype == np.float32
    assert ours.max() <= numpy_error.max() and ours.mean() <= numpy_error.mean()
    eps = float(np.finfo(np.float32).eps)
    bound = 256 * eps * np.abs(data).astype(np.float64).sum(axis=0) + eps * np.abs(exact)
    assert np.all(ours <= bound)


@pytest.mark.parametrize("op,shape,dims,keepdim,skeleton", REDUCTIONS)
def test_reduction_with_prologue_and_epilogue(op, shape, dims, keepdim, skeleton):
    case, kernel = compiled(("red", op, shape, dims, keepdim), lambda: reduction_case(op, shape, dims, keepdim))
    prologue = [n for n in case.kernel.nodes if n.target.op.name in ("mul", "add")]  # x * 0.01 + 1, times w
    assert len(prologue) == 3
    assert kernel.parallel == parallel_work(math.prod(shape), prologue)
    assert schedule(case.kernel).parallel == kernel.parallel
    assert skeleton_name(case.kernel) == skeleton
    for got, want in zip(kernel.run(case.inputs), case.expected()):
        assert_close(got, want, dict(rtol=2e-6, atol=1e-6), kernel.name)


@pytest.mark.parametrize("op,shape,dims,keepdim", [REDUCTIONS[i][:4] for i in (2, 3, 6, 8, 10)])
def test_amax_amin_propagate_nan_like_numpy(op, shape, dims, keepdim):
    case, kernel = compiled(("red", op, shape, dims, keepdim), lambda: reduction_case(op, shape, dims, keepdim))
    x = case.inputs[0].copy()
    x.reshape(-1)[[0, x.size // 2, x.size - 1]] = np.nan
    x.reshape(-1)[5] = -np.inf
    tensors = [torch.from_numpy(x)] + case.tensors[1:]
    want = case.expected(tensors)
    got = kernel.run([x] + case.inputs[1:])
    assert np.isnan(want[0]).any()
    for g, w in zip(got, want):
        assert_close(g, w, dict(rtol=2e-6, atol=1e-6))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op", ["amax", "amin"])
def test_float_block_max_and_min_helpers_match_numpy_on_special_values(op, dtype):
    """The integer-key helpers behind every float amax/amin block (nnc.codegen.cpu_reduction): blocks of 1 to 70
    values and of 1024, with +-inf, +-0, subnormals, the extreme finite values and nans of both signs, against
    numpy (signed zeros compare equal; nan wherever numpy gives nan)."""
    from types import SimpleNamespace

    from nnc.codegen.cpu_reduction import block_helper

    kb = SimpleNamespace(helpers={})
    name = block_helper(kb, op, OPS[op].reducer, np.dtype(dtype), np.dtype(dtype))
    helper = getattr(cache.load_module("import numpy as np\nfrom numba import njit\n" + kb.helpers[name])[0], name)
    info = np.finfo(dtype)
    special = np.array([np.inf, -np.inf, 0.0, -0.0, info.tiny / 4, -info.tiny / 4, info.max, -info.max, 1.0, -1.0],
                       dtype=dtype)
    negative_nan = -np.abs(np.array(np.nan, dtype))
    rng = np.random.default_rng(0)
    reference = np.max if op == "amax" else np.min
    for n in list(range(1, 71)) + [1024]:
        for trial in range(6):
            buf = rng.standard_normal(n).astype(dtype) * dtype(10.0 ** rng.integers(-3, 4))
            picks = rng.integers(0, n, size=min(n, 3))
            buf[picks] = rng.choice(special, size=len(picks))
            if trial == 4:
                buf[rng.integers(0, n)] = np.nan
            if trial == 5:
                buf[rng.integers(0, n)] = negative_nan
            got, want = helper(buf, n), reference(buf)
            assert np.signbit(negative_nan) and (np.isnan(got) == np.isnan(want)), (n, trial, buf, got)
            assert np.isnan(want) or got == want, (n, trial, buf, got, want)


@pytest.mark.parametrize("dtype", [np.bool_, np.float32, np.int64])
@pytest.mark.parametrize("op", ["all", "any"])
def test_all_and_any_block_helpers_match_numpy(op, dtype):
    """The counting helpers behind blocked all/any (a row kernel's fully-masked-row test): blocks of 1 to 70
    values and of 1024, all true, all false, one odd value out, and nan (nonzero, so true) against numpy."""
    from types import SimpleNamespace

    from nnc.codegen.cpu_reduction import block_helper

    kb = SimpleNamespace(helpers={})
    name = block_helper(kb, op, OPS[op].reducer, np.dtype(dtype), np.dtype(np.bool_))
    helper = getattr(cache.load_module("import numpy as np\nfrom numba import njit\n" + kb.helpers[name])[0], name)
    rng = np.random.default_rng(0)
    reference = np.all if op == "all" else np.any
    for n in list(range(1, 71)) + [1024]:
        blocks = [np.ones(n, dtype), np.zeros(n, dtype), rng.integers(0, 2, n).astype(dtype)]
        for base in (np.ones(n, dtype), np.zeros(n, dtype)):
            odd = base.copy()
            odd[rng.integers(0, n)] = not base[0]
            blocks.append(odd)
        if dtype is np.float32:
            blocks.append(np.where(rng.random(n) < 0.5, np.nan, 0.0).astype(dtype))
        for buf in blocks:
            assert helper(buf, n) == reference(buf), (n, buf)


SIBLINGS = [
    # shape, dims, keepdim, skeleton (as REDUCTIONS): two reductions sharing one pass over the input
    ((6, 7, 9), (2,), False, "row"),
    ((6, 7, 9), (0,), True, "column"),
    ((6, 7, 9), (1,), True, "column"),  # kept dims 0 and 2 are not one contiguous run
    ((256, 300), (1,), False, "blocked"),
    ((64, 5000), (1,), True, "blocked"),
    ((600, 520), (0,), True, "column_chunked"),
    ((130, 2100), (0,), False, "column_chunked"),
    ((2, 160000), (0, 1), False, "chunked"),
]


def siblings_case(ops, shape, dims, keepdim, dtype):
    """p = (x * 0.01 + 1) * w (a prologue value the kernel also writes out), reductions ops[0](p) and ops[1](p * x)
    over the same dims, and an epilogue reading both results."""
    inputs = reduction_inputs(shape, dims, keepdim, dtype, seed=8)

    def build(g, x, w, c):
        p = call(g, "mul", call(g, "add", call(g, "mul", x, 0.01), 1.0), w)
        r1 = call(g, ops[0], p, dims=dims, keepdim=keepdim)
        r2 = call(g, ops[1], call(g, "mul", p, x), dims=dims, keepdim=keepdim)
        e = call(g, "add", call(g, "mul", r1, c), r2)
        return [p, r1, r2, e]

    name = f"siblings_{'_'.join(ops)}_{dtype.name}_{'x'.join(map(str, shape))}"
    return Case(inputs, build, kind="reduction", shape=shape, name=name)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape,dims,keepdim,skeleton", SIBLINGS)
def test_sibling_reductions_share_one_pass(shape, dims, keepdim, skeleton, dtype):
    """Two reductions (a float64-accumulated sum and an amax in the reduced dtype) in one kernel, with a prologue
    output and an epilogue reading both results, in every skeleton."""
    ops = ("sum", "amax")
    case, kernel = compiled(("siblings", shape, dims, keepdim, dtype),
                            lambda: siblings_case(ops, shape, dims, keepdim, FLOAT[dtype]))
    assert kernel.parallel == (math.prod(shape) >= PARALLEL_MIN_ELEMENTS)
    assert skeleton_name(case.kernel) == skeleton
    assert "acc0" in kernel.source and "acc1" in kernel.source
    tol = dict(rtol=2e-6, atol=1e-5) if dtype == "float32" else dict(rtol=1e-12, atol=1e-12)
    for got, want, what in zip(kernel.run(case.inputs), case.expected(), ["p", "sum", "amax", "epilogue"]):
        assert_close(got, want, tol, f"{kernel.name} {what}")


def test_a_reduction_reading_another_of_its_kernel_is_refused():
    rng = np.random.default_rng(3)
    inputs = {"x": torch.from_numpy(rng.standard_normal((4, 8)).astype(np.float32))}

    def build(g, x):
        m = call(g, "amax", x, dims=(1,), keepdim=True)
        return [m, call(g, "sum", call(g, "sub", x, m), dims=(1,), keepdim=True)]

    case = Case(inputs, build, kind="reduction", shape=(4, 8))
    with pytest.raises(KernelCompileError, match="depends on a reduction of the same kernel"):
        compile_kernel(case.kernel)


@pytest.mark.parametrize("op", ["all", "any"])
def test_all_any_reductions(op):
    """all/any over a bool prologue (their accumulators are bool: never blocked)."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((5, 6, 70)).astype(np.float32)
    x[1] = 1.0  # a row all True, and one all False, for both ops
    x[2] = -1.0
    inputs = {"x": torch.from_numpy(x)}

    def build(g, x):
        return [call(g, "logical_not", call(g, op, call(g, "gt", x, 0.0), dims=(2,), keepdim=False))]

    case, kernel = compiled(("bool_red", op), lambda: Case(inputs, build, kind="reduction", shape=x.shape, name=op))
    (got,), (want,) = kernel.run(case.inputs), case.expected()
    assert got.dtype == np.bool_ and want.any() and not want.all()
    np.testing.assert_array_equal(got, want)


REDUCER_OPS = sorted(name for name, op in OPS.items() if op.reducer is not None)


@pytest.mark.parametrize("layout,dims", [("rows", (1,)), ("columns", (0,))])
@pytest.mark.parametrize("name", REDUCER_OPS)
def test_every_reducer_compiles(name, layout, dims):
    """Every op with an OpDef.reducer, in both layouts, with a prologue and an epilogue, against the interpreter:
    a new reducer is compiled here without a test of its own. The values are exact in float32 (sums, products
    and extremes of a few short binary fractions) and rows 0 and 1 hold no zero and only zeros (all/any)."""
    rng = np.random.default_rng(11)
    x = rng.choice(np.array([0.0, 0.5, 1.0, 2.0, -1.0], np.float32), (40, 70))
    x[0], x[1] = 1.0, 0.0
    x = x if dims == (1,) else np.ascontiguousarray(x.T)
    inputs = {"x": torch.from_numpy(x), "w": torch.from_numpy(np.ones(x.shape[-1], np.float32))}

    def build(g, x, w):
        r = call(g, name, call(g, "mul", x, w), dims=dims, keepdim=False)
        return [r, call(g, "logical_not", r)]

    case, kernel = compiled(("reducer", name, layout), lambda: Case(inputs, build, kind="reduction", shape=x.shape,
                                                                    name=f"{name}_{layout}"))
    assert schedule(case.kernel).layout == layout
    for got, want in zip(kernel.run(case.inputs), case.expected()):
        assert_close(got, want, dict(rtol=0, atol=0), f"{name} {layout}")


class BoolReductions(nn.Module):
    def forward(self, x):
        return (x > 0).all(dim=1), (x * 2 > 1).any(dim=0), (x.abs() < 3).all(), x.sum()


@pytest.mark.parametrize("shape", [(5, 7), (600, 520), (3, 200000)], ids=["serial", "columns", "chunked"])
def test_compiled_all_and_any_match_eager(shape):
    """all/any fuse with their prologues (their OpDef.reducer), alone or beside a sum, and agree with eager."""
    x = torch.randn(*shape)
    x[0] = 1.0
    model = BoolReductions()
    for got, want in zip(nnc.compile(model)(x), model(x)):
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5)
    kernels = nnc.explain(model, x).kernels
    assert [(k.kind, k.ops, k.generated) for k in kernels] == [
        ("reduction", ["gt", "all"], True), ("reduction", ["mul", "gt", "any"], True),
        ("reduction", ["abs", "lt", "all", "sum"], True)]


def test_integer_sum_and_full_reduction_with_keepdim():
    rng = np.random.default_rng(5)
    inputs = {"x": torch.from_numpy(rng.integers(-100, 100, (4, 5, 6)).astype(np.int32))}

    def build(g, x):
        return [call(g, "sum", call(g, "mul", x, 3), dims=(0, 1, 2), keepdim=True)]

    case, kernel = compiled("int_sum", lambda: Case(inputs, build, kind="reduction", shape=(4, 5, 6), name="isum"))
    (got,), (want,) = kernel.run(case.inputs), case.expected()
    assert got.dtype == np.int64 and got.shape == (1, 1, 1)
    np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------------------------------------------------------
# Matmul + epilogue
# ---------------------------------------------------------------------------------------------------------------

def linear_case(dtype, m, k, n):
    rng = np.random.default_rng(6)
    inputs = {"x": torch.from_numpy(rng.standard_normal((m, k)).astype(dtype.np)),
              "weight": torch.from_numpy(rng.standard_normal((n, k)).astype(dtype.np)),
              "bias": torch.from_numpy(rng.standard_normal(n).astype(dtype.np))}

    def build(g, x, weight, bias):
        return [call(g, "relu", call(g, "add", call(g, "linear", x, weight), bias))]

    return Case(inputs, build, kind="matmul", name=f"linear_{m}x{k}x{n}")


@pytest.mark.parametrize("dtype,m,k,n", [(torch.float32, 512, 64, 128), (torch.float64, 9, 5, 17)])
def test_linear_bias_relu(dtype, m, k, n):
    case, kernel = compiled(("linear", dtype.name, m), lambda: linear_case(dtype, m, k, n))
    assert kernel.parallel == (m * n >= PARALLEL_MIN_ELEMENTS)
    assert schedule(case.kernel).form == "blas"
    (got,), (want,) = kernel.run(case.inputs), case.expected()
    assert_close(got, want, dict(rtol=1e-4, atol=1e-4) if dtype is torch.float32 else TOL["float64"])
    buf = np.empty_like(want)
    assert kernel.run(case.inputs, out=[buf])[0] is buf
    assert_close(buf, want, dict(rtol=1e-4, atol=1e-4) if dtype is torch.float32 else TOL["float64"])


# (op, dtype, (rows, sum length, output columns), parallel)
SMALL_MATMULS = [("linear", torch.float32, (1, 784, 512), False),  # below PARALLEL_MIN_WORK: serial
                 ("linear", torch.float64, (1, 13, 11), False),  # a batch-1 linear: 4 weight rows a sweep, 3 left
                 ("linear", torch.float32, (1, 1000, 1030), False),  # ... with a partial last task
                 ("linear", torch.float64, (3, 7, 5), False),
                 ("linear", torch.float32, (4, 100, 1030), False),
                 ("linear", torch.float32, (8, 784, 512), True),  # a batch-8 layer: every row in one sweep
                 ("linear", torch.float64, (6, 13, 7), False),
                 ("matmul", torch.float32, (8, 300, 1000), True),
                 ("matmul", torch.float64, (4, 9, 11), False),
                 ("matmul", torch.float32, (512, 8, 784), True),  # g^T @ x at batch 8: a short sum
                 ("matmul", torch.float64, (40, 3, 17), False),
                 ("linear", torch.float32, (128, 512, 10), False),  # a 10-class head at batch 128: serial
                 ("matmul", torch.float32, (128, 10, 512), False),  # its input gradient: a serial short sum
                 ("matmul", torch.float32, (64, 9, 4500), True),  # a 1-channel 3x3 convolution: wide short sum
                 ("matmul", torch.float64, (9, 5, 4097), False)]  # a partial last block of columns


@pytest.mark.parametrize("op,dtype,shape,parallel", SMALL_MATMULS)
def test_small_matmul_shapes_run_as_a_generated_loop(op, dtype, shape, parallel):
    m, k, n = shape
    rng = np.random.default_rng(8)
    w_shape = (n, k) if op == "linear" else (k, n)
    inputs = {"x": torch.from_numpy(rng.standard_normal((m, k)).astype(dtype.np)),
              "w": torch.from_numpy(rng.standard_normal(w_shape).astype(dtype.np)),
              "bias": torch.from_numpy(rng.standard_normal(n).astype(dtype.np))}

    def build(g, x, w, bias):
        return [call(g, "relu", call(g, "add", call(g, op, x, w), bias))]

    case, kernel = compiled(("few_rows", op, dtype.name, shape),
                            lambda: Case(inputs, build, kind="matmul", name=f"few_{op}"))
    assert schedule(case.kernel).form != "blas" and schedule(case.kernel).parallel == parallel
    assert kernel.parallel == parallel
    assert not parallel or m * k * n >= PARALLEL_MIN_ELEMENTS
    (got,), (want,) = kernel.run(case.inputs), case.expected()
    assert_close(got, want, dict(rtol=1e-4, atol=1e-4) if dtype is torch.float32 else TOL["float64"])


@pytest.mark.parametrize("dtype,kdim", [(torch.float64, 1), (torch.float64, 3), (torch.float32, 4),
                                         (torch.float64, 7), (torch.float32, 64)])
def test_small_batched_matmuls_sum_every_k_with_or_without_a_remainder(dtype, kdim):
    # the loop adds 4 rows of b per sweep over an output row, then the rest one at a time
    rng = np.random.default_rng(kdim)
    inputs = {"a": torch.from_numpy(rng.standard_normal((2, 5, kdim)).astype(dtype.np)),
              "b": torch.from_numpy(rng.standard_normal((2, kdim, 9)).astype(dtype.np))}
    case, kernel = compiled(("batched_small", dtype.name, kdim),
                            lambda: Case(inputs, lambda g, a, b: [call(g, "matmul", a, b)], kind="matmul",
                                         name="bmm_small"))
    assert schedule(case.kernel).form == "batched_small"
    (got,), (want,) = kernel.run(case.inputs), case.expected()
    assert_close(got, want, dict(rtol=1e-5, atol=1e-5) if dtype is torch.float32 else TOL["float64"])


def test_matmul_with_more_rows_and_a_longer_sum_goes_to_blas():
    rng = np.random.default_rng(9)
    inputs = {"a": torch.from_numpy(rng.standard_normal((FEW_ROWS + 1, FEW_COLUMNS + 1)).astype(np.float32)),
              "b": torch.from_numpy(rng.standard_normal((FEW_COLUMNS + 1, 6)).astype(np.float32))}
    case, kernel = compiled(("blas_matmul",), lambda: Case(inputs, lambda g, a, b: [call(g, "matmul", a, b)],
                                                         kind="matmul", name="blas_matmul"))
    assert schedule(case.kernel).form == "blas"
    (got,), (want,) = kernel.run(case.inputs), case.expected()
    assert_close(got, want, dict(rtol=1e-5, atol=1e-5))


def test_batched_matmul_is_an_output_and_feeds_an_epilogue():
    rng = np.random.default_rng(7)
    inputs = {"a": torch.from_numpy(rng.standard_normal((2, 8, 12)).astype(np.float32)),
              "b": torch.from_numpy(rng.standard_normal((12, 10)).astype(np.float32)),
              "c": torch.from_numpy(rng.standard_normal((2, 12, 10)).astype(np.float32))}

    def build(g, a, b, c):
        mm = call(g, "matmul", a, b)
        mm3 = call(g, "matmul", a, c)
        return [mm, call(g, "sigmoid", call(g, "mul", mm, 2.0)), call(g, "sub", mm3, mm)]

    def make():
        case = Case(inputs, build, kind="matmul", name="bmm")
        # two kernels: mm (+ its epilogue), and the batched a @ c with an epilogue reading mm as an input
        mm, mm3, mul, sig, sub = case.kernel.nodes
        ph = case.placeholders
        k1 = Kernel("bmm_a", "matmul", [mm, mul, sig], [ph["a"], ph["b"]], [mm, sig], (2, 8, 10))
        k2 = Kernel("bmm_b", "matmul", [mm3, sub], [ph["a"], ph["c"], mm], [sub], (2, 8, 10))
        return case, compile_kernel(k1), compile_kernel(k2)

    if "bmm" not in _compiled:
        _compiled["bmm"] = make()
    case, k1, k2 = _compiled["bmm"]
    a, b, c = case.inputs
    want = case.expected()
    mm, sig = k1.run([a, b])
    assert_close(mm, want[0], dict(rtol=1e-5, atol=1e-5))
    assert_close(sig, want[1], dict(rtol=1e-5, atol=1e-5))
    (diff,) = k2.run([a, c, mm])
    assert_close(diff, want[2], dict(rtol=1e-5, atol=1e-5))


# ---------------------------------------------------------------------------------------------------------------
# Errors and the disk cache
# ---------------------------------------------------------------------------------------------------------------

def test_unsupported_kernels_raise_kernel_compile_error():
    x = torch.randn(3, 4).to(torch.float16)
    case = Case({"x": x}, lambda g, x: [call(g, "exp", x)], name="half_exp")
    with pytest.raises(KernelCompileError, match="half_exp.*float16"):
        compile_kernel(case.kernel)
    case = Case({"x": torch.randn(3, 4)}, lambda g, x: [call(g, "cat", x, x, dim=0)], name="cat_kernel")
    with pytest.raises(KernelCompileError, match="cat_kernel.*cat"):
        compile_kernel(case.kernel)
    case.kernel.kind = "opaque"
    with pytest.raises(KernelCompileError, match="cat_kernel.*opaque"):
        compile_kernel(case.kernel)


_CACHE_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import nnc, runtime as torch
    from nnc.graph import Graph
    from nnc.kernel import Kernel
    from nnc.passes import propagate_shapes
    from nnc.prims import prims
    from nnc.codegen.cpu import compile_kernel

    def kernel(name, rows, op):
        g = Graph()
        x, b = g.placeholder("x"), g.placeholder("b")
        h = g.call_function(prims.add, (x, b))
        y = g.call_function(prims.mul, (g.call_function(prims[op], (h,)), 3.0))
        g.output((y,))
        gm = nnc.GraphModule(torch.nn.Module(), g)
        X, B = torch.randn(rows, 300), torch.randn(300)
        propagate_shapes(gm, X, B)
        compiled = compile_kernel(Kernel(name, "elementwise", [n for n in g.nodes if n.op == "call_function"],
                                         [x, b], [y], (rows, 300)))
        want = nnc.Interpreter(gm).run(X, B)[0].numpy()
        ok = bool(np.allclose(compiled.run([X.numpy(), B.numpy()])[0], want, rtol=1e-6, atol=1e-7))
        return {"cache_hit": compiled.cache_hit, "seconds": compiled.compile_seconds, "ok": ok,
                "path": str(compiled.path)}

    # the first kernel of a process also pays numba's one-time start-up (~0.5 s: its typing registries, scipy)
    warm_up = kernel("warm_up", 4, "relu")
    print(json.dumps(dict(kernel("cached", 300, "tanh"), warm_up=warm_up)))
""")


def test_second_process_loads_the_kernel_from_the_disk_cache(tmp_path):
    env = dict(os.environ, NNC_CACHE_DIR=str(tmp_path / "kernels"))
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", _CACHE_SCRIPT], env=env, capture_output=True, text=True,
                              timeout=120, cwd=os.path.dirname(os.path.dirname(__file__)))
        assert done.returncode == 0, done.stderr
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["ok"] and second["ok"] and first["warm_up"]["ok"] and second["warm_up"]["ok"]
    assert first["cache_hit"] is False and first["warm_up"]["cache_hit"] is False, runs
    assert second["cache_hit"] is True and second["warm_up"]["cache_hit"] is True, runs
    assert first["path"] == second["path"] and first["path"].startswith(str(tmp_path / "kernels"))
    assert any((tmp_path / "kernels" / "__pycache__").glob("*.nbi"))  # numba's index next to the source
    print(f"\ncompile_kernel: first process {first['seconds']:.3f} s (+{first['warm_up']['seconds']:.3f} s for its "
          f"first kernel), second process {second['seconds']:.3f} s (+{second['warm_up']['seconds']:.3f} s)")
