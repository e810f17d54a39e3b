"""Tensor: a numpy array with dtype, device and autograd state, and the eager dispatch of the op table."""
from __future__ import annotations

import copy as _copy
import weakref
from time import perf_counter as _perf_counter
from typing import NamedTuple

import numpy as np

from . import amp, api
from . import dtypes as dt
from . import memory_formats as mf
from . import ops
from ._fp_quiet import IGNORE as _FP_IGNORE
from ._fp_quiet import reset_state as _fp_reset
from ._fp_quiet import set_state as _fp_set
from ._profiling import notify as _notify_observers
from ._profiling import op_observers as _op_observers
from ._tensor_str import format_tensor
from .autograd import grad_mode
from .autograd.graph import CopySlices, Node, OpNode, _retains_grad, accumulator_for, edge_of
from .device import CPU, check_device, device_of
from .ops import OPS
from .utils import state_version

_SCALARS = (int, float, bool, complex)
_COMPLEX = dt.COMPLEX
_NP_TO_DTYPE = dt.NP_TO_DTYPE
_BFLOAT16, _BFLOAT16_NP = dt.bfloat16, dt.bfloat16.np
_grad_state = grad_mode.state
_amp_state = amp.state


class Size(tuple):
    """A tensor's shape: a tuple that prints as runtime.Size([2, 3])."""

    def __repr__(self) -> str:
        return f"runtime.Size({list(self)})"

    def numel(self) -> int:
        n = 1
        for s in self:
            n *= s
        return n

    # NOTE: as torch.Size, concatenating, repeating and slicing give a Size (a tuple on either side of + too)
    def __add__(self, other):
        return Size(tuple(self) + tuple(other)) if isinstance(other, tuple) else NotImplemented

    def __radd__(self, other):
        return Size(tuple(other) + tuple(self)) if isinstance(other, tuple) else NotImplemented

    def __mul__(self, count):
        return Size(tuple(self) * count)

    __rmul__ = __mul__

    def __getitem__(self, key, _item=tuple.__getitem__):
        if key.__class__ is slice:
            return Size(_item(self, key))
        return _item(self, key)


