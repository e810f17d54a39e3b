"""nnc.trace: the PyTorch Modules note's examples, an MLP, a CNN and a transformer block traced into GraphModules
that compute what eager computes (forward, gradients, state), plus the tracer's rules, errors and node meta."""
from __future__ import annotations

import ast
import copy
import inspect
import operator
import os
import re
import sysconfig

import numpy as np
import pytest

import nnc
import nnc.passes
import runtime as torch
import runtime.nn.functional as F
from runtime import nn
from runtime.tensor import Tensor

from modules_note import (BigNet, DynamicNet, ModalModule, MyLinear, Net, RunningMean,
                          backward_hook, forward_hook, forward_pre_hook, hooks_demo)

THIS_FILE = os.path.abspath(__file__)
NOTE_FILE = os.path.abspath(inspect.getsourcefile(MyLinear))  # the note's modules live in examples/modules_note.py

# ---------------------------------------------------------------------------------------------------------------
# Models beyond the note: an MLP, a small CNN, a transformer block.
# ---------------------------------------------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2))
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(4 * 4 * 4, 5)

    def forward(self, x):
        return self.fc(self.flatten(self.features(x)))


class TransformerBlock(nn.Module):
    def __init__(self, dim=8, heads=2):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, need_weights=False)
        x = x + a
        return x + self.mlp(self.ln2(x))


# ---------------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------------


def assert_same(actual, expected, tol=0.0):
    """Equal structure, shapes, dtypes and values (exactly when tol is 0)."""
    if isinstance(expected, Tensor):
        assert isinstance(actual, Tensor), type(actual)
        assert tuple(actual.shape) == tuple(expected.shape) and actual.dtype == expected.dtype
        a, e = actual.detach().numpy(), expected.detach().numpy()
        if tol:
            np.testing.assert_allclose(a, e, rtol=tol, atol=tol)
        else:
            np.testing.assert_array_equal(a, e)
    elif isinstance(expected, (tuple, list)):
        assert type(actual) is type(expected) and len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e, tol)
    else:
        assert actual == expected


def tensors_in(value) -> list:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors_in(v)]
    return []


def loss_of(output):
    """A weighted sum of every floating output, so each output element gets its own gradient."""
    rng = np.random.default_rng(0)
    total = 0
    for t in tensors_in(output):
        if t.dtype.is_floating_point and t.requires_grad:
            total = total + (t * torch.tensor(rng.standard_normal(tuple(t.shape)).astype(np.float32))).sum()
    return total


def grad_inputs(inputs) -> list:
    return [x.detach().clone().requires_grad_() if isinstance(x, Tensor) and x.dtype.is_floating_point else x
            for x in inputs]


def check_traced(module, *inputs, concrete_args=None, tracer=None):
    """Trace `module`, then check the GraphModule against eager runs of a copy taken before tracing: outputs,
    gradients, state after the call, state_dict sharing, `.code`, lint and the Interpreter."""
    concrete_args = dict(concrete_args or {})
    reference = copy.deepcopy(module)
    gm = nnc.symbolic_trace(module, concrete_args=concrete_args, tracer=tracer)

    assert list(gm.state_dict()) == list(module.state_dict())
    shared = gm.state_dict(keep_vars=True)
    for key, tensor in module.state_dict(keep_vars=True).items():
        assert shared[key] is tensor, key
    ast.parse(gm.code)
    gm.graph.lint(gm)

    eager_in, traced_in = grad_inputs(inputs), grad_inputs(inputs)
    expected, actual = reference(*eager_in, **concrete_args), gm(*traced_in)
    assert_same(actual, expected)
    eager_loss, traced_loss = loss_of(expected), loss_of(actual)
    if isinstance(eager_loss, Tensor):
        eager_loss.backward()
        traced_loss.backward()
        for e, a in zip(eager_in, traced_in):
            if isinstance(e, Tensor) and e.grad is not None:
                assert_same(a.grad, e.grad)
        traced_params = dict(gm.named_parameters())
        for name, p in reference.named_parameters():
            assert (p.grad is None) == (traced_params[name].grad is None), name
            if p.grad is not None:
                assert_same(traced_params[name].grad, p.grad)
    assert_same(list(gm.state_dict().values()), list(reference.state_dict().values()))

    expected = reference.forward(*inputs, **concrete_args)  # the graph is forward; the root's hooks wrap calls
    assert_same(nnc.Interpreter(gm).run(*inputs), expected)
    assert_same(list(gm.state_dict().values()), list(reference.state_dict().values()))
    return gm


