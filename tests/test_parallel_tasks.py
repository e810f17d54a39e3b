"""Parallel kernels as task functions (nnc.codegen.cpu_tasks rewrites a prange function, nnc.codegen.tasks runs it):
the rewrite on its own, the launcher's split of the tasks, and compiled task kernels against the interpreter at one
and two threads, from several Python threads at once."""
from __future__ import annotations

import ast
import math
import re

import numba
import numpy as np
import pytest
from numba import njit, types

import nnc
import runtime as torch
from nnc.codegen.cpu import _keep_task_address, compile_kernel
from nnc.codegen.cpu_elementwise import PARALLEL_MIN_ELEMENTS
from nnc.codegen.cpu_tasks import launch_tasks, split_tasks
from nnc.codegen.tasks import CHUNKS, placed_row, run_tasks, task_array
from nnc.graph import Graph
from nnc.kernel import Kernel
from nnc.passes import propagate_shapes
from runtime import nn

from helpers import call, run_in_threads

F32 = [("in0", "np.float32"), ("out0", "np.float32")]


def test_a_loop_alone_runs_its_tasks_from_the_launch_line():
    split = split_tasks(["for o in prange(512):", "    out0[o] = in0[o] * np.float32(2.0)"], F32)
    assert split.direct
    assert split.task == ["in0 = task_array(nnc_addrs, 0, np.float32)", "out0 = task_array(nnc_addrs, 1, np.float32)",
                          "for o in range(np.uint64(nnc_lo), np.uint64(nnc_hi)):",
                          "    out0[o] = in0[o] * np.float32(2.0)", "return 0"]
    assert split.count == "512"


def test_arrays_the_prologue_makes_are_handed_to_the_task():
    lines = ["pad = np.empty(1280, dtype=np.float32)",
             "at = np.int64((out0.ctypes.data - pad.ctypes.data) % 4096) // 4",
             "row = pad[at:at + 256]",
             "for c in range(256):",
             "    row[c] = in0[c]",
             "for o in prange(512):",
             "    for j in range(256):",
             "        out0[o * 256 + j] = row[j]"]
    split = split_tasks(lines, F32)
    assert not split.direct
    assert split.launcher == lines[:5] + ["run_tasks(nnc_task, np.int64(512), in0, out0, row)"]
    assert split.task[2] == "row = task_array(nnc_addrs, 2, np.float32)"
    assert "at" not in " ".join(split.task).split()  # computed once, by the launcher


PLACED = ["bcast_in1_pad = np.empty(1280, dtype=np.float32)",
          "bcast_in1_at = np.int64((out0.ctypes.data + 2048 - bcast_in1_pad.ctypes.data) % 4096) // 4",
          "bcast_in1 = bcast_in1_pad[bcast_in1_at:bcast_in1_at + 256]",
          "for c in range(256):",
          "    bcast_in1[c] = in1[c]"]
F32_3 = [("in0", "np.float32"), ("in1", "np.float32"), ("out0", "np.float32")]
BIAS_LOOP = ["for o in prange(512):", "    for j in range(256):",
             "        out0[o * 256 + j] = in0[o * 256 + j] + bcast_in1[j]"]


def test_rows_placed_beside_the_output_are_copied_by_the_launch_line():
    """A prologue of placed-row copies alone (cpu_elementwise.placed_row_lines) compiles no launcher: the launch
    line calls run_tasks with nnc.codegen.tasks.placed_row's copy as the task's next array."""
    split = split_tasks(PLACED + BIAS_LOOP, F32_3)
    assert split.direct and split.placed == [(1, 2, 256)]
    assert split.task[3] == "bcast_in1 = task_array(nnc_addrs, 3, np.float32)"
    (line,) = launch_tasks(["__k__(ins[0].reshape(-1), ins[1].reshape(-1), outs[0].reshape(-1))"],
                           {"__k__": (split, 3)})
    assert ast.dump(ast.parse(line)) == ast.dump(ast.parse(
        "run_tasks(__k___task.nnc_address, 512, ins[0].reshape(-1), ins[1].reshape(-1), outs[0].reshape(-1), "
        "placed_row(ins[1].reshape(-1), outs[0].reshape(-1), 256))"))


