"""Kernel: the unit fusion produces and code generation consumes (a group of primitive nodes run as one)."""
from __future__ import annotations

from dataclasses import dataclass, field

from .graph import Node

# The fusion lattice (as in TVM): a node may absorb producers of a lower or equal rank into its kernel.
ELEMENTWISE, BROADCAST, INJECTIVE, REDUCTION, OPAQUE = range(5)
RANK_NAMES = {ELEMENTWISE: "elementwise", BROADCAST: "broadcast", INJECTIVE: "injective",
              REDUCTION: "reduction", OPAQUE: "opaque"}


@dataclass
class Kernel:
    """A fused group of primitive (prims.*) call_function nodes from a decomposed graph.

    kind:
      - "elementwise": every node is elementwise with the same output shape `shape`; inputs broadcast to it.
      - "reduction": elementwise prologue nodes, then exactly one reduction node (sum/amax/amin/prod), then
        elementwise epilogue nodes on the reduced shape; `shape` is the reduction's input shape.
      - "matmul": one matmul/linear node (run by BLAS) followed by elementwise epilogue nodes on its output
        shape (`shape`), e.g. bias add + activation.
      - "opaque": a single node run as is (views, gathers, cat, ...): no code generation.
    nodes: the group's nodes in graph order.
    inputs: nodes outside the group whose values the group reads (tensors), in a fixed order.
    outputs: nodes of the group whose values are read outside it (or are graph outputs).
    reason: why the group ends here (the kernel boundary), e.g. "reduction output feeds a matmul".
    """

    name: str
    kind: str
    nodes: list[Node]
    inputs: list[Node]
    outputs: list[Node]
    shape: tuple
    reason: str = ""
    meta: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        ops = ", ".join(n.target.op.name if hasattr(n.target, "op") else str(n.target) for n in self.nodes)
        return f"Kernel({self.name}: {self.kind} [{ops}] shape={list(self.shape)} reason={self.reason!r})"
