"""Random numbers inside compiled kernels: Philox-4x32-10 against its published answers, the generated kernels
against the op table's numpy forwards bit for bit, dropout's statistics, repeatability under manual_seed, the
backward regenerating the mask, and models with dropout compiling as one graph."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import nnc
import runtime
import runtime.nn.functional as F
from runtime import _philox, nn, ops
from runtime import dtypes as dt

pytestmark = pytest.mark.usefixtures("fresh_kernel_cache")


# ---------------------------------------------------------------------------------------------------------------
# Philox itself
# ---------------------------------------------------------------------------------------------------------------

# Random123's kat_vectors, "philox4x32 10" lines: counter (4 words), key (2 words) -> output (4 words)
KAT = [((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
        (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
       ((0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff), (0xffffffff, 0xffffffff),
        (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
       ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
        (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1))]


@pytest.mark.parametrize("counter,key,expected", KAT)
def test_philox_matches_random123_known_answers(counter, key, expected):
    scalar = _philox.philox4x32(*(np.uint64(v) for v in counter + key))
    assert [int(w) for w in scalar] == list(expected)
    arrays = _philox.philox4x32(*(np.full(3, v, dtype=np.uint64) for v in counter), *(np.uint64(v) for v in key))
    assert [list(map(int, w)) for w in arrays] == [[e] * 3 for e in expected]


@pytest.mark.parametrize("counter,key,expected", KAT)
def test_compiled_philox_matches_known_answers(counter, key, expected):
    from nnc.codegen import philox

    words = philox._rounds(*(np.uint64(v) for v in counter + key))
    assert [int(w) for w in words] == list(expected)


def test_uniforms_take_the_top_bits():
    w0, w1 = np.uint64(0xFFFFFFFF), np.uint64(0xFFFFFFFF)
    assert _philox.uniform_f32(w0) == np.float32(1 - 2.0 ** -24)  # the largest float32 below 1
    assert _philox.uniform_f64(w0, w1) == 1 - 2.0 ** -53
    assert _philox.uniform_f32(np.uint64(0)) == 0.0


# ---------------------------------------------------------------------------------------------------------------
# Generated kernels == the numpy forwards, bit for bit
# ---------------------------------------------------------------------------------------------------------------

class Draws(nn.Module):
    """Dropout (a flat elementwise kernel), channel dropout (a mask of another shape, read with broadcasting),
    rand_like / randn in float32 and float64, and dropout in a matmul's epilogue."""

    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x, x64):
        return (F.dropout(x, 0.3), F.dropout2d(x.unsqueeze(-1).unsqueeze(-1) + 1.0, 0.5).squeeze(-1).squeeze(-1),
                runtime.rand_like(x) * 2.0, runtime.randn(x.shape[0], 3) + 1.0, runtime.rand_like(x64) + x64,
                runtime.randn_like(x64) * x64, x + F.dropout(self.linear(x), 0.2))


def _compiled_and_interpreted(model, args, seed):
    compiled = nnc.compile(model)
    with warnings.catch_warnings(), runtime.no_grad():
        warnings.simplefilter("error")  # a kernel that falls back to the interpreter would warn
        runtime.manual_seed(seed)
        got = [t.numpy() for t in compiled(*args)]
        (artifact,) = compiled._cache.values()
        assert not artifact.forward_plan.fallbacks
        runtime.manual_seed(seed)
        want = [t.numpy() for t in nnc.Interpreter(artifact.forward).run(*args)]
    return got, want, artifact


@pytest.mark.parametrize("rows", [0, 1, 5, 700])  # 700 x 400 > 2^18: the parallel loops
def test_kernels_draw_what_the_numpy_forwards_draw(rows):
    features = 400 if rows == 700 else 6
    model = Draws(features)
    x = runtime.randn(rows, features)
    x64 = runtime.randn(rows, features, dtype=runtime.float64)
    got, want, artifact = _compiled_and_interpreted(model, (x, x64), seed=rows + 11)
    for k, (a, b) in enumerate(zip(got, want)):
        assert a.dtype == b.dtype and a.shape == b.shape
        if k == 5:  # Box-Muller's log and cos: numba's libm and numpy's may differ in the last float64 bit
            np.testing.assert_allclose(a, b, rtol=4e-16, atol=4e-16)
        elif k == 6:  # a matmul's sums (loops or BLAS) may round apart; the dropped places are x itself
            np.testing.assert_array_equal(a == x.numpy(), b == x.numpy())
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
        else:
            np.testing.assert_array_equal(a, b, err_msg=f"output {k}")
    if rows:
        drawing = [s.kernel for s in artifact.forward_plan.steps
                   if hasattr(s, "kernel") and any(o.startswith("philox") for o in s.kernel.meta["ops"])]
        assert drawing and all(hasattr(s, "compiled") for s in artifact.forward_plan.steps
                               if getattr(s, "kernel", None) in drawing)
        assert any(k.kind == "matmul" and "philox_uniform" in k.meta["ops"] for k in drawing)


