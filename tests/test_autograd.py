"""Autograd semantics: backward, accumulation, hooks, grad modes, autograd.grad, Function, and torch's errors."""
from __future__ import annotations

import numpy as np
import pytest

import runtime
from runtime.autograd import Function, gradcheck

from helpers import needs_torch, torch

rng = np.random.default_rng(7)


def leaf(*shape, dtype=np.float64):
    return runtime.tensor(rng.standard_normal(shape).astype(dtype), requires_grad=True)


def test_scalar_backward_fills_leaf_grads():
    x = runtime.tensor([1.0, 2.0, 3.0], requires_grad=True)
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 4.0, 6.0])
    assert x.grad.grad_fn is None and not x.grad.requires_grad


def test_grads_accumulate_across_backward_calls():
    x = runtime.tensor([1.0, 2.0], requires_grad=True)
    (x * 3).sum().backward()
    (x * 3).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [6.0, 6.0])


def test_broadcast_gradients_are_unbroadcast():
    x, b = leaf(4, 3), leaf(3)
    (x + b).sum().backward()
    assert b.grad.shape == (3,)
    np.testing.assert_allclose(b.grad.numpy(), np.full(3, 4.0))
    c = leaf(4, 1)
    (x * c).sum().backward()
    np.testing.assert_allclose(c.grad.numpy(), x.detach().numpy().sum(1, keepdims=True))


def test_non_scalar_backward_needs_gradient_argument():
    x = leaf(3)
    y = x * 2
    with pytest.raises(RuntimeError, match="grad can be implicitly created only for scalar outputs"):
        y.backward()
    y.backward(runtime.tensor([1.0, 10.0, 100.0], dtype=runtime.float64))
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 20.0, 200.0])


def test_same_leaf_used_twice_gets_summed_gradient():
    x = leaf(3)
    (x * x + x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * x.detach().numpy() + 1)


def test_shared_gradient_buffers_are_not_aliased():
    a, b = leaf(3), leaf(3)
    (a + b).sum().backward()
    a.grad.add_(1.0)
    np.testing.assert_allclose(b.grad.numpy(), np.ones(3))


def test_retain_graph_allows_second_backward_and_default_frees():
    x = leaf(3)
    y = (x.exp() * x).sum()
    y.backward(retain_graph=True)
    first = x.grad.numpy().copy()
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * first)
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
        y.backward()


def test_graph_without_saved_tensors_can_backward_twice_like_torch():
    a, b = leaf(2), leaf(2)
    y = (a + b).sum()
    y.backward()
    y.backward()
    np.testing.assert_allclose(a.grad.numpy(), [2.0, 2.0])


def test_tensor_hook_can_replace_gradient_and_be_removed():
    x = leaf(3)
    y = x * 2
    seen = []
    handle = y.register_hook(lambda g: seen.append(g.numpy().copy()) or g * 10)
    y.sum().backward()
    np.testing.assert_allclose(seen[0], np.ones(3))
    np.testing.assert_allclose(x.grad.numpy(), np.full(3, 20.0))
    handle.remove()
    x.grad = None
    (x * 2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.full(3, 2.0))


def test_leaf_hook_runs_before_accumulation():
    x = leaf(2)
    x.register_hook(lambda g: g * 0 + 5)
    (x * 3).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [5.0, 5.0])


def test_retain_grad_keeps_non_leaf_gradient():
    x = leaf(3)
    y = x * 2
    y.retain_grad()
    z = y * y
    z.sum().backward()
    assert y.retains_grad
    np.testing.assert_allclose(y.grad.numpy(), 2 * y.detach().numpy())
    w = x * 3
    w.sum().backward()
    assert w.grad is None


def test_no_grad_enable_grad_and_set_grad_enabled():
    x = leaf(2)
    with runtime.no_grad():
        assert not runtime.is_grad_enabled()
        y = x * 2
        with runtime.enable_grad():
            z = x * 2
    assert runtime.is_grad_enabled()
    assert not y.requires_grad and y.grad_fn is None
    assert z.requires_grad
    with runtime.set_grad_enabled(False):
        assert not (x * 2).requires_grad
    assert runtime.is_grad_enabled()
    runtime.set_grad_enabled(False)
    assert not runtime.is_grad_enabled()
    runtime.set_grad_enabled(True)


def test_grad_modes_as_decorators():
    x = leaf(2)

    @runtime.no_grad()
    def f1():
        return x * 2

    @runtime.no_grad
    def f2():
        return x * 2

    @runtime.set_grad_enabled(False)
    def f3():
        return x * 2

    @runtime.enable_grad()
    def f4():
        return x * 2

    assert runtime.is_grad_enabled()
    assert not f1().requires_grad and not f2().requires_grad and not f3().requires_grad
    with runtime.no_grad():
        assert f4().requires_grad


