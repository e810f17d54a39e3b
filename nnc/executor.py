"""Executor: runs a decomposed graph as a sequence of steps: generated kernels, or nodes through the interpreter."""
from __future__ import annotations

import contextlib
import copy
import functools
import sys
import threading
import time
import warnings

import numpy as np

from runtime.tensor import Tensor

from runtime.utils import _pytree as pytree
from .graph import Node, map_arg, nodes_in
from .graph_module import GraphModule
from .interpreter import Interpreter
from .kernel import Kernel, view_node
from .passes.fusion import fuse
from .passes.memory import aligned_empty, plan_memory
from .passes.stores import copy_nodes, fold_stores
from .profile import ACTIVE as _profiles
from .profile import run_steps as _profiled_steps
from .profile import run_whole as _profiled_whole
from .symbolic import DynamicSizeError, evaluate, has_symbols


class KernelStep:
    """One fused kernel compiled to numba; reads its inputs' arrays and produces its outputs' tensors.

    Outputs with a planned buffer are written into it (the same memory on every call of a thread); the others,
    graph outputs among them, get fresh arrays, since the caller keeps them. Where the arrays come from is a
    thread's OutputBuffers, so two threads calling one plan never share memory.
    """

    def __init__(self, kernel: Kernel, compiled, reuse_outputs: bool = True):
        self.kernel, self.compiled = kernel, compiled
        self.inputs, self.outputs = kernel.inputs, kernel.outputs
        self.out_specs = [(tuple(n.meta["shape"]), n.meta["dtype"].np) for n in kernel.outputs]
        self.reuse_outputs = reuse_outputs
        self.parallel = bool(getattr(compiled, "parallel", False))
        # values another kernel allocated that this one writes its product into (a cat's slices: passes/stores.py)
        self.writes_into = list(kernel.meta.get("writes_into", ()))

    def bind(self, sizes: dict, values: tuple) -> "KernelStep":
        """This step for one call's symbolic sizes (nnc.symbolic): concrete output shapes, the kernel given them."""
        step = copy.copy(self)
        step.out_specs = evaluate(self.out_specs, sizes)
        step.compiled = self.compiled.bind(sizes, values) if hasattr(self.compiled, "bind") else self.compiled
        return step

    def buffers(self, memory, arenas) -> "OutputBuffers":
        """This step's output arrays for one thread: planned views into its arenas, and a memo of the rest."""
        return OutputBuffers([memory.view(arenas, n) if n in memory.slots else None for n in self.outputs],
                             self.out_specs, self.reuse_outputs)

    def run(self, env: dict, buffers: "OutputBuffers") -> None:
        arrays = buffers.arrays()
        inputs = [env[n]._data for n in self.inputs]
        outs = arrays + [env[n]._data for n in self.writes_into] if self.writes_into else arrays
        if self.parallel and not threading_layer_is_threadsafe():
            with _PARALLEL_REGIONS:
                self.compiled.run_into(inputs, outs)
        else:
            self.compiled.run_into(inputs, outs)
        if buffers.reuse:
            buffers.handed_out(arrays)
        from_array = Tensor._from_array
        for node, array in zip(self.outputs, arrays):
            env[node] = from_array(array)


_PARALLEL_REGIONS = threading.Lock()
_threadsafe_layer: bool | None = None


class serial_numba_kernels:
    """Inside, numba's parallel kernels launched by this thread run on one thread (numba.set_num_threads is per
    calling thread), leaving the other cores to OpenBLAS's threads.

    NOTE: after every call OpenBLAS's idle workers spin on the cores for a long while (~0.1 s, its thread timeout),
    so a parallel numba kernel between two BLAS calls waits at its barrier for a worker sharing a core with one of
    them: the MNIST CNN's training step (tools/bench_compile.py case 7) took 64-105 ms with parallel numba kernels and
    44 ms with serial ones, alone in its process on 2 cores (torch eager 35 ms); the GPT's step (case 8a) was the
    same either way (4.3-4.9 ms vs 4.8 ms)."""

    __slots__ = ("previous",)

    def __enter__(self):
        import numba

        self.previous = numba.get_num_threads()
        numba.set_num_threads(1)

    def __exit__(self, *exc):
        import numba

        numba.set_num_threads(self.previous)
        return False


