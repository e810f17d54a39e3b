"""The compiled module's fast path for guard hits: it serves repeated calls, and every change the full guards catch
still reaches them (shape, dtype, requires_grad, grad mode, training, hooks) with eager's results."""
from __future__ import annotations

import copy
import inspect
import sys

import numpy as np
import pytest

import nnc
import runtime
from runtime import nn
from runtime.nn.modules import module as module_mod

compile_mod = sys.modules["nnc.compile"]  # the module (nnc.compile is the function)


@pytest.fixture
def full_guard_calls(monkeypatch):
    """A list that gets an entry whenever a call builds the full guard key (the slow path)."""
    calls = []
    original = compile_mod.CompiledModule._guard_key

    def counting(self, arguments):
        calls.append(1)
        return original(self, arguments)

    monkeypatch.setattr(compile_mod.CompiledModule, "_guard_key", counting)
    return calls


def warmed(model, *args):
    """The model compiled and called three times: compile, a full-guard hit, then the fast path."""
    compiled = nnc.compile(model)
    for _ in range(3):
        compiled(*args)
    return compiled


def slow_path_taken(calls, call) -> bool:
    before = len(calls)
    call()
    return len(calls) > before


def mlp():
    runtime.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


@pytest.mark.parametrize("grad", [False, True])
def test_a_repeated_call_takes_the_fast_path_and_matches_eager(full_guard_calls, grad):
    model, x = mlp(), runtime.randn(4, 6)
    with runtime.set_grad_enabled(grad):
        compiled = warmed(model, x)
        assert not slow_path_taken(full_guard_calls, lambda: compiled(x))
        out = compiled(x)
        np.testing.assert_allclose(out.detach().numpy(), model(x).detach().numpy(), rtol=1e-6, atol=1e-6)
        assert out.requires_grad == grad


@pytest.mark.parametrize("change", ["shape", "dtype", "input requires_grad", "grad mode", "training",
                                    "one flag set directly", "parameter requires_grad", "submodule replaced",
                                    "submodule replaced through the compiled module", "bias set to None",
                                    "submodule deleted and put back", "parameter replaced"])
def test_every_guarded_change_misses_the_fast_path(full_guard_calls, change):
    model, x = mlp(), runtime.randn(4, 6)
    compiled = warmed(model, x)
    if change == "shape":
        x = runtime.randn(5, 6)
    elif change == "dtype":
        model.double()
        x = x.double()
    elif change == "input requires_grad":
        x = x.detach().requires_grad_()
    elif change == "training":
        model.eval()
    elif change == "one flag set directly":  # no train()/eval(): runtime's module-state version still moves
        model[1].training = False
    elif change == "parameter requires_grad":
        model[0].weight.requires_grad_(False)
    elif change == "submodule replaced":  # the traced code changes: compiled anew, never the old graph
        model[1] = nn.Tanh()
    elif change == "submodule replaced through the compiled module":
        setattr(compiled, "1", nn.Sigmoid())  # the registries are shared: this replaces model[1]
    elif change == "bias set to None":
        model[2].bias = None
    elif change == "submodule deleted and put back":
        linear = model[2]
        del model[2]
        model.append(nn.Linear(8, 3))
        model[2].weight, model[2].bias = linear.weight, linear.bias
    elif change == "parameter replaced":  # its gradient must reach the new parameter
        model[2].weight = nn.Parameter(runtime.randn(3, 8))
    with runtime.set_grad_enabled(change != "grad mode"):
        assert slow_path_taken(full_guard_calls, lambda: compiled(x))
        out = compiled(x)
        expected = model(x)
    np.testing.assert_allclose(out.detach().numpy(), expected.detach().numpy(), rtol=1e-6, atol=1e-6)
    assert out.dtype == expected.dtype and out.requires_grad == expected.requires_grad
    if out.requires_grad:
        out.sum().backward()
        grads = [p.grad.numpy().copy() for p in model.parameters() if p.grad is not None]
        model.zero_grad()
        expected.sum().backward()
        wanted = [p.grad.numpy() for p in model.parameters() if p.grad is not None]
        assert len(grads) == len(wanted)
        for got, want in zip(grads, wanted):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


class TiedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)

    def forward(self, tokens):
        return self.head(self.emb(tokens))


