"""Random programs with mutation (in-place ops, writes through views, augmented assignment, detach, casts) and the
comparison of a compiled module with eager on them: outputs, requires_grad, gradients, inputs written in place,
and the errors eager raises. Used by tests/test_functionalize.py and tools/fuzz_mutation.py."""
from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, field

import numpy as np

import nnc
import runtime
import runtime.nn.functional as F
from runtime import nn

WIDTH = 6
UNARY = ("relu", "tanh", "sigmoid", "neg")
INPLACE_UNARY = ("relu_", "tanh_", "sigmoid_", "neg_", "tanh_exp_", "sigmoid_sqrt_", "pow_", "zero_", "detach_")
INPLACE_SCALAR = ("add_", "sub_", "mul_", "div_", "clamp_", "fill_", "iadd", "imul", "idiv")
INPLACE_OTHER = ("add_", "sub_", "copy_", "masked_fill_", "addcmul_", "addcdiv_", "lerp_", "iadd", "isub",
                 "setitem", "idiv_float64")
INPLACE_FUNCTIONAL = ("relu", "leaky_relu", "hardtanh", "elu")
VIEWS = ("rows", "cols", "select", "reshape", "transpose", "unsqueeze", "detach")


def random_program(rng: np.random.Generator, length: int | None = None) -> list:
    """Steps over a growing list of values; value 0 is the input x ([B, WIDTH]), steps refer to earlier values.
    Value shapes are tracked as labels ("full", "full.rows", ...) so binary ops pair equal shapes."""
    steps, shapes = [], ["full"]
    for _ in range(length or int(rng.integers(2, 9))):
        kind = rng.choice(["linear", "unary", "binary", "view", "inplace", "inplace", "inplace", "cast", "index"])
        i = int(rng.integers(len(shapes)))
        if kind == "linear":
            full = [k for k, s in enumerate(shapes) if s == "full"]
            steps.append(("linear", int(rng.choice(full))))
            shapes.append("full")
        elif kind == "unary":
            steps.append(("unary", i, str(rng.choice(UNARY))))
            shapes.append(shapes[i])
        elif kind == "binary":
            same = [k for k, s in enumerate(shapes) if s == shapes[i]]
            steps.append(("binary", i, int(rng.choice(same)), str(rng.choice(["add", "mul", "sub"]))))
            shapes.append(shapes[i])
        elif kind == "view":
            view = str(rng.choice(VIEWS))
            steps.append(("view", i, view))
            shapes.append(shapes[i] if view == "detach" else f"{shapes[i]}.{view}")
        elif kind == "cast":
            steps.append(("cast", i))
            shapes.append(shapes[i])
        elif kind == "index":  # integer-tensor indexing and an embedding of w's rows: gathers with scatter backwards
            full = [k for k, s in enumerate(shapes) if s == "full"]
            if rng.integers(2):
                steps.append(("index", int(rng.choice(full))))
                shapes.append("full.index")
            else:
                steps.append(("embedding", 0))
                shapes.append("embedding")
        else:
            steps.append(_inplace_step(rng, i, shapes))
            shapes.append(shapes[i])  # an in-place op returns the tensor it wrote
    outputs = sorted({int(k) for k in rng.choice(len(shapes), size=min(3, len(shapes)), replace=False)})
    return steps + [("output", tuple(outputs))]


def _inplace_step(rng, i: int, shapes: list) -> tuple:
    family = rng.choice(["unary", "scalar", "other", "functional"])
    if family == "unary":
        return ("inplace", i, str(rng.choice(INPLACE_UNARY)))
    if family == "scalar":
        return ("inplace", i, str(rng.choice(INPLACE_SCALAR)), float(rng.choice([0.5, -1.5, 2.0])))
    if family == "functional":
        return ("inplace_functional", i, str(rng.choice(INPLACE_FUNCTIONAL)))
    same = [k for k, s in enumerate(shapes) if s == shapes[i]]
    return ("inplace", i, str(rng.choice(INPLACE_OTHER)), int(rng.choice(same)))


