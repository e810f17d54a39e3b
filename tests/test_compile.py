"""nnc.compile: compiled == eager (forward, gradients, buffers), hooks, guards, fallbacks, and training curves."""
from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

import nnc
import runtime
from runtime import nn
import runtime.nn.functional as F

import models


def pair(module):
    """The module and an independent compiled copy of it (same initial weights)."""
    return module, nnc.compile(copy.deepcopy(module))


def assert_same_forward_and_grads(eager, compiled, *inputs, atol=1e-6):
    e_in = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    c_in = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    e_out, c_out = eager(*e_in), compiled(*c_in)
    e_out = e_out[0] if isinstance(e_out, tuple) else e_out
    c_out = c_out[0] if isinstance(c_out, tuple) else c_out
    rtol = 1e-9 if e_out.dtype is runtime.float64 else 1e-5
    np.testing.assert_allclose(c_out.detach().numpy(), e_out.detach().numpy(), atol=atol, rtol=rtol)
    seed = runtime.randn(*e_out.shape, dtype=e_out.dtype)
    e_out.backward(seed)
    c_out.backward(seed)
    for a, b in zip(c_in, e_in):
        if b.grad is not None:
            np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), atol=atol, rtol=rtol)
    for (name, p), q in zip(eager.named_parameters(), compiled.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            np.testing.assert_allclose(q.grad.numpy(), p.grad.numpy(), atol=atol, rtol=rtol, err_msg=name)


@pytest.mark.parametrize("name,shape", [("mlp", (8, 784)), ("cnn", (2, 1, 28, 28)), ("block", (2, 5, 32))])
def test_example_models_compile_to_the_same_results(name, shape):
    runtime.manual_seed(0)
    eager, compiled = pair(getattr(models, name))
    assert_same_forward_and_grads(eager, compiled, runtime.randn(*shape))


def test_state_dict_keys_and_tensors_are_the_originals():
    model = models.MLP()
    compiled = nnc.compile(model)
    assert list(compiled.state_dict()) == list(model.state_dict())
    assert all(a is b for a, b in zip(compiled.parameters(), model.parameters()))
    opt = runtime.optim.SGD(compiled.parameters(), lr=0.1)
    before = model.fc1.weight.detach().clone()
    loss = compiled(runtime.randn(4, 784)).sum()
    loss.backward()
    opt.step()
    assert not runtime.equal(model.fc1.weight, before)  # the optimizer on the compiled module moved the original


def test_training_curve_matches_eager_over_50_steps():
    runtime.manual_seed(1)
    eager = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))
    compiled = nnc.compile(copy.deepcopy(eager))
    data = runtime.randn(64, 20)
    target = runtime.randint(0, 4, (64,))
    curves = []
    for model in (eager, compiled):
        opt = runtime.optim.Adam(model.parameters(), lr=1e-2)
        losses = []
        for _ in range(50):
            opt.zero_grad()
            loss = F.cross_entropy(model(data), target)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        curves.append(np.array(losses))
    np.testing.assert_allclose(curves[1], curves[0], rtol=1e-4)
    assert curves[0][-1] < 0.5 * curves[0][0]


class ClassifierLoss(nn.Module):
    """A linear classifier with its cross-entropy (ignoring class 1) and a log_softmax output."""

    def __init__(self, reduction):
        super().__init__()
        self.fc = nn.Linear(6, 5)
        self.reduction = reduction

    def forward(self, x, target):
        logits = self.fc(x)
        loss = F.cross_entropy(logits, target, ignore_index=1, reduction=self.reduction)
        return loss, F.log_softmax(logits, dim=-1)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_fused_loss_ops_compile_into_primitive_kernels(reduction):
    """Eager runs log_softmax and nll_loss as fused ops; compiled, they are decomposed into kernels."""
    runtime.manual_seed(4)
    eager, compiled = pair(ClassifierLoss(reduction))
    x, target = runtime.randn(7, 6, dtype=runtime.float64), runtime.tensor([0, 1, 4, 2, 1, 3, 0])
    eager.double(), compiled.double()
    assert_same_forward_and_grads(eager, compiled, x, target, atol=1e-12)
    report = nnc.explain(ClassifierLoss(reduction).double(), x, target, backward=True)
    ops = {op for k in report.kernels + report.backward_kernels for op in k.ops}
    assert not ops & {"log_softmax", "log_softmax_backward", "nll_loss", "nll_loss_backward"}
    assert {"exp", "log", "gather"} <= ops


