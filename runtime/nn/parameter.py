"""Parameter (a Tensor a Module registers as learnable), UninitializedParameter and UninitializedBuffer (lazy
modules) and Buffer."""
from __future__ import annotations

import numpy as np

from ..tensor import Tensor, copy_array


class Parameter(Tensor):
    """A tensor that a Module registers in `parameters()`; it shares memory with `data`."""

    def __new__(cls, data=None, requires_grad=True):
        if data is None:
            data = Tensor._from_array(np.zeros((0,), dtype=np.float32))
        t = Tensor._from_array(data._data, cls)
        if requires_grad:
            t.requires_grad_(True)
        return t

    def __init__(self, data=None, requires_grad=True):
        pass

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        result = type(self)(Tensor._from_array(copy_array(self._data)), self.requires_grad)
        memo[id(self)] = result
        if self._grad is not None:
            result._grad = Tensor._from_array(copy_array(self._grad._data))
        return result

    def __reduce_ex__(self, protocol):
        return (_rebuild_parameter, (type(self), self._data, self.requires_grad))


def _rebuild_parameter(cls, data, requires_grad):
    return cls(Tensor._from_array(data), requires_grad)


def _materialize(tensor: Tensor, shape, dtype, becomes: type) -> None:
    """Give an uninitialized parameter or buffer its shape (zeros of `dtype`, else the default dtype) and the class it
    stood for."""
    from .. import dtypes as dt

    np_dtype = (dt.as_dtype(dtype) if dtype is not None else dt.get_default_dtype()).np
    tensor._data = np.zeros(tuple(shape), dtype=np_dtype)
    tensor.__class__ = becomes


class UninitializedParameter(Parameter):
    """A parameter whose shape is not known yet (lazy modules); materialize() gives it one."""

    def materialize(self, shape, dtype=None) -> None:
        _materialize(self, shape, dtype, Parameter)

    def __repr__(self) -> str:
        return "<UninitializedParameter>"


class UninitializedBuffer(Tensor):
    """A buffer whose shape is not known yet (a lazy batch norm's running stats); materialize() gives it one."""

    def __new__(cls):
        return Tensor._from_array(np.zeros((0,), dtype=np.float32), cls)

    def __init__(self):
        pass

    def materialize(self, shape, dtype=None) -> None:
        _materialize(self, shape, dtype, Tensor)

    def __repr__(self) -> str:
        return "<UninitializedBuffer>"


def is_lazy(param) -> bool:
    return isinstance(param, (UninitializedParameter, UninitializedBuffer))


class Buffer(Tensor):
    """Marks a tensor to be registered as a buffer when assigned to a Module attribute (torch.nn.Buffer)."""

    def __new__(cls, data=None, *, persistent=True):
        if data is None:
            data = Tensor._from_array(np.zeros((0,), dtype=np.float32))
        t = Tensor._from_array(data._data, cls)
        t.persistent = persistent
        return t

    def __init__(self, data=None, *, persistent=True):
        pass
