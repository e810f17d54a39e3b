"""torch.func's transforms on runtime's reverse-mode autograd: grad, grad_and_value, vjp, jvp, jacrev, jacfwd,
hessian, and vmap as a loop over the batch.

Each differentiating transform runs the function on fresh differentiable aliases of its arguments and asks
runtime.autograd.grad for the result. Transforms nest (grad of grad, jacfwd of jacrev, vmap of grad): while one runs,
an inner one keeps its gradients' graph (create_graph), and so does any transform whose arguments carry a history of
their own (a meta-learning loop differentiating through it); at the top level results come back detached, as
torch.func's do. jvp is the vjp of a vjp (the vjp is linear in its cotangent); jacfwd computes the same Jacobian as
jacrev, by reverse mode. vmap calls the function once per batch entry and stacks the results: torch's batching rules
give the same values, and its randomness modes keep their meaning (the generator's state is compared or restored).
"""
from __future__ import annotations

import contextlib
import functools

from .. import autograd
from ..api import stack
from ..autograd.grad_mode import enable_grad
from ..random import get_rng_state, set_rng_state
from ..tensor import Tensor
from ..utils._pytree import tree_flatten, tree_map, tree_unflatten

_running = [0]  # transforms running now (nesting depth)


@contextlib.contextmanager
def _inside_transform():
    _running[0] += 1
    try:
        yield
    finally:
        _running[0] -= 1


def _fresh(value):
    """A differentiable alias of a tensor argument: a view in its outer graph, or a new leaf."""
    if not isinstance(value, Tensor):
        return value
    if value.requires_grad:
        return value.view_as(value)
    if not value.dtype.is_differentiable:
        raise RuntimeError(f"torch.func transforms differentiate floating point and complex tensors only; got an "
                           f"argument of dtype {value.dtype}")
    return value.detach().requires_grad_(True)


def _tensors(tree) -> list:
    return [leaf for leaf in tree_flatten(tree)[0] if isinstance(leaf, Tensor)]


def _argnums(argnums, n_args: int) -> tuple:
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    if not nums:
        raise RuntimeError("argnums must be non-empty")
    for k in nums:
        if not -n_args <= k < n_args:
            raise RuntimeError(f"Got argnums={argnums}, but only {n_args} positional inputs")
    return tuple(k % n_args for k in nums)


def _split_aux(result, has_aux: bool, name: str):
    if not has_aux:
        return result, None
    if not (isinstance(result, tuple) and len(result) == 2):
        raise RuntimeError(f"{name}(f, ...): output of function f should be a tuple: (output, aux) if has_aux is True")
    return result


def _detached(tree):
    return tree_map(lambda v: v.detach() if isinstance(v, Tensor) else v, tree)


class _Linearized:
    """A function run on differentiable aliases of some of its arguments: its output, and vector-Jacobian products
    of that output with respect to those arguments."""

    def __init__(self, func, args: tuple, kwargs: dict, positions: tuple, has_aux: bool, name: str):
        self.keep_graph = _running[0] > 0 or any(t.requires_grad for k in positions for t in _tensors(args[k]))
        args = list(args)
        self.inputs = [tree_map(_fresh, args[k]) for k in positions]
        for k, value in zip(positions, self.inputs):
            args[k] = value
        with enable_grad(), _inside_transform():
            self.output, self.aux = _split_aux(func(*args, **kwargs), has_aux, name)

    def vjp(self, cotangents, keep_graph=None) -> list:
        """The gradients of <output, cotangents> for each differentiated argument (zeros where unused)."""
        keep = self.keep_graph if keep_graph is None else keep_graph
        outputs, cots = _tensors(self.output), _tensors(cotangents)
        leaves = [t for tree in self.inputs for t in _tensors(tree)]
        with enable_grad():
            grads = autograd.grad(outputs, leaves, cots, retain_graph=True, create_graph=keep, allow_unused=True)
        grads = [t.new_zeros(tuple(t.shape)) if g is None else (g if keep else g.detach())
                 for g, t in zip(grads, leaves)]
        it = iter(grads)
        return [tree_map(lambda v: next(it) if isinstance(v, Tensor) else v, tree) for tree in self.inputs]

    def result(self, value):
        return value if self.keep_graph else _detached(value)


def _scalar(output, name: str):
    if not isinstance(output, Tensor):
        raise RuntimeError(f"{name}(f)(*args): Expected f(*args) to return a Tensor, got {type(output).__name__}")
    if output.ndim != 0:
        raise RuntimeError(f"{name}(f)(*args): Expected f(*args) to return a scalar Tensor, got tensor with "
                           f"{output.ndim} dims. Maybe you wanted to use the vjp or jacrev APIs instead?")
    return output


