"""runtime.linalg: torch.linalg on numpy's LAPACK. inv, det, slogdet, solve, cholesky, eigh/eigvalsh and matrix_exp
are ops with derivative rules (runtime/ops.py); norms and householder_product are compositions; qr, svd, svdvals,
lstsq, pinv, matrix_rank and lu compute with numpy and refuse inputs that require grad (no rule for them yet)."""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from . import api
from . import dtypes as dt
from .api import _values, _vector_norm, wrap_dim
from .ops import apply


class LinAlgError(RuntimeError):
    """torch.linalg.LinAlgError: a matrix that is singular or not positive-definite."""


class _SignLogAbsDet(NamedTuple):
    sign: object
    logabsdet: object


class _EigH(NamedTuple):
    eigenvalues: object
    eigenvectors: object


class _QR(NamedTuple):
    Q: object
    R: object


class _SVD(NamedTuple):
    U: object
    S: object
    Vh: object


class _Ex(NamedTuple):
    result: object
    info: object


def _no_grad_here(name, *tensors):
    from .autograd import grad_mode

    if grad_mode.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors):
        raise RuntimeError(f"linalg.{name}: runtime has no derivative rule for {name}; call it on detached tensors "
                           f"(or under no_grad)")


def _square(name, a):
    if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        raise RuntimeError(f"linalg.{name}: A must be batches of square matrices, but they are "
                           f"{a.shape[-2] if a.ndim > 1 else 1} by {a.shape[-1] if a.ndim else 1} matrices")


def inv(A):
    _square("inv", A)
    return apply("inv", A)


def inv_ex(A, *, check_errors=False):
    return _Ex(inv(A), A.new_zeros(tuple(A.shape[:-2]), dtype=dt.int32))


def det(A):
    _square("det", A)
    return apply("det", A)


def slogdet(A):
    _square("slogdet", A)
    # NOTE: the sign is det's sign (not differentiable); the log comes from LAPACK's LU, so it does not overflow
    sign = A.new_tensor(np.linalg.slogdet(_values(A, "slogdet"))[0])
    return _SignLogAbsDet(sign, apply("logabsdet", A))


def solve(A, B, *, left=True):
    if not left:
        return solve(A.mT, B.mT).mT
    _square("solve", A)
    vector = B.ndim == 1 or (B.ndim == A.ndim - 1 and tuple(B.shape) == tuple(A.shape[:-1]))
    X = apply("solve", A, B.unsqueeze(-1) if vector else B)
    return X.squeeze(-1) if vector else X


def solve_ex(A, B, *, left=True, check_errors=False):
    return _Ex(solve(A, B, left=left), A.new_zeros(tuple(A.shape[:-2]), dtype=dt.int32))


def cholesky(A, *, upper=False):
    _square("cholesky", A)
    L = apply("cholesky", _hermitian(A, "L"))  # as LAPACK's, torch's reads A's lower triangle only
    return L.mT if upper else L


def cholesky_ex(A, *, upper=False, check_errors=False):
    return _Ex(cholesky(A, upper=upper), A.new_zeros(tuple(A.shape[:-2]), dtype=dt.int32))


def eigvalsh(A, UPLO="L"):
    _square("eigvalsh", A)
    return apply("eigvalsh", _hermitian(A, UPLO))


def eigh(A, UPLO="L"):
    _square("eigh", A)
    A = _hermitian(A, UPLO)
    return _EigH(apply("eigvalsh", A), apply("eigh_vectors", A))


def _hermitian(A, UPLO):
    if UPLO not in ("L", "U"):
        raise RuntimeError(f"Expected UPLO argument to be 'L' or 'U', but got {UPLO}")
    a = _values(A, "eigh")
    if np.array_equal(a, np.swapaxes(a, -1, -2)):
        return A
    # NOTE: LAPACK reads one triangle, so the values come from the matrix mirrored from it; the gradient is the
    # symmetric one torch gives whatever the other triangle holds (the ops' rules)
    tri = A.tril() if UPLO == "L" else A.triu()
    mirrored = tri + tri.mT - api.diag_embed(api.diagonal(A, 0, -2, -1))
    return mirrored.detach() + (A - A.detach())


