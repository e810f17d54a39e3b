"""nnc.compile: a Module that runs a model through the compiler, guarded, with a compiled backward and fallbacks."""
from __future__ import annotations

import inspect
import os
import sys
import time
import warnings

from runtime.autograd import Function, grad_mode, no_grad
from runtime.nn import Module
from runtime.nn.modules import module as module_mod
from runtime.tensor import Tensor

from .executor import Plan
from .graph_module import GraphModule, share_state
from .passes.autodiff import AutodiffError, build_backward
from .passes.decompose import decompose
from .passes.simplify import cse, dce, fold_constants, remove_noops
from .trace import HOOK_TABLES, symbolic_trace


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


class Artifact:
    """What one guard key compiles to: the forward graph, and the backward pieces when gradients are needed."""

    def __init__(self, module: Module, concrete: dict, example_inputs: list, needs_grad: bool,
                 inputs_requiring_grad: tuple = (), codegen: bool = True, whole_graph: bool | None = None):
        start = time.perf_counter()
        traced = symbolic_trace(module, concrete_args=concrete or None)
        self.forward = run_pipeline(decompose(traced, *example_inputs), FORWARD_PIPELINE, "forward")
        graph = self.forward.graph
        self.placeholders = graph.placeholders
        self.opaque = [n for n in graph.nodes if "opaque_reason" in n.meta]
        self.output_leaves = _leaves(graph.output_node.args[0])  # tensor outputs in structure order
        self.backward = None
        self.backward_error = None
        self.inputs_requiring_grad = inputs_requiring_grad
        self.forward_plan = self.training_plan = self.backward_plan = None
        if needs_grad:
            self._build_backward(module)
        if self.backward is not None and not self.opaque:
            self.training_plan = Plan(self.training_forward, use_codegen=codegen)
            # NOTE: the backward's outputs are gradients; with no reference kept, AccumulateGrad stores them as
            # .grad without a copy (a kept reference forces one: 1 ms for a 16 MiB gradient)
            self.backward_plan = Plan(self.backward.gm, use_codegen=codegen, reuse_outputs=False)
        else:
            # NOTE: whole-graph mode is for the forward only: numba links every kernel into the graph's function
            # and compiles them all again there, which a training step's two large graphs would pay cold in seconds
            self.forward_plan = Plan(self.forward, use_codegen=codegen, whole_graph=whole_graph)
        self.compile_seconds = time.perf_counter() - start

    @property
    def plans(self) -> list:
        return [p for p in (self.forward_plan, self.training_plan, self.backward_plan) if p is not None]

    def _build_backward(self, module: Module) -> None:
        graph = self.forward.graph
        params = dict(module.named_parameters())
        self.param_nodes = [n for n in graph.nodes if n.op == "get_attr" and n.target in params
                            and params[n.target].requires_grad]
        self.params = [params[n.target] for n in self.param_nodes]
        tensor_inputs = [n for n in self.placeholders if "shape" in n.meta]
        self.input_nodes = [n for n, wants in zip(tensor_inputs, self.inputs_requiring_grad) if wants]
        wrt = self.input_nodes + self.param_nodes
        try:
            backward = build_backward(self.forward, wrt)
        except AutodiffError as error:
            self.backward_error = str(error)
            debug(1, f"no compiled backward: {error}; gradients run through eager autograd")
            return
        backward.gm = run_pipeline(backward.gm, BACKWARD_PIPELINE, "backward")
        self.backward = backward
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


def _map_nodes(value, mapping):
    from .graph import map_arg

    return map_arg(value, mapping.__getitem__)


class _CompiledFunction(Function):
    """The compiled forward and backward as one autograd node."""

    @staticmethod
    def forward(ctx, artifact, structure, n_inputs, *tensors):
        inputs = tensors[:n_inputs]
        user, saved = artifact.training_plan.run(*inputs)
        ctx.artifact = artifact
        ctx.save_for_backward(*saved)
        flat = _flatten_tensors(user)
        structure.append(user)
        ctx.n_outputs = len(flat)
        return tuple(t.detach() for t in flat)

    @staticmethod
    def backward(ctx, *grads):
        artifact = ctx.artifact
        backward = artifact.backward
        saved = ctx.saved_tensors
        seeds = [_sum_for(n, artifact.output_leaves, grads) for n in backward.grad_outputs]
        with no_grad():
            results = artifact.backward_plan.run(*saved, *seeds)
        by_node = dict(zip(backward.wrt, results))
        tensor_inputs = [n for n in artifact.placeholders if "shape" in n.meta]
        input_grads = [by_node.get(n) for n in tensor_inputs]
        param_grads = [by_node.get(n) for n in artifact.param_nodes]
        return (None, None, None, *input_grads, *param_grads)


