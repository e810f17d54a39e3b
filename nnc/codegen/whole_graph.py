"""Whole-graph mode: every kernel of a small graph, and its view nodes, emitted as one numba function, so a run of
the graph is one call from Python (no per-kernel Python launches, no Tensor wrapping between kernels).

The module it generates holds each kernel's numba functions exactly as `nnc.codegen.cpu` generates them, and
`run_graph(...)`, which takes the graph's tensor placeholders and attributes (parameters, buffers) as arrays,
allocates every intermediate, and runs each kernel's launcher lines inlined (the per-kernel module's `launch`,
compiled instead of interpreted: it reshapes, calls BLAS through numba's `np.dot`, runs the epilogue), in kernel
order; it returns the graph's output arrays.

A graph qualifies when every kernel generates and every value it computes is small (at most
WHOLE_GRAPH_MAX_ELEMENTS; inputs and parameters may be any size): these graphs are where Python's per-kernel
overhead (a few microseconds a launch) is a large part of the time, and their buffers come from malloc's free
lists, so allocating them on every call costs less than planning them. Graphs with larger values run kernel by
kernel (`nnc.executor.Plan`), with planned buffers that are reused between calls. A matmul left to BLAS also
needs scipy (numba calls BLAS through it). Views are mostly folded into the kernels reading them
(nnc.passes.views); the view nodes left compile to numpy views (reshape, transpose, broadcast_to; a basic getitem,
or a view of a folded view, to `as_strided` of its base); a kernel reading a non-contiguous view gets a contiguous
copy, as the kernel-by-kernel executor does. Any other opaque node keeps the graph out of whole-graph mode.
"""
from __future__ import annotations

import importlib.util
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numba
import numpy as np

from ..graph import Graph, Node, nodes_in
from ..kernel import Kernel, matmul_nodes, view_node
from ..passes.views import view_maps
from . import cache, cblas, nowait
from .cpu import (COMPILE_LOCK, Generated, compile_generated, generate, launch_on_numba_threads, numba_signature_nd,
                  whole_graph_threaded_dtype)
from .cpu_elementwise import py_name
from .cpu_matmul import _same_batch_3d, matmul_schedule
from .scalar import KernelCompileError, check_dtype, ctor, node_dtype, node_shape, np_dtype, op_and_attrs

# NOTE: a kernel over 2**20 elements takes ~0.2 ms or more, where a launch from Python (~5 us) is noise, and a
# fresh output of 4 MiB or more can cost page faults that the executor's planned buffers avoid.
WHOLE_GRAPH_MAX_ELEMENTS = 2 ** 20
# NOTE: numba compiles a whole graph as one function, at about 0.18 s per kernel and worse past ~150 kernels (an
# unrolled 2-layer LSTMCell loop, no_grad: 37 kernels 6.6 s, 72 12.3 s, 142 28.3 s, 275 144 s), where kernel by
# kernel compiles each distinct kernel once (2 s for all four: a loop's steps share their kernels). A whole graph
# saves ~4 us of launch per kernel and call (72 kernels: 83 against 366 us), so past this many kernels, unless asked
# for with whole_graph=True, a graph runs kernel by kernel. The GPT's batch-1 forward has 25 (2 layers) and 45 (4).
# An nn.LSTM over 28 steps, no_grad, has 62: 23.7 s to compile whole against 2.3 s kernel by kernel, for ~250 us a
# call (100,000 calls to break even), so the bound is 32.
WHOLE_GRAPH_MAX_KERNELS = 32
# NOTE: run_graph links every kernel instance into one function, so an unrolled loop (an nn.LSTM over 28 steps: 62
# kernels repeating a few) compiles each step anew where kernel by kernel compiles each distinct kernel once (23.7 s
# against 2.3 s cold). Unless asked for, a graph of more than WHOLE_GRAPH_FEW kernels whose kernels repeat on
# average more than WHOLE_GRAPH_MAX_REPEATS times runs kernel by kernel (a 2-layer GPT's 25 kernels are 13 distinct).
WHOLE_GRAPH_FEW = 16
WHOLE_GRAPH_MAX_REPEATS = 3
_HAVE_SCIPY = importlib.util.find_spec("scipy") is not None
SHAPE_ERROR = "nnc whole graph: an argument's shape differs from the compiled one"


class WholeGraphUnsupported(Exception):
    """The graph does not qualify for whole-graph mode (the message says which node or kernel, and why)."""


