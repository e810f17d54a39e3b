"""On-disk kernel cache: generated source saved as a real .py file named by its content hash, run from that text.

A kernel's source is written once to `cache_dir()/k_<sha256>.py` (never rewritten: numba's on-disk cache is found
from the file's path and checked against its contents, so a stable file keeps the compiled code valid) and run as a
module from the text this process generated. The module's `numba.njit(cache=True)` functions then keep their
compiled machine code in `cache_dir()/__pycache__`, so a second process that generates the same source loads the
kernel instead of compiling it.

The directory is `$NNC_CACHE_DIR` when set, else `~/.cache/nnc/kernels`. Deleting it is always safe.

Trust (docs/security.md, "The kernel cache"): nothing in the directory runs unless this user could have written it.
- `cache_dir()` creates missing directories with mode 0700 and refuses, with a KernelCacheWarning, a directory that
  another user could write to: one not owned by this user, writable by group or others, or below a directory where
  someone other than this user and root could replace it. This process then uses a private temporary directory.
- A module runs from the source text this process generated (compile + exec): Python never reads or writes a .pyc
  in the cache, so a planted `__pycache__/k_*.pyc` is never loaded.
- numba unpickles its index (.nbi) and objects (.nbc): they are trusted because they live in the checked directory.
  A function whose cache numba puts elsewhere (`$NUMBA_CACHE_DIR`) keeps it only where the same check passes, and
  otherwise compiles in memory.

Processes that share the directory (DDP ranks on one machine, separate runs) compile a module once: `compiling(path)`
holds an advisory lock on the module's source while numba compiles it, and a second process waits for it, then
loads the result from numba's disk cache.

This process keeps the most recently used `$NNC_KERNEL_MODULES` imported modules (default 128). An older one is
dropped from the memo and sys.modules: plans that run it keep it alive, and once none does it can be freed;
generating its source again imports it from the disk cache (no numba compile). Measured on 60 small MLPs compiled
one after another and dropped: 640 MiB of growth unbounded, 228 MiB with a limit of 16; the rest is what numba
itself keeps for each function it compiles (functions a jitted caller linked stay referenced from numba's state).
"""
from __future__ import annotations

import atexit
import contextlib
import hashlib
import importlib.abc
import importlib.util
import os
import shutil
import stat
import sys
import tempfile
import threading
import time
import warnings
from collections import OrderedDict
from pathlib import Path
from types import ModuleType

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; processes may then compile a module twice
    fcntl = None

ENV_VAR = "NNC_CACHE_DIR"
DEFAULT_DIR = Path("~/.cache/nnc/kernels")

MODULES_ENV_VAR = "NNC_KERNEL_MODULES"
DEFAULT_MODULES = 128

_modules: OrderedDict[tuple[str, str], ModuleType] = OrderedDict()  # (directory, digest) -> module, LRU order
# NOTE: reentrant: running a kernel's module imports its libraries, which loads them while the kernel's load holds it
_lock = threading.RLock()
_sources: dict[str, str] = {}  # module name -> source, for what this process loaded or registered (library)

_PYCACHE = "__pycache__"  # numba's in-tree cache directory next to the sources
_dir_lock = threading.Lock()
_fallback: Path | None = None  # this process's private directory when the configured one is refused
_warned: set[tuple[str, str]] = set()


class KernelCacheWarning(UserWarning):
    """A kernel cache directory other users could write to is not used (see docs/security.md)."""


class _Untrusted(Exception):
    """Why a directory is not private to this user (the message names the path and what is wrong)."""


def module_limit() -> int:
    """How many imported kernel modules this process keeps ($NNC_KERNEL_MODULES, default 128, at least 1)."""
    try:
        return max(1, int(os.environ.get(MODULES_ENV_VAR, DEFAULT_MODULES)))
    except ValueError:
        return DEFAULT_MODULES