def calls(gm, op: str) -> list:
    return [n.target for n in gm.graph.nodes if n.op == op]


def line_of(obj, marker: str) -> int:
    """The line of obj's file, inside obj's source, that contains marker."""
    lines, start = inspect.getsourcelines(obj)
    found = [start + i for i, line in enumerate(lines) if marker in line]
    assert len(found) == 1, (marker, found)
    return found[0]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# ---------------------------------------------------------------------------------------------------------------
# The note's examples, and the MLP / CNN / transformer block: GraphModule == eager
# ---------------------------------------------------------------------------------------------------------------


def test_my_linear():
    gm = check_traced(MyLinear(4, 3), torch.randn(2, 4))
    assert calls(gm, "call_function") == [operator.matmul, operator.add]


def test_sequential_of_my_linear_and_relu():
    net = nn.Sequential(MyLinear(4, 3), nn.ReLU(), MyLinear(3, 1))
    gm = check_traced(net, torch.randn(5, 4))
    assert calls(gm, "call_module") == ["1"]  # the ReLU; the MyLinears are traced through
    assert calls(gm, "get_attr") == ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_net():
    gm = check_traced(Net(), torch.randn(3, 4))
    assert calls(gm, "call_function") == [operator.matmul, operator.add, F.relu, operator.matmul, operator.add]


def test_big_net():
    gm = check_traced(BigNet(), torch.randn(3, 5))
    assert calls(gm, "get_attr") == ["l1.weight", "l1.bias", "net.l0.weight", "net.l0.bias",
                                     "net.l1.weight", "net.l1.bias"]


@pytest.mark.parametrize("act, other", [("relu", "lrelu"), ("lrelu", "relu")])
def test_dynamic_net_with_concrete_act(act, other):
    gm = check_traced(DynamicNet(3), torch.randn(2, 4), concrete_args={"act": act})
    assert calls(gm, "call_module") == [f"activations.{act}"]
    assert [n.target for n in gm.graph.placeholders] == ["x"]  # act was specialised away
    assert gm.graph.meta["concrete_args"] == {"act": act}
    assert f"activations.{other}" not in gm.code


@pytest.mark.parametrize("training", [True, False])
def test_modal_module_is_specialised_on_the_mode(training):
    m = ModalModule().train(training)
    gm = check_traced(m, torch.randn(5))
    assert gm.graph.meta["training"] is training and gm.training is training
    assert calls(gm, "call_function") == ([operator.add] if training else [])
    x = torch.randn(5)
    if not training:
        assert gm(x) is x  # the eval graph returns its input, as eager does


def test_running_mean_records_its_buffer_assignment():
    m = RunningMean(4)
    nnc.symbolic_trace(m)
    assert torch.equal(m.mean, torch.zeros(4))  # tracing alone does not run the assignment
    gm = check_traced(m, torch.randn(4))
    writes = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is setattr]
    assert len(writes) == 1 and writes[0].args[1] == "mean"
    assert writes[0].args[0].op == "get_attr" and writes[0].args[0].target == ""  # the module itself
    assert "setattr(root, 'mean', add)" in gm.code
    # the GraphModule shares the original's registries, so running it rebinds the buffer there, as eager would
    assert not torch.equal(m.mean, torch.zeros(4))


def test_running_mean_tracks_like_eager_over_many_calls():
    m, reference = RunningMean(4), RunningMean(4)
    gm = nnc.symbolic_trace(m)
    for _ in range(5):
        x = torch.randn(4)
        assert_same(gm(x), reference(x))
        assert_same(gm.mean, reference.mean)
    assert list(gm.state_dict()) == ["mean"] and [n for n, _ in gm.named_buffers()] == ["mean"]
    assert not gm.graph.eliminate_dead_code()  # the write has no users but is kept
    assert "setattr(root, 'mean', add)" in gm.recompile().src