class Tensor:
    """An n-dimensional array with reverse-mode autograd; the API follows torch.Tensor."""

    # NOTE: class-level defaults instead of __slots__: a new tensor sets only what differs,
    # which keeps the per-op cost of creating results low.
    _rg = False
    _grad_fn = None
    _out_nr = 0
    _grad = None
    _base = None  # a view's base: the tensor whose memory it shares, never itself a view
    _view_fn = None  # a view's steps from its base, ((op, extra inputs, attrs), ...), to replay it after an in-place op
    _view_version = 0  # the memory's version when the view's grad_fn was recorded
    _no_grad_view = False  # made while grad mode was off (or from such a view): torch forbids rebasing it
    _version_counter = None
    _backward_hooks = None
    _post_accumulate_hooks = None  # a leaf's hooks run after its .grad is accumulated
    _acc_ref = None
    __array_ufunc__ = None  # numpy defers to our reflected operators (np.float32(2) * t)
    __hash__ = object.__hash__

    def __init__(self, *args):
        """torch.Tensor(data) makes a float tensor from data; torch.Tensor(2, 3) an uninitialised one."""
        if len(args) == 1 and not isinstance(args[0], int):
            from .factories import tensor

            self._data = tensor(args[0], dtype=dt.get_default_dtype())._data
        else:
            self._data = np.zeros(api.size_args(args), dtype=dt.get_default_dtype().np)

    @staticmethod
    def _from_array(array: np.ndarray, cls=None) -> "Tensor":
        t = object.__new__(cls or Tensor)
        t._data = array
        return t

    # ------------------------------------------------------------------------------------------
    # eager dispatch
    # ------------------------------------------------------------------------------------------

    @staticmethod
    def _apply_op(op, inputs, attrs):
        """Run one primitive: promote dtypes, call the numpy forward, record the autograd node."""
        start = _perf_counter() if _op_observers else None  # a profiler is on (runtime._profiling)
        if _amp_state.dtype is not None and op.kind == ops.Kind.MATMUL:  # inside runtime.autocast
            inputs = amp.autocast_inputs(op, inputs)
        arrays, requires, on_device = [], False, False
        for x in inputs:
            if isinstance(x, Tensor):
                data = x._data
                arrays.append(data)
                if type(data) is not np.ndarray and not isinstance(data, np.ndarray):
                    on_device = True  # a CUDA tensor (runtime/cuda): the op runs as a kernel on the device
                if x._base is not None:  # a view requires grad where its base does (torch's rule)
                    if _grad_state.enabled:
                        x._refresh_view()
                    requires = requires or x._base._rg
                requires = requires or x._rg
            elif type(x) in _SCALARS or x is None:
                arrays.append(x)
            else:
                handler = getattr(type(x), "_apply_op", None)
                if handler is not None:  # a foreign tensor-like (a graph proxy) takes over
                    return handler(op, inputs, attrs)
                plain = tuple(v if isinstance(v, Tensor) else _scalar_operand(op, v, inputs) for v in inputs)
                return Tensor._apply_op(op, plain, attrs)
        compute, out_dtype = op.dtype_rule(op, inputs, attrs)
        if out_dtype.category == _COMPLEX or compute is not None and compute.category == _COMPLEX:
            ops.check_complex(op)
        if on_device:
            from .cuda import dispatch

            out, is_view = dispatch.run(op, inputs, arrays, attrs, compute, out_dtype)
            if isinstance(out, Tensor):  # a fused op that ran as its decomposition, with autograd of its own
                return out
        else:
            if compute is not None:
                _cast_to_compute(arrays, compute.np, op.cast_inputs)
            if (out_dtype is _BFLOAT16 or compute is _BFLOAT16) and not op.is_view:
                _widen_bfloat16(op, arrays)
            fp_state = _fp_set(_FP_IGNORE)  # torch gives inf and nan without numpy's RuntimeWarnings
            try:
                out = op.forward(*arrays, **attrs)
                if type(out) is not np.ndarray:
                    out = np.asarray(out)
                if out.dtype != out_dtype.np:
                    out = out.astype(out_dtype.np)
            except Exception as e:  # numpy's message alone would not name the op or the shapes
                raise _op_error(op, inputs, attrs, e) from None
            finally:
                _fp_reset(fp_state)
            # NOTE: numpy says an empty array shares no memory; torch's empty slice is a view all the same
            is_view = op.is_view and (np.may_share_memory(out, arrays[0]) or (out.size == 0 and len(inputs) == 1))
        result = object.__new__(Tensor)
        result._data = out
        if is_view:
            src = inputs[0]
            vc = result._version_counter = src._vc()
            if op.differentiable:  # detach shares the memory but starts a history of its own: not a view
                step = ((op, inputs[1:], attrs),)
                if src._base is None:
                    result._base, result._view_fn = src, step
                else:
                    result._base, result._view_fn = src._base, src._view_fn + step
                    result._no_grad_view = src._no_grad_view
                result._view_version = vc[0]
                if not _grad_state.enabled:
                    result._no_grad_view = True
        if requires and _grad_state.enabled and out_dtype.is_differentiable and op.differentiable:
            result._grad_fn = OpNode(op, inputs, attrs, out, result._vc(), [_edge(x) for x in inputs])
            result._rg = True
        if start is not None:
            _notify_observers(op, arrays, out, start, _perf_counter(), False)
        return result

    @staticmethod
    def _apply_device_op(op, attrs):
        """An op with no inputs (full) whose result goes to the CUDA device."""
        from .cuda import dispatch

        compute, out_dtype = op.dtype_rule(op, (), attrs)
        return Tensor._from_array(dispatch.run(op, (), [], attrs, compute, out_dtype)[0])

    # ------------------------------------------------------------------------------------------
    # attributes
    # ------------------------------------------------------------------------------------------

    @property
    def dtype(self) -> dt.dtype:
        found = _NP_TO_DTYPE.get(self._data.dtype)
        return found if found is not None else dt.from_numpy_dtype(self._data.dtype)

    @property
    def shape(self) -> Size:
        return Size(self._data.shape)

    @property
    def ndim(self) -> int:
        return self._data.ndim

    @property
    def device(self):
        return device_of(self._data)

    @property
    def is_cuda(self) -> bool:
        return not isinstance(self._data, np.ndarray)

    is_sparse = False
    is_quantized = False
    is_meta = False

    @property
    def requires_grad(self) -> bool:
        self._refresh_view()
        return self._rg or (self._base is not None and self._base._rg)

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        self.requires_grad_(value)

    @property
    def grad(self):
        return self._grad

    @grad.setter
    def grad(self, value) -> None:
        if value is not None:
            if not isinstance(value, Tensor):
                raise TypeError(f"assigned grad expected to be a Tensor or None but got grad of type "
                                f"{type(value).__name__}")
            if value.shape != self.shape:
                raise RuntimeError(f"assigned grad has data of a different size: {list(value.shape)} "
                                   f"vs {list(self.shape)}")
            if value.dtype is not self.dtype:
                raise RuntimeError(f"assigned grad has data of a different type: {value.dtype} vs {self.dtype}")
            if value.is_cuda != self.is_cuda:
                raise RuntimeError("assigned grad has data located on a different device")
        self._grad = value

    @grad.deleter
    def grad(self) -> None:
        self._grad = None

    @property
    def grad_fn(self):
        self._refresh_view()
        return self._grad_fn

    @property
    def is_leaf(self) -> bool:
        self._refresh_view()
        return self._grad_fn is None

    @property
    def output_nr(self) -> int:
        return self._out_nr

    @property
    def data(self) -> "Tensor":
        return Tensor._from_array(self._data)

    @data.setter
    def data(self, value: "Tensor") -> None:
        self._data = value._data
        state_version.bump()  # a parameter's storage may have moved (nnc.compile's guards)

    @property
    def _version(self) -> int:
        return self._vc()[0]

    def _vc(self) -> list:
        """The version counter, shared by views of the same memory (created on first use)."""
        vc = self._version_counter
        if vc is None:
            vc = self._version_counter = [0]
        return vc

    def _bump_version(self) -> None:
        self._vc()[0] += 1

    @property
    def T(self) -> "Tensor":
        return self.permute(tuple(range(self.ndim - 1, -1, -1)))

    @property
    def mT(self) -> "Tensor":
        return self.transpose(-2, -1)

    @property
    def real(self) -> "Tensor":
        return api.real(self)

    @real.setter
    def real(self, value) -> None:
        self.real.copy_(value)

    @property
    def imag(self) -> "Tensor":
        return api.imag(self)

    @imag.setter
    def imag(self, value) -> None:
        self.imag.copy_(value)

    @property
    def mH(self) -> "Tensor":
        return api.conj(self.mT)

    @property
    def H(self) -> "Tensor":
        return api.conj(self.T)

    def size(self, dim=None):
        return self.shape if dim is None else self._data.shape[api.wrap_dim(dim, self.ndim)]

    def dim(self) -> int:
        return self._data.ndim

    ndimension = dim

    def numel(self) -> int:
        return self._data.size

    nelement = numel

    def element_size(self) -> int:
        return self._data.dtype.itemsize

    def stride(self, dim=None):
        strides = tuple(s // self._data.dtype.itemsize for s in self._data.strides)
        return strides if dim is None else strides[api.wrap_dim(dim, self.ndim)]

    def is_contiguous(self, memory_format=None) -> bool:
        fmt = mf.checked(memory_format, "is_contiguous")
        if fmt.rank is not None:
            return mf.is_channels_last(fmt, tuple(self.shape), self.stride())
        if self.is_cuda:
            from .cuda import memory

            return memory.is_c_contiguous(self._data)
        return self._data.flags.c_contiguous

    def is_floating_point(self) -> bool:
        return self.dtype.is_floating_point

    def get_device(self) -> int:
        return 0 if self.is_cuda else -1

    def _host(self) -> np.ndarray:
        """The values as a numpy array: the storage itself on the CPU, a copy from the device for CUDA (what
        item(), tolist() and printing read; numpy() refuses CUDA tensors, as torch's does)."""
        data = self._data
        if isinstance(data, np.ndarray):
            return data
        from .cuda import memory

        return memory.to_host(data)

    # ------------------------------------------------------------------------------------------
    # conversions
    # ------------------------------------------------------------------------------------------

    def item(self):
        if self._data.size != 1:
            raise RuntimeError(f"a Tensor with {self._data.size} elements cannot be converted to Scalar")
        return self._host().reshape(()).item()

    def tolist(self):
        return self._host().tolist()

    def numpy(self, *, force: bool = False) -> np.ndarray:
        if self.is_cuda and not force:
            raise TypeError(_CUDA_NUMPY_ERROR)
        if self.requires_grad and not force:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead.")
        return self._host()

    def __array__(self, dtype=None, copy=None):
        if self.is_cuda:
            raise TypeError(_CUDA_NUMPY_ERROR)
        return self._data if dtype is None else self._data.astype(dtype)

    def __bool__(self) -> bool:
        if self._data.size != 1:
            raise RuntimeError("Boolean value of Tensor with more than one value is ambiguous")
        return bool(self._host().reshape(()))

    def __float__(self) -> float:
        return float(self._scalar())

    def __int__(self) -> int:
        return int(self._scalar())

    def _scalar(self):
        if self._data.size != 1:
            raise ValueError("only one element tensors can be converted to Python scalars")
        return self._host().reshape(()).item()

    def __index__(self) -> int:
        if self.dtype.is_floating_point or self._data.size != 1:
            raise TypeError("only integer tensors of a single element can be converted to an index")
        return int(self.item())

    def __len__(self) -> int:
        if self._data.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self._data.shape[0]

    def __iter__(self):
        if self._data.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return iter(self.unbind(0))

    def __repr__(self) -> str:
        self._refresh_view()
        d = self.dtype
        suffixes = []
        if self._grad_fn is not None:
            suffixes.append(f"grad_fn=<{self._grad_fn.name()}>")
        elif self._rg:
            suffixes.append("requires_grad=True")
        is_default = d is dt.get_default_dtype() or d is dt.int64 or d is dt.bool_
        device = [f"device='{self.device}'"] if self.is_cuda else []
        return format_tensor(self._host(), repr(d), is_default, suffixes, device)

    def __format__(self, spec: str) -> str:
        if self._data.ndim == 0:
            return format(self.item(), spec)
        return repr(self)

    def __reduce_ex__(self, protocol):
        if self._grad_fn is not None:
            raise RuntimeError("Only Tensors created explicitly by the user (graph leaves) support pickling")
        return (_rebuild_tensor, (type(self), self._data, self._rg))

    def __deepcopy__(self, memo):
        if self._grad_fn is not None:
            raise RuntimeError("Only Tensors created explicitly by the user (graph leaves) support the "
                               "deepcopy protocol at the moment.")
        if id(self) in memo:
            return memo[id(self)]
        new = _rebuild_tensor(type(self), copy_array(self._data), self._rg)
        memo[id(self)] = new
        extra = {k: v for k, v in self.__dict__.items() if k not in _INTERNAL_ATTRS}
        new.__dict__.update(_copy.deepcopy(extra, memo))
        if self._grad is not None:
            new._grad = _copy.deepcopy(self._grad, memo)
        return new

    def to(self, *args, **kwargs) -> "Tensor":
        device, dtype, copy, fmt = _parse_to(args, kwargs)
        t = self
        if device is not None and device != self.device:
            t, copy = _to_device(t, device), False
        if dtype is not None:
            t = api.to_dtype(t, dtype, copy)
        elif copy:
            t = t.clone()
        # NOTE: as torch, an explicit format converts unless the strides already suggest it (not: unless they fit
        # it, which a 1-channel C-contiguous image does); preserve_format keeps the layout the steps above give
        if fmt is mf.preserve_format or (t is self and mf.suggest(tuple(t.shape), t.stride()) is fmt):
            return t
        return t if t is not self and t.is_contiguous(memory_format=fmt) else api.clone(t, memory_format=fmt)

    def type(self, dtype=None, non_blocking=False):
        """torch's legacy type names: x.type() is 'torch.FloatTensor'; x.type('torch.DoubleTensor') converts."""
        if dtype is None:
            return f"torch.{_TYPE_NAMES[self.dtype.name]}"
        if isinstance(dtype, type) and isinstance(getattr(dtype, "dtype", None), dt.dtype):  # torch.LongTensor
            dtype = dtype.dtype
        if isinstance(dtype, str):
            by_name = {f"torch.{v}": k for k, v in _TYPE_NAMES.items()}
            if dtype not in by_name:
                raise ValueError(f"invalid type: '{dtype}'")
            dtype = getattr(dt, by_name[dtype] if by_name[dtype] != "bool" else "bool_")
        return self.to(dtype)

    def cpu(self, memory_format=None) -> "Tensor":
        return self.to(CPU, memory_format=memory_format)

    @property
    def layout(self):
        """runtime.strided: a dense tensor's layout (runtime.sparse's tensors have runtime.sparse_coo)."""
        from .sparse import strided

        return strided

    def to_sparse(self, sparse_dim: int | None = None):
        """The nonzero entries as a sparse COO tensor (runtime.sparse)."""
        from .sparse import to_sparse

        return to_sparse(self, sparse_dim)

    def to_dense(self, dtype=None, *, masked_grad=None) -> "Tensor":
        """A dense tensor is its own dense form (torch returns it as is), in `dtype` when one is given."""
        return self if dtype is None else self.to(dtype)

    def share_memory_(self) -> "Tensor":
        """Move the values into shared memory, as torch does for Hogwild training: processes forked later share
        them, and spawned ones given this tensor (multiprocessing's pickler: runtime.multiprocessing) attach to the
        same memory, so in-place updates anywhere are seen everywhere. A no-op when already shared, and for CUDA
        tensors (as torch's). A view's values belong to the tensor it views: share that one first."""
        if self.is_cuda or self.is_shared():
            return self
        if self._base is not None:
            raise RuntimeError("share_memory_(): this tensor is a view; call share_memory_() on the tensor it "
                               "views (its ._base) before making views of it")
        from . import _shared_memory

        self._data = _shared_memory.share(self._data)
        return self

    def is_shared(self) -> bool:
        """Whether the values are in shared memory (share_memory_, or received from another process so)."""
        from . import _shared_memory

        return not self.is_cuda and _shared_memory.find(self._data) is not None

    def cuda(self, device=None, non_blocking=False, memory_format=None) -> "Tensor":
        return self.to(check_device(device if device is not None else "cuda"), memory_format=memory_format)

    def detach(self) -> "Tensor":
        out = Tensor._from_array(self._data)
        out._version_counter = self._vc()
        return out

    def resize_(self, *sizes, memory_format=None) -> "Tensor":
        """A new shape in place: the elements that fit keep their values in flat order, any new ones are
        uninitialized (torch's resize_, which older scripts use to shape preallocated buffers)."""
        shape = tuple(api.size_args(sizes))
        if self.requires_grad:
            raise RuntimeError("cannot resize variables that require grad")
        if self.is_cuda or (self._base is not None and self._base.requires_grad):
            raise RuntimeError("resize_ is supported on CPU tensors that are not views of a tensor requiring grad")
        count, flat = int(np.prod(shape, dtype=np.int64)), self._data.reshape(-1)
        if count <= flat.size and self._data.flags.c_contiguous:
            self._data = flat[:count].reshape(shape)  # the same memory: a view's base still sees its writes
        else:
            data = np.empty(shape, dtype=self._data.dtype)
            kept = min(count, flat.size)
            data.reshape(-1)[:kept] = flat[:kept]
            self._data = data
            if self._base is not None:  # new memory: no longer a view of its base
                self._base, self._view_fn, self._version_counter = None, None, [self._version_counter[0]]
        self._bump_version()
        return self

    def resize_as_(self, other, memory_format=None) -> "Tensor":
        return self.resize_(tuple(other.shape))

    def detach_(self) -> "Tensor":
        if self._base is not None:
            raise RuntimeError("Can't detach views in-place. Use detach() instead.")
        self._grad_fn, self._rg, self._out_nr = None, False, 0
        return self

    def contiguous(self, memory_format=None) -> "Tensor":
        """self where it is laid out as asked already, else a copy that is (channels_last: real NHWC strides)."""
        fmt = mf.checked(memory_format, "contiguous", mf.contiguous_format)
        if self.is_contiguous(memory_format=fmt):
            return self
        if fmt is mf.preserve_format:
            raise RuntimeError("preserve memory format is unsupported by the contiguous operator")
        return api.clone(self, memory_format=fmt)

    def view(self, *shape, dtype=None) -> "Tensor":
        if dtype is not None or (shape and isinstance(shape[0], dt.dtype)):
            return self._view_dtype(dt.as_dtype(dtype if dtype is not None else shape[0]))
        target = api._resolve_shape(api.size_args(shape), self._data.size)
        try:
            np.reshape(_layout(self._data), target, copy=False)
        except ValueError:
            raise RuntimeError("view size is not compatible with input tensor's size and stride (at least one "
                               "dimension spans across two contiguous subspaces). Use .reshape(...) instead.") from None
        return api.reshape(self, target)

    def _view_dtype(self, dtype) -> "Tensor":
        """The same memory read as another dtype (torch's view(dtype)): not differentiable, as in torch."""
        if dtype is self.dtype:
            return api._alias(self)
        names = {name: legacy.removesuffix("Tensor") for name, legacy in _TYPE_NAMES.items()}
        what = f"to view {names[self.dtype.name]} as {names[dtype.name]} (different element sizes)"
        if self._rg or (self._base is not None and self._base._rg):
            raise RuntimeError("Viewing a tensor as a new dtype with a different number of bytes per element is not "
                               "supported for tensors that require grad") if dtype.itemsize != self.dtype.itemsize \
                else RuntimeError("view(dtype) of a tensor that requires grad: runtime records no gradient through "
                                  "a reinterpretation; detach() it first")
        data = self._data
        if self.is_cuda:
            from .cuda.templates import NoLowering

            raise NoLowering(f"view(dtype) of a CUDA tensor ({self.dtype} as {dtype}) has no CUDA lowering")
        if dtype.itemsize != self.dtype.itemsize:
            if data.ndim == 0:
                raise RuntimeError(f"self.dim() cannot be 0 {what}")
            if data.shape[-1] * self.dtype.itemsize % dtype.itemsize:
                raise RuntimeError(f"self.size(-1) must be divisible by {dtype.itemsize // self.dtype.itemsize} "
                                   f"{what}, but got {data.shape[-1]}")
            if data.shape[-1] != 1 and data.strides[-1] != data.itemsize:
                raise RuntimeError(f"self.stride(-1) must be 1 {what}, but got {data.strides[-1] // data.itemsize}")
        out = Tensor._from_array(data.view(dtype.np))
        out._version_counter = self._vc()
        return out

    def _own(self, copy: bool) -> "Tensor":
        """This tensor as a non-view (api._own): a copy, or the same memory with the link to its base dropped."""
        if self._base is None:
            return self
        if copy:
            return api.clone(self)
        self._base = self._view_fn = self._version_counter = None
        return self

    def _refresh_view(self) -> None:
        """A view whose memory was modified in place since its grad_fn was recorded gets a new one, replayed from
        its base's current history (torch's view replay), so its gradient flows through what the base became."""
        base = self._base
        if base is None or self._view_version == self._version_counter[0]:
            return
        if self._grad_fn is None and not base._rg:
            return  # no history to replay (torch checks again at the next read, as here)
        if self._no_grad_view:
            raise RuntimeError("A view was created in no_grad mode and its base or another view of its base has been "
                               "modified inplace with grad mode enabled. Given that this use case is ambiguous and "
                               "error-prone, it is forbidden. You can clarify your code by moving both the view and "
                               "the inplace either both inside the no_grad block (if you don't want the inplace to be "
                               "tracked) or both outside (if you want the inplace to be tracked).")
        retained = _retains_grad(self)
        enabled, _grad_state.enabled = _grad_state.enabled, True
        try:
            view = base
            for op, extra, attrs in self._view_fn:
                view = Tensor._apply_op(op, (view,) + extra, attrs)
        finally:
            _grad_state.enabled = enabled
        self._grad_fn, self._out_nr, self._rg = view._grad_fn, 0, view._rg
        self._view_version = self._version_counter[0]
        if retained:
            self.retain_grad()

    def new_tensor(self, data, dtype=None, device=None, requires_grad=False) -> "Tensor":
        from .factories import tensor

        return tensor(data, dtype=dtype if dtype is not None else self.dtype, requires_grad=requires_grad,
                      device=device if device is not None else self.device)

    def new_empty(self, *size, dtype=None, device=None, requires_grad=False) -> "Tensor":
        return api.new_zeros(self, *size, dtype=dtype, requires_grad=requires_grad)

    # ------------------------------------------------------------------------------------------
    # autograd
    # ------------------------------------------------------------------------------------------

    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        if self._grad_fn is not None:
            if requires_grad:
                return self
            raise RuntimeError("you can only change requires_grad flags of leaf variables. If you want to use a "
                               "computed variable in a subgraph that doesn't require differentiation use "
                               "var_no_grad = var.detach().")
        if requires_grad and not self.dtype.is_differentiable:
            raise RuntimeError(f"only Tensors of floating point and complex dtype can require gradients (got "
                               f"{self.dtype})")
        self._rg = bool(requires_grad)
        return self

    def retain_grad(self) -> None:
        self._refresh_view()
        if not self._rg:
            raise RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
        node = self._grad_fn
        if node is not None:
            if node.retained is None:
                node.retained = {}
            node.retained[self._out_nr] = weakref.ref(self)

    @property
    def retains_grad(self) -> bool:
        self._refresh_view()
        return _retains_grad(self)

    def register_hook(self, hook):
        """Call hook(grad) when this tensor's gradient is computed; it may return a replacement."""
        self._refresh_view()
        if not self._rg:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        if self._grad_fn is not None:
            return self._grad_fn.add_tensor_hook(self._out_nr, hook)
        from .utils.hooks import RemovableHandle

        if self._backward_hooks is None:
            self._backward_hooks = {}
        handle = RemovableHandle(self._backward_hooks)
        self._backward_hooks[handle.id] = hook
        return handle

    def register_post_accumulate_grad_hook(self, hook):
        """Call hook(tensor) after this leaf's gradient is accumulated into .grad (an optimizer step per parameter
        during backward); the hook returns None."""
        if self._grad_fn is not None or self._base is not None:
            raise RuntimeError("post accumulate grad hooks cannot be registered on non-leaf tensors")
        if not self._rg:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        from .utils.hooks import RemovableHandle

        if self._post_accumulate_hooks is None:
            self._post_accumulate_hooks = {}
        handle = RemovableHandle(self._post_accumulate_hooks)
        self._post_accumulate_hooks[handle.id] = hook
        return handle

    @property
    def is_cpu(self) -> bool:
        return not self.is_cuda

    is_xpu = is_mps = is_xla = property(lambda self: False)

    @property
    def itemsize(self) -> int:
        return self.element_size()

    @property
    def nbytes(self) -> int:
        return self.numel() * self.element_size()

    def data_ptr(self) -> int:
        """The address of the first element (tensors sharing memory at the same offset give the same)."""
        if self.is_cuda:
            return self._data.__cuda_array_interface__["data"][0]
        return self._data.ctypes.data

    def pin_memory(self, device=None) -> "Tensor":
        return self  # no page-locked host memory here: the tensor itself, as a CPU-only torch build gives

    def is_pinned(self, device=None) -> bool:
        return False

    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None) -> None:
        from .autograd import backward

        backward(self, gradient, retain_graph=retain_graph, create_graph=create_graph, inputs=inputs)

    def _accumulator(self):
        return accumulator_for(self)

    # ------------------------------------------------------------------------------------------
    # in-place ops
    # ------------------------------------------------------------------------------------------

    def _inplace(self, name: str, *args, **attrs) -> "Tensor":
        """Compute op(self, *args) and write it into self's memory, keeping autograd history right."""
        op = OPS[name]
        inputs = (self,) + args
        _, out_dtype = op.dtype_rule(op, inputs, attrs)
        if out_dtype.category > self.dtype.category:
            raise RuntimeError(f"result type {out_dtype.name} can't be cast to the desired output type "
                               f"{self.dtype.name} (in-place {name})")
        self._check_writeable()
        for a in args:
            _check_no_partial_overlap(self._data, a)
            if isinstance(a, Tensor) and a.is_cuda != self.is_cuda and (a.is_cuda or a.ndim):
                from .cuda.dispatch import device_error

                raise device_error(["cuda:0", "cpu"])
        if _grad_state.enabled and (self.requires_grad or any(isinstance(a, Tensor) and a.requires_grad
                                                              for a in args)):
            return self._inplace_recorded(lambda old: Tensor._apply_op(op, (old,) + args, attrs), 0 in op.saves)
        # NOTE: numpy 2.4's negative computes wrong values in place on strided memory (a column: x[:, 1].neg_()),
        # so the ufunc writes in place only into contiguous memory
        contiguous = not self.is_cuda and (self._data.flags.c_contiguous or self._data.flags.f_contiguous)
        if contiguous and isinstance(op.forward, np.ufunc) and out_dtype is not _BFLOAT16 and all(
                not isinstance(a, Tensor) or a.dtype.category <= self.dtype.category for a in args):
            arrays = [a._data if isinstance(a, Tensor) else a for a in args]
            _wrap_int_scalars(arrays, out_dtype.np)
            start = _perf_counter() if _op_observers else None
            _wrap_numpy_errors(op, inputs, attrs, lambda: op.forward(self._data, *arrays, out=self._data,
                                                                       casting="unsafe"))
            if start is not None:
                _notify_observers(op, [self._data, *arrays], self._data, start, _perf_counter(), True)
        else:
            result = Tensor._apply_op(op, inputs, attrs)
            _wrap_numpy_errors(op, inputs, attrs, lambda: _write_broadcast(self._data, result._data, exact=True))
        self._bump_version()
        return self

    def _inplace_recorded(self, compute, copy_old: bool) -> "Tensor":
        """Rebase self onto the node that `compute(old_self)` records, then write the result in place. On a view,
        the base's history is rebased instead (CopySlices) and the view's replayed from it."""
        self._refresh_view()
        self._check_inplace_allowed()
        old = Tensor._from_array(copy_array(self._data) if copy_old else self._data)
        old._rg, old._grad_fn, old._out_nr = self._rg, self._grad_fn, self._out_nr
        result = compute(old)
        try:
            _write_broadcast(self._data, result._data)
        except ValueError:
            raise RuntimeError(f"in-place result of shape {list(result.shape)} does not fit a tensor of shape "
                               f"{list(self.shape)}") from None
        node, base = result._grad_fn, self._base
        if base is not None and node is not None:
            old_index = node.input_index(old)
            retained = base.retains_grad
            base._grad_fn = CopySlices(edge_of(base), self._view_fn, node, old_index)
            base._out_nr, base._rg = 0, True
            if retained:
                base.retain_grad()
        else:
            retained = self.retains_grad
            self._grad_fn, self._out_nr, self._rg = node, 0, result._rg
            if retained:
                self.retain_grad()
        self._bump_version()
        if isinstance(node, OpNode) and node.out_data is result._data:
            # the output the node saved is self now: a later in-place op on self fails the backward, as in torch
            node.out_data, node.out_version, node.out_version_seen = self._data, self._vc(), self._vc()[0]
        self._refresh_view()
        return self

    def _check_inplace_allowed(self) -> None:
        if self._rg and self._grad_fn is None:
            raise RuntimeError("a leaf Variable that requires grad is being used in an in-place operation.")
        base = self._base
        if base is not None and self._no_grad_view:
            raise RuntimeError("A view was created in no_grad mode and is being modified inplace with grad mode "
                               "enabled. Given that this use case is ambiguous and error-prone, it is forbidden. You "
                               "can clarify your code by moving both the view and the inplace either both inside the "
                               "no_grad block (if you don't want the inplace to be tracked) or both outside (if you "
                               "want the inplace to be tracked).")
        if base is not None and base._rg and base._grad_fn is None:
            raise RuntimeError("a view of a leaf Variable that requires grad is being used in an in-place "
                               "operation.")

    def _check_writeable(self) -> None:
        data = self._data
        if isinstance(data, np.ndarray) and data.flags.writeable:
            return
        if not isinstance(data, np.ndarray):
            from .cuda import memory

            if memory.is_writeable(data):
                return
        if any(stride == 0 and n > 1 for stride, n in zip(data.strides, data.shape)):
            raise RuntimeError("unsupported operation: more than one element of the written-to tensor refers to a "
                               "single memory location. Please clone() the tensor before performing the operation.")
        raise RuntimeError(f"an in-place operation on read-only memory (a tensor of shape {list(self.shape)} that "
                           f"views an expanded tensor, or a read-only numpy array): clone() it first")

    def add_(self, other, *, alpha=1):
        return self._scaled_inplace("add", api.add, other, alpha)

    def sub_(self, other, *, alpha=1):
        return self._scaled_inplace("sub", api.sub, other, alpha)

    def _scaled_inplace(self, name: str, fn, other, alpha) -> "Tensor":
        """self = self +- alpha * other in place: the op itself, or the composite (api.add / api.sub) where torch's
        fused rounding differs from rounding alpha * other first."""
        _check_no_partial_overlap(self._data, other)
        if alpha != 1 and self._scaled_other_rounds(other) and not self._recording_into_view(other):
            return self._inplace_composite(name, fn, other, alpha=alpha)
        return self._inplace(name, other if alpha == 1 else other * alpha)

    def _recording_into_view(self, *others) -> bool:
        """Whether an in-place write into this view is recorded for autograd (CopySlices): its last op must read
        the old value directly, so torch's fused roundings (api.add's alpha, lerp, addcmul: computed wider and
        cast back) give way to the plain formula there."""
        return self._base is not None and _grad_state.enabled and (
            self.requires_grad or any(isinstance(t, Tensor) and t.requires_grad for t in others))

    def _scaled_other_rounds(self, other) -> bool:
        """Whether `other * alpha` would round where torch's fused self + alpha * other does not: into bfloat16,
        or at a float precision below the result's (a float32 parameter plus alpha times a bfloat16 update)."""
        if self.dtype is _BFLOAT16:
            return True
        if self.dtype is dt.float32 and isinstance(other, Tensor) and other.dtype is dt.float32:
            return True  # (torch's fused multiply-add: api._add_scaled_other)
        return isinstance(other, Tensor) and other.dtype.is_floating_point and other.dtype is not self.dtype

    def mul_(self, other):
        return self._inplace("mul", other)

    def div_(self, other, *, rounding_mode=None):
        if rounding_mode is None:
            return self._inplace("div", other)
        return self._inplace_composite("div", api.div, other, rounding_mode=rounding_mode)

    def _inplace_composite(self, name, fn, *args, **kwargs) -> "Tensor":
        """self = fn(self, *args, **kwargs) in place, for a function composed of several ops: recorded for autograd
        (the copy of self it reads is saved) or written straight into self's memory."""
        self._check_writeable()
        for a in args:
            _check_no_partial_overlap(self._data, a)

        def compute(old):
            result = fn(old, *args, **kwargs)
            if result.dtype.category > self.dtype.category:
                raise RuntimeError(f"result type {result.dtype.name} can't be cast to the desired output type "
                                   f"{self.dtype.name} (in-place {name})")
            return result if result.dtype is self.dtype else result.to(self.dtype)

        if _grad_state.enabled and (self.requires_grad or any(isinstance(a, Tensor) and a.requires_grad
                                                              for a in args)):
            return self._inplace_recorded(compute, True)
        start = _perf_counter() if _op_observers else None
        result = compute(self)
        _write_broadcast(self._data, result._data)
        if start is not None:  # a profiler sees the in-place op (name_), as torch's shows aten::add_
            arrays = [self._data, *(a._data if isinstance(a, Tensor) else a for a in args)]
            _notify_observers(OPS.get(name) or _CompositeOp(name), arrays, self._data, start, _perf_counter(), True)
        self._bump_version()
        return self

    def pow_(self, exponent):
        return self._inplace("pow", exponent)

    def neg_(self):
        return self._inplace("neg")

    def exp_(self):
        return self._inplace("exp")

    def sqrt_(self):
        return self._inplace("sqrt")

    def relu_(self):
        return self._inplace("relu")

    def sigmoid_(self):
        return self._inplace("sigmoid")

    def tanh_(self):
        return self._inplace("tanh")

    def clamp_(self, min=None, max=None):
        if min is None and max is None:
            raise RuntimeError("clamp_: At least one of 'min' or 'max' must not be None")
        if isinstance(min, Tensor) or isinstance(max, Tensor):
            return self._inplace_composite("clamp", api.clamp, min, max)
        return self._inplace("clamp", min=min, max=max)

    clip_ = clamp_

    def addcmul_(self, tensor1, tensor2, *, value=1):
        if self._recording_into_view(tensor1, tensor2):
            return self._inplace("add", tensor1 * tensor2 * value if value != 1 else tensor1 * tensor2)
        return self._inplace_composite("addcmul", api.addcmul, tensor1, tensor2, value=value)

    def addcdiv_(self, tensor1, tensor2, *, value=1):
        return self._inplace_composite("addcdiv", api.addcdiv, tensor1, tensor2, value=value)

    def lerp_(self, end, weight):
        if self._recording_into_view(end, weight):
            return self._inplace("add", (end - self) * weight)
        return self._inplace_composite("lerp", api.lerp, end, weight)

    def masked_fill_(self, mask, value):
        self._check_writeable()
        if _grad_state.enabled and (self.requires_grad or (isinstance(value, Tensor) and value.requires_grad)):
            if isinstance(value, Tensor) and value.dtype is not self.dtype:
                value = value.to(self.dtype)  # so that the op recorded reads self directly (CopySlices needs that)
            return self._inplace_recorded(lambda old: api.masked_fill(old, mask, value), False)
        if self.is_cuda:
            _write_broadcast(self._data, api.masked_fill(self.detach(), mask, value)._data)
            self._bump_version()
            return self
        np.copyto(self._data, value._data if isinstance(value, Tensor) else value,
                  where=np.broadcast_to(mask._data, self._data.shape), casting="unsafe")
        self._bump_version()
        return self

    def tril_(self, diagonal=0):
        return self.masked_fill_(api._off_triangle(self, diagonal, True, "tril"), 0)

    def triu_(self, diagonal=0):
        return self.masked_fill_(api._off_triangle(self, diagonal, False, "triu"), 0)

    def _resize_for_out(self, shape: tuple) -> None:
        """New memory of `shape` for a tensor passed as out= (torch resizes such outputs)."""
        if self.is_cuda:
            from .cuda import memory

            self._data = memory.empty(shape, self.dtype.np)
        else:
            self._data = np.empty(shape, dtype=self.dtype.np)
        self._bump_version()

    def zero_(self):
        return self.fill_(0)

    def fill_(self, value):
        self[...] = value
        return self

    def copy_(self, src, non_blocking=False):
        if isinstance(src, Tensor) and src.device != self.device:
            src = _to_device(src, self.device)  # torch's copy_ copies across devices
        _check_no_partial_overlap(self._data, src)  # before src broadcasts, as torch's copy_ checks
        self[...] = src
        return self

    def uniform_(self, a=0.0, b=1.0, *, generator=None):
        from .random import rng

        return self._fill_random(rng(generator).uniform(a, b, self._data.shape))

    def normal_(self, mean=0.0, std=1.0, *, generator=None):
        from .random import rng

        return self._fill_random(rng(generator).normal(mean, std, self._data.shape))

    def bernoulli_(self, p=0.5, *, generator=None):
        return self._fill_random(api.bernoulli(self, p, generator=generator)._data)

    def exponential_(self, lambd=1.0, *, generator=None):
        from .random import rng

        return self._fill_random(rng(generator).exponential(1.0 / lambd, self._data.shape))

    def geometric_(self, p, *, generator=None):
        from .random import rng

        return self._fill_random(rng(generator).geometric(p, self._data.shape))

    def cauchy_(self, median=0.0, sigma=1.0, *, generator=None):
        from .random import rng

        return self._fill_random(median + sigma * rng(generator).standard_cauchy(self._data.shape))

    def log_normal_(self, mean=1.0, std=2.0, *, generator=None):
        from .random import rng

        return self._fill_random(rng(generator).lognormal(mean, std, self._data.shape))

    def random_(self, low=0, high=None, *, generator=None):
        """Integers drawn uniformly from [low, high) (random_(high): [0, high); random_(): up to the dtype's span)."""
        from .random import rng

        if high is None:
            low, high = (0, low) if low else (0, 2 ** 24 if self.dtype is dt.float32 else
                                              2 ** 53 if self.dtype is dt.float64 else 2 ** 11 if
                                              self.dtype is dt.float16 else 2 if self.dtype is dt.bool_ else
                                              np.iinfo(self.dtype.np).max)
        if low >= high:
            raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={low} >= to={high}")
        return self._fill_random(rng(generator).integers(low, high, self._data.shape))

    def fill_diagonal_(self, fill_value, wrap=False):
        self[api.fill_diagonal_key(self, wrap)] = fill_value
        return self

    def _fill_random(self, values: np.ndarray):
        self._check_writeable()
        if _grad_state.enabled and self.requires_grad:
            self._check_inplace_allowed()
        if self.is_cuda:
            from .cuda import dispatch, memory

            dispatch.copy_into(self._data, memory.to_device(np.asarray(values, dtype=self.dtype.np)))
        else:
            self._data[...] = values
        self._bump_version()
        return self

    def __setitem__(self, key, value) -> None:
        encoded, index_tensors = api.encode_index(self, key)
        self._check_writeable()
        if not index_tensors and isinstance(value, Tensor) and not self.is_cuda:  # torch expands the value first
            region = self._data[ops.decode_key(encoded, [])]
            if type(region) is np.ndarray and region.shape == value._data.shape:
                _check_no_partial_overlap(region, value)
            elif type(region) is np.ndarray and _broadcastable(value._data.shape, region.shape):
                _check_no_partial_overlap(region, Tensor._from_array(np.broadcast_to(value._data, region.shape)))
        recording = _grad_state.enabled and (self.requires_grad or (isinstance(value, Tensor) and value.requires_grad))
        if recording:
            attrs = {"key": encoded, "accumulate": False}
            self._inplace_recorded(lambda old: Tensor._apply_op(OPS["index_put"], (old, value, *index_tensors), attrs),
                                   False)
            return
        if self.is_cuda:
            self._setitem_device(encoded, index_tensors, value)
            return
        np_key = ops.decode_key(encoded, [t._data for t in index_tensors])
        source = value._data if isinstance(value, Tensor) else value
        inputs = (self, value, *index_tensors)
        _wrap_numpy_errors(OPS["index_put"], inputs, {"key": encoded},
                           lambda: self._data.__setitem__(np_key, source))
        self._bump_version()

    def _setitem_device(self, encoded, index_tensors, value) -> None:
        """self[key] = value on a CUDA tensor (basic keys: a view of the region, written by a copy kernel)."""
        from .cuda import dispatch

        if isinstance(value, Tensor):
            source = value._data if value.is_cuda else (value.item() if value.ndim == 0 else
                                                        _to_device(value, self.device)._data)
        else:
            source = _scalar_operand(OPS["index_put"], value)
        if index_tensors:
            indices = [t._data if t.is_cuda else _to_device(t, self.device)._data for t in index_tensors]
            dispatch.put(self._data, source, indices, encoded, accumulate=False)
            self._bump_version()
            return
        region = dispatch.basic_view(self._data, encoded)
        if isinstance(value, Tensor):
            _check_no_partial_overlap(region, value)
        try:
            dispatch.copy_into(region, source)
        except ValueError as e:
            raise _op_error(OPS["index_put"], (self, value), {"key": encoded, "accumulate": False}, e) from None
        self._bump_version()

    def __iadd__(self, other):
        return self.add_(other)

    def __isub__(self, other):
        return self.sub_(other)

    def __imul__(self, other):
        return self.mul_(other)

    def __itruediv__(self, other):
        return self.div_(other)


