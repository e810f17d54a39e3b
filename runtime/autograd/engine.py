"""The backward engine: a reverse topological walk over autograd nodes, with no op-specific code."""
from __future__ import annotations

import heapq
import threading

import numpy as np

from . import anomaly_mode, grad_mode
from .graph import AccumulateGrad, edge_of


def _discover(root_nodes):
    """Count, for each reachable node, how many edges point at it; also map child -> parents."""
    deps, parents = {}, {}
    stack, seen = list(root_nodes), set(root_nodes)
    while stack:
        node = stack.pop()
        for edge in node.next_edges:
            if edge is None:
                continue
            child = edge[0]
            deps[child] = deps.get(child, 0) + 1
            parents.setdefault(child, []).append(node)
            if child not in seen:
                seen.add(child)
                stack.append(child)
    return deps, parents


def _nodes_reaching(targets, parents):
    """Nodes from which some target is reachable (the only ones worth running)."""
    needed, stack = set(targets), list(targets)
    while stack:
        for parent in parents.get(stack.pop(), ()):
            if parent not in needed:
                needed.add(parent)
                stack.append(parent)
    return needed


class _RunState(threading.local):
    capturing = False  # this thread runs a backward whose gradients go to chosen inputs (grad, inputs=)


_run_state = _RunState()


def is_capturing() -> bool:
    """Whether the backward running in this thread is autograd.grad's or backward(inputs=...)'s."""
    return _run_state.capturing


def execute(roots, *, retain_graph: bool, create_graph: bool, capture=None) -> None:
    previous, _run_state.capturing = _run_state.capturing, capture is not None
    try:
        _execute(roots, retain_graph=retain_graph, create_graph=create_graph, capture=capture)
    finally:
        _run_state.capturing = previous


def _execute(roots, *, retain_graph: bool, create_graph: bool, capture=None) -> None:
    """Propagate gradients from `roots` [(edge, grad)] through the graph.

    Without `capture`, leaf gradients accumulate into `.grad`. With `capture` {edge: callback},
    only the captured edges receive gradients (autograd.grad, backward(inputs=...)).
    """
    root_nodes = list(dict.fromkeys(edge[0] for edge, _ in roots))
    deps, parents = _discover(root_nodes)
    needed = _nodes_reaching([e[0] for e in capture], parents) if capture is not None else None
    buffers = {}
    for (node, nr), grad in roots:
        _add_to_buffer(buffers, node, nr, grad)
    ready = [(-n.seq, n.seq, n) for n in root_nodes if deps.get(n, 0) == 0]
    heapq.heapify(ready)
    with grad_mode.set_grad_enabled(create_graph):
        while ready:
            node = heapq.heappop(ready)[2]
            grads = buffers.pop(node, None) or [None] * node.n_outputs
            if anomaly_mode.state.enabled:
                in_grads = _run_node_checked(node, grads, capture, needed)
            else:
                grads = node.call_pre_hooks(grads)
                in_grads = _run_node(node, grads, capture, needed)
            if not retain_graph:
                node.release()
            _pass_on(node, in_grads, buffers, deps, ready)
            # NOTE: no local may keep a gradient alive: AccumulateGrad stores an unshared one without a copy
            del grads, in_grads


def _pass_on(node, in_grads, buffers, deps, ready) -> None:
    """Add a node's input gradients to its children's buffers; queue the children that are now ready."""
    for edge, grad in zip(node.next_edges, in_grads):
        if edge is None:
            continue
        child = edge[0]
        if grad is not None:
            _add_to_buffer(buffers, child, edge[1], grad)
        deps[child] -= 1
        if deps[child] == 0:
            heapq.heappush(ready, (-child.seq, child.seq, child))


def _run_node(node, grads, capture, needed):
    if capture is not None:
        for nr, grad in enumerate(grads):
            callback = capture.get((node, nr))
            if callback is not None and grad is not None:
                callback(grad)
        if node not in needed:
            return ()
    if isinstance(node, AccumulateGrad):
        if capture is None:
            node.accumulate(grads)
        return ()
    if all(g is None for g in grads):
        return ()
    return node.apply(grads)


def _run_node_checked(node, grads, capture, needed):
    """A node's hooks and _run_node under anomaly detection: a node returning nan raises, and a node that fails
    (its hooks included) names its forward call."""
    try:
        in_grads = _run_node(node, node.call_pre_hooks(grads), capture, needed)
        anomaly_mode.check_gradients(node, in_grads)
    except Exception:
        anomaly_mode.warn_of_failure(node)
        raise
    return in_grads


def _add_to_buffer(buffers, node, nr, grad) -> None:
    buf = buffers.get(node)
    if buf is None:
        buf = buffers[node] = [None] * node.n_outputs
    buf[nr] = grad if buf[nr] is None else buf[nr] + grad


def root_edges(tensors, grad_tensors):
    """Pair each output with its seed gradient, checking torch's preconditions."""
    from ..tensor import Tensor

    roots = []
    for i, (t, g) in enumerate(zip(tensors, grad_tensors)):
        edge = edge_of(t)
        if edge is None:
            raise RuntimeError(f"element {i} of tensors does not require grad and does not have a grad_fn")
        if g is None:
            if t.numel() != 1:
                raise RuntimeError("grad can be implicitly created only for scalar outputs")
            g = Tensor._from_array(np.ones_like(t._data)) if not t.is_cuda else t.detach().new_ones(tuple(t.shape))
        elif not isinstance(g, Tensor):
            g = Tensor._from_array(np.asarray(g, dtype=t._data.dtype))
        if tuple(g.shape) != tuple(t.shape):
            raise RuntimeError(f"Mismatch in shape: grad_output[{i}] has a shape of {list(g.shape)} and "
                               f"output[{i}] has a shape of {list(t.shape)}.")
        roots.append((edge, g if g.dtype is t.dtype else g.detach().to(t.dtype)))
    return roots
