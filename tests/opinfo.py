"""Sample inputs for every primitive op in the op table, with the torch call that computes the same thing."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from runtime import dtypes as dt
from runtime.ops import decode_key

_rng = np.random.default_rng(1234)


@dataclass
class Sample:
    """One call of a primitive: inputs (numpy arrays become tensors), attrs, and torch's equivalent."""

    inputs: tuple
    attrs: dict = field(default_factory=dict)
    torch_fn: Callable | None = None  # torch_fn(torch, *torch_inputs) -> torch tensor
    fd: bool = True  # finite differences are meaningful here (no kinks or ties near the inputs)
    note: str = ""


def away(*shape, low=-2.0, high=2.0, gap=0.25):
    """Random values at least `gap` away from zero (so kinks at 0 don't disturb finite differences)."""
    x = _rng.uniform(low, high, shape)
    return np.where(x >= 0, x + gap, x - gap)


def pos(*shape, low=0.5, high=2.0):
    return _rng.uniform(low, high, shape)


def ints(*shape, low=-3, high=4):
    return _rng.integers(low, high, shape)


def bools(*shape):
    return _rng.random(shape) > 0.5


def _spd(*shape):
    """Well-conditioned symmetric positive-definite matrices: (n,) -> n x n, (b, n) -> b x n x n."""
    n = shape[-1]
    a = _rng.uniform(-1, 1, shape[:-1] + (n, n))
    return a @ np.swapaxes(a, -1, -2) + n * np.eye(n)


def _binary(name, torch_name, make=away, scalar=1.5, **kw):
    t = lambda torch, x, y: getattr(torch, torch_name)(x, y)  # noqa: E731
    return [
        Sample((make(3, 4), make(3, 4)), torch_fn=t, **kw),
        Sample((make(3, 1), make(1, 4)), torch_fn=t, note="broadcast", **kw),
        Sample((make(2, 3, 4), make(4)), torch_fn=t, note="broadcast rank", **kw),
        Sample((make(3, 4), scalar), torch_fn=t, note="python scalar", **kw),
        Sample((scalar, make(3, 4)), torch_fn=lambda torch, x, y: getattr(torch, torch_name)(
            torch.tensor(x, dtype=y.dtype), y), note="python scalar first", **kw),
    ]


def _unary(torch_name, make=away, **kw):
    return [Sample((make(3, 4),), torch_fn=lambda torch, x: getattr(torch, torch_name)(x), **kw),
            Sample((make(5),), torch_fn=lambda torch, x: getattr(torch, torch_name)(x), **kw)]


def _compare(torch_name):
    grid = lambda *s: _rng.integers(-2, 3, s).astype(np.float64)  # noqa: E731  (ties are likely)
    return [Sample((grid(3, 4), grid(3, 4)), torch_fn=lambda torch, x, y: getattr(torch, torch_name)(x, y)),
            Sample((grid(3, 1), 0.0), torch_fn=lambda torch, x, y: getattr(torch, torch_name)(x, y))]


def _logical(torch_name, arity=2):
    if arity == 1:
        return [Sample((bools(3, 4),), torch_fn=lambda torch, x: getattr(torch, torch_name)(x))]
    return [Sample((bools(3, 4), bools(3, 4)), torch_fn=lambda torch, x, y: getattr(torch, torch_name)(x, y)),
            Sample((ints(3, 4), ints(4)), torch_fn=lambda torch, x, y: getattr(torch, torch_name)(x, y))]


def _reduction(name, torch_fn, make=away):
    return [
        Sample((make(3, 4),), {"dims": (0, 1), "keepdim": False}, lambda torch, x: torch_fn(torch, x, (0, 1), False)),
        Sample((make(3, 4),), {"dims": (1,), "keepdim": False}, lambda torch, x: torch_fn(torch, x, (1,), False)),
        Sample((make(2, 3, 4),), {"dims": (0, 2), "keepdim": True},
               lambda torch, x: torch_fn(torch, x, (0, 2), True)),
        Sample((make(5),), {"dims": (0,), "keepdim": True}, lambda torch, x: torch_fn(torch, x, (0,), True)),
    ]


def _torch_key(key, idx):
    return decode_key(key, idx)


SLICE_ALL = ("slice", None, None, None)

def _nll_attrs(reduction, ignore_index):
    return {"dim": 1, "reduction": reduction, "ignore_index": ignore_index}


def _nll_sample(reduction, ignore_index):
    """nll_loss on 4 rows of 5 classes; two rows pick class 2, which ignore_index=2 leaves out."""
    return Sample((away(4, 5), np.array([1, 2, 0, 2])), _nll_attrs(reduction, ignore_index),
                  lambda torch, x, t: torch.nn.functional.nll_loss(x, t, reduction=reduction,
                                                                   ignore_index=ignore_index),
                  note=f"{reduction}, ignore_index={ignore_index}")


def _win(kernel, stride, padding, dilation):
    return {"kernel": kernel, "stride": stride, "padding": padding, "dilation": dilation}


def _cols(unfolded):
    """torch's unfold (N, C*K, L) as im2col's columns (C*K, N*L)."""
    return unfolded.transpose(0, 1).reshape(unfolded.shape[1], -1)


def _uncols(cols, n):
    """im2col's columns (C*K, N*L) as fold's input (N, C*K, L)."""
    return cols.reshape(cols.shape[0], n, -1).transpose(0, 1)


def _torch_nll_backward(torch, g, x, t, reduction, ignore_index):
    """nll_loss's gradient with respect to its input, as torch ops of g (so torch can differentiate it in g)."""
    valid = (t != ignore_index).to(x.dtype)
    scale = valid / valid.sum() if reduction == "mean" else valid
    index = t.masked_fill(t == ignore_index, 0).unsqueeze(1)
    return torch.zeros_like(x).scatter(1, index, -(g * scale).unsqueeze(1))


