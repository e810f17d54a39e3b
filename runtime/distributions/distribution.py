"""Distribution: the base class, with batch/event shapes, sampling defaults and argument validation."""
from __future__ import annotations

import warnings

from ..autograd.grad_mode import no_grad
from ..ops import is_tensor_like
from ..tensor import Size, Tensor
from . import constraints
from .utils import as_size, lazy_property

__all__ = ["Distribution"]


def _shown(value) -> str:
    """A tensor as torch's validation messages show it: a 0-d tensor as its number, any other as printed."""
    return f"{value.item()}" if isinstance(value, Tensor) and value.ndim == 0 else f"{value}"


class Distribution:
    """A batch of probability distributions of one family: `batch_shape` indexes independent distributions, each a
    distribution over values of `event_shape`."""

    has_rsample = False
    has_enumerate_support = False
    _validate_args = __debug__

    @staticmethod
    def set_default_validate_args(value: bool) -> None:
        """Turn checking of parameters and of values passed to log_prob on or off for every distribution."""
        if value not in (True, False):
            raise ValueError
        Distribution._validate_args = value

    def __init__(self, batch_shape=(), event_shape=(), validate_args=None):
        self._batch_shape = Size(batch_shape)
        self._event_shape = Size(event_shape)
        if validate_args is not None:
            self._validate_args = validate_args
        if self._validate_args:
            self._check_parameters()

    def _check_parameters(self) -> None:
        try:
            arg_constraints = self.arg_constraints
        except NotImplementedError:
            arg_constraints = {}
            warnings.warn(f"{self.__class__} does not define `arg_constraints`. Please set `arg_constraints = {{}}` or "
                          "initialize the distribution with `validate_args=False` to turn off validation.",
                          stacklevel=3)
        for name, constraint in arg_constraints.items():
            if constraints.is_dependent(constraint) or self._is_lazy_and_unset(name):
                continue
            value = getattr(self, name)
            if _traced(value):  # a compiler's stand-in: its values are not known while tracing
                continue
            if not bool(constraint.check(value).all()):
                raise ValueError(f"Expected parameter {name} ({type(value).__name__} of shape {tuple(value.shape)}) "
                                 f"of distribution {self!r} to satisfy the constraint {constraint!r}, but found "
                                 f"invalid values:\n{_shown(value)}")

    def _is_lazy_and_unset(self, name: str) -> bool:
        """A parameter derived from another one on first use (probs from logits): validation does not build it."""
        return name not in self.__dict__ and isinstance(getattr(type(self), name, None), lazy_property)

    def expand(self, batch_shape, _instance=None):
        """A distribution with the same parameters viewed (not copied) with a larger batch_shape."""
        raise NotImplementedError

    def _get_checked_instance(self, cls, _instance=None):
        if _instance is None and type(self).__init__ != cls.__init__:
            raise NotImplementedError(f"Subclass {self.__class__.__name__} of {cls.__name__} that defines a custom "
                                      "__init__ method must also define a custom .expand() method.")
        return self.__new__(type(self)) if _instance is None else _instance

    def _finish_expand(self, new, batch_shape, event_shape=None):
        """Set up an expanded copy `new` (parameters already set): shapes, and this distribution's validation flag."""
        Distribution.__init__(new, batch_shape, self._event_shape if event_shape is None else event_shape,
                              validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def batch_shape(self) -> Size:
        return self._batch_shape

    @property
    def event_shape(self) -> Size:
        return self._event_shape

    @property
    def arg_constraints(self) -> dict:
        raise NotImplementedError

    @property
    def support(self):
        raise NotImplementedError

    @property
    def mean(self):
        raise NotImplementedError

    @property
    def mode(self):
        raise NotImplementedError(f"{self.__class__} does not implement mode")

    @property
    def variance(self):
        raise NotImplementedError

    @property
    def stddev(self):
        return self.variance.sqrt()

    def sample(self, sample_shape=()):
        """A sample of shape sample_shape + batch_shape + event_shape, outside autograd."""
        with no_grad():
            return self.rsample(sample_shape)

    def rsample(self, sample_shape=()):
        """A sample that is a differentiable function of the parameters (the reparameterization trick)."""
        raise NotImplementedError

    def sample_n(self, n: int):
        warnings.warn("`sample_n(n)` will be deprecated. Use `sample((n,))` instead.", FutureWarning, stacklevel=2)
        return self.sample((n,))

    def log_prob(self, value):
        raise NotImplementedError

    def cdf(self, value):
        raise NotImplementedError

    def icdf(self, value):
        raise NotImplementedError

    def enumerate_support(self, expand: bool = True):
        raise NotImplementedError

    def entropy(self):
        raise NotImplementedError

    def perplexity(self):
        return self.entropy().exp()

    def _extended_shape(self, sample_shape=()) -> Size:
        return Size(as_size(sample_shape) + self._batch_shape + self._event_shape)

    def _validate_sample(self, value) -> None:
        """Raise torch's ValueError unless value is a tensor whose shape broadcasts with batch_shape + event_shape
        and whose entries lie in the support."""
        if not isinstance(value, Tensor) and not _traced(value):
            raise ValueError("The value argument to log_prob must be a Tensor")
        self._check_sample_shape(value.shape)
        try:
            support = self.support
        except NotImplementedError:
            warnings.warn(f"{self.__class__} does not define `support` to enable sample validation. Please initialize "
                          "the distribution with `validate_args=False` to turn off validation.", stacklevel=3)
            return
        if not _traced(value) and not bool(support.check(value).all()):
            raise ValueError(f"Expected value argument ({type(value).__name__} of shape {tuple(value.shape)}) to be "
                             f"within the support ({support!r}) of the distribution {self!r}, but found invalid "
                             f"values:\n{_shown(value)}")

    def _check_sample_shape(self, shape) -> None:
        shape = Size(shape)
        event_start = max(len(shape) - len(self._event_shape), 0)
        if Size(shape[event_start:]) != self._event_shape:
            raise ValueError(f"The right-most size of value must match event_shape: {shape} vs {self._event_shape}.")
        expected = Size(self._batch_shape + self._event_shape)
        for actual_size, expected_size in zip(reversed(shape), reversed(expected)):
            if actual_size != 1 and expected_size != 1 and actual_size != expected_size:
                raise ValueError(f"Value is not broadcastable with batch_shape+event_shape: {shape} vs {expected}.")

    def __repr__(self) -> str:
        shown = []
        for name in self.arg_constraints:
            if name in self.__dict__:
                value = self.__dict__[name]
                shown.append(f"{name}: {value if value.numel() == 1 else value.size()}")
        return f"{type(self).__name__}({', '.join(shown)})"


def _traced(value) -> bool:
    """A compiler's stand-in for a tensor (a tracer's proxy): its shape is known, its values are not, so the value
    checks of validation run in eager mode only (as the losses' checks of their targets do)."""
    return is_tensor_like(value) and not isinstance(value, Tensor)