class one_thread_pool:
    """Inside, OpenBLAS runs on one thread, for every thread of the process: a plan whose large products split over
    numba's threads (nnc.codegen.cblas.dot_threaded_f32, each block a single-threaded OpenBLAS call) runs with
    numba's pool as the only one, so its parallel kernels run on every core too (serial_numba_kernels says why
    two pools cannot). Nested and concurrent plans share one setting: the first in saves OpenBLAS's count, the
    last out restores it."""

    __slots__ = ()
    _lock = threading.Lock()
    _inside = 0
    _saved = 1

    def __enter__(self):
        from .codegen import cblas

        with one_thread_pool._lock:
            if one_thread_pool._inside == 0:
                one_thread_pool._saved = cblas.blas_threads()
                cblas.set_blas_threads(1)
            one_thread_pool._inside += 1

    def __exit__(self, *exc):
        from .codegen import cblas

        with one_thread_pool._lock:
            one_thread_pool._inside -= 1
            if one_thread_pool._inside == 0:
                cblas.set_blas_threads(one_thread_pool._saved)
        return False


def _numba_threads() -> int:
    import numba

    return numba.config.NUMBA_NUM_THREADS


def threading_layer_is_threadsafe() -> bool:
    """Whether numba's threading layer lets two threads run parallel regions at once (tbb and omp do; the
    workqueue layer, numba's fallback when neither is installed, aborts the process instead)."""
    global _threadsafe_layer
    if _threadsafe_layer is None:
        try:
            import numba
            from numba.np.ufunc import parallel

            parallel._launch_threads()  # NOTE: picks the layer, as numba's first parallel call would
            _threadsafe_layer = numba.threading_layer() in ("tbb", "omp")
        except Exception:  # no way to tell: serialise parallel regions, which is always safe
            _threadsafe_layer = False
    return _threadsafe_layer


class OutputBuffers:
    """Where one thread's calls of a kernel step write: planned buffers, or graph outputs reused once dropped."""

    __slots__ = ("planned", "specs", "reuse", "previous", "all_planned")

    def __init__(self, planned: list, specs: list, reuse: bool):
        self.planned, self.specs, self.reuse = planned, specs, reuse
        self.all_planned = all(p is not None for p in planned)
        self.previous = [None] * len(planned)  # the last unplanned outputs handed out

    def arrays(self) -> list:
        if self.all_planned:
            return self.planned  # NOTE: callers only read the list (it is the buffers' own)
        return [p if p is not None else self._unplanned(i) for i, p in enumerate(self.planned)]

    def _unplanned(self, i: int) -> np.ndarray:
        """A graph output: the previous call's array if nobody holds it any more, else a fresh one."""
        # NOTE: references counted here: self.previous[i], the local `last` and getrefcount's argument. Any other
        # holder (the caller's tensor, a view, autograd's saved values) makes it 4 or more: then no reuse.
        # Reuse saves the page faults of a fresh output (1.7 ms for 64 MiB), as AccumulateGrad does for grads.
        last = self.previous[i]
        if last is not None and sys.getrefcount(last) <= 3 and _owner_unshared(last):
            return last
        shape, dtype = self.specs[i]
        # NOTE: a plan that does not reuse its outputs (the backward's) hands them to AccumulateGrad, which keeps a
        # gradient's array without copying only when it owns its memory: an aligned view would cost a copy.
        return aligned_empty(shape, dtype) if self.reuse else np.empty(shape, dtype)

    def handed_out(self, arrays: list) -> None:
        if self.reuse and not self.all_planned:
            for i, array in enumerate(arrays):
                if self.planned[i] is None:
                    self.previous[i] = array


