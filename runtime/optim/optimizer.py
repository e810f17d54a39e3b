"""Optimizer: the base class holding param groups and per-parameter state, with torch's state_dict layout."""
from __future__ import annotations

import copy
from collections import defaultdict

import numpy as np

from .. import dtypes as dt
from ..autograd.grad_mode import enable_grad, no_grad
from ..ops import OPS
from ..tensor import Tensor, copy_array


# a complex array's memory as float pairs (real, imaginary) in a last dim of 2, and back: the op table's forwards of
# view_as_real and view_as_complex
_as_pairs, _as_complex = OPS["view_as_real"].forward, OPS["view_as_complex"].forward


class _RequiredParameter:
    """Marks a default that every param group must set itself (torch.optim.optimizer.required)."""

    def __repr__(self) -> str:
        return "<required parameter>"


required = _RequiredParameter()


def check_hyper(ok: bool, message: str) -> None:
    """Raise torch's ValueError for an invalid hyperparameter."""
    if not ok:
        raise ValueError(message)

def validate_adam_family(hyper: dict) -> None:
    """torch's checks of the Adam family's hyperparameters (lr, eps, betas, weight_decay), with its messages."""
    beta1, beta2 = hyper["betas"]
    check_hyper(hyper["lr"] >= 0.0, f"Invalid learning rate: {hyper['lr']}")
    check_hyper(hyper["eps"] >= 0.0, f"Invalid epsilon value: {hyper['eps']}")
    check_hyper(0.0 <= beta1 < 1.0, f"Invalid beta parameter at index 0: {beta1}")
    check_hyper(0.0 <= beta2 < 1.0, f"Invalid beta parameter at index 1: {beta2}")
    check_hyper(hyper["weight_decay"] >= 0.0, f"Invalid weight_decay value: {hyper['weight_decay']}")



def reject_unsupported(**flags) -> None:
    """fused/capturable/differentiable select kernels runtime does not have: refuse them clearly."""
    for name, value in flags.items():
        if value:
            raise NotImplementedError(f"{name}=True is not supported by runtime.optim; its single-tensor "
                                      f"numpy update gives the same results, leave {name} unset")


def check_fused(fused, foreach) -> None:
    """fused=True asks torch for its one-kernel update; runtime's update is already one numba pass per parameter
    (or per group), with the same results, so it is accepted. As in torch, it cannot be combined with foreach."""
    if fused and foreach:
        raise RuntimeError("`fused` and `foreach` cannot be `True` together.")


def as_float(value):
    """A hyperparameter as a Python number (torch also accepts a one-element tensor)."""
    return float(value) if isinstance(value, Tensor) else value


def scalar_dtype():
    """The dtype of a 'step' counter: float64 under a float64 default dtype, else float32 (as torch)."""
    return np.float64 if dt.get_default_dtype() is dt.float64 else np.float32


def new_step() -> Tensor:
    return Tensor._from_array(np.zeros((), scalar_dtype()))


def increment_step(state: dict) -> float:
    """Add one to state['step'] in place and return the new count as a float."""
    step = state["step"]
    if isinstance(step, Tensor):
        # NOTE: the sum is exact in float64 and rounded once when stored, as the in-place add rounds it; the
        # in-place add on a 0-d array cost 1.7 us (a parameter's whole one-pass update is a few us), this 0.2 us
        data = step._data
        data[()] = float(data) + 1
        step._bump_version()
        return float(data)
    state["step"] = Tensor._from_array(np.array(float(step) + 1, scalar_dtype()))  # an old-style number
    return float(step) + 1


def raise_no_cuda(optimizer) -> None:
    raise NotImplementedError(f"runtime.optim.{type(optimizer).__name__} does not support CUDA parameters yet "
                              f"(SGD, Adam and AdamW do); keep the model on the CPU for it")


def zeros_like(p: Tensor) -> Tensor:
    """Zeros shaped like p, on p's device (optimizer state lives where its parameter does)."""
    if p.is_cuda:
        from ..factories import zeros

        return zeros(p.shape, dtype=p.dtype, device=p.device)
    return Tensor._from_array(np.zeros_like(p._data))


def lerp_(a: np.ndarray, end: np.ndarray, weight: float) -> None:
    """a <- lerp(a, end, weight) in place, with torch's two-sided formula (exact at weight 0 and 1)."""
    if abs(weight) < 0.5:
        a += weight * (end - a)
    else:
        np.subtract(end, (end - a) * (1 - weight), out=a)


