"""Identical computations share kernels: a kernel's generated source names no graph node and not the kernel, so the
repeated blocks of a deep model give the same sources, one cache file and one numba compilation each."""
import re

import numpy as np

import nnc
import runtime
from nnc.codegen import cache
from nnc.codegen.cpu import generate
from nnc.graph import Graph
from nnc.kernel import Kernel
from nnc.passes import propagate_shapes
from nnc.prims import prims
from real_models import GPT, GPTConfig
from runtime import nn


def _kernel(prefix: str, kernel_name: str) -> Kernel:
    """tanh(x * w + b) summed over the last dim, with every node name starting with `prefix`."""
    g = Graph()
    x, w, b = (g.placeholder(f"{prefix}_{n}") for n in "xwb")
    h = g.call_function(prims["add"], (g.call_function(prims["mul"], (x, w)), b))
    t = g.call_function(prims["tanh"], (h,))
    s = g.call_function(prims["sum"], (t,), {"dims": (1,), "keepdim": False})
    g.output((t, s))
    for node in g.nodes:
        if node.op == "call_function":
            node.name = f"{prefix}_{node.name}"
    shapes = [runtime.zeros(6, 10), runtime.zeros(10), runtime.zeros(6, 1)]
    propagate_shapes(nnc.GraphModule(nn.Module(), g), *shapes)
    nodes = [n for n in g.nodes if n.op == "call_function"]
    return Kernel(kernel_name, "reduction", nodes, [x, w, b], [t, s], (6, 10))


def test_the_source_is_a_function_of_the_computation_only():
    a, b = generate(_kernel("first", "k3_reduction")), generate(_kernel("second", "k41_reduction"))
    assert a.source == b.source
    for name in ("first", "second", "k3_", "k41_"):
        assert name not in a.source
    # the legend, shown above the source by debug output and `nnc dump --stage codegen`, names the graph nodes
    assert "first_x" in a.annotated and "second_x" in b.annotated and "k41_reduction" in b.annotated
    assert a.annotated.endswith(a.source) and a.legend != b.legend


def _gpt_step_kernels(n_layer: int):
    """The compiled kernel steps of a small GPT's training step (forward and backward), and its loss and
    gradients next to eager's."""
    runtime.manual_seed(0)
    model = GPT(GPTConfig(block_size=8, vocab_size=16, n_layer=n_layer, n_head=2, n_embd=8))
    idx = runtime.tensor(np.random.default_rng(0).integers(0, 16, (2, 8)))
    compiled = nnc.compile(model)
    _, loss = compiled(idx, idx)
    loss.backward()
    grads = [p.grad.numpy().copy() for p in model.parameters()]
    for p in model.parameters():
        p.grad = None
    _, eager_loss = model(idx, idx)
    eager_loss.backward()
    np.testing.assert_allclose(loss.item(), eager_loss.item(), rtol=1e-5)
    for got, p in zip(grads, model.parameters()):
        np.testing.assert_allclose(got, p.grad.numpy(), rtol=1e-4, atol=1e-6)
    artifacts = [a for a in compiled._cache.values() if hasattr(a, "plans")]
    steps = [s for a in artifacts for p in a.plans for s in p.steps if hasattr(s, "compiled")]
    assert steps and not any(p.fallbacks for a in artifacts for p in a.plans)
    return steps


def test_identical_blocks_share_kernels(monkeypatch, tmp_path):
    monkeypatch.setenv(cache.ENV_VAR, str(tmp_path))
    two, three = _gpt_step_kernels(2), _gpt_step_kernels(3)
    assert len(three) > len(two)
    # a third block adds kernels but no kernel source: every one is a module the 2-layer model already has
    assert {s.compiled.path for s in three} == {s.compiled.path for s in two}
    assert all(s.compiled.cache_hit for s in three)  # nothing compiled by numba again
    # steps of one source run one compiled launcher, each with its own kernel's inputs and outputs
    by_path = {}
    for step in three:
        by_path.setdefault(step.compiled.path, []).append(step)
    shared = [steps for steps in by_path.values() if len(steps) > 1]
    assert shared
    for steps in shared:
        assert len({id(s.compiled._launch) for s in steps}) == 1
        assert len({id(s.kernel) for s in steps}) == len(steps)
    # the rest of the files are libraries the kernels import (block helpers, matmul epilogues), each written once
    libraries = {cache.source_path(lib, tmp_path) for s in three for lib in generate(s.kernel).libraries}
    assert libraries and set(tmp_path.glob("k_*.py")) == set(by_path) | libraries