SAMPLES: dict[str, list[Sample]] = {
    "add": _binary("add", "add"),
    "sub": _binary("sub", "sub"),
    "mul": _binary("mul", "mul"),
    "div": _binary("div", "div"),
    "pow": [
        Sample((pos(3, 4), away(3, 4)), torch_fn=lambda torch, x, y: torch.pow(x, y)),
        Sample((pos(3, 1), away(4)), torch_fn=lambda torch, x, y: torch.pow(x, y), note="broadcast"),
        Sample((away(3, 4), 2.0), torch_fn=lambda torch, x, y: torch.pow(x, y), note="square"),
        Sample((pos(3, 4), -1.5), torch_fn=lambda torch, x, y: torch.pow(x, y)),
        Sample((away(3, 4), 0.0), torch_fn=lambda torch, x, y: torch.pow(x, y), note="zero exponent"),
        Sample((2.0, away(3, 4)), torch_fn=lambda torch, x, y: torch.pow(x, y), note="scalar base"),
    ],
    "maximum": _binary("maximum", "maximum")[:3]
    + [Sample((np.array([1.0, 2.0, 3.0]), np.array([1.0, 0.5, 4.0])),
              torch_fn=lambda torch, x, y: torch.maximum(x, y), fd=False, note="tie splits the gradient")],
    "minimum": _binary("minimum", "minimum")[:3]
    + [Sample((np.array([1.0, 2.0, 3.0]), np.array([1.0, 0.5, 4.0])),
              torch_fn=lambda torch, x, y: torch.minimum(x, y), fd=False, note="tie splits the gradient")],
    # torch's floor_divide has no derivative; div(rounding_mode='floor') is the same function with a zero one
    "floordiv": [Sample(x.inputs, torch_fn=lambda torch, a, b: torch.div(a, b, rounding_mode="floor")
                        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor) else a // b, note=x.note)
                 for x in _binary("floordiv", "floor_divide")],
    "remainder": [
        Sample((np.array([5.3, -5.3, 7.7, -1.2]), np.array([2.0, 2.0, -3.0, -0.7])),
               torch_fn=lambda torch, x, y: torch.remainder(x, y)),
        Sample((np.array([5.3, -5.3, 7.7]), 2.5), torch_fn=lambda torch, x, y: torch.remainder(x, y)),
        Sample((ints(3, 4), np.array([2, 3, 5, 7])), torch_fn=lambda torch, x, y: torch.remainder(x, y)),
    ],
    "eq": _compare("eq"), "ne": _compare("ne"), "lt": _compare("lt"),
    "le": _compare("le"), "gt": _compare("gt"), "ge": _compare("ge"),
    "logical_and": _logical("logical_and"), "logical_or": _logical("logical_or"),
    "logical_xor": _logical("logical_xor"), "logical_not": _logical("logical_not", 1),
    "bitwise_not": [Sample((ints(3, 4),), torch_fn=lambda torch, x: torch.bitwise_not(x))],
    "bitwise_and": [Sample((ints(3, 4), ints(3, 4)), torch_fn=lambda torch, x, y: torch.bitwise_and(x, y)),
                    Sample((bools(3, 4), bools(4)), torch_fn=lambda torch, x, y: torch.bitwise_and(x, y))],
    "bitwise_or": [Sample((ints(3, 4), ints(3, 4)), torch_fn=lambda torch, x, y: torch.bitwise_or(x, y))],
    "bitwise_xor": [Sample((ints(3, 4), ints(3, 4)), torch_fn=lambda torch, x, y: torch.bitwise_xor(x, y))],
    "neg": _unary("neg") + [Sample((ints(4),), torch_fn=lambda torch, x: torch.neg(x))],
    "abs": _unary("abs") + [Sample((ints(4),), torch_fn=lambda torch, x: torch.abs(x))],
    "sign": _unary("sign"),
    "floor": [Sample((np.array([0.5, -1.3, 2.7, -2.2]),), torch_fn=lambda torch, x: torch.floor(x))],
    "exp": _unary("exp"),
    "log": _unary("log", pos),
    "log1p": _unary("log1p", lambda *s: _rng.uniform(-0.5, 2.0, s)),
    "sqrt": _unary("sqrt", pos),
    "rsqrt": _unary("rsqrt", pos),
    "reciprocal": _unary("reciprocal"),
    "sin": _unary("sin"),
    "cos": _unary("cos"),
    "tanh": _unary("tanh"),
    "sigmoid": _unary("sigmoid") + [Sample((np.array([-800.0, -50.0, 0.0, 50.0, 800.0]),),
                                           torch_fn=lambda torch, x: torch.sigmoid(x), fd=False, note="extremes")],
    "relu": _unary("relu") + [Sample((ints(5),), torch_fn=lambda torch, x: torch.relu(x))],
    "erf": _unary("erf") + [Sample((np.linspace(-6, 6, 25),), torch_fn=lambda torch, x: torch.erf(x))],
    "where": [
        Sample((bools(3, 4), away(3, 4), away(3, 4)), torch_fn=lambda torch, c, x, y: torch.where(c, x, y)),
        Sample((bools(3, 1), away(1, 4), away(3, 4)), torch_fn=lambda torch, c, x, y: torch.where(c, x, y)),
        Sample((bools(3, 4), away(3, 4), 0.0), torch_fn=lambda torch, c, x, y: torch.where(c, x, y)),
    ],
    "clamp": [
        Sample((np.array([-2.0, -0.7, 0.2, 0.9, 3.0]),), {"min": -0.5, "max": 0.5},
               lambda torch, x: torch.clamp(x, -0.5, 0.5)),
        Sample((away(3, 4),), {"min": 0.0, "max": None}, lambda torch, x: torch.clamp(x, min=0.0)),
        Sample((away(3, 4),), {"min": None, "max": 1.0}, lambda torch, x: torch.clamp(x, max=1.0)),
    ],
    "cast": [
        Sample((away(3, 4),), {"dtype": dt.float64}, lambda torch, x: x.to(torch.float64)),
        Sample((ints(3, 4),), {"dtype": dt.float64}, lambda torch, x: x.to(torch.float64)),
        Sample((away(3, 4),), {"dtype": dt.int64}, lambda torch, x: x.to(torch.int64)),
        Sample((away(3, 4),), {"dtype": dt.float32}, lambda torch, x: x.to(torch.float32), fd=False),
    ],
    "clone": [Sample((away(3, 4),), torch_fn=lambda torch, x: x.clone())],
    "detach": [Sample((away(3, 4),), torch_fn=lambda torch, x: x.detach())],
    "sum": _reduction("sum", lambda torch, x, d, k: torch.sum(x, d, k))
    + [Sample((ints(3, 4),), {"dims": (1,), "keepdim": False}, lambda torch, x: torch.sum(x, 1))],
    "prod": _reduction("prod", lambda torch, x, d, k: _torch_prod(torch, x, d, k))
    + [Sample((np.array([[2.0, 0.0, 3.0], [0.0, 0.0, 1.5], [1.0, 2.0, 4.0]]),), {"dims": (1,), "keepdim": False},
              lambda torch, x: torch.prod(x, 1), note="zeros")],
    "amax": _reduction("amax", lambda torch, x, d, k: torch.amax(x, d, k))
    + [Sample((np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]]),), {"dims": (1,), "keepdim": False},
              lambda torch, x: torch.amax(x, 1), fd=False, note="ties share the gradient")],
    "amin": _reduction("amin", lambda torch, x, d, k: torch.amin(x, d, k)),
    "all": [Sample((bools(3, 4),), {"dims": (1,), "keepdim": False}, lambda torch, x: torch.all(x, 1)),
            Sample((bools(3, 4),), {"dims": (0, 1), "keepdim": False}, lambda torch, x: torch.all(x))],
    "any": [Sample((bools(3, 4),), {"dims": (0,), "keepdim": True}, lambda torch, x: torch.any(x, 0, True)),
            Sample((bools(3, 4),), {"dims": (0, 1), "keepdim": False}, lambda torch, x: torch.any(x))],
    "argmax": [Sample((away(3, 4),), {"dim": 1, "keepdim": False}, lambda torch, x: torch.argmax(x, 1)),
               Sample((away(3, 4),), {"dim": None, "keepdim": False}, lambda torch, x: torch.argmax(x)),
               Sample((away(3, 4),), {"dim": 0, "keepdim": True}, lambda torch, x: torch.argmax(x, 0, True))],
    "argmin": [Sample((away(3, 4),), {"dim": 1, "keepdim": False}, lambda torch, x: torch.argmin(x, 1))],
    "scatter_extremum": [
        Sample((away(4, 5), np.array([[0, 1, 3, 3, 2], [3, 0, 1, 1, 0], [0, 0, 2, 1, 3]]), away(3, 5)),
               {"dim": 0, "reduce": "amax", "include_self": True},
               lambda torch, x, i, s: torch.scatter_reduce(x, 0, i, s, "amax")),
        Sample((away(3, 6), np.array([[5, 0, 0, 2], [1, 1, 4, 4], [3, 2, 2, 0]]), away(3, 4)),
               {"dim": 1, "reduce": "amin", "include_self": False},
               lambda torch, x, i, s: torch.scatter_reduce(x, 1, i, s, "amin", include_self=False),
               note="amin, the input left out where scattered"),
    ],
    "topk_indices": [
        Sample((away(3, 6),), {"k": 2, "dim": 1, "largest": True},
               lambda torch, x: torch.topk(x, 2, 1).indices),
        Sample((away(4, 3, 5),), {"k": 3, "dim": 0, "largest": False},
               lambda torch, x: torch.topk(x, 3, 0, largest=False).indices, note="smallest, along dim 0"),
        Sample((away(2, 5),), {"k": 5, "dim": 1, "largest": True},
               lambda torch, x: torch.topk(x, 5, 1).indices, note="k = the whole dim"),
    ],
    "sort_indices": [
        Sample((away(3, 6),), {"dim": 1, "descending": False},
               lambda torch, x: torch.sort(x, dim=1, stable=True).indices),
        Sample((away(4, 3, 2),), {"dim": 0, "descending": True},
               lambda torch, x: torch.sort(x, dim=0, descending=True, stable=True).indices, note="descending"),
        Sample((ints(3, 7, low=0, high=3),), {"dim": 1, "descending": True},
               lambda torch, x: torch.sort(x, dim=1, descending=True, stable=True).indices,
               note="ties keep their order"),
    ],
    "matmul": [
        Sample((away(3, 4), away(4, 5)), torch_fn=lambda torch, x, y: torch.matmul(x, y)),
        Sample((away(2, 3, 4), away(4, 5)), torch_fn=lambda torch, x, y: torch.matmul(x, y), note="batch x 2-D"),
        Sample((away(1, 3, 4), away(2, 4, 2)), torch_fn=lambda torch, x, y: torch.matmul(x, y), note="batch bcast"),
    ],
    "linear": [
        Sample((away(4, 5), away(3, 5)), torch_fn=lambda torch, x, w: torch.nn.functional.linear(x, w)),
        Sample((away(2, 4, 5), away(3, 5)), torch_fn=lambda torch, x, w: torch.nn.functional.linear(x, w)),
        Sample((away(5), away(3, 5)), torch_fn=lambda torch, x, w: torch.nn.functional.linear(x, w), note="1-D input"),
    ],
    "reshape": [Sample((away(3, 4),), {"shape": (2, 6)}, lambda torch, x: x.reshape(2, 6)),
                Sample((away(2, 3, 4),), {"shape": (24,)}, lambda torch, x: x.reshape(24))],
    "permute": [Sample((away(2, 3, 4),), {"dims": (2, 0, 1)}, lambda torch, x: x.permute(2, 0, 1))],
    "expand": [Sample((away(3, 1),), {"shape": (2, 3, 4)}, lambda torch, x: x.expand(2, 3, 4))],
    "getitem": [
        Sample((away(4, 5),), {"key": (("int", 1),)}, lambda torch, x: x[1]),
        Sample((away(4, 5),), {"key": (("slice", 1, None, 2), ("slice", None, -1, None))},
               lambda torch, x: x[1::2, :-1]),
        Sample((away(4, 5),), {"key": (("none",), ("ellipsis",), ("int", -1))}, lambda torch, x: x[None, ..., -1]),
        Sample((away(4, 5), np.array([0, 2, 0, 3])), {"key": (("tensor", 0),)},
               lambda torch, x, i: x[i], note="repeated indices accumulate"),
        Sample((away(4, 5), np.array([1, 3]), np.array([0, 4])), {"key": (("tensor", 0), ("tensor", 1))},
               lambda torch, x, i, j: x[i, j]),
        Sample((away(4, 5), np.array([True, False, True, True])), {"key": (("tensor", 0), SLICE_ALL)},
               lambda torch, x, m: x[m, :], note="bool mask"),
    ],
    "index_put": [
        Sample((away(4, 5), away(5)), {"key": (("int", 1),), "accumulate": False},
               lambda torch, x, v: _torch_setitem(torch, x, (1,), v)),
        Sample((away(4, 5), away(2, 5), np.array([0, 2])), {"key": (("tensor", 0),), "accumulate": False},
               lambda torch, x, v, i: _torch_setitem(torch, x, (i,), v)),
        Sample((away(4, 5), away(3, 5), np.array([0, 2, 0])), {"key": (("tensor", 0),), "accumulate": True},
               lambda torch, x, v, i: torch.index_put(x, (i,), v, accumulate=True), note="duplicates add"),
        Sample((away(4, 5), 0.5), {"key": (SLICE_ALL, ("slice", 1, 3, None)), "accumulate": False},
               lambda torch, x, v: _torch_setitem(torch, x, (slice(None), slice(1, 3)), v)),
    ],
    "cat": [
        Sample((away(2, 3), away(4, 3)), {"dim": 0}, lambda torch, x, y: torch.cat([x, y], 0)),
        Sample((away(2, 3), away(2, 1), away(2, 2)), {"dim": 1}, lambda torch, x, y, z: torch.cat([x, y, z], 1)),
    ],
    "constant_pad": [
        Sample((away(2, 3, 4),), {"pads": ((0, 0, 0), (1, 2, 0), (0, 3, 0)), "value": 0},
               lambda torch, x: torch.nn.functional.pad(x, (0, 3, 1, 2))),
        Sample((away(3, 5),), {"pads": ((-1, 2, 0), (1, -2, 0)), "value": 1.5}, note="crops",
               torch_fn=lambda torch, x: torch.nn.functional.pad(x, (1, -2, -1, 2), value=1.5)),
        Sample((away(2, 4, 3),), {"pads": ((0, 0, 0), (1, -2, 2), (0, 0, 0)), "value": 0}, note="between",
               torch_fn=lambda torch, x: torch.nn.functional.pad(
                   _torch_setitem(torch, torch.zeros(2, 10, 3, dtype=x.dtype), (slice(None), slice(None, None, 3)),
                                  x), (0, 0, 1, -2))),
    ],
    "gather": [
        Sample((away(3, 4), np.array([[0], [3], [1]])), {"dim": 1}, lambda torch, x, i: torch.gather(x, 1, i)),
        Sample((away(3, 4), np.array([[0, 2, 2, 1], [1, 0, 2, 2]])), {"dim": 0},
               lambda torch, x, i: torch.gather(x, 0, i)),
    ],
    "scatter_add": [
        Sample((away(3, 4), np.array([[0, 1], [3, 3], [1, 0]]), away(3, 2)), {"dim": 1},
               lambda torch, x, i, s: torch.scatter_add(x, 1, i, s)),
    ],
    "log_softmax": [
        Sample((away(3, 4),), {"dim": 1}, lambda torch, x: torch.log_softmax(x, 1)),
        Sample((away(2, 3, 4),), {"dim": 0}, lambda torch, x: torch.log_softmax(x, 0)),
        Sample((away(5),), {"dim": 0}, lambda torch, x: torch.log_softmax(x, 0)),
    ],
    "log_softmax_backward": [
        Sample((away(3, 4), away(3, 4)), {"dim": 1},
               lambda torch, g, out: g - torch.exp(out) * g.sum(1, keepdim=True)),
        Sample((away(2, 3), away(2, 3)), {"dim": 0},
               lambda torch, g, out: g - torch.exp(out) * g.sum(0, keepdim=True)),
    ],
    "nll_loss": [_nll_sample(reduction, ignore) for reduction in ("mean", "sum", "none") for ignore in (-100, 2)] + [
        Sample((away(5), np.array(3)), {"dim": 0, "reduction": "mean", "ignore_index": -100},
               lambda torch, x, t: torch.nn.functional.nll_loss(x, t), note="1-D input"),
        Sample((away(2, 3, 4), np.array([[0, 2, 1, 1], [2, 2, 0, 1]])),
               {"dim": 1, "reduction": "mean", "ignore_index": 1},
               lambda torch, x, t: torch.nn.functional.nll_loss(x, t, ignore_index=1), note="spatial"),
    ],
    "nll_loss_backward": [
        Sample((np.array(1.5), away(4, 5), np.array([1, 4, 2, 2])), _nll_attrs("mean", 2),
               lambda torch, g, x, t: _torch_nll_backward(torch, g, x, t, "mean", 2)),
        Sample((away(4), away(4, 5), np.array([1, 4, 0, 2])), _nll_attrs("none", -100),
               lambda torch, g, x, t: _torch_nll_backward(torch, g, x, t, "none", -100)),
    ],
    "full": [Sample((), {"shape": (2, 3), "value": 1.5, "dtype": dt.float64},
                    lambda torch: torch.full((2, 3), 1.5, dtype=torch.float64)),
             Sample((), {"shape": (4,), "value": 7, "dtype": dt.int32},
                    lambda torch: torch.full((4,), 7, dtype=torch.int32))],
    "arange": [Sample((), {"start": 0, "end": 5, "step": 1, "dtype": dt.int64},
                      lambda torch: torch.arange(0, 5, 1, dtype=torch.int64)),
               Sample((), {"start": -3, "end": 8, "step": 3, "dtype": dt.float64},
                      lambda torch: torch.arange(-3, 8, 3, dtype=torch.float64)),
               Sample((), {"start": 2, "end": 9, "step": 2, "dtype": dt.int32},
                      lambda torch: torch.arange(2, 9, 2, dtype=torch.int32))],
    # elementwise math with no code generation template (kind OTHER)
    "tan": _unary("tan", make=lambda *s: _rng.uniform(-1.2, 1.2, s)),
    "asin": _unary("asin", make=lambda *s: _rng.uniform(-0.9, 0.9, s)),
    "acos": _unary("acos", make=lambda *s: _rng.uniform(-0.9, 0.9, s)),
    "atan": _unary("atan"),
    "sinh": _unary("sinh"),
    "cosh": _unary("cosh"),
    "asinh": _unary("asinh"),
    "acosh": _unary("acosh", make=lambda *s: _rng.uniform(1.2, 3.0, s)),
    "atanh": _unary("atanh", make=lambda *s: _rng.uniform(-0.9, 0.9, s)),
    "expm1": _unary("expm1"),
    "erfc": _unary("erfc"),
    "erfinv": _unary("erfinv", make=lambda *s: _rng.uniform(-0.9, 0.9, s)),
    "lgamma": _unary("lgamma", make=pos),
    "digamma": _unary("digamma", make=pos),
    "trigamma": [Sample((pos(3, 4),), torch_fn=lambda torch, x: torch.polygamma(1, x))],
    "polygamma": [Sample((pos(3, 4),), {"n": n}, torch_fn=lambda torch, x, n=n: torch.polygamma(n, x))
                  for n in (2, 3, 5)],
    "trunc": _unary("trunc"),
    "i0": _unary("i0"),
    "i1": [Sample((away(3, 4),), torch_fn=lambda torch, x: torch.special.i1(x))],
    "atan2": _binary("atan2", "atan2")[:3],
    "fmod": _binary("fmod", "fmod")[:4],
    "copysign": _binary("copysign", "copysign")[:3],
    "nextafter": _binary("nextafter", "nextafter")[:3],
    "heaviside": [Sample((np.array([-1.0, 0.0, 2.0]), np.array([0.5, 0.5, 0.5])),
                         torch_fn=lambda torch, x, y: torch.heaviside(x, y))],
    "gcd": [Sample((ints(3, 4), ints(3, 4)), torch_fn=lambda torch, x, y: torch.gcd(x, y))],
    "lcm": [Sample((ints(3, 4), ints(3, 4)), torch_fn=lambda torch, x, y: torch.lcm(x, y))],
    "bitwise_left_shift": [Sample((ints(3, 4), _rng.integers(0, 4, (3, 4))),
                                  torch_fn=lambda torch, x, y: torch.bitwise_left_shift(x, y))],
    "bitwise_right_shift": [Sample((ints(3, 4), _rng.integers(0, 4, (3, 4))),
                                   torch_fn=lambda torch, x, y: torch.bitwise_right_shift(x, y))],
    "cumsum": [Sample((away(3, 4),), {"dim": 1}, torch_fn=lambda torch, x: torch.cumsum(x, 1)),
               Sample((away(3, 4),), {"dim": 0}, torch_fn=lambda torch, x: torch.cumsum(x, 0))],
    "cumprod": [Sample((away(3, 4),), {"dim": 1}, torch_fn=lambda torch, x: torch.cumprod(x, 1)),
                Sample((away(2, 3, 2),), {"dim": 0}, torch_fn=lambda torch, x: torch.cumprod(x, 0))],
    # sliding windows (convolution and pooling)
    "im2col": [
        Sample((away(2, 3, 5, 6),), _win((3, 3), (1, 2), ((1, 1), (0, 0)), (1, 1)),
               lambda torch, x: _cols(torch.nn.functional.unfold(x, (3, 3), padding=(1, 0), stride=(1, 2)))),
        Sample((away(1, 2, 7, 5),), _win((2, 3), (3, 1), ((0, 2), (1, 0)), (2, 1)), note="asymmetric padding",
               torch_fn=lambda torch, x: _cols(torch.nn.functional.unfold(
                   torch.nn.functional.pad(x, (1, 0, 0, 2)), (2, 3), dilation=(2, 1), stride=(3, 1)))),
        Sample((away(2, 2, 7),), _win((3,), (2,), ((1, 1),), (1,)), note="1-d",
               torch_fn=lambda torch, x: _cols(torch.nn.functional.unfold(x.unsqueeze(2), (1, 3), padding=(0, 1),
                                                                          stride=(1, 2)))),
    ],
    "col2im": [
        Sample((away(27, 20),), dict(size=(5, 6), **_win((3, 3), (1, 2), ((1, 1), (0, 0)), (1, 1))),
               lambda torch, c: torch.nn.functional.fold(_uncols(c, 2), (5, 6), (3, 3), padding=(1, 0),
                                                        stride=(1, 2))),
        Sample((away(4, 9),), dict(size=(4, 5), **_win((2, 2), (2, 1), ((1, 1), (0, 0)), (1, 2))),
               lambda torch, c: torch.nn.functional.fold(_uncols(c, 1), (4, 5), (2, 2), dilation=(1, 2),
                                                        padding=(1, 0), stride=(2, 1))),
    ],
    "max_pool": [
        Sample((away(2, 3, 6, 5),), _win((2, 2), (2, 2), ((0, 0), (0, 1)), (1, 1)), note="ceil_mode reach",
               torch_fn=lambda torch, x: torch.nn.functional.max_pool2d(x, 2, 2, ceil_mode=True)),
        Sample((away(1, 2, 7, 7),), _win((3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1)),
               lambda torch, x: torch.nn.functional.max_pool2d(x, 3, 2, 1)),
        Sample((away(2, 2, 9),), _win((3,), (1,), ((1, 1),), (2,)), note="1-d, dilated",
               torch_fn=lambda torch, x: torch.nn.functional.max_pool1d(x, 3, 1, 1, dilation=2)),
    ],
    "linked": [Sample((away(3, 4), away(3, 4), away(2, 3)), torch_fn=lambda torch, g, s, t: g + s * 0 + t.sum() * 0)],
    "max_pool_pick": [
        Sample((away(2, 3, 6, 5), away(2, 3, 6, 5)), _win((2, 2), (2, 2), ((0, 0), (0, 1)), (1, 1)),
               lambda torch, gg, x: _torch_pool_pick(torch, gg, x, lambda f, v: f.max_pool2d(
                   v, 2, 2, ceil_mode=True, return_indices=True))),
        Sample((away(1, 2, 7, 7), away(1, 2, 7, 7)), _win((3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1)),
               lambda torch, gg, x: _torch_pool_pick(torch, gg, x, lambda f, v: f.max_pool2d(
                   v, 3, 2, 1, return_indices=True))),
    ],
    "max_pool_backward": [
        Sample((away(2, 3, 3, 3), away(2, 3, 6, 5)), _win((2, 2), (2, 2), ((0, 0), (0, 1)), (1, 1)),
               lambda torch, g, x: _torch_pool_grad(torch, g, x,
                                                    lambda f, v: f.max_pool2d(v, 2, 2, ceil_mode=True))),
        Sample((away(1, 2, 4, 4), away(1, 2, 7, 7)), _win((3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1)),
               lambda torch, g, x: _torch_pool_grad(torch, g, x, lambda f, v: f.max_pool2d(v, 3, 2, 1))),
    ],
    # Winograd convolution's transforms (runtime/_winograd.py; tested against convolution in test_winograd.py)
    "winograd_input": [
        Sample((away(2, 3, 5, 6),), {"tile": 2, "padding": ((1, 1), (0, 0))},
               lambda torch, x: _torch_wg_input(torch, x, 2, ((1, 1), (0, 0)))),
        Sample((away(1, 2, 7, 9),), {"tile": 4, "padding": ((0, 0), (1, 1))}, note="partial tiles",
               torch_fn=lambda torch, x: _torch_wg_input(torch, x, 4, ((0, 0), (1, 1))))],
    "winograd_input_backward": [
        Sample((away(16, 3, 12),), {"size": (5, 6), "tile": 2, "padding": ((1, 1), (0, 0))},
               lambda torch, g: _torch_adjoint(torch, lambda z: _torch_wg_input(torch, z, 2, ((1, 1), (0, 0))), g,
                                               (2, 3, 5, 6))),
        Sample((away(36, 2, 6),), {"size": (7, 9), "tile": 4, "padding": ((0, 0), (1, 1))},
               lambda torch, g: _torch_adjoint(torch, lambda z: _torch_wg_input(torch, z, 4, ((0, 0), (1, 1))), g,
                                               (1, 2, 7, 9)))],
    "winograd_filter": [
        Sample((away(3, 2, 3, 3),), {"tile": 2}, lambda torch, w: torch.einsum(
            "ai,ocij,bj->aboc", _wg_mats(torch, 2, w)[1], w, _wg_mats(torch, 2, w)[1]).reshape(16, 3, 2)),
        Sample((away(2, 3, 3, 3),), {"tile": 4}, lambda torch, w: torch.einsum(
            "ai,ocij,bj->aboc", _wg_mats(torch, 4, w)[1], w, _wg_mats(torch, 4, w)[1]).reshape(36, 2, 3))],
    "winograd_filter_backward": [
        Sample((away(16, 3, 2),), {"tile": 2}, lambda torch, u: torch.einsum(
            "ai,aboc,bj->ocij", _wg_mats(torch, 2, u)[1], u.reshape(4, 4, 3, 2), _wg_mats(torch, 2, u)[1])),
        Sample((away(36, 2, 3),), {"tile": 4}, lambda torch, u: torch.einsum(
            "ai,aboc,bj->ocij", _wg_mats(torch, 4, u)[1], u.reshape(6, 6, 2, 3), _wg_mats(torch, 4, u)[1]))],
    "winograd_output": [
        Sample((away(16, 3, 12),), {"tile": 2, "size": (5, 4)},
               lambda torch, m: _torch_wg_output(torch, m, 2, (5, 4))),
        Sample((away(36, 2, 6),), {"tile": 4, "size": (5, 9)}, note="partial tiles",
               torch_fn=lambda torch, m: _torch_wg_output(torch, m, 4, (5, 9)))],
    "winograd_output_backward": [
        Sample((away(3, 40),), {"tile": 2, "size": (5, 4)},
               lambda torch, g: _torch_adjoint(torch, lambda z: _torch_wg_output(torch, z, 2, (5, 4)), g, (16, 3, 12))),
        Sample((away(2, 45),), {"tile": 4, "size": (5, 9)},
               lambda torch, g: _torch_adjoint(torch, lambda z: _torch_wg_output(torch, z, 4, (5, 9)), g, (36, 2, 6)))],
    "winograd_output_bias": [
        Sample((away(16, 3, 12), away(3)), {"tile": 2, "size": (5, 4), "relu": True},
               lambda torch, m, b: _torch_wg_output_bias(torch, m, b, 2, (5, 4), True)),
        Sample((away(36, 2, 6), away(2)), {"tile": 4, "size": (5, 9), "relu": False}, note="partial tiles",
               torch_fn=lambda torch, m, b: _torch_wg_output_bias(torch, m, b, 4, (5, 9), False))],
    # linear algebra
    "matrix_exp": [Sample((away(3, 3) * 0.4,), torch_fn=lambda torch, a: torch.linalg.matrix_exp(a)),
                   Sample((away(2, 4, 4) * 0.3,), torch_fn=lambda torch, a: torch.linalg.matrix_exp(a))],
    "inv": [Sample((_spd(3),), torch_fn=lambda torch, a: torch.linalg.inv(a)),
            Sample((_spd(2, 3),), torch_fn=lambda torch, a: torch.linalg.inv(a), note="batched")],
    "det": [Sample((away(3, 3),), torch_fn=lambda torch, a: torch.linalg.det(a)),
            Sample((_spd(2, 3),), torch_fn=lambda torch, a: torch.linalg.det(a), note="batched")],
    "logabsdet": [Sample((_spd(3),), torch_fn=lambda torch, a: torch.linalg.slogdet(a).logabsdet)],
    "solve": [Sample((_spd(3), away(3, 2)), torch_fn=lambda torch, a, b: torch.linalg.solve(a, b)),
              Sample((_spd(2, 3), away(2, 3, 1)), torch_fn=lambda torch, a, b: torch.linalg.solve(a, b))],
    "cholesky": [Sample((_spd(3),), torch_fn=lambda torch, a: torch.linalg.cholesky(a))],
    "eigvalsh": [Sample((_spd(3),), torch_fn=lambda torch, a: torch.linalg.eigvalsh(a))],
    # a fixed matrix: eigenvectors' signs are LAPACK's choice, and numpy's and torch's agree on this one
    "eigh_vectors": [Sample((np.array([[4.0, 1.0, 0.5], [1.0, 3.0, 0.2], [0.5, 0.2, 2.0]]),),
                            torch_fn=lambda torch, a: torch.linalg.eigh(a).eigenvectors)],
    # counter-based random draws (runtime/_philox.py), against a Philox written with torch's int64 arithmetic
    "random_seed": [Sample((), {}, None, note="draws from runtime's generator: no torch equivalent")],
    "philox_uniform": [Sample((np.array(0x123456789ABCDEF, dtype=np.int64),),
                              {"shape": (3, 5), "dtype": dt.float32, "stream": 2},
                              lambda torch, seed: _torch_philox(torch, seed, (3, 5), torch.float32, 2, "uniform")),
                       Sample((np.array(7, dtype=np.int64),), {"shape": (4,), "dtype": dt.float64, "stream": 0},
                              lambda torch, seed: _torch_philox(torch, seed, (4,), torch.float64, 0, "uniform"))],
    "philox_normal": [Sample((np.array(99, dtype=np.int64),), {"shape": (2, 6), "dtype": dt.float64, "stream": 1},
                             lambda torch, seed: _torch_philox(torch, seed, (2, 6), torch.float64, 1, "normal")),
                      Sample((np.array(5, dtype=np.int64),), {"shape": (7,), "dtype": dt.float32, "stream": 3},
                             lambda torch, seed: _torch_philox(torch, seed, (7,), torch.float32, 3, "normal"))],
}


