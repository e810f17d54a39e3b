"""nnc.passes.memory: buffer reuse across kernels. Plans are checked by an explicit liveness simulation (no two
live values share a buffer) and by running the kernels with every planned value stored in its planned buffer:
a buffer reused too early would corrupt a later read and change the result."""
from __future__ import annotations

import numpy as np
import pytest

import nnc
import runtime as torch
from nnc.graph import map_arg
from nnc.passes.fusion import fuse
from nnc.passes.memory import MemoryPlan, plan_memory
from runtime._aligned import ALIGNED_MIN_BYTES, CACHE_LINE, aligned_empty
from helpers import call
from test_fusion import X48, array, build, random_body

SUM1 = dict(dims=(1,), keepdim=True)


def reduction_chain(layers):
    """tanh -> amax -> (sub, tanh) -> amax -> ...: kernels alternate between [64, 64] and [1, 64] results. The
    maxima run over dim 0: over the last dim, the whole chain would be one row kernel with no buffers between."""
    def body(g, x):
        e = call(g, "tanh", x)
        for _ in range(layers):
            m = call(g, "amax", e, dims=(0,), keepdim=True)
            e = call(g, "tanh", call(g, "sub", e, m))
        return call(g, "mul", e, 2.0)

    return body


def lifetimes(kernels, graph, plan: MemoryPlan):
    """(defined, last use) per planned value, worked out here from the kernels alone (views extend their base)."""
    kernel_of = {n: i for i, k in enumerate(kernels) for n in k.nodes}
    base = dict(plan.aliases)
    result = {}
    for node in plan.slots:
        readers = [j for j, k in enumerate(kernels) for a in k.inputs if a is node or base.get(a) is node]
        result[node] = (kernel_of[node], max(readers, default=kernel_of[node]))
    return result


def check_no_live_overlap(kernels, graph, plan: MemoryPlan):
    """Step through the kernels: at each step, the values alive (defined, not yet past their last use) must sit
    in distinct buffers, and every buffer is large enough for what it holds."""
    spans = lifetimes(kernels, graph, plan)
    for node, slot in plan.slots.items():
        assert (slot.defined, slot.last_use) == spans[node]
        assert plan.buffers[slot.buffer].nbytes >= slot.nbytes
        assert node in plan.buffers[slot.buffer].values
    for step in range(len(kernels)):
        live = [n for n, (start, end) in spans.items() if start <= step <= end]
        used = [plan.buffer_of[n] for n in live]
        assert len(used) == len(set(used)), f"kernel {step}: live values share a buffer: {live}"


def run_in_buffers(gm, kernels, examples, plan: MemoryPlan):
    """Run the kernels, keeping each planned value only in its planned buffer (views look into it)."""
    interp = nnc.Interpreter(gm)
    expected = interp.run(*examples)
    arenas = plan.allocate()
    for arena in arenas:
        arena[:] = 0xAB  # garbage, so reading a value that was never written shows
    env = {n: interp.env[n] for n in gm.graph.nodes if n.op in ("placeholder", "get_attr")}
    for k in kernels:
        local = {n: env[n] for n in k.inputs}
        for view, m in k.meta.get("views", {}).items():  # folded views read their bases' buffers
            local[view] = torch.tensor(m.apply(array(local[m.base])))
        for node in k.nodes:
            local[node] = node.target(*map_arg(node.args, local.__getitem__), **map_arg(node.kwargs, local.__getitem__))
        for out in k.outputs:
            if out in plan.slots:
                target = plan.view(arenas, out)
                np.copyto(target, array(local[out]))
                env[out] = torch.from_numpy(target)  # later kernels read the buffer, not the kernel's own array
            else:
                env[out] = local[out]
    result = map_arg(gm.graph.output_node.args[0], env.__getitem__)
    return result, expected


def assert_same(result, expected):
    if isinstance(expected, (tuple, list)):
        for r, e in zip(result, expected):
            assert_same(r, e)
    else:
        np.testing.assert_allclose(array(result), array(expected), rtol=1e-6, atol=1e-6, equal_nan=True)


def planned(body, *examples):
    gm, examples = build(body, *examples)
    kernels = fuse(gm.graph)
    plan = plan_memory(kernels, gm.graph)
    check_no_live_overlap(kernels, gm.graph, plan)
    assert_same(*run_in_buffers(gm, kernels, examples, plan))
    return gm, kernels, plan


