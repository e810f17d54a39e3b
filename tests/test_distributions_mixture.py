"""MixtureSameFamily and the relaxed Bernoulli/categorical distributions against torch, and their sampling."""
from __future__ import annotations

import numpy as np
import pytest

import runtime
import runtime.distributions as D
from distribution_checks import check_against_torch, draws, finite_difference_gradient, ours, rsample_objective
from helpers import needs_torch, torch
from runtime.distributions.mixture_same_family import MixtureSameFamily
from runtime.distributions.relaxed_bernoulli import LogitRelaxedBernoulli, RelaxedBernoulli
from runtime.distributions.relaxed_categorical import ExpRelaxedCategorical, RelaxedOneHotCategorical

RNG = np.random.default_rng(4321)


class Ours:
    """runtime's distributions under torch's names, the new ones included (until __init__ exports them)."""

    def __getattr__(self, name):
        return globals()[name] if name in NEW else getattr(D, name)


NEW = ("MixtureSameFamily", "LogitRelaxedBernoulli", "RelaxedBernoulli", "ExpRelaxedCategorical",
       "RelaxedOneHotCategorical")


class Theirs:
    """torch's distributions, with the two it keeps in submodules only (LogitRelaxedBernoulli,
    ExpRelaxedCategorical)."""

    def __getattr__(self, name):
        from torch.distributions import relaxed_bernoulli, relaxed_categorical

        for module in (torch.distributions, relaxed_bernoulli, relaxed_categorical):
            if hasattr(module, name):
                return getattr(module, name)
        raise AttributeError(name)


def modules():
    return [(runtime, Ours())] + ([(torch, Theirs())] if torch is not None else [])


real, positive, unit = draws(RNG)


def simplex(*shape):
    p = RNG.uniform(0.2, 1.0, size=shape)
    return p / p.sum(-1, keepdims=True)


# ---------------------------------------------------------------------------------------------
# Values and parameter gradients against torch (float64).
# ---------------------------------------------------------------------------------------------

def normal_mixture(d, logits, loc, scale):
    return d.MixtureSameFamily(d.Categorical(logits=logits), d.Normal(loc, scale))


def normal_mixture_probs(d, probs, loc, scale):
    return d.MixtureSameFamily(d.Categorical(probs=probs), d.Normal(loc, scale))


def independent_mixture(d, logits, loc, scale):
    return d.MixtureSameFamily(d.Categorical(logits=logits), d.Independent(d.Normal(loc, scale), 1))


def at(value):
    """compute(distribution, module): log_prob at a fixed value."""
    return lambda dist, m: dist.log_prob(m.tensor(value))


def cdf_at(value):
    return lambda dist, m: dist.cdf(m.tensor(value))


MEAN, VARIANCE = (lambda dist, m: dist.mean), (lambda dist, m: dist.variance)

_VALUES_1 = real(5)
_VALUES_B = real(4, 2)
_VALUES_E = real(4, 2, 2)
_BERNOULLI_VALUES = unit(4, 3)
_SIMPLEX_VALUES = simplex(4, 2, 3)