def cplx(*shape, low=0.3, high=2.0):
    """Random complex values with real parts in [low, high) (off log's and sqrt's branch cut, away from 0)."""
    return _rng.uniform(low, high, shape) + 1j * _rng.uniform(-2.0, 2.0, shape)


def _complex_unary(torch_name, make=cplx):
    return [Sample((make(3, 4),), torch_fn=lambda torch, x: getattr(torch, torch_name)(x), note="complex")]


def _complex_binary(torch_name):
    t = lambda torch, x, y: getattr(torch, torch_name)(x, y)  # noqa: E731
    return [Sample((cplx(3, 4), cplx(3, 4)), torch_fn=t, note="complex"),
            Sample((cplx(3, 4), away(4)), torch_fn=t, note="complex and real"),
            Sample((cplx(3, 4), 1.5 - 0.5j), torch_fn=t, note="complex scalar")]


# complex samples of the ops that take complex tensors (runtime.ops.COMPLEX_OPS)
for _name in ("add", "sub", "mul", "div"):
    SAMPLES[_name] = SAMPLES[_name] + _complex_binary(_name)
SAMPLES["pow"] = SAMPLES["pow"] + [
    Sample((cplx(3, 4), 2.0), torch_fn=lambda torch, x, y: torch.pow(x, y), note="complex base"),
    Sample((cplx(3, 4), cplx(3, 4)), torch_fn=lambda torch, x, y: torch.pow(x, y), note="complex")]
