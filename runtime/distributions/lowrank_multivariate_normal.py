"""LowRankMultivariateNormal(loc, cov_factor, cov_diag): the Gaussian on vectors of covariance W W^T + diag(D), with
W of rank r much smaller than n, so that densities cost O(n r^2) through the r x r capacitance I + W^T D^-1 W
(Woodbury's identity for the inverse, the matrix determinant lemma for the determinant)."""
from __future__ import annotations

import math

from .. import api
from .. import factories
from .. import linalg
from ..ops import broadcast_shapes
from . import constraints
from .distribution import Distribution
from .multivariate_normal import _lower_solve
from .utils import lazy_property

__all__ = ["LowRankMultivariateNormal"]


class LowRankMultivariateNormal(Distribution):
    arg_constraints = {"loc": constraints.real_vector, "cov_factor": constraints.independent(constraints.real, 2),
                       "cov_diag": constraints.independent(constraints.positive, 1)}
    support = constraints.real_vector
    has_rsample = True

    def __init__(self, loc, cov_factor, cov_diag, validate_args=None):
        if loc.ndim < 1:
            raise ValueError("loc must be at least one-dimensional.")
        n = loc.shape[-1]
        if cov_factor.ndim < 2:
            raise ValueError("cov_factor must be at least two-dimensional, with optional leading batch dimensions")
        if tuple(cov_factor.shape[-2:-1]) != (n,):
            raise ValueError(f"cov_factor must be a batch of matrices with shape {n} x m")
        if tuple(cov_diag.shape[-1:]) != (n,):
            raise ValueError(f"cov_diag must be a batch of vectors with shape {(n,)}")
        batch_shape = tuple(broadcast_shapes(tuple(loc.shape[:-1]), tuple(cov_factor.shape[:-2]),
                                             tuple(cov_diag.shape[:-1])))
        rank = cov_factor.shape[-1]
        self.loc = loc.expand(batch_shape + (n,))
        self.cov_factor = cov_factor.expand(batch_shape + (n, rank))
        self.cov_diag = cov_diag.expand(batch_shape + (n,))
        self._unbroadcasted_cov_factor, self._unbroadcasted_cov_diag = cov_factor, cov_diag
        self._capacitance_tril = _capacitance_tril(cov_factor, cov_diag)
        super().__init__(batch_shape, (n,), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(LowRankMultivariateNormal, _instance)
        batch_shape, n = tuple(batch_shape), self._event_shape[0]
        rank = self.cov_factor.shape[-1]
        new.loc = self.loc.expand(batch_shape + (n,))
        new.cov_factor = self.cov_factor.expand(batch_shape + (n, rank))
        new.cov_diag = self.cov_diag.expand(batch_shape + (n,))
        new._unbroadcasted_cov_factor = self._unbroadcasted_cov_factor
        new._unbroadcasted_cov_diag = self._unbroadcasted_cov_diag
        new._capacitance_tril = self._capacitance_tril
        return self._finish_expand(new, batch_shape)

    @property
    def mean(self):
        return self.loc

    @property
    def mode(self):
        return self.loc

    @lazy_property
    def variance(self):
        return (self._unbroadcasted_cov_factor.pow(2).sum(-1) + self._unbroadcasted_cov_diag).expand(
            tuple(self._batch_shape + self._event_shape))

    @lazy_property
    def covariance_matrix(self):
        W, D = self._unbroadcasted_cov_factor, self._unbroadcasted_cov_diag
        return (W @ W.mT + api.diag_embed(D)).expand(self._matrix_shape())

    @lazy_property
    def precision_matrix(self):
        """Woodbury: D^-1 - D^-1 W C^-1 W^T D^-1, C the capacitance."""
        W, D = self._unbroadcasted_cov_factor, self._unbroadcasted_cov_diag
        scaled = (W / D.unsqueeze(-1)).mT  # W^T D^-1
        solved = _lower_solve(self._capacitance_tril, scaled)
        return (api.diag_embed(1 / D) - solved.mT @ solved).expand(self._matrix_shape())

    @lazy_property
    def scale_tril(self):
        return linalg.cholesky(self.covariance_matrix)

    def _matrix_shape(self):
        n = self._event_shape[0]
        return tuple(self._batch_shape) + (n, n)

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        rank = self._unbroadcasted_cov_factor.shape[-1]
        eps_w = factories.randn(tuple(shape[:-1]) + (rank,), dtype=self.loc.dtype, device=self.loc.device)
        eps_d = factories.randn(shape, dtype=self.loc.dtype, device=self.loc.device)
        low_rank = (self._unbroadcasted_cov_factor @ eps_w.unsqueeze(-1)).squeeze(-1)
        return self.loc + low_rank + self._unbroadcasted_cov_diag.sqrt() * eps_d

    def _log_det(self):
        """log det(W W^T + D) = log det(C) + sum log D (the matrix determinant lemma)."""
        capacitance = 2 * api.diagonal(self._capacitance_tril, 0, -2, -1).log().sum(-1)
        return capacitance + self._unbroadcasted_cov_diag.log().sum(-1)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        diff = value - self.loc
        W, D = self._unbroadcasted_cov_factor, self._unbroadcasted_cov_diag
        # diff^T (W W^T + D)^-1 diff = diff^T D^-1 diff - |L^-1 W^T D^-1 diff|^2, L L^T the capacitance
        scaled = diff / D
        projected = (W.mT @ scaled.unsqueeze(-1)).squeeze(-1)
        shape = tuple(broadcast_shapes(tuple(projected.shape[:-1]), tuple(self._capacitance_tril.shape[:-2])))
        tril = self._capacitance_tril.expand(shape + tuple(self._capacitance_tril.shape[-2:]))
        solved = _lower_solve(tril, projected.expand(shape + projected.shape[-1:]).unsqueeze(-1)).squeeze(-1)
        distance = (diff * scaled).sum(-1) - solved.pow(2).sum(-1)
        return -0.5 * (self._event_shape[0] * math.log(2 * math.pi) + distance + self._log_det())

    def entropy(self):
        n = self._event_shape[0]
        entropy = 0.5 * (n * (1.0 + math.log(2 * math.pi)) + self._log_det())
        return entropy.expand(tuple(self._batch_shape)) if self._batch_shape else entropy


def _capacitance_tril(W, D):
    """The lower Cholesky factor of I + W^T D^-1 W (r x r)."""
    rank = W.shape[-1]
    capacitance = (W.mT / D.unsqueeze(-2)) @ W + factories.eye(rank, dtype=W.dtype)
    return linalg.cholesky(capacitance)
