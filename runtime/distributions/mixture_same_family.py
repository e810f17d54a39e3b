"""MixtureSameFamily(mixture, components): a Categorical choice among K distributions of one family."""
from __future__ import annotations

from ..autograd.grad_mode import no_grad
from ..tensor import Size
from . import constraints
from .categorical import Categorical
from .distribution import Distribution
from .utils import as_size

__all__ = ["MixtureSameFamily", "MixtureSameFamilyConstraint"]


class MixtureSameFamilyConstraint(constraints.Constraint):
    """The component distribution's support, checked with the component dimension put back into the value: a value
    is valid when it lies in the support of every component."""

    def __init__(self, base_constraint):
        if not isinstance(base_constraint, constraints.Constraint):
            raise AssertionError(f"base_constraint must be a Constraint, got {type(base_constraint).__name__}")
        self.base_constraint = base_constraint

    @property
    def is_discrete(self) -> bool:
        return self.base_constraint.is_discrete

    @property
    def event_dim(self) -> int:
        return self.base_constraint.event_dim

    def check(self, value):
        result = self.base_constraint.check(value.unsqueeze(-1 - self.event_dim))
        if value.ndim < self.event_dim:
            raise ValueError(f"Expected value.dim() >= {self.event_dim} but got {value.ndim}")
        kept = value.ndim - self.event_dim
        return result.reshape(tuple(result.shape[:kept]) + (-1,)).all(-1)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_constraint!r})"


class MixtureSameFamily(Distribution):
    """A batch of mixtures: `mixture_distribution` (a Categorical over K) picks which of the K components (the
    rightmost batch dimension of `component_distribution`) a draw comes from. Not reparameterizable."""

    arg_constraints = {}
    has_rsample = False

    def __init__(self, mixture_distribution, component_distribution, validate_args=None):
        self._mixture_distribution = mixture_distribution
        self._component_distribution = component_distribution
        if not isinstance(mixture_distribution, Categorical):
            raise ValueError(" The Mixture distribution needs to be an  instance of torch.distributions.Categorical")
        if not isinstance(component_distribution, Distribution):
            raise ValueError("The Component distribution needs to be an instance of torch.distributions.Distribution")
        mixture_batch = mixture_distribution.batch_shape
        component_batch = Size(component_distribution.batch_shape[:-1])
        for size1, size2 in zip(reversed(mixture_batch), reversed(component_batch)):
            if size1 != 1 and size2 != 1 and size1 != size2:
                raise ValueError(f"`mixture_distribution.batch_shape` ({mixture_batch}) is not compatible with "
                                 f"`component_distribution.batch_shape`({component_batch})")
        mixture_k = mixture_distribution.logits.shape[-1]
        component_k = component_distribution.batch_shape[-1]
        if mixture_k != component_k:
            raise ValueError(f"`mixture_distribution component` ({mixture_k}) does not equal "
                             f"`component_distribution.batch_shape[-1]` ({component_k})")
        self._num_component = mixture_k
        self._event_ndims = len(component_distribution.event_shape)
        super().__init__(component_batch, component_distribution.event_shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(MixtureSameFamily, _instance)
        batch_shape = Size(batch_shape)
        new._component_distribution = self._component_distribution.expand(tuple(batch_shape) + (self._num_component,))
        new._mixture_distribution = self._mixture_distribution.expand(batch_shape)
        new._num_component = self._num_component
        new._event_ndims = self._event_ndims
        return self._finish_expand(new, batch_shape, new._component_distribution.event_shape)

    @constraints.dependent_property
    def support(self):
        return MixtureSameFamilyConstraint(self._component_distribution.support)

    @property
    def mixture_distribution(self):
        return self._mixture_distribution

    @property
    def component_distribution(self):
        return self._component_distribution

    def _pad(self, x):
        """x with a component dimension inserted just left of its event dims."""
        return x.unsqueeze(-1 - self._event_ndims)

    def _component_weights(self):
        """The mixture probabilities shaped [B, K, 1...] (one 1 per event dim), to weight per-component values."""
        probs = self._mixture_distribution.probs
        return probs.reshape(tuple(probs.shape) + (1,) * self._event_ndims)

    @property
    def mean(self):
        return (self._component_weights() * self._component_distribution.mean).sum(-1 - self._event_ndims)

    @property
    def variance(self):
        # NOTE: the law of total variance, Var(Y) = E[Var(Y | X)] + Var(E[Y | X]), X the chosen component
        weights, component_mean = self._component_weights(), self._component_distribution.mean
        dim = -1 - self._event_ndims
        mean_of_variances = (weights * self._component_distribution.variance).sum(dim)
        variance_of_means = (weights * (component_mean - self._pad(self.mean)).pow(2)).sum(dim)
        return mean_of_variances + variance_of_means

    def cdf(self, x):
        return (self._component_distribution.cdf(self._pad(x)) * self._mixture_distribution.probs).sum(-1)

    def log_prob(self, x):
        if self._validate_args:
            self._validate_sample(x)
        log_prob_x = self._component_distribution.log_prob(self._pad(x))  # [S, B, K]
        log_mix_prob = self._mixture_distribution.logits.log_softmax(-1)  # [B, K]
        return (log_prob_x + log_mix_prob).logsumexp(-1)  # [S, B]

    def sample(self, sample_shape=()):
        sample_shape = as_size(sample_shape)
        mixture = self._mixture_distribution
        if mixture.batch_shape != self._batch_shape:
            # NOTE: each mixture of the batch picks its own component, also where the weights are shared
            mixture = mixture.expand(self._batch_shape)
        with no_grad():
            choice = mixture.sample(sample_shape)  # [S, B]
            draws = self._component_distribution.sample(sample_shape)  # [S, B, K, E]
            dim = len(sample_shape) + len(self._batch_shape)
            index = choice.reshape(tuple(choice.shape) + (1,) * (self._event_ndims + 1))
            index = index.expand(tuple(choice.shape) + (1,) + tuple(self._event_shape))
            return draws.gather(dim, index).squeeze(dim)

    def __repr__(self) -> str:
        return f"MixtureSameFamily(\n  {self._mixture_distribution},\n  {self._component_distribution})"
