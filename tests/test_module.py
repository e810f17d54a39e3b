"""nn.Module semantics: registration, traversal, containers, modes, movement, hooks, state_dict, repr."""
from __future__ import annotations

import copy

import numpy as np
import pytest

import runtime
from runtime import nn
from runtime.nn.modules import module as module_mod


class Affine(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(runtime.randn(n_in, n_out, dtype=runtime.float64))
        self.bias = nn.Parameter(runtime.zeros(n_out, dtype=runtime.float64))

    def forward(self, x):
        return x @ self.weight + self.bias


class WithBuffers(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("mean", runtime.zeros(3))
        self.register_buffer("scratch", runtime.ones(2), persistent=False)
        self.register_buffer("slot", None)
        self.inner = Affine(3, 2)

    def forward(self, x):
        return self.inner(x - self.mean.double())


def test_assignment_registers_parameters_buffers_and_modules():
    m = WithBuffers()
    assert [n for n, _ in m.named_parameters()] == ["inner.weight", "inner.bias"]
    assert [n for n, _ in m.named_buffers()] == ["mean", "scratch"]
    assert [n for n, _ in m.named_children()] == ["inner"]
    assert "slot" in m._buffers and m.slot is None
    assert {"mean", "scratch", "inner", "slot"} <= set(dir(m))


def test_plain_tensor_into_parameter_slot_is_a_type_error():
    m = Affine(2, 2)
    with pytest.raises(TypeError, match="cannot assign"):
        m.weight = runtime.zeros(2, 2)
    m.weight = None
    assert m.weight is None and "weight" in m._parameters


def test_assignment_before_init_is_a_clear_error():
    class Early(nn.Module):
        def __init__(self):
            self.w = nn.Parameter(runtime.zeros(1))
            super().__init__()

    with pytest.raises(AttributeError, match="before Module.__init__"):
        Early()


def test_reassigning_an_attribute_changes_its_kind_and_delattr_unregisters():
    m = Affine(2, 2)
    m.extra = 3
    m.extra = nn.Module()
    assert "extra" not in m.__dict__ and "extra" in m._modules
    with pytest.raises(TypeError, match="as parameter 'bias'"):
        m.bias = nn.Module()  # torch refuses a module in a parameter slot too
    del m.extra
    assert "extra" not in m._modules
    with pytest.raises(AttributeError):
        m.extra


def test_register_errors():
    m = Affine(2, 2)
    with pytest.raises(KeyError, match="already exists"):
        m.register_buffer("weight", runtime.zeros(1))
    with pytest.raises(KeyError, match='contain "."'):
        m.register_parameter("a.b", None)
    with pytest.raises(TypeError):
        m.register_buffer("x", 3)
    with pytest.raises(TypeError):
        m.add_module("child", 3)
    with pytest.raises(ValueError, match="non-leaf"):
        m.register_parameter("derived", nn.Parameter(runtime.ones(2)) * 2 if False else _non_leaf_parameter())


def _non_leaf_parameter():
    p = nn.Parameter(runtime.ones(2))
    q = p * 2
    q.__class__ = nn.Parameter
    return q


def test_shared_modules_and_parameters_are_yielded_once():
    shared = Affine(2, 2)
    root = nn.Sequential(shared, nn.Sequential(shared))
    assert len(list(root.modules())) == 3
    assert len(list(root.parameters())) == 2
    names = [n for n, _ in root.named_parameters(remove_duplicate=False)]
    assert names == ["0.weight", "0.bias", "1.0.weight", "1.0.bias"]
    assert [n for n, _ in root.named_modules()] == ["", "0", "1"]
    assert [n for n, _ in root.named_parameters(prefix="net", recurse=False)] == []


def test_get_submodule_parameter_buffer():
    m = nn.Sequential(WithBuffers())
    assert m.get_submodule("0.inner") is m[0].inner
    assert m.get_parameter("0.inner.bias") is m[0].inner.bias
    assert m.get_buffer("0.mean") is m[0].mean
    with pytest.raises(AttributeError):
        m.get_submodule("0.missing")
    with pytest.raises(AttributeError, match="not an nn.Parameter"):
        m.get_parameter("0.mean")


def test_sequential_container_operations():
    a, b, c = Affine(2, 2), Affine(2, 2), Affine(2, 2)
    seq = nn.Sequential(a, b)
    assert len(seq) == 2 and seq[0] is a and seq[-1] is b
    assert isinstance(seq[0:1], nn.Sequential) and len(seq[0:1]) == 1
    seq.append(c)
    seq.insert(0, c)
    assert [m for m in seq] == [c, a, b, c]
    seq.extend([a])
    del seq[0]
    assert list(seq._modules) == ["0", "1", "2", "3"] and seq[0] is a
    x = runtime.randn(1, 2, dtype=runtime.float64)
    expected = x
    for m in seq:
        expected = m(expected)
    np.testing.assert_allclose(seq(x).detach().numpy(), expected.detach().numpy())


def test_module_list_and_dict():
    layers = nn.ModuleList([Affine(2, 2) for _ in range(3)])
    assert len(layers) == 3 and len(list(layers.parameters())) == 6
    layers.append(Affine(2, 2))
    layers.insert(1, Affine(2, 2))
    assert len(layers) == 5 and isinstance(layers[1:3], nn.ModuleList)
    d = nn.ModuleDict({"a": Affine(2, 2), "b": Affine(2, 2)})
    d["c"] = Affine(2, 2)
    assert list(d.keys()) == ["a", "b", "c"] and "b" in d and len(d) == 3
    assert [n for n, _ in d.named_parameters()][:2] == ["a.weight", "a.bias"]
    d.pop("a")
    assert list(d) == ["b", "c"]


def test_parameter_list_and_dict():
    pl = nn.ParameterList([runtime.ones(2), nn.Parameter(runtime.zeros(3))])
    assert all(isinstance(p, nn.Parameter) for p in pl) and len(pl) == 2
    pl.append(runtime.ones(1))
    assert [n for n, _ in pl.named_parameters()] == ["0", "1", "2"]
    pd = nn.ParameterDict({"x": runtime.ones(2)})
    pd["y"] = nn.Parameter(runtime.zeros(1))
    assert list(pd.keys()) == ["x", "y"] and isinstance(pd["x"], nn.Parameter)
    assert {n for n, _ in pd.named_parameters()} == {"x", "y"}


def test_train_eval_apply_zero_grad_requires_grad():
    m = nn.Sequential(Affine(2, 2), nn.Sequential(Affine(2, 2)))
    m.eval()
    assert not any(sub.training for sub in m.modules())
    m.train()
    assert all(sub.training for sub in m.modules())
    with pytest.raises(ValueError):
        m.train("yes")
    seen = []
    m.apply(lambda sub: seen.append(type(sub).__name__))
    assert seen == ["Affine", "Affine", "Sequential", "Sequential"]
    m(runtime.randn(1, 2, dtype=runtime.float64)).sum().backward()
    m.zero_grad(set_to_none=False)
    assert all(float(p.grad.abs().sum()) == 0 for p in m.parameters())
    m.zero_grad()
    assert all(p.grad is None for p in m.parameters())
    m.requires_grad_(False)
    assert not any(p.requires_grad for p in m.parameters())


def test_to_dtype_moves_parameters_and_every_buffer_keeping_objects():
    m = WithBuffers()
    weight = m.inner.weight
    m.to(runtime.float32)
    assert m.inner.weight is weight and weight.dtype is runtime.float32
    assert m.mean.dtype is runtime.float32 and m.scratch.dtype is runtime.float32
    m.double()
    assert m.scratch.dtype is runtime.float64 and m.inner.bias.dtype is runtime.float64
    m.half()
    assert m.mean.dtype is runtime.float16
    assert m.to("cpu") is m and m.cpu() is m
    if not runtime.cuda.is_available():  # with CUDA, tests/cuda covers Module.cuda()
        with pytest.raises(RuntimeError, match="not available"):
            m.cuda()


def test_forward_pre_and_forward_hooks_in_order_with_replacement():
    m = Affine(2, 2)
    calls = []
    m.register_forward_pre_hook(lambda mod, args: calls.append("pre1"))
    m.register_forward_pre_hook(lambda mod, args: calls.append("pre0"), prepend=True)
    m.register_forward_pre_hook(lambda mod, args, kwargs: (tuple(a * 0 for a in args), kwargs), with_kwargs=True)
    h = m.register_forward_hook(lambda mod, args, out: out + 1)
    m.register_forward_hook(lambda mod, args, kwargs, out: calls.append(("kw", kwargs)), with_kwargs=True)
    out = m(runtime.ones(1, 2, dtype=runtime.float64))
    assert calls == ["pre0", "pre1", ("kw", {})]
    np.testing.assert_allclose(out.detach().numpy(), np.ones((1, 2)))  # (0 @ w + 0) + 1
    h.remove()
    assert float(m(runtime.ones(1, 2, dtype=runtime.float64)).abs().sum()) == 0


def test_always_call_forward_hook_runs_when_forward_raises():
    class Boom(nn.Module):
        def forward(self, x):
            raise ValueError("boom")

    m, seen = Boom(), []
    m.register_forward_hook(lambda mod, args, out: seen.append("always"), always_call=True)
    m.register_forward_hook(lambda mod, args, out: seen.append("normal"))
    with pytest.raises(ValueError, match="boom"):
        m(runtime.ones(1))
    assert seen == ["always"]


def test_global_hooks_fire_for_every_module_and_can_be_removed():
    seen = []
    h1 = module_mod.register_module_forward_pre_hook(lambda mod, args: seen.append(("pre", type(mod).__name__)))
    h2 = module_mod.register_module_forward_hook(lambda mod, args, out: seen.append(("post", type(mod).__name__)))
    try:
        nn.Sequential(Affine(2, 2))(runtime.ones(1, 2, dtype=runtime.float64))
    finally:
        h1.remove()
        h2.remove()
    assert seen == [("pre", "Sequential"), ("pre", "Affine"), ("post", "Affine"), ("post", "Sequential")]
    nn.Sequential(Affine(2, 2))(runtime.ones(1, 2, dtype=runtime.float64))
    assert len(seen) == 4


def test_full_backward_hook_sees_and_replaces_gradients():
    m = Affine(3, 2)
    seen = {}

    def hook(mod, grad_input, grad_output):
        seen["in"], seen["out"] = grad_input, grad_output
        return tuple(runtime.ones_like(g) * 42.0 for g in grad_input)

    m.register_full_backward_hook(hook)
    x = runtime.randn(4, 3, dtype=runtime.float64, requires_grad=True)
    m(x).sum().backward()
    np.testing.assert_allclose(seen["out"][0].numpy(), np.ones((4, 2)))
    np.testing.assert_allclose(seen["in"][0].numpy(), np.ones((4, 2)) @ m.weight.detach().numpy().T)
    np.testing.assert_allclose(x.grad.numpy(), np.full((4, 3), 42.0))


def test_full_backward_hook_grad_input_has_one_entry_per_argument():
    class Scale(nn.Module):
        def forward(self, a, k, b):
            return a * b * k

    m, seen = Scale(), []
    m.register_full_backward_hook(lambda mod, gi, go: seen.append([None if g is None else tuple(g.shape) for g in gi]))
    a = runtime.randn(3, requires_grad=True)
    m(a, 2.0, runtime.randn(3)).sum().backward()
    assert seen == [[(3,), None, (3,)]]  # as torch: every tensor argument gets a gradient, the float None
    seen.clear()
    x = runtime.randn(3)
    lin = Affine(3, 2)
    lin.register_full_backward_hook(lambda mod, gi, go: seen.append((gi, tuple(go[0].shape))))
    lin(x.double()).sum().backward()
    assert seen == [((None,), (2,))]  # no input needs a gradient: the hook fires with None


def test_full_backward_pre_hook_replaces_grad_output():
    m = Affine(3, 2)
    m.register_full_backward_pre_hook(lambda mod, grad_output: (grad_output[0] * 0 + 2,))
    x = runtime.randn(4, 3, dtype=runtime.float64, requires_grad=True)
    m(x).sum().backward()
    np.testing.assert_allclose(m.bias.grad.numpy(), np.full(2, 8.0))


def test_state_dict_holds_parameters_and_persistent_buffers_with_metadata():
    m = WithBuffers()
    sd = m.state_dict()
    assert list(sd) == ["mean", "inner.weight", "inner.bias"]
    assert sd._metadata[""] == {"version": 1} and "inner" in sd._metadata
    assert not sd["inner.weight"].requires_grad
    assert m.state_dict(keep_vars=True)["inner.weight"] is m.inner.weight
    assert list(m.state_dict(prefix="model.")) == ["model.mean", "model.inner.weight", "model.inner.bias"]


def test_load_state_dict_round_trip_and_return_value():
    a, b = WithBuffers(), WithBuffers()
    result = b.load_state_dict(a.state_dict())
    assert repr(result) == "<All keys matched successfully>"
    np.testing.assert_array_equal(b.inner.weight.detach().numpy(), a.inner.weight.detach().numpy())
    assert b.inner.weight is not a.inner.weight


def test_failed_load_lists_every_problem_and_changes_nothing():
    m = WithBuffers()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    bad = m.state_dict()
    bad["inner.weight"] = runtime.zeros(5, 5)
    bad["inner.bias"] = runtime.full((2,), 9.0, dtype=runtime.float64)
    bad["stray"] = runtime.zeros(1)
    del bad["mean"]
    with pytest.raises(RuntimeError) as info:
        m.load_state_dict(bad)
    message = str(info.value)
    assert 'Missing key(s) in state_dict: "mean"' in message
    assert 'Unexpected key(s) in state_dict: "stray"' in message
    assert "size mismatch for inner.weight" in message
    for k, v in m.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), before[k].numpy())


