"""Binomial(total_count, probs | logits): the number of successes in total_count coin flips."""
from __future__ import annotations

from .. import api
from .. import factories
from ..autograd.grad_mode import no_grad
from . import constraints
from .distribution import Distribution
from .utils import BinaryProbsOrLogits, broadcast_all, one_of_probs_or_logits, softplus

__all__ = ["Binomial"]


class Binomial(BinaryProbsOrLogits, Distribution):
    """Counts 0..total_count, each flip a success with probability probs (or sigmoid(logits))."""

    arg_constraints = {"total_count": constraints.nonnegative_integer, "probs": constraints.unit_interval,
                       "logits": constraints.real}
    has_enumerate_support = True

    def __init__(self, total_count=1, probs=None, logits=None, validate_args=None):
        one_of_probs_or_logits(probs, logits)
        total_count, param = broadcast_all(total_count, probs if probs is not None else logits)
        self.total_count = total_count.type_as(param)
        if probs is not None:
            self.probs = param
        else:
            self.logits = param
        self._param = param
        super().__init__(param.shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Binomial, _instance)
        shape = tuple(batch_shape)
        new.total_count = self.total_count.expand(shape)
        self._expand_parameter(new, shape)
        return self._finish_expand(new, batch_shape)

    @constraints.dependent_property(is_discrete=True, event_dim=0)
    def support(self):
        return constraints.integer_interval(0, self.total_count)

    @property
    def mean(self):
        return self.total_count * self.probs

    @property
    def mode(self):
        return ((self.total_count + 1) * self.probs).floor().clamp(max=self.total_count)

    @property
    def variance(self):
        return self.total_count * self.probs * (1 - self.probs)

    def sample(self, sample_shape=()):
        shape = tuple(self._extended_shape(sample_shape))
        with no_grad():
            return api.binomial(self.total_count.expand(shape), self.probs.expand(shape))

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        n, logits = self.total_count, self.logits
        log_binomial_coefficient = (n + 1).lgamma() - (value + 1).lgamma() - (n - value + 1).lgamma()
        return log_binomial_coefficient + value * logits - n * softplus(logits)

    def _homogeneous_count(self, what: str) -> int:
        count = int(self.total_count.max())
        if not int(self.total_count.min()) == count:
            raise NotImplementedError(f"Inhomogeneous total count not supported by `{what}`.")
        return count

    def entropy(self):
        self._homogeneous_count("entropy")
        log_prob = self.log_prob(self.enumerate_support(False))
        return -(log_prob.exp() * log_prob).sum(0)

    def enumerate_support(self, expand=True):
        count = self._homogeneous_count("enumerate_support")
        values = factories.arange(1 + count, dtype=self._param.dtype).view((-1,) + (1,) * len(self._batch_shape))
        return values.expand((-1,) + tuple(self._batch_shape)) if expand else values
