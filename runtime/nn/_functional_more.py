"""More of torch.nn.functional: in-place activations, alpha dropout, CTC and margin losses, sampling grids, unpooling.

Like `functional.py`, everything here is a composition of tensor methods, so autograd comes for free. It is imported
by the last line of `functional.py`, whose names it reads through `F` at call time. It also replaces
`adaptive_max_pool1d/2d` there with versions that accept `return_indices=True` (the values path is unchanged).
"""
from __future__ import annotations

import itertools
import math
import warnings

from .. import amp
from .. import api
from .. import dtypes as dt
from .. import factories
from ..tensor import Tensor
from . import functional as F

__all__ = ["elu_", "celu_", "selu_", "hardtanh_", "rrelu_", "threshold_", "alpha_dropout", "feature_alpha_dropout",
           "gumbel_softmax", "pdist", "multilabel_margin_loss", "ctc_loss", "affine_grid", "grid_sample",
           "max_unpool1d", "max_unpool2d", "max_unpool3d", "adaptive_max_pool1d", "adaptive_max_pool2d",
           "adaptive_max_pool3d", "adaptive_max_pool1d_with_indices", "adaptive_max_pool2d_with_indices",
           "adaptive_max_pool3d_with_indices", "max_pool1d_with_indices", "max_pool2d_with_indices",
           "max_pool3d_with_indices", "lp_pool3d", "conv_tbc"]


# --- in-place activations ------------------------------------------------------------------------------

def elu_(input, alpha=1.0):
    return F.elu(input, alpha, inplace=True)


def celu_(input, alpha=1.0):
    return F.celu(input, alpha, inplace=True)


def selu_(input):
    return F.selu(input, inplace=True)


def hardtanh_(input, min_val=-1.0, max_val=1.0):
    return F.hardtanh(input, min_val, max_val, inplace=True)


def rrelu_(input, lower=1.0 / 8, upper=1.0 / 3, training=False):
    return F.rrelu(input, lower, upper, training, inplace=True)


def threshold_(input, threshold, value):
    return F.threshold(input, threshold, value, inplace=True)


# --- alpha dropout ---------------------------------------------------------------------------------------

_SELU_NEG = F._SELU_ALPHA * F._SELU_SCALE  # the value SELU saturates to, negated


def _alpha_dropout(input, p, training, inplace, feature):
    F._check_p(p)
    if not training or p == 0.0 or input.numel() == 0:
        return input
    if p == 1.0:
        return input.mul_(0.0) if inplace else input * 0.0
    # Dropped units are set to SELU's saturation value -alpha', then an affine map a*x + b restores zero mean and
    # unit variance: a = ((1 - p)(1 + p alpha'^2))^-1/2, b = a alpha' p (torch's formula, so the statistics agree).
    shape = tuple(input.shape)
    if feature:
        if input.ndim < 2:
            raise RuntimeError(f"Feature dropout requires at least 2 dimensions in the input, got {input.ndim}")
        shape = shape[:2] + (1,) * (input.ndim - 2)
    draw_dtype = input.dtype if input.dtype in (dt.float32, dt.float64) else dt.float32
    keep = (factories.rand(shape, dtype=draw_dtype) >= p).to(input.dtype)
    a = 1.0 / math.sqrt((_SELU_NEG * _SELU_NEG * p + 1) * (1 - p))
    b = (keep - 1) * (_SELU_NEG * a) + _SELU_NEG * a * p
    if inplace:
        return input.mul_(keep * a).add_(b)
    return input * (keep * a) + b


def alpha_dropout(input, p=0.5, training=False, inplace=False):
    return _alpha_dropout(input, p, training, inplace, feature=False)


def feature_alpha_dropout(input, p=0.5, training=False, inplace=False):
    return _alpha_dropout(input, p, training, inplace, feature=True)


def gumbel_softmax(logits, tau=1.0, hard=False, eps=1e-10, dim=-1):
    # Gumbel(0, 1) noise as -log(Exponential(1)), drawn from runtime's default generator
    gumbels = -factories.empty(tuple(logits.shape), dtype=logits.dtype).exponential_().log()
    y_soft = ((logits + gumbels) / tau).softmax(dim)
    if not hard:
        return y_soft
    index = y_soft.max(dim, keepdim=True)[1]
    y_hard = logits.new_zeros(tuple(logits.shape)).scatter(dim, index, 1.0)
    # straight-through: the hard one-hot forward, the soft sample's gradient
    return y_hard - y_soft.detach() + y_soft


