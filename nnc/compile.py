"""nnc.compile: a Module that runs a model through the compiler, guarded, with a compiled backward and fallbacks."""
from __future__ import annotations

import inspect
import os
import sys
import time
import types
import warnings

from runtime import dtypes as dt
from runtime.autograd import Function, grad_mode, no_grad
from runtime.nn import Module
from runtime.nn.modules import module as module_mod
from runtime.tensor import Tensor

from .executor import Plan
from .graph import fetch_attr
from .graph_module import GraphModule, share_state
from .passes.autodiff import AutodiffError, build_backward
from .passes.decompose import decompose
from .passes.simplify import cse, dce, fold_constants, remove_noops
from . import pytree
from .trace import HOOK_TABLES, Tracer, TraceError, symbolic_trace


def debug_level() -> int:
    """NNC_DEBUG=1: recompiles and fallbacks; 2: graphs after each pass; 3: kernel sources; 4: everything."""
    try:
        return int(os.environ.get("NNC_DEBUG", "0"))
    except ValueError:
        return 0


def debug(level: int, message: str) -> None:
    if debug_level() >= level:
        print(f"[nnc] {message}", file=sys.stderr)


FORWARD_PIPELINE = [("remove_noops", remove_noops), ("cse", cse), ("fold_constants", fold_constants), ("dce", dce)]
BACKWARD_PIPELINE = [("remove_noops", remove_noops), ("cse", cse), ("dce", dce)]


def run_pipeline(gm: GraphModule, pipeline, label: str) -> GraphModule:
    """Run named passes in order, linting after each and printing the graph under NNC_DEBUG>=2."""
    for name, fn in pipeline:
        gm = fn(gm)
        gm.graph.lint(gm)
        if debug_level() >= 2:
            debug(2, f"{label} after {name}:\n{gm.graph}")
    return gm


class CompileError(RuntimeError):
    """The model could not be compiled for these inputs (the caller falls back to eager)."""


class GraphBreak:
    """A submodule that could not be traced: it runs eagerly, as a call in the compiled graph."""

    def __init__(self, path: str, reason: str):
        self.path, self.reason = path, reason

    def __repr__(self) -> str:
        return f"GraphBreak({self.path!r}: {self.reason})"


def trace_for_compile(module: Module, concrete: dict, examples: dict, max_breaks: int = 16):
    """The traced graph with sizes specialized to the examples, and the graph breaks it needed.

    A submodule whose forward cannot be traced (data-dependent Python control flow) is recorded as a call and runs
    eagerly; the rest of the model still compiles. The root's own forward has no such way out: its TraceError is
    raised."""
    breaks: list[GraphBreak] = []
    while True:
        tracer = Tracer(leaf_paths=[b.path for b in breaks])
        try:
            return symbolic_trace(module, concrete_args=concrete or None, tracer=tracer, example_inputs=examples), breaks
        except TraceError as error:
            path = getattr(error, "module_path", "")
            if not path or len(breaks) >= max_breaks:
                raise
            breaks.append(GraphBreak(path, str(error)))
            debug(1, f"graph break at {path}: {error}")


