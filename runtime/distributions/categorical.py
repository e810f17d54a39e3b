"""Categorical(probs | logits): one of K categories, drawn in proportion to probs (or exp(logits))."""
from __future__ import annotations

import math

from .. import api
from .. import dtypes as dt
from .. import factories
from ..autograd.grad_mode import no_grad
from ..typeinfo import finfo
from . import constraints
from .distribution import Distribution
from .utils import as_size, lazy_property, logits_to_probs, one_of_probs_or_logits, probs_to_logits

__all__ = ["Categorical"]


class Categorical(Distribution):
    """Category indices 0..K-1, K the size of the parameter's last dimension; the other dimensions are the batch.
    probs need not sum to one (they are normalized), logits are normalized to log-probabilities."""

    arg_constraints = {"probs": constraints.simplex, "logits": constraints.real_vector}
    has_enumerate_support = True

    def __init__(self, probs=None, logits=None, validate_args=None):
        one_of_probs_or_logits(probs, logits)
        if probs is not None:
            if probs.ndim < 1:
                raise ValueError("`probs` parameter must be at least one-dimensional.")
            self.probs = probs / probs.sum(-1, keepdim=True)
            self._param = self.probs
        else:
            if logits.ndim < 1:
                raise ValueError("`logits` parameter must be at least one-dimensional.")
            self.logits = logits - logits.logsumexp(-1, keepdim=True)
            self._param = self.logits
        self._num_events = self._param.shape[-1]
        super().__init__(self._param.shape[:-1], validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Categorical, _instance)
        param_shape = tuple(batch_shape) + (self._num_events,)
        for name in ("probs", "logits"):
            if name in self.__dict__:
                setattr(new, name, self.__dict__[name].expand(param_shape))
                new._param = getattr(new, name)
        new._num_events = self._num_events
        return self._finish_expand(new, batch_shape)

    @constraints.dependent_property(is_discrete=True, event_dim=0)
    def support(self):
        return constraints.integer_interval(0, self._num_events - 1)

    @lazy_property
    def logits(self):
        return probs_to_logits(self.probs)

    @lazy_property
    def probs(self):
        return logits_to_probs(self.logits)

    @property
    def param_shape(self):
        return self._param.shape

    @property
    def mean(self):
        return factories.full(tuple(self._extended_shape()), math.nan, dtype=self.probs.dtype)

    @property
    def mode(self):
        return self.probs.argmax(-1)

    @property
    def variance(self):
        return factories.full(tuple(self._extended_shape()), math.nan, dtype=self.probs.dtype)

    def sample(self, sample_shape=()):
        sample_shape = as_size(sample_shape)
        shape = tuple(self._extended_shape(sample_shape))
        probs = self.probs.detach().reshape(-1, self._num_events)
        if sample_shape.numel() == 0 or probs.shape[0] == 0:
            return factories.zeros(shape, dtype=dt.int64)
        with no_grad():
            draws = api.multinomial(probs, sample_shape.numel(), True)
        return draws.T.reshape(shape)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        index = value.long().unsqueeze(-1)
        index, log_pmf = api.broadcast_tensors(index, self.logits)
        return log_pmf.gather(-1, index[..., :1]).squeeze(-1)

    def entropy(self):
        # NOTE: a zero probability has logit -inf when given as logits; clamped, its term 0 * finite stays 0
        logits = self.logits.clamp(min=float(finfo(self.logits.dtype).min))
        return -(logits * self.probs).sum(-1)

    def enumerate_support(self, expand=True):
        values = factories.arange(self._num_events, dtype=dt.int64).view((-1,) + (1,) * len(self._batch_shape))
        return values.expand((-1,) + tuple(self._batch_shape)) if expand else values