CASES = {
    "mixture log_prob": (normal_mixture, [real(3), real(3), positive(3)], at(_VALUES_1)),
    "mixture mean": (normal_mixture, [real(3), real(3), positive(3)], MEAN),
    "mixture variance": (normal_mixture, [real(3), real(3), positive(3)], VARIANCE),
    "mixture cdf": (normal_mixture, [real(3), real(3), positive(3)], cdf_at(_VALUES_1)),
    "mixture probs log_prob": (normal_mixture_probs, [simplex(3), real(3), positive(3)], at(_VALUES_1)),
    "batch log_prob": (normal_mixture, [real(2, 3), real(2, 3), positive(2, 3)], at(_VALUES_B)),
    "batch mean": (normal_mixture, [real(2, 3), real(2, 3), positive(2, 3)], MEAN),
    "batch variance": (normal_mixture, [real(2, 3), real(2, 3), positive(2, 3)], VARIANCE),
    "batch cdf": (normal_mixture, [real(2, 3), real(2, 3), positive(2, 3)], cdf_at(_VALUES_B)),
    "shared weights log_prob": (normal_mixture, [real(3), real(2, 3), positive(2, 3)], at(_VALUES_B)),
    "shared weights variance": (normal_mixture, [real(3), real(2, 3), positive(2, 3)], VARIANCE),
    "2-D events log_prob": (independent_mixture, [real(2, 3), real(2, 3, 2), positive(2, 3, 2)], at(_VALUES_E)),
    "2-D events mean": (independent_mixture, [real(2, 3), real(2, 3, 2), positive(2, 3, 2)], MEAN),
    "2-D events variance": (independent_mixture, [real(2, 3), real(2, 3, 2), positive(2, 3, 2)], VARIANCE),
    "RelaxedBernoulli probs": (lambda d, t, p: d.RelaxedBernoulli(t, probs=p), [positive(3), unit(3)],
                               at(_BERNOULLI_VALUES)),
    "RelaxedBernoulli logits": (lambda d, t, lg: d.RelaxedBernoulli(t, logits=lg), [positive(), real(3)],
                                at(_BERNOULLI_VALUES)),
    "LogitRelaxedBernoulli": (lambda d, t, p: d.LogitRelaxedBernoulli(t, probs=p), [positive(3), unit(3)],
                              at(real(4, 3))),
    "RelaxedOneHotCategorical probs": (lambda d, t, p: d.RelaxedOneHotCategorical(t, probs=p),
                                       [positive(), simplex(2, 3)], at(_SIMPLEX_VALUES)),
    "RelaxedOneHotCategorical logits": (lambda d, t, lg: d.RelaxedOneHotCategorical(t, logits=lg),
                                        [positive(), real(2, 3)], at(_SIMPLEX_VALUES)),
    "ExpRelaxedCategorical": (lambda d, t, lg: d.ExpRelaxedCategorical(t, logits=lg), [positive(), real(2, 3)],
                              at(np.log(_SIMPLEX_VALUES))),
}


@needs_torch
@pytest.mark.parametrize("name", CASES)
def test_values_and_gradients_match_torch(name):
    build, params, compute = CASES[name]
    check_against_torch(build, params, compute, Ours(), Theirs(), RNG)


@needs_torch
def test_cdf_of_multivariate_components_is_not_implemented_as_in_torch():
    for m, d in modules():
        mixture = independent_mixture(d, m.zeros(3), m.zeros(3, 2), m.ones(3, 2))
        with pytest.raises(NotImplementedError):
            mixture.cdf(m.zeros(2))


# ---------------------------------------------------------------------------------------------
# Shapes: batch/event shapes, expand, properties and sample shapes.
# ---------------------------------------------------------------------------------------------

MAKERS = {
    "mixture": lambda m, d: normal_mixture(d, m.zeros(3), m.zeros(3), m.ones(3)),
    "batch mixture": lambda m, d: normal_mixture(d, m.zeros(2, 3), m.zeros(2, 3), m.ones(2, 3)),
    "shared weights": lambda m, d: normal_mixture(d, m.zeros(3), m.zeros(4, 2, 3), m.ones(4, 2, 3)),
    "2-D events": lambda m, d: independent_mixture(d, m.zeros(2, 3), m.zeros(2, 3, 2), m.ones(2, 3, 2)),
    "RelaxedBernoulli scalar": lambda m, d: d.RelaxedBernoulli(m.tensor(0.5), probs=0.3),
    "RelaxedBernoulli": lambda m, d: d.RelaxedBernoulli(m.tensor(0.5), logits=m.zeros(2, 3)),
    "LogitRelaxedBernoulli": lambda m, d: d.LogitRelaxedBernoulli(m.tensor(0.5), probs=m.full((3,), 0.4)),
    "RelaxedOneHotCategorical": lambda m, d: d.RelaxedOneHotCategorical(m.tensor(0.5), probs=m.ones(2, 4)),
    "ExpRelaxedCategorical": lambda m, d: d.ExpRelaxedCategorical(m.tensor(0.5), logits=m.zeros(4)),
}


