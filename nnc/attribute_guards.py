"""Plain module attributes a compile read (a tensor, None, a number, a string) and global tensors it froze, recorded
while the model's code runs and checked again before a compiled variant is reused, so that `model.eps = new_tensor`,
`self.shift = None -> tensor` or a reassigned global tensor recompiles instead of running with the value the graph
froze."""
from __future__ import annotations

import contextlib
import sys
import threading

from runtime.nn import Module
from runtime.tensor import Tensor

from .python_state import module_registry_names
from .trace import PATCHING, for_thread, user_code_frame

_PLAIN = (type(None), bool, int, float, complex, str)
_MISSING = object()
# NOTE: tuples of plain values (a kernel size, a normalized shape); longer ones are not compared on every check
_MAX_TUPLE = 16
_active = threading.local()  # .reads: the dict this thread's innermost recording fills


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
    the registries), and the global tensors note_global_tensor finds, are added to `reads`: a key per place ->
    (the dict holding it, name, the value read first, a label for messages, whether it is a module's global)."""
    paths = {id(m): path for path, m in root.named_modules(remove_duplicate=False)}
    internal = module_registry_names()
    get = object.__getattribute__

    def recorded(module, name):
        value = get(module, name)
        if name not in internal and _watched(value):
            path = paths.get(id(module))
            d = get(module, "__dict__")
            if path is not None and d.get(name, _MISSING) is value:
                reads.setdefault((id(d), name), (d, name, value, f"{path}.{name}" if path else name, False))
        return value

    outer = getattr(_active, "reads", None)
    with PATCHING:
        previous = Module.__dict__.get("__getattribute__")
        Module.__getattribute__ = for_thread(threading.get_ident(), recorded, previous or get)
        _active.reads = reads
        try:
            yield
        finally:
            _active.reads = outer
            if previous is None:
                del Module.__getattribute__
            else:
                Module.__getattribute__ = previous


def note_global_tensor(tensor: Tensor) -> None:
    """Called when a trace freezes `tensor` as a constant: if the innermost user code running names a global bound to
    it, the recording in progress keeps that global (a reassignment does not move the module-state version, so the
    compiled module checks these on every call)."""
    reads = getattr(_active, "reads", None)
    if reads is None:
        return
    frame = user_code_frame(sys._getframe(1))
    if frame is None:
        return
    scope = frame.f_globals
    for name in frame.f_code.co_names:
        if scope.get(name, _MISSING) is tensor:
            label = f"global {scope.get('__name__', '?')}.{name}"
            reads.setdefault((id(scope), name), (scope, name, tensor, label, True))


class AttributeChecks:
    """The attribute and global values one compiled variant depends on, checked against the current ones."""

    __slots__ = ("entries", "globals")

    def __init__(self, reads: dict):
        self.entries = [entry[:4] for entry in reads.values() if not entry[4]]
        self.globals = [entry[:4] for entry in reads.values() if entry[4]]

    def changed(self, globals_only: bool = False) -> list[str]:
        """The labels (`path.name`, `global module.name`) of the values that are not those the variant was compiled
        with: all of them, or only the globals."""
        entries = self.globals if globals_only else self.entries + self.globals
        return [label for d, name, value, label in entries if not _same(d.get(name, _MISSING), value)]


def _same(current, value) -> bool:
    if current is value:
        return True
    if type(current) is not type(value) or isinstance(value, Tensor) or value is None:
        return False
    try:
        return bool(current == value)
    except Exception:  # an object whose == is not a plain answer
        return False
