"""CUDA tensors: factories, moves between devices, device errors, printing, modules and state dicts on the device."""
from __future__ import annotations

import copy

import numpy as np
import pytest

import runtime
from runtime import nn
from runtime.cuda.templates import NoLowering

MIXED = "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"


def test_cuda_queries():
    assert runtime.cuda.is_available() and runtime.cuda.device_count() >= 1
    assert runtime.cuda.current_device() == 0
    runtime.cuda.synchronize()
    assert isinstance(runtime.cuda.get_device_name(), str)
    assert runtime.accelerator.is_available() and runtime.accelerator.current_accelerator() == "cuda:0"
    runtime.accelerator.synchronize()


def test_grad_scaler_on_cuda_unscales_and_skips_infinite_steps():
    p = runtime.nn.Parameter(runtime.ones(3, device="cuda", dtype=runtime.float64))
    opt = runtime.optim.SGD([p], lr=0.5)
    scaler = runtime.amp.GradScaler("cuda", init_scale=4.0)
    assert scaler.is_enabled()
    scaler.scale((p * 2).sum()).backward()
    scaler.step(opt)
    scaler.update()
    assert np.allclose(p.detach().cpu().numpy(), 0.0)  # the gradient 2 unscaled, then one step of lr 0.5
    opt.zero_grad()
    scaler.scale((p * float("inf")).sum()).backward()
    scaler.step(opt)
    scaler.update()
    assert np.allclose(p.detach().cpu().numpy(), 0.0) and scaler.get_scale() == 2.0


@pytest.mark.parametrize("spec", ["cuda", "cuda:0", runtime.device("cuda"), runtime.device("cuda", 0), 0])
def test_factories_place_tensors_on_the_device(spec):
    for t in (runtime.zeros(2, 3, device=spec), runtime.ones(2, device=spec), runtime.full((2,), 7.0, device=spec),
              runtime.tensor([[1, 2], [3, 4]], device=spec), runtime.arange(5, device=spec),
              runtime.randn(3, device=spec), runtime.rand(2, 2, device=spec), runtime.eye(3, device=spec),
              runtime.randint(0, 4, (5,), device=spec), runtime.linspace(0, 1, 4, device=spec)):
        assert t.device == runtime.device("cuda:0") and t.is_cuda and t.get_device() == 0
        assert str(t.device) == "cuda:0"
    assert runtime.zeros(2, 3, device=spec).cpu().tolist() == [[0.0] * 3] * 2
    assert runtime.full((2,), 7, device=spec).dtype is runtime.int64
    assert runtime.tensor([[1, 2], [3, 4]], device=spec).cpu().tolist() == [[1, 2], [3, 4]]
    assert runtime.arange(5, device=spec).tolist() == [0, 1, 2, 3, 4]
    assert np.array_equal(runtime.eye(3, device=spec).cpu().numpy(), np.eye(3, dtype=np.float32))


def test_like_factories_follow_the_input_device():
    x = runtime.ones(2, 3, device="cuda", dtype=runtime.float64)
    for t in (runtime.zeros_like(x), runtime.ones_like(x), runtime.full_like(x, 2.0), runtime.randn_like(x),
              x.new_zeros(4), x.new_ones(2, 2), x.new_full((3,), 1.5), x.new_tensor([1.0, 2.0])):
        assert t.is_cuda and t.dtype is runtime.float64
    assert runtime.zeros_like(x, device="cpu").device == runtime.device("cpu")
    made = runtime.ops.apply("arange", like=x, start=1, end=7, step=2, dtype=runtime.int64)  # ops without inputs
    assert made.is_cuda and made.tolist() == [1, 3, 5]


def test_round_trips_keep_values_dtype_and_shape():
    for dtype in (runtime.float32, runtime.float64, runtime.int64, runtime.int32, runtime.bool):
        x = runtime.tensor(np.arange(12).reshape(3, 4) % 3, dtype=dtype)
        for y in (x.cuda(), x.to("cuda"), x.to(device="cuda"), x.to("cuda:0"), x.to(runtime.device("cuda"))):
            assert y.is_cuda and y.dtype is dtype and y.shape == x.shape
            back = y.cpu()
            assert not back.is_cuda and back.dtype is dtype
            assert np.array_equal(back.numpy(), x.numpy())
    x = runtime.randn(3, 4)
    y = x.to("cuda", runtime.float64)
    assert y.is_cuda and y.dtype is runtime.float64
    assert np.allclose(y.cpu().numpy(), x.numpy().astype(np.float64))
    other = runtime.zeros(1, device="cuda", dtype=runtime.int32)
    z = x.to(other)  # a tensor argument gives both its dtype and its device
    assert z.is_cuda and z.dtype is runtime.int32
    assert x.cuda().cuda().is_cuda and x.cpu() is x