def qr(A, mode="reduced"):
    _no_grad_here("qr", A)
    if mode not in ("reduced", "complete", "r"):
        raise RuntimeError(f"qr received unrecognized mode '{mode}' but expected one of 'reduced' (default), "
                           f"'r', or 'complete'")
    q, r = np.linalg.qr(_values(A, "qr"), mode="complete" if mode == "complete" else "reduced")
    return _QR(A.new_tensor(q) if mode != "r" else A.new_zeros((0,)), A.new_tensor(r))


def householder_product(A, tau):
    """The first n columns of H_1 ... H_k for an m x n A (batched), H_i = I - tau_i v_i v_i^H with v_i column i of A
    below the diagonal and 1 on it (LAPACK's orgqr; geqrf's output gives back Q). Differentiable: the reflectors
    are applied with tensor ops, last first."""
    m, n, k = A.shape[-2], A.shape[-1], tau.shape[-1]
    if A.ndim < 2 or m < n or k > n:
        raise RuntimeError(f"torch.linalg.householder_product: input must have at least 2 dimensions and "
                           f"input.shape[-2] >= input.shape[-1] >= tau.shape[-1], got {list(A.shape)} and "
                           f"{list(tau.shape)}")
    from . import factories

    rows = factories.arange(m).reshape(m, 1)
    q = factories.eye(m, n, dtype=A.dtype)
    for i in reversed(range(k)):
        column = A[..., :, i:i + 1]
        v = api.where(rows < i, 0.0, api.where(rows == i, 1.0, column))
        q = q - tau[..., i:i + 1].unsqueeze(-1) * (v @ v.mH @ q)
    return q


def svd(A, full_matrices=True, *, driver=None):
    _no_grad_here("svd", A)
    u, s, vh = np.linalg.svd(_values(A, "svd"), full_matrices=full_matrices)
    return _SVD(A.new_tensor(u), A.new_tensor(s), A.new_tensor(vh))


def svdvals(A, *, driver=None):
    _no_grad_here("svdvals", A)
    return A.new_tensor(np.linalg.svd(_values(A, "svdvals"), compute_uv=False))


def pinv(A, rcond=None, hermitian=False, *, atol=None, rtol=None):
    """The pseudo-inverse, singular values at most max(atol, rtol * the largest) taken as zero (torch's rule for
    their defaults: _tolerance). `rcond`, positional, is torch's older name for rtol."""
    _no_grad_here("pinv", A)
    a = _values(A, "pinv")
    if hermitian:  # A = V diag(w) V^T: the eigenvalues' magnitudes are the singular values
        values, left = np.linalg.eigh(a)
        right = left
    else:  # A = U diag(s) V^T
        left, values, vh = np.linalg.svd(a, full_matrices=False)
        right = np.swapaxes(vh, -1, -2)
    kept = np.abs(values) > _tolerance(np.abs(values), atol, rtol if rcond is None else rcond, a)
    inverted = np.where(kept, 1.0 / np.where(kept, values, 1), 0.0).astype(a.dtype)
    return A.new_tensor((right * np.expand_dims(inverted, -2)) @ np.swapaxes(left, -1, -2))


def _tolerance(s, atol, rtol, a):
    """max(atol, rtol * s.max()) per matrix, as a column against s: rtol defaults to eps * max(m, n), or to 0
    when atol is given above 0 (torch's rule); atol and rtol may be numbers or tensors of the batch's shape."""
    atol = 0.0 if atol is None else np.asarray(getattr(atol, "_data", atol), dtype=np.float64)
    if rtol is None:
        rtol = 0.0 if np.all(np.asarray(atol) > 0) else max(a.shape[-2:]) * np.finfo(a.dtype).eps
    rtol = np.asarray(getattr(rtol, "_data", rtol), dtype=np.float64)
    return np.expand_dims(np.maximum(atol, rtol * s.max(axis=-1, initial=0)), -1)


