"""FX-style symbolic tracing: run a Module's forward on Proxy objects and record a Graph of what it does."""
from __future__ import annotations

import builtins
import contextlib
import dis
import inspect
import linecache
import operator
import os
import sys
import sysconfig
import threading
import weakref

import numpy as np

import runtime
import runtime.nn.functional as F
from runtime import api, factories
from runtime.autograd import FunctionCtx, grad_mode, no_grad
from runtime.nn import Module
from runtime.nn.modules import container
from runtime.nn.utils.weight_norm import WeightNorm
from runtime.tensor import Tensor

from runtime.utils import _pytree as pytree
from .graph import Graph, fetch_attr, has_side_effect, map_arg
from .prims import prims
from .python_state import AttributesKept, RandomStreams, ReachableState
from .symbolic import has_symbols, hint_of


def _folder(path: str) -> str:
    return os.path.join(os.path.abspath(path), "")  # the trailing separator keeps /x/runtime from matching /x/runtime2


_OWN_DIRS = (_folder(os.path.dirname(runtime.__file__)), _folder(os.path.dirname(__file__)))
_STDLIB_DIR = _folder(sysconfig.get_paths()["stdlib"])
_SITE_DIRS = tuple({_folder(sysconfig.get_paths()[key]) for key in ("purelib", "platlib")})


def _is_library_file(filename: str) -> bool:
    """runtime, nnc and the standard library (contextlib, functools, ...); installed packages are user code."""
    if filename.startswith(_OWN_DIRS):
        return True
    return filename.startswith(_STDLIB_DIR) and not filename.startswith(_SITE_DIRS)


class TraceError(RuntimeError):
    """Tracing met something a graph cannot express (data-dependent control flow, len() of a proxy, ...)."""


class _TraceAgain(Exception):
    """Raised while tracing when traced values are written in place into a real tensor that a runtime function made
    in forward (call number `call`): the trace starts over with that call recorded, so the tensor is traced too."""

    def __init__(self, call: int):
        super().__init__(f"trace again with runtime call {call} recorded")
        self.call = call


def user_code_frame(frame):
    """The innermost frame of user code (see _is_library_file) from `frame` outward, or None."""
    while frame is not None:
        raw = frame.f_code.co_filename
        filename = raw if raw.startswith("<") else os.path.abspath(raw)  # keep pseudo-files like <string>
        if not _is_library_file(filename):
            return frame
        frame = frame.f_back
    return None


def user_frame():
    """(filename, lineno, source line) of the innermost frame of user code (see _is_library_file), or None."""
    frame = user_code_frame(sys._getframe(1))
    if frame is None:
        return None
    raw = frame.f_code.co_filename
    filename = raw if raw.startswith("<") else os.path.abspath(raw)
    # NOTE: linecache, not inspect.getframeinfo: that resolves the module by walking sys.modules with a realpath per
    # module (80 ms of a 170 ms compile from the disk cache)
    return filename, frame.f_lineno, linecache.getline(raw, frame.f_lineno).strip()


def _where() -> str:
    found = user_frame()
    if found is None:
        return "in the traced code"
    filename, lineno, line = found
    return f"at {filename}:{lineno}: `{line}`"


# Dunders become call_function nodes with Python's operator functions as targets (as torch.fx does):
# they also work on non-tensor values such as sizes. The list of dunders comes from runtime's API.
_DUNDER_TARGETS = {
    "__add__": operator.add, "__sub__": operator.sub, "__mul__": operator.mul, "__truediv__": operator.truediv,
    "__floordiv__": operator.floordiv, "__mod__": operator.mod, "__pow__": operator.pow,
    "__matmul__": operator.matmul, "__and__": operator.and_, "__or__": operator.or_, "__xor__": operator.xor,
    "__eq__": operator.eq, "__ne__": operator.ne, "__lt__": operator.lt, "__le__": operator.le,
    "__gt__": operator.gt, "__ge__": operator.ge, "__getitem__": operator.getitem,
    "__neg__": operator.neg, "__abs__": operator.abs, "__invert__": operator.invert, "__pos__": operator.pos,
}

# Methods recorded as call_method: runtime's API methods plus Tensor's own (to, view, detach, ...).
_TENSOR_METHODS = {"to", "type", "type_as", "float", "double", "half", "long", "int", "bool", "cpu", "view",
                   "contiguous", "detach", "size", "dim", "numel", "new_tensor", "new_empty"}
# Every in-place method (add_, tanh_, addcmul_, ...): a call_method node, which passes know writes its argument.
INPLACE_METHODS = tuple(sorted(n for n in dir(Tensor) if n.endswith("_") and not n.startswith("_")))
METHOD_NAMES = frozenset(api.METHODS) | _TENSOR_METHODS | frozenset(INPLACE_METHODS)
# What a tracer with example inputs answers from the example values instead of recording: sizes, rank, dtype and
# device. The compiled module's guards check exactly these, so the answers hold for every call that reuses the graph.
SIZE_QUERIES = frozenset({"size", "shape", "dim", "ndim", "numel", "nelement", "dtype", "device",
                          "is_floating_point", "is_complex", "element_size", "is_cuda"})
# The size queries whose answers may hold symbolic sizes when some dimensions are dynamic (nnc.symbolic).
SYMBOLIC_QUERIES = frozenset({"size", "shape", "numel", "nelement"})


