"""Beta(concentration1, concentration0): distributions over [0, 1], a two-category Dirichlet."""
from __future__ import annotations

from .. import api
from . import constraints
from .dirichlet import Dirichlet
from .distribution import Distribution
from .utils import broadcast_all, is_number

__all__ = ["Beta"]


class Beta(Distribution):
    """Density proportional to x^(concentration1 - 1) (1 - x)^(concentration0 - 1) on [0, 1]."""

    arg_constraints = {"concentration1": constraints.positive, "concentration0": constraints.positive}
    support = constraints.unit_interval
    has_rsample = True

    def __init__(self, concentration1, concentration0, validate_args=None):
        if is_number(concentration1) and is_number(concentration0):
            pair = api.stack(broadcast_all(float(concentration1), float(concentration0)), -1)
        else:
            pair = api.stack(broadcast_all(concentration1, concentration0), -1)
        self._dirichlet = Dirichlet(pair, validate_args=validate_args)
        super().__init__(self._dirichlet.batch_shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Beta, _instance)
        new._dirichlet = self._dirichlet.expand(batch_shape)
        return self._finish_expand(new, batch_shape)

    @property
    def concentration1(self):
        return self._dirichlet.concentration[..., 0]

    @property
    def concentration0(self):
        return self._dirichlet.concentration[..., 1]

    @property
    def mean(self):
        return self.concentration1 / (self.concentration1 + self.concentration0)

    @property
    def mode(self):
        return self._dirichlet.mode[..., 0]

    @property
    def variance(self):
        total = self.concentration1 + self.concentration0
        return self.concentration1 * self.concentration0 / (total.pow(2) * (total + 1))

    def rsample(self, sample_shape=()):
        return self._dirichlet.rsample(sample_shape).select(-1, 0)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return self._dirichlet.log_prob(api.stack([value, 1.0 - value], -1))

    def entropy(self):
        return self._dirichlet.entropy()
