"""nnc.compile on CUDA modules runs nnc's generated CUDA kernels (nnc.cuda_executor): an MLP, a small CNN and a
transformer block give eager CPU's forward, gradients and AdamW steps; the target follows the device, a CPU module
compiled for "cuda" is a clear error, and moving a model recompiles it. Shapes are tiny for numba's simulator; the
`gpu` test runs the same on a real GPU and skips without one."""
from __future__ import annotations

import copy

import numpy as np
import pytest
from numba import cuda as numba_cuda

import nnc
import runtime
import runtime.nn.functional as F
from nnc.codegen.cuda import simulator_enabled
from nnc.cuda_executor import CudaKernelStep, CudaPlan
from runtime import nn

GPU = not simulator_enabled() and numba_cuda.is_available()
F64, F32 = (runtime.float64, 1e-9), (runtime.float32, 2e-5)


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(2 * 2 * 2, 3)

    def forward(self, x):
        return self.fc(self.pool(self.conv(x).relu()).flatten(1))


def _mlp():
    return nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.Linear(8, 3)), (5, 6), 3


def _cnn():
    return SmallCNN(), (2, 1, 4, 4), 3


def _block():
    import models

    return models.TransformerBlock(embed_dim=8, num_heads=2, mlp_ratio=2), (1, 3, 8), 8


def _train(model, x, y, steps: int) -> list[float]:
    opt = runtime.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)
    losses = []
    for _ in range(steps):
        out = model(x)
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _compare_training(make, dtype, tol, steps: int) -> nnc.CompiledModule:
    """Compiled on CUDA vs eager on the CPU: the forward, every gradient, and the losses and parameters of `steps`
    AdamW steps. Returns the compiled module."""
    runtime.manual_seed(0)
    cpu, shape, classes = make()
    cpu = cpu.to(dtype)
    dev = copy.deepcopy(cpu).to("cuda")
    compiled = nnc.compile(dev)
    rng = np.random.default_rng(0)
    x = runtime.tensor(rng.standard_normal(shape), dtype=dtype)
    weight = runtime.tensor(rng.standard_normal(cpu(x).shape), dtype=dtype)
    got = compiled(x.cuda())
    assert got.is_cuda
    want = cpu(x)
    np.testing.assert_allclose(got.detach().cpu().numpy(), want.detach().numpy(), rtol=tol, atol=tol)
    (got * weight.cuda()).sum().backward()
    (want * weight).sum().backward()
    for (name, a), b in zip(cpu.named_parameters(), dev.parameters()):
        assert b.grad.is_cuda, name
        np.testing.assert_allclose(b.grad.cpu().numpy(), a.grad.numpy(), rtol=tol, atol=tol, err_msg=name)
    if not steps:
        return compiled
    y = runtime.tensor(rng.integers(0, classes, want.reshape(-1, want.shape[-1]).shape[0]))
    cpu_losses, dev_losses = _train(cpu, x, y, steps), _train(compiled, x.cuda(), y.cuda(), steps)
    np.testing.assert_allclose(dev_losses, cpu_losses, rtol=tol, atol=tol)
    assert cpu_losses[-1] != cpu_losses[0]  # the steps changed the parameters
    for (name, a), b in zip(cpu.named_parameters(), dev.parameters()):
        np.testing.assert_allclose(b.detach().cpu().numpy(), a.detach().numpy(), rtol=tol, atol=tol, err_msg=name)
    return compiled


def _generated_steps(compiled) -> list:
    return [s for c in compiled.compilations for p in c.plans for s in p.steps if isinstance(s, CudaKernelStep)]


# NOTE: the simulator runs a CUDA thread as a Python thread (a 16x16 matmul tile is 256 of them), so the transformer
# block's training steps (about 15 s each there) are left to the gpu test below; its forward and gradients run here
CASES = [("mlp", _mlp, *F64, 2), ("mlp", _mlp, *F32, 2), ("cnn", _cnn, *F64, 2), ("transformer_block", _block, *F64, 0)]


