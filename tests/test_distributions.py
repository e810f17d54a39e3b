"""runtime.distributions against torch.distributions (values and parameter gradients in float64, shapes, validation
errors), and without torch: sampling statistics, repeatability under manual_seed and reparameterized gradients."""
from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest

import runtime
import runtime.distributions as D
import distribution_checks as checks
from distribution_checks import close, draws, finite_difference_gradient, ours, rsample_objective, theirs
from helpers import needs_torch, torch

RNG = np.random.default_rng(1234)
real, positive, unit = draws(RNG)

# NOTE: cases added later draw from their own generator, so the data of the cases before them stays as it was
MORE = np.random.default_rng(4321)
more_real, more_positive, more_unit = draws(MORE)


def check_against_torch(build, params, compute, tol=1e-10):
    """distribution_checks.check_against_torch over runtime.distributions and torch.distributions."""
    checks.check_against_torch(build, params, compute, D, torch.distributions, RNG, tol)


def scored(values):
    return lambda d, m: d.log_prob(m.tensor(values))


def at_cdf(values):
    return lambda d, m: d.cdf(m.tensor(values))


def at_icdf(shape):
    levels = RNG.uniform(0.05, 0.95, size=shape)
    return lambda d, m: d.icdf(m.tensor(levels))


def attribute(name):
    return lambda d, m: getattr(d, name)


def called(name):
    return lambda d, m: getattr(d, name)()


MOMENTS = ("mean", "variance", "stddev", "mode")
UNIFORM_LOW, UNIFORM_WIDTH = real(3), positive(3)

# name: (build(module, *params), params, values to score, what else to compare)
CASES = {
    "Normal": (lambda m, loc, scale: m.Normal(loc, scale), [real(3), positive(3)], real(4, 3),
               MOMENTS + ("entropy", "cdf", "icdf")),
    "Laplace": (lambda m, loc, scale: m.Laplace(loc, scale), [real(3), positive(3)], real(4, 3),
                MOMENTS + ("entropy", "cdf", "icdf")),
    "Uniform": (lambda m, low, width: m.Uniform(low, low + width), [UNIFORM_LOW, UNIFORM_WIDTH],
                UNIFORM_LOW + 0.3 * UNIFORM_WIDTH, MOMENTS + ("entropy", "cdf", "icdf")),
    "Exponential": (lambda m, rate: m.Exponential(rate), [positive(3)], positive(4, 3),
                    MOMENTS + ("entropy", "cdf", "icdf")),
    "Bernoulli(probs)": (lambda m, p: m.Bernoulli(probs=p), [unit(2, 3)], (real(4, 2, 3) > 0).astype(float),
                         MOMENTS + ("entropy",)),
    "Bernoulli(logits)": (lambda m, logits: m.Bernoulli(logits=logits), [real(2, 3)],
                          (real(2, 3) > 0).astype(float), MOMENTS + ("entropy",)),
    "Poisson": (lambda m, rate: m.Poisson(rate), [positive(3)], np.floor(3 * positive(4, 3)), MOMENTS),
    "Binomial(probs)": (lambda m, p: m.Binomial(5, probs=p), [unit(3)], np.array([0.0, 2.0, 5.0]),
                        MOMENTS + ("entropy",)),
    "Binomial(logits)": (lambda m, logits: m.Binomial(logits.new_tensor([3.0, 4.0, 5.0]), logits=logits),
                         [real(3)], np.array([[0.0, 4.0, 1.0], [3.0, 0.0, 5.0]]), ("mean", "variance", "mode")),
    "Categorical(probs)": (lambda m, p: m.Categorical(probs=p), [positive(2, 4)], np.array([[0, 3], [2, 1], [3, 3]]),
                           ("mode", "entropy", "perplexity", "enumerate_support")),
    "Categorical(logits)": (lambda m, logits: m.Categorical(logits=logits), [real(2, 4)], np.array([1, 0]),
                            ("mean", "variance", "mode", "entropy")),
    "OneHotCategorical": (lambda m, p: m.OneHotCategorical(probs=p), [positive(2, 4)], np.eye(4)[[[0, 3], [1, 1]]],
                          MOMENTS + ("entropy", "enumerate_support")),
    "Independent(Normal)": (lambda m, loc, scale: m.Independent(m.Normal(loc, scale), 1), [real(2, 3), positive(2, 3)],
                            real(5, 2, 3), MOMENTS + ("entropy",)),
    "Gamma": (lambda m, a, rate: m.Gamma(a, rate), [positive(3) + 0.5, positive(3)], positive(4, 3),
              MOMENTS + ("entropy",)),
    "Gamma(small)": (lambda m, a, rate: m.Gamma(a, rate), [unit(3) / 4, positive(3)], positive(4, 3) / 50,
                     ("mean", "variance", "entropy")),
    "Beta": (lambda m, a, b: m.Beta(a, b), [positive(3), positive(3)], unit(4, 3), MOMENTS + ("entropy",)),
    "Dirichlet": (lambda m, a: m.Dirichlet(a), [positive(2, 4)], RNG.dirichlet([1.0, 2.0, 0.5, 1.0], size=(3, 2)),
                  MOMENTS + ("entropy",)),
    "Dirichlet(below one)": (lambda m, a: m.Dirichlet(a), [unit(2, 3)], RNG.dirichlet([0.5, 0.5, 0.5], size=2),
                             ("mode", "entropy")),
    "LogNormal": (lambda m, loc, scale: m.LogNormal(loc, scale), [real(3), positive(3) / 2], positive(4, 3),
                  MOMENTS + ("entropy", "cdf", "icdf")),
    "Tanh(Normal)": (lambda m, loc, scale: m.TransformedDistribution(m.Normal(loc, scale), [m.TanhTransform()]),
                     [real(3), positive(3)], 0.99 * np.tanh(real(4, 3)), ("cdf", "icdf")),
    "SAC policy": (lambda m, loc, scale: m.TransformedDistribution(
        m.Independent(m.Normal(loc, scale), 1), [m.TanhTransform(), m.AffineTransform(1.0, 2.0)]),
        [real(2, 3), positive(2, 3)], 1 + 1.98 * np.tanh(real(5, 2, 3)), ()),
    "Sigmoid(Normal)": (lambda m, loc, scale: m.TransformedDistribution(m.Normal(loc, scale), m.SigmoidTransform()),
                        [real(3), positive(3)], unit(4, 3), ("cdf", "icdf")),
    "Exp then decreasing affine": (lambda m, loc, scale: m.TransformedDistribution(m.Normal(loc, scale), [
        m.ExpTransform(), m.AffineTransform(loc.new_tensor(2.0), loc.new_tensor([-1.0, -0.5, -3.0]))]),
        [real(3), positive(3)], 2 - positive(4, 3), ("cdf", "icdf")),
    "StickBreaking(Normal)": (lambda m, loc, scale: m.TransformedDistribution(m.Normal(loc, scale),
                                                                             m.StickBreakingTransform()),
                              [real(2, 3), positive(2, 3)], RNG.dirichlet([1.0, 2.0, 1.0, 0.5], size=(3, 2)), ()),
    "Softplus(Normal)": (lambda m, loc, scale: m.TransformedDistribution(m.Normal(loc, scale), m.SoftplusTransform()),
                         [real(3), positive(3)], positive(4, 3), ()),
    "Power(LogNormal)": (lambda m, loc, scale: m.TransformedDistribution(m.LogNormal(loc, scale),
                                                                        m.PowerTransform(loc.new_tensor(-2.5))),
                         [real(3), positive(3)], positive(4, 3), ("cdf", "icdf")),
    "Reshape(Normal)": (lambda m, loc, scale: m.TransformedDistribution(
        m.Normal(loc, scale), m.ReshapeTransform((2, 3), (3, 2))), [real(4, 2, 3), positive(4, 2, 3)],
        real(5, 4, 3, 2), ()),
    "Affine(event_dim=1)": (lambda m, loc, scale: m.TransformedDistribution(
        m.Independent(m.Normal(loc, scale), 1), m.AffineTransform(loc, scale, event_dim=1)),
        [real(2, 3), positive(2, 3)], real(5, 2, 3), ()),
    "Cauchy": (lambda m, loc, scale: m.Cauchy(loc, scale), [more_real(3), more_positive(3)], more_real(4, 3),
               MOMENTS + ("entropy", "cdf", "icdf")),
    "Gumbel": (lambda m, loc, scale: m.Gumbel(loc, scale), [more_real(3), more_positive(3)], more_real(4, 3),
               MOMENTS + ("entropy", "cdf", "icdf")),
    "HalfNormal": (lambda m, scale: m.HalfNormal(scale), [more_positive(3)], more_positive(4, 3),
                   MOMENTS + ("entropy", "cdf", "icdf")),
    "Chi2": (lambda m, df: m.Chi2(df), [more_positive(3) + 0.5], more_positive(4, 3), MOMENTS + ("entropy",)),
    "StudentT": (lambda m, df, loc, scale: m.StudentT(df, loc, scale),
                 [more_positive(3) + 2.0, more_real(3), more_positive(3)], more_real(4, 3), MOMENTS + ("entropy",)),
    "StudentT(df <= 2)": (lambda m, df, loc, scale: m.StudentT(df, loc, scale),
                          [np.array([0.5, 1.0, 1.5]), more_real(3), more_positive(3)], more_real(4, 3),
                          ("mean", "variance", "entropy")),
    "Geometric(probs)": (lambda m, p: m.Geometric(probs=p), [more_unit(3)], np.floor(3 * more_positive(4, 3)),
                         MOMENTS + ("entropy",)),
    "Geometric(logits)": (lambda m, logits: m.Geometric(logits=logits), [more_real(3)], np.array([0.0, 2.0, 5.0]),
                          ("mean", "variance", "entropy")),
}