def _linalg():
    from .. import linalg

    return linalg


def pdist(input, p=2.0):
    if input.ndim != 2:
        raise RuntimeError(f"pdist only supports 2D tensors, got: {input.ndim}D")
    if p < 0:
        raise RuntimeError("pdist only supports non-negative p values")
    n = input.shape[0]
    if n < 2:
        return input.new_zeros((0,))
    rows, cols = api.triu_indices(n, n, 1)
    diff = input.index_select(0, rows) - input.index_select(0, cols)
    return _linalg().vector_norm(diff, p, dim=1)


# --- losses ----------------------------------------------------------------------------------------------

@amp.runs_in_float32
def multilabel_margin_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    reduction = F._reduction(size_average, reduce, reduction)
    F._check_reduction(reduction)
    if input.ndim not in (1, 2) or tuple(target.shape) != tuple(input.shape):
        raise RuntimeError(f"multilabel_margin_loss: inconsistent target size: {list(target.shape)} for input of "
                           f"size: {list(input.shape)}")
    x = input if input.ndim == 2 else input.unsqueeze(0)
    t = target if target.ndim == 2 else target.unsqueeze(0)
    c = x.shape[1]
    if F._is_eager(t) and t.numel() and (int(t.max()) >= c or int(t.min()) < -1):
        raise RuntimeError(f"multilabel_margin_loss: target values must be in [-1, {c - 1}]")
    # The targets of a row are its entries before the first -1. count[n, j]: how often class j is listed
    # (torch sums over the list, so a repeated class counts again); the other classes are the non-targets.
    listed = (t != -1).to(dt.int64).cumprod(1)
    count = (F.one_hot(t.clamp(min=0), c) * listed.unsqueeze(2)).sum(1).to(x.dtype)
    other = (count == 0).to(x.dtype)
    hinge = (1.0 - x.unsqueeze(2) + x.unsqueeze(1)).clamp(min=0.0)  # [n, j, i] = max(0, 1 - (x_j - x_i))
    loss = (hinge * count.unsqueeze(2) * other.unsqueeze(1)).sum((1, 2)) / c
    if input.ndim == 1 and reduction == "none":
        return loss.squeeze(0)
    return F._reduce(loss, reduction)


_CTC_NEG = -1e30  # log(0) for the CTC recursion: finite, so logsumexp's gradient stays defined where all are 0