@needs_torch
def test_inference_mode_is_reported_as_torch_reports_it(torch):
    def states(lib):
        seen = [lib.is_inference_mode_enabled()]
        with lib.inference_mode():
            seen += [lib.is_inference_mode_enabled(), lib.is_grad_enabled()]
            with lib.inference_mode(False):
                seen.append(lib.is_inference_mode_enabled())
            seen.append(lib.is_inference_mode_enabled())

        @lib.inference_mode()
        def decorated():
            return lib.is_inference_mode_enabled(), lib.is_grad_enabled()

        seen += [*decorated(), lib.is_inference_mode_enabled(), lib.is_grad_enabled()]
        return seen

    assert states(runtime) == states(torch) == [False, True, False, False, True, True, False, False, True]


def test_autograd_grad_returns_without_accumulating():
    x, w = leaf(3), leaf(3)
    y = (x * w).sum()
    gx, gw = runtime.autograd.grad(y, [x, w])
    np.testing.assert_allclose(gx.numpy(), w.detach().numpy())
    np.testing.assert_allclose(gw.numpy(), x.detach().numpy())
    assert x.grad is None and w.grad is None


def test_autograd_grad_unused_input():
    x, unused = leaf(2), leaf(2)
    y = (x * 2).sum()
    with pytest.raises(RuntimeError, match="appears to not have been used"):
        runtime.autograd.grad(y, [x, unused], retain_graph=True)
    gx, gu = runtime.autograd.grad(y, [x, unused], allow_unused=True)
    assert gu is None
    np.testing.assert_allclose(gx.numpy(), [2.0, 2.0])


def test_autograd_grad_of_non_leaf_input():
    x = leaf(3)
    h = x.exp()
    y = (h * h).sum()
    (gh,) = runtime.autograd.grad(y, h)
    np.testing.assert_allclose(gh.numpy(), 2 * h.detach().numpy())


def test_create_graph_gives_second_derivatives():
    x = runtime.tensor([0.5, -1.0, 2.0], dtype=runtime.float64, requires_grad=True)
    y = (x ** 3).sum()
    (g,) = runtime.autograd.grad(y, x, create_graph=True)
    assert g.requires_grad
    (gg,) = runtime.autograd.grad(g.sum(), x)
    np.testing.assert_allclose(gg.numpy(), 6 * x.detach().numpy())


def test_create_graph_through_saved_outputs():
    x = runtime.tensor([0.3, -0.7], dtype=runtime.float64, requires_grad=True)
    y = x.tanh().sum()
    (g,) = runtime.autograd.grad(y, x, create_graph=True)
    (gg,) = runtime.autograd.grad(g.sum(), x)
    t = np.tanh(x.detach().numpy())
    np.testing.assert_allclose(gg.numpy(), -2 * t * (1 - t * t))


def test_backward_inputs_argument_restricts_accumulation():
    a, b = leaf(2), leaf(2)
    (a * b).sum().backward(inputs=[a])
    assert b.grad is None
    np.testing.assert_allclose(a.grad.numpy(), b.detach().numpy())


class Exp(Function):
    @staticmethod
    def forward(ctx, x):
        result = x.exp()
        ctx.save_for_backward(result)
        return result

    @staticmethod
    def backward(ctx, grad_output):
        (result,) = ctx.saved_tensors
        return grad_output * result


class MulConstant(Function):
    @staticmethod
    def forward(ctx, x, constant):
        ctx.constant = constant
        return x * constant

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output * ctx.constant, None


def test_custom_function_forward_backward_and_name():
    x = leaf(3)
    y = Exp.apply(x)
    assert type(y.grad_fn).__name__ == "FunctionNode" and y.grad_fn.name() == "ExpBackward"
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.exp(x.detach().numpy()))
    assert gradcheck(lambda t: MulConstant.apply(Exp.apply(t), 2.5), [leaf(4)])


def test_custom_function_needs_input_grad_and_freed_context():
    seen = []

    class Probe(Function):
        @staticmethod
        def forward(ctx, a, b):
            seen.append(ctx.needs_input_grad)
            ctx.save_for_backward(a)
            return a * b

        @staticmethod
        def backward(ctx, g):
            (a,) = ctx.saved_tensors
            return g, g * a

    x, c = leaf(2), runtime.tensor([1.0, 2.0], dtype=runtime.float64)
    y = Probe.apply(x, c).sum()
    y.backward()
    assert seen == [(True, False)]
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.backward()


