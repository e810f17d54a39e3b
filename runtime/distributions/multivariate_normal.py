"""MultivariateNormal(loc, covariance_matrix | precision_matrix | scale_tril): the Gaussian on vectors."""
from __future__ import annotations

import math

from .. import api
from .. import factories
from .. import linalg
from ..ops import broadcast_shapes
from . import constraints
from .distribution import Distribution
from .utils import lazy_property

__all__ = ["MultivariateNormal"]


def _lower_solve(L, B):
    return linalg.solve_triangular(L, B, upper=False)


def _squared_mahalanobis(L, diff):
    """|L^-1 diff|^2 over the last dim, for a batch of lower-triangular L and vectors diff (broadcast)."""
    n, batch = L.shape[-1], tuple(L.shape[:-2])
    batch = tuple(broadcast_shapes(batch, tuple(diff.shape[-1 - len(batch):-1]))) if batch else ()
    diff = diff.expand(tuple(broadcast_shapes(tuple(diff.shape), batch + (n,))))
    L = L.expand(batch + (n, n))
    # NOTE: the leading dims of diff that L does not have become right-hand-side columns of one solve per matrix
    outer = tuple(diff.shape[:diff.ndim - 1 - len(batch)])
    k, b = len(outer), len(batch)
    columns = diff.permute(*range(k, k + b), k + b, *range(k)).reshape(batch + (n, math.prod(outer)))
    squared = _lower_solve(L, columns).pow(2).sum(-2)
    return squared.reshape(batch + outer).permute(*range(b, b + k), *range(b))


def _precision_to_scale_tril(P):
    """L with L L^T = P^-1, without inverting P: from the Cholesky factor of P with its rows and columns reversed."""
    # NOTE: flip(P) = R R^T gives P = U U^T with U = flip(R) upper triangular, so P^-1 = (U^-T)(U^-T)^T and U^-T is
    # lower triangular: the scale_tril, found by one triangular solve
    flipped_factor = linalg.cholesky(P.flip((-2, -1)))
    upper = flipped_factor.flip((-2, -1))
    identity = factories.eye(P.shape[-1], dtype=P.dtype)
    return _lower_solve(upper.mT, identity.expand(tuple(P.shape)))


class MultivariateNormal(Distribution):
    """The normal distribution on vectors of length n with mean `loc` and a covariance given as the covariance
    matrix, the precision matrix, or the covariance's lower Cholesky factor `scale_tril`."""

    arg_constraints = {"loc": constraints.real_vector, "covariance_matrix": constraints.positive_definite,
                       "precision_matrix": constraints.positive_definite, "scale_tril": constraints.lower_cholesky}
    support = constraints.real_vector
    has_rsample = True

    def __init__(self, loc, covariance_matrix=None, precision_matrix=None, scale_tril=None, validate_args=None):
        if loc.ndim < 1:
            raise ValueError("loc must be at least one-dimensional.")
        given = [(name, m) for name, m in (("covariance_matrix", covariance_matrix),
                                            ("precision_matrix", precision_matrix), ("scale_tril", scale_tril))
                 if m is not None]
        if len(given) != 1:
            raise ValueError("Exactly one of covariance_matrix or precision_matrix or scale_tril may be specified.")
        name, matrix = given[0]
        if matrix.ndim < 2:
            what = "scale_tril matrix" if name == "scale_tril" else name
            raise ValueError(f"{what} must be at least two-dimensional, with optional leading batch dimensions")
        batch_shape = tuple(broadcast_shapes(tuple(matrix.shape[:-2]), tuple(loc.shape[:-1])))
        setattr(self, name, matrix.expand(batch_shape + (-1, -1)))
        self.loc = loc.expand(batch_shape + (-1,))
        super().__init__(batch_shape, self.loc.shape[-1:], validate_args=validate_args)
        if name == "scale_tril":
            self._unbroadcasted_scale_tril = matrix
        elif name == "covariance_matrix":
            self._unbroadcasted_scale_tril = linalg.cholesky(matrix)
        else:
            self._unbroadcasted_scale_tril = _precision_to_scale_tril(matrix)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(MultivariateNormal, _instance)
        batch_shape, n = tuple(batch_shape), self._event_shape[0]
        new.loc = self.loc.expand(batch_shape + (n,))
        new._unbroadcasted_scale_tril = self._unbroadcasted_scale_tril
        for name in ("covariance_matrix", "scale_tril", "precision_matrix"):
            if name in self.__dict__:
                setattr(new, name, self.__dict__[name].expand(batch_shape + (n, n)))
        return self._finish_expand(new, batch_shape)

    def _matrix_shape(self):
        n = self._event_shape[0]
        return tuple(self._batch_shape) + (n, n)

    @lazy_property
    def scale_tril(self):
        return self._unbroadcasted_scale_tril.expand(self._matrix_shape())

    @lazy_property
    def covariance_matrix(self):
        L = self._unbroadcasted_scale_tril
        return (L @ L.mT).expand(self._matrix_shape())

    @lazy_property
    def precision_matrix(self):
        L = self._unbroadcasted_scale_tril
        identity = factories.eye(L.shape[-1], dtype=L.dtype).expand(tuple(L.shape))
        inverse = _lower_solve(L, identity)
        return (inverse.mT @ inverse).expand(self._matrix_shape())

    @property
    def mean(self):
        return self.loc

    @property
    def mode(self):
        return self.loc

    @property
    def variance(self):
        return self._unbroadcasted_scale_tril.pow(2).sum(-1).expand(tuple(self._batch_shape + self._event_shape))

    def _half_log_det(self):
        return api.diagonal(self._unbroadcasted_scale_tril, 0, -2, -1).log().sum(-1)

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        eps = factories.randn(shape, dtype=self.loc.dtype, device=self.loc.device)
        return self.loc + (self._unbroadcasted_scale_tril @ eps.unsqueeze(-1)).squeeze(-1)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        distance = _squared_mahalanobis(self._unbroadcasted_scale_tril, value - self.loc)
        return -0.5 * (self._event_shape[0] * math.log(2 * math.pi) + distance) - self._half_log_det()

    def entropy(self):
        n = self._event_shape[0]
        entropy = 0.5 * n * (1.0 + math.log(2 * math.pi)) + self._half_log_det()
        return entropy.expand(tuple(self._batch_shape)) if self._batch_shape else entropy
