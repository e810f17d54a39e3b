"""torch.nn.utils.prune: masks that zero a module's tensor, kept as `<name>_orig` and `<name>_mask`.

Pruning `module.weight` moves the parameter to `module.weight_orig`, registers the mask as the buffer
`module.weight_mask`, and makes `module.weight` a plain attribute (`mask * weight_orig`) that a forward pre-hook
(the pruning method itself) recomputes before every forward. Pruning the same tensor again wraps the methods in a
`PruningContainer`, whose new mask only decides among the entries still unpruned. `remove` makes the pruned tensor
the parameter again. State_dict keys, errors and masks follow torch's; where magnitudes tie, which of the tied
entries is pruned is runtime's topk's choice, which may differ from torch's (torch leaves it unspecified too).
"""
from __future__ import annotations

import numbers
from abc import ABC, abstractmethod
from collections.abc import Iterable

from ... import api, factories
from ...autograd import grad_mode

__all__ = ["BasePruningMethod", "PruningContainer", "Identity", "RandomUnstructured", "L1Unstructured",
           "RandomStructured", "LnStructured", "CustomFromMask", "identity", "random_unstructured",
           "l1_unstructured", "random_structured", "ln_structured", "global_unstructured", "custom_from_mask",
           "remove", "is_pruned"]


class BasePruningMethod(ABC):
    """A way of computing a mask for one tensor of a module; also the forward pre-hook that applies it."""

    _tensor_name: str | None = None

    def __call__(self, module, inputs) -> None:
        setattr(module, self._tensor_name, self.apply_mask(module))

    @abstractmethod
    def compute_mask(self, t, default_mask):
        """The new mask for `t`, given the mask already in force (`default_mask`)."""

    def apply_mask(self, module):
        """The pruned tensor: the module's stored mask times its original tensor."""
        if self._tensor_name is None:
            raise AssertionError(f"Module {module} has to be pruned")
        orig = getattr(module, self._tensor_name + "_orig")
        mask = getattr(module, self._tensor_name + "_mask")
        return mask.to(dtype=orig.dtype) * orig

    @classmethod
    def apply(cls, module, name, *args, importance_scores=None, **kwargs):
        """Prune `module.<name>` with a new `cls(*args, **kwargs)`; returns the method now hooked on the module."""
        method = _composite_method(cls, module, name, *args, **kwargs)
        orig = getattr(module, name)
        if importance_scores is not None:
            _check_scores_shape(importance_scores, orig, f"parameter {name} of {module}")
        else:
            importance_scores = orig
        first_time = not isinstance(method, PruningContainer)
        if first_time:
            module.register_parameter(name + "_orig", orig)
            del module._parameters[name]
            default_mask = factories.ones_like(orig)
        else:
            default_mask = getattr(module, name + "_mask").detach().clone()
        try:
            module.register_buffer(name + "_mask", method.compute_mask(importance_scores, default_mask=default_mask))
            setattr(module, name, method.apply_mask(module))
            module.register_forward_pre_hook(method)
        except Exception:
            if first_time:
                _restore_parameter(module, name)
            raise
        return method

    def prune(self, t, default_mask=None, importance_scores=None):
        """`t` times the mask this method computes for it (from `importance_scores` where given)."""
        if importance_scores is not None:
            _check_scores_shape(importance_scores, t, "tensor t")
        else:
            importance_scores = t
        default_mask = default_mask if default_mask is not None else factories.ones_like(t)
        return t * self.compute_mask(importance_scores, default_mask=default_mask)

    def remove(self, module) -> None:
        """Make the pruned tensor `module.<name>` a parameter again and drop `<name>_orig` and `<name>_mask`."""
        if self._tensor_name is None:
            raise AssertionError(f"Module {module} has to be pruned before pruning can be removed")
        name = self._tensor_name
        weight = self.apply_mask(module)
        if name in module.__dict__:
            delattr(module, name)
        orig = module._parameters[name + "_orig"]
        orig.data = weight.data
        del module._parameters[name + "_orig"]
        del module._buffers[name + "_mask"]
        setattr(module, name, orig)


def _check_scores_shape(scores, t, what: str) -> None:
    if tuple(scores.shape) != tuple(t.shape):
        raise AssertionError(f"importance_scores should have the same shape as {what}")


def _restore_parameter(module, name: str) -> None:
    """Undo a first pruning that failed: the original parameter goes back under its name."""
    orig = getattr(module, name + "_orig")
    module.register_parameter(name, orig)
    del module._parameters[name + "_orig"]