class Proxy:
    """Stands for a value during tracing; every operation on it becomes a node."""

    __slots__ = ("node", "tracer")

    def __init__(self, node, tracer: "Tracer"):
        self.node, self.tracer = node, tracer

    def __repr__(self) -> str:
        return f"Proxy({self.node.name})"

    @staticmethod
    def _apply_op(op, inputs, attrs):
        """runtime.ops.apply lands here when a proxy is among the inputs: record the primitive itself."""
        tracer = next(x.tracer for x in inputs if isinstance(x, Proxy))
        return tracer.create_proxy("call_function", prims[op.name], inputs, attrs)

    @staticmethod
    def _apply_function(fn_cls, args, kwargs):
        """A custom autograd.Function called on a proxy: one node, which decompose keeps as an eager call when
        gradients are wanted (so its own backward runs); without them its forward is traced like any code."""
        tracer = next(x.tracer for x in args if isinstance(x, Proxy))
        if not tracer._records_grad:
            return fn_cls.forward(_ForwardOnlyCtx(), *args, **kwargs)
        return tracer.create_proxy("call_function", fn_cls.apply, args, kwargs)

    @staticmethod
    def _refuse_autograd(what: str):
        raise TraceError(f"{what} on a traced value {_where()}: gradients inside forward need the eager autograd "
                         f"graph, so this forward runs eagerly")

    def __getattr__(self, name: str):
        if name in SIZE_QUERIES and self.tracer.specializes_sizes:
            value = self.tracer.value_of(self.node)
            if isinstance(value, Tensor):
                if name in SYMBOLIC_QUERIES and self.tracer.shape_env is not None:
                    return getattr(self.tracer.symbolic_value_of(self.node), name)
                return getattr(value, name)
        if name in METHOD_NAMES:
            return _MethodRecorder(self, name)
        return self.tracer.create_proxy("call_function", builtins.getattr, (self, name), {})

    def __call__(self, *args, **kwargs):
        return self.tracer.create_proxy("call_function", operator.call, (self,) + args, kwargs)

    def __setitem__(self, key, value) -> None:
        self.tracer.create_proxy("call_function", operator.setitem, (self, key, value), {})

    def __bool__(self):
        raise TraceError(f"symbolically traced values cannot be used as inputs to control flow {_where()}. "
                         f"Use concrete_args for Python arguments, or make the module a leaf "
                         f"(override Tracer.is_leaf_module)")

    def __len__(self):
        known = self._known_length()
        if known is not None:
            return known
        raise TraceError(f"len() is not supported on a traced value {_where()}: its length is not known while "
                         f"tracing. Use x.shape[0], concrete_args, or a leaf module")

    def __iter__(self):
        count = self._known_length()
        if count is None:
            count = _unpack_count(sys._getframe(1))
        if count is None:
            raise TraceError(f"a traced value cannot be iterated {_where()}: its length is not known while tracing. "
                             "Unpack it into names (a, b = x.chunk(2)) or index it (parts[0]), "
                             "or use concrete_args or a leaf module")
        return iter([self[i] for i in range(count)])

    def _known_length(self) -> int | None:
        """len() of the example value, when the tracer specializes sizes and the value has one."""
        if not self.tracer.specializes_sizes:
            return None
        value = self.tracer.value_of(self.node)
        if isinstance(value, Tensor) and value.ndim and self.tracer.shape_env is not None:
            return operator.index(self.tracer.symbolic_value_of(self.node).shape[0])  # pins a dynamic size
        if isinstance(value, Tensor):
            return len(value) if value.ndim else None
        return len(value) if isinstance(value, (tuple, list)) else None

    def __index__(self):
        raise TraceError(f"a traced value cannot be used as a Python integer {_where()}. "
                         f"Use concrete_args or a leaf module")

    __int__ = __float__ = __index__

    __hash__ = object.__hash__


class _ForwardOnlyCtx(FunctionCtx):
    """The ctx of a custom Function traced for inference: what forward saves is never read back."""

    def save_for_backward(self, *tensors) -> None:
        pass


def _unpack_count(frame) -> int | None:
    """n when the frame is executing `a, b, ... = value` (n names), else None: the one iteration with a known length."""
    # NOTE: as torch.fx does, read the caller's bytecode: UNPACK_SEQUENCE is what calls __iter__ for `a, b = proxy`.
    for instruction in dis.get_instructions(frame.f_code):
        if instruction.offset == frame.f_lasti:
            return instruction.argval if instruction.opname == "UNPACK_SEQUENCE" else None
    return None


class _MethodRecorder:
    """proxy.method(...) becomes a call_method node."""

    __slots__ = ("proxy", "name")

    def __init__(self, proxy: Proxy, name: str):
        self.proxy, self.name = proxy, name

    def __call__(self, *args, **kwargs):
        tracer = self.proxy.tracer
        if self.name == "type" and not args and "dtype" not in kwargs and tracer.specializes_sizes:
            value = tracer.value_of(self.proxy.node)  # x.type(): the legacy name of its dtype, which guards check
            if isinstance(value, Tensor):
                return value.type()
        return tracer.create_proxy("call_method", self.name, (self.proxy,) + args, kwargs)


def _dunder(target, reflected: bool):
    if reflected:
        return lambda self, other: self.tracer.create_proxy("call_function", target, (other, self), {})
    if target in (operator.neg, operator.abs, operator.invert, operator.pos):
        return lambda self: self.tracer.create_proxy("call_function", target, (self,), {})
    return lambda self, other: self.tracer.create_proxy("call_function", target, (self, other), {})