def _lengths(value, what):
    if isinstance(value, Tensor):
        return [int(v) for v in value.reshape(-1).tolist()]
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, reduction="mean", zero_infinity=False):
    F._check_reduction(reduction)
    unbatched = log_probs.ndim == 2
    lp = log_probs.unsqueeze(1) if unbatched else log_probs
    if lp.ndim != 3:
        raise RuntimeError(f"ctc_loss: expected log_probs of 2 or 3 dims (T, [N,] C), got {list(log_probs.shape)}")
    t_max, n, c = lp.shape
    if not 0 <= blank < c:
        raise RuntimeError("blank must be in label range")
    in_lens, tg_lens = _lengths(input_lengths, "input_lengths"), _lengths(target_lengths, "target_lengths")
    if len(in_lens) != n or len(tg_lens) != n:
        raise RuntimeError(f"ctc_loss: expected input_lengths and target_lengths of size {n}, got "
                           f"{len(in_lens)} and {len(tg_lens)}")
    if any(length > t_max for length in in_lens):
        raise RuntimeError(f"Expected input_lengths to have value at most {t_max}, but got value "
                           f"{max(in_lens)}")
    flat = [int(v) for v in targets.reshape(-1).tolist()]
    labels, offset = [], 0
    for b, length in enumerate(tg_lens):
        if targets.ndim == 1 or (unbatched and targets.ndim == 1):
            labels.append(flat[offset:offset + length])
            offset += length
        else:
            row = targets.shape[-1]
            if length > row:
                raise RuntimeError(f"Expected tensor to have size at least {length} at dimension 1, but got size "
                                   f"{row} for argument #2 'targets'")
            labels.append(flat[b * row:b * row + length])
    s_ext = 2 * max(tg_lens, default=0) + 1
    # the extended label sequences: blank, l1, blank, l2, ..., blank (padded with blanks)
    ext = [[blank] * s_ext for _ in range(n)]
    skip = [[False] * s_ext for _ in range(n)]
    for b, seq in enumerate(labels):
        for k, label in enumerate(seq):
            ext[b][2 * k + 1] = label
            skip[b][2 * k + 1] = k > 0 and label != seq[k - 1]  # s-2 -> s is allowed between distinct labels
    ext_t = factories.tensor(ext, dtype=dt.int64)
    emit = lp.gather(2, ext_t.unsqueeze(0).expand(t_max, n, s_ext))  # (T, N, S'): log p of each extended label
    neg = lp.new_full((n, 1), _CTC_NEG)
    skip_t = factories.tensor(skip, dtype=dt.bool_)
    start = factories.tensor([[s == 0 or (s == 1 and tg_lens[b] > 0) for s in range(s_ext)] for b in range(n)],
                             dtype=dt.bool_)
    alpha = api.where(start, emit[0], _CTC_NEG)
    for step in range(1, max(in_lens, default=0)):
        prev1 = api.cat([neg, alpha[:, :-1]], 1)
        prev2 = api.where(skip_t, api.cat([neg, neg, alpha[:, :-2]], 1) if s_ext > 2 else alpha, _CTC_NEG)
        new = api.stack([alpha, prev1, prev2]).logsumexp(0) + emit[step]
        running = factories.tensor([[step < length] for length in in_lens], dtype=dt.bool_)
        alpha = api.where(running, new, alpha)
    # log-likelihood: the paths ending on the last label or the blank after it
    last = factories.tensor([[2 * length, max(2 * length - 1, 0)] for length in tg_lens], dtype=dt.int64)
    ends = alpha.gather(1, last)
    ends = api.where(factories.tensor([[True, length > 0] for length in tg_lens], dtype=dt.bool_), ends, _CTC_NEG)
    nll = -ends.logsumexp(1)
    impossible = (nll > -_CTC_NEG / 2) | factories.tensor([length == 0 for length in in_lens], dtype=dt.bool_)
    impossible = impossible & factories.tensor([not (a == 0 and b == 0) for a, b in zip(in_lens, tg_lens)],
                                               dtype=dt.bool_)
    # NOTE: torch's backward returns exp(log_probs) - (the true gradient's magnitude) for t < input_length, which is
    # the gradient with respect to logits when log_probs = log_softmax(logits), and differs from the true gradient
    # with respect to log_probs otherwise. The term below is 0 in value and adds that exp(log_probs), so gradients
    # match torch's for any log_probs.
    steps = factories.tensor([[[t < length] for length in in_lens] for t in range(t_max)], dtype=lp.dtype)
    quirk = (lp.exp() * (lp - lp.detach()) * steps).sum((0, 2))
    nll = nll + quirk
    if zero_infinity:
        nll = api.where(impossible, 0.0, nll)
    else:
        nll = api.where(impossible, math.inf, nll)
    if reduction == "mean":
        lens = factories.tensor([max(length, 1) for length in tg_lens], dtype=lp.dtype)
        return (nll / lens).mean()
    if reduction == "sum":
        return nll.sum()
    return nll.squeeze(0) if unbatched else nll


# --- sampling grids --------------------------------------------------------------------------------------

_ALIGN_WARNING = ("Default grid_sample and affine_grid behavior has changed to align_corners=False since 1.3.0. "
                  "Please specify align_corners=True if the old behavior is desired. See the documentation of "
                  "grid_sample for details.")


def _base_coords(steps, align_corners, dtype):
    if steps <= 1:
        return factories.zeros((max(steps, 0),), dtype=dtype)
    line = factories.linspace(-1.0, 1.0, steps, dtype=dtype)
    return line if align_corners else line * (steps - 1) / steps  # (two roundings, as torch's)


