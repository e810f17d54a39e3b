"""Dirichlet(concentration): distributions over the probability simplex."""
from __future__ import annotations

from .. import api
from ..nn import functional as F
from . import constraints
from ._standard_gamma import standard_gamma
from .distribution import Distribution

__all__ = ["Dirichlet"]


class Dirichlet(Distribution):
    """Probability vectors of length K (the concentration's last dimension): density proportional to
    prod_i x_i^(concentration_i - 1)."""

    arg_constraints = {"concentration": constraints.independent(constraints.positive, 1)}
    support = constraints.simplex
    has_rsample = True

    def __init__(self, concentration, validate_args=None):
        if concentration.ndim < 1:
            raise ValueError("`concentration` parameter must be at least one-dimensional.")
        self.concentration = concentration
        super().__init__(concentration.shape[:-1], concentration.shape[-1:], validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Dirichlet, _instance)
        new.concentration = self.concentration.expand(tuple(batch_shape) + tuple(self._event_shape))
        return self._finish_expand(new, batch_shape)

    def rsample(self, sample_shape=()):
        # NOTE: normalized independent gamma draws; their implicit gradients make the result reparameterized
        gammas = standard_gamma(self.concentration.expand(tuple(self._extended_shape(sample_shape))))
        return gammas / gammas.sum(-1, keepdim=True)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        a = self.concentration
        return (a - 1.0).xlogy(value).sum(-1) + a.sum(-1).lgamma() - a.lgamma().sum(-1)

    @property
    def mean(self):
        return self.concentration / self.concentration.sum(-1, keepdim=True)

    @property
    def mode(self):
        excess = (self.concentration - 1).clamp(min=0.0)
        mode = excess / excess.sum(-1, keepdim=True)
        # NOTE: with every concentration below 1 the density is unbounded at the vertices: the mode is a vertex (the
        # first, as torch picks it)
        vertex = F.one_hot(mode.argmax(-1), excess.shape[-1]).type_as(mode)
        return api.where((self.concentration < 1).all(-1, keepdim=True), vertex, mode)

    @property
    def variance(self):
        total = self.concentration.sum(-1, keepdim=True)
        return self.concentration * (total - self.concentration) / (total.pow(2) * (total + 1))

    def entropy(self):
        a = self.concentration
        k, total = a.shape[-1], a.sum(-1)
        return a.lgamma().sum(-1) - total.lgamma() - (k - total) * total.digamma() - ((a - 1.0) * a.digamma()).sum(-1)
