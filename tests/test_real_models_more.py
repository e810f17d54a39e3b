"""More model shapes people train, compiled vs eager: state a forward keeps on the module across calls."""
from __future__ import annotations

import collections
import copy
import logging
import random
import warnings

import numpy as np

import nnc
import runtime
from runtime import nn


def outputs_and_grads(model, inputs):
    """Each call's output, then the parameters' gradients of the last output's sum."""
    outs = [model(x) for x in inputs]
    outs[-1].sum().backward()
    return [o.detach().numpy() for o in outs], [p.grad.numpy() for p in model.parameters()]


def assert_calls_match(model, inputs):
    """A compiled copy gives every call's output and the last call's gradients as eager does."""
    compiled = nnc.compile(copy.deepcopy(model))
    got_outs, got_grads = outputs_and_grads(compiled, inputs)
    want_outs, want_grads = outputs_and_grads(model, inputs)
    for got, want in zip(got_outs + got_grads, want_outs + want_grads):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    return compiled


class StepScaled(nn.Module):
    """A warm-up factor from a Python counter the forward advances."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4).double()
        self.step = 0

    def forward(self, x):
        self.step += 1
        return self.lin(x) * min(self.step, 3)


def test_a_python_counter_advanced_in_forward_advances_on_every_compiled_call():
    runtime.manual_seed(0)
    inputs = [runtime.randn(2, 4, dtype=runtime.float64) for _ in range(3)]
    compiled = assert_calls_match(StepScaled(), inputs)
    assert compiled.step == 3


class KeepsAttention(nn.Module):
    """Attention that keeps its last map on the module (for plotting) and adds the previous call's output."""

    def __init__(self):
        super().__init__()
        self.query = nn.Linear(4, 4).double()
        self.attention_map = None
        self.previous = None

    def forward(self, x):
        weights = (self.query(x) @ x.t()).softmax(-1)
        self.attention_map = weights.detach()
        out = weights @ x
        if self.previous is not None:
            out = out + self.previous
        self.previous = out.detach()
        return out


class WithKeptState(nn.Module):
    def __init__(self):
        super().__init__()
        self.attend = KeepsAttention()
        self.head = nn.Linear(4, 2).double()

    def forward(self, x):
        return self.head(self.attend(x))


def test_a_submodule_keeping_tensors_across_calls_keeps_real_ones_compiled():
    runtime.manual_seed(0)
    model = WithKeptState()
    inputs = [runtime.randn(3, 4, dtype=runtime.float64) for _ in range(3)]
    compiled = assert_calls_match(model, inputs)
    kept = compiled.attend.attention_map
    assert isinstance(kept, runtime.Tensor)
    np.testing.assert_allclose(kept.numpy(), model.attend.attention_map.numpy(), rtol=1e-12)


