"""On-disk kernel cache: generated source saved as a real .py file named by its content hash, then imported.

A kernel's source is written once to `cache_dir()/k_<sha256>.py` (never rewritten: numba's on-disk cache keys on
the file's path and modification time, so rewriting it would throw away the compiled code) and imported with
importlib. The module's `numba.njit(cache=True)` functions then keep their compiled machine code in
`cache_dir()/__pycache__`, so a second process that generates the same source imports the same file and loads the
kernel instead of compiling it.

The directory is `$NNC_CACHE_DIR` when set, else `~/.cache/nnc/kernels`. Deleting it is always safe.

This process keeps the most recently used `$NNC_KERNEL_MODULES` imported modules (default 128). An older one is
dropped from the memo and sys.modules: plans that run it keep it alive, and once none does it can be freed;
generating its source again imports it from the disk cache (no numba compile). Measured on 60 small MLPs compiled
one after another and dropped: 640 MiB of growth unbounded, 228 MiB with a limit of 16; the rest is what numba
itself keeps for each function it compiles (functions a jitted caller linked stay referenced from numba's state).
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import sys
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path
from types import ModuleType

ENV_VAR = "NNC_CACHE_DIR"
DEFAULT_DIR = Path("~/.cache/nnc/kernels")

MODULES_ENV_VAR = "NNC_KERNEL_MODULES"
DEFAULT_MODULES = 128

_modules: OrderedDict[tuple[str, str], ModuleType] = OrderedDict()  # (directory, digest) -> module, LRU order
_lock = threading.Lock()


def module_limit() -> int:
    """How many imported kernel modules this process keeps ($NNC_KERNEL_MODULES, default 128, at least 1)."""
    try:
        return max(1, int(os.environ.get(MODULES_ENV_VAR, DEFAULT_MODULES)))
    except ValueError:
        return DEFAULT_MODULES


def cache_dir() -> Path:
    """The kernel cache directory (created if missing); read from the environment on every call."""
    configured = os.environ.get(ENV_VAR)
    path = Path(configured).expanduser() if configured else DEFAULT_DIR.expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def digest(source: str) -> str:
    """The content hash that names a kernel's file."""
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


def module_name(source: str) -> str:
    return f"nnc_kernel_{digest(source)[:32]}"


def source_path(source: str) -> Path:
    """Where `source` lives in the cache (whether or not it has been written yet)."""
    return cache_dir() / f"k_{digest(source)[:32]}.py"


def write_source(source: str) -> Path:
    """Write `source` to its content-addressed file unless it is already there; returns the path.

    The write is atomic (a temporary file renamed into place), so concurrent processes never see half a file, and
    an existing file is left untouched so that its modification time (part of numba's cache key) stays the same.
    """
    path = source_path(source)
    if path.exists():
        try:
            if path.read_text(encoding="utf-8") == source:
                return path
        except OSError:
            pass
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(source)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def load_module(source: str) -> tuple[ModuleType, Path, bool]:
    """Import the module for `source` from the cache; returns (module, path, already_loaded_in_this_process)."""
    key = (str(cache_dir()), digest(source))
    with _lock:
        module = _modules.get(key)
        if module is not None:
            _modules.move_to_end(key)
            sys.modules.setdefault(module.__name__, module)
            return module, Path(module.__file__), True
        path = write_source(source)
        name = module_name(source)
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import the generated kernel module {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # numba's cache and pickling look modules up by name
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        _modules[key] = module
        _evict(module_limit())
        return module, path, False


def _evict(limit: int) -> None:
    """Forget the least recently used modules beyond `limit` (callers hold _lock)."""
    while len(_modules) > limit:
        _, old = _modules.popitem(last=False)
        if sys.modules.get(old.__name__) is old:
            del sys.modules[old.__name__]


def loaded() -> int:
    """How many kernel modules this process keeps imported."""
    return len(_modules)


def forget() -> None:
    """Drop this process's memo of imported kernel modules (the files and numba's cache stay on disk)."""
    with _lock:
        for module in _modules.values():
            sys.modules.pop(module.__name__, None)
        _modules.clear()

