"""Sweeps the whole op table: shape/dtype rules, forward and gradients vs torch, and gradients vs
float64 finite differences. A new op without samples in opinfo.py fails test_every_op_has_samples."""
from __future__ import annotations

import numpy as np
import pytest

import runtime
from runtime import ops
from runtime.ops import OPS, DataDependentShape
from runtime.autograd import gradcheck

from helpers import needs_torch, torch  # finite differences check every gradient where torch is missing
from opinfo import SAMPLES


def _cases(keep=lambda op, sample: True):
    return [pytest.param(name, i, id=f"{name}-{i}")
            for name in sorted(OPS) for i, sample in enumerate(SAMPLES.get(name, ()))
            if keep(OPS[name], sample)]


def _differentiable_inputs(op, sample):
    return [i for i, x in enumerate(sample.inputs)
            if isinstance(x, np.ndarray) and x.dtype.kind in "fc" and op.vjp_rule(i) is not None]


def _has_gradient(op, sample):
    if not (op.differentiable and _differentiable_inputs(op, sample)):
        return False
    out = ops.apply(op.name, *_runtime_inputs(op, sample, np.float64, False), **sample.attrs)
    return out.dtype.is_differentiable


def _inputs(lib, op, sample, float_dtype, requires_grad):
    """The sample's inputs as `lib` tensors (runtime or torch); scalars stay scalars."""
    out = []
    for i, x in enumerate(sample.inputs):
        if isinstance(x, np.ndarray):
            array = x.astype(float_dtype) if x.dtype.kind == "f" else x.copy()
            if x.dtype.kind == "c":  # complex samples: the complex dtype of the case's float dtype
                array = x.astype(np.result_type(float_dtype, np.complex64))
            t = lib.from_numpy(array)
            if requires_grad and i in _differentiable_inputs(op, sample):
                t.requires_grad_()
            out.append(t)
        else:
            out.append(x)
    return out


def _runtime_inputs(op, sample, float_dtype, requires_grad):
    return _inputs(runtime, op, sample, float_dtype, requires_grad)


def _torch_inputs(op, sample, float_dtype, requires_grad):
    return _inputs(torch, op, sample, float_dtype, requires_grad)


def _seed(rng, out):
    """Random output weights for a backward: complex ones for a complex output."""
    values = rng.standard_normal(tuple(out.shape))
    return values + 1j * rng.standard_normal(tuple(out.shape)) if out.dtype.is_complex else values


ALL_CASES = _cases()
GRAD_CASES = _cases(_has_gradient)
FD_CASES = _cases(lambda op, s: _has_gradient(op, s) and s.fd)


def _assert_close(ours, theirs, float_dtype):
    assert ours.dtype.name == str(theirs.dtype).removeprefix("torch."), (ours.dtype, theirs.dtype)
    assert tuple(ours.shape) == tuple(theirs.shape)
    expected = theirs.detach().resolve_conj().numpy()
    if expected.dtype.kind in "biu":
        np.testing.assert_array_equal(ours.numpy(), expected)
    else:
        tol = 1e-12 if float_dtype == np.float64 else 1e-5
        np.testing.assert_allclose(ours.detach().numpy(), expected, rtol=tol, atol=tol)


def test_every_op_has_samples():
    missing = sorted(name for name in OPS if not SAMPLES.get(name))
    assert not missing, f"ops without samples in tests/opinfo.py: {missing}"


def test_samples_only_name_real_ops():
    assert set(SAMPLES) <= set(OPS), sorted(set(SAMPLES) - set(OPS))


def test_every_differentiable_op_is_checked_by_finite_differences():
    checked = {p.values[0] for p in FD_CASES}
    unchecked = sorted(name for name, op in OPS.items() if op.differentiable and name not in checked)
    assert not unchecked, f"differentiable ops with no finite-difference sample: {unchecked}"


@pytest.mark.parametrize("name,i", ALL_CASES)
def test_shape_and_dtype_rules_match_forward(name, i):
    op, sample = OPS[name], SAMPLES[name][i]
    inputs = _runtime_inputs(op, sample, np.float32, False)
    out = ops.apply(name, *inputs, **sample.attrs)
    try:
        shape, dtype = op.infer(*inputs, **sample.attrs)
    except DataDependentShape:
        assert any(getattr(x, "dtype", None) is runtime.bool for x in inputs[1:])
        return
    assert shape == tuple(out.shape)
    assert dtype is out.dtype


@pytest.mark.parametrize("name,i", ALL_CASES)
def test_kind_template_and_rules_are_declared(name, i):
    op = OPS[name]
    assert op.kind in {ops.Kind.ELEMENTWISE, ops.Kind.REDUCTION, ops.Kind.MATMUL, ops.Kind.SHAPE, ops.Kind.OTHER}
    if op.kind == ops.Kind.ELEMENTWISE:
        assert op.template and all(f"{{{k}}}" in op.template for k in range(op.arity))
    assert callable(op.forward) and callable(op.shape_rule) and callable(op.dtype_rule)


@needs_torch
@pytest.mark.parametrize("float_dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name,i", _cases(lambda op, sample: sample.torch_fn is not None))
def test_forward_matches_torch(name, i, float_dtype):
    op, sample = OPS[name], SAMPLES[name][i]
    ours = ops.apply(name, *_runtime_inputs(op, sample, float_dtype, False), **sample.attrs)
    theirs = sample.torch_fn(torch, *_torch_inputs(op, sample, float_dtype, False))
    _assert_close(ours, theirs, float_dtype)