class CollectsFeatures(nn.Module):
    """Keeps each call's features in a list and counts calls in a dict, then branches on the features' values."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4).double()
        self.features = []
        self.calls = {}

    def forward(self, x):
        h = self.lin(x)
        self.features.append(h.detach())
        self.calls["forward"] = self.calls.get("forward", 0) + 1
        return h if h.sum() > 0 else -h


class WithCollector(nn.Module):
    def __init__(self):
        super().__init__()
        self.collect = CollectsFeatures()
        self.head = nn.Linear(4, 2).double()

    def forward(self, x):
        return self.head(self.collect(x))


def test_lists_and_dicts_a_forward_fills_are_filled_by_every_compiled_call():
    runtime.manual_seed(0)
    model = WithCollector()
    inputs = [runtime.randn(3, 4, dtype=runtime.float64) for _ in range(3)]
    compiled = assert_calls_match(model, inputs)
    kept = compiled.collect.features
    assert compiled.collect.calls == model.collect.calls == {"forward": 3}
    assert len(kept) == 3 and all(isinstance(t, runtime.Tensor) for t in kept)
    for got, want in zip(kept, model.collect.features):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12)


class Settings:
    """A plain config object, as scripts pass one to their modules."""

    def __init__(self):
        self.calls = 0
        self.last = None
        self.scale = 2.0


class CountsInItsConfig(nn.Module):
    """A block that counts its calls and keeps its last output in a shared config object."""

    def __init__(self, settings):
        super().__init__()
        self.lin = nn.Linear(4, 4).double()
        self.settings = settings

    def forward(self, x):
        self.settings.calls += 1
        h = self.lin(x) * self.settings.scale
        self.settings.last = h.detach()
        return h


class ReadsItsConfig(nn.Module):
    def __init__(self, settings):
        super().__init__()
        self.lin = nn.Linear(4, 4).double()
        self.settings = settings

    def forward(self, x):
        return self.lin(x) * self.settings.scale


class ConfiguredModel(nn.Module):
    def __init__(self):
        super().__init__()
        settings = Settings()
        self.counted, self.read = CountsInItsConfig(settings), ReadsItsConfig(settings)

    def forward(self, x):
        return self.read(self.counted(x))


def test_a_config_object_a_submodule_changes_is_changed_by_every_compiled_call():
    """Only the block that writes the config runs eagerly (a graph break); its neighbour still compiles, and the
    config holds real tensors, never traced values."""
    runtime.manual_seed(0)
    model = ConfiguredModel()
    inputs = [runtime.randn(3, 4, dtype=runtime.float64) for _ in range(3)]
    compiled = assert_calls_match(model, inputs)
    settings = compiled.counted.settings
    assert settings.calls == 3 and isinstance(settings.last, runtime.Tensor)
    np.testing.assert_allclose(settings.last.numpy(), model.counted.settings.last.numpy(), rtol=1e-12)
    (breaks,) = [c.graph_breaks for c in compiled.compilations]
    assert [b.path for b in breaks] == ["counted"] and "settings.calls" in breaks[0].reason


def test_a_forward_that_only_reads_a_config_object_compiles_whole():
    runtime.manual_seed(0)
    model = ReadsItsConfig(Settings())
    compiled = assert_calls_match(model, [runtime.randn(3, 4, dtype=runtime.float64) for _ in range(2)])
    (variant,) = compiled.compilations
    assert variant.graph_breaks == [] and "_partly" not in vars(compiled)


class KeepsPerKeyHistory(nn.Module):
    """Appends to lists held in a dict: a change two containers deep."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4).double()
        self.history = {"outputs": [], "norms": []}

    def forward(self, x):
        h = self.lin(x)
        self.history["outputs"].append(h.detach())
        self.history["norms"].append(float(h.detach().norm()))
        return h


def test_lists_inside_a_dict_are_filled_by_every_compiled_call():
    runtime.manual_seed(0)
    model = KeepsPerKeyHistory()
    compiled = assert_calls_match(model, [runtime.randn(3, 4, dtype=runtime.float64) for _ in range(3)])
    kept = compiled.history
    assert len(kept["outputs"]) == 3 and all(isinstance(t, runtime.Tensor) for t in kept["outputs"])
    np.testing.assert_allclose(kept["norms"], model.history["norms"], rtol=1e-12)


class AppendsToItsArgument(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4).double()

    def forward(self, x, seen):
        h = self.lin(x)
        seen.append(h.detach())
        return h * len(seen)


class GrowingCache:
    """A key cache as generation loops pass one: each call adds its keys and attends over all of them."""

    def __init__(self):
        self.keys = []

    def update(self, k):
        self.keys.append(k)
        return runtime.cat(self.keys, 0)


class AttendsOverACache(nn.Module):
    def __init__(self):
        super().__init__()
        self.key = nn.Linear(4, 4).double()

    def forward(self, x, cache):
        keys = cache.update(self.key(x))
        return (x @ keys.t()).softmax(-1) @ keys


def test_a_list_or_cache_object_passed_to_forward_is_changed_by_every_compiled_call():
    """The compiled calls fill the caller's list and cache object with real tensors and see them grow, as eager
    calls do (the trace saw one call's change, which a compiled graph would not repeat)."""
    runtime.manual_seed(0)
    inputs = [runtime.randn(2, 4, dtype=runtime.float64) for _ in range(3)]
    for model, make in ((AppendsToItsArgument(), list), (AttendsOverACache(), GrowingCache)):
        compiled = nnc.compile(copy.deepcopy(model))
        got_state, want_state = make(), make()
        got = [compiled(x, got_state).detach().numpy() for x in inputs]
        want = [model(x, want_state).detach().numpy() for x in inputs]
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
        held = got_state if isinstance(got_state, list) else got_state.keys
        assert len(held) == 3 and all(isinstance(t, runtime.Tensor) for t in held)


CALLS = 0
KEPT: list = []
LOG = logging.getLogger("nnc.tests.real_models_more")


