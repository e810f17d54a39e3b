"""Pure-numpy tensor repr that reproduces torch's tensor printing, under the options `set_printoptions` sets."""
import math
from dataclasses import dataclass

import numpy as np

from .dtypes import get_default_dtype

PREFIX = "tensor("


@dataclass
class PrintOptions:
    """What torch.set_printoptions sets: digits after the point, the element count above which a tensor prints
    summarized, the items kept at each end of a summarized dimension, the line width, and scientific notation
    (None: chosen from the values)."""

    precision: int = 4
    threshold: float = 1000
    edgeitems: int = 3
    linewidth: int = 80
    sci_mode: bool | None = None


PRINT_OPTS = PrintOptions()
_PROFILES = {"default": PrintOptions(), "short": PrintOptions(precision=2, edgeitems=2),
             "full": PrintOptions(threshold=math.inf)}


def set_printoptions(precision=None, threshold=None, edgeitems=None, linewidth=None, profile=None, sci_mode=None):
    """torch.set_printoptions: `profile` ("default", "short" or "full") first sets all four counts, then each given
    option overrides its own; `sci_mode` is always set (None: chosen from the values, as by default)."""
    if profile is not None:
        if profile not in _PROFILES:
            raise ValueError(f"set_printoptions: profile must be one of {', '.join(_PROFILES)}, got {profile!r}")
        chosen = _PROFILES[profile]
        PRINT_OPTS.precision, PRINT_OPTS.threshold = chosen.precision, chosen.threshold
        PRINT_OPTS.edgeitems, PRINT_OPTS.linewidth = chosen.edgeitems, chosen.linewidth
    for name, value in (("precision", precision), ("threshold", threshold), ("edgeitems", edgeitems),
                        ("linewidth", linewidth)):
        if value is not None:
            setattr(PRINT_OPTS, name, value)
    PRINT_OPTS.sci_mode = sci_mode


class _Formatter:
    """Chooses int/fixed/scientific mode and a common width for all elements."""

    def __init__(self, data):
        self.floating = data.dtype.kind == "f"
        self.int_mode = True
        self.sci_mode = False
        self.max_width = 1
        flat = data.reshape(-1)
        if not self.floating:
            self.max_width = max([1] + [len(str(v)) for v in flat.tolist()])
            return
        # NOTE: torch upcasts to double for the statistics; float16 would overflow.
        vals = flat[np.isfinite(flat) & (flat != 0)].astype(np.float64).tolist()
        if not vals:
            return
        lo, hi = min(map(abs, vals)), max(map(abs, vals))
        self.int_mode = all(v == math.ceil(v) for v in vals)
        self.sci_mode = hi / lo > 1000.0 or hi > 1.0e8 or lo < 1.0e-4 if PRINT_OPTS.sci_mode is None \
            else PRINT_OPTS.sci_mode
        precision = PRINT_OPTS.precision
        if self.sci_mode:
            widths = [len(f"{v:.{precision}e}") for v in vals]
        elif self.int_mode:
            widths = [len(f"{v:.0f}") + 1 for v in vals]  # +1 for the trailing '.'
        else:
            widths = [len(f"{v:.{precision}f}") for v in vals]
        self.max_width = max(self.max_width, *widths)

    def format(self, v):
        if not self.floating:
            s = str(v)
        elif self.sci_mode:
            s = f"{v:.{PRINT_OPTS.precision}e}"
        elif self.int_mode:
            s = f"{v:.0f}" + ("" if math.isinf(v) or math.isnan(v) else ".")
        else:
            s = f"{v:.{PRINT_OPTS.precision}f}"
        return s.rjust(self.max_width)


class _ComplexFormatter:
    """Formats complex elements as torch does: real and imaginary parts through a _Formatter each, joined by a sign."""

    def __init__(self, data):
        self.real, self.imag = _Formatter(data.real), _Formatter(data.imag)
        # NOTE: torch wraps lines by both parts' widths plus the 'j'; the joining '+' is not counted.
        self.max_width = self.real.max_width + self.imag.max_width + 1

    def format(self, v):
        """'1.+2.j': the imaginary part drops its padding and gets a '+' unless it carries its own sign."""
        imag = (self.imag.format(v.imag) + "j").lstrip()
        return self.real.format(v.real) + ("" if imag[0] in "+-" else "+") + imag


