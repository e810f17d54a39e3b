"""Builds and compiles CPU kernels: `generate` runs a Kernel's skeleton and assembles the module's source,
`compile_kernel` saves it in the on-disk cache (nnc.codegen.cache), imports it and compiles it with numba.

A kernel becomes readable Python: one scalar body (nnc.codegen.scalar, spelled by the CPU dialect) inside a range/
prange loop skeleton (cpu_elementwise, cpu_reduction, cpu_matmul; their loop layouts are pure schedule values that
`schedule(kernel)` returns). Imports run one way: this module -> the skeletons -> cpu_dialect, indexing, scalar.

The source is a function of the computation only (ops, attributes, dtypes, shapes, schedules): it names no graph
node and not the kernel, values are numbered by position and the functions named from a hash of the source. So the
kernels of identical blocks share one cache file and one compiled function. `Generated.legend` (comments shown above
the source in debug output, never cached) says which graph node each argument and value is.

`compile_kernel(kernel) -> CompiledKernel` compiles every numba function of the module for its one static signature
(1-D C-contiguous arrays) with `numba.njit(cache=True)`. Any failure raises `KernelCompileError(kernel name,
reason)`; the caller falls back to the interpreter.
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np

from ..graph import Node
from ..kernel import Kernel, matmul_nodes
from ..symbolic import evaluate, has_symbols
from . import cache, cblas, compile_workers, nowait
from .cpu_cat import CatSchedule, cat_schedule_of, gen_cat
from .cpu_conv import WindowSchedule, gen_window, window_schedule_of
from .cpu_dialect import file_digest
from .cpu_gather import GatherSchedule, gen_gather, gather_schedule_of
from .cpu_elementwise import (KERNEL_NAME, SIZE, ElementwiseSchedule, KernelBuilder, elementwise_schedule,
                              gen_elementwise, indent, symbols_in)
from .cpu_matmul import PER_ENTRY_DOT, MatmulSchedule, gen_matmul, matmul_schedule_of
from .cpu_reduction import ReductionSchedule, gen_reduction, reduction_schedule_of
from .cpu_rows import RowSchedule, gen_rows, row_schedule_of
from .cpu_take import TakeSchedule, gen_take, take_schedule_of
from .cpu_tasks import TASK_SUFFIX, launch_tasks
from .cpu_winograd import WinogradSchedule, gen_winograd, winograd_schedule_of
from .scalar import KernelCompileError, Unsupported, generate_or_raise, node_dtype, node_shape

GENERATOR_VERSION = 1
_TASKS_FILE = Path(__file__).with_name("tasks.py")  # its digest is in the stamp of modules calling it
# The skeleton that generates each kind of kernel (nnc.kernel.Kernel.kind).
SKELETONS = {"elementwise": gen_elementwise, "reduction": gen_reduction, "row": gen_rows, "matmul": gen_matmul,
             "window": gen_window, "gather": gen_gather, "cat": gen_cat,
             "take": gen_take, "winograd": gen_winograd}


@dataclass
class Generated:
    """What generation produces: the module source and, per numba function, its argument dtypes."""

    source: str
    signatures: dict[str, list[np.dtype]]
    parallel: bool
    in_specs: list[tuple[tuple, np.dtype]]
    out_specs: list[tuple[tuple, np.dtype]]
    launch: list[str] = field(default_factory=list)     # the body of launch(ins, outs) (numba-compatible)
    symbols: list[str] = field(default_factory=list)    # the size symbols launch(ins, outs, sizes) reads
    legend: list[str] = field(default_factory=list)     # comments naming the graph nodes (not in `source`)
    libraries: list[str] = field(default_factory=list)  # sources of the libraries `source` imports (cache.library)
    tasks: list[str] = field(default_factory=list)      # task functions (nnc.codegen.tasks) among `signatures`
    precompiled: list[str] = field(default_factory=list)  # nnc.codegen.precompiled functions among `signatures`

    @property
    def annotated(self) -> str:
        """`source` under the legend, then the libraries it imports: what debug output and `nnc dump --stage
        codegen` show."""
        shown = [f"# library {cache.module_name(lib)}:\n{lib}" for lib in self.libraries]
        return "\n".join(self.legend + [self.source] + shown)

    @property
    def uses_nowait(self) -> bool:
        """Whether a product runs with nnc.codegen.nowait's helper thread: a call in the module or in a library it
        imports (a matmul kernel's functions live in its library)."""
        return any("nowait_gemv(" in text or "nowait_rows(" in text for text in [self.source, *self.libraries])


def generate(kernel: Kernel, standalone: bool = True) -> Generated:
    """The generated module for a kernel (no compilation); raises KernelCompileError when it cannot.

    standalone: the kernel is launched by itself from Python, so its parallel loops run as task functions
    (nnc.codegen.tasks) and a small serial gather, scatter or column sum calls nnc.codegen.precompiled. False, for a
    whole graph (its launch lines run inside numba, where a task function's address cannot be passed), keeps every
    parallel loop a prange and generates every kernel's own loops."""
    return generate_or_raise(kernel, lambda k: _generate(k, standalone))


def _stamp(approx_digest: str | None, tasks: bool = False) -> str:
    """The generator's and numba's versions, and the digests of approx.py and tasks.py for a module that calls
    their functions."""
    import numba

    return (f"# generated by nnc.codegen.cpu v{GENERATOR_VERSION} for numba {numba.__version__}"
            + (f"; approx.py {approx_digest}" if approx_digest else "")
            + (f"; tasks.py {file_digest(_TASKS_FILE)}" if tasks else ""))


def _function_prefix(text: str, stamp: str) -> str:
    """The prefix of a module's function names: k_ and a hash of its text without the stamp line, so names do not
    change with the installed numba (the file name, from the whole text, does)."""
    return f"k_{cache.digest(text.replace(stamp, '', 1))[:16]}"


_IMPORTS = ["import math", "", "import numpy as np", "from numba import njit, prange"]


def _library(doc: str, stamp: str, imports: list[str], definitions: list[str]) -> tuple[str, str]:
    """(source, function-name prefix) of a library module holding `definitions` (KERNEL_NAME in them becomes the
    prefix: k_ and a hash of the text)."""
    text = "\n\n\n".join(["\n".join([f'"""{doc}"""', stamp] + _IMPORTS + imports)] + definitions) + "\n"
    prefix = _function_prefix(text, stamp)
    return text.replace(KERNEL_NAME, prefix), prefix


def _libraries_of(kb: KernelBuilder, stamp: str, preamble: list[str], splits: dict) -> tuple[list, list, list,
                                                                                              str | None]:
    """(library sources, the kernel module's lines importing them, the definitions left in the kernel module, the
    function-name prefix of a matmul kernel's library or None).

    NOTE: a reduction's block helpers (the same few in most kernels), a matmul kernel's numba functions (the same
    epilogue after products of other operands, whose launchers differ) and those of a kernel whose launcher passes
    inputs from an offset (KernelBuilder._rebase_views: an RNN's steps) are libraries: each compiles once, not once
    per kernel that calls it."""
    libraries, imports = [], []
    for helper, text in kb.helpers.items():
        source, _ = _library(f"nnc library: {helper}.", _stamp(None), [], [text])
        libraries.append(source)
        imports.append(f"from {cache.library(source)} import {helper}")
    definitions = [f.source(splits[f.name][0] if f.name in splits else None) for f in kb.functions]
    if not kb.functions or (kb.kernel.kind != "matmul" and not kb.rebased):
        return libraries, imports, definitions, None
    source, prefix = _library(f"nnc library: the numba functions of a {kb.kernel.kind} kernel.", stamp,
                              preamble + imports, definitions)
    names = ", ".join(name.replace(KERNEL_NAME, prefix) for f in kb.functions for name in _defined(f.name, splits))
    return libraries + [source], [f"from {cache.library(source)} import {names}"], [], prefix


def _generate(kernel: Kernel, standalone: bool = True) -> Generated:
    kind = kernel.kind
    kb = KernelBuilder(kernel, standalone)
    if kind not in SKELETONS:
        raise Unsupported(f"kernel kind {kind!r} has no code generation (run it as is)")
    SKELETONS[kind](kb)
    splits = {f.name: (split, len(f.args)) for f in kb.functions
              if standalone and (split := f.task_split()) is not None}
    kb.launch = launch_tasks(kb.launch, splits)
    ops = ", ".join(n.target.op.name for n in kernel.nodes)
    preamble = kb.dialect.preamble()  # NOTE: before the stamp: it records which approx.py functions are called
    placed = ", placed_row" if any(split.placed for split, _ in splits.values()) else ""
    tasks_import = [f"from nnc.codegen.tasks import run_tasks, task_array{placed}"]
    if splits:
        preamble += tasks_import
    # NOTE: tasks.py's hash in the stamp, as approx.py's: numba's cache does not notice a callee's change
    stamp = _stamp(kb.dialect.approx_digest, tasks=bool(splits))
    libraries, imports, definitions, library_prefix = _libraries_of(kb, stamp, preamble, splits)
    if splits and library_prefix:  # the kernel's launch calls run_tasks too
        imports += tasks_import
    header = [f'"""nnc {kind} kernel: {ops} over {list(kernel.shape)}."""', stamp] + _IMPORTS
    header += ([] if library_prefix else preamble) + imports
    if kb.precompiled:
        header += [f"from nnc.codegen.precompiled import {', '.join(sorted(kb.precompiled))}"]
    own_launch = kb.launch
    threaded = threaded_dtype(kernel) if kind == "matmul" else None
    if threaded is not None:  # the module's own launcher (a whole graph decides for itself: whole_graph_threaded_dtype)
        own_launch, called = launch_on_numba_threads(kb.launch, threaded)
        if called:
            header += ["from numba import get_num_threads", "",
                       f"from nnc.codegen.cblas import {', '.join(sorted(called))}"]
    parts = ["\n".join(header)] + definitions
    symbols = symbols_in(kb.launch)
    if symbols:  # a kernel over symbolic sizes (nnc.symbolic) takes each call's sizes
        launch = [f"{name} = sizes[{name[1:]}]" for name in symbols] + own_launch
        parts.append("\n".join(["def launch(ins, outs, sizes):", '    """Run the kernel on C-contiguous input and '
                                'output arrays, for the size symbols\' values."""'] + indent(launch)))
    else:
        parts.append("\n".join(["def launch(ins, outs):", '    """Run the kernel on C-contiguous input and output '
                                'arrays."""'] + indent(own_launch)))
    source = "\n\n\n".join(parts) + "\n"
    # NOTE: the source names no graph node and not the kernel (KernelBuilder), so identical kernels (the blocks of
    # a deep model) share one cached module and one numba compilation. Its functions are named from a hash of that
    # source (or of their library's): a whole-graph module imports several kernels' functions into one namespace,
    # and identical kernels importing the same name from the same module is harmless.
    name = library_prefix or _function_prefix(source, stamp)
    named = lambda text: text.replace(KERNEL_NAME, name)  # noqa: E731
    signatures = dict(kb.precompiled)
    for f in kb.functions:
        if f.name in splits:  # the task function first: (lo, hi, addrs); a launcher takes its address last
            signatures[named(f.name + TASK_SUFFIX)] = [SIZE] * 3
        if f.name not in splits or not splits[f.name][0].direct:
            signatures[named(f.name)] = [a.dtype for a in f.args] + [SIZE] * (len(f.symbols) + (f.name in splits))
    return Generated(source=named(source),
                     signatures=signatures, tasks=[named(name + TASK_SUFFIX) for name in sorted(splits)],
                     precompiled=sorted(kb.precompiled),
                     symbols=symbols,
                     parallel=any(f.parallel for f in kb.functions),
                     in_specs=[(a.shape, a.dtype) for a in kb.ins],
                     out_specs=[(a.shape, a.dtype) for a in kb.outs],
                     launch=[named(line) for line in kb.launch], legend=kb.legend(), libraries=libraries)


def _defined(name: str, splits: dict) -> list[str]:
    """The numba functions generated for function `name`: itself, or its launcher and task (nnc.codegen.cpu_tasks),
    or its task alone (a direct split)."""
    if name not in splits:
        return [name]
    return [name + TASK_SUFFIX] if splits[name][0].direct else [name, name + TASK_SUFFIX]


# the nnc.codegen.cblas functions a launcher calls to run its products on numba's threads
THREADED_NAMES = frozenset(cblas.DOT_THREADED.values()) | frozenset(cblas.DOT_BATCH_THREADED.values())


def _product_work(kernel: Kernel) -> tuple[int, object, int] | None:
    """(multiply-adds of one product, the dtype when operands and result share one, the products in its batch) of a
    matmul kernel's anchor."""
    anchors = matmul_nodes(kernel)
    if len(anchors) != 1 or len(anchors[0].args) < 2:
        return None
    mm = anchors[0]
    a, b = mm.args[0], mm.args[1]
    if not all(isinstance(n, Node) for n in (a, b)):
        return None
    a_shape, b_shape = node_shape(a), node_shape(b)
    if has_symbols((a_shape, b_shape)) or len(a_shape) < 1 or len(b_shape) < 2:
        return None
    n_out = b_shape[0] if mm.target.op.name == "linear" else b_shape[-1]
    rows = a_shape[-2] if len(b_shape) > 2 else math.prod(a_shape[:-1])  # a batched product: one matrix's rows
    dtypes = {node_dtype(n) for n in (a, b, mm)}
    batch = math.prod(a_shape[:-2]) if len(b_shape) > 2 else 1
    return rows * a_shape[-1] * n_out, (dtypes.pop() if len(dtypes) == 1 else None), batch


def threaded_dtype(kernel: Kernel):
    """The dtype of a matmul kernel whose products run on numba's threads (cblas.DOT_THREADED, DOT_BATCH_THREADED),
    or None: the product (all of the batch's) is below cblas.THREAD_MIN_WORK (OpenBLAS runs it on one thread
    anyway), its dtypes differ or have no threaded function, or OpenBLAS's thread count cannot be set."""
    product = _product_work(kernel)
    if not cblas.THREADS_SETTABLE or product is None or product[0] * product[2] < cblas.THREAD_MIN_WORK:
        return None
    return product[1] if product[1] in cblas.DOT_THREADED else None


def launch_on_numba_threads(launch: list[str], dtype, threads: str = "get_num_threads()") -> tuple[list, set]:
    """A launcher's lines with its products of `dtype` split over numba's threads (cblas.DOT_THREADED with
    `threads`, the batch loop as cblas.DOT_BATCH_THREADED), and the cblas functions they now call."""
    lines = [_on_numba_threads(line, cblas.DOT_THREADED[dtype], threads) for line in launch]
    lines = _batch_on_numba_threads(lines, cblas.DOT_BATCH_THREADED[dtype])
    return lines, {name for name in THREADED_NAMES if any(line.startswith(f"{name}(") for line in lines)}


def _batch_on_numba_threads(launch: list[str], function: str) -> list[str]:
    """The launcher's loop over a batch's products (`for bi in range(n):` with cpu_matmul.PER_ENTRY_DOT) as one
    `function(lhs3, rhs3, mm)` call, the batch spread over numba's threads; other lines as they are."""
    out, i = [], 0
    while i < len(launch):
        if launch[i].startswith("for bi in range(") and launch[i + 1:i + 2] == [PER_ENTRY_DOT]:
            out.append(f"{function}(lhs3, rhs3, mm)")
            i += 2
        else:
            out.append(launch[i])
            i += 1
    return out


def _on_numba_threads(line: str, function: str, threads: str = "get_num_threads()") -> str:
    """A launcher line `np.dot(a, b, out=c)` as `function(a, b, c, threads)`; any other line as it is."""
    if not (line.startswith("np.dot(") and line.endswith(")") and line.count(", out=") == 1):
        return line
    return f"{function}({line[len('np.dot('):-1].replace(', out=', ', ')}, {threads})"


def blas_threads_used(kernel: Kernel, source: str) -> str | None:
    """Whose threads a compiled matmul kernel's product runs on: "numba" (a cblas.DOT_THREADED call), "openblas"
    (np.dot or np.matmul on a product large enough for OpenBLAS to wake its own threads), or None (a generated
    loop, or products OpenBLAS keeps on the calling thread)."""
    if any(f"{name}(" in source for name in THREADED_NAMES):
        return "numba"
    product = _product_work(kernel)
    large = product is None or product[0] >= cblas.THREAD_MIN_WORK
    return "openblas" if large and ("np.dot(" in source or "np.matmul(" in source) else None


# In a whole graph, a product below this many multiply-adds (all of a batch's) runs on the calling thread: a
# parallel region joins its threads after every product, and beside busy processes a descheduled worker holds that
# join for a scheduler slice. NOTE: a trade, measured with tools/bench_blas_threads.py (a linear's layout, medians
# of 7): on a quiet machine two threads take 0.62-0.64x one thread's time from 0.8 M multiply-adds (64 x 64 x 192:
# 9.2 against 14.4 us) and 0.52-0.54x from 8 M; beside one CPU-bound process they take 1.4-6.2x, single calls up to
# 7.6 ms, at every size. Below 2^22 a product saves at most ~7 us on two threads: the GPT's batch-1 forward
# (64-row linears of 0.26-1 M) takes 141 against 115 us quiet on one thread, and beside other jobs 0.15 ms against
# 1.2 ms. Larger products split over numba's threads (whole_graph_threaded_dtype).
SERIAL_BLAS_MAX_WORK = 2 ** 22


def whole_graph_threaded_dtype(kernel: Kernel):
    """The dtype of a matmul kernel whose products a whole graph runs on numba's threads (threaded_dtype, from
    SERIAL_BLAS_MAX_WORK multiply-adds in all), or None: it runs them on the calling thread."""
    product = _product_work(kernel)
    if product is None or product[0] * product[2] < SERIAL_BLAS_MAX_WORK:
        return None
    return threaded_dtype(kernel)


def whole_graph_serial_blas(kernels: list[Kernel]) -> bool:
    """Whether a whole graph of these kernels holds OpenBLAS to one thread while it runs: some product would wake
    OpenBLAS's threads. The graph's large products then split over numba's threads (whole_graph_threaded_dtype), so
    numba's pool is the only one, as for a plan run kernel by kernel (nnc.executor.one_thread_pool).
    NOTE: with OpenBLAS's own threads beside a parallel numba kernel, both pools spin against each other: a
    Linear(64, 512) + GELU forward over 512 rows took 8.3 ms against torch's 0.5 ms."""
    if not cblas.THREADS_SETTABLE:
        return False
    return any(blas_threads_used(k, k.meta.get("source", "")) is not None for k in kernels)


def schedule(kernel: Kernel) -> (ElementwiseSchedule | ReductionSchedule | RowSchedule | MatmulSchedule
                                 | WindowSchedule | GatherSchedule | CatSchedule | TakeSchedule | WinogradSchedule):
    """The loop layout code generation chooses for a kernel (raises Unsupported for one it cannot generate)."""
    if kernel.kind == "reduction":
        return reduction_schedule_of(kernel)
    if kernel.kind == "row":
        return row_schedule_of(kernel)
    if kernel.kind == "matmul":
        return matmul_schedule_of(kernel)
    if kernel.kind == "window":
        return window_schedule_of(kernel)
    if kernel.kind == "gather":
        return gather_schedule_of(kernel)
    if kernel.kind == "cat":
        return cat_schedule_of(kernel)
    if kernel.kind == "take":
        return take_schedule_of(kernel)
    if kernel.kind == "winograd":
        return winograd_schedule_of(kernel)
    if kernel.kind == "elementwise":
        kb = KernelBuilder(kernel)
        arrays, shape = kb.reads + kb.outs, tuple(kernel.shape)
        return elementwise_schedule(shape, [a.shape for a in arrays], [a.strides_in(shape) for a in arrays],
                                    kernel.nodes)
    raise Unsupported(f"kernel kind {kernel.kind!r} has no code generation (run it as is)")


# ---------------------------------------------------------------------------------------------------------------
# Compilation
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class CompiledKernel:
    """A compiled kernel: `run(inputs, out=None)` returns one array per kernel output."""

    name: str
    kind: str
    source: str  # the module's source (`path` holds it) under comments naming the kernel's graph nodes
    path: Path
    parallel: bool
    cache_hit: bool  # True when nothing was compiled: numba's on-disk cache (or this process) had it
    compile_seconds: float
    in_specs: list = field(repr=False)
    out_specs: list = field(repr=False)
    _launch: Callable = field(repr=False)

    symbols: list = field(default_factory=list, repr=False)  # launch(ins, outs, sizes) reads these size symbols
    nowait: bool = False  # a product runs with nnc.codegen.nowait's helper thread (see nowait.retain)

    def __post_init__(self):
        # NOTE: static shapes as plain tuples of ints: run_into compares them on every call, and a symbolic Shape's
        # Python __eq__ cost ~0.5 us per input (a GPT training step's ~240 comparisons: ~60 us)
        self._in_shapes = [shape if has_symbols(shape) else tuple(int(d) for d in shape) for shape, _ in self.in_specs]
        self._in_dtypes = [dtype for _, dtype in self.in_specs]

    def bind(self, sizes: dict, values: tuple) -> "CompiledKernel":
        """This kernel for one call's symbol values: concrete shapes, and a launcher given the sizes."""
        if not self.symbols and not has_symbols((self.in_specs, self.out_specs)):
            return self
        launch = self._launch
        return replace(self, in_specs=evaluate(self.in_specs, sizes), out_specs=evaluate(self.out_specs, sizes),
                       _launch=(lambda ins, outs: launch(ins, outs, values)) if self.symbols else launch)

    def run_into(self, input_arrays: list, outs: list) -> None:
        """`run` for a caller whose `outs` are C-contiguous writeable arrays of the output specs (the executor's).

        NOTE: writeable inputs of the right shapes and dtypes go straight to the launcher (its reshape(-1) copies
        one that is not contiguous); numba's dispatcher refuses other layouts with a TypeError, and `run` then
        checks and converts every input (a launch is safe to repeat: it only writes `outs`). Read-only inputs
        (expand's broadcast views) go to `run` at once: a refused dispatch costs ~100 us of numba's typing."""
        if ([a.shape for a in input_arrays] == self._in_shapes and [a.dtype for a in input_arrays] == self._in_dtypes
                and all_writeable(input_arrays)):
            try:
                self._launch_retaining(input_arrays, outs)
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
            self._launch_retaining(ins, outs)
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
        self._launch_retaining(ins, outs)
        for buf, tmp in copies:
            np.copyto(buf, tmp)
        return out

    __call__ = run

    def _launch_retaining(self, ins: list, outs: list) -> None:
        self._launch(ins, outs)
        if self.nowait:  # the inputs stay referenced while nnc.codegen.nowait's helper may still read them
            nowait.retain(ins)


def _numba_signature(dtypes):
    from numba import types
    from numba.np.numpy_support import from_dtype

    return tuple(types.int64 if d == SIZE else types.Array(from_dtype(d), 1, "C") for d in dtypes)


def all_writeable(arrays) -> bool:
    """Whether a compiled launcher can take these arrays as they are: its numba signatures are writeable arrays, and a
    dispatch numba refuses (a read-only array: an expand's broadcast view) costs ~100 us of typing before failing."""
    for a in arrays:
        if not a.flags.writeable:
            return False
    return True


def numba_signature_nd(specs):
    """numba argument types for C-contiguous arrays of the given (shape, dtype)s."""
    from numba import types
    from numba.np.numpy_support import from_dtype

    return tuple(types.Array(from_dtype(d), len(shape), "C") for shape, d in specs)


# NOTE: numba's compile() of a dispatcher another thread has disabled raises "compilation disabled" before it looks
# for the signature that thread just compiled: two threads compiling one new module would lose one kernel to the
# interpreter. Checking, compiling and disabling under one lock makes the second find the first's overload.
COMPILE_LOCK = threading.Lock()


def _keep_task_address(dispatcher) -> None:
    """Set `nnc_address` on a compiled task function's dispatcher: the C entry point (numba's cfunc wrapper) its
    launcher hands nnc.codegen.tasks.run_tasks."""
    if getattr(dispatcher, "nnc_address", 0):
        return
    (compiled,) = dispatcher.overloads.values()
    dispatcher.nnc_address = compiled.library.get_pointer_to_function(compiled.fndesc.llvm_cfunc_wrapper_name)


def compile_kernel(kernel: Kernel) -> CompiledKernel:
    """Generate, cache and compile a kernel; KernelCompileError(kernel name, reason) on any failure. A module the
    codegen stage already generated for its compile helpers (meta "generated") is not generated again."""
    start = time.perf_counter()
    generated = kernel.meta.pop("generated", None) or generate(kernel)
    return compile_generated(kernel, generated, start)


def compile_generated(kernel: Kernel, generated: Generated, start: float | None = None) -> CompiledKernel:
    """Cache and compile the module `generate(kernel)` made (see compile_kernel)."""
    start = time.perf_counter() if start is None else start
    compile_workers.wait_for(generated.source)  # a helper process compiling it: load its result from the cache
    try:
        module, path, _ = cache.load_module(generated.source)
    except Exception as e:
        raise KernelCompileError(kernel.name, f"importing the generated module failed: {type(e).__name__}: {e}") from e
    hit = True
    for fname, dtypes in generated.signatures.items():
        disp = getattr(module, fname)
        sig = _numba_signature(dtypes)
        with COMPILE_LOCK:
            if sig in disp.overloads:
                continue
            try:
                with cache.compiling(path):  # another process compiling it: wait, then load its result
                    disp.compile(sig)
            except Exception as e:
                message = str(e).strip()
                if len(message) > 2000:
                    message = message[:2000] + " ..."
                raise KernelCompileError(kernel.name, f"numba could not compile {fname} (source: {path}): "
                                                      f"{type(e).__name__}: {message}") from e
            if fname in generated.precompiled:  # shared by the kernels calling it, each compiling its dtypes
                continue
            disp.disable_compile()  # a call with other argument types is an error, never a silent recompile
        stats = disp.stats
        if not sum(stats.cache_hits.values()) or sum(stats.cache_misses.values()):
            hit = False
    if generated.tasks:
        from .tasks import start_threads

        start_threads()
    for name in generated.tasks:
        _keep_task_address(getattr(module, name))
    uses_nowait = generated.uses_nowait
    if uses_nowait:
        nowait.ensure_helper()  # the thread that computes part of its product (it sleeps until then)
    return CompiledKernel(name=kernel.name, kind=kernel.kind, source=generated.annotated, path=path,
                          parallel=generated.parallel, cache_hit=hit,
                          compile_seconds=time.perf_counter() - start, in_specs=generated.in_specs,
                          out_specs=generated.out_specs, _launch=module.launch, symbols=generated.symbols,
                          nowait=uses_nowait)
