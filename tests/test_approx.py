"""Tests for nnc.codegen.approx: accuracy against float64 references, special values, vectorization, lookup."""
from __future__ import annotations

import math
import re
import zlib

import numpy as np
import pytest
from numba import njit, prange

from nnc.codegen import approx
from nnc.codegen.approx import APPROX, NAMESPACE, approx_function, approx_name

NAMES = ("exp", "log", "log1p", "tanh", "sigmoid", "erf")
F32, F64 = np.dtype(np.float32), np.dtype(np.float64)

# The stated bounds of the module docstring: max relative error over normal results (erf float32 also: absolute).
REL_BOUND = {
    ("exp", F32): 1e-7, ("log", F32): 1e-7, ("log1p", F32): 1e-7, ("tanh", F32): 3.5e-7,
    ("sigmoid", F32): 2e-7, ("erf", F32): 1.1e-7,
    ("exp", F64): 4e-16, ("log", F64): 4e-16, ("log1p", F64): 4e-16, ("tanh", F64): 6e-16,
    ("sigmoid", F64): 5e-16, ("erf", F64): 1e-15,
}
ERF_F32_ABS_BOUND = 1e-7
SUBNORMAL_STEP = {F32: 2.0 ** -149, F64: 2.0 ** -1074}

_math_erf = np.frompyfunc(math.erf, 1, 1)


