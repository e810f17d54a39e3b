"""The code of PyTorch's "Modules" note (docs/source/notes/modules.rst), run unchanged with `import runtime as torch`;
where torch is installed, the same source also runs under it (bound as `real`) and the two are compared."""
from __future__ import annotations

import inspect
import re
import textwrap
from collections import OrderedDict
from types import SimpleNamespace

import numpy as np
import pytest

import runtime as torch
from runtime import nn

from helpers import require_torch
from modules_note import (BigNet, DynamicNet, ModalModule, MyLinear, Net, RunningMean,
                          StatefulModule, backward_hook, forward_hook, forward_pre_hook, hooks_demo, init_weights)


def note_training_loop(torch, net, inputs):
    """The note's SGD loop, with the inputs given (so runtime and torch can see the same ones); returns the losses."""
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-4, weight_decay=1e-2, momentum=0.9)
    losses = []
    for input in inputs:
        output = net(input)
        loss = torch.abs(output)
        net.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


# ---------------------------------------------------------------------------------------------------------------
# Helpers: the same source run under real torch, copying weights across, capturing prints.
# ---------------------------------------------------------------------------------------------------------------


def in_real_torch(*objects):
    """Re-execute the source of the given classes/functions with torch, nn and F bound to the real torch."""
    real = require_torch()
    namespace = {"torch": real, "nn": real.nn, "F": real.nn.functional}
    for obj in objects:
        exec(textwrap.dedent(inspect.getsource(obj)), namespace)
    return real, SimpleNamespace(**{obj.__name__: namespace[obj.__name__] for obj in objects})


def copy_into_torch(real, ours, theirs):
    """Load our module's state_dict into the torch module, so both hold identical values."""
    theirs.load_state_dict({k: real.tensor(v.numpy()) for k, v in ours.state_dict().items()})
    return theirs


def as_runtime_text(text: str) -> str:
    return text.replace("torch.", "runtime.")


def printed(capsys) -> str:
    return capsys.readouterr().out


TENSOR_1D = r"tensor\(\[[-0-9. ,e+]+\]"


# ---------------------------------------------------------------------------------------------------------------
# A Simple Custom Module
# ---------------------------------------------------------------------------------------------------------------


def test_my_linear_forward():
    m = MyLinear(4, 3)
    sample_input = torch.randn(4)
    out = m(sample_input)
    # The note shows: tensor([-0.3037, -1.0413, -4.2057], grad_fn=<AddBackward0>)  (random values)
    assert out.shape == (3,)
    assert re.fullmatch(TENSOR_1D + r", grad_fn=<AddBackward0>\)", repr(out))
    expected = sample_input.numpy() @ m.weight.detach().numpy() + m.bias.detach().numpy()
    np.testing.assert_allclose(out.detach().numpy(), expected, rtol=1e-6)


def test_my_linear_named_parameters(capsys):
    m = MyLinear(4, 3)
    for parameter in m.named_parameters():
        print(parameter)
    out = printed(capsys)
    assert [name for name, _ in m.named_parameters()] == ["weight", "bias"]
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in m.parameters())
    row = r"\[[-0-9. ,]+\]"
    pattern = (r"\('weight', Parameter containing:\ntensor\(\[" + row + r",\n" + r"(?:        " + row + r",\n){2}"
               + r"        " + row + r"\], requires_grad=True\)\)\n"
               r"\('bias', Parameter containing:\n" + TENSOR_1D + r", requires_grad=True\)\)\n")
    assert re.fullmatch(pattern, out), out


def test_my_linear_prints_like_torch(capsys):
    real, theirs = in_real_torch(MyLinear)
    m = MyLinear(4, 3)
    tm = copy_into_torch(real, m, theirs.MyLinear(4, 3))
    sample_input = torch.randn(4)
    assert repr(m(sample_input)) == as_runtime_text(repr(tm(real.tensor(sample_input.numpy()))))
    for parameter in m.named_parameters():
        print(parameter)
    ours = printed(capsys)
    for parameter in tm.named_parameters():
        print(parameter)
    assert ours == as_runtime_text(printed(capsys))


# ---------------------------------------------------------------------------------------------------------------
# Modules as Building Blocks
# ---------------------------------------------------------------------------------------------------------------


