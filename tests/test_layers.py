"""Built-in layers vs torch with the same weights and input: outputs, gradients, reprs and defaults."""
from __future__ import annotations

import math

import numpy as np
import pytest

import runtime
from runtime import nn

from helpers import needs_torch, torch

rng = np.random.default_rng(3)


def _input(shape, kind="float"):
    if kind == "index":
        return rng.integers(0, 10, shape)
    if kind == "prob":
        return rng.uniform(0.05, 0.95, shape)
    return rng.standard_normal(shape)


# name -> (constructor given a library, input specs [(shape, kind)], target spec or None)
LAYERS = {
    "Linear": (lambda lib: lib.nn.Linear(5, 3), [((4, 5), "float")], None),
    "Linear_nobias": (lambda lib: lib.nn.Linear(5, 3, bias=False), [((2, 4, 5), "float")], None),
    "Bilinear": (lambda lib: lib.nn.Bilinear(3, 4, 2), [((5, 3), "float"), ((5, 4), "float")], None),
    "Identity": (lambda lib: lib.nn.Identity(), [((3, 2), "float")], None),
    "Flatten": (lambda lib: lib.nn.Flatten(), [((2, 3, 4), "float")], None),
    "Unflatten": (lambda lib: lib.nn.Unflatten(1, (2, 3)), [((4, 6), "float")], None),
    "ReLU": (lambda lib: lib.nn.ReLU(), [((3, 4), "float")], None),
    "LeakyReLU": (lambda lib: lib.nn.LeakyReLU(0.2), [((3, 4), "float")], None),
    "GELU": (lambda lib: lib.nn.GELU(), [((3, 4), "float")], None),
    "GELU_tanh": (lambda lib: lib.nn.GELU(approximate="tanh"), [((3, 4), "float")], None),
    "SiLU": (lambda lib: lib.nn.SiLU(), [((3, 4), "float")], None),
    "Sigmoid": (lambda lib: lib.nn.Sigmoid(), [((3, 4), "float")], None),
    "Tanh": (lambda lib: lib.nn.Tanh(), [((3, 4), "float")], None),
    "Softmax": (lambda lib: lib.nn.Softmax(dim=1), [((3, 4), "float")], None),
    "LogSoftmax": (lambda lib: lib.nn.LogSoftmax(dim=-1), [((3, 4), "float")], None),
    "Dropout_eval": (lambda lib: lib.nn.Dropout(0.3).eval(), [((3, 4), "float")], None),
    "Embedding": (lambda lib: lib.nn.Embedding(10, 4, padding_idx=0), [((3, 5), "index")], None),
    "LayerNorm": (lambda lib: lib.nn.LayerNorm(6), [((3, 6), "float")], None),
    "LayerNorm_2d": (lambda lib: lib.nn.LayerNorm((2, 3), eps=1e-3), [((4, 2, 3), "float")], None),
    "BatchNorm1d": (lambda lib: lib.nn.BatchNorm1d(4), [((6, 4), "float")], None),
    "BatchNorm1d_eval": (lambda lib: lib.nn.BatchNorm1d(4).eval(), [((6, 4, 3), "float")], None),
    "BatchNorm2d": (lambda lib: lib.nn.BatchNorm2d(3, momentum=None), [((2, 3, 4, 4), "float")], None),
    "Conv1d": (lambda lib: lib.nn.Conv1d(4, 6, 3, stride=2, padding=1, groups=2), [((2, 4, 9), "float")], None),
    "Conv2d": (lambda lib: lib.nn.Conv2d(3, 4, 3, padding="same", dilation=2), [((2, 3, 7, 7), "float")], None),
    "Conv2d_stride": (lambda lib: lib.nn.Conv2d(2, 4, (3, 2), stride=(2, 1), bias=False), [((1, 2, 6, 5), "float")],
                      None),
    "MaxPool2d": (lambda lib: lib.nn.MaxPool2d(2), [((2, 3, 6, 6), "float")], None),
    "MaxPool2d_pad": (lambda lib: lib.nn.MaxPool2d(3, stride=2, padding=1), [((1, 2, 7, 7), "float")], None),
    "MaxPool2d_ceil_dilation": (lambda lib: lib.nn.MaxPool2d(2, stride=2, dilation=2, ceil_mode=True),
                                [((1, 2, 7, 7), "float")], None),
    "AvgPool2d_ceil_exclude_pad": (lambda lib: lib.nn.AvgPool2d(3, 2, padding=1, ceil_mode=True,
                                                                count_include_pad=False), [((1, 2, 6, 6), "float")],
                                   None),
    "AvgPool2d": (lambda lib: lib.nn.AvgPool2d(2, padding=1), [((2, 3, 5, 5), "float")], None),
    "AdaptiveAvgPool2d": (lambda lib: lib.nn.AdaptiveAvgPool2d((2, 3)), [((2, 3, 5, 7), "float")], None),
    "MultiheadAttention": (lambda lib: lib.nn.MultiheadAttention(8, 2),
                           [((5, 2, 8), "float"), ((6, 2, 8), "float"), ((6, 2, 8), "float")], None),
    "MultiheadAttention_bf": (lambda lib: lib.nn.MultiheadAttention(8, 4, batch_first=True),
                              [((2, 5, 8), "float"), ((2, 5, 8), "float"), ((2, 5, 8), "float")], None),
    "MSELoss": (lambda lib: lib.nn.MSELoss(), [((3, 4), "float")], ((3, 4), "float")),
    "L1Loss_sum": (lambda lib: lib.nn.L1Loss(reduction="sum"), [((3, 4), "float")], ((3, 4), "float")),
    "CrossEntropyLoss": (lambda lib: lib.nn.CrossEntropyLoss(label_smoothing=0.1), [((5, 4), "float")],
                         ((5,), "class4")),
    "CrossEntropyLoss_none": (lambda lib: lib.nn.CrossEntropyLoss(reduction="none"), [((5, 4), "float")],
                              ((5,), "class4")),
    "NLLLoss": (lambda lib: lib.nn.NLLLoss(), [((5, 4), "float")], ((5,), "class4")),
    "BCELoss": (lambda lib: lib.nn.BCELoss(), [((3, 4), "prob")], ((3, 4), "prob")),
    "BCEWithLogitsLoss": (lambda lib: lib.nn.BCEWithLogitsLoss(reduction="sum"), [((3, 4), "float")],
                          ((3, 4), "prob")),
}