_INPLACE_DUNDERS = {"__iadd__": operator.iadd, "__isub__": operator.isub, "__imul__": operator.imul,
                    "__itruediv__": operator.itruediv, "__ifloordiv__": operator.ifloordiv, "__imod__": operator.imod,
                    "__ipow__": operator.ipow, "__iand__": operator.iand, "__ior__": operator.ior,
                    "__ixor__": operator.ixor, "__imatmul__": operator.imatmul}


def _install_dunders() -> None:
    # NOTE: `x += v` is recorded as operator.iadd (not x + v): on a tensor it writes x's memory, which views of x
    # and later readers see; on a Python number it is plain addition.
    for name, target in _INPLACE_DUNDERS.items():
        setattr(Proxy, name, _dunder(target, reflected=False))
    for name in api.DUNDERS:
        if name.startswith("__r") and f"__{name[3:]}" in _DUNDER_TARGETS:
            setattr(Proxy, name, _dunder(_DUNDER_TARGETS[f"__{name[3:]}"], reflected=True))
        elif name in _DUNDER_TARGETS:
            setattr(Proxy, name, _dunder(_DUNDER_TARGETS[name], reflected=False))


_install_dunders()


# Tensor's methods that write its memory: while tracing, a real tensor written with traced values asks for a new
# trace (Tracer.write_into_real)
WRITING_METHODS = INPLACE_METHODS + ("__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__")


# Tensor's in-place methods that draw random numbers: drawn into a real tensor while tracing, the values would be
# frozen into the graph as a constant (timm's DropPath: `x.new_empty(shape).bernoulli_(keep)`)
RANDOM_WRITING_METHODS = ("bernoulli_", "cauchy_", "exponential_", "geometric_", "log_normal_", "normal_", "random_",
                          "uniform_")


def _checked_write(method, tracer: "Tracer"):
    draws = method.__name__ in RANDOM_WRITING_METHODS

    def write(self, *args, **kwargs):
        if draws or _has_proxy(args) or _has_proxy(list(kwargs.values())):
            tracer.write_into_real(self)
        return method(self, *args, **kwargs)

    return write


def _has_proxy(value) -> bool:
    found = []

    def visit(v):
        if isinstance(v, Proxy):
            found.append(v)
        elif isinstance(v, (tuple, list)):
            for x in v:
                visit(x)
        elif isinstance(v, dict):
            for x in v.values():
                visit(x)

    visit(value)
    return bool(found)