def test_custom_function_gets_zeros_for_an_output_without_gradient():
    """With materialize_grads (the default), an unused output's gradient arrives as zeros of its shape."""
    seen = []

    class SumAndDouble(Function):
        @staticmethod
        def forward(ctx, a):
            return a.sum(), a * 2

        @staticmethod
        def backward(ctx, g_sum, g_double):
            seen.append((g_sum.numpy().copy(), g_double.numpy().copy(), g_double.dtype))
            return g_sum.expand(3) + 2 * g_double

    x = runtime.tensor([1.0, 2.0, 3.0], requires_grad=True)
    total, _ = SumAndDouble.apply(x)
    total.backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.ones(3, np.float32))
    (g_sum, g_double, dtype), = seen
    assert g_sum == 1.0 and dtype is runtime.float32
    np.testing.assert_array_equal(g_double, np.zeros(3, np.float32))


def test_custom_function_wrong_gradient_count():
    class Bad(Function):
        @staticmethod
        def forward(ctx, a, b):
            return a + b

        @staticmethod
        def backward(ctx, g):
            return (g,)

    with pytest.raises(RuntimeError, match="incorrect number of gradients"):
        Bad.apply(leaf(2), leaf(2)).sum().backward()


def test_inplace_on_leaf_requiring_grad_is_an_error():
    x = leaf(3)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        x.add_(1)
    with runtime.no_grad():
        x.add_(1)  # allowed: optimizers update parameters this way


def test_modifying_a_saved_tensor_is_detected():
    x = leaf(3)
    h = x * 1
    y = (h * h).sum()
    h.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_inplace_on_non_leaf_is_differentiated():
    x = leaf(3)
    h = x * 2
    h.mul_(x)  # h = 2x * x
    h.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 4 * x.detach().numpy())


def test_setitem_records_gradients():
    x, v = leaf(4), leaf(2)
    h = x * 1
    h[1:3] = v * 3
    h.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.0, 0.0, 0.0, 1.0])
    np.testing.assert_allclose(v.grad.numpy(), [3.0, 3.0])


def test_views_share_memory_and_version():
    base = runtime.zeros(2, 3)
    row = base[0]
    row.fill_(7.0)
    np.testing.assert_allclose(base.numpy()[0], np.full(3, 7.0))
    assert base._version == row._version > 0


def test_detach_shares_memory_and_stops_gradient():
    x = leaf(3)
    d = x.detach()
    assert not d.requires_grad and np.shares_memory(d.numpy(), x.detach().numpy())
    y = (x * d).sum()
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), d.numpy())


def test_requires_grad_only_on_floating_leaves():
    with pytest.raises(RuntimeError, match="floating point"):
        runtime.tensor([1, 2]).requires_grad_()
    x = leaf(2)
    with pytest.raises(RuntimeError, match="leaf variables"):
        (x * 2).requires_grad = False


def test_int_outputs_do_not_require_grad():
    x = leaf(4)
    assert not x.argmax().requires_grad
    assert not (x > 0).requires_grad


def test_grad_fn_names_and_next_functions():
    x = leaf(2)
    y = x + 1
    assert repr(y).endswith("grad_fn=<AddBackward0>)")
    z = y * y
    node, _ = z.grad_fn.next_functions[0]
    assert node is y.grad_fn
    acc, _ = y.grad_fn.next_functions[0]
    assert type(acc).__name__ == "AccumulateGrad" and acc.variable is x


@needs_torch
def test_mixed_expression_gradients_match_torch():
    data = [rng.standard_normal(s) for s in [(4, 3), (3, 5), (5,)]]
    ours = [runtime.tensor(d, requires_grad=True) for d in data]
    theirs = [torch.tensor(d, requires_grad=True) for d in data]

    def f(lib, x, w, b):
        h = (x @ w + b).tanh()
        return (lib.log_softmax(h, 1)[:, 1:].sum() + h.amax(0).mean() + (h * h).var(0).sum()
                + h.clamp(-0.5, 0.5).std() + lib.where(h > 0, h, h * 0.1).sum())

    f(runtime, *ours).backward()
    f(torch, *theirs).backward()
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-10, atol=1e-12)


def _address(array) -> int:
    return array.__array_interface__["data"][0]