@pytest.mark.parametrize("extra", [["c0 = in0[0]"], ["scratch = np.empty(8, dtype=np.float32)"]],
                         ids=["argument-value", "allocation"])
def test_a_prologue_doing_more_than_placing_rows_keeps_its_launcher(extra):
    split = split_tasks(PLACED + extra + BIAS_LOOP, F32_3)
    assert split is None or (not split.direct and not split.placed)


def test_placed_row_copies_the_row_half_a_page_from_the_outputs_page_offset():
    row = np.arange(300, dtype=np.float32)
    for shift in (0, 4, 1000):
        like = np.empty(5000, np.float32)[shift:]
        placed = placed_row(row, like, 256)
        assert placed.flags.c_contiguous and placed.dtype == np.float32
        np.testing.assert_array_equal(placed, row[:256])
        assert (placed.ctypes.data - like.ctypes.data) % 4096 == 2048


def test_literal_constants_are_computed_again_in_the_task():
    lines = ["c0 = np.float32(4.0)", "for t in prange(64):", "    out0[t] = in0[t] * c0"]
    split = split_tasks(lines, F32)
    assert "c0 = np.float32(4.0)" in split.task[:3]
    loop = split.task.index("for t in range(np.uint64(nnc_lo), np.uint64(nnc_hi)):")
    assert split.task.index("c0 = np.float32(4.0)") < loop


def test_partial_sums_the_epilogue_adds_up_stay_in_the_launcher():
    lines = ["partial = np.zeros(640, dtype=np.float64)",
             "for task in prange(10):",
             "    c = task % 5",
             "    for oo in range(64):",
             "        partial[c * 64 + oo] += in0[task * 64 + oo]",
             "for o in range(64):",
             "    total = partial[o]",
             "    for c in range(1, 5):",
             "        total = total + partial[c * 64 + o]",
             "    out0[o] = np.float32(total)"]
    split = split_tasks(lines, F32)
    assert split.launcher[1] == "run_tasks(nnc_task, np.int64(10), in0, out0, partial)"
    assert split.launcher[2:] == lines[5:]
    assert split.task[2] == "partial = task_array(nnc_addrs, 2, np.float64)"


@pytest.mark.parametrize("lines", [
    ["total = 0.0", "for t in prange(64):", "    total += in0[t]", "out0[0] = total"],  # a prange reduction
    ["n = in0.shape[0] // 2", "for t in prange(64):", "    out0[t] = in0[t + n]"],  # a value of an argument
    ["for t in prange(64):", "    out0[t] = in0[t] * S0"],  # a size symbol in the body
    ["for t in prange(64):", "    out0[t] = in0[t]", "for t in prange(64):", "    out0[t] += 1"],  # two loops
    ["for r in range(2):", "    for t in prange(64):", "        out0[t] = in0[t]"],  # not the outer loop
    ["for t in prange(64):", "    in0 = out0", "    out0[t] = 1"],  # rebinds an argument
    ["for nnc_lo in prange(64):", "    out0[nnc_lo] = 1"],  # a name the task function takes
], ids=["reduction", "argument-value", "symbol", "two-pranges", "nested", "rebinding", "name-clash"])
def test_what_cannot_be_a_task_keeps_its_prange(lines):
    assert split_tasks(lines, F32) is None


def test_a_body_reading_a_scalar_argument_keeps_its_prange():
    lines = ["for t in prange(64):", "    for o in range(width):", "        out0[t * 64 + o] = in0[o]"]
    assert split_tasks(lines, F32, ["width"]) is None
    assert split_tasks(lines, F32) is not None  # (without knowing it is an argument)