def test_tying_weights_after_compiling_sends_both_gradients_to_the_shared_weight():
    runtime.manual_seed(0)
    eager = TiedLM().double()
    compiled_model = copy.deepcopy(eager)
    compiled = nnc.compile(compiled_model)
    tokens = runtime.tensor([[1, 2, 3], [3, 0, 9]])
    for _ in range(3):  # compile, full guards, fast path: all before the tie
        compiled(tokens)
    for model in (compiled_model, eager):
        model.head.weight = model.emb.weight
    for model in (compiled, eager):
        model(tokens).pow(2).sum().backward()
    np.testing.assert_allclose(compiled_model.emb.weight.grad.numpy(), eager.emb.weight.grad.numpy(), rtol=1e-12)


def test_a_hook_on_a_submodule_that_replaced_another_fires(full_guard_calls):
    model, x = mlp(), runtime.randn(4, 6)
    compiled = warmed(model, x)
    model[1] = nn.Tanh()
    seen = []
    model[1].register_forward_hook(lambda module, args, out: seen.append(type(module).__name__))
    compiled(x)
    assert seen == ["Tanh"]
    assert "module tree" in compile_mod._changed_parts(compiled._keys[0], compiled._keys[-1])


def test_a_submodule_hook_added_after_the_fast_path_fires_and_removing_it_returns_there(full_guard_calls):
    model, x = mlp(), runtime.randn(4, 6)
    compiled = warmed(model, x)
    seen = []
    handle = model[1].register_forward_hook(lambda m, args, out: seen.append(out.detach().clone()))
    assert slow_path_taken(full_guard_calls, lambda: compiled(x))
    assert len(seen) == 1
    np.testing.assert_allclose(seen[0].numpy(), model[1](model[0](x)).detach().numpy(), rtol=1e-6)
    handle.remove()
    seen.clear()
    for _ in range(2):
        compiled(x)
    assert not slow_path_taken(full_guard_calls, lambda: compiled(x)) and not seen


def test_a_global_forward_hook_is_seen_by_the_fast_path_guard(full_guard_calls):
    model, x = mlp(), runtime.randn(4, 6)
    compiled = warmed(model, x)
    seen = []
    handle = module_mod.register_module_forward_hook(lambda m, args, out: seen.append(type(m).__name__))
    try:
        assert slow_path_taken(full_guard_calls, lambda: compiled(x))
        np.testing.assert_allclose(compiled(x).detach().numpy(), model(x).detach().numpy(), rtol=1e-6)
    finally:
        handle.remove()
    assert seen  # NOTE: it fires for the compiled module itself (its submodules' calls are compiled away)
    compiled(x)
    assert not slow_path_taken(full_guard_calls, lambda: compiled(x))


def test_parameters_replaced_and_buffers_mutated_are_read_on_the_fast_path():
    runtime.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Linear(8, 3)).eval()
    x = runtime.randn(4, 6)
    with runtime.no_grad():
        compiled = warmed(model, x)
        model[0].weight = nn.Parameter(runtime.randn(8, 6))
        model[1].running_mean.add_(1.5)
        np.testing.assert_allclose(compiled(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)


def test_non_contiguous_and_read_only_inputs_on_the_fast_path_match_eager():
    model = mlp().eval()
    with runtime.no_grad():
        compiled = warmed(model, runtime.randn(4, 6))
        transposed = runtime.randn(6, 4).t()
        broadcast = runtime.randn(1, 6).expand(4, 6)
        for x in (transposed, broadcast, runtime.randn(4, 6)):
            np.testing.assert_allclose(compiled(x).numpy(), model(x).numpy(), rtol=1e-6, atol=1e-6)


class WithDefault(nn.Module):
    def __init__(self, default):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.default = default

    def forward(self, x, scale=2.0):
        return self.fc(x) * scale


def test_a_call_leaving_an_immutable_default_out_takes_the_fast_path(full_guard_calls):
    runtime.manual_seed(0)
    model, x = WithDefault(None), runtime.randn(2, 3)
    with runtime.no_grad():
        compiled = warmed(model, x)
        assert not slow_path_taken(full_guard_calls, lambda: compiled(x))
        np.testing.assert_allclose(compiled(x, 3.0).numpy(), model(x, 3.0).numpy(), rtol=1e-6)
        np.testing.assert_allclose(compiled(x, scale=0.5).numpy(), model(x, scale=0.5).numpy(), rtol=1e-6)
        np.testing.assert_allclose(compiled(x).numpy(), model(x).numpy(), rtol=1e-6)


def test_mutable_defaults_and_non_tensor_arguments_always_take_the_full_guards():
    def forward(self, x, shift=[1.0]):  # noqa: B006 (a mutable default is what this test is about)
        return self.fc(x) + shift[0]

    signature = inspect.signature(forward)
    assert compile_mod._fast_arities(signature) == frozenset({3})  # self, x and shift: all passed
    assert compile_mod._fast_arities(inspect.signature(WithDefault.forward)) == frozenset({2, 3})
    compiled = warmed(mlp(), runtime.randn(4, 6))
    assert compiled._fast_key((runtime.randn(4, 6), 1)) is None


def test_a_read_only_parameter_array_in_whole_graph_mode_is_copied_then_checked_on_every_call():
    model = mlp().eval()
    x = runtime.randn(4, 6)
    with runtime.no_grad():
        compiled = warmed(model, x)
        plan = compiled.compilations[0].forward_plan
        assert plan.whole_graph
        model[0].weight._data.flags.writeable = False
        for _ in range(2):
            np.testing.assert_allclose(compiled(x).numpy(), model(x).numpy(), rtol=1e-6, atol=1e-6)
        assert plan.steps[0].compiled._check_all


def test_a_submodule_switched_to_eval_alone_recompiles_without_its_dropout(full_guard_calls):
    runtime.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)), runtime.randn(8, 4)
    with runtime.no_grad():
        compiled = warmed(model, x)
        model[1].eval()  # the root stays in training mode
        assert slow_path_taken(full_guard_calls, lambda: compiled(x))
        np.testing.assert_allclose(compiled(x).numpy(), model(x).numpy(), rtol=1e-6, atol=1e-6)


