"""CPU elementwise skeleton, and what every CPU skeleton shares: the per-kernel generation state (KernelBuilder),
numba function records and the scalar pass (loads, scalar body, stores).

Elementwise: one flat loop when nothing broadcasts, else a loop over rows with an inner loop along the last
(collapsed) dim through per-row slices, so it vectorizes; prange over the outer loop when the element count >=
PARALLEL_MIN_ELEMENTS (2**18), else range (decided from the static shape: `elementwise_schedule`).
"""
from __future__ import annotations

import functools
import glob
import math
import re
from dataclasses import dataclass, replace

import numpy as np

from runtime.ops import Kind

from ..graph import Node
from ..kernel import Kernel
from ..symbolic import Shape
from .cpu_dialect import CpuDialect
from .cpu_tasks import ADDRESS_ARG, PAGE, PLACED_SKEW, TASK_SUFFIX, TaskSplit, split_tasks, task_arguments
from .indexing import broadcast_strides, broadcast_shape, collapse, emit_offsets, shifted, view_strides
from .scalar import ScalarBody, Unsupported, Value, ctor, expensive, node_dtype, node_shape, op_and_attrs

# NOTE: a warm parallel kernel costs ~1.6 µs, which alone would put the crossover near 2**16 elements; but between
# BLAS calls numba's and OpenBLAS's spinning thread pools contend on a 2-core machine (a 10 µs kernel took 2-4 ms
# in an MLP training step), so parallel loops start at 2**18 elements (tools/bench_compile.py, case 4a), or at
# as many cheap elements of work (parallel_work).
PARALLEL_MIN_ELEMENTS = 2 ** 18

# What an op adds to the work of one element, in quarters of an element of a cheap loop (a load, an add, a store:
# _ELEMENT_COST), integers so that a symbolic size times a cost stays a polynomial (nnc.symbolic).
# NOTE: measured single-threaded over 2**18 float32 elements (2 cores, Zen 3): x * 2 + 1 53 us, exp 162 us, gelu
# (erf) 455 us, dropout (a Philox draw) 933 us; two threads won from 2**17 elements for x * 2 + 1, from 2**13-2**14
# for gelu and dropout (tools/bench_parallel.py).
_ELEMENT_COST = 4
_CHEAP_OP_COST = 1
_CALL_COST = 8  # a function other than a cheap one (exp, log, tanh, a power: scalar.expensive)
_OP_COST = {"erf": 28, "erfc": 28, "erfinv": 28}
_DRAW_COST = 64  # an op that needs its element's index: a counter-based random draw (Philox-4x32-10)

# A parallel elementwise kernel with broadcasting runs prange over rows when it has at least this many.
_MIN_PARALLEL_ROWS = 64


@dataclass
class Array:
    """One argument of a numba function: a 1-D C-contiguous view of a value; or one value a kernel reads from an
    argument: a folded view (nnc.passes.views) reads its base's argument at `offset` with element `strides`.

    `start`: the argument is the launcher's array from element `start` on (a base read only through views, rebased
    at their first offset: KernelBuilder), and `offset` counts from there."""

    arg: str
    node: Node
    shape: tuple
    dtype: np.dtype
    offset: int = 0
    strides: tuple | None = None  # None: C-contiguous over `shape`
    start: int = 0

    def strides_in(self, full) -> list[int]:
        """Element strides of this value read over the loop shape `full` (0 along broadcast dims)."""
        return view_strides(self.shape, self.strides, full)


# The argument type of a size or flag in `Generated.signatures` (an int64 scalar; arrays are named by their dtype).
SIZE = "size"


