"""CUDA window kernels (im2col, col2im, max_pool, max_pool_backward; ops whose `OpDef.kernel_kind` is "window"):
one thread per output element in a grid-stride loop, with the geometry (kernel, stride, padding, dilation, sizes)
baked in as constants, as on the CPU (nnc.codegen.cpu_conv).

The CPU's scatters become gathers, so no two threads write one element and no atomics are needed: col2im sums, per
image element, the column entries of the windows that cover it, and max_pool_backward sums, per input element, the
gradients of the windows whose maximum it is (each window's maximum found again with the CPU's rule: the first
greatest element, or the last nan). Both add in the CPU's order (kernel offsets ascending, windows in row-major
order), so the sums are the CPU's to the bit. Padding is never materialised.
"""
from __future__ import annotations

import math

from .cpu_conv import _geometry
from .cpu_elementwise import indent
from .cuda_elementwise import CudaFunction, CudaKernelBuilder, elementwise_launch
from .scalar import node_dtype


def _digits(flat: str, sizes, names) -> list[str]:
    """Lines splitting `flat` into row-major digits `names` over `sizes` (the leading digit needs no modulo)."""
    lines = []
    for d, (name, size) in enumerate(zip(names, sizes)):
        inner = math.prod(sizes[d + 1:])
        digit = flat if inner == 1 else f"{flat} // {inner}"
        lines.append(f"{name} = {digit}" if d == 0 else f"{name} = ({digit}) % {size}" if inner != 1 else
                     f"{name} = {flat} % {size}")
    return lines


def _flat(names, sizes) -> str:
    """The row-major flat index of digits `names` over `sizes`."""
    terms = [name if math.prod(sizes[d + 1:]) == 1 else f"{name} * {math.prod(sizes[d + 1:])}"
             for d, name in enumerate(names)]
    return " + ".join(terms)


class _Window:
    """The constants of one window op: sizes of the input plane, output positions, kernel and its attributes."""

    def __init__(self, kb: CudaKernelBuilder):
        self.node, self.op, attrs, in_shape, out_sizes = _geometry(kb.kernel)
        self.n, self.c = in_shape[0], in_shape[1]
        self.in_sizes, self.out_sizes = tuple(in_shape[2:]), tuple(out_sizes)
        self.kernel = tuple(attrs["kernel"])
        self.stride, self.dilation = tuple(attrs["stride"]), tuple(attrs["dilation"])
        self.low = tuple(lo for lo, _ in attrs["padding"])
        self.nd = len(self.kernel)
        self.plane, self.positions, self.k = (math.prod(self.in_sizes), math.prod(self.out_sizes),
                                             math.prod(self.kernel))
        self.zero = kb.dialect.literal(0, node_dtype(self.node))

    def input_at(self, d: int, o: str, k: str) -> str:
        """The input index along dim d of window position o's kernel offset k."""
        return f"{o} * {self.stride[d]} + {k} * {self.dilation[d]} - {self.low[d]}"

    def window_of(self, d: int, i: str, k: str, name: str) -> list[str]:
        """Lines (inside a loop over k) setting `name` to the window position along dim d whose offset k reads
        input index i, or skipping k (`continue`) when none does."""
        s = self.stride[d]
        lines = [f"t{d} = {i} + {self.low[d]} - {k} * {self.dilation[d]}"]
        if s == 1:
            return lines + [f"if t{d} < 0 or t{d} >= {self.out_sizes[d]}:", "    continue", f"{name} = t{d}"]
        return lines + [f"if t{d} < 0 or t{d} % {s} != 0 or t{d} // {s} >= {self.out_sizes[d]}:", "    continue",
                        f"{name} = t{d} // {s}"]

    def maximum_of_window(self, x: str, base: str, o) -> list[str]:
        """Lines finding window o's maximum in x (plane at `base`): `best` and its plane index `arg`; the first
        greatest element wins, and a nan wins over anything before it (the CPU's and torch's rule)."""
        lines = ["found = 0", f"best = {x}[{base}]", "arg = 0"]
        body = []
        for d in range(self.nd):
            body += indent([f"for m{d} in range({self.kernel[d]}):", f"    i{d} = {self.input_at(d, o[d], f'm{d}')}",
                            f"    if not (0 <= i{d} < {self.in_sizes[d]}):", "        continue"], d)
        src = _flat([f"i{d}" for d in range(self.nd)], self.in_sizes)
        body += indent([f"v = {x}[{base} + {src}]", "if found == 0 or v > best or v != v:", "    best = v",
                        f"    arg = {src}", "    found = 1"], self.nd)
        return lines + body