def test_long_chain_reuses_buffers():
    gm, kernels, plan = planned(reduction_chain(8), torch.randn(64, 64))
    # each (sub, tanh, amax) is one pass that writes the tanh and its amax
    assert [(k.kind, k.meta["ops"]) for k in kernels][:2] == [("reduction", ["tanh", "amax"]),
                                                              ("reduction", ["sub", "tanh", "amax"])]
    # 8 tanh results [64, 64] and 8 amax results [1, 64]; the last tanh is fused with the output mul
    assert len(plan.slots) == 16
    big, small = 64 * 64 * 4, 64 * 4
    assert plan.bytes_without_reuse == 8 * big + 8 * small
    # a kernel reads the tanh and amax the previous one wrote, while it writes its own: two big and two small
    # buffers alternate
    assert sorted(b.nbytes for b in plan.buffers) == [small, small, big, big]
    assert plan.bytes_with_reuse == 2 * big + 2 * small
    assert [len(b.values) for b in plan.buffers] == [4, 4, 4, 4]
    assert "16 planned values in 4 buffers" in plan.summary()


def test_graph_outputs_and_views_of_inputs_are_not_planned():
    def body(g, x):
        r = call(g, "reshape", x, shape=(8, 4))  # view of a graph input
        a = call(g, "exp", r)
        s = call(g, "sum", a, dims=(0,), keepdim=True)  # over the last dim, exp would stay inside one row kernel
        return call(g, "div", a, s), s  # s is returned too

    gm, kernels, plan = planned(body, X48())
    names = {n.name: why for n, why in plan.unplanned.items()}
    # the reshape is folded into exp's kernel, which reads x itself
    assert names == {"div": "graph output", "sum_1": "graph output"}
    assert [n.name for n in plan.slots] == ["exp"]


def test_view_of_an_intermediate_keeps_its_base_alive():
    """exp -> reshape (a view into exp's buffer) -> ... read two kernels later: exp's buffer stays taken until
    then, even though no kernel reads exp itself after the reshape."""
    def body(g, x):
        a = call(g, "exp", x)
        v = call(g, "reshape", a, shape=(8, 4))
        s1 = call(g, "sum", call(g, "neg", x), **SUM1)  # unrelated kernels in between
        t = call(g, "tanh", call(g, "add", x, s1))
        s2 = call(g, "amax", t, **SUM1)
        w = call(g, "add", call(g, "reshape", v, shape=(4, 8)), s2)
        return w

    gm, kernels, plan = planned(body, X48())
    exp = next(n for n in gm.graph.nodes if n.name == "exp")
    reshape_1 = next(n for n in gm.graph.nodes if n.name == "reshape_1")
    # both reshapes fold into the last kernel, which reads exp's buffer through them
    last_reader = max(i for i, k in enumerate(kernels) if reshape_1 in k.meta["views"])
    assert last_reader == len(kernels) - 1 and exp in kernels[last_reader].inputs
    assert plan.slots[exp].last_use == last_reader


def test_a_view_kept_as_a_step_keeps_its_base_alive():
    """A view read by an opaque node (cumsum) runs as a step and aliases its base's buffer."""
    def body(g, x):
        a = call(g, "exp", x)
        v = call(g, "reshape", a, shape=(8, 4))
        s = call(g, "sum", call(g, "neg", x), **SUM1)
        return call(g, "add", call(g, "cumsum", v, dim=1), 1.0), s

    gm, kernels, plan = planned(body, X48())
    exp = next(n for n in gm.graph.nodes if n.name == "exp")
    view = next(n for n in gm.graph.nodes if n.name == "reshape")
    cumsum = next(i for i, k in enumerate(kernels) if k.meta["ops"] == ["cumsum"])
    assert plan.aliases[view] is exp and plan.slots[exp].last_use == cumsum


def test_a_view_returned_by_the_graph_keeps_its_base_out_of_the_plan():
    def body(g, x):
        a = call(g, "exp", x)
        return call(g, "reshape", a, shape=(8, 4))

    gm, kernels, plan = planned(body, X48())
    assert plan.slots == {}
    assert sorted(plan.unplanned.values()) == ["a graph output is a view of it", "graph output (a view)"]


def test_a_smaller_value_reuses_a_larger_free_buffer():
    def body(g, x):
        a = call(g, "exp", x)  # [4, 8], read by reductions over different dims: written by the first one's pass
        b = call(g, "sum", a, **SUM1)  # [4, 1]
        c = call(g, "amax", a, dims=(0,), keepdim=True)  # [1, 8]: a dies here
        e = call(g, "sum", call(g, "add", b, c), dims=(0, 1), keepdim=True)  # [1, 1], defined after a died
        return call(g, "mul", call(g, "expand", e, shape=(4, 8)), x)  # e read through a view

    gm, kernels, plan = planned(body, X48())
    slots = {n.name: s for n, s in plan.slots.items()}
    assert list(slots) == ["exp", "sum_1", "amax", "sum_2"]
    assert slots["sum_1"].buffer != slots["exp"].buffer != slots["amax"].buffer  # all alive at kernel 1
    assert slots["sum_2"].buffer == slots["exp"].buffer and slots["sum_2"].nbytes == 4  # 4 bytes in a 128-byte one
    assert plan.buffers[slots["exp"].buffer].nbytes == 128
    assert slots["sum_2"].last_use == len(kernels) - 1  # the mul reads it through the expand
    assert (plan.bytes_without_reuse, plan.bytes_with_reuse) == (128 + 16 + 32 + 4, 128 + 16 + 32)


