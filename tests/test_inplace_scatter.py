"""In-place scatters (scatter_, index_add_, fill_diagonal_, index_put_ ...): eager vs torch, compiled vs eager."""
import copy
import math
import warnings

import numpy as np
import pytest

import nnc
import runtime
from runtime import nn

INDEX = np.array([[1, 0, 2], [3, 1, 1], [0, 0, 3]])


def _writes(lib):
    """name -> write(base, src): an in-place scatter of `lib` (runtime or torch) into base, reading src [3, 3]."""
    index, rows = lib.tensor(INDEX), lib.tensor([0, 2, 0])
    return {
        "scatter_ value": lambda b, s: b.scatter_(1, index, 1.5),
        "scatter_ src": lambda b, s: b.scatter_(1, index[:, :2], s[:, 1:]),
        "scatter_add_": lambda b, s: b.scatter_add_(1, index, s),
        "index_add_": lambda b, s: b.index_add_(1, rows, s, alpha=-2.0),
        "index_fill_": lambda b, s: b.index_fill_(1, rows, -1.0),
        "index_fill_ tensor": lambda b, s: b.index_fill_(0, rows[:2], s[0, 0]),
        "index_copy_": lambda b, s: b.index_copy_(1, lib.tensor([3, 0, 1]), s),
        "fill_diagonal_": lambda b, s: b.fill_diagonal_(7.0),
        "fill_diagonal_ wrap": lambda b, s: b.t().contiguous().fill_diagonal_(7.0, wrap=True),
    }


NAMES = list(_writes(runtime))


def _inputs(lib):
    x = lib.tensor(np.linspace(-1, 1, 12).reshape(3, 4), requires_grad=True)
    s = lib.tensor(np.linspace(2, 3, 9).reshape(3, 3), requires_grad=True)
    return x, s


def _weighted_sum(lib, out):
    """A loss whose gradient differs per element, so a gradient in the wrong place shows."""
    return (out * lib.tensor(np.linspace(-1, 1, out.numel()).reshape(tuple(out.shape)))).sum()


def _grads(*tensors):
    return [None if t.grad is None else t.grad.numpy().copy() for t in tensors]


def _assert_same(got, want, tol=1e-12):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert (a is None) == (b is None)
        if a is not None:
            np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("name", NAMES)
def test_eager_writes_match_torch_values_and_gradients(name):
    # into a tensor that requires grad (not a leaf), from one that does
    _assert_matches_torch(_inputs, _writes, name)


def _assert_matches_torch(make_inputs, functions, name):
    """functions(lib)[name] of (a * 1, b * 1) for make_inputs(lib) = (a, b): runtime's output and the gradients of
    a and b equal torch's."""
    torch = pytest.importorskip("torch")
    results = []
    for lib in (runtime, torch):
        a, b = make_inputs(lib)
        out = functions(lib)[name](a * 1, b * 1)
        _weighted_sum(lib, out).backward()
        results.append([out.detach().numpy(), *_grads(a, b)])
    _assert_same(*results)


class Write(nn.Module):
    """`write` into a copy of x, or (fresh) into a new tensor of x's shape, then a product with x."""

    def __init__(self, write, fresh=False):
        super().__init__()
        self.write, self.fresh = write, fresh

    def forward(self, x, s):
        base = runtime.zeros_like(x) if self.fresh else x * 1
        return self.write(base, s * 1) * x.sum()


def _compiled_matches_eager(model, *inputs):
    """Compiled and eager agree on outputs and input gradients; the compiled module runs no part eagerly."""
    results = []
    for module in (nnc.compile(copy.deepcopy(model)), model):
        leaves = [t.detach().requires_grad_(t.requires_grad) for t in inputs]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no fallback to eager, no kernel left to the interpreter
            out = module(*leaves)
            _weighted_sum(runtime, out).backward()
        results.append([out.detach().numpy(), *_grads(*leaves)])
    _assert_same(*results)
    report = nnc.explain(model, *inputs, backward=True)
    assert report.graph_breaks == [] and report.pieces == 0, str(report)