class Tracer:
    """Records a Module's forward. Override is_leaf_module to choose which submodules stay as calls."""

    def __init__(self, leaf_paths=()):
        self.graph: Graph | None = None
        self.root: Module | None = None
        self.leaf_paths = frozenset(leaf_paths)  # submodules recorded as calls whatever their type (graph breaks)
        # a traced tensor set as a plain module attribute in forward (`self.loss = mse(x, target)`) becomes an extra
        # output that the compiled module sets after each call (nnc.pipeline); else such a forward runs eagerly
        self.replays_attributes = False
        self.specializes_sizes = False
        self._values: dict = {}
        # Dynamic dimensions (nnc.symbolic): placeholder name -> dims, the symbols' ShapeEnv, and the values of the
        # nodes replayed on shape-only MetaValues, which answer size queries with symbolic sizes.
        self.dynamic: dict[str, tuple] = {}
        self.shape_env = None
        self._symbolic: dict = {}
        self._replay = None

    def is_leaf_module(self, module: Module, qualified_name: str) -> bool:
        """Built-in layers (and any module with hooks, so they keep firing) are recorded as calls, except a module
        whose only hooks are pre-hooks the trace runs inline (`inline_pre_hooks`): it is traced through."""
        if qualified_name in self.leaf_paths:
            return True
        if has_hooks(module):
            return not (self.replays_attributes and inline_pre_hooks(module))
        if isinstance(module, (container.Sequential, container.ModuleList, container.ModuleDict)):
            return False
        return type(module).__module__.startswith("runtime.nn.modules")

    def call_module(self, module: Module, forward, args, kwargs):
        """Record a call_module node for a leaf, or trace through the module's forward."""
        qualified_name = self.path_of(module)
        if self.is_leaf_module(module, qualified_name):
            return self.create_proxy("call_module", qualified_name, args, kwargs, module_path=qualified_name)
        self._module_stack.append(qualified_name)
        try:
            for hook in inline_pre_hooks(module) if has_hooks(module) else ():
                changed = hook(module, args)
                if changed is not None:
                    args = changed if isinstance(changed, tuple) else (changed,)
            return self._run_watched(module, qualified_name, forward, args, kwargs)
        except TraceError as error:  # the innermost module that failed: a graph break can make it a call
            if not hasattr(error, "module_path"):
                error.module_path = qualified_name
            raise
        finally:
            self._module_stack.pop()

    def _run_watched(self, module: Module, path: str, forward, args, kwargs, names=None):
        """forward(*args, **kwargs), raising TraceError when it changed Python state that later calls would see: a
        list, dict, set or plain object its module's attributes, its arguments or the globals its code names reach
        (a call counter in a config object, a cache passed in, a global step). The graph would not repeat that, so
        such a forward runs eagerly; what the trace changed is put back (it may hold traced values)."""
        names = names or [f"argument {k}" for k in range(len(args))] + [f"argument {k}" for k in kwargs]
        roots = list(zip(names, [*args, *kwargs.values()]))
        watched = [ReachableState.of_module(module, path), ReachableState(roots), ReachableState.of_globals(forward),
                   RandomStreams()]
        try:
            result = forward(*args, **kwargs)
            changed = next((what for what in (state.changed() for state in watched) if what), None)
        except BaseException:
            for state in watched:
                state.restore()
            raise
        if changed:
            for state in watched:
                state.restore()
            where = f"{type(module).__name__}.forward" + (f" ({path})" if path else "")
            raise TraceError(f"{where} changes {changed}: the compiled graph would not repeat that on later calls, "
                             f"so this forward runs eagerly")
        return result

    def path_of(self, module: Module) -> str:
        path = self._module_paths.get(id(module))
        if path is None:
            raise TraceError(f"module {type(module).__name__} called {_where()} is not a submodule of the traced "
                             f"module; register it (self.name = module) so the graph can refer to it")
        return path

    # -- recording ---------------------------------------------------------------------------------

    def create_proxy(self, op: str, target, args, kwargs, module_path: str | None = None) -> Proxy:
        node = self.graph.create_node(op, target, self._to_graph_args(args), self._to_graph_args(kwargs))
        found = user_frame()
        if found is not None:
            node.meta["source"] = f"{found[0]}:{found[1]}"
            node.meta["source_line"] = found[2]
        node.meta["module_path"] = module_path if module_path is not None else self._module_stack[-1]
        if self._records_grad and not grad_mode.state.enabled:
            self._mark_no_grad(node)
        return Proxy(node, self)

    def _mark_no_grad(self, node) -> None:
        """A node recorded under no_grad inside forward: decompose detaches its tensor results, so gradients stop
        there as they do in eager mode. An in-place write there to a value that may require grad (not a buffer, a
        constant, or a value made under no_grad) changes the value but not its history in eager mode, which a
        functional graph cannot express: that is a graph break."""
        target = node.args[0] if node.args else None
        made_without_grad = getattr(target, "meta", {}).get("no_grad", False)  # (decompose detaches it)
        if self._writes_tensor(node) and not (self._is_gradless_attr(target) or made_without_grad):
            name = target.name if hasattr(target, "name") else repr(target)
            raise TraceError(f"an in-place write to {name} under no_grad inside forward {_where()} cannot be "
                             f"compiled: eager mode changes its values but not its gradient history")
        node.meta["no_grad"] = True

    def _writes_tensor(self, node) -> bool:
        if node.op == "call_module":
            return bool(getattr(fetch_attr(self.root, node.target), "inplace", False))
        return has_side_effect(node) and not (node.op == "call_function" and node.target is builtins.setattr)

    def _is_gradless_attr(self, node) -> bool:
        """A buffer, or a constant tensor made in forward, that does not require grad."""
        if getattr(node, "op", None) != "get_attr":
            return False
        value = self.constants.get(node.target, self._state_tensors.get(node.target))
        return isinstance(value, Tensor) and not value.requires_grad

    def _to_graph_args(self, value):
        if isinstance(value, Proxy):
            return value.node
        if isinstance(value, Tensor):
            return self._tensor_node(value)
        if isinstance(value, (tuple, list)):
            return pytree.like(value, [self._to_graph_args(v) for v in value])  # a namedtuple keeps its type
        if isinstance(value, dict):
            return {k: self._to_graph_args(v) for k, v in value.items()}
        if isinstance(value, slice):
            return slice(*(self._to_graph_args(v) for v in (value.start, value.stop, value.step)))
        return value

    def _tensor_node(self, tensor: Tensor):
        """A parameter/buffer of the root becomes get_attr by path; other tensors become named constants."""
        path = self._tensor_paths.get(id(tensor))
        if path is None:
            self._check_constant(tensor)
            path = f"_tensor_constant{len(self.constants)}"
            self.constants[path] = tensor
            self._tensor_paths[id(tensor)] = path
            if self._made.get(id(tensor)) is tensor:
                self.fresh_constants.add(path)
            else:
                from .attribute_guards import note_global_tensor  # (it imports this module)

                note_global_tensor(tensor)
        node = self._attr_nodes.get(path)
        if node is None:
            node = self._attr_nodes[path] = self._create_attr_node(path)
        return node

    def write_into_real(self, tensor: Tensor) -> None:
        """Traced values (or random draws) are about to be written in place into a real tensor, which the Python code
        after the write would read unchanged (or frozen): trace again with the runtime call that made it recorded
        (_TraceAgain), or, for a tensor from elsewhere, a graph break."""
        made = tensor if tensor._base is None else tensor._base
        if self._made.get(id(made)) is made:
            raise _TraceAgain(self._made_by_call[id(made)])
        raise TraceError(f"an in-place write of traced values into a tensor that is not a traced value {_where()}: "
                         f"the Python code after it would read the old values; make the tensor in forward from a "
                         f"runtime function (torch.zeros, x.new_zeros) or a traced value")

    def _check_constant(self, tensor: Tensor) -> None:
        """A tensor computed before forward from others (with a grad_fn), or a plain attribute of a module whose
        forward pre-hooks may set it anew (torch.nn.utils.prune's `module.weight`), is not a constant: eager reads a
        fresh value on every call and sends gradients through it, so the trace must not freeze it."""
        if self._made.get(id(tensor)) is tensor:
            return
        if tensor.grad_fn is not None:
            raise TraceError(f"a tensor computed outside forward (it has a grad_fn) is read {_where()}: a compiled "
                             f"graph would freeze its value and cut its gradient")
        if id(tensor) in self._hook_set_tensors:
            raise TraceError(f"a tensor attribute that a forward pre-hook sets is read {_where()}: a compiled graph "
                             f"would freeze its value")

    def _create_attr_node(self, path: str, name: str | None = None):
        """get_attr nodes go right after the placeholders and earlier get_attrs, in order of first use."""
        later = [n for n in self.graph.nodes if n.op not in ("placeholder", "get_attr")]
        with self.graph.inserting_before(later[0]) if later else contextlib.nullcontext():
            node = self.graph.create_node("get_attr", path, name=name or path)
        node.meta["module_path"] = path.rpartition(".")[0]
        return node

    def assign_buffer(self, module: Module, name: str, value) -> None:
        """`module.name = value` on a buffer: recorded as setattr on the module, read back by the rest of the trace."""
        path = self.path_of(module)
        owner = self._attr_nodes.get(path)
        if owner is None:
            owner = self._attr_nodes[path] = self._create_attr_node(path, name=path.replace(".", "_") or "root")
        self.create_proxy("call_function", builtins.setattr, (Proxy(owner, self), name, value), {})
        self._assigned[(id(module), name)] = value

    def set_attribute(self, module: Module, name: str, value: Proxy) -> None:
        """`module.name = value` of a traced tensor on a plain attribute: recorded for graph.meta["set_attributes"]
        (the value becomes an extra output, set on the module after each compiled call), and held by the module
        until the trace ends, so that forward reads it back as the traced value."""
        path = self.path_of(module)
        self._attribute_before.setdefault((id(module), name), (module, name, module.__dict__.get(name, _UNSET)))
        self._set_attributes.pop((path, name), None)  # (the last assignment's order: where eager leaves it)
        self._set_attributes[(path, name)] = value
        module.__dict__[name] = value

    def _restore_set_attributes(self) -> None:
        """Put back what the attributes forward set held before the trace (or remove them)."""
        for module, name, before in self._attribute_before.values():
            if before is _UNSET:
                module.__dict__.pop(name, None)
            else:
                module.__dict__[name] = before

    def _with_set_attributes(self, result):
        """The graph's result with the traced values of the attributes forward set, as (result, (values...)), and
        graph.meta["set_attributes"] naming them; a forward that read one's earlier tensor (kept from a call before
        the trace) cannot be compiled: the graph would keep that tensor as a constant."""
        if not self._set_attributes:
            return result
        constants = {id(t) for t in self.constants.values()}
        for module, name, before in self._attribute_before.values():
            if isinstance(before, Tensor) and id(before) in constants:
                error = TraceError(f"{type(module).__name__}.forward reads {name}, the tensor an earlier call set, "
                                   f"and sets it again: the compiled graph would keep the earlier tensor, so this "
                                   f"forward runs eagerly")
                error.module_path = self.path_of(module)
                raise error
        self.graph.meta["set_attributes"] = list(self._set_attributes)
        return result, tuple(self._set_attributes.values())

    # -- the trace ---------------------------------------------------------------------------------

    def trace(self, root: Module, concrete_args: dict | None = None, example_inputs: dict | None = None,
              dynamic: dict | None = None, shape_env=None) -> Graph:
        """Record root.forward. With example_inputs (argument name -> value), sizes are specialized: x.size(),
        x.shape, len(x) and x.dim() are the example's ints, so Python code on sizes just runs; an argument holding
        tensors inside tuples, lists or dicts becomes one placeholder per tensor (named `arg_0`, `arg_1`, ...).

        dynamic (placeholder name -> dims) with a shape_env (nnc.symbolic.ShapeEnv): those dims get a symbol each,
        and size queries answer with symbolic sizes (SymInts) where they depend on one."""
        if not isinstance(root, Module):
            raise TypeError(f"nnc.trace expects a runtime.nn.Module, got {type(root).__name__}")
        self._recorded_calls: set[int] = set()
        while True:
            try:
                return self._trace_once(root, concrete_args, example_inputs, dynamic, shape_env)
            except _TraceAgain as again:
                if again.call in self._recorded_calls:  # (forward made a different tensor there this time)
                    error = TraceError(f"traced values are written in place into a tensor made in forward, which "
                                       f"could not be traced (runtime call {again.call})")
                    error.module_path = ""
                    raise error from None
                self._recorded_calls.add(again.call)

    def _trace_once(self, root: Module, concrete_args, example_inputs, dynamic, shape_env) -> Graph:
        self.root, self.graph, self.constants = root, Graph(), {}
        self._records_grad = grad_mode.is_grad_enabled()  # no_grad blocks in forward matter only then
        self.specializes_sizes, self._values = example_inputs is not None, {}
        self.dynamic, self.shape_env = dict(dynamic or {}), shape_env if dynamic else None
        self._symbolic, self._replay = {}, None
        self._module_paths = {id(m): name for name, m in root.named_modules(remove_duplicate=False)}
        self._tensor_paths = {}
        # NOTE: the state tensors by path, read while Module.__getattr__ answers with proxies
        self._state_tensors = dict([*root.named_parameters(remove_duplicate=False),
                                    *root.named_buffers(remove_duplicate=False)])
        for name, t in self._state_tensors.items():
            self._tensor_paths.setdefault(id(t), name)  # a tied tensor is named by its first path, as torch does
        self._attr_nodes, self._module_stack, self._assigned = {}, [""], {}
        self._set_attributes: dict[tuple[str, str], Proxy] = {}  # (module path, name) -> traced value (set_attribute)
        self._attribute_before: dict = {}  # (id(module), name) -> (module, name, value before the trace)
        # NOTE: tensors a runtime function made during this trace (runtime.zeros(3) in forward): eager makes them
        # anew on every call, so a constant holding one is fresh per call (functionalize need not write it back)
        self._made: dict[int, Tensor] = {}
        self._made_by_call: dict[int, int] = {}  # id of such a tensor -> the number of the runtime call made it
        self._calls = 0  # runtime functions called so far in this trace (recorded or not)
        self._hook_set_tensors = {id(v) for m in root.modules() if m._forward_pre_hooks
                                  for v in vars(m).values() if isinstance(v, Tensor)}
        self.fresh_constants: set[str] = set()
        args = self._placeholders(root, concrete_args or {}, example_inputs)
        with self._patched(), _state_kept(root, self.specializes_sizes):
            try:
                # NOTE: the root's inline pre-hooks run here too: the compiled module also runs them eagerly
                # before each call (they see the wrapped model), but the graph must compute what they set
                for hook in inline_pre_hooks(root) if self.replays_attributes and has_hooks(root) else ():
                    hook(root, args.positional)
                result = self._run_watched(root, "", root.forward, args.positional, args.keyword,
                                           args.names)
            except TraceError as error:
                error.module_path = getattr(error, "module_path", "")
                raise
            finally:
                self._restore_set_attributes()
        self.graph.output(self._to_graph_args(self._with_set_attributes(result)))
        self.graph.meta.update(training=root.training, constants=self.constants,
                               concrete_args=dict(concrete_args or {}))
        if self.fresh_constants:
            self.graph.meta["fresh_constants"] = sorted(self.fresh_constants)
        return self.graph

    def _placeholders(self, root: Module, concrete_args: dict, example_inputs: dict | None):
        signature = inspect.signature(root.forward)
        unknown = set(concrete_args) - set(signature.parameters)
        if unknown:
            raise TraceError(f"concrete_args names {sorted(unknown)}, which {type(root).__name__}.forward does "
                             f"not take (its parameters: {list(signature.parameters)})")
        positional, keyword = [], {}
        for name, param in signature.parameters.items():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise TraceError(f"{type(root).__name__}.forward takes *{name}: tracing needs named arguments")
            if name in concrete_args:
                value = concrete_args[name]
            elif example_inputs is not None and name in example_inputs:
                value = self._example_placeholders(name, example_inputs[name])
            else:
                value = self._placeholder(name, param.default)  # Parameter.empty is NO_DEFAULT
            if param.kind == param.KEYWORD_ONLY:
                keyword[name] = value
            else:
                positional.append(value)
        names = [f"argument {name}" for name, param in signature.parameters.items()
                 if param.kind != param.KEYWORD_ONLY] + [f"argument {name}" for name in keyword]
        return _Args(positional, keyword, names)

    def _placeholder(self, name: str, default=inspect.Parameter.empty, example=None) -> Proxy:
        proxy = Proxy(self.graph.placeholder(name, default), self)
        proxy.node.meta["module_path"] = ""
        if example is not None:
            self._values[proxy.node] = example.detach().clone()  # in-place ops while tracing must not reach it
            if self.shape_env is not None:
                proxy.node.meta.update(shape=self._symbolic_shape(name, example), dtype=example.dtype)
        return proxy

    def _symbolic_shape(self, name: str, example: Tensor) -> tuple:
        """The example's shape with a new symbol for each of its dynamic dims (sizes 0 and 1 stay as they are)."""
        dims = self.dynamic.get(name, ())
        return tuple(self.shape_env.symbol(size, f"{name}'s dim {d}") if d in dims and size >= 2 else size
                     for d, size in enumerate(example.shape))

    def _example_placeholders(self, name: str, example):
        """A placeholder for a tensor; for a nested value, one per tensor inside it (other leaves stay as given)."""
        if isinstance(example, Tensor):
            return self._placeholder(name, example=example)
        leaves, spec = pytree.flatten(example)
        count = iter(range(len(leaves)))
        proxies = [self._placeholder(f"{name}_{next(count)}", example=leaf) if isinstance(leaf, Tensor) else leaf
                   for leaf in leaves]
        return pytree.unflatten(proxies, spec)

    # -- example values (sizes specialized) --------------------------------------------------------

    def value_of(self, node):
        """The example value of a recorded node: the graph so far runs on the example inputs, without hooks and
        without recording, the first time a size of one of its values is asked for."""
        if node not in self._values:
            with self._suspended(), no_grad():
                for n in self.graph.nodes:
                    if n not in self._values and n.op != "output":
                        self._values[n] = self._evaluate(n)
                    if n is node:
                        break
        return self._values[node]

    def symbolic_value_of(self, node):
        """The value of a recorded node as decompose sees it (a MetaValue: symbolic shape and dtype), replaying the
        graph so far on shape-only values the first time a node's sizes are asked for."""
        if node not in self._symbolic:
            from .passes.decompose import replay_for_tracer

            if self._replay is None:
                self._replay = replay_for_tracer(self)
            with self._suspended(), no_grad():
                for n in self.graph.nodes:
                    if n not in self._symbolic and n.op != "output":
                        self._symbolic[n] = self._replay(n, self._symbolic)
                    if n is node:
                        break
        value = self._symbolic[node]
        if not hasattr(value, "shape"):
            reason = getattr(getattr(value, "node", None), "meta", {}).get("opaque_reason", "it runs eagerly")
            raise TraceError(f"the sizes of {node.name} are not known symbolically {_where()} ({reason}); "
                             f"compile with static sizes")
        return value

    def _evaluate(self, node):
        args, kwargs = map_arg(node.args, self._values.__getitem__), map_arg(node.kwargs, self._values.__getitem__)
        if self.shape_env is not None:  # the example values are at the hint sizes
            args, kwargs = hint_of(args), hint_of(kwargs)
        if node.op == "get_attr":
            return self.constants[node.target] if node.target in self.constants else fetch_attr(self.root, node.target)
        if node.op == "call_module":  # no hooks: tracing is an analysis (as shape propagation)
            return fetch_attr(self.root, node.target).forward(*args, **kwargs)
        if node.op == "call_method":
            return getattr(args[0], node.target)(*args[1:], **kwargs)
        if node.op == "placeholder":
            raise TraceError(f"no example value for the input {node.target!r}")
        return node.target(*args, **kwargs)

    @contextlib.contextmanager
    def _patched(self):
        """While tracing: module calls, parameter reads and runtime's functions are routed to the tracer, for calls
        from the tracing thread only (other threads' eager code runs as it is); one thread traces at a time."""
        with PATCHING:
            with self._patched_here(threading.get_ident()):
                yield

    @contextlib.contextmanager
    def _patched_here(self, owner: int):
        tracer = self
        original_call, original_init = Module.__call__, Module.__init__
        original_getattr, original_setattr = Module.__getattr__, Module.__setattr__
        made_in_forward = weakref.WeakSet()  # modules constructed while tracing (a patch extractor built per call)

        def traced_init(module, *args, **kwargs):
            made_in_forward.add(module)
            original_init(module, *args, **kwargs)

        def traced_call(module, *args, **kwargs):
            if module in made_in_forward and not any(True for _ in module.parameters()) and \
                    not any(True for _ in module.buffers()):
                return original_call(module, *args, **kwargs)  # made anew per call, holding no tensors: inlined
            return tracer.call_module(module, module.forward, args, kwargs)

        def traced_getattr(module, name):
            if (id(module), name) in tracer._assigned:
                return tracer._assigned[id(module), name]
            value = original_getattr(module, name)
            if isinstance(value, Tensor) and id(value) in tracer._tensor_paths:
                return Proxy(tracer._tensor_node(value), tracer)
            return value

        def traced_setattr(module, name, value):
            # NOTE: a buffer assigned in forward (RunningMean's `self.mean = ...`) is recorded, never set while tracing
            buffer = name in module._buffers and (value is None or isinstance(value, (Proxy, Tensor)))
            if buffer:
                tracer.assign_buffer(module, name, value)
                return
            if isinstance(value, Proxy) and tracer.replays_attributes and not _registered(module, name):
                tracer.set_attribute(module, name, value)
                return
            if module in made_in_forward and not isinstance(value, (Proxy, Tensor)) and \
                    (not isinstance(value, Module) or value in made_in_forward):
                original_setattr(module, name, value)  # a module made anew by every call: no state outlives it
                return
            if _changes_state(module, name, value):
                raise TraceError(f"forward sets {type(module).__name__}.{name} {_where()}: the compiled graph would "
                                 f"not repeat that on later calls, so this forward runs eagerly (a tensor kept "
                                 f"across calls can be a buffer)")
            original_setattr(module, name, value)

        patches = [(Module, "__call__", for_thread(owner, traced_call, original_call)),
                   (Module, "__init__", for_thread(owner, traced_init, original_init)),
                   (Module, "__getattr__", for_thread(owner, traced_getattr, original_getattr)),
                   (Module, "__setattr__", for_thread(owner, traced_setattr, original_setattr))]
        for name in WRITING_METHODS:
            method = getattr(Tensor, name)
            patches.append((Tensor, name, for_thread(owner, _checked_write(method, tracer), method)))
        # NOTE: runtime.factories too: runtime's own layers call its factories there (a causal mask's arange), and
        # a symbolic size reaching them unrecorded would be pinned to its hint
        for namespace in (runtime, F, factories):
            for name, fn in list(vars(namespace).items()):
                if _is_api_function(namespace, name, fn):
                    patches.append((namespace, name, _recording(fn, tracer, owner)))
        saved = [(obj, name, obj.__dict__[name] if name in obj.__dict__ else getattr(obj, name))
                 for obj, name, _ in patches]
        self._patches, self._originals = patches, saved
        try:
            _set_all(patches)
            yield
        finally:
            _set_all(saved)

    @contextlib.contextmanager
    def _suspended(self):
        """The original functions back for a while (to run recorded nodes on example values)."""
        _set_all(self._originals)
        try:
            yield
        finally:
            _set_all(self._patches)


