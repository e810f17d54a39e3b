"""torch.nn.utils.parametrize: a module's tensor computed from stored originals by a chain of modules.

`register_parametrization(module, "weight", P)` moves the parameter to `module.parametrizations.weight.original`
(or `original0`, `original1`, ... when `P.right_inverse` returns several tensors, as weight_norm's does) and makes
`module.weight` a property that runs the chain on every read; assigning to it runs the chain's right inverses. The
module's class becomes a subclass named `Parametrized<Class>` that holds the properties, as in torch, so state_dict
keys (`parametrizations.weight.original0`) and reprs match torch's.
"""
from __future__ import annotations

import contextlib

from ...autograd import grad_mode
from ...tensor import Tensor
from ..modules.container import ModuleDict, ModuleList
from ..modules.module import Module
from ..parameter import Parameter

__all__ = ["register_parametrization", "remove_parametrizations", "is_parametrized", "cached",
           "ParametrizationList", "type_before_parametrizations"]

_cache_enabled = 0
_cache: dict = {}


@contextlib.contextmanager
def cached():
    """Inside this context, each parametrized tensor is computed once, on its first read, and then reused."""
    global _cache_enabled
    _cache_enabled += 1
    try:
        yield
    finally:
        _cache_enabled -= 1
        if not _cache_enabled:
            _cache.clear()


def _as_parameter(t, requires_grad):
    return t if isinstance(t, Parameter) else Parameter(t.detach(), requires_grad=requires_grad)


class ParametrizationList(ModuleList):
    """The chain of parametrizations of one tensor, and the original tensor(s) it is computed from."""

    def __init__(self, modules, original, unsafe=False):
        if len(modules) == 0:
            raise ValueError("ParametrizationList requires one or more modules.")
        super().__init__(modules)
        self.unsafe = unsafe
        with grad_mode.no_grad():
            new = original
            for module in reversed(list(self)):
                if hasattr(module, "right_inverse"):
                    new = module.right_inverse(new)
        self.is_tensor = isinstance(new, Tensor)
        self.ntensors = 1 if self.is_tensor else len(new)
        if self.is_tensor:
            if new is not original:
                if tuple(new.shape) != tuple(original.shape) or new.dtype != original.dtype:
                    raise ValueError(f"When `right_inverse` outputs one tensor, it may not change the shape or "
                                     f"dtype. original.shape: {tuple(original.shape)}, "
                                     f"right_inverse(original).shape: {tuple(new.shape)}")
                with grad_mode.no_grad():
                    original.copy_(new)
            self.register_parameter("original", _as_parameter(original, original.requires_grad))
        else:
            for i, t in enumerate(new):
                if not isinstance(t, Tensor):
                    raise ValueError(f"'right_inverse' must return a Tensor or a Sequence of tensors (list, "
                                     f"tuple...). Got element {i} of type {type(t).__name__}")
                self.register_parameter(f"original{i}", _as_parameter(t, original.requires_grad))

    def right_inverse(self, value) -> None:
        """Set the originals so that the chain computes `value` (assignment to the parametrized attribute)."""
        with grad_mode.no_grad():
            for module in reversed(list(self)):
                if hasattr(module, "right_inverse"):
                    value = module.right_inverse(value)
                elif not self.unsafe:
                    raise RuntimeError(f"parametrization {type(module).__name__} does not implement "
                                       f"right_inverse.")
            if self.is_tensor:
                self.original.copy_(value)
            else:
                for i, t in enumerate(value):
                    getattr(self, f"original{i}").copy_(t)

    def forward(self):
        modules = list(self)
        if self.is_tensor:
            x = modules[0](self.original)
        else:
            x = modules[0](*(getattr(self, f"original{i}") for i in range(self.ntensors)))
        for module in modules[1:]:
            x = module(x)
        return x


def _property(name):
    def get(self):
        chain = self.parametrizations[name]
        if _cache_enabled:
            key = (id(self), name)
            if key not in _cache:
                _cache[key] = chain()
            return _cache[key]
        return chain()

    def set(self, value):
        self.parametrizations[name].right_inverse(value)

    return property(get, set)


def _inject_class(module):
    cls = module.__class__
    module.__class__ = type(f"Parametrized{cls.__name__}", (cls,), {"_runtime_original_class": cls})


def register_parametrization(module, tensor_name, parametrization, *, unsafe=False):
    """Make `module.<tensor_name>` the output of `parametrization` applied to the stored original."""
    if not isinstance(parametrization, Module):
        raise TypeError(f"parametrization must be an nn.Module, got {type(parametrization).__name__}")
    if is_parametrized(module, tensor_name):
        module.parametrizations[tensor_name].append(parametrization)
        return module
    if tensor_name in module._parameters or tensor_name in module._buffers:
        original = getattr(module, tensor_name)
        chain = ParametrizationList([parametrization], original, unsafe=unsafe)
        delattr(module, tensor_name)
        if not is_parametrized(module):
            _inject_class(module)
            module.parametrizations = ModuleDict()
        setattr(type(module), tensor_name, _property(tensor_name))
        module.parametrizations[tensor_name] = chain
        return module
    raise ValueError(f"Module '{module}' does not have a parameter, a buffer, or a parametrized element with name "
                     f"'{tensor_name}'")


def is_parametrized(module, tensor_name=None) -> bool:
    chains = module.__dict__.get("_modules", {}).get("parametrizations")
    if chains is None or not isinstance(chains, ModuleDict):
        return False
    return tensor_name is None or tensor_name in chains


def remove_parametrizations(module, tensor_name, leave_parametrized=True):
    """Undo register_parametrization: the attribute becomes a Parameter again, holding the parametrized value
    (leave_parametrized=True) or the original (only possible when there is a single original tensor)."""
    if not is_parametrized(module, tensor_name):
        raise ValueError(f"Module {module} does not have a parametrization on {tensor_name}")
    chain = module.parametrizations[tensor_name]
    if chain.is_tensor:
        original = chain.original
        if leave_parametrized:
            with grad_mode.no_grad():
                value = getattr(module, tensor_name)
                original.copy_(value)
    else:
        if not leave_parametrized:
            raise ValueError("Cannot leave unparametrized (`leave_parametrized=False`) a tensor that is parametrized "
                             "in terms of a sequence of tensors.")
        with grad_mode.no_grad():
            value = getattr(module, tensor_name)
        original = Parameter(value.detach().clone(), requires_grad=value.requires_grad or chain.original0.requires_grad)
    delattr(type(module), tensor_name)
    del module.parametrizations[tensor_name]
    module.register_parameter(tensor_name, original)
    if not module.parametrizations:
        del module.parametrizations
        module.__class__ = module.__class__._runtime_original_class
    return module


def type_before_parametrizations(module) -> type:
    return getattr(type(module), "_runtime_original_class", type(module)) if is_parametrized(module) else type(module)