@needs_torch
@pytest.mark.parametrize("name", MAKERS)
def test_shapes_and_flags_match_torch(name):
    got, want = MAKERS[name](runtime, Ours()), MAKERS[name](torch, Theirs())
    assert tuple(got.batch_shape) == tuple(want.batch_shape)
    assert tuple(got.event_shape) == tuple(want.event_shape)
    assert got.has_rsample == want.has_rsample
    bigger = (5,) + tuple(want.batch_shape)
    got_expanded, want_expanded = got.expand(bigger), want.expand(bigger)
    assert type(got_expanded) is type(got)
    assert tuple(got_expanded.batch_shape) == tuple(want_expanded.batch_shape)
    assert tuple(got_expanded.event_shape) == tuple(want_expanded.event_shape)
    assert tuple(got_expanded.sample((2,)).shape) == tuple(want_expanded.sample((2,)).shape)
    assert repr(got) == repr(want).replace("torch.", "runtime.")


@pytest.mark.parametrize("name", MAKERS)
@pytest.mark.parametrize("sample_shape", [(), (4,), (2, 3)])
def test_sample_shapes(name, sample_shape):
    dist = MAKERS[name](runtime, Ours())
    want = tuple(sample_shape) + tuple(dist.batch_shape) + tuple(dist.event_shape)
    assert tuple(dist.sample(sample_shape).shape) == want
    if dist.has_rsample:
        assert tuple(dist.rsample(sample_shape).shape) == want
    assert tuple(dist.log_prob(dist.sample(sample_shape)).shape) == tuple(sample_shape) + tuple(dist.batch_shape)


def test_mixture_properties_and_expand():
    mix, comp = D.Categorical(logits=runtime.zeros(2, 3)), D.Normal(runtime.zeros(2, 3), runtime.ones(2, 3))
    mixture = MixtureSameFamily(mix, comp)
    assert mixture.mixture_distribution is mix and mixture.component_distribution is comp
    assert not mixture.has_rsample
    with pytest.raises(NotImplementedError):
        mixture.rsample()
    expanded = mixture.expand((4, 2))
    assert expanded.component_distribution.batch_shape == (4, 2, 3)
    assert expanded.mixture_distribution.batch_shape == (4, 2)
    np.testing.assert_allclose(expanded.mean.numpy(), np.zeros((4, 2)))


def test_relaxed_properties():
    t, p = runtime.tensor(0.3), runtime.tensor([0.2, 0.6])
    for dist in (RelaxedBernoulli(t, probs=p), LogitRelaxedBernoulli(t, probs=p)):
        assert dist.temperature is t
        np.testing.assert_allclose(dist.probs.numpy(), p.numpy())
        np.testing.assert_allclose(dist.logits.numpy(), np.log([0.2 / 0.8, 0.6 / 0.4]), rtol=1e-6)
    probs = runtime.tensor([0.25, 0.75])
    for dist in (RelaxedOneHotCategorical(t, probs=probs), ExpRelaxedCategorical(t, probs=probs)):
        assert dist.temperature is t
        np.testing.assert_allclose(dist.probs.numpy(), probs.numpy())
        np.testing.assert_allclose(dist.logits.numpy(), np.log([0.25, 0.75]), rtol=1e-6)


def test_each_mixture_of_a_batch_picks_its_own_component_when_weights_are_shared():
    # NOTE: torch gives shape (4, 1) here (and fails when the weights have no batch dims): a bug we do not copy
    mixture = MixtureSameFamily(D.Categorical(runtime.ones(1, 2)),
                                D.Normal(runtime.tensor([[-100.0, 100.0]] * 3), runtime.ones(3, 2)))
    draws = mixture.sample((2000,)).numpy()
    assert draws.shape == (2000, 3)
    assert (np.sign(draws[:, 0]) != np.sign(draws[:, 1])).any()
    shared = MixtureSameFamily(D.Categorical(runtime.ones(2)), D.Normal(runtime.zeros(3, 2), runtime.ones(3, 2)))
    assert shared.sample((4,)).shape == (4, 3)


# ---------------------------------------------------------------------------------------------
# Sampling without torch: moments, support, repeatability, reparameterized gradients.
# ---------------------------------------------------------------------------------------------