def unsupported_reason(kernels: list[Kernel], graph: Graph) -> str | None:
    """Why this graph cannot run in whole-graph mode, or None when it can (generation may still fail)."""
    for node in graph.nodes:
        if node.op == "output":
            continue
        shape = node.meta.get("shape")
        if shape is None:
            if node.op == "get_attr" and not node.users:
                continue
            return f"node {node.name} has no shape meta (a non-tensor value)"
        if node.op not in ("placeholder", "get_attr") and math.prod(shape) > WHOLE_GRAPH_MAX_ELEMENTS:
            return f"node {node.name} has {math.prod(shape)} elements (> {WHOLE_GRAPH_MAX_ELEMENTS})"
        try:
            check_dtype(np_dtype(node.meta["dtype"]), f"node {node.name}")
        except Exception as error:
            return str(error)
    maps = view_maps(graph)
    for kernel in kernels:
        view = view_node(kernel)
        if kernel.kind == "opaque" and view is None and kernel.nodes[0] in maps:
            continue  # a view with a strided map (a basic getitem): numpy's strided view of its base
        if kernel.kind == "opaque" and view is None:
            node = kernel.nodes[0]
            return f"opaque node {node.name} ({getattr(node.target, '__name__', node.target)}) runs in Python"
        if view is not None and view.target.op.name not in _VIEWS:
            return f"view {view.name} ({view.target.op.name}) has no whole-graph spelling"
        elif kernel.kind == "matmul" and not all(_dot_matmul(n) for n in matmul_nodes(kernel)):
            return f"matmul {matmul_nodes(kernel)[0].name} is batched (numba's np.dot takes 2-D operands)"
    return None


def _dot_matmul(node: Node) -> bool:
    """Whether codegen lowers this matmul/linear to np.dot or a generated loop (numba has no batched np.matmul)."""
    a, b = node.args[0], node.args[1]
    if node.target.op.name == "linear" or (len(b.meta["shape"]) == 2 and len(a.meta["shape"]) >= 2):
        return True
    if _same_batch_3d(node_shape(a), node_shape(b)):  # a loop of np.dot over the batch (cpu_matmul)
        return True
    schedule = matmul_schedule(node.target.op.name, node_shape(a), node_shape(b), node_dtype(a), node_dtype(b),
                               node_dtype(node))
    return schedule.form != "blas"


@dataclass
class CompiledGraph:
    """A graph compiled whole: `run(arrays)` takes one array per `arg_nodes`, returns one per `returned`."""

    source: str
    path: Path
    cache_hit: bool
    compile_seconds: float
    arg_nodes: list[Node]
    returned: list[Node]
    arg_specs: list = field(repr=False)
    _function: Callable = field(repr=False)
    kernel_sources: dict = field(repr=False, default_factory=dict)  # kernel name -> its own module's source
    nowait: bool = False  # a product runs with nnc.codegen.nowait's helper thread (see nowait.retain)

    def __post_init__(self):
        self._inputs = [k for k, node in enumerate(self.arg_nodes) if node.op == "placeholder"]
        self._check_all = False

    def run(self, arrays: list) -> tuple:
        # NOTE: run_graph checks the shapes itself (its code is specialized to them: _shape_checks); dtypes, ranks
        # and layouts are checked by numba's dispatcher, which refuses other types (compilation is disabled). Either
        # refusal comes before anything runs, and _checked then says which argument was wrong. A refused dispatch
        # costs ~100 us of typing, so the inputs' layouts are checked first; the attributes' (parameters, buffers)
        # are trusted until one is refused, and checked on every call from then on.
        if self._layouts_fit(arrays):
            try:
                results = self._function(*arrays)
            except TypeError:
                self._check_all = True
            except ValueError as error:
                if error.args != (SHAPE_ERROR,):
                    raise
            else:
                if self.nowait:  # (what _call does, inlined: this is every call's path)
                    nowait.retain(arrays)
                return results
        return self._call(self._checked(arrays))

    def _call(self, arrays: list) -> tuple:
        results = self._function(*arrays)
        if self.nowait:  # nnc.codegen.nowait's helper may still read a parameter: keep them referenced
            nowait.retain(arrays)
        return results

    def _layouts_fit(self, arrays: list) -> bool:
        """Whether the arrays checked on every call are writeable and C-contiguous (numba's signature)."""
        for k in (range(len(arrays)) if self._check_all else self._inputs):
            flags = arrays[k].flags
            if not (flags.c_contiguous and flags.writeable):
                return False
        return True

    def _checked(self, arrays: list) -> list:
        checked = []
        for k, (a, (shape, dtype)) in enumerate(zip(arrays, self.arg_specs)):
            if type(a) is not np.ndarray or a.shape != shape or a.dtype != dtype:
                got = f"{a.dtype}{list(a.shape)}" if isinstance(a, np.ndarray) else type(a).__name__
                node = self.arg_nodes[k]
                what = f"attribute {node.target}" if node.op == "get_attr" else f"input {node.name}"
                raise ValueError(f"whole graph: argument {k} ({what}) must be {dtype}{list(shape)}, got {got}")
            if not (a.flags.c_contiguous and a.flags.writeable):
                a = np.array(a, order="C")  # the compiled signature takes writeable C-contiguous arrays
            checked.append(a)
        return checked