def test_sequential():
    net = nn.Sequential(
        MyLinear(4, 3),
        nn.ReLU(),
        MyLinear(3, 1)
    )

    sample_input = torch.randn(4)
    out = net(sample_input)
    # The note shows: tensor([-0.6749], grad_fn=<AddBackward0>)  (random value)
    assert re.fullmatch(r"tensor\(\[-?\d+\.\d{4}\], grad_fn=<AddBackward0>\)", repr(out)), repr(out)
    w0, b0, w1, b1 = (p.detach().numpy() for p in net.parameters())
    expected = np.maximum(sample_input.numpy() @ w0 + b0, 0) @ w1 + b1
    np.testing.assert_allclose(out.detach().numpy(), expected, rtol=1e-6)
    assert repr(net) == ("Sequential(\n  (0): MyLinear()\n  (1): ReLU()\n  (2): MyLinear()\n)")


def test_net_named_children(capsys):
    net = Net()
    for child in net.named_children():
        print(child)
    assert printed(capsys) == ("('l0', MyLinear())\n"
                               "('l1', MyLinear())\n")
    assert [type(c) for c in net.children()] == [MyLinear, MyLinear]


BIG_NET_NAMED_MODULES = """\
('', BigNet(
  (l1): MyLinear()
  (net): Net(
    (l0): MyLinear()
    (l1): MyLinear()
  )
))
('l1', MyLinear())
('net', Net(
  (l0): MyLinear()
  (l1): MyLinear()
))
('net.l0', MyLinear())
('net.l1', MyLinear())
"""


def test_big_net_named_modules(capsys):
    big_net = BigNet()
    for module in big_net.named_modules():
        print(module)
    assert printed(capsys) == BIG_NET_NAMED_MODULES
    assert [type(m) for m in big_net.modules()] == [BigNet, MyLinear, Net, MyLinear, MyLinear]
    assert big_net(torch.randn(5)).shape == (1,)


def test_net_and_big_net_print_like_torch(capsys):
    real, theirs = in_real_torch(MyLinear, Net, BigNet)
    for ours, mine in ((Net(), theirs.Net()), (BigNet(), theirs.BigNet())):
        for module in ours.named_modules():
            print(module)
        for child in ours.named_children():
            print(child)
        text = printed(capsys)
        for module in mine.named_modules():
            print(module)
        for child in mine.named_children():
            print(child)
        assert text == as_runtime_text(printed(capsys))
        assert repr(ours) == as_runtime_text(repr(mine))


# ---------------------------------------------------------------------------------------------------------------
# ModuleList / ModuleDict, .to(), .apply()
# ---------------------------------------------------------------------------------------------------------------


DYNAMIC_NET_PARAMETERS = [
    ("linears.0.weight", (4, 4)), ("linears.0.bias", (4,)),
    ("linears.1.weight", (4, 4)), ("linears.1.bias", (4,)),
    ("linears.2.weight", (4, 4)), ("linears.2.bias", (4,)),
    ("final.weight", (4, 1)), ("final.bias", (1,)),
]


def dynamic_net_reference(net, x, act):
    for linear in net.linears:
        x = x @ linear.weight.detach().numpy() + linear.bias.detach().numpy()
    x = np.maximum(x, 0) if act == "relu" else np.where(x > 0, x, 0.01 * x)
    return x @ net.final.weight.detach().numpy() + net.final.bias.detach().numpy()


def test_dynamic_net_forward():
    dynamic_net = DynamicNet(3)
    sample_input = torch.randn(4)
    output = dynamic_net(sample_input, 'relu')
    assert output.shape == (1,) and output.grad_fn is not None
    for act in ("relu", "lrelu"):
        np.testing.assert_allclose(dynamic_net(sample_input, act).detach().numpy(),
                                   dynamic_net_reference(dynamic_net, sample_input.numpy(), act), rtol=1e-5)
    assert list(dynamic_net.activations.keys()) == ["relu", "lrelu"]
    assert [type(a) for a in dynamic_net.activations.values()] == [nn.ReLU, nn.LeakyReLU]
    assert len(dynamic_net.linears) == 3


def test_dynamic_net_named_parameters(capsys):
    dynamic_net = DynamicNet(3)
    for parameter in dynamic_net.named_parameters():
        print(parameter)
    out = printed(capsys)
    assert [(n, tuple(p.shape)) for n, p in dynamic_net.named_parameters()] == DYNAMIC_NET_PARAMETERS
    assert re.findall(r"^\('([\w.]+)', Parameter containing:$", out, flags=re.M) == [
        n for n, _ in DYNAMIC_NET_PARAMETERS]
    assert out.count("requires_grad=True))") == len(DYNAMIC_NET_PARAMETERS)