def test_buffer_assignment_in_a_submodule():
    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.stats = RunningMean(3)

        def forward(self, x):
            return self.stats(x) * 2

    gm = check_traced(Outer(), torch.randn(3))
    owner = [n for n in gm.graph.nodes if n.target is setattr][0].args[0]
    assert owner.op == "get_attr" and owner.target == "stats"


def test_hooks_example_on_the_traced_module_prints_what_eager_prints(capsys):
    m = nn.Linear(3, 3)
    reference = copy.deepcopy(m)
    gm = nnc.symbolic_trace(m)
    x = torch.randn(2, 3, requires_grad=True)
    hooks_demo(reference, x)
    eager = capsys.readouterr().out
    x = x.detach().requires_grad_()
    hooks_demo(gm, x)
    assert capsys.readouterr().out == eager
    assert "x.grad with backwards hook: tensor([[42., 42., 42.]," in eager


def test_hooks_on_the_root_fire_when_the_graph_module_runs():
    m = nn.Linear(3, 3)
    m.register_forward_pre_hook(forward_pre_hook)
    m.register_forward_hook(forward_hook)
    m.register_full_backward_hook(backward_hook)
    x = torch.randn(2, 3)
    check_traced(m, x)
    gm = nnc.symbolic_trace(m)
    xg = x.clone().requires_grad_()
    gm(xg).sum().backward()
    assert_same(xg.grad, torch.full((2, 3), 42.0))


def test_hooks_on_the_original_registered_after_tracing_fire_too():
    m = MyLinear(3, 3)
    gm = nnc.symbolic_trace(m)
    x = torch.randn(2, 3)
    handle = m.register_forward_hook(forward_hook)
    assert_same(gm(x), m(x))
    assert_same(gm(x), (x @ m.weight + m.bias) + x)
    handle.remove()
    assert_same(gm(x), x @ m.weight + m.bias)


def test_modules_with_hooks_stay_calls_and_their_hooks_fire():
    net = Net()
    fired = []
    net.l0.register_forward_pre_hook(forward_pre_hook)
    net.l1.register_forward_hook(lambda m, i, o: fired.append(tuple(o.shape)))
    gm = check_traced(net, torch.randn(2, 4))
    assert calls(gm, "call_module") == ["l0", "l1"]  # MyLinear is traced through unless it has hooks
    fired.clear()
    gm(torch.randn(7, 4))
    assert fired == [(7, 1)]


def test_submodule_backward_hook_fires_through_the_graph_module():
    net = Net()
    net.l1.register_full_backward_hook(backward_hook)
    gm = check_traced(net, torch.randn(2, 4))
    assert "l1" in calls(gm, "call_module")


def test_mlp():
    gm = check_traced(MLP(), torch.randn(4, 6))
    assert calls(gm, "call_module") == ["fc1", "fc2"] and calls(gm, "call_function") == [F.relu]


@pytest.mark.parametrize("training", [True, False])
def test_cnn(training):
    gm = check_traced(CNN().train(training), torch.randn(2, 3, 8, 8))
    assert calls(gm, "call_module") == ["features.0", "features.1", "features.2", "features.3", "flatten", "fc"]
    assert gm.graph.meta["training"] is training


def test_transformer_block():
    gm = check_traced(TransformerBlock(), torch.randn(5, 2, 8))
    assert calls(gm, "call_module") == ["ln1", "attn", "ln2", "mlp.0", "mlp.1", "mlp.2"]
    # `a, _ = self.attn(...)` unpacks the leaf's tuple output into two getitem nodes
    assert [n.args[1] for n in gm.graph.nodes if n.target is operator.getitem] == [0, 1]


# ---------------------------------------------------------------------------------------------------------------
# What becomes a call, what is traced through
# ---------------------------------------------------------------------------------------------------------------


def test_module_list_loop_gives_one_call_per_layer():
    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

        def forward(self, x):
            for layer in self.layers:
                x = torch.tanh(layer(x))
            return x

    gm = check_traced(Stack(), torch.randn(2, 4))
    assert calls(gm, "call_module") == ["layers.0", "layers.1", "layers.2"]
    assert calls(gm, "call_function") == [torch.tanh] * 3