class _Emitter:
    """Builds run_graph's body: one variable per graph value, launches in kernel order."""

    def __init__(self, kernels: list[Kernel], graph: Graph):
        self.kernels, self.graph = kernels, graph
        self.var: dict[Node, str] = {}
        self.non_contiguous: set[Node] = set()
        self.copies: set[str] = set()
        self.lines: list[str] = []
        self.generated: list[tuple[Kernel, Generated]] = []
        self.blas: set[str] = set()  # the nnc.codegen.cblas functions the graph calls
        self.maps = view_maps(graph)

    def arguments(self) -> list[Node]:
        args = [n for n in self.graph.nodes if n.op in ("placeholder", "get_attr") and "shape" in n.meta]
        for k, node in enumerate(args):
            self.var[node] = f"a{k}"
        return args

    def emit(self) -> None:
        for kernel in self.kernels:
            if kernel.kind == "opaque" and view_node(kernel) is None:
                self.folded_view(kernel.nodes[0], self.maps[kernel.nodes[0]])  # a basic getitem
            elif kernel.kind == "opaque":
                for folded, m in kernel.meta.get("views", {}).items():
                    self.folded_view(folded, m)
                self.view(kernel.nodes[0])
            else:
                self.launch(kernel)

    def read(self, node: Node) -> str:
        """A value as a C-contiguous array (kernels take flat views): a view that is not gets copied, once."""
        if node not in self.non_contiguous:
            return self.var[node]
        copy = f"c_{node.name}"
        if copy not in self.copies:
            self.copies.add(copy)
            self.lines.append(f"{copy} = np.ascontiguousarray({self.var[node]})")
        return copy

    def launch(self, kernel: Kernel) -> None:
        """The kernel's launcher lines, inlined: its ins[k], outs[k] and mm become this function's variables."""
        try:
            generated = generate(kernel, standalone=False)  # its launch lines run inside run_graph
        except KernelCompileError as error:
            raise WholeGraphUnsupported(str(error)) from None
        self.generated.append((kernel, generated))
        ins = [self.read(node) for node in kernel.inputs]
        outs = []
        for node in kernel.outputs:
            self.var[node] = f"v_{node.name}"
            shape, dtype = tuple(int(d) for d in node.meta["shape"]), np_dtype(node.meta["dtype"])
            self.lines.append(f"v_{node.name} = np.empty({shape!r}, dtype={ctor(dtype)})")
            outs.append(self.var[node])
        outs += [self.var[node] for node in kernel.meta.get("writes_into", [])]  # a cat's slices (passes/stores)
        mm = f"mm_{py_name(kernel.name)}"
        dot = _cblas_dot(kernel)
        launch = generated.launch
        threaded = whole_graph_threaded_dtype(kernel) if dot is not None else None
        if threaded is not None:  # a large product: on numba's threads (OpenBLAS on one, whole_graph_serial_blas)
            # NOTE: numba's pool size, written in: get_num_threads() in compiled code keeps numba from caching it
            # (a ctypes pointer); under set_num_threads(1) prange runs the blocks one after another
            launch, called = launch_on_numba_threads(launch, threaded, str(numba.config.NUMBA_NUM_THREADS))
            self.blas |= called
        for line in launch:
            if dot is not None and "np.dot(" in line:
                line = line.replace("np.dot(", f"{dot}(")
                self.blas.add(dot)
            line = re.sub(r"\b(lhs3|rhs3)\b", lambda m: f"{m.group(1)}_{py_name(kernel.name)}", line)  # per kernel
            line = re.sub(r"\bins\[(\d+)\]", lambda m: ins[int(m.group(1))], line)
            line = re.sub(r"\bouts\[(\d+)\]", lambda m: outs[int(m.group(1))], line)
            self.lines.append(re.sub(r"\bmm\b", mm, line))

    def folded_view(self, node: Node, m) -> None:
        """A view as numpy's strided view of its base (nnc.passes.views): a folded view a view step reads, or a
        view with no spelling of its own (a basic getitem the graph returns)."""
        itemsize = np_dtype(node.meta["dtype"]).itemsize
        self.var[node] = f"v_{node.name}"
        self.non_contiguous.add(node)
        self.lines.append(f"v_{node.name} = np.lib.stride_tricks.as_strided({self.read(m.base)}.reshape(-1)"
                          f"[{m.offset}:], {tuple(m.shape)!r}, {tuple(s * itemsize for s in m.strides)!r})")

    def view(self, node: Node) -> None:
        op, args, attrs = op_and_attrs(node)
        self.var[node] = f"v_{node.name}"
        expr, contiguous = _VIEWS[op.name](self, node, args[0], attrs)
        if not contiguous:
            self.non_contiguous.add(node)
        self.lines.append(f"v_{node.name} = {expr}")