def gen_window(kb: CudaKernelBuilder) -> None:
    """A window kernel: one thread per output element (see the module docstring)."""
    w = _Window(kb)
    gen = {"im2col": _im2col, "col2im": _col2im, "max_pool": _max_pool, "max_pool_backward": _max_pool_backward}
    total, body = gen[w.op](w)
    lines = [f"for q in range(cuda.grid(1), {total}, cuda.gridsize(1)):"] + indent(body)
    f = CudaFunction(kb.name, kb.ins + kb.outs, lines, elementwise_launch(total))
    kb.functions.append(f)
    kb.launch = [f.launch_line()]


def _im2col(w: _Window):
    """in0 (N, C, *S) -> out0 (C*K, N*L): out0[c*K + kk, n*L + pos] = the input under offset kk of window pos."""
    nl = w.n * w.positions
    os_, ks = [f"o{d}" for d in range(w.nd)], [f"k{d}" for d in range(w.nd)]
    lines = [f"pos = q % {w.positions}", f"n = (q // {w.positions}) % {w.n}", f"ck = q // {nl}",
             f"kk = ck % {w.k}", f"c = ck // {w.k}"]
    lines += _digits("kk", w.kernel, ks) + _digits("pos", w.out_sizes, os_)
    lines += [f"i{d} = {w.input_at(d, os_[d], ks[d])}" for d in range(w.nd)]
    inside = " and ".join(f"0 <= i{d} < {w.in_sizes[d]}" for d in range(w.nd))
    src = _flat([f"i{d}" for d in range(w.nd)], w.in_sizes)
    lines += [f"if {inside}:", f"    out0[q] = in0[(n * {w.c} + c) * {w.plane} + {src}]", "else:",
              f"    out0[q] = {w.zero}"]
    return w.c * w.k * nl, lines


def _col2im(w: _Window):
    """in0 (C*K, N*L) -> out0 (N, C, *S): each image element sums the column entries of the windows covering it."""
    nl = w.n * w.positions
    lines = [f"j = q % {w.plane}", f"c = (q // {w.plane}) % {w.c}", f"n = q // {w.plane * w.c}"]
    lines += _digits("j", w.in_sizes, [f"a{d}" for d in range(w.nd)]) + [f"acc = {w.zero}"]
    inner = []
    for d in range(w.nd):
        inner += indent([f"for k{d} in range({w.kernel[d]}):"]
                        + indent(w.window_of(d, f"a{d}", f"k{d}", f"o{d}")), d)
    kk = _flat([f"k{d}" for d in range(w.nd)], w.kernel)
    pos = _flat([f"o{d}" for d in range(w.nd)], w.out_sizes)
    inner += indent([f"acc += in0[(c * {w.k} + {kk}) * {nl} + n * {w.positions} + {pos}]"], w.nd)
    return w.n * w.c * w.plane, lines + inner + ["out0[q] = acc"]


def _max_pool(w: _Window):
    """in0 (N, C, *S) -> out0 (N, C, *O): each output element is its window's maximum."""
    os_ = [f"o{d}" for d in range(w.nd)]
    lines = [f"pos = q % {w.positions}", f"base = (q // {w.positions}) * {w.plane}"]
    lines += _digits("pos", w.out_sizes, os_) + w.maximum_of_window("in0", "base", os_) + ["out0[q] = best"]
    return w.n * w.c * w.positions, lines


def _max_pool_backward(w: _Window):
    """in0 g (N, C, *O), in1 x (N, C, *S) -> out0 (N, C, *S): each input element sums the gradients of the windows
    whose maximum it is, windows in row-major order (kernel offsets descending)."""
    os_ = [f"o{d}" for d in range(w.nd)]
    lines = [f"j = q % {w.plane}", f"plane = q // {w.plane}", f"base = plane * {w.plane}",
             f"gbase = plane * {w.positions}"]
    lines += _digits("j", w.in_sizes, [f"a{d}" for d in range(w.nd)]) + [f"acc = {w.zero}"]
    inner = []
    for d in range(w.nd):
        inner += indent([f"for k{d} in range({w.kernel[d] - 1}, -1, -1):"]
                        + indent(w.window_of(d, f"a{d}", f"k{d}", f"o{d}")), d)
    pos = _flat(os_, w.out_sizes)
    inner += indent(w.maximum_of_window("in1", "base", os_) + ["if arg == j:", f"    acc += in0[gbase + {pos}]"],
                    w.nd)
    return w.n * w.c * w.plane, lines + inner + ["out0[q] = acc"]