def comparisons():
    for name, (build, params, values, extras) in CASES.items():
        yield pytest.param(build, params, scored(values), id=f"{name}.log_prob")
        for extra in extras:
            compute = {"cdf": at_cdf(values), "icdf": at_icdf(np.shape(values)), "entropy": called("entropy"),
                       "perplexity": called("perplexity"), "enumerate_support": called("enumerate_support")}
            yield pytest.param(build, params, compute.get(extra, attribute(extra)), id=f"{name}.{extra}")


@needs_torch
@pytest.mark.parametrize("build, params, compute", comparisons())
def test_matches_torch(build, params, compute):
    check_against_torch(build, params, compute)


@contextlib.contextmanager
def torch_validation_off():
    """torch's own argument checks reshape with -1, which fails on empty tensors: its side runs without them."""
    torch.distributions.Distribution.set_default_validate_args(False)
    try:
        yield
    finally:
        torch.distributions.Distribution.set_default_validate_args(True)


def _spd(*batch, n=3):
    a = RNG.normal(size=batch + (n, n))
    return a @ np.swapaxes(a, -1, -2) + np.eye(n)


@needs_torch
@pytest.mark.parametrize("kind", ["covariance_matrix", "precision_matrix", "scale_tril"])
@pytest.mark.parametrize("what", ["log_prob", "entropy", "mean", "variance", "covariance_matrix", "precision_matrix",
                                  "scale_tril"])
def test_multivariate_normal_matches_torch(kind, what):
    matrix = _spd(2)
    matrix = np.linalg.cholesky(matrix) if kind == "scale_tril" else matrix
    compute = {"log_prob": scored(real(5, 2, 3)), "entropy": called("entropy")}.get(what, attribute(what))

    def build(m, loc, matrix):
        return m.MultivariateNormal(loc, **{kind: matrix})

    if kind == "scale_tril" and what == "precision_matrix":
        # NOTE: torch's cholesky_inverse also sends gradient to scale_tril's (zero) upper triangle: compare values
        # and the lower triangle's gradient only
        build_lower = lambda m, loc, lower: build(m, loc, lower.tril())  # noqa: E731
        return check_against_torch(build_lower, [real(2, 3), matrix], compute)
    check_against_torch(build, [real(2, 3), matrix], compute)


@needs_torch
@pytest.mark.parametrize("loc_shape, matrix_batch, value_shape", [((3,), (2,), (4, 1, 3)), ((2, 3), (), (4, 2, 3)),
                                                                   ((1, 3), (2,), (3,)), ((3,), (), (0, 3))])
def test_multivariate_normal_broadcasts_loc_matrix_and_value_as_torch(loc_shape, matrix_batch, value_shape):
    values = real(*value_shape)
    build = lambda m, loc, cov: m.MultivariateNormal(loc, covariance_matrix=cov)  # noqa: E731
    with torch_validation_off():
        check_against_torch(build, [real(*loc_shape), _spd(*matrix_batch)], scored(values))


# ---------------------------------------------------------------------------------------------
# Shapes: batch_shape / event_shape as torch's; sample and rsample shapes for several sample and batch shapes.
# ---------------------------------------------------------------------------------------------

def _filled(m, shape, value):
    return m.full(shape, value, dtype=m.float64)


SHAPED = {  # name: build(module, batch_shape)
    "Normal": lambda m, b: m.distributions.Normal(_filled(m, b, 0.5), _filled(m, b, 2.0)),
    "Uniform": lambda m, b: m.distributions.Uniform(_filled(m, b, -1.0), _filled(m, b, 2.0)),
    "Laplace": lambda m, b: m.distributions.Laplace(_filled(m, b, 0.0), _filled(m, b, 1.0)),
    "Exponential": lambda m, b: m.distributions.Exponential(_filled(m, b, 1.5)),
    "Bernoulli": lambda m, b: m.distributions.Bernoulli(_filled(m, b, 0.3)),
    "Poisson": lambda m, b: m.distributions.Poisson(_filled(m, b, 2.0)),
    "Binomial": lambda m, b: m.distributions.Binomial(_filled(m, b, 4.0), _filled(m, b, 0.4)),
    "Categorical": lambda m, b: m.distributions.Categorical(_filled(m, tuple(b) + (3,), 1.0)),
    "OneHotCategorical": lambda m, b: m.distributions.OneHotCategorical(_filled(m, tuple(b) + (3,), 1.0)),
    "MultivariateNormal": lambda m, b: m.distributions.MultivariateNormal(
        _filled(m, tuple(b) + (2,), 0.0), scale_tril=m.eye(2, dtype=m.float64).expand(tuple(b) + (2, 2))),
    "Independent": lambda m, b: m.distributions.Independent(
        m.distributions.Normal(_filled(m, tuple(b) + (2,), 0.0), 1.0), 1),
    "Gamma": lambda m, b: m.distributions.Gamma(_filled(m, b, 0.7), _filled(m, b, 2.0)),
    "Beta": lambda m, b: m.distributions.Beta(_filled(m, b, 0.7), _filled(m, b, 2.0)),
    "Dirichlet": lambda m, b: m.distributions.Dirichlet(_filled(m, tuple(b) + (3,), 0.8)),
    "Cauchy": lambda m, b: m.distributions.Cauchy(_filled(m, b, 0.5), _filled(m, b, 2.0)),
    "Gumbel": lambda m, b: m.distributions.Gumbel(_filled(m, b, 0.5), _filled(m, b, 2.0)),
    "HalfNormal": lambda m, b: m.distributions.HalfNormal(_filled(m, b, 2.0)),
    "Chi2": lambda m, b: m.distributions.Chi2(_filled(m, b, 3.0)),
    "StudentT": lambda m, b: m.distributions.StudentT(_filled(m, b, 4.0), _filled(m, b, 1.0), _filled(m, b, 2.0)),
    "Geometric": lambda m, b: m.distributions.Geometric(_filled(m, b, 0.3)),
}
BATCH_SHAPES = [(), (1,), (3,), (2, 3), (0,), (2, 0)]
SAMPLE_SHAPES = [(), (1,), (4,), (2, 5), (0,)]


@needs_torch
@pytest.mark.parametrize("name", SHAPED)
@pytest.mark.parametrize("batch", BATCH_SHAPES, ids=str)
def test_batch_and_event_shapes_match_torch(name, batch):
    with torch_validation_off():
        got, want = SHAPED[name](runtime, batch), SHAPED[name](torch, batch)
    assert tuple(got.batch_shape) == tuple(want.batch_shape) and tuple(got.event_shape) == tuple(want.event_shape)
    assert isinstance(got.batch_shape, runtime.Size) and isinstance(got.event_shape, runtime.Size)
    assert got.has_rsample == want.has_rsample and got.has_enumerate_support == want.has_enumerate_support


