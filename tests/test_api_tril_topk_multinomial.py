"""tril/triu, topk and multinomial: values and gradients vs torch and finite differences, sampling statistics."""
from __future__ import annotations

import numpy as np
import pytest

import runtime
from runtime.autograd import gradcheck

from helpers import require_torch


def _distinct(shape, seed=0) -> np.ndarray:
    """float64 values, all distinct and at least 0.5 apart (so finite differences never reorder them)."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    return (rng.permutation(n) + rng.uniform(0, 0.25, n)).reshape(shape) - n / 2


def _grad_pair(fn, array: np.ndarray):
    """fn's output and the gradient of sum(output * weights) w.r.t. the input, in runtime and in torch."""
    torch = require_torch()
    results = []
    for lib, make in ((runtime, runtime.tensor), (torch, torch.tensor)):
        x = make(array, requires_grad=True)
        out = fn(lib, x)
        weights = make(np.arange(1.0, out.numel() + 1).reshape(tuple(out.shape)))
        (out * weights).sum().backward()
        results.append((out.detach().numpy(), x.grad.numpy()))
    return results


# ---------------------------------------------------------------------------------------------
# tril / triu
# ---------------------------------------------------------------------------------------------

TRIANGLES = [
    ("tril", lambda lib, x: lib.tril(x), (4, 4)),
    ("tril_diag1", lambda lib, x: x.tril(1), (3, 5)),
    ("tril_diag_neg", lambda lib, x: lib.tril(x, diagonal=-1), (5, 3)),
    ("triu", lambda lib, x: x.triu(), (4, 4)),
    ("triu_batched", lambda lib, x: lib.triu(x, 2), (2, 3, 4, 6)),
    ("triu_diag_neg", lambda lib, x: x.triu(-2), (5, 3)),
    ("tril_far", lambda lib, x: x.tril(10), (3, 4)),
    ("triu_far", lambda lib, x: x.triu(10), (3, 4)),
]


@pytest.mark.parametrize("name,fn,shape", TRIANGLES, ids=[t[0] for t in TRIANGLES])
def test_triangle_matches_torch(name, fn, shape):
    (ours, our_grad), (theirs, their_grad) = _grad_pair(fn, _distinct(shape))
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(our_grad, their_grad)


@pytest.mark.parametrize("name,fn,shape", TRIANGLES, ids=[t[0] for t in TRIANGLES])
def test_triangle_finite_differences(name, fn, shape):
    x = runtime.tensor(_distinct(shape), requires_grad=True)
    assert gradcheck(lambda t: fn(runtime, t), (x,))


def test_triangle_values_without_torch():
    x = runtime.arange(1, 10).reshape(3, 3)
    assert x.tril().tolist() == [[1, 0, 0], [4, 5, 0], [7, 8, 9]]
    assert x.triu(1).tolist() == [[0, 2, 3], [0, 0, 6], [0, 0, 0]]
    assert (x.tril(-1) + x.triu()).tolist() == x.tolist()


def test_triangle_keeps_dtype_and_zeroes_infinities():
    b = runtime.ones(2, 3, dtype=runtime.bool).tril()
    assert b.dtype is runtime.bool and b.tolist() == [[True, False, False], [True, True, False]]
    assert runtime.ones(2, 2, dtype=runtime.int32).triu().dtype is runtime.int32
    inf = runtime.full((2, 2), runtime.inf).tril()
    assert inf.tolist() == [[runtime.inf, 0.0], [runtime.inf, runtime.inf]]


def test_causal_mask_as_gpt_builds_it():
    mask = runtime.tril(runtime.ones(4, 4)).view(1, 1, 4, 4)
    scores = runtime.zeros(2, 1, 4, 4).masked_fill(mask == 0, float("-inf"))
    attention = runtime.softmax(scores, dim=-1)
    np.testing.assert_allclose(attention[0, 0, 3].numpy(), [0.25] * 4)
    np.testing.assert_allclose(attention[1, 0, 0].numpy(), [1.0, 0, 0, 0])