class UsesGlobals(nn.Module):
    """Counts its calls in a global and keeps outputs in a global list, as quick scripts do."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4).double()

    def forward(self, x):
        global CALLS
        CALLS += 1
        h = self.lin(x)
        KEPT.append(h.detach())
        return h * CALLS


def test_globals_a_forward_rebinds_or_fills_change_on_every_compiled_call():
    global CALLS
    runtime.manual_seed(0)
    model, inputs = UsesGlobals(), [runtime.randn(2, 4, dtype=runtime.float64) for _ in range(3)]
    compiled = nnc.compile(copy.deepcopy(model))
    CALLS = 0
    KEPT.clear()
    got = [compiled(x).detach().numpy() for x in inputs]
    assert CALLS == 3 and len(KEPT) == 3 and all(isinstance(t, runtime.Tensor) for t in KEPT)
    CALLS = 0
    want = [model(x).detach().numpy() for x in inputs]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


class LogsAndKeepsADeque(nn.Module):
    """Logs in forward (a logging.Logger fills its own cache: not the model's state) and keeps recent outputs in a
    deque (which is)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4).double()
        self.recent = collections.deque(maxlen=2)

    def forward(self, x):
        LOG.debug("forward")
        h = self.lin(x)
        self.recent.append(h.detach())
        return h


def test_a_deque_is_state_and_a_logger_is_not():
    runtime.manual_seed(0)
    inputs = [runtime.randn(2, 4, dtype=runtime.float64) for _ in range(3)]
    compiled = assert_calls_match(LogsAndKeepsADeque(), inputs)
    assert len(compiled.recent) == 2 and all(isinstance(t, runtime.Tensor) for t in compiled.recent)
    assert "recent" in vars(compiled)["_partly"].reason

    class OnlyLogs(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4).double()

        def forward(self, x):
            LOG.debug("forward")
            return self.lin(x)

    compiled = assert_calls_match(OnlyLogs(), inputs)
    assert "_partly" not in vars(compiled) and compiled.compilations[0].graph_breaks == []


class PatchExtractor(nn.Module):
    """Image patches by unfold, as pytorch/examples' vision transformer builds them: the module is constructed
    anew inside each forward."""

    def __init__(self, size):
        super().__init__()
        self.size = size

    def forward(self, images):
        b = images.shape[0]
        s = self.size
        return images.unfold(2, s, s).unfold(3, s, s).permute(0, 2, 3, 1, 4, 5).contiguous().view(b, -1, 3 * s * s)


class TinyViT(nn.Module):
    def __init__(self, patch=4, dim=16, heads=2, classes=5):
        super().__init__()
        self.patch = patch
        self.proj = nn.Linear(3 * patch * patch, dim)
        self.cls = nn.Parameter(runtime.randn(2, 1, dim, dtype=runtime.float64))
        self.norm = nn.LayerNorm(dim)
        self.attention = nn.MultiheadAttention(dim, heads)
        self.head = nn.Linear(dim, classes)

    def forward(self, images):
        tokens = self.proj(PatchExtractor(self.patch)(images))
        tokens = runtime.cat((self.cls, tokens), dim=1)
        tokens = tokens + self.attention(self.norm(tokens), self.norm(tokens), self.norm(tokens))[0]
        return self.head(tokens[:, 0])


def test_a_parameter_free_module_made_in_forward_is_traced_through():
    runtime.manual_seed(0)
    model = TinyViT().double()
    images = [runtime.randn(2, 3, 8, 8, dtype=runtime.float64) for _ in range(2)]
    compiled = assert_calls_match(model, images)
    (artifact,) = compiled._cache.values()
    assert artifact.graph_breaks == [] and artifact.split is None


class BuildsALayerPerCall(nn.Module):
    """A layer with parameters made in forward: freshly drawn weights every call, which a graph cannot repeat."""

    def forward(self, x):
        return nn.Linear(3, 2).double()(x)


def test_a_module_with_parameters_made_in_forward_still_runs_eagerly():
    x = runtime.randn(4, 3, dtype=runtime.float64)
    compiled = nnc.compile(BuildsALayerPerCall())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first, second = compiled(x), compiled(x)
    assert not np.allclose(first.detach().numpy(), second.detach().numpy())  # new weights per call, as eager
    assert any("eager" in str(w.message) for w in caught)


