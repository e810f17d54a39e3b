"""Older and device-probing torch API that public training scripts still use: typed tensor classes, Variable,
`import torch.backends.cudnn`, torch.cuda.amp, DataParallel on the CPU, clip_grad_norm, resize_, range indices,
dropout2d on other ranks, lazy sampling with replacement, torch.xpu."""
from __future__ import annotations

import importlib
import itertools
import warnings

import numpy as np
import pytest

import runtime
from runtime import nn

from helpers import needs_torch, torch


LEGACY_TYPES = ["FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "LongTensor", "IntTensor",
                "ShortTensor", "CharTensor", "ByteTensor", "BoolTensor"]


@needs_torch
@pytest.mark.parametrize("name", LEGACY_TYPES)
def test_typed_tensor_classes_construct_and_check_as_torchs(name):
    ours, theirs = getattr(runtime, name), getattr(torch, name)
    for args in [(), (2, 3), (4,), ([1, 0, 1],), (np.array([[1, 2], [3, 4]]),), ((2, 3),)]:
        got, want = ours(*args), theirs(*args)
        assert tuple(got.shape) == tuple(want.shape) and got.dtype.name == str(want.dtype).removeprefix("torch.")
        if args and not all(isinstance(a, int) for a in args):  # data, not sizes: the values too
            np.testing.assert_array_equal(got.double().numpy(), want.double().numpy())
    assert tuple(ours(runtime.Size([2, 3])).shape) == (2, 3)
    for dtype in (runtime.float32, runtime.int64, runtime.uint8, runtime.bool):
        t = runtime.zeros(2, dtype=dtype)
        assert isinstance(t, ours) == isinstance(torch.zeros(2, dtype=getattr(torch, dtype.name)), theirs)
    assert runtime.zeros(2).type(ours).dtype is ours.dtype
    assert runtime.zeros(2).type(ours).type() == torch.zeros(2).type(theirs).type() == f"torch.{name}"
    assert runtime.zeros(2).type(f"torch.{name}").dtype is ours.dtype
    with pytest.raises(TypeError, match="data must be a sequence"):
        ours(2.5)


def test_byte_char_and_short_conversions_wrap_as_torchs():
    values = [-129.0, -1.5, 0.0, 200.7, 300.0, 70000.0]
    expected = {"byte": ("uint8", [127, 255, 0, 200, 44, 112]), "char": ("int8", [127, -1, 0, -56, 44, 112]),
                "short": ("int16", [-129, -1, 0, 200, 300, 4464])}
    for method, (name, want) in expected.items():
        got = getattr(runtime.tensor(values, dtype=runtime.float64).long(), method)()
        assert got.dtype is getattr(runtime, name) and got.tolist() == want, method
        legacy = {"uint8": "ByteTensor", "int8": "CharTensor", "int16": "ShortTensor"}[name]
        assert got.type() == f"torch.{legacy}" and isinstance(got, getattr(runtime, legacy))
    assert runtime.short is runtime.int16


def test_typed_class_of_a_tensor_shares_its_memory_and_refuses_another_dtype():
    a = runtime.zeros(3)
    b = runtime.FloatTensor(a)
    b[0] = 5.0
    assert a[0].item() == 5.0 and b is not a
    with pytest.raises(TypeError, match="dtype float32 for torch.FloatTensor, got a CPU tensor of dtype int64"):
        runtime.FloatTensor(runtime.zeros(3, dtype=runtime.int64))


def test_variable_is_a_new_leaf_sharing_memory():
    from runtime.autograd import Variable

    t = runtime.randn(3)
    assert isinstance(t, Variable)
    v = Variable(t, requires_grad=True)
    assert v is not t and v.requires_grad and v.is_leaf and not t.requires_grad
    (v * 2).sum().backward()
    np.testing.assert_array_equal(v.grad.numpy(), np.full(3, 2.0))
    with pytest.warns(UserWarning, match="volatile was removed"):
        assert not Variable(t, volatile=True).requires_grad
    with pytest.raises(TypeError, match="has to be a tensor"):
        Variable([1.0, 2.0])


def test_backends_and_cuda_amp_import_as_modules():
    cudnn = importlib.import_module("runtime.backends.cudnn")
    assert cudnn is runtime.backends.cudnn and not cudnn.is_available()
    cudnn.benchmark = True
    assert runtime.backends.cudnn.benchmark is True
    cudnn.benchmark = False
    amp = importlib.import_module("runtime.cuda.amp")
    with pytest.warns(UserWarning, match="CUDA is not available"):
        with amp.autocast():
            assert not runtime.is_autocast_enabled()
    assert not amp.GradScaler(enabled=False).is_enabled()
    assert runtime.xpu.is_available() is False and runtime.xpu.device_count() == 0


