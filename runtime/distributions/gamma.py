"""Gamma(concentration, rate): the gamma distribution, with implicit reparameterization gradients."""
from __future__ import annotations

from ..typeinfo import finfo
from . import constraints
from ._standard_gamma import regularized_gamma_p, standard_gamma
from .distribution import Distribution
from .utils import broadcast_all, is_number

__all__ = ["Gamma"]


class Gamma(Distribution):
    """Density rate^a x^(a-1) exp(-rate x) / Gamma(a) on x > 0, a the concentration."""

    arg_constraints = {"concentration": constraints.positive, "rate": constraints.positive}
    support = constraints.nonnegative
    has_rsample = True

    def __init__(self, concentration, rate, validate_args=None):
        self.concentration, self.rate = broadcast_all(concentration, rate)
        batch_shape = () if is_number(concentration) and is_number(rate) else self.concentration.shape
        super().__init__(batch_shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Gamma, _instance)
        shape = tuple(batch_shape)
        new.concentration, new.rate = self.concentration.expand(shape), self.rate.expand(shape)
        return self._finish_expand(new, batch_shape)

    @property
    def mean(self):
        return self.concentration / self.rate

    @property
    def mode(self):
        return ((self.concentration - 1) / self.rate).clamp(min=0)

    @property
    def variance(self):
        return self.concentration / self.rate.pow(2)

    def rsample(self, sample_shape=()):
        shape = tuple(self._extended_shape(sample_shape))
        value = standard_gamma(self.concentration.expand(shape)) / self.rate.expand(shape)
        # NOTE: in place on the detached values: the forward value stays positive, the gradient is unchanged
        value.detach().clamp_(min=float(finfo(value.dtype).tiny))
        return value

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        a, rate = self.concentration, self.rate
        return a.xlogy(rate) + (a - 1).xlogy(value) - rate * value - a.lgamma()

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        a, scaled = broadcast_all(self.concentration, self.rate * value)
        return regularized_gamma_p(a, scaled)

    def entropy(self):
        a = self.concentration
        return a - self.rate.log() + a.lgamma() + (1.0 - a) * a.digamma()