@pytest.mark.parametrize("fresh", [False, True], ids=["into a copy", "into zeros_like"])
@pytest.mark.parametrize("name", NAMES)
def test_compiled_writes_match_eager_forward_and_backward(name, fresh):
    _compiled_matches_eager(Write(_writes(runtime)[name], fresh), *_inputs(runtime))


class OneHotCE(nn.Module):
    """Label smoothing as classification scripts write it."""

    def forward(self, logits, target):
        onehot = runtime.zeros_like(logits).scatter_(1, target.unsqueeze(1), 1.0)
        smooth = onehot * 0.9 + 0.1 / logits.size(1)
        return -(smooth * logits.log_softmax(1)).sum(1).mean()


def test_one_hot_label_smoothing_compiles_as_one_graph():
    runtime.manual_seed(0)
    logits = runtime.randn(4, 5, dtype=runtime.float64, requires_grad=True)
    target = runtime.tensor([4, 0, 2, 2])
    _compiled_matches_eager(OneHotCE(), logits, target)
    compiled = nnc.compile(OneHotCE())
    compiled(logits, target)
    assert compiled.compiled_variants == 1


def test_a_tensor_made_in_forward_is_read_after_its_write():
    class Later(nn.Module):
        def forward(self, x, s):
            z = runtime.zeros_like(x)
            z.index_add_(1, runtime.tensor([0, 2, 0]), s)  # the result is not used: z itself is read below
            z += 1
            return z * x

    _compiled_matches_eager(Later(), *_inputs(runtime))


@pytest.mark.parametrize("alias", [lambda z: z[0], lambda z: z.detach()], ids=["view", "detached alias"])
def test_an_alias_of_a_fresh_tensor_kept_across_its_write_runs_eagerly_and_right(alias):
    class KeepsView(nn.Module):
        def forward(self, x, s):
            z = runtime.zeros_like(x)
            kept = alias(z)
            z.scatter_(1, runtime.tensor(INDEX[:, :2]), s[:, 1:])
            return kept * x

    x, s = _inputs(runtime)
    with pytest.warns(RuntimeWarning, match="could not compile"):
        got = nnc.compile(KeepsView())(x, s)
    np.testing.assert_allclose(got.detach().numpy(), KeepsView()(x, s).detach().numpy())


class LabelSmoothingLoss(nn.Module):
    """The smoothed target built under no_grad, as the widely copied label-smoothing loss writes it."""

    def __init__(self, classes, smoothing=0.1):
        super().__init__()
        self.classes, self.smoothing = classes, smoothing

    def forward(self, pred, target):
        pred = pred.log_softmax(dim=-1)
        with runtime.no_grad():
            true_dist = runtime.zeros_like(pred)
            true_dist.fill_(self.smoothing / (self.classes - 1))
            true_dist.scatter_(1, target.data.unsqueeze(1), 1.0 - self.smoothing)
        return runtime.mean(runtime.sum(-true_dist * pred, dim=-1))


def test_a_target_built_in_place_under_no_grad_compiles_as_one_graph():
    runtime.manual_seed(0)
    pred = runtime.randn(4, 5, dtype=runtime.float64, requires_grad=True)
    _compiled_matches_eager(LabelSmoothingLoss(5), pred, runtime.tensor([4, 0, 2, 2]))


class MaskedByScatter(nn.Module):
    """Masks of -inf made under no_grad (from a graph value, and by a factory), opened at the targets by chained
    in-place writes, then read (the first through a view taken before the writes)."""

    def forward(self, x, target):
        with runtime.no_grad():
            computed = (x * 0).fill_(float("-inf"))
            made = runtime.full_like(x, float("-inf"))
            flat = computed.view(-1)
            for mask in (computed, made):
                mask.scatter_(1, target.unsqueeze(1), 0.0).scatter_(1, target.flip(0).unsqueeze(1), 0.0)
        return (x + flat.view(x.shape)).logsumexp(1) + (x + made).logsumexp(1)