class CompiledGraph:
    """One decomposed graph compiled: a forward plan; with gradients, a training forward and a backward plan."""

    def __init__(self, gm: GraphModule, needs_grad: bool, inputs_requiring_grad: tuple, codegen: bool = True,
                 whole_graph: bool | None = None):
        self.forward = gm
        graph = gm.graph
        self.placeholders = graph.placeholders
        self.tensor_inputs = [n for n in self.placeholders if "shape" in n.meta]
        self.opaque = [n for n in graph.nodes if "opaque_reason" in n.meta]
        self.output_leaves = _leaves(graph.output_node.args[0])  # tensor outputs in structure order
        self.backward = None
        self.backward_error = None
        self.inputs_requiring_grad = tuple(inputs_requiring_grad)
        self.params, self.param_nodes = [], []
        self.forward_plan = self.training_plan = self.backward_plan = None
        if needs_grad:
            self._build_backward()
        if self.backward is not None and not self.opaque:
            self.training_plan = Plan(self.training_forward, use_codegen=codegen)
            # NOTE: the backward's outputs are gradients; with no reference kept, AccumulateGrad stores them as
            # .grad without a copy (a kept reference forces one: 1 ms for a 16 MiB gradient)
            self.backward_plan = Plan(self.backward.gm, use_codegen=codegen, reuse_outputs=False)
        else:
            # NOTE: whole-graph mode is for the forward only: numba links every kernel into the graph's function
            # and compiles them all again there, which a training step's two large graphs would pay cold in seconds
            self.forward_plan = Plan(self.forward, use_codegen=codegen, whole_graph=whole_graph)

    @property
    def plans(self) -> list:
        return [p for p in (self.forward_plan, self.training_plan, self.backward_plan) if p is not None]

    def _build_backward(self) -> None:
        self.param_nodes, self.params = parameter_nodes(self.forward)
        self.input_nodes = [n for n, wants in zip(self.tensor_inputs, self.inputs_requiring_grad) if wants]
        wrt = self.input_nodes + self.param_nodes
        try:
            backward = build_backward(self.forward, wrt)
        except AutodiffError as error:
            self.backward_error = str(error)
            debug(1, f"no compiled backward: {error}; gradients run through eager autograd")
            return
        backward.gm = run_pipeline(backward.gm, BACKWARD_PIPELINE, "backward")
        self.backward = backward
        self.differentiable_outputs = set(backward.grad_outputs)
        self.training_forward = self._forward_returning_saved(backward.saved)

    def _forward_returning_saved(self, saved) -> GraphModule:
        """A copy of the forward graph that also returns the values the backward needs."""
        from .graph import Graph

        graph, mapping = Graph(), {}
        for node in self.forward.graph.nodes:
            if node.op == "output":
                user = _map_nodes(node.args[0], mapping)
                graph.output((user, tuple(mapping[n] for n in self.backward.saved)))
            else:
                mapping[node] = graph.node_copy(node, mapping.__getitem__)
        graph.meta = dict(self.forward.graph.meta)
        return GraphModule(self.forward, graph, class_name=self.forward._get_name())

    def run(self, tensors: list, wants_grad: bool):
        """What the graph returns for these input tensors; with wants_grad, connected to autograd."""
        if not wants_grad:
            plan = self.forward_plan or self.training_plan
            if plan.whole_graph:  # one numba call: nothing records autograd history
                result = plan.run(*tensors)
            else:
                with no_grad():
                    result = plan.run(*tensors)
            return result if plan is self.forward_plan else result[0]
        if self.training_plan is None or self._unexpected_grad(tensors):
            # eager autograd through the decomposed graph: correct, and hooked modules see real values
            return self.forward.forward(*tensors)
        structure: list = []
        flat = _CompiledFunction.apply(self, structure, len(tensors), *tensors, *self.params)
        flat = flat if isinstance(flat, tuple) else (flat,)
        return pytree.replace_tensors(structure[0], flat)

    def _unexpected_grad(self, tensors) -> bool:
        """An input requires grad that the backward was not built for (never a lost gradient: run eagerly)."""
        return any(t._rg and not wants for t, wants in zip(tensors, self.inputs_requiring_grad))


def parameter_nodes(gm: GraphModule) -> tuple[list, list]:
    """(get_attr nodes, tensors) of the parameters that require grad, identified by object. The tracer and decompose
    name a tied parameter by its first path, so it is one node; two nodes for one parameter would split its gradient,
    so they raise instead."""
    trainable = {id(p): p for p in gm.parameters() if p.requires_grad}
    nodes, tensors, seen = [], [], set()
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        tensor = fetch_attr(gm, node.target)
        if id(tensor) not in trainable:
            continue
        if id(tensor) in seen:
            raise CompileError(f"parameter {node.target} is read by two graph nodes; its gradient would be split")
        seen.add(id(tensor))
        nodes.append(node)
        tensors.append(tensor)
    return nodes, tensors