def affine_grid(theta, size, align_corners=None):
    if align_corners is None:
        warnings.warn(_ALIGN_WARNING, stacklevel=2)
        align_corners = False
    size = [int(s) for s in size]
    if not theta.dtype.is_floating_point:
        raise ValueError(f"Expected theta to have floating point type, but got {theta.dtype}")
    if len(size) == 4:
        if theta.ndim != 3 or tuple(theta.shape[-2:]) != (2, 3):
            raise ValueError(f"Expected a batch of 2D affine matrices of shape Nx2x3 for size {size}. Got "
                             f"{list(theta.shape)}.")
        n, _, h, w = size
        xs = _base_coords(w, align_corners, theta.dtype).reshape(1, w).expand(h, w)
        ys = _base_coords(h, align_corners, theta.dtype).reshape(h, 1).expand(h, w)
        base = api.stack([xs, ys, xs.new_ones(tuple(xs.shape))], -1).reshape(1, h * w, 3)
        return api.matmul(base, theta.transpose(1, 2)).reshape(n, h, w, 2)
    if len(size) == 5:
        if theta.ndim != 3 or tuple(theta.shape[-2:]) != (3, 4):
            raise ValueError(f"Expected a batch of 3D affine matrices of shape Nx3x4 for size {size}. Got "
                             f"{list(theta.shape)}.")
        n, _, d, h, w = size
        xs = _base_coords(w, align_corners, theta.dtype).reshape(1, 1, w).expand(d, h, w)
        ys = _base_coords(h, align_corners, theta.dtype).reshape(1, h, 1).expand(d, h, w)
        zs = _base_coords(d, align_corners, theta.dtype).reshape(d, 1, 1).expand(d, h, w)
        base = api.stack([xs, ys, zs, xs.new_ones(tuple(xs.shape))], -1).reshape(1, d * h * w, 4)
        return api.matmul(base, theta.transpose(1, 2)).reshape(n, d, h, w, 3)
    raise NotImplementedError(f"affine_grid only supports 4D and 5D sizes, for 2D and 3D affine transforms, "
                              f"respectively. Got size {size}.")


def _reflect(coord, twice_low, twice_high):
    """torch's reflect_coordinates: fold coord into [twice_low / 2, twice_high / 2] by mirroring at the ends."""
    if twice_low == twice_high:
        return coord * 0.0
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    dist = (coord - low).abs()
    extra = dist.fmod(span)
    flips = (dist / span).floor().detach()
    even = flips.fmod(2) == 0
    return api.where(even, extra + low, span - extra + low)


def _source_index(coord, size, padding_mode, align_corners):
    """Pixel coordinate of a grid value in [-1, 1], with torch's padding-mode folding."""
    if align_corners:
        pix = (coord + 1) * ((size - 1) / 2)
    else:
        pix = ((coord + 1) * size - 1) / 2
    if padding_mode == "border":
        pix = pix.clamp(0.0, size - 1)
    elif padding_mode == "reflection":
        pix = _reflect(pix, 0, 2 * (size - 1)) if align_corners else _reflect(pix, -1, 2 * size - 1)
        pix = pix.clamp(0.0, size - 1)
    return pix


def grid_sample(input, grid, mode="bilinear", padding_mode="zeros", align_corners=None):
    if mode not in ("bilinear", "nearest", "bicubic"):
        raise ValueError(f"nn.functional.grid_sample(): expected mode to be 'bilinear', 'nearest' or 'bicubic', "
                         f"but got: '{mode}'")
    if padding_mode not in ("zeros", "border", "reflection"):
        raise ValueError(f"nn.functional.grid_sample(): expected padding_mode to be 'zeros', 'border', or "
                         f"'reflection', but got: '{padding_mode}'")
    if mode == "bicubic":
        raise NotImplementedError("grid_sample(mode='bicubic') is not supported (bilinear and nearest are)")
    if input.ndim == 5:
        raise NotImplementedError("grid_sample on 5-D (volumetric) input is not supported (4-D input is)")
    if input.ndim != 4 or grid.ndim != 4 or grid.shape[-1] != 2 or grid.shape[0] != input.shape[0]:
        raise RuntimeError(f"grid_sampler(): expected 4D input and grid of shape (N, H_out, W_out, 2) with the "
                           f"same batch size, but got input of size {list(input.shape)} and grid of size "
                           f"{list(grid.shape)}")
    if align_corners is None:
        warnings.warn(_ALIGN_WARNING, stacklevel=2)
        align_corners = False
    n, c, h, w = input.shape
    ho, wo = grid.shape[1], grid.shape[2]
    ix = _source_index(grid[..., 0].reshape(n, 1, ho * wo), w, padding_mode, align_corners)
    iy = _source_index(grid[..., 1].reshape(n, 1, ho * wo), h, padding_mode, align_corners)
    flat = input.reshape(n, c, h * w)

    def tap(x, y):
        """input[n, :, y, x] where (x, y) is inside, else 0: (N, C, Ho*Wo); x, y are integer-valued tensors."""
        inside = (x >= 0) & (x <= w - 1) & (y >= 0) & (y <= h - 1)
        idx = (y.clamp(0, h - 1) * w + x.clamp(0, w - 1)).to(dt.int64)
        vals = flat.gather(2, idx.expand(n, c, ho * wo))
        return api.where(inside, vals, 0.0)

    if mode == "nearest":
        # NOTE: round half to even, as torch's nearbyint. The grid's gradient is zero, but (as torch's) a tensor:
        # the where keeps the grid in the graph without touching the values
        out = tap(ix.detach().round(), iy.detach().round())
        out = api.where(ix.detach() == ix.detach(), out, ix + iy) if grid.requires_grad else out
    else:
        x0, y0 = ix.detach().floor(), iy.detach().floor()
        x1, y1 = x0 + 1, y0 + 1
        out = (tap(x0, y0) * ((x1 - ix) * (y1 - iy)) + tap(x1, y0) * ((ix - x0) * (y1 - iy))
               + tap(x0, y1) * ((x1 - ix) * (iy - y0)) + tap(x1, y1) * ((ix - x0) * (iy - y0)))
    return out.reshape(n, c, ho, wo)