def matrix_rank(A, tol=None, hermitian=False, *, atol=None, rtol=None):
    """How many singular values exceed max(atol, rtol * the largest) (_tolerance). `tol`, torch's older form, is an
    absolute tolerance (rtol 0)."""
    a = _values(A, "matrix_rank")
    if tol is not None:
        atol, rtol = tol, 0.0
    s = np.abs(np.linalg.eigvalsh(a)) if hermitian else np.linalg.svd(a, compute_uv=False)
    return A.new_tensor((s > _tolerance(s, atol, rtol, a)).sum(-1).astype(np.int64), dtype=dt.int64)


_LSTSQ_DRIVERS = ("gels", "gelsy", "gelsd", "gelss")


def lstsq(A, B, rcond=None, *, driver=None):
    """The minimum-norm least-squares solution of A X = B (batched), with what torch's CPU driver returns beside
    it: residuals (squared, per column of B) for gels, gelsd and gelss where every A is tall and of full rank; the
    rank for gelsy (the default), gelsd and gelss; the singular values for gelsd and gelss. The rest are empty."""
    _no_grad_here("lstsq", A, B)
    driver = "gelsy" if driver is None else driver
    if driver not in _LSTSQ_DRIVERS:
        raise RuntimeError(f"parameter `driver` should be one of ({', '.join(_LSTSQ_DRIVERS)})")
    a, b = _values(A, "lstsq"), _values(B, "lstsq")
    vector = b.ndim == a.ndim - 1  # B of shape (*, m): one right-hand side, and results without its dim
    if vector:
        b = b[..., None]
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a, b = np.broadcast_to(a, batch + a.shape[-2:]), np.broadcast_to(b, batch + b.shape[-2:])
    solved = [np.linalg.lstsq(a[k], b[k], rcond=rcond) for k in np.ndindex(*batch)]
    m, n = a.shape[-2:]
    solution = np.stack([x for x, _, _, _ in solved]).reshape(batch + (n, b.shape[-1]))
    ranks = np.array([r for _, _, r, _ in solved], dtype=np.int64).reshape(batch)
    empty = A.new_zeros((0,))
    residuals = empty
    if driver != "gelsy" and m > n and bool(np.all(ranks == n)):
        residuals = A.new_tensor(np.sum((a @ solution - b) ** 2, axis=-2))  # (*, k): k is 1 for a vector B
    rank = A.new_tensor(ranks, dtype=dt.int64) if driver != "gels" else A.new_zeros((0,), dtype=dt.int64)
    singular = empty
    if driver in ("gelsd", "gelss"):
        singular = A.new_tensor(np.stack([s for _, _, _, s in solved]).reshape(batch + (min(m, n),)))
    return _Lstsq(A.new_tensor(solution[..., 0] if vector else solution), residuals, rank, singular)


class _Lstsq(NamedTuple):
    solution: object
    residuals: object
    rank: object
    singular_values: object


def matrix_power(A, n):
    _square("matrix_power", A)
    if n == 0:
        return api.expand(api.clone(A.new_tensor(np.eye(A.shape[-1]))), tuple(A.shape)) * 1
    if n < 0:
        return matrix_power(inv(A), -n)
    result, base = None, A
    while n:
        if n & 1:
            result = base if result is None else result @ base
        n >>= 1
        if n:
            base = base @ base
    return result


def matrix_exp(A):
    _square("matrix_exp", A)
    return apply("matrix_exp", A)


def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    if dtype is not None:
        x = x.to(dtype)
    return _vector_norm(x, ord, dim, keepdim)


