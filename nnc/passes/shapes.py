"""Shape and dtype propagation: run the graph on example inputs and record each node's shape and dtype in meta."""
from __future__ import annotations

import contextlib

from runtime.tensor import Tensor

from ..interpreter import Interpreter
from ..symbolic import hint_of
from ..trace import attributes_kept


def tensor_meta(value):
    """{'shape', 'dtype'} for a tensor, a list of them for a tuple/list of tensors, else None."""
    if isinstance(value, Tensor):
        return {"shape": tuple(value.shape), "dtype": value.dtype}
    if isinstance(value, (tuple, list)) and any(isinstance(v, Tensor) for v in value):
        return [tensor_meta(v) for v in value]
    return None


class ShapeProp(Interpreter):
    """An Interpreter that stores meta['shape'] and meta['dtype'] (or meta['tensor_meta'] for tuples)."""

    def fetch_args_kwargs_from_env(self, node):
        args, kwargs = super().fetch_args_kwargs_from_env(node)
        return hint_of(args), hint_of(kwargs)  # symbolic sizes in attributes: this run is at their hints

    def run_node(self, node):
        result = super().run_node(node)
        found = tensor_meta(result)
        if isinstance(found, dict):
            node.meta.update(found)
        elif found is not None:
            node.meta["tensor_meta"] = found
            if hasattr(result, "_fields"):  # a named tuple (topk's values/indices): decompose keeps its type
                node.meta["tuple_type"] = type(result)
        elif not isinstance(result, Tensor):
            node.meta["value"] = result if isinstance(result, (int, float, bool, tuple)) else None
        return result

    def call_module(self, target, args, kwargs):
        # NOTE: an analysis must not fire user hooks (they may record or print); a hooked module's output
        # shape is taken from its forward alone.
        return self.fetch_attr(target).forward(*args, **kwargs)

    def propagate(self, *example_inputs):
        return self.run(*example_inputs)


def propagate_shapes(gm, *example_inputs):
    """Fill shape/dtype meta on gm.graph from example inputs; returns gm (its state left as it was)."""
    import runtime
    from runtime.autograd import no_grad

    rng = runtime.get_rng_state()  # an analysis draws no numbers from the user's stream (dropout replayed here)
    try:
        with no_grad(), buffers_kept(gm):
            ShapeProp(gm).propagate(*example_inputs)
    finally:
        runtime.set_rng_state(rng)
    gm.graph.meta["example_inputs"] = [tensor_meta(x) for x in example_inputs]
    return gm


@contextlib.contextmanager
def buffers_kept(root):
    """Undo what running the graph does to buffers (BatchNorm's running stats, a buffer assigned in forward) and to
    attributes: shape propagation is an analysis, so it must not advance the model's state."""
    saved = [(m, dict(m._buffers), [(b._vc()[0], b.clone()) if b is not None else None
                                     for b in m._buffers.values()])
             for m in root.modules()]
    try:
        with attributes_kept(root):
            yield
    finally:
        for module, registry, values in saved:
            module._buffers.clear()
            module._buffers.update(registry)
            for buffer, value in zip(registry.values(), values):
                # NOTE: only what was written: a buffer that views an expanded tensor (BERT's position_ids) is
                # read-only memory, and writing it back would raise
                if buffer is not None and buffer._vc()[0] != value[0]:
                    buffer.copy_(value[1])
