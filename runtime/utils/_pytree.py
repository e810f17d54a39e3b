"""Pytrees: nested tuples, lists, dicts and namedtuples of values, flattened to leaves and a hashable structure
(torch.utils._pytree's tree_flatten, tree_unflatten and tree_map are the same functions under torch's names)."""
from __future__ import annotations

from ..tensor import Tensor


class Spec:
    """The shape of a nested value: a leaf, or a container type with the specs of its children (and dict keys)."""

    __slots__ = ("kind", "children", "keys", "_hash")

    def __init__(self, kind, children: tuple = (), keys: tuple = ()):
        self.kind, self.children, self.keys = kind, children, keys
        self._hash = hash((kind, children, keys))

    @property
    def is_leaf(self) -> bool:
        return self.kind is None

    def __eq__(self, other) -> bool:
        return isinstance(other, Spec) and (self.kind, self.children, self.keys) == \
            (other.kind, other.children, other.keys)

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        if self.is_leaf:
            return "*"
        if self.kind is dict:
            return "{" + ", ".join(f"{k!r}: {c!r}" for k, c in zip(self.keys, self.children)) + "}"
        inner = ", ".join(map(repr, self.children))
        return f"[{inner}]" if self.kind is list else f"{getattr(self.kind, '__name__', 'tuple')}({inner})"


LEAF = Spec(None)


def _is_namedtuple(value) -> bool:
    return isinstance(value, tuple) and hasattr(type(value), "_fields")


def like(value, items):
    """`items` in a container of `value`'s kind: a list, a tuple, or the same named tuple."""
    if isinstance(value, list):
        return list(items)
    return type(value)(*items) if _is_namedtuple(value) else tuple(items)


def flatten(value) -> tuple[list, Spec]:
    """(leaves in order, spec): tuples, lists, dicts (keys in insertion order) and namedtuples are containers."""
    leaves: list = []
    return leaves, _flatten_into(value, leaves)


def _flatten_into(value, leaves: list) -> Spec:
    if isinstance(value, (tuple, list)) and not isinstance(value, Tensor):
        children = tuple(_flatten_into(v, leaves) for v in value)
        kind = type(value) if _is_namedtuple(value) else (list if isinstance(value, list) else tuple)
        return Spec(kind, children)
    if isinstance(value, dict):
        keys = tuple(value)
        return Spec(dict, tuple(_flatten_into(value[k], leaves) for k in keys), keys)
    leaves.append(value)
    return LEAF


def unflatten(leaves, spec: Spec):
    """The nested value of `spec` built from `leaves` (an iterable, consumed in order)."""
    return _build(iter(leaves), spec)


def _build(leaves, spec: Spec):
    if spec.is_leaf:
        return next(leaves)
    items = [_build(leaves, child) for child in spec.children]
    if spec.kind is dict:
        return dict(zip(spec.keys, items))
    if spec.kind is list:
        return items
    if spec.kind is tuple:
        return tuple(items)
    return spec.kind(*items)  # a namedtuple


def replace_tensors(value, tensors):
    """`value` with its tensors replaced, in flatten order, by `tensors` (other leaves kept)."""
    leaves, spec = flatten(value)
    replacements = iter(tensors)
    return unflatten([next(replacements) if isinstance(leaf, Tensor) else leaf for leaf in leaves], spec)


def tensor_leaves(value) -> list:
    """The tensors inside a nested value, in flatten order."""
    return [leaf for leaf in flatten(value)[0] if isinstance(leaf, Tensor)]


def has_tensor(value) -> bool:
    return bool(tensor_leaves(value))


def tree_map(fn, value):
    """`value` with every leaf replaced by fn(leaf)."""
    leaves, spec = flatten(value)
    return unflatten([fn(leaf) for leaf in leaves], spec)


tree_flatten, tree_unflatten, tree_leaves = flatten, unflatten, lambda value: flatten(value)[0]
