"""Target-neutral scalar layer: dtypes, typed literals, the Dialect a target spells code with, and ScalarBody,
which turns the op table's templates into one straight-line statement per elementwise node.

`ScalarBody.emit(nodes, env)` builds each statement ONLY from the op's `template` (parsed with `ast`, its function
names mapped by a `Dialect`), computing in the dtype the op's dtype rule gives (float32 stays float32: literals and
Python scalars are typed). Nothing here knows loops, arrays or a target; `KernelCompileError` and `Unsupported` are
the errors every code generator module raises.
"""
from __future__ import annotations

import ast
import functools
import math
import string
from dataclasses import dataclass

import numpy as np

from runtime import dtypes as dt
from runtime.ops import Kind

from ..graph import Node
from ..prims import Prim
from ..symbolic import Shape, is_symbolic


class KernelCompileError(RuntimeError):
    """A kernel could not be generated or compiled; the caller runs its nodes with the interpreter instead."""

    def __init__(self, kernel_name: str, reason: str):
        self.kernel_name = kernel_name
        self.reason = reason
        super().__init__(f"cannot compile kernel {kernel_name}: {reason}")


class Unsupported(Exception):
    """Raised inside generation; compile_kernel turns it into a KernelCompileError naming the kernel."""


def generate_or_raise(kernel, generate, what: str = "code generation"):
    """`generate(kernel)`, with any failure as a KernelCompileError naming the kernel (every target's `generate`)."""
    try:
        return generate(kernel)
    except Unsupported as e:
        raise KernelCompileError(kernel.name, str(e)) from None
    except KernelCompileError:
        raise
    except Exception as e:  # a bug in the generator: still a clear, catchable error
        raise KernelCompileError(kernel.name, f"{what} failed: {type(e).__name__}: {e}") from e


# ---------------------------------------------------------------------------------------------------------------
# dtypes
# ---------------------------------------------------------------------------------------------------------------

def np_dtype(d) -> np.dtype:
    """A numpy dtype from a runtime dtype (or a numpy dtype/type)."""
    return d.np if isinstance(d, dt.dtype) else np.dtype(d)


def check_dtype(d: np.dtype, what: str) -> np.dtype:
    if d.kind == "b" or (d.kind in "iu") or (d.kind == "f" and d.itemsize in (4, 8)):
        return d
    lacking = {"float16": " (numba has no float16 arithmetic on CPU)", "bfloat16": " (numba has no bfloat16 type)"}
    raise Unsupported(f"{what} has dtype {d}, which the numba CPU backend does not support"
                      + lacking.get(d.name, ""))


def ctor(d: np.dtype) -> str:
    """The generated-code name that converts a scalar to dtype d (np.float32, np.bool_, ...)."""
    return "np.bool_" if d.kind == "b" else f"np.{d.name}"


def node_dtype(node: Node) -> np.dtype:
    d = node.meta.get("dtype")
    if d is None:
        raise Unsupported(f"node {node.name} has no dtype meta (run nnc.passes.propagate_shapes first)")
    return check_dtype(np_dtype(d), f"node {node.name}")


def node_shape(node: Node) -> tuple:
    s = node.meta.get("shape")
    if s is None:
        raise Unsupported(f"node {node.name} has no shape meta (run nnc.passes.propagate_shapes first)")
    return Shape(x if is_symbolic(x) else int(x) for x in s)


# ---------------------------------------------------------------------------------------------------------------
# Scalar body (target-neutral): templates -> statements
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class Value:
    """A scalar in generated code: a variable name and its dtype."""

    name: str
    dtype: np.dtype


class _Operand:
    """A stand-in tensor for an op's dtype rule (it reads .dtype and .ndim, and asks is_tensor_like)."""

    def __init__(self, node: Node):
        self.dtype = node.meta["dtype"]
        self.ndim = len(node.meta.get("shape") or ())

    @staticmethod
    def _apply_op(op, inputs, attrs):  # only its presence matters (ops.is_tensor_like)
        raise TypeError("a codegen stand-in is not executable")


