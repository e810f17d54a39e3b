"""Gumbel(loc, scale): the distribution of a maximum (extreme value type I)."""
from __future__ import annotations

import math

from .. import factories
from ..typeinfo import finfo
from .loc_scale import LocScale

__all__ = ["Gumbel"]

_EULER = 0.57721566490153286060


class Gumbel(LocScale):
    """Density exp(-(z + exp(-z))) / scale, z = (x - loc) / scale."""

    @property
    def mean(self):
        return self.loc + self.scale * _EULER

    @property
    def mode(self):
        return self.loc

    @property
    def stddev(self):
        return (math.pi / math.sqrt(6)) * self.scale

    @property
    def variance(self):
        return self.stddev.pow(2)

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        # NOTE: u in [tiny, 1 - eps], as torch's base Uniform, so both logs stay finite
        info = finfo(self.loc.dtype)
        u = factories.empty(shape, dtype=self.loc.dtype, device=self.loc.device).uniform_(info.tiny, 1 - info.eps)
        return self.loc - self.scale * (-u.log()).log()

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        y = (self.loc - value) / self.scale
        return (y - y.exp()) - self.scale.log()

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return (-((self.loc - value) / self.scale).exp()).exp()

    def icdf(self, value):
        return self.loc - self.scale * (-value.log()).log()

    def entropy(self):
        return self.scale.log() + (1 + _EULER)