def test_best_fit_prefers_an_exact_size():
    def body(g, x):
        a = call(g, "exp", x)  # [4, 8]
        s = call(g, "sum", a, dims=(0,), keepdim=True)  # [1, 8], written with a by one pass
        m = call(g, "amax", call(g, "add", a, s), dims=(1,), keepdim=True)  # [4, 1]: a and s die here
        v = call(g, "sum", call(g, "mul", x, m), dims=(0,), keepdim=True)  # [1, 8]
        return call(g, "add", call(g, "expand", v, shape=(4, 8)), x)

    gm, kernels, plan = planned(body, X48())
    slots = {n.name: s for n, s in plan.slots.items()}
    assert list(slots) == ["exp", "sum_1", "amax", "sum_2"]
    # when sum_2 is written, both exp's 128-byte buffer and sum_1's 32-byte one are free: the exact size wins
    assert slots["exp"].last_use < slots["sum_2"].defined and slots["sum_1"].last_use < slots["sum_2"].defined
    assert slots["sum_2"].buffer == slots["sum_1"].buffer


def test_values_of_one_kernel_never_share():
    def body(g, x):
        a = call(g, "exp", x)
        b = call(g, "neg", a)
        # one pass, which also writes b (over dim 0: the maxima over rows and the add would make one row kernel)
        s, m = call(g, "sum", a, dims=(0,), keepdim=True), call(g, "amax", b, dims=(0,), keepdim=True)
        t = call(g, "sum", b, dims=(1,), keepdim=False)
        return call(g, "add", call(g, "mul", x, s), m), t

    gm, kernels, plan = planned(body, X48())
    [k] = [k for k in kernels if len(k.outputs) == 3]
    assert [n.name for n in k.outputs] == ["neg", "sum_1", "amax"]
    assert len({plan.buffer_of[n] for n in k.outputs}) == 3


@pytest.mark.parametrize("seed", range(40))
def test_random_graphs_plan_safely(seed):
    idx = torch.tensor(np.random.default_rng(seed).integers(0, 8, size=(4, 8)))
    planned(random_body(seed), X48(), idx)


def test_decomposed_mlp_plan():
    from nnc.passes.decompose import decompose
    from test_fusion import MLP

    torch.manual_seed(0)
    model = MLP()
    x = torch.randn(5, 8)
    gm = decompose(nnc.trace(model), x)
    kernels = fuse(gm.graph)
    plan = plan_memory(kernels, gm.graph)
    check_no_live_overlap(kernels, gm.graph, plan)
    result, expected = run_in_buffers(gm, kernels, (x,), plan)
    assert_same(result, model(x))
    assert plan.bytes_with_reuse < plan.bytes_without_reuse


def test_the_checks_catch_a_buffer_reused_too_early():
    """Sanity check of this file's oracles: put amax into tanh's buffer (both written by kernel 0) while tanh is
    still to be read by kernel 1."""
    import dataclasses

    gm, examples = build(reduction_chain(2), torch.randn(16, 16))
    kernels = fuse(gm.graph)
    plan = plan_memory(kernels, gm.graph)
    slots = {n.name: n for n in plan.slots}
    tanh, amax = slots["tanh"], slots["amax"]
    assert plan.slots[tanh].defined <= plan.slots[amax].defined <= plan.slots[tanh].last_use
    plan.slots[amax] = dataclasses.replace(plan.slots[amax], buffer=plan.slots[tanh].buffer)
    plan.buffers[plan.slots[tanh].buffer].values.append(amax)
    with pytest.raises(AssertionError, match="live values share a buffer"):
        check_no_live_overlap(kernels, gm.graph, plan)
    with pytest.raises(AssertionError):
        assert_same(*run_in_buffers(gm, kernels, examples, plan))


@pytest.mark.parametrize("shape,dtype", [((4096, 1024), np.float32), ((3, 50000), np.float64),
                                         ((ALIGNED_MIN_BYTES,), np.uint8), ((0, 4), np.float32), ((4, 4), np.int64)])
def test_aligned_empty_starts_large_arrays_on_a_cache_line(shape, dtype):
    a = aligned_empty(shape, dtype)
    assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous and a.flags.writeable
    if a.nbytes >= ALIGNED_MIN_BYTES:
        assert a.ctypes.data % CACHE_LINE == 0
    else:
        assert a.base is None  # small arrays: plain np.empty
    a[...] = 3
    assert (a == 3).all()