class Scaled(nn.Module):
    """Dropout, channel dropout and rand_like around elementwise work (no matmul, whose sums may round apart)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(runtime.randn(8))
        self.drop, self.drop1d = nn.Dropout(0.4), nn.Dropout1d(0.5)

    def forward(self, x):
        return self.drop1d(self.drop(x * self.w) + runtime.rand_like(x))


def _generated_and_interpreted(model, dynamic, shape_of, dtype=runtime.float32):
    """Per batch of 3, 6 and 1: [(output, input grad, w grad) generated, the same interpreted], each call seeded
    alike. Static sizes compile anew per batch (a third size of one compiled module would run eagerly). Returns the
    last generated compiled module and the pairs."""
    pairs = []
    for batch in (3, 6, 1):
        if not dynamic or not pairs:
            generated = nnc.compile(model, dynamic=dynamic)
            interpreted = nnc.compile(model, dynamic=dynamic, codegen=False)
        results = []
        for run in (generated, interpreted):
            x = runtime.randn(*shape_of(batch), dtype=dtype, generator=runtime.Generator().manual_seed(batch),
                              requires_grad=True)
            runtime.manual_seed(batch)
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # a kernel falling back to the interpreter would warn
                y = run(x)
                y.backward(y.detach() + 1.0)
            results.append((y.detach().numpy(), x.grad.numpy(), model.w.grad.numpy().copy()))
            model.w.grad = None
        pairs.append(results)
    return generated, pairs


@pytest.mark.parametrize("dynamic", [False, True])
def test_kernels_match_the_interpreter_forward_and_backward(dynamic):
    """Sizes as constants and as symbols (one kernel for every batch): codegen == interpreter, bit for bit."""
    generated, pairs = _generated_and_interpreted(Scaled(), dynamic, lambda batch: (batch, 8))
    for got, want in pairs:
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
    if dynamic:
        assert generated.compiled_variants == 2  # batch 1 compiles apart; 3 and 6 share one symbolic variant


def test_draws_differ_by_stream_and_by_call():
    seed = ops.apply("random_seed")
    a = ops.apply("philox_uniform", seed, shape=(4096,), dtype=dt.float32, stream=0).numpy()
    b = ops.apply("philox_uniform", seed, shape=(4096,), dtype=dt.float32, stream=1).numpy()
    c = ops.apply("philox_uniform", ops.apply("random_seed"), shape=(4096,), dtype=dt.float32, stream=0).numpy()
    for other in (b, c):
        assert abs(np.corrcoef(a, other)[0, 1]) < 5 / math.sqrt(a.size)


def test_random_seed_draws_from_runtimes_generator():
    runtime.manual_seed(3)
    first = [int(ops.apply("random_seed")) for _ in range(3)]
    runtime.manual_seed(3)
    assert [int(ops.apply("random_seed")) for _ in range(3)] == first
    assert len(set(first)) == 3


def test_random_seed_is_never_folded_or_merged():
    class TwoDraws(nn.Module):
        def forward(self, x):
            return x + runtime.rand(3), x + runtime.rand(3)

    compiled = nnc.compile(TwoDraws())
    x = runtime.zeros(3)
    a1, b1 = compiled(x)
    a2, _ = compiled(x)
    assert not np.array_equal(a1.numpy(), b1.numpy())  # two streams, not one merged draw
    assert not np.array_equal(a1.numpy(), a2.numpy())  # a new seed per call, not a folded constant


# ---------------------------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------------------------

class DropoutOnly(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.drop = nn.Dropout(p)

    def forward(self, x):
        return self.drop(x)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_rate_and_scale(p):
    n = 1 << 16
    compiled = nnc.compile(DropoutOnly(p))
    runtime.manual_seed(0)
    first, second = compiled(runtime.ones(n)).numpy(), compiled(runtime.ones(n)).numpy()
    for y in (first, second):
        kept = y != 0
        sigma = math.sqrt(n * p * (1 - p))
        assert abs(kept.sum() - n * (1 - p)) < 5 * sigma
        np.testing.assert_array_equal(y[kept], np.float32(1.0) * np.float32(1.0 / (1.0 - p)))
    a, b = (first != 0).astype(np.float64), (second != 0).astype(np.float64)
    assert abs(np.corrcoef(a, b)[0, 1]) < 5 / math.sqrt(n)          # calls are independent
    assert abs(np.corrcoef(a[:-1], a[1:])[0, 1]) < 5 / math.sqrt(n)  # neighbouring elements are independent


def test_uniform_and_normal_moments():
    class Moments(nn.Module):
        def forward(self, x):
            return runtime.rand_like(x), runtime.randn_like(x)

    n = 1 << 16
    runtime.manual_seed(1)
    u, z = (t.numpy().astype(np.float64) for t in nnc.compile(Moments())(runtime.zeros(n)))
    assert 0 <= u.min() and u.max() < 1
    assert abs(u.mean() - 0.5) < 5 * math.sqrt(1 / 12 / n) and abs(u.var() - 1 / 12) < 0.005
    assert abs(z.mean()) < 5 / math.sqrt(n) and abs(z.std() - 1) < 0.02
    assert abs(np.corrcoef(u, z)[0, 1]) < 5 / math.sqrt(n)


# ---------------------------------------------------------------------------------------------------------------
# Repeatability
# ---------------------------------------------------------------------------------------------------------------

class SmallNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(12, 32), nn.Linear(32, 4)
        self.drop = nn.Dropout(0.3)

    def forward(self, x):
        return self.fc2(self.drop(F.relu(self.fc1(x))))


def _train_steps(model, step, seed, steps=2):
    runtime.manual_seed(seed)
    opt = runtime.optim.SGD(model.parameters(), lr=0.1)
    x, y = runtime.randn(16, 12), runtime.randint(0, 4, (16,))
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(step(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().numpy().copy() for p in model.parameters()]


def test_manual_seed_makes_compiled_training_repeatable():
    runtime.manual_seed(0)
    model = SmallNet()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    compiled = nnc.compile(model)
    runs = []
    for seed in (7, 7, 8):
        model.load_state_dict(state)
        runs.append(_train_steps(model, compiled, seed))
    (l1, p1), (l2, p2), (l3, p3) = runs
    assert l1 == l2 and all(np.array_equal(a, b) for a, b in zip(p1, p2))
    assert l1 != l3 and not all(np.array_equal(a, b) for a, b in zip(p1, p3))


# ---------------------------------------------------------------------------------------------------------------
# Backward
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("p", [0.0, 0.4, 1.0])
@pytest.mark.parametrize("shape", [(0, 3), (1,), (37, 11)])
def test_gradient_is_g_times_the_forward_mask(p, shape):
    compiled = nnc.compile(DropoutOnly(p))
    x = runtime.ones(shape, requires_grad=True)
    y = compiled(x)  # = mask / (1 - p): the output exposes the mask
    g = runtime.randn(shape)
    y.backward(g)
    np.testing.assert_array_equal(x.grad.numpy(), g.numpy() * y.detach().numpy())
    if p == 1.0:
        assert not y.detach().numpy().any() and not x.grad.numpy().any()
    if p == 0.0:
        np.testing.assert_array_equal(y.detach().numpy(), x.detach().numpy())


def test_backward_regenerates_the_mask_instead_of_saving_it():
    compiled = nnc.compile(SmallNet())
    x = runtime.randn(16, 12, requires_grad=True)
    compiled(x).sum().backward()
    (artifact,) = compiled._cache.values()
    saved = artifact.backward.saved
    names = [n.target.op.name for n in saved if hasattr(n.target, "op")]
    assert "random_seed" in names
    assert not {"philox_uniform", "ge", "cast"} & set(names), names  # the mask (or its draw) is not saved
    # of the hidden layer's shape at most one value is kept: an activation its weight gradients read anyway
    assert len([n for n in saved if tuple(n.meta.get("shape", ())) == (16, 32)]) <= 1
    backward_ops = [n.target.op.name for n in artifact.backward.gm.graph.nodes if hasattr(n.target, "op")]
    assert "philox_uniform" in backward_ops
    assert artifact.backward_plan is not None and not artifact.backward_plan.fallbacks


def test_eval_mode_is_the_identity():
    model = SmallNet().eval()
    compiled = nnc.compile(model)
    x = runtime.randn(5, 12)
    np.testing.assert_allclose(compiled(x).detach().numpy(), model(x).detach().numpy(), rtol=1e-6, atol=1e-6)
    (artifact,) = compiled._cache.values()
    assert not [n for n in artifact.forward.graph.nodes if "philox" in str(n.target)]


def test_draws_it_does_not_compile_stay_calls_that_draw_anew():
    """normal, randint and a user's generator are not compiled: each stays an eager call (never a frozen constant),
    even with plain sizes, which the tracer would otherwise have run once."""
    class Others(nn.Module):
        def __init__(self):
            super().__init__()
            self.gen = runtime.Generator().manual_seed(5)

        def forward(self, x):
            return (x + runtime.normal(0.0, 1.0, size=(4,)) + runtime.randint(0, 5, (4,))
                    + runtime.rand(4, generator=self.gen))

    x = runtime.zeros(4)
    compiled = nnc.compile(Others())
    assert not np.array_equal(compiled(x).numpy(), compiled(x).numpy())
    eager_calls = {name for name, _ in nnc.explain(Others(), x).opaque_nodes}
    assert {"normal", "randint", "rand"} <= eager_calls


# ---------------------------------------------------------------------------------------------------------------
# Models with dropout: one graph, and they train
# ---------------------------------------------------------------------------------------------------------------

def _tiny_gpt(lib, dropout):
    """examples/real_models.py's GPT (one block, dropout after the embeddings, in attention and after each
    sublayer), returning its loss."""
    from real_models import GPT, GPTConfig

    config = GPTConfig(block_size=16, vocab_size=20, n_layer=1, n_head=2, n_embd=32, dropout=dropout)

    class Loss(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.gpt = GPT(config)

        def forward(self, idx, targets):
            return self.gpt(idx, targets)[1]

    data = np.random.default_rng(0).integers(0, config.vocab_size, (4, config.block_size + 1))
    return Loss(), (lib.tensor(data[:, :-1]), lib.tensor(data[:, 1:]))


def _tiny_cnn(lib, dropout):
    nn_, F_ = lib.nn, lib.nn.functional

    class CNN(nn_.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = nn_.Conv2d(1, 8, 3), nn_.Conv2d(8, 8, 3)
            self.drop2d, self.drop = nn_.Dropout2d(dropout), nn_.Dropout(dropout)
            self.fc = nn_.Linear(8 * 4 * 4, 5)

        def forward(self, x, y):
            x = F_.max_pool2d(F_.relu(self.conv2(self.drop2d(F_.relu(self.conv1(x))))), 2)
            return F_.cross_entropy(self.fc(self.drop(lib.flatten(x, 1))), y)

    rng = np.random.default_rng(1)
    x = rng.standard_normal((16, 1, 12, 12)).astype(np.float32)
    return CNN(), (lib.tensor(x), lib.tensor(rng.integers(0, 5, 16)))


def _losses(model, run, args, steps, seed):
    runtime.manual_seed(seed)
    opt = runtime.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    out = []
    for _ in range(steps):
        opt.zero_grad()
        loss = run(*args)
        loss.backward()
        opt.step()
        out.append(loss.item())
    return np.array(out)


@pytest.mark.parametrize("make", [_tiny_gpt, _tiny_cnn], ids=["gpt", "cnn"])
def test_models_with_dropout_compile_as_one_graph_and_train(make):
    runtime.manual_seed(0)
    model, args = make(runtime, 0.2)
    report = nnc.explain(model, *args, backward=True)
    assert report.pieces == 0 and not report.graph_breaks and not report.opaque_nodes, str(report)
    assert report.backward_kernels
    fused = [k for k in report.kernels if any(o.startswith("philox") for o in k.ops)]
    assert fused and all(len(k.ops) > 1 for k in fused)  # each draw joins the kernel of its neighbours

    state = {k: v.clone() for k, v in model.state_dict().items()}
    compiled = nnc.compile(model)
    steps = 30
    ours = _losses(model, compiled, args, steps, seed=1)
    (artifact,) = compiled._cache.values()
    assert artifact.training_plan is not None and not artifact.training_plan.fallbacks
    assert not artifact.backward_plan.fallbacks
    model.load_state_dict(state)
    eager = _losses(model, model, args, steps, seed=1)
    assert ours[-5:].mean() < 0.8 * ours[:5].mean()  # it learns
    # the same training, with other random numbers: the same statistics, not the same values
    assert not np.array_equal(ours, eager)
    assert abs(ours[-5:].mean() - eager[-5:].mean()) < 0.25 * eager[:5].mean()


class SoftmaxDropout(nn.Module):
    """Attention's dropout of softmax weights, then a per-row mean: draws along rows and per row of a row kernel."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(runtime.randn(7, dtype=runtime.float64))

    def forward(self, x):
        weights = F.dropout(F.softmax(x * self.w, dim=-1), 0.3)
        return weights * F.dropout(weights.sum(-1, keepdim=True), 0.5)