@pytest.mark.parametrize("name,make,dtype,tol,steps", CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_compiled_on_cuda_trains_as_eager_on_the_cpu(name, make, dtype, tol, steps):
    compiled = _compare_training(make, dtype, tol, steps)
    plans = [p for c in compiled.compilations for p in c.plans]
    assert plans and all(isinstance(p, CudaPlan) for p in plans)
    kinds = {s.kernel.kind for s in _generated_steps(compiled)}
    assert "matmul" in kinds  # the products ran as generated CUDA kernels, not eager ops
    if name == "cnn":
        assert "window" in kinds


def test_target_follows_the_device_and_a_move_recompiles():
    runtime.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU()).double()
    compiled = nnc.compile(model)
    x = runtime.randn(2, 4, dtype=runtime.float64)
    with runtime.no_grad():
        want = compiled(x)
        assert not want.is_cuda and compiled.compiled_variants == 1
        model.to("cuda")
        got = compiled(x.cuda())
    assert got.is_cuda and compiled.compiled_variants == 2
    assert isinstance(compiled.compilations[-1].plans[0], CudaPlan)
    assert not isinstance(compiled.compilations[0].plans[0], CudaPlan)
    np.testing.assert_allclose(got.cpu().numpy(), want.numpy(), rtol=1e-12)


def test_a_move_after_fast_path_calls_is_seen():
    """Calls that took the fast guard path (nnc.compile's _fast_key) on the CPU; then the model moves: a CPU input
    is the wrong-device error, never the CPU variant run with device parameters, and a CUDA input runs on CUDA."""
    runtime.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU()).double()
    compiled = nnc.compile(model)
    x = runtime.randn(2, 4, dtype=runtime.float64)
    with runtime.no_grad():
        want = [compiled(x) for _ in range(3)][-1]  # the later calls are served by the fast path
        assert compiled._fast
        model.to("cuda")
        with pytest.raises(RuntimeError, match="cuda"):
            compiled(x)
        got = compiled(x.cuda())
    assert got.is_cuda
    np.testing.assert_allclose(got.cpu().numpy(), want.numpy(), rtol=1e-12)


def test_new_batch_sizes_compile_static_cuda_variants_then_run_eagerly():
    # CUDA kernels are generated for static sizes: the variant with a symbolic batch fails, static ones serve
    runtime.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU()).double()
    compiled = nnc.compile(copy.deepcopy(model).cuda())
    with runtime.no_grad():
        for batch in (2, 3, 5):
            x = runtime.randn(batch, 4, dtype=runtime.float64)
            np.testing.assert_allclose(compiled(x.cuda()).cpu().numpy(), model(x).numpy(), rtol=1e-12)
    assert compiled.compiled_variants == 2
    assert all(isinstance(p, CudaPlan) for c in compiled.compilations for p in c.plans)


def test_a_cpu_module_compiled_for_cuda_is_a_clear_error():
    model = nn.Linear(3, 2)
    with pytest.raises(ValueError, match=r"target='cuda'.*weight.*on the CPU.*model.to\('cuda'\)"):
        nnc.compile(model, target="cuda")
    compiled = nnc.compile(model.to("cuda"), target="cuda")
    with pytest.raises(RuntimeError, match=r"got tensors on the CPU.*x.cuda\(\)"):
        compiled(runtime.randn(4, 3))
    with pytest.raises(ValueError, match="unknown code generation target 'tpu'"):
        nnc.compile(model, target="tpu")