_UNSET = object()  # an attribute the module did not have


def _registered(module: Module, name: str) -> bool:
    """Whether `name` is one of the module's parameters, buffers or submodules."""
    return any(name in (module.__dict__.get(registry) or ()) for registry in ("_parameters", "_buffers", "_modules"))


def _changes_state(module: Module, name: str, value) -> bool:
    """Whether `module.name = value` in forward changes what later calls see: any traced value, tensor or module,
    or a plain value different from the one held (re-setting the same flag is harmless)."""
    if isinstance(value, (Proxy, Tensor, Module)):
        return True
    if name in module.__dict__:
        current = module.__dict__[name]
        return not (current is value or (type(current) is type(value) and _same_plain_value(current, value)))
    return True


def _same_plain_value(a, b) -> bool:
    try:
        return bool(a == b)
    except Exception:  # an object whose == is not a plain answer
        return False


# One thread at a time swaps runtime's functions and Module's methods process-wide (tracing, decompose); the
# stand-ins serve that thread only, and pass other threads' calls to the originals (see for_thread)
PATCHING = threading.RLock()


def for_thread(owner: int, stand_in, original):
    """`stand_in` for calls from the thread `owner`, `original` for every other thread's."""

    def call(*args, **kwargs):
        if threading.get_ident() != owner:
            return original(*args, **kwargs)
        return stand_in(*args, **kwargs)

    call.__wrapped__ = original
    return call


