"""Memory formats (runtime.channels_last, ...): the objects, and the strides and contiguity they give, against torch."""
from __future__ import annotations

import copy
import pickle
import warnings

import numpy as np
import pytest

import runtime
import runtime.nn as nn

from helpers import needs_torch, torch

FORMATS = ["contiguous_format", "preserve_format", "channels_last", "channels_last_3d"]
RNG = np.random.default_rng(0)


def _both(name):
    return getattr(runtime, name), getattr(torch, name)


def _layouts(lib, shape):
    """Tensors of one shape in the layouts a user meets: C-contiguous, channels-last (4-d and 5-d), transposed, and
    slices of those (not dense: formats are suggested by their strides)."""
    x = lib.arange(float(np.prod(shape))).reshape(shape)
    out = {"contiguous": x, "transposed": x.transpose(-1, -2)}
    if x.ndim in (4, 5):
        fmt = lib.channels_last if x.ndim == 4 else lib.channels_last_3d
        out["channels_last"] = x.contiguous(memory_format=fmt)
    return {**out, **{f"sliced {name}": t[..., ::2] for name, t in out.items() if t.shape[-1] > 2}}


# shapes where torch's answers differ: 1 channel or 1x1 images are channels-last and contiguous at once, a batch of
# one with several channels is not
SHAPES = [(2, 3, 4, 5), (2, 1, 4, 5), (2, 3, 1, 1), (1, 3, 4, 5), (2, 3, 1, 5), (2, 3, 4, 5, 6), (1, 1, 1, 1),
          (2, 3, 4), (3, 4)]


def test_formats_are_distinct_named_objects():
    formats = [getattr(runtime, name) for name in FORMATS]
    assert len(set(map(id, formats))) == len(FORMATS)
    for name, fmt in zip(FORMATS, formats):
        assert isinstance(fmt, runtime.memory_format) and repr(fmt) == str(fmt) == f"runtime.{name}"
        assert copy.deepcopy(fmt) is fmt and pickle.loads(pickle.dumps(fmt)) is fmt


@needs_torch
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("fmt", FORMATS)
def test_is_contiguous_answers_as_torch(shape, fmt):
    ours, theirs = _layouts(runtime, shape), _layouts(torch, shape)
    for layout in ours:
        assert ours[layout].stride() == theirs[layout].stride(), layout
        got = ours[layout].is_contiguous(memory_format=getattr(runtime, fmt))
        assert got == theirs[layout].is_contiguous(memory_format=getattr(torch, fmt)), layout


def _outcome(fn):
    """(strides, values) of what fn returns, or the type and message of what it raises."""
    try:
        out = fn()
    except (RuntimeError, TypeError) as e:
        return type(e).__name__, str(e)
    return out.stride(), out.tolist()


@needs_torch
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("method", ["contiguous", "to", "clone", "empty_like", "zeros_like", "full_like"])
def test_layouts_match_torch(shape, fmt, method):
    """The strides (and values) of each layout converted, or torch's error (a channels-last format of another rank,
    contiguous() with preserve_format). A preserve_format clone is C-contiguous here: torch keeps dense strides."""
    calls = {"contiguous": lambda lib, x, f: x.contiguous(memory_format=f),
             "to": lambda lib, x, f: x.to(memory_format=f),
             "clone": lambda lib, x, f: x.clone(memory_format=f),
             "empty_like": lambda lib, x, f: lib.empty_like(x, memory_format=f).zero_(),
             "zeros_like": lambda lib, x, f: lib.zeros_like(x, memory_format=f),
             "full_like": lambda lib, x, f: lib.full_like(x, 2.0, memory_format=f)}
    call = calls[method]
    ours, theirs = _layouts(runtime, shape), _layouts(torch, shape)
    for layout in ours:
        if method == "clone" and fmt == "preserve_format":
            continue
        got = _outcome(lambda: call(runtime, ours[layout], getattr(runtime, fmt)))
        want = _outcome(lambda: call(torch, theirs[layout], getattr(torch, fmt)))
        assert got == want, layout


