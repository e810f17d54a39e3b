"""The location-scale families' shared parameters: a real `loc` and a positive `scale`, broadcast together."""
from __future__ import annotations

from . import constraints
from .distribution import Distribution
from .utils import broadcast_all, is_number

__all__ = ["LocScale"]


class LocScale(Distribution):
    """A distribution of loc + scale * (a standard draw): Normal, Laplace, Cauchy, Gumbel."""

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.real
    has_rsample = True

    def __init__(self, loc, scale, validate_args=None):
        self.loc, self.scale = broadcast_all(loc, scale)
        batch_shape = () if is_number(loc) and is_number(scale) else self.loc.shape
        super().__init__(batch_shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        # NOTE: checked against the nearest runtime class (Normal for a user's subclass of it), as torch names it
        family = next(c for c in type(self).__mro__ if c.__module__.startswith(__package__ + "."))
        new = self._get_checked_instance(family, _instance)
        new.loc, new.scale = self.loc.expand(tuple(batch_shape)), self.scale.expand(tuple(batch_shape))
        return self._finish_expand(new, batch_shape)
