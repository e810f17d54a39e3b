"""Complex tensors: dtypes and promotion, the complex ops and views, torch's gradient convention (checked by finite
differences and against torch), and a LLaMA-style model with complex rotary embeddings, eager and compiled."""
from __future__ import annotations

import copy
import io
import warnings

import numpy as np
import pytest

import nnc
import runtime
from helpers import needs_torch, torch

from llama import make_llama
from test_real_models import train

C = 1.5 - 0.5j


def complex_tensor(*shape, dtype=runtime.complex128, requires_grad=False, seed=0):
    rng = np.random.default_rng(seed)
    values = rng.uniform(0.3, 2.0, shape) + 1j * rng.uniform(-2.0, 2.0, shape)
    return runtime.tensor(values, dtype=dtype, requires_grad=requires_grad)


# -- dtypes and promotion ------------------------------------------------------------------------------------------

def test_python_complex_numbers_give_the_default_complex_dtype():
    assert runtime.tensor([1 + 2j, 3.0]).dtype is runtime.complex64
    assert runtime.tensor(np.array([1j])).dtype is runtime.complex128  # numpy arrays keep their dtype
    assert runtime.cfloat is runtime.complex64 and runtime.cdouble is runtime.complex128
    assert runtime.complex64.is_complex and not runtime.complex64.is_floating_point
    assert runtime.complex64.to_real() is runtime.float32 and runtime.float64.to_complex() is runtime.complex128


@pytest.mark.parametrize("a,b,want", [
    ("complex64", "float64", "complex128"), ("complex64", "int64", "complex64"), ("float16", "complex64", "complex64"),
    ("complex128", "complex64", "complex128"), ("bool", "complex64", "complex64")])
def test_promote_types(a, b, want):
    assert runtime.promote_types(getattr(runtime, a), getattr(runtime, b)) is getattr(runtime, want)


@needs_torch
@pytest.mark.parametrize("make", [
    lambda lib: lib.ones(2, dtype=lib.float64) * 1j,
    lambda lib: lib.ones(2, dtype=lib.int64) * 1j,
    lambda lib: lib.ones(2) + lib.tensor(1j, dtype=lib.complex128),
    lambda lib: lib.ones(2, dtype=lib.int32) + lib.tensor(1j, dtype=lib.complex128),
    lambda lib: lib.tensor(2.0, dtype=lib.float64) * 1j,
    lambda lib: lib.ones(2, dtype=lib.complex64) * lib.ones(2, dtype=lib.float64),
], ids=["f64*1j", "i64*1j", "f32+c128-0d", "i32+c128-0d", "f64-0d*1j", "c64*f64"])
def test_result_dtypes_match_torch(make):
    assert make(runtime).dtype.name == str(make(torch).dtype).removeprefix("torch.")


def test_complex_draws_have_torchs_moments():
    runtime.manual_seed(0)
    z = runtime.randn(200_000, dtype=runtime.cfloat).numpy()
    assert z.dtype == np.complex64
    assert abs(np.mean(np.abs(z) ** 2) - 1.0) < 0.02  # real and imaginary parts of variance 1/2 each
    assert abs(np.var(z.real) - 0.5) < 0.01 and abs(np.mean(z.real * z.imag)) < 0.01
    u = runtime.rand(100_000, dtype=runtime.cdouble).numpy()
    assert 0 <= u.real.min() and u.real.max() < 1 and 0 <= u.imag.min() and u.imag.max() < 1


# -- ops and views -------------------------------------------------------------------------------------------------

def test_parts_and_pair_views_share_memory_with_the_complex_tensor():
    z = complex_tensor(3, 2)
    before = z.numpy().copy()
    runtime.view_as_real(z)[:, 1, 0] = 7.0  # the real part of row 1, column 1
    z.imag[0] = 0.0
    want = before.copy()
    want[:, 1] = 7.0 + 1j * want[:, 1].imag
    want[0] = want[0].real
    np.testing.assert_array_equal(z.numpy(), want)
    pairs = runtime.zeros(4, 2, dtype=runtime.float64)
    runtime.view_as_complex(pairs).mul_(0).add_(1 + 2j)
    np.testing.assert_array_equal(pairs.numpy(), np.tile([1.0, 2.0], (4, 1)))