def test_dynamic_net_matches_torch(capsys):
    real, theirs = in_real_torch(MyLinear, DynamicNet)
    dynamic_net = DynamicNet(3)
    mine = copy_into_torch(real, dynamic_net, theirs.DynamicNet(3))
    sample_input = torch.randn(4)
    for act in ("relu", "lrelu"):
        ours = dynamic_net(sample_input, act)
        ref = mine(real.tensor(sample_input.numpy()), act)
        np.testing.assert_allclose(ours.detach().numpy(), ref.detach().numpy(), rtol=1e-5)
        assert repr(ours) == as_runtime_text(repr(ref))
    for parameter in dynamic_net.named_parameters():
        print(parameter)
    text = printed(capsys)
    for parameter in mine.named_parameters():
        print(parameter)
    assert text == as_runtime_text(printed(capsys))


def test_dynamic_net_repr_like_torch():
    real, theirs = in_real_torch(MyLinear, DynamicNet)
    # torch's ModuleList folds repeated identical entries: "(0-2): 3 x MyLinear()".
    assert repr(DynamicNet(3)) == as_runtime_text(repr(theirs.DynamicNet(3)))


def test_to_float64():
    dynamic_net = DynamicNet(3)
    before = {n: p for n, p in dynamic_net.named_parameters()}

    # Change precision of all parameters  (the note also moves to 'cuda' first; runtime is CPU-only here)
    assert dynamic_net.to(dtype=torch.float64) is dynamic_net
    for name, p in dynamic_net.named_parameters():
        assert p.dtype == torch.float64 and isinstance(p, nn.Parameter) and p.requires_grad, name
        np.testing.assert_array_equal(p.detach().numpy(), before[name].detach().numpy().astype(np.float64))

    out = dynamic_net(torch.randn(4, dtype=torch.float64), 'relu')
    # The note shows: tensor([6.5166], device='cuda:0', dtype=torch.float64, grad_fn=<AddBackward0>)
    assert out.dtype == torch.float64
    assert re.fullmatch(r"tensor\(\[-?\d+\.\d{4}\], dtype=runtime\.float64, grad_fn=<AddBackward0>\)",
                        repr(out)), repr(out)

    # The same through the shorthands and the positional forms.
    assert dynamic_net.float() is dynamic_net
    assert {p.dtype for p in dynamic_net.parameters()} == {torch.float32}
    dynamic_net.double()
    assert {p.dtype for p in dynamic_net.parameters()} == {torch.float64}
    dynamic_net.to(torch.float32)
    assert {p.dtype for p in dynamic_net.parameters()} == {torch.float32}
    dynamic_net.to(device='cpu')
    assert {str(p.device) for p in dynamic_net.parameters()} == {"cpu"}


def test_apply_init_weights_on_dynamic_net_as_in_note():
    dynamic_net = DynamicNet(3)
    before = {n: p.detach().numpy().copy() for n, p in dynamic_net.named_parameters()}

    # Apply the function recursively on the module and its submodules.
    assert dynamic_net.apply(init_weights) is dynamic_net

    # DynamicNet holds MyLinear, not nn.Linear, so the note's init_weights leaves it as it was.
    for name, p in dynamic_net.named_parameters():
        np.testing.assert_array_equal(p.detach().numpy(), before[name])


def test_apply_init_weights_on_nn_linear():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(300, 200), nn.ReLU(), nn.Sequential(nn.Linear(200, 100)))
    net.apply(init_weights)
    for layer in (net[0], net[2][0]):
        w, b = layer.weight, layer.bias
        assert isinstance(w, nn.Parameter) and w.requires_grad and w.is_leaf and w.grad_fn is None
        assert isinstance(b, nn.Parameter) and b.requires_grad and b.is_leaf and b.grad_fn is None
        np.testing.assert_array_equal(b.detach().numpy(), 0.0)
        fan_out, fan_in = w.shape
        std = float(np.sqrt(2.0 / (fan_in + fan_out)))
        assert abs(float(w.detach().numpy().std()) - std) < 0.1 * std
        assert abs(float(w.detach().numpy().mean())) < 0.1 * std


