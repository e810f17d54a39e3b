"""nnc.compile: a Module that runs a model through the compiler, guarded, with a compiled backward and fallbacks."""
from __future__ import annotations

import inspect
import types
import warnings

from runtime import dtypes as dt
from runtime.autograd import grad_mode, no_grad
from runtime.nn import Module
from runtime.nn.modules import module as module_mod
from runtime.tensor import Tensor

from . import pytree
from .graph_module import share_state
from .pipeline import compile_arguments, debug, debug_level
from .trace import HOOK_TABLES


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
                artifact = compile_arguments(self._module, concrete, examples, needs_grad, codegen=self.codegen,
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