def _set_all(assignments) -> None:
    for obj, name, value in assignments:
        setattr(obj, name, value)


@contextlib.contextmanager
def _state_kept(root: Module, active: bool):
    """Running nodes on example values must leave the model as it was: its buffers (BatchNorm's running stats, a
    buffer assigned in forward), its modules' attributes (a submodule run as a call may keep a tensor or count its
    calls) and the random stream (dropout) are restored afterwards."""
    if not active:
        yield
        return
    buffers = [(m, dict(m._buffers), [b._data.copy() if b is not None else None for b in m._buffers.values()])
               for m in root.modules()]
    rng = runtime.get_rng_state()
    try:
        with attributes_kept(root):
            yield
    finally:
        runtime.set_rng_state(rng)
        for module, registry, arrays in buffers:
            module._buffers.clear()
            module._buffers.update(registry)
            for buffer, array in zip(registry.values(), arrays):
                if buffer is not None and not np.array_equal(buffer._data, array, equal_nan=True):
                    buffer._data[...] = array


@contextlib.contextmanager
def attributes_kept(root: Module):
    """Undo, on leaving, what running the model's code did to its modules' attributes and containers."""
    kept = AttributesKept(root)
    try:
        yield
    finally:
        kept.restore()


class _Args:
    def __init__(self, positional, keyword, names):
        self.positional, self.keyword = positional, keyword
        self.names = names  # "argument NAME" for each positional, then each keyword argument