def _summarized(data):
    """Keep only the edge items along every axis (what the formatter measures)."""
    edge = PRINT_OPTS.edgeitems
    for axis, n in enumerate(data.shape):
        if n > 2 * edge:
            keep = list(range(edge)) + list(range(n - edge, n))
            data = np.take(data, keep, axis=axis)
    return data


def _vector_str(row, indent, summarize, fmt):
    per_line = max(1, (PRINT_OPTS.linewidth - indent) // (fmt.max_width + 2))
    edge = PRINT_OPTS.edgeitems
    if summarize and not edge:  # NOTE: row[-0:] would be the whole row; torch shows the ellipsis alone
        items = ["..."]
    elif summarize and row.shape[0] > 2 * edge:
        items = [fmt.format(v) for v in row[:edge].tolist()] + [" ..."]
        items += [fmt.format(v) for v in row[-edge:].tolist()]
    else:
        items = [fmt.format(v) for v in row.tolist()]
    lines = [", ".join(items[i:i + per_line]) for i in range(0, len(items), per_line)]
    return "[" + (",\n" + " " * (indent + 1)).join(lines) + "]"


def _nested_str(data, indent, summarize, fmt):
    if data.ndim == 0:
        return fmt.format(data.item())
    if data.ndim == 1:
        return _vector_str(data, indent, summarize, fmt)
    n, edge = data.shape[0], PRINT_OPTS.edgeitems
    if summarize and n > 2 * edge:
        rows = list(range(edge)) + [None] + list(range(n - edge, n))
    else:
        rows = list(range(n))
    parts = ["..." if i is None else _nested_str(data[i], indent + 1, summarize, fmt)
             for i in rows]
    return "[" + ("," + "\n" * (data.ndim - 1) + " " * (indent + 1)).join(parts) + "]"


def _body_str(data, indent):
    summarize = data.size > PRINT_OPTS.threshold
    shown = _summarized(data) if summarize else data
    fmt = _ComplexFormatter(shown) if data.dtype.kind == "c" else _Formatter(shown)
    return _nested_str(data, indent, summarize, fmt)


def _is_default_complex(np_dtype):
    """Whether a complex dtype is the default complex one (complex128 under a float64 default, else complex64)."""
    return np_dtype == get_default_dtype().to_complex().np


def _add_suffixes(text, suffixes, indent):
    out = [text]
    # NOTE: torch counts 2 more than the last line's real length; kept to match its wrapping.
    last_len = len(text) - text.rfind("\n") + 1
    for suffix in suffixes:
        if last_len + len(suffix) + 2 > PRINT_OPTS.linewidth:
            out.append(",\n" + " " * indent + suffix)
            last_len = indent + len(suffix)
        else:
            out.append(", " + suffix)
            last_len += len(suffix) + 2
    return "".join(out) + ")"


def format_tensor(data: "np.ndarray", dtype_name: str, is_default_dtype: bool,
                  suffixes: list[str], device: list[str] = ()) -> str:
    """Return the repr, e.g. 'tensor([1., 2.], requires_grad=True)'; `device` (["device='cuda:0'"]) comes first
    among the suffixes, as in torch."""
    data = np.asarray(data)
    if data.dtype.name == "bfloat16":  # ml_dtypes' type: printed from its exact float32 values
        data = data.astype(np.float32)
    if data.dtype.kind == "c":  # torch leaves the default complex dtype unnamed, as it does the default float one
        is_default_dtype = is_default_dtype or _is_default_complex(data.dtype)
    extra = list(device)
    if data.size == 0:
        if data.ndim != 1:
            extra.append(f"size={tuple(int(d) for d in data.shape)}")
        # NOTE: an empty tensor has no values revealing its dtype, so torch prints
        # every dtype except the default float one (int64 and bool included).
        if not (is_default_dtype and data.dtype.kind == "f"):
            extra.append(f"dtype={dtype_name}")
        body = "[]"
    else:
        if not PRINT_OPTS.edgeitems:  # torch names the shape whenever no edge items could show it
            extra.append(f"size={tuple(int(d) for d in data.shape)}")
        if not is_default_dtype:
            extra.append(f"dtype={dtype_name}")
        body = _body_str(data, len(PREFIX))
    return _add_suffixes(PREFIX + body, extra + list(suffixes), len(PREFIX))
