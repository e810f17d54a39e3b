"""Identical computations share kernels: a kernel's generated source names no graph node and not the kernel, so the
repeated blocks of a deep model give the same sources, one cache file and one numba compilation each."""
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