@pytest.mark.parametrize("name", SHAPED)
@pytest.mark.parametrize("batch", BATCH_SHAPES, ids=str)
@pytest.mark.parametrize("sample_shape", SAMPLE_SHAPES, ids=str)
def test_sample_shapes(name, batch, sample_shape):
    d = SHAPED[name](runtime, batch)
    expected = tuple(sample_shape) + tuple(d.batch_shape) + tuple(d.event_shape)
    draws = d.sample(sample_shape)
    assert tuple(draws.shape) == expected and not draws.requires_grad
    assert tuple(d.log_prob(draws).shape) == tuple(sample_shape) + tuple(d.batch_shape)
    if d.has_rsample:
        assert tuple(d.rsample(runtime.Size(sample_shape)).shape) == expected


@pytest.mark.parametrize("name", SHAPED)
def test_expand_views_parameters_with_a_larger_batch(name):
    d = SHAPED[name](runtime, (3,))
    wide = d.expand((2, 3))
    assert tuple(wide.batch_shape) == (2, 3) and wide.event_shape == d.event_shape
    draws = d.sample((2,))
    np.testing.assert_allclose(wide.log_prob(draws).numpy(), d.log_prob(draws).numpy())
    assert type(wide) is type(d) and wide._validate_args == d._validate_args


def test_sample_draws_from_runtimes_generator():
    for name, build in SHAPED.items():
        d = build(runtime, (3,))
        runtime.manual_seed(7)
        first = d.sample((4,))
        runtime.manual_seed(7)
        again = d.sample((4,))
        np.testing.assert_array_equal(first.numpy(), again.numpy(), err_msg=name)
    runtime.manual_seed(7)
    first = D.Normal(0.0, 1.0).sample((8,))
    assert not np.array_equal(first.numpy(), D.Normal(0.0, 1.0).sample((8,)).numpy())


def test_numbers_take_the_default_dtype_and_tensors_keep_theirs():
    assert D.Normal(0.0, 1.0).sample().dtype is runtime.float32 and D.Normal(0.0, 1.0).batch_shape == ()
    assert D.Normal(ours(0.0), 1.0).rsample((2,)).dtype is runtime.float64
    assert D.Categorical(runtime.ones(3)).sample().dtype is runtime.int64
    assert D.Bernoulli(0.3).sample().dtype is runtime.float32


@pytest.mark.parametrize("name", ["Bernoulli", "Categorical", "OneHotCategorical", "Binomial"])
@pytest.mark.parametrize("expand", [True, False])
@needs_torch
def test_enumerate_support_matches_torch(name, expand):
    got = SHAPED[name](runtime, (2, 3)).enumerate_support(expand=expand)
    want = SHAPED[name](torch, (2, 3)).enumerate_support(expand=expand)
    assert tuple(got.shape) == tuple(want.shape)
    np.testing.assert_array_equal(got.numpy(), want.numpy())


# ---------------------------------------------------------------------------------------------
# Sampling statistics (no torch): the mean and variance of many draws agree with the distribution's own.
# ---------------------------------------------------------------------------------------------

def f64(*values):
    return [runtime.tensor(v, dtype=runtime.float64) for v in values]


STATISTICS = {
    "Normal": lambda: D.Normal(*f64([0.5, -2.0], [1.0, 3.0])),
    "Uniform": lambda: D.Uniform(*f64([0.0, -3.0], [1.0, 5.0])),
    "Laplace": lambda: D.Laplace(*f64([1.0, -1.0], [0.5, 2.0])),
    "Exponential": lambda: D.Exponential(*f64([0.5, 4.0])),
    "Bernoulli": lambda: D.Bernoulli(*f64([0.1, 0.7])),
    "Poisson": lambda: D.Poisson(*f64([0.3, 12.0])),
    "Binomial": lambda: D.Binomial(*f64([3.0, 20.0], [0.2, 0.9])),
    "OneHotCategorical": lambda: D.OneHotCategorical(*f64([[0.2, 0.3, 0.5], [0.9, 0.05, 0.05]])),
    "MultivariateNormal": lambda: D.MultivariateNormal(*f64([1.0, -1.0], [[2.0, 0.6], [0.6, 1.0]])),
    "Gamma": lambda: D.Gamma(*f64([0.05, 1.0, 30.0], [1.0, 0.5, 3.0])),
    "Beta": lambda: D.Beta(*f64([0.3, 2.0, 50.0], [0.5, 5.0, 20.0])),
    "Dirichlet": lambda: D.Dirichlet(*f64([[0.2, 1.0, 3.0], [10.0, 10.0, 0.5]])),
    "LogNormal": lambda: D.LogNormal(*f64([0.0, 1.0], [0.3, 0.5])),
    "Gumbel": lambda: D.Gumbel(*f64([0.5, -2.0], [1.0, 3.0])),
    "HalfNormal": lambda: D.HalfNormal(*f64([0.5, 3.0])),
    "Chi2": lambda: D.Chi2(*f64([0.5, 4.0, 30.0])),
    "StudentT": lambda: D.StudentT(*f64([12.0, 30.0], [1.0, -2.0], [0.5, 2.0])),
    "Geometric": lambda: D.Geometric(*f64([0.05, 0.5, 0.95])),
}


def assert_moments_match(draws, mean, variance, sigmas=5.0):
    """Sample mean and variance within `sigmas` standard errors of the expected ones (the variance's standard error
    from the sample's fourth central moment)."""
    draws, mean, variance = draws.numpy(), mean.numpy(), variance.numpy()
    n = draws.shape[0]
    np.testing.assert_array_less(np.abs(draws.mean(0) - mean), sigmas * np.sqrt(variance / n) + 1e-12)
    centered = draws - draws.mean(0)
    fourth = (centered ** 4).mean(0)
    variance_error = np.sqrt((fourth - variance ** 2) / n)
    np.testing.assert_array_less(np.abs(draws.var(0) - variance), sigmas * variance_error + 1e-12)


@pytest.mark.parametrize("name", STATISTICS)
def test_sample_moments_match_mean_and_variance(name):
    d = STATISTICS[name]()
    assert_moments_match(d.sample((40000,)), d.mean, d.variance)


def test_categorical_draws_follow_the_probabilities():
    probs = runtime.tensor([[0.1, 0.2, 0.7], [0.5, 0.5, 0.0]], dtype=runtime.float64)
    draws = D.Categorical(probs * 3).sample((30000,)).numpy()
    counts = np.stack([(draws == k).mean(0) for k in range(3)], -1)
    np.testing.assert_array_less(np.abs(counts - probs.numpy()), 5 * np.sqrt(0.25 / 30000))
    assert not (draws[:, 1] == 2).any()


def test_multivariate_normal_draws_have_its_covariance():
    cov = runtime.tensor([[2.0, 0.6, 0.0], [0.6, 1.0, -0.3], [0.0, -0.3, 0.5]], dtype=runtime.float64)
    draws = D.MultivariateNormal(runtime.zeros(3, dtype=runtime.float64), precision_matrix=runtime.linalg.inv(cov))
    np.testing.assert_allclose(np.cov(draws.sample((50000,)).numpy().T), cov.numpy(), atol=0.05)


# ---------------------------------------------------------------------------------------------
# Reparameterized sampling: gradients of rsample by finite differences (the same noise under one seed).
# ---------------------------------------------------------------------------------------------

RSAMPLED = {
    "Normal": (lambda loc, scale: D.Normal(loc, scale), [real(3), positive(3)]),
    "Uniform": (lambda low, width: D.Uniform(low, low + width), [real(3), positive(3)]),
    "Laplace": (lambda loc, scale: D.Laplace(loc, scale), [real(3), positive(3)]),
    "Exponential": (lambda rate: D.Exponential(rate), [positive(3)]),
    "MultivariateNormal": (lambda loc, lower: D.MultivariateNormal(loc, scale_tril=lower.tril()),
                           [real(3), np.linalg.cholesky(_spd())]),
    "Independent": (lambda loc, scale: D.Independent(D.Normal(loc, scale), 1), [real(3), positive(3)]),
    "LogNormal": (lambda loc, scale: D.LogNormal(loc, scale), [real(3) / 2, positive(3) / 2]),
    "Tanh(Normal)": (lambda loc, scale: D.TransformedDistribution(D.Normal(loc, scale), D.TanhTransform()),
                     [real(3), positive(3)]),
    "Cauchy": (lambda loc, scale: D.Cauchy(loc, scale), [more_real(3), more_positive(3)]),
    "Gumbel": (lambda loc, scale: D.Gumbel(loc, scale), [more_real(3), more_positive(3)]),
    "HalfNormal": (lambda scale: D.HalfNormal(scale), [more_positive(3)]),
}