for _name in ("neg", "exp", "log", "log1p", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tanh", "sigmoid", "tan",
              "sinh", "cosh", "expm1", "abs", "conj"):
    SAMPLES[_name] = SAMPLES.get(_name, []) + _complex_unary(_name, (lambda *s: cplx(*s, high=1.0))
                                                             if _name in ("sinh", "cosh", "exp", "expm1") else cplx)
SAMPLES["eq"] = SAMPLES["eq"] + [Sample((cplx(3, 4), 1.0 + 0j), torch_fn=lambda torch, x, y: torch.eq(x, y))]
SAMPLES["matmul"] = SAMPLES["matmul"] + [
    Sample((cplx(3, 4), cplx(4, 5)), torch_fn=lambda torch, x, y: torch.matmul(x, y), note="complex"),
    Sample((cplx(2, 3, 4), cplx(4, 5)), torch_fn=lambda torch, x, y: torch.matmul(x, y), note="complex batch")]
SAMPLES["linear"] = SAMPLES["linear"] + [
    Sample((cplx(4, 5), cplx(3, 5)), torch_fn=lambda torch, x, w: torch.nn.functional.linear(x, w), note="complex")]
SAMPLES["sum"] = SAMPLES["sum"] + [
    Sample((cplx(3, 4),), {"dims": (1,), "keepdim": False}, lambda torch, x: torch.sum(x, 1), note="complex")]
