"""Pure-numpy tensor repr that reproduces torch's default tensor printing."""
import math

import numpy as np

PRECISION = 4
THRESHOLD = 1000
EDGEITEMS = 3
LINEWIDTH = 80
PREFIX = "tensor("


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
        self.sci_mode = hi / lo > 1000.0 or hi > 1.0e8 or lo < 1.0e-4
        if self.sci_mode:
            widths = [len(f"{v:.{PRECISION}e}") for v in vals]
        elif self.int_mode:
            widths = [len(f"{v:.0f}") + 1 for v in vals]  # +1 for the trailing '.'
        else:
            widths = [len(f"{v:.{PRECISION}f}") for v in vals]
        self.max_width = max(self.max_width, *widths)

    def format(self, v):
        if not self.floating:
            s = str(v)
        elif self.sci_mode:
            s = f"{v:.{PRECISION}e}"
        elif self.int_mode:
            s = f"{v:.0f}" + ("" if math.isinf(v) or math.isnan(v) else ".")
        else:
            s = f"{v:.{PRECISION}f}"
        return s.rjust(self.max_width)


def _summarized(data):
    """Keep only the edge items along every axis (what the formatter measures)."""
    for axis, n in enumerate(data.shape):
        if n > 2 * EDGEITEMS:
            keep = list(range(EDGEITEMS)) + list(range(n - EDGEITEMS, n))
            data = np.take(data, keep, axis=axis)
    return data


def _vector_str(row, indent, summarize, fmt):
    per_line = max(1, (LINEWIDTH - indent) // (fmt.max_width + 2))
    if summarize and row.shape[0] > 2 * EDGEITEMS:
        items = [fmt.format(v) for v in row[:EDGEITEMS].tolist()] + [" ..."]
        items += [fmt.format(v) for v in row[-EDGEITEMS:].tolist()]
    else:
        items = [fmt.format(v) for v in row.tolist()]
    lines = [", ".join(items[i:i + per_line]) for i in range(0, len(items), per_line)]
    return "[" + (",\n" + " " * (indent + 1)).join(lines) + "]"


def _nested_str(data, indent, summarize, fmt):
    if data.ndim == 0:
        return fmt.format(data.item())
    if data.ndim == 1:
        return _vector_str(data, indent, summarize, fmt)
    n = data.shape[0]
    if summarize and n > 2 * EDGEITEMS:
        rows = list(range(EDGEITEMS)) + [None] + list(range(n - EDGEITEMS, n))
    else:
        rows = list(range(n))
    parts = ["..." if i is None else _nested_str(data[i], indent + 1, summarize, fmt)
             for i in rows]
    return "[" + ("," + "\n" * (data.ndim - 1) + " " * (indent + 1)).join(parts) + "]"


def _body_str(data, indent):
    summarize = data.size > THRESHOLD
    fmt = _Formatter(_summarized(data) if summarize else data)
    return _nested_str(data, indent, summarize, fmt)


def _add_suffixes(text, suffixes, indent):
    out = [text]
    # NOTE: torch counts 2 more than the last line's real length; kept to match its wrapping.
    last_len = len(text) - text.rfind("\n") + 1
    for suffix in suffixes:
        if last_len + len(suffix) + 2 > LINEWIDTH:
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
        if not is_default_dtype:
            extra.append(f"dtype={dtype_name}")
        body = _body_str(data, len(PREFIX))
    return _add_suffixes(PREFIX + body, extra + list(suffixes), len(PREFIX))