def _target(spec):
    shape, kind = spec
    if kind == "class4":
        return rng.integers(0, 4, shape)
    return _input(shape, kind)


def _copy_weights(theirs, ours) -> None:
    state = {k: runtime.tensor(v.detach().numpy().copy()) for k, v in theirs.state_dict().items()}
    ours.load_state_dict(state)


def _build(name):
    make, input_specs, target_spec = LAYERS[name]
    torch.manual_seed(0)
    theirs = make(torch).double()
    ours = make(runtime).double()
    _copy_weights(theirs, ours)
    arrays = [_input(shape, kind) for shape, kind in input_specs]
    target = _target(target_spec) if target_spec else None
    return ours, theirs, arrays, target


def _run(lib, module, arrays, target):
    inputs = [lib.tensor(a, requires_grad=a.dtype.kind == "f") for a in arrays]
    args = inputs + ([lib.tensor(target)] if target is not None else [])
    out = module(*args)
    if isinstance(out, tuple):
        out = out[0] + out[1].sum()
    return inputs, out


@needs_torch
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layer_matches_torch_forward_and_backward(name):
    ours, theirs, arrays, target = _build(name)
    our_inputs, our_out = _run(runtime, ours, arrays, target)
    their_inputs, their_out = _run(torch, theirs, arrays, target)
    np.testing.assert_allclose(our_out.detach().numpy(), their_out.detach().numpy(), rtol=1e-9, atol=1e-10)
    seed = rng.standard_normal(tuple(their_out.shape))
    our_out.backward(runtime.tensor(seed))
    their_out.backward(torch.tensor(seed))
    for a, b in zip(our_inputs, their_inputs):
        if b.grad is not None:
            np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-9, atol=1e-10)
    their_params = dict(theirs.named_parameters())
    for key, p in ours.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), their_params[key].grad.numpy(), rtol=1e-9, atol=1e-10,
                                   err_msg=key)
    their_buffers = dict(theirs.named_buffers())
    for key, buf in ours.named_buffers():
        np.testing.assert_allclose(buf.numpy(), their_buffers[key].numpy(), rtol=1e-9, err_msg=key)


@needs_torch
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layer_repr_and_state_dict_keys_match_torch(name):
    make = LAYERS[name][0]
    ours, theirs = make(runtime), make(torch)
    assert repr(ours) == repr(theirs).replace("torch.", "runtime.")
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for (k, a), (_, b) in zip(ours.state_dict().items(), theirs.state_dict().items()):
        assert tuple(a.shape) == tuple(b.shape) and a.dtype.name == str(b.dtype).removeprefix("torch."), k


@pytest.mark.parametrize("name,bound", [("Linear", lambda m: 1 / math.sqrt(m.in_features)),
                                        ("Conv2d", lambda m: 1 / math.sqrt(m.weight[0].numel()))])
