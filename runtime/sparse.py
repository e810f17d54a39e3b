"""Sparse COO tensors (torch.sparse_coo_tensor, Tensor.to_sparse, torch.sparse.mm / torch.spmm), as graph
networks use them: an adjacency or normalization matrix times dense features.

A SparseCooTensor holds int64 `indices` [sparse dims, nnz] and `values` [nnz, *dense dims]; everything it computes
is written with runtime's dense ops on those two (index_add, index_select, index_put), so gradients reach the values
and the dense operands through the ordinary autograd. Any other op given a sparse operand computes on its dense
form (`_apply_op`), as a result-equal fallback.
"""
from __future__ import annotations

import numpy as np

from . import dtypes as dt
from .tensor import Size, Tensor


class Layout:
    """torch.strided / torch.sparse_coo."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"runtime.{self.name}"


strided = Layout("strided")
sparse_coo = Layout("sparse_coo")


class SparseCooTensor:
    """A sparse tensor in COO form: values[k] sits at indices[:, k]; repeated indices add up (until coalesce)."""

    is_sparse = True
    layout = sparse_coo
    is_cuda = False

    def __init__(self, indices: Tensor, values: Tensor, size, coalesced: bool = False):
        self._idx, self._vals = indices, values
        self._size = Size(tuple(int(d) for d in size))
        self._coalesced = coalesced

    # -- what it is ----------------------------------------------------------------------------------

    @property
    def shape(self) -> Size:
        return self._size

    def size(self, dim: int | None = None):
        return self._size if dim is None else self._size[dim]

    def dim(self) -> int:
        return len(self._size)

    ndim = property(dim)

    @property
    def dtype(self):
        return self._vals.dtype

    @property
    def device(self):
        return self._vals.device

    @property
    def requires_grad(self) -> bool:
        return self._vals.requires_grad

    def requires_grad_(self, requires_grad: bool = True) -> "SparseCooTensor":
        self._vals.requires_grad_(requires_grad)
        return self

    @property
    def grad_fn(self):
        return self._vals.grad_fn

    def sparse_dim(self) -> int:
        return self._idx.shape[0]

    def dense_dim(self) -> int:
        return self._vals.ndim - 1

    def _nnz(self) -> int:
        return self._vals.shape[0]

    def is_coalesced(self) -> bool:
        return self._coalesced

    def indices(self) -> Tensor:
        if not self._coalesced:
            raise RuntimeError("Cannot get indices on an uncoalesced tensor, please call .coalesce() first")
        return self._idx

    def values(self) -> Tensor:
        if not self._coalesced:
            raise RuntimeError("Cannot get values on an uncoalesced tensor, please call .coalesce() first")
        return self._vals

    def _indices(self) -> Tensor:
        """The indices as stored (repeats and order kept), as torch's _indices()."""
        return self._idx

    def _values(self) -> Tensor:
        return self._vals

    def __len__(self) -> int:
        return self._size[0]

    def __repr__(self) -> str:
        pad = " " * len("tensor(indices=")
        indices = repr(self._idx).replace("\n", "\n" + pad)
        values = repr(self._vals).replace("\n", "\n" + " " * len("       values="))
        return (f"tensor(indices={indices},\n       values={values},\n       size={tuple(self._size)}, "
                f"nnz={self._nnz()}, layout={self.layout})")

    # -- forms -----------------------------------------------------------------------------------------

    def coalesce(self) -> "SparseCooTensor":
        """Indices sorted (row-major) and each repeated once, their values summed."""
        if self._coalesced:
            return self
        positions = self._idx.numpy()
        flat = np.ravel_multi_index(tuple(positions), tuple(self._size[:self.sparse_dim()])) if positions.size \
            else np.zeros(0, np.int64)
        unique, inverse = np.unique(flat, return_inverse=True)
        indices = Tensor._from_array(np.stack(np.unravel_index(unique, tuple(self._size[:self.sparse_dim()])))
                                     .astype(np.int64).reshape(self.sparse_dim(), len(unique)))
        summed = self._vals.new_zeros((len(unique), *self._vals.shape[1:])).index_add(
            0, Tensor._from_array(inverse.astype(np.int64).reshape(-1)), self._vals)
        return SparseCooTensor(indices, summed, self._size, coalesced=True)

    def to_dense(self) -> Tensor:
        """The dense tensor (repeated indices add up); differentiable in the values."""
        dense = self._vals.new_zeros(tuple(self._size))
        if self._nnz() == 0:
            return dense
        at = tuple(self._idx[d] for d in range(self.sparse_dim()))
        return dense.index_put(at, self._vals, accumulate=True)

    def detach(self) -> "SparseCooTensor":
        return SparseCooTensor(self._idx, self._vals.detach(), self._size, self._coalesced)

    def clone(self) -> "SparseCooTensor":
        return SparseCooTensor(self._idx.clone(), self._vals.clone(), self._size, self._coalesced)

    def to(self, *args, **kwargs) -> "SparseCooTensor":
        """Values converted as Tensor.to converts (dtype, the CPU device); the indices stay int64."""
        return SparseCooTensor(self._idx, self._vals.to(*args, **kwargs), self._size, self._coalesced)

    def cpu(self) -> "SparseCooTensor":
        return self

    def float(self) -> "SparseCooTensor":
        return self.to(dt.float32)

    def double(self) -> "SparseCooTensor":
        return self.to(dt.float64)

    def t(self) -> "SparseCooTensor":
        if self.sparse_dim() != 2 or self.dense_dim():
            raise RuntimeError(f"t() expects a 2-D sparse tensor with no dense dims, got size {tuple(self._size)}")
        return SparseCooTensor(self._idx.flip(0), self._vals, (self._size[1], self._size[0]))

    def transpose(self, dim0: int, dim1: int) -> "SparseCooTensor":
        if {dim0 % self.dim(), dim1 % self.dim()} != {0, 1} or self.dim() != 2:
            raise RuntimeError("transpose of a sparse tensor: only the two dims of a 2-D one are supported")
        return self.t()

    # -- arithmetic ------------------------------------------------------------------------------------

    def __matmul__(self, other):
        return mm(self, other)

    def __add__(self, other):
        if isinstance(other, SparseCooTensor):
            if other.shape != self.shape:
                raise RuntimeError(f"add: sparse tensors of sizes {tuple(self.shape)} and {tuple(other.shape)}")
            from . import api

            return SparseCooTensor(api.cat([self._idx, other._idx], 1),
                                   api.cat([self._vals, other._vals.to(self.dtype)], 0), self._size)
        raise RuntimeError("add(sparse, dense) is not supported. Use add(dense, sparse) instead.")

    def __radd__(self, other):
        return other + self.to_dense()

    def __sub__(self, other):
        if not isinstance(other, SparseCooTensor):
            raise RuntimeError("add(sparse, dense) is not supported. Use add(dense, sparse) instead.")
        return self + (-other)

    def __rsub__(self, other):
        return other - self.to_dense()

    def __neg__(self) -> "SparseCooTensor":
        return SparseCooTensor(self._idx, -self._vals, self._size, self._coalesced)

    def __mul__(self, other):
        """Times a number, or elementwise times a dense tensor broadcast to this one's size: sparse, as torch's
        (only the stored entries can be nonzero)."""
        if isinstance(other, (int, float)):
            return SparseCooTensor(self._idx, self._vals * other, self._size, self._coalesced)
        if isinstance(other, SparseCooTensor):
            other = other.to_dense()
        at = tuple(self._idx[d] for d in range(self.sparse_dim()))
        picked = other.expand(tuple(self._size))[at]
        return SparseCooTensor(self._idx, self._vals * picked, self._size, self._coalesced)

    __rmul__ = __mul__

    def __truediv__(self, other):
        if isinstance(other, (int, float)):
            return SparseCooTensor(self._idx, self._vals / other, self._size, self._coalesced)
        return self.to_dense() / other

    @staticmethod
    def _apply_op(op, inputs, attrs):
        """A product with a dense matrix (mm, matmul, @ either way round), as `mm`; dense * sparse, sparse; any
        other op computed on the dense form of the sparse operands."""
        from .ops import apply

        if op.name == "matmul":
            return mm(*inputs)
        if op.name == "mul" and len(inputs) == 2:  # dense * sparse is sparse, as sparse * dense
            sparse = inputs[0] if isinstance(inputs[0], SparseCooTensor) else inputs[1]
            return sparse * (inputs[1] if sparse is inputs[0] else inputs[0])
        dense = [x.to_dense() if isinstance(x, SparseCooTensor) else x for x in inputs]
        return apply(op.name, *dense, **attrs)