def test_strided_views_copy_to_host_in_order():
    x = runtime.arange(24, dtype=runtime.float64).reshape(2, 3, 4)
    y = x.cuda()
    for cpu, dev in ((x.permute(2, 0, 1), y.permute(2, 0, 1)), (x[:, 1:, ::2], y[:, 1:, ::2]),
                     (x[1], y[1]), (x.unsqueeze(1).expand(2, 5, 3, 4), y.unsqueeze(1).expand(2, 5, 3, 4))):
        assert dev.shape == cpu.shape
        assert np.array_equal(dev.cpu().numpy(), cpu.numpy())
        assert dev.stride() == cpu.stride() and dev.is_contiguous() == cpu.is_contiguous()


def test_moves_are_differentiable():
    x = runtime.randn(3, 4, dtype=runtime.float64, requires_grad=True)
    y = x.cuda()
    assert y.grad_fn is not None and y.grad_fn.name() == "ToCopyBackward0"
    (y * y).sum().backward()
    assert not x.grad.is_cuda
    assert np.allclose(x.grad.numpy(), 2 * x.detach().numpy(), rtol=0, atol=1e-12)
    leaf = runtime.randn(3, dtype=runtime.float64, device="cuda", requires_grad=True)
    (leaf.cpu() * 3).sum().backward()
    assert leaf.grad.is_cuda and np.allclose(leaf.grad.cpu().numpy(), 3.0)


def test_mixing_devices_raises_torchs_error():
    a, b = runtime.ones(3, device="cuda"), runtime.ones(3)
    for fn in (lambda: a + b, lambda: b * a, lambda: a @ runtime.ones(3, 3), lambda: runtime.where(b > 0, a, a),
               lambda: runtime.cat([a, b])):
        with pytest.raises(RuntimeError) as info:
            fn()
        assert str(info.value) == MIXED
    for fn in (lambda: b.add_(a), lambda: a.mul_(b)):
        with pytest.raises(RuntimeError) as info:
            fn()
        assert str(info.value) == MIXED
    # a 0-d CPU tensor is a scalar to a CUDA op, as in torch
    assert np.allclose((a * runtime.tensor(2.0)).cpu().numpy(), 2.0)


def test_numpy_refuses_cuda_tensors_with_torchs_error():
    x = runtime.ones(2, device="cuda")
    message = ("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host "
               "memory first.")
    with pytest.raises(TypeError) as info:
        x.numpy()
    assert str(info.value) == message
    with pytest.raises(TypeError):
        np.asarray(x)
    assert x.cpu().numpy().tolist() == [1.0, 1.0]
    assert x.sum().item() == 2.0 and float(x[0]) == 1.0 and x.tolist() == [1.0, 1.0] and bool(x[1])


def test_printing_shows_the_device():
    x = runtime.tensor([1.0, 2.0], device="cuda")
    assert repr(x) == "tensor([1., 2.], device='cuda:0')"
    assert repr(runtime.tensor([1, 2], dtype=runtime.int32, device="cuda")) == \
        "tensor([1, 2], device='cuda:0', dtype=runtime.int32)"
    x.requires_grad_()
    assert repr(x) == "tensor([1., 2.], device='cuda:0', requires_grad=True)"
    assert repr(x * 2) == "tensor([2., 4.], device='cuda:0', grad_fn=<MulBackward0>)"


def test_an_op_without_a_cuda_lowering_names_itself():
    x = runtime.randn(4, 4, device="cuda")
    with pytest.raises(NotImplementedError, match="'inv'"):
        runtime.linalg.inv(x)
    with pytest.raises(NotImplementedError, match="getitem"):
        x[runtime.tensor([0, 2], device="cuda"), runtime.tensor([1, 1], device="cuda")]
    with pytest.raises(NotImplementedError, match="getitem"):
        x[x > 0]  # a boolean mask
    with pytest.raises(NotImplementedError, match="sort"):
        x.sort()
    assert issubclass(NoLowering, NotImplementedError)
    half = runtime.ones(3, dtype=runtime.float16).cuda()  # float16 tensors move and view, but compute nothing yet
    assert half.T.is_cuda and half.cpu().dtype is runtime.float16
    with pytest.raises(NotImplementedError, match="'add'.*float16"):
        half + half


def test_in_place_writes_on_the_device():
    x = runtime.zeros(3, 4, device="cuda", dtype=runtime.float64)
    x[1] = 5.0
    x[:, 2] = runtime.arange(3, dtype=runtime.float64, device="cuda")
    x[0, :2] = runtime.tensor([7.0, 8.0])  # a CPU value is copied over, as torch's copy_ does
    x.add_(1).mul_(2)
    x.clamp_(max=15.0)
    expected = np.zeros((3, 4))
    expected[1] = 5.0
    expected[:, 2] = np.arange(3)
    expected[0, :2] = [7.0, 8.0]
    expected = np.minimum((expected + 1) * 2, 15.0)
    assert np.array_equal(x.cpu().numpy(), expected)
    y = runtime.empty(3, 4, device="cuda", dtype=runtime.float64).copy_(runtime.tensor(expected))
    assert np.array_equal(y.cpu().numpy(), expected)
    y.zero_()
    assert not y.cpu().numpy().any()
    with pytest.raises(RuntimeError, match="single memory location"):
        runtime.ones(3, device="cuda").expand(2, 3).add_(1)
    grid = runtime.arange(12, dtype=runtime.float64).reshape(3, 4)
    on_device = grid.cuda()
    for fn in (lambda t: t[1:].copy_(t[:-1]), lambda t: t.__setitem__(slice(1, None), t[:-1])):
        for t in (grid.clone(), on_device.clone()):  # the CPU's error for a source overlapping its destination
            with pytest.raises(RuntimeError, match="single memory location"):
                fn(t)
    grid[:, 1:].add_(grid[:, :-1])  # strided memory is not checked (as torch's): both compute out of place
    on_device[:, 1:].add_(on_device[:, :-1])
    grid[:, 1:] = grid[:, :1]  # a broadcast source in the destination's memory
    on_device[:, 1:] = on_device[:, :1]
    assert np.array_equal(on_device.cpu().numpy(), grid.numpy())


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.norm = nn.BatchNorm1d(2)

    def forward(self, x):
        return self.norm(self.fc(x))