def assert_moments_match(draws, mean, variance, sigmas=5.0):
    """Sample mean and variance within `sigmas` standard errors of the expected ones."""
    draws, mean, variance = draws.numpy(), mean.detach().numpy(), variance.detach().numpy()
    n = draws.shape[0]
    np.testing.assert_array_less(np.abs(draws.mean(0) - mean), sigmas * np.sqrt(variance / n) + 1e-12)
    centered = draws - draws.mean(0)
    variance_error = np.sqrt(((centered ** 4).mean(0) - variance ** 2) / n)
    np.testing.assert_array_less(np.abs(draws.var(0) - variance), sigmas * variance_error + 1e-12)


STATISTICS = {
    "mixture": lambda: normal_mixture(Ours(), ours([0.0, 1.0, -1.0], False), ours([-2.0, 0.0, 3.0], False),
                                      ours([0.5, 1.0, 0.7], False)),
    "batch": lambda: normal_mixture(Ours(), ours(real(2, 3), False), ours(3 * real(2, 3), False),
                                    ours(positive(2, 3), False)),
    "2-D events": lambda: independent_mixture(Ours(), ours(real(2, 3), False), ours(3 * real(2, 3, 2), False),
                                              ours(positive(2, 3, 2), False)),
}


@pytest.mark.parametrize("name", STATISTICS)
def test_mixture_sample_moments_match_mean_and_variance(name):
    runtime.manual_seed(2)
    dist = STATISTICS[name]()
    assert_moments_match(dist.sample((40000,)), dist.mean, dist.variance)


def test_relaxed_samples_lie_in_the_support():
    runtime.manual_seed(3)
    t = runtime.tensor(0.2, dtype=runtime.float64)
    bernoulli = RelaxedBernoulli(t, probs=ours([0.01, 0.5, 0.99], False)).rsample((2000,)).detach().numpy()
    assert ((bernoulli > 0) & (bernoulli < 1)).all()
    one_hot = RelaxedOneHotCategorical(t, probs=ours(simplex(2, 4), False)).rsample((2000,)).detach().numpy()
    assert (one_hot > 0).all() and (one_hot <= 1).all()
    np.testing.assert_allclose(one_hot.sum(-1), 1.0, atol=1e-12)
    log_one_hot = ExpRelaxedCategorical(t, logits=ours(real(4), False)).rsample((100,)).detach().numpy()
    np.testing.assert_allclose(np.exp(log_one_hot).sum(-1), 1.0, atol=1e-12)


def test_low_temperature_draws_follow_the_probabilities():
    runtime.manual_seed(4)
    probs = np.array([0.2, 0.5, 0.3])
    t = runtime.tensor(0.05, dtype=runtime.float64)
    draws = RelaxedOneHotCategorical(t, probs=ours(probs, False)).sample((20000,)).numpy()
    np.testing.assert_array_less(np.abs((draws.argmax(-1)[:, None] == np.arange(3)).mean(0) - probs),
                                 5 * np.sqrt(0.25 / 20000))
    coins = RelaxedBernoulli(t, probs=ours([0.3], False)).sample((20000,)).numpy()
    assert abs((coins > 0.5).mean() - 0.3) < 5 * np.sqrt(0.25 / 20000)


@pytest.mark.parametrize("name", list(MAKERS))
def test_draws_repeat_under_manual_seed(name):
    dist = MAKERS[name](runtime, Ours())
    runtime.manual_seed(7)
    first = dist.sample((3,)).numpy()
    runtime.manual_seed(7)
    np.testing.assert_array_equal(dist.sample((3,)).numpy(), first)


RSAMPLED = {
    "RelaxedBernoulli": (lambda t, p: RelaxedBernoulli(t, probs=p), [positive(), unit(3)]),
    "RelaxedBernoulli logits": (lambda t, lg: RelaxedBernoulli(t, logits=lg), [positive(3), real(3)]),
    "LogitRelaxedBernoulli": (lambda t, p: LogitRelaxedBernoulli(t, probs=p), [positive(3), unit(3)]),
    "RelaxedOneHotCategorical": (lambda t, lg: RelaxedOneHotCategorical(t, logits=lg), [positive(), real(2, 3)]),
    "ExpRelaxedCategorical": (lambda t, lg: ExpRelaxedCategorical(t, logits=lg), [positive(2, 1), real(2, 3)]),
}