def _cblas_dot(kernel: Kernel) -> str | None:
    """The nnc.codegen.cblas function that runs a matmul kernel's np.dot (numpy's OpenBLAS, no scipy), or None."""
    if kernel.kind != "matmul" or not cblas.AVAILABLE:
        return None
    (mm,) = matmul_nodes(kernel)
    a, b = mm.args[0], mm.args[1]
    dtypes = {np_dtype(n.meta["dtype"]) for n in (a, b, mm)}
    return cblas.DOT.get(dtypes.pop()) if len(dtypes) == 1 else None


def _reshape(emitter: _Emitter, node: Node, source: Node, attrs: dict) -> tuple[str, bool]:
    return f"{emitter.read(source)}.reshape({tuple(int(d) for d in node.meta['shape'])!r})", True


def _permute(emitter: _Emitter, node: Node, source: Node, attrs: dict) -> tuple[str, bool]:
    ndim = len(source.meta["shape"])
    axes = tuple(int(d) % ndim for d in attrs["dims"])
    contiguous = axes == tuple(range(ndim)) and source not in emitter.non_contiguous
    return f"np.transpose({emitter.var[source]}, {axes!r})", contiguous


def _expand(emitter: _Emitter, node: Node, source: Node, attrs: dict) -> tuple[str, bool]:
    return f"np.broadcast_to({emitter.var[source]}, {tuple(int(d) for d in node.meta['shape'])!r})", False


# How numba's numpy spells each view op nnc.kernel.view_node lets through (the op table says what is a view; this
# CPU-side table says how to write one): (expression, whether its result is C-contiguous).
_VIEWS = {"reshape": _reshape, "permute": _permute, "expand": _expand}


def _tuple(names: list[str]) -> str:
    return "(" + ", ".join(names) + ("," if len(names) == 1 else "") + ")"


def generate_graph(kernels: list[Kernel], graph: Graph, name: str = "graph", requested: bool | None = True):
    """(module source, argument nodes, returned nodes, [(kernel, its Generated module)]); raises
    WholeGraphUnsupported (also, unless `requested`, for a graph of repeating kernels: repeats_reason)."""
    reason = unsupported_reason(kernels, graph)
    if reason is not None:
        raise WholeGraphUnsupported(reason)
    emitter = _Emitter(kernels, graph)
    arg_nodes = emitter.arguments()
    emitter.emit()
    reason = None if requested else repeats_reason([generated for _, generated in emitter.generated])
    if reason is not None:
        raise WholeGraphUnsupported(reason)
    if not _HAVE_SCIPY and any("np.dot(" in line for line in emitter.lines):
        # NOTE: numba calls BLAS through scipy's cython bindings; scipy is not a dependency of nnc (the products
        # nnc.codegen.cblas runs, numpy's own OpenBLAS, need no scipy)
        raise WholeGraphUnsupported("a matmul runs in BLAS, which numba calls through scipy (not installed)")
    returned = _returned_nodes(graph, emitter)
    return _module_source(name, len(kernels), emitter, arg_nodes, returned), arg_nodes, returned, emitter.generated


def repeats_reason(generated: list[Generated]) -> str | None:
    """Why a graph's kernels repeat too much to compile as one function (see WHOLE_GRAPH_MAX_REPEATS), or None."""
    distinct = len({g.source for g in generated})
    if len(generated) > WHOLE_GRAPH_FEW and len(generated) > WHOLE_GRAPH_MAX_REPEATS * distinct:
        return (f"its {len(generated)} kernels repeat {distinct} distinct ones (an unrolled loop): kernel by kernel "
                f"compiles each once, one numba function would compile every repeat; whole_graph=True asks for it")
    return None


