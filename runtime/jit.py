"""torch.jit's Python-level API for code that uses it while running eagerly: model code asks is_scripting(), marks
methods with ignore/unused/export and attributes with Final, and training scripts script or trace a module before
running it. TorchScript compiles the same semantics, so here script and trace return what they are given (trace runs
it once on the example, as torch's does), fork runs its call at once, and the decorators change nothing.
TorchScript archives are not: save and load raise, naming runtime.save. nnc.compile is the compiler here."""
from __future__ import annotations

import builtins
import contextlib
import typing
from typing import Final  # noqa: F401  (torch.jit.Final: attribute annotations in model code)

from .futures import Future

Error = RuntimeError


class ScriptModule:
    """torch's class of scripted modules; nothing here is one (script returns the module itself)."""


class ScriptFunction:
    """torch's class of scripted functions; nothing here is one (script returns the function itself)."""


def is_scripting() -> bool:
    return False


def is_tracing() -> bool:
    return False


def script(obj, optimize=None, _frames_up=0, _rcb=None, example_inputs=None):
    """The module or function itself: it runs eagerly with the semantics TorchScript would compile."""
    return obj


def script_if_tracing(fn):
    return fn


def trace(func, example_inputs=None, optimize=None, check_trace=True, check_inputs=None, check_tolerance=1e-5,
          strict=True, _force_outplace=False, _module_class=None, _compilation_unit=None, example_kwarg_inputs=None,
          _store_inputs=True):
    """func itself, after one call on the example inputs (torch's trace runs it once too, and so fails where it
    would)."""
    if example_kwarg_inputs is not None:
        func(**example_kwarg_inputs)
    elif example_inputs is not None:
        func(*(example_inputs if builtins.isinstance(example_inputs, tuple) else (example_inputs,)))
    return func


def trace_module(mod, inputs, **kwargs):
    for method, example in inputs.items():
        getattr(mod, method)(*(example if builtins.isinstance(example, tuple) else (example,)))
    return mod


def _decorator(fn=None, **options):
    """A decorator usable bare (@ignore) or with options (@ignore(drop=True)) that returns the function itself."""
    if fn is None:
        return lambda f: f
    return fn


ignore = unused = export = interface = _decorator


def annotate(the_type, the_value):
    return the_value


def Attribute(value, type):  # noqa: N802, A002 (torch's names)
    return value


def isinstance(obj, target_type) -> bool:  # noqa: A001 (torch.jit.isinstance)
    """Whether obj is of a type that may be a typing container (List[int], Dict[str, Tensor], Optional[...])."""
    origin, args = typing.get_origin(target_type), typing.get_args(target_type)
    if origin is None:
        return builtins.isinstance(obj, target_type)
    if origin is typing.Union:
        return any(isinstance(obj, a) for a in args)
    if not builtins.isinstance(obj, origin):
        return False
    if origin in (list, set) and args:
        return all(isinstance(v, args[0]) for v in obj)
    if origin is dict and args:
        return all(isinstance(k, args[0]) and isinstance(v, args[1]) for k, v in obj.items())
    if origin is tuple and args:
        return len(obj) == len(args) and all(isinstance(v, a) for v, a in zip(obj, args))
    return True


def fork(func, *args, **kwargs) -> Future:
    """A future holding func(*args, **kwargs), computed now (torch may run it on another thread)."""
    future = Future()
    future.set_result(func(*args, **kwargs))
    return future


def wait(future):
    return future.wait()


def freeze(mod, preserved_attrs=None, optimize_numerics=True):
    return mod


def optimize_for_inference(mod, other_methods=None):
    return mod


@contextlib.contextmanager
def optimized_execution(should_optimize):
    yield


@contextlib.contextmanager
def fuser(name):
    yield


def set_fusion_strategy(strategy):
    return [("STATIC", 2), ("DYNAMIC", 10)]  # torch's default, which it returns as the previous strategy


def enable_onednn_fusion(enabled: bool) -> None:
    """Nothing to switch: no TorchScript fuser runs here."""


def onednn_fusion_enabled() -> bool:
    return False


def save(m, f, _extra_files=None):
    raise RuntimeError("runtime.jit.save: TorchScript archives are not supported; save the weights with "
                       "runtime.save(model.state_dict(), f) and rebuild the model from its code")


def load(f, map_location=None, _extra_files=None):
    raise RuntimeError("runtime.jit.load: TorchScript archives are not supported; load weights saved with "
                       "runtime.save into the model built from its code")
