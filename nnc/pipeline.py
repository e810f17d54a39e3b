"""The compiler's stages, in order: nnc.compile, nnc.explain and `nnc dump` all run this one list.

    trace -> shapes -> decompose -> functionalize -> simplify -> split -> autodiff -> simplify_backward
          -> fuse -> memory -> codegen

A `Compilation` holds what the stages make of one module for one set of example arguments; `run_stages` fills it
in, stage by stage, up to a chosen stage or to the end. After codegen, `Compilation.run` runs the result. What the
`nnc dump --stage NAME` command prints is read from a Compilation stopped after that stage, so it is what compile
runs. A stage that fails raises PipelineError naming itself and the stages before it (as torch.fx's PassManager
does). Observers (`observing`) see the Compilation after every stage; NNC_DEBUG uses the same hook.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from runtime import amp
from runtime.autograd import grad_mode
from runtime.nn import Module

from runtime.utils import _pytree as pytree
from .attribute_guards import recording
from .collector import full_collections_deferred
from .compiled_graph import CompiledGraph
from .graph_module import GraphModule
from .passes import functionalize
from .passes.decompose import decompose
from .passes.shapes import propagate_shapes
from .passes.slices import hoist_slices
from .passes.simplify import cse, dce, fold_broadcasts, fold_constants, remove_noops
from .passes.views import copy_strided_reshapes
from .passes.winograd import rewrite_winograd
from .split import SplitGraph
from .symbolic import DynamicSizeError, ShapeEnv, has_symbols
from .trace import Tracer, TraceError, symbolic_trace


def debug_level() -> int:
    """NNC_DEBUG=1: recompiles and fallbacks; 2: graphs after each stage and pass; 3: kernel sources; 4: all."""
    try:
        return int(os.environ.get("NNC_DEBUG", "0"))
    except ValueError:
        return 0


def debug(level: int, message: str) -> None:
    if debug_level() >= level:
        print(f"[nnc] {message}", file=sys.stderr)


# -- the cleanup passes of the two simplify stages ------------------------------------------------------

FORWARD_CLEANUPS = [("remove_noops", remove_noops), ("fold_broadcasts", fold_broadcasts), ("cse", cse),
                    ("fold_constants", fold_constants), ("hoist_slices", hoist_slices), ("cse", cse),
                    ("dce", dce),
                    ("copy_strided_reshapes", copy_strided_reshapes)]
BACKWARD_CLEANUPS = [("remove_noops", remove_noops), ("fold_broadcasts", fold_broadcasts), ("cse", cse),
                     ("dce", dce), ("copy_strided_reshapes", copy_strided_reshapes)]


def run_passes(gm: GraphModule, passes, label: str) -> GraphModule:
    """Run named `gm -> gm` passes in order, linting after each and printing the graph under NNC_DEBUG>=2."""
    for name, fn in passes:
        try:
            gm = fn(gm)
            gm.graph.lint(gm)
        except Exception as error:
            error.add_note(f"nnc: in pass {name!r} of {label}")
            raise
        if debug_level() >= 2:  # printing a graph of thousands of nodes takes longer than the pass
            debug(2, f"{label} after {name}:\n{gm.graph}")
    return gm


# -- tracing with graph breaks --------------------------------------------------------------------------


class GraphBreak:
    """A submodule that could not be traced: it runs eagerly, as a call in the compiled graph."""

    def __init__(self, path: str, reason: str):
        self.path, self.reason = path, reason

    def __repr__(self) -> str:
        return f"GraphBreak({self.path!r}: {self.reason})"


def trace_for_compile(module: Module, concrete: dict, examples: dict, max_breaks: int = 16,
                      dynamic: dict | None = None, shape_env: ShapeEnv | None = None):
    """The traced graph with sizes specialized to the examples, and the graph breaks it needed.

    A submodule whose forward cannot be traced (data-dependent Python control flow) is recorded as a call and runs
    eagerly; the rest of the model still compiles. The root's own forward has no such way out: its TraceError is
    raised. With dynamic dims (placeholder name -> dims) sizes are symbolic there (nnc.symbolic), and a graph break
    is an error: an eager part's sizes are not known symbolically."""
    breaks: list[GraphBreak] = []
    while True:
        tracer = Tracer(leaf_paths=[b.path for b in breaks])
        tracer.replays_attributes = True
        try:
            traced = symbolic_trace(module, concrete_args=concrete or None, tracer=tracer, example_inputs=examples,
                                    dynamic=dynamic, shape_env=shape_env)
            return traced, breaks
        except TraceError as error:
            path = getattr(error, "module_path", "")
            if not path or len(breaks) >= max_breaks or dynamic:
                raise
            breaks.append(GraphBreak(path, str(error)))
            debug(1, f"graph break at {path}: {error}")


