"""Vectorizable approximations of exp, log, log1p, tanh, sigmoid and erf for generated numba kernels.

The PyPI llvmlite has no vector math library (SVML), so `math.exp` & co. inside a numba loop stay scalar libm
calls and the whole loop stays scalar. The functions here are branch-free float arithmetic plus integer bit
tricks, which LLVM inlines into the caller's loop and vectorizes (8 or 16 float32 lanes per instruction).

One function per (name, dtype): `exp_f32`, `exp_f64`, ..., `erf_f64`. The code generator picks one with
`approx_function(name, dtype)` (or `APPROX[name][dtype]`); `NAMESPACE` maps every function's name to it for
generated source. Each function casts its argument to its own dtype first and computes in that dtype.

Stated maximum errors, asserted by tests/test_approx.py on dense samples: max relative error |got - want| / |want|
over results that are normal numbers, against float64 numpy (and math.erf). Subnormal results are within one
subnormal step (2**-149, 2**-1074) of the correctly rounded result. The float32 bounds are slightly above the
maxima of exhaustive runs over all 2**32 float32 inputs, compiled with FMA and without (in parentheses: with /
without); the float64 ones above the maxima of 35M-45M samples per function. 1 ulp is 6e-8..1.2e-7 relative
in float32 and 1.1e-16..2.2e-16 in float64.

    function   float32 stated  (exhaustive max)        float64 stated  (sampled max)
    exp        1.0e-7          (8.5e-8 / 8.2e-8)       4e-16           (2.2e-16)
    log        1.0e-7          (8.2e-8 / 8.1e-8)       4e-16           (2.2e-16)
    log1p      1.0e-7          (8.2e-8 / 8.2e-8)       4e-16           (2.2e-16)
    tanh       3.5e-7          (3.0e-7)                6e-16           (4.2e-16)
    sigmoid    2.0e-7          (1.8e-7 / 1.8e-7)       5e-16           (3.3e-16)
    erf        1.1e-7          (8.9e-8 / 1.0e-7)       1e-15           (6.7e-16)
               (absolute error of erf float32: 7.0e-8 / 7.8e-8, stated 1e-7; tanh float32 is a rational fit,
               its exhaustive maximum from numba's default code generation)

Special values follow numpy: exp(-inf) = 0, exp(inf) = inf, overflow to inf / underflow through subnormals to
0 at numpy's thresholds; log(0) = -inf, log(x < 0) = nan, log(inf) = inf; log1p(-1) = -inf, log1p(x < -1) = nan;
tanh(+-inf) = +-1, sigmoid(+inf) = 1, sigmoid(-inf) = 0, erf(+-inf) = +-1; nan propagates everywhere; the sign
of zero is kept where numpy keeps it (exp/log excepted, which have no signed-zero results).
"""
from __future__ import annotations

import numba
import numpy as np

__all__ = ["APPROX", "NAMESPACE", "approx_function", "approx_name", "DTYPE_SUFFIX",
           "exp_f32", "log_f32", "log1p_f32", "tanh_f32", "sigmoid_f32", "erf_f32",
           "exp_f64", "log_f64", "log1p_f64", "tanh_f64", "sigmoid_f64", "erf_f64"]