def test_real_tensors_are_their_own_real_part_and_conjugate():
    x = runtime.randn(3)
    assert x.real is x and x.conj() is x and runtime.isreal(x).all()
    with pytest.raises(RuntimeError, match="imag is not implemented for tensors with non-complex dtypes"):
        x.imag
    z = runtime.tensor([1 + 0j, 2 + 1j])
    assert runtime.isreal(z).tolist() == [True, False] and z.is_complex() and not z.is_floating_point()


@pytest.mark.parametrize("call,message", [
    (lambda z: z < z, "lt: complex tensors are not supported"),
    (lambda z: z.argmax(), "argmax.*complex"),
    (lambda z: z.relu(), "relu: complex tensors are not supported"),
    (lambda z: runtime.view_as_complex(runtime.zeros(2, 3)), "last dimension of size 2"),
    (lambda z: runtime.view_as_complex(runtime.zeros(2, 4)[:, ::2]), "stride 1"),
    (lambda z: runtime.view_as_complex(runtime.zeros(2, 2, dtype=runtime.int64)), "float and double"),
    (lambda z: runtime.complex(runtime.zeros(2), runtime.zeros(2, dtype=runtime.float64)), "complex"),
    (lambda z: runtime.view_as_real(runtime.zeros(2)), "only supported for complex tensors"),
], ids=["order", "argmax", "relu", "pair-size", "pair-stride", "pair-dtype", "complex-dtypes", "view_as_real-real"])
def test_what_complex_tensors_cannot_do_raises_naming_it(call, message):
    with pytest.raises((RuntimeError, TypeError), match=message):
        call(complex_tensor(3, 2))


def test_a_complex_tensor_requires_grad_and_survives_save_and_load():
    z = complex_tensor(2, 3, dtype=runtime.complex64, requires_grad=True)
    assert z.requires_grad
    buffer = io.BytesIO()
    runtime.save({"z": z.detach(), "w": z.detach().to(runtime.complex128)}, buffer)
    buffer.seek(0)
    loaded = runtime.load(buffer)
    assert loaded["z"].dtype is runtime.complex64 and loaded["w"].dtype is runtime.complex128
    np.testing.assert_array_equal(loaded["z"].numpy(), z.detach().numpy())


# -- gradients: torch's convention, dL/dRe + i dL/dIm ----------------------------------------------------------------

GRADIENT_PROGRAMS = {
    "rotation": lambda z, w: runtime.view_as_real(z * w).pow(2).sum(-1),
    "polar": lambda z, w: runtime.polar(z.abs(), w.angle()).real * z.imag,
    "matmul": lambda z, w: (z @ w.mT).abs(),
    "conj-product": lambda z, w: (z * w.conj()).real + (z / w).imag,
    "transcendental": lambda z, w: (z.exp() * w.log() + z.sqrt().sin()).abs(),
    "parts-and-pairs": lambda z, w: runtime.view_as_complex(stacked_parts(z) * 2).angle() + w.sgn().real,
    "sum-and-mean": lambda z, w: (z.sum(0) * w.mean()).abs(),
    "variance-and-norms": lambda z, w: z.var(1) * z.std(0) + runtime.linalg.vector_norm(w, dim=0)
    + runtime.linalg.vector_norm(w, 3, dim=1) + w.norm(),
}


@needs_torch
@pytest.mark.parametrize("call", [lambda lib, z: z.var(), lambda lib, z: z.std(1, correction=0),
                                  lambda lib, z: lib.linalg.vector_norm(z), lambda lib, z: lib.linalg.norm(z, 1),
                                  lambda lib, z: lib.linalg.vector_norm(z, float("inf"), dim=0)],
                         ids=["var", "std", "norm2", "norm1", "norm-inf"])
def test_variance_and_norms_of_complex_tensors_are_torchs(call):
    values = complex_tensor(3, 4, seed=5).numpy()
    got, want = call(runtime, runtime.tensor(values)), call(torch, torch.tensor(values))
    assert got.dtype is runtime.float64 and str(want.dtype) == "torch.float64"
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12)


