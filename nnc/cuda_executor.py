"""The CUDA executor: a Plan whose steps launch generated CUDA kernels on device arrays (runtime's CUDA tensors).

The plan is the CPU's (nnc.executor.Plan: the same fuse and memory stages, views folded the same way, the same
step order); only the steps and the memory differ per target. Here:

- a generated kernel (elementwise, reduction, matmul, window) is a `CudaKernelStep`: nnc.codegen.cuda's module,
  launched on C-contiguous device arrays (an input that is a strided view is copied contiguous first), writing into
  device buffers of the memory plan (`DeviceMemoryPlan`) or fresh device arrays for graph outputs. Elementwise and
  reduction skeletons read folded views through their strides; a matmul gets its folded views as inputs of their
  own, made from their bases before it runs (`unfold_views`);
- a view kernel that is not folded (a graph output, or read by an opaque node) is a `CudaViewStep`: runtime's
  device view of the array (no copy), made contiguous once when generated kernels are its only readers;
- a row kernel (softmax, LayerNorm: reductions chained along rows) has no CUDA skeleton yet: it runs as a
  `CudaRowStep`, the row kernel split into the reduction and elementwise kernels it is made of, launched in order;
- everything else with no CUDA skeleton (gathers, cat and other opaque nodes, size-0 values) runs node by node
  through the interpreter on CUDA tensors (`CudaInterpretedStep`), so each node is runtime's eager CUDA op: nothing
  is computed on the host, and an op with no eager CUDA lowering raises its NotImplementedError naming the op;
- a kernel that fails to compile runs the same way, with a warning (never a wrong answer).
"""
from __future__ import annotations

import copy
import warnings

from runtime.tensor import Tensor

from .executor import InterpretedStep, KernelStep, OutputBuffers, Plan, _has_empty_value
from .graph import Node, map_arg
from .interpreter import Interpreter
from .kernel import Kernel, view_node
from .prims import Prim
from .passes.fusion import fuse, is_pointwise, is_reduction
from .passes.memory import MemoryPlan, plan_memory
from .symbolic import DynamicSizeError, evaluate, has_symbols

# Kernel kinds nnc.codegen.cuda has a skeleton for; the others run as runtime's eager CUDA ops (no warning: that is
# how they run on this target, and nnc.explain says so).
GENERATED_KINDS = ("elementwise", "reduction", "matmul", "window", "cat")
INDEXES_VIEWS = ("elementwise", "reduction", "cat")  # the skeletons that read folded views through their strides
EAGER_REASON = "eager CUDA ops (no CUDA skeleton for {kind} kernels yet)"


class DeviceMemoryPlan(MemoryPlan):
    """The memory plan with its arenas in device memory (numba device arrays)."""

    def allocate(self) -> list:
        from runtime.cuda import memory

        return [memory.empty((b.nbytes,), "uint8") for b in self.buffers]

    def view(self, arenas: list, node: Node):
        from runtime.cuda import memory

        slot = self.slots[node]
        return memory.typed_view(arenas[slot.buffer], slot.shape, slot.dtype.np)


class CudaOutputBuffers(OutputBuffers):
    """OutputBuffers whose unplanned outputs (graph outputs) are fresh device arrays on every call.

    NOTE: not reused as on the CPU: a numba device array's views do not reference it (they share its memory, not
    the object), so a reference count of the array cannot tell that a caller still holds a view of it."""

    __slots__ = ()

    def _unplanned(self, i: int):
        from runtime.cuda import memory

        shape, dtype = self.specs[i]
        return memory.empty(shape, dtype)

    def handed_out(self, arrays: list) -> None:
        pass


