"""torch's legacy names still found in training scripts: the typed tensor classes (FloatTensor, ...) and Variable."""
from __future__ import annotations

import warnings

import numpy as np

from . import dtypes as dt
from . import factories
from .tensor import Size, Tensor


class TensorType(type):
    """The class of FloatTensor and its kin: calling one makes a CPU tensor of its dtype (torch.FloatTensor(2, 3) is
    uninitialized, torch.FloatTensor([1, 2]) holds the data), and isinstance checks a tensor's dtype and device."""

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, Tensor) and obj.dtype is cls.dtype and not obj.is_cuda

    def __call__(cls, *args, device=None):
        if device is not None and str(device) != "cpu":
            raise RuntimeError(f"legacy constructor expects device type: cpu but device type: {device} was passed")
        return _construct(cls, args)

    def __repr__(cls) -> str:
        return f"<class 'torch.{cls.__name__}'>"


def _construct(cls, args: tuple) -> Tensor:
    dtype = cls.dtype
    if not args:
        return factories.empty((0,), dtype=dtype)
    if len(args) == 1:
        (arg,) = args
        if isinstance(arg, Tensor):
            return _alias_of(cls, arg)
        if isinstance(arg, Size):
            return factories.empty(tuple(arg), dtype=dtype)
        if isinstance(arg, (list, tuple, np.ndarray)):
            return factories.tensor(np.asarray(arg) if isinstance(arg, np.ndarray) else arg, dtype=dtype)
    if all(isinstance(a, (int, np.integer)) and not isinstance(a, bool) for a in args):
        return factories.empty(tuple(int(a) for a in args), dtype=dtype)
    raise TypeError(f"new(): data must be a sequence (got {type(args[0]).__name__})")


def _alias_of(cls, tensor: Tensor) -> Tensor:
    """torch.FloatTensor(t) for a float32 t: a tensor sharing t's memory; another dtype is refused."""
    if tensor.dtype is not cls.dtype or tensor.is_cuda:
        raise TypeError(f"expected a CPU tensor of dtype {cls.dtype.name} for torch.{cls.__name__}, got a "
                        f"{'CUDA' if tensor.is_cuda else 'CPU'} tensor of dtype {tensor.dtype.name}")
    return tensor.detach()


def _tensor_type(name: str, dtype) -> TensorType:
    return TensorType(name, (), {"dtype": dtype, "__module__": "torch", "__doc__": f"torch.{name}: {dtype.name}."})


FloatTensor = _tensor_type("FloatTensor", dt.float32)
DoubleTensor = _tensor_type("DoubleTensor", dt.float64)
HalfTensor = _tensor_type("HalfTensor", dt.float16)
BFloat16Tensor = _tensor_type("BFloat16Tensor", dt.bfloat16)
LongTensor = _tensor_type("LongTensor", dt.int64)
IntTensor = _tensor_type("IntTensor", dt.int32)
ShortTensor = _tensor_type("ShortTensor", dt.int16)
CharTensor = _tensor_type("CharTensor", dt.int8)
ByteTensor = _tensor_type("ByteTensor", dt.uint8)
BoolTensor = _tensor_type("BoolTensor", dt.bool_)


class _VariableMeta(type):
    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, Tensor)


class Variable(metaclass=_VariableMeta):
    """torch.autograd.Variable: since torch 0.4 every tensor is one. Variable(t, requires_grad) is a new leaf sharing
    t's memory; `volatile` has no effect (use no_grad), as in torch."""

    def __new__(cls, data, requires_grad: bool = False, volatile: bool = False):
        if not isinstance(data, Tensor):
            raise TypeError(f"Variable data has to be a tensor, but got {type(data).__name__}")
        if volatile:
            warnings.warn("volatile was removed and now has no effect. Use `with torch.no_grad():` instead.",
                          UserWarning, stacklevel=2)
        return data.detach().requires_grad_(requires_grad)