# NOTE: how vectorization was verified, and what blocks it. tests/test_approx.py compiles a
# `numba.njit(parallel=True)` prange loop over each function and checks its LLVM IR
# (`dispatcher.inspect_llvm(sig)`): vector types (`<16 x float>`, `<8 x double>` on this AVX-512
# machine; its asm for exp_f32 is vfmadd213ps/vpslld/vpaddd on %zmm registers), no call left to the
# function, and no libm call or libm-backed intrinsic. The last part matters: a loop over math.exp
# also shows `<16 x float>` in the IR, as a call to `llvm.exp.v16f32`, which the backend splits into
# 16 scalar expf calls because there is no SVML. Measured causes of scalar or slower code:
#   - Python float literals: numba types `x * 0.5` with float32 x as float64, so a float32 function
#     silently computes in float64 (half the lanes, conversions). Every constant here is a module-level
#     np.float32/np.float64, which numba freezes as a constant of that type.
#   - math.floor()/int(): they give int64, and `k * ln2` then promotes to float64 (seen as vcvtps2pd
#     in the asm). Rounding uses the 1.5*2**23 (1.5*2**52) magic-number trick instead, which also
#     leaves k in the low bits for building 2**k.
#   - error_model='python' (njit's default) adds a zero check raising ZeroDivisionError to every float
#     division: a branch out of the loop. Hence error_model='numpy' here.
#   - The LLVM inliner's size threshold: erf_f64 stayed an out-of-line call (so its loop stayed scalar)
#     until `forceinline=True`, which gives every function here LLVM's `alwaysinline` attribute.
#   - numba's own `inline='always'` inlines the numba IR instead, which then gets the caller's flags: a
#     copy of exp_f32 inlined that way into a fastmath=True loop lost its nan results and gave wrong
#     values (max relative error inf). forceinline keeps each function compiled
#     with its own flags (fastmath and error_model are set explicitly, so they are not inherited from
#     the caller) and LLVM inlines the result with its instruction flags; a fastmath=True caller is
#     covered by a test.
#   - Branches: each range split computes every piece and picks one with a conditional expression
#     (-> `select`, vblendmps); nan falls through because comparisons with nan are false. (An
#     early-return `if` version of exp_f32 was if-converted and vectorized too; the conditional
#     expressions just leave LLVM nothing to prove.)
# Scalar float<->int reinterpretation is `np.float32(x).view(np.int32)`: numba accepts `.view` only on
# an explicit np.<dtype>(...) wrapper and lowers it to a bitcast. numba widens int32 arithmetic to
# int64; the np.int32(...) around the result lets LLVM narrow it back to 32-bit lanes (vpslld above).
_FLAGS = dict(fastmath={"contract"}, error_model="numpy", forceinline=True, nogil=True, no_cfunc_wrapper=True,
              cache=True)
# NOTE: cache=True: every process (each compile helper too) compiled these anew (exp_f32 0.24 s, log_f32 0.23 s);
# a cached one still links into its callers as bitcode, so LLVM inlines and vectorizes it as before.
# NOTE: 'contract' (fused multiply-add) is the only fast-math flag: FMA only removes roundings, which
# neither the Cody-Waite reductions nor the magic-number rounding depend on. The float32 bounds were
# measured exhaustively both with it and with fastmath=False (no FMA hardware behaves like the latter).
# nnan/ninf/reassoc would break the special values and the rounding trick.


def _approx(fn):
    return numba.njit(**_FLAGS)(fn)


_F = np.float32
_D = np.float64
_I32 = np.int32
_I64 = np.int64

# ---------------------------------------------------------------------------------------------------------------
# float32
# ---------------------------------------------------------------------------------------------------------------

_ONE_F = _F(1.0)
_TWO_F = _F(2.0)
_HALF_F = _F(0.5)
_ZERO_F = _F(0.0)
_INF_F = _F(np.inf)
_NAN_F = _F(np.nan)

# exp: x = k*ln2 + r, |r| <= ln2/2, exp(r) = 1 + r + r^2*P(r) (Cephes expf's minimax P), 2^k built in two
# halves so that k in [-150, 128] (all of float32's range, subnormals included) never leaves the exponent field.
_EXP_LO_F = _F(-104.0)     # exp(-104) < 2**-150: rounds to 0, as for every x below it
_EXP_HI_F = _F(89.0)       # exp(89) > FLT_MAX: inf, as for every x above it
_LOG2E_F = _F(1.44269504088896341)
_RND_F = _F(12582912.0)    # 1.5 * 2**23: x + _RND_F rounds x to an integer, held in the low mantissa bits
_RND_BITS_F = 0x4B400000   # the bits of _RND_F
_LN2_HI_F = _F(0.693359375)          # 9 significant bits: k * _LN2_HI_F is exact for |k| < 2**15
_LN2_LO_F = _F(-2.12194440e-4)       # ln2 - _LN2_HI_F
_EXP_P0_F = _F(1.9875691500e-4)
_EXP_P1_F = _F(1.3981999507e-3)
_EXP_P2_F = _F(8.3334519073e-3)
_EXP_P3_F = _F(4.1665795894e-2)
_EXP_P4_F = _F(1.6666665459e-1)
_EXP_P5_F = _F(5.0000001201e-1)