def _composite_method(cls, module, name, *args, **kwargs):
    """The method to hook for a new pruning of `module.<name>`: a fresh one, or a container holding the earlier."""
    found = [(key, hook) for key, hook in module._forward_pre_hooks.items()
             if isinstance(hook, BasePruningMethod) and hook._tensor_name == name]
    if len(found) > 1:
        raise AssertionError(f"Avoid adding multiple pruning hooks to the same tensor {name} of module {module}. "
                             f"Use a PruningContainer.")
    for key, _ in found:
        del module._forward_pre_hooks[key]
        module._forward_pre_hooks_with_kwargs.pop(key, None)
    method = cls(*args, **kwargs)
    method._tensor_name = name
    if not found:
        return method
    old = found[0][1]
    if not isinstance(old, PruningContainer):
        old = PruningContainer(old)
    old.add_pruning_method(method)
    return old


class PruningContainer(BasePruningMethod):
    """A sequence of pruning methods on one tensor: each new mask applies only to the entries still unpruned."""

    def __init__(self, *args) -> None:
        self._pruning_methods: tuple = ()
        methods = list(args[0]) if len(args) == 1 and isinstance(args[0], Iterable) else list(args)
        if methods:
            # NOTE: torch names the container after a lone method only (given several, it fails); here the first
            # method names it in every case.
            self._tensor_name = getattr(methods[0], "_tensor_name", None)
        for method in methods:
            self.add_pruning_method(method)

    def add_pruning_method(self, method) -> None:
        """Append `method`, which must prune the same tensor as the methods already held."""
        if not isinstance(method, BasePruningMethod) and method is not None:
            raise TypeError(f"{type(method)} is not a BasePruningMethod subclass")
        if method is not None and self._tensor_name != method._tensor_name:
            raise ValueError(f"Can only add pruning methods acting on the parameter named '{self._tensor_name}' "
                             f"to PruningContainer. Found '{method._tensor_name}'")
        self._pruning_methods += (method,)

    def __len__(self) -> int:
        return len(self._pruning_methods)

    def __iter__(self):
        return iter(self._pruning_methods)

    def __getitem__(self, idx):
        return self._pruning_methods[idx]

    def compute_mask(self, t, default_mask):
        """The current mask with the newest method's mask computed on, and written into, its unpruned part."""
        method = self._pruning_methods[-1]
        index = _unpruned_part(method, t, default_mask)
        new_mask = default_mask.clone().to(dtype=t.dtype)
        partial = method.compute_mask(t[index], default_mask=default_mask[index])
        new_mask[index] = partial.to(dtype=new_mask.dtype)
        return new_mask


def _unpruned_part(method, t, mask):
    """The index of what `method` may still prune: unpruned entries, unpruned channels, or everything."""
    kind = method.PRUNING_TYPE
    if kind == "unstructured":
        return mask == 1
    if kind == "structured":
        if not hasattr(method, "dim"):
            raise AttributeError("Pruning methods of PRUNING_TYPE 'structured' need to have the attribute `dim` "
                                 "defined.")
        ndim = t.dim()
        dim = method.dim + ndim if method.dim < 0 else method.dim
        if dim < 0:
            raise IndexError(f"Index is out of bounds for tensor of size {ndim}.")
        others = [d for d in range(ndim) if d != dim]
        index = [slice(None)] * ndim
        index[dim] = mask.sum(dim=others) != 0
        return tuple(index)
    if kind == "global":
        return (slice(None),) * len(t.shape)
    raise ValueError(f"Unrecognized PRUNING_TYPE {kind}")


class Identity(BasePruningMethod):
    """Prunes nothing: the mask is all ones (a way to get the `_orig`/`_mask` layout without pruning)."""

    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t, default_mask):
        return default_mask

    @classmethod
    def apply(cls, module, name):
        return super().apply(module, name)


class _ByEntryScore(BasePruningMethod):
    """Unstructured pruning of `amount` entries (a count, or a fraction of the tensor): the ones topk picks from a
    score per entry, the largest or the smallest."""

    PRUNING_TYPE = "unstructured"
    PRUNES_LARGEST = False

    def __init__(self, amount) -> None:
        _validate_amount_init(amount)
        self.amount = amount

    def _entry_scores(self, t):
        raise NotImplementedError

    def compute_mask(self, t, default_mask):
        count = _count_to_prune(self.amount, t.nelement())
        return _zero_smallest(self._entry_scores(t), default_mask, count, largest=self.PRUNES_LARGEST)