# -- what the stages make ------------------------------------------------------------------------------


class Compilation:
    """What the stages make of `module` for one set of arguments, filled in stage by stage.

    examples: argument name -> example value (a tensor, or tuples, lists and dicts holding tensors); the graph's
    placeholders are the tensors inside them, in order. concrete: the arguments holding no tensor, fixed into the
    graph. With gradients, a graph with opaque nodes (graph breaks, random draws) is split: the pieces between
    opaque nodes compile with their own backwards, the opaque nodes run eagerly (nnc.split)."""

    def __init__(self, module: Module, concrete: dict, examples: dict, needs_grad: bool, codegen: bool = True,
                 whole_graph: bool | None = None, dynamic: dict | None = None, target: str = "cpu"):
        self.module, self.concrete, self.examples = module, concrete, examples
        self.target = target  # "cpu" or "cuda": where the plans run (the graphs and kernels are the same)
        self.needs_grad, self.codegen, self.whole_graph = needs_grad, codegen, whole_graph
        self.autocast = amp.state.dtype  # the caller's autocast: the graph gets its casts (decompose)
        # dynamic: placeholder name -> dims whose sizes are symbols (nnc.symbolic); shape_env holds the symbols and
        # the guards the stages' decisions on them recorded
        self.dynamic = {name: tuple(dims) for name, dims in (dynamic or {}).items() if dims}
        self.shape_env: ShapeEnv | None = ShapeEnv() if self.dynamic else None
        self._guard = None
        if self.dynamic:
            self.whole_graph = False  # one numba function for the whole graph is generated for static sizes
        self.tensors = pytree.tensor_leaves(list(examples.values()))
        self.traced: GraphModule | None = None    # trace (shapes fills in its meta)
        self.graph_breaks: list[GraphBreak] = []
        self.forward: GraphModule | None = None   # decompose, then functionalize and simplify
        self.writes: list[functionalize.Write] = []  # functionalize: what forward writes in place, in order
        # trace: (module path, name) of each plain attribute forward sets to a tensor; the graph returns
        # (result, (their values...)) and `run` sets them (nnc.trace.Tracer.set_attribute)
        self.set_attributes: list[tuple[str, str]] = []
        self.returned_inputs: dict[int, int] = {}   # output leaf position -> input written and returned as is
        self.opaque: list = []                    # split: the forward's nodes that run eagerly
        self.main: CompiledGraph | None = None    # split: the forward compiled whole ...
        self.split: SplitGraph | None = None      # ... or in pieces around its eager nodes
        self.done: list[str] = []                 # the stages run so far
        self.seconds: dict[str, float] = {}       # stage name -> seconds it took
        self.fingerprint: str | None = None       # trace: what decides the kernels, hashed (see _fingerprint)
        # trace, shapes, decompose: (module path, name) -> the plain attribute value the model's code read there
        self.attribute_reads: dict = {}

    @property
    def compile_seconds(self) -> float:
        return sum(self.seconds.values())

    @property
    def graphs(self) -> list[CompiledGraph]:
        if self.main is not None:
            return [self.main]
        return self.split.compiled_graphs if self.split is not None else []

    @property
    def plans(self) -> list:
        return [p for g in self.graphs for p in g.plans]

    forward_plan = property(lambda self: self.main.forward_plan if self.main else None)
    training_plan = property(lambda self: self.main.training_plan if self.main else None)
    backward_plan = property(lambda self: self.main.backward_plan if self.main else None)
    backward = property(lambda self: self.main.backward if self.main else None)

    def direct_runner(self):
        """run(tensors, wants_grad=False) as a function of the tensors with the least Python around one numba call,
        for a compilation whose forward is one whole-graph plan writing no input; None otherwise."""
        if self.main is None or self.writes:
            return None
        run = self.main.direct_runner()
        if run is None or not self.set_attributes:
            return run
        return lambda tensors: self._set_attributes_of(run(tensors))

    def run(self, tensors: list, wants_grad: bool):
        """What the compiled module returns for these input tensors (after the codegen stage); the tensors forward
        writes in place get their new values, and the attributes it sets theirs."""
        result = (self.main or self.split).run(tensors, wants_grad)
        if not self.writes and not self.set_attributes:
            return result
        user = result
        if self.writes:
            user, values = result
            functionalize.apply_writes(self.writes, values, tensors, self.forward)
        if self.returned_inputs:
            leaves, spec = pytree.flatten(user)
            for position, k in self.returned_inputs.items():
                leaves[position] = tensors[k]
            user = pytree.unflatten(leaves, spec)
        return self._set_attributes_of(user) if self.set_attributes else user

    def _set_attributes_of(self, result):
        """The module's result, from the graph's (result, values of the attributes forward sets): each of those set
        on its module, as eager forward leaves it."""
        user, values = result
        for (path, name), value in zip(self.set_attributes, values):
            setattr(self.module.get_submodule(path), name, value)
        return user

    def accepts(self, tensors: list) -> bool:
        """Whether this compilation serves a call with these input tensors: with symbolic sizes, whether their sizes
        satisfy the guards its stages recorded (the caller has checked everything else)."""
        if self.shape_env is None:
            return True
        if self._guard is None:
            self._guard = self.shape_env.guard_function()
        return self._guard(self.main.sizes_of(tensors))

    def graph_names(self) -> list[str]:
        """A label per compiled graph: the module's name, or each piece's."""
        if self.split is not None:
            return [piece.name for piece in self.split.pieces]
        return [self.forward._get_name()] if self.main is not None else []