_TYPE_NAMES = {"float32": "FloatTensor", "float64": "DoubleTensor", "float16": "HalfTensor",
               "bfloat16": "BFloat16Tensor", "int64": "LongTensor",
               "int32": "IntTensor", "int16": "ShortTensor", "int8": "CharTensor", "uint8": "ByteTensor",
               "bool": "BoolTensor", "complex64": "ComplexFloatTensor", "complex128": "ComplexDoubleTensor"}
_INTERNAL_ATTRS = {"_data", "_rg", "_grad_fn", "_out_nr", "_grad", "_base", "_view_fn", "_view_version",
                   "_no_grad_view", "_version_counter", "_backward_hooks", "_acc_ref", "_post_accumulate_hooks"}


def _check_no_partial_overlap(out, src) -> None:
    """torch's check that an in-place op reads the memory it writes only element for element (the same tensor, or
    memory laid out alike): a partly overlapping source would be read after it is partly written."""
    if not isinstance(src, Tensor):
        return
    if not isinstance(out, np.ndarray):
        if src.is_cuda and _dense(out) and _dense(src._data):
            from .cuda import memory

            if memory.reads_elsewhere(out, src._data):
                raise RuntimeError(_PARTIAL_OVERLAP)
        return
    if type(out) is not np.ndarray:
        return
    b = src._data
    if out.size == 0 or b.size == 0 or not _dense(out) or not _dense(b) or not np.may_share_memory(out, b):
        return  # as torch, memory with gaps (slices with steps) is not checked
    a_begin, b_begin = out.__array_interface__["data"][0], b.__array_interface__["data"][0]
    if a_begin == b_begin and out.nbytes == b.nbytes:
        # NOTE: torch compares the strides of size-1 dims too, but numpy and torch set those differently
        if out.shape == b.shape and all(n < 2 or sa == sb for n, sa, sb in zip(out.shape, out.strides, b.strides)):
            return
    elif not (a_begin < b_begin + b.nbytes and b_begin < a_begin + out.nbytes):
        return
    raise RuntimeError(_PARTIAL_OVERLAP)