def stacked_parts(z):
    return runtime.stack([z.real, z.imag * 0.5], -1)


@pytest.mark.parametrize("name", sorted(GRADIENT_PROGRAMS))
def test_gradients_match_finite_differences(name):
    z, w = complex_tensor(3, 3, requires_grad=True, seed=1), complex_tensor(3, 3, requires_grad=True, seed=2)
    assert runtime.autograd.gradcheck(GRADIENT_PROGRAMS[name], (z, w), eps=1e-6, atol=1e-6, rtol=1e-5)


def test_a_real_input_of_a_complex_computation_gets_a_real_gradient():
    r = runtime.tensor([0.5, 1.5, -2.0], dtype=runtime.float64, requires_grad=True)
    theta = runtime.tensor([0.3, -1.0, 2.0], dtype=runtime.float64, requires_grad=True)
    assert runtime.autograd.gradcheck(lambda r, t: (runtime.polar(r, t) * (1 + 2j)).imag, (r, theta))
    (runtime.polar(r, theta) * C).abs().sum().backward()
    assert r.grad.dtype is runtime.float64 and theta.grad.dtype is runtime.float64


# -- a LLaMA-style model (examples/llama.py): rotary embeddings as complex products ----------------------------------

def llama_batches(steps=3, batch=2, length=8, vocab=40):
    return [(runtime.randint(0, vocab, (batch, length)), runtime.randint(0, vocab, (batch, length)))
            for _ in range(steps)]


@needs_torch
def test_llama_with_complex_rotary_embeddings_matches_torch():
    runtime.manual_seed(0)
    ours, theirs = make_llama(runtime), make_llama(torch)
    theirs.load_state_dict({k: torch.tensor(v.numpy()) for k, v in ours.state_dict().items()})
    tokens, targets = llama_batches(steps=1)[0]
    loss = ours(tokens, targets)
    want = theirs(torch.tensor(tokens.numpy()), torch.tensor(targets.numpy()))
    loss.backward()
    want.backward()
    np.testing.assert_allclose(loss.item(), want.item(), rtol=1e-6)
    grads = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), grads[name].grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)


def test_llama_with_complex_rotary_embeddings_trains_compiled_as_eager():
    """Complex values run in numpy (opaque steps, no warning) while the rest compiles: forward and backward plans,
    no graph break, the same losses, gradients and weights as eager in float64."""
    runtime.manual_seed(0)
    runtime.set_default_dtype(runtime.float64)
    try:
        model = make_llama(runtime, upcast=False)
        batches = llama_batches()
        compiled = nnc.compile(copy.deepcopy(model))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no fallback to eager, no kernel failing to compile
            got = train(compiled, batches)
        want = train(model, batches)
    finally:
        runtime.set_default_dtype(runtime.float32)
    (artifact,) = compiled._cache.values()
    assert artifact.graph_breaks == [] and artifact.split is None
    assert artifact.training_plan is not None and artifact.backward_plan is not None
    np.testing.assert_allclose(got[0], want[0], rtol=1e-9)
    for step_got, step_want in zip(got[1], want[1]):
        for g, w in zip(step_got, step_want):
            np.testing.assert_allclose(g, w, rtol=1e-8, atol=1e-12)


class WritesThroughPairs(runtime.nn.Module):
    def forward(self, a, b):
        z = runtime.complex(a, b)
        runtime.view_as_real(z)[..., 0].mul_(2.0)  # doubles the real parts, in z's memory
        z.imag.add_(a)
        return (z * z.conj()).real + z.angle()


def test_writes_through_complex_views_compile_as_eager():
    a = runtime.randn(4, 3, dtype=runtime.float64, requires_grad=True)
    b = runtime.randn(4, 3, dtype=runtime.float64, requires_grad=True)
    model = WritesThroughPairs()
    want = model(a, b)
    want_grads = runtime.autograd.grad(want.sum(), (a, b))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = nnc.compile(model)(a, b)
    got_grads = runtime.autograd.grad(got.sum(), (a, b))
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-12)
    for g, w in zip(got_grads, want_grads):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-12)


