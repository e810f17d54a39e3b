"""Cauchy(loc, scale): the Lorentz distribution, with no mean or variance."""
from __future__ import annotations

import math

from .. import factories
from . import constraints
from .distribution import Distribution
from .utils import broadcast_all, is_number

__all__ = ["Cauchy"]


class Cauchy(Distribution):
    """Density 1 / (pi scale (1 + ((x - loc) / scale)^2))."""

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.real
    has_rsample = True

    def __init__(self, loc, scale, validate_args=None):
        self.loc, self.scale = broadcast_all(loc, scale)
        batch_shape = () if is_number(loc) and is_number(scale) else self.loc.shape
        super().__init__(batch_shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Cauchy, _instance)
        new.loc, new.scale = self.loc.expand(tuple(batch_shape)), self.scale.expand(tuple(batch_shape))
        return self._finish_expand(new, batch_shape)

    @property
    def mean(self):
        return factories.full(self._extended_shape(), math.nan, dtype=self.loc.dtype, device=self.loc.device)

    @property
    def mode(self):
        return self.loc

    @property
    def variance(self):
        return factories.full(self._extended_shape(), math.inf, dtype=self.loc.dtype, device=self.loc.device)

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        eps = factories.empty(shape, dtype=self.loc.dtype, device=self.loc.device).cauchy_()
        return self.loc + eps * self.scale

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return -math.log(math.pi) - self.scale.log() - (((value - self.loc) / self.scale) ** 2).log1p()

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return ((value - self.loc) / self.scale).atan() / math.pi + 0.5

    def icdf(self, value):
        return (math.pi * (value - 0.5)).tan() * self.scale + self.loc

    def entropy(self):
        return math.log(4 * math.pi) + self.scale.log()
