"""torch._foreach_*: an op over lists of tensors (results as a tuple, as torch's), element by element, as EMA and
optimizer code calls them (timm's ModelEmaV3, torch.optim.swa_utils' multi-tensor averages). torch fuses each list
into few kernels; here each is the tensor op applied per element, with the same results."""
from __future__ import annotations

from . import api

_UNARY = ("abs", "acos", "asin", "atan", "ceil", "cos", "cosh", "erf", "erfc", "exp", "expm1", "floor", "frac",
          "lgamma", "log", "log10", "log1p", "log2", "neg", "reciprocal", "round", "rsqrt", "sigmoid", "sign", "sin",
          "sinh", "sqrt", "tan", "tanh", "trunc")
_BINARY = ("add", "sub", "mul", "div", "maximum", "minimum", "clamp_min", "clamp_max", "pow")


def _spread(value, n: int, what: str) -> list:
    """A second operand per element: a list of them (one each), or one value (a number or tensor) for all."""
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise RuntimeError(f"Tensor lists must have the same number of tensors, got {n} and {len(value)} "
                               f"({what})")
        return list(value)
    return [value] * n


def _unary(name: str):
    def out_of_place(tensors):
        return tuple(getattr(t, name)() for t in tensors)

    def in_place(tensors):
        for t in tensors:
            getattr(t, name + "_")()

    return out_of_place, in_place


def _binary(name: str):
    def out_of_place(tensors, other, **kwargs):
        return tuple(getattr(t, name)(o, **kwargs) for t, o in zip(tensors, _spread(other, len(tensors), name)))

    def in_place(tensors, other, **kwargs):
        for t, o in zip(tensors, _spread(other, len(tensors), name)):
            getattr(t, name + "_")(o, **kwargs)

    return out_of_place, in_place


def _lerp():
    """lerp(tensors, ends, weight): a weight for all (a number or a tensor), or one per tensor."""

    def out_of_place(tensors, ends, weight):
        return tuple(t.lerp(e, w) for t, e, w in zip(tensors, ends, _spread(weight, len(tensors), "lerp")))

    def in_place(tensors, ends, weight):
        for t, e, w in zip(tensors, ends, _spread(weight, len(tensors), "lerp")):
            t.lerp_(e, w)

    return out_of_place, in_place


def _addc(name: str):
    """addcmul / addcdiv(tensors, tensors1, tensors2, value=1): a value for all, a list of them, or a tensor."""

    def values(tensors, value, scalars):
        chosen = value if scalars is None else scalars
        return _spread(chosen.tolist() if hasattr(chosen, "tolist") else chosen, len(tensors), name)

    def out_of_place(tensors, tensors1, tensors2, value=1, *, scalars=None):
        return tuple(getattr(t, name)(a, b, value=v)
                     for t, a, b, v in zip(tensors, tensors1, tensors2, values(tensors, value, scalars)))

    def in_place(tensors, tensors1, tensors2, value=1, *, scalars=None):
        for t, a, b, v in zip(tensors, tensors1, tensors2, values(tensors, value, scalars)):
            getattr(t, name + "_")(a, b, value=v)

    return out_of_place, in_place


def _foreach_norm(tensors, ord=2, dtype=None):
    return tuple(api.norm(t if dtype is None else t.to(dtype), ord) for t in tensors)


def _foreach_max(tensors):
    return tuple(t.max() for t in tensors)


def _foreach_zero_(tensors) -> None:
    for t in tensors:
        t.zero_()


def _foreach_copy_(tensors, src, non_blocking=False) -> None:
    for t, s in zip(tensors, _spread(src, len(tensors), "copy_")):
        t.copy_(s)


def _foreach_clone(tensors):
    return tuple(t.clone() for t in tensors)


def _foreach_powsum(tensors, ord=2):
    return tuple(t.abs().pow(ord).sum() for t in tensors)


def _foreach_mm(tensors, others):
    return tuple(a @ b for a, b in zip(tensors, _spread(others, len(tensors), "mm")))


def functions() -> dict:
    """Every _foreach_ name and its function, out of place and in place."""
    table = {"_foreach_norm": _foreach_norm, "_foreach_max": _foreach_max, "_foreach_zero_": _foreach_zero_,
             "_foreach_copy_": _foreach_copy_, "_foreach_clone": _foreach_clone, "_foreach_powsum": _foreach_powsum,
             "_foreach_mm": _foreach_mm}
    made = [(name, _unary(name)) for name in _UNARY] + [(name, _binary(name)) for name in _BINARY]
    made += [("lerp", _lerp()), ("addcmul", _addc("addcmul")), ("addcdiv", _addc("addcdiv"))]
    for name, (out_of_place, in_place) in made:
        out_of_place.__name__, in_place.__name__ = f"_foreach_{name}", f"_foreach_{name}_"
        table[out_of_place.__name__], table[in_place.__name__] = out_of_place, in_place
    return table