@_approx
def _exp_core_f32(x):
    """exp(x) for float32 x in [-104, 89] (nan gives nan); no clamping."""
    t = x * _LOG2E_F + _RND_F
    k = t - _RND_F
    r = x - k * _LN2_HI_F
    r = r - k * _LN2_LO_F
    z = r * r
    p = (((((_EXP_P0_F * r + _EXP_P1_F) * r + _EXP_P2_F) * r + _EXP_P3_F) * r + _EXP_P4_F) * r
         + _EXP_P5_F) * z + r + _ONE_F
    ki = np.float32(t).view(np.int32) - _RND_BITS_F
    k1 = ki >> 1
    k2 = ki - k1
    s1 = np.int32((k1 + 127) << 23).view(np.float32)
    s2 = np.int32((k2 + 127) << 23).view(np.float32)
    # NOTE: p * s1 is exact (a normal number); the one rounding is in * s2, also into subnormals.
    return p * s1 * s2


@_approx
def exp_f32(x):
    """e**x in float32; max relative error 1e-7."""
    x = _F(x)
    xc = _EXP_LO_F if x < _EXP_LO_F else x
    xc = _EXP_HI_F if xc > _EXP_HI_F else xc
    return _exp_core_f32(xc)


# log: x = 2^e * m, m in [sqrt(1/2), sqrt(2)), log(x) = e*ln2 + log1p(f), f = m - 1, with Cephes logf's
# minimax polynomial log1p(f) = f - f^2/2 + f^3*P(f).
_FLT_MIN_F = _F(1.17549435e-38)
_TWO23_F = _F(8388608.0)
_SUBNORMAL_E_F = _F(23.0)
_SQRT_HALF_BITS_F = 0x3F3504F3    # bits of sqrt(1/2): subtracting them puts m in [sqrt(1/2), sqrt(2))
_LOG_P0_F = _F(7.0376836292e-2)
_LOG_P1_F = _F(-1.1514610310e-1)
_LOG_P2_F = _F(1.1676998740e-1)
_LOG_P3_F = _F(-1.2420140846e-1)
_LOG_P4_F = _F(1.4249322787e-1)
_LOG_P5_F = _F(-1.6668057665e-1)
_LOG_P6_F = _F(2.0000714765e-1)
_LOG_P7_F = _F(-2.4999993993e-1)
_LOG_P8_F = _F(3.3333331174e-1)
_TINY_LOG1P_F = _F(2.0 ** -24)    # |x| below it: log1p(x) rounds to x


@_approx
def _log_core_f32(x, c, e0):
    """log(x * 2**e0) + c for positive normal finite float32 x, a small correction c, an integral e0."""
    i = np.float32(x).view(np.int32)
    ix = i - _SQRT_HALF_BITS_F
    e = _F(ix >> 23) + e0
    m = np.int32(i - (ix & -8388608)).view(np.float32)    # -8388608 == ~0x7FFFFF: clear the mantissa bits of ix
    f = m - _ONE_F
    z = f * f
    y = ((((((((_LOG_P0_F * f + _LOG_P1_F) * f + _LOG_P2_F) * f + _LOG_P3_F) * f + _LOG_P4_F) * f
              + _LOG_P5_F) * f + _LOG_P6_F) * f + _LOG_P7_F) * f + _LOG_P8_F) * f * z
    y = y + e * _LN2_LO_F + c
    y = y - _HALF_F * z
    return (f + y) + e * _LN2_HI_F


@_approx
def log_f32(x):
    """Natural log in float32; max relative error 1e-7."""
    x = _F(x)
    sub = x < _FLT_MIN_F
    xs = x * _TWO23_F if sub else x    # subnormals: scale into the normal range first
    r = _log_core_f32(xs, _ZERO_F, -_SUBNORMAL_E_F if sub else _ZERO_F)
    r = r if x < _INF_F else x         # inf -> inf, nan -> nan
    r = -_INF_F if x == _ZERO_F else r
    return _NAN_F if x < _ZERO_F else r