def format_literal(value, d: np.dtype | None) -> str:
    """A Python scalar as generated code, typed to d (None: an untyped Python literal). A symbolic size is its
    polynomial over the size symbols, which the kernel then takes as arguments."""
    if is_symbolic(value):
        return f"({value})" if d is None or d.kind == "b" else f"{ctor(d)}({value})"
    if isinstance(value, (bool, np.bool_)):
        if d is None or d.kind == "b":
            return "True" if value else "False"
        value = int(value)
    if isinstance(value, (int, np.integer)):
        value = int(value)
        if d is None or d.kind in "biu":
            if d is not None and d.kind in "iu":
                info = np.iinfo(d)
                if not info.min <= value <= info.max:
                    raise Unsupported(f"integer literal {value} does not fit {d}")
            text = repr(value)
            return text if d is None else f"{ctor(d)}({text})"
        value = float(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if math.isnan(value):
            text = "np.nan"
        elif math.isinf(value):
            text = "np.inf" if value > 0 else "-np.inf"
        else:
            text = repr(value)
        # a float literal in an integer computation stays a (float64) Python float: never truncated
        return text if d is None or d.kind != "f" else f"{ctor(d)}({text})"
    raise Unsupported(f"cannot put {value!r} ({type(value).__name__}) into generated code")


class Dialect:
    """How a target spells template functions, literals and casts. Subclass per target (CPU, CUDA)."""

    # The template functions whose spelled call returns its operands' float dtype: an expression of them and of
    # arithmetic (float_preserving) on operands of one float dtype has that dtype, and is not cast again. None:
    # always cast.
    FLOAT_PRESERVING: frozenset[str] | None = None

    def literal(self, value, d: np.dtype | None) -> str:
        return format_literal(value, d)

    def cast(self, expr: str, d: np.dtype) -> str:
        return expr if _is_call_of(expr, ctor(d)) else f"{ctor(d)}({expr})"

    def floordiv(self, a: str, b: str) -> str:
        return f"({a} // {b})"

    def mod(self, a: str, b: str) -> str:
        return f"({a} % {b})"

    def call(self, name: str, args: list[str], attrs: dict, compute: np.dtype) -> str:
        raise NotImplementedError

    def preamble(self) -> list[str]:
        """Module-level lines (imports, helper definitions) that the calls made so far need."""
        return []


def _is_call_of(expr: str, fn: str) -> bool:
    """Whether expr is one call `fn(...)` (its parentheses close at the very end)."""
    if not (expr.startswith(fn + "(") and expr.endswith(")")):
        return False
    depth = 0
    for i, ch in enumerate(expr[len(fn):]):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            return i == len(expr) - len(fn) - 1
    return False


_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
           ast.Pow: "**", ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^", ast.LShift: "<<", ast.RShift: ">>"}
_UNARY = {ast.USub: "-", ast.UAdd: "+", ast.Not: "not ", ast.Invert: "~"}
_COMPARE = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}


def only_node(kernel, kind: str, ops) -> tuple:
    """(node, OpDef, operands, attrs) of a kernel of `kind` that is one node of one of `ops` (op names)."""
    if len(kernel.nodes) != 1:
        raise Unsupported(f"a {kind} kernel has exactly one node")
    node = kernel.nodes[0]
    op, args, attrs = op_and_attrs(node)
    if op.name not in ops:
        raise Unsupported(f"{op.name} has no {kind} kernel")
    return node, op, args, attrs


def op_and_attrs(node: Node):
    """The OpDef of a prims.* node, its operands and its attrs (kwargs, plus positional ones past the arity)."""
    if node.op != "call_function" or not isinstance(node.target, Prim):
        raise Unsupported(f"node {node.name} ({node.op} {node.target!r}) is not a prims.* primitive")
    op = node.target.op
    args = list(node.args)
    attrs = dict(node.kwargs)
    if op.arity is not None and len(args) > op.arity:
        for name, value in zip(op.attr_names, args[op.arity:]):
            attrs[name] = value
        args = args[:op.arity]
    return op, args, attrs