class Optimizer:
    """Base class: param groups (dicts of params + hyperparameters) and `state` keyed by parameter.

    Subclasses either override `step` (torch style) or implement `_update(p, grad, group)`, which the
    default `step` calls for every parameter that has a gradient, under no_grad.
    """

    def __init__(self, params, defaults: dict) -> None:
        self.defaults = defaults
        self.state: defaultdict = defaultdict(dict)
        self.param_groups: list[dict] = []
        if isinstance(params, Tensor):
            raise TypeError("params argument given to the optimizer should be an iterable of Tensors or dicts, "
                            "but got a Tensor")
        _reject_sets(params)
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    def _validate(self, hyper: dict) -> None:
        """Subclasses check hyperparameter values here (on the defaults and on every added group)."""

    # ------------------------------------------------------------------------------------------
    # param groups
    # ------------------------------------------------------------------------------------------

    def add_param_group(self, param_group: dict) -> None:
        """Append a group; options it does not set come from the defaults. Validated before anything changes."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group).__name__}")
        if "params" not in param_group:
            raise ValueError("param_group must have a 'params' entry")
        group = dict(param_group)
        params, names = _split_params(group["params"])
        group["params"] = params
        if names is not None:
            group["param_names"] = names
        for p in params:
            _check_param(p)
        _check_unique(params, self.param_groups)
        for name, default in self.defaults.items():
            if default is required and name not in group:
                raise ValueError(f"parameter group didn't specify a value of required optimization parameter {name}")
            group.setdefault(name, default)
        self._validate(group)
        if self.param_groups and ("param_names" in group) != ("param_names" in self.param_groups[0]):
            raise ValueError("all optimizer param groups should be with/without names")
        self.param_groups.append(group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop every parameter's .grad (or zero it in place when set_to_none=False)."""
        for group in self.param_groups:
            for p in group["params"]:
                g = p._grad
                if g is None:
                    continue
                if set_to_none:
                    p._grad = None
                else:
                    g.detach_()
                    if g.is_cuda:
                        g.fill_(0)
                        continue
                    g._data[...] = 0
                    g._bump_version()

    # ------------------------------------------------------------------------------------------
    # stepping
    # ------------------------------------------------------------------------------------------

    def step(self, closure=None):
        """One update of every parameter with a gradient; `closure` (re)computes and returns the loss."""
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        with no_grad():
            for group in self.param_groups:
                self._step_group(group)
        return loss

    def _step_group(self, group: dict) -> None:
        for p in group["params"]:
            g = p._grad
            if g is not None:
                self._step_param(p, g, group)

    def _step_param(self, p: Tensor, g: Tensor, group: dict) -> None:
        """One parameter's update from its gradient `g`, then its version bump."""
        if p.is_cuda:
            self._update_cuda(p, g, group)
        elif p._data.dtype.kind == "c":
            self._update_as_pairs(p, g._data, group)
        else:
            self._update(p, g._data, group)
        p._bump_version()

    def _update_as_pairs(self, p: Tensor, grad: np.ndarray, group: dict) -> None:
        """A complex parameter updated as torch updates it: as the float pairs of its real and imaginary parts
        (view_as_real), its gradient and its complex state alike, so that elementwise rules (Adam's squares and
        roots) act on each part. The state stays complex between steps."""
        complex_data, pairs_shape = p._data, p._data.shape + (2,)
        state = self.state[p]
        held = [t for t in state.values() if isinstance(t, Tensor) and t._data.dtype.kind == "c"]
        p._data = _as_pairs(complex_data)
        for t in held:
            t._data = _as_pairs(t._data)
        try:
            self._update(p, _as_pairs(grad), group)
        finally:
            p._data = complex_data
            for t in state.values():  # the complex state held, and the state this first step made as pairs
                if isinstance(t, Tensor) and t._data.shape == pairs_shape and t._data.dtype.kind == "f":
                    t._data = _as_complex(t._data)

    def _update(self, p: Tensor, grad: np.ndarray, group: dict) -> None:
        """Update p._data in place from its gradient array (read-only: it is p.grad's memory)."""
        raise NotImplementedError(f"{type(self).__name__} must implement step() or _update()")

    def _update_cuda(self, p: Tensor, grad: Tensor, group: dict) -> None:
        """Update a CUDA parameter in place from its gradient, with tensor ops (kernels on the device)."""
        raise_no_cuda(self)

    # ------------------------------------------------------------------------------------------
    # state dict
    # ------------------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """{'state': {index: {...}}, 'param_groups': [{..., 'params': [index, ...]}]}, as torch.

        Like torch, the state tensors are the live ones (not copies): serialize or deepcopy to snapshot.
        """
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            packed["params"] = [index.setdefault(id(p), len(index)) for p in group["params"]]
            groups.append(packed)
        packed_state = {(index[id(k)] if isinstance(k, Tensor) else k): v for k, v in self.state.items()}
        return {"state": packed_state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a state_dict(): validated first, so a bad one leaves this optimizer unchanged; tensors are copied."""
        if not isinstance(state_dict, dict) or "state" not in state_dict or "param_groups" not in state_dict:
            raise ValueError("optimizer state_dict must be a dict with 'state' and 'param_groups' entries")
        saved_groups = copy.deepcopy(state_dict["param_groups"])
        _check_group_sizes(self.param_groups, saved_groups)
        id_map = {}
        for saved, group in zip(saved_groups, self.param_groups):
            id_map.update(zip(saved["params"], group["params"]))
        new_state: defaultdict = defaultdict(dict)
        for key, value in state_dict["state"].items():
            if key in id_map:
                new_state[id_map[key]] = _copy_state(id_map[key], key, value)
            else:
                new_state[key] = value
        for saved, group in zip(saved_groups, self.param_groups):
            saved["params"] = group["params"]
            if "param_names" in group:
                saved.setdefault("param_names", group["param_names"])
            for name, default in self.defaults.items():
                saved.setdefault(name, default)
        self.state, self.param_groups = new_state, saved_groups

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines += [f"    {k}: {group[k]}" for k in sorted(group) if k not in ("params", "param_names")]
        return "\n".join(lines) + "\n)"