class Artifact:
    """What one guard key compiles to: the traced, decomposed forward, compiled whole or in pieces.

    examples: argument name -> example value (a tensor, or tuples, lists and dicts holding tensors); the graph's
    placeholders are the tensors inside them, in order. With gradients, a graph with opaque nodes (graph breaks,
    random draws) is split: the pieces between opaque nodes compile with their own backwards, the opaque nodes run
    eagerly (nnc.split)."""

    def __init__(self, module: Module, concrete: dict, examples: dict, needs_grad: bool, codegen: bool = True,
                 whole_graph: bool | None = None):
        from .split import SplitGraph

        start = time.perf_counter()
        tensors = pytree.tensor_leaves(list(examples.values()))
        traced, self.graph_breaks = trace_for_compile(module, concrete, examples)
        self.forward = run_pipeline(decompose(traced, *[t.detach() for t in tensors]), FORWARD_PIPELINE, "forward")
        self.opaque = [n for n in self.forward.graph.nodes if "opaque_reason" in n.meta]
        requiring = tuple(t.requires_grad for t in tensors)
        self.main = self.split = None
        if needs_grad and self.opaque:
            self.split = SplitGraph(self.forward, requiring, lambda gm, grad, rg: CompiledGraph(
                gm, grad, rg, codegen=codegen))
        else:
            self.main = CompiledGraph(self.forward, needs_grad, requiring, codegen=codegen, whole_graph=whole_graph)
        self.compile_seconds = time.perf_counter() - start

    forward_plan = property(lambda self: self.main.forward_plan if self.main else None)
    training_plan = property(lambda self: self.main.training_plan if self.main else None)
    backward_plan = property(lambda self: self.main.backward_plan if self.main else None)
    backward = property(lambda self: self.main.backward if self.main else None)

    @property
    def graphs(self) -> list:
        return [self.main] if self.main is not None else self.split.compiled_graphs

    @property
    def plans(self) -> list:
        return [p for g in self.graphs for p in g.plans]

    def run(self, tensors: list, wants_grad: bool):
        return (self.main or self.split).run(tensors, wants_grad)


def _map_nodes(value, mapping):
    from .graph import map_arg

    return map_arg(value, mapping.__getitem__)


class _CompiledFunction(Function):
    """The compiled forward and backward as one autograd node."""

    @staticmethod
    def forward(ctx, graph, structure, n_inputs, *tensors):
        inputs = tensors[:n_inputs]
        user, saved = graph.training_plan.run(*inputs)
        ctx.graph = graph
        ctx.save_for_backward(*saved)
        flat = pytree.tensor_leaves(user)
        structure.append(user)
        ctx.n_outputs = len(flat)
        outputs = tuple(t.detach() for t in flat)
        # NOTE: an output the backward cannot reach (detached, integer, a mask) does not require grad, as in eager
        ctx.mark_non_differentiable(*[t for t, node in zip(outputs, graph.output_leaves)
                                      if node not in graph.differentiable_outputs])
        return outputs

    @staticmethod
    def backward(ctx, *grads):
        graph = ctx.graph
        backward = graph.backward
        saved = ctx.saved_tensors
        seeds = [_sum_for(n, graph.output_leaves, grads) for n in backward.grad_outputs]
        with no_grad():
            results = graph.backward_plan.run(*saved, *seeds)
        by_node = dict(zip(backward.wrt, results))
        input_grads = [by_node.get(n) for n in graph.tensor_inputs]
        param_grads = [by_node.get(n) for n in graph.param_nodes]
        return (None, None, None, *input_grads, *param_grads)


def _leaves(value) -> list:
    """Graph output nodes that are tensors, in structure order (repeats kept)."""
    from .graph import Node

    if isinstance(value, Node):
        return [value] if "shape" in value.meta else []
    if isinstance(value, (tuple, list)):
        return [n for v in value for n in _leaves(v)]
    if isinstance(value, dict):
        return [n for v in value.values() for n in _leaves(v)]
    return []


