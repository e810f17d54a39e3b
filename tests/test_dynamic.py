"""Dynamic sizes: symbolic sizes (nnc.symbolic), kernels that take sizes as arguments, and the compiled module's
policy (automatic dynamic on a size change, dynamic=True, nnc.mark_dynamic), compiled against eager."""
from __future__ import annotations

import contextlib
import copy
import math
import operator
import warnings

import numpy as np
import pytest
from hypothesis import given, strategies as st

import nnc
import runtime
from nnc.symbolic import ShapeEnv, SymInt, evaluate, provably
from runtime import nn

import real_models
from helpers import run_in_threads

# -- the polynomials ---------------------------------------------------------------------------------------------


_OPS_TESTED = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne, ">": operator.gt,
               ">=": operator.ge}


def _env(*hints):
    env = ShapeEnv()
    return env, [env.symbol(h, f"x's dim {k}") for k, h in enumerate(hints)]


def test_arithmetic_is_normalized_and_constants_are_plain_ints():
    env, (a, b) = _env(5, 3)
    assert a * 64 - 64 * a == 0 and type(a * 64 - 64 * a) is int
    assert isinstance(a * b, SymInt) and a * b == b * a and a + b - a == b
    assert (8 * a) // 4 == 2 * a and (6 * a + 3) % 3 == 0
    assert not env.guards  # decided by the polynomials themselves


