"""Plain module attributes a compile read (a tensor, None, a number, a string), recorded while the model's code runs
and checked again before a compiled variant is reused, so that `model.eps = new_tensor` or `self.shift = None ->
tensor` recompiles instead of running with the value the graph froze."""
from __future__ import annotations

import contextlib
import threading

from runtime.nn import Module
from runtime.tensor import Tensor

from .python_state import module_registry_names
from .trace import PATCHING, for_thread

_PLAIN = (type(None), bool, int, float, complex, str)
_MISSING = object()
# NOTE: tuples of plain values (a kernel size, a normalized shape); longer ones are not compared on every check
_MAX_TUPLE = 16


def _watched(value) -> bool:
    """Whether a graph may have frozen this attribute value: a tensor that is no parameter or buffer, or a plain
    value (Python code in forward branches on it or folds it into the graph)."""
    kind = type(value)
    if kind in _PLAIN or isinstance(value, Tensor):
        return True
    return kind is tuple and len(value) <= _MAX_TUPLE and all(type(v) in _PLAIN for v in value)


@contextlib.contextmanager
def recording(root: Module, reads: dict):
    """Within the block, this thread's reads of plain attributes of `root`'s modules (from their instance dicts, not
    the registries) are added to `reads`: (module path, name) -> the value read first."""
    paths = {id(m): path for path, m in root.named_modules(remove_duplicate=False)}
    internal = module_registry_names()
    get = object.__getattribute__

    def recorded(module, name):
        value = get(module, name)
        if name not in internal and _watched(value):
            path = paths.get(id(module))
            if path is not None and get(module, "__dict__").get(name, _MISSING) is value:
                reads.setdefault((path, name), value)
        return value

    with PATCHING:
        previous = Module.__dict__.get("__getattribute__")
        Module.__getattribute__ = for_thread(threading.get_ident(), recorded, previous or get)
        try:
            yield
        finally:
            if previous is None:
                del Module.__getattribute__
            else:
                Module.__getattribute__ = previous


class AttributeChecks:
    """The attribute values one compiled variant depends on, checked against the model's current ones."""

    __slots__ = ("entries",)

    def __init__(self, root: Module, reads: dict):
        self.entries = []
        for (path, name), value in reads.items():
            module = root.get_submodule(path) if path else root
            label = f"{path}.{name}" if path else name
            self.entries.append((module.__dict__, name, value, label))

    def changed(self) -> list[str]:
        """The attributes (as `path.name`) whose value is not the one the variant was compiled with."""
        return [label for d, name, value, label in self.entries if not _same(d.get(name, _MISSING), value)]


def _same(current, value) -> bool:
    if current is value:
        return True
    if type(current) is not type(value) or isinstance(value, Tensor) or value is None:
        return False
    try:
        return bool(current == value)
    except Exception:  # an object whose == is not a plain answer
        return False
