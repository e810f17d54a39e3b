"""decompose: rewrite a traced, shape-propagated graph into primitive ops (prims.*) from the op table.

Every node is replayed on MetaValues: tensor-likes that know their shape and dtype and record each primitive
that runtime's API reaches through ops.apply. Modules with hooks stay `call_module` nodes, so their hooks fire
with real values at run time. A node whose replay fails (it reads tensor values, draws random numbers it cannot
compile, or mutates real state) stays as it was: an opaque node, run by the interpreter, with the reason in its meta.

Random draws (`rand`, `randn` and their `_like` forms on the default generator, so dropout too) become
counter-based ones (`_compiled_random`): one `random_seed` node per graph, drawn from runtime's generator on every
run, and a `philox_uniform`/`philox_normal` node per draw, elementwise in the seed and each element's index.
"""
from __future__ import annotations

import builtins
import contextlib
import math
import threading

import numpy as np

import runtime
import runtime.factories as factories
from runtime import amp, api, dtypes as dt
from runtime.nn import Module
from runtime.ops import OPS, Kind, apply
from runtime.tensor import Tensor

from runtime.utils import _pytree as pytree
from ..graph import Graph, Node, fetch_attr, has_side_effect, map_arg
from ..graph_module import GraphModule
from ..prims import prims
from ..symbolic import has_symbols, is_symbolic
from ..python_state import AttributesKept, RandomStreams
from ..trace import PATCHING, RANDOM_FACTORIES, RANDOM_WRITING_METHODS, for_thread, has_hooks
from . import functionalize
from .functionalize import FunctionalizeError
from .shapes import propagate_shapes


class DecomposeError(RuntimeError):
    """A node cannot be expressed with primitives (why is in the message); it stays opaque."""


class MetaValue:
    """A tensor in the graph being built: its node, shape and dtype. Operations on it record primitives."""

    __slots__ = ("_node", "builder", "storage", "chain", "seen", "detached", "own_history")

    def __init__(self, node: Node, builder: "GraphBuilder"):
        self._node, self.builder = node, builder
        self.storage = builder.storage_for(node)  # the memory it shares with its views (nnc.passes.functionalize)
        self.chain = ()                           # the view ops from the storage's value to this one
        self.seen = self.storage.version          # the storage version self._node reflects
        self.detached = False                     # detach_ was called on it
        self.own_history = False                  # a .detach() alias written in place: autograd follows the write

    @property
    def node(self) -> Node:
        """The node of this value's current contents (a write to its storage since the last read regenerates it)."""
        if self.seen != self.storage.version:
            self._node, self.seen = functionalize.current_node(self), self.storage.version
        return self._node

    @staticmethod
    def _apply_op(op, inputs, attrs):
        for x in inputs:  # another kind of tensor-like among the inputs (autodiff's shape-only stand-in) decides
            handler = getattr(type(x), "_apply_op", None)
            if handler is not None and not isinstance(x, (MetaValue, Tensor)):
                return handler(op, inputs, attrs)
        builder = next((x.builder for x in inputs if isinstance(x, MetaValue)), None) or current_builder()
        if any(isinstance(x, np.generic) for x in inputs):  # a numpy scalar operand is a Python number, as in eager
            inputs = tuple(x.item() if isinstance(x, np.generic) else x for x in inputs)
        if amp.state.dtype is not None and op.kind == Kind.MATMUL:  # the caller's autocast: casts, as eager makes
            inputs = amp.autocast_inputs(op, inputs)
        return builder.emit(op, inputs, attrs)

    @staticmethod
    def _apply_function(fn_cls, args, kwargs):
        raise DecomposeError(f"a custom autograd.Function ({fn_cls.__name__}) runs eagerly, so that its own "
                             f"backward computes the gradients")

    @staticmethod
    def _refuse_autograd(what: str):
        raise DecomposeError(f"{what} inside forward needs the eager autograd graph")

    shape = property(lambda self: self.node.meta["shape"])
    dtype = property(lambda self: self.node.meta["dtype"])
    ndim = property(lambda self: len(self.node.meta["shape"]))
    T = property(lambda self: self.permute(tuple(range(self.ndim - 1, -1, -1))))
    mT = property(lambda self: self.transpose(-2, -1))
    mH = property(lambda self: api.conj(self.transpose(-2, -1)))
    H = property(lambda self: api.conj(self.T))
    real = property(lambda self: api.real(self))
    imag = property(lambda self: api.imag(self))

    def size(self, dim=None):
        return tuple(self.shape) if dim is None else self.shape[api.wrap_dim(dim, self.ndim)]

    def dim(self) -> int:
        return self.ndim

    def numel(self) -> int:
        return math.prod(self.shape)

    nelement = numel

    def is_floating_point(self) -> bool:
        return self.dtype.is_floating_point

    requires_grad = False

    def is_contiguous(self, memory_format=None) -> bool:
        return True

    def contiguous(self, memory_format=None):  # a graph's values have no layout: kernels write C-contiguous arrays
        return self

    def view(self, *shape):
        return api.reshape(self, *shape)

    def to(self, *args, **kwargs):
        dtype = kwargs.get("dtype")
        for a in args:
            if isinstance(a, dt.dtype):
                dtype = a
            elif isinstance(a, (Tensor, MetaValue)):
                dtype = a.dtype
        return self if dtype is None else api.to_dtype(self, dtype)

    def detach(self):
        return api.detach(self)

    type = Tensor.type  # (the legacy names, `w.type(v.dtype)` in Hugging Face's GPT-2: a cast, through self.to)

    @property
    def data(self):
        """`x.data` in forward: the same memory without history, as detach() (a write through it reaches x)."""
        return api.detach(self)

    def new_tensor(self, data, dtype=None, **kwargs):
        return factories.tensor(data, dtype=dtype if dtype is not None else self.dtype)

    def __bool__(self):
        raise DecomposeError("the code reads a tensor's value (bool)")

    def __len__(self) -> int:
        return self.shape[0]

    def __iter__(self):
        return iter(api.unbind(self, 0))

    def __index__(self):
        raise DecomposeError("the code reads a tensor's value (int)")

    __int__ = __float__ = __index__
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"MetaValue({self.node.name}: {self.dtype.name}{list(self.shape)})"