def sparse_coo_tensor(indices, values, size=None, *, dtype=None, device=None, requires_grad: bool = False,
                      check_invariants=None, is_coalesced=None) -> SparseCooTensor:
    """torch.sparse_coo_tensor: values[k] at indices[:, k]; size defaults to the smallest that holds them."""
    from . import factories

    indices = indices if isinstance(indices, Tensor) else factories.tensor(indices)
    indices = indices.to(dt.int64).detach()
    if indices.ndim != 2:
        raise RuntimeError(f"indices must be sparse_dim x nnz, but got: {list(indices.shape)}")
    values = values if isinstance(values, Tensor) else factories.tensor(values)
    if dtype is not None:
        values = values.to(dtype)
    if values.ndim == 0 or values.shape[0] != indices.shape[1]:
        raise RuntimeError(f"indices and values must have same nnz, but got nnz from indices: {indices.shape[1]}, "
                           f"nnz from values: {values.shape[0] if values.ndim else 0}")
    positions = indices.numpy()
    if size is None:
        size = tuple(int(positions[d].max()) + 1 if positions.shape[1] else 0 for d in range(positions.shape[0]))
        size += tuple(values.shape[1:])
    size = tuple(int(d) for d in size)
    if len(size) != indices.shape[0] + values.ndim - 1:
        raise RuntimeError(f"number of dimensions must be sparse_dim ({indices.shape[0]}) + dense_dim "
                           f"({values.ndim - 1}), but got {len(size)}")
    for d in range(indices.shape[0]):
        if positions.shape[1] and (positions[d].min() < 0 or positions[d].max() >= size[d]):
            raise RuntimeError(f"size is inconsistent with indices: for dim {d}, size is {size[d]} but found index "
                               f"{int(positions[d].max() if positions[d].max() >= size[d] else positions[d].min())}")
    if requires_grad:
        values = values.detach().requires_grad_(True)
    return SparseCooTensor(indices, values, size, coalesced=bool(is_coalesced))