def _leaves(value) -> list:
    """Graph output nodes that are tensors, in structure order (repeats kept)."""
    from .graph import Node

    if isinstance(value, Node):
        return [value] if "shape" in value.meta else []
    if isinstance(value, (tuple, list)):
        return [n for v in value for n in _leaves(v)]
    return []


def _sum_for(node, leaves, grads):
    """The gradient of a forward output node: the sum over every place it appears in the output."""
    total = None
    for leaf, grad in zip(leaves, grads):
        if leaf is node and grad is not None:
            total = grad if total is None else total + grad
    return total


def _flatten_tensors(value) -> list:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _flatten_tensors(v)]
    return []


def _rebuild(template, flat_iter):
    """The user's output structure with its tensors replaced by the autograd-connected ones."""
    if isinstance(template, Tensor):
        return next(flat_iter)
    if isinstance(template, (tuple, list)):
        items = [_rebuild(v, flat_iter) for v in template]
        return tuple(items) if isinstance(template, tuple) else items
    return template


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
        return self._run(artifact, arguments, key[3])

    def _compile(self, key, arguments):
        if len(self._cache) >= self.recompile_limit:
            if not self.__dict__.get("_limit_warned"):
                warnings.warn(f"nnc.compile: {self._module._get_name()} was recompiled {self.recompile_limit} times "
                              f"(the recompile limit); running eagerly for new inputs", RuntimeWarning, stacklevel=3)
                self.__dict__["_limit_warned"] = True
            return _EAGER
        debug(1, f"compiling {self._module._get_name()}: {self._why_recompile(key)}")
        concrete = {k: v for k, v in arguments.items() if not isinstance(v, Tensor)}
        examples = [v for v in arguments.values() if isinstance(v, Tensor)]
        needs_grad = key[2] and (any(t.requires_grad for t in examples)
                                 or any(p.requires_grad for p in self._module.parameters()))
        try:
            with no_grad():
                artifact = Artifact(self._module, concrete, [t.detach() for t in examples], needs_grad,
                                    tuple(t.requires_grad for t in examples), codegen=self.codegen,
                                    whole_graph=self.whole_graph)
        except Exception as error:  # never a wrong answer: run eagerly, and say why
            warnings.warn(f"nnc.compile: could not compile {self._module._get_name()} "
                          f"({type(error).__name__}: {error}); running it eagerly", RuntimeWarning, stacklevel=3)
            artifact = _EAGER
        self._cache[key] = artifact
        self._keys.append(key)
        return artifact

    def _why_recompile(self, key) -> str:
        if not self._keys:
            return "first call"
        previous = self._keys[-1]
        labels = ("arguments", "training flag", "grad mode", "parameters' requires_grad", "hooks")
        changed = [label for label, a, b in zip(labels, previous, key) if a != b]
        return "changed: " + ", ".join(changed)

    def _run(self, artifact: Artifact, arguments: dict, key_params: tuple):
        tensors = [v for v in arguments.values() if isinstance(v, Tensor)]
        wants_grad = grad_mode.is_grad_enabled() and (any(t._rg for t in tensors) or any(key_params))
        if not wants_grad:
            plan = artifact.forward_plan or artifact.training_plan
            if plan.whole_graph:  # one numba call: nothing records autograd history
                result = plan.run(*tensors)
            else:
                with no_grad():
                    result = plan.run(*tensors)
            return result if plan is artifact.forward_plan else result[0]
        if artifact.training_plan is None:
            # eager autograd through the decomposed graph: correct, and hooked modules see real values
            return artifact.forward.forward(*tensors)
        structure: list = []
        flat = _CompiledFunction.apply(artifact, structure, len(tensors), *tensors, *artifact.params)
        flat = flat if isinstance(flat, tuple) else (flat,)
        return _rebuild(structure[0], iter(flat))


_EAGER = object()


def _hashable(value):
    try:
        hash(value)
        return value
    except TypeError:
        return repr(value)


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