def _install_api_methods() -> None:
    for name, fn in {**api.METHODS, **api.DUNDERS}.items():
        if name not in MetaValue.__dict__:
            setattr(MetaValue, name, fn)
    functionalize.install(MetaValue)


_install_api_methods()


_building = threading.local()  # each thread's GraphBuilder (threads may compile at once)


def current_builder() -> "GraphBuilder | None":
    """The GraphBuilder this thread records into (for ops that have no graph value among their inputs)."""
    return getattr(_building, "builder", None)


@contextlib.contextmanager
def building(builder: "GraphBuilder"):
    """Within the block, this thread records into `builder`."""
    previous, _building.builder = current_builder(), builder
    try:
        yield builder
    finally:
        _building.builder = previous


class GraphBuilder:
    """Builds the decomposed graph: emits primitives with shape/dtype meta and explicit casts."""

    def __init__(self, gm: GraphModule | None):
        self.gm = gm
        self.graph = Graph()
        self.graph.meta = dict(gm.graph.meta) if gm is not None else {}
        self.origin: Node | None = None
        self._attr_nodes: dict[str, Node] = {}
        self.storages: dict[Node, functionalize.Storage] = {}  # by the node that first held each value
        self.writes = 0  # in-place writes functionalized so far
        self.seed: MetaValue | None = None  # the graph's random_seed node, made at its first random draw
        self.draws = 0  # random draws recorded so far: the next one's stream number
        self._tensor_paths, self.constants = {}, {}
        if gm is not None:
            named = [*gm.named_parameters(remove_duplicate=False), *gm.named_buffers(remove_duplicate=False)]
            for name, t in named:  # a tied tensor is named by its first path, as the tracer names it
                self._tensor_paths.setdefault(id(t), name)
            for name, value in gm.graph.meta.get("constants", {}).items():
                self._tensor_paths.setdefault(id(value), name)
            self.constants = dict(gm.graph.meta.get("constants", {}))
        # constants eager makes anew on every call: made by a runtime function while tracing, or while decomposing
        self.fresh_constants = set(gm.graph.meta.get("fresh_constants", ())) if gm is not None else set()

    # -- nodes ---------------------------------------------------------------------------------------

    def node(self, op: str, target, args=(), kwargs=None, *, shape=None, dtype=None, name=None) -> Node:
        node = self.graph.create_node(op, target, args, kwargs or {}, name=name)
        if shape is not None:
            node.meta["shape"], node.meta["dtype"] = tuple(shape), dtype
        if self.origin is not None:
            for key in ("source", "source_line", "module_path"):
                if key in self.origin.meta:
                    node.meta[key] = self.origin.meta[key]
            node.meta["from_node"] = self.origin.name
        return node

    def emit(self, op, inputs, attrs) -> MetaValue:
        if op.decomposition is not None:  # a fused eager op: record the primitives it is made of
            return op.decomposition(*inputs, **attrs)
        result = MetaValue(self.emit_node(op, inputs, attrs), self)
        functionalize.track_view(result, op, inputs, attrs)
        return result

    def emit_node(self, op, inputs, attrs) -> Node:
        """The node of one primitive (inputs: MetaValues, nodes, tensors or Python values), casts made explicit."""
        args = [self.graph_arg(x) for x in inputs]
        compute, out_dtype = op.dtype_rule(op, [self._meta_of(a) for a in args], attrs)
        if compute is not None:
            args = [self._cast(a, compute) if (op.cast_inputs is None or i in op.cast_inputs) else a
                    for i, a in enumerate(args)]
        shape, _ = op.infer(*[self._meta_of(a) for a in args], **attrs)
        return self.node("call_function", prims[op.name], tuple(args), dict(attrs), shape=shape, dtype=out_dtype)

    def storage_for(self, node: Node):
        """The storage whose value `node` first was (a new one for a new node)."""
        storage = self.storages.get(node)
        if storage is None:
            storage = self.storages[node] = functionalize.Storage(node)
        return storage

    def _cast(self, arg, dtype):
        if isinstance(arg, Node) and arg.meta.get("dtype") is not dtype:
            return self.node("call_function", prims.cast, (arg,), {"dtype": dtype}, shape=arg.meta["shape"],
                             dtype=dtype)
        return arg

    def _meta_of(self, arg):
        return _ShapeOnly(arg.meta["shape"], arg.meta["dtype"]) if isinstance(arg, Node) else arg

    def graph_arg(self, value):
        """A MetaValue becomes its node; a real tensor becomes a get_attr (parameter, buffer or constant)."""
        if isinstance(value, (MetaValue, _OpaqueValue)):
            return value.node
        if isinstance(value, Tensor):
            return self.attr_node(self._path_for(value), value)
        if isinstance(value, (tuple, list)):
            items = [self.graph_arg(v) for v in value]
            return tuple(items) if isinstance(value, tuple) else items
        return value

    def _path_for(self, tensor: Tensor) -> str:
        path = self._tensor_paths.get(id(tensor))
        if path is None:
            path = f"_tensor_constant{len(self.constants)}"
            while path in self.constants:
                path += "_"
            self.constants[path] = tensor
            self.fresh_constants.add(path)
            self._tensor_paths[id(tensor)] = path
        return path

    def attr_node(self, path: str, tensor: Tensor) -> Node:
        node = self._attr_nodes.get(path)
        if node is None:
            first = next((n for n in self.graph.nodes if n.op not in ("placeholder", "get_attr")), None)
            context = self.graph.inserting_before(first) if first is not None else contextlib.nullcontext()
            with context:
                node = self._attr_nodes[path] = self.graph.get_attr(path)
            node.meta.update(shape=tuple(tensor.shape), dtype=tensor.dtype, module_path=path.rpartition(".")[0])
        return node

    def value_of_constant(self, tensor: Tensor) -> "MetaValue":
        """A real tensor as the graph value of its constant (a new one: made in forward, so made anew per call)."""
        return self.value_of_attr(self._path_for(tensor), tensor)

    def value_of_attr(self, path: str, obj):
        """A parameter or buffer read as a graph value: its current contents, a write earlier in the graph included
        (BatchNorm reads num_batches_tracked right after incrementing it)."""
        if not isinstance(obj, Tensor):
            return obj
        value = MetaValue(self.attr_node(path, obj), self)
        if value.storage.written:
            value.seen = -1  # its node is read through the storage, as after any write
        return value