def write_through_parts(a, b, variant):
    z = runtime.complex(a, b)
    if variant in ("pairs", "both"):
        runtime.view_as_real(z)[..., 0].mul_(2.0)
    if variant in ("imag", "both"):
        z.imag.add_(a)
    if variant == "real-slice":
        z[1:].real.mul_(3.0)
    return (z * z.conj()).real + z.angle()


@pytest.mark.parametrize("variant", ["pairs", "imag", "both", "real-slice"])
def test_eager_writes_through_complex_parts_have_the_gradients_of_finite_differences(variant):
    a = runtime.randn(3, 2, dtype=runtime.float64, requires_grad=True)
    b = runtime.randn(3, 2, dtype=runtime.float64, requires_grad=True)
    assert runtime.autograd.gradcheck(lambda a, b: write_through_parts(a, b, variant), (a, b))


# -- optimizers: complex parameters are updated as their real and imaginary parts ----------------------------------

OPTIMIZERS = [("SGD", dict(momentum=0.9, nesterov=True, weight_decay=0.01)), ("Adam", dict(amsgrad=True)),
              ("AdamW", dict(weight_decay=0.1)), ("RMSprop", dict(momentum=0.5, centered=True)), ("Adagrad", {}),
              ("Adadelta", {}), ("Adamax", {}), ("NAdam", {}), ("RAdam", {}), ("ASGD", {}), ("Rprop", {}),
              ("LBFGS", {})]


def optimize(lib, name, options, start, target, steps=3):
    """A complex parameter after `steps` steps of optimizer `name` on |p - target|^2, in library `lib`."""
    p = lib.nn.Parameter(lib.tensor(start))
    opt = getattr(lib.optim, name)([p], lr=0.1, **options)
    goal = lib.tensor(target)

    def closure():
        opt.zero_grad()
        loss = ((p - goal).abs() ** 2).sum()
        loss.backward()
        return loss

    for _ in range(steps):
        opt.step(closure)
    return p.detach().numpy(), opt


@pytest.mark.parametrize("name,options", OPTIMIZERS, ids=[name for name, _ in OPTIMIZERS])
def test_a_complex_parameter_steps_as_its_real_pairs_would(name, options):
    rng = np.random.default_rng(3)
    start, target = rng.standard_normal((2, 3, 4)) + 1j * rng.standard_normal((2, 3, 4))
    got, opt = optimize(runtime, name, options, start, target)
    pairs = lambda z: np.stack([z.real, z.imag], -1)  # noqa: E731
    want, _ = optimize(runtime, name, options, pairs(start), pairs(target))  # the loss is the same function of them
    np.testing.assert_allclose(pairs(got), want, rtol=1e-12, atol=1e-14)
    state = opt.state[opt.param_groups[0]["params"][0]]
    assert all(t.dtype is runtime.complex128 for k, t in state.items() if isinstance(t, runtime.Tensor)
               and t.ndim == 2), state


@needs_torch
@pytest.mark.parametrize("name,options", OPTIMIZERS, ids=[name for name, _ in OPTIMIZERS])
def test_complex_parameters_step_as_torchs(name, options):
    rng = np.random.default_rng(4)
    start, target = rng.standard_normal((3, 4)) + 1j * rng.standard_normal((3, 4)), rng.standard_normal((3, 4)) * 1j
    np.testing.assert_allclose(optimize(runtime, name, options, start, target)[0],
                               optimize(torch, name, options, start, target)[0], rtol=1e-10, atol=1e-12)


def test_module_to_a_complex_dtype_casts_floating_and_complex_tensors_as_torch():
    model = runtime.nn.Linear(2, 2)
    model.register_parameter("c", runtime.nn.Parameter(runtime.ones(2, dtype=runtime.cfloat)))
    model.register_buffer("counts", runtime.ones(2, dtype=runtime.int64))
    model.to(runtime.complex128)
    assert [t.dtype for t in (model.weight, model.c, model.counts)] == [runtime.complex128] * 2 + [runtime.int64]
    model.double()  # floating tensors only: the complex ones stay
    assert model.c.dtype is runtime.complex128
    with pytest.raises(TypeError, match="floating point or complex dtypes"):
        model.to(runtime.int32)
