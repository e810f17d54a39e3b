"""The numba CUDA dialect: how CUDA kernels spell template functions (`math.*`, which numba.cuda lowers to
libdevice, and conditional expressions for numpy's nan rules), literals and casts.

NOTE: numpy's maximum, minimum and sign are written out inline rather than as `cuda.jit(device=True)` helpers:
numba.cuda compiles a called device function for the current GPU's compute capability, so a kernel calling one
cannot be compiled to PTX on a machine without a GPU (the PTX checks run there)."""
from __future__ import annotations

import re

import numpy as np

from .scalar import Dialect, Unsupported, format_literal


class CudaDialect(Dialect):
    """numba CUDA: `math.*` functions (libdevice: exp, log, tanh, erf, ... in the operands' precision), Python's
    `//` and `%` (numba gives them numpy's floored semantics, as on the CPU), numpy scalar constructors as casts."""

    MATH = {"sqrt": "math.sqrt", "sin": "math.sin", "cos": "math.cos", "floor": "math.floor", "exp": "math.exp",
            "log": "math.log", "log1p": "math.log1p", "tanh": "math.tanh", "erf": "math.erf"}

    def literal(self, value, d):
        text = format_literal(value, d)
        # numpy's constants are module attributes numba.cuda may not freeze; math's are plain floats
        return text.replace("np.nan", "math.nan").replace("np.inf", "math.inf")

    def call(self, name, args, attrs, compute):
        if name in self.MATH:
            if name != "floor" and compute.kind != "f":
                raise Unsupported(f"{name} needs a floating-point compute dtype, got {compute}")
            if name == "floor" and compute.kind != "f":
                return args[0]  # floor of an integer is itself (numpy keeps the dtype)
            return f"{self.MATH[name]}({', '.join(args)})"
        if name in ("max", "min"):
            return pick(args[0], args[1], ">" if name == "max" else "<")
        if name == "sign":
            one, zero = self.literal(1, compute), self.literal(0, compute)
            a = atom(args[0])
            return f"({a} if {a} != {a} else ({one} if {a} > {zero} else (-{one} if {a} < {zero} else {zero})))"
        if name == "abs":
            return f"abs({args[0]})"
        if name == "sigmoid":
            if compute.kind != "f":
                raise Unsupported(f"sigmoid needs a floating-point compute dtype, got {compute}")
            one = self.literal(1.0, compute)
            return f"{one} / ({one} + math.exp(-{atom(args[0])}))"
        if name == "clamp":
            if len(args) != 1:
                raise Unsupported("clamp takes one operand (min/max are attributes)")
            expr = args[0]
            low, high = attrs.get("min"), attrs.get("max")
            if low is not None:
                expr = pick(expr, self.literal(low, compute), ">")
            if high is not None:
                expr = pick(expr, self.literal(high, compute), "<")
            return expr
        if name.startswith("__cast_"):
            return self.cast(args[0], np.dtype(name[len("__cast_"):]))
        raise Unsupported(f"template function {name!r} has no CUDA code generator helper")


def pick(a: str, b: str, compare: str) -> str:
    """numpy's maximum (compare ">") or minimum ("<") of two expressions: a nan operand gives nan (Python's max and
    CUDA's fmaxf would return the other operand)."""
    a, b = atom(a), atom(b)
    return f"({a} if {a} {compare} {b} or {a} != {a} else {b})"


_ATOM = re.compile(r"[\w.]+(\[[^\[\]]*\]|\([^()]*\))?")


def atom(expr: str) -> str:
    """expr, parenthesized unless it is a name, a literal, or one call or subscript of simple arguments."""
    return expr if _ATOM.fullmatch(expr) else f"({expr})"
