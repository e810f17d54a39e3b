"""runtime.jit: the torch.jit API model code and scripts use while running eagerly (is_scripting, Final, ignore,
script, trace, fork), a timm-style block that uses it trained compiled as eager, and archives refused by name."""
from __future__ import annotations

import copy
import io
import warnings
from typing import Dict, List, Optional, Tuple

import numpy as np
import pytest

import nnc
import runtime
from helpers import needs_torch, torch


def make_block(lib):
    """A vision-transformer block in timm's style: a Final flag read in forward, an is_scripting branch, a method
    kept out of scripting, and a scripted activation function."""
    nn, F = lib.nn, lib.nn.functional

    @lib.jit.script
    def gelu_tanh(x):
        return 0.5 * x * (1.0 + lib.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))

    class Attention(nn.Module):
        fused_attn: lib.jit.Final[bool]

        def __init__(self, dim=16, heads=2):
            super().__init__()
            self.heads, self.fused_attn = heads, True
            self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

        @lib.jit.ignore
        def no_weight_decay(self):
            return {"proj.bias"}

        def forward(self, x):
            b, n, c = x.shape
            q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
            if self.fused_attn and not lib.jit.is_scripting():
                y = F.scaled_dot_product_attention(q, k, v)
            else:
                y = (q @ k.transpose(-2, -1) * (c // self.heads) ** -0.5).softmax(-1) @ v
            return self.proj(y.transpose(1, 2).reshape(b, n, c))

    class Block(nn.Module):
        def __init__(self, dim=16):
            super().__init__()
            self.norm1, self.attn = nn.LayerNorm(dim), Attention(dim)
            self.norm2, self.fc1, self.fc2 = nn.LayerNorm(dim), nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)

        def forward(self, x):
            x = x + self.attn(self.norm1(x))
            return x + self.fc2(gelu_tanh(self.fc1(self.norm2(x))))

    return Block()


@needs_torch
def test_a_timm_style_block_runs_scripted_and_traced_as_torch():
    ours, theirs = make_block(runtime).double(), make_block(torch).double()
    theirs.load_state_dict({k: torch.tensor(v.numpy()) for k, v in ours.state_dict().items()})
    x = np.random.default_rng(0).standard_normal((2, 5, 16))
    want = theirs(torch.tensor(x)).detach().numpy()
    np.testing.assert_allclose(ours(runtime.tensor(x)).detach().numpy(), want, rtol=1e-10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own deprecation of scripting and its tracer's warnings
        traced = runtime.jit.trace(ours, runtime.tensor(x))
        scripted = runtime.jit.script(ours)
    np.testing.assert_allclose(traced(runtime.tensor(x)).detach().numpy(), want, rtol=1e-10)
    np.testing.assert_allclose(scripted(runtime.tensor(x)).detach().numpy(), want, rtol=1e-10)


def test_a_block_using_the_jit_api_trains_compiled_as_eager():
    runtime.manual_seed(0)
    block = make_block(runtime).double()
    x = runtime.randn(2, 5, 16, dtype=runtime.float64)
    eager = block(x).square().mean()
    want = runtime.autograd.grad(eager, list(block.parameters()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled = nnc.compile(copy.deepcopy(block))
        got_loss = compiled(x).square().mean()
    got = runtime.autograd.grad(got_loss, list(compiled.parameters()))
    (artifact,) = compiled._cache.values()
    assert artifact.graph_breaks == [] and artifact.backward_plan is not None
    np.testing.assert_allclose(got_loss.item(), eager.item(), rtol=1e-12)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-9, atol=1e-12)


def test_jit_helpers():
    assert runtime.jit.is_scripting() is False and runtime.jit.is_tracing() is False
    assert runtime.jit.annotate(List[int], [1]) == [1]
    assert runtime.jit.isinstance([1, 2], List[int]) and not runtime.jit.isinstance([1, "a"], List[int])
    assert runtime.jit.isinstance({"a": runtime.ones(1)}, Dict[str, runtime.Tensor])
    assert runtime.jit.isinstance((1, "a"), Tuple[int, str]) and runtime.jit.isinstance(None, Optional[int])
    assert runtime.jit.wait(runtime.jit.fork(lambda a, b: a * b, 3, b=4)) == 12
    assert not isinstance(runtime.nn.Linear(1, 1), runtime.jit.ScriptModule)

    @runtime.jit.unused
    def skipped():
        return 1

    @runtime.jit.ignore(drop=True)
    def dropped():
        return 2

    assert skipped() == 1 and dropped() == 2


def test_torchscript_archives_are_refused_naming_the_alternative():
    with pytest.raises(RuntimeError, match="runtime.save"):
        runtime.jit.save(runtime.nn.Linear(1, 1), io.BytesIO())
    with pytest.raises(RuntimeError, match="runtime.save"):
        runtime.jit.load(io.BytesIO())
