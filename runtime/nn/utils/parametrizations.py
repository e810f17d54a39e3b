"""torch.nn.utils.parametrizations: weight_norm and spectral_norm as parametrizations (see parametrize.py).

State dict keys are torch's: weight_norm stores `parametrizations.weight.original0` (the magnitude g) and
`original1` (the direction v); spectral_norm stores `parametrizations.weight.original` and the power iteration's
vectors as buffers `parametrizations.weight.0._u` / `._v`, so a torch checkpoint loads unchanged.
"""
from __future__ import annotations

from ... import factories
from ...autograd import grad_mode
from .. import functional as F
from ..modules.module import Module
from . import parametrize

__all__ = ["weight_norm", "spectral_norm"]


def _norm_except_dim(v, dim):
    """The 2-norm of v over every dim but `dim`, kept as size-1 dims (dim=-1: over all of v, as torch's)."""
    if dim == -1:
        return (v * v).sum().sqrt()
    dims = tuple(d for d in range(v.ndim) if d != dim)
    return (v * v).sum(dims, keepdim=True).sqrt() if dims else v.abs()


class _WeightNorm(Module):
    def __init__(self, dim=0):
        super().__init__()
        self.dim = -1 if dim is None else dim

    def forward(self, weight_g, weight_v):
        dim = self.dim if self.dim == -1 else self.dim % weight_v.ndim
        return weight_v * (weight_g / _norm_except_dim(weight_v, dim))

    def right_inverse(self, weight):
        dim = self.dim if self.dim == -1 else self.dim % weight.ndim
        return _norm_except_dim(weight, dim), weight


def weight_norm(module, name="weight", dim=0):
    """Reparametrize module.<name> as g * v / ||v|| (norm over every dim but `dim`); g and v are trained."""
    parametrize.register_parametrization(module, name, _WeightNorm(dim), unsafe=True)
    return module


class _SpectralNorm(Module):
    def __init__(self, weight, n_power_iterations=1, dim=0, eps=1e-12):
        super().__init__()
        ndim = weight.ndim
        if dim >= ndim or dim < -ndim:
            raise IndexError(f"Dimension out of range (expected to be in range of [-{ndim}, {ndim - 1}] but got "
                             f"{dim})")
        if n_power_iterations <= 0:
            raise ValueError(f"Expected n_power_iterations to be positive, but got n_power_iterations="
                             f"{n_power_iterations}")
        self.dim = dim if dim >= 0 else dim + ndim
        self.eps, self.n_power_iterations = eps, n_power_iterations
        if ndim > 1:
            matrix = self._matrix(weight)
            h, w = matrix.shape
            u = F.normalize(factories.randn(h, dtype=weight.dtype), dim=0, eps=eps)
            v = F.normalize(factories.randn(w, dtype=weight.dtype), dim=0, eps=eps)
            self.register_buffer("_u", u)
            self.register_buffer("_v", v)
            self._power_method(matrix, 15)

    def _matrix(self, weight):
        if self.dim != 0:
            weight = weight.permute((self.dim,) + tuple(d for d in range(weight.ndim) if d != self.dim))
        return weight.flatten(1)

    def _power_method(self, matrix, iterations):
        with grad_mode.no_grad():
            for _ in range(iterations):
                self._u.copy_(F.normalize(matrix.detach() @ self._v, dim=0, eps=self.eps))
                self._v.copy_(F.normalize(matrix.detach().T @ self._u, dim=0, eps=self.eps))

    def forward(self, weight):
        if weight.ndim == 1:
            return F.normalize(weight, dim=0, eps=self.eps)
        matrix = self._matrix(weight)
        if self.training:
            self._power_method(matrix, self.n_power_iterations)
        u, v = self._u.clone(), self._v.clone()
        sigma = (u * (matrix @ v)).sum()
        return weight / sigma

    def right_inverse(self, value):
        return value


def spectral_norm(module, name="weight", n_power_iterations=1, eps=1e-12, dim=None):
    """Divide module.<name> by its largest singular value, estimated by power iteration on every training read."""
    weight = getattr(module, name, None)
    if weight is None or not hasattr(weight, "ndim"):
        raise ValueError(f"Module '{module}' has no parameter or buffer with name '{name}'")
    if dim is None:
        dim = 1 if type(module).__name__.startswith("ConvTranspose") else 0
    parametrize.register_parametrization(module, name, _SpectralNorm(weight, n_power_iterations, dim, eps))
    return module
