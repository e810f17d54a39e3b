"""Real model shapes through nnc.compile: a GPT, an LSTM language model and a graph break train as eager does."""
from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest

import nnc
import runtime
import runtime.nn.functional as F
from runtime import nn

import real_models


def train(model, batches, lr=0.05):
    """Losses, gradients after each step and final parameters of SGD-with-momentum steps, one per batch."""
    opt = runtime.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses, grads = [], []
    for inputs in batches:
        opt.zero_grad()
        loss = model(*inputs)
        loss = loss[1] if isinstance(loss, tuple) else loss
        loss.backward()
        losses.append(loss.item())
        grads.append([None if p.grad is None else p.grad.numpy().copy() for p in model.parameters()])
        opt.step()
    return losses, grads, [p.detach().numpy().copy() for p in model.parameters()]


def assert_trains_the_same(model, batches):
    """Compiled and eager copies of `model` train to the same losses, gradients and weights (float64, 1e-9)."""
    compiled = nnc.compile(copy.deepcopy(model))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to eager, no kernel failing to compile
        got = train(compiled, batches)
    want = train(model, batches)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-9)
    for step_got, step_want in zip(got[1], want[1]):
        for g, w in zip(step_got, step_want):
            assert (g is None) == (w is None)
            if w is not None:
                np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12)
    for g, w in zip(got[2], want[2]):
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12)
    return compiled


def gpt_batches(config, steps=3, batch=2, length=8):
    return [(runtime.randint(0, config.vocab_size, (batch, length)),
             runtime.randint(0, config.vocab_size, (batch, length))) for _ in range(steps)]


def only_artifact(compiled):
    (artifact,) = compiled._cache.values()
    return artifact


# -- a GPT -------------------------------------------------------------------------------------------------------

def test_gpt_with_size_asserts_and_tied_embeddings_trains_compiled_as_eager():
    runtime.manual_seed(0)
    config = real_models.GPTConfig()
    model = real_models.GPT(config).double()
    compiled = assert_trains_the_same(model, gpt_batches(config))
    artifact = only_artifact(compiled)
    assert artifact.graph_breaks == [] and artifact.split is None
    assert artifact.training_plan is not None and artifact.backward_plan is not None  # forward and backward compiled


def test_gpt_still_raises_for_symbolic_trace():
    """nnc.trace keeps torch.fx's symbolic sizes: the assert on a size cannot run there."""
    with pytest.raises(nnc.TraceError, match="control flow"):
        nnc.trace(real_models.GPT(real_models.GPTConfig()))


def test_gpt_sizes_are_specialized_and_guarded():
    runtime.manual_seed(0)
    config = real_models.GPTConfig()
    model = real_models.GPT(config).double().eval()
    compiled = nnc.compile(copy.deepcopy(model))
    for length in (5, 7, 5):
        idx = runtime.randint(0, config.vocab_size, (1, length))
        with runtime.no_grad():
            np.testing.assert_allclose(compiled(idx)[0].numpy(), model(idx)[0].numpy(), rtol=1e-9)
    assert compiled.compiled_variants == 2  # one per length; the third call reuses the first


def test_gpt_generate_runs_through_the_compiled_forward():
    runtime.manual_seed(0)
    config = real_models.GPTConfig(n_layer=1)
    model = real_models.GPT(config).double().eval()
    compiled = nnc.compile(copy.deepcopy(model))
    prompt = runtime.zeros(1, 3, dtype=runtime.int64)
    runtime.manual_seed(1)
    want = model.generate(prompt, 3, top_k=5)
    runtime.manual_seed(1)
    got = compiled.generate(prompt, 3, top_k=5)
    assert got.tolist() == want.tolist()
    # the loop's self(...) is the compiled module: length 3 compiles static, 4 with the length symbolic, which 5 reuses
    assert compiled.compiled_variants == 2 and len(compiled._cache) == 1
    assert compiled._dynamic_dims == {("idx", 0): {1}}


def test_generating_many_tokens_compiles_at_most_twice():
    runtime.manual_seed(0)
    config = real_models.GPTConfig(n_layer=1, block_size=8)
    model = real_models.GPT(config).eval()
    compiled = nnc.compile(copy.deepcopy(model))
    runtime.manual_seed(1)
    want = model.generate(runtime.zeros(1, 1, dtype=runtime.int64), 20)
    runtime.manual_seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no recompile-limit warning either
        got = compiled.generate(runtime.zeros(1, 1, dtype=runtime.int64), 20)
    assert got.tolist() == want.tolist()
    assert compiled.compiled_variants == 2


# -- tied parameters ---------------------------------------------------------------------------------------------