# -- the stages -----------------------------------------------------------------------------------------


def _trace(c: Compilation) -> None:
    # NOTE: forward is traced in the caller's grad mode (the pipeline runs under no_grad), so a no_grad block in
    # forward is seen as one: its values are detached in the graph, as eager mode leaves them without history
    with _read_only(c.module.parameters()), grad_mode.set_grad_enabled(c.needs_grad):
        c.traced, c.graph_breaks = trace_for_compile(c.module, c.concrete,
                                                     pytree.replace_tensors(c.examples, _copies(c.tensors)),
                                                     dynamic=c.dynamic, shape_env=c.shape_env)
    c.set_attributes = c.traced.graph.meta.get("set_attributes", [])
    if c.codegen and c.target == "cpu":
        from .codegen.compile_workers import start_early

        c.fingerprint = _fingerprint(c)
        if c.needs_grad or c.whole_graph is False:  # (a forward without gradients may compile whole: no helpers)
            ops = sum(1 for n in c.traced.graph.nodes if n.op in ("call_function", "call_method", "call_module"))
            start_early(c.fingerprint, ops * (2 if c.needs_grad else 1))


def _fingerprint(c: Compilation) -> str:
    """What decides a compilation's kernels, hashed: the traced code, the inputs' and parameters' shapes and dtypes,
    and the options. A hint of whether its kernels are on disk (codegen.cache.seen), so no more than that."""
    parts = [c.traced.code, c.needs_grad, c.whole_graph, sorted(c.dynamic.items()),
             [(tuple(t.shape), str(t.dtype)) for t in c.tensors],
             [(name, tuple(p.shape), str(p.dtype)) for name, p in c.module.named_parameters()]]
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def _shapes(c: Compilation) -> None:
    meta = c.traced.graph.meta
    captured = [t for path, t in meta.get("constants", {}).items() if path not in meta.get("fresh_constants", ())]
    symbolic = {n: n.meta["shape"] for n in c.traced.graph.placeholders if has_symbols(n.meta.get("shape"))}
    with _read_only([*c.module.parameters(), *captured]):
        propagate_shapes(c.traced, *_copies(c.tensors))
    for node, shape in symbolic.items():  # shape propagation ran at the hint sizes; the inputs' sizes are symbols
        node.meta["shape"] = shape


