"""CompiledGraph: one decomposed graph with its backward and plans, run as one autograd node (built by nnc.pipeline)."""
from __future__ import annotations

import numpy as np

from runtime.autograd import Function, grad_mode, no_grad
from runtime.func import _reparametrized
from runtime.tensor import Tensor

from runtime.utils import _pytree as pytree
from .executor import Plan
from .graph import Graph, Node, fetch_attr, map_arg
from .graph_module import GraphModule
from .interpreter import Interpreter
from .passes.autodiff import AutodiffError, build_backward
from .symbolic import evaluate, is_symbolic


class CompileError(RuntimeError):
    """The model could not be compiled for these inputs (the caller falls back to eager)."""


class CompiledGraph:
    """One decomposed graph compiled: a forward plan; with gradients, a training forward and a backward plan.

    The pipeline fills it in stage by stage: `differentiate` (autodiff), `finish_backward` (its cleanup), then
    `make_plans`, whose plans the fuse, memory and codegen stages complete."""

    def __init__(self, gm: GraphModule, needs_grad: bool, inputs_requiring_grad: tuple, written_inputs=(),
                 shape_env=None, target: str = "cpu"):
        self.forward = gm
        self.target = target  # "cpu" or "cuda": which executor's plans run it (nnc.executor, nnc.cuda_executor)
        self.shape_env = shape_env  # symbolic sizes (nnc.symbolic): each call's come from its inputs' shapes
        graph = gm.graph
        self.needs_grad = needs_grad
        self.placeholders = graph.placeholders
        self.tensor_inputs = [n for n in self.placeholders if "shape" in n.meta]
        self.opaque = [n for n in graph.nodes if "opaque_reason" in n.meta]
        self.output_leaves = _leaves(graph.output_node.args[0])  # tensor outputs in structure order
        self.backward = None
        self.backward_error = None
        self.inputs_requiring_grad = tuple(inputs_requiring_grad)
        self.written_inputs = tuple(written_inputs)  # positions of inputs forward writes in place (copied in later)
        self.params, self.param_nodes = [], []
        self.forward_plan = self.training_plan = self.backward_plan = None
        self.size_sources = _size_sources(self.tensor_inputs, shape_env)

    def sizes_of(self, tensors: list) -> tuple:
        """The values of the size symbols for a call with these input tensors (() with static sizes)."""
        return tuple([tensors[k]._data.shape[d] for k, d in self.size_sources])
    @property
    def plans(self) -> list:
        return [p for p in (self.forward_plan, self.training_plan, self.backward_plan) if p is not None]

    def differentiate(self) -> None:
        """Derive the backward graph (with gradients asked for); a graph autodiff cannot handle keeps none."""
        if not self.needs_grad:
            return
        self.param_nodes, self.params = parameter_nodes(self.forward)
        self.input_nodes = [n for n, wants in zip(self.tensor_inputs, self.inputs_requiring_grad) if wants]
        try:
            self.backward = build_backward(self.forward, self.input_nodes + self.param_nodes)
        except AutodiffError as error:
            self.backward_error = str(error)

    def finish_backward(self, cleanup) -> None:
        """Clean the backward graph up (`cleanup(gm) -> gm`) and make the forward that also returns what it saves."""
        if self.backward is None:
            return
        self.backward.gm = cleanup(self.backward.gm)
        self.differentiable_outputs = set(self.backward.grad_outputs)
        self.gradient_seeds = _seeds_of_gradients(self.backward.gm.graph, len(self.backward.grad_outputs))
        self.training_forward = self._forward_returning_saved(self.backward.saved)

    def make_plans(self, codegen: bool, whole_graph: bool | None) -> None:
        """The plans this graph runs with: training forward and backward, or the forward alone."""
        env = self.shape_env
        Plan = plan_type(self.target)
        if self.backward is not None and not self.opaque:
            self.training_plan = Plan(self.training_forward, use_codegen=codegen, shape_env=env)
            # NOTE: the backward's outputs are gradients; with no reference kept, AccumulateGrad stores them as
            # .grad without a copy (a kept reference forces one: 1 ms for a 16 MiB gradient)
            self.backward_plan = Plan(self.backward.gm, use_codegen=codegen, reuse_outputs=False, shape_env=env)
        else:
            if env is not None and self.needs_grad:
                raise CompileError(f"no compiled backward ({self.backward_error}); dynamic sizes need one")
            # NOTE: whole-graph mode is for the forward only: numba links every kernel into the graph's function
            # and compiles them all again there, which a training step's two large graphs would pay cold in seconds
            self.forward_plan = Plan(self.forward, use_codegen=codegen, whole_graph=whole_graph, shape_env=env)

    def _forward_returning_saved(self, saved) -> GraphModule:
        """A copy of the forward graph that also returns the values the backward needs."""
        graph, mapping = Graph(), {}
        for node in self.forward.graph.nodes:
            if node.op == "output":
                user = map_arg(node.args[0], mapping.__getitem__)
                graph.output((user, tuple(mapping[n] for n in saved)))
            else:
                mapping[node] = graph.node_copy(node, mapping.__getitem__)
        graph.meta = dict(self.forward.graph.meta)
        return GraphModule(self.forward, graph, class_name=self.forward._get_name())

    def direct_runner(self):
        """What run(tensors, wants_grad=False) does, as a function of the tensors with less Python around the plan's
        one numba call (see Plan.direct_runner); None where the forward plan has no such function."""
        direct = getattr(self.forward_plan, "direct_runner", None)
        return direct() if direct is not None and not self.size_sources else None

    def run(self, tensors: list, wants_grad: bool):
        """What the graph returns for these input tensors; with wants_grad, connected to autograd."""
        sizes = self.sizes_of(tensors) if self.size_sources else ()
        if not wants_grad:
            plan = self.forward_plan or self.training_plan
            if plan.whole_graph:  # one numba call: nothing records autograd history
                result = plan.run(*tensors)
            else:
                with no_grad():
                    result = plan.run(*tensors, sizes=sizes)
            return result if plan is self.forward_plan else result[0]
        if self.training_plan is None or self._unexpected_grad(tensors):
            # eager autograd through the decomposed graph: correct, and hooked modules see real values
            return self.run_eagerly(tensors, sizes)
        structure: list = []
        flat = _CompiledFunction.apply(self, structure, len(tensors), *tensors, *self.params)
        flat = flat if isinstance(flat, tuple) else (flat,)
        return pytree.replace_tensors(structure[0], self._aliases_restored(list(flat), tensors))

    def _aliases_restored(self, flat: list, tensors: list) -> list:
        """As eager returns them: an input or parameter returned as is is that tensor object (a leaf keeps its .grad),
        and a value returned twice is one object. Gradients reach them directly, not through the compiled node."""
        first: dict = {}
        for i, node in enumerate(self.output_leaves):
            if node in first:
                flat[i] = flat[first[node]]
                continue
            first[node] = i
            if node.op == "placeholder" and node in self.tensor_inputs:
                flat[i] = tensors[self.tensor_inputs.index(node)]
            elif node.op == "get_attr":
                value = fetch_attr(self.forward, node.target)
                if isinstance(value, Tensor):
                    flat[i] = value
        return flat

    def run_eagerly(self, tensors: list, sizes: tuple = ()):
        """The decomposed forward run op by op on runtime tensors, recording autograd history."""
        if self.shape_env is not None:
            return _SizedInterpreter(self.forward, dict(zip(self.shape_env.names, sizes))).run(*tensors)
        return self.forward.forward(*tensors)

    def _unexpected_grad(self, tensors) -> bool:
        """An input requires grad that the backward was not built for (never a lost gradient: run eagerly)."""
        return any(t._rg and not wants for t, wants in zip(tensors, self.inputs_requiring_grad))