class Program(nn.Module):
    """Runs a random program's steps on x with parameters w [WIDTH, WIDTH] and b [WIDTH]."""

    def __init__(self, steps: list, dtype=runtime.float64):
        super().__init__()
        self.steps = steps
        self.w = nn.Parameter((runtime.randn(WIDTH, WIDTH) * 0.4).to(dtype))
        self.b = nn.Parameter((runtime.randn(WIDTH) * 0.4).to(dtype))

    def forward(self, x):
        return run_steps(self.steps, x, self.w, self.b, runtime, F)


def run_steps(steps: list, x, w, b, lib, functional):
    """The program on x, written against a torch-like library `lib` (runtime, or torch as the oracle)."""
    values = [x]
    for step in steps:
        if step[0] == "output":
            return tuple(values[k] for k in step[1])
        values.append(_run(step, values, w, b, lib, functional))
    return values[-1]


def _run(step, values, w, b, lib, functional):
    kind, i = step[0], step[1]
    v = values[i]
    if kind == "linear":
        return v @ w + b
    if kind == "unary":
        return getattr(v, step[2])()
    if kind == "binary":
        return getattr(lib, step[3])(v, values[step[2]])
    if kind == "view":
        return _view(v, step[2])
    if kind == "cast":
        return (v * 4).long().to(v.dtype) * 0.25 + v.detach() * 0.0
    if kind == "index":
        return v[..., lib.tensor([1, 4, 4, 0])]
    if kind == "embedding":
        return functional.embedding(lib.tensor([[0, 5], [2, 2]]), w)
    if kind == "inplace_functional":
        return _functional_inplace(v, step[2], functional)
    return _inplace(v, step[2], values[step[3]] if len(step) > 3 and isinstance(step[3], int) else
                    (step[3] if len(step) > 3 else None))


def _view(v, kind: str):
    if kind == "rows":
        return v[1:]
    if kind == "cols":
        return v[..., 1:4] if v.ndim else v
    if kind == "select":
        return v[..., 2] if v.ndim and v.shape[-1] > 2 else v[...]
    if kind == "reshape":
        return v.reshape(-1)
    if kind == "transpose":
        return v.t() if v.ndim == 2 else v
    if kind == "unsqueeze":
        return v.unsqueeze(0)
    return v.detach()


def _functional_inplace(v, name: str, functional):
    if name == "relu":
        return functional.relu(v, inplace=True)
    if name == "leaky_relu":
        return functional.leaky_relu(v, 0.1, inplace=True)
    if name == "hardtanh":
        return functional.hardtanh(v, -0.5, 0.5, inplace=True)
    return functional.elu(v, inplace=True)


def _inplace(v, name: str, arg):
    if name == "tanh_exp_":
        return v.tanh_().exp_()
    if name == "sigmoid_sqrt_":
        return v.sigmoid_().sqrt_()
    if name == "pow_":
        return v.pow_(2)
    if name in ("zero_", "detach_") or name in INPLACE_UNARY:
        return getattr(v, name)()
    if name == "clamp_":
        return v.clamp_(min=-abs(arg), max=abs(arg))
    if name == "iadd":
        v += arg
        return v
    if name == "isub":
        v -= arg
        return v
    if name == "imul":
        v *= arg
        return v
    if name == "idiv":
        v /= arg
        return v
    if name == "idiv_float64":
        v /= (arg.detach().abs() + 1).double()
        return v
    if name == "add_" and not isinstance(arg, float):
        return v.add_(arg, alpha=0.5)
    if name == "masked_fill_":
        return v.masked_fill_(arg > 0, 0.25)
    if name == "addcmul_":
        return v.addcmul_(arg, arg, value=0.5)
    if name == "addcdiv_":
        return v.addcdiv_(arg, arg.abs() + 1, value=0.5)
    if name == "lerp_":
        return v.lerp_(arg, 0.3)
    if name == "setitem":
        v[..., :1] = arg[..., :1]
        return v
    return getattr(v, name)(arg)


# -- running a program both ways ----------------------------------------------------------------------------