def test_default_initialisation_follows_torch_scheme(name, bound):
    layer = nn.Linear(400, 300) if name == "Linear" else nn.Conv2d(16, 32, 3)
    limit = bound(layer)
    w = layer.weight.detach().numpy()
    assert np.abs(w).max() <= limit + 1e-7  # kaiming_uniform(a=sqrt(5)) gives bound 1/sqrt(fan_in)
    assert np.abs(w).max() > 0.95 * limit
    assert abs(w.std() - limit / math.sqrt(3)) < 0.05 * limit
    assert np.abs(layer.bias.detach().numpy()).max() <= limit


def test_factory_kwargs_dtype_and_device():
    layer = nn.Linear(3, 2, dtype=runtime.float64, device="cpu")
    assert layer.weight.dtype is runtime.float64 and layer.bias.dtype is runtime.float64
    with pytest.raises(RuntimeError, match="not available"):
        nn.Conv2d(1, 1, 1, device="cuda")


@needs_torch
def test_batchnorm_running_stats_momentum_and_eval():
    bn_r, bn_t = nn.BatchNorm1d(3), torch.nn.BatchNorm1d(3).double()
    bn_r.double()
    for step in range(3):
        x = rng.standard_normal((8, 3)) * (step + 1)
        bn_r(runtime.tensor(x))
        bn_t(torch.tensor(x))
    np.testing.assert_allclose(bn_r.running_mean.numpy(), bn_t.running_mean.numpy(), rtol=1e-12)
    np.testing.assert_allclose(bn_r.running_var.numpy(), bn_t.running_var.numpy(), rtol=1e-12)
    assert int(bn_r.num_batches_tracked) == 3
    bn_r.eval()
    bn_t.eval()
    x = rng.standard_normal((4, 3))
    np.testing.assert_allclose(bn_r(runtime.tensor(x)).detach().numpy(), bn_t(torch.tensor(x)).detach().numpy(),
                               rtol=1e-12)


@pytest.mark.parametrize("make", [lambda lib: lib.nn.BatchNorm2d(3), lambda lib: lib.nn.BatchNorm2d(3, momentum=None),
                                  lambda lib: lib.nn.GroupNorm(3, 3)], ids=["BatchNorm2d", "cumulative", "GroupNorm"])
def test_an_empty_batch_normalizes_to_nothing_in_training(make):
    layer = make(runtime)
    for name, buffer in layer.named_buffers():
        if buffer.dtype.is_floating_point:
            buffer.fill_(5.0)  # as torch: an empty batch leaves the running statistics as they were
    before = {k: v.numpy().copy() for k, v in layer.state_dict().items()}
    x = runtime.zeros(0, 3, 4, 4, requires_grad=True)
    out = layer(x)
    out.sum().backward()
    assert tuple(out.shape) == (0, 3, 4, 4) and tuple(x.grad.shape) == (0, 3, 4, 4)
    assert all(float(p.grad.abs().sum()) == 0 for p in layer.parameters())
    after = layer.state_dict()
    for k, v in before.items():
        want = v + 1 if k.endswith("num_batches_tracked") else v
        np.testing.assert_array_equal(after[k].numpy(), want, err_msg=k)
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        nn.BatchNorm1d(3)(runtime.zeros(1, 3))
    if torch is not None:
        theirs = make(torch)
        assert tuple(theirs(torch.zeros(0, 3, 4, 4)).shape) == tuple(out.shape)


def test_dropout_train_mode_zeroes_and_scales():
    layer = nn.Dropout(0.25)
    out = layer(runtime.ones(20000)).numpy()
    assert set(np.unique(out)) <= {0.0, np.float32(1 / 0.75)}
    assert abs((out == 0).mean() - 0.25) < 0.02


def test_lazy_linear_materialises_on_first_call():
    layer = nn.LazyLinear(4)
    assert isinstance(layer.weight, nn.UninitializedParameter)
    out = layer(runtime.randn(2, 7))
    assert tuple(out.shape) == (2, 4) and tuple(layer.weight.shape) == (4, 7)
    assert type(layer) is nn.Linear and repr(layer) == "Linear(in_features=7, out_features=4, bias=True)"


def test_skip_init_leaves_parameters_unset():
    layer = nn.utils.skip_init(nn.Linear, 5, 3)
    assert tuple(layer.weight.shape) == (3, 5)
    assert float(layer.weight.abs().sum()) == 0
    assert float(nn.Linear(5, 3).weight.abs().sum()) > 0  # the class itself is unchanged afterwards