class TiedLM(nn.Module):
    def __init__(self, vocab=11, dim=6):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, idx, targets):
        logits = self.head(runtime.tanh(self.embed(idx)))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def test_tied_weight_gets_the_gradient_of_both_uses():
    runtime.manual_seed(0)
    model = TiedLM().double()
    batches = [(runtime.randint(0, 11, (3, 4)), runtime.randint(0, 11, (3, 4))) for _ in range(3)]
    compiled = assert_trains_the_same(model, batches)
    assert compiled.head.weight is compiled.embed.weight and compiled.embed.weight.grad is not None
    forward = only_artifact(compiled).forward.graph
    reads = [n for n in forward.nodes if n.op == "get_attr" and n.target.endswith("weight")]
    assert len(reads) == 1  # one parameter, one node: its gradient cannot be split or lost


def test_parameter_read_by_two_paths_is_one_parameter():
    runtime.manual_seed(0)
    shared = nn.Linear(4, 4).double()
    model = nn.Sequential(shared, nn.Tanh(), shared)
    x = runtime.randn(3, 4, dtype=runtime.float64)
    assert_trains_the_same(nn.Sequential(model, _Sum()), [(x,), (x * 2,)])


class _Sum(nn.Module):
    def forward(self, x):
        return (x * x).sum()


def test_trainable_embedding_backward_compiles():
    runtime.manual_seed(0)

    class Bag(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(9, 5)

        def forward(self, idx):
            return (self.embed(idx) ** 2).sum()

    compiled = assert_trains_the_same(Bag().double(), [(runtime.tensor([[1, 2, 2], [8, 0, 1]]),)] * 2)
    assert only_artifact(compiled).backward_plan is not None


# -- an LSTM language model with a tuple hidden state -----------------------------------------------------------

class LanguageModelLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = real_models.RNNModel()

    def forward(self, tokens, hidden, targets):
        output, _ = self.rnn(tokens, hidden)
        return F.nll_loss(output, targets.view(-1))


def test_lstm_language_model_with_tuple_hidden_state_and_tied_weights_trains_as_eager():
    runtime.manual_seed(0)
    model = LanguageModelLoss().double()
    batches = [(runtime.randint(0, 50, (5, 3)),
                tuple(runtime.randn(2, 3, 16, dtype=runtime.float64) for _ in range(2)),
                runtime.randint(0, 50, (5, 3))) for _ in range(3)]
    compiled = assert_trains_the_same(model, batches)
    assert compiled.compiled_variants == 1  # new hidden values are inputs, not constants baked into the graph
    assert [n.target for n in only_artifact(compiled).forward.graph.placeholders] == \
        ["tokens", "hidden_0", "hidden_1", "targets"]


def test_hidden_state_out_and_back_in():
    """The usual loop: the returned (h, c) is fed to the next call."""
    runtime.manual_seed(0)
    model = real_models.RNNModel().double().eval()
    compiled = nnc.compile(copy.deepcopy(model))
    hidden_e = hidden_c = compiled.init_hidden(2)
    for _ in range(3):
        tokens = runtime.randint(0, 50, (4, 2))
        with runtime.no_grad():
            out_e, hidden_e = model(tokens, hidden_e)
            out_c, hidden_c = compiled(tokens, hidden_c)
        np.testing.assert_allclose(out_c.numpy(), out_e.numpy(), rtol=1e-9)
        assert isinstance(hidden_c, tuple) and len(hidden_c) == 2
    assert compiled.compiled_variants == 1


def test_dict_inputs_and_outputs():
    class Heads(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(3, 2), nn.Linear(3, 2)

        def forward(self, batch):
            return {"sum": self.a(batch["x"]) + self.b(batch["y"]), "x": batch["x"] * 2}

    runtime.manual_seed(0)
    model = Heads().double()
    compiled = nnc.compile(copy.deepcopy(model))
    batch = {"x": runtime.randn(4, 3, dtype=runtime.float64), "y": runtime.randn(4, 3, dtype=runtime.float64)}
    got, want = compiled(batch), model(batch)
    assert list(got) == ["sum", "x"]
    for key in got:
        np.testing.assert_allclose(got[key].detach().numpy(), want[key].detach().numpy(), rtol=1e-9)
    assert got["sum"].requires_grad and not got["x"].requires_grad  # x * 2 does not depend on a parameter


def test_explain_takes_what_forward_takes():
    model = real_models.RNNModel().double()
    report = nnc.explain(model, runtime.randint(0, 50, (3, 2)), model.init_hidden(2))
    assert report.kernels and not report.graph_breaks


# -- the wrapped model's own attributes ------------------------------------------------------------------------

def test_compiled_module_forwards_the_models_attributes_and_methods():
    model = real_models.RNNModel().double()
    compiled = nnc.compile(model)
    assert compiled.nhid == model.nhid and compiled.ntoken == 50
    hidden = compiled.init_hidden(3)
    assert [tuple(h.shape) for h in hidden] == [(2, 3, 16), (2, 3, 16)]
    with pytest.raises(AttributeError, match="no_such_thing"):
        compiled.no_such_thing


def test_a_compiled_container_has_the_models_length():
    assert len(nnc.compile(nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)))) == 3
    with pytest.raises(TypeError, match="Linear does not support len"):
        len(nnc.compile(nn.Linear(2, 3)))
    assert nnc.compile(nn.Linear(2, 3)) and not nnc.compile(nn.Sequential())  # truth as the model's