def test_triangle_in_place():
    x = runtime.arange(9.0).reshape(3, 3)
    assert x.tril_() is x and x.tolist() == [[0, 0, 0], [3, 4, 0], [6, 7, 8]]
    y = runtime.ones(2, 3)
    y.triu_(1)
    assert y.tolist() == [[0, 1, 1], [0, 0, 1]]


def test_triangle_in_place_gradient():
    leaf = runtime.tensor(_distinct((3, 3)), requires_grad=True)
    y = leaf * 2
    y.triu_()
    y.sum().backward()
    np.testing.assert_array_equal(leaf.grad.numpy(), 2 * np.triu(np.ones((3, 3))))


def test_triangle_errors():
    with pytest.raises(RuntimeError, match="tril: input tensor must have at least 2 dimensions"):
        runtime.tril(runtime.ones(3))
    with pytest.raises(RuntimeError, match="triu: input tensor must have at least 2 dimensions"):
        runtime.ones(()).triu()
    with pytest.raises(TypeError, match="tril\\(\\): argument 'diagonal' must be int, not float"):
        runtime.ones(2, 2).tril(1.5)


# ---------------------------------------------------------------------------------------------
# topk
# ---------------------------------------------------------------------------------------------

TOPKS = [
    ("last_dim", lambda lib, x: x.topk(3), (4, 7)),
    ("dim0", lambda lib, x: lib.topk(x, 2, dim=0), (5, 3)),
    ("smallest", lambda lib, x: lib.topk(x, 4, largest=False), (2, 3, 6)),
    ("middle_dim", lambda lib, x: x.topk(2, 1, True, True), (2, 5, 3)),
    ("k_equals_size", lambda lib, x: x.topk(6), (6,)),
    ("k_one", lambda lib, x: lib.topk(x, 1, -2), (4, 3)),
]


@pytest.mark.parametrize("name,fn,shape", TOPKS, ids=[t[0] for t in TOPKS])
def test_topk_matches_torch(name, fn, shape, torch):
    array = _distinct(shape)
    ours, theirs = fn(runtime, runtime.tensor(array)), fn(torch, torch.tensor(array))
    np.testing.assert_array_equal(ours.values.numpy(), theirs.values.numpy())
    np.testing.assert_array_equal(ours.indices.numpy(), theirs.indices.numpy())
    assert ours.indices.dtype is runtime.int64
    (values, grad), (their_values, their_grad) = _grad_pair(lambda lib, x: fn(lib, x).values, array)
    np.testing.assert_array_equal(values, their_values)
    np.testing.assert_array_equal(grad, their_grad)


@pytest.mark.parametrize("name,fn,shape", TOPKS, ids=[t[0] for t in TOPKS])
def test_topk_finite_differences(name, fn, shape):
    x = runtime.tensor(_distinct(shape), requires_grad=True)
    assert gradcheck(lambda t: fn(runtime, t).values, (x,))


def test_topk_result_unpacks_like_torch():
    x = runtime.tensor([3.0, 1.0, 4.0, 1.5, 9.0, 2.6])
    values, indices = runtime.topk(x, 3)
    result = x.topk(3)
    assert values.tolist() == [9.0, 4.0, 3.0] and indices.tolist() == [4, 2, 0]
    assert result.values.tolist() == values.tolist() and result.indices.tolist() == indices.tolist()
    assert result[0].tolist() == values.tolist() and len(result) == 2
    assert x.topk(2, largest=False).indices.tolist() == [1, 3]
    assert x.topk(0).values.shape == (0,)


def test_topk_gradient_lands_on_chosen_entries():
    x = runtime.tensor([0.5, 3.0, -1.0, 2.0], requires_grad=True)
    (x.topk(2).values * runtime.tensor([10.0, 1.0])).sum().backward()
    assert x.grad.tolist() == [0.0, 10.0, 0.0, 1.0]