_PARTIAL_OVERLAP = ("unsupported operation: some elements of the input tensor and the written-to tensor refer to a "
                    "single memory location. Please clone() the tensor before performing the operation.")


def _broadcastable(shape, target) -> bool:
    try:
        return np.broadcast_shapes(shape, target) == target
    except ValueError:
        return False


def _dense(a) -> bool:
    """Elements without gaps or overlaps, in some order of dims (torch's is_non_overlapping_and_dense)."""
    expected = a.dtype.itemsize
    for stride, n in sorted((s, n) for s, n in zip(a.strides, a.shape) if n > 1):
        if stride != expected:
            return False
        expected *= n
    return True


def copy_array(a):
    """A copy of a tensor's storage, on its device."""
    if isinstance(a, np.ndarray):
        return a.copy()
    from .cuda import dispatch

    return dispatch.clone(a)


def _write_broadcast(dst, src, exact: bool = False) -> None:
    """dst[...] = src (an array on dst's device, broadcast to dst's shape; exact: of dst's shape), cast as
    numpy's unsafe casting does."""
    if isinstance(dst, np.ndarray):
        np.copyto(dst, src if exact else np.broadcast_to(src, dst.shape), casting="unsafe")
    else:
        from .cuda import dispatch

        dispatch.copy_into(dst, src)