class ScalarBody:
    """Emits one statement per elementwise node from its op's template: `<value_name(node)> = <expr>`.

    `env` maps nodes (kernel inputs loaded from memory, and nodes already emitted) to Values; emit() adds the nodes
    it emits. Operands are cast to the op's compute dtype (from the op's dtype rule, as eager dispatch does) and the
    result to the node's dtype, so no arithmetic silently widens (a Python float literal would make float32 maths
    float64).
    """

    def __init__(self, dialect: Dialect, value_name=None):
        self.dialect = dialect
        # the variable a node's value gets (a target names them by position, so the code does not name nodes)
        self.value_name = value_name or (lambda node: f"v_{node.name}")
        # index_of(node) -> the expression of the node's element's flat index in its own shape, for ops that
        # need it (OpDef.needs_index: counter-based random draws); a skeleton that can say it sets this
        self.index_of = None

    def emit(self, nodes: list[Node], env: dict[Node, Value]) -> list[str]:
        return [self.statement(node, env) for node in nodes]

    def statement(self, node: Node, env: dict[Node, Value]) -> str:
        op, args, attrs = op_and_attrs(node)
        if op.kind != Kind.ELEMENTWISE or op.template is None:
            raise Unsupported(f"node {node.name}: op {op.name} ({op.kind}) has no scalar template")
        out = node_dtype(node)
        operands = [_Operand(a) if isinstance(a, Node) else a for a in args]
        try:
            compute, out_rule = op.dtype_rule(op, operands, attrs)
        except Exception as e:
            raise Unsupported(f"node {node.name}: dtype rule of {op.name} failed: {e}") from None
        compute = check_dtype(np_dtype(compute if compute is not None else out_rule), f"node {node.name}")
        texts = []
        for k, a in enumerate(args):
            cast = op.cast_inputs is None or k in op.cast_inputs
            if isinstance(a, Node):
                if a not in env:
                    raise Unsupported(f"node {node.name} reads {a.name}, which is neither a kernel input nor "
                                      f"computed before it in the kernel")
                v = env[a]
                texts.append(self.dialect.cast(v.name, compute) if cast and v.dtype != compute else v.name)
            elif a is None or isinstance(a, (bool, int, float, np.generic)) or is_symbolic(a):
                texts.append(self.dialect.literal(a, compute if cast else None) if a is not None else "None")
            else:
                raise Unsupported(f"node {node.name}: operand {k} is {type(a).__name__}, not a node or a scalar")
        if op.needs_index:
            if self.index_of is None:
                raise Unsupported(f"node {node.name}: {op.name} needs its element's index, which this kernel's "
                                  f"skeleton does not provide")
            texts.append(self.index_of(node))
        try:
            expr = self.render_template(op.template, texts, attrs, compute, f"node {node.name}")
        except Unsupported as e:
            message = str(e)
            raise Unsupported(message if message.startswith(f"node {node.name}") else
                              f"node {node.name} ({op.name}, template {op.template!r}): {message}") from None
        same_var = any(expr == t and isinstance(a, Node) and env[a].dtype == out for t, a in zip(texts, args))
        # NOTE: a cast is a call numba types like any other (about a millisecond of compile time each), so none is
        # written where the expression is already of dtype `out`: float arithmetic on operands all of one dtype
        typed = compute == out and out.kind == "f" and self.dialect.FLOAT_PRESERVING is not None \
            and all(op.cast_inputs is None or k in op.cast_inputs for k in range(len(args))) \
            and float_preserving(op.template, self.dialect.FLOAT_PRESERVING)
        env[node] = Value(self.value_name(node), out)
        return f"{env[node].name} = {expr if same_var or typed else self.dialect.cast(_strip(expr), out)}"

    def render_template(self, template: str, operands: list[str], attrs: dict, compute: np.dtype, where: str) -> str:
        """A template on operand expressions (their text) as one expression; `where` starts error messages."""
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
        named = {}
        for f in fields:
            if f.isdigit():
                continue
            if f not in attrs:
                raise Unsupported(f"{where}: template {template!r} needs attribute {f!r}")
            value = attrs[f]
            if isinstance(value, dt.dtype):
                named[f] = f"__cast_{check_dtype(value.np, f'cast target of {where}').name}"
            elif isinstance(value, (bool, int, float)):
                named[f] = f"({value!r})"
            else:
                raise Unsupported(f"{where}: attribute {f}={value!r} cannot appear in a scalar expression")
        placeholders = [f"__o{k}" for k in range(len(operands))]
        try:
            tree = ast.parse(template.format(*placeholders, **named), mode="eval").body
        except (SyntaxError, IndexError, KeyError) as e:
            raise Unsupported(f"{where}: template {template!r} does not parse: {e}") from None
        return _strip(self._render(tree, operands, attrs, compute))

    def fold(self, template: str, acc: str, value: str, dtype: np.dtype) -> str:
        """A reducer's combine template (runtime.ops.Reducer) on an accumulator and a value, both in dtype."""
        return self.render_template(template, [acc, value], {}, dtype, "reducer")

    def _render(self, t, operands, attrs, compute) -> str:
        r = lambda x: self._render(x, operands, attrs, compute)  # noqa: E731
        if isinstance(t, ast.Name):
            if t.id.startswith("__o"):
                return operands[int(t.id[3:])]
            raise Unsupported(f"template refers to an unknown name {t.id!r}")
        if isinstance(t, ast.Constant):
            return self.dialect.literal(t.value, compute)
        if isinstance(t, ast.BinOp) and type(t.op) in _BINOPS:
            remainder = _remainder_pattern(t)
            if remainder is not None:
                return self.dialect.mod(r(remainder[0]), r(remainder[1]))
            return f"({r(t.left)} {_BINOPS[type(t.op)]} {r(t.right)})"
        if isinstance(t, ast.UnaryOp) and type(t.op) in _UNARY:
            if isinstance(t.op, ast.USub) and isinstance(t.operand, ast.Constant):
                return self.dialect.literal(-t.operand.value, compute)
            return f"({_UNARY[type(t.op)]}{r(t.operand)})"
        if isinstance(t, ast.BoolOp):
            word = " and " if isinstance(t.op, ast.And) else " or "
            return "(" + word.join(r(v) for v in t.values) + ")"
        if isinstance(t, ast.Compare) and all(type(o) in _COMPARE for o in t.ops):
            parts = [r(t.left)]
            for o, c in zip(t.ops, t.comparators):
                parts += [_COMPARE[type(o)], r(c)]
            return "(" + " ".join(parts) + ")"
        if isinstance(t, ast.IfExp):
            return f"({r(t.body)} if {r(t.test)} else {r(t.orelse)})"
        if isinstance(t, ast.Call) and isinstance(t.func, ast.Name) and not t.keywords:
            name = t.func.id
            # NOTE: floor(a / b) lowers to a // b: numpy's floor_divide semantics (exact for integers, and for
            # floats floor of the rounded quotient would be off by one where a / b rounds up to an integer).
            if _is_floor_div(t):
                return self.dialect.floordiv(r(t.args[0].left), r(t.args[0].right))
            return self.dialect.call(name, [_strip(r(a)) for a in t.args], attrs, compute)
        raise Unsupported(f"template construct {ast.dump(t)[:80]} is not supported by the code generator")


