"""Eager training on CUDA equals training on the CPU: an MLP stepped by SGD (with momentum) and AdamW."""
from __future__ import annotations

import copy

import numpy as np
import pytest

import runtime
import runtime.nn.functional as F
from runtime import nn


def _mlp(dtype):
    runtime.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)).to(dtype)


def _train(model, opt, x, y, steps=3):
    losses = []
    for _ in range(steps):
        out = model(x)
        loss = F.cross_entropy(out, y) + 0.1 * F.mse_loss(out.tanh(), x[:, :3])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


OPTIMIZERS = {
    "sgd": lambda params: runtime.optim.SGD(params, lr=0.1),
    "sgd_momentum": lambda params: runtime.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-2,
                                                     nesterov=True),
    "adamw": lambda params: runtime.optim.AdamW(params, lr=0.01, weight_decay=0.1),
    "adam_amsgrad": lambda params: runtime.optim.Adam(params, lr=0.01, amsgrad=True, weight_decay=1e-3),
}


F64, F32 = (runtime.float64, 1e-10), (runtime.float32, 2e-5)
CASES = [("sgd_momentum", *F64), ("adamw", *F64), ("sgd_momentum", *F32), ("adamw", *F32), ("sgd", *F64),
         ("adam_amsgrad", *F64)]


@pytest.mark.parametrize("optimizer,dtype,tol", CASES, ids=[f"{o}-{d}" for o, d, _ in CASES])
def test_mlp_training_on_cuda_equals_cpu(optimizer, dtype, tol):
    cpu = _mlp(dtype)
    dev = copy.deepcopy(cpu).to("cuda")
    rng = np.random.default_rng(1)
    x = runtime.tensor(rng.standard_normal((5, 6)), dtype=dtype)
    y = runtime.tensor(rng.integers(0, 3, 5))
    cpu_losses = _train(cpu, OPTIMIZERS[optimizer](cpu.parameters()), x, y)
    dev_losses = _train(dev, OPTIMIZERS[optimizer](dev.parameters()), x.cuda(), y.cuda())
    np.testing.assert_allclose(dev_losses, cpu_losses, rtol=tol, atol=tol)
    assert cpu_losses[-1] != cpu_losses[0]  # the steps changed the parameters
    for (name, a), b in zip(cpu.named_parameters(), dev.parameters()):
        assert b.is_cuda and b.grad.is_cuda
        np.testing.assert_allclose(b.detach().cpu().numpy(), a.detach().numpy(), rtol=tol, atol=tol, err_msg=name)


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(3 * 3 * 3, 4)

    def forward(self, x):
        return self.fc(self.pool(self.conv(x).relu()).flatten(1))


def test_cnn_training_on_cuda_equals_cpu():
    runtime.manual_seed(0)
    cpu = SmallCNN().double()
    dev = copy.deepcopy(cpu).cuda()
    rng = np.random.default_rng(2)
    x = runtime.tensor(rng.standard_normal((3, 1, 6, 6)))
    y = runtime.tensor(rng.integers(0, 4, 3))
    losses = []
    for model, xx, yy in ((cpu, x, y), (dev, x.cuda(), y.cuda())):
        opt = runtime.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        run = []
        for _ in range(2):
            loss = F.cross_entropy(model(xx), yy)
            opt.zero_grad()
            loss.backward()
            opt.step()
            run.append(loss.item())
        losses.append(run)
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-10, atol=1e-10)
    for a, b in zip(cpu.parameters(), dev.parameters()):
        np.testing.assert_allclose(b.detach().cpu().numpy(), a.detach().numpy(), rtol=1e-10, atol=1e-10)