def _owner_unshared(array: np.ndarray) -> bool:
    """Whether nothing but `array` holds the memory it views: numpy points a view of a view at the owner, so a
    caller's `out.numpy().T` or `[:, 0]` of an aligned output (itself a view of a byte arena) holds the arena, not
    `array`. Counted: array.base, the local and getrefcount's argument."""
    owner = array.base
    return owner is None or sys.getrefcount(owner) <= 3


class WholeGraphStep:
    """Every kernel of the graph in one numba call (nnc.codegen.whole_graph): reads the graph's tensor inputs and
    attributes, produces its outputs."""

    def __init__(self, kernels: list[Kernel], compiled):
        self.kernels, self.compiled = kernels, compiled
        self.inputs, self.outputs = compiled.arg_nodes, compiled.returned

    def run(self, arrays: list) -> dict:
        """{output node: Tensor} from one array per input node."""
        return dict(zip(self.outputs, map(Tensor._from_array, self.compiled.run(arrays))))


class ViewStep:
    """A reshape, permute or expand node run as its op's numpy forward on the array (a view where numpy can make
    one): no eager dispatch, no autograd bookkeeping, for a node the kernels around it read as an array. A source
    that is a folded view (nnc.passes.views) is made from its base first."""

    def __init__(self, node: Node, views: dict | None = None):
        from .codegen.scalar import op_and_attrs

        op, args, self.attrs = op_and_attrs(node)
        self.node, self.source, self.forward = node, args[0], op.forward
        self.nodes = [node]
        self.folded = (views or {}).get(self.source)

    def bind(self, sizes: dict, values: tuple) -> "ViewStep":
        step = copy.copy(self)
        step.attrs = evaluate(self.attrs, sizes)
        return step

    def run(self, env: dict, buffers=None) -> None:
        m = self.folded
        source = env[self.source]._data if m is None else m.apply(env[m.base]._data)
        env[self.node] = Tensor._from_array(self.forward(source, **self.attrs))


class InterpretedStep:
    """Nodes run one by one with the op table's numpy forwards (opaque kernels, and the fallback). A kernel's folded
    views (nnc.passes.views) are made first, as numpy views of their bases."""

    def __init__(self, nodes: list[Node], interpreter: Interpreter, reason: str, views: dict | None = None,
                 kernel: Kernel | None = None):
        self.nodes, self.interpreter, self.reason = nodes, interpreter, reason
        copies = copy_nodes(kernel) if kernel is not None else set()
        self.calls = [(node, node.args, node.kwargs) for node in nodes if node not in copies]
        self.views = list((views or {}).items())
        # a kernel whose product is stored into another value's buffer (passes/stores.py) does the same here
        self.stores = list(kernel.meta.get("stores", {}).values()) if kernel is not None else []
        self.allocates = set(kernel.outputs) if kernel is not None else set()

    def bind(self, sizes: dict, values: tuple) -> "InterpretedStep":
        step = copy.copy(self)
        step.calls = [(node, evaluate(args, sizes), evaluate(kwargs, sizes)) for node, args, kwargs in self.calls]
        return step

    def run(self, env: dict, buffers=None) -> None:
        interpreter = self.interpreter
        for view, m in self.views:
            env[view] = Tensor._from_array(m.apply(env[m.base]._data))
        for node, args, kwargs in self.calls:
            args, kwargs = map_arg(args, env.__getitem__), map_arg(kwargs, env.__getitem__)
            env[node] = getattr(interpreter, node.op)(node.target, args, kwargs)
        for store in self.stores:
            target = store.target
            if target in self.allocates:
                env[target] = Tensor._from_array(np.empty(tuple(target.meta["shape"]), target.meta["dtype"].np))
            store.view(env[target]._data)[...] = env.pop(store.value)._data


def _has_empty_value(nodes) -> bool:
    """Whether any of the nodes (or the tensors they read) has a dimension of size 0."""
    for node in nodes:
        for n in (node, *node.all_input_nodes):
            if 0 in tuple(n.meta.get("shape", ()) or ()):
                return True
    return False