def test_the_no_grad_fast_path_of_a_whole_graph_model_is_profiled_and_guarded():
    """The no-grad fast path goes straight to the plan's one numba call (Plan.direct_runner): nnc.profile still
    sees that call, and a parameter replaced by one of another shape is never read out of bounds: the new parameter
    compiles anew, which fails as eager fails."""
    model = mlp().eval()
    x = runtime.randn(4, 6)
    with runtime.no_grad():
        compiled = warmed(model, x)
        assert compiled.compilations[0].forward_plan.whole_graph
        with nnc.profile() as prof:
            out = compiled(x)
        np.testing.assert_allclose(out.numpy(), model(x).numpy(), rtol=1e-6, atol=1e-6)
        assert [e for e in prof.events if e.cat == "whole_graph"]
        weight = model[0].weight
        model[0].weight = nn.Parameter(runtime.randn(8, 5))
        with pytest.raises(RuntimeError, match=r"cannot be multiplied \(4x6 and 5x8\)"), \
                pytest.warns(RuntimeWarning, match="could not compile"):
            compiled(x)
        model[0].weight = weight
        np.testing.assert_allclose(compiled(x).numpy(), model(x).numpy(), rtol=1e-6, atol=1e-6)
        data = weight.data
        weight.data = runtime.randn(8, 5)  # the same parameter with other data: refused by name
        with pytest.raises(ValueError, match=r"attribute 0\.weight\) must be float32\[8, 6\], got float32\[8, 5\]"):
            compiled(x)
        weight.data = data
        np.testing.assert_allclose(compiled(x).numpy(), model(x).numpy(), rtol=1e-6, atol=1e-6)


def test_a_deep_copy_of_a_compiled_module_is_compiled_and_independent():
    model, x = mlp(), runtime.randn(4, 6)
    compiled = warmed(model, x)
    ema = copy.deepcopy(compiled)
    assert isinstance(ema, type(compiled)) and ema._module is not model
    assert all(a is not b for a, b in zip(ema.parameters(), model.parameters()))
    np.testing.assert_array_equal(ema(x).detach().numpy(), compiled(x).detach().numpy())
    with runtime.no_grad():
        for p in ema.parameters():
            p.mul_(0.5)
    halved = copy.deepcopy(model)
    with runtime.no_grad():
        for p in halved.parameters():
            p.mul_(0.5)
    np.testing.assert_allclose(ema(x).detach().numpy(), halved(x).detach().numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(compiled(x).detach().numpy(), model(x).detach().numpy(), rtol=1e-6, atol=1e-6)
    ema(x).sum().backward()
    assert all(p.grad is not None for p in ema.parameters()) and all(p.grad is None for p in model.parameters())
