"""torch.func for runtime: functional_call, a module run with other parameters and buffers in place of its own
(meta-learning's inner loops, model ensembles), stack_module_state, and the transforms of _transforms.py (grad,
grad_and_value, vjp, jvp, jacrev, jacfwd, hessian, vmap)."""
from __future__ import annotations

import contextlib

from ..nn.modules.module import Module
from ..utils import state_version
from ._transforms import grad, grad_and_value, hessian, jacfwd, jacrev, jvp, vjp, vmap  # noqa: F401

_UNSET = object()


def functional_call(module: Module, parameter_and_buffer_dicts, args=None, kwargs=None, *, tie_weights: bool = True,
                    strict: bool = False):
    """module(*args, **kwargs) with the given tensors (by state-dict name) as its parameters and buffers for this
    call only; gradients flow to them, not to the module's own. A tensor given for one of tied names stands for all
    of them (tie_weights). strict: every parameter and buffer must be given, and nothing else."""
    values = _merged(parameter_and_buffer_dicts)
    if tie_weights:
        values = _with_tied(module, values)
    if strict:
        _check_strict(module, values)
    if args is None:
        args = ()
    elif not isinstance(args, tuple):
        args = (args,)
    with _reparametrized(module, values):
        return module(*args, **(kwargs or {}))


def _merged(dicts) -> dict:
    if isinstance(dicts, dict):
        return dict(dicts)
    merged: dict = {}
    for d in dicts:
        repeated = sorted(set(merged) & set(d))
        if repeated:
            raise ValueError(f"{repeated} appeared in multiple dictionaries; behavior of functional call is ambiguous")
        merged.update(d)
    return merged


def _tensors_by_name(module: Module) -> dict:
    return dict([*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)])


def _with_tied(module: Module, values: dict) -> dict:
    """`values` with each given tensor also under the other names of the tensor it replaces."""
    names_of: dict[int, list[str]] = {}
    for name, tensor in _tensors_by_name(module).items():
        names_of.setdefault(id(tensor), []).append(name)
    out = dict(values)
    for names in (n for n in names_of.values() if len(n) > 1):
        given = [n for n in names if n in values]
        if len({id(values[n]) for n in given}) > 1:
            raise ValueError(f"functional_call got multiple values for keys {given}, which are tied. Consider using "
                             f"tie_weights=False")
        if given:
            for name in names:
                out.setdefault(name, values[given[0]])
    return out


def _check_strict(module: Module, values: dict) -> None:
    known = _tensors_by_name(module)
    unexpected = [k for k in values if k not in known]
    missing = [k for k in known if k not in values]
    parts = []
    if unexpected:
        parts.append("Unexpected key(s): " + ", ".join(repr(k) for k in unexpected) + ".")
    if missing:
        parts.append("Missing key(s): " + ", ".join(repr(k) for k in missing) + ".")
    if parts:
        raise RuntimeError(f"Error(s) in reparametrizing for {module._get_name()}:\n\t" + "\n\t".join(parts))


@contextlib.contextmanager
def _reparametrized(module: Module, values: dict):
    """Each named parameter, buffer or attribute of a submodule replaced by the given tensor, and put back after."""
    saved = []
    try:
        for name, value in values.items():
            prefix, _, leaf = name.rpartition(".")
            owner = module.get_submodule(prefix)
            registry = next((getattr(owner, r) for r in ("_parameters", "_buffers") if leaf in getattr(owner, r)),
                            owner.__dict__)
            saved.append((registry, leaf, registry.get(leaf, _UNSET)))
            registry[leaf] = value
        state_version.bump()
        yield
    finally:
        for registry, leaf, old in reversed(saved):
            if old is _UNSET:
                del registry[leaf]
            else:
                registry[leaf] = old
        state_version.bump()


def stack_module_state(models) -> tuple[dict, dict]:
    """(parameters, buffers) of same-shaped models, each name's tensors stacked along a new first dim: an ensemble's
    state for vmap over functional_call. The stacked parameters are new leaves that require grad."""
    from ..api import stack

    models = list(models)
    if not models:
        raise RuntimeError("stack_module_state: Expected at least one model, got 0.")
    if len({type(m) for m in models}) > 1 or len({m.training for m in models}) > 1:
        raise RuntimeError("stack_module_state: Expected all models to be of the same class and training mode")
    params = {name: stack([dict(m.named_parameters())[name].detach() for m in models]).requires_grad_(True)
              for name, _ in models[0].named_parameters()}
    buffers = {name: stack([dict(m.named_buffers())[name] for m in models]) for name, _ in models[0].named_buffers()}
    return params, buffers
