"""RemovableHandle: the object every register_*hook returns; `.remove()` unregisters the hook."""
from __future__ import annotations

import itertools
import weakref

_next_id = itertools.count().__next__


class RemovableHandle:
    """Removes one entry (by id) from one or more hook dicts; also a context manager."""

    def __init__(self, hooks_dict, *, extra_dict=None):
        self.id = _next_id()
        self.hooks_dict_ref = weakref.ref(hooks_dict)
        self.extra_dict_refs = tuple(weakref.ref(d) for d in ([extra_dict] if extra_dict is not None else []))

    def remove(self) -> None:
        for ref in (self.hooks_dict_ref, *self.extra_dict_refs):
            d = ref()
            if d is not None:
                d.pop(self.id, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()
        return False