@needs_torch
@pytest.mark.parametrize("name,i", GRAD_CASES)
def test_gradients_match_torch(name, i):
    op, sample = OPS[name], SAMPLES[name][i]
    ours_in = _runtime_inputs(op, sample, np.float64, True)
    theirs_in = _torch_inputs(op, sample, np.float64, True)
    ours, theirs = ops.apply(name, *ours_in, **sample.attrs), sample.torch_fn(torch, *theirs_in)
    seed = _seed(np.random.default_rng(i), ours)
    diff = _differentiable_inputs(op, sample)
    our_grads = runtime.autograd.grad(ours, [ours_in[k] for k in diff], runtime.tensor(seed), allow_unused=True)
    their_grads = torch.autograd.grad(theirs, [theirs_in[k] for k in diff], torch.tensor(seed), allow_unused=True)
    for k, a, b in zip(diff, our_grads, their_grads):
        expected = np.zeros(sample.inputs[k].shape) if b is None else b.resolve_conj().numpy()
        got = np.zeros(sample.inputs[k].shape) if a is None else a.numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12, err_msg=f"gradient of input {k}")


@pytest.mark.parametrize("name,i", GRAD_CASES)
def test_gradients_read_only_what_saved_tensor_hooks_kept(name, i):
    """Under hooks that keep copies, the rules see only those: the inputs overwritten with NaN after forward (and
    the inputs an op does not declare saved, which the node then drops) change no gradient."""
    op, sample = OPS[name], SAMPLES[name][i]
    diff = _differentiable_inputs(op, sample)
    plain_in = _runtime_inputs(op, sample, np.float64, True)
    out = ops.apply(name, *plain_in, **sample.attrs)
    seed = runtime.tensor(_seed(np.random.default_rng(i), out))
    want = runtime.autograd.grad(out, [plain_in[k] for k in diff], seed, allow_unused=True)
    hooked_in = _runtime_inputs(op, sample, np.float64, True)
    packed = []
    with runtime.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t.detach().clone(),
                                                      lambda t: t):
        out = ops.apply(name, *hooked_in, **sample.attrs)
    assert len(packed) == sum(1 for s in op.saves if s == "out" or isinstance(hooked_in[s], runtime.Tensor))
    for x in hooked_in:
        if isinstance(x, runtime.Tensor) and x.dtype.is_differentiable:
            x.detach().numpy()[...] = np.nan
    got = runtime.autograd.grad(out, [hooked_in[k] for k in diff], seed, allow_unused=True)
    for k, a, b in zip(diff, got, want):
        assert (a is None) == (b is None)
        if b is not None:
            np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=f"gradient of input {k}")


@pytest.mark.parametrize("name,i", FD_CASES)
def test_gradients_match_finite_differences(name, i):
    op, sample = OPS[name], SAMPLES[name][i]
    inputs = _runtime_inputs(op, sample, np.float64, True)
    assert gradcheck(lambda *xs: ops.apply(name, *xs, **sample.attrs), inputs, eps=1e-6, atol=1e-6, rtol=1e-5)


DECOMPOSED_CASES = _cases(lambda op, sample: op.decomposition is not None)


def test_fused_ops_have_decompositions():
    """The ops eager runs fused are the ones nnc expands: each has samples checked below."""
    assert {p.values[0] for p in DECOMPOSED_CASES} >= {"log_softmax", "log_softmax_backward", "nll_loss",
                                                        "nll_loss_backward"}


@pytest.mark.parametrize("name,i", DECOMPOSED_CASES)
def test_decomposition_computes_the_op_and_its_gradients(name, i):
    op, sample = OPS[name], SAMPLES[name][i]
    fused_in = _runtime_inputs(op, sample, np.float64, True)
    composed_in = _runtime_inputs(op, sample, np.float64, True)
    fused = ops.apply(name, *fused_in, **sample.attrs)
    composed = op.decomposition(*composed_in, **sample.attrs)
    assert tuple(fused.shape) == tuple(composed.shape) and fused.dtype is composed.dtype
    np.testing.assert_allclose(fused.detach().numpy(), composed.detach().numpy(), rtol=1e-12, atol=1e-12)
    diff = _differentiable_inputs(op, sample)
    if not diff or not fused.requires_grad:
        return
    seed = runtime.tensor(np.random.default_rng(i).standard_normal(tuple(fused.shape)))
    fused_grads = runtime.autograd.grad(fused, [fused_in[k] for k in diff], seed, allow_unused=True)
    composed_grads = runtime.autograd.grad(composed, [composed_in[k] for k in diff], seed, allow_unused=True)
    for k, a, b in zip(diff, fused_grads, composed_grads):
        zero = np.zeros(sample.inputs[k].shape)
        np.testing.assert_allclose(zero if a is None else a.numpy(), zero if b is None else b.numpy(),
                                   rtol=1e-12, atol=1e-12, err_msg=f"gradient of input {k}")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_second_derivatives_match_finite_differences(reduction):
    """Double backward through the fused ops: the gradient of (gradient . v) by finite differences."""
    rng = np.random.default_rng(5)
    target = runtime.tensor(np.array([1, 3, 0, 3, 2]))
    v = runtime.tensor(rng.standard_normal((5, 4)))

    def gradient_dot_v(x):
        loss = runtime.nn.functional.cross_entropy(x, target, reduction=reduction, ignore_index=0)
        (g,) = runtime.autograd.grad(loss.sum(), [x], create_graph=True)
        return (g * v).sum()

    x = runtime.tensor(rng.standard_normal((5, 4)), requires_grad=True)
    assert gradcheck(gradient_dot_v, [x], eps=1e-6, atol=1e-6, rtol=1e-5)