class TeacherForcedDecoder(nn.Module):
    """A seq2seq decoder loop that feeds back its own prediction or the target, as Python's random module decides
    on each step (the teacher-forcing ratio of the well-known translation tutorials)."""

    def __init__(self):
        super().__init__()
        self.cell = nn.GRUCell(3, 4, dtype=runtime.float64)
        self.out = nn.Linear(4, 3, dtype=runtime.float64)

    def forward(self, target):
        h, token, outputs = runtime.zeros(target.shape[0], 4, dtype=runtime.float64), target[:, 0], []
        for t in range(1, target.shape[1]):
            h = self.cell(token, h)
            outputs.append(self.out(h))
            token = target[:, t] if random.random() < 0.5 else outputs[-1]
        return runtime.stack(outputs, 1)


class NoisyHead(nn.Module):
    """Scales by numpy's global generator (np.random.rand), drawn anew on every call."""

    def __init__(self):
        super().__init__()
        self.decoder = TeacherForcedDecoder()

    def forward(self, target):
        return self.decoder(target) * float(np.random.rand())


def _seeded_calls(model, inputs):
    outs = []
    for seed, x in enumerate(inputs):
        random.seed(seed)
        np.random.seed(seed)
        outs.append(model(x))
    outs[-1].sum().backward()
    return [o.detach().numpy() for o in outs], [p.grad.numpy() for p in model.parameters()]


def test_a_forward_drawing_from_pythons_or_numpys_random_decides_anew_on_every_compiled_call():
    """The draws (a submodule's random.random(), the root's np.random.rand()) would be frozen into a graph at the
    traced call's values: those forwards run eagerly, the rest compiles, and under the same seeds every call gives
    eager's outputs and gradients (the failed trace puts the generators back, so eager reruns draw the same)."""
    runtime.manual_seed(0)
    for model in (TeacherForcedDecoder(), NoisyHead()):
        inputs = [runtime.randn(2, 6, 3, dtype=runtime.float64) for _ in range(5)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = _seeded_calls(nnc.compile(copy.deepcopy(model)), inputs)
        want = _seeded_calls(model, inputs)
        for a, b in zip(got[0] + got[1], want[0] + want[1]):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    explained = str(nnc.explain(NoisyHead(), inputs[0]))
    assert "Python's random module" in explained or "numpy's global random generator" in explained


class PositionIdsEncoder(nn.Module):
    """Position ids kept as an expanded, non-persistent buffer (the Hugging Face BERT pattern): read-only memory."""

    def __init__(self, rows=1):
        super().__init__()
        self.register_buffer("position_ids", runtime.arange(12).expand((rows, -1)), persistent=False)
        self.positions = nn.Embedding(12, 4, dtype=runtime.float64)
        self.norm = nn.LayerNorm(4, dtype=runtime.float64)

    def forward(self, x):
        return self.norm(x + self.positions(self.position_ids[:, :x.shape[1]]))


def test_a_buffer_viewing_an_expanded_tensor_compiles():
    """Shape propagation used to write every buffer back after its run, and a write into that buffer raises: the
    whole model ran eagerly, with a warning."""
    runtime.manual_seed(0)
    for rows in (1, 2):
        inputs = [runtime.randn(2, 12, 4, dtype=runtime.float64) for _ in range(2)]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the fallback to eager warned
            assert_calls_match(PositionIdsEncoder(rows), inputs)
        assert "graph break" not in str(nnc.explain(PositionIdsEncoder(rows), inputs[0]))


class LegacyTypeNames(nn.Module):
    """Hugging Face GPT-2's attention casts with `w.type(v.dtype)`; older code branches on `x.type()`."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4, dtype=runtime.float64)

    def forward(self, x):
        q = self.proj(x)
        w = (q @ q.transpose(-1, -2)).softmax(-1).type(q.dtype)
        if x.type() == "torch.DoubleTensor":
            w = w * 2
        return (w @ q).type("torch.DoubleTensor")


def test_legacy_type_casts_and_queries_compile_without_a_graph_break():
    runtime.manual_seed(0)
    inputs = [runtime.randn(2, 5, 4, dtype=runtime.float64) for _ in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_calls_match(LegacyTypeNames(), inputs)
    explained = str(nnc.explain(LegacyTypeNames(), inputs[0]))
    assert "graph break" not in explained and "opaque node" not in explained
