"""A compiled module reads the model's plain attributes (a tensor, None, a number) as eager does: a variant that froze
one is dropped when it changes, setting an attribute on the compiled module reaches the model, and attributes the
forward never reads do not recompile anything."""
import warnings

import numpy as np
import pytest

import runtime as torch
import nnc
from runtime import nn


class Shifted(nn.Module):
    """lin(x) plus a tensor attribute, or nothing while it is None; times a plain float."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.shift = None
        self.scale = 1.0

    def forward(self, x):
        y = self.lin(x) * self.scale
        return y if self.shift is None else y + self.shift


def _forward_and_grads(module, model, x):
    """module(x)'s output and the gradients of its sum with respect to the model's parameters."""
    for p in model.parameters():
        p.grad = None
    out = module(x)
    out.sum().backward()
    return out.detach().numpy().copy(), [p.grad.numpy().copy() for p in model.parameters()]


def _assert_matches_eager(model, compiled, x):
    eager_out, eager_grads = _forward_and_grads(model, model, x)
    out, grads = _forward_and_grads(compiled, model, x)
    np.testing.assert_allclose(out, eager_out, rtol=1e-5, atol=1e-6)
    for g, e in zip(grads, eager_grads):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


def test_reassigned_tensor_attribute_recompiles():
    torch.manual_seed(0)
    model, x = Shifted(), torch.randn(2, 4, requires_grad=True)
    compiled = nnc.compile(model)
    for value in (0.0, 100.0, -3.0):
        model.shift = torch.full((2, 3), value, requires_grad=True)
        _assert_matches_eager(model, compiled, x)
    assert compiled.compiled_variants == 1  # the stale variants were dropped, not kept


def test_attribute_from_none_to_tensor_and_plain_float_change():
    torch.manual_seed(1)
    model, x = Shifted(), torch.randn(2, 4)
    compiled = nnc.compile(model)
    _assert_matches_eager(model, compiled, x)
    model.shift = torch.ones(2, 3)
    _assert_matches_eager(model, compiled, x)
    model.scale = 2.5
    _assert_matches_eager(model, compiled, x)
    model.shift = None
    _assert_matches_eager(model, compiled, x)


def test_builtin_layer_attribute_change_recompiles():
    """A layer's own setting (read while decompose replays the layer) counts too."""
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(4, 4), nn.LeakyReLU(0.01))
    compiled = nnc.compile(model)
    x = torch.randn(3, 4)
    _assert_matches_eager(model, compiled, x)
    model[1].negative_slope = 0.5
    _assert_matches_eager(model, compiled, x)


def test_setting_an_attribute_on_the_compiled_module_reaches_the_model():
    torch.manual_seed(3)
    model, x = Shifted(), torch.randn(2, 4)
    compiled = nnc.compile(model)
    compiled(x)
    shift = torch.full((2, 3), 7.0)
    compiled.shift = shift
    assert model.shift is shift
    _assert_matches_eager(model, compiled, x)
    del compiled.shift
    assert not hasattr(model, "shift")
    compiled.recompile_limit = 5  # the wrapper's own option stays on the wrapper
    assert compiled.recompile_limit == 5 and "recompile_limit" not in model.__dict__


class SetsChildAttribute(nn.Module):
    """A forward that sets a child's attribute runs eagerly, its child compiled on its own."""

    def __init__(self):
        super().__init__()
        self.child = Shifted()

    def forward(self, x, value):
        self.child.shift = torch.full((x.size(0), 3), value)
        return self.child(x)


def test_parent_running_eagerly_sets_its_compiled_childs_attribute():
    torch.manual_seed(4)
    model, x = SetsChildAttribute(), torch.randn(2, 4)
    compiled = nnc.compile(model)
    for value in (1.0, 100.0):
        eager = model(x, value).detach().numpy().copy()
        model.child.shift = None
        got = compiled(x, value).detach().numpy()
        np.testing.assert_allclose(got, eager, rtol=1e-5, atol=1e-6)
        assert model.child.shift is not None and float(model.child.shift[0, 0]) == value


def test_attribute_changing_every_call_reaches_the_limit_and_runs_eagerly():
    torch.manual_seed(5)
    model, x = Shifted(), torch.randn(2, 4)
    compiled = nnc.compile(model, recompile_limit=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(5):
            model.shift = torch.full((2, 3), float(step))
            _assert_matches_eager(model, compiled, x)
    limit = [w for w in caught if "recompile limit" in str(w.message)]
    assert len(limit) == 1 and "attribute shift" in str(limit[0].message)


def test_unread_or_unchanged_attributes_keep_the_variant():
    torch.manual_seed(6)
    model, x = Shifted(), torch.randn(2, 4)
    model.shift = torch.ones(2, 3)
    compiled = nnc.compile(model)
    _assert_matches_eager(model, compiled, x)
    model.last_output = torch.zeros(1)  # set outside forward, never read by it (a hook's habit)
    model.shift = model.shift  # the same tensor again
    model.scale = 1.0  # an equal value
    with torch.no_grad():
        model.shift.mul_(3.0)  # an in-place change is read through the same tensor
    _assert_matches_eager(model, compiled, x)
    assert compiled.compiled_variants == 1 and compiled._evicted == 0


@pytest.mark.parametrize("whole_graph", [True, False])
def test_no_grad_fast_path_sees_the_change(whole_graph):
    """Calls served by the fast path (all-tensor arguments) check the attributes too."""
    torch.manual_seed(7)
    model, x = Shifted(), torch.randn(1, 4)
    compiled = nnc.compile(model, whole_graph=whole_graph)
    with torch.no_grad():
        for value in (0.0, 5.0, 5.0, -1.0):
            model.shift = torch.full((1, 3), value)
            for _ in range(2):
                np.testing.assert_allclose(compiled(x).numpy(), model(x).numpy(), rtol=1e-6, atol=1e-6)


OFFSET = torch.zeros(3)


class UsesGlobal(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return self.lin(x) + OFFSET


def test_reassigned_global_tensor_recompiles():
    """A global tensor the graph froze is checked on every call (reassigning it moves no module-state version)."""
    global OFFSET
    torch.manual_seed(8)
    model, x = UsesGlobal(), torch.randn(2, 4)
    compiled = nnc.compile(model)
    try:
        for value in (0.0, 0.0, 50.0):
            OFFSET = torch.full((3,), value)
            _assert_matches_eager(model, compiled, x)
            with torch.no_grad():  # the fast path
                np.testing.assert_allclose(compiled(x).numpy(), model(x).numpy(), rtol=1e-6, atol=1e-6)
        # two variants (with and without gradients), each dropped at both reassignments after the first
        assert compiled.compiled_variants == 2 and compiled._evicted == 4
    finally:
        OFFSET = torch.zeros(3)
