"""StudentT(df, loc, scale): Student's t distribution, heavy-tailed for few degrees of freedom."""
from __future__ import annotations

import math

from .. import api
from .. import factories
from . import constraints
from .chi2 import Chi2
from .distribution import Distribution
from .utils import broadcast_all

__all__ = ["StudentT"]


class StudentT(Distribution):
    """loc + scale * t, t with df degrees of freedom."""

    arg_constraints = {"df": constraints.positive, "loc": constraints.real, "scale": constraints.positive}
    support = constraints.real
    has_rsample = True

    def __init__(self, df, loc=0.0, scale=1.0, validate_args=None):
        self.df, self.loc, self.scale = broadcast_all(df, loc, scale)
        self._chi2 = Chi2(self.df)
        super().__init__(self.df.shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(StudentT, _instance)
        shape = tuple(batch_shape)
        new.df, new.loc, new.scale = self.df.expand(shape), self.loc.expand(shape), self.scale.expand(shape)
        new._chi2 = self._chi2.expand(batch_shape)
        return self._finish_expand(new, batch_shape)

    @property
    def mean(self):
        return api.where(self.df <= 1, math.nan, self.loc)

    @property
    def mode(self):
        return self.loc

    @property
    def variance(self):
        finite = self.scale.pow(2) * self.df / (self.df - 2)
        return api.where(self.df > 2, finite, api.where(self.df > 1, math.inf, math.nan))

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        x = factories.randn(shape, dtype=self.df.dtype, device=self.df.device)
        z = self._chi2.rsample(sample_shape)
        return self.loc + self.scale * x * (z / self.df).rsqrt()

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        y = (value - self.loc) / self.scale
        z = (self.scale.log() + 0.5 * self.df.log() + 0.5 * math.log(math.pi) + (0.5 * self.df).lgamma()
             - (0.5 * (self.df + 1.0)).lgamma())
        return -0.5 * (self.df + 1.0) * (y ** 2.0 / self.df).log1p() - z

    def entropy(self):
        half, half_next = 0.5 * self.df, 0.5 * (self.df + 1)
        lbeta = half.lgamma() + math.lgamma(0.5) - half_next.lgamma()
        return (self.scale.log() + half_next * (half_next.digamma() - half.digamma()) + 0.5 * self.df.log()
                + lbeta)
