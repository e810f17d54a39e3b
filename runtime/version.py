"""torch.version for runtime: its version, and the CUDA version its CUDA backend runs on (None without one)."""
from __future__ import annotations

__version__ = "0.1.0"
debug = False
git_version = "unknown"  # runtime is not built from a recorded commit, as torch's wheels are
hip = None
rocm = None
xpu = None


def __getattr__(name: str):
    # NOTE: looked up on use: finding the CUDA runtime imports numba-cuda, which `import runtime` should not pay for
    if name == "cuda":
        return _cuda_version()
    raise AttributeError(f"module 'runtime.version' has no attribute {name!r}")


def _cuda_version() -> str | None:
    """The CUDA runtime's "major.minor" when runtime's CUDA backend has a GPU, else None (torch's CPU builds)."""
    from . import cuda

    if not cuda.is_available():
        return None
    try:
        from numba.cuda import runtime as cuda_runtime

        major, minor = cuda_runtime.get_version()
    except Exception:  # noqa: BLE001 - numba's simulator and odd installs have no runtime version to report
        return None
    return f"{major}.{minor}"