@_approx
def log1p_f32(x):
    """log(1 + x) in float32; max relative error 1e-7."""
    x = _F(x)
    u = x + _ONE_F
    # NOTE: c = (1 + x - u) / u corrects for the rounding of u (fdlibm's log1p); u - 1 is exact for u < 2.
    c = _ONE_F - (u - x) if u >= _TWO_F else x - (u - _ONE_F)
    r = _log_core_f32(u, c / u, _ZERO_F)
    r = r if x < _INF_F else x         # inf -> inf, nan -> nan
    r = -_INF_F if x == -_ONE_F else r
    r = _NAN_F if x < -_ONE_F else r
    return x if abs(x) < _TINY_LOG1P_F else r    # keeps -0.0


# tanh: |x| < 9: x * P(x^2) / Q(x^2), a rational fit of tanh(x)/x on [0, 9] made for this file (relative error,
# Chebyshev basis in (x/9)^2, Sanathanan-Koerner iterations with Lawson weights; 6.6e-9 in exact arithmetic, the
# stated 3.5e-7 is float32 evaluation, largest near |x| = 7.3); from 9 on tanh rounds to +-1 in float32.
# NOTE: one division and no exp, where 1 - 2/(exp(2|x|) + 1) plus a small-|x| polynomial computed both pieces and
# a division: the chain benchmark's forward 2.65 -> 1.95 ms, its backward 3.85 -> 3.1 ms (tools/bench_compile.py).
_TANH_EDGE_F = _F(9.0)
_TANH_P_F = tuple(_F(c) for c in (1.0, 0.13084007799625397, 0.003103953553363681, 1.1154279491165653e-05,
                                  -2.02251051462099e-08, 5.277886808152665e-11, -8.488542036161686e-14))
_TANH_Q_F = tuple(_F(c) for c in (1.0, 0.4641733467578888, 0.024495167657732964, 0.0002546141331549734))
_TP0, _TP1, _TP2, _TP3, _TP4, _TP5, _TP6 = _TANH_P_F
_TQ0, _TQ1, _TQ2, _TQ3 = _TANH_Q_F


@_approx
def tanh_f32(x):
    """tanh in float32; max relative error 3.5e-7."""
    x = _F(x)
    z = x * x
    p = (((((_TP6 * z + _TP5) * z + _TP4) * z + _TP3) * z + _TP2) * z + _TP1) * z + _TP0
    q = ((_TQ3 * z + _TQ2) * z + _TQ1) * z + _TQ0
    r = x * (p / q)
    r = _ONE_F if r > _ONE_F else r    # rounding may step past 1 near the edge
    r = -_ONE_F if r < -_ONE_F else r
    r = _ONE_F if x >= _TANH_EDGE_F else r
    return -_ONE_F if x <= -_TANH_EDGE_F else r    # nan: comparisons false, r is nan


@_approx
def sigmoid_f32(x):
    """1 / (1 + e**-x) in float32; max relative error 2e-7."""
    x = _F(x)
    # NOTE: e = exp(-|x|) <= 1 never overflows; e/(1+e) for x < 0 keeps the tiny results accurate.
    t = -abs(x)
    t = _EXP_LO_F if t < _EXP_LO_F else t
    e = _exp_core_f32(t)
    num = e if x < _ZERO_F else _ONE_F
    return num / (_ONE_F + e)


