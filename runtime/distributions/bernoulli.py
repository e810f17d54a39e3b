"""Bernoulli(probs | logits): a coin flip, 1 with probability probs."""
from __future__ import annotations

import math

from .. import api
from .. import factories
from ..autograd.grad_mode import no_grad
from . import constraints
from .distribution import Distribution
from .utils import BinaryProbsOrLogits, broadcast_all, softplus

__all__ = ["Bernoulli"]


class Bernoulli(BinaryProbsOrLogits, Distribution):
    """Values 0 and 1, 1 with probability `probs` (or sigmoid(`logits`))."""

    arg_constraints = {"probs": constraints.unit_interval, "logits": constraints.real}
    support = constraints.boolean
    has_enumerate_support = True

    def __init__(self, probs=None, logits=None, validate_args=None):
        super().__init__(self._set_parameter(probs, logits), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Bernoulli, _instance)
        self._expand_parameter(new, batch_shape)
        return self._finish_expand(new, batch_shape)

    @property
    def mean(self):
        return self.probs

    @property
    def mode(self):
        mode = (self.probs >= 0.5).type_as(self.probs)
        return api.where(self.probs == 0.5, math.nan, mode)

    @property
    def variance(self):
        return self.probs * (1 - self.probs)

    def sample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        with no_grad():
            return api.bernoulli(self.probs.expand(tuple(shape)))

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        logits, value = broadcast_all(self.logits, value)
        return value * logits - softplus(logits)

    def entropy(self):
        return softplus(self.logits) - self.probs * self.logits

    def enumerate_support(self, expand=True):
        values = factories.arange(2, dtype=self._param.dtype).view((-1,) + (1,) * len(self._batch_shape))
        return values.expand((-1,) + tuple(self._batch_shape)) if expand else values
