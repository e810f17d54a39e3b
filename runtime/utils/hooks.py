"""RemovableHandle: the object every register_*hook returns; `.remove()` unregisters the hook."""
from __future__ import annotations

import itertools

_next_id = itertools.count().__next__


class RemovableHandle:
    """Removes one entry (by id) from one or more hook dicts; also a context manager."""

    def __init__(self, hooks_dict, *, extra_dict=None):
        self.id = _next_id()
        self._dicts = (hooks_dict,) if extra_dict is None else (hooks_dict, extra_dict)

    def remove(self) -> None:
        for d in self._dicts:
            d.pop(self.id, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()
        return False