@functools.lru_cache(maxsize=None)
def float_preserving(template: str, calls: frozenset[str]) -> bool:
    """Whether `template` computes in its operands' dtype when they and its literals all have one float dtype: it
    uses only + - * / // % **, unary minus and plus, conditional expressions on a comparison, and `calls`."""
    fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    if not all(f.isdigit() for f in fields):
        return False  # an attribute: a cast to a dtype, or a value of another type
    try:
        tree = ast.parse(template.format(*(f"__o{k}" for k in range(len(fields) + 1))), mode="eval").body
    except (SyntaxError, IndexError):
        return False
    return _keeps_dtype(tree, calls)


def _keeps_dtype(t, calls: frozenset[str]) -> bool:
    if isinstance(t, ast.Name) or (isinstance(t, ast.Constant) and isinstance(t.value, (int, float))
                                   and not isinstance(t.value, bool)):
        return True
    if isinstance(t, ast.BinOp):
        return type(t.op) in _DTYPE_KEEPING_BINOPS and _keeps_dtype(t.left, calls) and _keeps_dtype(t.right, calls)
    if isinstance(t, ast.UnaryOp):
        return isinstance(t.op, (ast.USub, ast.UAdd)) and _keeps_dtype(t.operand, calls)
    if isinstance(t, ast.IfExp):
        return _keeps_dtype(t.body, calls) and _keeps_dtype(t.orelse, calls)
    if isinstance(t, ast.Call):
        return isinstance(t.func, ast.Name) and t.func.id in calls and not t.keywords \
            and all(_keeps_dtype(a, calls) for a in t.args)
    return False


