"""Winograd's minimal filtering for 3x3, stride-1 convolutions: the transform matrices of F(m x m, 3 x 3) and the
numpy forwards of the six linear ops that make a convolution (runtime/ops.py registers them; nnc's winograd pass
rewrites im2col -> matmul into them).

A convolution of x (N, C, H, W), padded, with w (O, C, 3, 3) is cut into output tiles of m x m; tile p reads the
(m + 2) x (m + 2) input patch d_p and gives Y_p = A^T [sum_c (G w_oc G^T) * (B^T d_pc B)] A, so the T x T = (m+2)^2
positions of the transformed tiles are T*T independent products U[t] (O, C) @ V[t] (C, P), P the tiles:
    winograd_filter:  w (O, C, 3, 3)  -> U (T*T, O, C)        U[t] = (G w G^T)[t]
    winograd_input:   x (N, C, H, W)  -> V (T*T, C, P)        V[t] = (B^T d B)[t], tiles p = (n, tile row, column)
    winograd_output:  M (T*T, O, P)   -> Y (O, N * Ho * Wo)   A^T M_p A, cropped: convolution's product layout
and each has its adjoint (`*_backward`), which is the op's derivative: the three are linear. Tiles that reach past
the padded input read zeros, and the outputs they give past (Ho, Wo) are dropped.
A convolution with a bias takes `winograd_output_bias` instead of winograd_output, its bias add and (attr relu) a
relu after it, in the convolution's (N, O, Ho, Wo) layout: one kernel where there were three.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

TILES = (2, 4)  # the output tile sizes m built: F(2x2, 3x3) and F(4x4, 3x3)


@lru_cache(maxsize=None)
def matrices(m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(B^T (T, T), G (T, 3), A^T (m, T)) of F(m, 3) in float64, interpolating at 0, +-1, +-2 and infinity."""
    if m == 2:
        bt = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]
        g = [[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]]
        at = [[1, 1, 1, 0], [0, 1, -1, -1]]
    elif m == 4:
        bt = [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
              [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]]
        g = [[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
             [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]]
        at = [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]
    else:
        raise ValueError(f"Winograd output tiles of {m} x {m} are not built (only {TILES})")
    return np.array(bt, np.float64), np.array(g, np.float64), np.array(at, np.float64)


def tile_counts(out_sizes, m: int) -> tuple[int, int]:
    """Tiles per column and per row covering an output of (Ho, Wo)."""
    return tuple(-(-o // m) for o in out_sizes)


def output_sizes(size, padding) -> tuple[int, int]:
    """(Ho, Wo) of a 3x3, stride-1 convolution of an (H, W) input padded by ((top, bottom), (left, right))."""
    return tuple(n + lo + hi - 2 for n, (lo, hi) in zip(size, padding))


def _padded(x, padding, m):
    """x (N, C, H, W) zero-padded into the (th * m + 2, tw * m + 2) plane its tiles read, and the tile counts."""
    th, tw = tile_counts(output_sizes(x.shape[2:], padding), m)
    out = np.zeros(x.shape[:2] + (th * m + 2, tw * m + 2), x.dtype)
    (top, _), (left, _) = padding
    h, w = x.shape[2:]
    out[:, :, top:top + h, left:left + w] = x
    return out, th, tw


def _patches(xp, th, tw, m):
    """(N, C, th, tw, T, T): the overlapping input patch of every tile (a view of the padded plane xp)."""
    t = m + 2
    s = xp.strides
    return np.lib.stride_tricks.as_strided(xp, xp.shape[:2] + (th, tw, t, t), s[:2] + (s[2] * m, s[3] * m) + s[2:],
                                           writeable=False)


def _as(mat, dtype):
    return mat.astype(dtype)


def np_input(x, tile, padding):
    bt, _, _ = matrices(tile)
    xp, th, tw = _padded(x, padding, tile)
    b = _as(bt, x.dtype)
    v = np.einsum("ai,ncyxij,bj->abcnyx", b, _patches(xp, th, tw, tile), b, optimize=True)
    t = tile + 2
    return np.ascontiguousarray(v).reshape(t * t, x.shape[1], x.shape[0] * th * tw)


def np_input_backward(dv, size, tile, padding):
    bt, _, _ = matrices(tile)
    t = tile + 2
    th, tw = tile_counts(output_sizes(size, padding), tile)
    c, p = dv.shape[1:]
    n = p // (th * tw)
    b = _as(bt, dv.dtype)
    d = np.einsum("ai,abcnyx,bj->ncyxij", b, dv.reshape(t, t, c, n, th, tw), b, optimize=True)
    out = np.zeros((n, c, th * tile + 2, tw * tile + 2), dv.dtype)
    for i in range(t):  # every tile's (i, j) element, all tiles at once: strided slices never overlap within one
        for j in range(t):
            out[:, :, i:i + th * tile:tile, j:j + tw * tile:tile] += d[..., i, j]
    (top, _), (left, _) = padding
    return out[:, :, top:top + size[0], left:left + size[1]].copy()


def np_filter(w, tile):
    _, g, _ = matrices(tile)
    t = tile + 2
    gm = _as(g, w.dtype)
    u = np.einsum("ai,ocij,bj->aboc", gm, w, gm, optimize=True)
    return np.ascontiguousarray(u).reshape(t * t, w.shape[0], w.shape[1])


def np_filter_backward(du, tile):
    _, g, _ = matrices(tile)
    t = tile + 2
    gm = _as(g, du.dtype)
    return np.ascontiguousarray(np.einsum("ai,aboc,bj->ocij", gm, du.reshape((t, t) + du.shape[1:]), gm,
                                          optimize=True))


def np_output(mm, tile, size):
    _, _, at = matrices(tile)
    t = tile + 2
    th, tw = tile_counts(size, tile)
    o, p = mm.shape[1:]
    n = p // (th * tw)
    a = _as(at, mm.dtype)
    y = np.einsum("ia,abonyx,jb->onyixj", a, mm.reshape(t, t, o, n, th, tw), a, optimize=True)
    y = y.reshape(o, n, th * tile, tw * tile)[:, :, :size[0], :size[1]]
    return np.ascontiguousarray(y).reshape(o, n * size[0] * size[1])


def np_output_backward(dy, tile, size):
    _, _, at = matrices(tile)
    t = tile + 2
    th, tw = tile_counts(size, tile)
    o = dy.shape[0]
    n = dy.shape[1] // math.prod(size)
    full = np.zeros((o, n, th * tile, tw * tile), dy.dtype)
    full[:, :, :size[0], :size[1]] = dy.reshape(o, n, *size)
    a = _as(at, dy.dtype)
    dm = np.einsum("ia,onyixj,jb->abonyx", a, full.reshape(o, n, th, tile, tw, tile), a, optimize=True)
    return np.ascontiguousarray(dm).reshape(t * t, o, n * th * tw)


def np_output_bias(mm, bias, tile, size, relu):
    """(N, O, Ho, Wo): np_output(mm) + bias per output channel, then relu if asked."""
    o = mm.shape[1]
    y = np_output(mm, tile, size).reshape(o, -1, *size).transpose(1, 0, 2, 3) + bias.reshape(1, o, 1, 1)
    return np.ascontiguousarray(np.maximum(y, 0) if relu else y)
