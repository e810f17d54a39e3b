"""nnc.explain: what the compiler does with a model: its kernels, why each boundary exists, bytes moved, timings."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from runtime.nn import Module

from .cuda_executor import CudaViewStep
from .executor import ViewStep
from .symbolic import hint_int


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
    device: bool = False  # the step runs on CUDA tensors (a view there is runtime's device view)
    eager: str = ""  # on CUDA: why the kernel's nodes run as runtime's eager CUDA ops (no CUDA skeleton yet, ...)
    launch: list = field(default_factory=list)  # target "cuda": each GPU kernel's grid and block
    resources: str = ""  # target "cuda": ptxas's registers per thread, spills and shared memory


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
    graph_breaks: list = field(default_factory=list)  # (submodule path, why it could not be traced)
    pieces: int = 0  # with gradients and opaque nodes: the compiled pieces between eager calls (nnc.split)
    sizes: str = ""  # with symbolic sizes: the symbols, and the guards a call's sizes must pass
    target: str = "cpu"  # "cuda": the kernels' CUDA source and launches (run when the module is on the device)
    on_device: bool = False  # target "cuda" with a module on the device: the report of what runs there

    def forward_mode(self) -> str:
        """One line: how the forward runs (whole-graph mode, or kernel by kernel and why)."""
        if self.target == "cuda" and self.on_device:
            eager = sum(1 for k in self.kernels + self.backward_kernels if k.eager)
            return (f"target cuda: runs on the device, kernel by kernel (whole-graph mode is CPU only); "
                    f"{eager} kernels run as eager CUDA ops")
        if self.target == "cuda":
            return ("target cuda: CUDA kernels generated (and compiled to PTX where the toolkit is installed), not "
                    "run; the forward launches them one by one (whole-graph mode is CPU only)")
        if self.whole_graph:
            return "forward: one numba function (whole-graph mode)"
        return f"forward: kernel by kernel (not whole-graph: {self.whole_graph_reason})"

    def __str__(self) -> str:
        lines = [f"{len(self.kernels)} forward kernels, {len(self.backward_kernels)} backward kernels; "
                 f"compile {self.compile_seconds:.2f} s, {self.cache_hits} kernels from the disk cache"]
        lines.append(self.forward_mode())
        if self.sizes:
            lines.append("symbolic sizes:")
            lines.extend(f"  {line}" for line in self.sizes.splitlines())
        for path, reason in self.graph_breaks:
            lines.append(f"graph break: {path} runs eagerly ({reason})")
        if self.pieces:
            lines.append(f"training: {self.pieces} compiled pieces around {len(self.opaque_nodes)} eager calls")
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
    view = "device view" if k.device else "numpy view"
    how = ("cuda" if k.launch else "numba") if k.generated else view if k.view else \
        ("interpreted: " + k.fallback if k.fallback else k.eager or "interpreted")
    how = "; ".join([how] + k.launch + ([k.resources] if k.resources else []))
    return (f"  {k.name:<16} {k.kind:<11} {k.bytes_moved / 1024:9.1f} KiB  [{', '.join(k.ops)}]  ({how})"
            + (f"  boundary: {k.reason}" if k.reason else ""))


def _cuda_kernel_reports(plan, reports: list[KernelReport], resources: dict) -> list[KernelReport]:
    """The reports of a plan compiled with codegen off, with each kernel's CUDA module in place of its CPU one:
    source and launch configuration, and ptxas's resource line (`resources` memoizes it by source)."""
    from .codegen import cuda
    from .codegen.scalar import KernelCompileError

    out = []
    for kernel, k in zip(plan.kernels, reports):
        try:
            generated = cuda.generate(kernel)
        except KernelCompileError as error:
            out.append(replace(k, generated=False, fallback=error.reason))
            continue
        if generated.source not in resources:
            resources[generated.source] = cuda.resource_summary(generated, kernel.name)
        launch = generated.launch_summary()
        source = "\n".join([f"# launch {line}" for line in launch] + [f"# {resources[generated.source]}",
                                                                       generated.annotated])
        out.append(replace(k, generated=True, fallback="", source=source, launch=launch,
                           resources=resources[generated.source]))
    return out


def _kernel_reports(plan) -> list[KernelReport]:
    failed = dict(plan.fallbacks)
    steps = plan.steps * len(plan.kernels) if plan.whole_graph else plan.steps
    on_device = getattr(plan, "target", "cpu") == "cuda"
    reports = []
    for kernel, step in zip(plan.kernels, steps):
        view = isinstance(step, (ViewStep, CudaViewStep))
        eager = step.reason if on_device and hasattr(step, "reason") and kernel.name not in failed else ""
        reports.append(KernelReport(
            name=kernel.name, kind=kernel.kind,
            ops=list(kernel.meta.get("ops") or [getattr(n.target, "__name__", str(n.target)) for n in kernel.nodes]),
            reason=kernel.reason, bytes_moved=int(hint_int(kernel.meta.get("bytes_moved", 0))),  # at the hints
            generated=hasattr(step, "compiled"), fallback=failed.get(kernel.name, ""),
            view=view, eager=eager, device=on_device, launch=list(kernel.meta.get("launch", ())) if on_device else [],
            source=kernel.meta.get("source", "")))
    return reports


