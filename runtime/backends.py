"""runtime.backends: the flags training scripts set on torch.backends, kept as settable attributes with torch's
defaults. They change nothing here (runtime computes on the CPU with numpy, in full precision: no TF32, no cuDNN);
the queries answer for this machine: no CUDA, cuDNN or MPS."""
from __future__ import annotations

import sys


class _Flags:
    """Attributes scripts read and assign; documented as having no effect in runtime."""

    def __init__(self, name: str, **defaults):
        self.__dict__["_name"] = name
        self.__dict__.update(defaults)

    def __setattr__(self, key, value):
        if key not in self.__dict__:
            raise AttributeError(f"torch.backends.{self._name} has no flag {key!r}")
        self.__dict__[key] = value

    def __repr__(self) -> str:
        flags = ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items() if not k.startswith("_"))
        return f"<runtime.backends.{self._name}: {flags}>"


class _Backend(_Flags):
    def is_available(self) -> bool:
        return False

    def is_built(self) -> bool:
        return False


class _Cudnn(_Backend):
    def version(self):
        return None


cuda = _Backend("cuda", matmul=_Flags("cuda.matmul", allow_tf32=False, allow_fp16_reduced_precision_reduction=True,
                                      allow_bf16_reduced_precision_reduction=True,
                                      fp32_precision="ieee"))
cudnn = _Cudnn("cudnn", enabled=True, benchmark=False, deterministic=False, allow_tf32=True, benchmark_limit=10)
mps = _Backend("mps")
mkldnn = _Backend("mkldnn", enabled=True)
openmp = _Backend("openmp")
mkl = _Backend("mkl")

# NOTE: scripts import these as modules (`import torch.backends.cudnn as cudnn`): the import system finds them in
# sys.modules, the same objects as the attributes
for _name in ("cuda", "cudnn", "mps", "mkldnn", "openmp", "mkl"):
    sys.modules[f"{__name__}.{_name}"] = globals()[_name]
del _name


# torch's process-wide settings of the same kind: remembered and reported, changing nothing (float32 matmuls are
# always computed in float32, and runtime's kernels give the same bits on every run of the same program)
_MATMUL_PRECISIONS = ("highest", "high", "medium")
_settings = {"float32_matmul_precision": "highest", "deterministic": False, "deterministic_warn_only": False}


def set_float32_matmul_precision(precision: str) -> None:
    """torch.set_float32_matmul_precision: 'highest', 'high' or 'medium'; anything else warns and is ignored."""
    if precision not in _MATMUL_PRECISIONS:
        import warnings

        warnings.warn(f"{precision} is not one of 'highest', 'high', or 'medium'; the current "
                      "set_float32_matmul_precision call has no effect.", UserWarning, stacklevel=2)
        return
    _settings["float32_matmul_precision"] = precision


def get_float32_matmul_precision() -> str:
    return _settings["float32_matmul_precision"]


def use_deterministic_algorithms(mode: bool, *, warn_only: bool = False) -> None:
    """torch.use_deterministic_algorithms: every runtime op is deterministic already, so this only records it."""
    if not isinstance(mode, bool) or not isinstance(warn_only, bool):
        raise TypeError(f"use_deterministic_algorithms expects bools, got mode={mode!r}, warn_only={warn_only!r}")
    _settings["deterministic"] = mode
    _settings["deterministic_warn_only"] = warn_only


def are_deterministic_algorithms_enabled() -> bool:
    return _settings["deterministic"]


def is_deterministic_algorithms_warn_only_enabled() -> bool:
    return _settings["deterministic_warn_only"]