def grad_and_value(func, argnums=0, has_aux=False):
    """f's gradient with respect to its argument(s) `argnums`, and f's value: ((gradient, value) or
    (gradient, (value, aux)) with has_aux)."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        positions = _argnums(argnums, len(args))
        run = _Linearized(func, args, kwargs, positions, has_aux, "grad_and_value")
        output = _scalar(run.output, "grad_and_value")
        grads = run.vjp(output.new_ones(()))
        gradient = grads[0] if isinstance(argnums, int) else tuple(grads)
        value = run.result(output)
        return (gradient, (value, run.result(run.aux))) if has_aux else (gradient, value)

    return wrapper


def grad(func, argnums=0, has_aux=False):
    """The gradient of a scalar-valued f with respect to its argument(s) `argnums` ((gradient, aux) with has_aux)."""
    both = grad_and_value(func, argnums, has_aux)

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        gradient, value = both(*args, **kwargs)
        return (gradient, value[1]) if has_aux else gradient

    return wrapper


def vjp(func, *primals, has_aux=False):
    """(f(*primals), vjp_fn) (and aux): vjp_fn(cotangents) gives a tuple of the vector-Jacobian products with
    respect to each primal."""
    run = _Linearized(func, primals, {}, tuple(range(len(primals))), has_aux, "vjp")

    def vjp_fn(cotangents):
        if tree_flatten(cotangents)[1] != tree_flatten(run.output)[1]:
            raise RuntimeError("Expected pytree structure of cotangents to be the same as pytree structure of outputs "
                               "to the function")
        return tuple(run.vjp(cotangents))

    output = run.result(run.output)
    return (output, vjp_fn, run.result(run.aux)) if has_aux else (output, vjp_fn)


def jvp(func, primals, tangents, *, has_aux=False):
    """(f(*primals), J @ tangents): the Jacobian-vector product, as the vjp of f's vjp (linear in its cotangent)."""
    if not isinstance(primals, tuple) or not isinstance(tangents, tuple) or len(primals) != len(tangents):
        raise RuntimeError("jvp(f, primals, tangents): Expected primals and tangents to be tuples of the same length")
    run = _Linearized(func, primals, {}, tuple(range(len(primals))), has_aux, "jvp")
    outputs = _tensors(run.output)
    probes = [o.detach().new_zeros(tuple(o.shape)).requires_grad_(True) for o in outputs]
    probe_tree = _refill(run.output, probes)
    pulled = [t for tree in run.vjp(probe_tree, keep_graph=True) for t in _tensors(tree)]
    with enable_grad():
        pushed = autograd.grad(pulled, probes, _tensors(tangents), retain_graph=True, create_graph=run.keep_graph,
                               allow_unused=True)
    pushed = [p.new_zeros(tuple(p.shape)) if g is None else g for g, p in zip(pushed, probes)]
    out = run.result(run.output)
    jvp_out = run.result(_refill(run.output, pushed))
    return (out, jvp_out, run.result(run.aux)) if has_aux else (out, jvp_out)


def _refill(tree, tensors):
    it = iter(tensors)
    return tree_map(lambda v: next(it) if isinstance(v, Tensor) else v, tree)


