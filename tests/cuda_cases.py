"""The kernels the test models make (forward and backward graphs of an MLP, a CNN and a transformer block), with
the interpreter's values of their inputs and outputs: what the CUDA code generator's PTX, simulator and GPU tests
run. Shared by tests/test_cuda_ptx.py and tests/cuda/."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import nnc
import runtime as torch
from nnc.executor import Plan
from nnc.interpreter import Interpreter
from runtime import nn
from runtime.nn import functional as F

# Kernel kinds the CUDA code generator has a skeleton for (nnc.codegen.cuda.SKELETONS); "view": an opaque kernel of
# one reshape, permute or expand (copied); other opaque kernels have none.
GENERATED_KINDS = ("elementwise", "reduction", "matmul", "window", "cat", "view")


def kind_of(kernel) -> str:
    """A kernel's kind, with "view" for an opaque kernel that is one view of one tensor."""
    from nnc.kernel import view_node

    return "view" if kernel.kind == "opaque" and view_node(kernel) is not None else kernel.kind


@dataclass
class KernelCase:
    """One kernel of a model's plan, with the interpreter's values of its inputs and outputs (numpy arrays)."""

    label: str  # "<model> <plan> <kernel name>"
    kernel: object
    inputs: list
    outputs: list


class TinyCNN(nn.Module):
    """Conv2d + ReLU + MaxPool2d, a second Conv2d (its input gradient is a col2im), then Linear: examples/models.py's
    CNN at simulator-friendly sizes."""

    def __init__(self, channels=2, size=6, classes=3):
        super().__init__()
        self.conv = nn.Conv2d(1, channels, kernel_size=3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(channels, channels, kernel_size=2, stride=1)
        self.fc = nn.Linear(channels * (size // 2 - 1) ** 2, classes)

    def forward(self, x):
        return self.fc(self.conv2(self.pool(torch.relu(self.conv(x)))).flatten(1))


def models(small: bool) -> list[tuple[str, nn.Module, torch.Tensor, object]]:
    """(name, model, input, loss(output)) per test model; small: the simulator's sizes, else examples/models.py's
    layer sizes at a small batch (what the PTX check compiles)."""
    from models import CNN, MLP, TransformerBlock

    torch.manual_seed(0)
    classes = 3 if small else 10
    labels = lambda n: torch.tensor(np.arange(n) % classes)  # noqa: E731
    if small:
        mlp, mlp_x = MLP((6, 5, 4, 3)), torch.randn(2, 6)
        cnn, cnn_x = TinyCNN(), torch.randn(2, 1, 6, 6)
        block, block_x = TransformerBlock(embed_dim=8, num_heads=2, mlp_ratio=2), torch.randn(1, 3, 8)
    else:
        mlp, mlp_x = MLP(), torch.randn(8, 784)
        cnn, cnn_x = CNN(), torch.randn(2, 1, 28, 28)
        block, block_x = TransformerBlock(), torch.randn(2, 8, 32)
    return [("mlp", mlp, mlp_x, lambda out: F.cross_entropy(out, labels(out.shape[0]))),
            ("cnn", cnn, cnn_x, lambda out: F.cross_entropy(out, labels(out.shape[0]))),
            ("transformer", block, block_x, lambda out: (out * out).mean())]


def kernel_cases(small: bool, kinds=GENERATED_KINDS) -> list[KernelCase]:
    """Every kernel of the given kinds that compiling each test model makes (training forward and backward), with
    its values from the interpreter: the models run once compiled with codegen off, each plan's inputs are recorded,
    and each plan's graph is then interpreted on them."""
    recorded = []
    run = Plan.run

    def recording(plan, *inputs, sizes=()):
        recorded.append((plan, inputs))
        return run(plan, *inputs, sizes=sizes)

    cases = []
    for name, model, x, loss in models(small):
        recorded.clear()
        Plan.run = recording
        try:
            compiled = nnc.compile(model, codegen=False)
            loss(compiled(x)).backward()
        finally:
            Plan.run = run
        for k, (plan, inputs) in enumerate(recorded):
            interpreter = Interpreter(plan.gm)
            interpreter.run(*inputs)
            env = interpreter.env
            part = "forward" if k == 0 else "backward"
            for kernel in _with_row_parts(plan.kernels) + _reading_folded_views(plan.gm.graph):
                if kind_of(kernel) in kinds:
                    folded = " folded" if kernel.meta.get("views") else ""
                    cases.append(KernelCase(f"{name} {part}{folded} {kernel.name}", kernel,
                                            [np.array(env[n]._data, order="C") for n in kernel.inputs],
                                            [np.array(env[n]._data, order="C") for n in kernel.outputs]))
    return cases


def _reading_folded_views(graph) -> list:
    """The graph's kernels (row kernels' parts included) that read folded views and whose CUDA skeleton indexes
    them (elementwise, reduction), as the CUDA executor fuses a graph (views folded)."""
    from nnc.cuda_executor import INDEXES_VIEWS
    from nnc.passes.fusion import fuse

    return [k for k in _with_row_parts(fuse(graph, fold=True)) if k.meta.get("views") and k.kind in INDEXES_VIEWS]


def _with_row_parts(kernels) -> list:
    """The kernels, with each row kernel followed by the parts the CUDA executor runs it as (split_row_kernel)."""
    from nnc.cuda_executor import split_row_kernel

    out = []
    for kernel in kernels:
        out.append(kernel)
        if kernel.kind == "row":
            out += split_row_kernel(kernel) or []
    return out


# ---------------------------------------------------------------------------------------------------------------
# Kernels built by hand: the edge cases the models do not reach (nan, float64, integers, bools, size-1 dims,
# broadcast batch dims, every reducer)
# ---------------------------------------------------------------------------------------------------------------

def _hand_case(label: str, kind: str, inputs: dict, build, shape=None) -> KernelCase:
    """A Kernel over a hand-built graph's compute nodes, with the interpreter's values."""
    from helpers import call
    from nnc.graph import Graph
    from nnc.kernel import Kernel
    from nnc.passes import propagate_shapes

    g = Graph()
    placeholders = [g.placeholder(name) for name in inputs]
    outputs = list(build(lambda name, *args, **attrs: call(g, name, *args, **attrs), *placeholders))
    g.output(tuple(outputs))
    gm = nnc.GraphModule(nn.Module(), g)
    propagate_shapes(gm, *inputs.values())
    interpreter = Interpreter(gm)
    interpreter.run(*inputs.values())
    nodes = [n for n in g.nodes if n.op == "call_function"]
    used = [p for p in placeholders if p.users]
    kernel = Kernel(label.replace(" ", "_"), kind, nodes, used, outputs,
                    tuple(shape if shape is not None else outputs[-1].meta["shape"]))
    env = interpreter.env
    return KernelCase(label, kernel, [np.array(env[n]._data, order="C") for n in used],
                      [np.array(env[n]._data, order="C") for n in outputs])


def _with_nans(*shape, dtype=np.float32):
    values = np.random.default_rng(1).standard_normal(shape).astype(dtype)
    values.reshape(-1)[::5] = np.nan
    return torch.tensor(values)


def hand_cases() -> list[KernelCase]:
    rng = np.random.default_rng(0)
    f64 = lambda *s: torch.tensor(rng.standard_normal(s))  # noqa: E731
    f32 = lambda *s: torch.tensor(rng.standard_normal(s).astype(np.float32))  # noqa: E731
    i64 = lambda *s: torch.tensor(rng.integers(-20, 20, s))  # noqa: E731
    cases = [
        _hand_case("nan maximum minimum sign clamp", "elementwise", {"x": _with_nans(3, 1, 4), "y": f32(4)},
                   lambda c, x, y: [c("maximum", x, y), c("minimum", x, y), c("sign", x), c("relu", x),
                                    c("clamp", x, min=-0.5, max=0.5), c("sigmoid", c("mul", x, y))]),
        _hand_case("float64 math", "elementwise", {"x": f64(2, 3), "y": f64(1, 3)},
                   lambda c, x, y: [c("where", c("gt", x, y), c("exp", x), c("tanh", y)),
                                    c("floordiv", x, y), c("remainder", x, y), c("erf", c("abs", x)),
                                    c("log1p", c("abs", y)), c("rsqrt", c("add", c("mul", x, x), 1.0))]),
        _hand_case("int64 arithmetic", "elementwise", {"a": i64(5, 4), "b": torch.tensor([3, -7, 2, 5])},
                   lambda c, a, b: [c("floordiv", a, b), c("remainder", a, b), c("bitwise_xor", a, b),
                                    c("cast", c("mul", a, 0.5), dtype=torch.float32), c("maximum", a, b)]),
        _hand_case("bool logic", "elementwise", {"x": f32(4, 3)},
                   lambda c, x: [c("logical_and", c("gt", x, 0.0), c("logical_not", c("gt", x, 1.0))),
                                 c("logical_or", c("lt", x, -1.0), c("gt", x, 1.0))]),
        _hand_case("size one", "elementwise", {"x": f32(1, 1), "y": f32(1)},
                   lambda c, x, y: [c("add", x, y)]),
        _hand_case("size zero", "elementwise", {"x": f32(0, 3), "y": f32(3)},
                   lambda c, x, y: [c("mul", c("exp", x), y)]),
        _hand_case("sum over an empty dim", "reduction", {"x": f32(3, 0)},
                   lambda c, x: [c("add", c("sum", x, dims=(1,), keepdim=False), 1.0)], shape=(3, 0)),
        _hand_case("row amax with nan and logsumexp", "reduction", {"x": _with_nans(4, 7)},
                   lambda c, x: _logsumexp(c, x), shape=(4, 7)),
        _hand_case("column sum float64", "reduction", {"x": f64(37, 5), "w": f64(5)},
                   lambda c, x, w: [c("sum", c("mul", x, w), dims=(0,), keepdim=False)], shape=(37, 5)),
        _hand_case("column sum with prologue output and epilogue", "reduction", {"x": f32(2, 3, 70), "g": f32(70)},
                   lambda c, x, g: _stored_prologue(c, x, g), shape=(2, 3, 70)),
        _hand_case("chunked full mean with stored square", "reduction", {"x": f32(2, 9000)},
                   lambda c, x: _chunked_mean(c, x), shape=(2, 9000)),
        _hand_case("chunked column sum and amax", "reduction", {"x": f32(20000, 3)},
                   lambda c, x: [c("sum", x, dims=(0,), keepdim=False), c("amax", x, dims=(0,), keepdim=False)],
                   shape=(20000, 3)),
        _hand_case("short rows a warp each softmax", "reduction", {"x": _with_nans(21, 3, 5)},
                   lambda c, x: _logsumexp(c, x, dims=(1, 2)),
                   shape=(21, 3, 5)),
        _hand_case("inner dims prod amin", "reduction", {"x": f32(3, 4, 2)},
                   lambda c, x: [c("prod", x, dims=(0, 2), keepdim=False), c("amin", x, dims=(0, 2), keepdim=False)],
                   shape=(3, 4, 2)),
        _hand_case("any all", "reduction", {"x": f32(5, 300)},
                   lambda c, x: [c("any", c("gt", x, 2.5), dims=(1,), keepdim=False),
                                 c("all", c("gt", x, -3.0), dims=(1,), keepdim=False)], shape=(5, 300)),
        _hand_case("integer sum of one", "reduction", {"a": i64(6, 1)},
                   lambda c, a: [c("sum", a, dims=(1,), keepdim=True)], shape=(6, 1)),
        _hand_case("im2col strided dilated padded", "window", {"x": f32(2, 3, 7, 6)},
                   lambda c, x: [c("im2col", x, **_window((2, 3), (2, 1), ((1, 1), (2, 0)), (2, 1)))]),
        _hand_case("col2im strided dilated padded", "window", {"cols": f64(3 * 6, 2 * 4 * 6)},
                   lambda c, cols: [c("col2im", cols, size=(7, 6), **_window((2, 3), (2, 1), ((1, 1), (2, 0)),
                                                                             (2, 1)))]),
        _hand_case("max_pool overlapping windows with nan", "window", {"x": _with_nans(2, 2, 7)},
                   lambda c, x: [c("max_pool", x, **_window((3,), (2,), ((1, 1),), (1,)))]),
        _hand_case("max_pool_backward ties and nan", "window",
                   {"g": f64(1, 2, 4), "x": torch.tensor(np.array([[[1.0, 3, 3, 0, 2, np.nan, 2],
                                                                    [5, 5, 5, 5, 5, 5, 5]]]))},
                   lambda c, g, x: [c("max_pool_backward", g, x, **_window((3,), (2,), ((1, 1),), (1,)))]),
        _hand_case("max_pool 3d", "window", {"x": f32(1, 2, 3, 4, 5)},
                   lambda c, x: [c("max_pool", x, **_window((2, 2, 3), (1, 2, 2), ((0, 0), (1, 0), (1, 1)),
                                                            (1, 1, 1)))]),
        _hand_case("permute negative dims", "opaque", {"x": f32(2, 3, 4)},
                   lambda c, x: [c("permute", x, dims=(-1, 0, 1))]),
        _hand_case("expand new and size-1 dims", "opaque", {"x": i64(3, 1)},
                   lambda c, x: [c("expand", x, shape=(2, 3, 4))]),
        _hand_case("reshape", "opaque", {"x": f32(2, 6)}, lambda c, x: [c("reshape", x, shape=(3, 2, 2))]),
        _hand_case("batched matmul broadcast", "matmul", {"a": f32(2, 1, 3, 20), "b": f32(3, 20, 5)},
                   lambda c, a, b: [c("matmul", a, b)]),
        _hand_case("linear of a vector", "matmul", {"x": f64(17), "w": f64(3, 17), "b": f64(3)},
                   lambda c, x, w, b: [c("tanh", c("add", c("linear", x, w), b))]),
        _hand_case("blocked linear with epilogue", "matmul", {"x": f32(70, 20), "w": f32(66, 20), "b": f32(66)},
                   lambda c, x, w, b: [c("relu", c("add", c("linear", x, w), b))]),
        _hand_case("blocked batched matmul float64", "matmul", {"a": f64(2, 65, 17), "b": f64(1, 17, 80)},
                   lambda c, a, b: [c("matmul", a, b)]),
        _hand_case("matmul summing over nothing", "matmul", {"a": f32(3, 0), "b": f32(0, 2)},
                   lambda c, a, b: [c("matmul", a, b)]),
        _hand_case("int64 matmul", "matmul", {"a": i64(33, 18), "b": i64(18, 2)},
                   lambda c, a, b: [c("matmul", a, b)]),
        _hand_case("cat of three along a middle dim with an empty input", "cat",
                   {"a": f32(2, 1, 3), "b": f32(2, 0, 3), "c": f32(2, 4, 3)},
                   lambda c, a, b, cc: [c("cat", a, b, cc, dim=1)]),
        _hand_case("int64 cat along the last dim", "cat", {"a": i64(3, 1), "b": i64(3, 5)},
                   lambda c, a, b: [c("cat", a, b, dim=-1)]),
    ]
    return cases


def hand_case(label: str) -> KernelCase:
    """The hand-built case of this label (built afresh)."""
    return next(case for case in hand_cases() if case.label == label)


def _logsumexp(c, x, dims=(1,)):
    m = c("amax", x, dims=dims, keepdim=True)
    s = c("sum", c("exp", x), dims=dims, keepdim=True)
    return [m, c("add", c("log", s), m)]


def _stored_prologue(c, x, g):
    p = c("mul", x, g)
    return [p, c("mul", c("sum", p, dims=(0, 1), keepdim=False), 0.5)]


def _window(kernel, stride, padding, dilation) -> dict:
    return {"kernel": kernel, "stride": stride, "padding": padding, "dilation": dilation}


def _chunked_mean(c, x):
    square = c("mul", x, x)
    return [square, c("mul", c("sum", square, dims=(0, 1), keepdim=False), 1 / 18000)]