def test_method_calling_super_runs_on_the_original():
    class Base(nn.Module):
        def describe(self):
            return "base"

    class Child(Base):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2, 2)

        def forward(self, x):
            return self.fc(x)

        def describe(self):
            return "child of " + super().describe()

    assert nnc.compile(Child()).describe() == "child of base"


# -- graph breaks ----------------------------------------------------------------------------------------------

class GatedLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = real_models.GatedMLP()

    def forward(self, x):
        return (self.body(x) ** 2).mean()


def test_data_dependent_submodule_runs_eagerly_and_the_rest_compiles():
    runtime.manual_seed(0)
    model = GatedLoss().double()
    batches = [(runtime.randn(4, 8, dtype=runtime.float64) * scale,) for scale in (0.1, 10.0, 0.1)]
    compiled = assert_trains_the_same(model, batches)  # both branches of the gate taken
    artifact = only_artifact(compiled)
    assert [b.path for b in artifact.graph_breaks] == ["body.gate"]
    assert [n.target for n in artifact.split.eager_nodes] == ["body.gate"]
    assert len(artifact.split.pieces) == 2
    assert all(p.compiled.training_plan is not None for p in artifact.split.pieces)


def test_graph_break_without_gradients():
    runtime.manual_seed(0)
    model = real_models.GatedMLP().double()
    compiled = nnc.compile(copy.deepcopy(model))
    for scale in (0.1, 10.0):
        x = runtime.randn(4, 8, dtype=runtime.float64) * scale
        with runtime.no_grad():
            np.testing.assert_allclose(compiled(x).numpy(), model(x).numpy(), rtol=1e-9)


def test_explain_lists_graph_breaks_with_the_users_line():
    report = nnc.explain(GatedLoss().double(), runtime.randn(4, 8, dtype=runtime.float64), backward=True)
    assert [path for path, _ in report.graph_breaks] == ["body.gate"]
    text = str(report)
    assert "graph break: body.gate runs eagerly" in text and "if x.abs().mean() > 1.0" in text
    assert "2 compiled pieces around 1 eager calls" in text