class CudaKernelStep(KernelStep):
    """A kernel compiled by nnc.codegen.cuda, launched on device arrays. `made_views`: folded views the kernel reads
    as inputs of their own (a matmul's: its skeleton does not index views), made from their bases first."""

    def __init__(self, kernel: Kernel, compiled, reuse_outputs: bool = True, made_views=()):
        super().__init__(kernel, compiled, reuse_outputs)
        self.made_views = list(made_views)

    def buffers(self, memory, arenas) -> CudaOutputBuffers:
        return CudaOutputBuffers([memory.view(arenas, n) if n in memory.slots else None for n in self.outputs],
                                 self.out_specs, self.reuse_outputs)

    def run(self, env: dict, buffers: CudaOutputBuffers) -> None:
        for view, m in self.made_views:
            env[view] = Tensor._from_array(folded_view(m, env[m.base]._data))
        arrays = buffers.arrays()
        self.compiled.run_into([device_operand(env[n]._data) for n in self.inputs], arrays)
        buffers.handed_out(arrays)
        for node, array in zip(self.outputs, arrays):
            env[node] = Tensor._from_array(array)


def folded_view(m, array):
    """A folded view (nnc.passes.views.ViewMap: offset and element strides into its base's C-order elements) as a
    device array over the base's memory (a base that is not C-contiguous is copied first, as ViewMap.apply does)."""
    from runtime.cuda import memory

    base = device_operand(array)
    if 0 in tuple(m.shape):
        return memory.empty(tuple(m.shape), base.dtype)
    item = base.dtype.itemsize
    return memory.strided_view(base, m.shape, [s * item for s in m.strides], m.offset * item)


class CudaInterpretedStep(InterpretedStep):
    """Nodes run one by one as runtime's eager CUDA ops (InterpretedStep), the kernel's folded views made as device
    views of their bases."""

    def run(self, env: dict, buffers=None) -> None:
        interpreter = self.interpreter
        for view, m in self.views:
            env[view] = Tensor._from_array(folded_view(m, env[m.base]._data))
        for node, args, kwargs in self.calls:
            args, kwargs = map_arg(args, env.__getitem__), map_arg(kwargs, env.__getitem__)
            env[node] = getattr(interpreter, node.op)(node.target, args, kwargs)


def device_operand(array):
    """An input array as a generated kernel reads it: C-contiguous device memory (a strided view is copied; a host
    array, a constant the graph captured on the CPU, is copied to the device)."""
    from runtime.cuda import dispatch, memory

    if isinstance(array, memory.HOST_ARRAY):
        return memory.to_device(array)
    return array if memory.is_c_contiguous(array) else dispatch.contiguous(array)


class CudaRowStep(KernelStep):
    """A row kernel run as the reduction and elementwise kernels it is made of (`split_row_kernel`), each compiled
    by nnc.codegen.cuda and launched in order; the values passed between them get device arrays of their own."""

    def __init__(self, kernel: Kernel, parts: list[CudaKernelStep]):
        self.kernel, self.parts = kernel, parts
        self.inputs, self.outputs = kernel.inputs, kernel.outputs
        self.compiled = _Sources(parts)

    def bind(self, sizes: dict, values: tuple) -> "CudaRowStep":
        step = copy.copy(self)
        step.parts = [part.bind(sizes, values) for part in self.parts]
        return step

    def buffers(self, memory, arenas) -> list:
        return [part.buffers(memory, arenas) for part in self.parts]

    def run(self, env: dict, buffers: list) -> None:
        for part, buffer in zip(self.parts, buffers):
            part.run(env, buffer)


class _Sources:
    """What a CudaRowStep's parts compiled to, as one compiled kernel reads: their sources and launches."""

    def __init__(self, parts: list[CudaKernelStep]):
        self.source = "\n\n".join(part.compiled.source for part in parts)
        self.launches = {name: launch for part in parts for name, launch in part.compiled.launches.items()}


