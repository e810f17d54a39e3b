"""Gumbel(loc, scale): the distribution of a maximum (extreme value type I)."""
from __future__ import annotations

import math

from .. import factories
from ..typeinfo import finfo
from . import constraints
from .distribution import Distribution
from .utils import broadcast_all, is_number

__all__ = ["Gumbel"]

_EULER = 0.57721566490153286060


class Gumbel(Distribution):
    """Density exp(-(z + exp(-z))) / scale, z = (x - loc) / scale."""

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.real
    has_rsample = True

    def __init__(self, loc, scale, validate_args=None):
        self.loc, self.scale = broadcast_all(loc, scale)
        batch_shape = () if is_number(loc) and is_number(scale) else self.loc.shape
        super().__init__(batch_shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Gumbel, _instance)
        new.loc, new.scale = self.loc.expand(tuple(batch_shape)), self.scale.expand(tuple(batch_shape))
        return self._finish_expand(new, batch_shape)

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