def parameter_nodes(gm: GraphModule) -> tuple[list, list]:
    """(get_attr nodes, tensors) of the parameters that require grad, identified by object. The tracer and decompose
    name a tied parameter by its first path, so it is one node; two nodes for one parameter would split its gradient,
    so they raise instead."""
    trainable = {id(p): p for p in gm.parameters() if p.requires_grad}
    nodes, tensors, seen = [], [], set()
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        tensor = fetch_attr(gm, node.target)
        if id(tensor) not in trainable:
            continue
        if id(tensor) in seen:
            raise CompileError(f"parameter {node.target} is read by two graph nodes; its gradient would be split")
        seen.add(id(tensor))
        nodes.append(node)
        tensors.append(tensor)
    return nodes, tensors


class _CompiledFunction(Function):
    """The compiled forward and backward as one autograd node."""

    @staticmethod
    def forward(ctx, graph, structure, n_inputs, *tensors):
        inputs = tensors[:n_inputs]
        ctx.sizes = graph.sizes_of(inputs) if graph.size_sources else ()
        _keep_for_replay(ctx, graph, tensors, n_inputs)
        user, saved = graph.training_plan.run(*inputs, sizes=ctx.sizes)
        ctx.graph = graph
        if graph.written_inputs:
            # NOTE: an input written in place gets its new value after this call, and the write bumps its version
            # counter, which views of it (run through the interpreter) share: the backward keeps copies of those
            written = {id(inputs[k]._vc()) for k in graph.written_inputs}
            saved = [s.clone() if id(s._vc()) in written else s for s in saved]
        ctx.save_for_backward(*saved)
        ctx.set_materialize_grads(False)  # which outputs got no gradient decides which inputs get None
        flat = pytree.tensor_leaves(user)
        structure.append(user)
        ctx.n_outputs = len(flat)
        outputs = tuple(t.detach() for t in flat)
        # NOTE: an output the backward cannot reach (detached, integer, a mask) does not require grad, as in eager
        ctx.mark_non_differentiable(*[t for t, node in zip(outputs, graph.output_leaves)
                                      if node not in graph.differentiable_outputs])
        return outputs

    @staticmethod
    def backward(ctx, *grads):
        if grad_mode.is_grad_enabled():  # create_graph=True: gradients that are themselves differentiable
            return _replayed_backward(ctx, grads)
        graph = ctx.graph
        backward = graph.backward
        saved = ctx.saved_tensors
        seeds = [_sum_for(n, graph.output_leaves, grads) for n in backward.grad_outputs]
        given = {j for j, seed in enumerate(seeds) if seed is not None}
        sizes = dict(zip(graph.shape_env.names, ctx.sizes)) if graph.shape_env is not None else {}
        seeds = [seed if seed is not None else _zeros_like_node(n, sizes, graph.target)
                 for seed, n in zip(seeds, backward.grad_outputs)]
        with no_grad():
            results = graph.backward_plan.run(*saved, *seeds, sizes=ctx.sizes)
        # NOTE: as eager's engine, an input no given gradient reaches gets None, not zeros
        by_node = {n: r if graph.gradient_seeds[j] & given else None for j, (n, r) in enumerate(zip(backward.wrt,
                                                                                                   results))}
        input_grads = [_contiguous(by_node.get(n)) for n in graph.tensor_inputs]
        param_grads = [by_node.get(n) for n in graph.param_nodes]
        return (None, None, None, *input_grads, *param_grads)


