"""runtime.autograd.functional: jacobian, hessian, vjp, jvp, hvp and vhp of a function of tensors, as torch's, built
on reverse mode (runtime.autograd.grad): a Jacobian costs one backward per output element, and jvp/hvp use the
double-backward identity (the vjp of a vjp is linear in its cotangent)."""
from __future__ import annotations


def _tuple(x):
    return (tuple(x), True) if isinstance(x, (tuple, list)) else ((x,), False)


def _prepare(inputs, create_graph):
    from . import enable_grad  # noqa: F401  (imported for the caller's context)

    return tuple(x.detach().requires_grad_(True) if not create_graph or not x.requires_grad else x
                 for x in inputs)


def _grad(outputs, inputs, grad_outputs, create_graph, strict, what):
    from . import grad

    # NOTE: as torch's, outputs that do not require grad (a constant, the derivative of a linear map) contribute
    # nothing: with none left every input's gradient is zero (or a strict-mode error)
    kept = [(o, g) for o, g in zip(outputs, grad_outputs) if o.requires_grad]
    gs = (grad([o for o, _ in kept], inputs, [g for _, g in kept], retain_graph=True, create_graph=create_graph,
               allow_unused=True) if kept else (None,) * len(inputs))
    out = []
    for i, (g, x) in enumerate(zip(gs, inputs)):
        if g is None:
            if strict:
                raise RuntimeError(f"The output of the user-provided function is independent of input {i}. This is "
                                   f"not allowed in strict mode.")
            g = x.new_zeros(tuple(x.shape))
        out.append(g)
    return tuple(out)


def _detach(values, create_graph):
    return tuple(v if create_graph else v.detach() for v in values)


def vjp(func, inputs, v=None, create_graph=False, strict=False):
    """(func(inputs), v^T J): the vector-Jacobian product."""
    from . import enable_grad

    inputs, was_tuple = _tuple(inputs)
    with enable_grad():
        inputs = _prepare(inputs, create_graph)
        outputs, out_tuple = _tuple(func(*inputs))
        if v is None:
            if len(outputs) != 1 or outputs[0].numel() != 1:
                raise RuntimeError("The vector v can only be None if the user-provided function returns a single "
                                   "Tensor with a single element.")
            v = (outputs[0].new_ones(tuple(outputs[0].shape)),)
        else:
            v, _ = _tuple(v)
        grads = _grad(outputs, inputs, v, create_graph, strict, "vjp")
    outs = _detach(outputs, create_graph)
    return (outs if out_tuple else outs[0]), (grads if was_tuple else grads[0])


def jvp(func, inputs, v=None, create_graph=False, strict=False):
    """(func(inputs), J v): the Jacobian-vector product, as the vjp of the vjp (double backward)."""
    from . import enable_grad

    inputs, was_tuple = _tuple(inputs)
    if v is None:
        if len(inputs) != 1 or inputs[0].numel() != 1:
            raise RuntimeError("The vector v can only be None if the input to the user-provided function is a single "
                               "Tensor with a single element.")
        v = (inputs[0].new_ones(tuple(inputs[0].shape)),)
    else:
        v, _ = _tuple(v)
    with enable_grad():
        inputs = _prepare(inputs, create_graph)
        outputs, out_tuple = _tuple(func(*inputs))
        dummies = tuple(o.new_zeros(tuple(o.shape)).requires_grad_(True) for o in outputs)
        # u -> J^T u is linear in u; its vjp with v is J v
        back = _grad(outputs, inputs, dummies, True, strict, "jvp")
        result = _grad(back, dummies, v, create_graph, strict, "jvp")
    outs = _detach(outputs, create_graph)
    res = _detach(result, create_graph)
    return (outs if out_tuple else outs[0]), (res if out_tuple else res[0])


def jacobian(func, inputs, create_graph=False, strict=False, vectorize=False, strategy="reverse-mode"):
    """d func / d inputs, shaped output.shape + input.shape (nested tuples for several outputs or inputs)."""
    from . import enable_grad

    if strategy not in ("reverse-mode", "forward-mode"):
        raise ValueError('Expected strategy to be either "forward-mode" or "reverse-mode".')
    inputs, was_tuple = _tuple(inputs)
    with enable_grad():
        inputs = _prepare(inputs, create_graph)
        outputs, out_tuple = _tuple(func(*inputs))
        rows = []
        for out in outputs:
            flat = out.reshape(-1)
            per_input = [[] for _ in inputs]
            for k in range(flat.shape[0]):
                seed = flat.new_zeros((flat.shape[0],))
                seed[k] = 1.0
                gs = _grad((flat,), inputs, (seed,), create_graph, strict, "jacobian")
                for i, g in enumerate(gs):
                    per_input[i].append(g)
            blocks = []
            for i, x in enumerate(inputs):
                shape = tuple(out.shape) + tuple(x.shape)
                if per_input[i]:
                    from ..api import stack

                    block = stack(per_input[i], 0).reshape(shape)
                else:
                    block = x.new_zeros(shape)
                blocks.append(block if create_graph else block.detach())
            rows.append(tuple(blocks))
    if not was_tuple:
        rows = [r[0] for r in rows]
    else:
        rows = [tuple(r) for r in rows]
    return tuple(rows) if out_tuple else rows[0]


def hessian(func, inputs, create_graph=False, strict=False, vectorize=False, outer_jacobian_strategy="reverse-mode"):
    """The Hessian of a scalar function: the Jacobian of its gradient."""
    inputs_t, was_tuple = _tuple(inputs)

    def gradient(*xs):
        from . import grad

        out = func(*xs)
        if out.numel() != 1:
            raise RuntimeError("The function given to hessian should return a single Tensor with a single element")
        gs = grad((out.reshape(()),), xs, create_graph=True, allow_unused=True)
        return tuple(g if g is not None else x.new_zeros(tuple(x.shape)) * x.sum() for g, x in zip(gs, xs))

    result = jacobian(gradient, inputs_t, create_graph=create_graph, strict=strict)
    if not was_tuple:
        return result[0][0] if isinstance(result[0], tuple) else result[0]
    return result


def vhp(func, inputs, v=None, create_graph=False, strict=False):
    """(func(inputs), v^T H)."""
    from . import enable_grad, grad

    inputs, was_tuple = _tuple(inputs)
    v, _ = _tuple(v) if v is not None else ((None,), False)
    with enable_grad():
        xs = _prepare(inputs, create_graph)
        out = func(*xs)
        if out.numel() != 1:
            raise RuntimeError("The function given to vhp should return a single Tensor with a single element")
        gs = grad((out.reshape(()),), xs, create_graph=True, allow_unused=True)
        gs = tuple(g if g is not None else x.new_zeros(tuple(x.shape)) for g, x in zip(gs, xs))
        result = _grad(gs, xs, v, create_graph, strict, "vhp")
    value = out if create_graph else out.detach()
    return value, (result if was_tuple else result[0])


hvp = vhp  # the Hessian of a scalar function is symmetric, so H v = (v^T H)^T