def test_tracer_subclass_choosing_leaves_changes_the_graph():
    class MyLinearLeaves(nnc.Tracer):
        def is_leaf_module(self, module, qualified_name):
            return isinstance(module, MyLinear) or super().is_leaf_module(module, qualified_name)

    class NoLeaves(nnc.Tracer):
        def is_leaf_module(self, module, qualified_name):
            return False

    gm = check_traced(Net(), torch.randn(2, 4), tracer=MyLinearLeaves())
    assert calls(gm, "call_module") == ["l0", "l1"] and calls(gm, "get_attr") == []

    gm = check_traced(MLP(), torch.randn(2, 6), tracer=NoLeaves())
    assert calls(gm, "call_module") == []
    assert calls(gm, "call_function") == [F.linear, F.relu, F.linear]


def test_training_branch_in_a_custom_module_follows_the_mode():
    class Noisy(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x):
            x = self.fc(x)
            if self.training:
                x = x * 0.5
            return x

    m = Noisy()
    assert operator.mul in calls(nnc.symbolic_trace(m), "call_function")
    m.eval()
    gm = nnc.symbolic_trace(m)
    assert calls(gm, "call_function") == [] and gm.graph.meta["training"] is False


# ---------------------------------------------------------------------------------------------------------------
# concrete_args and TraceError
# ---------------------------------------------------------------------------------------------------------------


def test_unknown_concrete_arg_names_raise_clearly():
    with pytest.raises(nnc.TraceError) as info:
        nnc.symbolic_trace(DynamicNet(2), concrete_args={"activation": "relu"})
    message = str(info.value)
    assert "activation" in message and "DynamicNet" in message and "'x', 'act'" in message


def test_concrete_args_leave_only_the_traced_inputs():
    net = DynamicNet(2)
    gm = nnc.symbolic_trace(net, concrete_args={"act": "lrelu"})
    assert gm.code.startswith("def forward(self, x):\n")
    x = torch.randn(3, 4)
    assert_same(gm(x), net(x, "lrelu"))
    with pytest.raises(TypeError):
        gm(x, "relu")