class RandomUnstructured(_ByEntryScore):
    """Prunes `amount` entries (a count, or a fraction of the tensor) chosen uniformly at random."""

    PRUNES_LARGEST = True

    def _entry_scores(self, t):
        return factories.rand_like(t)

    @classmethod
    def apply(cls, module, name, amount):
        return super().apply(module, name, amount=amount)


class L1Unstructured(_ByEntryScore):
    """Prunes the `amount` entries (a count, or a fraction of the tensor) of smallest magnitude."""

    def _entry_scores(self, t):
        return api.abs(t)

    @classmethod
    def apply(cls, module, name, amount, importance_scores=None):
        return super().apply(module, name, amount=amount, importance_scores=importance_scores)


def _zero_smallest(scores, default_mask, count: int, largest: bool):
    """A copy of `default_mask` with zeros at the `count` entries that topk picks from the flattened scores."""
    mask = default_mask.clone()
    if count != 0:
        with grad_mode.no_grad():
            chosen = api.topk(scores.reshape(-1), k=count, largest=largest).indices
        mask.view(-1)[chosen] = 0
    return mask


class _ByChannel(BasePruningMethod):
    """Structured pruning of `amount` whole channels along `dim` (a count, or a fraction of them)."""

    PRUNING_TYPE = "structured"

    def _kept_channels(self, t, channels: int, count: int):
        """The channels to keep, as a bool mask or indices, when `count` of them are pruned."""
        raise NotImplementedError

    def compute_mask(self, t, default_mask):
        _validate_structured(t)
        channels = t.shape[self.dim]
        count = _count_to_prune(self.amount, channels)
        if count == 0:
            return default_mask
        return _channel_mask(t, self.dim, self._kept_channels(t, channels, count)) * default_mask.to(dtype=t.dtype)


class RandomStructured(_ByChannel):
    """Prunes `amount` whole channels along `dim` (a count, or a fraction of them) chosen at random."""

    def __init__(self, amount, dim=-1) -> None:
        _validate_amount_init(amount)
        self.amount = amount
        self.dim = dim

    def _kept_channels(self, t, channels, count):
        scores = factories.rand(channels)
        return scores > api.kthvalue(scores, k=count).values

    @classmethod
    def apply(cls, module, name, amount, dim=-1):
        return super().apply(module, name, amount=amount, dim=dim)


class LnStructured(_ByChannel):
    """Prunes the `amount` channels along `dim` with the smallest L`n` norm (a count, or a fraction of them)."""

    def __init__(self, amount, n, dim=-1) -> None:
        _validate_amount_init(amount)
        self.amount = amount
        self.n = n
        self.dim = dim

    def _kept_channels(self, t, channels, count):
        with grad_mode.no_grad():
            norms = _channel_norms(t, self.n, self.dim)
            return api.topk(norms, k=channels - count, largest=True).indices

    @classmethod
    def apply(cls, module, name, amount, n, dim, importance_scores=None):
        return super().apply(module, name, amount=amount, n=n, dim=dim, importance_scores=importance_scores)


def _channel_norms(t, n, dim: int):
    """The `n`-norm of each slice of `t` along `dim` (over all the other dims)."""
    dim = dim + t.dim() if dim < 0 else dim
    return api.norm(t, p=n, dim=[d for d in range(t.dim()) if d != dim])


def _channel_mask(t, dim: int, channels):
    """Ones on the chosen channels along `dim` (a bool mask or indices), zeros elsewhere."""
    mask = factories.zeros_like(t)
    index = [slice(None)] * t.dim()
    index[dim] = channels
    mask[tuple(index)] = 1
    return mask


class CustomFromMask(BasePruningMethod):
    """Prunes with a given mask (combined with any mask already in force)."""

    PRUNING_TYPE = "global"

    def __init__(self, mask) -> None:
        self.mask = mask

    def compute_mask(self, t, default_mask):
        if tuple(default_mask.shape) != tuple(self.mask.shape):
            raise AssertionError("the mask must have the shape of the tensor it prunes")
        return default_mask * self.mask.to(dtype=default_mask.dtype)

    @classmethod
    def apply(cls, module, name, mask):
        return super().apply(module, name, mask=mask)


def _validate_amount_init(amount) -> None:
    """torch's check of `amount` when a method is made: a non-negative int, or a float in [0, 1]."""
    if not isinstance(amount, numbers.Real):
        raise TypeError(f"Invalid type for amount: {amount}. Must be int or float.")
    integral = isinstance(amount, numbers.Integral)
    if (integral and amount < 0) or (not integral and not 0.0 <= float(amount) <= 1.0):
        raise ValueError(f"amount={amount} should either be a float in the range [0, 1] or a non-negative integer")