# erf: |x| < 0.875: x + x*P(x^2); above: 1 - exp(L(|x|) - x^2) with L(x) = log(erfc(x)) + x^2 fitted on
# [0.875, 3.92] (a polynomial in |x| - 2.3975); erf rounds to 1 in float32 from 3.84 on. Both fits are
# minimax fits made for this file with float32 coefficients (least squares + Lawson iterations).
_ERF_SPLIT_F = _F(0.875)
_ERF_CLAMP_F = _F(3.92)
_ERF_CENTER_F = _F(2.3975)
_ERF_S0_F = _F(0.12837915122509003)
_ERF_S1_F = _F(-0.3761255145072937)
_ERF_S2_F = _F(0.11282455176115036)
_ERF_S3_F = _F(-0.026791462674736977)
_ERF_S4_F = _F(0.005032180808484554)
_ERF_S5_F = _F(-0.0006203252705745399)
_ERF_L0_F = _F(-1.520064115524292)
_ERF_L1_F = _F(-0.36453428864479065)
_ERF_L2_F = _F(0.05958646163344383)
_ERF_L3_F = _F(-0.011792074888944626)
_ERF_L4_F = _F(0.0023932575713843107)
_ERF_L5_F = _F(-0.0004708045453298837)
_ERF_L6_F = _F(8.738309406908229e-05)
_ERF_L7_F = _F(-1.4623458810092416e-05)
_ERF_L8_F = _F(1.6201469179577543e-06)


@_approx
def erf_f32(x):
    """The error function in float32; max relative error 1.1e-7, max absolute error 1e-7."""
    x = _F(x)
    ax = abs(x)
    z = x * x
    small = x + x * (((((_ERF_S5_F * z + _ERF_S4_F) * z + _ERF_S3_F) * z + _ERF_S2_F) * z + _ERF_S1_F) * z
                     + _ERF_S0_F)
    a = _ERF_CLAMP_F if ax > _ERF_CLAMP_F else ax
    u = a - _ERF_CENTER_F
    q = (((((((_ERF_L8_F * u + _ERF_L7_F) * u + _ERF_L6_F) * u + _ERF_L5_F) * u + _ERF_L4_F) * u + _ERF_L3_F) * u
          + _ERF_L2_F) * u + _ERF_L1_F) * u + _ERF_L0_F
    big = _ONE_F - _exp_core_f32(q - a * a)
    big = -big if x < _ZERO_F else big
    return big if ax >= _ERF_SPLIT_F else small    # nan: comparison false, small is nan


# ---------------------------------------------------------------------------------------------------------------
# float64: the same algorithms with float64 polynomials (vectorizable, 4 or 8 lanes)
# ---------------------------------------------------------------------------------------------------------------

_ONE_D = _D(1.0)
_TWO_D = _D(2.0)
_HALF_D = _D(0.5)
_ZERO_D = _D(0.0)
_INF_D = _D(np.inf)
_NAN_D = _D(np.nan)

_EXP_LO_D = _D(-746.0)    # exp(-746) < 2**-1075: rounds to 0
_EXP_HI_D = _D(710.0)     # exp(710) > DBL_MAX: inf
_LOG2E_D = _D(1.4426950408889634)
_RND_D = _D(6755399441055744.0)    # 1.5 * 2**52
_RND_BITS_D = 0x4338000000000000
_LN2_HI_D = _D(6.93147180369123816490e-01)    # fdlibm's split of ln2: the high part has 32 significant bits
_LN2_LO_D = _D(1.90821492927058770002e-10)
# exp(r) = 1 + r + r^2 * (1/2! + r/3! + ... + r^11/13!): the Taylor tail is below 3e-18 relative for |r| <= ln2/2.
_EXP_C2_D = _D(1.0 / 2)
_EXP_C3_D = _D(1.0 / 6)
_EXP_C4_D = _D(1.0 / 24)
_EXP_C5_D = _D(1.0 / 120)
_EXP_C6_D = _D(1.0 / 720)
_EXP_C7_D = _D(1.0 / 5040)
_EXP_C8_D = _D(1.0 / 40320)
_EXP_C9_D = _D(1.0 / 362880)
_EXP_C10_D = _D(1.0 / 3628800)
_EXP_C11_D = _D(1.0 / 39916800)
_EXP_C12_D = _D(1.0 / 479001600)
_EXP_C13_D = _D(1.0 / 6227020800)