_FUNCTIONAL_MORE = "runtime.nn._functional_more"


def _is_api_function(namespace, name: str, fn) -> bool:
    if name.startswith("_") or not callable(fn) or isinstance(fn, type):
        return False
    module = getattr(fn, "__module__", "") or ""
    if namespace is F:  # (F re-exports _functional_more's functions: CTC, grid_sample, unpooling, ...)
        return module in (F.__name__, _FUNCTIONAL_MORE)
    return module in ("runtime.api", "runtime.factories") and name in vars(runtime)


# runtime's functions that draw from a random generator
RANDOM_FACTORIES = ("rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "bernoulli",
                    "multinomial", "normal", "poisson")


def _recording(fn, tracer: Tracer, owner: int):
    """A stand-in for a runtime function: recorded as call_function when any argument is a proxy (in the tracing
    thread `owner`; other threads call `fn`)."""

    def recorder(*args, **kwargs):
        call, tracer._calls = tracer._calls, tracer._calls + 1
        symbolic = tracer.shape_env is not None and has_symbols((args, kwargs))  # arange(0, T): a node of its own
        # NOTE: a random draw is a node even of plain sizes (runtime.rand(3, 4)): as a constant it would be frozen
        drawn = getattr(fn, "__name__", "") in RANDOM_FACTORIES
        written = call in tracer._recorded_calls  # its tensor is written with traced values later (_TraceAgain)
        if _has_proxy(args) or _has_proxy(kwargs) or symbolic or drawn or written:
            if isinstance(kwargs.get("out"), Tensor):
                # NOTE: the write would happen in the graph only; the real tensor, which later Python code reads
                # while tracing, would keep its old value
                raise TraceError(f"out= a tensor that is not a traced value cannot be traced {_where()}: write "
                                 f"into a traced value, or use the result instead of out=")
            return tracer.create_proxy("call_function", fn, args, kwargs)
        result = fn(*args, **kwargs)
        if isinstance(result, Tensor):
            tracer._made[id(result)] = result
            tracer._made_by_call[id(result)] = call
        return result

    return for_thread(owner, recorder, fn)