# --- unpooling and pooling with indices ------------------------------------------------------------------

def _max_unpool(name, nd, input, indices, kernel_size, stride, padding, output_size):
    kernel = F._ntuple(kernel_size, nd, "kernel_size")
    stride = kernel if stride is None else F._ntuple(stride, nd, "stride")
    padding = F._ntuple(padding, nd, "padding")
    if input.ndim not in (nd + 1, nd + 2):
        raise RuntimeError(f"{name}: Expected {nd + 1}D or {nd + 2}D input, got {list(input.shape)}")
    if tuple(indices.shape) != tuple(input.shape):
        raise RuntimeError(f"Expected shape of indices to be same as that of the input tensor "
                           f"({list(input.shape)}) but got indices tensor with shape: {list(indices.shape)}")
    spatial = tuple(input.shape[-nd:])
    default = tuple((i - 1) * s - 2 * p + k for i, s, p, k in zip(spatial, stride, padding, kernel))
    if output_size is None:
        out_sizes = default
    else:
        out_sizes = tuple(int(s) for s in output_size)
        if len(out_sizes) == nd + 2 or (len(out_sizes) == nd + 1 and input.ndim == nd + 1):
            out_sizes = out_sizes[-nd:]
        if len(out_sizes) != nd:
            raise ValueError(f"output_size should be a sequence containing {nd} or {nd + 2} elements, but it has a "
                             f"length of '{len(out_sizes)}'")
        for o, d, s in zip(out_sizes, default, stride):
            if not d - s < o < d + s:
                raise ValueError(f"invalid output_size \"{list(out_sizes)}\" (dim must be between "
                                 f"{[a - b for a, b in zip(default, stride)]} and "
                                 f"{[a + b for a, b in zip(default, stride)]})")
    lead = tuple(input.shape[:-nd])
    plane = math.prod(out_sizes)
    idx = indices.reshape(lead + (-1,))
    if F._is_eager(idx) and idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= plane):
        raise RuntimeError(f"{name}: found an invalid max index {int(idx.max())} (output volume of size "
                           f"{'x'.join(str(s) for s in out_sizes)})")
    out = input.new_zeros(lead + (plane,)).scatter(input.ndim - nd, idx, input.reshape(lead + (-1,)))
    return out.reshape(lead + out_sizes)


def max_unpool1d(input, indices, kernel_size, stride=None, padding=0, output_size=None):
    return _max_unpool("max_unpool1d", 1, input, indices, kernel_size, stride, padding, output_size)


def max_unpool2d(input, indices, kernel_size, stride=None, padding=0, output_size=None):
    return _max_unpool("max_unpool2d", 2, input, indices, kernel_size, stride, padding, output_size)


def max_unpool3d(input, indices, kernel_size, stride=None, padding=0, output_size=None):
    return _max_unpool("max_unpool3d", 3, input, indices, kernel_size, stride, padding, output_size)


_adaptive_max_values = {1: F.adaptive_max_pool1d, 2: F.adaptive_max_pool2d}