def matrix_norm(A, ord="fro", dim=(-2, -1), keepdim=False, *, dtype=None):
    if dtype is not None:
        A = A.to(dtype)
    if A.ndim < 2:
        raise RuntimeError("linalg.matrix_norm: The input tensor A must have at least 2 dimensions.")
    d0, d1 = wrap_dim(dim[0], A.ndim), wrap_dim(dim[1], A.ndim)
    if ord == "fro":
        return _vector_norm(A, 2, (d0, d1), keepdim)
    if ord in ("nuc", 2, -2):
        moved = api.movedim(A, (d0, d1), (-2, -1))
        s = svdvals(moved)
        out = s.sum(-1) if ord == "nuc" else s.amax(-1) if ord == 2 else s.amin(-1)
        return out.unsqueeze(min(d0, d1)).unsqueeze(max(d0, d1)) if keepdim else out
    if ord in (1, -1, math.inf, -math.inf):
        sum_dim, max_dim = (d0, d1) if ord in (1, -1) else (d1, d0)
        s = A.abs().sum(sum_dim, keepdim=True)
        out = s.amax(max_dim, keepdim=True) if ord > 0 else s.amin(max_dim, keepdim=True)
        return out if keepdim else out.squeeze((d0, d1))
    raise RuntimeError(f"linalg.matrix_norm: Order {ord} not supported.")


def norm(A, ord=None, dim=None, keepdim=False, *, dtype=None):
    if isinstance(ord, str) or (ord is not None and dim is None and A.ndim == 2) or \
            (isinstance(dim, (tuple, list)) and len(dim) == 2):
        return matrix_norm(A, "fro" if ord is None else ord, (-2, -1) if dim is None else dim, keepdim, dtype=dtype)
    if ord is not None and dim is None and A.ndim != 1:
        raise RuntimeError("linalg.norm: If dim is not specified but ord is, the input must be 1D or 2D. Got "
                           f"{A.ndim}D.")
    return vector_norm(A, 2 if ord is None else ord, dim, keepdim, dtype=dtype)


def cross(input, other, *, dim=-1):
    return api.cross(input, other, dim)


def diagonal(A, *, offset=0, dim1=-2, dim2=-1):
    return api.diagonal(A, offset, dim1, dim2)


def matmul(input, other):
    return api.matmul(input, other)


def vecdot(x, y, *, dim=-1):
    return (x * y).sum(dim)


def multi_dot(tensors):
    tensors = list(tensors)
    if len(tensors) < 2:
        raise RuntimeError(f"multi_dot(): expected at least 2 tensors but got {len(tensors)}")
    out = tensors[0]
    for t in tensors[1:]:
        out = api.matmul(out, t)
    return out


def vander(x, *, N=None):
    n = x.shape[-1] if N is None else N
    powers = x.new_tensor(np.arange(n), dtype=dt.int64)
    return api.pow(x.unsqueeze(-1), powers)


def solve_triangular(A, B, *, upper, left=True, unitriangular=False):
    tri = A.triu() if upper else A.tril()
    if unitriangular:
        n = A.shape[-1]
        tri = tri.masked_fill(A.new_tensor(np.eye(n, dtype=bool), dtype=dt.bool_), 1.0)
    return solve(tri, B, left=left)


def tensorinv(A, ind=2):
    if ind <= 0:
        raise RuntimeError(f"Expected a strictly positive integer for 'ind', but got {ind}")
    out_shape, in_shape = tuple(A.shape[:ind]), tuple(A.shape[ind:])
    n = math.prod(out_shape)
    if n != math.prod(in_shape):
        raise RuntimeError(f"Expected self to satisfy the requirement prod(self.shape[ind:]) == "
                           f"prod(self.shape[:ind]), but got {math.prod(in_shape)} != {n}")
    return inv(A.reshape(n, n)).reshape(in_shape + out_shape)