@contextlib.contextmanager
def _read_only(parameters):
    """Parameters (and tensors captured from outside the model) cannot be written while tracing and shape
    propagation run the model (those restore buffers and copy inputs, but copying every parameter would cost a
    model's size): a forward that writes one fails to compile and runs eagerly instead of being written twice."""
    # NOTE: numpy refuses the write itself ("assignment destination is read-only"), so nothing is half done
    # NOTE: device arrays (CUDA parameters) have no write flag; nothing guards them
    arrays = [p._data for p in parameters if isinstance(p._data, np.ndarray) and p._data.flags.writeable]
    for array in arrays:
        array.flags.writeable = False
    try:
        yield
    except (RuntimeError, ValueError) as error:
        if "read-only" in str(error) or "written-to tensor" in str(error):
            error.add_note("nnc: parameters are read-only while compiling; a forward that writes one runs eagerly")
        raise
    finally:
        # NOTE: numpy makes a view writeable only while its base is, so bases first (a captured tensor and a view
        # of it can come in either order)
        for array in sorted(arrays, key=lambda a: a.base is not None):
            array.flags.writeable = True


def _copies(tensors: list) -> list:
    """Detached copies of the example tensors (one per distinct tensor): tracing and shape propagation run the
    model on them, and an in-place op in forward must not write the caller's tensors while compiling."""
    memo: dict = {}
    return [memo.setdefault(id(t), t.detach().clone()) for t in tensors]


def _decompose(c: Compilation) -> None:
    c.forward = decompose(c.traced)


def _functionalize(c: Compilation) -> None:
    c.writes = functionalize.writes_as_outputs(c.forward, c.needs_grad)
    names = [n.name for n in c.forward.graph.placeholders if "shape" in n.meta]
    c.returned_inputs = {position: names.index(name)
                         for position, name in c.forward.graph.meta.get("returned_inputs", {}).items()}


def _simplify(c: Compilation) -> None:
    # Winograd convolution has CPU kernels only; it rewrites before autodiff, so the backward derives from it
    rewrites = [("rewrite_winograd", rewrite_winograd)] if c.target == "cpu" else []
    c.forward = run_passes(c.forward, rewrites + FORWARD_CLEANUPS, "forward")


def _split(c: Compilation) -> None:
    c.opaque = [n for n in c.forward.graph.nodes if "opaque_reason" in n.meta]
    if c.shape_env is not None and c.opaque:  # an eager node's output sizes are not known symbolically
        eager = ", ".join(f"{n.name} ({n.meta['opaque_reason']})" for n in c.opaque)
        raise DynamicSizeError(f"dynamic sizes need every node compiled, and these run eagerly: {eager}")
    requiring = tuple(t.requires_grad for t in c.tensors)
    tensor_inputs = [n for n in c.forward.graph.placeholders if "shape" in n.meta]
    written = {tensor_inputs[w.where] for w in c.writes if w.kind == "input"}
    if c.needs_grad and c.opaque:
        c.split = SplitGraph(c.forward, requiring)
        for piece in c.split.pieces:
            piece.compiled = CompiledGraph(piece.gm, piece.needs_grad, piece.wants_grad,
                                           written_inputs=[k for k, n in enumerate(piece.inputs) if n in written],
                                           target=c.target)
    else:
        c.main = CompiledGraph(c.forward, c.needs_grad, requiring,
                               written_inputs=[w.where for w in c.writes if w.kind == "input"], shape_env=c.shape_env,
                               target=c.target)


def _autodiff(c: Compilation) -> None:
    for graph in c.graphs:
        graph.differentiate()
        if graph.backward_error:
            debug(1, f"no compiled backward: {graph.backward_error}; gradients run through eager autograd")