def cache_dir() -> Path:
    """The kernel cache directory, created if missing and checked to be private to this user on every call.

    Read from the environment on every call. A directory another user could write to is refused with a
    KernelCacheWarning (once per directory and reason) and this process's private temporary directory is returned
    instead, so compiling still works (nothing is kept for the next process)."""
    configured = os.environ.get(ENV_VAR)
    path = Path(configured).expanduser() if configured else DEFAULT_DIR.expanduser()
    try:
        return _private_dir(path)
    except _Untrusted as problem:
        fallback = _fallback_dir()
        _warn_once(path, str(problem),
                   f"nnc is not using the kernel cache directory {path}: {problem}. Whoever can write there could "
                   f"run code in this process, so kernels are compiled in {fallback}, private to this process "
                   f"(nothing is kept for the next one). Point {ENV_VAR} at a directory only you can write, or "
                   f"delete this one (it only holds a cache) so that nnc creates it again with mode 0700.")
        return fallback


def _problem(directory: Path, own: bool = True) -> str | None:
    """Why someone other than this user and root could put files into `directory` (absolute, resolved), or None.

    `directory` must be a real directory of this user's (`own`; else root's will do) that group and others cannot
    write; each directory above it must belong to this user or root and be unwritable by group and others, or be
    sticky like /tmp (then no one can rename or replace another user's entry)."""
    getuid = getattr(os, "getuid", None)
    if getuid is None:  # no POSIX owners and modes (Windows): the profile's ACLs decide, see docs/security.md
        return None
    uid = getuid()
    for depth, path in enumerate([directory, *directory.parents]):
        try:
            st = os.lstat(path)
        except OSError as error:
            return f"{path} cannot be examined ({error.strerror or error})"
        if stat.S_ISLNK(st.st_mode):
            return f"{path} is a symbolic link"
        if not stat.S_ISDIR(st.st_mode):
            return f"{path} is not a directory"
        leaf = depth == 0 and own
        if st.st_uid != uid and (leaf or st.st_uid != 0):
            who = "this user" if leaf else "this user or root"
            return f"{path} is owned by uid {st.st_uid}, not by {who} (uid {uid})"
        writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if writable and (leaf or not st.st_mode & stat.S_ISVTX):
            who = {stat.S_IWGRP: "its group", stat.S_IWOTH: "others"}.get(writable, "its group and others")
            mode = f"mode {stat.S_IMODE(st.st_mode):04o}"
            if leaf:
                return f"{path} is writable by {who} ({mode})"
            return f"{path} is writable by {who} ({mode}, not sticky), who could replace what is below it"
    return None


def _mkdir_private(path: Path) -> None:
    """Create `path` with mode 0700 whatever the umask (left as it is when it exists already)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        return
    except OSError as error:
        raise _Untrusted(f"{path} cannot be created ({error.strerror or error})") from error
    os.chmod(path, 0o700)  # the umask may have taken bits from 0700 (e.g. 0277); no one else can reach it yet


def _private_dir(path: Path) -> Path:
    """`path` resolved, with every missing directory (its `__pycache__` included) created 0700, checked by
    _problem; raises _Untrusted naming what is wrong. Later steps use the resolved path only, so a symbolic link
    on the way that someone else could change afterwards is never followed again."""
    real = Path(os.path.realpath(path))
    existing = real
    while not os.path.lexists(existing):
        existing = existing.parent
    if existing != real:  # check where the new directories go before making them
        problem = _problem(existing, own=False)
        if problem:
            raise _Untrusted(problem)
        for missing in reversed([real, *real.parents][:len(real.parents) - len(existing.parents)]):
            _mkdir_private(missing)
    problem = _problem(real)
    if problem:
        raise _Untrusted(problem)
    pycache = real / _PYCACHE
    _mkdir_private(pycache)  # numba would create it with the umask's mode (group-writable under 002)
    problem = _problem(pycache)
    if problem:
        raise _Untrusted(problem)
    return real


def _fallback_dir() -> Path:
    """This process's private kernel directory (made by mkdtemp, removed at exit); OSError when even that fails."""
    global _fallback
    with _dir_lock:
        if _fallback is None or not os.path.isdir(_fallback):
            made = Path(tempfile.mkdtemp(prefix="nnc-kernels-"))
            atexit.register(shutil.rmtree, made, True)
            _fallback = made
        try:
            return _private_dir(_fallback)
        except _Untrusted as problem:
            raise OSError(f"no private directory for generated kernels: {problem}") from None