@dataclass
class Outcome:
    """What a call did: outputs, their requires_grad, the input after the call, gradients, or the error."""

    outputs: list = field(default_factory=list)
    requires_grad: list = field(default_factory=list)
    input_after: np.ndarray | None = None
    grads: list = field(default_factory=list)
    error: str = ""
    warnings: list = field(default_factory=list)
    # NOTE: under no_grad, torch gives a view of a tensor that requires grad requires_grad=True (a "view created
    # in no_grad mode"); compiled outputs are new tensors that record nothing. Flags are compared with grad only.
    grad_enabled: bool = True


def run(model, x, *, grad: bool, lib=runtime, calls: int = 2) -> Outcome:
    """Call `model` `calls` times on fresh copies of x (the last call's results count), backward when grad."""
    outcome = Outcome(grad_enabled=grad)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            for _ in range(calls):
                _one_call(model, x, grad, lib, outcome)
        except Exception as error:  # noqa: BLE001 - the program's own error is part of what is compared
            outcome.error = f"{type(error).__name__}: {error}"
    outcome.warnings = [str(w.message) for w in caught]
    return outcome


def _one_call(model, x, grad: bool, lib, outcome: Outcome) -> None:
    for p in model.parameters():
        p.grad = None
    inp = x.detach().clone().requires_grad_(x.requires_grad)
    leaf = inp
    if inp.requires_grad:
        inp = inp * 1  # a non-leaf input, which in-place ops may write
    with lib.set_grad_enabled(grad):
        out = model(inp)
    outs = out if isinstance(out, tuple) else (out,)
    outcome.outputs = [o.detach().numpy().copy() for o in outs]
    outcome.requires_grad = [o.requires_grad for o in outs]
    outcome.input_after = inp.detach().numpy().copy()
    differentiable = [o for o in outs if o.requires_grad]
    if differentiable:
        loss = sum((o.double() * (k + 1)).sum() for k, o in enumerate(differentiable))
        loss.backward()
    outcome.grads = [None if t.grad is None else t.grad.numpy().copy() for t in (leaf, *model.parameters())]


@dataclass
class Case:
    steps: list
    dtype: object
    batch: int
    grad: bool
    input_requires_grad: bool


def random_case(seed: int, dtype=None) -> Case:
    rng = np.random.default_rng(seed)
    return Case(steps=random_program(rng), dtype=dtype or rng.choice([runtime.float64, runtime.float32]),
                batch=int(rng.choice([0, 1, 3])), grad=bool(rng.integers(4)),
                input_requires_grad=bool(rng.integers(3) == 0))


@dataclass
class Result:
    """One case run three ways: eager, compiled and (when installed) torch."""

    eager: Outcome
    compiled: Outcome
    torch: Outcome | None
    dtype: object

    def compiled_vs_eager(self) -> list[str]:
        return differences(self.eager, self.compiled, self.dtype)

    def compiled_vs_torch(self) -> list[str]:
        return differences(self.torch, self.compiled, self.dtype) if self.torch is not None else []

    def eager_vs_torch(self) -> list[str]:
        return differences(self.torch, self.eager, self.dtype) if self.torch is not None else []

    def compiled_is_wrong(self) -> list[str]:
        """The compiler's differences: from eager, unless torch (the ground truth, when installed) agrees with
        the compiled result, which makes them eager's."""
        against_eager = self.compiled_vs_eager()
        if not against_eager or self.torch is None:
            return against_eager
        return self.compiled_vs_torch()


def run_case(case: Case, codegen: bool = True, oracle: bool = True) -> Result:
    runtime.manual_seed(0)
    eager = Program(case.steps, case.dtype)
    compiled = nnc.compile(copy.deepcopy(eager), codegen=codegen)
    x = runtime.randn(case.batch, WIDTH).to(case.dtype).requires_grad_(case.input_requires_grad)
    want = run(eager, x, grad=case.grad)
    got = run(compiled, x, grad=case.grad)
    return Result(want, got, _run_torch(case, eager, x) if oracle else None, case.dtype)