def test_writes_under_no_grad_into_a_value_made_there_keep_infinities():
    x = runtime.randn(4, 5, dtype=runtime.float64, requires_grad=True)
    _compiled_matches_eager(MaskedByScatter(), x, runtime.tensor([4, 0, 2, 2]))


class Remember(nn.Module):
    """Copies its input into a buffer under no_grad, then reads the buffer with gradients recorded."""

    def __init__(self, scale_first=False):
        super().__init__()
        self.register_buffer("seen", runtime.zeros(3, dtype=runtime.float64))
        self.scale_first = scale_first

    def forward(self, x):
        if self.scale_first:
            self.seen.copy_(x)  # recorded: the buffer's history is now x's
        with runtime.no_grad():
            self.seen.mul_(2) if self.scale_first else self.seen.copy_(x)
        return self.seen * x


def test_a_value_written_under_no_grad_carries_no_gradient():
    _compiled_matches_eager(Remember(), runtime.tensor([1.0, 2.0, 3.0], dtype=runtime.float64, requires_grad=True))


def test_a_write_under_no_grad_after_a_recorded_one_runs_eagerly_and_right():
    grads = []
    for model in (Remember(scale_first=True), nnc.compile(Remember(scale_first=True))):
        x = runtime.tensor([1.0, 2.0, 3.0], dtype=runtime.float64, requires_grad=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model(x).sum().backward()
        grads.append(x.grad.numpy())
    assert any("written earlier with gradients" in str(w.message) for w in caught)
    np.testing.assert_allclose(grads[1], grads[0])


class OneHotOfPlainSizes(nn.Module):
    """One-hot targets in a tensor made with plain sizes (a real tensor while tracing), under no_grad or not, and
    columns written one by one into another."""

    def __init__(self, under_no_grad):
        super().__init__()
        self.under_no_grad = under_no_grad

    def forward(self, logits, target):
        with runtime.set_grad_enabled(not self.under_no_grad):
            onehot = runtime.zeros(target.size(0), logits.size(1), dtype=logits.dtype)
            onehot.scatter_(1, target.unsqueeze(1), 1.0)
        columns = runtime.empty(logits.shape, dtype=logits.dtype)
        for c in range(logits.size(1)):
            columns[:, c] = logits[:, c] * (c + 1)
        return (onehot * columns.log_softmax(1)).sum()


class Loss(nn.Module):
    def __init__(self, under_no_grad):
        super().__init__()
        self.lin, self.loss = nn.Linear(5, 5).double(), OneHotOfPlainSizes(under_no_grad)

    def forward(self, x, target):
        return self.loss(self.lin(x), target)


@pytest.mark.parametrize("under_no_grad", [False, True])
def test_traced_values_written_into_a_tensor_of_plain_sizes_compile(under_no_grad):
    runtime.manual_seed(0)
    x = runtime.randn(4, 5, dtype=runtime.float64, requires_grad=True)
    _compiled_matches_eager(Loss(under_no_grad), x, runtime.tensor([4, 0, 2, 2]))


OUTSIDE = runtime.zeros(3)


class WritesOutside(nn.Module):
    """Writes a tensor made outside forward: the Python code after the write reads it."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        OUTSIDE.copy_(self.lin(x).detach())
        return OUTSIDE.sum() + x


def test_traced_values_written_into_a_tensor_from_outside_forward_are_a_graph_break():
    model, x = WritesOutside(), runtime.randn(3)
    report = nnc.explain(model, x)
    assert [path for path, _ in report.graph_breaks] == ["WritesOutside.forward"]
    assert "not a traced value" in report.graph_breaks[0][1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = nnc.compile(model)(x)
    np.testing.assert_allclose(got.detach().numpy(), model(x).detach().numpy())
    np.testing.assert_allclose(OUTSIDE.numpy(), model.lin(x).detach().numpy())


class CountClasses(nn.Module):
    """Writes a buffer (class counts) and an input (the logits of the true class zeroed) in forward."""

    def __init__(self):
        super().__init__()
        self.register_buffer("counts", runtime.zeros(5, dtype=runtime.float64))

    def forward(self, logits, target):
        self.counts.index_add_(0, target, runtime.ones_like(target, dtype=runtime.float64))
        logits.scatter_(1, target.unsqueeze(1), 0.0)
        return logits, logits.sum(1)


def test_writes_into_an_input_and_a_buffer_are_written_back():
    target = runtime.tensor([4, 0, 2, 2])
    eager, compiled = CountClasses(), nnc.compile(CountClasses())
    for _ in range(2):
        x_eager = runtime.linspace(-1, 1, 20, dtype=runtime.float64).reshape(4, 5)
        x_compiled = x_eager.clone()
        want = eager(x_eager, target)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = compiled(x_compiled, target)
        assert got[0] is x_compiled and want[0] is x_eager
        np.testing.assert_array_equal(x_compiled.numpy(), x_eager.numpy())
        np.testing.assert_array_equal(got[1].numpy(), want[1].numpy())
    np.testing.assert_array_equal(compiled.counts.numpy(), [2, 0, 4, 0, 2])
    np.testing.assert_array_equal(eager.counts.numpy(), compiled.counts.numpy())
    assert compiled.compiled_variants == 1


def test_an_input_that_requires_grad_written_in_place_gets_the_writes_history():
    class FillDiagonal(nn.Module):
        def forward(self, x, s):
            x.index_add_(1, runtime.tensor([0, 2, 0]), s).fill_diagonal_(0.5)
            return x

    grads = []
    for model in (FillDiagonal(), nnc.compile(FillDiagonal())):
        x, s = _inputs(runtime)
        inp = x * 1
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out = model(inp, s)
        assert out is inp
        _weighted_sum(runtime, out * inp).backward()
        grads.append(_grads(x, s))
    _assert_same(*grads)


# -- torch.index_put, Tensor.index_put and index_put_ ---------------------------------------------------------------


def _index_puts(lib):
    """name -> put(x, v): an index_put of `lib` (runtime or torch) into x [3, 4], reading v [3, 4]."""
    def t(values, dtype=None):
        return lib.tensor(np.array(values), dtype=dtype)

    return {
        "rows": lambda x, v: lib.index_put(x, (t([2, 0]),), v[:2]),
        "rows broadcast": lambda x, v: x.index_put((t([2, 0]),), v[0]),
        "rows added, repeated": lambda x, v: lib.index_put(x, (t([1, 1, -1]),), v, accumulate=True),
        "pairs": lambda x, v: x.index_put_((t([0, 2, 2]), t([1, 3, 3])), v[:, 0]),
        "pairs added": lambda x, v: x.index_put_((t([0, 2, 2]), t([1, 3, 3])), v[:, 0], True),
        "pairs of broadcast indices": lambda x, v: x.index_put((t([[0], [2]]), t([1, 3])), v[0, :2]),
        "mask of rows": lambda x, v: x.index_put_((t([True, False, True]),), v[1]),
        "mask of rows added": lambda x, v: x.index_put((t([True, False, True]),), v[:2], accumulate=True),
        "mask of elements": lambda x, v: x.index_put_((x.detach() > 0,), v[0, 0]),
        "int32 index": lambda x, v: x.index_put((t([2, 0], dtype=lib.int32),), v[:2]),
        "list of indices": lambda x, v: x.index_put([t([1])], v[2]),
    }


INDEX_PUTS = list(_index_puts(runtime))


def _put_inputs(lib):
    x = lib.tensor(np.linspace(-1, 1, 12).reshape(3, 4), requires_grad=True)
    v = lib.tensor(np.linspace(2, 3, 12).reshape(3, 4), requires_grad=True)
    return x, v


@pytest.mark.parametrize("name", INDEX_PUTS)
def test_index_put_matches_torch_values_and_gradients(name):
    _assert_matches_torch(_put_inputs, _index_puts, name)


class Put(nn.Module):
    def __init__(self, put):
        super().__init__()
        self.put = put

    def forward(self, x, v):
        return self.put(x * 1, v * 1) * 2


# values in mask order: their gradient, g[mask], has a shape only the mask's values decide
DATA_DEPENDENT = "mask of rows added"


@pytest.mark.parametrize("name", [n for n in INDEX_PUTS if n != DATA_DEPENDENT])
def test_compiled_index_put_matches_eager_forward_and_backward(name):
    _compiled_matches_eager(Put(_index_puts(runtime)[name]), *_put_inputs(runtime))


def test_values_in_mask_order_run_eagerly_and_right():
    x, v = _put_inputs(runtime)
    model = Put(_index_puts(runtime)[DATA_DEPENDENT])
    with pytest.warns(RuntimeWarning, match="data-dependent shape"):
        got = nnc.compile(model)(x, v)
    np.testing.assert_array_equal(got.detach().numpy(), model(x, v).detach().numpy())


def test_index_put_into_an_input_is_written_back():
    class AddRows(nn.Module):
        def forward(self, x, v):
            return x.index_put_((runtime.tensor([1, 1, 0]),), v, accumulate=True)

    v = runtime.ones(3, 4)
    x_eager, x_compiled = runtime.zeros(3, 4), runtime.zeros(3, 4)
    compiled = nnc.compile(AddRows())
    for _ in range(2):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert compiled(x_compiled, v) is x_compiled
        AddRows()(x_eager, v)
    np.testing.assert_array_equal(x_compiled.numpy(), x_eager.numpy())
    np.testing.assert_array_equal(x_compiled.numpy()[:, 0], [2, 4, 0])


def test_index_put_refuses_what_torch_refuses():
    x, index, one = runtime.zeros(3, 4), runtime.tensor([0]), runtime.tensor(1.0)
    with pytest.raises(RuntimeError, match="dtypes match"):
        x.index_put_((index,), one.double())
    with pytest.raises(TypeError, match="tuple of Tensors"):
        x.index_put_(index, one)
    with pytest.raises(TypeError, match="must be Tensor"):
        x.index_put_((index,), 1.0)
    with pytest.raises(IndexError, match="long, int"):
        x.index_put_((index.double(),), one)
    with pytest.raises(RuntimeError, match="leaf Variable"):
        runtime.zeros(3, requires_grad=True).index_put_((index,), one)


# -- index_put of a Python scalar as a generated gather kernel ------------------------------------------------------


class FillColumns(nn.Module):
    """A Python scalar written into whole columns: by index_fill_, or by `y[:, index] = value`."""

    def __init__(self, value, setitem=False):
        super().__init__()
        self.value, self.setitem = value, setitem

    def forward(self, x):
        y = x * 2
        index = runtime.tensor([0, 3, -1, 0])
        if self.setitem:
            y[:, index] = self.value
        else:
            y.index_fill_(1, index, self.value)
        return y + 1


@pytest.mark.parametrize("setitem", [False, True], ids=["index_fill_", "setitem"])
@pytest.mark.parametrize("dtype, value", [(runtime.float32, 0.1), (runtime.float64, -2.5), (runtime.int64, 1.7),
                                          (runtime.int32, -3), (runtime.float32, float("nan"))])
def test_a_scalar_written_at_an_index_runs_as_a_generated_gather_kernel(dtype, value, setitem):
    x = runtime.arange(30).reshape(5, 6).to(dtype)
    model = FillColumns(value, setitem)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a kernel that fails to generate warns and runs in the interpreter
        got = nnc.compile(model)(x)
    np.testing.assert_array_equal(got.numpy(), model(x).numpy())
    report = nnc.explain(model, x)
    gathers = [k for k in report.kernels if k.kind == "gather"]
    assert gathers and all(k.generated and not k.fallback for k in gathers), str(report)


def test_a_scalar_written_at_an_index_has_eager_gradients():
    _compiled_matches_eager(FillColumns(0.25), runtime.randn(5, 6, dtype=runtime.float64, requires_grad=True))


class PutRows(nn.Module):
    """`y[:, index] = v` with values v that broadcast to the indexed shape, or hold one value."""

    def forward(self, x, v):
        y = x * 2
        y[:, runtime.tensor([0, 3, -1, 0][:x.shape[1]])] = v
        return y + 1


@pytest.mark.parametrize("x_shape, v_shape", [((4, 5, 3), (3,)), ((4, 5, 3), (4, 1, 3)), ((4, 5, 3), (1, 4, 1)),
                                              ((4, 5, 3), (1,)), ((6, 1), (1,)), ((6, 1), (6, 1))])
def test_values_that_broadcast_or_hold_one_value_run_as_a_generated_gather_kernel(x_shape, v_shape):
    x = runtime.arange(math.prod(x_shape), dtype=runtime.float64).reshape(x_shape)
    v = -runtime.arange(1, math.prod(v_shape) + 1, dtype=runtime.float64).reshape(v_shape)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = nnc.compile(PutRows())(x, v)
    np.testing.assert_array_equal(got.numpy(), PutRows()(x, v).numpy())
    report = nnc.explain(PutRows(), x, v)
    gathers = [k for k in report.kernels if k.kind == "gather"]
    assert gathers and all(k.generated and not k.fallback for k in gathers), str(report)
    _compiled_matches_eager(PutRows(), x.requires_grad_(), v.requires_grad_())


class ForcesIntoViews(nn.Module):
    """Forces accumulated into rows of a tensor made in forward, as simulation code writes them; `order` puts the
    writes without graph values before or after the others."""

    def __init__(self, order):
        super().__init__()
        self.order = order

    def forward(self, x, s):
        forces = runtime.zeros_like(x)
        if self.order == "constant first":
            forces[:, 1] -= 9.81
        forces[0, :3] += s[0] * x[1, :3]
        forces[2, 1:] -= s[0] * x[1, 1:]
        forces[1, 1:3] = s[1, :2]
        if self.order == "constant last":
            forces[:, 1] -= 9.81
            forces *= 2.0
        return forces * x + forces.sum()


@pytest.mark.parametrize("order", ["constant first", "constant last"])
def test_writes_into_views_of_a_tensor_made_in_forward_compile_as_one_graph(order):
    _compiled_matches_eager(ForcesIntoViews(order), *_inputs(runtime))


class MassSprings(nn.Module):
    """A differentiable mass-spring simulation in the shape of pytorch/examples' differentiable_physics: spring forces
    added into rows of a fresh force tensor, semi-implicit Euler steps, the anchor particle pinned by writes."""

    def __init__(self):
        super().__init__()
        self.anchor = runtime.tensor([0.0, 0.0], dtype=runtime.float64)
        self.free = nn.Parameter(runtime.tensor([[0.7, -0.2], [1.4, 0.3]], dtype=runtime.float64))
        self.springs = [(0, 1, 1.0, 10.0), (1, 2, 0.5, 5.0)]

    def forward(self, velocity):
        position = runtime.cat([self.anchor.unsqueeze(0), self.free])
        for _ in range(4):
            forces = runtime.zeros_like(position)
            for i, j, rest, stiffness in self.springs:
                d = position[j] - position[i]
                length = d.norm()
                force = stiffness * (length - rest) * d / (length + 1e-6)
                forces[i] += force
                forces[j] -= force
            forces[:, 1] -= 9.81
            velocity = velocity + forces * 0.01
            position = position + velocity * 0.01
            position[0] = self.anchor
            velocity[0] = runtime.zeros(2, dtype=runtime.float64)
        return position


def test_a_mass_spring_simulation_compiles_as_one_graph():
    _compiled_matches_eager(MassSprings(), runtime.zeros(3, 2, dtype=runtime.float64))
