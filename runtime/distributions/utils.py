"""Helpers the distributions share: broadcasting parameters, probabilities <-> logits, lazily derived parameters."""
from __future__ import annotations

import math
import numbers

import numpy as np

from .. import api
from .. import dtypes as dt
from ..autograd.grad_mode import enable_grad
from ..factories import tensor
from ..ops import is_tensor_like
from ..tensor import Size, Tensor
from ..typeinfo import finfo

__all__ = ["broadcast_all", "logits_to_probs", "clamp_probs", "probs_to_logits", "lazy_property",
           "tril_matrix_to_vec", "vec_to_tril_matrix"]

euler_constant = 0.5772156649015329


def is_number(value) -> bool:
    """A plain Python (or numpy) number, which a distribution turns into a tensor of the default dtype."""
    return isinstance(value, numbers.Number) and not isinstance(value, Tensor)


def as_size(shape) -> Size:
    """A sample_shape as a Size: accepts a Size, a tuple or list of ints, or one int."""
    if isinstance(shape, numbers.Integral):
        return Size((int(shape),))
    return Size(tuple(int(s) for s in shape))


def broadcast_all(*values):
    """Numbers and tensors as tensors of one broadcast shape; numbers take the first tensor's dtype and device (or
    the default dtype)."""
    # NOTE: a tensor-like (a compiler's traced value) counts as a tensor, as torch's __torch_function__ objects do
    tensors_in = [isinstance(v, Tensor) or is_tensor_like(v) for v in values]
    if not all(t or is_number(v) for t, v in zip(tensors_in, values)):
        raise ValueError("Input arguments must all be instances of Number, torch.Tensor or objects implementing "
                         "__torch_function__.")
    like = next((v for t, v in zip(tensors_in, values) if t), None)
    options = {"dtype": dt.get_default_dtype()} if like is None else {"dtype": like.dtype, "device": like.device}
    tensors = [v if t else tensor(v, **options) for t, v in zip(tensors_in, values)]
    return tuple(api.broadcast_tensors(*tensors))


def clamp_probs(probs):
    """Probabilities kept eps away from 0 and 1, so their logs stay finite."""
    eps = float(finfo(probs.dtype).eps)
    return probs.clamp(min=eps, max=1 - eps)


def logits_to_probs(logits, is_binary: bool = False):
    return logits.sigmoid() if is_binary else logits.softmax(-1)


def probs_to_logits(probs, is_binary: bool = False):
    clamped = clamp_probs(probs)
    return clamped.log() - (-clamped).log1p() if is_binary else clamped.log()


def softplus(x):
    """log(1 + exp(x)) to full precision for every x; its gradient is sigmoid(x), also at 0."""
    # NOTE: exp only of the non-positive value; the gradient of where(x > 0, -x, x) is never 0, unlike -|x|'s at 0
    small = api.where(x > 0, -x, x).exp().log1p()
    return api.where(x > 0, x + small, small)


def sum_rightmost(value, dims: int):
    """value summed over its `dims` rightmost dimensions."""
    if dims == 0:
        return value
    kept = tuple(value.shape[:value.ndim - dims])
    return value.reshape(kept + (math.prod(value.shape[value.ndim - dims:]),)).sum(-1)


class lazy_property:
    """A parameter computed from another on first use (under enable_grad, so it stays differentiable), then cached
    on the instance. Read on the class, it is the descriptor itself: argument validation skips such parameters."""

    def __init__(self, wrapped):
        self.wrapped = wrapped
        self.__name__ = wrapped.__name__
        self.__doc__ = wrapped.__doc__

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        with enable_grad():
            value = self.wrapped(instance)
        setattr(instance, self.wrapped.__name__, value)
        return value


def _tril_mask(n: int, diag: int) -> np.ndarray:
    rows = np.arange(n)
    return rows[None, :] < rows[:, None] + (diag + 1)


def tril_matrix_to_vec(mat, diag: int = 0):
    """The entries of mat's lower triangle (below diagonal `diag`), row by row, as the last dimension."""
    n = mat.shape[-1]
    if not -n <= diag < n:
        raise ValueError(f"diag ({diag}) provided is outside [{-n}, {n - 1}].")
    rows, cols = np.nonzero(_tril_mask(n, diag))
    flat = mat.reshape(tuple(mat.shape[:-2]) + (n * n,))
    return flat[..., mat.new_tensor(rows * n + cols, dtype=dt.int64)]


def vec_to_tril_matrix(vec, diag: int = 0):
    """The inverse of tril_matrix_to_vec: a square matrix with vec's entries in its lower triangle, zeros elsewhere."""
    k = vec.shape[-1]
    n = round((-(1 + 2 * diag) + ((1 + 2 * diag) ** 2 + 8 * k + 4 * abs(diag) * (diag + 1)) ** 0.5) / 2)
    rows, cols = np.nonzero(_tril_mask(n, diag))
    if len(rows) != k:
        raise ValueError(f"The size of last dimension is {k} which cannot be expressed as the lower triangular part "
                         "of a square D x D matrix.")
    # NOTE: a scatter into the flattened matrix (a gather's adjoint), so the result stays differentiable in vec
    flat = vec.new_zeros(tuple(vec.shape[:-1]) + (n * n,))
    index = vec.new_tensor(rows * n + cols, dtype=dt.int64).expand(tuple(vec.shape))
    return flat.scatter_add(-1, index, vec).reshape(tuple(vec.shape[:-1]) + (n, n))


def one_of_probs_or_logits(probs, logits) -> None:
    if (probs is None) == (logits is None):
        raise ValueError("Either `probs` or `logits` must be specified, but not both.")


class BinaryProbsOrLogits:
    """A two-outcome parameter given as `probs` or `logits` (in _param), the other computed from it on first use."""

    @lazy_property
    def logits(self):
        return probs_to_logits(self.probs, is_binary=True)

    @lazy_property
    def probs(self):
        return logits_to_probs(self.logits, is_binary=True)

    @property
    def param_shape(self):
        return self._param.shape

    def _set_parameter(self, probs, logits):
        """Keep whichever of probs and logits is given (exactly one must be, as torch says); the batch shape it
        gives."""
        one_of_probs_or_logits(probs, logits)
        given = probs if probs is not None else logits
        (param,) = broadcast_all(given)
        if probs is not None:
            self.probs = param
        else:
            self.logits = param
        self._param = param
        return () if is_number(given) else param.shape

    def _expand_parameter(self, new, batch_shape) -> None:
        """Give `new` (an expand's instance) this one's given parameter, expanded to batch_shape."""
        for name in ("probs", "logits"):
            if name in self.__dict__:
                setattr(new, name, self.__dict__[name].expand(tuple(batch_shape)))
                new._param = getattr(new, name)


class RelaxedParameters:
    """temperature, logits and probs of a relaxed distribution (a TransformedDistribution), read from its base."""

    @property
    def temperature(self):
        return self.base_dist.temperature

    @property
    def logits(self):
        return self.base_dist.logits

    @property
    def probs(self):
        return self.base_dist.probs