class LSTMLM(nn.Module):
    """An LSTM language model's step shape: each time step reads its slice of the input projection computed for
    every step at once, a folded view at an offset that grows with the step."""

    def __init__(self):
        super().__init__()
        self.emb, self.rnn, self.head = nn.Embedding(30, 8), nn.LSTM(8, 8, 2), nn.Linear(8, 30)

    def forward(self, x):
        out, _ = self.rnn(self.emb(x))
        return runtime.log_softmax(self.head(out), dim=-1)


def _lstm_kernels(steps: int) -> tuple[list, set]:
    """(the kernels of a compiled LSTM LM's training step over `steps` time steps, its numba functions' modules);
    checks its outputs and gradients against eager."""
    from helpers import compiled_matches_eager

    runtime.manual_seed(0)
    x = runtime.tensor(np.random.default_rng(steps).integers(0, 30, (steps, 3)))
    compiled = compiled_matches_eager(LSTMLM().double(), x)
    kernels = [k for c in compiled.compilations for p in c.plans for k in p.kernels if k.kind != "opaque"]
    generated = [generate(k) for k in kernels]
    defining = {cache.module_name(source) for g in generated for source in [g.source] + g.libraries
                if "@njit" in source}
    _LAST_KERNELS[:] = kernels
    return generated, defining


_LAST_KERNELS: list = []
_REBASED = re.compile(r"ins\[\d+\]\.reshape\(-1\)\[\d+:\]")  # an input passed from an offset


def test_the_steps_of_an_rnn_share_their_numba_functions(monkeypatch, tmp_path):
    """A step's kernel reads its inputs from where the launch line slices them, so the numba code of every step is
    one library: twice as many steps add kernels (launch lines) but no numba function to compile."""
    monkeypatch.setenv(cache.ENV_VAR, str(tmp_path))
    three, three_defining = _lstm_kernels(3)
    six, six_defining = _lstm_kernels(6)
    assert len(six) > len(three)
    rebased = [g for g in six if _REBASED.search("\n".join(g.launch))]
    assert rebased and all(g.libraries and "@njit" not in g.source for g in rebased)
    # kernels over whole sequences change with their length, but there are as many of them: the count of modules
    # defining numba functions stays (it grew by four per step when each step's offsets were in its code)
    assert len(six) >= len(three) + 30 and len(six_defining) <= len(three_defining)


def test_kernels_reading_inputs_from_an_offset_match_their_whole_graph_form(monkeypatch, tmp_path):
    """Each step's kernel with rebased views gives bit for bit what its unrebased form (as a whole graph generates
    it, offsets in the numba code) gives, on the same random inputs."""
    from nnc.codegen.cpu import compile_generated

    monkeypatch.setenv(cache.ENV_VAR, str(tmp_path))
    _lstm_kernels(4)
    rebased = [k for k in _LAST_KERNELS if _REBASED.search("\n".join(generate(k).launch))]
    assert len(rebased) >= 4
    rng = np.random.default_rng(0)
    for kernel in rebased:
        ours = compile_generated(kernel, generate(kernel))
        whole = compile_generated(kernel, generate(kernel, standalone=False))
        assert not _REBASED.search(whole.source)
        inputs = [rng.standard_normal(shape).astype(dtype) for shape, dtype in ours.in_specs]
        for got, want in zip(ours.run(inputs), whole.run(inputs)):
            np.testing.assert_array_equal(got, want)
