"""runtime.autograd: backward, grad, custom Function, grad-mode switches and gradcheck."""
from __future__ import annotations

from .anomaly_mode import detect_anomaly, set_detect_anomaly  # noqa: F401
from .grad_mode import enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled  # noqa: F401


def _as_tuple(x):
    if x is None:
        return None
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _refuse_stand_ins(values, what: str) -> None:
    """A compiler's stand-in for a tensor (a tracer's value) has no autograd graph: its type raises the error that
    makes the compiler run this code eagerly instead."""
    from ..tensor import Tensor

    for v in values or ():
        refuse = getattr(type(v), "_refuse_autograd", None)
        if refuse is not None and not isinstance(v, Tensor):
            refuse(what)


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, inputs=None) -> None:
    """Accumulate d(tensors)/d(leaf) into each leaf's .grad (or only into `inputs` when given)."""
    from . import engine
    from .graph import edge_of

    tensors = _as_tuple(tensors)
    _refuse_stand_ins(tensors + (_as_tuple(inputs) or ()), "backward()")
    grads = _as_tuple(grad_tensors) or (None,) * len(tensors)
    if len(grads) != len(tensors):
        raise RuntimeError(f"grad_tensors has {len(grads)} tensors but tensors has {len(tensors)}")
    roots = engine.root_edges(tensors, grads)
    retain = create_graph if retain_graph is None else retain_graph
    capture = None
    if inputs is not None:
        inputs = _as_tuple(inputs)
        if not inputs:
            raise RuntimeError("'inputs' argument to backward() cannot be empty.")
        capture = {}
        for t in inputs:
            edge = edge_of(t)
            if edge is None:
                raise RuntimeError("One of the differentiated Tensors does not require grad")
            capture[edge] = _grad_accumulator_for(t, create_graph)
    engine.execute(roots, retain_graph=retain, create_graph=create_graph, capture=capture)


def _grad_accumulator_for(tensor, create_graph):
    from .graph import _accumulate_into

    return lambda g: _accumulate_into(tensor, g, create_graph)


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, allow_unused=None,
         is_grads_batched=False, materialize_grads=False):
    """The gradients of outputs with respect to inputs, returned (not accumulated into .grad)."""
    from . import engine
    from .graph import edge_of

    outputs, inputs = _as_tuple(outputs), _as_tuple(inputs)
    _refuse_stand_ins(outputs + inputs, "autograd.grad()")
    grads = _as_tuple(grad_outputs) or (None,) * len(outputs)
    if is_grads_batched:
        return _batched_grad(outputs, inputs, grads, retain_graph, create_graph, allow_unused, materialize_grads)
    roots = engine.root_edges(outputs, grads)
    results = [None] * len(inputs)
    capture = {}
    for i, t in enumerate(inputs):
        edge = edge_of(t)
        if edge is None:
            raise RuntimeError("One of the differentiated Tensors does not require grad")
        capture[edge] = _store_into(results, i, capture.get(edge))
    retain = create_graph if retain_graph is None else retain_graph
    engine.execute(roots, retain_graph=retain, create_graph=create_graph, capture=capture)
    for i, (t, g) in enumerate(zip(inputs, results)):
        if g is None:
            if materialize_grads:
                from ..factories import zeros_like

                results[i] = zeros_like(t)
            elif not (allow_unused or materialize_grads):
                raise RuntimeError("One of the differentiated Tensors appears to not have been used in the graph. "
                                   "Set allow_unused=True if this is the desired behavior.")
    return tuple(results)


def _batched_grad(outputs, inputs, grads, retain_graph, create_graph, allow_unused, materialize_grads):
    """is_grads_batched: each grad_output's first dim is a batch of cotangents; the gradients stack theirs (torch
    vmaps the backward; here it runs once per cotangent, the graph kept until the last)."""
    from ..api import stack

    if any(g is None for g in grads):
        raise RuntimeError("is_grads_batched=True needs a grad_output for every output")
    sizes = {g.shape[0] for g in grads}
    if len(sizes) != 1:
        raise RuntimeError(f"is_grads_batched=True: the grad_outputs' batch sizes differ: {sorted(sizes)}")
    (size,) = sizes
    per_cotangent = [grad(outputs, inputs, tuple(g[b] for g in grads),
                          retain_graph=True if b < size - 1 else retain_graph, create_graph=create_graph,
                          allow_unused=allow_unused, materialize_grads=materialize_grads) for b in range(size)]
    return tuple(None if parts[0] is None else stack(list(parts)) for parts in zip(*per_cotangent))


def _store_into(results, i, previous):
    def store(g):
        results[i] = g if results[i] is None else results[i] + g
        if previous is not None:  # the same tensor was passed twice as an input
            previous(g)

    return store


from .function import Function, FunctionCtx  # noqa: E402,F401
from .gradcheck import gradcheck  # noqa: E402,F401
from . import functional  # noqa: E402,F401
from . import forward_ad  # noqa: E402,F401


def __getattr__(name):
    # NOTE: legacy imports the tensor module, which imports this package: Variable loads on first use
    if name == "Variable":
        from ..legacy import Variable

        return Variable
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def gradgradcheck(func, inputs, grad_outputs=None, *, eps=1e-6, atol=1e-5, rtol=1e-3, raise_exception=True, **kwargs):
    """Check second derivatives: gradcheck of the map from inputs (and output cotangents) to first derivatives."""
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    outputs = func(*inputs)
    outputs = tuple(outputs) if isinstance(outputs, (tuple, list)) else (outputs,)
    if grad_outputs is None:
        from ..factories import randn

        grad_outputs = tuple(randn(tuple(o.shape), dtype=o.dtype, requires_grad=True) for o in outputs)
    grad_outputs = tuple(grad_outputs) if isinstance(grad_outputs, (tuple, list)) else (grad_outputs,)
    n = len(inputs)

    def first_derivatives(*args):
        xs, gos = args[:n], args[n:]
        outs = func(*xs)
        outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
        gs = grad(outs, [x for x in xs if x.requires_grad], gos, create_graph=True, allow_unused=True)
        return tuple(g for g in gs if g is not None)

    return gradcheck(first_derivatives, inputs + grad_outputs, eps=eps, atol=atol, rtol=rtol,
                     raise_exception=raise_exception)
