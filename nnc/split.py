"""Graph breaks at run time: a decomposed graph with opaque nodes runs as compiled pieces and eager calls.

Opaque nodes (a submodule that could not be traced, a random draw, a hooked module) must run eagerly, with real
autograd. Everything between them is pure primitives: each maximal run of those becomes a piece of its own, compiled
with its own backward (nnc.compiled_graph.CompiledGraph), so gradients flow piece -> eager call -> piece through
ordinary autograd. What each piece needs from earlier ones (and what later ones need from it) are its inputs and
outputs.
"""
from __future__ import annotations

from runtime.tensor import Tensor

from .graph import Graph, Node, fetch_attr, map_arg
from .graph_module import GraphModule
from .interpreter import Interpreter
from .passes.simplify import is_pure_prim


class Piece:
    """A run of pure nodes as a graph of its own: `inputs` and `outputs` are nodes of the whole graph."""

    def __init__(self, gm: GraphModule, inputs: list[Node], outputs: list[Node]):
        self.gm, self.inputs, self.outputs = gm, inputs, outputs
        self.compiled = None     # its CompiledGraph (the pipeline's later stages build it)
        self.trainable = False   # whether it reads a parameter that requires grad
        self.wants_grad = ()     # per input: whether it may require grad at run time

    @property
    def needs_grad(self) -> bool:
        return self.trainable or any(self.wants_grad)

    @property
    def name(self) -> str:
        return self.gm._get_name()


def split_runs(graph: Graph) -> list:
    """The graph's computing nodes in order, as lists of consecutive pure nodes and single eager nodes."""
    runs, current = [], []
    for node in graph.nodes:
        if node.op in ("placeholder", "get_attr", "output"):
            continue
        if is_pure_prim(node):
            current.append(node)
            continue
        if current:
            runs.append(current)
            current = []
        runs.append(node)
    if current:
        runs.append(current)
    return runs


def piece_graph(root: GraphModule, nodes: list[Node], name: str) -> Piece:
    """A GraphModule over `nodes` (sharing root's state): placeholders for what it reads from outside, get_attr
    copies for the attributes, and a tuple output of what is read after it."""
    inside = set(nodes)
    inputs = [n for n in _read_from_outside(nodes, inside) if n.op != "get_attr"]
    outputs = [n for n in nodes if any(u not in inside for u in n.users)]
    graph, mapping = Graph(), {}
    for node in inputs:
        placeholder = graph.placeholder(node.name)
        placeholder.meta.update({k: node.meta[k] for k in ("shape", "dtype") if k in node.meta})
        mapping[node] = placeholder
    for node in _read_from_outside(nodes, inside):
        if node.op == "get_attr":
            mapping[node] = graph.node_copy(node, mapping.__getitem__)
    for node in nodes:
        mapping[node] = graph.node_copy(node, mapping.__getitem__)
    graph.output(tuple(mapping[n] for n in outputs))
    constants = root.graph.meta.get("constants", {})
    graph.meta = {**root.graph.meta,
                  "constants": {n.target: constants[n.target] for n in graph.nodes
                                if n.op == "get_attr" and n.target in constants}}
    return Piece(GraphModule(root, graph, class_name=name), inputs, outputs)


def _read_from_outside(nodes: list[Node], inside: set) -> list[Node]:
    found: dict = {}
    for node in nodes:
        for arg in node.all_input_nodes:
            if arg not in inside:
                found.setdefault(arg, None)
    return list(found)


def requires_grad_flow(gm: GraphModule, inputs_requiring_grad) -> set:
    """Nodes whose value may require grad at run time (a superset: a piece is built to differentiate them all)."""
    trainable = {id(p) for p in gm.parameters() if p.requires_grad}
    tensor_inputs = [n for n in gm.graph.placeholders if "shape" in n.meta]
    requires = {n for n, wants in zip(tensor_inputs, inputs_requiring_grad) if wants}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            if id(fetch_attr(gm, node.target)) in trainable:
                requires.add(node)
        elif node.op == "call_module":
            module = gm.get_submodule(node.target)
            if any(p.requires_grad for p in module.parameters()) or any(a in requires for a in node.all_input_nodes):
                requires.add(node)
        elif node.op != "placeholder" and any(a in requires for a in node.all_input_nodes):
            requires.add(node)
    return requires


class SplitGraph:
    """Runs a decomposed graph as pieces (each compiled by the pipeline into `piece.compiled`) and eager nodes (run
    through the interpreter on real tensors, so autograd records them)."""

    def __init__(self, gm: GraphModule, inputs_requiring_grad: tuple):
        self.gm = gm
        self.interpreter = Interpreter(gm)
        requires = requires_grad_flow(gm, inputs_requiring_grad)
        self.steps = []
        for k, run in enumerate(split_runs(gm.graph)):
            if isinstance(run, Node):
                self.steps.append(run)
                continue
            piece = piece_graph(gm, run, f"{gm._get_name()}_piece{k}")
            piece.wants_grad = tuple(n in requires for n in piece.inputs)
            piece.trainable = any(n in requires for n in _read_from_outside(run, set(run)) if n.op == "get_attr")
            self.steps.append(piece)
        self.placeholders = gm.graph.placeholders
        self.attrs = [n for n in gm.graph.nodes if n.op == "get_attr"]
        self.output = gm.graph.output_node.args[0]

    @property
    def pieces(self) -> list[Piece]:
        return [s for s in self.steps if isinstance(s, Piece)]

    @property
    def compiled_graphs(self) -> list:
        return [p.compiled for p in self.pieces]

    @property
    def eager_nodes(self) -> list[Node]:
        return [s for s in self.steps if isinstance(s, Node)]

    def run(self, tensors: list, wants_grad: bool):
        env: dict = dict(zip(self.placeholders, tensors))
        for node in self.attrs:
            env[node] = self.interpreter.fetch_attr(node.target)
        lookup = env.__getitem__
        for step in self.steps:
            if isinstance(step, Node):
                env[step] = getattr(self.interpreter, step.op)(step.target, map_arg(step.args, lookup),
                                                               map_arg(step.kwargs, lookup))
                continue
            inputs = [env[n] for n in step.inputs]
            results = step.compiled.run(inputs, wants_grad and _any_requires_grad(inputs, step))
            env.update(zip(step.outputs, results))
        return map_arg(self.output, lookup)


def _any_requires_grad(inputs: list, piece: Piece) -> bool:
    return piece.trainable or any(isinstance(t, Tensor) and t._rg for t in inputs)