def test_non_strict_load_reports_keys():
    m = WithBuffers()
    sd = m.state_dict()
    del sd["mean"]
    sd["extra"] = runtime.zeros(1)
    result = m.load_state_dict(sd, strict=False)
    assert result.missing_keys == ["mean"] and result.unexpected_keys == ["extra"]
    result = m.load_state_dict({"inner.bias": runtime.zeros(2, dtype=runtime.float64)}, strict=False)
    assert result.missing_keys == ["mean", "inner.weight"] and result.unexpected_keys == []
    assert float(m.inner.bias.abs().sum()) == 0


def test_assign_load_replaces_the_tensors():
    m = Affine(2, 2)
    new = {"weight": runtime.ones(2, 2, dtype=runtime.float64), "bias": runtime.zeros(2, dtype=runtime.float64)}
    m.load_state_dict(new, assign=True)
    assert isinstance(m.weight, nn.Parameter) and m.weight.requires_grad
    np.testing.assert_array_equal(m.weight.detach().numpy(), np.ones((2, 2)))


def test_extra_state_and_state_dict_hooks():
    class Stateful(nn.Module):
        def __init__(self):
            super().__init__()
            self.counter = 0

        def get_extra_state(self):
            return {"counter": self.counter}

        def set_extra_state(self, state):
            self.counter = state["counter"]

    a = Stateful()
    a.counter = 7
    seen = []
    a.register_state_dict_pre_hook(lambda mod, prefix, keep_vars: seen.append("pre"))
    a.register_state_dict_post_hook(lambda mod, sd, prefix, meta: seen.append("post"))
    sd = a.state_dict()
    assert sd["_extra_state"] == {"counter": 7} and seen == ["pre", "post"]
    b = Stateful()
    b.register_load_state_dict_pre_hook(lambda *args: seen.append("load-pre"))
    b.register_load_state_dict_post_hook(lambda mod, keys: seen.append(("load-post", tuple(keys.missing_keys))))
    b.load_state_dict(sd)
    assert b.counter == 7 and seen[-2:] == ["load-pre", ("load-post", ())]


