"""The Python state a forward can change besides tensors (lists, dicts, sets and plain objects reachable from a
module's attributes, its arguments or the globals its code names), snapshot so that a trace can tell when forward
changed it, and undo that."""
from __future__ import annotations

import collections
import functools
import inspect
import random
import sys
import types

import numpy as np

from runtime.nn import Module
from runtime.tensor import Tensor

# NOTE: a bound on the objects one snapshot walks, so a module holding a huge structure (a dataset's Python lists)
# costs a bounded time to compile; what lies beyond is not checked.
MAX_OBJECTS = 20_000

# Values never walked into: immutable scalars, tensors (in-place writes to them are nnc.passes.functionalize's),
# modules (each traced module's own snapshot covers it), numpy arrays, and code and type objects. (Traced values,
# nnc's Proxy objects, are skipped with runtime's and nnc's other objects: _contents.)
_LEAVES = (int, float, complex, bool, str, bytes, type(None), type(Ellipsis), Tensor, Module, np.ndarray, np.generic,
           type, types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.BuiltinMethodType,
           types.ModuleType, functools.partial, property, staticmethod, classmethod)
_PLAIN = (int, float, complex, bool, str, bytes, type(None))


@functools.cache
def module_registry_names() -> frozenset:
    """The attributes every Module has (its registries, hook tables and flags): not the model's own state."""
    return frozenset(Module().__dict__)


class ReachableState:
    """A snapshot of the lists, dicts, sets and plain objects (their `__dict__`) reachable from some roots, each with
    a path that names it for the user (`cfg.calls`, `cache['k']`, `argument past`)."""

    def __init__(self, roots: list[tuple[str, object]]):
        self.saved: list[tuple[str, object, object]] = []  # (path, object, its shallow contents then)
        seen: set[int] = set()
        todo = list(reversed(roots))
        while todo and len(self.saved) < MAX_OBJECTS:
            path, value = todo.pop()
            if isinstance(value, _LEAVES) or id(value) in seen:
                continue
            seen.add(id(value))
            contents = _contents(value)
            if contents is None:
                continue
            if not isinstance(value, (tuple, frozenset)):
                self.saved.append((path, value, _copy(contents)))
            todo.extend(reversed(list(_children(path, value, contents))))

    @classmethod
    def of_module(cls, module: Module, path: str = "") -> "ReachableState":
        """What `module`'s own attributes hold (not its registries or submodules, nor the attributes themselves:
        setting one in forward is caught where it happens)."""
        own = module_registry_names()
        roots = [(f"{path}.{name}".lstrip("."), value) for name, value in vars(module).items() if name not in own]
        return cls(roots)

    @classmethod
    def of_globals(cls, function) -> "ReachableState":
        """The globals `function`'s code names (a counter it rebinds with `global`, a list it appends to), and
        what they reach."""
        function = inspect.unwrap(getattr(function, "__func__", function))
        namespace, code = getattr(function, "__globals__", None), getattr(function, "__code__", None)
        if not isinstance(namespace, dict) or code is None:
            return cls([])
        return cls([("global", _Names(namespace, [n for n in _code_names(code) if n in namespace]))])

    def changed(self) -> str | None:
        """The path of the first value that changed since the snapshot, or None."""
        for path, value, before in self.saved:
            what = _difference(path, value, before)
            if what is not None:
                return what
        return None

    def restore(self) -> bool:
        """Put back what changed; whether anything had."""
        changed = False
        for path, value, before in self.saved:
            if _difference(path, value, before) is not None:
                changed = True
                _put_back(value, before)
        return changed


class RandomStreams:
    """The state of Python's `random` module and of numpy's global generator (np.random.rand and friends): a forward
    that draws from them (`if random.random() < teacher_forcing_ratio`) decides anew on every call, which a
    compiled graph would freeze at the traced call's draw."""

    def __init__(self):
        self.python, self.numpy = random.getstate(), np.random.get_state()

    def changed(self) -> str | None:
        if random.getstate() != self.python:
            return "the state of Python's random module (it draws from it)"
        name, keys, position, has_gauss, gauss = np.random.get_state()
        if (position, has_gauss, gauss) != self.numpy[2:] or not np.array_equal(keys, self.numpy[1]):
            return "the state of numpy's global random generator (it draws from it)"
        return None

    def restore(self) -> bool:
        """Put back the states, so that an eager rerun draws what the traced call drew; whether either changed."""
        changed = self.changed() is not None
        if changed:
            random.setstate(self.python)
            np.random.set_state(self.numpy)
        return changed