def to_sparse(dense: Tensor, sparse_dim: int | None = None) -> SparseCooTensor:
    """Tensor.to_sparse: the nonzero entries (over all dims, or the first `sparse_dim`), coalesced."""
    k = dense.ndim if sparse_dim is None else sparse_dim
    if not 0 < k <= dense.ndim:
        raise RuntimeError(f"sparse_dim must be in [1, {dense.ndim}], got {k}")
    array = dense.detach().numpy()
    nonzero = np.nonzero(array.reshape(array.shape[:k] + (-1,)).any(axis=-1) if k < dense.ndim else array)
    indices = Tensor._from_array(np.stack(nonzero).astype(np.int64).reshape(k, -1))
    values = dense[tuple(indices[d] for d in range(k))]
    return SparseCooTensor(indices, values, tuple(dense.shape), coalesced=True)


def mm(mat1, mat2) -> Tensor:
    """A 2-D sparse times a dense matrix (or dense times sparse): a dense result, differentiable in the sparse
    values and the dense operand (torch.sparse.mm, torch.spmm, sparse @ dense)."""
    if isinstance(mat1, SparseCooTensor) and isinstance(mat2, SparseCooTensor):
        return mm(mat1, mat2.to_dense())
    if not isinstance(mat1, SparseCooTensor):  # dense @ sparse = (sparse^T @ dense^T)^T
        return mm(mat2.t(), mat1.t()).t()
    if mat1.sparse_dim() != 2 or mat1.dense_dim() or mat2.ndim != 2:
        raise RuntimeError(f"sparse mm: expects a 2-D sparse matrix and a 2-D dense one, got sizes "
                           f"{tuple(mat1.shape)} and {tuple(mat2.shape)}")
    if mat1.shape[1] != mat2.shape[0]:
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({mat1.shape[0]}x{mat1.shape[1]} and "
                           f"{mat2.shape[0]}x{mat2.shape[1]})")
    rows, cols = mat1._idx[0], mat1._idx[1]
    values = mat1._vals.to(mat2.dtype) if mat1.dtype != mat2.dtype else mat1._vals
    out = mat2.new_zeros((mat1.shape[0], mat2.shape[1]))
    if mat1._nnz() == 0:
        return out
    return out.index_add(0, rows, values.unsqueeze(1) * mat2.index_select(0, cols))


def sum(input, dim=None, dtype=None):  # noqa: A001 - torch.sparse.sum's name
    """torch.sparse.sum over every dim (a 0-dim dense tensor) or the given ones: a sparse tensor of the sparse dims
    left while some are (their duplicate indices added up), else the dense tensor of the dense dims left."""
    if dtype is not None:
        input = input.to(dtype)
    if not isinstance(input, SparseCooTensor):
        return input.sum() if dim is None else input.sum(dim)
    if dim is None:
        return input._vals.sum()
    dims = sorted({d % input.dim() for d in ((dim,) if isinstance(dim, int) else dim)})
    sparse = input.sparse_dim()
    kept = [d for d in range(sparse) if d not in dims]
    if not kept:
        return input.to_dense().sum(dims)
    dense_summed = [d - sparse + 1 for d in dims if d >= sparse]  # dense dims are the values' dims after the first
    values = input._vals.sum(dense_summed) if dense_summed else input._vals
    size = [n for d, n in enumerate(input.shape) if d not in dims]
    return SparseCooTensor(input._idx[kept], values, tuple(size)).coalesce()


def FloatTensor(indices, values, size) -> SparseCooTensor:  # noqa: N802 - torch.sparse.FloatTensor's name
    """The legacy constructor (pygcn's sparse_mx_to_torch_sparse_tensor): float32 values."""
    return sparse_coo_tensor(indices, values, size, dtype=dt.float32)


def DoubleTensor(indices, values, size) -> SparseCooTensor:  # noqa: N802
    return sparse_coo_tensor(indices, values, size, dtype=dt.float64)
