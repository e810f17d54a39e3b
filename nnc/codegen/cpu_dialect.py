"""The numba CPU dialect: how CPU kernels spell template functions (numpy scalar ufuncs, approx.py's
transcendentals), literals and casts."""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from . import approx, philox
from .scalar import Dialect, Unsupported


class CpuDialect(Dialect):
    """numba CPU: numpy scalar ufuncs (numpy's nan semantics), approx.py for transcendentals."""

    # numba types numpy's scalar ufuncs and approx.py's functions on a float32 as float32 (math.floor would be int)
    FLOAT_PRESERVING = frozenset({"sqrt", "sin", "cos", "floor", "abs", "sign", "max", "min", "clamp", "exp", "log",
                                  "log1p", "tanh", "sigmoid", "erf"})
    NUMPY = {"sqrt": "np.sqrt", "sin": "np.sin", "cos": "np.cos", "floor": "np.floor", "abs": "np.abs",
             "sign": "np.sign", "max": "np.maximum", "min": "np.minimum"}

    def __init__(self):
        self._approx: set[str] = set()  # the approx.py functions the calls so far use (exp_f32, erf_f64, ...)
        self._philox: set[str] = set()  # the philox.py helpers they use (philox_uniform_f32, ...)
        self.approx_digest: str | None = None
        self.nowait = False  # a product calls nnc.codegen.nowait.gemv (the batch-1 linear with the helper thread)
        self.nowait_rows = False  # a product calls nnc.codegen.nowait.batched_rows (Winograd's products)
        self.streaming = False  # a loop stores its outputs through nnc.codegen.streaming's stages

    def call(self, name, args, attrs, compute):
        if name in self.NUMPY:
            return f"{self.NUMPY[name]}({', '.join(args)})"
        if name in approx.APPROX:  # exp, log, tanh, ...: vectorizable approximations
            if compute.kind != "f":
                raise Unsupported(f"{name} needs a floating-point compute dtype, got {compute}")
            helper = approx.approx_name(name, compute)
            self._approx.add(helper)
            return f"{helper}({', '.join(args)})"
        if name in philox.HELPERS:  # (seed, element index): random draws, the stream an attribute
            helper = philox.helper_name(name, compute)
            self._philox.add(helper)
            return f"{helper}({args[0]}, {args[1]}, {int(attrs['stream'])})"
        if name == "clamp":
            if len(args) != 1:
                raise Unsupported("clamp takes one operand (min/max are attributes)")
            expr = args[0]
            low, high = attrs.get("min"), attrs.get("max")
            if low is not None:
                expr = f"np.maximum({expr}, {self.literal(low, compute)})"
            if high is not None:
                expr = f"np.minimum({expr}, {self.literal(high, compute)})"
            return expr
        if name.startswith("__cast_"):
            return self.cast(args[0], np.dtype(name[len("__cast_"):]))
        raise Unsupported(f"template function {name!r} has no CPU code generator helper")

    def preamble(self):
        lines = []
        # NOTE: numba's cache does not notice when a called function changes, so approx.py's hash is part of the
        # source (and so of the file name): editing approx.py gives new kernel files, never stale code.
        if self._approx:
            self.approx_digest = file_digest(approx.__file__)
            lines.append(f"from nnc.codegen.approx import {', '.join(sorted(self._approx))}")
        if self._philox:  # the same for the Philox helpers and the runtime functions they compile
            digest = file_digest(philox.__file__) + file_digest(philox._philox.__file__)
            lines.append(f"from nnc.codegen.philox import {', '.join(sorted(self._philox))}  # {digest}")
        if self.nowait:  # the same for the helper thread's product (its module holds all of that code)
            from . import nowait

            lines.append(f"from nnc.codegen.nowait import gemv as nowait_gemv  # {file_digest(nowait.__file__)}")
        if self.nowait_rows:  # the same for the batched products' code (nowait's and rows_kernel's)
            from . import nowait, rows_kernel

            digest = file_digest(nowait.__file__) + file_digest(rows_kernel.__file__)
            lines.append(f"from nnc.codegen.nowait import batched_rows as nowait_rows  # {digest}")
        if self.streaming:
            from . import streaming

            digest = file_digest(streaming.__file__)
            lines.append(f"from nnc.codegen.streaming import stack_row, stream_row  # {digest}")
        return lines


def file_digest(path) -> str:
    """A short hash of a file's bytes (generated sources name the helper modules they call by it)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
