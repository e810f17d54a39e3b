"""numba CPU code generator: a Kernel becomes readable Python (one scalar body inside a range/prange loop skeleton),
saved in the on-disk cache and compiled with `numba.njit(cache=True)`.

Layers (the first two are target-neutral so a CUDA skeleton can reuse them):

  scalar body   `ScalarBody.emit(nodes, env)`: one straight-line statement per node, built ONLY from the op table's
                `template` (parsed with `ast`, its function names mapped by a `Dialect`), computing in the dtype the
                op's dtype rule gives (float32 stays float32: literals and Python scalars are typed).
  index maths   `broadcast_strides`, `collapse`, `emit_offsets`: element offsets of broadcast inputs from a flat
                index (dims merged where every array is contiguous across them; static shapes, so divisions are by
                constants).
  skeletons     elementwise: one flat loop when nothing broadcasts, else a loop over rows with an inner loop along
                the last (collapsed) dim through per-row slices, so it vectorizes; prange over the outer loop when the
                element count >= PARALLEL_MIN_ELEMENTS (2**18), else range (decided from the static shape).
                reduction: one pass computes the prologue (storing the prologue values the kernel outputs) and
                accumulates every reduction of the kernel (siblings over the same dims, one accumulator each), then
                the epilogue runs per kept position; in one of four forms: rows (one task per kept position,
                an inner loop over reduced positions; >= 64 of them: the prologue fills 1024-value blocks that a
                vectorized helper reduces), columns (the last dim kept: tasks of a tile of up to 1024 accumulators
                x a chunk of rows, swept row by row; with several row chunks, partial results are combined at the
                end), chunked (too few kept positions to go parallel: partial results per chunk, then a serial
                combine). Accumulators: float32 sums/products in float64 (the column form adds float32 spans of at
                most 256 rows first, see _SPAN); amax/amin propagate nan like numpy.
                matmul: numpy BLAS (`np.dot`/`np.matmul`) into the output buffer (shapes BLAS is slow on: a generated
                loop, see small_matmul), then the elementwise skeleton runs the epilogue in place over it.

`compile_kernel(kernel) -> CompiledKernel` generates the module, writes it to the cache (nnc.codegen.cache), imports
it and compiles every numba function for its one static signature (1-D C-contiguous arrays). Any failure raises
`KernelCompileError(kernel name, reason)`; the caller falls back to the interpreter.
"""
from __future__ import annotations

import ast
import hashlib
import math
import string
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from runtime import dtypes as dt
from runtime.ops import Kind

from ..graph import Node
from ..kernel import Kernel, matmul_nodes
from ..prims import Prim
from . import cache

GENERATOR_VERSION = 1
# NOTE: a warm parallel kernel costs ~1.6 µs, which alone would put the crossover near 2**16 elements; but between
# BLAS calls numba's and OpenBLAS's spinning thread pools contend on a 2-core machine (a 10 µs kernel took 2-4 ms
# in an MLP training step), so parallel loops start at 2**18 elements (tools/bench_compile.py, case 4a).
PARALLEL_MIN_ELEMENTS = 2 ** 18
# Reductions with fewer kept positions than this split the reduced range into chunks (a parallel two-pass form).
_REDUCTION_TASKS = 64
_MIN_CHUNK = 4096
# Reductions over at least _MIN_BLOCKED positions run their prologue block by block (_BLOCK values at a time).
_BLOCK = 1024
_MIN_BLOCKED = 64
# Column reductions (last dim kept) take the column skeleton when a parallel kernel keeps >= 4 * _COLUMN_TILE_MIN
# positions. A task sweeps a tile of up to _COLUMN_TILE kept positions (an accumulator each, per reduction) over a
# chunk of the reduced positions; chunks (of >= _MIN_COLUMN_CHUNK positions) are added until there are
# _COLUMN_TASKS tasks. NOTE: measured on the chain backward (tools/bench_compile.py, case 3): tiles of 128 columns ran
# 1.7x slower than tiles of 1024 (per-row loop overhead), and row chunks give the parallelism that the tiles no
# longer give.
_COLUMN_TILE_MIN = 32
_COLUMN_TILE = 1024
_COLUMN_TASKS = 16
_MIN_COLUMN_CHUNK = 32
# NOTE: a column skeleton's float32 sum adds float32 values over spans of at most _SPAN reduced positions and then
# the span's total into a float64 accumulator: vectorized at float32's width (a float64 accumulator in the sweep
# halves it; storing and adding in a second loop cost 0.4-0.8 ms of the chain backward). A span's error is at most
# ~_SPAN ulps of its magnitude, and the float64 total adds none: more accurate than numpy's own axis-0 float32
# sum, which adds row after row in float32.
_SPAN = 256
# A parallel elementwise kernel with broadcasting runs prange over rows when it has at least this many.
_MIN_PARALLEL_ROWS = 64
# A matmul/linear whose first operand has at most FEW_ROWS rows, or a matmul that sums over at most FEW_ROWS
# (a weight gradient g^T @ x at a small batch), runs as a generated loop instead of BLAS (see
# _Generator.small_matmul): linear in tasks of _FEW_ROWS_BLOCK output columns, matmul in tasks of a row x
# _AXPY_BLOCK columns, the short sum one output row a task.
# NOTE: measured on the MLP at batch 8 (2 cores): 8 x 784 x 512 linear 59 us (OpenBLAS 141, torch 84); g^T @ x with
# a sum over 8: 106 us (OpenBLAS 144, torch 66). The limit also keeps OpenBLAS out of a small-batch training step
# altogether: a parallel numba region between OpenBLAS calls makes both thread pools spin against each other on a
# 2-core machine (a batch-8 step ran 10x slower when only the forward used loops).
FEW_ROWS = 8
# Smaller still (at most _SERIAL_LOOP_WORK multiply-adds), a linear with at most FEW_COLUMNS outputs or a matmul
# summing over at most FEW_COLUMNS (a classifier head and its input gradient at batch 128) runs as a *serial*
# generated loop: OpenBLAS wakes its threads for these tiny products (40 us in a batch-128 step for a
# 128 x 512 x 10 linear, 15 us as a loop), and a serial loop has no thread pool to contend with BLAS's.
FEW_COLUMNS = 16
_SERIAL_LOOP_WORK = 2 ** 20
_FEW_ROWS_BLOCK = 8
_AXPY_BLOCK = 1024

# The template functions that go through nnc/codegen/approx.py (vectorizable approximations).
TRANSCENDENTAL = ("exp", "log", "log1p", "tanh", "sigmoid", "erf")


class KernelCompileError(RuntimeError):
    """A kernel could not be generated or compiled; the caller runs its nodes with the interpreter instead."""

    def __init__(self, kernel_name: str, reason: str):
        self.kernel_name = kernel_name
        self.reason = reason
        super().__init__(f"cannot compile kernel {kernel_name}: {reason}")


class _Unsupported(Exception):
    """Raised inside generation; compile_kernel turns it into a KernelCompileError naming the kernel."""


# ---------------------------------------------------------------------------------------------------------------
# dtypes
# ---------------------------------------------------------------------------------------------------------------

def np_dtype(d) -> np.dtype:
    """A numpy dtype from a runtime dtype (or a numpy dtype/type)."""
    return d.np if isinstance(d, dt.dtype) else np.dtype(d)


def check_dtype(d: np.dtype, what: str) -> np.dtype:
    if d.kind == "b" or (d.kind in "iu") or (d.kind == "f" and d.itemsize in (4, 8)):
        return d
    raise _Unsupported(f"{what} has dtype {d}, which the numba CPU backend does not support"
                       + (" (numba has no float16 arithmetic on CPU)" if d == np.float16 else ""))


def ctor(d: np.dtype) -> str:
    """The generated-code name that converts a scalar to dtype d (np.float32, np.bool_, ...)."""
    return "np.bool_" if d.kind == "b" else f"np.{d.name}"


def _node_dtype(node: Node) -> np.dtype:
    d = node.meta.get("dtype")
    if d is None:
        raise _Unsupported(f"node {node.name} has no dtype meta (run nnc.passes.propagate_shapes first)")
    return check_dtype(np_dtype(d), f"node {node.name}")


def _node_shape(node: Node) -> tuple:
    s = node.meta.get("shape")
    if s is None:
        raise _Unsupported(f"node {node.name} has no shape meta (run nnc.passes.propagate_shapes first)")
    return tuple(int(x) for x in s)


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
    """A Python scalar as generated code, typed to d (None: an untyped Python literal)."""
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
                    raise _Unsupported(f"integer literal {value} does not fit {d}")
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
    raise _Unsupported(f"cannot put {value!r} ({type(value).__name__}) into generated code")


class Dialect:
    """How a target spells template functions, literals and casts. Subclass per target (CPU, CUDA)."""

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