def test_topk_integers_nan_and_scalars():
    ints = runtime.tensor([1, 5, 3])
    assert ints.topk(2).values.tolist() == [5, 3] and ints.topk(2).values.dtype is runtime.int64
    with_nan = runtime.tensor([1.0, float("nan"), 3.0])
    assert with_nan.topk(2).indices.tolist() == [1, 2]  # nan counts as the largest, as in torch
    assert with_nan.topk(2, largest=False).indices.tolist() == [0, 2]
    scalar = runtime.topk(runtime.tensor(3.0), 1)
    assert scalar.values.shape == () and scalar.values.item() == 3.0 and scalar.indices.item() == 0


def test_topk_errors():
    x = runtime.ones(2, 3)
    for k in (4, -1):
        with pytest.raises(RuntimeError, match="selected index k out of range"):
            x.topk(k)
    with pytest.raises(IndexError, match="Dimension out of range"):
        x.topk(1, dim=2)
    with pytest.raises(RuntimeError, match="topk does not support bool"):
        runtime.ones(3, dtype=runtime.bool).topk(1)


def test_top_k_sampling_filter_as_generate_writes_it():
    logits = runtime.tensor([[1.0, 5.0, 3.0, 4.0, 2.0]])
    v, _ = runtime.topk(logits, 2)
    filtered = logits.masked_fill(logits < v[:, [-1]], -float("inf"))
    probs = runtime.softmax(filtered, dim=-1)
    runtime.manual_seed(0)
    draws = runtime.multinomial(probs.expand(2000, 5), 1)
    assert set(draws.reshape(-1).tolist()) == {1, 3}


# ---------------------------------------------------------------------------------------------
# multinomial
# ---------------------------------------------------------------------------------------------

def _frequencies(samples: np.ndarray, n: int) -> np.ndarray:
    return np.bincount(samples.reshape(-1), minlength=n) / samples.size


def test_multinomial_with_replacement_follows_probabilities():
    weights = np.array([1.0, 0.0, 3.0, 6.0])  # unnormalised, as torch allows
    runtime.manual_seed(1)
    draws = runtime.multinomial(runtime.tensor(weights), 20000, replacement=True)
    assert draws.shape == (20000,) and draws.dtype is runtime.int64
    np.testing.assert_allclose(_frequencies(draws.numpy(), 4), weights / weights.sum(), atol=0.02)


def test_multinomial_rows_are_independent_distributions():
    probs = runtime.tensor([[0.9, 0.1, 0.0], [0.0, 0.2, 0.8]], dtype=runtime.float64)
    runtime.manual_seed(2)
    draws = probs.multinomial(5000, True).numpy()
    assert draws.shape == (2, 5000)
    np.testing.assert_allclose(_frequencies(draws[0], 3), [0.9, 0.1, 0.0], atol=0.03)
    np.testing.assert_allclose(_frequencies(draws[1], 3), [0.0, 0.2, 0.8], atol=0.03)


def test_multinomial_without_replacement_never_repeats():
    runtime.manual_seed(3)
    probs = runtime.rand(6, 10) + 0.01
    draws = runtime.multinomial(probs, 10).numpy()
    assert draws.shape == (6, 10)
    assert all(sorted(row) == list(range(10)) for row in draws.tolist())
    # zero probabilities come only after every positive one, as in torch
    partial = runtime.multinomial(runtime.tensor([0.0, 1.0, 0.0, 2.0]), 4).tolist()
    assert sorted(partial[:2]) == [1, 3] and sorted(partial) == [0, 1, 2, 3]