def test_a_product_divides_by_a_factor_that_is_a_sum_of_terms():
    env, (n, h, w) = _env(2, 20, 13)
    positions = ((h - 1) // 2 + 1) * ((w + 1) // 2)  # a strided convolution's output positions
    assert (n * positions) // positions == n and (n * positions + positions) % positions == 0
    assert (h * h - 1) // (h - 1) == h + 1
    assert not env.guards and not env.pinned
    assert (h * h + 1) % (h - 1) == 2 and set(env.pinned) == {"S1"}  # no quotient: pinned, and right


def test_what_the_polynomial_decides_records_no_guard():
    env, (a, b) = _env(5, 3)
    assert a != 1 and a >= 2 and a * b - a > 0 and a * b != a and not a < 0 and -4 * a < 0
    assert provably(a * b, ">=", 2 * a) and not provably(a, "<", 10)
    assert not env.guards


def test_an_undecided_comparison_is_answered_by_the_hint_and_guarded():
    env, (a,) = _env(5)
    assert a < 10
    check = env.guard_function()
    assert check((7,)) and not check((10,)) and not check((1,))  # sizes 0 and 1 are never dynamic


def test_using_a_symbol_as_a_plain_int_pins_it():
    env, (a, b) = _env(5, 3)
    assert operator.index(a) == 5 and np.zeros(b).shape == (3,)
    assert set(env.pinned) == {"S0", "S1"} and "test_dynamic.py" in env.pinned["S0"]
    check = env.guard_function()
    assert check((5, 3)) and not check((6, 3)) and not check((5, 4))


def test_an_equality_guard_makes_later_arithmetic_use_the_value():
    env, (a, b) = _env(5, 8)
    assert b == 8  # undecided: a guard, and b is 8 from now on
    assert type(b * 2 - 16) is int and (a * b) // 8 == a


@given(st.lists(st.integers(-3, 3), min_size=3, max_size=3), st.integers(1, 7), st.integers(2, 40),
       st.integers(2, 40))
def test_evaluation_matches_python_on_the_same_values(coefficients, divisor, x, y):
    env, (a, b) = _env(5, 3)
    c0, c1, c2 = coefficients
    value = c0 * a * b + c1 * a + c2 + b
    expressions = [value, value // divisor, value % divisor, (a + divisor) // divisor * b]
    want = [c0 * x * y + c1 * x + c2 + y, (c0 * x * y + c1 * x + c2 + y) // divisor,
            (c0 * x * y + c1 * x + c2 + y) % divisor, (x + divisor) // divisor * y]
    assert [evaluate(e, {"S0": x, "S1": y}) for e in expressions] == want


@given(st.lists(st.integers(-3, 3), min_size=3, max_size=3), st.integers(2, 5), st.sampled_from(list(_OPS_TESTED)),
       st.integers(-4, 4))
def test_every_decision_holds_for_every_size_its_guards_admit(coefficients, divisor, op, offset):
    # a quotient of a value that may be negative is negative too: decided as if it were not, a bin's end of an
    # adaptive pooling came out wrong (compiled output inf) with no guard to catch it
    env, (a, b) = _env(7, 3)
    c0, c1, c2 = coefficients
    quotient = (c0 * a * b + c1 * a + c2 * b) // divisor
    answer = _OPS_TESTED[op](quotient + offset, 0)
    check = env.guard_function()
    for x in range(2, 12):
        for y in range(2, 12):
            if check((x, y)):
                value = (c0 * x * y + c1 * x + c2 * y) // divisor + offset
                assert _OPS_TESTED[op](value, 0) == answer, (x, y)


def test_sizes_put_into_generated_expressions_stay_one_operand():
    from nnc.codegen.indexing import emit_offsets

    env, (a, b) = _env(5, 3)
    values = {"S0": 5, "S1": 3}
    for size in (2 * a, a * b, -a, a + 1, (8 * a) // 3):
        assert [eval(f"{o} // {size} * {size} + {o} % {size}", values) for o in (0, 7, 40)] == [0, 7, 40]
    # the flat-index digits of an attention score [3, 2, T, T] read against a [3, 1, 1, T] mask: `o // 2*S0`
    # once divided by 2 and multiplied by S0, so a kernel wrote far past its rows
    shape, strides = (3, 2 * a, a), [(2 * a * a, a, 1), (a, 0, 1)]  # the scores, and the mask broadcast to them
    lines, (at_scores, at_mask) = emit_offsets(shape, strides, "o", "o_")
    concrete = evaluate((shape, strides), values)
    for o in range(math.prod(concrete[0])):
        scope = dict(values, o=o)
        exec("\n".join(lines), {}, scope)
        digits = np.unravel_index(o, concrete[0])
        assert eval(at_scores, {}, scope) == sum(d * st for d, st in zip(digits, concrete[1][0]))
        assert eval(at_mask, {}, scope) == sum(d * st for d, st in zip(digits, concrete[1][1]))


def test_evaluate_reaches_into_attributes():
    env, (a,) = _env(5)
    attrs = {"shape": (2, a, a * 3), "key": (("slice", None, a - 1, None),), "index": slice(0, a)}
    assert evaluate(attrs, {"S0": 9}) == {"shape": (2, 9, 27), "key": (("slice", None, 8, None),),
                                          "index": slice(0, 9)}


# -- compiled with symbolic sizes against eager -------------------------------------------------------------------


class Reshaping(nn.Module):
    """Python on sizes, views by them, a softmax over a dynamic dim and a matmul: what attention does."""

    def __init__(self, features=6):
        super().__init__()
        self.proj = nn.Linear(features, features)

    def forward(self, x):
        b, t, c = x.size()
        y = self.proj(x).view(b, t, 2, c // 2).transpose(1, 2)        # (b, 2, t, c/2)
        scores = (y @ y.transpose(-2, -1)) * (1.0 / (c // 2) ** 0.5)    # (b, 2, t, t)
        mask = runtime.tril(runtime.ones(t, t)).view(1, 1, t, t)
        scores = scores.masked_fill(mask == 0, float("-inf")).softmax(-1)
        out = (scores @ y).transpose(1, 2).contiguous().view(b, t, c)
        return (out + x).relu().sum(-1)[:, : t - 1]


def _outputs_and_grads(model, x):
    x.requires_grad_(True)  # the same tensor (nnc.mark_dynamic marks an object)
    x.grad = None
    out = model(x)
    (out * runtime.arange(out.numel()).view(out.shape).to(out.dtype)).sum().backward()
    grads = [x.grad.numpy().copy()] + [p.grad.numpy().copy() for p in model.parameters()]
    model.zero_grad()
    return out.detach().numpy().copy(), grads


def _assert_same(compiled, model, x):
    got, got_grads = _outputs_and_grads(compiled, x)
    want, want_grads = _outputs_and_grads(model, x)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    for g, w in zip(got_grads, want_grads):
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12)


def test_one_variant_serves_every_length_forward_and_backward():
    runtime.manual_seed(0)
    model = Reshaping().double()
    compiled = nnc.compile(copy.deepcopy(model), dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for b, t in [(2, 5), (3, 9), (2, 2), (4, 17), (2, 5)]:
            _assert_same(compiled, model, runtime.randn(b, t, 6, dtype=runtime.float64))
    assert compiled.compiled_variants == 1
    (variants,) = compiled._dynamic_variants.values()
    assert [s.source for s in variants[0].shape_env.symbols] == ["x's dim 0", "x's dim 1", "x's dim 2"]


def test_kernels_take_the_sizes_as_arguments():
    model = Reshaping()
    compiled = nnc.compile(model, dynamic=True)
    compiled(runtime.randn(2, 5, 6))
    (variants,) = compiled._dynamic_variants.values()
    sources = [k.meta.get("source", "") for plan in variants[0].plans for k in plan.kernels]
    symbolic = [s for s in sources if "def launch(ins, outs, sizes):" in s]
    assert symbolic and all("S1 = sizes[1]" in s or "S0 = sizes[0]" in s for s in symbolic)


def test_a_size_change_compiles_one_symbolic_variant_automatically():
    runtime.manual_seed(0)
    model = Reshaping().double()
    compiled = nnc.compile(copy.deepcopy(model))
    for t in (4, 6, 3, 11, 4):
        _assert_same(compiled, model, runtime.randn(2, t, 6, dtype=runtime.float64))
    assert compiled.compiled_variants == 2  # length 4 static, then one with the length symbolic
    assert compiled._dynamic_dims == {("x", 0): {1}}


def test_sizes_zero_and_one_are_compiled_apart():
    runtime.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh()).double()
    compiled = nnc.compile(copy.deepcopy(model), dynamic=True)
    for batch in (5, 1, 0, 7):
        _assert_same(compiled, model, runtime.randn(batch, 3, dtype=runtime.float64))
    assert compiled.compiled_variants == 3  # batch >= 2 symbolic, then 1 and 0 on their own


def test_mark_dynamic_makes_a_dimension_symbolic_from_the_first_call():
    runtime.manual_seed(0)
    model = Reshaping().double()
    compiled = nnc.compile(copy.deepcopy(model))
    first = runtime.randn(2, 5, 6, dtype=runtime.float64)
    nnc.mark_dynamic(first, 1)
    _assert_same(compiled, model, first)
    for t in (3, 8):
        _assert_same(compiled, model, runtime.randn(2, t, 6, dtype=runtime.float64))
    assert compiled.compiled_variants == 1
    with pytest.raises(IndexError, match="out of range"):
        nnc.mark_dynamic(first, 3)


def test_dynamic_false_compiles_static_sizes_only():
    model = nn.Linear(2, 2)
    compiled = nnc.compile(model, dynamic=False)
    for batch in (2, 3, 4):
        x = runtime.randn(batch, 2)
        with contextlib.nullcontext() if batch < 4 else pytest.warns(RuntimeWarning, match="dynamic=False"):
            out = compiled(x)
        np.testing.assert_allclose(out.detach().numpy(), model(x).detach().numpy(), rtol=1e-6)
    assert compiled.compiled_variants == 2 and not compiled._dynamic_variants  # the third size ran eagerly


class Branchy(nn.Module):
    """Python branching on a size: a guard, so sizes on the other side get a variant of their own."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        y = self.proj(x)
        return y.tanh() if x.size(0) > 6 else y.sigmoid() * 2


def test_a_guard_that_fails_compiles_a_variant_for_the_other_side():
    runtime.manual_seed(0)
    model = Branchy().double()
    compiled = nnc.compile(copy.deepcopy(model), dynamic=True)
    for batch in (3, 5, 9, 12, 4):
        _assert_same(compiled, model, runtime.randn(batch, 4, dtype=runtime.float64))
    assert compiled.compiled_variants == 2
    guards = [v.shape_env.guard_source() for found in compiled._dynamic_variants.values() for v in found]
    assert any("(S0 - 6) <= 0" in g for g in guards) and any("(S0 - 6) > 0" in g for g in guards), guards


class UnrolledOverTime(nn.Module):
    """A Python loop over the length: the length is pinned (the graph's size depends on it)."""

    def __init__(self):
        super().__init__()
        self.cell = nn.Linear(3, 3)

    def forward(self, x):
        h = x[:, 0]
        for t in range(1, x.shape[1]):
            h = self.cell(h).tanh() + x[:, t]
        return h


def test_a_pinned_size_falls_back_to_static_variants_and_stays_right():
    runtime.manual_seed(0)
    model = UnrolledOverTime().double()
    compiled = nnc.compile(copy.deepcopy(model), dynamic=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for t in (3, 4, 5, 3, 6):
            _assert_same(compiled, model, runtime.randn(2, t, 3, dtype=runtime.float64))
    assert compiled._pinned_dims == {("x", 0): {1}} and compiled._dynamic_dims == {("x", 0): {0, 2}}
    assert compiled.compiled_variants == 2  # lengths 3 and 4; the third and fourth lengths ran eagerly
    said = [w for w in caught if "third size" in str(w.message)]
    assert len(said) == 1 and "x's dim 1" in str(said[0].message) and said[0].filename == __file__  # at the caller


def test_threads_calling_one_variant_with_different_sizes():
    runtime.manual_seed(0)
    model = Reshaping().double().eval()
    compiled = nnc.compile(copy.deepcopy(model), dynamic=True)
    inputs = [runtime.randn(2, t, 6, dtype=runtime.float64) for t in (3, 5, 7, 9)]
    with runtime.no_grad():
        compiled(inputs[0])
        want = [model(x).numpy() for x in inputs]
    def worker(k):
        for _ in range(20):
            with runtime.no_grad():
                got = compiled(inputs[k]).numpy()
            np.testing.assert_allclose(got, want[k], rtol=1e-9, atol=1e-12)

    run_in_threads(worker, len(inputs))
    assert compiled.compiled_variants == 1


# -- real models --------------------------------------------------------------------------------------------------


def test_gpt_trains_compiled_as_eager_over_changing_lengths():
    runtime.manual_seed(0)
    config = real_models.GPTConfig(n_layer=1)
    model = real_models.GPT(config).double()
    compiled = nnc.compile(copy.deepcopy(model))
    opts = [runtime.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (compiled, model)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for length in (5, 7, 6, 9):
            idx = runtime.randint(0, config.vocab_size, (2, length))
            targets = runtime.randint(0, config.vocab_size, (2, length))
            losses = []
            for m, opt in zip((compiled, model), opts):
                opt.zero_grad()
                _, loss = m(idx, targets)
                loss.backward()
                losses.append(loss.item())
                opt.step()
            assert losses[0] == pytest.approx(losses[1], rel=1e-9)
    for got, want in zip(compiled.parameters(), model.parameters()):
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-9, atol=1e-12)
    assert compiled.compiled_variants == 2


def test_generating_a_hundred_tokens_compiles_twice_and_matches_eager():
    runtime.manual_seed(0)
    config = real_models.GPTConfig(n_layer=1, block_size=128)
    model = real_models.GPT(config).eval()
    compiled = nnc.compile(copy.deepcopy(model))
    runtime.manual_seed(1)
    want = model.generate(runtime.zeros(1, 1, dtype=runtime.int64), 100)
    runtime.manual_seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = compiled.generate(runtime.zeros(1, 1, dtype=runtime.int64), 100)
    assert got.tolist() == want.tolist()
    assert compiled.compiled_variants == 2 and not compiled._dynamic_failed


def test_lstm_language_model_with_a_changing_batch():
    runtime.manual_seed(0)
    model = real_models.RNNModel().double()
    compiled = nnc.compile(copy.deepcopy(model))
    for batch in (3, 4, 6):
        tokens = runtime.randint(0, 50, (5, batch))
        hidden = model.init_hidden(batch)
        hidden = tuple(h.double() for h in hidden) if isinstance(hidden, tuple) else hidden.double()
        got, _ = compiled(tokens, hidden)
        want, _ = model(tokens, hidden)
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-9, atol=1e-12)
    assert compiled.compiled_variants == 2


def test_explain_shows_the_symbols_and_guards_of_marked_dims():
    x = runtime.randn(2, 5, 6)
    nnc.mark_dynamic(x, 1)
    text = str(nnc.explain(Reshaping(), x))
    assert "symbolic sizes:" in text and "S0 = x's dim 1 (compiled at 5)" in text
    assert "symbolic sizes" not in str(nnc.explain(Reshaping(), runtime.randn(2, 5, 6)))


@pytest.mark.parametrize("seed", range(12))
def test_random_mutation_programs_with_dynamic_batch_sizes_match_static_compiles(seed):
    """tools/fuzz_mutation.py --dynamic runs thousands of these; generated kernels for one (numba compiles are slow)."""
    from mutation_programs import random_case, run_dynamic_case

    assert run_dynamic_case(random_case(seed), codegen=seed == 0) == []


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(1, 4, 3), nn.Conv2d(4, 6, 3, padding=1)

    def forward(self, x):
        x = runtime.nn.functional.max_pool2d(self.c2(self.c1(x).relu()).relu(), 2)
        return x.flatten(1).sum(1)


def test_convolutions_and_pooling_take_a_symbolic_batch():
    runtime.manual_seed(0)
    _one_symbolic_batch_variant(SmallCNN().double(), (4, 6, 3, 5), 1, 12, 12)  # window kernels, none interpreted


class PoolingCNN(nn.Module):
    """Strided, dilated and padded windows, overlapping max pooling, average pooling with padding and adaptive
    pooling to bins that do not divide the size: the geometry of every window kernel over symbolic sizes."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(2, 4, 3, stride=2, padding=1)
        self.c2 = nn.Conv2d(4, 4, 3, dilation=2, padding=2)
        self.up = nn.ConvTranspose2d(4, 3, 4, stride=2, padding=1)

    def forward(self, x):
        f = runtime.nn.functional
        h = f.max_pool2d(self.c1(x).relu(), 3, stride=2, padding=1)
        h = f.avg_pool2d(self.c2(h).tanh(), 3, stride=1, padding=1)
        return self.up(h).flatten(1).sum(1) + f.adaptive_avg_pool2d(h, (2, 3)).flatten(1).sum(1)


def test_image_sizes_are_symbolic_in_window_kernels():
    runtime.manual_seed(0)
    model = PoolingCNN().double()
    compiled = nnc.compile(copy.deepcopy(model))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing run eagerly: a third size is served by a symbolic variant
        for height, width in [(12, 12), (16, 13), (11, 20), (19, 15), (12, 12), (14, 22)]:
            _assert_same(compiled, model, runtime.randn(2, 2, height, width, dtype=runtime.float64))
    assert compiled._dynamic_dims == {("x", 0): {2, 3}} and compiled.compiled_variants <= 4
    assert "S0" in _symbolic_sources(compiled)


def test_adaptive_pooling_over_a_symbolic_length_that_its_bins_do_not_divide():
    # its bins end at -((-(j + 1) * n) // k): a quotient of a negative value, once taken to be >= 0 (output inf)
    model = nn.AdaptiveAvgPool1d(2)
    compiled = nnc.compile(copy.deepcopy(model))
    for length in (16, 21, 23, 25, 20):
        _assert_same(compiled, model, runtime.randn(2, 3, length, dtype=runtime.float64))


class MasksFromRuntimeHelpers(nn.Module):
    """Masks runtime builds inside its own code from a symbolic length: Transformer's square subsequent mask, a
    causal attention's, and MultiheadAttention's float mask from a bool padding mask."""

    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(4, 2, batch_first=True)

    def forward(self, x, pad):
        t = x.shape[1]
        scores = (x @ x.transpose(1, 2) + nn.Transformer.generate_square_subsequent_mask(t)).softmax(-1)
        causal = runtime.nn.functional.scaled_dot_product_attention(x, x, x, is_causal=True)
        return scores @ x + causal + self.mha(x, x, x, key_padding_mask=pad, need_weights=False)[0]


def test_masks_runtime_builds_from_a_symbolic_length_keep_it_symbolic():
    runtime.manual_seed(0)
    model = MasksFromRuntimeHelpers()
    compiled = nnc.compile(copy.deepcopy(model))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a length pinned by a factory would run the third length eagerly
        for t in (8, 6, 5, 9):
            x = runtime.randn(2, t, 4)
            pad = runtime.arange(t).expand(2, t) >= runtime.tensor([[t - 1], [t - 2]])
            got, want = compiled(x, pad), model(x, pad)
            np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert compiled.compiled_variants == 2


class Unpooling(nn.Module):
    """Max pooling with indices and MaxUnpool2d, a scatter whose grids of positions once were numpy constants."""

    def __init__(self):
        super().__init__()
        self.pool, self.unpool = nn.MaxPool2d(2, 2, return_indices=True), nn.MaxUnpool2d(2, 2)

    def forward(self, x):
        return self.unpool(*self.pool(x))


def test_max_unpooling_takes_a_symbolic_batch():
    runtime.manual_seed(0)
    _one_symbolic_batch_variant(Unpooling(), (4, 6, 3, 5), 2, 8, 8)


def _one_symbolic_batch_variant(model, batches, *rest):
    """A compiled copy of `model` checked against eager on inputs of shape (batch, *rest) for each batch, with no
    warning (nothing interpreted or run eagerly): the first batch static, then one variant with it symbolic."""
    compiled = nnc.compile(copy.deepcopy(model))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for batch in batches:
            _assert_same(compiled, model, runtime.randn(batch, *rest, dtype=runtime.float64))
    assert compiled.compiled_variants == 2 and compiled._dynamic_dims == {("x", 0): {0}}
    return compiled


def _symbolic_sources(compiled) -> str:
    (variants,) = compiled._dynamic_variants.values()
    return "".join(k.meta.get("source", "") for plan in variants[0].plans for k in plan.kernels)


class SizesAsScalars(nn.Module):
    """A symbolic size used as a number in tensor arithmetic: means over the batch, a loss's mean, `* x.shape[0]`."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(3, 4)

    def forward(self, x):
        h = self.proj(x)
        scaled = h.mean(0) * x.shape[0] + h.sum(0) / (2 * x.shape[0] - 1)
        return runtime.nn.functional.mse_loss(h, x.sum(1, keepdim=True).expand_as(h) * 0.5) + scaled.sum()


def test_sizes_as_numbers_in_tensor_arithmetic_stay_symbolic():
    runtime.manual_seed(0)
    model = SizesAsScalars().double()
    compiled = _one_symbolic_batch_variant(model, (4, 6, 3, 9), 3)
    assert "np.float64(S0)" in _symbolic_sources(compiled)  # the batch size reaches the kernels as an argument
    with runtime.no_grad():  # inference runs as one function over the same symbols
        for batch in (5, 8):
            x = runtime.randn(batch, 3, dtype=runtime.float64)
            np.testing.assert_allclose(compiled(x).numpy(), model(x).numpy(), rtol=1e-12)


class LikeFactories(nn.Module):
    """New tensors shaped like a value of symbolic sizes: a target of ones, masks and fills."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(3, 4)

    def forward(self, x):
        h = self.proj(x)
        loss = runtime.nn.functional.binary_cross_entropy_with_logits(h, runtime.ones_like(h))
        filled = runtime.full_like(h, 0.25) + runtime.zeros_like(h, dtype=runtime.float64)
        return loss + (h * filled).sum(1)


def test_like_factories_of_symbolic_values_are_graph_nodes():
    runtime.manual_seed(0)
    _one_symbolic_batch_variant(LikeFactories().double(), (4, 6, 3, 9), 3)


class Reversals(nn.Module):
    """flip and cumsum (whose gradient is a reversed cumsum) over a dimension of symbolic size."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(3, 4)

    def forward(self, x):
        h = self.proj(x)
        similar = runtime.nn.functional.cosine_similarity(h, h.flip(0), dim=1)
        return similar + h.cumsum(0).flip(1).sum(1) + h[:, 1:].flip(0, 1).mean(1)


def test_flips_and_cumsums_over_symbolic_sizes_compile():
    runtime.manual_seed(0)
    _one_symbolic_batch_variant(Reversals().double(), (4, 6, 3, 9), 3)
    with pytest.raises(ValueError, match="step must be greater than zero"):  # a user's negative step, as torch
        runtime.arange(4)[::-1]


class ColumnSums(nn.Module):
    """A sum over a middle dim with the last kept: the column skeleton, with a symbolic count of kept positions."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(runtime.linspace(0.5, 1.5, 300, dtype=runtime.float64))

    def forward(self, x):
        return (x * self.scale).sum(1) * 2.0


def test_column_reductions_over_a_symbolic_number_of_columns():
    runtime.manual_seed(0)
    model = ColumnSums()
    # 600 to 2100 kept positions: one partial tile of 1024, then two and three
    compiled = _one_symbolic_batch_variant(model, (3, 2, 5, 7), 4, 300)
    assert "for task in range((((300*S0 + 1023))//1024)):" in _symbolic_sources(compiled)  # whole tiles of columns


class PaddedEncoder(nn.Module):
    """A transformer encoder over a padded batch: its key padding mask becomes a float mask inside the layer."""

    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)

    def forward(self, x, padding):
        keep = (~padding).unsqueeze(-1).to(x.dtype)
        return (self.encoder(x, src_key_padding_mask=padding) * keep).sum(1) / keep.sum(1)


def test_an_encoder_with_a_padding_mask_takes_a_symbolic_length():
    runtime.manual_seed(0)
    model = PaddedEncoder().double()
    compiled = nnc.compile(copy.deepcopy(model))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for length in (6, 9, 5, 12):
            x = runtime.randn(3, length, 8, dtype=runtime.float64)
            padding = runtime.zeros(3, length, dtype=runtime.bool)
            padding[0, length - 2:] = True
            got, want = compiled(x, padding), model(x, padding)
            np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-9, atol=1e-12)
            (got.sum() + want.sum()).backward()
    assert compiled.compiled_variants == 2 and compiled._dynamic_dims == {("x", 0): {1}, ("padding", 0): {1}}


def test_attention_with_a_bool_padding_mask_takes_a_symbolic_batch():
    """A DataLoader's short last batch: the bool mask becomes its float form without reading the batch size as an
    int, so the batch stays symbolic (it was pinned, and a third batch size ran eagerly with a warning)."""
    runtime.manual_seed(0)
    model = nn.MultiheadAttention(8, 2, batch_first=True).double()
    compiled = nnc.compile(copy.deepcopy(model))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for batch in (4, 3, 2, 5):
            x = runtime.randn(batch, 6, 8, dtype=runtime.float64)
            padding = runtime.zeros(batch, 6, dtype=runtime.bool)
            padding[:, -1] = True
            got, want = compiled(x, x, x, key_padding_mask=padding), model(x, x, x, key_padding_mask=padding)
            for g, w in zip(got, want):
                np.testing.assert_allclose(g.detach().numpy(), w.detach().numpy(), rtol=1e-9, atol=1e-12)
    assert compiled.compiled_variants == 2 and ("key_padding_mask", 0) in compiled._dynamic_dims


def test_batch_norm_trains_over_changing_batch_sizes_with_one_symbolic_variant():
    runtime.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.GroupNorm(2, 4),
                          nn.Flatten(), nn.Linear(64, 3)).double()
    twin = copy.deepcopy(model)
    compiled = nnc.compile(twin)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for batch in (4, 3, 5, 7, 0, 6):
            x = runtime.randn(batch, 2, 4, 4, dtype=runtime.float64)
            got, got_grads = _outputs_and_grads(compiled, x)
            want, want_grads = _outputs_and_grads(model, x)
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
            for g, w in zip(got_grads, want_grads):
                np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12)
            for (name, b), w in zip(twin.named_buffers(), model.buffers()):
                np.testing.assert_allclose(b.numpy(), w.numpy(), rtol=1e-12, err_msg=name)
    # 4 static, then one symbolic variant for 3, 5, 7 and 6 (the running variance's n - 1 keeps the size
    # symbolic), and the empty batch on its own
    assert compiled.compiled_variants == 3 and compiled._dynamic_dims == {("input", 0): {0}}


def test_a_kernel_without_symbolic_code_makes_the_variant_static_without_a_warning():
    model = nn.MaxPool2d(2)
    compiled = nnc.compile(copy.deepcopy(model), dynamic=True)  # channels symbolic too: no window kernel
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for channels in (3, 5):
            _assert_same(compiled, model, runtime.randn(2, channels, 6, 6, dtype=runtime.float64))
    assert "no code for symbolic sizes" in compiled._dynamic_failed or compiled._dynamic_failed == "the compile failed"