def _warn_once(path: Path | str, problem: str, message: str) -> None:
    with _dir_lock:
        if (str(path), problem) in _warned:
            return
        _warned.add((str(path), problem))
    warnings.warn(message, KernelCacheWarning, stacklevel=3)


def digest(source: str) -> str:
    """The content hash that names a kernel's file."""
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


def module_name(source: str) -> str:
    return f"nnc_kernel_{digest(source)[:32]}"


def source_path(source: str, directory: Path | None = None) -> Path:
    """Where `source` lives in the cache (whether or not it has been written yet)."""
    return (cache_dir() if directory is None else directory) / f"k_{digest(source)[:32]}.py"


def write_source(source: str, directory: Path | None = None) -> Path:
    """Write `source` to its content-addressed file unless it is already there; returns the path.

    The write is atomic (a temporary file, mode 0600, linked into place), so concurrent processes never see half a
    file. A file with the same text is never replaced, even one another process linked in after this one looked:
    `compiling(path)` locks that file and numba's cache checks its modification time, so replacing it would let a
    second process compile the module beside the first and make the first's cached compile stale.
    """
    path = source_path(source, directory)
    if _holds(path, source):
        return path
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(source)
        _link_unless_written(tmp, path, source)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return path


def _holds(path: Path, source: str) -> bool:
    """Whether the file at `path` exists and holds exactly `source`."""
    try:
        return path.read_text(encoding="utf-8") == source
    except (OSError, UnicodeDecodeError):
        return False


def _link_unless_written(tmp: str, path: Path, source: str) -> None:
    """Put the written temporary file `tmp` at `path`: linked in (which fails if a file is there), or where a file
    with other text is there (a torn or foreign write), or the file system cannot link, replaced."""
    try:
        os.link(tmp, path)
        return
    except FileExistsError:
        if _holds(path, source):
            return  # another process wrote the same text first: keep its file
    except OSError:
        pass
    os.replace(tmp, path)


class _SourceTextLoader(importlib.abc.Loader):
    """Runs a kernel module from the source text this process generated: Python's own loader would prefer a
    `__pycache__/*.pyc` whose header matches the .py (anyone able to write there could plant one) and write one.

    The code object gets the .py's path as its file name, as an import would, so numba finds its cache next to it
    and tracebacks and inspect show the file."""

    def __init__(self, source: str, path: Path):
        self.source, self.path = source, path

    def create_module(self, spec):
        return None

    def exec_module(self, module: ModuleType) -> None:
        exec(compile(self.source, str(self.path), "exec", dont_inherit=True), module.__dict__)

    def get_source(self, fullname: str) -> str:
        return self.source


def load_module(source: str) -> tuple[ModuleType, Path, bool]:
    """Import the module for `source` from the cache; returns (module, path, already_loaded_in_this_process)."""
    directory = cache_dir()
    key = (str(directory), digest(source))
    with _lock:
        module = _modules.get(key)
        if module is not None:
            _modules.move_to_end(key)
            sys.modules.setdefault(module.__name__, module)
            return module, Path(module.__file__), True
        path = write_source(source, directory)
        name = module_name(source)
        _sources[name] = source
        spec = importlib.util.spec_from_loader(name, _SourceTextLoader(source, path), origin=str(path))
        module = importlib.util.module_from_spec(spec)
        module.__file__ = str(path)  # set by hand: a spec "with a location" would also name a .pyc as __cached__
        sys.modules[name] = module  # numba's cache and pickling look modules up by name
        try:
            spec.loader.exec_module(module)
            _keep_numba_caches_private(module, directory / _PYCACHE)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        _modules[key] = module
        _evict(module_limit())
        return module, path, False


LOCK_WAIT_S = 600.0  # a process holding a module's lock longer than this is not waited for: compile it here too
_LOCK_POLL_S = 0.02


