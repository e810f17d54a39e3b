"""kl_divergence(p, q) in closed form for registered pairs of distribution types, and register_kl to add pairs."""
from __future__ import annotations

import math
import warnings

from .. import api
from . import multivariate_normal as _mvn
from .bernoulli import Bernoulli
from .beta import Beta
from .binomial import Binomial
from .categorical import Categorical
from .dirichlet import Dirichlet
from .distribution import Distribution
from .exponential import Exponential
from .gamma import Gamma
from .independent import Independent
from .laplace import Laplace
from .multivariate_normal import MultivariateNormal
from .normal import Normal
from .one_hot_categorical import OneHotCategorical
from .poisson import Poisson
from .transformed_distribution import TransformedDistribution
from .uniform import Uniform
from .utils import softplus, sum_rightmost

__all__ = ["register_kl", "kl_divergence"]

_KL_REGISTRY: dict = {}
_KL_DISPATCH_CACHE: dict = {}


def register_kl(type_p, type_q):
    """Decorator registering fn(p, q) as KL(p || q) for p of type_p and q of type_q (and their subclasses)."""
    for name, cls in (("type_p", type_p), ("type_q", type_q)):
        if not (isinstance(cls, type) and issubclass(cls, Distribution)):
            raise TypeError(f"Expected {name} to be a Distribution subclass but got {cls}")

    def decorator(fn):
        _KL_REGISTRY[type_p, type_q] = fn
        _KL_DISPATCH_CACHE.clear()
        return fn

    return decorator


def _distance(cls, base) -> int:
    """How many steps up cls's method resolution order `base` is (0: cls itself)."""
    return cls.__mro__.index(base)


def _dispatch_kl(type_p, type_q):
    """The registered function for the most specific registered pair both types derive from, or None. Where p's
    closest match and q's closest match disagree, the pair is ambiguous: p's wins, with a warning."""
    matches = [(p, q) for p, q in _KL_REGISTRY if issubclass(type_p, p) and issubclass(type_q, q)]
    if not matches:
        return None
    left = min(matches, key=lambda m: (_distance(type_p, m[0]), _distance(type_q, m[1])))
    right = min(matches, key=lambda m: (_distance(type_q, m[1]), _distance(type_p, m[0])))
    if _KL_REGISTRY[left] is not _KL_REGISTRY[right]:
        warnings.warn(f"Ambiguous kl_divergence({type_p.__name__}, {type_q.__name__}). Please register_kl("
                      f"{left[0].__name__}, {right[1].__name__})", RuntimeWarning, stacklevel=3)
    return _KL_REGISTRY[left]


def kl_divergence(p, q):
    """KL(p || q) = E_p[log p(x) - log q(x)], batched over the two distributions' (broadcast) batch shapes."""
    key = (type(p), type(q))
    if key not in _KL_DISPATCH_CACHE:
        _KL_DISPATCH_CACHE[key] = _dispatch_kl(*key)
    fn = _KL_DISPATCH_CACHE[key]
    if fn is None:
        raise NotImplementedError(f"No KL(p || q) is implemented for p type {p.__class__.__name__} and q type "
                                  f"{q.__class__.__name__}")
    return fn(p, q)


def _infinite_where(condition, value):
    return api.where(condition, math.inf, value)


def _zero_where(condition, value):
    return api.where(condition, 0.0, value)


@register_kl(Normal, Normal)
def _kl_normal_normal(p, q):
    var_ratio = (p.scale / q.scale).pow(2)
    shift = ((p.loc - q.loc) / q.scale).pow(2)
    return 0.5 * (var_ratio + shift - 1 - var_ratio.log())


@register_kl(Bernoulli, Bernoulli)
def _kl_bernoulli_bernoulli(p, q):
    ones = p.probs * (softplus(-q.logits) - softplus(-p.logits))
    ones = _zero_where(p.probs == 0, _infinite_where(q.probs == 0, ones))
    zeros = (1 - p.probs) * (softplus(q.logits) - softplus(p.logits))
    zeros = _zero_where(p.probs == 1, _infinite_where(q.probs == 1, zeros))
    return ones + zeros


@register_kl(Categorical, Categorical)
def _kl_categorical_categorical(p, q):
    terms = p.probs * (p.logits - q.logits)
    # NOTE: a category p gives probability 0 adds 0 whatever q says; one only q rules out makes KL infinite
    terms = _infinite_where((q.probs == 0).expand_as(terms), terms)
    return _zero_where((p.probs == 0).expand_as(terms), terms).sum(-1)


@register_kl(OneHotCategorical, OneHotCategorical)
def _kl_onehotcategorical_onehotcategorical(p, q):
    return _kl_categorical_categorical(p._categorical, q._categorical)


