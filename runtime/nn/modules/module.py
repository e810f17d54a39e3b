"""nn.Module with torch's semantics: registration, traversal, hooks, train/eval, movement and state_dict."""
from __future__ import annotations

import itertools
from collections import OrderedDict, namedtuple

from ... import dtypes as dt
from ... import memory_formats as mf
from ...autograd import grad_mode
from ...autograd.function import Function
from ...device import check_device
from ...tensor import Tensor, _write_broadcast, copy_array
from ...utils import state_version
from ...utils.hooks import RemovableHandle
from ..parameter import Buffer, Parameter

_global_forward_pre_hooks: dict = OrderedDict()
_global_forward_hooks: dict = OrderedDict()
_global_forward_hooks_always_called: dict = OrderedDict()
_global_backward_hooks: dict = OrderedDict()


def register_module_forward_pre_hook(hook) -> RemovableHandle:
    """A forward pre-hook for every module: hook(module, args) -> None or new args."""
    handle = RemovableHandle(_global_forward_pre_hooks)
    _global_forward_pre_hooks[handle.id] = hook
    return handle


def register_module_forward_hook(hook, *, always_call: bool = False) -> RemovableHandle:
    """A forward hook for every module: hook(module, args, output) -> None or a new output."""
    handle = RemovableHandle(_global_forward_hooks, extra_dict=_global_forward_hooks_always_called)
    _global_forward_hooks[handle.id] = hook
    if always_call:
        _global_forward_hooks_always_called[handle.id] = True
    return handle


def register_module_full_backward_hook(hook) -> RemovableHandle:
    """A full backward hook for every module: hook(module, grad_input, grad_output)."""
    handle = RemovableHandle(_global_backward_hooks)
    _global_backward_hooks[handle.id] = hook
    return handle


class _IncompatibleKeys(namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])):
    """What load_state_dict returns; prints <All keys matched successfully> when both lists are empty."""

    def __repr__(self) -> str:
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return super().__repr__()

    __str__ = __repr__


def _addindent(text: str, spaces: int) -> str:
    lines = text.split("\n")
    if len(lines) == 1:
        return text
    return lines[0] + "\n" + "\n".join(" " * spaces + line for line in lines[1:])


def _typename(value) -> str:
    return type(value).__name__ if not isinstance(value, Tensor) else "runtime.Tensor"


def _module_format(t, fmt):
    """The memory format Module.to gives a parameter or buffer: as torch, only 4-d and 5-d ones are converted (and
    here, to a channels-last format only those of its rank)."""
    if t.ndim == fmt.rank or (fmt.rank is None and t.ndim in (4, 5)):
        return fmt
    return mf.preserve_format