def test_multinomial_without_replacement_first_draw_follows_probabilities():
    weights = np.array([0.1, 0.2, 0.7])
    runtime.manual_seed(4)
    draws = runtime.multinomial(runtime.tensor(weights).expand(20000, 3), 2).numpy()
    np.testing.assert_allclose(_frequencies(draws[:, 0], 3), weights, atol=0.02)
    # second draw given the first was category 2: categories 0 and 1 in proportion 1:2
    second = draws[draws[:, 0] == 2, 1]
    np.testing.assert_allclose(_frequencies(second, 3), [1 / 3, 2 / 3, 0.0], atol=0.03)


def test_multinomial_is_reproducible_under_seeds_and_generators():
    probs = runtime.tensor([0.2, 0.3, 0.1, 0.4])
    runtime.manual_seed(7)
    first = runtime.multinomial(probs, 50, replacement=True).tolist()
    runtime.manual_seed(7)
    assert runtime.multinomial(probs, 50, replacement=True).tolist() == first
    gen_a, gen_b = runtime.Generator().manual_seed(11), runtime.Generator().manual_seed(11)
    a = runtime.multinomial(probs, 4, generator=gen_a).tolist()
    assert probs.multinomial(4, generator=gen_b).tolist() == a
    assert sorted(a) == [0, 1, 2, 3]


def test_multinomial_is_not_differentiable():
    probs = runtime.tensor([0.5, 0.5], requires_grad=True)
    draws = runtime.multinomial(probs, 1)
    assert not draws.requires_grad and draws.grad_fn is None


def test_multinomial_matches_torch_shapes_and_dtypes(torch):
    for shape, count, replacement in (((5,), 3, False), ((3, 4), 2, False), ((2, 3), 7, True), ((0, 3), 1, False)):
        ours = runtime.multinomial(runtime.ones(*shape), count, replacement)
        theirs = torch.multinomial(torch.ones(*shape), count, replacement)
        assert tuple(ours.shape) == tuple(theirs.shape) and ours.dtype.name == "int64"


@pytest.mark.parametrize("probs,count,replacement,message", [
    ([0.2, 0.3, 0.5], 4, False, "cannot sample n_sample > prob_dist.size\\(-1\\) samples without replacement"),
    ([0.2, 0.3, 0.5], 0, True, "cannot sample n_sample <= 0 samples"),
    ([0.2, -0.1], 1, True, "probability tensor contains either `inf`, `nan` or element < 0"),
    ([0.2, float("nan")], 1, True, "probability tensor contains either `inf`, `nan` or element < 0"),
    ([0.2, float("inf")], 1, False, "probability tensor contains either `inf`, `nan` or element < 0"),
    ([0.0, 0.0], 1, True, "invalid multinomial distribution \\(sum of probabilities <= 0\\)"),
    ([[1.0, 1.0], [0.0, 0.0]], 1, False, "invalid multinomial distribution \\(sum of probabilities <= 0\\)"),
    ([[[1.0]]], 1, False, "prob_dist must be 1 or 2 dim"),
])
def test_multinomial_errors_match_torch(probs, count, replacement, message):
    with pytest.raises(RuntimeError, match=message):
        runtime.multinomial(runtime.tensor(probs), count, replacement)
    torch = require_torch()
    with pytest.raises(RuntimeError, match=message):
        torch.multinomial(torch.tensor(probs), count, replacement)


def test_multinomial_needs_floating_probabilities():
    with pytest.raises(RuntimeError, match="multinomial only supports floating-point dtypes"):
        runtime.multinomial(runtime.tensor([1, 2]), 1)


def test_sort_orders_bools_and_refuses_complex_numbers():
    flags = runtime.tensor([True, False, True, False])
    values, indices = flags.sort(stable=True)
    assert values.tolist() == [False, False, True, True] and indices.tolist() == [1, 3, 0, 2]
    assert flags.argsort(stable=True).tolist() == [1, 3, 0, 2] and runtime.msort(flags).tolist() == values.tolist()
    with pytest.raises(RuntimeError, match="complex"):
        runtime.tensor([1 + 1j, 2j]).sort()
