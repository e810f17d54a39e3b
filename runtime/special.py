"""torch.special for runtime: the special functions runtime computes, under torch.special's names.

Most are runtime's own functions by another name (expit is sigmoid, gammaln is lgamma, psi is digamma, multigammaln
is mvlgamma); entr, xlog1py and ndtr are written here with runtime's ops, so they differentiate. The rest of
torch.special (Bessel and orthogonal-polynomial families, zeta, erfcx, ndtri, log_ndtr, the incomplete gammas)
is not here, and asking for one says so.
"""
from __future__ import annotations

import math

from . import api, factories
from .tensor import Tensor

__all__ = ["digamma", "entr", "erf", "erfc", "erfinv", "exp2", "expit", "expm1", "gammaln", "i0", "log1p",
           "log_softmax", "logit", "logsumexp", "multigammaln", "ndtr", "polygamma", "psi", "round", "sinc",
           "softmax", "xlog1py", "xlogy"]

digamma = psi = api.digamma
erf, erfc, erfinv = api.erf, api.erfc, api.erfinv
exp2, expm1, log1p = api.exp2, api.expm1, api.log1p
expit = api.sigmoid
gammaln = api.lgamma
i0 = api.i0
logit = api.logit
logsumexp = api.logsumexp
multigammaln = api.mvlgamma
polygamma = api.polygamma
round = api.round  # noqa: A001 - torch.special.round's name
sinc = api.sinc
xlogy = api.xlogy


def softmax(input, dim, *, dtype=None):
    return api.softmax(input, dim, dtype=dtype)


def log_softmax(input, dim, *, dtype=None):
    return api.log_softmax(input, dim, dtype=dtype)


def entr(input: Tensor) -> Tensor:
    """-x ln x elementwise: 0 at 0, -inf below 0."""
    positive = input > 0
    safe = api.where(positive, input, 1.0)  # NOTE: the unused branch must not put 0 * inf into the gradient
    return api.where(positive, -safe * api.log(safe), api.where(input == 0, 0.0, -math.inf))


def xlog1py(input, other) -> Tensor:
    """input * log1p(other), 0 where input is 0 (unless other is nan), as torch's."""
    input = input if isinstance(input, Tensor) else factories.tensor(input)
    other = other if isinstance(other, Tensor) else factories.tensor(other, dtype=input.dtype)
    zero = (input == 0) & ~api.isnan(other)
    safe = api.where(zero, 0.0, other)
    return api.where(zero, 0.0, input * api.log1p(safe))


def ndtr(input: Tensor) -> Tensor:
    """The standard normal CDF, through erfc so that the lower tail keeps its digits."""
    return 0.5 * api.erfc(-input / math.sqrt(2.0))


def __getattr__(name: str):
    raise AttributeError(f"runtime.special.{name} is not implemented (torch.special has more functions than "
                         f"runtime computes: {', '.join(__all__)})")