def _sigmoid64(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


REFERENCE = {  # float64 references, applied to the inputs converted to float64
    "exp": np.exp, "log": np.log, "log1p": np.log1p, "tanh": np.tanh, "sigmoid": _sigmoid64,
    "erf": lambda x: _math_erf(x).astype(np.float64),
}


def reference(name, x):
    with np.errstate(all="ignore"):
        return REFERENCE[name](x.astype(np.float64))


_KERNELS: dict = {}


def kernel(name, dtype):
    """A numba parallel prange loop applying the approximation: compiled once per (name, dtype)."""
    key = (name, np.dtype(dtype))
    if key not in _KERNELS:
        fn = APPROX[name][key[1]]

        @njit(parallel=True, error_model="numpy")
        def apply(a, out):
            for i in prange(a.shape[0]):
                out[i] = fn(a[i])

        _KERNELS[key] = apply
    return _KERNELS[key]


def run(name, x):
    x = np.ascontiguousarray(x)
    out = np.empty_like(x)
    kernel(name, x.dtype)(x, out)
    return out


# ---------------------------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------------------------

def neighbours(values, dtype, n):
    """The n float values either side of each value (consecutive bit patterns), values included."""
    dtype = np.dtype(dtype)
    ibits = np.int32 if dtype == F32 else np.int64
    out = []
    for v in values:
        b = np.array([v], dtype).view(ibits)[0]
        steps = np.arange(-n, n + 1, dtype=ibits)
        if v == 0:  # walk through both signed zeros into the subnormals
            out += [np.arange(0, n, dtype=ibits).view(dtype), -np.arange(0, n, dtype=ibits).view(dtype)]
        else:
            out.append((b + steps).view(dtype))
    return np.concatenate(out)


# Per function and dtype: a dense range, and points (overflow/underflow thresholds, the pieces' split points,
# clamps) whose neighbours are all tested.
INTERESTING = {
    "exp": {F32: ((-105.0, 90.0), (88.72283935546875, -87.33654, -103.97208, -104.0, 89.0, 0.0, 1.0)),
            F64: ((-750.0, 711.0), (709.782712893384, -708.3964185322641, -745.1332191019411, -746.0, 710.0,
                                    0.0, 1.0))},
    "log": {F32: ((0.0, 4.0), (1.0, 2.0 ** -126, 0.70710678, 1.41421356, 0.0, 3.4e38)),
            F64: ((0.0, 4.0), (1.0, 2.0 ** -1022, 0.7071067811865476, 1.4142135623730951, 0.0, 1.7e308))},
    "log1p": {F32: ((-1.0, 8.0), (-1.0, -0.5, 0.0, 1.0, 2.0 ** -24, 2.0 ** 24, 3.4e38)),
              F64: ((-1.0, 8.0), (-1.0, -0.5, 0.0, 1.0, 2.0 ** -54, 2.0 ** 53, 1.7e308))},
    "tanh": {F32: ((-12.0, 12.0), (9.0, -9.0, 7.307389, -7.307389, 0.0)),
             F64: ((-22.0, 22.0), (0.625, -0.625, 19.0, 20.0, 0.0))},
    "sigmoid": {F32: ((-110.0, 40.0), (0.0, -87.33654, -103.97208, -104.0, 16.635532)),
                F64: ((-750.0, 40.0), (0.0, -708.3964185322641, -745.1332191019411, -746.0, 36.7368005696771))},
    "erf": {F32: ((-4.5, 4.5), (0.875, -0.875, 3.92, 3.8325, 0.0)),
            F64: ((-6.5, 6.5), (0.46875, -0.46875, 4.0, 5.9, 6.0, 0.0))},
}


def sample(name, dtype, n_random, n_dense, n_near):
    """Random bit patterns (every finite, subnormal, huge value; inf; nan), a dense range, thresholds."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(zlib.crc32(f"{name} {dtype}".encode()))
    ibits = np.uint32 if dtype == F32 else np.uint64
    bits = rng.integers(0, np.iinfo(ibits).max, n_random, dtype=ibits, endpoint=True)
    (lo, hi), points = INTERESTING[name][dtype]
    dense = np.linspace(lo, hi, n_dense).astype(dtype)
    return np.concatenate([bits.view(dtype), dense, neighbours(points, dtype, n_near),
                           np.array([np.inf, -np.inf, np.nan, 0.0, -0.0], dtype)])


def check(name, dtype, x, got):
    """Assert the stated bound; exact agreement on nan / inf / zero results and zero signs."""
    dtype = np.dtype(dtype)
    assert got.dtype == dtype
    want = reference(name, x)
    with np.errstate(over="ignore"):
        want_rounded = want.astype(dtype)     # correctly rounded: inf where it overflows
    nan = np.isnan(want_rounded)
    assert np.array_equal(np.isnan(got), nan), x[np.isnan(got) != nan][:5]
    special = ~nan & (np.isinf(want_rounded) | (want_rounded == 0))
    assert np.array_equal(got[special], want_rounded[special]), x[special][got[special] != want_rounded[special]][:5]
    zero = ~nan & (got == 0)
    assert np.array_equal(np.signbit(got[zero]), np.signbit(want_rounded[zero])), x[zero][:5]
    finite = ~nan & ~special
    normal = finite & (np.abs(want) >= np.finfo(dtype).tiny)
    g, w = got[normal].astype(np.float64), want[normal]
    rel = np.abs(g - w) / np.abs(w)
    bound = REL_BOUND[name, dtype]
    assert rel.max() <= bound, (rel.max(), x[normal][rel.argmax()])
    if name == "erf" and dtype == F32:
        abs_err = np.abs(g - w)
        assert abs_err.max() <= ERF_F32_ABS_BOUND, (abs_err.max(), x[normal][abs_err.argmax()])
    sub = finite & ~normal
    assert np.all(np.abs(got[sub] - want_rounded[sub]) <= SUBNORMAL_STEP[dtype]), x[sub][:5]
    return float(rel.max())


# ---------------------------------------------------------------------------------------------------------------
# accuracy
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_float32_accuracy_dense(name):
    # ~1.3M points: 2**20 random bit patterns, a 2**18 dense range, 2x1000 neighbours of each threshold.
    x = sample(name, F32, 2 ** 20, 2 ** 18, 1000)
    check(name, F32, x, run(name, x))


@pytest.mark.parametrize("name", NAMES)
def test_float64_accuracy_dense(name):
    x = sample(name, F64, 2 ** 18, 2 ** 18, 200)
    check(name, F64, x, run(name, x))


def test_float32_every_exponent():
    """Inputs 1.5 * 2**e for every float32 exponent, both signs, plus every 8th mantissa of one binade."""
    mant = np.arange(0, 2 ** 23, 8, dtype=np.uint32)
    scaled = np.ldexp(np.float32(1.5), np.arange(-149, 128)).astype(np.float32)
    for name, binade in (("exp", 0x40000000), ("log", 0x3F800000), ("log1p", 0x3F000000),
                         ("tanh", 0x3F000000), ("sigmoid", 0x40800000), ("erf", 0x3F800000)):
        x = np.concatenate([scaled, -scaled, (mant + np.uint32(binade)).view(np.float32)])
        check(name, F32, x, run(name, x))


# ---------------------------------------------------------------------------------------------------------------
# special values
# ---------------------------------------------------------------------------------------------------------------

INF, NAN = math.inf, math.nan
SPECIAL = {  # name: [(x, expected)], for both dtypes
    "exp": [(-INF, 0.0), (INF, INF), (NAN, NAN), (0.0, 1.0), (-0.0, 1.0), (1e300, INF), (-1e300, 0.0)],
    "log": [(0.0, -INF), (-0.0, -INF), (-1.0, NAN), (-INF, NAN), (INF, INF), (NAN, NAN), (1.0, 0.0)],
    "log1p": [(-1.0, -INF), (-2.0, NAN), (-INF, NAN), (INF, INF), (NAN, NAN), (0.0, 0.0), (-0.0, -0.0)],
    "tanh": [(INF, 1.0), (-INF, -1.0), (NAN, NAN), (0.0, 0.0), (-0.0, -0.0), (1e30, 1.0), (-1e30, -1.0)],
    "sigmoid": [(INF, 1.0), (-INF, 0.0), (NAN, NAN), (0.0, 0.5), (-0.0, 0.5), (1e30, 1.0), (-1e30, 0.0)],
    "erf": [(INF, 1.0), (-INF, -1.0), (NAN, NAN), (0.0, 0.0), (-0.0, -0.0), (1e30, 1.0), (-1e30, -1.0)],
}


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", NAMES)
def test_special_values(name, dtype):
    with np.errstate(over="ignore"):
        xs = np.array([x for x, _ in SPECIAL[name]], dtype)
    want = np.array([w for _, w in SPECIAL[name]], dtype)
    got = run(name, xs)
    assert np.array_equal(got, want, equal_nan=True), (xs, got)
    signed = ~np.isnan(want)  # a nan's sign bit means nothing
    assert np.array_equal(np.signbit(got[signed]), np.signbit(want[signed]))
    # the scalar functions called from Python agree with the compiled loop
    scalar = np.array([APPROX[name][dtype](x) for x in xs], dtype)
    assert np.array_equal(scalar, got, equal_nan=True)


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
def test_exp_overflow_and_underflow_thresholds(dtype):
    """The last finite / first inf result and the last nonzero / first zero result match numpy's."""
    big = 88.72283935546875 if dtype == F32 else 709.782712893384
    tiny = -103.97208 if dtype == F32 else -745.1332191019411
    x = np.concatenate([neighbours([big], dtype, 3), neighbours([tiny], dtype, 3)]).astype(dtype)
    with np.errstate(all="ignore"):
        want = np.exp(x.astype(np.float64)).astype(dtype)
    got = run("exp", x)
    assert np.array_equal(np.isinf(got), np.isinf(want)) and np.array_equal(got == 0, want == 0)
    assert np.isinf(got).any() and np.isfinite(got).any() and (got == 0).any() and (got > 0).any()


# ---------------------------------------------------------------------------------------------------------------
# vectorization
# ---------------------------------------------------------------------------------------------------------------

# NOTE: an IR vector type alone proves nothing: LLVM happily vectorizes a loop over math.exp into
# `llvm.exp.v16f32`, which the backend then splits into 16 scalar expf calls (there is no SVML to map it
# to). So the check is: vector types, and no libm call or libm-backed llvm intrinsic left in the IR.
_LIBM = re.compile(r"^(llvm\.(exp|exp2|exp10|log|log2|log10|pow|sin|cos|tan|tanh|sinh|cosh)\.|"
                   r"(exp|expf|expm1|expm1f|log|logf|log1p|log1pf|tanh|tanhf|erf|erff|erfc|erfcf|pow|powf)$)")


def vector_widths(ir, dtype):
    elem = "float" if np.dtype(dtype) == F32 else "double"
    return {int(n) for n in re.findall(r"<(\d+) x " + elem + ">", ir)}


def libm_calls(ir):
    return {c for c in re.findall(r"call [^@\n]*@\"?([\w.$]+)", ir) if _LIBM.match(c)}


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", NAMES)
def test_prange_loop_vectorizes(name, dtype):
    """The LLVM IR of a prange loop over the function has vector types and calls neither it nor libm."""
    k = kernel(name, dtype)
    x = np.linspace(-3, 3, 64).astype(dtype)
    k(x, np.empty_like(x))
    ir = k.inspect_llvm(k.signatures[0])
    widths = vector_widths(ir, dtype)
    assert widths and max(widths) >= 4, f"no vectors of {dtype} in the loop's IR: {sorted(widths)}"
    callees = set(re.findall(r"call [^@\n]*@\"?([\w.$]+)", ir))
    assert not {c for c in callees if "7codegen6approx" in c}, "the approximation was not inlined"  # mangled name
    assert not libm_calls(ir)


def test_vectorization_check_catches_libm():
    """Control for the test above: the same loop over math.exp is flagged (vector IR, but libm calls)."""
    @njit(parallel=True, error_model="numpy")
    def apply(a, out):
        for i in prange(a.shape[0]):
            out[i] = math.exp(a[i])

    x = np.linspace(-3, 3, 64).astype(np.float32)
    apply(x, np.empty_like(x))
    ir = apply.inspect_llvm(apply.signatures[0])
    if "svml" in ir.lower():
        pytest.skip("this llvmlite maps math.exp to SVML")
    assert libm_calls(ir)


def test_inlined_with_the_functions_own_flags_under_a_fastmath_caller():
    """A fastmath=True caller neither breaks the special values nor the rounding tricks (flags stay per function)."""
    @njit(fastmath=True, error_model="numpy")
    def apply(a, out):
        for i in range(a.shape[0]):
            out[i] = approx.exp_f32(a[i]) + approx.log_f32(a[i])

    x = np.array([np.nan, np.inf, 0.5, 3.0, 1e-40], np.float32)
    out = np.empty_like(x)
    apply(x, out)
    want = np.array([approx.exp_f32(v) + approx.log_f32(v) for v in x], np.float32)
    assert np.array_equal(out, want, equal_nan=True)


# ---------------------------------------------------------------------------------------------------------------
# lookup for the code generator
# ---------------------------------------------------------------------------------------------------------------

def test_lookup_tables():
    assert set(APPROX) == set(NAMES)
    for name in NAMES:
        assert set(APPROX[name]) == {F32, F64}
        for dtype, fn in APPROX[name].items():
            assert approx_function(name, dtype) is fn
            assert NAMESPACE[approx_name(name, dtype)] is fn
    assert approx_function("exp", np.float32) is approx.exp_f32
    assert approx_function("erf", "float64") is approx.erf_f64
    assert approx_name("log1p", np.dtype("float32")) == "log1p_f32"
    assert set(NAMESPACE) == {f"{n}_{s}" for n in NAMES for s in ("f32", "f64")}


def test_lookup_errors():
    with pytest.raises(KeyError, match="no approximation"):
        approx_function("cosh", np.float32)
    for bad in (np.float16, np.int32, "complex64", object):
        with pytest.raises(TypeError, match="float32 or float64"):
            approx_function("exp", bad)


def test_generated_source_through_namespace():
    """What the code generator does: source text naming NAMESPACE functions, exec'd and jitted."""
    calls = " + ".join(f"{approx_name(n, np.float32)}(v)" for n in ("exp", "tanh", "sigmoid", "erf"))
    src = ("def gen(a, out):\n"
           "    for i in prange(a.shape[0]):\n"
           "        v = a[i]\n"
           f"        out[i] = {calls} + {approx_name('log1p', np.float32)}(abs(v))\n")
    scope = dict(NAMESPACE, prange=prange)
    exec(src, scope)
    gen = njit(parallel=True, error_model="numpy")(scope["gen"])
    x = np.linspace(-5, 5, 1001).astype(np.float32)
    out = np.empty_like(x)
    gen(x, out)
    x64 = x.astype(np.float64)
    want = np.exp(x64) + np.tanh(x64) + _sigmoid64(x64) + _math_erf(x64).astype(np.float64) + np.log1p(np.abs(x64))
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