class DataDependentIf(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # marker: if
            return x
        return -x


class LenOfProxy(nn.Module):
    def forward(self, x):
        return x * len(x)  # marker: len


class IterateProxy(nn.Module):
    def forward(self, x):
        total = 0
        for row in x:  # marker: iter
            total = total + row
        return total


class IntOfProxy(nn.Module):
    def forward(self, x):
        return x.reshape(int(x.sum()))  # marker: int


class Inner(nn.Module):
    def forward(self, x):
        while x.max() > 1:  # marker: nested
            x = x / 2
        return x


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()

    def forward(self, x):
        return self.inner(x)


@pytest.mark.parametrize("module_class, where, marker", [
    (DataDependentIf, DataDependentIf, "marker: if"),
    (LenOfProxy, LenOfProxy, "marker: len"),
    (IterateProxy, IterateProxy, "marker: iter"),
    (IntOfProxy, IntOfProxy, "marker: int"),
    (Outer, Inner, "marker: nested"),
])
def test_trace_error_names_the_users_line_and_suggests_fixes(module_class, where, marker):
    with pytest.raises(nnc.TraceError) as info:
        nnc.symbolic_trace(module_class())
    message = str(info.value)
    assert f"{THIS_FILE}:{line_of(where, marker)}" in message, message
    assert marker in message  # the source line itself is quoted
    assert "concrete_args" in message and "leaf" in message


def test_unpacking_a_proxy_into_names_is_not_iteration():
    class Halves(nn.Module):
        def forward(self, x):
            a, b = x.chunk(2, -1)
            return a * b

    gm = check_traced(Halves(), torch.randn(3, 4))
    assert [n.args[1] for n in gm.graph.nodes if n.target is operator.getitem] == [0, 1]


# ---------------------------------------------------------------------------------------------------------------
# Node meta: source, module path, shapes
# ---------------------------------------------------------------------------------------------------------------


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.proj = MyLinear(4, 2)

    def forward(self, x):
        h = F.relu(self.fc1(x))
        return self.proj(h)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = Encoder()

    def forward(self, x):
        return torch.tanh(self.encoder(x))


def node(gm, op, target):
    found = [n for n in gm.graph.nodes if n.op == op and n.target == target]
    assert len(found) == 1, (op, target, found)
    return found[0]


def test_source_is_the_users_file_and_line():
    gm = nnc.symbolic_trace(Model())
    assert node(gm, "call_module", "encoder.fc1").meta["source"] == f"{THIS_FILE}:{line_of(Encoder, 'F.relu')}"
    assert node(gm, "call_function", F.relu).meta["source"] == f"{THIS_FILE}:{line_of(Encoder, 'F.relu')}"
    assert node(gm, "call_function", operator.matmul).meta["source"] == f"{NOTE_FILE}:{line_of(MyLinear, '@')}"
    assert node(gm, "call_function", torch.tanh).meta["source"] == f"{THIS_FILE}:{line_of(Model, 'tanh')}"
    assert node(gm, "call_function", F.relu).meta["source_line"] == "h = F.relu(self.fc1(x))"


@pytest.mark.parametrize("folder", [sysconfig.get_paths()["purelib"], os.path.dirname(torch.__file__) + "_models"])
def test_code_in_installed_packages_and_look_alike_folders_is_user_code(folder):
    filename = os.path.join(folder, "somepkg", "model.py")
    source = ("class Branchy(nn.Module):\n"
              "    def forward(self, x):\n"
              "        if x.sum() > 0:\n"
              "            return x\n"
              "class Plain(nn.Module):\n"
              "    def forward(self, x):\n"
              "        return torch.tanh(x)\n")
    namespace = {"nn": nn, "torch": torch}
    exec(compile(source, filename, "exec"), namespace)
    with pytest.raises(nnc.TraceError, match=f"at {re.escape(filename)}:3"):
        nnc.symbolic_trace(namespace["Branchy"]())
    gm = nnc.symbolic_trace(namespace["Plain"]())
    assert node(gm, "call_function", torch.tanh).meta["source"] == f"{filename}:7"


def test_module_path_is_the_qualified_name_of_the_module_the_op_came_from():
    gm = nnc.symbolic_trace(Model())
    assert node(gm, "call_module", "encoder.fc1").meta["module_path"] == "encoder.fc1"
    assert node(gm, "call_function", F.relu).meta["module_path"] == "encoder"
    assert node(gm, "call_function", operator.matmul).meta["module_path"] == "encoder.proj"
    assert node(gm, "call_function", operator.add).meta["module_path"] == "encoder.proj"
    assert node(gm, "get_attr", "encoder.proj.weight").meta["module_path"] == "encoder.proj"
    assert node(gm, "call_function", torch.tanh).meta["module_path"] == ""


def assert_meta_matches(n, value):
    if isinstance(value, Tensor):
        assert n.meta["shape"] == tuple(value.shape) and n.meta["dtype"] == value.dtype, n.name
        assert n.shape == tuple(value.shape) and n.dtype == value.dtype
    elif isinstance(value, tuple) and any(isinstance(v, Tensor) for v in value):
        expected = [{"shape": tuple(v.shape), "dtype": v.dtype} if isinstance(v, Tensor) else None for v in value]
        assert n.meta["tensor_meta"] == expected, n.name


@pytest.mark.parametrize("make, shape", [(MLP, (3, 6)), (CNN, (2, 3, 8, 8)), (TransformerBlock, (4, 2, 8)),
                                         (Model, (3, 4))])
def test_propagated_shapes_equal_the_eager_intermediates(make, shape):
    m = make().eval()
    x = torch.randn(*shape)
    gm = nnc.symbolic_trace(m)
    nnc.passes.propagate_shapes(gm, x)

    # every leaf module's eager output, captured by hooks on the original modules during an eager run
    eager = {}
    handles = [sub.register_forward_hook(lambda mod, i, o, name=name: eager.setdefault(name, o))
               for name, sub in m.named_modules() if name in calls(gm, "call_module")]
    out = m(x)
    for h in handles:
        h.remove()
    for n in gm.graph.nodes:
        if n.op == "call_module":
            assert_meta_matches(n, eager[n.target])
    assert_meta_matches(gm.graph.placeholders[0], x)
    assert_meta_matches(gm.graph.output_node, out)

    # and every node against the values a plain run of the graph computes
    interpreter = nnc.Interpreter(gm)
    interpreter.run(x)
    for n, value in interpreter.env.items():
        assert_meta_matches(n, value)
        if isinstance(value, Tensor):
            assert "shape" in n.meta


def test_propagated_dtypes_follow_each_op():
    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 5)

        def forward(self, x):
            h = self.fc(x)
            return h.double().sum(0), h.argmax(-1), h > 0, x.shape[0]

    m = Mixed()
    x = torch.randn(2, 3)
    gm = nnc.symbolic_trace(m)
    nnc.passes.propagate_shapes(gm, x)
    h = m.fc(x)
    expected = {"fc": h, "double": h.double(), "sum_1": h.double().sum(0), "argmax": h.argmax(-1), "gt": h > 0}
    meta = {n.name: (n.shape, n.dtype) for n in gm.graph.nodes}
    assert {name: meta[name] for name in expected} == {k: (tuple(v.shape), v.dtype) for k, v in expected.items()}
    assert meta["argmax"][1] == torch.int64 and meta["gt"][1] == torch.bool and meta["double"][1] == torch.float64
    assert node(gm, "call_function", operator.getitem).meta["value"] == 2
    assert gm.graph.output_node.meta["tensor_meta"][:3] == [
        {"shape": (5,), "dtype": torch.float64}, {"shape": (2,), "dtype": torch.int64},
        {"shape": (2, 5), "dtype": torch.bool}]