@dataclass
class Function:
    """A numba function of the generated module: its arguments (flat arrays) and body lines."""

    name: str
    args: list[Array]
    lines: list[str]
    parallel: bool
    reassociate: bool = False  # fastmath reassoc + contract: a dot product's sum in vector lanes, with FMA

    @property
    def symbols(self) -> list[str]:
        """The size symbols (nnc.symbolic) the body uses: extra integer arguments after the arrays."""
        return symbols_in(self.lines)

    def task_split(self) -> TaskSplit | None:
        """This parallel function as a launcher and a task function (nnc.codegen.cpu_tasks), or None: it keeps its
        prange, or is serial."""
        if not self.parallel:
            return None
        return split_tasks(self.lines, [(a.arg, ctor(a.dtype)) for a in self.args], self.symbols)

    def source(self, split: TaskSplit | None = None) -> str:
        """The function's numba source: as it is (a parallel one with its prange), or as `split` (its task_split())."""
        sig = ", ".join([a.arg for a in self.args] + self.symbols + ([ADDRESS_ARG] if split else []))
        doc = "; ".join(f"{a.arg}: {a.dtype.name}{list(a.shape)}" for a in self.args)
        fastmath = ", fastmath={'reassoc', 'contract'}" if self.reassociate else ""
        parallel = self.parallel and split is None
        # NOTE: no_cfunc_wrapper: nothing takes a kernel's address, and that wrapper is ~5% of its compile time
        head = [f"@njit(cache=True, parallel={parallel}{fastmath}, error_model='numpy', no_cfunc_wrapper=True)",
                f"def {self.name}({sig}):", f"    # {doc}"]
        if split is None:
            return "\n".join(head + indent(self.lines))
        # NOTE: the task keeps numba's cfunc wrapper: run_tasks calls it through that C entry point
        task = [f"@njit(cache=True{fastmath}, error_model='numpy')",
                f"def {self.name}{TASK_SUFFIX}({task_arguments()}):",
                f"    # tasks nnc_lo <= t < nnc_hi of {self.name} ({doc}), run by nnc.codegen.tasks.run_tasks"]
        if split.direct:  # the launch line calls run_tasks itself
            return "\n".join(task + indent(split.task))
        head.append(f"    # its tasks run as {self.name}{TASK_SUFFIX} on numba's threads (nnc.codegen.tasks)")
        return "\n".join(head + indent(split.launcher)) + "\n\n\n" + "\n".join(task + indent(split.task))


_SYMBOL = re.compile(r"\bS(\d+)\b")


def symbols_in(lines) -> list[str]:
    """The size symbols named in generated lines, in symbol order (S0, S1, ...)."""
    found = {int(k) for line in lines for k in _SYMBOL.findall(line)}
    return [f"S{k}" for k in sorted(found)]


def indent(lines, n=1):
    """lines indented n levels (empty lines stay empty)."""
    return ["    " * n + line if line else "" for line in lines]


def py_name(name: str) -> str:
    """A name as a Python identifier."""
    out = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)
    return out if out and not out[0].isdigit() else f"k_{out}"


# What generation calls the kernel's main numba function (its helpers add _epilogue, _rows). nnc.codegen.cpu
# replaces it with k_<hash of the module source>, so the source stays a function of the computation only.
KERNEL_NAME = "__nnc_kernel__"