def _adaptive_max_indices(name, nd, input, output_size):
    """(values, flat indices into each input plane) of adaptive max pooling: every bin gathered into one padded
    row of a table, then one max over the rows (the first maximal element wins, as torch's)."""
    if input.ndim not in (nd + 1, nd + 2):
        raise RuntimeError(f"{name}: Expected {nd + 1}D or {nd + 2}D tensor, but got input of size "
                           f"{list(input.shape)}")
    spatial = tuple(input.shape[-nd:])
    sizes = output_size if isinstance(output_size, (tuple, list)) else (output_size,) * nd
    sizes = tuple(s if o is None else int(o) for o, s in zip(sizes, spatial))
    if len(sizes) != nd or any(o <= 0 for o in sizes):
        raise RuntimeError(f"{name}: output size must be {nd} positive values, got {list(sizes)}")
    ranges = [[range((j * size) // out, -((-(j + 1) * size) // out)) for j in range(out)]
              for size, out in zip(spatial, sizes)]
    strides = [math.prod(spatial[d + 1:]) for d in range(nd)]
    rows = []
    for cell in itertools.product(*ranges):
        rows.append([sum(i * s for i, s in zip(pos, strides)) for pos in itertools.product(*cell)])
    width = max(len(r) for r in rows)
    table = factories.tensor([r + [r[0]] * (width - len(r)) for r in rows], dtype=dt.int64)  # repeat, never wins
    lead = tuple(input.shape[:-nd])
    flat = input.reshape(lead + (-1,))
    windows = flat.index_select(len(lead), table.reshape(-1)).reshape(lead + (len(rows), width))
    values, arg = windows.max(-1)
    indices = table.expand(lead + (len(rows), width)).gather(-1, arg.unsqueeze(-1)).squeeze(-1)
    return values.reshape(lead + sizes), indices.reshape(lead + sizes)


def adaptive_max_pool1d_with_indices(input, output_size, return_indices=False):
    return _adaptive_max_indices("adaptive_max_pool1d", 1, input, output_size)


def adaptive_max_pool2d_with_indices(input, output_size, return_indices=False):
    return _adaptive_max_indices("adaptive_max_pool2d", 2, input, output_size)


def adaptive_max_pool3d_with_indices(input, output_size, return_indices=False):
    return _adaptive_max_indices("adaptive_max_pool3d", 3, input, output_size)


def adaptive_max_pool1d(input, output_size, return_indices=False):
    if return_indices:
        return _adaptive_max_indices("adaptive_max_pool1d", 1, input, output_size)
    return _adaptive_max_values[1](input, output_size)


def adaptive_max_pool2d(input, output_size, return_indices=False):
    if return_indices:
        return _adaptive_max_indices("adaptive_max_pool2d", 2, input, output_size)
    return _adaptive_max_values[2](input, output_size)


def adaptive_max_pool3d(input, output_size, return_indices=False):
    if return_indices:
        return _adaptive_max_indices("adaptive_max_pool3d", 3, input, output_size)
    return F._adaptive_max("adaptive_max_pool3d", 3, input, output_size, False)


def max_pool1d_with_indices(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                            return_indices=False):
    return F.max_pool1d(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices=True)


def max_pool2d_with_indices(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                            return_indices=False):
    return F.max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices=True)


def max_pool3d_with_indices(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                            return_indices=False):
    return F.max_pool3d(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices=True)


def lp_pool3d(input, norm_type, kernel_size, stride=None, ceil_mode=False):
    kernel = F._ntuple(kernel_size, 3, "kernel_size")
    out = F.avg_pool3d(input ** norm_type, kernel, stride, 0, ceil_mode) * math.prod(kernel)
    return (out.sign() * out.abs().relu()) ** (1.0 / norm_type)


def conv_tbc(input, weight, bias, pad=0):
    """Time-batch-channel 1-D convolution: input (T, B, C_in), weight (K, C_in, C_out), bias (C_out,)."""
    if input.ndim != 3 or weight.ndim != 3 or bias.ndim != 1:
        raise RuntimeError("conv_tbc: expected a 3-D input, a 3-D weight and a 1-D bias")
    out = F.conv1d(input.permute(1, 2, 0), weight.permute(2, 1, 0), bias, padding=pad)
    return out.permute(2, 0, 1)