def split_row_kernel(kernel: Kernel) -> list[Kernel] | None:
    """A row kernel as a sequence of kernels nnc.codegen.cuda generates: each reduction alone, and the runs of
    elementwise nodes of one shape between them (in the row kernel's node order, which is the graph's). A value one
    part computes and a later one (or a kernel outside) reads is an output of that part. None when a node is
    neither (the kernel then runs as eager CUDA ops)."""
    runs: list[tuple[str, list[Node]]] = []
    for node in kernel.nodes:
        if is_reduction(node):
            runs.append(("reduction", [node]))
        elif is_pointwise(node):
            if runs and runs[-1][0] == "elementwise" and runs[-1][1][-1].meta["shape"] == node.meta["shape"]:
                runs[-1][1].append(node)
            else:
                runs.append(("elementwise", [node]))
        else:
            return None
    outputs, views = set(kernel.outputs), kernel.meta.get("views") or {}
    parts = []
    for k, (kind, nodes) in enumerate(runs):
        members = set(nodes)
        read = list(dict.fromkeys(a for n in nodes for a in n.all_input_nodes if a not in members))
        inputs = list(dict.fromkeys(views[a].base if a in views else a for a in read))
        outs = [n for n in nodes if n in outputs or any(user not in members for user in n.users)]
        shape = tuple(nodes[0].args[0].meta["shape"] if kind == "reduction" else nodes[0].meta["shape"])
        parts.append(Kernel(f"{kernel.name}.{k}", kind, nodes, inputs, outs, shape,
                            reason=f"part {k} of row kernel {kernel.name}",
                            meta={"views": {a: views[a] for a in read if a in views}}))
    return parts


def unfold_views(kernel: Kernel) -> Kernel:
    """The kernel with its folded views as inputs of their own (made before it runs), for a skeleton that does not
    index views: the bases stay inputs only where a node reads them directly."""
    views = kernel.meta.get("views") or {}
    read = {a for n in kernel.nodes for a in n.all_input_nodes}
    inputs = [n for n in kernel.inputs if n in read] + [v for v in views if v in read]
    return Kernel(kernel.name, kernel.kind, kernel.nodes, inputs, kernel.outputs, kernel.shape, kernel.reason,
                  meta={**kernel.meta, "views": {}})


class CudaViewStep:
    """A reshape, permute or expand node as runtime's view of the device array (no copy). A view that only generated
    kernels read and that is not a graph output is copied contiguous here, once, instead of once per reader."""

    def __init__(self, node: Node, contiguous: bool, views: dict | None = None):
        from .codegen.scalar import op_and_attrs

        op, args, self.attrs = op_and_attrs(node)
        self.node, self.source, self.op_name, self.contiguous = node, args[0], op.name, contiguous
        self.nodes = [node]
        self.folded = (views or {}).get(self.source)  # a source that is a folded view is made from its base

    def bind(self, sizes: dict, values: tuple) -> "CudaViewStep":
        step = copy.copy(self)
        step.attrs = evaluate(self.attrs, sizes)
        return step

    def run(self, env: dict, buffers=None) -> None:
        from runtime.cuda import dispatch

        m = self.folded
        source = env[self.source]._data if m is None else folded_view(m, env[m.base]._data)
        view = dispatch.view_of(self.op_name, source, self.attrs)
        env[self.node] = Tensor._from_array(device_operand(view) if self.contiguous else view)


class CudaInterpreter(Interpreter):
    """The interpreter for the nodes a CUDA plan runs eagerly: a factory op (full, arange: no tensor inputs, and
    graphs carry no device) makes its tensor on the device, as eager did while tracing."""

    def call_function(self, target, args, kwargs):
        if isinstance(target, Prim) and not any(isinstance(a, Tensor) for a in args):
            return Tensor._apply_device_op(target.op, kwargs)
        return target(*args, **kwargs)


def _on_device(read):
    """A get_attr reader for a tensor held on the CPU (a constant the graph captured or folded): the tensor copied
    to the device, copied again only when the tensor read is another object or was written since."""
    memo = [None, None, None]  # the CPU tensor, its version, the device copy

    def read_on_device():
        tensor = read()
        if not isinstance(tensor, Tensor) or tensor.is_cuda:
            return tensor
        if memo[0] is not tensor or memo[1] != tensor._version:
            memo[:] = [tensor, tensor._version, tensor.detach().to("cuda")]
        return memo[2]

    return read_on_device