def _simplify_backward(c: Compilation) -> None:
    for graph, name in zip(c.graphs, c.graph_names()):
        graph.finish_backward(lambda gm: run_passes(gm, BACKWARD_CLEANUPS, f"{name} backward"))


def _fuse(c: Compilation) -> None:
    for graph in c.graphs:
        graph.make_plans(c.codegen, c.whole_graph)
    for plan in c.plans:
        plan.fuse()


def _memory(c: Compilation) -> None:
    for plan in c.plans:
        plan.plan_memory()


def _codegen(c: Compilation) -> None:
    progress = Progress._showing if Progress._showing is not None and Progress._showing.c is c else None
    _precompile_in_helpers(c.plans)
    for plan in c.plans:
        plan.generate(on_kernel=progress.kernel_compiled if progress is not None else None)
    if c.shape_env is not None:
        c.shape_env.frozen = True  # what the variant decided on its sizes is complete: its guards
    if c.fingerprint is not None:
        from .codegen import cache

        cache.mark_seen(c.fingerprint)


def _precompile_in_helpers(plans) -> None:
    """Hand the kernels that run kernel by kernel and that numba has not compiled yet to helper processes
    (nnc.codegen.compile_workers), so that a cold compile uses more than one core. Whole-graph candidates are left
    alone: their kernels are compiled into the graph's function instead."""
    from .codegen.compile_workers import precompile, worker_count
    from .codegen.cpu import generate
    from .executor import _has_empty_value

    if worker_count() == 0:
        return
    generated = []
    for plan in plans:
        if not plan.use_codegen or plan.requested_whole_graph is not False or getattr(plan, "target", "cpu") != "cpu":
            continue
        for kernel in plan.kernels:
            if kernel.kind == "opaque" or _has_empty_value(kernel.nodes):
                continue
            try:
                kernel.meta["generated"] = generate(kernel)  # compile_kernel takes it from there
                generated.append(kernel.meta["generated"])
            except Exception:  # noqa: BLE001  the plan reports it when it compiles the kernel itself
                continue
    precompile(generated)


@dataclass(frozen=True)
class Stage:
    name: str
    summary: str  # one line: what the stage makes (the CLI's help and docs/architecture.md show it)
    run: Callable[[Compilation], None]


STAGES = (
    Stage("trace", "the graph the tracer records, sizes specialized to the example inputs", _trace),
    Stage("shapes", "the traced graph with each node's shape and dtype", _shapes),
    Stage("decompose", "primitive ops from runtime's op table (opaque nodes where that is impossible)", _decompose),
    Stage("functionalize", "in-place writes to inputs and buffers as extra outputs, copied in after the run",
          _functionalize),
    Stage("simplify", "the forward after no-op removal, CSE, constant folding and dead-code removal", _simplify),
    Stage("split", "with gradients and opaque nodes: compiled pieces between the nodes that run eagerly", _split),
    Stage("autodiff", "the backward graph derived for the inputs and parameters that require grad", _autodiff),
    Stage("simplify_backward", "the backward after no-op removal, CSE and dead-code removal", _simplify_backward),
    Stage("fuse", "kernels: groups of nodes run as one, and why each boundary is there", _fuse),
    Stage("memory", "buffers for the kernels' intermediate results, reused once a value is dead", _memory),
    Stage("codegen", "the generated numba source of every kernel", _codegen),
)
STAGE_NAMES = tuple(stage.name for stage in STAGES)


class PipelineError(RuntimeError):
    """A stage failed: names it and the stages that ran before it; the original error is its __cause__."""

    def __init__(self, stage: str, done: list[str], cause: BaseException):
        notes = "".join(f"; {note}" for note in getattr(cause, "__notes__", ()))
        after = f"after {', '.join(done)}" if done else "the first stage"
        super().__init__(f"stage {stage!r} failed ({after}): {type(cause).__name__}: {cause}{notes}")
        self.stage, self.done, self.cause = stage, list(done), cause