@_approx
def _exp_core_f64(x):
    """exp(x) for float64 x in [-746, 710] (nan gives nan); no clamping."""
    t = x * _LOG2E_D + _RND_D
    k = t - _RND_D
    r = x - k * _LN2_HI_D
    r = r - k * _LN2_LO_D
    q = ((((((((((_EXP_C13_D * r + _EXP_C12_D) * r + _EXP_C11_D) * r + _EXP_C10_D) * r + _EXP_C9_D) * r
               + _EXP_C8_D) * r + _EXP_C7_D) * r + _EXP_C6_D) * r + _EXP_C5_D) * r + _EXP_C4_D) * r
         + _EXP_C3_D) * r + _EXP_C2_D
    p = _ONE_D + (r + r * r * q)
    ki = np.float64(t).view(np.int64) - _RND_BITS_D
    k1 = ki >> 1
    k2 = ki - k1
    s1 = np.int64((k1 + 1023) << 52).view(np.float64)
    s2 = np.int64((k2 + 1023) << 52).view(np.float64)
    return p * s1 * s2


@_approx
def exp_f64(x):
    """e**x in float64; max relative error 4e-16."""
    x = _D(x)
    xc = _EXP_LO_D if x < _EXP_LO_D else x
    xc = _EXP_HI_D if xc > _EXP_HI_D else xc
    return _exp_core_f64(xc)


# log: fdlibm's e_log.c / s_log1p.c: f = m - 1, s = f/(2+f), log1p(f) = f - f^2/2 + s*(f^2/2 + R(s^2)).
_DBL_MIN_D = _D(2.2250738585072014e-308)
_TWO54_D = _D(18014398509481984.0)
_SUBNORMAL_E_D = _D(54.0)
_SQRT_HALF_BITS_D = 0x3FE6A09E667F3BCD    # bits of sqrt(1/2)
_LG1_D = _D(6.666666666666735130e-01)
_LG2_D = _D(3.999999999940941908e-01)
_LG3_D = _D(2.857142874366239149e-01)
_LG4_D = _D(2.222219843214978396e-01)
_LG5_D = _D(1.818357216161805012e-01)
_LG6_D = _D(1.531383769920937332e-01)
_LG7_D = _D(1.479819860511658591e-01)
_TINY_LOG1P_D = _D(2.0 ** -54)


@_approx
def _log_core_f64(x, c, e0):
    """log(x * 2**e0) + c for positive normal finite float64 x, a small correction c, an integral e0."""
    i = np.float64(x).view(np.int64)
    ix = i - _SQRT_HALF_BITS_D
    e = _D(ix >> 52) + e0
    m = np.int64(i - (ix & -4503599627370496)).view(np.float64)    # -4503599627370496 == ~(2**52 - 1)
    f = m - _ONE_D
    hfsq = _HALF_D * f * f
    s = f / (_TWO_D + f)
    z = s * s
    w = z * z
    t1 = w * (_LG2_D + w * (_LG4_D + w * _LG6_D))
    t2 = z * (_LG1_D + w * (_LG3_D + w * (_LG5_D + w * _LG7_D)))
    r = t2 + t1
    return e * _LN2_HI_D - ((hfsq - (s * (hfsq + r) + (e * _LN2_LO_D + c))) - f)


@_approx
def log_f64(x):
    """Natural log in float64; max relative error 4e-16."""
    x = _D(x)
    sub = x < _DBL_MIN_D
    xs = x * _TWO54_D if sub else x
    r = _log_core_f64(xs, _ZERO_D, -_SUBNORMAL_E_D if sub else _ZERO_D)
    r = r if x < _INF_D else x
    r = -_INF_D if x == _ZERO_D else r
    return _NAN_D if x < _ZERO_D else r


@_approx
def log1p_f64(x):
    """log(1 + x) in float64; max relative error 4e-16."""
    x = _D(x)
    u = x + _ONE_D
    c = _ONE_D - (u - x) if u >= _TWO_D else x - (u - _ONE_D)
    r = _log_core_f64(u, c / u, _ZERO_D)
    r = r if x < _INF_D else x
    r = -_INF_D if x == -_ONE_D else r
    r = _NAN_D if x < -_ONE_D else r
    return x if abs(x) < _TINY_LOG1P_D else r