def _returned_nodes(graph: Graph, emitter: _Emitter) -> list[Node]:
    """The graph's outputs run_graph returns (each once; inputs and attributes the caller has already)."""
    returned = [n for n in dict.fromkeys(nodes_in(graph.output_node.args[0]))
                if n.op not in ("placeholder", "get_attr")]
    for node in returned:
        if node not in emitter.var:
            raise WholeGraphUnsupported(f"output {node.name} is not computed by a kernel or a view")
    return returned


def _module_source(name: str, n_kernels: int, emitter: _Emitter, arg_nodes: list, returned: list) -> str:
    # NOTE: the kernels' functions are imported from their own cached modules (content-addressed, so a kernel
    # shared by several graphs, or compiled kernel by kernel before, is compiled once and loaded from numba's cache)
    imports = [f"from {cache.module_name(generated.source)} import {', '.join(generated.signatures)}"
               for _, generated in emitter.generated if generated.signatures]
    if emitter.blas:
        imports.append(f"from nnc.codegen.cblas import {', '.join(sorted(emitter.blas))}  # cblas v{cblas.VERSION}")
    doc = "; ".join(f"a{k}: {n.name} {np_dtype(n.meta['dtype']).name}{list(n.meta['shape'])}"
                    for k, n in enumerate(arg_nodes))
    results = [emitter.var[n] for n in returned]
    checks = _shape_checks([emitter.var[n] for n in arg_nodes], arg_nodes)
    body = ([f"    # {doc}"] + ["    " + line for line in checks + emitter.lines]
            + [f"    return {_tuple(results)}"])
    entry = "\n".join(["@njit(cache=True, error_model='numpy', no_cfunc_wrapper=True)",
                       f"def run_graph({', '.join(emitter.var[n] for n in arg_nodes)}):"] + body)
    header = [f'"""nnc whole graph {name}: {n_kernels} kernels as one numba function."""',
              "import numpy as np", "from numba import njit", ""] + imports
    return "\n\n\n".join(["\n".join(header), entry]) + "\n"


def _shape_checks(names: list[str], arg_nodes: list) -> list[str]:
    """run_graph's first lines: each argument's sizes against the ones its code is specialized to, raising
    SHAPE_ERROR before anything runs (CompiledGraph.run then names the argument)."""
    lines = []
    for name, node in zip(names, arg_nodes):
        sizes = [int(d) for d in node.meta["shape"]]
        if sizes:
            test = " or ".join(f"{name}.shape[{d}] != {size}" for d, size in enumerate(sizes))
            lines += [f"if {test}:", f"    raise ValueError({SHAPE_ERROR!r})"]
    return lines


def compile_graph(kernels: list[Kernel], graph: Graph, name: str = "graph",
                  requested: bool | None = True) -> CompiledGraph:
    """Generate, cache and compile the whole graph; WholeGraphUnsupported or KernelCompileError when it cannot."""
    start = time.perf_counter()
    source, arg_nodes, returned, generated = generate_graph(kernels, graph, name, requested)
    compiled = [compile_generated(kernel, g) for kernel, g in generated]  # imports (and compiles) them
    hits = [c.cache_hit for c in compiled]
    # NOTE: run_graph imports the kernels' modules by name; one the LRU dropped meanwhile is loaded again by that
    # import (cache._KnownSourceFinder)
    module, path, _ = cache.load_module(source)
    function = module.run_graph
    specs = [(tuple(int(d) for d in n.meta["shape"]), np_dtype(n.meta["dtype"])) for n in arg_nodes]
    signature = numba_signature_nd(specs)
    with COMPILE_LOCK:  # see its note: another thread may be compiling the same graph
        try:
            if signature not in function.overloads:  # a module imported before in this process is compiled already
                function.compile(signature)
        except Exception as error:
            message = str(error).strip()
            raise KernelCompileError(name, f"numba could not compile the whole graph (source: {path}): "
                                           f"{type(error).__name__}: {message[:2000]}") from error
        function.disable_compile()  # other argument types are an error, never a silent recompile
    stats = function.stats
    hit = bool(sum(stats.cache_hits.values())) and not sum(stats.cache_misses.values()) and all(hits)
    return CompiledGraph(source=source, path=path, cache_hit=hit, compile_seconds=time.perf_counter() - start,
                         arg_nodes=arg_nodes, returned=returned, arg_specs=specs,
                         kernel_sources={kernel.name: g.annotated for kernel, g in generated},
                         _function=function, nowait=any(c.nowait for c in compiled))