def jacrev(func, argnums=0, has_aux=False, *, chunk_size=None, _preallocate_and_copy=False):
    """The Jacobian of f with respect to its argument(s) `argnums` by reverse mode: for each output (a pytree), an
    entry of shape output.shape + argument.shape per argument (a tuple of them when argnums is a tuple)."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        positions = _argnums(argnums, len(args))
        run = _Linearized(func, args, kwargs, positions, has_aux, "jacrev")
        per_output = [_jacobian_of(run, output) for output in _tensors(run.output)]
        if isinstance(argnums, int):
            per_output = [rows[0] for rows in per_output]
        else:
            per_output = [tuple(rows) for rows in per_output]
        jacobian = run.result(_refill(run.output, per_output))
        return (jacobian, run.result(run.aux)) if has_aux else jacobian

    return wrapper


def _jacobian_of(run: _Linearized, output) -> list:
    """For each differentiated argument, d output / d argument, of shape output.shape + argument.shape."""
    rows = []
    outputs = _tensors(run.output)
    for k in range(output.numel()):
        basis = [o.new_zeros(tuple(o.shape)) for o in outputs]
        basis[next(i for i, o in enumerate(outputs) if o is output)].view(-1)[k] = 1.0
        rows.append(run.vjp(_refill(run.output, basis)))
    jacobians = []
    for position, tree in enumerate(run.inputs):
        leaves, spec = tree_flatten(tree)
        stacked = []
        for leaf_index, leaf in enumerate(leaves):
            if not isinstance(leaf, Tensor):
                stacked.append(leaf)
                continue
            parts = [tree_flatten(row[position])[0][leaf_index] for row in rows]
            whole = stack(parts) if parts else leaf.new_zeros((0,) + tuple(leaf.shape))
            stacked.append(whole.reshape(tuple(output.shape) + tuple(leaf.shape)))
        jacobians.append(tree_unflatten(stacked, spec))
    return jacobians


def jacfwd(func, argnums=0, has_aux=False, *, randomness="error"):
    """torch.func.jacfwd's Jacobian (the same values and layout as jacrev's; computed here by reverse mode)."""
    return jacrev(func, argnums, has_aux)


def hessian(func, argnums=0):
    """The Hessian of a scalar-valued f: jacfwd of jacrev, as torch.func.hessian."""
    return jacfwd(jacrev(func, argnums), argnums)


# -- vmap ------------------------------------------------------------------------------------------------------------

_RANDOMNESS = ("error", "different", "same")


def vmap(func, in_dims=0, out_dims=0, randomness="error", *, chunk_size=None):
    """f mapped over a dim of its tensor arguments (in_dims: an int or None, or one per argument, or pytrees of
    them); the results stacked along out_dims. kwargs are passed unbatched, as torch does."""
    if randomness not in _RANDOMNESS:
        raise RuntimeError(f"Only allowed values for randomness are 'error', 'different', or 'same'. Got "
                           f"{randomness}")

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        leaves, spec = tree_flatten(args)
        dims = _leaf_dims(in_dims, args, leaves)
        size = _batch_size(leaves, dims)
        state = get_rng_state() if randomness != "different" else None
        results = []
        for i in range(size):
            if randomness == "same":
                set_rng_state(state)
            sliced = [leaf.select(d, i) if d is not None else leaf for leaf, d in zip(leaves, dims)]
            results.append(func(*tree_unflatten(sliced, spec), **kwargs))
            if randomness == "error" and state != get_rng_state():  # the generator's state: plain numbers
                raise RuntimeError("vmap: called random operation while in randomness error mode. Please either use "
                                   "the 'same' or 'different' randomness flags on vmap or perform the randomness "
                                   "operation out of vmap")
        return _stacked(results, out_dims)

    return wrapper


def _leaf_dims(in_dims, args: tuple, leaves: list) -> list:
    """The mapped dim of each flattened argument leaf (None: not mapped)."""
    if isinstance(in_dims, int) or in_dims is None:
        per_arg = [in_dims] * len(args)
    elif isinstance(in_dims, tuple) and len(in_dims) == len(args):
        per_arg = list(in_dims)
    else:
        raise ValueError(f"vmap(f, in_dims={in_dims}, ...)(<inputs>): expected in_dims to be an int, None, or a "
                         f"tuple with one entry per positional argument ({len(args)})")
    dims = []
    for arg, dim in zip(args, per_arg):
        arg_leaves = tree_flatten(arg)[0]
        if isinstance(dim, int) or dim is None:
            dims += [dim if isinstance(leaf, Tensor) else None for leaf in arg_leaves]
        else:
            dim_leaves = tree_flatten(dim)[0]
            if len(dim_leaves) != len(arg_leaves):
                raise ValueError(f"vmap: in_dims {dim} is not compatible with the structure of its input")
            dims += [d if isinstance(leaf, Tensor) else None for leaf, d in zip(arg_leaves, dim_leaves)]
    return [None if d is None else d % max(leaf.ndim, 1) for leaf, d in zip(leaves, dims)]


def _batch_size(leaves: list, dims: list) -> int:
    sizes = [leaf.shape[d] for leaf, d in zip(leaves, dims) if d is not None]
    if not sizes:
        raise ValueError("vmap: at least one input must be mapped over (got in_dims None for every tensor input)")
    if len(set(sizes)) > 1:
        raise ValueError(f"vmap: Expected all tensors to have the same size in the mapped dimension, got sizes "
                         f"{sizes} for the mapped dimension")
    return sizes[0]


def _stacked(results: list, out_dims):
    """The per-entry results stacked along out_dims (an int, None for unmapped, or a pytree of them)."""
    flat = [tree_flatten(r) for r in results]
    spec = flat[0][1]
    columns = list(zip(*[leaves for leaves, _ in flat]))
    dims = ([out_dims] * len(columns) if isinstance(out_dims, int) or out_dims is None
            else tree_flatten(out_dims)[0])
    if len(dims) != len(columns):
        raise ValueError(f"vmap: out_dims={out_dims} is not compatible with the structure of the outputs")
    stacked = []
    for column, dim in zip(columns, dims):
        if not all(isinstance(v, Tensor) for v in column):
            raise ValueError(f"vmap: the function must return tensors only, got {type(column[0]).__name__}")
        stacked.append(column[0] if dim is None else stack(list(column), dim))
    return tree_unflatten(stacked, spec)