def _sum_for(node, leaves, grads):
    """The gradient of a forward output node: the sum over every place it appears in the output."""
    total = None
    for leaf, grad in zip(leaves, grads):
        if leaf is node and grad is not None:
            total = grad if total is None else total + grad
    return total


class CompiledModule(Module):
    """Runs `module` compiled; shares its parameters, buffers, submodules and hooks (same state_dict)."""

    def __init__(self, module: Module, target: str = "cpu", recompile_limit: int = 8, codegen: bool = True,
                 whole_graph: bool | None = None):
        super().__init__()
        if target != "cpu":
            raise ValueError(f"nnc.compile: target {target!r} is not available (only 'cpu')")
        share_state(self, module)
        for name in ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
                     "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_backward_hooks",
                     "_backward_pre_hooks"):
            object.__setattr__(self, name, getattr(module, name))  # the root's hooks fire around this module
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_cache", {})
        object.__setattr__(self, "_keys", [])
        object.__setattr__(self, "_signature", inspect.signature(module.forward))
        positional = [p.name for p in self._signature.parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        object.__setattr__(self, "_positional", positional)
        # NOTE: the module tree is fixed at compile time (its hooks and parameters are not): walking a cached
        # list of modules keeps the guards cheap on every call.
        object.__setattr__(self, "_module_list", [(path, m) for path, m in module.named_modules()])
        object.__setattr__(self, "_parameter_tables", [m._parameters for _, m in self._module_list])
        object.__setattr__(self, "_hook_tables", [getattr(m, name) for path, m in self._module_list if path
                                                  for name in HOOK_TABLES])
        self.recompile_limit = recompile_limit
        self.target = target
        self.codegen = codegen
        self.whole_graph = whole_graph

    @property
    def training(self) -> bool:
        return self.__dict__["_module"].training if "_module" in self.__dict__ else True

    @training.setter
    def training(self, mode: bool) -> None:
        if "_module" in self.__dict__:
            self._module.training = mode

    def train(self, mode: bool = True):
        self._module.train(mode)
        return self

    def _get_name(self) -> str:
        return f"Compiled{self._module._get_name()}"

    def extra_repr(self) -> str:
        return f"target={self.target!r}, compiled variants={len(self._cache)}"

    # -- the wrapped model's own attributes -------------------------------------------------------------

    def __getattr__(self, name: str):
        """Parameters, buffers and submodules come from the shared registries; anything else from the wrapped
        model. Its methods are bound to this module, so `self(...)` inside them (a generate loop) runs compiled."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            pass
        module = self.__dict__.get("_module")
        if module is None:
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        function = inspect.getattr_static(type(module), name, None)
        if inspect.isfunction(function) and not _uses_super(function):
            return types.MethodType(function, self)
        return getattr(module, name)

    # -- guards ----------------------------------------------------------------------------------------

    def _bind(self, args, kwargs):
        if not kwargs and len(args) == len(self._positional) == len(self._signature.parameters):
            return dict(zip(self._positional, args))
        bound = self._signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return bound.arguments

    def _guard_key(self, arguments: dict):
        parts = []
        for name, value in arguments.items():
            if isinstance(value, Tensor):
                parts.append((name, "tensor", value._data.shape, value._data.dtype.str, value._rg))
            elif isinstance(value, (tuple, list, dict)):
                leaves, spec = pytree.flatten(value)
                parts.append((name, spec, tuple(_leaf_key(leaf) for leaf in leaves)))
            else:
                parts.append((name, "python", _hashable(value)))
        params = tuple([p._rg for table in self._parameter_tables for p in table.values() if p is not None])
        return (tuple(parts), self._module.training, grad_mode.is_grad_enabled(), params, self._hook_signature())

    def _hook_signature(self):
        """Which submodules have hooks (they are kernel boundaries), and the global hooks present.

        NOTE: presence is what compilation depends on: a hooked submodule runs as a call, which fires whatever hooks
        it has at that time."""
        hooked = tuple([bool(table) for table in self._hook_tables])
        globals_ = (bool(module_mod._global_forward_pre_hooks), bool(module_mod._global_forward_hooks),
                    bool(module_mod._global_backward_hooks))
        return hooked, globals_

    # -- running ---------------------------------------------------------------------------------------

    def forward(self, *args, **kwargs):
        arguments = self._bind(args, kwargs)
        key = self._guard_key(arguments)
        artifact = self._cache.get(key)
        if artifact is None:
            artifact = self._compile(key, arguments)
        if artifact is _EAGER:
            return self._module.forward(*args, **kwargs)
        tensors = _argument_tensors(arguments)
        wants_grad = grad_mode.is_grad_enabled() and (any(t._rg for t in tensors) or any(key[3]))
        return artifact.run(tensors, wants_grad)

    @property
    def compiled_variants(self) -> int:
        """How many variants compiled successfully (failed compiles run eagerly and do not count)."""
        return sum(1 for a in self._cache.values() if a is not _EAGER)

    def _compile(self, key, arguments):
        changing = self._changing_dimension(key)
        if changing is not None:
            # NOTE: kernels are generated for static sizes; a dimension seen with a third value (a generate loop's
            # growing length) would compile once per value, seconds each. Such calls run eagerly instead, and the
            # variants compiled so far keep serving their sizes (the issue tracker has sizes as kernel arguments).
            debug(1, f"{self._module._get_name()}: {changing} keeps changing; running eagerly for its new sizes")
            self._cache[key] = _EAGER
            return _EAGER
        if self.compiled_variants >= self.recompile_limit:
            if not self.__dict__.get("_limit_warned"):
                warnings.warn(f"nnc.compile: {self._module._get_name()} was recompiled {self.recompile_limit} times "
                              f"(the recompile limit; {self._what_kept_changing()}); running eagerly for new "
                              f"inputs", RuntimeWarning, stacklevel=3)
                self.__dict__["_limit_warned"] = True
            return _EAGER
        if debug_level() >= 1:
            debug(1, f"compiling {self._module._get_name()}: {self._why_recompile(key)}")
        concrete, examples = split_arguments(arguments)
        needs_grad = key[2] and (any(t.requires_grad for t in pytree.tensor_leaves(list(examples.values())))
                                 or any(p.requires_grad for p in self._module.parameters()))
        try:
            with no_grad():
                artifact = Artifact(self._module, concrete, examples, needs_grad, codegen=self.codegen,
                                    whole_graph=self.whole_graph)
        except Exception as error:  # never a wrong answer: run eagerly, and say why
            warnings.warn(f"nnc.compile: could not compile {self._module._get_name()} "
                          f"({type(error).__name__}: {error}); running it eagerly", RuntimeWarning, stacklevel=3)
            artifact = _EAGER
        for graph_break in getattr(artifact, "graph_breaks", ()):
            debug(1, f"{self._module._get_name()}: {graph_break.path} runs eagerly ({graph_break.reason})")
        self._cache[key] = artifact
        self._keys.append(key)
        return artifact

    def _changing_dimension(self, key) -> str | None:
        """'x's dim 1' when this key gives a tensor dimension a third distinct size, among the compiled variants."""
        new_shapes = _tensor_shapes(key)
        seen: dict = {}
        for other, artifact in self._cache.items():
            if artifact is _EAGER:
                continue
            for leaf, shape in _tensor_shapes(other).items():
                for dim, size in enumerate(shape):
                    seen.setdefault((leaf, len(shape), dim), set()).add(size)
        for leaf, shape in new_shapes.items():
            for dim, size in enumerate(shape):
                sizes = seen.get((leaf, len(shape), dim), set())
                if size not in sizes and len(sizes) >= 2:
                    return f"{leaf[0]}'s dim {dim}"
        return None

    def _why_recompile(self, key) -> str:
        if not self._keys:
            return "first call"
        changed = _changed_parts(self._keys[-1], key)
        return "changed: " + ", ".join(changed)

    def _what_kept_changing(self) -> str:
        """Which guard parts differed between the variants compiled so far (argument names, flags)."""
        seen: dict = {}
        for previous, key in zip(self._keys, self._keys[1:]):
            for part in _changed_parts(previous, key):
                seen[part] = None
        return "changed: " + ", ".join(seen) if seen else "no change recorded"


_GUARD_LABELS = ("arguments", "training flag", "grad mode", "parameters' requires_grad", "hooks")


def _changed_parts(previous, key) -> list[str]:
    """What differs between two guard keys: argument names (with their shapes when those changed), else labels."""
    changed = []
    for label, a, b in zip(_GUARD_LABELS, previous, key):
        if label == "arguments" and a != b:
            changed += [_describe_argument(x, y) for x, y in zip(a, b) if x != y]
        elif a != b:
            changed.append(label)
    return changed


def _describe_argument(before, after) -> str:
    name = after[0]
    if before[1] == after[1] == "tensor" and before[2] != after[2]:
        return f"{name}'s shape {tuple(before[2])} -> {tuple(after[2])}"
    return f"argument {name}"


def bind_arguments(module: Module, args: tuple, kwargs: dict) -> dict:
    """forward's arguments by name, defaults filled in (the order the graph's placeholders follow)."""
    bound = inspect.signature(module.forward).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def split_arguments(arguments: dict) -> tuple[dict, dict]:
    """(concrete, examples): arguments holding no tensor are fixed into the graph (and guarded); the others are
    inputs, one placeholder per tensor inside them."""
    concrete = {k: v for k, v in arguments.items() if not pytree.has_tensor(v)}
    return concrete, {k: v for k, v in arguments.items() if k not in concrete}


def _tensor_shapes(key) -> dict:
    """{(argument name, leaf position): shape} of the tensors a guard key describes."""
    shapes = {}
    for part in key[0]:
        if part[1] == "tensor":
            shapes[(part[0], 0)] = tuple(part[2])
        elif isinstance(part[1], pytree.Spec):
            for i, leaf in enumerate(part[2]):
                if leaf[0] == "tensor":
                    shapes[(part[0], i)] = tuple(leaf[1])
    return shapes


def _argument_tensors(arguments: dict) -> list:
    """The tensors among the arguments, nested ones included, in the order the graph's placeholders take them."""
    tensors = []
    for value in arguments.values():
        if isinstance(value, Tensor):
            tensors.append(value)
        elif isinstance(value, (tuple, list, dict)):
            tensors += pytree.tensor_leaves(value)
    return tensors


def _leaf_key(leaf):
    if isinstance(leaf, Tensor):
        return ("tensor", leaf._data.shape, leaf._data.dtype.str, leaf._rg)
    return ("python", _hashable(leaf))


def _uses_super(function) -> bool:
    """Whether a method calls super() (it then needs an instance of its class as self)."""
    return "__class__" in function.__code__.co_freevars


_EAGER = object()


def _hashable(value):
    """The value itself when it can be a dict key and compared safely, else its repr (a tensor inside an object
    compares elementwise, which a guard must never do)."""
    if isinstance(value, (int, float, str, bytes, bool, type(None), dt.dtype)):
        return value
    try:
        hash(value)
    except TypeError:
        return ("repr", repr(value))
    return ("object", type(value).__qualname__, id(value)) if not _compares_safely(value) else value


def _compares_safely(value) -> bool:
    try:
        return bool(value == value)
    except Exception:
        return False


def compile(module: Module, target: str = "cpu", recompile_limit: int = 8, codegen: bool = True,
            whole_graph: bool | None = None) -> CompiledModule:
    """Compile `module`: same parameters and state_dict, same results, faster (see docs/architecture.md).

    whole_graph: None (the default) runs a forward without gradients as one numba function when its values are
    small (nnc.codegen.whole_graph), True asks for that (with a warning when a graph does not qualify), False never.
    """
    if not isinstance(module, Module):
        raise TypeError(f"nnc.compile expects a runtime.nn.Module, got {type(module).__name__}")
    return CompiledModule(module, target=target, recompile_limit=recompile_limit, codegen=codegen,
                          whole_graph=whole_graph)