def test_apply_visits_modules_in_torch_order():
    real, theirs = in_real_torch(MyLinear, DynamicNet)
    ours, seen = [], []
    DynamicNet(2).apply(lambda m: ours.append(type(m).__name__))
    theirs.DynamicNet(2).apply(lambda m: seen.append(type(m).__name__))
    assert ours == seen


# ---------------------------------------------------------------------------------------------------------------
# Neural Network Training with Modules
# ---------------------------------------------------------------------------------------------------------------


def test_training_loop_as_in_note():
    torch.manual_seed(0)
    # Create the network (from previous section) and optimizer
    net = Net()
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-4, weight_decay=1e-2, momentum=0.9)
    start_l1 = net.l1.weight.detach().numpy().copy()

    # Run a sample training loop that "teaches" the network
    # to output the constant zero function
    losses = []
    for _ in range(10000):
        input = torch.randn(4)
        output = net(input)
        loss = torch.abs(output)
        net.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())

    # After training, switch the module to eval mode to do inference, compute performance metrics, etc.
    net.eval()
    assert not net.training and not net.l0.training and not net.l1.training

    assert np.mean(losses[-1000:]) < 0.5 * np.mean(losses[:1000])
    # "examining the value of l1's weight parameter shows that its values are now much closer to 0"
    assert np.abs(net.l1.weight.detach().numpy()).sum() < np.abs(start_l1).sum()
    assert net.l1.weight.shape == (3, 1)
    assert re.fullmatch(r"Parameter containing:\ntensor\(\[\[.+\],\n        \[.+\],\n        \[.+\]\], "
                        r"requires_grad=True\)", repr(net.l1.weight)), repr(net.l1.weight)


@pytest.mark.parametrize("dtype_name, atol", [("float32", 1e-6), ("float64", 0.0)])
def test_training_loop_matches_torch(dtype_name, atol):
    # Same initial weights and inputs, so the same losses step for step. In float32 a loss near zero is a
    # cancellation whose last bits differ between any two matmul implementations, hence the small atol there.
    real, theirs = in_real_torch(MyLinear, Net)
    torch.manual_seed(1)
    net = Net().to(getattr(torch, dtype_name))
    mine = copy_into_torch(real, net, theirs.Net().to(getattr(real, dtype_name)))
    inputs = np.random.default_rng(0).standard_normal((2000, 4)).astype(dtype_name)
    ours = note_training_loop(torch, net, [torch.tensor(row) for row in inputs])
    ref = note_training_loop(real, mine, [real.tensor(row) for row in inputs])
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=atol)
    assert np.mean(ours[-200:]) < 0.5 * np.mean(ours[:200])
    for (name, p), (_, q) in zip(net.named_parameters(), mine.named_parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-5, atol=atol, err_msg=name)


def test_modal_module(capsys):
    m = ModalModule()
    x = torch.randn(4)

    print('training mode output: {}'.format(m(x)))
    assert m.training
    np.testing.assert_array_equal(m(x).numpy(), x.numpy() + 1.0)

    m.eval()
    print('evaluation mode output: {}'.format(m(x)))
    assert not m.training and m(x) is x

    lines = printed(capsys).splitlines()
    assert lines == [f"training mode output: {x + 1.}", f"evaluation mode output: {x}"]
    assert m.train() is m and m.training


def test_modal_module_prints_the_notes_values(capsys):
    # The note's printed x (it was torch's first five draws after manual_seed(1)).
    m = ModalModule()
    x = torch.tensor([0.6614, 0.2669, 0.0617, 0.6213, -0.4519])
    print('training mode output: {}'.format(m(x)))
    m.eval()
    print('evaluation mode output: {}'.format(m(x)))
    assert printed(capsys) == ("training mode output: tensor([1.6614, 1.2669, 1.0617, 1.6213, 0.5481])\n"
                               "evaluation mode output: tensor([ 0.6614,  0.2669,  0.0617,  0.6213, -0.4519])\n")


# ---------------------------------------------------------------------------------------------------------------
# Module State
# ---------------------------------------------------------------------------------------------------------------


def test_save_and_load_net(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    net = Net()
    # Save the module
    torch.save(net.state_dict(), 'net.pt')

    # Load the module later on
    new_net = Net()
    result = new_net.load_state_dict(torch.load('net.pt'))
    assert repr(result) == "<All keys matched successfully>"
    x = torch.randn(4)
    np.testing.assert_array_equal(new_net(x).detach().numpy(), net(x).detach().numpy())
    for (name, p), (_, q) in zip(net.named_parameters(), new_net.named_parameters()):
        assert isinstance(q, nn.Parameter) and q.requires_grad, name
        np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy())