def _contiguous(grad):
    """An input's gradient C-contiguous, as torch's backward kernels write them: the backward graph may end in a view
    (the slice of a padded gradient that a padding's cat leaves), which .view(batch, -1) would refuse."""
    return grad if grad is None or grad.is_contiguous() else grad.contiguous()


def _keep_for_replay(ctx, graph, tensors, n_inputs: int) -> None:
    """What a backward with create_graph=True replays the forward from: the call's tensors (inputs, then parameters)
    and their versions."""
    ctx.replay, ctx.n_inputs = tensors, n_inputs
    ctx.replay_versions = [t._vc()[0] for t in tensors]


def _replayed_backward(ctx, grads):
    """The compiled backward computes gradients without recording them. With create_graph=True they must carry
    history (a gradient penalty differentiates them again): run the decomposed forward eagerly from the call's
    tensors and differentiate that, recording, as eager mode would have."""
    from runtime import autograd

    graph, tensors = ctx.graph, ctx.replay
    if any(getattr(n.target, "nnc_name", None) == "prims.random_seed" for n in graph.forward.graph.nodes):
        raise RuntimeError("nnc.compile: backward with create_graph=True through a compiled graph that draws random "
                           "numbers (dropout) is not supported: the draw cannot be replayed. Run this module eagerly")
    if graph.written_inputs:
        raise RuntimeError("nnc.compile: backward with create_graph=True through a compiled graph that writes its "
                           "inputs in place is not supported: their old values are gone. Run this module eagerly")
    for t, seen in zip(tensors, ctx.replay_versions):
        if t._vc()[0] != seen:
            raise RuntimeError(f"one of the variables needed for gradient computation has been modified by an "
                               f"inplace operation: an input of a compiled graph is at version {t._vc()[0]}; "
                               f"expected version {seen} instead.")
    # NOTE: the parameters the call read (func.functional_call's substitutes, swapped back since), not the module's
    params = {node.target: t for node, t in zip(graph.param_nodes, tensors[ctx.n_inputs:])}
    with grad_mode.enable_grad(), _reparametrized(graph.forward, params):
        outputs = pytree.tensor_leaves(graph.run_eagerly(list(tensors[:ctx.n_inputs]), ctx.sizes))
    pairs = [(o, g) for o, g in zip(outputs, grads) if g is not None and o.requires_grad]
    wanted = [k for k, t in enumerate(tensors) if t.requires_grad]
    found = autograd.grad([o for o, _ in pairs], [tensors[k] for k in wanted], [g for _, g in pairs],
                          create_graph=True, allow_unused=True) if pairs else [None] * len(wanted)
    result = [None] * len(tensors)
    for k, g in zip(wanted, found):
        result[k] = g
    return (None, None, None, *result)


