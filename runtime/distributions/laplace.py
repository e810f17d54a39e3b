"""Laplace(loc, scale): the double-exponential distribution."""
from __future__ import annotations

import math

from .. import factories
from ..typeinfo import finfo
from .loc_scale import LocScale

__all__ = ["Laplace"]


class Laplace(LocScale):
    """The Laplace distribution with density exp(-|x - loc| / scale) / (2 scale)."""

    @property
    def mean(self):
        return self.loc

    @property
    def mode(self):
        return self.loc

    @property
    def variance(self):
        return 2 * self.scale.pow(2)

    @property
    def stddev(self):
        return math.sqrt(2) * self.scale

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        # NOTE: u in (-1, 1), open at -1, so log1p(-|u|) stays finite
        eps = float(finfo(self.loc.dtype).eps)
        u = factories.empty(shape, dtype=self.loc.dtype, device=self.loc.device).uniform_(eps - 1, 1)
        return self.loc - self.scale * u.sign() * (-u.abs()).log1p()

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return -(2 * self.scale).log() - (value - self.loc).abs() / self.scale

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        centered = value - self.loc
        return 0.5 - 0.5 * centered.sign() * (-centered.abs() / self.scale).expm1()

    def icdf(self, value):
        term = value - 0.5
        return self.loc - self.scale * term.sign() * (-2 * term.abs()).log1p()

    def entropy(self):
        return 1 + (2 * self.scale).log()