def test_load_from_state_dict_override_point():
    class Renaming(Affine):
        def _load_from_state_dict(self, state_dict, prefix, *args):
            for old, new in (("w", "weight"), ("b", "bias")):
                if prefix + old in state_dict:
                    state_dict[prefix + new] = state_dict.pop(prefix + old)
            super()._load_from_state_dict(state_dict, prefix, *args)

    m = Renaming(2, 2)
    m.load_state_dict({"w": runtime.ones(2, 2, dtype=runtime.float64), "b": runtime.ones(2, dtype=runtime.float64)})
    np.testing.assert_array_equal(m.bias.detach().numpy(), np.ones(2))


def test_repr_matches_torch_format_with_extra_repr():
    class Leaf(nn.Module):
        def extra_repr(self):
            return "in_features=2, out_features=3"

    class Multi(nn.Module):
        def extra_repr(self):
            return "line one\nline two"

    net = nn.Sequential(Leaf(), nn.Sequential(Leaf(), Multi()))
    assert repr(net) == ("Sequential(\n"
                         "  (0): Leaf(in_features=2, out_features=3)\n"
                         "  (1): Sequential(\n"
                         "    (0): Leaf(in_features=2, out_features=3)\n"
                         "    (1): Multi(\n"
                         "      line one\n"
                         "      line two\n"
                         "    )\n"
                         "  )\n"
                         ")")