def test_launch_lines_call_run_tasks_or_pass_the_task_address():
    direct = split_tasks(["for t in prange(16 * S0):", "    out0[t] = in0[t]"], F32)
    launched = split_tasks(["c = np.float32(2.0)", "for t in prange(64):", "    out0[t] = in0[t] * c"], F32)
    lines = launch_tasks(["__k__(ins[0].reshape(-1), outs[0].reshape(-1), S0)",
                          "__k___epilogue(mm, outs[0].reshape(-1))"], {"__k__": (direct, 2)})
    assert lines == ["run_tasks(__k___task.nnc_address, 16 * S0, ins[0].reshape(-1), outs[0].reshape(-1))",
                     "__k___epilogue(mm, outs[0].reshape(-1))"]
    lines = launch_tasks(["__k___epilogue(mm, outs[0].reshape(-1))"], {"__k___epilogue": (launched, 2)})
    assert ast.dump(ast.parse(lines[0])) == ast.dump(ast.parse(
        "__k___epilogue(mm, outs[0].reshape(-1), __k___epilogue_task.nnc_address)"))


@njit(cache=False, error_model="numpy")
def _count_tasks(nnc_lo, nnc_hi, nnc_addrs):
    counts = task_array(nnc_addrs, 0, np.int64)
    for t in range(nnc_lo, nnc_hi):
        counts[t] += 1
    return 0


def _address(function):
    function.compile((types.int64,) * 3)
    _keep_task_address(function)
    return function.nnc_address


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n", [0, 1, 5, CHUNKS - 1, CHUNKS, CHUNKS + 1, 1000])
def test_run_tasks_runs_every_task_once(n, threads):
    counts = np.zeros(max(n, 1), np.int64)
    previous = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        run_tasks(_address(_count_tasks), n, counts)
    finally:
        numba.set_num_threads(previous)
    assert counts[:n].tolist() == [1] * n


def test_run_tasks_refuses_a_task_that_was_never_compiled():
    with pytest.raises(ValueError, match="before its task function was compiled"):
        run_tasks(0, 4, np.zeros(4))


def _graph_kernel(name, kind, build, tensors, shape=None):
    """(Kernel over every call of the graph `build` makes, interpreter, inputs as arrays)."""
    g = Graph()
    placeholders = [g.placeholder(f"x{k}") for k in range(len(tensors))]
    outputs = list(build(g, *placeholders))
    g.output(tuple(outputs))
    gm = nnc.GraphModule(nn.Module(), g)
    propagate_shapes(gm, *tensors)
    nodes = [n for n in g.nodes if n.op == "call_function"]
    kernel = Kernel(name, kind, nodes, placeholders, outputs, tuple(shape or outputs[-1].meta["shape"]))
    return kernel, (lambda: [r.numpy() for r in nnc.Interpreter(gm).run(*tensors)]), [t.numpy() for t in tensors]


def _bias_gelu(g, x, b):
    h = call(g, "add", x, b)
    return [call(g, "mul", call(g, "mul", h, 0.5), call(g, "add", call(g, "erf", call(g, "mul", h, 0.7071)), 1.0))]


def _column_sums(g, x):
    return [call(g, "sum", call(g, "mul", x, x), dims=(0,), keepdim=False)]


def _softmax(g, x):
    e = call(g, "exp", call(g, "sub", x, call(g, "amax", x, dims=(1,), keepdim=True)))
    return [call(g, "div", e, call(g, "sum", e, dims=(1,), keepdim=True))]


KERNELS = {  # name: (kind, graph, input shapes, loop shape)
    "elementwise_broadcast": ("elementwise", _bias_gelu, [(1024, 300), (300,)], None),
    "reduction_partials": ("reduction", _column_sums, [(1000, 600)], (1000, 600)),
    "row_softmax": ("row", _softmax, [(2048, 130)], (2048, 130)),
}