@pytest.mark.parametrize("name", RSAMPLED)
def test_rsample_gradients_match_finite_differences(name):
    build, arrays = RSAMPLED[name]
    params = [ours(a) for a in arrays]
    weights = ours(real(*build(*params).rsample((5,)).shape), False)
    grads = runtime.autograd.grad(rsample_objective(build, params, weights), params)
    for index, grad in enumerate(grads):
        expected = finite_difference_gradient(build, arrays, weights, index)
        if name == "MultivariateNormal" and index == 1:
            expected = np.tril(expected)
        np.testing.assert_allclose(grad.numpy(), expected, rtol=1e-6, atol=1e-7)


def test_sample_is_outside_autograd_and_rsample_inside():
    loc = ours([0.0, 1.0])
    d = D.Normal(loc, 1.0)
    assert not d.sample().requires_grad and d.rsample().requires_grad
    with pytest.raises(NotImplementedError):
        D.Bernoulli(0.5).rsample()


# ---------------------------------------------------------------------------------------------
# Validation: torch's ValueError messages for bad parameters and values (torch.Size printed as runtime.Size).
# ---------------------------------------------------------------------------------------------

BAD_PARAMETERS = {
    "Normal scale": lambda m: m.distributions.Normal(0.0, -1.0),
    "Normal vector scale": lambda m: m.distributions.Normal(m.tensor([0.0, 1.0]), m.tensor([-1.0, 1.0])),
    "Uniform low": lambda m: m.distributions.Uniform(1.0, 0.0),
    "Exponential rate": lambda m: m.distributions.Exponential(m.tensor([0.0, 1.0])),
    "Laplace scale": lambda m: m.distributions.Laplace(0.0, m.tensor([[2.0], [-2.0]])),
    "Bernoulli probs": lambda m: m.distributions.Bernoulli(probs=1.5),
    "Bernoulli nan logits": lambda m: m.distributions.Bernoulli(logits=m.tensor([0.0, float("nan")])),
    "Poisson rate": lambda m: m.distributions.Poisson(-1.0),
    "Binomial count": lambda m: m.distributions.Binomial(m.tensor(2.5), probs=0.5),
    "Categorical probs": lambda m: m.distributions.Categorical(probs=m.tensor([-0.1, 1.1])),
    "Categorical logits": lambda m: m.distributions.Categorical(logits=m.tensor([0.0, float("nan")])),
    "OneHotCategorical probs": lambda m: m.distributions.OneHotCategorical(m.tensor([-0.5, 0.5, 1.0]),
                                                                           validate_args=True),
    "MultivariateNormal covariance": lambda m: m.distributions.MultivariateNormal(
        m.zeros(2), covariance_matrix=m.tensor([[1.0, 2.0], [2.0, 1.0]])),
    "MultivariateNormal asymmetric": lambda m: m.distributions.MultivariateNormal(
        m.zeros(2), precision_matrix=m.tensor([[1.0, 0.5], [0.0, 1.0]])),
    "MultivariateNormal scale_tril": lambda m: m.distributions.MultivariateNormal(
        m.zeros(2), scale_tril=m.tensor([[1.0, 0.0], [1.0, -1.0]])),
    "Gamma rate": lambda m: m.distributions.Gamma(1.0, 0.0),
    "Gamma concentration": lambda m: m.distributions.Gamma(m.tensor([1.0, -2.0]), 1.0),
    "Beta": lambda m: m.distributions.Beta(-1.0, 1.0),
    "Dirichlet": lambda m: m.distributions.Dirichlet(m.tensor([[1.0, 2.0], [0.0, 1.0]])),
    "LogNormal": lambda m: m.distributions.LogNormal(0.0, -1.0),
    "TransformedDistribution transforms": lambda m: m.distributions.TransformedDistribution(
        m.distributions.Normal(0.0, 1.0), "tanh"),
    "TransformedDistribution list": lambda m: m.distributions.TransformedDistribution(
        m.distributions.Normal(0.0, 1.0), [m.tanh]),
}

BAD_VALUES = {
    "not a tensor": lambda m: m.distributions.Normal(0.0, 1.0).log_prob(1.0),
    "Bernoulli non-boolean": lambda m: m.distributions.Bernoulli(0.3).log_prob(m.tensor(0.5)),
    "Categorical out of range": lambda m: m.distributions.Categorical(m.tensor([0.3, 0.7])).log_prob(m.tensor([1, 2])),
    "Exponential negative": lambda m: m.distributions.Exponential(1.0).log_prob(m.tensor([-1.0, 1.0])),
    "Uniform outside": lambda m: m.distributions.Uniform(0.0, 1.0).log_prob(m.tensor(2.0)),
    "Uniform outside cdf": lambda m: m.distributions.Uniform(0.0, 1.0).cdf(m.tensor(2.0)),
    "Poisson fraction": lambda m: m.distributions.Poisson(1.0).log_prob(m.tensor([1.5])),
    "OneHot not one-hot": lambda m: m.distributions.OneHotCategorical(m.ones(3)).log_prob(m.tensor([1.0, 1.0, 0.0])),
    "not broadcastable": lambda m: m.distributions.Normal(m.zeros(3), 1.0).log_prob(m.zeros(2)),
    "wrong event shape": lambda m: m.distributions.MultivariateNormal(
        m.zeros(3), m.eye(3)).log_prob(m.zeros(2)),
    "Independent support": lambda m: m.distributions.Independent(
        m.distributions.Exponential(m.ones(2)), 1).log_prob(m.tensor([1.0, -1.0])),
    "Beta outside": lambda m: m.distributions.Beta(1.0, 1.0).log_prob(m.tensor([0.5, 1.5])),
    "Gamma negative": lambda m: m.distributions.Gamma(1.0, 1.0).log_prob(m.tensor(-0.5)),
    "Dirichlet off simplex": lambda m: m.distributions.Dirichlet(m.ones(3)).log_prob(m.tensor([0.5, 0.5, 0.5])),
    "Dirichlet event shape": lambda m: m.distributions.Dirichlet(m.ones(3)).log_prob(m.tensor([0.5, 0.5])),
    "LogNormal negative": lambda m: m.distributions.LogNormal(0.0, 1.0).log_prob(m.tensor([-1.0])),
    "Tanh outside": lambda m: m.distributions.TransformedDistribution(
        m.distributions.Normal(0.0, 1.0), m.distributions.TanhTransform()).log_prob(m.tensor(1.5)),
}


def raised(make, module):
    with pytest.raises(Exception) as info:
        make(module)
    return info


@needs_torch
@pytest.mark.parametrize("make", list(BAD_PARAMETERS.values()) + list(BAD_VALUES.values()),
                         ids=list(BAD_PARAMETERS) + list(BAD_VALUES))
def test_validation_errors_match_torch(make):
    got, want = raised(make, runtime), raised(make, torch)
    assert got.type is want.type is ValueError
    assert str(got.value) == str(want.value).replace("torch.", "runtime.")


def test_validation_can_be_switched_off():
    assert math.isnan(D.Normal(0.0, -1.0, validate_args=False).log_prob(runtime.tensor(0.0)).item())
    assert D.Bernoulli(0.3, validate_args=False).log_prob(runtime.tensor(0.5)).shape == ()
    D.Distribution.set_default_validate_args(False)
    try:
        D.Exponential(-1.0)
        with pytest.raises(ValueError, match="constraint GreaterThan"):
            D.Exponential(-1.0, validate_args=True)
    finally:
        D.Distribution.set_default_validate_args(True)
    with pytest.raises(ValueError):
        D.Exponential(-1.0)
    with pytest.raises(ValueError):
        D.Distribution.set_default_validate_args("yes")