class CudaPlan(Plan):
    """A Plan for the "cuda" target: kernels from nnc.codegen.cuda, device memory, eager CUDA ops for the rest."""

    target = "cuda"

    def __init__(self, gm, use_codegen: bool = True, whole_graph: bool | None = False, reuse_outputs: bool = True,
                 shape_env=None):
        super().__init__(gm, use_codegen=use_codegen, whole_graph=False, reuse_outputs=reuse_outputs,
                         shape_env=shape_env)
        if use_codegen:
            self.whole_graph_reason = "whole-graph mode is CPU only; the CUDA forward launches kernel by kernel"
        self.interpreter = CudaInterpreter(gm)
        self.attrs = [(node, _on_device(read)) for node, read in self.attrs]

    def fuse(self) -> None:
        # NOTE: views fold as on the CPU when codegen is on: elementwise and reduction skeletons index them, a
        # matmul reads them as inputs made before it (unfold_views); with codegen off nothing indexes them
        kernels = fuse(self.gm.graph, fold=self.use_codegen)
        self.kernels = [k for k in kernels if k.outputs or k.kind == "opaque"]
        self._generated_readers = _readers_generated(self.kernels, self.gm.graph)

    def plan_memory(self) -> None:
        planned = plan_memory(self.kernels, self.gm.graph)
        self.memory = DeviceMemoryPlan(**{name: getattr(planned, name) for name in MemoryPlan.__dataclass_fields__})

    def _step_for(self, kernel: Kernel, use_codegen: bool):
        view = view_node(kernel)
        views = kernel.meta.get("views") or {}
        if view is not None:
            return CudaViewStep(view, use_codegen and self._generated_readers.get(view, False), views)
        if not use_codegen:
            return CudaInterpretedStep(kernel.nodes, self.interpreter, "codegen off: eager CUDA ops", views)
        parts = split_row_kernel(kernel) if kernel.kind == "row" else None
        if kernel.kind not in GENERATED_KINDS and parts is None:
            return CudaInterpretedStep(kernel.nodes, self.interpreter, EAGER_REASON.format(kind=kernel.kind), views)
        if _has_empty_value(kernel.nodes):
            return CudaInterpretedStep(kernel.nodes, self.interpreter, "size-0 values: eager CUDA ops", views)
        from .codegen.cuda import compile_kernel

        try:
            if parts is not None:
                step = CudaRowStep(kernel, [CudaKernelStep(part, compile_kernel(part), self.reuse_outputs)
                                            for part in parts])
                compiled = step.compiled
            elif kernel.kind in INDEXES_VIEWS or not views:
                compiled = compile_kernel(kernel)
            else:
                compiled = compile_kernel(unfold_views(kernel))
        except Exception as error:  # never a wrong answer: this kernel's nodes run as eager CUDA ops instead
            reason = f"{type(error).__name__}: {error}"
            if self.shape_env is not None and has_symbols([n.meta.get("shape") for n in kernel.nodes]):
                raise DynamicSizeError(f"kernel {kernel.name} has no CUDA code for symbolic sizes ({reason})") \
                    from error
            self.fallbacks.append((kernel.name, reason))
            warnings.warn(f"nnc: CUDA kernel {kernel.name} failed to compile ({reason}); running its nodes as eager "
                          f"CUDA ops", RuntimeWarning, stacklevel=4)
            return CudaInterpretedStep(kernel.nodes, self.interpreter, reason, views)
        kernel.meta["source"] = compiled.source
        kernel.meta["launch"] = [f"{name}: grid {list(launch.grid)} x block {list(launch.block)}"
                                 for name, launch in compiled.launches.items()]
        if parts is not None:
            return step
        made = [] if kernel.kind in INDEXES_VIEWS else list(views.items())
        return CudaKernelStep(kernel if not made else unfold_views(kernel), compiled, self.reuse_outputs, made)


def _readers_generated(kernels: list[Kernel], graph) -> dict:
    """View node -> whether every kernel reading it is one that nnc.codegen.cuda generates (and it is no graph
    output): such a view is worth copying contiguous once, where its readers would each copy it."""
    outputs = set(graph.output_node.all_input_nodes)
    readers: dict = {}
    for kernel in kernels:
        generated = kernel.kind in GENERATED_KINDS or kernel.kind == "row"
        for node in kernel.inputs:
            readers[node] = readers.get(node, True) and generated
    return {node: readers.get(node, False) and node not in outputs
            for kernel in kernels if (node := view_node(kernel)) is not None}