def explain(module: Module, *args, backward: bool = False, target: str | None = None, **kwargs) -> Report:
    """Compile `module` for these arguments (any forward takes: tensors, nested tuples, Python values) and its
    backward, if asked, and report what came out: kernels, graph breaks and the nodes that run eagerly. Dimensions
    marked with nnc.mark_dynamic compile with symbolic sizes, and the report lists the guards. The target follows
    the device of the module and inputs, as nnc.compile's: on CUDA, the report is what runs there (generated CUDA
    kernels with their launches, and the kernels run as eager CUDA ops). target="cuda" for a module on the CPU
    reports each kernel's CUDA source, launch configuration and ptxas's registers instead (nothing runs)."""
    from .codegen.targets import check_target
    from .compile import bind_arguments, marked_placeholder_dims, root_trace_error, split_arguments, unwrapped
    from .pipeline import compile_arguments

    module = unwrapped(module)
    arguments = bind_arguments(module, args, kwargs)
    concrete, examples = split_arguments(arguments)
    on_device = _on_device(module, examples)
    target = check_target(target) if target is not None else "cuda" if on_device else "cpu"
    runs = "cuda" if on_device and target == "cuda" else "cpu"  # else CUDA source is generated, not run
    try:
        compilation = compile_arguments(module, concrete, examples, needs_grad=backward,
                                        codegen=target == "cpu" or on_device,
                                        dynamic=marked_placeholder_dims(arguments), target=runs)
    except Exception as error:
        reason = root_trace_error(error)
        if reason is None:
            raise
        if target != "cpu":
            raise
        return _partly_compiled_report(module, reason, args, kwargs, backward)
    return report(compilation, target)


def _on_device(module: Module, examples: dict) -> bool:
    """Whether the module's parameters or its example inputs are CUDA tensors."""
    from runtime.utils import _pytree as pytree

    tensors = [*module.parameters(), *module.buffers(), *pytree.tensor_leaves(list(examples.values()))]
    return any(t.is_cuda for t in tensors)


def _partly_compiled_report(module: Module, reason: str, args, kwargs, backward: bool) -> Report:
    """A module whose own forward cannot be traced: its forward runs once eagerly (state restored afterwards, as
    shape propagation's run) with its submodules compiled for the inputs they get; their reports, merged."""
    import runtime
    from runtime.autograd import set_grad_enabled

    from .compile import PartlyCompiled
    from .passes.shapes import buffers_kept

    partly = PartlyCompiled(module, reason, {})
    rng = runtime.get_rng_state()
    try:
        with set_grad_enabled(backward), buffers_kept(module):
            partly.run(args, kwargs)
    finally:
        runtime.set_rng_state(rng)
    merged = Report(kernels=[], compile_seconds=0.0, cache_hits=0, whole_graph_reason="the forward runs eagerly",
                    graph_breaks=[(f"{module._get_name()}.forward", reason)])
    for path, compiled in partly.compiled.items():
        for compilation in compiled.compilations:
            part = report(compilation)
            merged.kernels += [_prefixed(k, path) for k in part.kernels]
            merged.backward_kernels += [_prefixed(k, path) for k in part.backward_kernels]
            merged.compile_seconds += part.compile_seconds
            merged.cache_hits += part.cache_hits
            merged.opaque_nodes += [(f"{path}.{name}", why) for name, why in part.opaque_nodes]
            merged.graph_breaks += [(f"{path}.{where}", why) for where, why in part.graph_breaks]
    return merged


def _prefixed(kernel: KernelReport, path: str) -> KernelReport:
    return replace(kernel, name=f"{path}:{kernel.name}")


def report(compilation, target: str = "cpu") -> Report:
    """The Report of a finished nnc.pipeline.Compilation; target "cuda" (of one compiled with codegen off): the
    kernels' CUDA modules."""
    forward_plans = [g.forward_plan or g.training_plan for g in compilation.graphs]
    first = forward_plans[0]
    result = Report(kernels=[k for plan in forward_plans for k in _kernel_reports(plan)],
                    compile_seconds=compilation.compile_seconds,
                    whole_graph=first.whole_graph and len(forward_plans) == 1,
                    whole_graph_reason=first.whole_graph_reason if len(forward_plans) == 1 else
                    "the graph runs in pieces around eager calls",
                    whole_graph_source=first.steps[0].compiled.source if first.whole_graph else "",
                    cache_hits=sum(p.cache_hits for p in compilation.plans),
                    opaque_nodes=[(n.name, n.meta["opaque_reason"]) for n in compilation.opaque],
                    graph_breaks=[(b.path, b.reason) for b in compilation.graph_breaks],
                    pieces=len(compilation.graphs) if compilation.split is not None else 0,
                    sizes=compilation.shape_env.describe() if compilation.shape_env is not None else "")
    result.backward_kernels = [k for g in compilation.graphs if g.backward_plan is not None
                               for k in _kernel_reports(g.backward_plan)]
    if compilation.target == "cuda":
        result.target, result.on_device = "cuda", True
    elif target == "cuda":
        memo: dict = {}
        backward_plans = [g.backward_plan for g in compilation.graphs if g.backward_plan is not None]
        result.kernels = [k for plan in forward_plans
                          for k in _cuda_kernel_reports(plan, _kernel_reports(plan), memo)]
        result.backward_kernels = [k for plan in backward_plans
                                   for k in _cuda_kernel_reports(plan, _kernel_reports(plan), memo)]
        result.target, result.whole_graph = "cuda", False
    return result