class RunningMean(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.register_buffer("mean", runtime.zeros(n))
        self.momentum = 0.1

    def forward(self, x):
        self.mean = self.momentum * x.mean(0) + (1 - self.momentum) * self.mean
        return x - self.mean


def test_buffer_mutation_matches_eager():
    eager = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU())
    compiled = nnc.compile(copy.deepcopy(eager))
    for _ in range(3):
        x = runtime.randn(6, 3)
        np.testing.assert_allclose(compiled(x).detach().numpy(), eager(x).detach().numpy(), atol=1e-6)
    bn = compiled.get_submodule("1")
    np.testing.assert_allclose(bn.running_mean.numpy(), eager[1].running_mean.numpy(), atol=1e-6)
    assert int(bn.num_batches_tracked) == 3


def test_running_mean_buffer_rebinding_like_eager():
    eager, compiled = RunningMean(3), nnc.compile(RunningMean(3))
    for _ in range(3):
        x = runtime.randn(5, 3)
        np.testing.assert_allclose(compiled(x).numpy(), eager(x).numpy(), atol=1e-6)


def test_hooks_fire_with_real_values_including_ones_added_after_compiling():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    compiled = nnc.compile(model)
    x = runtime.randn(2, 3)
    compiled(x)
    seen = []
    model[1].register_forward_hook(lambda m, args, out: seen.append(out.detach().clone()))
    out = compiled(x)
    assert len(seen) == 1 and tuple(seen[0].shape) == (2, 4)
    expected = model[1](model[0](x))
    np.testing.assert_allclose(seen[0].numpy(), expected.detach().numpy(), atol=1e-6)
    np.testing.assert_allclose(out.detach().numpy(), model(x).detach().numpy(), atol=1e-6)


def test_full_backward_hook_on_a_submodule_replaces_gradients():
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    compiled = nnc.compile(model)
    model[1].register_full_backward_hook(lambda m, gi, go: tuple(runtime.ones_like(g) * 42.0 for g in gi))
    x = runtime.randn(2, 3, requires_grad=True)
    compiled(x).sum().backward()
    expected = np.full((2, 4), 42.0, dtype=np.float32) @ model[0].weight.detach().numpy()
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-5)


def test_root_hooks_fire_on_the_compiled_module():
    model = nn.Linear(3, 2)
    compiled = nnc.compile(model)
    model.register_forward_hook(lambda m, args, out: out * 0)
    assert float(compiled(runtime.randn(4, 3)).abs().sum()) == 0


def test_guards_recompile_on_shape_dtype_training_and_python_args():
    class Scale(nn.Module):
        def forward(self, x, factor=2.0):
            return x * factor if self.training else x

    compiled = nnc.compile(Scale())
    compiled(runtime.ones(2))
    compiled(runtime.ones(2))
    assert len(compiled._cache) == 1
    compiled(runtime.ones(3))
    compiled(runtime.ones(3, dtype=runtime.float64))
    np.testing.assert_allclose(compiled(runtime.ones(3), 5.0).numpy(), np.full(3, 5.0))
    compiled.eval()
    np.testing.assert_allclose(compiled(runtime.ones(3), 5.0).numpy(), np.ones(3))
    assert compiled.compiled_variants == 5  # ones(3) made dim 0 symbolic: a dynamic variant


def test_recompile_limit_falls_back_to_eager_with_a_warning():
    compiled = nnc.compile(nn.Linear(2, 2), recompile_limit=2)
    compiled(runtime.ones(1, 2))
    compiled(runtime.ones(1, 1, 2))
    with pytest.warns(RuntimeWarning, match="recompile limit"):
        out = compiled(runtime.ones(1, 1, 1, 2))
    assert tuple(out.shape) == (1, 1, 1, 2)


