"""Muon as torch.optim.Muon: SGD momentum whose update matrix is orthogonalised by Newton-Schulz iterations in
bfloat16 before it is applied, with decoupled weight decay. For 2-D parameters only (hidden layers' weights)."""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes as dt
from ..tensor import Tensor
from .optimizer import Optimizer, as_float, check_hyper, zeros_like

_ADJUST_LR_FNS = (None, "original", "match_rms_adamw")


class Muon(Optimizer):
    def __init__(self, params, lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
                 ns_coefficients=(3.4445, -4.775, 2.0315), eps=1e-7, ns_steps=5, adjust_lr_fn=None) -> None:
        if isinstance(lr, Tensor) and lr.numel() != 1:
            raise ValueError("Tensor lr must be 1-element")
        defaults = {"lr": lr, "weight_decay": weight_decay, "momentum": momentum, "nesterov": nesterov,
                    "ns_coefficients": ns_coefficients, "eps": eps, "ns_steps": ns_steps,
                    "adjust_lr_fn": adjust_lr_fn}
        self._validate(defaults)
        super().__init__(params, defaults)

    def _validate(self, hyper: dict) -> None:
        check_hyper(as_float(hyper["lr"]) >= 0.0, f"Learning rate should be >= 0 but is: {hyper['lr']}")
        check_hyper(hyper["momentum"] >= 0.0, f"momentum should be >= 0 but is: {hyper['momentum']}")
        check_hyper(hyper["weight_decay"] >= 0.0, f"weight decay should be >= 0 but is: {hyper['weight_decay']}")
        check_hyper(hyper["adjust_lr_fn"] in _ADJUST_LR_FNS,
                    f"Adjust learning rate function {hyper['adjust_lr_fn']} is not supported")
        for p in hyper.get("params", ()):
            check_hyper(p.ndim == 2, f"Muon only supports 2D parameters whereas we found a parameter with size: "
                                     f"{p.size()}")

    def _step_param(self, p: Tensor, g: Tensor, group: dict) -> None:
        if p.dtype.is_complex:
            raise RuntimeError("Muon does not support complex parameters")
        if g.is_sparse:
            raise RuntimeError("Muon does not support sparse gradients")
        super()._step_param(p, g, group)

    def _update(self, p: Tensor, grad: np.ndarray, group: dict) -> None:
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = zeros_like(p)
        buf, g = state["momentum_buffer"], Tensor._from_array(grad)
        momentum = group["momentum"]
        buf.lerp_(g, 1 - momentum)
        update = g.lerp(buf, momentum) if group["nesterov"] else buf
        update = orthogonalize(update, group["ns_coefficients"], group["ns_steps"], group["eps"])
        lr = as_float(group["lr"])
        p.mul_(1 - lr * group["weight_decay"])
        p.add_(update, alpha=-adjusted_lr(lr, group["adjust_lr_fn"], p.shape))


def orthogonalize(matrix: Tensor, coefficients, steps: int, eps: float) -> Tensor:
    """An approximately orthogonal matrix with `matrix`'s singular vectors (U S' V^T with S' near 1), from `steps`
    quintic Newton-Schulz iterations X <- aX + (bA + cA^2)X, A = XX^T, in bfloat16 on the wide side's transpose."""
    if steps >= 100:
        raise ValueError("Number of steps must be less than 100 for computational efficiency")
    if matrix.ndim != 2:
        raise ValueError("Input tensor gradient must be a 2D matrix")
    if len(coefficients) != 3:
        raise ValueError("Coefficients must be a tuple of exactly 3 values")
    a, b, c = coefficients
    tall = matrix.shape[0] > matrix.shape[1]
    x = matrix.to(dt.bfloat16)
    x = x.T if tall else x
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        x = x.addmm(gram.addmm(gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def adjusted_lr(lr: float, adjust_lr_fn, shape) -> float:
    """The learning rate scaled for a rows x cols update: Keller Jordan's sqrt(max(1, rows/cols)) ("original", the
    default) or Moonshot's 0.2 sqrt(max(rows, cols)), which matches AdamW's update RMS ("match_rms_adamw")."""
    rows, cols = shape[:2]
    if adjust_lr_fn in (None, "original"):
        return lr * math.sqrt(max(1, rows / cols))
    return lr * 0.2 * math.sqrt(max(rows, cols))