SAMPLES["prod"] = SAMPLES["prod"] + [
    Sample((cplx(3, 4),), {"dims": (1,), "keepdim": False}, lambda torch, x: torch.prod(x, 1), note="complex"),
    Sample((np.array([[1 + 1j, 0j, 2 - 1j], [0j, 0j, 1j]]),), {"dims": (1,), "keepdim": False},
           lambda torch, x: torch.prod(x, 1), fd=False, note="complex zeros")]
SAMPLES["cumprod"] = SAMPLES["cumprod"] + [
    Sample((cplx(3, 4),), {"dim": 1}, torch_fn=lambda torch, x: torch.cumprod(x, 1), note="complex")]
SAMPLES["cumsum"] = SAMPLES["cumsum"] + [
    Sample((cplx(3, 4),), {"dim": 1}, torch_fn=lambda torch, x: torch.cumsum(x, 1), note="complex")]
SAMPLES["cast"] = SAMPLES["cast"] + [
    Sample((away(3, 4),), {"dtype": dt.complex128}, lambda torch, x: x.to(torch.complex128), note="real to complex"),
    Sample((cplx(3, 4),), {"dtype": dt.complex64}, lambda torch, x: x.to(torch.complex64), fd=False,
           note="complex narrowed: complex64 steps are too coarse for finite differences")]