def _zeros_like_node(node, sizes: dict, target: str = "cpu"):
    import runtime
    from runtime.tensor import Tensor

    shape = evaluate(node.meta["shape"], sizes)
    if target == "cuda":
        return runtime.zeros(shape, dtype=node.meta["dtype"], device="cuda")
    return Tensor._from_array(np.zeros(shape, dtype=node.meta["dtype"].np))


def plan_type(target: str) -> type:
    """The Plan class that runs a graph on a target: nnc.executor's (CPU) or nnc.cuda_executor's."""
    if target == "cuda":
        from .cuda_executor import CudaPlan

        return CudaPlan
    return Plan


def _size_sources(tensor_inputs: list, shape_env) -> list[tuple[int, int]]:
    """(input position, dim) where each size symbol's value is read, in symbol order."""
    if shape_env is None:
        return []
    found = {}
    for k, node in enumerate(tensor_inputs):
        for d, size in enumerate(node.meta["shape"]):
            if is_symbolic(size) and len(size.terms) == 1 and size.terms[0][1] == 1 and len(size.terms[0][0]) == 1:
                found.setdefault(size.terms[0][0][0], (k, d))
    missing = [name for name in shape_env.names if name not in found]
    if missing:
        raise CompileError(f"size symbols {missing} are not an input's dimension")
    return [found[name] for name in shape_env.names]


class _SizedInterpreter(Interpreter):
    """Runs a graph whose attributes hold symbolic sizes, evaluated for one call's sizes (eager autograd)."""

    def __init__(self, gm, sizes: dict):
        super().__init__(gm)
        self.sizes = sizes

    def fetch_args_kwargs_from_env(self, node):
        args, kwargs = super().fetch_args_kwargs_from_env(node)
        return evaluate(args, self.sizes), evaluate(kwargs, self.sizes)


def _seeds_of_gradients(graph, n_seeds: int) -> list[frozenset]:
    """For each gradient the backward graph returns, which of its seed placeholders (the last n_seeds) it reads."""
    seeds = graph.placeholders[len(graph.placeholders) - n_seeds:]
    bit = {node: 1 << j for j, node in enumerate(seeds)}
    reads: dict = {}  # node -> a bit mask of the seeds it reads
    for node in graph.nodes:
        mask = bit.get(node, 0)
        for arg in node.all_input_nodes:
            mask |= reads.get(arg, 0)
        reads[node] = mask
    outputs = graph.output_node.args[0]
    outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    return [frozenset(j for j in range(n_seeds) if reads.get(out, 0) >> j & 1) if isinstance(out, Node)
            else frozenset() for out in outputs]


def _leaves(value) -> list:
    """Graph output nodes that are tensors, in structure order (repeats kept)."""
    if isinstance(value, Node):
        return [value] if "shape" in value.meta else []
    if isinstance(value, (tuple, list)):
        return [n for v in value for n in _leaves(v)]
    if isinstance(value, dict):
        return [n for v in value.values() for n in _leaves(v)]
    return []


def _sum_for(node, leaves, grads):
    """The gradient of a forward output node: the sum over every place it appears in the output."""
    total = None
    for leaf, grad in zip(leaves, grads):
        if leaf is node and grad is not None:
            total = grad if total is None else total + grad
    return total