@needs_torch
def test_constructor_errors_match_torch():
    for make in (lambda m: m.distributions.Categorical(m.tensor(0.5)),
                 lambda m: m.distributions.Bernoulli(0.3, logits=0.1),
                 lambda m: m.distributions.Categorical(),
                 lambda m: m.distributions.MultivariateNormal(m.zeros(2)),
                 lambda m: m.distributions.MultivariateNormal(m.tensor(0.0), m.eye(2)),
                 lambda m: m.distributions.Independent(m.distributions.Normal(0.0, 1.0), 1)):
        got, want = raised(make, runtime), raised(make, torch)
        assert got.type is want.type and str(got.value) == str(want.value)


@needs_torch
def test_reprs_match_torch():
    for make in (lambda m: m.distributions.Normal(0.0, 1.0), lambda m: m.distributions.Normal(m.zeros(2), 1.0),
                 lambda m: m.distributions.Categorical(logits=m.zeros(2, 3)),
                 lambda m: m.distributions.Independent(m.distributions.Bernoulli(m.full((2,), 0.5)), 1),
                 lambda m: m.distributions.MultivariateNormal(m.zeros(2), scale_tril=m.eye(2))):
        assert repr(make(runtime)) == repr(make(torch)).replace("torch.", "runtime.")


@needs_torch
def test_constraints_match_torch():
    names = ["real", "positive", "nonnegative", "unit_interval", "boolean", "simplex", "real_vector",
             "nonnegative_integer", "positive_integer", "one_hot", "lower_cholesky", "positive_definite"]
    values = runtime.tensor([[0.0, 1.0, 0.5], [0.2, 0.3, 0.5], [-1.0, 2.0, 0.0]], dtype=runtime.float64)
    for name in names:
        ours_c, theirs_c = getattr(D.constraints, name), getattr(torch.distributions.constraints, name)
        assert repr(ours_c) == repr(theirs_c)
        assert (ours_c.event_dim, ours_c.is_discrete) == (theirs_c.event_dim, theirs_c.is_discrete)
        if ours_c.event_dim < 2:
            np.testing.assert_array_equal(ours_c.check(values).numpy(),
                                          theirs_c.check(torch.tensor(values.numpy())).numpy())
    for make in (lambda c: c.interval(0.0, 1.0), lambda c: c.integer_interval(0, 3),
                 lambda c: c.independent(c.greater_than(-1.0), 1), lambda c: c.half_open_interval(0, 1)):
        assert repr(make(D.constraints)) == repr(make(torch.distributions.constraints))
    matrices = np.stack([_spd(), -_spd(), np.linalg.cholesky(_spd())])
    for name in ("positive_definite", "lower_cholesky", "symmetric"):
        got = getattr(D.constraints, name).check(ours(matrices, False))
        want = getattr(torch.distributions.constraints, name).check(theirs(matrices, False))
        np.testing.assert_array_equal(got.numpy(), want.numpy())


@needs_torch
@pytest.mark.parametrize("diag", [0, -1, 1])
def test_tril_vector_helpers_match_torch(diag):
    from torch.distributions.utils import tril_matrix_to_vec

    matrices = real(2, 4, 4)
    vectors = D.utils.tril_matrix_to_vec(ours(matrices, False), diag)
    close(vectors, tril_matrix_to_vec(theirs(matrices, False), diag))
    check_against_torch(lambda m, v: m.utils.vec_to_tril_matrix(v, diag), [vectors.numpy()], lambda built, m: built)
    with pytest.raises(ValueError, match="cannot be expressed as the lower triangular part"):
        D.utils.vec_to_tril_matrix(runtime.zeros(5))


def test_straight_through_one_hot_passes_gradients_to_probs():
    probs = ours([0.2, 0.3, 0.5])
    d = D.OneHotCategoricalStraightThrough(probs)
    sample = d.rsample((4,))
    assert set(sample.detach().numpy().sum(-1)) == {1.0} and d.has_rsample
    weights = np.array([1.0, 2.0, 3.0])
    (sample * ours(weights, False)).sum().backward()
    # NOTE: probs are normalized (they sum to 1 here), so the gradient is the weights' deviation from their mean
    np.testing.assert_allclose(probs.grad.numpy(), 4 * (weights - weights @ [0.2, 0.3, 0.5]), rtol=1e-12)


def test_sample_n_warns_and_independent_refuses_enumeration():
    with pytest.warns(FutureWarning, match="sample_n"):
        assert tuple(D.Normal(0.0, 1.0).sample_n(3).shape) == (3,)
    with pytest.raises(NotImplementedError, match="cartesian product"):
        D.Independent(D.Bernoulli(runtime.full((2,), 0.5)), 1).enumerate_support()


def test_runtime_distributions_is_torch_distributions_after_import_runtime():
    assert runtime.distributions.Normal is D.Normal
    from runtime.distributions.categorical import Categorical
    from runtime.distributions.normal import Normal

    assert Normal is D.Normal and Categorical is D.Categorical


# ---------------------------------------------------------------------------------------------
# Gamma, Beta, Dirichlet: rsample's implicit reparameterization gradient dx/da = -(dP(a, x)/da) / pdf(x; a).
# ---------------------------------------------------------------------------------------------

def inverse_cdf_derivative(a, levels, h=1e-6):
    """d/da of the gamma quantile at fixed levels: the derivative a draw would have, by central differences."""
    from scipy.special import gammaincinv

    return (gammaincinv(a * (1 + h), levels) - gammaincinv(a * (1 - h), levels)) / (2 * h * a)


@pytest.mark.parametrize("a", [0.01, 0.3, 1.0, 4.5, 50.0, 2000.0])
def test_standard_gamma_grad_is_the_quantiles_derivative(a):
    pytest.importorskip("scipy")
    from scipy.special import gammaincinv

    from runtime.distributions._standard_gamma import standard_gamma_grad

    levels = np.array([1e-4, 0.02, 0.3, 0.5, 0.7, 0.98, 0.9999])
    draws = gammaincinv(a, levels)
    got = standard_gamma_grad(np.full(levels.shape, a), draws)
    np.testing.assert_allclose(got, inverse_cdf_derivative(a, levels), rtol=1e-6)


def test_standard_gamma_grad_at_the_edges():
    from runtime.distributions._standard_gamma import standard_gamma_grad

    out = standard_gamma_grad([0.5, 2.0, 1.0, -1.0, 3.0], [0.0, 1e-300, math.nan, 1.0, 1.0])
    assert out[0] == 0.0 and 0 <= out[1] < 1e-250
    assert np.isnan(out[2:4]).all() and np.isfinite(out[4])


@needs_torch
def test_standard_gamma_grad_agrees_with_torchs_approximation():
    from runtime.distributions._standard_gamma import standard_gamma_grad

    a = np.repeat([0.05, 0.5, 1.0, 3.0, 9.0, 40.0], 200)
    draws = np.maximum(RNG.standard_gamma(a), 1e-30)
    want = torch._standard_gamma_grad(torch.tensor(a), torch.tensor(draws)).numpy()
    # NOTE: torch evaluates rational and asymptotic fits (relative error up to ~1e-3); ours is exact to ~1e-14
    np.testing.assert_allclose(standard_gamma_grad(a, draws), want, rtol=2e-3)