class BranchingRoot(nn.Module):
    """The root's own forward branches on a tensor value: it runs eagerly, its submodules compile."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(2)])
        self.head = nn.Linear(8, 3)

    def forward(self, x, target):
        h = self.embed(x)
        if h.mean() > 0:
            h = h * 0.5
        for block in self.blocks:
            h = block(h)
        return F.cross_entropy(self.head(h), target)


def test_a_root_that_branches_on_values_compiles_its_submodules_and_trains_as_eager():
    runtime.manual_seed(0)
    model = BranchingRoot().double()
    batches = [(runtime.randn(5, 4, dtype=runtime.float64) + shift, runtime.randint(0, 3, (5,)))
               for shift in (2.0, -2.0, 2.0)]  # both branches
    compiled = assert_trains_the_same(model, batches)  # no warning: the submodules compiled
    partly = compiled._partly
    assert sorted(partly.compiled) == ["blocks.0", "blocks.1", "embed", "head"]
    assert all(c.compiled_variants == 1 for c in partly.compiled.values())
    assert type(compiled._module.embed) is nn.Linear  # the registries hold the originals between calls
    assert list(compiled.state_dict()) == list(model.state_dict())


def test_a_root_break_keeps_submodule_hooks_firing_once_and_restores_after_an_error():
    model = BranchingRoot()
    calls = []
    model.head.register_forward_hook(lambda module, args, out: calls.append(module))
    compiled = nnc.compile(model)
    compiled(runtime.randn(3, 4), runtime.randint(0, 3, (3,)))
    assert len(calls) == 1
    with pytest.raises(IndexError):
        compiled(runtime.randn(3, 4), runtime.tensor([0, 1, 7]))  # a target out of range raises in eager too
    assert type(model.head) is nn.Linear and type(model.blocks[0]) is nn.Sequential


def test_explain_shows_a_root_break_and_the_kernels_of_its_submodules():
    report = nnc.explain(BranchingRoot(), runtime.randn(3, 4), runtime.randint(0, 3, (3,)), backward=True)
    text = str(report)
    assert "graph break: BranchingRoot.forward runs eagerly" in text and "if h.mean() > 0" in text
    assert {k.name.split(":")[0] for k in report.kernels} == {"embed", "blocks.0", "blocks.1", "head"}
    assert report.backward_kernels


def test_a_root_with_no_submodules_that_branches_still_warns():
    class Root(nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else -x

    compiled = nnc.compile(Root())
    with pytest.warns(RuntimeWarning, match="could not compile Root"):
        compiled(runtime.ones(2, 3))


# -- recompiles ------------------------------------------------------------------------------------------------

def test_recompile_limit_counts_successful_compiles_and_names_what_changed():
    model = nn.Linear(3, 2)
    compiled = nnc.compile(model, recompile_limit=2)
    with runtime.no_grad():
        compiled(runtime.ones(1, 3))
        compiled(runtime.ones(1, 1, 3))
        with pytest.warns(RuntimeWarning, match=r"recompile limit; changed: input's shape \(1, 3\) -> \(1, 1, 3\)"):
            compiled(runtime.ones(1, 1, 1, 3))
    assert compiled.compiled_variants == 2


def test_failed_compiles_do_not_count_towards_the_limit():
    class Sometimes(nn.Module):
        def forward(self, x):
            if x.shape[0] == 1:
                return x.nonzero_static_unknown()  # an AttributeError while tracing: compiling fails
            return x * 2

    compiled = nnc.compile(Sometimes(), recompile_limit=1)
    with pytest.warns(RuntimeWarning, match="could not compile"):
        with pytest.raises(AttributeError):
            compiled(runtime.ones(1, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(compiled(runtime.ones(2, 3)).numpy(), 2.0)
    assert compiled.compiled_variants == 1


def test_gpt_with_dropout_trains_as_one_graph_repeatably():
    """Dropout draws its masks inside the kernels (Philox, seeded from runtime's generator): the graph is not split,
    the same seed repeats a compiled run exactly, and the masks are other than eager's (same rate and scaling)."""
    runtime.manual_seed(0)
    config = real_models.GPTConfig(dropout=0.1, n_layer=1)
    model = real_models.GPT(config).double()
    batches = gpt_batches(config, steps=2)
    runs = []
    for _ in range(2):
        compiled = nnc.compile(copy.deepcopy(model))
        runtime.manual_seed(7)
        runs.append(train(compiled, batches))
    artifact = only_artifact(compiled)
    assert artifact.split is None and artifact.training_plan is not None and artifact.backward_plan is not None
    (losses, grads, params), (losses2, grads2, params2) = runs
    assert losses == losses2
    for a, b in zip(params, params2):
        np.testing.assert_array_equal(a, b)
    runtime.manual_seed(7)
    want = train(model, batches)
    assert losses != want[0]
    np.testing.assert_allclose(losses, want[0], rtol=0.05)  # the same model and data: close, not equal


class TopKGate(nn.Module):
    """A mixture-of-experts style gate: the named tuples of topk and sort read by field."""

    def __init__(self):
        super().__init__()
        self.score = nn.Linear(8, 6)
        self.out = nn.Linear(6, 1)

    def forward(self, x):
        scores = self.score(x)
        top = scores.topk(2, dim=-1)
        gate = top.values.softmax(-1).sum(-1, keepdim=True)
        ranks = scores.sort(-1).indices.to(scores.dtype)
        return (self.out(scores * gate + ranks / 6) ** 2).mean()


def test_named_tuples_of_topk_and_sort_keep_their_fields_and_compile():
    runtime.manual_seed(0)
    model = TopKGate().double()
    batches = [(runtime.randn(4, 8, dtype=runtime.float64),) for _ in range(2)]
    compiled = assert_trains_the_same(model, batches)
    artifact = only_artifact(compiled)  # the choice of entries is an op of the graph: nothing runs eagerly
    assert artifact.split is None and not artifact.opaque
    ops = {n.target.op.name for n in artifact.forward.graph.nodes if hasattr(n.target, "op")}
    assert {"topk_indices", "sort_indices"} <= ops
    with runtime.no_grad():
        x = runtime.randn(3, 8, dtype=runtime.float64)
        np.testing.assert_allclose(compiled(x).numpy(), model(x).numpy(), rtol=1e-12)