def _split_params(params):
    """(tensors, names or None) from a Tensor, a list of tensors or a list of (name, tensor) pairs."""
    if isinstance(params, Tensor):
        return [params], None
    _reject_sets(params)
    params = list(params)
    named = [isinstance(p, tuple) for p in params]
    if not any(named):
        return params, None
    if not all(named):
        raise ValueError("all optimizer params should be with/without names. Some param names are missing")
    return [p for _, p in params], [n for n, _ in params]


def _reject_sets(params) -> None:
    if isinstance(params, (set, frozenset)):
        raise TypeError("optimizer parameters need to be organized in ordered collections, but the ordering of "
                        "tensors in sets will change between runs. Please use a list instead.")


def _check_param(p) -> None:
    if not isinstance(p, Tensor):
        raise TypeError(f"optimizer can only optimize Tensors, but one of the params is {type(p).__name__}")
    if not (p.is_leaf or p.retains_grad):
        raise ValueError("can't optimize a non-leaf Tensor")


def _check_unique(params: list, groups: list) -> None:
    ids = {id(p) for p in params}
    if len(ids) != len(params):
        # NOTE: torch only warns here; a repeated parameter would be updated twice per step.
        raise ValueError("optimizer got the same parameter more than once in one parameter group")
    if any(id(p) in ids for g in groups for p in g["params"]):
        raise ValueError("some parameters appear in more than one parameter group")


def _check_group_sizes(groups: list, saved_groups) -> None:
    if not isinstance(saved_groups, list) or len(groups) != len(saved_groups):
        n = len(saved_groups) if isinstance(saved_groups, list) else type(saved_groups).__name__
        raise ValueError(f"loaded state dict has a different number of parameter groups ({n}) than the "
                         f"optimizer ({len(groups)})")
    for i, (group, saved) in enumerate(zip(groups, saved_groups)):
        if not isinstance(saved, dict) or "params" not in saved:
            raise ValueError(f"loaded state dict's parameter group {i} is not a dict with a 'params' entry")
        if len(group["params"]) != len(saved["params"]):
            raise ValueError(f"loaded state dict contains a parameter group that doesn't match the size of "
                             f"optimizer's group (group {i}: {len(saved['params'])} saved parameters, "
                             f"{len(group['params'])} in the optimizer)")


def _copy_state(param: Tensor, index, value, key=None):
    """A deep copy of one parameter's state; float tensors take the parameter's dtype (except 'step')."""
    if isinstance(value, Tensor):
        # NOTE: torch does not check shapes here; a mismatch (a checkpoint of another model with the same
        # group sizes) would otherwise surface later as a broadcasting error or silently broadcast.
        if key != "step" and value.ndim and value.shape != param.shape:
            raise ValueError(f"loaded state for parameter {index} has '{key}' of shape {list(value.shape)}, "
                             f"but the parameter has shape {list(param.shape)}")
        same_type = key == "step" or not value.dtype.is_floating_point or value.dtype is param.dtype
        copied = Tensor._from_array(copy_array(value._data))
        if not same_type:
            copied = copied.to(param.dtype)
        if key != "step" and copied.device != param.device:
            copied = copied.to(param.device)  # state lives on its parameter's device, as torch moves it
        return copied
    if isinstance(value, dict):
        return {k: _copy_state(param, index, v, k) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_copy_state(param, index, v) for v in value)
    return copy.deepcopy(value)