def test_gamma_rsample_gradients_are_the_implicit_ones():
    from runtime.distributions._standard_gamma import standard_gamma_grad

    concentration, rate = ours([0.2, 1.0, 7.0]), ours([0.5, 1.0, 4.0])
    draws = D.Gamma(concentration, rate).rsample((6,))
    draws.sum().backward()
    x, r = draws.detach().numpy(), rate.detach().numpy()
    expected = (standard_gamma_grad(np.broadcast_to(concentration.detach().numpy(), x.shape), x * r) / r).sum(0)
    np.testing.assert_allclose(concentration.grad.numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(rate.grad.numpy(), (-x / r).sum(0), rtol=1e-12)


def mean_and_error(values: np.ndarray):
    return values.mean(0), values.std(0) / math.sqrt(values.shape[0])


def test_gamma_pathwise_gradient_is_unbiased():
    n = 40000
    concentration = ours(np.full(n, 2.5))
    rate = 2.0
    draws = D.Gamma(concentration, rate).rsample()
    (draws ** 2).sum().backward()
    mean, error = mean_and_error(concentration.grad.numpy())
    assert abs(mean - (2 * 2.5 + 1) / rate ** 2) < 5 * error  # d/da E[x^2] = d/da a(a+1)/rate^2


def test_beta_pathwise_gradient_is_unbiased():
    n, a, b = 40000, 0.7, 2.0
    c1, c0 = ours(np.full(n, a)), ours(np.full(n, b))
    D.Beta(c1, c0).rsample().sum().backward()
    for grad, expected in ((c1.grad, b / (a + b) ** 2), (c0.grad, -a / (a + b) ** 2)):  # d E[x] = d a/(a+b)
        mean, error = mean_and_error(grad.numpy())
        assert abs(mean - expected) < 5 * error


def test_dirichlet_pathwise_gradient_is_unbiased():
    alpha = np.array([0.5, 2.0, 3.5])
    total = alpha.sum()
    concentration = ours(np.tile(alpha, (40000, 1)))
    draws = D.Dirichlet(concentration).rsample()
    np.testing.assert_allclose(draws.detach().numpy().sum(-1), 1.0, rtol=1e-12)
    draws[:, 0].sum().backward()
    expected = ((np.arange(3) == 0) * total - alpha[0]) / total ** 2  # d/d alpha_i of E[x_0] = alpha_0 / total
    mean, error = mean_and_error(concentration.grad.numpy())
    np.testing.assert_array_less(np.abs(mean - expected), 5 * error)


def test_small_concentrations_give_positive_draws_with_finite_log_prob():
    d = D.Gamma(ours([1e-3, 1e-2]), 1.0)
    draws = d.rsample((200,))
    assert (draws.detach().numpy() > 0).all() and np.isfinite(d.log_prob(draws).detach().numpy()).all()
    dirichlet = D.Dirichlet(ours([1e-3, 1e-3, 1e-3]))
    assert np.isfinite(dirichlet.rsample((50,)).detach().numpy()).all()


@needs_torch
@pytest.mark.parametrize("a, tol", [([0.05, 0.3, 0.2], 1e-10), ([1.5, 2.0, 40.0], 1e-8)])
def test_gamma_cdf_matches_torch(a, tol):
    # NOTE: torch has no derivative of gammainc in its first argument: the concentration's is checked below. At
    # a = 40 torch's gammainc is off by up to ~2e-9 (relative, against 30-digit mpmath); scipy's, ours, by ~2e-14
    build = lambda m, rate: m.Gamma(rate.new_tensor(a), rate)  # noqa: E731
    check_against_torch(build, [positive(3)], at_cdf(positive(4, 3) * np.array(a)), tol)


def test_gamma_cdf_gradients():
    pytest.importorskip("scipy")
    from scipy.special import gammainc

    a, rate, value = np.array([0.3, 2.0, 12.0]), np.array([1.0, 0.5, 2.0]), np.array([0.4, 3.0, 6.5])
    concentration, x = ours(a), ours(value)
    d = D.Gamma(concentration, ours(rate, False))
    d.cdf(x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), d.log_prob(x).exp().detach().numpy(), rtol=1e-12)
    h = 1e-6 * a
    expected = (gammainc(a + h, rate * value) - gammainc(a - h, rate * value)) / (2 * h)
    np.testing.assert_allclose(concentration.grad.numpy(), expected, rtol=1e-7)


# ---------------------------------------------------------------------------------------------
# Transforms: forward, inverse and log|det J| against torch and against autograd's derivative.
# ---------------------------------------------------------------------------------------------

def _scalar(m, value):
    return m.tensor(value, dtype=m.float64)


TRANSFORMS = {  # name: (make(module's distributions, module), points of the domain)
    "Exp": (lambda d, m: d.ExpTransform(), real(3, 4)),
    "Tanh": (lambda d, m: d.TanhTransform(), 4 * real(3, 4)),
    "Sigmoid": (lambda d, m: d.SigmoidTransform(), 3 * real(3, 4)),
    "Softplus": (lambda d, m: d.SoftplusTransform(), 3 * real(3, 4)),
    "Affine": (lambda d, m: d.AffineTransform(0.5, -2.0), real(3, 4)),
    "Affine(tensors)": (lambda d, m: d.AffineTransform(_scalar(m, [1.0, 2.0, 3.0, 4.0]), _scalar(m, 0.5)), real(3, 4)),
    "Power": (lambda d, m: d.PowerTransform(_scalar(m, 3.0)), positive(3, 4)),
    "Tanh.inv": (lambda d, m: d.TanhTransform().inv, 0.99 * np.tanh(real(3, 4))),
    "Compose": (lambda d, m: d.ComposeTransform([d.AffineTransform(0.3, 2.0), d.TanhTransform()]), real(3, 4)),
    "Independent(Exp)": (lambda d, m: d.IndependentTransform(d.ExpTransform(), 1), real(3, 4)),
    "StickBreaking": (lambda d, m: d.StickBreakingTransform(), real(3, 4)),
    "Reshape": (lambda d, m: d.ReshapeTransform((3, 4), (2, 6)), real(5, 3, 4)),
    "Compose(event dims)": (lambda d, m: d.ComposeTransform([d.ExpTransform(), d.StickBreakingTransform(),
                                                              d.AffineTransform(0.0, 2.0)]), real(3, 4)),
}
ELEMENTWISE = ["Exp", "Tanh", "Sigmoid", "Softplus", "Affine", "Affine(tensors)", "Power", "Tanh.inv", "Compose"]


