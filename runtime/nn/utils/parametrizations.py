"""torch.nn.utils.parametrizations: weight_norm and spectral_norm as parametrizations (see parametrize.py).

State dict keys are torch's: weight_norm stores `parametrizations.weight.original0` (the magnitude g) and
`original1` (the direction v); spectral_norm stores `parametrizations.weight.original` and the power iteration's
vectors as buffers `parametrizations.weight.0._u` / `._v`, so a torch checkpoint loads unchanged.
"""
from __future__ import annotations

from ... import dtypes as dt
from ... import factories
from ...autograd import grad_mode
from .. import functional as F
from ..modules.module import Module
from . import parametrize

__all__ = ["weight_norm", "spectral_norm", "orthogonal"]


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


_ORTHOGONAL_MAPS = ("matrix_exp", "cayley", "householder")


class _Orthogonal(Module):
    """An orthogonal (unitary) matrix, or batch of them, from an unconstrained one: the exponential or the Cayley
    transform of the skew-symmetric matrix its lower triangle gives, or a product of Householder reflectors (its
    strict lower triangle the vectors, its diagonal's signs the last flips). With the dynamic trivialization
    (`base`, a buffer) the result is base @ that, and right_inverse restarts it at the identity."""

    def __init__(self, weight, orthogonal_map: str, *, use_trivialization: bool = True):
        super().__init__()
        if weight.dtype.is_complex and orthogonal_map == "householder":
            raise ValueError("The householder parametrization does not support complex tensors.")
        self.shape, self.orthogonal_map = tuple(weight.shape), orthogonal_map
        if use_trivialization:
            self.register_buffer("base", None)

    def forward(self, X):
        from ... import api, linalg

        n, k = X.shape[-2], X.shape[-1]
        transposed = n < k
        if transposed:
            X, n, k = X.mT, k, n
        if self.orthogonal_map == "householder":
            A = X.tril(-1)
            tau = 2.0 / (1.0 + (A * A).sum(-2))
            Q = linalg.householder_product(A, tau) * api.diagonal(X, 0, -2, -1).int().unsqueeze(-2)
        else:
            X = X.tril()
            if n != k:
                X = api.cat([X, X.new_zeros((n, n - k)).expand(tuple(X.shape[:-2]) + (n, n - k))], -1)
            A = X - X.mH
            if self.orthogonal_map == "matrix_exp":
                Q = linalg.matrix_exp(A)
            else:
                identity = factories.eye(n, dtype=A.dtype)
                Q = linalg.solve(identity - 0.5 * A, identity + 0.5 * A)
            Q = Q[..., :k] if n != k else Q
        if "base" in self._buffers:
            Q = self.base @ Q
        return Q.mT if transposed else Q

    def right_inverse(self, Q):
        with grad_mode.no_grad():
            return self._right_inverse(Q)

    def _right_inverse(self, Q):
        from ... import api

        if tuple(Q.shape) != self.shape:
            raise ValueError(f"Expected a matrix or batch of matrices of shape {self.shape}. Got a tensor of shape "
                             f"{tuple(Q.shape)}.")
        initial = Q
        n, k = Q.shape[-2], Q.shape[-1]
        transposed = n < k
        if transposed:
            Q, n, k = Q.mT, k, n
        if "base" not in self._buffers:
            if self.orthogonal_map != "householder":
                raise NotImplementedError("It is not possible to assign to the matrix exponential or the Cayley "
                                          "parametrizations when use_trivialization=False.")
            A, tau = api.geqrf(Q)
            signs = api.diagonal(A, 0, -2, -1).sign()
            on_diagonal = factories.eye(n, k, dtype=dt.bool_)
            A = api.where(on_diagonal, signs.where(tau != 0.0, -signs).unsqueeze(-2), A)
            return A.mT if transposed else A
        if n == k:
            Q = Q.clone() if _is_orthogonal(Q) else _make_orthogonal(Q)
        else:
            extra = factories.randn(tuple(Q.shape[:-2]) + (n, n - k), dtype=Q.dtype)
            Q = _make_orthogonal(api.cat([Q, extra], -1))
        self.base = Q
        negated_identity = factories.zeros(tuple(initial.shape), dtype=initial.dtype)
        api.diagonal(negated_identity, 0, -2, -1).fill_(-1.0)
        return negated_identity


def _is_orthogonal(Q) -> bool:
    from ... import api
    from ...typeinfo import finfo

    n, k = Q.shape[-2], Q.shape[-1]
    gram = Q.mH @ Q
    return api.allclose(gram, factories.eye(k, dtype=Q.dtype), atol=10 * n * finfo(Q.dtype).eps)


def _make_orthogonal(A):
    """Q of A's QR with R's diagonal made positive (geqrf's reflectors, then each column's sign)."""
    from ... import api, linalg

    X, tau = api.geqrf(A)
    return linalg.householder_product(X, tau) * api.diagonal(X, 0, -2, -1).sgn().unsqueeze(-2)


def orthogonal(module, name="weight", orthogonal_map=None, *, use_trivialization=True):
    """Make module.<name> an orthogonal matrix (or batch of them), as torch.nn.utils.parametrizations.orthogonal:
    orthonormal columns for a tall weight, rows for a wide one. orthogonal_map: "matrix_exp" (the default for square
    or complex weights), "cayley" or "householder" (the default otherwise)."""
    weight = getattr(module, name, None)
    if weight is None or not hasattr(weight, "ndim"):
        raise ValueError(f"Module '{module}' has no parameter or buffer with name '{name}'")
    if weight.ndim < 2:
        raise ValueError(f"Expected a matrix or batch of matrices. Got a tensor of {weight.ndim} dimensions.")
    if orthogonal_map is None:
        square = weight.shape[-2] == weight.shape[-1]
        orthogonal_map = "matrix_exp" if square or weight.dtype.is_complex else "householder"
    if orthogonal_map not in _ORTHOGONAL_MAPS:
        raise ValueError(f'orthogonal_map has to be one of "matrix_exp", "cayley", "householder". Got: '
                         f"{orthogonal_map}")
    orth = _Orthogonal(weight, orthogonal_map, use_trivialization=use_trivialization)
    parametrize.register_parametrization(module, name, orth, unsafe=True)
    return module