class _ShapeOnly:
    """What op.infer needs of an operand: shape, dtype and ndim."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @staticmethod
    def _apply_op(op, inputs, attrs):  # marks it tensor-like for the op table's rules; never called
        raise AssertionError("shape-only operands are not executed")


@contextlib.contextmanager
def _compiled_random(builder: GraphBuilder):
    """Random draws inside a decomposed node become graph nodes (`_draw`) where they can; the others would be
    frozen into the graph, so they are refused (the node stays an opaque call that draws anew on every run)."""

    def refuse(*args, **kwargs):
        raise DecomposeError("the code draws random numbers (kept as a call so each run draws anew)")

    compiled = {fn.__name__: draw for fn, draw in _COMPILED_DRAWS.items()}
    with _runtime_names_replaced({name: compiled.get(name, refuse) for name in RANDOM_FACTORIES}):
        yield


@contextlib.contextmanager
def _runtime_names_replaced(replacements: dict):
    """runtime's functions of these names (in runtime, runtime.api and runtime.factories) replaced meanwhile, for
    calls from this thread (other threads' eager code calls the originals)."""
    owner = threading.get_ident()
    with PATCHING:
        saved = [(ns, name, getattr(ns, name)) for ns in (factories, api, runtime) for name in replacements
                 if hasattr(ns, name)]
        try:
            for ns, name, fn in saved:
                setattr(ns, name, for_thread(owner, replacements[name], fn))
            yield
        finally:
            for ns, name, fn in saved:
                setattr(ns, name, fn)


def _drawing(distribution: str):
    """A stand-in for runtime.rand (uniform) or runtime.randn (normal) that records a counter-based draw."""

    def draw(*size, generator=None, dtype=None, device=None, requires_grad=False, **kw):
        if generator is not None or requires_grad or set(kw) - {"size"}:
            raise DecomposeError("the code draws random numbers from its own generator, or a tensor that "
                                 "requires grad (kept as a call so each run draws anew)")
        shape = api.size_args((kw["size"],) if "size" in kw else size)
        return _draw(distribution, shape, dt.as_dtype(dtype) if dtype is not None else dt.get_default_dtype())

    return draw


def _drawing_like(distribution: str):
    def draw_like(input, *, dtype=None, device=None, requires_grad=False, **kw):
        return _drawing(distribution)(tuple(input.shape), dtype=dtype if dtype is not None else input.dtype,
                                      requires_grad=requires_grad, **kw)

    return draw_like


_COMPILED_DRAWS = {factories.rand: _drawing("uniform"), factories.randn: _drawing("normal"),
                   factories.rand_like: _drawing_like("uniform"), factories.randn_like: _drawing_like("normal")}


def _draw(distribution: str, shape: tuple, dtype) -> "MetaValue":
    """A philox_<distribution> node of the current graph: its stream the number of draws before it, its seed the
    graph's random_seed node. Other floating dtypes are drawn in float32 and cast (eager draws them in float64)."""
    if not dtype.is_floating_point:
        raise DecomposeError(f"the code draws random numbers of dtype {dtype} (kept as a call)")
    builder = current_builder()
    if builder.seed is None or builder.seed.node not in set(builder.graph.nodes):  # (a failed replay erased it)
        builder.seed = builder.emit(OPS["random_seed"], (), {})
    draw_dtype = dtype if dtype in (dt.float32, dt.float64) else dt.float32
    value = builder.emit(OPS[f"philox_{distribution}"], (builder.seed,),
                         dict(shape=tuple(shape), dtype=draw_dtype, stream=builder.draws))
    builder.draws += 1
    return value if draw_dtype is dtype else api.to_dtype(value, dtype)


def replay_for_tracer(tracer):
    """replay(node, env) -> the node's value on shape-only MetaValues, for a tracer whose sizes are symbolic: the
    graph the tracer is recording, replayed as decompose would (its nodes are thrown away; only shapes are read)."""
    builder = GraphBuilder(None)
    builder.constants = tracer.constants

    def replay(node: Node, env: dict):
        for key, path in [*tracer._tensor_paths.items()]:  # parameters, buffers and constants seen so far
            builder._tensor_paths.setdefault(key, path)
        for path, tensor in tracer.constants.items():
            builder._tensor_paths.setdefault(id(tensor), path)
        with building(builder), _as_graph_values(builder):
            builder.origin = node
            if node.op == "get_attr" and node.target in tracer.constants:
                return builder.value_of_attr(node.target, tracer.constants[node.target])
            return _replay(builder, tracer.root, node, env)

    return replay


def decompose(gm: GraphModule, *example_inputs) -> GraphModule:
    """A new GraphModule over primitive ops (sharing gm's state); shapes come from example inputs."""
    if example_inputs:
        propagate_shapes(gm, *example_inputs)
    builder = GraphBuilder(gm)
    env: dict[Node, object] = {}
    with building(builder), _as_graph_values(builder):
        for node in gm.graph.nodes:
            builder.origin = node
            env[node] = _replay(builder, gm, node, env)
    builder.graph.meta["constants"] = builder.constants
    builder.graph.eliminate_dead_code(is_impure=_is_impure)
    result = GraphModule(gm, builder.graph, class_name=gm._get_name())
    result.graph.lint(result)
    return result


@contextlib.contextmanager
def _state_as_graph_values(builder: GraphBuilder):
    """Inside layers' forwards, parameters and buffers read as graph values (get_attr), not real tensors."""
    def getattr_as_graph_value(module, name):
        value = original(module, name)
        path = builder._tensor_paths.get(id(value)) if isinstance(value, Tensor) else None
        return builder.value_of_attr(path, value) if path is not None else value

    with PATCHING:
        original = Module.__getattr__
        Module.__getattr__ = for_thread(threading.get_ident(), getattr_as_graph_value, original)
        try:
            yield
        finally:
            Module.__getattr__ = original


def _is_impure(node: Node) -> bool:
    return node.op in ("call_module",) or node.meta.get("opaque_reason") is not None and node.op != "get_attr"


def _replay(builder: GraphBuilder, gm: GraphModule, node: Node, env: dict):
    result = _replay_node(builder, gm, node, env)
    return _detached(result) if node.meta.get("no_grad") else result


def _detached(value):
    """A value computed under no_grad inside forward: its tensors carry no history (autodiff stops at them)."""
    if isinstance(value, MetaValue):
        storage = value.storage
        if storage.gradless:
            return value
        if not value.chain and storage.root is value.node and not storage.written and not storage.views:
            # NOTE: a new value is detached as a storage of its own, so a later write into it replaces its value
            # (a write through a detach view would add a detached difference to the base: inf - inf is nan)
            detached = MetaValue(value.builder.emit_node(OPS["detach"], (value.node,), {}), value.builder)
            detached.storage.gradless = True
            return detached
        return api.detach(value)
    if isinstance(value, (tuple, list)):
        return pytree.like(value, [_detached(v) for v in value])
    return value


def _replay_node(builder: GraphBuilder, gm: GraphModule, node: Node, env: dict):
    if node.op == "placeholder":
        new = builder.node("placeholder", node.target, name=node.name)
        new.meta.update(node.meta)
        return MetaValue(new, builder) if "shape" in node.meta else _OpaqueValue(new)
    if node.op == "get_attr":
        if node.target == "":  # the module itself (for a buffer rebound in forward): a node, so it runs on `self`
            return _OpaqueValue(builder.node("get_attr", ""))
        return builder.value_of_attr(node.target, fetch_attr(gm, node.target))
    if node.op == "output":
        functionalize.add_write_backs(builder)
        builder.graph.meta["returned_inputs"] = functionalize.returned_inputs(map_arg(node.args[0], env.__getitem__))
        builder.node("output", "output", (map_arg(node.args[0], lambda n: builder.graph_arg(env[n])),))
        return None
    args = map_arg(node.args, env.__getitem__)
    kwargs = map_arg(node.kwargs, env.__getitem__)
    args, kwargs = _written_constant_as_graph_value(builder, node, args, kwargs, env)
    if node.op == "call_module" and has_hooks(fetch_attr(gm, node.target)):
        if getattr(fetch_attr(gm, node.target), "inplace", False):
            raise FunctionalizeError(f"{node.target} works in place and has hooks, so it must run eagerly, and "
                                     f"its write would be lost to the compiled graph")
        return _opaque(builder, node, args, kwargs, "the module has hooks, which must see real values")
    module = fetch_attr(gm, node.target) if node.op == "call_module" else None
    snapshot = _StateSnapshot(module)
    existing = set(builder.graph.nodes)
    writes = builder.writes
    try:
        result = _run_symbolically(node, module, args, kwargs)
        if snapshot.changed():
            raise DecomposeError("the module changes its own state (buffers) in forward")
        if snapshot.attributes_changed():
            raise DecomposeError("the module sets its own attributes in forward, which must happen on every call")
        drew = snapshot.drew()
        if drew:
            raise DecomposeError(f"the module changes {drew}, anew on every call")
        return result
    except FunctionalizeError:
        raise
    except Exception as error:  # any failure: keep the node as it was, with real state untouched
        snapshot.restore()
        if builder.writes != writes or _writes_in_place(node):
            # NOTE: an opaque node's own writes would be invisible to the pure graph around it: refuse instead
            raise FunctionalizeError(f"{node.name} writes in place and cannot be decomposed "
                                     f"({type(error).__name__}: {error})") from error
        _erase_new_nodes(builder, existing)
        return _opaque(builder, node, args, kwargs, f"{type(error).__name__}: {error}")


def _written_constant_as_graph_value(builder: GraphBuilder, node: Node, args, kwargs, env: dict):
    """(args, kwargs) with the tensor `node` writes made a graph value when it is a real tensor written with graph
    values (a constant made in forward: `torch.zeros_like(x).scatter_(1, index, 1.0)`), or a view of one
    (`forces = torch.zeros_like(x); forces[i] += f`): the view's steps are replayed on the base's graph value, so the
    write reaches the base. Every env entry holding either then holds its value, so later readers see the write."""
    target = _real_tensor_written_with_graph_values(node, args, kwargs)
    if target is None:
        return args, kwargs
    base = target if target._base is None else target._base
    if base.requires_grad or base._base is not None or (target is not base and target._view_fn is None):
        raise FunctionalizeError(f"{node.name} writes graph values into a tensor made in forward that requires "
                                 f"grad or is a view of one; it runs eagerly")
    value = builder.value_of_constant(base)
    value.storage.gradless = not value.storage.written_with_grad
    held_values = {id(base): value}
    if target is not base:
        view = value
        for op, extra, attrs in target._view_fn:
            view = apply(op.name, view, *extra, **attrs)
        held_values[id(target)] = view
    for key, held in env.items():
        if id(held) in held_values:
            env[key] = held_values[id(held)]
        elif _read_later(key, node, env) and any(_aliases(t, base) for t in pytree.tensor_leaves(held)):
            # NOTE: another view or detached alias computed eagerly holds the old values, and its view ops are not
            # in the graph to replay after the write
            raise FunctionalizeError(f"{node.name} writes graph values into a tensor made in forward that has "
                                     f"other views or aliases; it runs eagerly")

    def swap(v):
        return held_values.get(id(v), v) if isinstance(v, Tensor) else v

    return tuple(map(swap, args)), {k: swap(v) for k, v in kwargs.items()}


def _read_later(key: Node, node: Node, env: dict) -> bool:
    """Whether a replayed node's value is read by a node not replayed yet (env holds the replayed ones)."""
    return any(user is not node and user not in env for user in key.users)


def _aliases(t: Tensor, target: Tensor) -> bool:
    """Whether t shares target's memory (a view of it or a detached alias)."""
    if t._base is target:
        return True
    return isinstance(t._data, np.ndarray) and isinstance(target._data, np.ndarray) and \
        np.may_share_memory(t._data, target._data)


def _real_tensor_written_with_graph_values(node: Node, args, kwargs):
    """The real tensor an in-place method, `x[i] = v`, `x += v`, inplace=True or out= writes, when some other
    argument is a graph value (it cannot be computed eagerly); None otherwise."""
    if node.op not in ("call_method", "call_function") or not _writes_in_place(node):
        return None
    target = kwargs.get("out") if kwargs.get("out") is not None else (args[0] if args else None)
    if not isinstance(target, Tensor):
        return None
    if node.op == "call_method" and node.target in RANDOM_WRITING_METHODS:
        return target  # its draws are graph values too (philox nodes): run eagerly, they would be frozen
    return target if any(isinstance(v, MetaValue) for v in pytree.flatten((args, kwargs))[0]) else None


def _writes_in_place(node: Node) -> bool:
    """Whether a traced node writes a tensor's memory (an in-place method, `x[i] = v`, `x += v`, inplace=True);
    rebinding an attribute (setattr) writes no tensor and may stay an opaque call."""
    return has_side_effect(node) and not (node.op == "call_function" and node.target is builtins.setattr)


class _StateSnapshot:
    """A module's buffers and attributes before a symbolic replay, to detect and undo real mutations."""

    def __init__(self, module):
        buffers = list(module.buffers()) if module is not None else []
        self.saved = [(t, t._vc()[0], t._data.copy()) for t in buffers]
        self.attributes = AttributesKept(module) if module is not None else None
        self.streams = RandomStreams() if module is not None else None

    def changed(self) -> bool:
        return any(t._vc()[0] != version for t, version, _ in self.saved)

    def drew(self) -> str | None:
        """What global random generator the replay drew from (Python's, numpy's), if any."""
        return self.streams.changed() if self.streams is not None else None

    def attributes_changed(self) -> bool:
        """Whether forward rebound an attribute of a module (a counter, a tensor kept for the next call) or changed
        a container it holds; they are put back, so the replay leaves no graph value in the model."""
        return self.attributes is not None and self.attributes.restore()

    def restore(self) -> None:
        for t, version, data in self.saved:
            if t._vc()[0] != version:
                t._data[...] = data
        self.attributes_changed()
        if self.streams is not None:
            self.streams.restore()


def _erase_new_nodes(builder: GraphBuilder, existing: set) -> None:
    """Remove the nodes a failed replay created (get_attr nodes stay cached; dead-code removal drops them)."""
    for new in reversed([n for n in builder.graph.nodes if n not in existing and n.op != "get_attr"]):
        builder.graph.erase_node(new)


def _run_symbolically(node: Node, module, args, kwargs):
    if node.op == "call_function" and node.target in _FACTORY_STAND_INS:
        return _FACTORY_STAND_INS[node.target](*args, **kwargs)
    if node.op == "call_function" and node.target in _COMPILED_DRAWS:  # a draw traced as a node of its own
        return _COMPILED_DRAWS[node.target](*args, **kwargs)
    if node.op == "call_function" and getattr(node.target, "__name__", None) in RANDOM_FACTORIES:
        raise DecomposeError("the code draws random numbers (kept as a call so each run draws anew)")
    if node.op == "call_module":
        result = module.forward(*args, **kwargs)
    elif node.op == "call_method":
        result = getattr(args[0], node.target)(*args[1:], **kwargs)
    else:
        result = node.target(*args, **kwargs)
    _check_no_real_tensors_from(result, args)
    return result


def _sized_factory(fn, args, kwargs):
    """A factory call whose sizes are symbolic (nnc.symbolic) as a primitive node: `arange` or `full`."""
    if kwargs.get("requires_grad"):
        raise DecomposeError("a new tensor that requires grad inside forward")
    dtype = kwargs.get("dtype")
    name = fn.__name__  # (not `fn is factories.ones`: while decompose runs, that is the stand-in)
    if name == "arange":
        bounds = (0, args[0], 1) if len(args) == 1 else (tuple(args) + (kwargs.get("step", 1),))[:3]
        if not all(isinstance(b, int) or is_symbolic(b) for b in bounds):
            raise DecomposeError("arange with symbolic sizes takes integer bounds")
        attrs = dict(start=bounds[0], end=bounds[1], step=bounds[2], dtype=dt.as_dtype(dtype or dt.int64))
        return current_builder().emit(OPS["arange"], (), attrs)
    if name == "full":
        shape, value = api.size_args((args[0],)), args[1] if len(args) > 1 else kwargs["fill_value"]
        dtype = dtype or dt.default_for_category(dt.scalar_category(value))
    else:
        shape, value = api.size_args(args), 1 if name == "ones" else 0
        dtype = dtype or dt.get_default_dtype()
    return current_builder().emit(OPS["full"], (), dict(shape=shape, value=value, dtype=dt.as_dtype(dtype)))


_SIZED_FACTORIES = (factories.arange, factories.zeros, factories.ones, factories.empty, factories.full)


def _like_factory(fn, args, kwargs):
    """`zeros_like(x)` and its kin for a value of symbolic sizes, as a primitive `full` node of x's shape (computed
    eagerly, the new tensor would have the sizes of the compiling call only)."""
    if kwargs.get("requires_grad"):
        raise DecomposeError("a new tensor that requires grad inside forward")
    like = args[0]
    if fn.__name__ == "full_like":
        value = args[1] if len(args) > 1 else kwargs["fill_value"]
    else:
        value = 1 if fn.__name__ == "ones_like" else 0
    dtype = dt.as_dtype(kwargs.get("dtype") or like.dtype)
    return current_builder().emit(OPS["full"], (), dict(shape=tuple(like.shape), value=value, dtype=dtype))


def _sized_stand_in(fn):
    def factory(*args, **kwargs):
        return _sized_factory(fn, args, kwargs) if has_symbols((args, kwargs)) else fn(*args, **kwargs)

    return factory


def _like_stand_in(fn):
    def factory(*args, **kwargs):
        if args and isinstance(args[0], MetaValue) and has_symbols(tuple(args[0].shape)):
            return _like_factory(fn, args, kwargs)
        return fn(*args, **kwargs)

    return factory


# Factories as decompose runs them: a new tensor of symbolic sizes is a graph node (made eagerly, it would have the
# compiling call's sizes only, and pin them); any other call makes its tensor as usual
_FACTORY_STAND_INS = {**{fn: _sized_stand_in(fn) for fn in _SIZED_FACTORIES},
                      **{fn: _like_stand_in(fn) for fn in (factories.zeros_like, factories.ones_like,
                                                            factories.empty_like, factories.full_like)}}


@contextlib.contextmanager
def _as_graph_values(builder: GraphBuilder):
    """What code run on graph values records as nodes instead of computing: draws, state, new tensors' sizes (the
    factories that code inside a decomposed node calls, a module's forward, are their stand-ins)."""
    stand_ins = {fn.__name__: stand_in for fn, stand_in in _FACTORY_STAND_INS.items()}
    with _compiled_random(builder), _state_as_graph_values(builder), _runtime_names_replaced(stand_ins):
        yield


def _check_no_real_tensors_from(result, args) -> None:
    """A real tensor computed from graph values means a value was read eagerly: not expressible."""
    if isinstance(result, Tensor) and any(isinstance(a, MetaValue) for a in args):
        raise DecomposeError("the result was computed outside the graph")


class _OpaqueValue:
    """A non-tensor value produced by an opaque node."""

    __slots__ = ("node",)

    def __init__(self, node):
        self.node = node


def _opaque(builder: GraphBuilder, node: Node, args, kwargs, reason: str):
    """Keep `node` as a call in the new graph; its result is a MetaValue (or a tuple of them)."""
    new = builder.node(node.op, node.target, builder.graph_arg(tuple(args)),
                       {k: builder.graph_arg(v) for k, v in kwargs.items()}, name=node.name)
    new.meta.update(node.meta)
    new.meta["opaque_reason"] = reason
    if "shape" in node.meta:
        value = MetaValue(new, builder)
        if node.op == "call_function" and node.target is builtins.getattr:  # a property may return a view
            value.storage.read_as_attribute = f".{node.args[1]}" if len(node.args) > 1 else "getattr"
        return value
    items = node.meta.get("tensor_meta")
    if isinstance(items, list):
        import operator

        values = []
        for i, item in enumerate(items):
            part = builder.node("call_function", operator.getitem, (new, i))
            if isinstance(item, dict):
                part.meta.update(shape=item["shape"], dtype=item["dtype"])
                values.append(MetaValue(part, builder))
            else:
                values.append(_OpaqueValue(part))
        named = node.meta.get("tuple_type")
        return named(*values) if named is not None else tuple(values)
    return _OpaqueValue(new)
