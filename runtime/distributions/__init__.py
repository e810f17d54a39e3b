"""runtime.distributions: torch.distributions' probability distributions (more to come: transforms, KL), written
with runtime's tensor ops (so they are differentiable) and drawing from runtime's generator (so manual_seed repeats
them)."""
from __future__ import annotations

from . import constraints  # noqa: F401
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
from .one_hot_categorical import OneHotCategorical, OneHotCategoricalStraightThrough
from .poisson import Poisson
from .uniform import Uniform

__all__ = ["Bernoulli", "Beta", "Binomial", "Categorical", "Dirichlet", "Distribution", "Exponential", "Gamma",
           "Independent", "Laplace", "MultivariateNormal", "Normal", "OneHotCategorical",
           "OneHotCategoricalStraightThrough", "Poisson", "Uniform", "constraints"]