def _layout(a):
    """a, or for a device array a host stand-in with its layout (for numpy's view rules; never read)."""
    if isinstance(a, np.ndarray):
        return a
    from .cuda import memory

    return memory.stand_in(a)


_CUDA_NUMPY_ERROR = ("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host "
                     "memory first.")


class ToCopyBackward0(Node):
    """The backward of a copy between devices: the gradient is copied back to the source's device."""

    def __init__(self, next_edges, source):
        super().__init__(next_edges)
        self.source = source

    def apply(self, grads):
        return [None if grads[0] is None else _to_device(grads[0], self.source)]


def _to_device(t: "Tensor", device) -> "Tensor":
    """t copied to another device, recorded for autograd (the gradient is copied back)."""
    from .cuda import memory

    target = check_device(device)
    if target == t.device:
        return t
    out = Tensor._from_array(memory.to_host(t._data) if target is CPU else memory.to_device(t._data))
    if _grad_state.enabled and t.requires_grad:
        out._grad_fn = ToCopyBackward0([_edge_refreshed(t)], t.device)
        out._rg = True
    return out


def _edge_refreshed(t):
    t._refresh_view()
    return _edge(t)


def _rebuild_tensor(cls, data, requires_grad):
    t = Tensor._from_array(data, cls)
    t._rg = requires_grad
    return t