_DTYPE_KEEPING_BINOPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)


def _is_floor_div(t) -> bool:
    return isinstance(t, ast.Call) and isinstance(t.func, ast.Name) and t.func.id == "floor" and len(t.args) == 1 \
        and not t.keywords and isinstance(t.args[0], ast.BinOp) and isinstance(t.args[0].op, ast.Div)


def _remainder_pattern(t):
    """(a, b) when t is `a - floor(a / b) * b` (or `a - b * floor(a / b)`), else None.

    NOTE: that is the definition of floored modulo, so it lowers to `a % b`, numpy's remainder exactly: the
    spelled-out form rounds twice (off by ~ulp(a) for floats) and gives a instead of 0 for an integer b == 0.
    """
    if not (isinstance(t.op, ast.Sub) and isinstance(t.right, ast.BinOp) and isinstance(t.right.op, ast.Mult)):
        return None
    a, (x, y) = t.left, (t.right.left, t.right.right)
    for fl, b in ((x, y), (y, x)):
        if _is_floor_div(fl) and ast.dump(fl.args[0].left) == ast.dump(a) and ast.dump(fl.args[0].right) == ast.dump(b):
            return a, b
    return None


def _strip(expr: str) -> str:
    """Drop one pair of redundant outer parentheses."""
    if expr.startswith("(") and expr.endswith(")"):
        depth = 0
        for i, ch in enumerate(expr):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0 and i < len(expr) - 1:
                return expr
        return expr[1:-1]
    return expr


def expensive(node: Node) -> bool:
    """Whether a node's op template calls a function other than a cast and the cheap ones (_CHEAP_CALLS), or
    raises to a power (exp, log, erf, sqrt, ...): worth keeping rather than computing again."""
    op, _, _ = op_and_attrs(node)
    if not op.template:
        return False
    text = "".join(literal + ("_field" if field is not None else "")  # a field as a callee is a cast
                   for literal, field, _, _ in string.Formatter().parse(op.template))
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return False
    return any((isinstance(t, ast.Call) and not (isinstance(t.func, ast.Name) and t.func.id in _CHEAP_CALLS))
               or (isinstance(t, ast.BinOp) and isinstance(t.op, ast.Pow)) for t in ast.walk(tree))


# Template functions as cheap as the arithmetic around them (and "_field": a cast to the dtype attribute).
_CHEAP_CALLS = ("_field", "max", "min", "abs", "clamp", "sign", "floor", "ceil", "trunc")