@needs_torch
@pytest.mark.parametrize("name", TRANSFORMS)
def test_transforms_match_torch(name):
    make, points = TRANSFORMS[name]
    ours_t, theirs_t = make(D, runtime), make(torch.distributions, torch)
    x, tx = ours(points), theirs(points)
    y, ty = ours_t(x), theirs_t(tx)
    close(y, ty, 1e-12)
    close(ours_t.inv(ours(y.detach().numpy(), False)), theirs_t.inv(theirs(ty.detach().numpy(), False)), 1e-9)
    ladj, tladj = ours_t.log_abs_det_jacobian(x, y), theirs_t.log_abs_det_jacobian(tx, ty)
    close(ladj, tladj, 1e-10)
    assert ladj.requires_grad == tladj.requires_grad
    if tladj.requires_grad:
        close(runtime.autograd.grad(ladj.sum(), x)[0], torch.autograd.grad(tladj.sum(), tx)[0], 1e-10)
    assert repr(ours_t) == repr(theirs_t)
    if name in ELEMENTWISE:
        assert np.array_equal(np.asarray(ours_t.sign), np.asarray(theirs_t.sign))
    for side in ("domain", "codomain"):
        assert repr(getattr(ours_t, side)) == repr(getattr(theirs_t, side))
    x_shape, y_shape = (7,) + tuple(points.shape), (7,) + tuple(ty.shape)
    assert tuple(ours_t.forward_shape(x_shape)) == tuple(theirs_t.forward_shape(x_shape)) == y_shape
    assert tuple(ours_t.inverse_shape(y_shape)) == tuple(theirs_t.inverse_shape(y_shape)) == x_shape


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_log_abs_det_jacobian_is_the_log_of_autograds_derivative(name):
    make, points = TRANSFORMS[name]
    transform = make(D, runtime)
    x = ours(points)
    y = transform(x)
    (derivative,) = runtime.autograd.grad(y.sum(), x)
    np.testing.assert_allclose(transform.log_abs_det_jacobian(x, y).detach().numpy(),
                               np.log(np.abs(derivative.numpy())), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", [n for n in TRANSFORMS if n != "Tanh.inv"])
def test_inverse_undoes_the_transform(name):
    make, points = TRANSFORMS[name]
    transform = make(D, runtime)
    x = ours(points, False)
    np.testing.assert_allclose(transform.inv(transform(x)).numpy(), points, rtol=1e-9, atol=1e-9)
    assert transform.inv.inv is transform


def test_cached_transform_inverts_its_own_output_exactly():
    transform = D.TanhTransform(cache_size=1)
    x = ours([0.5, 30.0, -40.0], False)
    y = transform(x)
    assert transform.inv(y) is x and transform(x) is y
    assert not np.isfinite(D.TanhTransform().inv(y).numpy()).all()  # tanh(30) rounds to 1: atanh gives inf
    assert D.TanhTransform().with_cache(1)._cache_size == 1
    with pytest.raises(ValueError, match="cache_size must be 0 or 1"):
        D.ExpTransform(cache_size=2)
    compose = D.ComposeTransform([D.ExpTransform(), D.TanhTransform()], cache_size=1)
    assert all(part._cache_size == 1 for part in compose.parts)


def test_squashed_gaussian_policy_log_prob_stays_finite_at_saturation():
    loc, scale = ours([0.0, 25.0, -3.0]), ours([1.0, 0.5, 2.0])
    policy = D.TransformedDistribution(D.Normal(loc, scale), [D.TanhTransform(cache_size=1)])
    action = policy.rsample((64,))
    log_prob = policy.log_prob(action)
    pre_tanh = D.TanhTransform().inv(action.clamp(-0.999999, 0.999999))
    assert np.isfinite(log_prob.detach().numpy()).all()
    expected = D.Normal(loc, scale).log_prob(pre_tanh) - (1 - pre_tanh.tanh() ** 2).log()
    np.testing.assert_allclose(log_prob[:, 0].detach().numpy(), expected[:, 0].detach().numpy(), rtol=1e-6)
    log_prob.sum().backward()
    assert np.isfinite(loc.grad.numpy()).all() and np.isfinite(scale.grad.numpy()).all()


@needs_torch
@pytest.mark.parametrize("make", [
    lambda d, m: d.TransformedDistribution(d.Normal(m.zeros(2, 3), 1.0), d.StickBreakingTransform()),
    lambda d, m: d.TransformedDistribution(d.Normal(m.zeros(2, 3), 1.0), d.IndependentTransform(d.ExpTransform(), 1)),
    lambda d, m: d.TransformedDistribution(d.Normal(m.zeros(4, 6), 1.0), d.ReshapeTransform((6,), (2, 3))),
    lambda d, m: d.TransformedDistribution(d.Normal(0.0, 1.0), d.AffineTransform(m.zeros(3), m.ones(2, 1))),
    lambda d, m: d.TransformedDistribution(d.Normal(m.zeros(3), 1.0), []),
    lambda d, m: d.LogNormal(m.zeros(3), 1.0).expand((2, 3)),
])
def test_transformed_distribution_shapes_and_support_match_torch(make):
    got, want = make(D, runtime), make(torch.distributions, torch)
    assert tuple(got.batch_shape) == tuple(want.batch_shape) and tuple(got.event_shape) == tuple(want.event_shape)
    assert repr(got.support) == repr(want.support)
    assert tuple(got.sample((2,)).shape) == tuple(want.sample((2,)).shape)
    assert tuple(got.log_prob(got.sample((2,))).shape) == (2,) + tuple(want.batch_shape)


@needs_torch
def test_transform_reprs_match_torch():
    for make in (lambda d: d.ComposeTransform([d.ExpTransform(), d.TanhTransform()]), lambda d: d.ExpTransform().inv,
                 lambda d: d.IndependentTransform(d.SigmoidTransform(), 2), lambda d: d.identity_transform):
        assert repr(make(D)) == repr(make(torch.distributions))


# ---------------------------------------------------------------------------------------------
# kl_divergence: closed forms against torch (values and gradients), against Monte Carlo without torch, dispatch.
# ---------------------------------------------------------------------------------------------

KL_PAIRS = {  # name: (build(module, *params), parameters of p, parameters of q)
    "Normal": (lambda m, loc, scale: m.Normal(loc, scale), [real(3), positive(3)], [real(3), positive(3)]),
    "Laplace": (lambda m, loc, scale: m.Laplace(loc, scale), [real(3), positive(3)], [real(3), positive(3)]),
    "Exponential": (lambda m, rate: m.Exponential(rate), [positive(3)], [positive(3)]),
    "Poisson": (lambda m, rate: m.Poisson(rate), [positive(3)], [positive(3)]),
    "Gamma": (lambda m, a, rate: m.Gamma(a, rate), [positive(3), positive(3)], [positive(3), positive(3)]),
    "Beta": (lambda m, a, b: m.Beta(a, b), [positive(3), positive(3)], [positive(3), positive(3)]),
    "Dirichlet": (lambda m, a: m.Dirichlet(a), [positive(2, 4)], [positive(4)]),
    "Bernoulli": (lambda m, p: m.Bernoulli(p), [[0.2, 0.0, 1.0, 0.5, 0.3]], [[0.3, 0.4, 0.6, 0.0, 1.0]]),
    "Bernoulli(logits)": (lambda m, logits: m.Bernoulli(logits=logits), [real(3)], [real(3)]),
    "Categorical": (lambda m, p: m.Categorical(p), [[[0.2, 0.0, 0.8], [0.3, 0.3, 0.4]]],
                    [[[0.3, 0.4, 0.3], [0.0, 0.5, 0.5]]]),
    "Categorical(logits)": (lambda m, logits: m.Categorical(logits=logits), [real(2, 5)], [real(5)]),
    "OneHotCategorical": (lambda m, p: m.OneHotCategorical(p), [positive(2, 3)], [positive(2, 3)]),
    "Uniform": (lambda m, low, high: m.Uniform(low, high), [[0.0, 0.5, 0.0], [1.0, 1.0, 2.0]],
                [[-1.0, 0.0, 0.5], [2.0, 2.0, 3.0]]),
    "Binomial": (lambda m, p: m.Binomial(4, p), [unit(3)], [unit(3)]),
    "Independent": (lambda m, loc, scale: m.Independent(m.Normal(loc, scale), 1), [real(2, 3), positive(2, 3)],
                    [real(2, 3), positive(2, 3)]),
    "LogNormal": (lambda m, loc, scale: m.LogNormal(loc, scale), [real(3), positive(3)], [real(3), positive(3)]),
    "MultivariateNormal": (lambda m, loc, cov: m.MultivariateNormal(loc, covariance_matrix=cov), [real(2, 3), _spd(2)],
                           [real(3), _spd()]),
    "MultivariateNormal(scale_tril)": (lambda m, loc, lower: m.MultivariateNormal(loc, scale_tril=lower.tril()),
                                       [real(3), np.linalg.cholesky(_spd())],
                                       [real(2, 3), np.linalg.cholesky(_spd(2))]),
}


def _kl_with_finite_weights(p, q, weights, module):
    kl = module.distributions.kl_divergence(p, q)
    finite = module.isfinite(kl)
    return kl, (module.where(finite, kl, module.zeros_like(kl)) * weights).sum()


@needs_torch
@pytest.mark.parametrize("name", KL_PAIRS)
def test_kl_divergence_matches_torch(name):
    build, p_params, q_params = KL_PAIRS[name]
    params = p_params + q_params
    split = len(p_params)
    our_params, their_params = [ours(v) for v in params], [theirs(v) for v in params]
    got_p, got_q = build(D, *our_params[:split]), build(D, *our_params[split:])
    want_p = build(torch.distributions, *their_params[:split])
    want_q = build(torch.distributions, *their_params[split:])
    weights = real(*runtime.distributions.kl_divergence(got_p, got_q).shape)
    got, got_total = _kl_with_finite_weights(got_p, got_q, ours(weights, False), runtime)
    want, want_total = _kl_with_finite_weights(want_p, want_q, theirs(weights, False), torch)
    close(got, want)
    for got_grad, want_grad in zip(runtime.autograd.grad(got_total, our_params),
                                   torch.autograd.grad(want_total, their_params)):
        close(got_grad, want_grad)


MONTE_CARLO_KL = {
    "Normal": (lambda: D.Normal(*f64([0.0, 1.0], [1.0, 0.5])), lambda: D.Normal(*f64([0.5, 0.0], [2.0, 1.0]))),
    "Gamma": (lambda: D.Gamma(*f64([2.0, 0.7], [1.0, 3.0])), lambda: D.Gamma(*f64([1.5, 1.0], [0.5, 2.0]))),
    "Beta": (lambda: D.Beta(*f64([2.0, 0.7], [1.0, 3.0])), lambda: D.Beta(*f64([1.5, 1.0], [0.5, 2.0]))),
    "Dirichlet": (lambda: D.Dirichlet(*f64([1.0, 2.0, 3.0])), lambda: D.Dirichlet(*f64([2.0, 2.0, 0.5]))),
    "Categorical": (lambda: D.Categorical(*f64([0.1, 0.6, 0.3])), lambda: D.Categorical(*f64([0.3, 0.3, 0.4]))),
    "Laplace": (lambda: D.Laplace(*f64([0.0, 1.0], [1.0, 0.5])), lambda: D.Laplace(*f64([0.5, 0.0], [2.0, 1.0]))),
    "MultivariateNormal": (lambda: D.MultivariateNormal(*f64([0.0, 1.0], [[1.0, 0.3], [0.3, 0.5]])),
                           lambda: D.MultivariateNormal(*f64([0.5, 0.0], [[2.0, 0.0], [0.0, 1.0]]))),
}


@pytest.mark.parametrize("name", MONTE_CARLO_KL)
def test_kl_divergence_is_the_expected_log_ratio(name):
    make_p, make_q = MONTE_CARLO_KL[name]
    p, q = make_p(), make_q()
    draws = p.sample((40000,))
    ratios = (p.log_prob(draws) - q.log_prob(draws)).numpy()
    mean, error = mean_and_error(ratios)
    np.testing.assert_array_less(np.abs(D.kl_divergence(p, q).numpy() - mean), 5 * error)
    np.testing.assert_allclose(D.kl_divergence(p, p).numpy(), 0.0, atol=1e-12)


@needs_torch
def test_unregistered_pairs_raise_torchs_error():
    for make_p, make_q in ((lambda m: m.distributions.Categorical(m.ones(3)),
                            lambda m: m.distributions.Normal(0.0, 1.0)),
                           (lambda m: m.distributions.Independent(m.distributions.Normal(m.zeros(2), 1.0), 1),
                            lambda m: m.distributions.Normal(m.zeros(2), 1.0))):
        got = raised(lambda m: m.distributions.kl_divergence(make_p(m), make_q(m)), runtime)
        want = raised(lambda m: m.distributions.kl_divergence(make_p(m), make_q(m)), torch)
        assert got.type is want.type is NotImplementedError and str(got.value) == str(want.value)


def test_kl_refuses_what_it_cannot_compute():
    normal = D.Normal(runtime.zeros(2, 3), 1.0)
    with pytest.raises(NotImplementedError):
        D.kl_divergence(D.Independent(normal, 1), D.Independent(normal, 2))
    with pytest.raises(NotImplementedError):
        D.kl_divergence(D.TransformedDistribution(normal, D.ExpTransform()),
                        D.TransformedDistribution(normal, D.TanhTransform()))
    with pytest.raises(NotImplementedError, match="q.total_count > p.total_count"):
        D.kl_divergence(D.Binomial(2, 0.5), D.Binomial(3, 0.5))
    assert D.kl_divergence(D.Binomial(3, 0.5), D.Binomial(2, 0.5)).item() == math.inf


@pytest.fixture
def restored_kl_registry():
    """register_kl changes a process-wide table: put it back after the test."""
    saved = dict(D.kl._KL_REGISTRY)
    yield
    D.kl._KL_REGISTRY.clear()
    D.kl._KL_REGISTRY.update(saved)
    D.kl._KL_DISPATCH_CACHE.clear()


def test_register_kl_dispatches_to_the_most_specific_pair(restored_kl_registry):
    class Wide(D.Normal):
        pass

    class Narrow(D.Normal):
        pass

    @D.register_kl(Wide, D.Normal)
    def _wide_normal(p, q):
        return runtime.tensor(1.0)

    assert D.kl_divergence(Wide(0.0, 1.0), D.Normal(0.0, 1.0)).item() == 1.0
    assert D.kl_divergence(Wide(0.0, 1.0), Narrow(0.0, 1.0)).item() == 1.0
    assert D.kl_divergence(Narrow(0.0, 1.0), Wide(0.0, 1.0)).item() == 0.0  # Normal-Normal's closed form

    @D.register_kl(D.Normal, Narrow)
    def _normal_narrow(p, q):
        return runtime.tensor(2.0)

    with pytest.warns(RuntimeWarning, match=r"Ambiguous kl_divergence\(Wide, Narrow\)"):
        assert D.kl_divergence(Wide(0.0, 1.0), Narrow(0.0, 1.0)).item() == 1.0
    with pytest.raises(TypeError, match="Distribution subclass"):
        D.register_kl(int, D.Normal)


# ---------------------------------------------------------------------------------------------
# Training programs as torch users write them, run with `import runtime as torch`.
# ---------------------------------------------------------------------------------------------

def test_reinforce_learns_a_contextual_bandit():
    nn = runtime.nn
    runtime.manual_seed(3)
    policy = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 3))
    optimizer = runtime.optim.Adam(policy.parameters(), lr=0.03)

    def rewards(states, actions):
        best = (states[:, 0] > 0).long() * 2  # action 2 pays when the first feature is positive, action 0 otherwise
        return (actions == best).float()

    def average_reward():
        with runtime.no_grad():
            states = runtime.randn(2000, 2)
            return rewards(states, D.Categorical(logits=policy(states)).sample()).mean().item()

    before = average_reward()
    for _ in range(150):
        states = runtime.randn(32, 2)
        dist = D.Categorical(logits=policy(states))
        actions = dist.sample()
        advantage = rewards(states, actions) - rewards(states, actions).mean()
        loss = -(dist.log_prob(actions) * advantage).mean() - 0.01 * dist.entropy().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert before < 0.5 and average_reward() > 0.9