SAMPLES["reshape"] = SAMPLES["reshape"] + [
    Sample((cplx(3, 4),), {"shape": (2, 6)}, lambda torch, x: x.reshape(2, 6), note="complex")]
SAMPLES["getitem"] = SAMPLES["getitem"] + [
    Sample((cplx(3, 4),), {"key": (("slice", 1, None, 2), ("slice", None, -1, None))}, lambda torch, x: x[1::2, :-1],
           note="complex")]
SAMPLES["where"] = SAMPLES["where"] + [
    Sample((bools(3, 4), cplx(3, 4), cplx(3, 4)), torch_fn=lambda torch, c, x, y: torch.where(c, x, y),
           note="complex")]
SAMPLES.update({
    "angle": [Sample((cplx(3, 4),), torch_fn=lambda torch, x: torch.angle(x)),
              Sample((away(3, 4),), torch_fn=lambda torch, x: torch.angle(x), fd=False, note="real: 0 or pi")],
    "complex": [Sample((away(3, 4), away(3, 4)), torch_fn=lambda torch, x, y: torch.complex(x, y)),
                Sample((away(3, 1), away(4)), torch_fn=lambda torch, x, y: torch.complex(x, y), note="broadcast")],
    "real": [Sample((cplx(3, 4),), torch_fn=lambda torch, x: torch.real(x))],
    "imag": [Sample((cplx(3, 4),), torch_fn=lambda torch, x: torch.imag(x))],
    "view_as_real": [Sample((cplx(3, 4),), torch_fn=lambda torch, x: torch.view_as_real(x))],
    "view_as_complex": [Sample((away(3, 4, 2),), torch_fn=lambda torch, x: torch.view_as_complex(x))],
    "fft_c2c": [Sample((cplx(3, 4),), {"dims": (1,), "norm": "backward", "forward": True},
                       lambda torch, x: torch.fft.fft(x)),
                Sample((cplx(3, 4),), {"dims": (0, 1), "norm": "ortho", "forward": False},
                       lambda torch, x: torch.fft.ifft2(x, norm="ortho"))],
    "fft_r2c": [Sample((away(3, 5),), {"dims": (1,), "norm": "backward"}, lambda torch, x: torch.fft.rfft(x)),
                Sample((away(3, 4),), {"dims": (0, 1), "norm": "forward"},
                       lambda torch, x: torch.fft.rfft2(x, norm="forward"))],
    "fft_c2r": [Sample((cplx(3, 4),), {"dims": (1,), "norm": "backward", "last_size": 6},
                       lambda torch, x: torch.fft.irfft(x, n=6)),
                Sample((cplx(3, 3),), {"dims": (0, 1), "norm": "ortho", "last_size": 5},
                       lambda torch, x: torch.fft.irfft2(x, s=(3, 5), norm="ortho"))],
})