@pytest.mark.parametrize("make, shape", [(CNN, (2, 3, 8, 8)), (lambda: RunningMean(4), (4,))])
def test_propagate_shapes_leaves_the_models_state_alone(make, shape):
    m = make()  # train mode: BatchNorm would update its running stats, RunningMean its mean
    gm = nnc.symbolic_trace(m)
    before = {k: v.clone() for k, v in gm.state_dict().items()}
    buffers = dict(gm.named_buffers())
    nnc.passes.propagate_shapes(gm, torch.randn(*shape))
    after = gm.state_dict()
    assert list(after) == list(before)
    for key in before:
        assert_same(after[key], before[key])
    assert all(gm.get_buffer(k) is b for k, b in buffers.items())
    assert gm.graph.output_node.shape == tuple(m(torch.randn(*shape)).shape)


# ---------------------------------------------------------------------------------------------------------------
# What the tracer records for functions, methods, operators and constants
# ---------------------------------------------------------------------------------------------------------------


class Ops(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        a = F.relu(x)
        b = torch.tanh(a)
        c = b.sum(-1, keepdim=True)
        d = a + c
        e = d @ self.w
        f = -e
        g = 2 * f
        return g[0], torch.zeros_like(g)


def test_functions_methods_and_operators_are_recorded_as_such():
    gm = check_traced(Ops(), torch.randn(3, 4))
    recorded = [(n.op, n.target) for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
    assert recorded == [("call_function", F.relu), ("call_function", torch.tanh), ("call_method", "sum"),
                        ("call_function", operator.add), ("call_function", operator.matmul),
                        ("call_function", operator.neg), ("call_function", operator.mul),
                        ("call_function", operator.getitem), ("call_function", torch.zeros_like)]
    mul = node(gm, "call_function", operator.mul)
    assert mul.args[0] == 2 and mul.args[1].target is operator.neg  # 2 * f: the reflected operand order kept
    assert node(gm, "call_method", "sum").kwargs == {"keepdim": True}
    for text in ("F.relu(x)", "runtime.tanh(relu)", "tanh.sum(-1, keepdim=True)", "add @ w", "-matmul", "2 * neg",
                 "mul[0]", "runtime.zeros_like(mul)"):
        assert text in gm.code, text


class LinearViaF(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3, 4))
        self.bias = nn.Parameter(torch.randn(3))

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


def test_f_linear_in_a_traced_through_module_is_one_call_function():
    class Wrapper(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = LinearViaF()

        def forward(self, x):
            return self.proj(x).relu()

    gm = check_traced(Wrapper(), torch.randn(2, 4))
    linear = node(gm, "call_function", F.linear)
    assert [a.target for a in linear.args] == ["x", "proj.weight", "proj.bias"]
    assert linear.meta["module_path"] == "proj"
    assert calls(gm, "call_module") == [] and calls(gm, "call_method") == ["relu"]
    assert "F.linear(x, proj_weight, proj_bias)" in gm.code


def test_tensor_constants_become_get_attr_and_stay_out_of_the_state_dict():
    class WithConstants(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x):
            scale = torch.tensor([1.0, 2.0, 3.0])
            shift = torch.ones(3) * 0.5
            return self.fc(x) * scale + shift

    m = WithConstants()
    gm = check_traced(m, torch.randn(2, 3))
    assert calls(gm, "get_attr") == ["_tensor_constant0", "_tensor_constant1"]
    assert_same(gm._tensor_constant0, torch.tensor([1.0, 2.0, 3.0]))
    assert_same(gm._tensor_constant1, torch.full((3,), 0.5))
    assert list(gm.state_dict()) == list(m.state_dict()) == ["fc.weight", "fc.bias"]
    assert len(list(gm.parameters())) == 2 and list(gm.buffers()) == []


# ---------------------------------------------------------------------------------------------------------------
# The generated code
# ---------------------------------------------------------------------------------------------------------------


def test_a_pass_leaves_code_that_is_generated_again_when_next_used():
    """Passes mark the code stale (GraphModule.invalidate) instead of generating it after every edit; the next
    `.code` or call generates it from the edited graph."""

    class Dead(nn.Module):
        def forward(self, x):
            unused = torch.exp(x)  # noqa: F841 (dead code for dce to remove)
            return x * 2

    gm = nnc.symbolic_trace(Dead())
    assert "exp" in gm.code
    nnc.passes.simplify.dce(gm)
    assert "exp" not in gm.code and "x * 2" in gm.code
    x = torch.randn(3)
    assert_same(gm(x), x * 2)


def test_recompile_regenerates_code_after_editing_the_graph():
    net = Net()
    gm = nnc.symbolic_trace(net)
    x = torch.randn(2, 4)
    relu = node(gm, "call_function", F.relu)
    with gm.graph.inserting_after(relu):
        sigmoid = gm.graph.call_function(torch.sigmoid, (relu.args[0],))
    relu.replace_all_uses_with(sigmoid)
    gm.graph.erase_node(relu)
    gm.graph.lint(gm)
    assert "F.relu" in gm.code  # not regenerated yet
    gm.recompile()
    assert "F.relu" not in gm.code and "sigmoid = runtime.sigmoid(add)" in gm.code
    ast.parse(gm.code)
    expected = torch.sigmoid(x @ net.l0.weight + net.l0.bias) @ net.l1.weight + net.l1.bias
    assert_same(gm(x), expected)
    assert_same(nnc.Interpreter(gm).run(x), expected)


def test_code_keeps_defaults_and_odd_operands_right():
    class Odd(nn.Module):
        def forward(self, x, scale=2.0, tag=None):
            return (-2.0) ** x + x[()] * scale, tag

    m = Odd()
    gm = nnc.symbolic_trace(m)
    assert "def forward(self, x, scale=2.0, tag=None):" in gm.code
    assert "(-2.0) ** x" in gm.code and "x[()]" in gm.code
    x = torch.tensor(3.0)
    assert_same(gm(x), m(x))
    assert_same(nnc.Interpreter(gm).run(x), m(x))
    assert_same(gm(x, 3.0), m(x, 3.0))


def test_shape_dependent_factories_are_recorded():
    class Positions(nn.Module):
        def forward(self, x):
            return x + torch.arange(x.shape[-1])

    m = Positions()
    gm = check_traced(m, torch.randn(2, 3))
    assert torch.arange in calls(gm, "call_function")
    assert_same(gm(torch.zeros(1, 5)), torch.arange(5).float()[None])