class CpuDialect(Dialect):
    """numba CPU: numpy scalar ufuncs (numpy's nan semantics), approx.py for transcendentals."""

    NUMPY = {"sqrt": "np.sqrt", "sin": "np.sin", "cos": "np.cos", "floor": "np.floor", "abs": "np.abs",
             "sign": "np.sign", "max": "np.maximum", "min": "np.minimum"}

    def __init__(self):
        self._approx: dict[str, tuple[str, str]] = {}  # helper name -> (function name, dtype name)
        self.approx_digest: str | None = None

    def call(self, name, args, attrs, compute):
        if name in self.NUMPY:
            return f"{self.NUMPY[name]}({', '.join(args)})"
        if name in TRANSCENDENTAL:
            if compute.kind != "f":
                raise _Unsupported(f"{name} needs a floating-point compute dtype, got {compute}")
            helper = f"{name}_f{compute.itemsize * 8}"  # approx.py's names: exp_f32, erf_f64, ...
            approx = _approx_module()
            if approx is not None:
                helper = approx.approx_name(name, compute)
            self._approx[helper] = (name, compute.name)
            return f"{helper}({', '.join(args)})"
        if name == "clamp":
            if len(args) != 1:
                raise _Unsupported("clamp takes one operand (min/max are attributes)")
            expr = args[0]
            low, high = attrs.get("min"), attrs.get("max")
            if low is not None:
                expr = f"np.maximum({expr}, {self.literal(low, compute)})"
            if high is not None:
                expr = f"np.minimum({expr}, {self.literal(high, compute)})"
            return expr
        if name.startswith("__cast_"):
            return self.cast(args[0], np.dtype(name[len("__cast_"):]))
        raise _Unsupported(f"template function {name!r} has no CPU code generator helper")

    def preamble(self):
        if not self._approx:
            return []
        approx = _approx_module()
        lines = []
        if approx is not None:
            # NOTE: numba's cache does not notice when a called function changes, so approx.py's hash is part of
            # the source (and so of the file name): editing approx.py gives new kernel files, never stale code.
            self.approx_digest = _file_digest(approx.__file__)
            lines.append(f"from nnc.codegen.approx import {', '.join(sorted(self._approx))}")
        else:  # approx.py not there yet: numpy's own functions (correct, not vectorizable)
            for helper, (fn, dtype) in sorted(self._approx.items()):
                lines += _fallback_helper(helper, fn, dtype)
        return lines


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


def _approx_module():
    try:
        from . import approx
    except ImportError:
        return None
    return approx if hasattr(approx, "approx_function") else None


def _file_digest(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def _fallback_helper(helper: str, fn: str, dtype: str) -> list[str]:
    one = f"np.{dtype}(1.0)"
    if fn == "sigmoid":
        body = ["    e = np.exp(-np.abs(x))", f"    return {one} / ({one} + e) if x >= 0 else e / ({one} + e)"]
    elif fn == "erf":
        body = [f"    return np.{dtype}(math.erf(x))"]
    else:
        body = [f"    return np.{fn}(x)"]
    return ["", "", "@njit(inline='always', cache=True, error_model='numpy')", f"def {helper}(x):"] + body


_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
           ast.Pow: "**", ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^", ast.LShift: "<<", ast.RShift: ">>"}
_UNARY = {ast.USub: "-", ast.UAdd: "+", ast.Not: "not ", ast.Invert: "~"}
_COMPARE = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}


def _op_and_attrs(node: Node):
    """The OpDef of a prims.* node, its operands and its attrs (kwargs, plus positional ones past the arity)."""
    if node.op != "call_function" or not isinstance(node.target, Prim):
        raise _Unsupported(f"node {node.name} ({node.op} {node.target!r}) is not a prims.* primitive")
    op = node.target.op
    args = list(node.args)
    attrs = dict(node.kwargs)
    if op.arity is not None and len(args) > op.arity:
        for name, value in zip(op.attr_names, args[op.arity:]):
            attrs[name] = value
        args = args[:op.arity]
    return op, args, attrs


class ScalarBody:
    """Emits one statement per elementwise node from its op's template: `v_<node> = <expr>`.

    `env` maps nodes (kernel inputs loaded from memory, and nodes already emitted) to Values; emit() adds the nodes
    it emits. Operands are cast to the op's compute dtype (from the op's dtype rule, as eager dispatch does) and the
    result to the node's dtype, so no arithmetic silently widens (a Python float literal would make float32 maths
    float64).
    """

    def __init__(self, dialect: Dialect):
        self.dialect = dialect

    def emit(self, nodes: list[Node], env: dict[Node, Value]) -> list[str]:
        return [self.statement(node, env) for node in nodes]

    def statement(self, node: Node, env: dict[Node, Value]) -> str:
        op, args, attrs = _op_and_attrs(node)
        if op.kind != Kind.ELEMENTWISE or op.template is None:
            raise _Unsupported(f"node {node.name}: op {op.name} ({op.kind}) has no scalar template")
        out = _node_dtype(node)
        operands = [_Operand(a) if isinstance(a, Node) else a for a in args]
        try:
            compute, out_rule = op.dtype_rule(op, operands, attrs)
        except Exception as e:
            raise _Unsupported(f"node {node.name}: dtype rule of {op.name} failed: {e}") from None
        compute = check_dtype(np_dtype(compute if compute is not None else out_rule), f"node {node.name}")
        texts = []
        for k, a in enumerate(args):
            cast = op.cast_inputs is None or k in op.cast_inputs
            if isinstance(a, Node):
                if a not in env:
                    raise _Unsupported(f"node {node.name} reads {a.name}, which is neither a kernel input nor "
                                       f"computed before it in the kernel")
                v = env[a]
                texts.append(self.dialect.cast(v.name, compute) if cast and v.dtype != compute else v.name)
            elif a is None or isinstance(a, (bool, int, float, np.generic)):
                texts.append(self.dialect.literal(a, compute if cast else None) if a is not None else "None")
            else:
                raise _Unsupported(f"node {node.name}: operand {k} is {type(a).__name__}, not a node or a scalar")
        try:
            expr = self.render_template(op.template, texts, attrs, compute, node)
        except _Unsupported as e:
            message = str(e)
            raise _Unsupported(message if message.startswith(f"node {node.name}") else
                               f"node {node.name} ({op.name}, template {op.template!r}): {message}") from None
        same_var = any(expr == t and isinstance(a, Node) and env[a].dtype == out for t, a in zip(texts, args))
        env[node] = Value(f"v_{node.name}", out)
        return f"v_{node.name} = {expr if same_var else self.dialect.cast(_strip(expr), out)}"

    def render_template(self, template: str, operands: list[str], attrs: dict, compute: np.dtype, node) -> str:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
        named = {}
        for f in fields:
            if f.isdigit():
                continue
            if f not in attrs:
                raise _Unsupported(f"node {node.name}: template {template!r} needs attribute {f!r}")
            value = attrs[f]
            if isinstance(value, dt.dtype):
                named[f] = f"__cast_{check_dtype(value.np, f'cast target of {node.name}').name}"
            elif isinstance(value, (bool, int, float)):
                named[f] = f"({value!r})"
            else:
                raise _Unsupported(f"node {node.name}: attribute {f}={value!r} cannot appear in a scalar expression")
        placeholders = [f"__o{k}" for k in range(len(operands))]
        try:
            tree = ast.parse(template.format(*placeholders, **named), mode="eval").body
        except (SyntaxError, IndexError, KeyError) as e:
            raise _Unsupported(f"node {node.name}: template {template!r} does not parse: {e}") from None
        return _strip(self._render(tree, operands, attrs, compute))

    def _render(self, t, operands, attrs, compute) -> str:
        r = lambda x: self._render(x, operands, attrs, compute)  # noqa: E731
        if isinstance(t, ast.Name):
            if t.id.startswith("__o"):
                return operands[int(t.id[3:])]
            raise _Unsupported(f"template refers to an unknown name {t.id!r}")
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
        raise _Unsupported(f"template construct {ast.dump(t)[:80]} is not supported by the code generator")


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


# ---------------------------------------------------------------------------------------------------------------
# Index arithmetic (target-neutral)
# ---------------------------------------------------------------------------------------------------------------

def broadcast_strides(shape, full) -> list[int]:
    """Element strides of a C-contiguous array of `shape` read broadcast to `full` (0 along broadcast dims)."""
    shape, full = tuple(shape), tuple(full)
    pad = len(full) - len(shape)
    if pad < 0:
        raise _Unsupported(f"shape {list(shape)} does not broadcast to {list(full)}")
    padded = (1,) * pad + shape
    strides, step = [0] * len(full), 1
    for k in reversed(range(len(full))):
        if padded[k] == full[k] and full[k] != 1:
            strides[k] = step
            step *= padded[k]
        elif padded[k] != 1:
            raise _Unsupported(f"shape {list(shape)} does not broadcast to {list(full)}")
    return strides


def broadcast_shape(a, b):
    """numpy's broadcast of two shapes, or None."""
    try:
        return tuple(np.broadcast_shapes(tuple(a), tuple(b)))
    except ValueError:
        return None