def _wg_mats(torch, tile, like):
    from runtime import _winograd
    return [torch.tensor(m, dtype=like.dtype) for m in _winograd.matrices(tile)]


def _torch_wg_input(torch, x, tile, padding):
    """winograd_input in torch: the padded input's overlapping (tile+2)^2 patches, each B^T d B."""
    from runtime import _winograd
    bt, _, _ = _wg_mats(torch, tile, x)
    (top, _), (left, _) = padding
    th, tw = _winograd.tile_counts(_winograd.output_sizes(tuple(x.shape[2:]), padding), tile)
    h, w = th * tile + 2, tw * tile + 2
    xp = torch.nn.functional.pad(x, (left, w - left - x.shape[3], top, h - top - x.shape[2]))
    patches = xp.unfold(2, tile + 2, tile).unfold(3, tile + 2, tile)  # (N, C, th, tw, T, T)
    v = torch.einsum("ai,ncyxij,bj->abcnyx", bt, patches, bt)
    return v.reshape((tile + 2) ** 2, x.shape[1], -1)


def _torch_wg_output(torch, m, tile, size):
    """winograd_output in torch: A^T M A per tile, tiles laid out and cropped to size, as (O, N * Ho * Wo)."""
    from runtime import _winograd
    _, _, at = _wg_mats(torch, tile, m)
    th, tw = _winograd.tile_counts(size, tile)
    t, o = tile + 2, m.shape[1]
    y = torch.einsum("ia,abonyx,jb->onyixj", at, m.reshape(t, t, o, -1, th, tw), at)
    y = y.reshape(o, -1, th * tile, tw * tile)[:, :, :size[0], :size[1]]
    return y.reshape(o, -1)


