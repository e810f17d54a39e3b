"""One-pass optimizer updates: numba loops that read each array once, where numpy takes a pass per operation.

Imported at an optimizer's first fusable update (SGD's large ones, Adam's any), so `import runtime` does not load
numba."""
from __future__ import annotations

import functools

import numpy as np
from numba import njit, prange


@njit(inline="always")
def _sgd_momentum_element(p, g, buf, i, lr, momentum, damp, weight_decay, nesterov, maximize):
    d = -g[i] if maximize else g[i]
    if weight_decay != 0:
        d = d + weight_decay * p[i]
    b = buf[i] * momentum + (damp * d if damp != 1 else d)
    buf[i] = b
    p[i] = p[i] - lr * (d + momentum * b if nesterov else b)


# NOTE: two functions, not one jitted twice: numba's disk cache keys a function by its code, not by `parallel`,
# and would hand one variant's machine code to the other.
@njit(cache=True, nogil=True)
def _sgd_momentum_serial(p, g, buf, lr, momentum, damp, weight_decay, nesterov, maximize):
    for i in range(p.size):
        _sgd_momentum_element(p, g, buf, i, lr, momentum, damp, weight_decay, nesterov, maximize)


@njit(cache=True, nogil=True, parallel=True)
def _sgd_momentum_parallel(p, g, buf, lr, momentum, damp, weight_decay, nesterov, maximize):
    for i in prange(p.size):
        _sgd_momentum_element(p, g, buf, i, lr, momentum, damp, weight_decay, nesterov, maximize)


def sgd_momentum(p, grad, buf, lr: float, momentum: float, dampening: float, weight_decay: float, nesterov: bool,
                 maximize: bool, parallel: bool = False) -> None:
    """torch's SGD step with a momentum buffer, in place on p and buf (C-contiguous arrays of one float dtype):
    the numpy sequence `d = g (+ wd*p); buf = buf*m + (1-dampening)*d; p -= lr * (nesterov ? d + m*buf : buf)`
    rounded the same way (every scalar in the arrays' dtype, one rounding per operation), in one pass. Serial and
    parallel give the same bits: each element's arithmetic is the same."""
    scalar = p.dtype.type
    kernel = _sgd_momentum_parallel if parallel else _sgd_momentum_serial
    kernel(p.reshape(-1), grad.reshape(-1), buf.reshape(-1), scalar(lr), scalar(momentum), scalar(1 - dampening),
           scalar(weight_decay), bool(nesterov), bool(maximize))


# NOTE: error_model="numpy": a division by zero gives inf/nan as numpy's does, with no exception path in the loop.
# The element function takes and returns scalars: inlined with array arguments, numba counted references to the
# arrays inside the loop (atomic increments per element, which ran the loop 10x slower).
@njit(inline="always", error_model="numpy")
def _adam_element(p, d, m, v, vmax, decay, l2, lerp_w, lerp_small, beta2, one_minus_beta2, bc2_sqrt, eps,
                  neg_step_size, maximize, amsgrad):
    """(p, m, v, vmax) after one step from gradient d (vmax is v without amsgrad)."""
    if maximize:
        d = -d
    if l2 != 0:
        d = d + l2 * p
    # torch's two-sided lerp toward d: exact at weight 0 and 1
    m = m + lerp_w * (d - m) if lerp_small else d - (d - m) * lerp_w
    v = v * beta2 + one_minus_beta2 * d * d
    vmax = np.maximum(vmax, v) if amsgrad else v
    return p * decay + (neg_step_size * m) / (np.sqrt(vmax) / bc2_sqrt + eps), m, v, vmax


# NOTE: without amsgrad the loops take no running-max array at all. One loop for both, storing v into a vmax that
# was v's own array, stored twice per element into possibly aliasing arrays: LLVM kept that loop scalar (sqrt and
# division one element at a time), 2.8 ns per element; without the second store it vectorizes: 0.4 ns (the GPT of
# tools/bench_compile.py case 8a: 108k parameters, 290 us -> 50 us per step on one thread).
@njit(cache=True, nogil=True, error_model="numpy")
def _adam_serial(p, g, m, v, decay, l2, lerp_w, lerp_small, beta2, one_minus_beta2, bc2_sqrt, eps, neg_step_size,
                 maximize):
    for i in range(p.size):
        p[i], m[i], v[i], _ = _adam_element(p[i], g[i], m[i], v[i], v[i], decay, l2, lerp_w, lerp_small, beta2,
                                            one_minus_beta2, bc2_sqrt, eps, neg_step_size, maximize, False)


@njit(cache=True, nogil=True, parallel=True, error_model="numpy")
def _adam_parallel(p, g, m, v, decay, l2, lerp_w, lerp_small, beta2, one_minus_beta2, bc2_sqrt, eps, neg_step_size,
                   maximize):
    for i in prange(p.size):
        p[i], m[i], v[i], _ = _adam_element(p[i], g[i], m[i], v[i], v[i], decay, l2, lerp_w, lerp_small, beta2,
                                            one_minus_beta2, bc2_sqrt, eps, neg_step_size, maximize, False)


@njit(cache=True, nogil=True, error_model="numpy")
def _amsgrad_serial(p, g, m, v, vmax, decay, l2, lerp_w, lerp_small, beta2, one_minus_beta2, bc2_sqrt, eps,
                    neg_step_size, maximize):
    for i in range(p.size):
        p[i], m[i], v[i], vmax[i] = _adam_element(p[i], g[i], m[i], v[i], vmax[i], decay, l2, lerp_w, lerp_small,
                                                  beta2, one_minus_beta2, bc2_sqrt, eps, neg_step_size, maximize,
                                                  True)