def test_module_to_moves_parameters_buffers_and_grads():
    m = Net()
    weight = m.fc.weight
    m.fc(runtime.randn(4, 3)).sum().backward()
    assert m.to("cuda") is m and m.fc.weight is weight  # the same Parameter objects, their data moved
    for name, t in list(m.named_parameters()) + list(m.named_buffers()):
        assert t.is_cuda, name
    assert m.fc.weight.grad.is_cuda
    out = m(runtime.randn(5, 3, device="cuda"))
    assert out.is_cuda and out.shape == (5, 2)
    assert m.norm.num_batches_tracked.is_cuda and m.norm.num_batches_tracked.item() == 1
    m.cpu()
    assert not any(t.is_cuda for t in m.parameters()) and not m.norm.running_mean.is_cuda
    m.cuda()
    assert m.fc.bias.is_cuda
    m.to(runtime.float64)
    assert m.fc.weight.dtype is runtime.float64 and m.fc.weight.is_cuda


def test_state_dict_of_a_cuda_module_round_trips():
    cpu = Net()
    dev = copy.deepcopy(cpu).cuda()
    state = dev.state_dict()
    assert list(state) == list(cpu.state_dict())
    for key, value in state.items():
        assert value.is_cuda, key
        assert np.array_equal(value.cpu().numpy(), cpu.state_dict()[key].numpy())
    fresh = Net().cuda()
    fresh.load_state_dict(cpu.state_dict())  # CPU values copied into CUDA parameters
    assert fresh.fc.weight.is_cuda
    assert np.array_equal(fresh.fc.weight.detach().cpu().numpy(), cpu.fc.weight.detach().numpy())
    back = Net()
    back.load_state_dict(state)
    assert not back.fc.weight.is_cuda
    assert np.array_equal(back.fc.bias.detach().numpy(), cpu.fc.bias.detach().numpy())
    clone = copy.deepcopy(dev)
    assert clone.fc.weight.is_cuda and clone.fc.weight is not dev.fc.weight


def test_optimizer_state_lives_on_the_parameter_device():
    m = Net().cuda()
    opt = runtime.optim.AdamW(m.parameters(), lr=0.1)
    m(runtime.randn(4, 3, device="cuda")).sum().backward()
    opt.step()
    state = opt.state[m.fc.weight]
    assert state["exp_avg"].is_cuda and state["exp_avg_sq"].is_cuda
    sgd = runtime.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    sgd.step()
    assert sgd.state[m.fc.weight]["momentum_buffer"].is_cuda
    opt.zero_grad(set_to_none=False)
    assert m.fc.weight.grad.is_cuda and not m.fc.weight.grad.cpu().numpy().any()


@pytest.mark.parametrize("name", ["RMSprop", "Adagrad", "NAdam", "Adadelta", "LBFGS"])
def test_other_optimizers_refuse_cuda_parameters_by_name(name):
    p = nn.Parameter(runtime.ones(3, device="cuda"))
    opt = getattr(runtime.optim, name)([p])
    (p * p).sum().backward()
    with pytest.raises(NotImplementedError, match=name):
        opt.step((lambda: (p * p).sum()) if name == "LBFGS" else None)


def test_save_and_load_a_cuda_state_dict(tmp_path):
    m = Net().cuda()
    runtime.save(m.state_dict(), tmp_path / "m.pt")
    loaded = runtime.load(tmp_path / "m.pt")
    assert not loaded["fc.weight"].is_cuda
    assert np.array_equal(loaded["fc.weight"].numpy(), m.fc.weight.detach().cpu().numpy())
    fresh = Net().cuda()
    fresh.load_state_dict(loaded)
    assert np.array_equal(fresh.fc.bias.detach().cpu().numpy(), m.fc.bias.detach().cpu().numpy())
    with pytest.raises(RuntimeError, match="different device"):
        m.fc.weight.grad = runtime.zeros(2, 3)


def test_dropout_draws_its_mask_on_the_device():
    x = runtime.ones(200, device="cuda", dtype=runtime.float64)
    out = runtime.nn.functional.dropout(x, 0.25)
    values = out.cpu().numpy()
    assert out.is_cuda and set(np.unique(values)) <= {0.0, 1.0 / 0.75} and 0 < (values == 0).sum() < 200