class Module:
    """Base class for all neural-network modules (torch.nn.Module)."""

    dump_patches = False
    _version = 1
    training: bool
    call_super_init = False

    def __init__(self, *args, **kwargs) -> None:
        if args or kwargs:
            raise TypeError(f"{type(self).__name__}.__init__() got unexpected arguments {args} {kwargs}")
        setattr_ = object.__setattr__
        setattr_(self, "training", True)
        for name in ("_parameters", "_buffers", "_modules", "_backward_pre_hooks", "_backward_hooks",
                     "_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
                     "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_state_dict_hooks",
                     "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks"):
            setattr_(self, name, OrderedDict())
        setattr_(self, "_non_persistent_buffers_set", set())

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f'Module [{type(self).__name__}] is missing the required "forward" function')

    # ------------------------------------------------------------------------------------------
    # registration
    # ------------------------------------------------------------------------------------------

    def _check_new_name(self, kind: str, name, registry: str) -> None:
        if registry not in self.__dict__:
            raise AttributeError(f"cannot assign {kind} before Module.__init__() call")
        if not isinstance(name, str):
            raise TypeError(f"{kind} name should be a string. Got {type(name).__name__}")
        if "." in name:
            raise KeyError(f'{kind} name can\'t contain "."')
        if name == "":
            raise KeyError(f'{kind} name can\'t be empty string ""')
        if hasattr(self, name) and name not in self.__dict__[registry]:
            raise KeyError(f"attribute '{name}' already exists")

    def register_buffer(self, name: str, tensor, persistent: bool = True) -> None:
        self._check_new_name("buffer", name, "_buffers")
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"cannot assign '{_typename(tensor)}' object to buffer '{name}' "
                            f"(runtime Tensor or None required)")
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)
        state_version.bump()

    def register_parameter(self, name: str, param) -> None:
        self._check_new_name("parameter", name, "_parameters")
        if param is not None:
            if not isinstance(param, Parameter):
                raise TypeError(f"cannot assign '{_typename(param)}' object to parameter '{name}' "
                                f"(runtime.nn.Parameter or None required)")
            if param.grad_fn is not None:
                raise ValueError(f"Cannot assign non-leaf Tensor to parameter '{name}'. Model parameters must be "
                                 f"created explicitly. To express '{name}' as a function of another Tensor, compute "
                                 f"the value in the forward() method.")
        self._parameters[name] = param
        state_version.bump()

    def add_module(self, name: str, module) -> None:
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{_typename(module)} is not a Module subclass")
        self._check_new_name("module", name, "_modules")
        self._modules[name] = module
        state_version.bump()

    register_module = add_module

    def __getattr__(self, name: str):
        d = self.__dict__
        for registry in ("_parameters", "_buffers", "_modules"):
            if registry in d and name in d[registry]:
                return d[registry][name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __setattr__(self, name: str, value) -> None:
        try:
            d = self.__dict__
            params = d.get("_parameters")
            if isinstance(value, Parameter):
                if params is None:
                    raise AttributeError("cannot assign parameters before Module.__init__() call")
                self._forget(name, keep="_parameters")
                self.register_parameter(name, value)
            elif params is not None and name in params:
                if value is not None:
                    raise TypeError(f"cannot assign '{_typename(value)}' as parameter '{name}' "
                                    f"(runtime.nn.Parameter or None expected)")
                self.register_parameter(name, value)
            elif isinstance(value, Module):
                if d.get("_modules") is None:
                    raise AttributeError("cannot assign module before Module.__init__() call")
                self._forget(name, keep="_modules")
                d["_modules"][name] = value
            elif d.get("_modules") is not None and name in d["_modules"]:
                if value is not None:
                    raise TypeError(f"cannot assign '{_typename(value)}' as child module '{name}' "
                                    f"(runtime.nn.Module or None expected)")
                d["_modules"][name] = value
            elif isinstance(value, Buffer) or (d.get("_buffers") is not None and name in d["_buffers"]):
                if value is not None and not isinstance(value, Tensor):
                    raise TypeError(f"cannot assign '{_typename(value)}' as buffer '{name}' (Tensor or None expected)")
                if isinstance(value, Buffer):
                    self._forget(name, keep="_buffers")
                    self.register_buffer(name, Tensor._from_array(value._data), value.persistent)
                else:
                    d["_buffers"][name] = value
            else:
                object.__setattr__(self, name, value)
        finally:  # (even a failed assignment may have dropped the old attribute: _forget)
            state_version.bump()

    def _forget(self, name: str, keep: str) -> None:
        """Drop `name` from every registry but `keep` (re-assigning an attribute changes its kind)."""
        d = self.__dict__
        d.pop(name, None)
        for registry in ("_parameters", "_buffers", "_modules"):
            if registry != keep:
                d[registry].pop(name, None)
        if keep != "_buffers":
            d["_non_persistent_buffers_set"].discard(name)

    def __delattr__(self, name: str) -> None:
        try:
            for registry in ("_parameters", "_buffers", "_modules"):
                if name in self.__dict__.get(registry, ()):
                    del self.__dict__[registry][name]
                    self._non_persistent_buffers_set.discard(name)
                    return
            object.__delattr__(self, name)
        finally:
            state_version.bump()

    def __dir__(self):
        keys = set(dir(type(self))) | set(self.__dict__) | set(self._parameters) | set(self._modules) \
            | set(self._buffers)
        return sorted(k for k in keys if not k[:1].isdigit())

    # ------------------------------------------------------------------------------------------
    # traversal
    # ------------------------------------------------------------------------------------------

    def _named_members(self, get_members, prefix="", recurse=True, remove_duplicate=True):
        seen = set()
        modules = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse \
            else [(prefix, self)]
        for module_prefix, module in modules:
            for name, value in get_members(module):
                if value is None or (remove_duplicate and id(value) in seen):
                    continue
                if remove_duplicate:
                    seen.add(id(value))
                yield (module_prefix + ("." if module_prefix else "") + name, value)

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        return self._named_members(lambda m: m._parameters.items(), prefix, recurse, remove_duplicate)

    def parameters(self, recurse: bool = True):
        for _, param in self.named_parameters(recurse=recurse):
            yield param

    def named_buffers(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        return self._named_members(lambda m: m._buffers.items(), prefix, recurse, remove_duplicate)

    def buffers(self, recurse: bool = True):
        for _, buf in self.named_buffers(recurse=recurse):
            yield buf

    def named_children(self):
        seen = set()
        for name, module in self._modules.items():
            if module is not None and id(module) not in seen:
                seen.add(id(module))
                yield name, module

    def children(self):
        for _, module in self.named_children():
            yield module

    def named_modules(self, memo=None, prefix: str = "", remove_duplicate: bool = True):
        if memo is None:
            memo = set()
        if id(self) in memo and remove_duplicate:
            return
        if remove_duplicate:
            memo.add(id(self))
        yield prefix, self
        for name, module in self._modules.items():
            if module is None:
                continue
            yield from module.named_modules(memo, prefix + ("." if prefix else "") + name, remove_duplicate)

    def modules(self):
        for _, module in self.named_modules():
            yield module

    def get_submodule(self, target: str) -> "Module":
        if target == "":
            return self
        module = self
        for item in target.split("."):
            if not hasattr(module, item):
                raise AttributeError(f"{module._get_name()} has no attribute `{item}`")
            module = getattr(module, item)
            if not isinstance(module, Module):
                raise AttributeError(f"`{item}` is not an nn.Module")
        return module

    def _get_owned(self, target: str, registry: str, kind: str):
        module_path, _, name = target.rpartition(".")
        module = self.get_submodule(module_path)
        if not hasattr(module, name):
            raise AttributeError(f"{module._get_name()} has no attribute `{name}`")
        if name not in getattr(module, registry):
            raise AttributeError(f"`{name}` is not {kind}")
        return getattr(module, name)

    def get_parameter(self, target: str) -> Parameter:
        return self._get_owned(target, "_parameters", "an nn.Parameter")

    def get_buffer(self, target: str) -> Tensor:
        return self._get_owned(target, "_buffers", "a buffer")

    def get_extra_state(self):
        raise RuntimeError("Reached a code path in Module.get_extra_state() that should never be called.")

    def set_extra_state(self, state) -> None:
        raise RuntimeError("Reached a code path in Module.set_extra_state() that should never be called.")

    def _has_extra_state(self) -> bool:
        return type(self).get_extra_state is not Module.get_extra_state

    # ------------------------------------------------------------------------------------------
    # mode and movement
    # ------------------------------------------------------------------------------------------

    def train(self, mode: bool = True) -> "Module":
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        self.training = mode
        for module in self.children():
            module.train(mode)
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parameters():
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.detach_()
                    p.grad.zero_()

    def apply(self, fn) -> "Module":
        for module in self.children():
            module.apply(fn)
        fn(self)
        return self

    def _apply(self, fn, recurse: bool = True) -> "Module":
        """Replace every parameter's and buffer's data by fn(tensor), keeping the Parameter objects."""
        if recurse:
            for module in self.children():
                module._apply(fn)
        for param in self._parameters.values():
            if param is None:
                continue
            with grad_mode.no_grad():
                param._data = fn(param)._data
            if param.grad is not None:
                param._grad = Tensor._from_array(fn(param.grad)._data)
        for key, buf in self._buffers.items():
            if buf is not None:
                self._buffers[key] = fn(buf)
        state_version.bump()
        return self

    def to(self, *args, **kwargs) -> "Module":
        dtype = kwargs.pop("dtype", None)
        device = kwargs.pop("device", None)
        device = check_device(device) if device is not None else None
        kwargs.pop("non_blocking", None)
        fmt = mf.checked(kwargs.pop("memory_format", None), "to")
        if kwargs:
            raise TypeError(f"to() got unexpected keyword arguments {sorted(kwargs)}")
        for a in args:
            if isinstance(a, Tensor):
                dtype, device = a.dtype, a.device
            elif isinstance(a, dt.dtype):
                dtype = a
            else:
                device = check_device(a)
        if dtype is not None:
            dtype = dt.as_dtype(dtype)
            if not dtype.is_differentiable:
                raise TypeError(f"nn.Module.to only accepts floating point or complex dtypes, but got desired "
                                f"dtype={dtype}")
        if device is not None and all(t.device == device for t in self._tensors()):
            device = None
        if dtype is None and device is None and fmt is mf.preserve_format:
            return self
        return self._apply(lambda t: t.to(device=device, dtype=dtype if t.dtype.is_differentiable else None,
                                          memory_format=_module_format(t, fmt)))

    def _tensors(self):
        """Every parameter and buffer of this module and its submodules."""
        for module in self.modules():
            yield from (t for t in module._parameters.values() if t is not None)
            yield from (t for t in module._buffers.values() if t is not None)

    def float(self) -> "Module":
        return self._apply(lambda t: t.float() if t.is_floating_point() else t)

    def double(self) -> "Module":
        return self._apply(lambda t: t.double() if t.is_floating_point() else t)

    def half(self) -> "Module":
        return self._apply(lambda t: t.half() if t.is_floating_point() else t)

    def type(self, dst_type) -> "Module":
        return self._apply(lambda t: t.to(dst_type))

    def cpu(self) -> "Module":
        return self.to("cpu")

    def cuda(self, device=None) -> "Module":
        return self.to(check_device(device if device is not None else "cuda"))

    def share_memory(self) -> "Module":
        """Every parameter and buffer (and gradient already allocated) moved into shared memory: Tensor's
        share_memory_, so processes started afterwards train this same model (Hogwild)."""
        for t in [*self.parameters(), *self.buffers()]:
            t.share_memory_()
            if t.grad is not None:
                t.grad.share_memory_()
        return self

    # ------------------------------------------------------------------------------------------
    # hooks and calling
    # ------------------------------------------------------------------------------------------

    def register_forward_pre_hook(self, hook, *, prepend: bool = False, with_kwargs: bool = False):
        handle = RemovableHandle(self._forward_pre_hooks, extra_dict=self._forward_pre_hooks_with_kwargs)
        _insert(self._forward_pre_hooks, handle.id, hook, prepend)
        if with_kwargs:
            self._forward_pre_hooks_with_kwargs[handle.id] = True
        return handle

    def register_forward_hook(self, hook, *, prepend: bool = False, with_kwargs: bool = False,
                              always_call: bool = False):
        handle = RemovableHandle(self._forward_hooks, extra_dict=self._forward_hooks_with_kwargs)
        _insert(self._forward_hooks, handle.id, hook, prepend)
        if with_kwargs:
            self._forward_hooks_with_kwargs[handle.id] = True
        if always_call:
            self._forward_hooks_always_called[handle.id] = True
        return handle

    def register_full_backward_pre_hook(self, hook, prepend: bool = False):
        handle = RemovableHandle(self._backward_pre_hooks)
        _insert(self._backward_pre_hooks, handle.id, hook, prepend)
        return handle

    def register_full_backward_hook(self, hook, prepend: bool = False):
        handle = RemovableHandle(self._backward_hooks)
        _insert(self._backward_hooks, handle.id, hook, prepend)
        return handle

    def register_backward_hook(self, hook):
        raise NotImplementedError("register_backward_hook (the non-full form) is deprecated in torch; "
                                  "use register_full_backward_hook")

    def _call_impl(self, *args, **kwargs):
        if not (self._forward_hooks or self._forward_pre_hooks or self._backward_hooks or self._backward_pre_hooks
                or _global_forward_hooks or _global_forward_pre_hooks or _global_backward_hooks):
            return self.forward(*args, **kwargs)
        args, kwargs = self._run_forward_pre_hooks(args, kwargs)
        backward_hooks = _BackwardHooks.for_module(self)
        if backward_hooks is not None:
            args = backward_hooks.wrap_inputs(args)
        try:
            result = self.forward(*args, **kwargs)
        except Exception:
            self._run_forward_hooks(args, kwargs, None, only_always_called=True)
            raise
        result = self._run_forward_hooks(args, kwargs, result)
        if backward_hooks is not None:
            result = backward_hooks.wrap_outputs(result)
        return result

    __call__ = _call_impl

    def _run_forward_pre_hooks(self, args, kwargs):
        for hook_id, hook in (*_global_forward_pre_hooks.items(), *self._forward_pre_hooks.items()):
            if hook_id in self._forward_pre_hooks_with_kwargs:
                result = hook(self, args, kwargs)
                if result is not None:
                    if not (isinstance(result, tuple) and len(result) == 2):
                        raise RuntimeError(f"forward pre-hook must return None or a tuple of (new_args, new_kwargs), "
                                           f"but got {result}.")
                    args, kwargs = result
            else:
                result = hook(self, args)
                if result is not None:
                    args = result if isinstance(result, tuple) else (result,)
        return args, kwargs

    def _run_forward_hooks(self, args, kwargs, result, only_always_called: bool = False):
        for hook_id, hook in (*_global_forward_hooks.items(), *self._forward_hooks.items()):
            if only_always_called and not (hook_id in self._forward_hooks_always_called
                                           or hook_id in _global_forward_hooks_always_called):
                continue
            if hook_id in self._forward_hooks_with_kwargs:
                replaced = hook(self, args, kwargs, result)
            else:
                replaced = hook(self, args, result)
            if replaced is not None and not only_always_called:
                result = replaced
        return result

    # ------------------------------------------------------------------------------------------
    # state
    # ------------------------------------------------------------------------------------------

    def register_state_dict_pre_hook(self, hook):
        handle = RemovableHandle(self._state_dict_pre_hooks)
        self._state_dict_pre_hooks[handle.id] = hook
        return handle

    def register_state_dict_post_hook(self, hook):
        handle = RemovableHandle(self._state_dict_hooks)
        self._state_dict_hooks[handle.id] = hook
        return handle

    _register_state_dict_hook = register_state_dict_post_hook

    def register_load_state_dict_pre_hook(self, hook):
        """hook(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)."""
        handle = RemovableHandle(self._load_state_dict_pre_hooks)
        self._load_state_dict_pre_hooks[handle.id] = hook
        return handle

    def register_load_state_dict_post_hook(self, hook):
        """hook(module, incompatible_keys); it may edit the key lists in place."""
        handle = RemovableHandle(self._load_state_dict_post_hooks)
        self._load_state_dict_post_hooks[handle.id] = hook
        return handle

    def _save_to_state_dict(self, destination, prefix: str, keep_vars: bool) -> None:
        for name, param in self._parameters.items():
            if param is not None:
                destination[prefix + name] = param if keep_vars else param.detach()
        for name, buf in self._buffers.items():
            if buf is not None and name not in self._non_persistent_buffers_set:
                destination[prefix + name] = buf if keep_vars else buf.detach()
        if self._has_extra_state():
            destination[prefix + "_extra_state"] = self.get_extra_state()

    def state_dict(self, *args, destination=None, prefix: str = "", keep_vars: bool = False):
        if args:  # the legacy positional form state_dict(destination, prefix, keep_vars)
            destination, prefix, keep_vars = (list(args) + [destination, prefix, keep_vars][len(args):])[:3]
        if destination is None:
            destination = OrderedDict()
            destination._metadata = OrderedDict()
        local_metadata = dict(version=self._version)
        if hasattr(destination, "_metadata"):
            destination._metadata[prefix[:-1]] = local_metadata
        for hook in self._state_dict_pre_hooks.values():
            hook(self, prefix, keep_vars)
        self._save_to_state_dict(destination, prefix, keep_vars)
        for name, module in self._modules.items():
            if module is not None:
                module.state_dict(destination=destination, prefix=prefix + name + ".", keep_vars=keep_vars)
        for hook in self._state_dict_hooks.values():
            result = hook(self, destination, prefix, local_metadata)
            if result is not None:
                destination = result
        return destination

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        """Copy this module's own entries from state_dict (the override point for custom loading)."""
        for hook in self._load_state_dict_pre_hooks.values():
            hook(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)
        persistent = {k: v for k, v in self._buffers.items() if k not in self._non_persistent_buffers_set}
        local_state = {k: v for k, v in itertools.chain(self._parameters.items(), persistent.items()) if v is not None}
        assign = local_metadata.get("assign_to_params_buffers", False)
        for name, param in local_state.items():
            key = prefix + name
            if key not in state_dict:
                if strict:
                    missing_keys.append(key)
                continue
            self._load_one(name, key, param, state_dict[key], assign, error_msgs)
        extra_key = prefix + "_extra_state"
        if self._has_extra_state():
            if extra_key in state_dict:
                self.set_extra_state(state_dict[extra_key])
            elif strict:
                missing_keys.append(extra_key)
        elif strict and extra_key in state_dict:
            unexpected_keys.append(extra_key)
        if strict:
            for key in state_dict:
                if key.startswith(prefix) and key != extra_key:
                    head = key[len(prefix):].split(".", 1)[0]
                    if head not in self._modules and head not in local_state:
                        unexpected_keys.append(key)

    def _load_one(self, name, key, param, value, assign, error_msgs) -> None:
        if not isinstance(value, Tensor):
            error_msgs.append(f'While copying the parameter named "{key}", expected a Tensor from checkpoint '
                              f"but received {type(value)}")
            return
        from ..parameter import is_lazy

        if not is_lazy(param) and tuple(value.shape) != tuple(param.shape):
            error_msgs.append(f"size mismatch for {key}: copying a param with shape {value.shape} from checkpoint, "
                              f"the shape in current model is {param.shape}.")
            return
        with grad_mode.no_grad():
            if is_lazy(param):
                param.materialize(value.shape, value.dtype)
            if assign:
                replacement = value
                if name in self._parameters and not isinstance(value, Parameter):
                    replacement = Parameter(value, requires_grad=param.requires_grad)
                setattr(self, name, replacement) if name in self._parameters else self._buffers.__setitem__(name, value)
            else:
                param.copy_(value)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Load parameters and buffers; on any error nothing changes and the message lists every problem."""
        if not hasattr(state_dict, "keys"):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict)}.")
        metadata = getattr(state_dict, "_metadata", None)
        state_dict = OrderedDict(state_dict)
        missing, unexpected, errors = [], [], []
        snapshot = _Snapshot(self)

        def load(module, local_state, prefix=""):
            local_metadata = dict(metadata.get(prefix[:-1], {})) if metadata is not None else {}
            if assign:
                local_metadata["assign_to_params_buffers"] = True
            module._load_from_state_dict(local_state, prefix, local_metadata, True, missing, unexpected, errors)
            for name, child in module._modules.items():
                if child is not None:
                    child_prefix = prefix + name + "."
                    load(child, {k: v for k, v in local_state.items() if k.startswith(child_prefix)}, child_prefix)
            keys = _IncompatibleKeys(missing, unexpected)
            for hook in module._load_state_dict_post_hooks.values():
                hook(module, keys)

        try:
            load(self, state_dict)
        except BaseException:  # NOTE: KeyboardInterrupt from a hook too: a failed load changes nothing
            snapshot.restore()
            raise
        if strict:
            if unexpected:
                keys = ", ".join(f'"{k}"' for k in unexpected)
                errors.insert(0, f"Unexpected key(s) in state_dict: {keys}. ")
            if missing:
                errors.insert(0, "Missing key(s) in state_dict: {}. ".format(", ".join(f'"{k}"' for k in missing)))
        if errors:
            snapshot.restore()
            raise RuntimeError("Error(s) in loading state_dict for {}:\n\t{}".format(type(self).__name__,
                                                                                    "\n\t".join(errors)))
        return _IncompatibleKeys(missing, unexpected)

    # ------------------------------------------------------------------------------------------
    # printing
    # ------------------------------------------------------------------------------------------

    def _get_name(self) -> str:
        return type(self).__name__

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        extra = self.extra_repr()
        extra_lines = extra.split("\n") if extra else []
        child_lines = [f"({key}): " + _addindent(repr(module), 2) for key, module in self._modules.items()]
        lines = extra_lines + child_lines
        main = self._get_name() + "("
        if lines:
            if len(extra_lines) == 1 and not child_lines:
                main += extra_lines[0]
            else:
                main += "\n  " + "\n  ".join(lines) + "\n"
        return main + ")"

    def __setstate__(self, state) -> None:
        self.__dict__.update(state)


def _insert(hooks: dict, key, hook, prepend: bool) -> None:
    hooks[key] = hook
    if prepend:
        hooks.move_to_end(key, last=False)


class _Snapshot:
    """The registries and tensors of a module tree, to undo a failed load_state_dict: contents, classes,
    requires_grad and version counters, so a graph recorded before the failed load still runs backward."""

    def __init__(self, root: Module):
        self.entries = []
        for module in root.modules():
            tensors = [t for t in itertools.chain(module._parameters.values(), module._buffers.values())
                       if t is not None]
            saved_extra = module.get_extra_state() if module._has_extra_state() else None
            self.entries.append((module, dict(module._parameters), dict(module._buffers),
                                 [_TensorState(t) for t in tensors], saved_extra))

    def restore(self) -> None:
        for module, params, buffers, tensors, extra in self.entries:
            module._parameters.clear()
            module._parameters.update(params)
            module._buffers.clear()
            module._buffers.update(buffers)
            for state in tensors:
                state.restore()
            if extra is not None:
                module.set_extra_state(extra)
        state_version.bump()


class _TensorState:
    """One tensor's memory, contents, class, requires_grad and version, as they were before a load."""

    def __init__(self, t: Tensor):
        self.tensor, self.array, self.contents, self.cls, self.rg = t, t._data, copy_array(t._data), t.__class__, t._rg
        # NOTE: the counter object is shared with the tensor's views; restoring its value in place restores theirs
        self.counter = t._vc()
        self.version = self.counter[0]

    def restore(self) -> None:
        t = self.tensor
        t._data = self.array
        _write_broadcast(self.array, self.contents)
        t.__class__, t._rg = self.cls, self.rg
        t._version_counter = self.counter
        self.counter[0] = self.version


class _BackwardHookFunction(Function):
    """Identity on tensors; its backward hands the gradients to a callback that may replace them."""

    @staticmethod
    def forward(ctx, callback, *tensors):
        ctx.callback = callback
        ctx.set_materialize_grads(False)
        return tensors

    @staticmethod
    def backward(ctx, *grads):
        return (None,) + tuple(ctx.callback(grads))


class _BackwardHooks:
    """Full backward (pre-)hooks of one module call: capture grad_output, then grad_input."""

    def __init__(self, module: Module, hooks, pre_hooks):
        self.module, self.hooks, self.pre_hooks = module, hooks, pre_hooks
        self.grad_output = None
        self.n_inputs = 0
        self.inputs_require_grad = False

    @classmethod
    def for_module(cls, module: Module):
        hooks = [*_global_backward_hooks.values(), *module._backward_hooks.values()]
        pre_hooks = list(module._backward_pre_hooks.values())
        if not (hooks or pre_hooks) or not grad_mode.is_grad_enabled():
            return None
        return cls(module, hooks, pre_hooks)

    def wrap_inputs(self, args):
        """Route the tensor arguments through the hook function (all of them, as torch does)."""
        self.n_args = len(args)
        self.tensor_positions = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
        self.inputs_require_grad = any(args[i].requires_grad for i in self.tensor_positions)
        if not self.inputs_require_grad:
            return args
        wrapped = _BackwardHookFunction.apply(self._on_grad_input, *(args[i] for i in self.tensor_positions))
        wrapped = wrapped if isinstance(wrapped, tuple) else (wrapped,)
        args = list(args)
        for i, w in zip(self.tensor_positions, wrapped):
            args[i] = w
        return tuple(args)

    def wrap_outputs(self, result):
        single = isinstance(result, Tensor)
        outputs = (result,) if single else result
        if not isinstance(outputs, tuple) or not any(isinstance(o, Tensor) and o.requires_grad for o in outputs):
            return result
        positions = [i for i, o in enumerate(outputs) if isinstance(o, Tensor) and o.requires_grad]
        wrapped = _BackwardHookFunction.apply(self._on_grad_output, *(outputs[i] for i in positions))
        wrapped = wrapped if isinstance(wrapped, tuple) else (wrapped,)
        outputs = list(outputs)
        for i, w in zip(positions, wrapped):
            outputs[i] = w
        return outputs[0] if single else tuple(outputs)

    def _on_grad_output(self, grads):
        for hook in self.pre_hooks:
            replaced = hook(self.module, grads)
            if replaced is not None:
                grads = tuple(replaced) if isinstance(replaced, (tuple, list)) else (replaced,)
        self.grad_output = grads
        if not self.inputs_require_grad:  # torch fires the hooks here, with no input gradients
            for hook in self.hooks:
                hook(self.module, (None,) * self.n_args, grads)
        return grads

    def _on_grad_input(self, grads):
        """Hooks see one grad_input entry per positional argument (None for non-tensors)."""
        full = [None] * self.n_args
        for i, g in zip(self.tensor_positions, grads):
            full[i] = g
        for hook in self.hooks:
            replaced = hook(self.module, tuple(full), self.grad_output)
            if replaced is not None:
                if len(replaced) != self.n_args:
                    raise RuntimeError(f"Backward hook returned an invalid number of grad_input, got "
                                       f"{len(replaced)}, but expected {self.n_args}")
                full = list(replaced)
        return tuple(full[i] for i in self.tensor_positions)