# tanh: |x| < 0.625: Cephes tanh's x + x^3 * P(x^2)/Q(x^2); above: 1 - 2/(exp(2|x|) + 1).
_TANH_SPLIT_D = _D(0.625)
_TANH_CLAMP_D = _D(40.0)    # tanh(20) rounds to 1 in float64
_TANH_P0_D = _D(-9.64399179425052238628e-1)
_TANH_P1_D = _D(-9.92877231001918586564e1)
_TANH_P2_D = _D(-1.61468768441708447952e3)
_TANH_Q1_D = _D(1.12811678491632931402e2)
_TANH_Q2_D = _D(2.23548839060100448583e3)
_TANH_Q3_D = _D(4.84406305325125486048e3)


@_approx
def tanh_f64(x):
    """tanh in float64; max relative error 6e-16."""
    x = _D(x)
    ax = abs(x)
    z = x * x
    small = x + x * z * (((_TANH_P0_D * z + _TANH_P1_D) * z + _TANH_P2_D)
                         / (((z + _TANH_Q1_D) * z + _TANH_Q2_D) * z + _TANH_Q3_D))
    t = ax + ax
    t = _TANH_CLAMP_D if t > _TANH_CLAMP_D else t
    big = _ONE_D - _TWO_D / (_exp_core_f64(t) + _ONE_D)
    big = -big if x < _ZERO_D else big
    small = x if x == _ZERO_D else small    # tanh(-0.0) = -0.0
    return big if ax >= _TANH_SPLIT_D else small


@_approx
def sigmoid_f64(x):
    """1 / (1 + e**-x) in float64; max relative error 5e-16."""
    x = _D(x)
    t = -abs(x)
    t = _EXP_LO_D if t < _EXP_LO_D else t
    e = _exp_core_f64(t)
    num = e if x < _ZERO_D else _ONE_D
    return num / (_ONE_D + e)


# erf: W. J. Cody's rational approximations (the coefficients of runtime/_special.py, SPECFUN's CALERF):
# |x| <= 0.46875: x*R(x^2); <= 4: 1 - exp(-x^2)*R(|x|); < 6: 1 - exp(-x^2)/|x|*(1/sqrt(pi) - R(1/x^2)/x^2);
# erf rounds to +-1 beyond. All three are computed and the right one selected.
_ERF_SMALL_END_D = _D(0.46875)
_ERF_MID_END_D = _D(4.0)
_ERF_CLAMP_D = _D(6.0)
_INV_SQRT_PI_D = _D(5.6418958354775628695e-1)
_ERF_A0_D = _D(1.85777706184603153e-1)
_ERF_A1_D = _D(3.16112374387056560e00)
_ERF_A2_D = _D(1.13864154151050156e02)
_ERF_A3_D = _D(3.77485237685302021e02)
_ERF_A4_D = _D(3.20937758913846947e03)
_ERF_B1_D = _D(2.36012909523441209e01)
_ERF_B2_D = _D(2.44024637934444173e02)
_ERF_B3_D = _D(1.28261652607737228e03)
_ERF_B4_D = _D(2.84423683343917062e03)
_ERF_C0_D = _D(2.15311535474403846e-8)
_ERF_C1_D = _D(5.64188496988670089e-1)
_ERF_C2_D = _D(8.88314979438837594e00)
_ERF_C3_D = _D(6.61191906371416295e01)
_ERF_C4_D = _D(2.98635138197400131e02)
_ERF_C5_D = _D(8.81952221241769090e02)
_ERF_C6_D = _D(1.71204761263407058e03)
_ERF_C7_D = _D(2.05107837782607147e03)
_ERF_C8_D = _D(1.23033935479799725e03)
_ERF_D1_D = _D(1.57449261107098347e01)
_ERF_D2_D = _D(1.17693950891312499e02)
_ERF_D3_D = _D(5.37181101862009858e02)
_ERF_D4_D = _D(1.62138957456669019e03)
_ERF_D5_D = _D(3.29079923573345963e03)
_ERF_D6_D = _D(4.36261909014324716e03)
_ERF_D7_D = _D(3.43936767414372164e03)
_ERF_D8_D = _D(1.23033935480374942e03)
_ERF_P0_D = _D(1.63153871373020978e-2)
_ERF_P1_D = _D(3.05326634961232344e-1)
_ERF_P2_D = _D(3.60344899949804439e-1)
_ERF_P3_D = _D(1.25781726111229246e-1)
_ERF_P4_D = _D(1.60837851487422766e-2)
_ERF_P5_D = _D(6.58749161529837803e-4)
_ERF_Q1_D = _D(2.56852019228982242e00)
_ERF_Q2_D = _D(1.87295284992346047e00)
_ERF_Q3_D = _D(5.27905102951428412e-1)
_ERF_Q4_D = _D(6.05183413124413191e-2)
_ERF_Q5_D = _D(2.33520497626869185e-3)