def test_an_unshared_gradient_becomes_grad_without_a_copy():
    made = []

    class Double(runtime.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            out = g * 2.0
            made.append(_address(out.numpy()))  # the address only: holding the array would make it shared
            return out

    x = runtime.randn(1000, requires_grad=True)
    Double.apply(x).sum().backward()
    assert _address(x.grad.numpy()) == made[-1]
    np.testing.assert_array_equal(x.grad.numpy(), np.full(1000, 2.0, np.float32))


def test_a_gradient_someone_else_holds_is_copied():
    a, b = runtime.randn(4, requires_grad=True), runtime.randn(4, requires_grad=True)
    (a + b).backward(runtime.ones(4))  # one gradient tensor reaches both leaves
    assert not np.shares_memory(a.grad.numpy(), b.grad.numpy())
    a.grad.numpy()[:] = 7.0
    np.testing.assert_array_equal(b.grad.numpy(), np.ones(4, np.float32))
    x = runtime.randn(4, requires_grad=True)
    seed = runtime.ones(4)
    x.backward(seed)  # the caller keeps `seed`
    seed.mul_(5.0)
    np.testing.assert_array_equal(x.grad.numpy(), np.ones(4, np.float32))


def test_a_leaf_gradient_is_accumulated_as_soon_as_it_is_complete():
    # torch gives AccumulateGrad the highest priority, so .grad (and DDP's all-reduce) need not wait for the rest of
    # backward: w's accumulator, made before the ops below, still runs before the nodes that compute h's gradient
    w, a = runtime.randn(3, requires_grad=True), runtime.randn(3, requires_grad=True)
    keep = w * 1.0  # noqa: F841  (keeps w's accumulator alive, so it is older than every node below)
    order = []
    h = a * 2.0
    h.register_hook(lambda g: order.append("h"))
    w.register_hook(lambda g: order.append("w"))
    (h.sum() * w).sum().backward()
    assert order == ["w", "h"]


def test_post_accumulate_grad_hooks_step_each_parameter_during_backward():
    """The optimizer-in-backward pattern: each parameter steps (and frees its gradient) as soon as its gradient is
    accumulated, eagerly and through a compiled module alike, with the weights a separate step would give."""
    import copy

    import nnc

    model, x = runtime.nn.Linear(3, 2), runtime.randn(4, 3)
    reference = copy.deepcopy(model)
    opt = runtime.optim.SGD(reference.parameters(), lr=0.1)
    reference(x).square().sum().backward()
    opt.step()
    for module in (copy.deepcopy(model), nnc.compile(copy.deepcopy(model))):
        optimizers = {p: runtime.optim.SGD([p], lr=0.1) for p in module.parameters()}
        stepped = []

        def step(p, optimizers=optimizers, stepped=stepped):
            stepped.append(p)
            optimizers[p].step()
            optimizers[p].zero_grad()

        for p in module.parameters():
            p.register_post_accumulate_grad_hook(step)
        module(x).square().sum().backward()
        assert len(stepped) == 2 and all(p.grad is None for p in module.parameters())
        for got, want in zip(module.parameters(), reference.parameters()):
            np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-6)
    with pytest.raises(RuntimeError, match="non-leaf"):
        (x.requires_grad_() * 2).register_post_accumulate_grad_hook(lambda t: None)


@needs_torch
def test_a_gradient_penalty_through_relu_and_max_pooling_gives_torchs_gradients():
    """R1 / WGAN-GP: the gradient of a critic's output with respect to its input, differentiated again. Where a
    rule reads its saved tensors only through masks (relu, max pooling), torch's result still depends on them with a
    zero derivative: the biases get zero gradients, not None (Adam then steps them too), and max pooling's double
    backward reaches the layers after it."""
    rng = np.random.default_rng(0)
    x0, w1, b1, w2 = rng.standard_normal((2, 1, 6, 6)), rng.standard_normal((3, 1, 3, 3)), \
        rng.standard_normal(3), rng.standard_normal((1, 12))
    results = []
    for lib in (runtime, torch):
        F = lib.nn.functional
        conv_w, conv_b, fc = (lib.tensor(v, requires_grad=True) for v in (w1, b1, w2))
        x = lib.tensor(x0, requires_grad=True)
        hidden = F.max_pool2d(F.leaky_relu(F.conv2d(x, conv_w, conv_b), 0.2), 2)
        score = (F.relu(hidden.flatten(1)) @ fc.T).sum()
        (gx,) = lib.autograd.grad(score, x, create_graph=True)
        (gx.pow(2).sum() * 0.5).backward()
        results.append([gx.detach().numpy()] + [t.grad.numpy() if t.grad is not None else None
                                                for t in (conv_w, conv_b, fc)])
    for ours, theirs in zip(*results):
        assert ours is not None
        np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-12)


def test_grads_batched_stack_one_gradient_per_cotangent(torch):
    """is_grads_batched=True (a Jacobian in one call: grad_outputs = eye) was ignored and raised a shape error."""
    results = []
    for lib in (runtime, torch):
        x = lib.tensor([1.0, 2.0, -0.5], dtype=lib.float64, requires_grad=True)
        (g,) = lib.autograd.grad((x ** 3).sum(), x, create_graph=True)
        jacobian = lib.autograd.grad(x.sin() * x, x, lib.eye(3, dtype=lib.float64), is_grads_batched=True)[0]
        hessian = lib.autograd.grad(g, x, lib.eye(3, dtype=lib.float64), is_grads_batched=True)[0]
        results.append((jacobian.numpy(), hessian.detach().numpy()))
    for ours, theirs in zip(*results):
        np.testing.assert_allclose(ours, theirs, rtol=1e-12)
