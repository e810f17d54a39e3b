"""torch's older top-level decompositions, which scripts written before torch.linalg still call: svd (returning V,
not Vh), qr(some=), cholesky(upper=), pinverse, cholesky_solve, cholesky_inverse and triangular_solve, on
runtime.linalg (with its gradients and its limits). Those torch deprecates warn as torch's do, once."""
from __future__ import annotations

import warnings
from typing import NamedTuple

from . import linalg

_warned: set[str] = set()


def _deprecated(name: str, message: str) -> None:
    if name not in _warned:
        _warned.add(name)
        warnings.warn(message, UserWarning, stacklevel=3)


class svd_result(NamedTuple):
    """torch.return_types.svd."""

    U: object
    S: object
    V: object


class qr_result(NamedTuple):
    """torch.return_types.qr."""

    Q: object
    R: object


class triangular_solve_result(NamedTuple):
    """torch.return_types.triangular_solve."""

    solution: object
    cloned_coefficient: object


def svd(input, some: bool = True, compute_uv: bool = True):
    """input = U diag(S) V^T (reduced unless some=False); without compute_uv, U and V are zero-filled square
    matrices, as torch's."""
    if not compute_uv:
        m, n = input.shape[-2], input.shape[-1]
        batch = tuple(input.shape[:-2])
        return svd_result(input.new_zeros(batch + (m, m)), linalg.svdvals(input), input.new_zeros(batch + (n, n)))
    U, S, Vh = linalg.svd(input, full_matrices=not some)
    return svd_result(U, S, Vh.mT)


def qr(input, some: bool = True):
    _deprecated("qr", "torch.qr is deprecated in favor of torch.linalg.qr and will be removed in a future PyTorch "
                "release.\nThe boolean parameter 'some' has been replaced with a string parameter 'mode'.\nQ, R = "
                "torch.qr(A, some)\nshould be replaced with\nQ, R = torch.linalg.qr(A, 'reduced' if some else "
                "'complete')")
    Q, R = linalg.qr(input, "reduced" if some else "complete")
    return qr_result(Q, R)


def cholesky(input, upper: bool = False):
    _deprecated("cholesky", "torch.cholesky is deprecated in favor of torch.linalg.cholesky and will be removed in a "
                "future PyTorch release.\nL = torch.cholesky(A)\nshould be replaced with\nL = torch.linalg.cholesky(A)"
                "\nand\nU = torch.cholesky(A, upper=True)\nshould be replaced with\nU = torch.linalg.cholesky(A).mH\n"
                "This transform will produce equivalent results for all valid (symmetric positive definite) inputs.")
    return linalg.cholesky(input, upper=upper)


def pinverse(input, rcond: float = 1e-15):
    """The pseudo-inverse; singular values below rcond times the largest count as zero."""
    return linalg.pinv(input, rtol=rcond)


def cholesky_solve(B, L, upper: bool = False):
    """X with A X = B, for A = L L^T (or U^T U with upper=True) given its Cholesky factor."""
    lower = L.mT if upper else L
    return linalg.solve_triangular(lower.mT, linalg.solve_triangular(lower, B, upper=False), upper=True)


def cholesky_inverse(L, upper: bool = False):
    """The inverse of A = L L^T (or U^T U with upper=True) from its Cholesky factor."""
    from .factories import eye

    lower = L.mT if upper else L
    identity = eye(L.shape[-1], dtype=L.dtype, device=L.device).expand(tuple(L.shape))
    return cholesky_solve(identity, lower)


def triangular_solve(b, A, upper: bool = True, transpose: bool = False, unitriangular: bool = False):
    """(X with op(A) X = b, a copy of A), op(A) = A or A^T; only A's upper (or lower) triangle is read."""
    _deprecated("triangular_solve", "torch.triangular_solve is deprecated in favor of torch.linalg.solve_triangular"
                "and will be removed in a future PyTorch release.\ntorch.linalg.solve_triangular has its arguments "
                "reversed and does not return a copy of one of the inputs.\nX = torch.triangular_solve(B, A).solution"
                "\nshould be replaced with\nX = torch.linalg.solve_triangular(A, B).")
    triangle = A.triu() if upper else A.tril()
    if transpose:
        triangle, upper = triangle.mT, not upper
    X = linalg.solve_triangular(triangle, b, upper=upper, unitriangular=unitriangular)
    return triangular_solve_result(X, A.clone())


def _install_methods() -> None:
    """Each is a Tensor method too, taking the tensor first (x.svd(), b.triangular_solve(A)), as in torch."""
    from .tensor import Tensor

    for fn in (svd, qr, cholesky, pinverse, cholesky_solve, cholesky_inverse, triangular_solve):
        if fn.__name__ not in Tensor.__dict__:
            setattr(Tensor, fn.__name__, fn)


_install_methods()