def _single_output(output, returned: list, extra: list):
    """For a whole graph that returns just computed values, each once: a function making the graph's result from the
    numba call's arrays (no env dict, no map_arg on every call); None for any other output."""
    if extra:
        return None
    if isinstance(output, Node) and returned == [output]:
        return lambda results: Tensor._from_array(results[0])
    if type(output) is tuple and list(output) == returned:
        return lambda results: tuple(map(Tensor._from_array, results))
    leaves, spec = pytree.flatten(output)  # nested: (result, (values of attributes forward sets)), dicts, ...
    if leaves == returned and all(isinstance(leaf, Node) for leaf in leaves):
        return lambda results: pytree.unflatten(list(map(Tensor._from_array, results)), spec)
    return None


def _attr_reader(gm: GraphModule, path: str):
    """A cheap reader for a get_attr target: its owner is resolved once, the registry is read on every call
    (so a parameter or buffer rebound later, e.g. by load_state_dict(assign=True), is still seen)."""
    if not path:
        return lambda: gm
    owner_path, _, name = path.rpartition(".")
    owner = gm.get_submodule(owner_path) if owner_path else gm
    for registry in ("_parameters", "_buffers"):
        table = owner.__dict__.get(registry)
        if table is not None and name in table:
            return functools.partial(table.__getitem__, name)  # NOTE: no Python frame, where a lambda has one
    return lambda: getattr(owner, name)


# How many distinct sizes a plan with symbolic sizes keeps bound steps for (then it starts over), and for how many
# (the most recently used) each thread keeps its intermediate buffers: a generate loop meets a new size per token.
_MAX_BOUND_SIZES = 256
_KEPT_BUFFER_SIZES = 4


class BoundSteps:
    """A plan's steps and memory plan with its symbols evaluated for one call's sizes."""

    __slots__ = ("values", "steps", "memory")

    def __init__(self, values: tuple, steps: list, memory):
        self.values, self.steps, self.memory = values, steps, memory


def _allocate(steps: list, memory) -> list:
    """One thread's output buffers for the steps: arenas of the memory plan, viewed per kernel output."""
    arenas = memory.allocate() if memory is not None else []
    return [step.buffers(memory, arenas) if isinstance(step, KernelStep) else None for step in steps]