def test_a_dimension_that_changes_size_compiles_once_more_with_the_size_symbolic():
    compiled = nnc.compile(nn.Linear(2, 2))
    model = compiled._module
    for batch in (1, 2, 3, 4, 2):
        x = runtime.randn(batch, 2)
        np.testing.assert_allclose(compiled(x).detach().numpy(), model(x).detach().numpy(), rtol=1e-6)
    assert compiled.compiled_variants == 2  # batch 1 static; batch 2 with the batch symbolic serves 3, 4 and 2
    assert compiled._dynamic_dims == {("input", 0): {0}}


def test_untraceable_code_falls_back_to_eager_with_a_warning():
    class DataDependent(nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x * 3

    compiled = nnc.compile(DataDependent())
    with pytest.warns(RuntimeWarning, match="could not compile"):
        out = compiled(runtime.ones(3))
    np.testing.assert_allclose(out.numpy(), np.full(3, 2.0))
    np.testing.assert_allclose(compiled(-runtime.ones(3)).numpy(), np.full(3, -3.0))


def test_dropout_in_training_stays_random_and_eval_is_identity():
    model = nn.Sequential(nn.Linear(50, 50), nn.Dropout(0.5))
    compiled = nnc.compile(model)
    x = runtime.randn(4, 50)
    a, b = compiled(x), compiled(x)
    assert not runtime.equal(a, b)
    model.eval()
    np.testing.assert_allclose(compiled(x).detach().numpy(), model(x).detach().numpy(), atol=1e-6)


def test_inference_under_no_grad_records_nothing():
    compiled = nnc.compile(models.MLP())
    with runtime.no_grad():
        out = compiled(runtime.randn(2, 784))
    assert out.grad_fn is None and not out.requires_grad


# -- differential testing on random programs -----------------------------------------------------------

UNARY = ["relu", "tanh", "sigmoid", "exp", "neg", "abs"]
BINARY = ["add", "sub", "mul", "maximum"]
REDUCE = ["sum", "mean", "amax", "logsumexp", "softmax", "layer_norm"]
# Shape-preserving rearrangements of a [4, 6] value: folded views, copies of permuted values, cats, gathers
REARRANGE = ["transpose_round_trip", "rotate_columns", "chunk_gate", "swap_row_pairs", "select_rows",
             "half_rows_scaled"]


@st.composite
def programs(draw):
    steps = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["unary", "binary", "reduce", "matmul", "rearrange", "no_grad", "custom",
                                     "keep"]))
        if kind in ("unary", "no_grad"):
            steps.append((kind, draw(st.sampled_from(UNARY))))
        elif kind == "binary":
            steps.append(("binary", draw(st.sampled_from(BINARY)), draw(st.booleans())))
        elif kind == "reduce":
            steps.append(("reduce", draw(st.sampled_from(REDUCE))))
        elif kind == "rearrange":
            steps.append(("rearrange", draw(st.sampled_from(REARRANGE))))
        elif kind in ("custom", "keep"):
            steps.append((kind,))
        else:
            steps.append(("matmul",))
    return steps


def rearranged(h, name, w):
    """One REARRANGE step on a [4, 6] value; `w` is a [6, 6] parameter a step may read a slice of."""
    if name == "transpose_round_trip":  # views only: fold into the next kernel
        return h.reshape(6, 4).t().t().reshape(4, 6)
    if name == "rotate_columns":  # a cat of two column slices (a cat kernel reading folded views)
        return runtime.cat([h[:, 2:], h[:, :2]], 1)
    if name == "chunk_gate":  # chunk: the backward lays the two slice gradients out with one cat
        a, b = h.chunk(2, dim=-1)
        return runtime.cat([a * b.sigmoid(), b + w[:3, :3].sum(0)], -1)
    if name == "swap_row_pairs":  # a reshape of a permuted value: a copy kernel
        return h.reshape(2, 2, 6).transpose(0, 1).reshape(4, 6)
    if name == "select_rows":  # an index_select: a gather kernel, a scatter in the backward
        return h.index_select(0, runtime.tensor([3, 0, 0, 2]))
    return runtime.cat([h[:2] * 2.0, h[2:]], 0)  # half_rows_scaled: a cat along dim 0


