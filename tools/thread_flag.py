"""The benchmarks' --threads N flag: set thread-count variables before numpy, torch or numba load (no heavy imports)."""
import os


def threads_from_argv(argv):
    """The N of `--threads N` / `--threads=N` in argv, or None."""
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--threads="):
            return a.split("=", 1)[1]
    return None


def apply_threads_flag(argv, variables=("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")) -> None:
    """BLAS libraries and numba read their thread counts when they load: call this before importing them."""
    threads = threads_from_argv(argv)
    if threads:
        for name in variables:
            os.environ[name] = threads