@pytest.mark.parametrize("name", RSAMPLED)
def test_rsample_gradients_match_finite_differences(name):
    build, arrays = RSAMPLED[name]
    arrays = [np.asarray(a, np.float64) for a in arrays]
    params = [ours(a) for a in arrays]
    weights = ours(real(*build(*params).rsample((5,)).shape), False)
    grads = runtime.autograd.grad(rsample_objective(build, params, weights), params)
    for index, grad in enumerate(grads):
        np.testing.assert_allclose(grad.numpy(), finite_difference_gradient(build, arrays, weights, index),
                                   rtol=1e-6, atol=1e-7)


def test_sample_is_outside_autograd_and_rsample_inside():
    t = ours(0.5)
    assert RelaxedBernoulli(t, logits=ours([0.1])).rsample().requires_grad
    assert not RelaxedBernoulli(t, logits=ours([0.1])).sample().requires_grad
    mixture = normal_mixture(Ours(), ours([0.0, 1.0]), ours([0.0, 1.0]), ours([1.0, 1.0]))
    assert not mixture.sample((3,)).requires_grad


# ---------------------------------------------------------------------------------------------
# Errors in torch's words.
# ---------------------------------------------------------------------------------------------

ERRORS = {
    "mixture not Categorical": lambda m, d: d.MixtureSameFamily(d.Normal(m.zeros(3), 1.0), d.Normal(m.zeros(3), 1.0)),
    "component not Distribution": lambda m, d: d.MixtureSameFamily(d.Categorical(m.ones(3)), m.zeros(3)),
    "batch mismatch": lambda m, d: d.MixtureSameFamily(d.Categorical(m.ones(2, 3)), d.Normal(m.zeros(4, 3), 1.0)),
    "component count": lambda m, d: d.MixtureSameFamily(d.Categorical(m.ones(2)), d.Normal(m.zeros(3), 1.0)),
    "mixture value shape": lambda m, d: independent_mixture(d, m.zeros(3), m.zeros(3, 2), m.ones(3, 2)).log_prob(
        m.zeros(3)),
    "mixture outside support": lambda m, d: d.MixtureSameFamily(
        d.Categorical(m.ones(2)), d.Exponential(m.ones(2))).log_prob(m.tensor([-1.0])),
    "RelaxedBernoulli both": lambda m, d: d.RelaxedBernoulli(m.tensor(1.0), probs=0.3, logits=0.1),
    "RelaxedBernoulli neither": lambda m, d: d.LogitRelaxedBernoulli(m.tensor(1.0)),
    "RelaxedBernoulli bad probs": lambda m, d: d.RelaxedBernoulli(m.tensor(1.0), probs=m.tensor([1.5])),
    "RelaxedBernoulli outside": lambda m, d: d.RelaxedBernoulli(m.tensor(1.0), probs=0.3).log_prob(m.tensor(1.5)),
    "RelaxedOneHotCategorical both": lambda m, d: d.RelaxedOneHotCategorical(m.tensor(1.0), m.ones(2), m.ones(2)),
    "RelaxedOneHotCategorical 0-d": lambda m, d: d.RelaxedOneHotCategorical(m.tensor(1.0), probs=m.tensor(0.5)),
    "RelaxedOneHotCategorical outside": lambda m, d: d.RelaxedOneHotCategorical(
        m.tensor(1.0), probs=m.ones(2)).log_prob(m.tensor([0.3, 0.3])),
    "ExpRelaxedCategorical shape": lambda m, d: d.ExpRelaxedCategorical(m.tensor(1.0), logits=m.ones(3)).log_prob(
        m.zeros(2)),
}


def raised(make, module, distributions):
    with pytest.raises(Exception) as info:
        make(module, distributions)
    return info


@needs_torch
@pytest.mark.parametrize("name", ERRORS)
def test_errors_match_torch(name):
    got, want = raised(ERRORS[name], runtime, Ours()), raised(ERRORS[name], torch, Theirs())
    assert got.type is want.type
    assert str(got.value) == str(want.value).replace("torch.Size", "runtime.Size").replace(
        "dtype=torch.", "dtype=runtime.")