def test_running_mean_buffer_save_and_load(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    m = RunningMean(4)
    expected = np.zeros(4, dtype=np.float32)
    for _ in range(10):
        input = torch.randn(4)
        m(input)
        expected = 0.9 * expected + (1.0 - 0.9) * input.numpy()

    print(m.state_dict())
    # The note shows: OrderedDict([('mean', tensor([ 0.1041, -0.1113, -0.0647,  0.1515]))])  (random values)
    assert re.fullmatch(r"OrderedDict\(\[\('mean', " + TENSOR_1D + r"\)\)\]\)\n", printed(capsys))
    assert isinstance(m.state_dict(), OrderedDict) and list(m.state_dict()) == ["mean"]
    np.testing.assert_allclose(m.mean.numpy(), expected, rtol=1e-5, atol=1e-7)
    # The assignment in forward() kept "mean" a buffer, not a parameter.
    assert [n for n, _ in m.named_buffers()] == ["mean"] and list(m.parameters()) == []
    assert not m.mean.requires_grad and m.mean.dtype == torch.float32

    # Serialized form will contain the 'mean' tensor
    torch.save(m.state_dict(), 'mean.pt')

    m_loaded = RunningMean(4)
    m_loaded.load_state_dict(torch.load('mean.pt'))
    assert(torch.all(m.mean == m_loaded.mean))
    assert [n for n, _ in m_loaded.named_buffers()] == ["mean"] and m_loaded.mean.dtype == torch.float32


def test_running_mean_state_dict_prints_like_torch(capsys):
    real, theirs = in_real_torch(RunningMean)
    m, tm = RunningMean(4), theirs.RunningMean(4)
    for _ in range(10):
        input = torch.randn(4)
        m(input)
        tm(real.tensor(input.numpy()))
    np.testing.assert_allclose(m.mean.numpy(), tm.mean.numpy(), rtol=1e-6)
    rounded = {"mean": torch.tensor(np.round(m.mean.numpy(), 4))}
    m.load_state_dict(rounded)
    tm.load_state_dict({"mean": real.tensor(rounded["mean"].numpy())})
    print(m.state_dict())
    print(tm.state_dict())
    ours, theirs_text = printed(capsys).splitlines()
    assert ours == as_runtime_text(theirs_text)


def test_non_persistent_buffer_to_and_named_buffers(capsys):
    class RunningMeanWithScratch(RunningMean):
        def __init__(self, num_features, momentum=0.9):
            super().__init__(num_features, momentum)
            self.register_buffer('unserialized_thing', torch.randn(5), persistent=False)

    m = RunningMeanWithScratch(4)
    m(torch.randn(4))
    assert list(m.state_dict()) == ["mean"]

    # Moves all module parameters and buffers to the specified device / dtype
    m.to(device='cpu', dtype=torch.float64)
    assert m.mean.dtype == torch.float64 and m.unserialized_thing.dtype == torch.float64

    for buffer in m.named_buffers():
        print(buffer)
    out = printed(capsys)
    assert re.fullmatch(r"\('mean', " + TENSOR_1D + r", dtype=runtime\.float64\)\)\n"
                        r"\('unserialized_thing', " + TENSOR_1D + r", dtype=runtime\.float64\)\)\n", out), out


STATEFUL_KEYS = ['param1', 'param2', 'buffer1', 'param_list.0', 'param_list.1', 'param_list.2',
                 'param_dict.bar', 'param_dict.foo', 'linear.weight', 'linear.bias']
STATEFUL_SHAPES = [(2,), (3,), (4,), (2,), (2,), (2,), (4,), (3,), (3, 2), (3,)]


def test_stateful_module_registration():
    m = StatefulModule()
    assert m.param3 is None and "param3" in m._parameters
    assert m.buffer3 is None and "buffer3" in m._buffers
    with pytest.raises(TypeError):
        m.param3 = torch.zeros(1)  # reserved for a Parameter
    assert sorted(n for n, _ in m.named_parameters()) == sorted(
        ['param1', 'param2', 'param_list.0', 'param_list.1', 'param_list.2', 'param_dict.foo', 'param_dict.bar',
         'linear.weight', 'linear.bias'])
    assert [n for n, _ in m.named_buffers()] == ['buffer1', 'buffer2']
    assert [n for n, _ in m.named_children()] == ['param_list', 'param_dict', 'linear']
    m.double()
    assert m.buffer2.dtype == torch.float64 and m.param_dict['foo'].dtype == torch.float64


def test_stateful_module_state_dict_keys_as_note_prints(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    m = StatefulModule()

    # Save and load state_dict.
    torch.save(m.state_dict(), 'state.pt')
    m_loaded = StatefulModule()
    m_loaded.load_state_dict(torch.load('state.pt'))

    # Note that non-persistent buffer "buffer2" and reserved attributes "param3" and "buffer3" do
    # not appear in the state_dict.
    sd = m_loaded.state_dict()
    assert list(sd) == STATEFUL_KEYS
    assert [tuple(v.shape) for v in sd.values()] == STATEFUL_SHAPES
    for key, value in m.state_dict().items():
        np.testing.assert_array_equal(sd[key].numpy(), value.numpy(), err_msg=key)
    assert not torch.equal(m_loaded.buffer2, m.buffer2)  # not saved, so still m_loaded's own draw


def test_stateful_module_state_dict_prints_in_note_format(capsys):
    m_loaded = StatefulModule()
    print(m_loaded.state_dict())
    out = printed(capsys)
    # (the order of the keys is checked above; here the format)
    assert re.findall(r"\('([\w.]+)', tensor\(", out) == list(m_loaded.state_dict())
    assert sorted(m_loaded.state_dict()) == sorted(STATEFUL_KEYS)
    assert out.startswith("OrderedDict([('param1', tensor([") and out.endswith("]))])\n")


def test_stateful_module_matches_torch():
    real, theirs = in_real_torch(StatefulModule)
    m, tm = StatefulModule(), theirs.StatefulModule()
    assert list(m.state_dict()) == list(tm.state_dict())
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in tm.named_parameters()]
    assert [n for n, _ in m.named_buffers()] == [n for n, _ in tm.named_buffers()]
    assert [n for n, _ in m.named_modules()] == [n for n, _ in tm.named_modules()]


def test_stateful_module_with_extra_state(tmp_path, monkeypatch):
    # Not in the note: the fourth kind of state, get_extra_state / set_extra_state.
    monkeypatch.chdir(tmp_path)

    class WithExtraState(StatefulModule):
        def __init__(self):
            super().__init__()
            self.steps = 0

        def get_extra_state(self):
            return {"steps": self.steps}

        def set_extra_state(self, state):
            self.steps = state["steps"]

    m = WithExtraState()
    m.steps = 7
    # torch writes a module's own parameters, buffers, then its extra state, then recurses into children.
    keys = list(StatefulModule().state_dict())
    assert list(m.state_dict()) == keys[:3] + ["_extra_state"] + keys[3:]
    torch.save(m.state_dict(), 'state.pt')
    m_loaded = WithExtraState()
    assert repr(m_loaded.load_state_dict(torch.load('state.pt'))) == "<All keys matched successfully>"
    assert m_loaded.steps == 7


# ---------------------------------------------------------------------------------------------------------------
# Module Hooks
# ---------------------------------------------------------------------------------------------------------------

# What torch.manual_seed(1); nn.Linear(3, 3); torch.randn(2, 3) draws in torch (runtime's generator differs).
SEED1_WEIGHT = [[0.2974873483181, -0.2548298239707947, -0.11192598193883896],
                [0.2709902822971344, -0.5435388088226318, 0.3462469279766083],
                [-0.11877556145191193, 0.2937234044075012, 0.08026149123907089]]
SEED1_BIAS = [-0.07069316506385803, 0.16013438999652863, 0.02848171815276146]
SEED1_X = [[-1.522768497467041, 0.38168391585350037, -1.0276086330413818],
           [-0.563052773475647, -0.8922905325889587, -0.05825017765164375]]

# The note's printed output (grad_fn names as torch 2.x spells them: AddmmBackward0, AddBackward0).
NOTE_HOOKS_OUTPUT = """\
output with no forward hooks: tensor([[-0.5059, -0.8158,  0.2390],
        [-0.0043,  0.4724, -0.1714]], grad_fn=<AddmmBackward0>)
output with forward pre hook: tensor([[-0.5752, -0.7421,  0.4942],
        [-0.0736,  0.5461,  0.0838]], grad_fn=<AddmmBackward0>)
output with both forward hooks: tensor([[-1.0980,  0.6396,  0.4666],
        [ 0.3634,  0.6538,  1.0256]], grad_fn=<AddBackward0>)
output after removing forward hooks: tensor([[-0.5059, -0.8158,  0.2390],
        [-0.0043,  0.4724, -0.1714]], grad_fn=<AddmmBackward0>)
x.grad with no backwards hook: tensor([[ 0.4497, -0.5046,  0.3146],
        [ 0.4497, -0.5046,  0.3146]])
x.grad with backwards hook: tensor([[42., 42., 42.],
        [42., 42., 42.]])
"""

GRAD_FN = re.compile(r"grad_fn=<\w+>")


def seed1_linear_and_x():
    m = nn.Linear(3, 3)
    with torch.no_grad():
        m.weight.copy_(torch.tensor(SEED1_WEIGHT))
        m.bias.copy_(torch.tensor(SEED1_BIAS))
    x = torch.tensor(SEED1_X, requires_grad=True)
    return m, x


def test_hooks_as_in_note(capsys):
    torch.manual_seed(1)

    # Create sample module & input.
    m = nn.Linear(3, 3)
    x = torch.randn(2, 3, requires_grad=True)

    hooks_demo(m, x)
    lines = printed(capsys).splitlines()
    assert len(lines) == 12

    w, b, xv = m.weight.detach().numpy(), m.bias.detach().numpy(), x.detach().numpy()
    plain, pre = xv @ w.T + b, (xv + 1) @ w.T + b
    both = pre + (xv + 1)

    def values(first, second):
        return np.array([[float(v) for v in re.findall(r"-?\d+\.\d+", line.split("grad_fn")[0].split(": ")[-1])]
                         for line in (first, second)])

    for i, expected in ((0, plain), (2, pre), (4, both), (6, plain)):
        np.testing.assert_allclose(values(lines[i], lines[i + 1]), expected, atol=1e-4 + 1e-6)
    np.testing.assert_allclose(values(lines[8], lines[9]), np.tile(w.sum(0), (2, 1)), atol=1e-4 + 1e-6)
    assert lines[10:] == ["x.grad with backwards hook: tensor([[42., 42., 42.],", "        [42., 42., 42.]])"]
    np.testing.assert_array_equal(x.grad.numpy(), np.full((2, 3), 42.0, dtype=np.float32))


def test_hooks_print_the_notes_values(capsys):
    # With the weights and input torch draws after manual_seed(1), the numbers are the note's exactly.
    m, x = seed1_linear_and_x()
    hooks_demo(m, x)
    assert GRAD_FN.sub("grad_fn=<...>", printed(capsys)) == GRAD_FN.sub("grad_fn=<...>", NOTE_HOOKS_OUTPUT)


def test_hooks_print_grad_fns_where_the_note_does(capsys):
    # NOTE: torch's Linear is one addmm kernel (grad_fn AddmmBackward0); runtime's F.linear is a composition
    # of primitives (matmul, then add), so the output's grad_fn is the add's. Same places, different name.
    m, x = seed1_linear_and_x()
    hooks_demo(m, x)
    ours = GRAD_FN.findall(printed(capsys))
    assert len(ours) == len(GRAD_FN.findall(NOTE_HOOKS_OUTPUT)) > 0
    assert all("AddBackward0" in name for name in ours), ours


def test_hooks_match_torch(capsys):
    real, theirs = in_real_torch(forward_pre_hook, forward_hook, backward_hook, hooks_demo)
    m, x = seed1_linear_and_x()
    hooks_demo(m, x)
    ours = printed(capsys)
    real.manual_seed(1)
    tm = real.nn.Linear(3, 3)
    tx = real.randn(2, 3, requires_grad=True)
    theirs.hooks_demo(tm, tx)
    reference = printed(capsys)
    assert GRAD_FN.sub("grad_fn=<...>", reference) == GRAD_FN.sub("grad_fn=<...>", NOTE_HOOKS_OUTPUT)
    # (grad_fn names are checked on their own above)
    assert GRAD_FN.sub("grad_fn=<...>", ours) == GRAD_FN.sub("grad_fn=<...>", as_runtime_text(reference))