def _edge(x):  # NOTE: _apply_op has refreshed a view's grad_fn before
    if isinstance(x, Tensor):
        if x._grad_fn is not None:
            return (x._grad_fn, x._out_nr)
        if x._rg:
            return (accumulator_for(x), 0)
    return None


def _scalar_operand(op, x, inputs=()):
    """numpy scalars and other numbers become Python scalars; a numpy array a tensor (`t + np.ones(2)`): torch's
    operators hand those to numpy, whose promotion decides the result's dtype (float32 with an int64 array is
    float64), so the array takes that dtype. Anything else is a clear TypeError."""
    if isinstance(x, np.generic) or isinstance(x, (int, float)):
        return x.item() if isinstance(x, np.generic) else x
    if isinstance(x, np.ndarray):
        dt.from_numpy_dtype(x.dtype)  # a clear error for a dtype runtime has not
        result = np.result_type(*[v._data.dtype if isinstance(v, Tensor) else v for v in inputs if v is not None])
        return Tensor._from_array(x.astype(result) if result.kind in "fc" and result != x.dtype else x)
    raise TypeError(f"{op.name}(): expected Tensor or number operands, got {type(x).__name__}")


def _cast_to_compute(arrays, np_dtype, positions) -> None:
    for i, a in enumerate(arrays):
        if type(a) is np.ndarray and a.dtype != np_dtype and (positions is None or i in positions):
            arrays[i] = a.astype(np_dtype)
    _wrap_int_scalars(arrays, np_dtype)