def tensorsolve(A, B, dims=None):
    if dims is not None:
        rest = [d for d in range(A.ndim) if d not in [wrap_dim(x, A.ndim) for x in dims]]
        A = A.permute(tuple(rest) + tuple(wrap_dim(x, A.ndim) for x in dims))
    x_shape = tuple(A.shape[B.ndim:])
    n = math.prod(x_shape)
    return solve(A.reshape(B.numel(), n), B.reshape(-1)).reshape(x_shape)


class _LUFactor(NamedTuple):
    LU: object
    pivots: object


class _PLU(NamedTuple):
    P: object
    L: object
    U: object


def lu_factor(A, *, pivot=True):
    """(LU, pivots) as LAPACK's getrf: pivots are 1-based row swaps, as torch's."""
    _no_grad_here("lu_factor", A)
    if not pivot:
        raise RuntimeError("linalg.lu_factor: LU without pivoting is not implemented on CPU")
    from scipy.linalg import lu_factor as _lu_factor

    a = _values(A, "lu_factor")
    flat = a.reshape(-1, *a.shape[-2:])
    lus, pivs = zip(*(_lu_factor(m, check_finite=False) for m in flat)) if flat.shape[0] else ((), ())
    lu = np.stack(lus).reshape(a.shape) if lus else a.copy()
    piv = (np.stack(pivs) + 1).astype(np.int32).reshape(a.shape[:-2] + (min(a.shape[-2:]),)) if pivs else \
        np.zeros(a.shape[:-2] + (min(a.shape[-2:]),), np.int32)
    return _LUFactor(A.new_tensor(lu), A.new_tensor(piv, dtype=dt.int32))


def lu_factor_ex(A, *, pivot=True, check_errors=False):
    LU, pivots = lu_factor(A, pivot=pivot)
    return LU, pivots, A.new_zeros(tuple(A.shape[:-2]), dtype=dt.int32)


def lu(A, *, pivot=True):
    """(P, L, U) with A = P L U."""
    _no_grad_here("lu", A)
    if not pivot:
        raise RuntimeError("linalg.lu: LU without pivoting is not implemented on CPU")
    from scipy.linalg import lu as _lu

    a = _values(A, "lu")
    flat = a.reshape(-1, *a.shape[-2:])
    parts = [_lu(m, check_finite=False) for m in flat]
    k = min(a.shape[-2:])
    batch = a.shape[:-2]
    P = np.stack([p for p, _, _ in parts]).reshape(batch + (a.shape[-2], a.shape[-2]))
    L = np.stack([low for _, low, _ in parts]).reshape(batch + (a.shape[-2], k))
    U = np.stack([up for _, _, up in parts]).reshape(batch + (k, a.shape[-1]))
    return _PLU(A.new_tensor(P), A.new_tensor(L), A.new_tensor(U))


def lu_solve(LU, pivots, B, *, left=True, adjoint=False):
    _no_grad_here("lu_solve", LU, B)
    from scipy.linalg import lu_solve as _lu_solve

    lu_, piv, b = _values(LU, "lu_solve"), _values(pivots, "lu_solve") - 1, _values(B, "lu_solve")
    if not left:
        raise RuntimeError("linalg.lu_solve(left=False) is not supported by runtime")
    batch = np.broadcast_shapes(lu_.shape[:-2], b.shape[:-2])
    lu_b = np.broadcast_to(lu_, batch + lu_.shape[-2:]).reshape(-1, *lu_.shape[-2:])
    piv_b = np.broadcast_to(piv, batch + piv.shape[-1:]).reshape(-1, piv.shape[-1])
    b_b = np.broadcast_to(b, batch + b.shape[-2:]).reshape(-1, *b.shape[-2:])
    x = np.stack([_lu_solve((m, p), r, trans=1 if adjoint else 0, check_finite=False)
                  for m, p, r in zip(lu_b, piv_b, b_b)]) if b_b.shape[0] else b_b.copy()
    return B.new_tensor(x.reshape(batch + b.shape[-2:]))