# Batch sizes a dynamic variant is called with after compiling at the first (sizes 0 and 1 compile apart).
DYNAMIC_BATCHES = (3, 5, 2, 7, 1, 4)


def run_dynamic_case(case: Case, codegen: bool = True) -> list[str]:
    """The differences of a module compiled with dynamic=True, called with changing batch sizes, from static compiles
    of the same program at each size (which the static fuzzing checks against eager and torch)."""
    runtime.manual_seed(0)
    eager = Program(case.steps, case.dtype)
    dynamic = nnc.compile(copy.deepcopy(eager), codegen=codegen, dynamic=True)
    problems = []
    for batch in DYNAMIC_BATCHES:
        runtime.manual_seed(batch)
        x = runtime.randn(batch, WIDTH).to(case.dtype).requires_grad_(case.input_requires_grad)
        static = nnc.compile(copy.deepcopy(eager), codegen=codegen, dynamic=False)
        want, got = run(static, x, grad=case.grad), run(dynamic, x, grad=case.grad)
        if got.error and not want.error and any(text in got.error for text in PERMISSIVE):
            continue  # the dynamic module ran eagerly for this size (a third static size): eager's own error
        problems += [f"batch {batch}: {p}" for p in differences(want, got, case.dtype)]
    return problems


def _run_torch(case: Case, eager: Program, x) -> Outcome | None:
    try:
        import torch
    except ImportError:
        return None

    class TorchProgram(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.tensor(eager.w.detach().numpy().copy()))
            self.b = torch.nn.Parameter(torch.tensor(eager.b.detach().numpy().copy()))

        def forward(self, inp):
            return run_steps(case.steps, inp, self.w, self.b, torch, torch.nn.functional)

    return run(TorchProgram(), torch.tensor(x.detach().numpy().copy()).requires_grad_(x.requires_grad),
               grad=case.grad, lib=torch)


# NOTE: errors of eager's bookkeeping that a compiled module does not raise, as torch.compile does not: a value
# saved for backward was overwritten in place or detached in place since (the compiled graph keeps its own saved
# values, so its gradient is right), and a view made under no_grad whose base was written (compiled outputs are
# not views).
PERMISSIVE = ("modified by an inplace operation", "A view was created in no_grad mode",
              "saved tensor that has been detached in-place")


def differences(want: Outcome, got: Outcome, dtype) -> list[str]:
    """What `got` does differently from `want` (a compile that fell back to eager is not a difference: its
    results are compared like any other)."""
    if want.error and not got.error and any(text in want.error for text in PERMISSIVE):
        return []
    if want.error or got.error:
        return [] if _same_error(want.error, got.error) else [f"error: expected {want.error!r}, got {got.error!r}"]
    problems = []
    rtol, atol = (1e-7, 1e-9) if dtype is runtime.float64 else (2e-4, 2e-5)
    pairs = [("output", want.outputs, got.outputs), ("grad", want.grads, got.grads),
             ("input after", [want.input_after], [got.input_after])]
    for what, expected, actual in pairs:
        for k, (a, b) in enumerate(zip(expected, actual)):
            if (a is None) != (b is None):
                problems.append(f"{what} {k}: expected {'None' if a is None else 'a tensor'}, got "
                                f"{'None' if b is None else 'a tensor'}")
            elif a is not None and not np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True):
                problems.append(f"{what} {k} differs by {np.nanmax(np.abs(a - b)) if a.size else 0}")
    if want.requires_grad != got.requires_grad and want.grad_enabled:
        problems.append(f"requires_grad: expected {want.requires_grad}, got {got.requires_grad}")
    return problems


def fallbacks(outcome: Outcome) -> list[str]:
    """The compile fallbacks a compiled run warned about."""
    return [w for w in outcome.warnings if "could not compile" in w]


def _same_error(expected: str, got: str) -> bool:
    """Both raised, the same type (runtime's ShapeError is the RuntimeError torch raises there), or neither."""
    kinds = [text.split(":")[0].replace("ShapeError", "RuntimeError") for text in (expected, got)]
    return bool(expected) == bool(got) and kinds[0] == kinds[1]
