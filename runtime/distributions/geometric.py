"""Geometric(probs | logits): the number of failures before the first success."""
from __future__ import annotations

from .. import api
from .. import factories
from ..autograd.grad_mode import no_grad
from ..nn import functional as F
from ..tensor import Tensor
from ..typeinfo import finfo
from . import constraints
from .distribution import Distribution
from .utils import BinaryProbsOrLogits, broadcast_all

__all__ = ["Geometric"]


class Geometric(BinaryProbsOrLogits, Distribution):
    """P(k) = (1 - p)^k p for k = 0, 1, 2, ..."""

    arg_constraints = {"probs": constraints.unit_interval, "logits": constraints.real}
    support = constraints.nonnegative_integer

    def __init__(self, probs=None, logits=None, validate_args=None):
        super().__init__(self._set_parameter(probs, logits), validate_args=validate_args)
        if (self._validate_args and probs is not None and isinstance(self.probs, Tensor)
                and not bool((self.probs > 0).all())):
            invalid = self.probs.detach()[~(self.probs > 0)]
            raise ValueError(f"Expected parameter probs ({type(self.probs).__name__} of shape "
                             f"{tuple(self.probs.shape)}) of distribution {self!r} to be positive but found invalid "
                             f"values:\n{invalid}")

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Geometric, _instance)
        self._expand_parameter(new, batch_shape)
        return self._finish_expand(new, batch_shape)

    @property
    def mean(self):
        return 1.0 / self.probs - 1.0

    @property
    def mode(self):
        return factories.zeros_like(self.probs)

    @property
    def variance(self):
        return (1.0 / self.probs - 1.0) / self.probs

    def sample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        with no_grad():
            u = factories.empty(shape, dtype=self.probs.dtype, device=self.probs.device)
            u.uniform_(finfo(self.probs.dtype).tiny, 1)
            return (u.log() / (-self.probs).log1p()).floor()

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        value, probs = broadcast_all(value, self.probs)
        # NOTE: P(0) is p itself where p = 1 (0 * log(0) would be nan)
        probs = api.where((probs == 1) & (value == 0), 0.0, probs)
        return value * (-probs).log1p() + self.probs.log()

    def entropy(self):
        return F.binary_cross_entropy_with_logits(self.logits, self.probs, reduction="none") / self.probs