def test_hooks_and_buffer_writes_work_as_on_the_cpu():
    runtime.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2)).double()
    dev = copy.deepcopy(cpu).cuda()
    seen = {}
    for name, model in (("cpu", cpu), ("cuda", dev)):
        model[0].register_forward_hook(lambda m, args, out, name=name: seen.update({name: out.detach()}))
    x, weight = runtime.randn(5, 4, dtype=runtime.float64), runtime.randn(5, 2, dtype=runtime.float64)
    compiled = nnc.compile(dev)
    (compiled(x.cuda()) * weight.cuda()).sum().backward()
    (cpu(x) * weight).sum().backward()
    assert seen["cuda"].is_cuda
    np.testing.assert_allclose(seen["cuda"].cpu().numpy(), seen["cpu"].numpy(), rtol=1e-12)
    for name in ("running_mean", "running_var"):  # written in forward: copied back on the device
        got, want = getattr(dev[1], name), getattr(cpu[1], name)
        assert got.is_cuda
        np.testing.assert_allclose(got.cpu().numpy(), want.numpy(), rtol=1e-12, err_msg=name)
    for (name, a), b in zip(cpu.named_parameters(), dev.parameters()):
        np.testing.assert_allclose(b.grad.cpu().numpy(), a.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=name)


def test_a_kernel_that_fails_to_compile_runs_as_eager_cuda_ops(monkeypatch):
    import models
    from nnc.codegen import cuda as cuda_codegen
    from nnc.codegen.scalar import KernelCompileError

    real = cuda_codegen.compile_kernel

    def failing(kernel):
        if kernel.kind != "matmul":
            raise KernelCompileError(kernel.name, "made to fail by the test")
        return real(kernel)

    monkeypatch.setattr(cuda_codegen, "compile_kernel", failing)
    runtime.manual_seed(0)
    block = models.TransformerBlock(embed_dim=8, num_heads=2, mlp_ratio=2).double()
    x = runtime.randn(1, 3, 8, dtype=runtime.float64)
    compiled = nnc.compile(copy.deepcopy(block).cuda())
    with runtime.no_grad(), pytest.warns(RuntimeWarning, match="made to fail by the test"):
        got = compiled(x.cuda())
    steps = [s for p in compiled.compilations[0].plans for s in p.steps]
    assert any(isinstance(s, CudaKernelStep) for s in steps) and any(getattr(s, "views", None) for s in steps)
    np.testing.assert_allclose(got.cpu().numpy(), block(x).detach().numpy(), rtol=1e-12, atol=1e-12)


def test_factories_inside_the_graph_make_device_tensors():
    class Padded(nn.Module):
        def forward(self, x):
            return runtime.cat([x, runtime.zeros(x.shape[0], 2, dtype=x.dtype, device=x.device)], dim=1) * 2

    x = runtime.randn(3, 2, dtype=runtime.float64)
    got = nnc.compile(Padded())(x.cuda())
    assert got.is_cuda
    np.testing.assert_allclose(got.cpu().numpy(), Padded()(x).numpy())


def test_explain_counts_generated_kernels_and_eager_cuda_ops():
    import models

    runtime.manual_seed(0)
    block = models.TransformerBlock(embed_dim=8, num_heads=2, mlp_ratio=2).double().cuda()
    report = nnc.explain(block, runtime.randn(1, 3, 8, dtype=runtime.float64).cuda(), backward=True)
    text = str(report)
    assert report.target == "cuda" and "runs on the device" in report.forward_mode()
    generated = [k for k in report.kernels + report.backward_kernels if k.generated]
    assert generated and all(k.launch for k in generated) and "(cuda; " in text
    rows = [k for k in report.kernels + report.backward_kernels if k.kind == "row"]
    assert rows and all(k.generated and len(k.launch) > 1 for k in rows)  # softmax, LayerNorm: split into kernels
    eager = {op for k in report.kernels + report.backward_kernels if k.eager for op in k.ops}
    # the packed q/k/v projection's gradient is one cat kernel: nothing of the block runs as eager CUDA ops
    assert not eager, eager


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("make", [_mlp, _cnn, _block], ids=["mlp", "cnn", "transformer_block"])
@pytest.mark.parametrize("dtype,tol", [F64, F32], ids=["float64", "float32"])
def test_compiled_on_a_gpu_trains_as_eager_on_the_cpu(make, dtype, tol):
    _compare_training(make, dtype, tol, steps=3)