@njit(cache=True, nogil=True, parallel=True, error_model="numpy")
def _amsgrad_parallel(p, g, m, v, vmax, decay, l2, lerp_w, lerp_small, beta2, one_minus_beta2, bc2_sqrt, eps,
                      neg_step_size, maximize):
    for i in prange(p.size):
        p[i], m[i], v[i], vmax[i] = _adam_element(p[i], g[i], m[i], v[i], vmax[i], decay, l2, lerp_w, lerp_small,
                                                  beta2, one_minus_beta2, bc2_sqrt, eps, neg_step_size, maximize,
                                                  True)


def adam(p, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, scalars: tuple, parallel: bool = False) -> None:
    """torch's Adam/AdamW step in place on p and its moments (C-contiguous arrays of one float dtype), in one pass,
    rounded as adam.py's numpy sequence: every scalar in the arrays' dtype, one rounding per operation.
    max_exp_avg_sq is None without amsgrad; `scalars` come from adam_scalars."""
    arrays = [p.reshape(-1), grad.reshape(-1), exp_avg.reshape(-1), exp_avg_sq.reshape(-1)]
    if max_exp_avg_sq is None:
        kernel = _adam_parallel if parallel else _adam_serial
    else:
        kernel = _amsgrad_parallel if parallel else _amsgrad_serial
        arrays.append(max_exp_avg_sq.reshape(-1))
    kernel(*arrays, *scalars)


# Parameters per call of the many-parameter kernels: a shorter list is padded with empty arrays, so one compiled
# signature (per dtype) serves every model.
MANY = 16
_CHUNK = 8192  # elements per task of the parallel many-parameter kernel


@njit(inline="always", error_model="numpy")
def _adam_range(p, g, m, v, lo, hi, decay, l2, lerp_w, lerp_small, beta2, one_minus_beta2, bc2_sqrt, eps,
                neg_step_size, maximize):
    for i in range(lo, hi):
        p[i], m[i], v[i], _ = _adam_element(p[i], g[i], m[i], v[i], v[i], decay, l2, lerp_w, lerp_small, beta2,
                                            one_minus_beta2, bc2_sqrt, eps, neg_step_size, maximize, False)


@njit(cache=True, nogil=True, error_model="numpy")
def _adam_many_serial(ps, gs, ms, vs, decay, l2, lerp_w, lerp_small, beta2, one_minus_beta2, bc2_sqrt, eps,
                      neg_step_size, maximize):
    for k in range(len(ps)):
        _adam_range(ps[k], gs[k], ms[k], vs[k], 0, ps[k].size, decay, l2, lerp_w, lerp_small, beta2,
                    one_minus_beta2, bc2_sqrt, eps, neg_step_size, maximize)


@njit(cache=True, nogil=True, parallel=True, error_model="numpy")
def _adam_many_parallel(ps, gs, ms, vs, decay, l2, lerp_w, lerp_small, beta2, one_minus_beta2, bc2_sqrt, eps,
                        neg_step_size, maximize):
    # the parameters laid end to end, cut into chunks of _CHUNK elements: tasks of one size however they are shaped
    starts = np.zeros(len(ps) + 1, np.int64)
    for k in range(len(ps)):
        starts[k + 1] = starts[k] + ps[k].size
    for c in prange((starts[-1] + _CHUNK - 1) // _CHUNK):
        lo, hi = c * _CHUNK, min(starts[-1], (c + 1) * _CHUNK)
        k = np.searchsorted(starts, lo, side="right") - 1
        while lo < hi:
            end = min(hi, starts[k + 1])
            _adam_range(ps[k], gs[k], ms[k], vs[k], lo - starts[k], end - starts[k], decay, l2, lerp_w, lerp_small,
                        beta2, one_minus_beta2, bc2_sqrt, eps, neg_step_size, maximize)
            lo = end
            k += 1


def adam_many(params: list, grads: list, exp_avgs: list, exp_avg_sqs: list, scalars: tuple,
              parallel: bool = False) -> None:
    """`adam` (without amsgrad) on many parameters of one dtype, MANY per kernel call: the same bits as one call
    per parameter, without a launch per parameter (~4 us each, more than a small parameter's update)."""
    kernel = _adam_many_parallel if parallel else _adam_many_serial
    empty = np.empty(0, params[0].dtype)
    for lo in range(0, len(params), MANY):
        pad = [empty] * max(0, lo + MANY - len(params))
        kernel(*[tuple([a.ravel() for a in arrays[lo:lo + MANY]] + pad)  # C-contiguous: views
                 for arrays in (params, grads, exp_avgs, exp_avg_sqs)], *scalars)


@functools.lru_cache(maxsize=64)
def adam_scalars(dtype: np.dtype, step: float, lr: float, betas: tuple, eps: float, weight_decay: float,
                 decoupled: bool, maximize: bool) -> tuple:
    """The kernels' scalar arguments for one step, each rounded to the arrays' dtype as numpy rounds a Python
    float meeting an array (the same for every parameter of a group, hence cached)."""
    scalar = dtype.type
    beta1, beta2 = betas
    decay = 1 - lr * weight_decay if decoupled and weight_decay != 0 else 1.0
    lerp_w = 1 - beta1
    lerp_small = abs(lerp_w) < 0.5
    return (scalar(decay), scalar(0.0 if decoupled else weight_decay), scalar(lerp_w if lerp_small else 1 - lerp_w),
            bool(lerp_small), scalar(beta2), scalar(1 - beta2), scalar((1 - beta2 ** step) ** 0.5), scalar(eps),
            scalar(-(lr / (1 - beta1 ** step))), bool(maximize))