def _count_to_prune(amount, tensor_size: int) -> int:
    """How many entries `amount` means: itself when an int (torch's check: at most the tensor's size), else that
    fraction of the tensor, rounded."""
    if not isinstance(amount, numbers.Integral):
        return round(amount * tensor_size)
    if amount > tensor_size:
        raise ValueError(f"amount={amount} should be smaller than the number of parameters to prune={tensor_size}")
    return amount


def _validate_structured(t) -> None:
    if t.dim() <= 1:
        raise ValueError(f"Structured pruning can only be applied to multidimensional tensors. Found tensor of "
                         f"shape {tuple(t.shape)} with {t.dim()} dims")


def identity(module, name):
    """Prune nothing, but give `module.<name>` the pruned layout (`_orig`, an all-ones `_mask`, the hook)."""
    Identity.apply(module, name)
    return module


def random_unstructured(module, name, amount):
    """Zero `amount` randomly chosen entries of `module.<name>`."""
    RandomUnstructured.apply(module, name, amount)
    return module


def l1_unstructured(module, name, amount, importance_scores=None):
    """Zero the `amount` entries of `module.<name>` with the smallest magnitude (of `importance_scores` if given)."""
    L1Unstructured.apply(module, name, amount=amount, importance_scores=importance_scores)
    return module


def random_structured(module, name, amount, dim):
    """Zero `amount` randomly chosen channels of `module.<name>` along `dim`."""
    RandomStructured.apply(module, name, amount, dim)
    return module


def ln_structured(module, name, amount, n, dim, importance_scores=None):
    """Zero the `amount` channels of `module.<name>` along `dim` with the smallest L`n` norm."""
    LnStructured.apply(module, name, amount, n, dim, importance_scores=importance_scores)
    return module


def custom_from_mask(module, name, mask):
    """Prune `module.<name>` with the given mask."""
    CustomFromMask.apply(module, name, mask)
    return module


def global_unstructured(parameters, pruning_method, importance_scores=None, **kwargs) -> None:
    """Prune several `(module, name)` tensors as one: `pruning_method(**kwargs)` ranks all their entries together."""
    if not isinstance(parameters, Iterable):
        raise TypeError("global_unstructured(): parameters is not an Iterable")
    importance_scores = importance_scores if importance_scores is not None else {}
    if not isinstance(importance_scores, dict):
        raise TypeError("global_unstructured(): importance_scores must be of type dict")
    parameters = list(parameters)
    scores = _flat([importance_scores.get((m, name), getattr(m, name)) for m, name in parameters])
    current = _flat([_mask_or_ones(m, name) for m, name in parameters])
    method = pruning_method(**kwargs)
    method._tensor_name = "temp"
    if method.PRUNING_TYPE != "unstructured":
        raise TypeError(f'Only "unstructured" PRUNING_TYPE supported for the `pruning_method`. Found method '
                        f'{pruning_method} of type {method.PRUNING_TYPE}')
    container = PruningContainer()
    container._tensor_name = "temp"
    container.add_pruning_method(method)
    final_mask = container.compute_mask(scores, current)
    start = 0
    for module, name in parameters:
        param = getattr(module, name)
        size = param.numel()
        custom_from_mask(module, name, mask=final_mask[start:start + size].view_as(param))
        start += size


def _mask_or_ones(module, name: str):
    """The mask in force on `module.<name>`: its `_mask` buffer, or all ones where it is not pruned yet."""
    if hasattr(module, name + "_mask"):
        return getattr(module, name + "_mask")
    return factories.ones_like(getattr(module, name))


def _flat(tensors):
    """The tensors flattened and joined into one vector."""
    return api.cat([t.reshape(-1) for t in tensors])


def remove(module, name):
    """Make the pruned `module.<name>` permanent: a parameter again, with no hook, `_orig` or `_mask`."""
    for key, hook in module._forward_pre_hooks.items():
        if isinstance(hook, BasePruningMethod) and hook._tensor_name == name:
            hook.remove(module)
            del module._forward_pre_hooks[key]
            module._forward_pre_hooks_with_kwargs.pop(key, None)
            return module
    raise ValueError(f"Parameter '{name}' of module {module} has to be pruned before pruning can be removed")


def is_pruned(module) -> bool:
    """Whether any module in `module`'s tree has a pruning hook."""
    return any(isinstance(hook, BasePruningMethod)
               for sub in module.modules() for hook in sub._forward_pre_hooks.values())