def collapse(sizes, stride_lists):
    """Drop size-1 dims and merge neighbours that every array walks contiguously (same offsets, fewer divisions)."""
    keep = [k for k, s in enumerate(sizes) if s != 1]
    out_sizes = []
    out_strides = [[] for _ in stride_lists]
    for k in keep:
        if out_sizes and all(st[k] * sizes[k] == cur[-1] for st, cur in zip(stride_lists, out_strides)):
            out_sizes[-1] *= sizes[k]
            for st, cur in zip(stride_lists, out_strides):
                cur[-1] = st[k]
            continue
        out_sizes.append(sizes[k])
        for st, cur in zip(stride_lists, out_strides):
            cur.append(st[k])
    return out_sizes, out_strides


def emit_offsets(sizes, stride_lists, flat: str, prefix: str):
    """(lines, offset expressions): each array's element offset at flat index `flat` over `sizes`.

    A full contiguous array reads at `flat` itself, a broadcast scalar at 0; others from the mixed-radix digits of
    `flat` (constant divisors: the shapes are static).
    """
    sizes, strides = collapse(list(sizes), [list(s) for s in stride_lists])
    n = len(sizes)
    inner = [math.prod(sizes[k + 1:]) for k in range(n)]
    digits = {}
    for k in range(n):
        digit = flat if inner[k] == 1 else f"{flat} // {inner[k]}"
        if k > 0:  # the leading digit needs no modulo
            digit = f"{flat} % {sizes[k]}" if inner[k] == 1 else f"({digit}) % {sizes[k]}"
        digits[k] = digit
    exprs, needed = [], set()
    for st in strides:
        if not any(st):
            exprs.append("0")
        elif st == inner:
            exprs.append(flat)
        else:
            terms = []
            for k in range(n):
                if st[k]:
                    name = flat if digits[k] == flat else f"{prefix}{k}"
                    if name != flat:
                        needed.add(k)
                    terms.append(name if st[k] == 1 else f"{name} * {st[k]}")
            exprs.append(" + ".join(terms))
    return [f"{prefix}{k} = {digits[k]}" for k in sorted(needed)], exprs


# ---------------------------------------------------------------------------------------------------------------
# CPU skeletons
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class _Array:
    """One argument of a numba function: a 1-D C-contiguous view of a value."""

    arg: str
    node: Node
    shape: tuple
    dtype: np.dtype


@dataclass
class _Function:
    name: str
    args: list[_Array]
    lines: list[str]
    parallel: bool
    reassociate: bool = False  # fastmath reassoc + contract: a dot product's sum in vector lanes, with FMA

    def source(self) -> str:
        sig = ", ".join(a.arg for a in self.args)
        doc = "; ".join(f"{a.arg}: {a.node.name} {a.dtype.name}{list(a.shape)}" for a in self.args)
        fastmath = ", fastmath={'reassoc', 'contract'}" if self.reassociate else ""
        head = [f"@njit(cache=True, parallel={self.parallel}{fastmath}, error_model='numpy')",
                f"def {self.name}({sig}):", f"    # {doc}"]
        return "\n".join(head + ["    " + line if line else "" for line in self.lines])


@dataclass
class Generated:
    """What generation produces: the module source and, per numba function, its argument dtypes."""

    source: str
    signatures: dict[str, list[np.dtype]]
    parallel: bool
    in_specs: list[tuple[tuple, np.dtype]]
    out_specs: list[tuple[tuple, np.dtype]]
    # The pieces of `source`, for nnc.codegen.whole_graph to put several kernels into one module:
    preamble: list[str] = field(default_factory=list)     # module-level lines: approx imports (or helpers)
    definitions: list[str] = field(default_factory=list)  # helper and numba function sources, in order
    launch: list[str] = field(default_factory=list)       # the body of launch(ins, outs) (numba-compatible)
    stamp: str = ""                                       # the generator/numba/approx versions line


def _indent(lines, n=1):
    return ["    " * n + line if line else "" for line in lines]


def _py_name(name: str) -> str:
    out = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)
    return out if out and not out[0].isdigit() else f"k_{out}"