class _CompositeOp(NamedTuple):
    """What a profiler is told of an in-place composite with no op of its own (lerp_, addcmul_)."""

    name: str
    is_view: bool = False
    kind: str = "composite"


def _widen_bfloat16(op, arrays) -> None:
    """bfloat16 operands as float32: the op computes in float32 and its result is rounded to bfloat16 once, as torch
    does (numpy's bfloat16 sums and products would round at every step). A Python number is first rounded to
    bfloat16, as torch casts it to the op's dtype, except the scale of mul and div (torch keeps it in float32)."""
    for i, a in enumerate(arrays):
        if type(a) is np.ndarray:
            if a.dtype == _BFLOAT16_NP:
                arrays[i] = a.astype(np.float32)
        elif (type(a) is float or type(a) is int) and not (i == 1 and op.name in _UNROUNDED_SCALE_OPS):
            arrays[i] = float(_BFLOAT16_NP.type(a))


_UNROUNDED_SCALE_OPS = ("mul", "div", "floordiv")


def _wrap_int_scalars(arrays, np_dtype) -> None:
    if np_dtype.kind in "iu" and np_dtype.itemsize < 8:
        for i, a in enumerate(arrays):
            if type(a) is int:
                arrays[i] = _wrap_int(a, np_dtype)


def _wrap_int(value: int, np_dtype) -> int:
    """A Python int operand of a narrow integer op as torch casts it: wrapped modulo 2**bits (uint8 + 300 adds 44)."""
    bits = 8 * np_dtype.itemsize
    low = -(1 << (bits - 1)) if np_dtype.kind == "i" else 0
    return (value - low) % (1 << bits) + low