class HalfGradient(runtime.autograd.Function):
    """The identity whose backward halves the gradient: only its own backward gives these gradients."""

    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        return g * 0.5


class Program(nn.Module):
    """A random chain over a [4, 6] input: elementwise ops, broadcasts, reductions (row kernels among them),
    matmuls, views, cats and gathers, values made under no_grad, a custom autograd.Function, and values kept on
    the module (`self.kept = ...`, read back in the same forward: nnc.trace's set attributes)."""

    def __init__(self, steps):
        super().__init__()
        self.steps = steps
        self.w = nn.Parameter(runtime.randn(6, 6) * 0.3)
        self.b = nn.Parameter(runtime.randn(6) * 0.3)

    def forward(self, x):
        h = x
        for step in self.steps:
            if step[0] == "unary":
                h = getattr(h, step[1])() if step[1] != "exp" else (h * 0.3).exp()
            elif step[0] == "binary":
                other = self.b if step[2] else x
                h = getattr(runtime, step[1])(h, other)
            elif step[0] == "reduce":
                name = step[1]
                if name == "softmax":
                    h = h.softmax(-1)
                elif name == "layer_norm":
                    h = F.layer_norm(h, (6,), self.b + 1.0, self.b)
                elif name == "logsumexp":
                    h = h + h.logsumexp(-1, keepdim=True)
                else:
                    h = h - getattr(h, name)(-1, keepdim=True)
            elif step[0] == "rearrange":
                h = rearranged(h, step[1], self.w)
            elif step[0] == "no_grad":  # a factor without history: gradients flow through h only
                with runtime.no_grad():
                    factor = (h * 0.3).exp() if step[1] == "exp" else getattr(h, step[1])()
                h = h * factor + h
            elif step[0] == "custom":
                h = HalfGradient.apply(h)
            elif step[0] == "keep":
                self.kept = h.tanh()
                h = h + 0.5 * self.kept
            else:
                h = h @ self.w
        return h


def assert_same_kept(eager, compiled):
    """The value a Program keeps on itself, if any step keeps one: compiled equals eager, with its history."""
    if not hasattr(eager, "kept"):
        return
    kept = compiled.kept
    np.testing.assert_allclose(kept.detach().numpy(), eager.kept.detach().numpy(), rtol=1e-9, atol=1e-9)
    assert (kept.grad_fn is None) == (eager.kept.grad_fn is None)


@settings(max_examples=25, deadline=None)
@given(steps=programs())
@example(steps=[("keep",), ("matmul",), ("reduce", "softmax"), ("keep",)])  # kept twice, read back each time
def test_random_programs_compile_to_eager_results(steps):
    # NOTE: float64, so the comparison is tight: random chains amplify float32 rounding through cancellation
    runtime.manual_seed(0)
    eager = Program(steps).double()
    compiled = nnc.compile(copy.deepcopy(eager))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a silent fallback would hide a compiler bug here
        assert_same_forward_and_grads(eager, compiled, runtime.randn(4, 6, dtype=runtime.float64), atol=1e-9)
    assert_same_kept(eager, compiled)


@settings(max_examples=12, deadline=None)
@given(steps=programs())
@example(steps=[("unary", "tanh"), ("keep",), ("matmul",)])
def test_random_programs_in_whole_graph_mode_compute_eager_results(steps):
    runtime.manual_seed(0)
    eager = Program(steps).double()
    compiled = nnc.compile(copy.deepcopy(eager), whole_graph=True)
    x = runtime.randn(4, 6, dtype=runtime.float64)
    with warnings.catch_warnings(), runtime.no_grad():
        warnings.simplefilter("error")  # whole_graph=True warns when it is not used: that would fail here
        got, want = compiled(x), eager(x)
    (artifact,) = compiled._cache.values()
    assert artifact.forward_plan.whole_graph
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-9, atol=1e-9)
    assert_same_kept(eager, compiled)