def test_data_parallel_on_the_cpu_runs_its_module_and_prefixes_the_state_dict():
    runtime.manual_seed(0)
    inner = nn.Linear(3, 2)
    model = nn.DataParallel(inner, device_ids=[0, 1])
    assert model.module is inner and model.device_ids == []
    assert list(model.state_dict()) == ["module.weight", "module.bias"]
    x = runtime.randn(4, 3)
    np.testing.assert_array_equal(model(x).detach().numpy(), inner(x).detach().numpy())
    model(x).sum().backward()
    assert inner.weight.grad is not None


def test_clip_grad_norm_is_the_deprecated_name_of_clip_grad_norm_():
    p = nn.Parameter(runtime.ones(2))
    p.grad = runtime.full((2,), 3.0)
    with pytest.warns(FutureWarning, match="deprecated in favor of `torch.nn.utils.clip_grad_norm_`"):
        total = nn.utils.clip_grad_norm(p, 1.0)
    assert abs(total.item() - np.sqrt(18)) < 1e-6
    assert abs(float(p.grad.norm()) - 1.0) < 1e-5


@needs_torch
@pytest.mark.parametrize("start,new", [((2, 3), (3, 2)), ((2, 3), (4,)), ((4,), (2, 3)), ((1,), (5,))])
def test_resize_keeps_the_leading_values_in_flat_order(start, new):
    n = int(np.prod(start))
    ours = runtime.arange(float(n)).reshape(start)
    theirs = torch.arange(float(n)).reshape(start)
    assert ours.resize_(*new) is ours
    theirs.resize_(*new)
    kept = min(n, int(np.prod(new)))
    assert tuple(ours.shape) == tuple(theirs.shape)
    np.testing.assert_array_equal(ours.reshape(-1)[:kept].numpy(), theirs.reshape(-1)[:kept].numpy())
    with pytest.raises(RuntimeError, match="cannot resize variables that require grad"):
        runtime.ones(2, requires_grad=True).resize_(3)


@needs_torch
def test_range_indices_read_and_write_as_torchs():
    ours, theirs = runtime.arange(12).reshape(3, 4), torch.arange(12).reshape(3, 4)
    np.testing.assert_array_equal(ours[range(3), [0, 1, 2]].numpy(), theirs[range(3), [0, 1, 2]].numpy())
    np.testing.assert_array_equal(ours[range(1, 3)].numpy(), theirs[range(1, 3)].numpy())
    ours[range(3), runtime.tensor([3, 2, 1])] = -1
    theirs[range(3), torch.tensor([3, 2, 1])] = -1
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


@pytest.mark.parametrize("shape", [(6, 500), (3, 4, 500), (2, 3, 4, 5, 60)])
def test_dropout2d_on_other_ranks_warns_and_drops_per_sample_and_channel(shape):
    runtime.manual_seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = nn.functional.dropout2d(runtime.ones(*shape), 0.5, training=True).numpy()
    assert any("dropout2d: Received a" in str(w.message) for w in caught)
    if len(shape) == 2:  # (N, C) with no spatial dims: each element on its own
        assert all(set(np.unique(row)) == {0.0, 2.0} for row in out)
    else:  # one draw per (sample, channel), shared by its spatial elements
        per_channel = out.reshape(shape[0], shape[1], -1)
        assert all(len(np.unique(c)) == 1 for row in per_channel for c in row)
        assert set(np.unique(per_channel)) == {0.0, 2.0}
    with pytest.raises(RuntimeError, match="at least 2 dimensions"):
        nn.functional.dropout2d(runtime.ones(5), 0.5)


def test_sampling_with_replacement_is_lazy_and_repeatable():
    data = list(range(7))
    sampler = runtime.utils.data.RandomSampler(data, replacement=True, num_samples=int(1e10))
    assert len(sampler) == int(1e10)
    runtime.manual_seed(3)
    first = list(itertools.islice(iter(sampler), 100))
    runtime.manual_seed(3)
    again = list(itertools.islice(iter(sampler), 100))
    assert first == again and set(first) <= set(data) and len(set(first)) > 3
    small = runtime.utils.data.RandomSampler(data, replacement=True, num_samples=45)
    drawn = list(small)
    assert len(drawn) == 45 and set(drawn) <= set(data)


@needs_torch
def test_size_arithmetic_and_slices_stay_sizes_as_torchs():
    ours, theirs = runtime.zeros(2, 3, 4).shape, torch.zeros(2, 3, 4).shape
    for op in (lambda s: s + (5,), lambda s: (5,) + s, lambda s: s + s, lambda s: s * 2, lambda s: s[1:],
               lambda s: s[::2]):
        got, want = op(ours), op(theirs)
        assert isinstance(got, runtime.Size) == isinstance(want, torch.Size) and tuple(got) == tuple(want)
    assert ours[1:].numel() == theirs[1:].numel() == 12 and ours[0] == 2 and ours[-1] == 4
    assert runtime.zeros(2, 3).ndimension() == 2