def _describe(inputs) -> str:
    parts = []
    for x in inputs:
        if isinstance(x, Tensor):
            parts.append(f"Tensor(shape={list(x.shape)}, dtype={x.dtype})")
        else:
            parts.append(repr(x))
    return ", ".join(parts)


def _op_error(op, inputs, attrs, error: Exception) -> Exception:
    """A clear error naming the op, shapes and dtypes: the shape rule's own message when it has one."""
    try:
        op.infer(*inputs, **attrs)
    except (ops.ShapeError, IndexError, TypeError, RuntimeError) as rule_error:
        return type(rule_error)(str(rule_error))
    except Exception:
        pass
    message = str(error).replace("axis", "dimension")
    kind = next((k for k in (IndexError, TypeError) if isinstance(error, k)), RuntimeError)
    return kind(f"{op.name}: {message} (inputs: {_describe(inputs)})")


def _wrap_numpy_errors(op, inputs, attrs, action) -> None:
    try:
        action()
    except (ValueError, IndexError, TypeError) as e:
        raise _op_error(op, inputs, attrs, e) from None


def _parse_to(args, kwargs):
    """(device or None, dtype or None, copy, memory format) from Tensor.to's many call forms."""
    dtype, copy = kwargs.pop("dtype", None), kwargs.pop("copy", False)
    kwargs.pop("non_blocking", None)
    fmt = mf.checked(kwargs.pop("memory_format", None), "to")
    device = check_device(kwargs.pop("device")) if kwargs.get("device") is not None else None
    kwargs.pop("device", None)
    if kwargs:
        raise TypeError(f"to() got unexpected keyword arguments {sorted(kwargs)}")
    for a in args:
        if isinstance(a, Tensor):
            dtype, device = a.dtype, a.device
        elif isinstance(a, dt.dtype) or a in (float, int, bool):
            dtype = dt.as_dtype(a)
        elif isinstance(a, bool):
            copy = a
        else:
            device = check_device(a)
    return device, dtype, copy, fmt


def _install_api_methods() -> None:
    for name, fn in {**api.METHODS, **api.DUNDERS}.items():
        if name not in Tensor.__dict__:
            setattr(Tensor, name, fn)
    for name in api.INPLACE:
        if name + "_" not in Tensor.__dict__:
            setattr(Tensor, name + "_", _inplace_method(name, api.METHODS[name]))
    for name in ("squeeze", "unsqueeze", "transpose", "swapaxes", "swapdims", "t"):
        if name + "_" not in Tensor.__dict__:
            setattr(Tensor, name + "_", _inplace_view_method(name))


def _inplace_method(name, fn):
    def method(self, *args, **kwargs):
        return self._inplace_composite(name, fn, *args, **kwargs)

    method.__name__ = method.__qualname__ = name + "_"
    method.__doc__ = f"In-place {name}: self = {name}(self, ...)."
    return method


def _inplace_view_method(name):
    def method(self, *args):
        """Change this tensor's shape in place, as torch's metadata-only in-place ops."""
        if self._base is not None or self._grad_fn is not None:
            raise RuntimeError(f"{name}_: runtime changes the shape in place only of a tensor that is neither a "
                               f"view nor computed by a recorded op")
        new = getattr(api, name)(self.detach(), *args)
        self._data = new._data
        return self

    method.__name__ = method.__qualname__ = name + "_"
    return method


_install_api_methods()
ops.set_default_handler(Tensor)
