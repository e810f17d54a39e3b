"""nnc.explain: what the compiler does with a model: its kernels, why each boundary exists, bytes moved, timings."""
from __future__ import annotations

from dataclasses import dataclass, field

from runtime.nn import Module
from runtime.tensor import Tensor

from .executor import ViewStep


@dataclass
class KernelReport:
    name: str
    kind: str
    ops: list
    reason: str
    bytes_moved: int
    generated: bool  # numba code was generated (False: interpreted, with `fallback` saying why when it failed)
    fallback: str = ""
    source: str = ""
    view: bool = False  # a reshape/permute/expand run as a numpy view (no code needed)


@dataclass
class Report:
    """The result of nnc.explain; str() or .print() shows it as a table."""

    kernels: list[KernelReport]
    compile_seconds: float
    cache_hits: int
    opaque_nodes: list = field(default_factory=list)
    backward_kernels: list[KernelReport] = field(default_factory=list)
    whole_graph: bool = False   # the forward runs as one numba function (nnc.codegen.whole_graph)
    whole_graph_reason: str = ""  # else why it runs kernel by kernel
    whole_graph_source: str = ""  # the generated module of whole-graph mode (run_graph)

    def forward_mode(self) -> str:
        """One line: how the forward runs (whole-graph mode, or kernel by kernel and why)."""
        if self.whole_graph:
            return "forward: one numba function (whole-graph mode)"
        return f"forward: kernel by kernel (not whole-graph: {self.whole_graph_reason})"

    def __str__(self) -> str:
        lines = [f"{len(self.kernels)} forward kernels, {len(self.backward_kernels)} backward kernels; "
                 f"compile {self.compile_seconds:.2f} s, {self.cache_hits} kernels from the disk cache"]
        lines.append(self.forward_mode())
        for title, kernels in (("forward", self.kernels), ("backward", self.backward_kernels)):
            if kernels:
                lines.append(f"{title}:")
                lines.extend(_kernel_line(k) for k in kernels)
        for name, reason in self.opaque_nodes:
            lines.append(f"opaque node {name}: {reason}")
        return "\n".join(lines)

    def print(self) -> None:
        print(self)


def _kernel_line(k: KernelReport) -> str:
    how = "numba" if k.generated else "numpy view" if k.view else \
        ("interpreted: " + k.fallback if k.fallback else "interpreted")
    return (f"  {k.name:<16} {k.kind:<11} {k.bytes_moved / 1024:9.1f} KiB  [{', '.join(k.ops)}]  ({how})"
            + (f"  boundary: {k.reason}" if k.reason else ""))


def _kernel_reports(plan) -> list[KernelReport]:
    failed = dict(plan.fallbacks)
    steps = plan.steps * len(plan.kernels) if plan.whole_graph else plan.steps
    reports = []
    for kernel, step in zip(plan.kernels, steps):
        reports.append(KernelReport(
            name=kernel.name, kind=kernel.kind,
            ops=list(kernel.meta.get("ops") or [getattr(n.target, "__name__", str(n.target)) for n in kernel.nodes]),
            reason=kernel.reason, bytes_moved=int(kernel.meta.get("bytes_moved", 0)),
            generated=hasattr(step, "compiled"), fallback=failed.get(kernel.name, ""),
            view=isinstance(step, ViewStep),
            source=kernel.meta.get("source", "")))
    return reports


def explain(module: Module, *example_inputs, backward: bool = False) -> Report:
    """Compile `module` for these inputs (and its backward, if asked) and report what came out."""
    from .compile import Artifact

    tensors = [x for x in example_inputs if isinstance(x, Tensor)]
    artifact = Artifact(module, {}, [t.detach() for t in tensors], needs_grad=backward,
                        inputs_requiring_grad=tuple(t.requires_grad for t in tensors))
    forward_plan = artifact.forward_plan or artifact.training_plan
    report = Report(kernels=_kernel_reports(forward_plan), compile_seconds=artifact.compile_seconds,
                    whole_graph=forward_plan.whole_graph, whole_graph_reason=forward_plan.whole_graph_reason,
                    whole_graph_source=forward_plan.steps[0].compiled.source if forward_plan.whole_graph else "",
                    cache_hits=sum(p.cache_hits for p in artifact.plans),
                    opaque_nodes=[(n.name, n.meta["opaque_reason"]) for n in artifact.opaque])
    if artifact.backward_plan is not None:
        report.backward_kernels = _kernel_reports(artifact.backward_plan)
    return report