class KernelBuilder:
    """What generating one kernel's module builds up: its numba functions, module-level helpers and launcher lines,
    with the kernel's inputs and outputs as numba arguments (in0, in1, ..., out0, ...).

    NOTE: nothing generated names a graph node or the kernel: identical computations (the same block repeated in
    a model) must give the same source, so that they share one cached module and one numba compilation. A scalar
    is named by its position: v_in<k> for the kernel's input k, v<i>_<op> for its node i (`value_name`)."""

    def __init__(self, kernel: Kernel, standalone: bool = False):
        self.kernel = kernel
        self.standalone = standalone  # launched by itself from Python, not inside a whole graph (cpu.generate)
        self.name = KERNEL_NAME
        self.dialect = CpuDialect()
        self._value_names: dict[Node, str] = {}
        for k, node in enumerate(kernel.inputs):
            self._value_names.setdefault(node, f"v_in{k}")
        views = kernel.meta.get("views", {})  # folded views: read from their bases' arguments
        for k, node in enumerate(views):
            self._value_names[node] = f"v_view{k}"
        for i, node in enumerate(kernel.nodes):
            self._value_names[node] = f"v{i}_{py_name(getattr(getattr(node.target, 'op', None), 'name', 'node'))}"
        self.body = ScalarBody(self.dialect, self.value_name)
        self.functions: list[Function] = []
        self.helpers: dict[str, str] = {}
        self.launch: list[str] = []
        self.precompiled: dict[str, list] = {}  # nnc.codegen.precompiled functions launch calls: argument dtypes
        for node in kernel.nodes:
            node_shape(node), node_dtype(node)
        self.ins = [Array(f"in{k}", n, node_shape(n), node_dtype(n)) for k, n in enumerate(kernel.inputs)]
        self.outs = [Array(f"out{k}", n, node_shape(n), node_dtype(n)) for k, n in enumerate(kernel.outputs)]
        members = set(kernel.nodes)
        for a in self.ins:
            if a.node in members:
                raise Unsupported(f"{a.node.name} is both an input and a node of the kernel")
        for a in self.outs:
            if a.node not in members:
                raise Unsupported(f"output {a.node.name} is not a node of the kernel")
        # values another kernel allocated that this one writes into (a cat's slices, nnc.passes.stores): outs too
        writes = kernel.meta.get("writes_into", [])
        self.outs += [Array(f"out{len(self.outs) + k}", n, node_shape(n), node_dtype(n)) for k, n in enumerate(writes)]
        if not self.outs:
            raise Unsupported("the kernel has no outputs")
        self.reads = self._reads(views)
        if standalone:
            self._rebase_views()

    def _reads(self, views: dict) -> list[Array]:
        """The values the kernel's nodes read from its arguments: inputs read as they are, then folded views."""
        read = {a for n in self.kernel.nodes for a in n.all_input_nodes}
        arg_of = {a.node: a for a in self.ins}
        reads = [a for a in self.ins if a.node in read]
        for node, m in views.items():
            base = arg_of.get(m.base)
            if base is None:
                raise Unsupported(f"the base {m.base.name} of folded view {node.name} is not a kernel input")
            reads.append(Array(base.arg, node, tuple(m.shape), base.dtype, int(m.offset), tuple(m.strides)))
        return reads

    def _rebase_views(self) -> None:
        """Pass each input read only through folded views from its first view's offset on (its launch line slices
        it), so the numba code reads every view at an offset relative to that one.

        NOTE: kernels that differ only in where their views start (an RNN's steps, reading step t of a projection
        computed for all steps at once) then have the same numba functions: cpu.generate puts those in a library,
        compiled once for all of them."""
        inputs = {id(a) for a in self.ins}
        direct = {a.arg for a in self.reads if id(a) in inputs}
        starts: dict[str, int] = {}
        for a in self.reads:
            if a.arg not in direct:
                starts[a.arg] = min(starts.get(a.arg, a.offset), a.offset)
        starts = {arg: start for arg, start in starts.items() if start > 0}
        if not starts:
            return
        self.ins = [replace(a, start=starts[a.arg]) if a.arg in starts else a for a in self.ins]
        self.reads = [replace(a, offset=a.offset - starts[a.arg], start=starts[a.arg]) if a.arg in starts else a
                      for a in self.reads]

    @property
    def rebased(self) -> bool:
        """Whether some argument starts past its launcher array's first element (`_rebase_views`)."""
        return any(a.start for a in self.ins)

    def read_of(self, node: Node) -> Array:
        """The Array the kernel reads `node` through: an input as it is, or a folded view of an input's base."""
        for a in self.reads:
            if a.node is node:
                return a
        raise Unsupported(f"{node.name} is not read from an argument of the kernel")

    def arguments(self, arrays) -> list[Array]:
        """The distinct numba arguments behind some reads and outputs (a base read through views is one argument;
        an array read and written in place is one argument, its last role naming it)."""
        own = {a.arg: a for a in self.ins}
        unique: dict[str, Array] = {}
        for a in arrays:
            unique.pop(a.arg, None)
            unique[a.arg] = own.get(a.arg, a) if a.strides is not None else a
        return list(unique.values())

    def value_name(self, node: Node) -> str:
        """The generated variable holding a node's scalar value (by its position in the kernel, see the class)."""
        name = self._value_names.get(node)
        if name is None:
            raise Unsupported(f"node {node.name} is neither an input nor a node of the kernel")
        return name

    def legend(self) -> list[str]:
        """Comment lines naming the graph node behind each argument and value (what `value_name` numbers)."""
        k = self.kernel
        args = [f"in{i} = {n.name}" for i, n in enumerate(k.inputs)] + [f"out{i} = {n.name}"
                                                                        for i, n in enumerate(k.outputs)]
        values = [f"{self._value_names[n]} = {n.name}" for n in k.nodes]
        return _wrap(f"# kernel {k.name}: ", args, "#   ") + _wrap("#   values: ", values, "#     ")

    def elementwise_function(self, fname, nodes, ins, outs, shape) -> Function:
        """The elementwise skeleton: loads at broadcast offsets, the scalar body, stores, in the loops
        `elementwise_schedule` lays out."""
        arrays = ins + outs
        # nodes that need their element's flat index (random draws) are indexed like contiguous arrays of their
        # shape: their offsets are computed with the arrays' (after them), and never loaded
        indexed = [n for n in nodes if op_and_attrs(n)[0].needs_index]
        strides = [a.strides_in(shape) for a in arrays] + [broadcast_strides(node_shape(n), shape) for n in indexed]
        schedule = elementwise_schedule(shape, [a.shape for a in arrays] + [node_shape(n) for n in indexed], strides,
                                        nodes, [(len(ins) + k, a.dtype.itemsize) for k, a in enumerate(outs)])
        loop = schedule.loop
        index_of: dict[Node, str] = {}
        hoisted: set[int] = set()
        if schedule.nested:
            # NOTE: each row reads and writes through slices (row_in0 = in0[b0:b0 + n]) indexed by the inner j: j is
            # provably >= 0, so numba's negative-index wraparound folds away and the loop vectorizes. Indexing the
            # flat array at b0 + j inside a prange does not (the parfor's row index has no known sign): measured
            # 9x slower on one thread. Row-invariant reads (a [B, 1] input) are loaded once per row.
            length = schedule.length
            sizes, collapsed = collapse(list(shape), strides)
            if schedule.streamed:
                sizes, collapsed = split_rows(sizes, collapsed, length)
            row_lines, bases = emit_offsets(sizes[:-1], [st[:-1] for st in collapsed], "o", "o_")
            bases = [shifted(base, a.offset) for a, base in zip(arrays, bases)] + bases[len(arrays):]
            base_vars: dict[str, str] = {}
            views: dict[tuple, str] = {}  # (argument, row start, step) -> its row slice
            prologue: list[str] = []  # lines before the outer loop (placed copies of broadcast rows)
            streams: list[str] = []  # after the inner loop: each output's stage streamed into its row
            refs = []
            for k, (a, base, st) in enumerate(zip(arrays, bases, collapsed)):
                if base != "0" and base not in base_vars:
                    base_vars[base] = base if base.isidentifier() else f"b{len(base_vars)}"
                    if base_vars[base] != base:
                        row_lines.append(f"{base_vars[base]} = {base}")
                b = base_vars.get(base, "0")
                step = st[-1]
                if step == 1 and b == "0" and k < len(ins) and placed_rows(schedule):
                    # a row the same for every o (a bias) in a large kernel: read from a copy placed beside the
                    # output's rows (`placed_row_lines`)
                    view = views.get((a.arg, "placed", step))
                    if view is None:
                        view = views[(a.arg, "placed", step)] = f"bcast_{a.arg}"
                        prologue += placed_row_lines(view, a, length, outs[0].arg)
                    refs.append(f"{view}[j]")
                elif step and b == "0":  # a row the same for every o (a bias): the array itself
                    refs.append(f"{a.arg}[{'j' if step == 1 else f'j * {step}'}]")
                elif step:
                    view = views.get((a.arg, b, step))
                    if view is None:
                        view = f"row_{a.arg}"
                        view = views[(a.arg, b, step)] = view + (f"_{len(views)}" if view in views.values() else "")
                        span = (length - 1) * step + 1
                        row_lines.append(f"{view} = {a.arg}[{b}:{b} + {span}]")
                    refs.append(f"{view}[{'j' if step == 1 else f'j * {step}'}]")
                    if schedule.streamed and k >= len(ins):
                        refs[-1] = f"stage_{a.arg}[j]"
                        row_lines.append(f"stage_{a.arg} = stack_row({length}, {ctor(a.dtype)})")
                        streams.append(f"stream_row({view}, stage_{a.arg})")
                else:
                    refs.append(f"{a.arg}[{b}]")
                    if k < len(ins):
                        hoisted.add(k)
            for m, n in enumerate(indexed):  # the node's index: its row's base + j * step, as an array's offset
                base, step = bases[len(arrays) + m], collapsed[len(arrays) + m][-1]
                if base != "0" and base not in base_vars:
                    base_vars[base] = base if base.isidentifier() else f"b{len(base_vars)}"
                    if base_vars[base] != base:
                        row_lines.append(f"{base_vars[base]} = {base}")
                base = base_vars.get(base, "0")
                index_of[n] = " + ".join(t for t in (base, "j" if step == 1 else f"j * {step}" if step else "0")
                                         if t != "0") or "0"
            header = prologue + [f"for o in {loop}({schedule.rows}):"] + indent(row_lines)
            inner_loop = [f"for j in range({length}):"]
            depth = 2
            if streams:
                self.dialect.streaming = True
        else:
            streams = []
            index_lines, offsets = emit_offsets(shape, strides, "i", "i_")
            refs = [f"{a.arg}[{shifted(off, a.offset)}]" for a, off in zip(arrays, offsets)]
            index_of = dict(zip(indexed, offsets[len(arrays):]))
            header = [f"for i in {loop}({schedule.numel}):"] + indent(index_lines)
            inner_loop = []
            depth = 1
        self.body.index_of = index_of.__getitem__
        try:
            row_loads, loads, body, stores, _ = self.scalar_pass(ins, outs, refs, hoisted, nodes)
        finally:
            self.body.index_of = None
        header += indent(row_loads + inner_loop)
        return Function(fname, self.arguments(arrays), header + indent(loads + body + stores, depth) + indent(streams),
                        schedule.parallel)

    def scalar_pass(self, ins, outs, refs, hoisted, nodes):
        """(hoisted loads, loads, body, stores, env) of one pass: each input loaded from its ref (the inputs in
        `hoisted`, by position, once per outer iteration), the nodes' scalar statements, each output stored."""
        env: dict[Node, Value] = {}
        hoisted_loads, loads = [], []
        for k, (a, ref) in enumerate(zip(ins, refs)):
            env[a.node] = Value(self.value_name(a.node), a.dtype)
            (hoisted_loads if k in hoisted else loads).append(f"{env[a.node].name} = {ref}")
        body = self.body.emit(nodes, env)
        stores = [f"{ref} = {env[a.node].name}" for a, ref in zip(outs, refs[len(ins):])]
        return hoisted_loads, loads, body, stores, env