class Plan:
    """The steps for one graph; `run(*inputs)` returns what the graph returns.

    Three stages of nnc.pipeline build it, in order: `fuse` groups the graph's nodes into kernels, `plan_memory`
    gives their intermediate results reusable buffers, and `generate` compiles a step per kernel (or one numba
    function for the whole graph, which needs no buffers).

    whole_graph: False (the default) runs the graph kernel by kernel; None runs it as one numba function when it
    qualifies (nnc.codegen.whole_graph: small values, every node generated), else kernel by kernel; True asks for
    whole-graph mode and warns when it cannot be had. `whole_graph_reason` says why a graph runs kernel by kernel
    ("" when it runs whole).

    reuse_outputs: a kernel keeps its last graph outputs and writes the next call's into them when the caller has
    dropped them (no page faults for a fresh array); False hands out fresh arrays and keeps no reference, so a
    gradient output can be stolen by AccumulateGrad (which copies a buffer someone else holds).
    """

    def __init__(self, gm: GraphModule, use_codegen: bool = True, whole_graph: bool | None = False,
                 reuse_outputs: bool = True, shape_env=None):
        self.gm = gm
        # With symbolic sizes (nnc.symbolic) the steps are bound to each call's sizes: `run(..., sizes=)`.
        self.shape_env = shape_env
        self._bound: dict = {}
        self.use_codegen, self.requested_whole_graph, self.reuse_outputs = use_codegen, whole_graph, reuse_outputs
        self.interpreter = Interpreter(gm)
        self.kernels, self.memory = [], None
        self._local = threading.local()  # each thread's buffers (see _buffers)
        self.steps, self.fallbacks, self.cache_hits = [], [], 0
        self.whole_graph_reason = ("codegen off" if not use_codegen else
                                   "not asked for (whole-graph mode is for forwards without gradients)")
        self.placeholders = gm.graph.placeholders
        self.attrs = [(n, _attr_reader(gm, n.target)) for n in gm.graph.nodes if n.op == "get_attr"]
        self.output = gm.graph.output_node.args[0]
        self._whole_args = self._whole_extra = None  # how _run_whole finds its arguments (on its first call)
        self.compile_seconds = 0.0
        # numba's kernels run serially when the plan calls multi-threaded BLAS (see serial_numba_kernels); when it
        # runs its products on numba's threads, OpenBLAS runs on one (see one_thread_pool)
        self.serial_numba = self.one_pool = False
        # a whole graph of small products holds OpenBLAS to one thread while it runs (whole_graph_serial_blas)
        self.serial_blas = False

    def fuse(self) -> None:
        """The fuse stage: the graph's kernels, in execution order."""
        # NOTE: a pure kernel nobody reads is dead; an opaque one with no readers is there for its side effect.
        # Views fold into the indexing of generated kernels only: with codegen off nothing indexes them (and
        # nnc.explain's CUDA source for a CPU module is generated from such a plan's kernels).
        kernels = fuse(self.gm.graph, fold=self.use_codegen)
        if self.use_codegen:  # copies of matmul products into another layout: the matmul stores there itself
            kernels = fold_stores(kernels, self.gm.graph)
        self.kernels = [k for k in kernels if k.outputs or k.kind == "opaque" or k.meta.get("writes_into")]

    def plan_memory(self) -> None:
        """The memory stage: buffers for the kernels' intermediate results."""
        self.memory = plan_memory(self.kernels, self.gm.graph)

    def generate(self, on_kernel=None) -> None:
        """The codegen stage: a step per kernel (generated, a numpy view, or interpreted), or one whole-graph step.
        `on_kernel(count)` is told as kernels are done (the compile's progress line)."""
        start = time.perf_counter()
        use_codegen, requested = self.use_codegen, self.requested_whole_graph
        whole = self._whole_graph_step(requested) if use_codegen and requested is not False else None
        if whole is not None:
            self.steps = [whole]
            self.memory = None  # one numba function holds its intermediates itself
            if on_kernel is not None:
                on_kernel(len(self.kernels))
        else:
            self.steps = []
            for kernel in self.kernels:
                self.steps.append(self._step_for(kernel, use_codegen))
                if on_kernel is not None:
                    on_kernel(1)
            self._buffers()  # the compiling thread's, allocated now rather than on its first call
        self.compile_seconds += time.perf_counter() - start

    def _buffers(self, bound=None) -> list:
        """This thread's output buffers, one entry per step (None for steps that need none).

        NOTE: intermediate buffers are per thread: two threads running one plan at once (BLAS and numba release
        the GIL) would otherwise write each other's intermediates. A thread allocates its arenas on its first call
        (with symbolic sizes, its first call with those sizes)."""
        if bound is not None:
            table = getattr(self._local, "by_sizes", None)
            if table is None:
                table = self._local.by_sizes = {}
            buffers = table.pop(bound.values, None)
            if buffers is None:
                buffers = _allocate(bound.steps, bound.memory)
                if len(table) >= _KEPT_BUFFER_SIZES:  # the least recently used sizes' arenas go
                    del table[next(iter(table))]
            table[bound.values] = buffers
            return buffers
        buffers = getattr(self._local, "buffers", None)
        if buffers is None:
            if self.shape_env is not None:
                return []  # allocated per call's sizes
            buffers = self._local.buffers = _allocate(self.steps, self.memory)
        return buffers

    def bound(self, values: tuple) -> "BoundSteps":
        """The steps and buffers plan for one call's symbol values (made once per distinct sizes)."""
        bound = self._bound.get(values)
        if bound is None:
            if len(self._bound) >= _MAX_BOUND_SIZES:
                self._bound.clear()
                self._local = threading.local()
            sizes = dict(zip(self.shape_env.names, values))
            steps = [step.bind(sizes, values) if hasattr(step, "bind") else step for step in self.steps]
            memory = self.memory.bind(sizes) if self.memory is not None else None
            bound = self._bound[values] = BoundSteps(values, steps, memory)
        return bound

    @property
    def whole_graph(self) -> bool:
        return bool(self.steps) and isinstance(self.steps[0], WholeGraphStep)

    def _whole_graph_step(self, requested: bool | None):
        from .codegen.whole_graph import WHOLE_GRAPH_MAX_KERNELS, WholeGraphUnsupported, compile_graph

        if _has_empty_value(self.gm.graph.nodes):
            self.whole_graph_reason = "size-0 values"
            return None
        if requested is None and len(self.kernels) > WHOLE_GRAPH_MAX_KERNELS:
            self.whole_graph_reason = (f"{len(self.kernels)} kernels (> {WHOLE_GRAPH_MAX_KERNELS}: one numba function "
                                       f"would take longer to compile than it saves; whole_graph=True asks for it)")
            return None
        try:
            compiled = compile_graph(self.kernels, self.gm.graph, name=self.gm._get_name(), requested=requested)
        except WholeGraphUnsupported as reason:
            self.whole_graph_reason = str(reason)
            if requested:
                warnings.warn(f"nnc: whole-graph mode is not available for {self.gm._get_name()} ({reason}); "
                              f"running it kernel by kernel", RuntimeWarning, stacklevel=4)
            return None
        except Exception as error:  # never a wrong answer: run kernel by kernel instead
            self.whole_graph_reason = f"{type(error).__name__}: {error}"
            warnings.warn(f"nnc: whole-graph compilation of {self.gm._get_name()} failed ({self.whole_graph_reason});"
                          f" running it kernel by kernel", RuntimeWarning, stacklevel=4)
            return None
        self.whole_graph_reason = ""
        self.cache_hits += compiled.cache_hit
        for kernel in self.kernels:
            kernel.meta["source"] = compiled.kernel_sources.get(kernel.name, "")
        from .codegen.cpu import whole_graph_serial_blas

        self.serial_blas = whole_graph_serial_blas(self.kernels)
        return WholeGraphStep(self.kernels, compiled)

    def _step_for(self, kernel: Kernel, use_codegen: bool):
        view = view_node(kernel) if use_codegen else None
        if view is not None:
            return ViewStep(view, kernel.meta.get("views"))
        views = kernel.meta.get("views")
        if kernel.kind == "opaque" or not use_codegen:
            return InterpretedStep(kernel.nodes, self.interpreter, "opaque" if use_codegen else "codegen off", views)
        if _has_empty_value(kernel.nodes):  # nothing to loop over; numpy gets size-0 edge cases right
            return InterpretedStep(kernel.nodes, self.interpreter, "size-0 values", views, kernel)
        from .codegen.cpu import compile_kernel

        try:
            compiled = compile_kernel(kernel)
        except Exception as error:  # never a wrong answer: interpret this group instead
            reason = f"{type(error).__name__}: {error}"
            if self.shape_env is not None and has_symbols([n.meta.get("shape") for n in kernel.nodes]):
                raise DynamicSizeError(f"kernel {kernel.name} has no code for symbolic sizes ({reason})") from error
            self.fallbacks.append((kernel.name, reason))
            warnings.warn(f"nnc: kernel {kernel.name} failed to compile ({reason}); running it with the "
                          f"interpreter", RuntimeWarning, stacklevel=4)
            return InterpretedStep(kernel.nodes, self.interpreter, reason, views, kernel)
        self.cache_hits += bool(getattr(compiled, "cache_hit", False))
        kernel.meta["source"] = getattr(compiled, "source", "")
        if kernel.kind == "matmul" and _numba_threads() > 1:
            self._note_blas_threads(kernel)
        return KernelStep(kernel, compiled, self.reuse_outputs)

    def _note_blas_threads(self, kernel: Kernel) -> None:
        """Which pool the plan runs on, after a matmul kernel: products on OpenBLAS's own threads make numba's
        kernels serial (serial_numba_kernels); products on numba's threads set OpenBLAS to one (one_thread_pool)."""
        from .codegen.cpu import blas_threads_used

        used = blas_threads_used(kernel, kernel.meta["source"])
        self.serial_numba |= used == "openblas"
        self.one_pool |= used == "numba"

    def run(self, *inputs, sizes: tuple = ()):
        """What the graph returns for these inputs; `sizes` are the values of the plan's symbols for this call."""
        if self.whole_graph:
            return self._run_whole(inputs)
        env: dict = {}
        for node, value in zip(self.placeholders, inputs):
            env[node] = value
        for node, read in self.attrs:
            env[node] = read()
        if self.shape_env is not None:
            bound = self.bound(tuple(sizes))
            steps, buffers = bound.steps, self._buffers(bound)
        else:
            steps, buffers = self.steps, self._buffers()
        if self.serial_numba:
            with serial_numba_kernels():
                self._run_steps(steps, buffers, env)
        elif self.one_pool:
            with one_thread_pool():
                self._run_steps(steps, buffers, env)
        else:
            self._run_steps(steps, buffers, env)
        return map_arg(self.output, env.__getitem__)

    def _run_steps(self, steps, buffers, env) -> None:
        if _profiles:  # nnc.profile is on: the same loop, each step timed
            _profiled_steps(self, steps, buffers, env)
        else:
            for step, buffer in zip(steps, buffers):
                step.run(env, buffer)

    def _prepare_whole(self, step) -> None:
        """Where the whole-graph call's arguments and extra outputs come from (found once, on the first run)."""
        if self._whole_args is None:  # _whole_args is set last: another thread may test it meanwhile
            extra = [n for n in nodes_in(self.output) if n.op in ("placeholder", "get_attr")]
            self._whole_extra = list(zip(extra, self._sources_of(extra)))
            self._whole_single = _single_output(self.output, step.outputs, extra)
            self._whole_args = self._sources_of(step.inputs)

    def direct_runner(self):
        """For a whole-graph plan returning only computed tensors: a function of the input tensors doing what run
        does with the least Python between the caller and the numba call (a compiled module's no-grad fast path);
        None for any other plan."""
        if not self.whole_graph:
            return None
        step = self.steps[0]
        self._prepare_whole(step)
        single, sources, compiled = self._whole_single, self._whole_args, step.compiled
        if single is None:
            return None
        if self.serial_blas:  # its call sits inside one_thread_pool: _run_whole has it
            return self._run_whole

        def run(inputs):
            if _profiles:
                return self._run_whole(inputs)
            return single(compiled.run([inputs[k]._data if read is None else read()._data for k, read in sources]))
        return run

    def _run_whole(self, inputs):
        step = self.steps[0]
        self._prepare_whole(step)
        arrays = [inputs[k]._data if read is None else read()._data for k, read in self._whole_args]
        with one_thread_pool() if self.serial_blas else contextlib.nullcontext():
            if _profiles:
                env, results = _profiled_whole(self, step, arrays), None
            else:
                results = step.compiled.run(arrays)
        if results is not None:
            if self._whole_single is not None:  # the graph returns one computed tensor (or a tuple of them)
                return self._whole_single(results)
            env = dict(zip(step.outputs, map(Tensor._from_array, results)))
        for node, (k, read) in self._whole_extra:  # outputs that are inputs or attributes
            env[node] = inputs[k] if read is None else read()
        return map_arg(self.output, env.__getitem__)

    def _sources_of(self, nodes) -> list:
        """(placeholder position, None) or (None, attribute reader) for each placeholder / get_attr node."""
        position = {node: k for k, node in enumerate(self.placeholders)}
        readers = dict(self.attrs)
        return [(position.get(n), readers.get(n)) for n in nodes]