def test_deepcopy_gives_independent_parameters():
    m = WithBuffers()
    clone = copy.deepcopy(m)
    assert clone.inner.weight is not m.inner.weight
    np.testing.assert_array_equal(clone.inner.weight.detach().numpy(), m.inner.weight.detach().numpy())
    with runtime.no_grad():
        clone.inner.weight.add_(1)
    assert not np.array_equal(clone.inner.weight.detach().numpy(), m.inner.weight.detach().numpy())


def test_missing_forward_and_unexpected_init_args():
    with pytest.raises(NotImplementedError, match='missing the required "forward"'):
        nn.Module()(1)
    with pytest.raises(TypeError):
        nn.Module(3)


def _version() -> int:
    from runtime.utils import state_version

    return state_version.VERSION[0]


@pytest.mark.parametrize("change", ["train flag", "eval", "parameter assigned", "parameter registered",
                                    "buffer registered", "module added", "attribute deleted", "moved by to()",
                                    "data assigned", "failed load restored"])
def test_every_guarded_module_change_moves_the_state_version(change):
    """nnc.compile re-reads training flags and parameters only when runtime.utils.state_version has moved."""
    model = nn.Sequential(Affine(3, 2), nn.ReLU())
    before = _version()
    if change == "train flag":
        model[1].training = False
    elif change == "eval":
        model.eval()
    elif change == "parameter assigned":
        model[0].weight = nn.Parameter(runtime.randn(3, 2, dtype=runtime.float64))
    elif change == "parameter registered":
        model[0].register_parameter("extra", nn.Parameter(runtime.zeros(1)))
    elif change == "buffer registered":
        model[0].register_buffer("stat", runtime.zeros(1))
    elif change == "module added":
        model.add_module("2", nn.Tanh())
    elif change == "attribute deleted":
        del model[0].bias
    elif change == "moved by to()":
        model.to(runtime.float32)
    elif change == "data assigned":
        model[0].weight.data = runtime.zeros(3, 2, dtype=runtime.float64)
    elif change == "failed load restored":  # (a load copying in place leaves it: the restore moves it)
        with pytest.raises(RuntimeError, match="Missing key"):
            model.load_state_dict({"0.weight": runtime.zeros(3, 2, dtype=runtime.float64)})
    assert _version() != before


def test_reading_a_module_leaves_the_state_version_alone():
    model = nn.Sequential(Affine(3, 2), nn.ReLU())
    before = _version()
    model(runtime.randn(4, 3, dtype=runtime.float64))
    list(model.parameters())
    model.state_dict()
    assert model[0].training and _version() == before