@needs_torch
def test_converting_returns_self_where_torch_does():
    for lib in (runtime, torch):
        x = lib.zeros(2, 3, 4, 5)
        cl = x.contiguous(memory_format=lib.channels_last)
        assert x.contiguous(memory_format=lib.contiguous_format) is x
        assert cl.contiguous(memory_format=lib.channels_last) is cl
        assert cl.to(memory_format=lib.channels_last) is cl and x.to(memory_format=lib.preserve_format) is x
        assert cl.to(lib.float64).stride() == cl.double().stride() == (60, 1, 15, 3)
        assert x.to(lib.float64, memory_format=lib.channels_last).stride() == (60, 1, 15, 3)


@needs_torch
def test_gradient_flows_through_a_layout_change():
    x = RNG.standard_normal((2, 3, 4, 5))
    seed = RNG.standard_normal((2, 3, 4, 5))
    grads = []
    for lib in (runtime, torch):
        xt = lib.tensor(x, requires_grad=True)
        out = xt.contiguous(memory_format=lib.channels_last)
        assert out.requires_grad and out.stride() == (60, 1, 15, 3)
        grads.append(lib.autograd.grad((out * lib.tensor(seed)).sum(), xt)[0].numpy())
    np.testing.assert_array_equal(*grads)


@needs_torch
def test_empty_takes_a_format_and_other_factories_do_not():
    for lib in (runtime, torch):
        assert lib.empty(2, 3, 4, 5, memory_format=lib.channels_last).stride() == (60, 1, 15, 3)
        assert lib.empty(2, 3, 4, 5, 6, memory_format=lib.channels_last_3d).stride() == (360, 1, 90, 18, 3)
        with pytest.raises(RuntimeError, match="unsupported memory format Preserve"):
            lib.empty(2, 3, 4, 5, memory_format=lib.preserve_format)
        with pytest.raises(RuntimeError, match="required rank 4 tensor to use channels_last format"):
            lib.empty(2, 3, 4, memory_format=lib.channels_last)
        with pytest.raises(TypeError, match="memory_format"):
            lib.zeros(2, 3, 4, 5, memory_format=lib.channels_last)


@needs_torch
def test_a_format_argument_must_be_a_format():
    for lib in (runtime, torch):
        with pytest.raises(TypeError, match="must be torch.memory_format, not str"):
            lib.zeros(2, 3).is_contiguous(memory_format="channels_last")


@needs_torch
def test_module_to_converts_its_4d_tensors():
    torch.manual_seed(0)
    theirs = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
                                 torch.nn.Linear(16, 2))
    ours = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(16, 2))
    ours.load_state_dict({k: runtime.tensor(v.numpy()) for k, v in theirs.state_dict().items()})
    x = RNG.standard_normal((2, 3, 4, 4)).astype(np.float32)
    want = ours(runtime.tensor(x)).detach().numpy()
    weight = ours[0].weight
    for model, lib in ((ours, runtime), (theirs, torch)):
        assert model.to(memory_format=lib.channels_last) is model
    assert ours[0].weight is weight
    for (name, a), b in zip(ours.state_dict().items(), theirs.state_dict().values()):
        assert a.stride() == b.stride(), name
    np.testing.assert_allclose(ours(runtime.tensor(x)).detach().numpy(), theirs(torch.tensor(x)).detach().numpy(),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(ours(runtime.tensor(x).contiguous(memory_format=runtime.channels_last))
                                  .detach().numpy(), want)


def test_a_compiled_channels_last_model_computes_the_same():
    import nnc

    def make():
        runtime.manual_seed(0)
        return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(16, 2)).double()

    x = runtime.tensor(RNG.standard_normal((2, 3, 4, 4)))
    eager = make()
    want = eager(x)
    want.sum().backward()
    model = make().to(memory_format=runtime.channels_last)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = nnc.compile(model)(x.contiguous(memory_format=runtime.channels_last))
    got.sum().backward()
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-12, atol=1e-12)
    for p, q in zip(model.parameters(), eager.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-12, atol=1e-12)