@pytest.mark.parametrize("dynamic", [False, True])
def test_draws_join_row_kernels_and_match_the_interpreter(dynamic):
    """Dropout after softmax is part of the softmax's row kernel (forward and backward), drawing the same numbers as
    the interpreter by element index: along the row at o * length + r, per row at o."""
    generated, pairs = _generated_and_interpreted(SoftmaxDropout(), dynamic, lambda batch: (batch, 4, 7),
                                                  dtype=runtime.float64)
    for got, want in pairs:
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a == 0, b == 0)  # the same elements dropped
            np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13)
    rows = [k for c in generated.compilations for p in c.plans for k in p.kernels if k.kind == "row"]
    assert any("philox_uniform" in k.meta["ops"] and "exp" in k.meta["ops"] for k in rows), \
        [(k.kind, k.meta["ops"]) for c in generated.compilations for p in c.plans for k in p.kernels]


class DropPath(nn.Module):
    """Stochastic depth as timm writes it: a per-sample mask drawn in place into a tensor made in forward."""

    def __init__(self, keep):
        super().__init__()
        self.keep = keep

    def forward(self, x):
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(self.keep)
        return x * mask / self.keep


class FilledInPlace(nn.Module):
    """Noise drawn with uniform_ and normal_ into tensors made in forward, read after the fill."""

    def forward(self, x):
        noise = runtime.empty(x.shape).uniform_(-0.5, 1.5)
        gauss = runtime.zeros(x.shape)
        gauss.normal_(2.0, 3.0)
        return x * 0 + noise, gauss