@_approx
def erf_f64(x):
    """The error function in float64; max relative error 1e-15."""
    x = _D(x)
    ax = abs(x)
    z = x * x
    small = x * ((((_ERF_A0_D * z + _ERF_A1_D) * z + _ERF_A2_D) * z + _ERF_A3_D) * z + _ERF_A4_D) \
        / ((((z + _ERF_B1_D) * z + _ERF_B2_D) * z + _ERF_B3_D) * z + _ERF_B4_D)
    y = _ERF_CLAMP_D if ax > _ERF_CLAMP_D else ax
    mid = (((((((_ERF_C0_D * y + _ERF_C1_D) * y + _ERF_C2_D) * y + _ERF_C3_D) * y + _ERF_C4_D) * y + _ERF_C5_D) * y
            + _ERF_C6_D) * y + _ERF_C7_D) * y + _ERF_C8_D
    mid = mid / (((((((((y + _ERF_D1_D) * y + _ERF_D2_D) * y + _ERF_D3_D) * y + _ERF_D4_D) * y + _ERF_D5_D) * y
                    + _ERF_D6_D) * y + _ERF_D7_D) * y + _ERF_D8_D))
    w = _ONE_D / (y * y)
    tail = ((((_ERF_P0_D * w + _ERF_P1_D) * w + _ERF_P2_D) * w + _ERF_P3_D) * w + _ERF_P4_D) * w + _ERF_P5_D
    tail = tail / (((((w + _ERF_Q1_D) * w + _ERF_Q2_D) * w + _ERF_Q3_D) * w + _ERF_Q4_D) * w + _ERF_Q5_D)
    tail = (_INV_SQRT_PI_D - tail * w) / y
    ratio = mid if y <= _ERF_MID_END_D else tail
    big = _ONE_D - _exp_core_f64(-(y * y)) * ratio
    big = -big if x < _ZERO_D else big
    return small if ax <= _ERF_SMALL_END_D else big    # nan: comparison false, big is nan


# ---------------------------------------------------------------------------------------------------------------
# lookup for the code generator
# ---------------------------------------------------------------------------------------------------------------

# The dtypes with approximations and the suffix of their function names (float16 etc. are not supported:
# compute in float32 and cast).
DTYPE_SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}

# Every function by its name, for exec'ing generated source that calls e.g. `exp_f32(t0)`.
NAMESPACE = {f.__name__: f for f in (exp_f32, log_f32, log1p_f32, tanh_f32, sigmoid_f32, erf_f32,
                                     exp_f64, log_f64, log1p_f64, tanh_f64, sigmoid_f64, erf_f64)}

# APPROX[template function name][np.dtype] -> the function.
APPROX = {name: {dtype: NAMESPACE[f"{name}_{suffix}"] for dtype, suffix in DTYPE_SUFFIX.items()}
          for name in ("exp", "log", "log1p", "tanh", "sigmoid", "erf")}


def approx_name(name: str, dtype) -> str:
    """The NAMESPACE key of the approximation of `name` computing in `dtype` (float32 or float64)."""
    if name not in APPROX:
        raise KeyError(f"no approximation for {name!r}; have {sorted(APPROX)}")
    try:
        suffix = DTYPE_SUFFIX[np.dtype(dtype)]
    except (KeyError, TypeError):
        raise TypeError(f"{name}: approximations compute in float32 or float64, not {dtype!r}") from None
    return f"{name}_{suffix}"


def approx_function(name: str, dtype):
    """The numba function computing `name` ("exp", "log", ...) in `dtype` (float32 or float64)."""
    return NAMESPACE[approx_name(name, dtype)]