# A module's own hook registries (the *_with_kwargs / always_called tables only annotate entries of these).
HOOK_TABLES = ("_forward_pre_hooks", "_forward_hooks", "_backward_hooks", "_backward_pre_hooks")


def has_hooks(module: Module) -> bool:
    """Whether any forward or backward hook is registered on the module itself."""
    return any(getattr(module, name) for name in HOOK_TABLES)


# Forward pre-hooks that only compute a module attribute from its parameters (torch.nn.utils.weight_norm's): a
# compiling trace runs them inline, so the attribute they set is a traced value (Tracer.set_attribute), and the
# module compiles with them instead of running as an eager call.
_INLINE_PRE_HOOK_TYPES = (WeightNorm,)


def inline_pre_hooks(module: Module) -> list:
    """The module's forward pre-hooks when every hook on it is one a trace runs inline, else []."""
    hooks = list(module._forward_pre_hooks.values())
    others = [name for name in HOOK_TABLES if name != "_forward_pre_hooks" and getattr(module, name)]
    if not hooks or others or getattr(module, "_forward_pre_hooks_with_kwargs", None):
        return []
    return hooks if all(type(h) in _INLINE_PRE_HOOK_TYPES for h in hooks) else []


def symbolic_trace(module: Module, concrete_args: dict | None = None, tracer: Tracer | None = None,
                   example_inputs: dict | None = None, dynamic: dict | None = None, shape_env=None):
    """Trace `module` into a GraphModule (same parameters, buffers and state_dict keys).

    example_inputs (argument name -> value) specializes sizes to those values (see Tracer.trace); without it the
    trace is symbolic, as torch.fx's."""
    from .graph_module import GraphModule

    tracer = tracer or Tracer()
    graph = tracer.trace(module, concrete_args, example_inputs, dynamic=dynamic, shape_env=shape_env)
    return GraphModule(module, graph, class_name=type(module).__name__)