def _wrap(first: str, items: list[str], indent_: str, width: int = 116) -> list[str]:
    """Comment lines listing `items` (comma-separated, never split) after `first`, continued after `indent_`."""
    lines, line = [], first
    for k, item in enumerate(items):
        text = item + ("," if k < len(items) - 1 else "")
        if line not in (first, indent_) and len(line) + 1 + len(text) > width:
            lines.append(line.rstrip())
            line = indent_
        line += ("" if line in (first, indent_) else " ") + text
    return lines + [line.rstrip()]


def flat_view(a: Array) -> str:
    """The launcher's expression for a's flat view (in3 -> ins[3].reshape(-1), from its start if it has one)."""
    if a.arg.startswith("out"):
        return f"outs[{a.arg[3:]}].reshape(-1)"
    return f"ins[{a.arg[2:]}].reshape(-1)" + (f"[{a.start}:]" if a.start else "")


def precompiled_call(kb: KernelBuilder, name: str, args: list) -> str:
    """A launcher's call of nnc.codegen.precompiled's `name` on `args` (Arrays as their flat views, anything else
    an int64 size or flag), recorded in kb.precompiled with the argument dtypes it is compiled for."""
    kb.precompiled[name] = [a.dtype if isinstance(a, Array) else SIZE for a in args]
    return f"{name}({', '.join(flat_view(a) if isinstance(a, Array) else str(a) for a in args)})"