@contextlib.contextmanager
def compiling(path: Path):
    """Held while numba compiles the kernel module whose source is `path`: another process compiling the same module
    waits here, then finds it in numba's disk cache and loads it instead of compiling it again.

    An exclusive flock on the source file (the kernel module's, never a library's, so no process holds two), which
    the system releases if the holder dies. Nothing is held where there is no flock, or the file cannot be opened."""
    fd = None
    if fcntl is not None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            fd = None
    try:
        if fd is not None:
            _lock_or_give_up(fd)
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock


def _lock_or_give_up(fd: int) -> None:
    """Take the flock on fd, waiting at most LOCK_WAIT_S (a holder that hangs must not hang this process too)."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return
            time.sleep(_LOCK_POLL_S)
        except OSError:  # a file system without flock
            return


_SEEN = "seen"  # empty files, one per compilation that finished with this cache (named by its fingerprint)


def seen(fingerprint: str) -> bool:
    """Whether a compilation with this fingerprint finished with this cache before (mark_seen): its kernels are then
    on disk. Only a hint for when to start compile helpers; the file's existence is all that is read."""
    return (cache_dir() / _SEEN / fingerprint).exists()


def mark_seen(fingerprint: str) -> None:
    """Record that a compilation with this fingerprint finished with this cache (an empty file in `seen/`)."""
    directory = cache_dir() / _SEEN
    try:
        _mkdir_private(directory)
        (directory / fingerprint).touch()
    except (OSError, _Untrusted):  # a hint only: the next compile of it starts its helpers early, no harm
        pass


def library(source: str) -> str:
    """The module name under which a kernel module imports `source`, a library: numba functions that several kernels
    call (a reduction's block helper, the epilogue that kernels of different products share). It is compiled once
    per process and cached on disk once, instead of once in each kernel that calls it.

    The name is registered for this process only: an import of it loads this text through load_module (the kernel
    cache, its trust rules and its LRU), and nothing else is ever imported under such a name. Every module
    load_module ran is registered too, so an import by name finds a module the LRU has dropped."""
    name = module_name(source)
    with _lock:
        _sources[name] = source
    return name


class _KnownSourceFinder(importlib.abc.MetaPathFinder):
    """Finds the kernel modules and libraries this process loaded or registered (`library`), and nothing else."""

    def find_spec(self, fullname, path=None, target=None):
        with _lock:
            source = _sources.get(fullname)
        return None if source is None else importlib.util.spec_from_loader(fullname, _KnownSourceLoader(source))


class _KnownSourceLoader(importlib.abc.Loader):
    """Imports a known module as load_module does (memoized, from its text), so the import gets that very module."""

    def __init__(self, source: str):
        self.source = source

    def create_module(self, spec):
        return load_module(self.source)[0]

    def exec_module(self, module: ModuleType) -> None:
        pass


sys.meta_path.append(_KnownSourceFinder())


def _keep_numba_caches_private(module: ModuleType, pycache: Path) -> None:
    """Let each numba function of `module` use its on-disk cache only in a directory that passes _problem.

    numba picks the directory when the decorator runs (`$NUMBA_CACHE_DIR` when set, else `__pycache__` next to the
    source, else a user-wide one) and reads nothing from it before the first compile, which comes after this."""
    dispatcher = sys.modules.get("numba.core.dispatcher")
    if dispatcher is None:  # numba not imported: the module holds no numba function
        return
    from numba.core.caching import NullCache

    for value in vars(module).values():
        if not isinstance(value, dispatcher.Dispatcher) or isinstance(value._cache, NullCache):
            continue
        where = value._cache.cache_path
        real = Path(os.path.realpath(where))
        if real == pycache:
            continue
        problem = _problem(real)
        if problem:
            value._cache = NullCache()  # compiles in memory, reads and writes nothing
            _warn_once(real, problem, f"numba's cache directory {where} is not used for nnc's kernels: {problem}. "
                                      f"They are compiled in memory; set NUMBA_CACHE_DIR to a directory only you "
                                      f"can write, or unset it.")


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
