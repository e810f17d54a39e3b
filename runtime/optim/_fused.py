"""One-pass optimizer updates: numba loops that read each array once, where numpy takes a pass per operation.

Imported at an optimizer's first large update, so `import runtime` does not load numba."""
from __future__ import annotations

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