@pytest.fixture(scope="module")
def task_kernels():
    rng = np.random.default_rng(3)
    made = {}
    for name, (kind, build, shapes, shape) in KERNELS.items():
        tensors = [torch.from_numpy(rng.standard_normal(s).astype(np.float32)) for s in shapes]
        kernel, expected, inputs = _graph_kernel(name, kind, build, tensors, shape)
        made[name] = compile_kernel(kernel), expected(), inputs
    return made


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("threads", [1, 2])
def test_task_kernels_match_the_interpreter(task_kernels, name, threads):
    compiled, want, inputs = task_kernels[name]
    assert "run_tasks(" in compiled.source and "in prange(" not in compiled.source
    assert ("placed_row(" in compiled.source) == (name == "elementwise_broadcast")  # the bias row, in the launch
    assert compiled.parallel
    previous = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        got = compiled.run(inputs)
    finally:
        numba.set_num_threads(previous)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-6, atol=2e-6)


def test_the_same_task_kernel_from_several_threads_at_once(task_kernels):
    compiled, want, inputs = task_kernels["elementwise_broadcast"]
    results = []
    run_in_threads(lambda k: results.append(compiled.run(inputs)[0]), 4)
    assert len(results) == 4
    for got in results:
        np.testing.assert_allclose(got, want[0], rtol=2e-6, atol=2e-6)


def test_a_model_with_task_kernels_trains_as_eagerly():
    """Forward and gradients of a compiled MLP whose hidden layer is large enough for task kernels."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(300, 512), nn.GELU(), nn.LayerNorm(512), nn.Linear(512, 8))
    x = torch.randn(1024, 300)
    assert 1024 * 512 >= PARALLEL_MIN_ELEMENTS
    compiled = nnc.compile(model)
    out_eager = model(x)
    out_eager.square().mean().backward()
    grads = {k: p.grad.numpy().copy() for k, p in model.named_parameters()}
    model.zero_grad()
    out = compiled(x)
    out.square().mean().backward()
    np.testing.assert_allclose(out.detach().numpy(), out_eager.detach().numpy(), rtol=1e-4, atol=1e-5)
    for k, p in model.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), grads[k], rtol=1e-4, atol=1e-5, err_msg=k)
    sources = [s.compiled.source for plan in _plans(compiled) for s in plan.steps if hasattr(s, "compiled")]
    assert any("run_tasks(" in s for s in sources)
    assert math.isfinite(float(out.sum()))


def _plans(compiled):
    return [p for a in compiled._cache.values() if hasattr(a, "plans") for p in a.plans]


def test_a_flat_task_loop_is_vectorized():
    """The task loop's index is unsigned (as a parfor's): with a signed one numba wraps negative indices, and LLVM
    left this flat loop (a product's epilogue, rewriting the product in place) scalar, 4-5x slower."""
    from nnc.codegen.cpu import generate

    rng = np.random.default_rng(5)
    tensors = [torch.from_numpy(rng.standard_normal(s).astype(np.float32)) for s in [(512, 64), (256, 64)]]

    def build(g, x, w):
        h = call(g, "linear", x, w)
        return [call(g, "mul", h, call(g, "exp", call(g, "neg", call(g, "mul", h, h))))]
    kernel, _, _ = _graph_kernel("epilogue", "matmul", build, tensors)
    generated = generate(kernel)
    (library,) = [lib for lib in generated.libraries if "_task(" in lib]
    scope = {"__name__": "epilogue_task_kernel"}
    exec(compile(library.replace("cache=True", "cache=False"), "epilogue_task_kernel", "exec"), scope)
    (name,) = [n for n in scope if n.endswith("_task")]
    scope[name].compile((types.int64,) * 3)
    llvm = "\n".join(scope[name].inspect_llvm().values())
    assert re.search(r"<(4|8|16) x float>", llvm), "the task loop was not vectorized"