def launch_line(f: Function) -> str:
    """The launcher's call of f on the flat views of its arguments."""
    return f"{f.name}({', '.join([flat_view(a) for a in f.args] + f.symbols)})"


class ParallelLoop:
    """A schedule whose outer loop is a prange when its `parallel` field says so (`loop` names it for the source)."""

    @property
    def loop(self) -> str:
        return "prange" if self.parallel else "range"


@dataclass(frozen=True)
class ElementwiseSchedule(ParallelLoop):
    """How an elementwise loop is laid out (a pure value of the iteration shape and the arrays' shapes).

    rows > 0: a loop over `rows` rows with an inner loop of `length` along the last collapsed dim, so the inner
    loop reads every array at base + j * stride and vectorizes (a flat loop needs a division per element and does
    not). rows == 0: one flat loop over all `numel` elements: when nothing broadcasts (every array is contiguous
    over the whole space, so it collapses to one dim), or when a parallel kernel has too few rows to share out.

    streamed: the outputs outgrow the cache (nnc.codegen.streaming): each row is computed into a stage on the stack
    and streamed out, rows of `length` elements, the last collapsed dim split into tiles of that length if it is
    longer than a stage.
    """

    numel: int
    parallel: bool  # the outer loop is a prange
    rows: int
    length: int
    streamed: bool = False

    @property
    def nested(self) -> bool:
        return self.rows > 0


