"""The CUDA spelling of the op table's scalar templates: one template (`OpDef.template`, a Python expression over
operands {0}, {1}, ...) becomes one scalar expression for a numba.cuda kernel body.

Operands arrive as variable names already cast to the op's compute dtype; literals are typed to that dtype (so
float32 arithmetic stays float32). Template functions map to `math.*` or to inline expressions with numpy's
semantics (max/min propagate nan, sign keeps nan and zero, sigmoid never overflows).

NOTE: nnc/codegen/scalar.py parses the same templates for nnc's code generators; runtime cannot import nnc (the
layering is tools -> nnc -> runtime), so this is the eager runtime's own small renderer. Both read only the op
table; a later change could move a shared template parser into runtime for both to use.
"""
from __future__ import annotations

import ast
import math
import string

import numpy as np

# the generated-code name of the function that converts a scalar to each dtype (bound in kernels.KERNEL_GLOBALS)
CTORS = {np.dtype(np.float16): "np.float16", np.dtype(np.float32): "np.float32", np.dtype(np.float64): "np.float64",
         np.dtype(np.int8): "np.int8", np.dtype(np.int16): "np.int16", np.dtype(np.int32): "np.int32",
         np.dtype(np.int64): "np.int64", np.dtype(np.uint8): "np.uint8"}
_MATH = {"exp", "log", "log1p", "sqrt", "sin", "cos", "tanh", "erf", "floor"}
_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
           ast.Pow: "**", ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^", ast.LShift: "<<", ast.RShift: ">>"}
_COMPARE = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}


class NoLowering(NotImplementedError):
    """An op (or a form of it) that the CUDA eager backend cannot run; the message names the op."""


def cast(expr: str, d: np.dtype) -> str:
    """expr converted to dtype d (bool: nonzero, as numpy's astype(bool))."""
    d = np.dtype(d)
    if d.kind == "b":
        return f"({expr} != 0)"
    if d not in CTORS:
        raise NoLowering(f"dtype {d} has no CUDA kernels")
    return f"{CTORS[d]}({expr})"


def literal(value, d: np.dtype | None) -> str:
    """A Python scalar typed to d (None: left untyped)."""
    if isinstance(value, (bool, np.bool_)):
        if d is None or np.dtype(d).kind == "b":
            return "True" if value else "False"
        value = int(value)
    if isinstance(value, float):
        text = "math.nan" if math.isnan(value) else ("math.inf" if value == math.inf else
                                                     "(-math.inf)" if value == -math.inf else repr(value))
    else:
        text = repr(int(value))
    if d is None:
        return text
    d = np.dtype(d)
    if d.kind in "iu" and isinstance(value, float):
        return text  # a float literal in an integer computation stays a float, never truncated
    return cast(text, d)


def render(template: str, operands: list[str], attrs: dict, compute: np.dtype, where: str) -> str:
    """One template on operand expressions, as a CUDA scalar expression computing in dtype `compute`."""
    named = {}
    for _, f, _, _ in string.Formatter().parse(template):
        if f is None or f.isdigit():
            continue
        if f == "dtype":
            named[f] = f"__cast_{np.dtype(attrs['dtype'].np).name}"
        else:
            raise NoLowering(f"{where}: template {template!r} reads attribute {f!r}, which CUDA kernels cannot take")
    tree = ast.parse(template.format(*[f"__o{k}" for k in range(len(operands))], **named), mode="eval").body
    return _Renderer(operands, attrs, np.dtype(compute), where).render(tree)


class _Renderer:
    def __init__(self, operands, attrs, compute, where):
        self.operands, self.attrs, self.compute, self.where = operands, attrs, compute, where

    def render(self, t) -> str:
        r = self.render
        c = self.compute
        if isinstance(t, ast.Name) and t.id.startswith("__o"):
            return self.operands[int(t.id[3:])]
        if isinstance(t, ast.Constant):
            return literal(t.value, c)
        if isinstance(t, ast.BinOp) and type(t.op) in _BINOPS:
            return f"({r(t.left)} {_BINOPS[type(t.op)]} {r(t.right)})"
        if isinstance(t, ast.UnaryOp):
            if isinstance(t.op, ast.USub):
                return literal(-t.operand.value, c) if isinstance(t.operand, ast.Constant) else f"(-{r(t.operand)})"
            if isinstance(t.op, ast.Not) or (isinstance(t.op, ast.Invert) and c.kind == "b"):
                return f"(not {r(t.operand)})"  # numpy's invert of a bool is logical not (Python's ~True is -2)
            if isinstance(t.op, ast.Invert):
                return f"(~{r(t.operand)})"
        if isinstance(t, ast.BoolOp):
            word = " and " if isinstance(t.op, ast.And) else " or "
            return "(" + word.join(f"({r(v)} != 0)" for v in t.values) + ")"
        if isinstance(t, ast.Compare) and len(t.ops) == 1 and type(t.ops[0]) in _COMPARE:
            return f"({r(t.left)} {_COMPARE[type(t.ops[0])]} {r(t.comparators[0])})"
        if isinstance(t, ast.IfExp):
            return f"({r(t.body)} if {r(t.test)} else {r(t.orelse)})"
        if isinstance(t, ast.Call) and isinstance(t.func, ast.Name) and not t.keywords:
            return self.call(t.func.id, [r(a) for a in t.args])
        raise NoLowering(f"{self.where}: template construct {ast.dump(t)[:60]} has no CUDA spelling")

    def call(self, name: str, args: list[str]) -> str:
        c = self.compute
        if name in ("max", "min"):
            a, b = args
            op = ">" if name == "max" else "<"
            # numpy's maximum/minimum: a nan on either side wins
            return f"({a} if ({a} {op} {b} or {a} != {a}) else {b})"
        if name == "abs":
            return f"abs({args[0]})"
        if name == "sign":
            x = args[0]
            return f"({literal(1, c)} if {x} > 0 else ({literal(-1, c)} if {x} < 0 else {x}))"
        if name == "sigmoid":
            x = args[0]
            one = literal(1.0, c)
            # NOTE: split by sign so exp never overflows, as runtime.ops' numpy forward does
            return (f"({one} / ({one} + math.exp(-{x})) if {x} >= 0 else "
                    f"math.exp({x}) / ({one} + math.exp({x})))")
        if name == "clamp":
            expr = args[0]
            if self.attrs.get("min") is not None:
                expr = self.call("max", [expr, "lo"])
            if self.attrs.get("max") is not None:
                expr = self.call("min", [expr, "hi"])
            return expr
        if name == "floor":
            if c.kind != "f":
                return args[0]  # integers are their own floor
            x = args[0]
            # NOTE: numba's math.floor returns an int64 (Python 3's rule), wrong for nan, inf and |x| >= 2^63;
            # floats from 2^52 up are integers already, so only smaller ones go through it
            return f"({x} if not (abs({x}) < 4503599627370496.0) else {cast(f'math.floor({x})', c)})"
        if name in _MATH:
            if c.kind != "f":
                raise NoLowering(f"{self.where}: {name} needs a floating-point compute dtype, got {c}")
            return f"math.{name}({args[0]})"
        if name.startswith("__cast_"):
            return cast(args[0], np.dtype(name[len("__cast_"):]))
        raise NoLowering(f"{self.where}: template function {name!r} has no CUDA spelling")