@register_kl(Binomial, Binomial)
def _kl_binomial_binomial(p, q):
    if bool((p.total_count < q.total_count).any()):
        raise NotImplementedError("KL between Binomials where q.total_count > p.total_count is not implemented")
    kl = p.total_count * (p.probs * (p.logits - q.logits) + (-p.probs).log1p() - (-q.probs).log1p())
    return _infinite_where(p.total_count > q.total_count, kl)


@register_kl(Uniform, Uniform)
def _kl_uniform_uniform(p, q):
    result = ((q.high - q.low) / (p.high - p.low)).log()
    return _infinite_where((q.low > p.low) | (q.high < p.high), result)


@register_kl(Exponential, Exponential)
def _kl_exponential_exponential(p, q):
    rate_ratio = q.rate / p.rate
    return rate_ratio - rate_ratio.log() - 1


@register_kl(Laplace, Laplace)
def _kl_laplace_laplace(p, q):
    scale_ratio = p.scale / q.scale
    distance = (p.loc - q.loc).abs()
    return -scale_ratio.log() + distance / q.scale + scale_ratio * (-distance / p.scale).exp() - 1


@register_kl(Poisson, Poisson)
def _kl_poisson_poisson(p, q):
    return p.rate * (p.rate.log() - q.rate.log()) - (p.rate - q.rate)


@register_kl(Gamma, Gamma)
def _kl_gamma_gamma(p, q):
    shape_term = q.concentration * (p.rate / q.rate).log()
    normalizers = q.concentration.lgamma() - p.concentration.lgamma()
    log_term = (p.concentration - q.concentration) * p.concentration.digamma()
    linear_term = (q.rate - p.rate) * (p.concentration / p.rate)
    return shape_term + normalizers + log_term + linear_term


@register_kl(Beta, Beta)
def _kl_beta_beta(p, q):
    p_total = p.concentration1 + p.concentration0
    q_total = q.concentration1 + q.concentration0
    normalizers = (q.concentration1.lgamma() + q.concentration0.lgamma() + p_total.lgamma()
                   - p.concentration1.lgamma() - p.concentration0.lgamma() - q_total.lgamma())
    return (normalizers + (p.concentration1 - q.concentration1) * p.concentration1.digamma()
            + (p.concentration0 - q.concentration0) * p.concentration0.digamma()
            + (q_total - p_total) * p_total.digamma())


@register_kl(Dirichlet, Dirichlet)
def _kl_dirichlet_dirichlet(p, q):
    p_total, q_total = p.concentration.sum(-1), q.concentration.sum(-1)
    normalizers = p_total.lgamma() - q_total.lgamma() - (p.concentration.lgamma() - q.concentration.lgamma()).sum(-1)
    expected_log = p.concentration.digamma() - p_total.digamma().unsqueeze(-1)
    return normalizers + ((p.concentration - q.concentration) * expected_log).sum(-1)


@register_kl(MultivariateNormal, MultivariateNormal)
def _kl_multivariatenormal_multivariatenormal(p, q):
    if p.event_shape != q.event_shape:
        raise ValueError("KL-divergence between two Multivariate Normals with different event shapes cannot be "
                         "computed")
    n = p.event_shape[0]
    Lp, Lq = p._unbroadcasted_scale_tril, q._unbroadcasted_scale_tril
    batch = tuple(api.broadcast_shapes(tuple(Lq.shape[:-2]), tuple(Lp.shape[:-2])))
    # NOTE: tr(Sq^-1 Sp) = |Lq^-1 Lp|_F^2 and the log-determinant ratio is a difference of log-diagonals
    whitened = _mvn._lower_solve(Lq.expand(batch + (n, n)), Lp.expand(batch + (n, n)))
    trace = whitened.pow(2).sum((-2, -1))
    distance = _mvn._squared_mahalanobis(Lq, q.loc - p.loc)
    return q._half_log_det() - p._half_log_det() + 0.5 * (trace + distance - n)


@register_kl(Independent, Independent)
def _kl_independent_independent(p, q):
    if p.reinterpreted_batch_ndims != q.reinterpreted_batch_ndims:
        raise NotImplementedError
    return sum_rightmost(kl_divergence(p.base_dist, q.base_dist), p.reinterpreted_batch_ndims)


@register_kl(TransformedDistribution, TransformedDistribution)
def _kl_transformed_transformed(p, q):
    if p.transforms != q.transforms or p.event_shape != q.event_shape:
        raise NotImplementedError
    return kl_divergence(p.base_dist, q.base_dist)