def test_in_place_draws_into_tensors_made_in_forward_draw_anew_on_every_compiled_call():
    """bernoulli_, uniform_ and normal_ on a tensor made in forward were run once while tracing and frozen into the
    graph as a constant (DropPath's mask never changed). They are philox draws now: fresh on every call, with the
    distribution's statistics, repeatable under manual_seed, and no warning."""
    x = runtime.ones(20000, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        drop, fill = nnc.compile(DropPath(0.7)), nnc.compile(FilledInPlace())
        first, second = drop(x).numpy()[:, 0], drop(x).numpy()[:, 0]
        (noise, gauss), (noise2, _) = fill(x), fill(x)
    assert not np.array_equal(first, second) and not np.array_equal(noise.numpy(), noise2.numpy())
    assert abs((first != 0).mean() - 0.7) < 0.02 and np.allclose(first[first != 0], 1 / 0.7)
    assert noise.numpy().min() >= -0.5 and noise.numpy().max() < 1.5 and abs(noise.numpy().mean() - 0.5) < 0.02
    assert abs(gauss.numpy().mean() - 2.0) < 0.1 and abs(gauss.numpy().std() - 3.0) < 0.1
    runtime.manual_seed(7)
    again = drop(x).numpy()
    runtime.manual_seed(7)
    np.testing.assert_array_equal(drop(x).numpy(), again)