def test_outputs_the_caller_holds_are_never_overwritten_and_dropped_ones_are_reused():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    compiled = nnc.compile(model)
    x1, x2 = runtime.randn(4, 8), runtime.randn(4, 8)
    with runtime.no_grad():
        first = compiled(x1)
        kept = first.numpy().copy()
        second = compiled(x2)
        np.testing.assert_array_equal(first.numpy(), kept)  # still the first call's values
        address = second.numpy().__array_interface__["data"][0]
        del second
        third = compiled(x1)
    assert third.numpy().__array_interface__["data"][0] == address  # the dropped buffer was reused
    np.testing.assert_array_equal(third.numpy(), kept)


def test_a_numpy_view_of_an_output_keeps_it_from_being_reused():
    """An aligned output is itself a view of a byte arena, and numpy points a view of a view at the owner: a kept
    `out.numpy().T` or `[:, 0]` held the arena, not the output array, which the next call then overwrote."""
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU())  # large enough for an aligned output
    compiled = nnc.compile(model, whole_graph=False)
    with runtime.no_grad():
        column = compiled(runtime.randn(2048, 8)).numpy()[:, 0]
        kept = column.copy()
        compiled(runtime.randn(2048, 8))
    np.testing.assert_array_equal(column, kept)


def test_outputs_saved_for_backward_are_not_reused_before_backward():
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
    eager, compiled = model, nnc.compile(copy.deepcopy(model))
    xs = [runtime.randn(4, 8) for _ in range(2)]
    losses = [compiled(x).sum() for x in xs]  # two graphs alive at once
    for loss in losses:
        loss.backward()
    for x in xs:
        eager(x).sum().backward()
    for p, q in zip(eager.parameters(), compiled.parameters()):
        np.testing.assert_allclose(q.grad.numpy(), p.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_relu_backward_mask_is_computed_in_the_matmul_epilogue():
    runtime.manual_seed(5)
    eager, compiled = pair(models.MLP())
    assert_same_forward_and_grads(eager, compiled, runtime.randn(4, 784))
    (artifact,) = compiled._cache.values()
    kernels = [step.kernel for step in artifact.backward_plan.steps if type(step).__name__ == "KernelStep"]
    assert any({"matmul", "gt", "where"} <= set(k.meta["ops"]) for k in kernels)
    assert not any(k.meta["ops"] == ["gt"] for k in kernels)


def test_view_nodes_between_kernels_fold_into_the_matmuls():
    runtime.manual_seed(3)
    eager, compiled = pair(models.MLP())
    assert_same_forward_and_grads(eager, compiled, runtime.randn(4, 784))
    (artifact,) = compiled._cache.values()
    kinds = {type(step).__name__ for step in artifact.backward_plan.steps}
    assert kinds == {"KernelStep"}  # the weight gradients' transposes are read by their matmuls
    assert sum(len(k.meta["views"]) for k in artifact.backward_plan.kernels) >= 3
    report = nnc.explain(models.MLP(), runtime.randn(4, 784), backward=True)
    assert not any(k.view for k in report.backward_kernels) and "(numpy view)" not in str(report)


def test_compiling_or_explaining_a_compiled_module_compiles_the_model_it_wraps():
    runtime.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    compiled = nnc.compile(model)
    x = runtime.randn(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no submodule falling back to eager
        report = nnc.explain(compiled, x)
        again = nnc.compile(compiled)
        out = again(x)
    assert report.graph_breaks == [] and next(again.parameters()) is model[0].weight
    np.testing.assert_allclose(out.detach().numpy(), model(x).detach().numpy(), rtol=1e-6)


class ReadsAnAttributeAndItsView(nn.Module):
    """A plain tensor attribute read first through a view (unsqueeze), then itself: both are captured constants."""

    def __init__(self):
        super().__init__()
        self.anchor = runtime.tensor([1.0, 2.0])

    def forward(self, x):
        y = x + self.anchor.unsqueeze(0)
        return y * 2 - self.anchor


def test_a_captured_tensor_and_its_view_captured_first_compile():
    """Compiling makes captured tensors read-only for a while; a view listed before its base was made writeable
    again first, which numpy refuses while the base is read-only, and the compile failed."""
    model = ReadsAnAttributeAndItsView()
    x = runtime.ones(3, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = nnc.compile(model)(x)
    np.testing.assert_array_equal(got.numpy(), model(x).numpy())
    assert model.anchor._data.flags.writeable