class _Names:
    """Some names of a namespace (a module's globals): rebinding one is a change, adding others is not."""

    def __init__(self, namespace: dict, names: list[str]):
        self.namespace, self.names = namespace, names

    def view(self) -> dict:
        return {name: self.namespace.get(name, _UNBOUND) for name in self.names}


_UNBOUND = object()


def _code_names(code) -> list[str]:
    """The global and attribute names a code object and the code nested in it (comprehensions, lambdas) use."""
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names += _code_names(const)
    return list(dict.fromkeys(names))


def _contents(value):
    """A container's items, a user object's attributes (its __dict__), or None for anything else. Objects of
    runtime's and nnc's own classes are not the model's state (a GraphModule's graph, whose nodes an analysis
    annotates)."""
    if isinstance(value, (list, tuple, dict, set, frozenset, collections.deque)):
        return value
    if isinstance(value, _Names):
        return value.view()
    package = type(value).__module__.partition(".")[0]
    if package in _OWN_PACKAGES or (package in sys.stdlib_module_names and package not in _STDLIB_NAMESPACES):
        return None
    attributes = getattr(value, "__dict__", None)
    return attributes if isinstance(attributes, dict) else None


# NOTE: objects of the standard library's classes keep caches of their own (a logging.Logger fills `_cache` the
# first time a level is asked for), so only its plain namespaces count as the model's state.
_OWN_PACKAGES = ("runtime", "nnc")
_STDLIB_NAMESPACES = ("types", "argparse")


def _copy(contents):
    return dict(contents) if isinstance(contents, dict) else list(contents)


def _children(path: str, value, contents):
    if isinstance(value, (list, tuple, collections.deque)):
        return ((f"{path}[{k}]", item) for k, item in enumerate(contents))
    if isinstance(value, (set, frozenset)):
        return ((f"{path} (an item)", item) for item in contents)
    if isinstance(value, dict):
        return ((f"{path}[{key!r}]", item) for key, item in contents.items())
    if isinstance(value, _Names):
        return ((f"global {name}", item) for name, item in contents.items() if item is not _UNBOUND)
    return ((f"{path}.{name}", item) for name, item in contents.items())


def _same(a, b) -> bool:
    """The same object, or equal plain values (re-setting a flag or a count to what it was changes nothing)."""
    return a is b or (type(a) is type(b) and isinstance(a, _PLAIN) and a == b)


def _difference(path: str, value, before) -> str | None:
    """How `value` differs from its snapshot `before`, as the path of what changed; None when it does not."""
    if isinstance(value, (list, collections.deque)):
        if len(value) != len(before) or not all(_same(a, b) for a, b in zip(value, before)):
            return f"{path} (its items)"
        return None
    if isinstance(value, set):
        return None if {id(v) for v in value} == {id(v) for v in before} else f"{path} (its items)"
    now = _namespace(value)
    for key in [*before, *(k for k in now if k not in before)]:  # in order: the first change is named
        if key not in now or key not in before or not _same(now[key], before[key]):
            if isinstance(value, _Names):
                return f"global {key}"
            return f"{path}[{key!r}]" if isinstance(value, dict) else f"{path}.{key}".lstrip(".")
    return None


def _namespace(value) -> dict:
    """What a dict, an object or some global names hold now."""
    if isinstance(value, dict):
        return value
    return value.view() if isinstance(value, _Names) else vars(value)


def _put_back(value, before) -> None:
    if isinstance(value, list):
        value[:] = before
    elif isinstance(value, collections.deque):
        value.clear()
        value.extend(before)
    elif isinstance(value, set):
        value.clear()
        value.update(before)
    elif isinstance(value, _Names):
        for name, item in before.items():
            if item is _UNBOUND:
                value.namespace.pop(name, None)
            else:
                value.namespace[name] = item
    else:
        now = _namespace(value)
        now.clear()
        now.update(before)


class AttributesKept:
    """The attributes of a model's modules, and the Python state they reach, to find and undo the changes that
    running the model's code on traced or example values made (a submodule run as a call may count its calls or
    keep a tensor for the next one): the model's real calls make them."""

    def __init__(self, root: Module):
        self.saved = [(m, dict(m.__dict__)) for m in root.modules()]
        self.reachable = [ReachableState.of_module(m, path) for path, m in root.named_modules()]

    def restore(self) -> bool:
        """Put back whatever changed; whether anything had."""
        changed = False
        for state in self.reachable:
            changed |= state.restore()
        for module, before in self.saved:
            now = module.__dict__
            if now.keys() != before.keys() or any(now[k] is not v for k, v in before.items()):
                changed = True
                now.clear()
                now.update(before)
        return changed