def node_cost(node: Node) -> int:
    """What computing `node` adds to the work of one element, in quarters of a cheap element (_ELEMENT_COST)."""
    op, _, _ = op_and_attrs(node)
    if op.needs_index:
        return _DRAW_COST
    if op.name in _OP_COST:
        return _OP_COST[op.name]
    return _CALL_COST if expensive(node) else _CHEAP_OP_COST


def parallel_work(numel, nodes=(), passes: int = 1) -> bool:
    """Whether a loop computing `nodes` at each of `numel` elements, walking them `passes` times, runs as a prange:
    its work reaches PARALLEL_MIN_ELEMENTS cheap elements."""
    return numel * (passes * _ELEMENT_COST + sum(node_cost(n) for n in nodes)) >= PARALLEL_MIN_ELEMENTS * _ELEMENT_COST


def elementwise_schedule(shape, array_shapes, stride_lists=None, nodes=(), outs=()) -> ElementwiseSchedule:
    """The schedule of an elementwise loop over `shape` computing `nodes`, reading and writing arrays of
    `array_shapes` (C-contiguous, or read with the given element `stride_lists` over `shape`: folded views), of
    which `outs` ((position, itemsize) of each) are the outputs."""
    numel = math.prod(shape)
    parallel = parallel_work(numel, nodes)
    if stride_lists is None:
        stride_lists = [view_strides(s, None, shape) for s in array_shapes]
    sizes, collapsed = collapse(list(shape), stride_lists)
    stage = stream_stage(numel, sizes, [(collapsed[k], itemsize) for k, itemsize in outs])
    if stage is not None:
        return ElementwiseSchedule(numel, parallel, numel // stage, stage, streamed=True)
    rows = math.prod(sizes[:-1]) if sizes else 1
    if len(sizes) >= 2 and (not parallel or rows >= _MIN_PARALLEL_ROWS):
        return ElementwiseSchedule(numel, parallel, rows, sizes[-1])
    return ElementwiseSchedule(numel, parallel, 0, numel)


_DEFAULT_CACHE_BYTES = 32 * 2 ** 20


@functools.lru_cache(maxsize=None)
def last_level_cache_bytes() -> int:
    """The largest cache of this machine's first CPU in bytes (Linux sysfs), or 32 MiB where it says nothing."""
    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        scale = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}.get(text[-1:].upper(), 1)
        digits = text.rstrip("KMGkmg")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes, default=_DEFAULT_CACHE_BYTES)


# A loop whose outputs take at least this many bytes streams them (nnc.codegen.streaming's doc has the measurements
# behind 3/4 of the last-level cache, which is also glibc's threshold for its own non-temporal memcpy).
STREAM_MIN_BYTES = 3 * last_level_cache_bytes() // 4

# The stage of one row: rows longer than this many bytes are split into tiles of at most it (a stack array).
# NOTE: measured 4 KiB stages faster than 16 KiB ones (a quarter and half of a 32 KiB L1 data cache).
STAGE_MAX_BYTES = 4 * 2 ** 10
_STAGE_MIN_BYTES = 1024  # a shorter tile would leave the streamed lines few beside the unaligned ends
_STREAMED_ITEMSIZES = (4, 8)


