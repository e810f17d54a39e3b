"""nnc.compile: a Module that runs a model through the compiler, guarded, with a compiled backward and fallbacks."""
from __future__ import annotations

import copy
import functools
import inspect
import types
import warnings
import weakref
from collections.abc import Callable

import numpy as np

from runtime import amp, dtypes as dt
from runtime.autograd import grad_mode, no_grad
from runtime.nn import Module
from runtime.nn.modules import container, module as module_mod
from runtime.nn.parameter import Buffer, Parameter
from runtime.tensor import Tensor
from runtime.utils import state_version

from runtime.utils import _pytree as pytree
from .attribute_guards import AttributeChecks
from .codegen.targets import check_target
from .graph_module import share_state
from .pipeline import compile_arguments, debug, debug_level
from .symbolic import MIN_DYNAMIC_SIZE
from .trace import HOOK_TABLES, TraceError


class CompiledModule(Module):
    """Runs `module` compiled; shares its parameters, buffers, submodules and hooks (same state_dict)."""

    def __init__(self, module: Module, target: str | None = None, recompile_limit: int = 8, codegen: bool = True,
                 whole_graph: bool | None = None, dynamic: bool | None = None):
        super().__init__()
        if target is not None:
            _check_module_device(module, check_target(target))
        share_state(self, module)
        for name in ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
                     "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_backward_hooks",
                     "_backward_pre_hooks"):
            object.__setattr__(self, name, getattr(module, name))  # the root's hooks fire around this module
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_cache", {})
        object.__setattr__(self, "_keys", [])
        # Variants with symbolic sizes (nnc.symbolic): key with the dynamic dims' sizes wildcarded -> [compilations]
        object.__setattr__(self, "_dynamic_variants", {})
        object.__setattr__(self, "_dynamic_dims", {})  # (argument name, leaf position) -> dims seen changing
        object.__setattr__(self, "_dynamic_dim_sets", {})  # the dims each registered variant's key wildcards
        object.__setattr__(self, "_pinned_dims", {})  # dims a compile pinned to their size (static from then on)
        object.__setattr__(self, "_dynamic_failed", None)  # why a compile with symbolic sizes failed, once one did
        object.__setattr__(self, "_signature", inspect.signature(module.forward))
        positional = [p.name for p in self._signature.parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        object.__setattr__(self, "_positional", positional)
        # NOTE: the guards walk cached lists of the tree's modules, parameter tables and hook tables, which are
        # cheap on every call; they are rebuilt when the tree changes (a submodule replaced), which moves runtime's
        # module-state version (see _module_state)
        self._cache_tree(module)
        # Calls whose arguments are all tensors, passed positionally (nothing left to a default), may take the fast
        # path: a flat key (_fast_key) -> the artifact the full guards found for it (see forward)
        object.__setattr__(self, "_fast_arities", _fast_arities(self._signature))
        object.__setattr__(self, "_fast", {})
        object.__setattr__(self, "_state_seen", (None, None))  # (state_version.VERSION[0], _module_state's answer)
        # compiled variant -> the plain attributes of the model it read and froze (nnc.attribute_guards)
        object.__setattr__(self, "_attribute_checks", {})
        object.__setattr__(self, "_evicted", 0)  # variants dropped because such an attribute changed
        object.__setattr__(self, "_changed_attributes", {})  # their names, for the recompile-limit warning
        object.__setattr__(self, "_watches_globals", False)  # a variant froze a global tensor: checked every call
        self.recompile_limit = recompile_limit
        self.target = target
        self.codegen = codegen
        self.whole_graph = whole_graph
        self.dynamic = dynamic

    def __deepcopy__(self, memo):
        """A compiled copy of a deep copy of the model (an EMA copy, a frozen teacher): the same options, its own
        state and compiled variants (the variants hold the original's parameters, so none is shared)."""
        module = copy.deepcopy(self._module, memo)
        copied = CompiledModule(module, target=self.target, recompile_limit=self.recompile_limit,
                                codegen=self.codegen, whole_graph=self.whole_graph, dynamic=self.dynamic)
        memo[id(self)] = copied
        return copied

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

    def __setattr__(self, name: str, value) -> None:
        """Parameters, buffers and submodules go to the shared registries and the wrapper's own options stay here;
        any other attribute is set on the wrapped model, where its forward reads it (as torch.compile's module does).
        NOTE: a parent whose forward runs eagerly around compiled children (PartlyCompiled) holds the children's
        wrappers during the call, so `self.child.flag = ...` in its forward must reach the child itself."""
        d = self.__dict__
        module = d.get("_module")
        if module is None or name in d or name in _OWN_OPTIONS or _registers(d, name, value):
            super().__setattr__(name, value)
        else:
            setattr(module, name, value)

    def __delattr__(self, name: str) -> None:
        d = self.__dict__
        module = d.get("_module")
        if module is None or name in d or name in _OWN_OPTIONS or _registers(d, name, None):
            super().__delattr__(name)
        else:
            delattr(module, name)

    def __len__(self) -> int:
        """The wrapped model's length (a compiled Sequential or ModuleList), as torch.compile's module gives it."""
        module = self.__dict__["_module"]
        if not hasattr(type(module), "__len__"):
            raise TypeError(f"{type(module).__name__} does not support len()")
        return len(module)

    def __bool__(self) -> bool:
        """The wrapped model's truth: a module's, or an empty container's False (never len()'s TypeError)."""
        return bool(self.__dict__["_module"])

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
                parts.append((name, "tensor", value._data.shape, value._data.dtype.str, value._rg, type(value._data)))
            elif isinstance(value, (tuple, list, dict)):
                leaves, spec = pytree.flatten(value)
                parts.append((name, spec, tuple(_leaf_key(leaf) for leaf in leaves)))
            else:
                parts.append((name, "python", _hashable(value)))
        tree = self._module_state()[2]  # first: a changed tree refreshes the tables the other guards read
        if self._watches_globals:
            self._drop_stale_variants(globals_only=True)
        params = self._parameters_requiring_grad()
        return (tuple(parts), self._training_flags(), grad_mode.is_grad_enabled(), params, self._hook_signature(),
                self._state_storage(), amp.state.dtype, tree)

    def _state_storage(self) -> type | None:
        """The storage type of the module's first parameter (numpy's array on the CPU, a device array on CUDA):
        the device its compiled variants run on, part of the guard (a model moved by .to() recompiles)."""
        for table in self._parameter_tables:
            for p in table.values():
                if p is not None:
                    return type(p._data)
        return None

    def _hook_signature(self):
        """Which submodules have hooks (they are kernel boundaries), and the global hooks present.

        NOTE: presence is what compilation depends on: a hooked submodule runs as a call, which fires whatever hooks
        it has at that time."""
        hooked = tuple([bool(table) for table in self._hook_tables])
        globals_ = (bool(module_mod._global_forward_pre_hooks), bool(module_mod._global_forward_hooks),
                    bool(module_mod._global_backward_hooks))
        return hooked, globals_

    # -- running ---------------------------------------------------------------------------------------

    def _run_forward_pre_hooks(self, args, kwargs):
        """The root's forward pre-hooks, given the wrapped model as their module (as torch.compile's do), so one
        that sets an attribute (torch.nn.utils.prune's `module.weight`) sets it where forward reads it."""
        return self._module._run_forward_pre_hooks(args, kwargs)

    def _run_forward_hooks(self, args, kwargs, result, only_always_called: bool = False):
        """The root's forward hooks, given the wrapped model as their module."""
        return self._module._run_forward_hooks(args, kwargs, result, only_always_called)

    def __call__(self, *args, **kwargs):
        """Module.__call__. A call that no hook on this module nor a global one sees looks its fast-path entry up
        here (forward's first lines, without the frames of Module.__call__ and forward: ~0.2 us of a batch-1 call)."""
        if (kwargs or len(args) not in self._fast_arities or self._forward_hooks or self._forward_pre_hooks
                or self._backward_hooks or self._backward_pre_hooks or module_mod._global_forward_hooks
                or module_mod._global_forward_pre_hooks or module_mod._global_backward_hooks):
            return self._call_impl(*args, **kwargs)
        run = self._fast.get(self._fast_key(args))
        return run(args) if run is not None else self.forward(*args)

    def forward(self, *args, **kwargs):
        fast = self._fast_key(args) if not kwargs and len(args) in self._fast_arities else None
        if fast is not None:
            run = self._fast.get(fast)
            if run is not None:
                return run(args)
        arguments = self._bind(args, kwargs)
        key = self._guard_key(arguments)
        tensors = _argument_tensors(arguments)
        artifact = self._cache.get(key)
        if artifact is None and self._dynamic_variants:
            artifact = self._dynamic_variant(key, tensors)
        if artifact is None:
            artifact = self._compile(key, arguments)
        elif fast is not None:  # found by the full guards: the fast path serves this key from now on
            if len(self._fast) >= _MAX_FAST_KEYS:
                self._fast.clear()
            self._fast[fast] = self._fast_runner(artifact, args, fast[-2])
        return self._run(artifact, args, kwargs, tensors, key[3])

    def _fast_runner(self, artifact, args: tuple, params_rg) -> Callable:
        """What the fast path runs for calls with this call's fast key: the artifact's direct function where the call
        needs no gradient and the artifact has one (one numba call, little Python around it), else _run.

        NOTE: whether a call wants gradients is part of the fast key (grad mode, every argument's and parameter's
        requires_grad), so it is decided here once for all the calls the entry serves."""
        wants_grad = grad_mode.is_grad_enabled() and (any(t._rg for t in args) or any(params_rg))
        direct = getattr(artifact, "direct_runner", None)
        run = direct() if direct is not None and not wants_grad else None
        return run if run is not None else functools.partial(self._run_positional, artifact, params_rg)

    def _run_positional(self, artifact, params_rg, args: tuple):
        return self._run(artifact, args, {}, args, params_rg)

    def _run(self, artifact, args, kwargs, tensors, params_rg):
        if artifact is _EAGER:
            return self._module.forward(*args, **kwargs)
        if type(artifact) is PartlyCompiled:
            return artifact.run(args, kwargs)
        wants_grad = grad_mode.is_grad_enabled() and (any(t._rg for t in tensors) or any(params_rg))
        return artifact.run(tensors, wants_grad)

    def _fast_key(self, args) -> tuple | None:
        """A flat key holding everything the guards check for a call whose arguments are all tensors (None for any
        other call): each tensor's shape, dtype, array type (its device) and requires_grad, then the parameters'
        storage type (their device), the training flags, the autocast dtype, grad mode, the parameters' requires_grad
        (None under no_grad, where no compile depends on them) and the hooks present (None when there are none).

        NOTE: it maps to what the full guards found for an equal call (`_cache` and the variants with symbolic sizes
        lose entries only in _drop_stale_variants, which clears this table); it only saves building and hashing the
        full key."""
        parts = []
        for value in args:
            if not isinstance(value, Tensor):
                return None
            data = value._data
            parts += (data.shape, data.dtype, type(data), value._rg)
        grad = grad_mode.is_grad_enabled()
        params = self._parameters_requiring_grad() if grad else None
        hooks = self._hook_signature() if self._any_hooks() else None
        if self._watches_globals:
            self._drop_stale_variants(globals_only=True)
        return (*parts, self._module_state(), amp.state.dtype, grad, params, hooks)

    def _cache_tree(self, module: Module) -> None:
        modules = list(module.named_modules())
        object.__setattr__(self, "_module_list", modules)
        object.__setattr__(self, "_parameter_tables", [m._parameters for _, m in modules])
        object.__setattr__(self, "_hook_tables", [getattr(m, name) for path, m in modules if path
                                                  for name in HOOK_TABLES])
        object.__setattr__(self, "_tree", _tree_signature(modules))

    def _module_state(self) -> tuple:
        """(the parameters' storage type, the training flags, the tree's signature), re-read only when runtime's
        module-state version has moved (runtime.utils.state_version: every change to any of them moves it).

        NOTE: the version is read before the state, so a change made meanwhile moves it past the one kept."""
        version = state_version.VERSION[0]
        seen = self.__dict__["_state_seen"]
        if seen[0] == version:
            return seen[1]
        if _tree_signature(list(self._module.named_modules())) != self._tree:
            self._cache_tree(self._module)
        state = (self._state_storage(), self._training_flags(), self._tree)
        if self._attribute_checks:
            self._drop_stale_variants()
        self.__dict__["_state_seen"] = (version, state)
        return state

    def _drop_stale_variants(self, globals_only: bool = False) -> None:
        """Drop the compiled variants that froze a model attribute or a global tensor whose value has changed since
        (an attribute set moves the module-state version, so attributes are checked only then; globals on every call
        while a variant holds one): the next call compiles with the new value."""
        for key, (artifact, checks) in list(self._attribute_checks.items()):
            changed = checks.changed(globals_only)
            if not changed:
                continue
            del self._attribute_checks[key]
            for name in changed:
                self._changed_attributes[name] = None
            for cache_key, cached in list(self._cache.items()):
                if cached is artifact:
                    del self._cache[cache_key]
            for found in self._dynamic_variants.values():
                if artifact in found:
                    found.remove(artifact)
            self._fast.clear()
            self.__dict__["_evicted"] += 1
            debug(1, f"{self._module._get_name()}: {', '.join(changed)} changed; compiling anew")

    def _training_flags(self) -> tuple:
        """Every module's training flag: a submodule switched to eval alone (its dropout off) compiles anew."""
        return tuple([m.training for _, m in self._module_list])

    def _any_hooks(self) -> bool:
        return bool(any(self._hook_tables) or module_mod._global_forward_pre_hooks
                    or module_mod._global_forward_hooks or module_mod._global_backward_hooks)

    def _parameters_requiring_grad(self) -> tuple:
        return tuple([p._rg for table in self._parameter_tables for p in table.values() if p is not None])

    @property
    def compilations(self) -> list:
        """The compiled variants (nnc.pipeline.Compilation), static ones first."""
        static = [a for a in self._cache.values() if a is not _EAGER and type(a) is not PartlyCompiled]
        return static + [a for found in self._dynamic_variants.values() for a in found]

    @property
    def compiled_variants(self) -> int:
        """How many variants compiled successfully (failed compiles run eagerly and do not count); a variant with
        symbolic sizes counts once, whatever sizes it serves."""
        static = sum(1 for a in self._cache.values() if a is not _EAGER and type(a) is not PartlyCompiled)
        return static + sum(len(found) for found in self._dynamic_variants.values())

    def _partly_compiled(self, reason: str) -> "PartlyCompiled":
        """The module's own forward runs eagerly (it cannot be traced), its submodules compiled; made once."""
        partly = self.__dict__.get("_partly")
        if partly is None:
            options = dict(recompile_limit=self.recompile_limit, codegen=self.codegen, whole_graph=self.whole_graph,
                           dynamic=self.dynamic, target=self.target)
            partly = PartlyCompiled(self._module, reason, options)
            self.__dict__["_partly"] = partly
            debug(1, f"{self._module._get_name()}: graph break: its forward runs eagerly ({reason}); "
                     f"{len(partly.units)} submodules compile on their own")
        return partly

    def _dynamic_variant(self, key, tensors):
        """A compiled variant with symbolic sizes whose guards accept this call, or None."""
        for dims, wild in self._dynamic_dim_sets.items():
            for artifact in self._dynamic_variants.get((dims, _wildcard(key, wild)), ()):
                if artifact.accepts(tensors):
                    return artifact
        return None

    def _compile(self, key, arguments):
        changing = self._changing_dimension(key)
        dims = self._dims_to_make_dynamic(key, arguments)
        if dims and (changing is None or changing[1] in dims.get(changing[0], ())):
            artifact = self._compile_dynamic(key, arguments, dims)
            if artifact is not None:
                return artifact
            changing = self._changing_dimension(key)
        if changing is not None:
            # NOTE: where symbolic sizes failed (the reason is in NNC_DEBUG=1's output), kernels are generated for
            # static sizes; a dimension seen with a third value would compile once per value, seconds each. Such
            # calls run eagerly instead, and the variants compiled so far keep serving their sizes.
            what = f"{changing[0][0]}'s dim {changing[1]}"
            debug(1, f"{self._module._get_name()}: {what} keeps changing; running eagerly for its new sizes")
            warned = self.__dict__.setdefault("_changing_warned", set())
            if changing not in warned:
                warned.add(changing)
                why = ("with dynamic=False" if self.dynamic is False else
                       "it could not be compiled with symbolic sizes (NNC_DEBUG=1 says why)")
                warnings.warn(f"nnc.compile: {self._module._get_name()}'s {what} took a third size, and {why}; calls "
                              f"with new sizes of it run eagerly", RuntimeWarning, stacklevel=4)
            self._cache[key] = _EAGER
            return _EAGER
        return self._compile_variant(key, arguments)

    def _dims_to_make_dynamic(self, key, arguments) -> dict:
        """(argument name, leaf position) -> dims to compile with symbolic sizes: all of them with dynamic=True,
        those marked with nnc.mark_dynamic, and (by default) those seen with a second size."""
        if self.dynamic is False or self._dynamic_failed is not None:
            return {}
        shapes = _tensor_shapes(key)
        dims = {leaf: set(range(len(shape))) for leaf, shape in shapes.items()} if self.dynamic else {}
        leaves = _argument_leaves(arguments)
        for leaf, tensor in leaves.items():
            marked = _marked_dims(tensor)
            if marked:
                dims.setdefault(leaf, set()).update(d for d in marked if d < tensor.ndim)
        if self.dynamic is None:
            for leaf, dim in self._changed_dims(key):
                dims.setdefault(leaf, set()).add(dim)
        for leaf, seen in self._dynamic_dims.items():
            if leaf in dims:
                dims[leaf] |= seen
        pinned = self._pinned_dims
        dims = {leaf: {d for d in ds if shapes[leaf][d] >= MIN_DYNAMIC_SIZE and d not in pinned.get(leaf, ())}
                for leaf, ds in dims.items() if leaf in shapes}
        return {leaf: ds for leaf, ds in dims.items() if ds}

    def _changed_dims(self, key) -> list:
        """(leaf, dim) of tensor dims whose size differs from a compiled variant that differs from this key only in
        tensor sizes."""
        new_shapes = _tensor_shapes(key)
        changed = []
        for other, artifact in self._cache.items():
            if artifact is _EAGER or _wildcard(other, None) != _wildcard(key, None):
                continue
            for leaf, shape in _tensor_shapes(other).items():
                changed += [(leaf, d) for d, (a, b) in enumerate(zip(shape, new_shapes[leaf])) if a != b]
        return changed

    def _compile_dynamic(self, key, arguments, dims: dict):
        """A variant with symbolic sizes for `dims`, registered under the wildcarded key; None when the compile
        failed (the reason is kept, and static variants are compiled from then on). Dims the compile pinned to their
        size (a Python loop over a length) stay static from then on; a variant with every symbol pinned is a static
        one."""
        if self._compiles_used() >= self.recompile_limit:
            return None
        names = _placeholder_names(key)
        dynamic = {names[leaf]: tuple(sorted(ds)) for leaf, ds in dims.items() if leaf in names}
        artifact = self._compile_variant(key, arguments, dynamic=dynamic, register=False)
        if artifact is _EAGER:
            self.__dict__["_dynamic_failed"] = "the compile failed"
            debug(1, f"{self._module._get_name()}: no variant with symbolic sizes; compiling static sizes")
            return None
        env = artifact.shape_env
        pinned = {symbol.source for symbol in env.symbols if symbol.name in env.pinned}
        for leaf, ds in dims.items():
            for d in ds:
                table = self._pinned_dims if f"{names[leaf]}'s dim {d}" in pinned else self._dynamic_dims
                table.setdefault(leaf, set()).add(d)
        for name, why in env.pinned.items():
            debug(1, f"{self._module._get_name()}: {name} keeps a static size ({why})")
        self._keys.append(key)
        if set(env.pinned) >= set(env.names):  # nothing symbolic is left: right for these sizes only
            self._cache[key] = artifact
            return artifact
        dims = frozenset((leaf, d) for leaf, ds in self._dynamic_dims.items() for d in ds)
        self._dynamic_dim_sets.setdefault(dims, {leaf: set(ds) for leaf, ds in self._dynamic_dims.items()})
        self._dynamic_variants.setdefault((dims, _wildcard(key, self._dynamic_dims)), []).append(artifact)
        debug(1, f"{self._module._get_name()}: compiled with symbolic sizes:\n{env.describe()}")
        return artifact

    def _compiles_used(self) -> int:
        """Compiled variants held, and those dropped because an attribute they froze changed: the recompile limit
        counts both."""
        return self.compiled_variants + self._evicted

    def _compile_variant(self, key, arguments, dynamic: dict | None = None, register: bool = True):
        if self._compiles_used() >= self.recompile_limit:
            if not self.__dict__.get("_limit_warned"):
                warnings.warn(f"nnc.compile: {self._module._get_name()} was recompiled {self.recompile_limit} times "
                              f"(the recompile limit; {self._what_kept_changing()}); running eagerly for new "
                              f"inputs", RuntimeWarning, stacklevel=3)
                self.__dict__["_limit_warned"] = True
            return _EAGER
        if debug_level() >= 1:
            debug(1, f"compiling {self._module._get_name()}: {self._why_recompile(key)}")
        concrete, examples = split_arguments(arguments)
        target = self._target_of(key, pytree.tensor_leaves(list(examples.values())))
        if target is None:  # tensors on two devices: eager raises torch's error for that
            self._cache[key] = _EAGER
            return _EAGER
        needs_grad = key[2] and (any(t.requires_grad for t in pytree.tensor_leaves(list(examples.values())))
                                 or any(p.requires_grad for p in self._module.parameters()))
        try:
            with no_grad():
                artifact = compile_arguments(self._module, concrete, examples, needs_grad, codegen=self.codegen,
                                             whole_graph=self.whole_graph, dynamic=dynamic, target=target)
        except Exception as error:  # never a wrong answer: run eagerly, and say why
            if dynamic:  # the caller compiles static sizes instead
                debug(1, f"{self._module._get_name()}: symbolic sizes failed ({type(error).__name__}: {error})")
                return _EAGER
            reason = root_trace_error(error)
            if reason is not None and self._module._modules:  # its forward runs eagerly, its submodules compile
                artifact = self._partly_compiled(reason)
            else:
                warnings.warn(f"nnc.compile: could not compile {self._module._get_name()} "
                              f"({type(error).__name__}: {error}); running it eagerly", RuntimeWarning, stacklevel=4)
                artifact = _EAGER
        if getattr(artifact, "attribute_reads", None):
            checks = AttributeChecks(artifact.attribute_reads)
            self._attribute_checks[id(artifact)] = (artifact, checks)
            if checks.globals:
                self.__dict__["_watches_globals"] = True
        for graph_break in getattr(artifact, "graph_breaks", ()):
            debug(1, f"{self._module._get_name()}: {graph_break.path} runs eagerly ({graph_break.reason})")
        if register:
            self._cache[key] = artifact
            self._keys.append(key)
        return artifact

    def _target_of(self, key, tensors: list) -> str | None:
        """The target a variant compiles for: the one asked for, else the device of the parameters and inputs
        (None when they are on two devices). A tensor on the other device than an asked-for target raises."""
        state = key[5]
        cuda = [t.is_cuda for t in tensors if t.ndim]  # a 0-dim CPU tensor is a scalar beside CUDA ones, as in torch
        if state is not None:
            cuda.append(state is not np.ndarray)
        if self.target is not None:
            if any(on != (self.target == "cuda") for on in cuda):
                other = "the CPU" if self.target == "cuda" else "CUDA"
                raise RuntimeError(f"nnc.compile(target={self.target!r}): {self._module._get_name()} got tensors on "
                                   f"{other}; {_MOVE_HINT[self.target]}")
            return self.target
        if any(cuda) and not all(cuda):
            return None
        return "cuda" if any(cuda) else "cpu"

    def _changing_dimension(self, key) -> tuple | None:
        """(leaf, dim) when this key gives a static tensor dimension a third distinct size, among the compiled
        variants (dimensions with symbolic sizes do not count)."""
        new_shapes = _tensor_shapes(key)
        seen: dict = {}
        for other in self._keys:
            for leaf, shape in _tensor_shapes(other).items():
                for dim, size in enumerate(shape):
                    seen.setdefault((leaf, len(shape), dim), set()).add(size)
        for leaf, shape in new_shapes.items():
            for dim, size in enumerate(shape):
                if dim in self._dynamic_dims.get(leaf, ()):  # symbolic, or one of sizes 0 and 1
                    continue
                sizes = seen.get((leaf, len(shape), dim), set())
                if size not in sizes and len(sizes) >= 2:
                    return leaf, dim
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
        for name in self._changed_attributes:
            seen[f"attribute {name}"] = None
        return "changed: " + ", ".join(seen) if seen else "no change recorded"


class PartlyCompiled:
    """A module whose own forward cannot be traced (Python control flow on tensor values): the forward runs eagerly,
    and every submodule it calls runs compiled (a CompiledModule of its own, with its own guards and fallbacks).

    NOTE: during a call the module's registries hold the compiled submodules, so `self.fc1(x)` in the forward (and
    an iteration over a ModuleList) reaches them; they share the submodules' parameters, buffers and hooks, so state
    and results are those of eager. After the call the registries get the original submodules back."""

    def __init__(self, module: Module, reason: str, options: dict):
        self.module, self.reason = module, reason
        self.units: list[_Unit] = []
        _collect_units(module, options, self.units)

    def run(self, args, kwargs):
        for unit in self.units:
            unit.registry[unit.name] = unit.compiled
        try:
            return self.module.forward(*args, **kwargs)
        finally:
            for unit in self.units:
                unit.registry[unit.name] = unit.original

    @property
    def compiled(self) -> dict:
        """Submodule path -> its CompiledModule."""
        return {unit.path: unit.compiled for unit in self.units}


class _Unit:
    __slots__ = ("registry", "name", "path", "original", "compiled")

    def __init__(self, registry: dict, name: str, path: str, original: Module, compiled: "CompiledModule"):
        self.registry, self.name, self.path, self.original, self.compiled = registry, name, path, original, compiled


def _collect_units(module: Module, options: dict, units: list, prefix: str = "") -> None:
    """The submodules a forward calls: children, and the entries of ModuleLists and ModuleDicts (which are indexed
    or iterated, not called)."""
    for name, child in module._modules.items():
        if child is None:
            continue
        if isinstance(child, (container.ModuleList, container.ModuleDict)):
            _collect_units(child, options, units, f"{prefix}{name}.")
        else:
            units.append(_Unit(module._modules, name, f"{prefix}{name}", child, CompiledModule(child, **options)))


def root_trace_error(error) -> str | None:
    """The reason, when a compile failed because the module's own forward (not a submodule's) cannot be traced."""
    cause = getattr(error, "cause", error)
    if isinstance(cause, TraceError) and not getattr(cause, "module_path", ""):
        return str(cause)
    return None


_GUARD_LABELS = ("arguments", "training flags", "grad mode", "parameters' requires_grad", "hooks",
                 "parameters' device", "autocast", "module tree")
_MOVE_HINT = {"cuda": "move the model and its inputs to the GPU first (model.to('cuda'), x.cuda())",
              "cpu": "move them to the CPU first (model.cpu(), x.cpu()), or compile with target='cuda'"}


def _tree_signature(modules: list) -> tuple:
    """Which module object is at each path, which parameter object at each name, and which buffer entries are None:
    what a compiled variant depends on beyond values (a submodule replaced, a bias set to None, a weight tied or
    replaced, whose gradient must reach the new parameter), so a change compiles anew.

    NOTE: buffers by None-ness only: a buffer rebound in forward (a running statistic) changes its object every call"""
    return tuple([(path, id(m), tuple([(k, id(v)) for k, v in m._parameters.items()]),
                   tuple([k for k, v in m._buffers.items() if v is None])) for path, m in modules])


def _check_module_device(module: Module, target: str) -> None:
    """A target asked for must be where the module's parameters and buffers are: a clear error otherwise."""
    on_other = [name for name, t in (*module.named_parameters(), *module.named_buffers())
                if t is not None and t.is_cuda != (target == "cuda")]
    if on_other:
        where = "the CPU" if target == "cuda" else "CUDA"
        more = f" and {len(on_other) - 1} more tensors are" if len(on_other) > 1 else " is"
        raise ValueError(f"nnc.compile(target={target!r}): {module._get_name()}'s {on_other[0]}{more} on {where}; "
                         f"{_MOVE_HINT[target]}")


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
    if before[1] == after[1] == "tensor" and before[5:] != after[5:]:
        return f"{name}'s device"
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


def _wildcard(key, dims: dict | None):
    """The guard key with the sizes of `dims` ((argument name, leaf position) -> dims) replaced by None, where
    they are at least MIN_DYNAMIC_SIZE (sizes 0 and 1 are compiled apart); with dims None, every tensor size (keys
    equal then differ only in tensor sizes)."""
    def blank(shape, leaf):
        if dims is None:
            return (None,) * len(shape)
        chosen = dims.get(leaf, ())
        return tuple(None if d in chosen and size >= MIN_DYNAMIC_SIZE else size for d, size in enumerate(shape))

    parts = []
    for part in key[0]:
        if part[1] == "tensor":
            parts.append((part[0], "tensor", blank(part[2], (part[0], 0)), *part[3:]))
        elif isinstance(part[1], pytree.Spec):
            leaves = tuple((leaf[0], blank(leaf[1], (part[0], i)), *leaf[2:]) if leaf[0] == "tensor" else leaf
                           for i, leaf in enumerate(part[2]))
            parts.append((part[0], part[1], leaves))
        else:
            parts.append(part)
    return (tuple(parts), *key[1:])


def _placeholder_names(key) -> dict:
    """(argument name, leaf position) -> the name of the graph placeholder of that tensor."""
    names = {}
    for part in key[0]:
        if part[1] == "tensor":
            names[(part[0], 0)] = part[0]
        elif isinstance(part[1], pytree.Spec):
            tensors = [i for i, leaf in enumerate(part[2]) if leaf[0] == "tensor"]
            for j, i in enumerate(tensors):
                names[(part[0], i)] = f"{part[0]}_{j}"
    return names


def marked_placeholder_dims(arguments: dict) -> dict:
    """placeholder name -> the dims nnc.mark_dynamic marked on that input tensor (for nnc.explain and dump)."""
    names, leaves = {}, _argument_leaves(arguments)
    for name in arguments:
        positions = sorted(i for (arg, i) in leaves if arg == name)
        nested = not isinstance(arguments[name], Tensor)
        for j, i in enumerate(positions):
            names[(name, i)] = f"{name}_{j}" if nested else name
    return {names[leaf]: tuple(sorted(dims)) for leaf, tensor in leaves.items()
            if (dims := {d for d in _marked_dims(tensor) if tensor.shape[d] >= MIN_DYNAMIC_SIZE})}


def _argument_leaves(arguments: dict) -> dict:
    """(argument name, leaf position) -> tensor, as _tensor_shapes numbers them."""
    leaves = {}
    for name, value in arguments.items():
        if isinstance(value, Tensor):
            leaves[(name, 0)] = value
        elif isinstance(value, (tuple, list, dict)):
            for i, leaf in enumerate(pytree.flatten(value)[0]):
                if isinstance(leaf, Tensor):
                    leaves[(name, i)] = leaf
    return leaves


_MARKED: dict = {}  # id(tensor) -> (weak reference, dims): nnc.mark_dynamic's marks


def mark_dynamic(tensor: Tensor, dim) -> None:
    """Compile dimension `dim` (an int or a list of them) of this tensor with a symbolic size from its first call:
    one compiled variant then serves every size there (sizes 0 and 1 are compiled apart)."""
    if not isinstance(tensor, Tensor):
        raise TypeError(f"nnc.mark_dynamic expects a runtime Tensor, got {type(tensor).__name__}")
    dims = [dim] if isinstance(dim, int) else list(dim)
    for d in dims:
        if not isinstance(d, int) or not -tensor.ndim <= d < max(tensor.ndim, 1):
            raise IndexError(f"nnc.mark_dynamic: dim {d!r} is out of range for a tensor of shape "
                             f"{list(tensor.shape)}")
    ref = weakref.ref(tensor, lambda _, key=id(tensor): _MARKED.pop(key, None))
    previous = _marked_dims(tensor)
    _MARKED[id(tensor)] = (ref, previous | {d % tensor.ndim for d in dims})


def _marked_dims(tensor: Tensor) -> set:
    entry = _MARKED.get(id(tensor))
    if entry is None or entry[0]() is not tensor:
        return set()
    return set(entry[1])


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
        return ("tensor", leaf._data.shape, leaf._data.dtype.str, leaf._rg, type(leaf._data))
    return ("python", _hashable(leaf))


def _fast_arities(signature) -> frozenset:
    """The numbers of positional arguments a call may pass to take the fast path: every parameter positional, and
    those left out having defaults of immutable types (a call leaving them out always binds the same values)."""
    parameters = list(signature.parameters.values())
    if any(p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in parameters):
        return frozenset()
    arities = {len(parameters)}
    for k in reversed(range(len(parameters))):
        if type(parameters[k].default) not in _IMMUTABLE_DEFAULTS:
            break
        arities.add(k)
    return frozenset(arities)


_IMMUTABLE_DEFAULTS = (type(None), bool, int, float, str, bytes)


def _uses_super(function) -> bool:
    """Whether a method calls super() (it then needs an instance of its class as self)."""
    return "__class__" in function.__code__.co_freevars


_EAGER = object()
# The wrapper's own attributes (set in CompiledModule.__init__); any other plain attribute belongs to the model
_OWN_OPTIONS = frozenset({"recompile_limit", "target", "codegen", "whole_graph", "dynamic", "training"})


def _registers(d: dict, name: str, value) -> bool:
    """Whether `module.name = value` goes to a registry (a parameter, buffer or submodule), which the wrapper
    shares with the model."""
    if isinstance(value, (Parameter, Buffer, Module)):
        return True
    return any(name in d.get(table, ()) for table in ("_parameters", "_buffers", "_modules"))
_MAX_FAST_KEYS = 256  # fast-path keys kept (a generate loop meets a new size per token): then it starts over


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


def unwrapped(module: Module) -> Module:
    """The model a CompiledModule runs (it shares its state and hooks); any other module as it is.
    NOTE: a CompiledModule's own forward takes *args, which cannot be traced: compiling or explaining it would
    run its root eagerly and retrace every submodule, with misleading warnings."""
    return module._module if isinstance(module, CompiledModule) else module


def compile(module: Module, target: str | None = None, recompile_limit: int = 8, codegen: bool = True,
            whole_graph: bool | None = None, dynamic: bool | None = None) -> CompiledModule:
    """Compile `module`: same parameters and state_dict, same results, faster (see docs/architecture.md).

    dynamic: None (the default) compiles static sizes first and, when a dimension changes size, one variant with
    that dimension symbolic (kernels take sizes as arguments), as torch's automatic dynamic shapes; True makes every
    dimension symbolic from the first call; False always compiles static sizes. nnc.mark_dynamic(x, dim) marks one.

    whole_graph: None (the default) runs a forward without gradients as one numba function when its values are
    small (nnc.codegen.whole_graph), True asks for that (with a warning when a graph does not qualify), False never.

    target: None (the default) follows the device of the parameters and inputs: CUDA tensors (`model.to("cuda")`)
    run generated CUDA kernels (nnc.cuda_executor), CPU tensors numba's parallel CPU kernels. "cpu" or "cuda" asks
    for one; a module or input on the other device then raises, saying to move it first.
    """
    if not isinstance(module, Module):
        raise TypeError(f"nnc.compile expects a runtime.nn.Module, got {type(module).__name__}")
    module = unwrapped(module)
    return CompiledModule(module, target=target, recompile_limit=recompile_limit, codegen=codegen,
                          whole_graph=whole_graph, dynamic=dynamic)