class _Generator:
    def __init__(self, kernel: Kernel):
        self.kernel = kernel
        self.name = _py_name(kernel.name)
        self.dialect = CpuDialect()
        self.body = ScalarBody(self.dialect)
        self.functions: list[_Function] = []
        self.helpers: dict[str, str] = {}
        self.launch: list[str] = []
        for node in kernel.nodes:
            _node_shape(node), _node_dtype(node)
        self.ins = [_Array(f"in{k}", n, _node_shape(n), _node_dtype(n)) for k, n in enumerate(kernel.inputs)]
        self.outs = [_Array(f"out{k}", n, _node_shape(n), _node_dtype(n)) for k, n in enumerate(kernel.outputs)]
        members = set(kernel.nodes)
        for a in self.ins:
            if a.node in members:
                raise _Unsupported(f"{a.node.name} is both an input and a node of the kernel")
        for a in self.outs:
            if a.node not in members:
                raise _Unsupported(f"output {a.node.name} is not a node of the kernel")
        if not kernel.outputs:
            raise _Unsupported("the kernel has no outputs")

    # -- elementwise --------------------------------------------------------------------------------------------

    def elementwise_function(self, fname, nodes, ins, outs, shape) -> _Function:
        """The elementwise skeleton: loads at broadcast offsets, the scalar body, stores.

        When every array is contiguous over the whole iteration space (no broadcasting) it is one flat loop. With
        broadcasting it is a loop over rows with an inner loop over the last (collapsed) dim, so the inner loop
        reads every array at base + j * stride and vectorizes (a flat loop would need a division per element and
        does not vectorize); a parallel kernel with too few rows keeps the flat loop over all elements.
        """
        numel = math.prod(shape)
        parallel = numel >= PARALLEL_MIN_ELEMENTS
        loop = "prange" if parallel else "range"
        arrays = ins + outs
        strides = [broadcast_strides(a.shape, shape) for a in arrays]
        sizes, collapsed = collapse(list(shape), strides)
        rows = math.prod(sizes[:-1]) if sizes else 1
        nested = len(sizes) >= 2 and (not parallel or rows >= _MIN_PARALLEL_ROWS)
        hoisted: set[int] = set()
        if nested:
            # NOTE: each row reads and writes through slices (row_in0 = in0[b0:b0 + n]) indexed by the inner j: j is
            # provably >= 0, so numba's negative-index wraparound folds away and the loop vectorizes. Indexing the
            # flat array at b0 + j inside a prange does not (the parfor's row index has no known sign): measured
            # 9x slower on one thread. Row-invariant reads (a [B, 1] input) are loaded once per row.
            length = sizes[-1]
            row_lines, bases = emit_offsets(sizes[:-1], [st[:-1] for st in collapsed], "o", "o_")
            base_vars: dict[str, str] = {}
            views: set[str] = set()
            refs = []
            for k, (a, base, st) in enumerate(zip(arrays, bases, collapsed)):
                if base != "0" and base not in base_vars:
                    base_vars[base] = base if base.isidentifier() else f"b{len(base_vars)}"
                    if base_vars[base] != base:
                        row_lines.append(f"{base_vars[base]} = {base}")
                b = base_vars.get(base, "0")
                step = st[-1]
                if step and b == "0":  # a row the same for every o (a bias): the array itself
                    refs.append(f"{a.arg}[{'j' if step == 1 else f'j * {step}'}]")
                elif step:
                    view = f"row_{a.arg}"
                    if view not in views:
                        views.add(view)
                        span = (length - 1) * step + 1
                        row_lines.append(f"{view} = {a.arg}[{b}:{b} + {span}]")
                    refs.append(f"{view}[{'j' if step == 1 else f'j * {step}'}]")
                else:
                    refs.append(f"{a.arg}[{b}]")
                    if k < len(ins):
                        hoisted.add(k)
            header = [f"for o in {loop}({rows}):"] + _indent(row_lines)
            inner_loop = [f"for j in range({length}):"]
            depth = 2
        else:
            index_lines, offsets = emit_offsets(shape, strides, "i", "i_")
            refs = [f"{a.arg}[{off}]" for a, off in zip(arrays, offsets)]
            header = [f"for i in {loop}({numel}):"] + _indent(index_lines)
            inner_loop = []
            depth = 1
        row_loads, loads, body, stores, _ = self.scalar_pass(ins, outs, refs, hoisted, nodes)
        header += _indent(row_loads + inner_loop)
        unique: dict[str, _Array] = {}
        for a in arrays:  # an array read and written in place is one argument (its last role names it)
            unique.pop(a.arg, None)
            unique[a.arg] = a
        return _Function(fname, list(unique.values()), header + _indent(loads + body + stores, depth), parallel)

    def scalar_pass(self, ins, outs, refs, hoisted, nodes):
        """(hoisted loads, loads, body, stores, env) of one pass: each input loaded from its ref (the inputs in
        `hoisted`, by position, once per outer iteration), the nodes' scalar statements, each output stored."""
        env: dict[Node, Value] = {}
        hoisted_loads, loads = [], []
        for k, (a, ref) in enumerate(zip(ins, refs)):
            env[a.node] = Value(f"v_{a.node.name}", a.dtype)
            (hoisted_loads if k in hoisted else loads).append(f"v_{a.node.name} = {ref}")
        body = self.body.emit(nodes, env)
        stores = [f"{ref} = {env[a.node].name}" for a, ref in zip(outs, refs[len(ins):])]
        return hoisted_loads, loads, body, stores, env

    def gen_elementwise(self):
        shape = tuple(self.kernel.shape)
        for n in self.kernel.nodes:
            op, _, _ = _op_and_attrs(n)
            if op.kind != Kind.ELEMENTWISE:
                raise _Unsupported(f"node {n.name}: op {op.name} ({op.kind}) is not elementwise")
            if broadcast_shape(_node_shape(n), shape) != shape:
                raise _Unsupported(f"node {n.name} has shape {list(_node_shape(n))}, which does not fit the kernel "
                                   f"shape {list(shape)}")
        f = self.elementwise_function(self.name, self.kernel.nodes, self.ins, self.outs, shape)
        self.functions.append(f)
        self.launch = [f"{f.name}({', '.join(self._flat(a) for a in f.args)})"]

    @staticmethod
    def _flat(a: _Array) -> str:
        """The launcher's expression for a's flat view (in3 -> ins[3].reshape(-1))."""
        if a.arg.startswith("out"):
            return f"outs[{a.arg[3:]}].reshape(-1)"
        return f"ins[{a.arg[2:]}].reshape(-1)"

    # -- reduction ----------------------------------------------------------------------------------------------

    def gen_reduction(self):
        """The reduction skeleton: one pass over the input shape computes the prologue (storing the prologue values
        the kernel outputs) and accumulates every reduction of the kernel (siblings: same input shape, same reduced
        dims, same output shape), then the epilogue runs per kept position on the reduced shape."""
        k = self.kernel
        accs = self._accumulators()
        red_nodes = [a.node for a in accs]
        shape = tuple(k.shape)
        ndim = len(shape)
        dims, out_shape = accs[0].dims, accs[0].out_shape
        prologue, epilogue = _split_reduction_kernel(k.nodes, red_nodes)
        prologue_set = set(prologue)
        for n in prologue:
            broadcast_strides(_node_shape(n), shape)
        for n in epilogue:
            if _node_shape(n) != out_shape:
                raise _Unsupported(f"epilogue node {n.name} has shape {list(_node_shape(n))}, not the reduced "
                                   f"shape {list(out_shape)}")
            if any(a in prologue_set for a in n.all_input_nodes):
                raise _Unsupported(f"epilogue node {n.name} reads a prologue value")
        pro_ins = [a for a in self.ins if any(a.node in n.all_input_nodes for n in prologue + red_nodes)]
        epi_ins = [a for a in self.ins if any(a.node in n.all_input_nodes for n in epilogue)]
        for a in epi_ins:
            broadcast_strides(a.shape, out_shape)
        pro_outs = [a for a in self.outs if a.node in prologue_set]
        epi_outs = [a for a in self.outs if a.node not in prologue_set]

        kept = [d for d in range(ndim) if d not in dims]
        n_outer = math.prod(shape[d] for d in kept)
        n_red = math.prod(shape[d] for d in dims)
        numel = n_outer * n_red
        parallel = numel >= PARALLEL_MIN_ELEMENTS
        # NOTE: reducing outer dims while the last dim is kept (a bias gradient: sum over the batch) walks columns:
        # the column skeleton keeps a tile of accumulators and sweeps the input row by row, contiguous and
        # vectorized, instead of striding down one column per accumulator.
        column = bool(ndim) and (ndim - 1) not in dims and shape[-1] > 1 and n_red > 1 and n_outer > 1 \
            and (not parallel or n_outer >= 4 * _COLUMN_TILE_MIN)
        chunks = 1
        if parallel and n_outer < _REDUCTION_TASKS and not column:
            chunks = max(1, min(-(-_REDUCTION_TASKS // max(n_outer, 1)), n_red // _MIN_CHUNK))
        chunk = n_red
        if chunks > 1:
            chunk = -(-n_red // chunks)
            chunk = -(-chunk // _BLOCK) * _BLOCK  # whole blocks per chunk
            chunks = -(-n_red // chunk)

        # Offsets of prologue arrays: base(o) over the kept dims + an offset over the reduced dims. When the reduced
        # dims collapse to one (the usual case) every array is read through a per-task slice at r * step (r >= 0 is
        # provable there, so no negative-index wraparound and the prologue loop vectorizes); otherwise from the
        # digits of the absolute reduced index.
        blocked = not column and n_red >= _MIN_BLOCKED \
            and all(a.reducer.block is not None and a.acc_dtype.kind != "b" for a in accs)
        block = min(_BLOCK, chunk)
        pro_arrays = pro_ins + pro_outs
        full_strides = [broadcast_strides(a.shape, shape) for a in pro_arrays]
        o_lines, o_offs = emit_offsets([shape[d] for d in kept], [[s[d] for d in kept] for s in full_strides],
                                       "o", "o_")
        red_sizes, red_strides = collapse([shape[d] for d in dims], [[s[d] for d in dims] for s in full_strides])
        linear = len(red_sizes) <= 1
        lo = "0" if chunks == 1 else f"c * {chunk}"
        length = str(n_red) if chunks == 1 else "m"
        task_lines, refs, hoisted = [], [], set()
        if chunks > 1:
            task_lines.append(f"m = min({chunk}, {n_red} - c * {chunk})  # this chunk's length")
        if linear:
            digit_lines = []
            for k, (a, oo, st) in enumerate(zip(pro_arrays, o_offs, red_strides)):
                step = st[0] if st else 0
                if not step:
                    refs.append(f"{a.arg}[{oo}]")
                    if k < len(pro_ins):
                        hoisted.add(k)
                    continue
                start = " + ".join(t for t in (oo, lo if step == 1 else f"{lo} * {step}") if t not in ("0", "0 * 1"))
                start = "" if lo == "0" and oo == "0" else start
                view = a.arg
                if start:
                    view = f"red_{a.arg}"
                    task_lines.append(f"{view} = {a.arg}[{start}:]")
                refs.append(f"{view}[{'r' if step == 1 else f'r * {step}'}]")
        else:
            absolute = "r" if lo == "0" else "ra"
            digit_lines, r_offs = emit_offsets([shape[d] for d in dims], [[s[d] for d in dims] for s in full_strides],
                                               absolute, "r_")
            if absolute == "ra":
                digit_lines = [f"ra = {lo} + r"] + digit_lines
            for k, (a, oo, ro) in enumerate(zip(pro_arrays, o_offs, r_offs)):
                if oo != "0" and ro != "0":
                    task_lines.append(f"b_{a.arg} = {oo}")
                    oo = f"b_{a.arg}"
                refs.append(f"{a.arg}[{' + '.join(t for t in (oo, ro) if t != '0') or '0'}]")
                if ro == "0" and k < len(pro_ins):
                    hoisted.add(k)
        task_loads, loads, pro_body, pro_stores, env = self.scalar_pass(pro_ins, pro_outs, refs, hoisted, prologue)
        task_lines += task_loads
        values = [env[a.source] for a in accs]
        per_element = digit_lines + loads + pro_body + pro_stores
        if blocked:
            # NOTE: the prologue fills a block buffer per reduction in a loop with no loop-carried dependence (it
            # vectorizes, approx.py's exp included), then a helper reduces each block with the reassociation a
            # serial accumulator forbids (measured 10x faster for a row sum).
            reduce_lines = [f"{a.acc} = {a.identity}" for a in accs]
            reduce_lines += [f"{a.buf} = np.empty({block}, dtype={ctor(a.in_dtype)})" for a in accs]
            reduce_lines += [f"for r0 in range(0, {length}, {block}):"]
            reduce_lines += _indent([f"n = min({block}, {length} - r0)", "for q in range(n):"])
            fills = [f"{a.buf}[q] = {v.name}" for a, v in zip(accs, values)]
            reduce_lines += _indent(["r = r0 + q"] + per_element + fills, 2)
            combines = [f"{a.acc} = {a.reducer.combine(a.acc, f'{self._block_helper_of(a)}({a.buf}, n)')}"
                        for a in accs]
            reduce_lines += _indent(combines)
        else:
            combines = [f"{a.acc} = {a.reducer.combine(a.acc, self._acc_term(v, a))}" for a, v in zip(accs, values)]
            reduce_lines = [f"{a.acc} = {a.identity}" for a in accs] + [f"for r in range({length}):"]
            reduce_lines += _indent(per_element + combines)

        # epilogue over the reduced shape at flat index o
        e_lines, e_offs = emit_offsets(out_shape, [broadcast_strides(a.shape, out_shape) for a in epi_ins + epi_outs],
                                       "o", "e_")

        def finish_lines(results: list[str]) -> list[str]:
            """The reductions' values from their accumulator expressions, then the epilogue and the stores."""
            lines = []
            for a, result in zip(accs, results):
                env[a.node] = Value(f"v_{a.node.name}", a.out_dtype)
                lines.append(f"v_{a.node.name} = {self.dialect.cast(result, a.out_dtype)}")
            lines += e_lines + [f"v_{a.node.name} = {a.arg}[{off}]" for a, off in zip(epi_ins, e_offs)]
            for a in epi_ins:
                env[a.node] = Value(f"v_{a.node.name}", a.dtype)
            lines += self.body.emit(epilogue, env)
            lines += [f"{a.arg}[{off}] = {env[a.node].name}" for a, off in zip(epi_outs, e_offs[len(epi_ins):])]
            return lines

        if column:
            lines = self.column_reduction(shape, kept, dims, n_outer, n_red, parallel, pro_ins, pro_outs, prologue,
                                          accs, finish_lines)
        elif chunks == 1:
            loop = "prange" if parallel else "range"
            lines = [f"for o in {loop}({n_outer}):"]
            lines += _indent(o_lines + task_lines + reduce_lines + finish_lines([a.acc for a in accs]))
        else:
            tasks = n_outer * chunks
            lines = [f"{a.partial} = np.empty({tasks}, dtype={ctor(a.acc_dtype)})" for a in accs]
            lines += [f"for t in prange({tasks}):"]
            lines += _indent([f"o = t // {chunks}", f"c = t - o * {chunks}"] + o_lines + task_lines + reduce_lines
                             + [f"{a.partial}[t] = {a.acc}" for a in accs])
            lines += [f"for o in range({n_outer}):"]
            lines += _indent([f"{a.acc} = {a.partial}[o * {chunks}]" for a in accs] + [f"for c in range(1, {chunks}):"])
            lines += _indent([f"{a.acc} = {a.reducer.combine(a.acc, f'{a.partial}[o * {chunks} + c]')}" for a in accs],
                             2)
            lines += _indent(finish_lines([a.acc for a in accs]))
        f = _Function(self.name, self.ins + self.outs, lines, parallel)
        self.functions.append(f)
        self.launch = [f"{f.name}({', '.join(self._flat(a) for a in f.args)})"]

    def _accumulators(self) -> list[_Accumulator]:
        """One accumulator per reduction node of the kernel, after checking they can share one pass: each reads one
        tensor of the kernel's shape, and all reduce the same dims to the same output shape."""
        k = self.kernel
        reductions = [n for n in k.nodes if isinstance(n.target, Prim) and n.target.op.kind == Kind.REDUCTION]
        if not reductions:
            raise _Unsupported("a reduction kernel needs at least one reduction node, found none")
        accs = []
        for i, red in enumerate(reductions):
            op, args, attrs = _op_and_attrs(red)
            if op.name not in _REDUCERS:
                raise _Unsupported(f"reduction {op.name} has no accumulator in the CPU code generator")
            if len(args) != 1 or not isinstance(args[0], Node):
                raise _Unsupported(f"reduction {red.name} must read one tensor")
            shape = _node_shape(args[0])
            if tuple(k.shape) != shape:
                raise _Unsupported(f"kernel shape {list(k.shape)} is not the input shape {list(shape)} of "
                                   f"reduction {red.name}")
            ndim = len(shape)
            dims = sorted({d % ndim if ndim else 0 for d in attrs.get("dims", ())} & set(range(ndim)))
            reducer = _REDUCERS[op.name]
            in_dtype, out_dtype = _node_dtype(args[0]), _node_dtype(red)
            acc_dtype = reducer.acc_dtype(in_dtype, out_dtype)
            suffix = "" if len(reductions) == 1 else str(i)
            accs.append(_Accumulator(red, op.name, reducer, args[0], dims, _node_shape(red), in_dtype, out_dtype,
                                     acc_dtype, self.dialect.literal(reducer.identity(acc_dtype), acc_dtype), suffix))
        first = accs[0]
        for a in accs[1:]:
            if (a.dims, a.out_shape) != (first.dims, first.out_shape):
                raise _Unsupported(f"reductions {first.node.name} and {a.node.name} reduce different dims or to "
                                   f"different shapes, so they cannot share one pass")
        return accs

    def _acc_term(self, value: Value, acc: _Accumulator) -> str:
        """A prologue value as the accumulator's dtype."""
        return value.name if value.dtype == acc.acc_dtype else self.dialect.cast(value.name, acc.acc_dtype)

    def _block_helper_of(self, acc: _Accumulator) -> str:
        return self.block_helper(acc.op_name, acc.reducer, acc.in_dtype, acc.acc_dtype)

    def column_reduction(self, shape, kept, dims, n_outer, n_red, parallel, pro_ins, pro_outs, prologue, accs,
                         finish_lines) -> list[str]:
        """The column skeleton: tasks of a tile of kept positions x a chunk of reduced positions, each with a tile of
        accumulators per reduction; for each reduced position r, one vectorizable sweep over the tile. With several
        chunks, tasks leave partial results that a last loop combines per kept position before the epilogue."""
        tile, n_tiles, chunk, chunks = _column_tasks(n_outer, n_red, parallel)
        arrays = pro_ins + pro_outs
        strides = [broadcast_strides(a.shape, shape) for a in arrays]
        r_lines, r_offs = emit_offsets([shape[d] for d in dims], [[s[d] for d in dims] for s in strides], "r", "r_")
        ksizes, kstrides = collapse([shape[d] for d in kept], [[s[d] for d in kept] for s in strides])
        per_r, inner, refs, hoisted = list(r_lines), [], [], set()
        if len(ksizes) <= 1:  # the kept positions are one strided run per array: read through per-r slices
            for k, (a, ro, kst) in enumerate(zip(arrays, r_offs, kstrides)):
                step = kst[0] if kst else 0
                if not step:
                    refs.append(f"{a.arg}[{ro}]")
                    if k < len(pro_ins):
                        hoisted.add(k)
                    continue
                start = " + ".join(t for t in (ro, "o0" if step == 1 else f"o0 * {step}") if t != "0")
                per_r.append(f"col_{a.arg} = {a.arg}[{start}:]")
                refs.append(f"col_{a.arg}[{'oo' if step == 1 else f'oo * {step}'}]")
        else:
            o_lines, o_offs = emit_offsets([shape[d] for d in kept], [[s[d] for d in kept] for s in strides], "o",
                                           "o_")
            inner = ["o = o0 + oo"] + o_lines
            for k, (a, ro, oo_off) in enumerate(zip(arrays, r_offs, o_offs)):
                refs.append(f"{a.arg}[{' + '.join(t for t in (oo_off, ro) if t != '0') or '0'}]")
                if oo_off == "0" and k < len(pro_ins):
                    hoisted.add(k)
        r_loads, loads, body, stores, env = self.scalar_pass(pro_ins, pro_outs, refs, hoisted, prologue)
        per_r += r_loads
        sweep = ["for oo in range(nt):"] + _indent(inner + loads + body + stores)
        # NOTE: accumulating float32 values into float64 inside the sweep makes LLVM vectorize the whole sweep at
        # float64's width (half as many lanes): the sweep stores the values to a tile buffer and a second loop
        # accumulates them (measured 1.5x faster on the chain backward).
        def accumulate(a: _Accumulator, value: Value) -> str:
            return f"{a.acc}[oo] = {a.reducer.combine(f'{a.acc}[oo]', self._acc_term(value, a))}"

        # float32 sums add float32 values over spans of at most _SPAN reduced positions, then each span's total
        # into the float64 accumulator (see _SPAN); other widened reductions (products) store, then accumulate.
        widened = [a for a in accs if env[a.source].dtype != a.acc_dtype]
        spanned = [a for a in widened if a.op_name == "sum" and a.out_dtype == a.in_dtype]
        stored = [a for a in widened if a not in spanned]
        sweep += _indent([f"{a.vals}[oo] += {env[a.source].name}" for a in spanned])
        sweep += _indent([f"{a.vals}[oo] = {env[a.source].name}" for a in stored])
        sweep += _indent([accumulate(a, env[a.source]) for a in accs if a not in widened])
        if stored:
            sweep += ["for oo in range(nt):"]
            sweep += _indent([accumulate(a, Value(f"{a.vals}[oo]", env[a.source].dtype)) for a in stored])
        task = ([f"o0 = task * {tile}"] if chunks == 1 else
                [f"c = task % {chunks}", f"o0 = (task // {chunks}) * {tile}"])
        task += [f"nt = min({tile}, {n_outer} - o0)"]
        task += [f"{a.acc} = np.empty({tile}, dtype={ctor(a.acc_dtype)})" for a in accs]
        task += [f"{a.vals} = np.empty({tile}, dtype={ctor(env[a.source].dtype)})" for a in widened]
        task += ["for oo in range(nt):"] + _indent([f"{a.acc}[oo] = {a.identity}" for a in accs])
        start, stop = ("0", str(n_red)) if chunks == 1 else (f"c * {chunk}", f"min({n_red}, (c + 1) * {chunk})")
        if spanned:
            task += [f"for r0 in range({start}, {stop}, {_SPAN}):"]
            task += _indent(["for oo in range(nt):"] + _indent([f"{a.vals}[oo] = {a.identity_of_values}"
                                                                for a in spanned]))
            task += _indent([f"for r in range(r0, min({stop}, r0 + {_SPAN})):"] + _indent(per_r + sweep))
            task += _indent(["for oo in range(nt):"]
                            + _indent([accumulate(a, Value(f"{a.vals}[oo]", env[a.source].dtype)) for a in spanned]))
        else:
            task += [f"for r in range({start}, {stop}):"] + _indent(per_r + sweep)
        loop = "prange" if parallel else "range"
        lines = [f"{a.partial} = np.empty({chunks * n_outer}, dtype={ctor(a.acc_dtype)})" for a in accs
                 if chunks > 1]
        lines += [f"for task in {loop}({n_tiles * chunks}):"]
        if chunks == 1:
            task += ["for oo in range(nt):"] + _indent(["o = o0 + oo"] + finish_lines([f"{a.acc}[oo]" for a in accs]))
            return lines + _indent(task)
        task += ["for oo in range(nt):"] + _indent([f"{a.partial}[c * {n_outer} + o0 + oo] = {a.acc}[oo]"
                                                    for a in accs])
        lines += _indent(task) + [f"for o in range({n_outer}):"]
        lines += _indent([f"{a.total} = {a.partial}[o]" for a in accs] + [f"for c in range(1, {chunks}):"])
        lines += _indent([f"{a.total} = {a.reducer.combine(a.total, f'{a.partial}[c * {n_outer} + o]')}"
                          for a in accs], 2)
        return lines + _indent(finish_lines([a.total for a in accs]))

    def block_helper(self, op_name: str, reducer, in_dtype: np.dtype, acc_dtype: np.dtype) -> str:
        """The name of a module-level helper reducing buf[:n] (buf of in_dtype) into acc_dtype; defines it once."""
        name = f"block_{op_name}_{in_dtype.name}"
        if name in self.helpers:
            return name
        one = ctor(acc_dtype)
        if reducer.block == "fold":
            lines = ["@njit(fastmath={'reassoc'}, error_model='numpy')", f"def {name}(buf, n):",
                     f'    """{op_name} of buf[:n] in {acc_dtype} (reassociated, so it vectorizes)."""',
                     f"    acc = {self.dialect.literal(reducer.identity(acc_dtype), acc_dtype)}",
                     "    for q in range(n):",
                     f"        acc = {reducer.combine('acc', self.dialect.cast('buf[q]', acc_dtype))}",
                     "    return acc"]
        else:
            # NOTE: one serial max chain runs at one element per compare latency and does not vectorize (not even
            # under nnan); eight independent accumulators do (measured 0.52 -> 0.15 ns per element, numpy 0.13).
            # The select ignores nan, so a float block is checked for nan separately (numpy's max propagates it).
            pick = ">" if op_name == "amax" else "<"
            lanes = [f"a{k}" for k in range(8)]
            pick_into = lambda a, v: f"{a} = {v} if {v} {pick} {a} else {a}"  # noqa: E731
            lines = ["@njit(error_model='numpy')", f"def {name}(buf, n):",
                     f'    """{op_name} of buf[:n] (n >= 1), eight accumulators wide'
                     + (", nan if any is nan (numpy's)." if in_dtype.kind == "f" else ".") + '"""',
                     f"    {' = '.join(lanes)} = buf[0]", "    full = n - n % 8", "    for q in range(0, full, 8):"]
            for k in range(8):
                lines += [f"        v{k} = buf[q + {k}]" if k else "        v0 = buf[q]",
                          "        " + pick_into(f"a{k}", f"v{k}")]
            for step in (1, 2, 4):
                for k in range(0, 8, 2 * step):
                    lines.append("    " + pick_into(f"a{k}", f"a{k + step}"))
            lines += ["    for q in range(full, n):", "        v = buf[q]", "        " + pick_into("a0", "v")]
            if in_dtype.kind == "f":
                lines += ["    bad = False", "    for q in range(n):", "        bad |= buf[q] != buf[q]",
                          f"    return {one}(np.nan) if bad else a0"]
            else:
                lines.append("    return a0")
        self.helpers[name] = "\n".join(lines)
        return name

    # -- matmul -------------------------------------------------------------------------------------------------

    def gen_matmul(self):
        k = self.kernel
        anchors = matmul_nodes(k)
        if len(anchors) != 1:
            raise _Unsupported("a matmul kernel has exactly one matmul/linear node")
        mm = anchors[0]
        op, args, attrs = _op_and_attrs(mm)
        if op.name not in ("matmul", "linear") or len(args) != 2 or not all(isinstance(a, Node) for a in args):
            raise _Unsupported(f"matmul anchor {mm.name} ({op.name}) is not a matmul/linear of two tensors")
        by_node = {a.node: a for a in self.ins}
        if any(a not in by_node for a in args):
            raise _Unsupported(f"the operands of {mm.name} are not kernel inputs")
        a_arr, b_arr = by_node[args[0]], by_node[args[1]]
        mm_shape, mm_dtype = _node_shape(mm), _node_dtype(mm)
        epilogue = [n for n in k.nodes if n is not mm]  # in graph order: side inputs (a relu mask) come first
        for n in epilogue:
            if _node_shape(n) != mm_shape:
                raise _Unsupported(f"epilogue node {n.name} has shape {list(_node_shape(n))}, not the matmul "
                                   f"output shape {list(mm_shape)}")
        out_of = {a.node: a for a in self.outs}
        # where the product goes: its own output, else (in place) an epilogue output of the same shape and dtype
        in_place = None
        if mm in out_of:
            target = f"outs[{self.outs.index(out_of[mm])}]"
        else:
            same = [a for a in self.outs if a.shape == mm_shape and a.dtype == mm_dtype]
            in_place = same[-1] if same else None
            target = f"outs[{self.outs.index(in_place)}]" if same else None
        lines = []
        if target is None:
            lines.append(f"mm = np.empty({mm_shape!r}, dtype={ctor(mm_dtype)})")
        else:
            lines.append(f"mm = {target}")
        ia, ib = f"ins[{self.ins.index(a_arr)}]", f"ins[{self.ins.index(b_arr)}]"
        loop = self.small_matmul(op.name, mm, a_arr, b_arr)
        if loop is not None:
            self.functions.append(loop)
            lines.append(f"{loop.name}({ia}.reshape(-1), {ib}.reshape(-1), mm.reshape(-1))")
        elif op.name == "linear":
            kdim, n_out = b_arr.shape[1], b_arr.shape[0]
            lines.append(f"np.dot({ia}.reshape(-1, {kdim}), {ib}.T, out=mm.reshape(-1, {n_out}))")
        elif len(b_arr.shape) == 2 and len(a_arr.shape) >= 2:
            kdim, n_out = b_arr.shape
            lines.append(f"np.dot({ia}.reshape(-1, {kdim}), {ib}, out=mm.reshape(-1, {n_out}))")
        else:
            lines.append(f"np.matmul({ia}, {ib}, out=mm)")
        if epilogue:
            # NOTE: in place, the product is read through the output's own argument: with two arguments pointing at
            # the same memory LLVM's runtime alias check fails and the loop runs scalar (measured 3.4x slower).
            mm_arr = _Array(in_place.arg if in_place is not None else "mm", mm, mm_shape, mm_dtype)
            ins = [mm_arr] + [a for a in self.ins if any(a.node in n.all_input_nodes for n in epilogue)]
            outs = [a for a in self.outs if a.node is not mm]
            f = self.elementwise_function(f"{self.name}_epilogue", epilogue, ins, outs, mm_shape)
            self.functions.append(f)
            flat = ["mm.reshape(-1)" if a.arg == "mm" else self._flat(a) for a in f.args]
            lines.append(f"{f.name}({', '.join(flat)})")
        self.launch = lines

    def small_matmul(self, op_name, mm, a_arr, b_arr) -> _Function | None:
        """A matmul/linear of a few rows or a short sum (small batches) as a generated loop; None: BLAS runs it.

        Four forms (measured against OpenBLAS here: tools/bench_compile.py cases 4 and 5):
          linear with at most FEW_ROWS rows of `a`: dot products of contiguous rows, all rows at once, so each
            weight element is loaded once (the rows of `a` stay in L1); parallel over blocks of output columns.
            BLAS's matrix-vector path is single-threaded.
          matmul with at most FEW_ROWS rows: each output row is rows of b scaled and added, vectorized along N,
            parallel over rows x column blocks.
          matmul summing over at most FEW_ROWS (a weight gradient at a small batch): each output element is its
            short sum written out, parallel over output rows; serial for a sum over at most FEW_COLUMNS when the
            whole product is small.
          linear with at most FEW_COLUMNS outputs and a small product: every column's dot product in one sweep
            over a row of `a`, serial.
        Sums run in the output dtype with reassociation and FMA, as BLAS's do.
        """
        a_shape, b_shape, dtype = a_arr.shape, b_arr.shape, _node_dtype(mm)
        if dtype.kind != "f" or a_arr.dtype != dtype or b_arr.dtype != dtype or len(b_shape) != 2 or not a_shape:
            return None
        rows, kdim = math.prod(a_shape[:-1]), a_shape[-1]
        args = [_Array("a", a_arr.node, a_shape, dtype), _Array("b", b_arr.node, b_shape, dtype),
                _Array("out", mm, _node_shape(mm), dtype)]
        zero = self.dialect.literal(0, dtype)
        if kdim == 0:
            return None
        n_out = b_shape[0] if op_name == "linear" else b_shape[1]
        work = rows * kdim * n_out  # multiply-adds
        parallel = work >= PARALLEL_MIN_ELEMENTS
        if op_name == "linear" and rows <= FEW_ROWS:  # each weight row swept once, every row of `a` held
            lines = self._dot_lines("b", "a", n_out, rows, kdim, lambda h: f"{h * n_out} + s", zero,
                                    _FEW_ROWS_BLOCK)
        elif op_name == "matmul" and len(a_shape) >= 2 and rows <= FEW_ROWS:
            lines = self._axpy_rows_lines(rows, kdim, n_out, zero)
        elif op_name == "matmul" and len(a_shape) >= 2 and kdim <= FEW_ROWS:
            lines = self._short_sum_lines(rows, kdim, n_out)
        elif work <= _SERIAL_LOOP_WORK and op_name == "linear" and n_out <= FEW_COLUMNS:
            # each row of `a` swept once, every weight row held
            lines = self._dot_lines("a", "b", rows, n_out, kdim, lambda h: f"s * {n_out} + {h}", zero, 1)
            parallel = False
        elif work <= _SERIAL_LOOP_WORK and op_name == "matmul" and len(a_shape) >= 2 and kdim <= FEW_COLUMNS:
            lines, parallel = self._short_sum_lines(rows, kdim, n_out), False
        else:
            return None
        lines[0] = lines[0].replace("LOOP", "prange" if parallel else "range")
        return _Function(f"{self.name}_rows", args, lines, parallel, reassociate=True)

    @staticmethod
    def _dot_lines(swept, held, n_swept, n_held, kdim, out_at, zero, block) -> list[str]:
        """out = a . w^T as dot products of contiguous rows of length kdim: tasks of `block` rows s of `swept`;
        each is read once, in one sweep over k that adds it into a sum per row h of `held` (n_held rows, which
        stay in L1). out_at(h) is the flat output index (of s and h) a sum is stored at."""
        accs = [f"acc{h}" for h in range(n_held)]
        rows = ([f"for s in LOOP({n_swept}):"] if block == 1 else
                [f"for blk in LOOP({-(-n_swept // block)}):",
                 f"    for s in range(blk * {block}, min({n_swept}, blk * {block} + {block})):"])
        body = ([f"sr = {swept}[s * {kdim}:s * {kdim} + {kdim}]",
                 f"{', '.join(accs)} = {', '.join([zero] * n_held)}",
                 f"for k in range({kdim}):",
                 "    v = sr[k]"]
                + [f"    {acc} += {held}[{h * kdim} + k] * v" for h, acc in enumerate(accs)]
                + [f"out[{out_at(h)}] = {acc}" for h, acc in enumerate(accs)])
        return rows + _indent(body, len(rows))

    @staticmethod
    def _short_sum_lines(rows, kdim, n_out) -> list[str]:
        """out[i, :] = sum over k < kdim of a[i, k] * b[k, :] with the sum written out: one task per output row,
        the kdim rows of b in L1, each output element written once."""
        terms = " + ".join(f"a{k} * b[{k * n_out} + j]" for k in range(kdim))
        return ([f"for i in LOOP({rows}):"]
                + [f"    a{k} = a[i * {kdim} + {k}]" for k in range(kdim)]
                + [f"    base = i * {n_out}",
                   f"    for j in range({n_out}):",
                   f"        out[base + j] = {terms}"])

    @staticmethod
    def _axpy_rows_lines(rows, kdim, n_out, zero) -> list[str]:
        """out[i, n0:n1] = sum over k of a[i, k] * b[k, n0:n1], one task per row i and block of columns."""
        block = min(n_out, _AXPY_BLOCK)
        blocks = -(-n_out // block)
        return [f"for task in LOOP({rows * blocks}):",
                f"    i = task // {blocks}",
                f"    n0 = (task % {blocks}) * {block}",
                f"    n1 = min({n_out}, n0 + {block})",
                f"    orow = out[i * {n_out} + n0:i * {n_out} + n1]",
                "    for j in range(n1 - n0):",
                f"        orow[j] = {zero}",
                f"    for k in range({kdim}):",
                f"        aik = a[i * {kdim} + k]",
                f"        brow = b[k * {n_out} + n0:k * {n_out} + n1]",
                "        for j in range(n1 - n0):",
                "            orow[j] += aik * brow[j]"]

    # -- module -------------------------------------------------------------------------------------------------

    def generate(self) -> Generated:
        kind = self.kernel.kind
        if kind == "elementwise":
            self.gen_elementwise()
        elif kind == "reduction":
            self.gen_reduction()
        elif kind == "matmul":
            self.gen_matmul()
        else:
            raise _Unsupported(f"kernel kind {kind!r} has no code generation (run it as is)")
        import numba

        ops = ", ".join(n.target.op.name for n in self.kernel.nodes)
        preamble = self.dialect.preamble()
        header = [f'"""nnc kernel {self.kernel.name} ({kind}): {ops} over {list(self.kernel.shape)}."""',
                  f"# generated by nnc.codegen.cpu v{GENERATOR_VERSION} for numba {numba.__version__}"
                  + (f"; approx.py {self.dialect.approx_digest}" if self.dialect.approx_digest else ""),
                  "import math", "", "import numpy as np", "from numba import njit, prange"]
        definitions = list(self.helpers.values()) + [f.source() for f in self.functions]
        parts = ["\n".join(header + preamble)] + definitions
        parts.append("\n".join(["def launch(ins, outs):", '    """Run the kernel on C-contiguous input and output '
                                'arrays."""'] + _indent(self.launch)))
        source = "\n\n\n".join(parts) + "\n"
        return Generated(source=source,
                         signatures={f.name: [a.dtype for a in f.args] for f in self.functions},
                         parallel=any(f.parallel for f in self.functions),
                         in_specs=[(a.shape, a.dtype) for a in self.ins],
                         out_specs=[(a.shape, a.dtype) for a in self.outs],
                         preamble=preamble, definitions=definitions, launch=list(self.launch), stamp=header[1])


@dataclass(frozen=True)
class _Reducer:
    combine: Callable[[str, str], str]
    identity: Callable[[np.dtype], object]
    acc_dtype: Callable[[np.dtype, np.dtype], np.dtype]
    block: str | None = None  # the block helper's kind: "fold" (sum/prod) or "extreme" (amax/amin); None: none


@dataclass
class _Accumulator:
    """One reduction of a reduction kernel: what it reads and accumulates, and its variables in generated code
    (acc, buf, partial for a kernel's only reduction; acc0, acc1, ... when several share the pass)."""

    node: Node
    op_name: str
    reducer: _Reducer
    source: Node
    dims: list
    out_shape: tuple
    in_dtype: np.dtype
    out_dtype: np.dtype
    acc_dtype: np.dtype
    identity: str  # the reducer's identity as a literal of acc_dtype
    suffix: str

    acc = property(lambda self: f"acc{self.suffix}")
    buf = property(lambda self: f"buf{self.suffix}")
    partial = property(lambda self: f"partial{self.suffix}")
    vals = property(lambda self: f"vals{self.suffix}")
    identity_of_values = property(lambda self: format_literal(0, self.in_dtype))  # a sum's zero, in in_dtype
    total = property(lambda self: f"total{self.suffix}")


def _column_tasks(n_outer: int, n_red: int, parallel: bool) -> tuple[int, int, int, int]:
    """(tile, tiles, chunk, chunks) of the column skeleton: balanced tiles of at most _COLUMN_TILE kept positions
    (a multiple of 16, whole vectors), and when parallel, reduced positions split into chunks until there are
    _COLUMN_TASKS tasks (chunks of at least _MIN_COLUMN_CHUNK positions)."""
    n_tiles = -(-n_outer // _COLUMN_TILE)
    balanced = -(-n_outer // n_tiles)
    tile = min(n_outer, -(-balanced // 16) * 16)
    chunks = 1
    if parallel and n_tiles < _COLUMN_TASKS:
        chunks = max(1, min(-(-_COLUMN_TASKS // n_tiles), n_red // _MIN_COLUMN_CHUNK))
    chunk = -(-n_red // chunks)
    return tile, n_tiles, chunk, -(-n_red // chunk)


def _split_reduction_kernel(nodes: list[Node], reductions: list[Node]) -> tuple[list[Node], list[Node]]:
    """(prologue, epilogue) of a reduction kernel's nodes (in order): the epilogue is what depends on a reduction
    result, the prologue everything else (computed in the pass over the input). Raises _Unsupported when a
    reduction reads another one's result (it would need a second pass)."""
    after = set(reductions)
    for n in nodes:
        late = [a for a in n.all_input_nodes if a in after]
        if late and n in reductions:
            raise _Unsupported(f"reduction {n.name} reads {late[0].name}, which depends on a reduction of the same "
                               f"kernel")
        if late:
            after.add(n)
    return [n for n in nodes if n not in after], [n for n in nodes if n in after and n not in reductions]


def _wide_acc(in_dtype, out_dtype):
    # NOTE: float32 sums and products accumulate in float64: numpy sums pairwise (error ~ log n), a serial float32
    # loop would lose ~n * eps; one float64 accumulator is at least as accurate as numpy.
    if out_dtype.kind == "f":
        return np.dtype(np.float64)
    return np.dtype(np.int64) if out_dtype.kind in "iub" else out_dtype


def _extreme(low: bool):
    def identity(d):
        if d.kind == "f":
            return -math.inf if low else math.inf
        if d.kind == "b":
            return not low
        info = np.iinfo(d)
        return int(info.min if low else info.max)
    return identity


_REDUCERS = {
    "sum": _Reducer(lambda a, b: f"{a} + {b}", lambda d: 0, _wide_acc, "fold"),
    "prod": _Reducer(lambda a, b: f"{a} * {b}", lambda d: 1, _wide_acc, "fold"),
    # numpy's max/min propagate nan: np.maximum does
    "amax": _Reducer(lambda a, b: f"np.maximum({a}, {b})", _extreme(True), lambda i, o: o, "extreme"),
    "amin": _Reducer(lambda a, b: f"np.minimum({a}, {b})", _extreme(False), lambda i, o: o, "extreme"),
    "all": _Reducer(lambda a, b: f"{a} and np.bool_({b})", lambda d: True, lambda i, o: np.dtype(np.bool_)),
    "any": _Reducer(lambda a, b: f"{a} or np.bool_({b})", lambda d: False, lambda i, o: np.dtype(np.bool_)),
}


def generate(kernel: Kernel) -> Generated:
    """The generated module for a kernel (no compilation); raises KernelCompileError when it cannot."""
    try:
        return _Generator(kernel).generate()
    except _Unsupported as e:
        raise KernelCompileError(kernel.name, str(e)) from None
    except KernelCompileError:
        raise
    except Exception as e:  # a bug in the generator: still a clear, catchable error
        raise KernelCompileError(kernel.name, f"code generation failed: {type(e).__name__}: {e}") from e


# ---------------------------------------------------------------------------------------------------------------
# Compilation
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class CompiledKernel:
    """A compiled kernel: `run(inputs, out=None)` returns one array per kernel output."""

    name: str
    kind: str
    source: str
    path: Path
    parallel: bool
    cache_hit: bool  # True when nothing was compiled: numba's on-disk cache (or this process) had it
    compile_seconds: float
    in_specs: list = field(repr=False)
    out_specs: list = field(repr=False)
    _launch: Callable = field(repr=False)

    def __post_init__(self):
        self._in_shapes = [shape for shape, _ in self.in_specs]
        self._in_dtypes = [dtype for _, dtype in self.in_specs]

    def run_into(self, input_arrays: list, outs: list) -> None:
        """`run` for a caller whose `outs` are C-contiguous writeable arrays of the output specs (the executor's).

        NOTE: writeable inputs of the right shapes and dtypes go straight to the launcher (its reshape(-1) copies
        one that is not contiguous); numba's dispatcher refuses other layouts with a TypeError, and `run` then
        checks and converts every input (a launch is safe to repeat: it only writes `outs`). Read-only inputs
        (expand's broadcast views) go to `run` at once: a refused dispatch costs ~100 us of numba's typing."""
        if ([a.shape for a in input_arrays] == self._in_shapes and [a.dtype for a in input_arrays] == self._in_dtypes
                and all_writeable(input_arrays)):
            try:
                self._launch(input_arrays, outs)
                return
            except TypeError:
                pass
        self.run(input_arrays, out=outs)

    def run(self, input_arrays, out=None) -> list[np.ndarray]:
        if len(input_arrays) != len(self.in_specs):
            raise ValueError(f"kernel {self.name} takes {len(self.in_specs)} inputs, got {len(input_arrays)}")
        ins = []
        for k, (a, (shape, dtype)) in enumerate(zip(input_arrays, self.in_specs)):
            if type(a) is not np.ndarray:
                a = np.asarray(a)
            if a.shape != shape or a.dtype != dtype:
                raise ValueError(f"kernel {self.name}: input {k} must be {dtype}{list(shape)}, "
                                 f"got {a.dtype}{list(a.shape)}")
            if not a.flags.c_contiguous or not a.flags.writeable:
                a = np.array(a, order="C")  # numba's signature is a writeable C-contiguous array
            ins.append(a)
        if out is None:
            outs = [np.empty(shape, dtype) for shape, dtype in self.out_specs]
            self._launch(ins, outs)
            return outs
        out = list(out)
        if len(out) != len(self.out_specs):
            raise ValueError(f"kernel {self.name} has {len(self.out_specs)} outputs, got {len(out)} out buffers")
        outs, copies = [], []
        for k, (buf, (shape, dtype)) in enumerate(zip(out, self.out_specs)):
            if type(buf) is not np.ndarray or buf.shape != shape or buf.dtype != dtype:
                got = f"{buf.dtype}{list(buf.shape)}" if isinstance(buf, np.ndarray) else type(buf).__name__
                raise ValueError(f"kernel {self.name}: out buffer {k} must be a {dtype}{list(shape)} array, got {got}")
            if buf.flags.c_contiguous and buf.flags.writeable:
                outs.append(buf)
            else:
                if not buf.flags.writeable:
                    raise ValueError(f"kernel {self.name}: out buffer {k} is read-only")
                tmp = np.empty(shape, dtype)
                outs.append(tmp)
                copies.append((buf, tmp))
        self._launch(ins, outs)
        for buf, tmp in copies:
            np.copyto(buf, tmp)
        return out

    __call__ = run


def _numba_signature(dtypes):
    from numba import types
    from numba.np.numpy_support import from_dtype

    return tuple(types.Array(from_dtype(d), 1, "C") for d in dtypes)


def all_writeable(arrays) -> bool:
    """Whether a compiled launcher can take these arrays as they are: its numba signatures are writeable arrays, and a
    dispatch numba refuses (a read-only array: an expand's broadcast view) costs ~100 us of typing before failing."""
    return all(a.flags.writeable for a in arrays)


def _numba_signature_nd(specs):
    """numba argument types for C-contiguous arrays of the given (shape, dtype)s."""
    from numba import types
    from numba.np.numpy_support import from_dtype

    return tuple(types.Array(from_dtype(d), len(shape), "C") for shape, d in specs)


def compile_kernel(kernel: Kernel) -> CompiledKernel:
    """Generate, cache and compile a kernel; KernelCompileError(kernel name, reason) on any failure."""
    start = time.perf_counter()
    return compile_generated(kernel, generate(kernel), start)


def compile_generated(kernel: Kernel, generated: Generated, start: float | None = None) -> CompiledKernel:
    """Cache and compile the module `generate(kernel)` made (see compile_kernel)."""
    start = time.perf_counter() if start is None else start
    try:
        module, path, _ = cache.load_module(generated.source)
    except Exception as e:
        raise KernelCompileError(kernel.name, f"importing the generated module failed: {type(e).__name__}: {e}") from e
    hit = True
    for fname, dtypes in generated.signatures.items():
        disp = getattr(module, fname)
        sig = _numba_signature(dtypes)
        if sig in disp.overloads:
            continue
        try:
            disp.compile(sig)
        except Exception as e:
            message = str(e).strip()
            if len(message) > 2000:
                message = message[:2000] + " ..."
            raise KernelCompileError(kernel.name, f"numba could not compile {fname} (source: {path}): "
                                                  f"{type(e).__name__}: {message}") from e
        stats = disp.stats
        if not sum(stats.cache_hits.values()) or sum(stats.cache_misses.values()):
            hit = False
        disp.disable_compile()  # a call with other argument types is an error, never a silent recompile
    return CompiledKernel(name=kernel.name, kind=kernel.kind, source=generated.source, path=path,
                          parallel=generated.parallel, cache_hit=hit,
                          compile_seconds=time.perf_counter() - start, in_specs=generated.in_specs,
                          out_specs=generated.out_specs, _launch=module.launch)