def test_vae_trains_with_rsample_and_kl_divergence():
    nn, F = runtime.nn, runtime.nn.functional
    runtime.manual_seed(5)
    bits = (runtime.rand(64, 4) > 0.5).float()
    data = runtime.cat([bits, bits], 1)  # two copies of 4 bits: a 3-dim code can hold them
    encoder, decoder = nn.Linear(8, 2 * 3), nn.Linear(3, 8)
    optimizer = runtime.optim.Adam(list(encoder.parameters()) + list(decoder.parameters()), lr=0.05)
    prior = D.Independent(D.Normal(runtime.zeros(3), runtime.ones(3)), 1)

    def loss_terms():
        loc, log_scale = encoder(data).chunk(2, -1)
        posterior = D.Independent(D.Normal(loc, log_scale.exp()), 1)
        code = posterior.rsample()
        reconstruction = F.binary_cross_entropy_with_logits(decoder(code), data, reduction="none").sum(-1)
        return reconstruction.mean(), D.kl_divergence(posterior, prior).mean()

    first = sum(loss_terms()).item()
    for _ in range(150):
        reconstruction, kl = loss_terms()
        optimizer.zero_grad()
        (reconstruction + kl).backward()
        assert encoder.weight.grad.abs().sum().item() > 0
        optimizer.step()
    reconstruction, kl = loss_terms()
    assert kl.item() > 0.1 and (reconstruction + kl).item() < 0.75 * first


@needs_torch
@pytest.mark.parametrize("batch", [(), (2,)])
def test_low_rank_multivariate_normal_matches_torch(batch):
    """Densities (Woodbury and the determinant lemma), entropy, moments, the covariance, precision and Cholesky
    factor, gradients of log_prob in loc, W and D, and the shapes of draws and expansion."""
    rng = np.random.default_rng(0)
    loc, factor = rng.standard_normal(batch + (5,)), rng.standard_normal(batch + (5, 2))
    diag, value = rng.uniform(0.5, 2.0, batch + (5,)), rng.standard_normal((3,) + batch + (5,))
    results = []
    for lib in (runtime, torch):
        args = [lib.tensor(v, requires_grad=True) for v in (loc, factor, diag)]
        dist = lib.distributions.LowRankMultivariateNormal(*args)
        log_prob = dist.log_prob(lib.tensor(value))
        log_prob.sum().backward()
        results.append([log_prob, dist.entropy(), dist.variance, dist.covariance_matrix, dist.precision_matrix,
                        dist.scale_tril, *(a.grad for a in args)])
        assert tuple(dist.rsample((4,)).shape) == (4,) + batch + (5,)
        assert tuple(dist.expand((3,) + batch).batch_shape) == (3,) + batch
    for got, want in zip(*results):
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-10, atol=1e-12)


def test_low_rank_multivariate_normal_draws_have_its_covariance():
    runtime.manual_seed(0)
    factor = runtime.tensor([[1.0], [0.5], [-1.0]], dtype=runtime.float64)
    dist = D.LowRankMultivariateNormal(runtime.zeros(3, dtype=runtime.float64), factor,
                                       runtime.tensor([0.5, 1.0, 0.25], dtype=runtime.float64))
    samples = dist.sample((40000,)).numpy()
    np.testing.assert_allclose(np.cov(samples.T), dist.covariance_matrix.numpy(), atol=0.05)