def _torch_wg_output_bias(torch, m, bias, tile, size, relu):
    """winograd_output_bias in torch: winograd_output's (O, N * Ho * Wo) as (N, O, Ho, Wo), plus bias, relu'd."""
    o = m.shape[1]
    y = _torch_wg_output(torch, m, tile, size).reshape(o, -1, *size).permute(1, 0, 2, 3) + bias.reshape(1, o, 1, 1)
    return torch.relu(y) if relu else y


def _torch_adjoint(torch, forward, g, in_shape):
    """The adjoint of a linear torch function at g: the gradient of <forward(z), g> in z (z of in_shape)."""
    z = torch.zeros(in_shape, dtype=g.dtype, requires_grad=True)
    return torch.autograd.grad((forward(z) * g).sum(), z, create_graph=True)[0]


def _torch_pool_grad(torch, g, x, pool):
    x = x.detach().requires_grad_()  # (create_graph: the result's own gradients are compared too)
    return torch.autograd.grad(pool(torch.nn.functional, x), x, g, create_graph=True)[0]


def _torch_pool_pick(torch, gg, x, pool):
    """max_pool_pick's equivalent: gg at each window's maximum, by the indices torch's max pooling returns."""
    values, indices = pool(torch.nn.functional, x.detach())
    return gg.flatten(2).gather(2, indices.flatten(2)).reshape(values.shape)


def _torch_prod(torch, x, dims, keepdim):
    for d in sorted(dims, reverse=True):
        x = torch.prod(x, d, keepdim=keepdim)
    return x


def _torch_setitem(torch, x, key, v):
    out = x.clone()
    out[key] = v
    return out


def _torch_philox(torch, seed, shape, dtype, stream, distribution):
    """Philox-4x32-10 draws written independently with torch int64 tensors: each 32 x 32-bit product is made of
    16-bit halves, so no int64 overflows."""
    mask = 0xFFFFFFFF

    def mulhilo(m, c):
        a, b = m * (c & 0xFFFF), m * (c >> 16)  # both below 2^48
        t = a + ((b & 0xFFFF) << 16)
        return (t >> 32) + (b >> 16), t & mask

    s = int(seed)
    index = torch.arange(int(np.prod(shape)), dtype=torch.int64)
    c = [index & mask, index >> 32, torch.full_like(index, stream), torch.zeros_like(index)]
    k0, k1 = s & mask, (s >> 32) & mask
    for r in range(10):
        if r:
            k0, k1 = (k0 + 0x9E3779B9) & mask, (k1 + 0xBB67AE85) & mask
        hi0, lo0 = mulhilo(0xD2511F53, c[0])
        hi1, lo1 = mulhilo(0xCD9E8D57, c[2])
        c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0]

    def u53(w0, w1):
        return ((w0 >> 5) * (1 << 26) + (w1 >> 6)).to(torch.float64) * 2.0 ** -53

    if distribution == "normal":
        values = torch.sqrt(-2.0 * torch.log(1.0 - u53(c[0], c[1]))) * torch.cos(2.0 * math.pi * u53(c[2], c[3]))
    elif dtype == torch.float32:
        values = (c[0] >> 8).to(torch.float32) * 2.0 ** -24
    else:
        values = u53(c[0], c[1])
    return values.to(dtype).reshape(shape)
