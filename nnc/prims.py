"""Primitive ops of runtime's op table as call targets (`prims.add`), for graphs after decomposition."""
from __future__ import annotations

from runtime.ops import OPS, apply


class Prim:
    """A callable standing for one op-table record; graphs print it as prims.<name>."""

    def __init__(self, op):
        self.op = op
        self.__name__ = op.name
        self.nnc_name = f"prims.{op.name}"

    def __call__(self, *args, **kwargs):
        return apply(self.op.name, *args, **kwargs)

    def __repr__(self) -> str:
        return self.nnc_name


class _Namespace:
    """`prims.<name>` for every op in the table."""

    def __init__(self):
        for name, op in OPS.items():
            setattr(self, name, Prim(op))

    def __getitem__(self, name: str) -> Prim:
        return getattr(self, name)


prims = _Namespace()