_observers: list[Callable[[str, Compilation], None]] = []


@contextlib.contextmanager
def observing(callback: Callable[[str, Compilation], None]):
    """Within the block, `callback(stage name, compilation)` runs after every stage of every compilation."""
    _observers.append(callback)
    try:
        yield
    finally:
        _observers.remove(callback)


def run_stages(c: Compilation, until: str | None = None) -> Compilation:
    """Run the stages `c` has not run yet, in order, up to and including `until` (default: all of them)."""
    if until is not None and until not in STAGE_NAMES:
        raise ValueError(f"unknown stage {until!r}; the stages are {', '.join(STAGE_NAMES)}")
    last = STAGE_NAMES.index(until) if until is not None else len(STAGES) - 1
    progress = Progress.start(c)
    try:
        with full_collections_deferred():
            _run_each(c, STAGES[len(c.done):last + 1], progress)
    finally:
        if progress is not None:
            progress.close(failed=len(c.done) <= last)
    return c


def _run_each(c: Compilation, stages: list, progress: Progress | None) -> None:
    for stage in stages:
        if progress is not None:
            progress.update(stage.name)
        start = time.perf_counter()
        try:
            with _autocast_for(stage.name, c.autocast), _attributes_recorded(stage.name, c):
                stage.run(c)
        except Exception as error:
            raise PipelineError(stage.name, c.done, error) from error
        c.seconds[stage.name] = time.perf_counter() - start
        c.done.append(stage.name)
        _report(stage.name, c)


AUTOCAST_STAGES = ("trace", "shapes", "decompose")  # where the graph's ops are made, casts included
RECORDING_STAGES = ("trace", "shapes", "decompose")  # where the model's own code runs


def _attributes_recorded(stage: str, c: Compilation):
    """Where the model's code runs, the plain attributes it reads are recorded (nnc.attribute_guards): a compiled
    variant is reused only while they hold the same values."""
    return recording(c.module, c.attribute_reads) if stage in RECORDING_STAGES else contextlib.nullcontext()


@contextlib.contextmanager
def _autocast_for(stage: str, dtype):
    """The caller's autocast while the graph's ops are made, none after: the casts are then in the graph, and the
    backward's matmuls, like eager's, run in the dtypes the forward gave them."""
    previous, amp.state.dtype = amp.state.dtype, dtype if stage in AUTOCAST_STAGES else None
    try:
        yield
    finally:
        amp.state.dtype = previous


# -- compile progress on a terminal ---------------------------------------------------------------------


PROGRESS_AFTER = 2.0   # seconds a compile runs before it shows what it is doing (on a terminal's stderr)
PROGRESS_EVERY = 0.25  # seconds between redraws of the status line while a stage runs


