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
from test_fusion import X48, array, build, call, random_body

SUM1 = dict(dims=(1,), keepdim=True)


def reduction_chain(layers):
    """tanh -> amax -> (sub, tanh) -> amax -> ...: kernels alternate between [64, 64] and [64, 1] results."""
    def body(g, x):
        e = call(g, "tanh", x)
        for _ in range(layers):
            m = call(g, "amax", e, **SUM1)
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
    assert [k.kind for k in kernels][:4] == ["elementwise", "reduction", "elementwise", "reduction"]
    # 8 tanh results [64, 64] and 8 amax results [64, 1]; the last tanh is fused with the output mul
    assert len(plan.slots) == 16
    big, small = 64 * 64 * 4, 64 * 4
    assert plan.bytes_without_reuse == 8 * big + 8 * small
    # a [64, 64] value is read by the amax and by the next (sub, tanh) kernel, so two big buffers alternate;
    # an amax result dies in the kernel after it, before the next amax writes: one small buffer serves them all
    assert sorted(b.nbytes for b in plan.buffers) == [small, big, big]
    assert plan.bytes_with_reuse == 2 * big + small
    assert [len(b.values) for b in plan.buffers] == [4, 8, 4]
    assert "16 planned values in 3 buffers" in plan.summary()


def test_graph_outputs_and_views_of_inputs_are_not_planned():
    def body(g, x):
        r = call(g, "reshape", x, shape=(8, 4))  # view of a graph input
        a = call(g, "exp", r)
        s = call(g, "sum", a, **SUM1)
        return call(g, "div", a, s), s  # s is returned too

    gm, kernels, plan = planned(body, X48())
    names = {n.name: why for n, why in plan.unplanned.items()}
    assert names == {"reshape": "view of a graph input", "div": "graph output", "sum_1": "graph output"}
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
    assert plan.aliases[reshape_1] is exp  # a view of a view of exp
    last_reader = max(i for i, k in enumerate(kernels) if reshape_1 in k.inputs)
    assert plan.slots[exp].last_use == last_reader


def test_a_view_returned_by_the_graph_keeps_its_base_out_of_the_plan():
    def body(g, x):
        a = call(g, "exp", x)
        return call(g, "reshape", a, shape=(8, 4))

    gm, kernels, plan = planned(body, X48())
    assert plan.slots == {}
    assert sorted(plan.unplanned.values()) == ["a graph output is a view of it", "graph output (a view)"]


def test_a_smaller_value_reuses_a_larger_free_buffer():
    def body(g, x):
        a = call(g, "exp", x)  # [4, 8], read by two reductions
        b = call(g, "sum", a, **SUM1)  # [4, 1]
        c = call(g, "amax", a, **SUM1)  # [4, 1]: a dies here
        e = call(g, "sum", call(g, "add", c, b), dims=(0,), keepdim=True)  # [1, 1], defined after a died
        return call(g, "mul", call(g, "expand", e, shape=(4, 8)), x)  # e read through a view

    gm, kernels, plan = planned(body, X48())
    slots = {n.name: s for n, s in plan.slots.items()}
    assert list(slots) == ["exp", "sum_1", "amax", "sum_2"]
    assert slots["sum_1"].buffer != slots["exp"].buffer != slots["amax"].buffer  # all alive at kernel 2
    assert slots["sum_2"].buffer == slots["exp"].buffer and slots["sum_2"].nbytes == 4  # 4 bytes in a 128-byte one
    assert plan.buffers[slots["exp"].buffer].nbytes == 128
    assert slots["sum_2"].last_use == len(kernels) - 1  # the mul reads it through the expand
    assert (plan.bytes_without_reuse, plan.bytes_with_reuse) == (128 + 16 + 16 + 4, 128 + 16 + 16)


def test_best_fit_prefers_an_exact_size():
    def body(g, x):
        a = call(g, "exp", x)  # [4, 8]
        b = call(g, "sum", a, **SUM1)  # [4, 1]
        c = call(g, "amax", a, **SUM1)  # [4, 1]
        d = call(g, "neg", call(g, "add", b, c))  # [4, 1], read twice
        e = call(g, "sum", d, dims=(0,), keepdim=True)
        f = call(g, "amax", d, dims=(0,), keepdim=True)
        return call(g, "add", e, f)

    gm, kernels, plan = planned(body, X48())
    slots = {n.name: s for n, s in plan.slots.items()}
    assert list(slots) == ["exp", "amax", "neg", "amax_1"]
    # when amax_1 is written, both exp's 128-byte buffer and amax's 16-byte one are free: the exact size wins
    assert slots["exp"].last_use < slots["amax_1"].defined and slots["amax"].last_use < slots["amax_1"].defined
    assert slots["amax_1"].buffer == slots["amax"].buffer


def test_values_of_one_kernel_never_share():
    def body(g, x):
        a = call(g, "exp", x)
        b = call(g, "neg", a)
        return call(g, "sum", a, **SUM1), call(g, "amax", b, **SUM1), call(g, "sum", b, dims=(0,), keepdim=False)

    gm, kernels, plan = planned(body, X48())
    [k] = [k for k in kernels if len(k.outputs) == 2]
    assert plan.buffer_of[k.outputs[0]] != plan.buffer_of[k.outputs[1]]


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
    """Sanity check of this file's oracles: put amax (written by kernel 1) into tanh's buffer while tanh is still
    to be read by kernel 2."""
    import dataclasses

    gm, examples = build(reduction_chain(2), torch.randn(16, 16))
    kernels = fuse(gm.graph)
    plan = plan_memory(kernels, gm.graph)
    slots = {n.name: n for n in plan.slots}
    tanh, amax = slots["tanh"], slots["amax"]
    assert plan.slots[tanh].defined < plan.slots[amax].defined <= plan.slots[tanh].last_use
    plan.slots[amax] = dataclasses.replace(plan.slots[amax], buffer=plan.slots[tanh].buffer)
    plan.buffers[plan.slots[tanh].buffer].values.append(amax)
    with pytest.raises(AssertionError, match="live values share a buffer"):
        check_no_live_overlap(kernels, gm.graph, plan)
    with pytest.raises(AssertionError):
        assert_same(*run_in_buffers(gm, kernels, examples, plan))