@pytest.mark.parametrize("make", [
    lambda: torch.zeros(128, 256), lambda: torch.ones(20000, dtype=torch.float64), lambda: torch.empty(64, 1024),
    lambda: torch.full((3, 40000), 2.0), lambda: torch.rand(256, 128), lambda: torch.randn(50000, dtype=torch.float64),
    lambda: torch.nn.Linear(784, 512).weight.detach()])
def test_large_factory_tensors_start_on_a_cache_line(make):
    """Tensors from runtime's factories, parameters among them, are aligned as compiled kernels' buffers are."""
    t = make()
    assert t.numpy().nbytes >= ALIGNED_MIN_BYTES and t.numpy().ctypes.data % CACHE_LINE == 0


def test_aligned_random_draws_are_the_generators_stream():
    """Drawing into an aligned buffer takes the same numbers as a plain draw: a large draw's first values are a small
    draw's under the same seed."""
    torch.manual_seed(7)
    small = torch.randn(10)
    torch.manual_seed(7)
    large = torch.randn(100000)
    assert large.numpy().ctypes.data % CACHE_LINE == 0
    np.testing.assert_array_equal(large.numpy()[:10], small.numpy())


def test_large_compiled_outputs_and_arenas_start_on_a_cache_line():
    """The executor's fresh outputs and the memory plan's large arenas are aligned (vector stores never split)."""
    _, _, plan = planned(reduction_chain(2), torch.randn(128, 160))  # [128, 160] float32: 80 KiB buffers
    arenas = plan.allocate()
    assert [a.nbytes for a in arenas] == [b.nbytes for b in plan.buffers]
    assert all(a.ctypes.data % CACHE_LINE == 0 for a in arenas if a.nbytes >= ALIGNED_MIN_BYTES)
    assert any(a.nbytes >= ALIGNED_MIN_BYTES for a in arenas)

    class Affine(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x * 3.0 - 1.0) + 0.5 * x

    x = torch.randn(1030, 1024)  # above whole-graph mode's 2^20 elements: the executor allocates the output
    with torch.no_grad():
        compiled = nnc.compile(Affine())
        first, second = compiled(x), compiled(x)
        want = Affine()(x)
    for got in (first, second):
        assert got.numpy().ctypes.data % CACHE_LINE == 0
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_outputs_handed_to_autograd_own_their_memory():
    """A plan that does not reuse its outputs (the backward's, whose outputs AccumulateGrad keeps without a copy only
    when they own their memory) gets plain np.empty outputs; a forward plan's large outputs are aligned."""
    from nnc.executor import OutputBuffers

    spec = [((128, 256), np.dtype(np.float32))]
    backward = OutputBuffers([None], spec, reuse=False).arrays()[0]
    forward = OutputBuffers([None], spec, reuse=True).arrays()[0]
    assert backward.shape == forward.shape == (128, 256) and backward.dtype == forward.dtype == np.float32
    assert backward.flags.owndata
    assert forward.ctypes.data % CACHE_LINE == 0


class ReturnsItsInput(torch.nn.Module):
    """Tensor.type to the dtype it has returns the tensor itself: an opaque call whose result is its input (the
    Hugging Face GPT-2 attention's `w.type(v.dtype)`), read by a product stored through a permute."""

    def __init__(self):
        super().__init__()
        self.W = torch.nn.Parameter(torch.randn(8, 8, dtype=torch.float64))

    def forward(self, x):
        q = x.view(2, 5, 2, 4).permute(0, 2, 1, 3)
        w = (q @ q.transpose(-1, -2)).type(x.dtype)
        a = (w @ q).permute(0, 2, 1, 3).contiguous().view(2, 5, 8)
        return a @ self.W, w.type(x.dtype)


def test_an_opaque_result_keeps_the_buffer_it_may_be_alive_and_escapes_with_it():
    """The planner gave the opaque call's input buffer to a later kernel's output while the opaque result (that same
    array) was still to be read: compiled under no_grad was off by 458. The second output is that result itself, so
    its buffer must not be reused by the next call either."""
    torch.manual_seed(0)
    model = ReturnsItsInput()
    compiled = nnc.compile(model)
    x1, x2 = torch.randn(2, 5, 8, dtype=torch.float64), torch.randn(2, 5, 8, dtype=torch.float64)
    with torch.no_grad():
        first = compiled(x1)
        kept = first[1].clone()
        second = compiled(x2)
        want1, want2 = model(x1), model(x2)
    np.testing.assert_allclose(first[0].numpy(), want1[0].numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(first[1].numpy(), kept.numpy())  # not overwritten by the second call
    np.testing.assert_allclose(second[0].numpy(), want2[0].numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(second[1].numpy(), want2[1].numpy(), rtol=1e-12, atol=1e-12)