class Progress:
    """A status line on stderr for a compile that takes long: the module, the stage, kernels compiled of the total
    and the time so far, redrawn in place ("\r") by a timer thread and at every stage and kernel, then a last line
    once the compile ends. Only when stderr is a terminal (NNC_PROGRESS=1 forces it, NNC_PROGRESS=0 turns it off),
    and only from PROGRESS_AFTER seconds into the compile: a short compile prints nothing."""

    _showing: "Progress | None" = None  # one status line at a time (a compile inside a compile stays quiet)

    @classmethod
    def start(cls, c: Compilation) -> "Progress | None":
        setting = os.environ.get("NNC_PROGRESS", "")
        if setting == "0" or cls._showing is not None:
            return None
        stream = sys.stderr
        if setting != "1":
            try:
                if stream is None or not stream.isatty():
                    return None
            except (AttributeError, ValueError):  # no isatty, or a closed stream
                return None
        progress = cls(c, stream)
        cls._showing = progress
        return progress

    def __init__(self, c: Compilation, stream):
        self.c, self.stream = c, stream
        self.began = time.perf_counter()
        self.stage, self.kernels_done, self.kernels_total = "", 0, 0
        self.shown, self.width = False, 0
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._tick, name="nnc-compile-progress", daemon=True)
        self.thread.start()

    def _tick(self) -> None:
        if self.stopped.wait(max(PROGRESS_AFTER - (time.perf_counter() - self.began), 0.0)):
            return
        while not self.stopped.is_set():
            self.draw()
            self.stopped.wait(PROGRESS_EVERY)

    def update(self, stage: str | None = None) -> None:
        """A stage begins (stage=its name) or a kernel was compiled; redrawn once the compile has run long enough."""
        if stage is not None:
            self.stage = stage
            if stage == "codegen":
                self.kernels_total = sum(len(plan.kernels) for plan in self.c.plans)
        if time.perf_counter() - self.began >= PROGRESS_AFTER:
            self.draw()

    def kernel_compiled(self, count: int = 1) -> None:
        self.kernels_done += count
        self.update()

    def line(self) -> str:
        name = type(self.c.module).__name__
        stage = f"stage {self.stage} ({STAGE_NAMES.index(self.stage) + 1}/{len(STAGES)})" if self.stage else "starting"
        kernels = f", kernel {self.kernels_done}/{self.kernels_total}" if self.stage == "codegen" else ""
        return f"nnc: compiling {name}: {stage}{kernels}, {time.perf_counter() - self.began:.1f} s"

    def draw(self, text: str | None = None, end: str = "") -> None:
        with self.lock:
            text = self.line() if text is None else text
            try:
                self.stream.write("\r" + text + " " * max(self.width - len(text), 0) + end)
                self.stream.flush()
            except (OSError, ValueError):  # the terminal went away: stop drawing
                self.stopped.set()
            self.shown, self.width = True, len(text)

    def close(self, failed: bool) -> None:
        self.stopped.set()
        self.thread.join()
        if Progress._showing is self:
            Progress._showing = None
        if not self.shown:
            return
        name, seconds = type(self.c.module).__name__, time.perf_counter() - self.began
        if failed:
            self.draw(f"nnc: compiling {name} stopped at stage {self.stage} after {seconds:.1f} s", end="\n")
        else:
            kernels = f", {self.kernels_total} kernels" if self.kernels_total else ""
            self.draw(f"nnc: compiled {name} in {seconds:.1f} s ({len(self.c.done)} stages{kernels})", end="\n")


def compile_arguments(module: Module, concrete: dict, examples: dict, needs_grad: bool, codegen: bool = True,
                      whole_graph: bool | None = None, dynamic: dict | None = None,
                      target: str = "cpu") -> Compilation:
    """Every stage, for these arguments: a Compilation ready to run on the target ("cpu" or "cuda")."""
    return run_stages(Compilation(module, concrete, examples, needs_grad, codegen=codegen, whole_graph=whole_graph,
                                  dynamic=dynamic, target=target))


# -- what a stage made, as text -----------------------------------------------------------------------


def stage_graphs(c: Compilation, stage: str) -> list[tuple[str, GraphModule]]:
    """(label, graph module) of each graph a graph-making stage left (trace .. simplify_backward)."""
    if stage in ("trace", "shapes"):
        return [("traced", c.traced)]
    if stage in ("decompose", "functionalize", "simplify"):
        return [("forward", c.forward)]
    if stage == "split":
        return [(name, graph.forward) for name, graph in zip(c.graph_names(), c.graphs)]
    if stage in ("autodiff", "simplify_backward"):
        return [(f"{name} backward", graph.backward.gm) for name, graph in zip(c.graph_names(), c.graphs)
                if graph.backward is not None]
    raise ValueError(f"stage {stage!r} makes kernels, not graphs")


def _report(stage: str, c: Compilation) -> None:
    for callback in list(_observers):
        callback(stage, c)
    if stage in ("fuse", "memory"):
        return
    if stage == "codegen":
        if debug_level() >= 3:
            for plan in c.plans:
                for kernel in plan.kernels:
                    debug(3, f"kernel {kernel.name} ({kernel.kind}):\n{kernel.meta.get('source') or '(no source)'}")
        return
    if debug_level() >= 2:
        for label, gm in stage_graphs(c, stage):
            debug(2, f"{label} after stage {stage}:\n{gm.graph}")