def stage_length(length: int, itemsize: int) -> int | None:
    """The elements of a row's stage for rows of `length` elements: the row itself when it fits STAGE_MAX_BYTES,
    else the largest divisor of `length` that fits and still spans _STAGE_MIN_BYTES; None when there is none."""
    most = STAGE_MAX_BYTES // itemsize
    if length <= most:
        return length
    return next((t for t in range(most, _STAGE_MIN_BYTES // itemsize - 1, -1) if length % t == 0), None)


def stream_stage(numel, sizes, outs) -> int | None:
    """The stage length of a loop that streams its outputs (nnc.codegen.streaming), or None when it stores them
    plainly: a loop over the static collapsed `sizes` whose outputs ((element strides over `sizes`, itemsize) of
    each) are rows walked one element after another, of itemsizes streaming handles, together taking at least
    STREAM_MIN_BYTES.

    NOTE: only where something broadcasts (more than one collapsed dim). There plain stores reached 0.78-0.85x of a
    memcpy's speed at 2**24 float32 elements and streamed ones 1.10-1.21x; a flat loop's plain stores already ran at
    1.0-1.2x, and streaming it measured no steady gain (0.95-1.23x against 1.04-1.18x)."""
    if not outs or not isinstance(numel, int) or not all(isinstance(s, int) for s in sizes) or len(sizes) < 2:
        return None
    if sum(numel * itemsize for _, itemsize in outs) < STREAM_MIN_BYTES:
        return None
    if any(itemsize not in _STREAMED_ITEMSIZES or strides[-1] != 1 for strides, itemsize in outs):
        return None
    return stage_length(sizes[-1], max(itemsize for _, itemsize in outs))


def split_rows(sizes: list, collapsed: list, length: int) -> tuple[list, list]:
    """Collapsed sizes and strides with the last dim split into rows of `length` (a divisor of it)."""
    if sizes[-1] == length:
        return sizes, collapsed
    tiles = sizes[-1] // length
    return sizes[:-1] + [tiles, length], [st[:-1] + [st[-1] * length, st[-1]] for st in collapsed]


# NOTE: a page is 4096 bytes. A load whose address matches a store still in flight in its low 12 bits waits for
# that store ("4K aliasing"); with the output's stores queued behind the memory system, a bias row at an unlucky
# address relative to the output stalls every load of it. relu(x*w+b)+0.5*x over [4096, 1024] took 2.3x the time
# of `out = x*2` with the bias rows the benchmark happened to allocate, and 1.04x with them copied to the output's
# address modulo 4096 (x and the output 64-byte aligned; 1.2x with x 16 bytes into a page as numpy puts it).
# Half a page after the output's address measured better still where the data stays in the L3 (2**22 elements:
# 0.86-0.91 of a copy's speed against 0.82-0.89 at the same address, three alternating runs of tools-style
# loops): a load of row element j then never matches a store of the row before in flight (PLACED_SKEW).
_PAGE = PAGE


def placed_rows(schedule: ElementwiseSchedule) -> bool:
    """Whether a nested elementwise loop reads its broadcast rows (a bias read by every row) from copies placed
    beside the output (`placed_row_lines`): in large (parallel) kernels, where the copy costs nothing measurable,
    over a static row length."""
    return schedule.parallel and isinstance(schedule.length, int) and schedule.length > 0


def placed_row_lines(view: str, a: Array, length: int, like: str) -> list[str]:
    """Lines copying the row `a.arg[0:length]` into `view`, fresh memory half a page (PLACED_SKEW) after the address
    of the array `like` modulo a page: element j of the copy is then half a page from element j of every row of
    `like` whose start shares its page offset (all of them when a row is a multiple of 4096 bytes, and `like` starts
    a row), so loading it never waits on a recent store to `like` (see _PAGE), and it is as aligned as `like`'s
    rows."""
    size = a.dtype.itemsize
    return [f"{view}_pad = np.empty({length + _PAGE // size}, dtype={ctor(a.dtype)})",
            f"{view}_at = np.int64(({like}.ctypes.data + {PLACED_SKEW} - {view}_pad.ctypes.data) % {_PAGE}) // {size}",
            f"{view} = {view}_pad[{view}_at:{view}_at + {length}]",
            f"for c in range({length}):",  # NOTE: a loop, not `{view}[:] = ...`, which numba makes a parallel region
            f"    {view}[c] = {a.arg}[c]"]


def check_elementwise_nodes(kernel: Kernel) -> tuple:
    """The shape of an elementwise kernel, after checking (for every target) that each node is elementwise and
    broadcasts to it."""
    shape = tuple(kernel.shape)
    for n in kernel.nodes:
        op, _, _ = op_and_attrs(n)
        if op.kind != Kind.ELEMENTWISE:
            raise Unsupported(f"node {n.name}: op {op.name} ({op.kind}) is not elementwise")
        if Shape(broadcast_shape(node_shape(n), shape) or ()) != Shape(shape):
            raise Unsupported(f"node {n.name} has shape {list(node_shape(n))}, which does not fit the kernel "
                              f"shape {list(shape)}")
    return shape


def gen_elementwise(kb: KernelBuilder) -> None:
    """An elementwise kernel: one function over the kernel's shape."""
    shape = check_elementwise_nodes(kb.kernel)
    f = kb.elementwise_function(kb.name, kb.kernel.nodes, kb.reads, kb.outs, shape)
    kb.functions.append(f)
    kb.launch = [launch_line(f)]
