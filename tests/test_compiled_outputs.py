"""What a compiled module returns is what eager returns: the same objects for returned inputs, parameters and
repeated values, named tuples of their own type, and the same gradients through all of them."""
from __future__ import annotations

import collections
import copy

import numpy as np
import pytest

import nnc
import runtime
from runtime import nn

Output = collections.namedtuple("Output", "logits hidden")


class Aliases(nn.Module):
    """Returns one value twice, its input, a parameter and a buffer as they are."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = nn.Parameter(runtime.randn(4))
        self.register_buffer("offset", runtime.ones(4))

    def forward(self, x):
        y = self.lin(x) * self.scale
        return y, y, x, self.scale, self.offset


class Named(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        return Output(h.relu(), {"h": h, "pair": Output(h, x)})


@pytest.mark.parametrize("grad", [False, True])
def test_returned_inputs_parameters_and_repeats_are_the_same_objects(grad):
    runtime.manual_seed(0)
    model = Aliases().double()
    compiled = nnc.compile(model)
    x = runtime.randn(3, 4, dtype=runtime.float64).requires_grad_(grad)
    with runtime.set_grad_enabled(grad):
        for _ in range(3):  # compile, full guards, fast path
            y1, y2, xo, scale, offset = compiled(x)
            assert y1 is y2 and xo is x and scale is model.scale and offset is model.offset


def test_gradients_through_returned_aliases_match_eager():
    runtime.manual_seed(0)
    eager = Aliases().double()
    compiled_model = copy.deepcopy(eager)
    compiled = nnc.compile(compiled_model)
    results = []
    for model, owner in ((compiled, compiled_model), (eager, eager)):
        x = runtime.linspace(-1, 1, 12, dtype=runtime.float64).reshape(3, 4).requires_grad_()
        y1, y2, xo, scale, _ = model(x)
        (y1.sum() + 2 * y2.pow(2).sum() + 3 * xo.sum() + scale.pow(3).sum()).backward()
        results.append([x.grad.numpy().copy()] + [p.grad.numpy().copy() for p in owner.parameters()])
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize("grad", [False, True])
def test_named_tuple_outputs_keep_their_type(grad):
    runtime.manual_seed(0)
    eager = Named().double()
    compiled_model = copy.deepcopy(eager)
    compiled = nnc.compile(compiled_model)
    x = runtime.randn(2, 4, dtype=runtime.float64)
    with runtime.set_grad_enabled(grad):
        got, want = compiled(x), eager(x)
    assert type(got) is Output and type(got.hidden["pair"]) is Output
    np.testing.assert_allclose(got.logits.detach().numpy(), want.logits.detach().numpy(), rtol=1e-12)
    assert got.hidden["pair"].hidden is x
    if grad:
        got.hidden["h"].pow(2).sum().backward()
        want.hidden["h"].pow(2).sum().backward()
        for a, b in zip(compiled_model.parameters(), eager.parameters()):
            np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-12)
