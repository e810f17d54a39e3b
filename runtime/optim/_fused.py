"""One-pass optimizer updates: numba loops that read each array once, where numpy takes a pass per operation."""
from __future__ import annotations

import numpy as np

_FUSABLE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_kernels: dict = {}


def fusable(*arrays: np.ndarray) -> bool:
    """Same shape and float dtype, C-contiguous, and the first (the one written) writeable."""
    first = arrays[0]
    return (first.dtype in _FUSABLE_DTYPES and first.flags.writeable
            and all(a.dtype == first.dtype and a.shape == first.shape and a.flags.c_contiguous for a in arrays))


def _sgd_momentum_kernel():
    """The compiled SGD-with-momentum loop (numba loads lazily: `import runtime` stays light)."""
    kernel = _kernels.get("sgd_momentum")
    if kernel is None:
        from numba import njit

        # NOTE: serial on purpose. A parallel region right after the backward's BLAS calls makes numba's and
        # OpenBLAS's thread pools spin against each other on few cores (see nnc/codegen/cpu.py FEW_ROWS).
        @njit(cache=True, nogil=True)
        def sgd_momentum(p, g, buf, lr, momentum, damp, weight_decay, nesterov, maximize):
            for i in range(p.size):
                d = -g[i] if maximize else g[i]
                if weight_decay != 0:
                    d = d + weight_decay * p[i]
                b = buf[i] * momentum + (damp * d if damp != 1 else d)
                buf[i] = b
                p[i] = p[i] - lr * (d + momentum * b if nesterov else b)

        kernel = _kernels["sgd_momentum"] = sgd_momentum
    return kernel


def sgd_momentum(p: np.ndarray, grad: np.ndarray, buf: np.ndarray, lr: float, momentum: float, dampening: float,
                 weight_decay: float, nesterov: bool, maximize: bool) -> None:
    """torch's SGD step with a momentum buffer, in place on p and buf: the numpy sequence
    `d = g (+ wd*p); buf = buf*m + (1-dampening)*d; p -= lr * (nesterov ? d + m*buf : buf)` rounded the same
    way (every scalar in the arrays' dtype, one rounding per operation), in one pass."""
    scalar = p.dtype.type
    _sgd_momentum_kernel()(p.reshape(-1), grad.reshape(-1), buf.reshape(-1), scalar(lr), scalar(momentum),
                           scalar(1 - dampening), scalar(weight_decay), bool(nesterov), bool(maximize))
