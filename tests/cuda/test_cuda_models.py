"""The examples' models (a transformer block, the CNN, a GPT) run eagerly on CUDA: forward and parameter gradients
equal the CPU's (float64), at small sizes for the simulator."""
from __future__ import annotations

import copy

import numpy as np
import pytest

import runtime
from runtime import nn


def _block():
    import models

    return models.TransformerBlock(embed_dim=8, num_heads=2, mlp_ratio=2), runtime.randn(2, 3, 8)


def _cnn():
    import models

    model = models.CNN(num_classes=3)
    model.fc = nn.Linear(16 * 2 * 2, 3)  # 8x8 images: two 2x2 poolings leave 2x2
    return model, runtime.randn(2, 1, 8, 8)


def _gpt():
    import real_models

    config = real_models.GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=8)
    return real_models.gpt(config), runtime.randint(0, 11, (2, 5))


@pytest.mark.parametrize("make", [_block, _cnn, _gpt], ids=["transformer_block", "cnn", "gpt"])
def test_example_model_on_cuda_equals_cpu(make):
    runtime.manual_seed(0)
    cpu, x = make()
    cpu = cpu.double()
    if x.is_floating_point():
        x = x.double()
    dev = copy.deepcopy(cpu).cuda()
    want, got = cpu(x), dev(x.cuda())
    if isinstance(want, tuple):  # the GPT returns (logits, loss)
        want, got = want[0], got[0]
    assert got.is_cuda and got.shape == want.shape
    np.testing.assert_allclose(got.detach().cpu().numpy(), want.detach().numpy(), rtol=1e-10, atol=1e-12)
    weight = runtime.randn(*want.shape, dtype=runtime.float64)
    (want * weight).sum().backward()
    (got * weight.cuda()).sum().backward()
    for (name, a), b in zip(cpu.named_parameters(), dev.parameters()):
        if a.grad is None:
            assert b.grad is None, name
            continue
        assert b.grad.is_cuda, name
        np.testing.assert_allclose(b.grad.cpu().numpy(), a.grad.numpy(), rtol=1e-9, atol=1e-11, err_msg=name)
