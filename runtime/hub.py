"""torch.hub's helpers that training scripts use: the tqdm progress bar it re-exports, the hub directory, and
downloads of files and state dicts (checked against a hash prefix, loaded with runtime.load, which runs no code).
Loading models from a repository's hubconf.py would run code downloaded from it: hub.load, list and help raise."""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import urllib.parse
import urllib.request

_hub_dir: str | None = None


class _PlainProgress:
    """A minimal tqdm: wraps an iterable or counts updates, and prints one line of progress to stderr."""

    def __init__(self, iterable=None, desc=None, total=None, disable=False, unit="it", unit_scale=False,
                 unit_divisor=1000, **_):
        self.iterable, self.desc, self.disable, self.unit = iterable, desc or "", disable, unit
        self.total = total if total is not None else (len(iterable) if hasattr(iterable, "__len__") else None)
        self.n, self.postfix = 0, ""

    def __iter__(self):
        for item in self.iterable:
            yield item
            self.update(1)
        self.close()

    def __len__(self):
        return self.total or 0

    def update(self, n=1) -> None:
        self.n += n
        if not self.disable:
            of = f"/{self.total}" if self.total else ""
            sys.stderr.write(f"\r{self.desc}{': ' if self.desc else ''}{self.n}{of} {self.unit} {self.postfix}")
            sys.stderr.flush()

    def set_postfix(self, ordered_dict=None, refresh=True, **kwargs) -> None:
        items = {**(ordered_dict or {}), **kwargs}
        self.postfix = ", ".join(f"{k}={v}" for k, v in items.items())

    def set_description(self, desc=None, refresh=True) -> None:
        self.desc = desc or ""

    def close(self) -> None:
        if not self.disable:
            sys.stderr.write("\n")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


try:  # the real progress bar when installed (the `examples` extra has it), as torch.hub re-exports it
    from tqdm import tqdm
except ImportError:
    tqdm = _PlainProgress


def get_dir() -> str:
    """Where downloads go: set_dir's directory, else $RUNTIME_HOME/hub, else ~/.cache/runtime/hub."""
    if _hub_dir is not None:
        return _hub_dir
    home = os.environ.get("RUNTIME_HOME", os.path.join(os.path.expanduser("~"), ".cache", "runtime"))
    return os.path.join(home, "hub")


def set_dir(d) -> None:
    global _hub_dir
    _hub_dir = os.path.expanduser(os.fspath(d))


def download_url_to_file(url: str, dst, hash_prefix: str | None = None, progress: bool = True) -> None:
    """The file at `url` saved to `dst` (written to a temporary file first, moved there when complete); with
    hash_prefix, its SHA-256 must start with it, or nothing is kept."""
    dst = os.path.expanduser(os.fspath(dst))
    folder = os.path.dirname(os.path.abspath(dst))
    digest = hashlib.sha256()
    with urllib.request.urlopen(urllib.request.Request(url, headers={"User-Agent": "runtime.hub"})) as response, \
            tempfile.NamedTemporaryFile(delete=False, dir=folder) as partial:
        size = response.headers.get("Content-Length")
        with tqdm(total=int(size) if size else None, disable=not progress, unit="B", unit_scale=True,
                  unit_divisor=1024) as bar:
            while True:
                chunk = response.read(1 << 16)
                if not chunk:
                    break
                partial.write(chunk)
                digest.update(chunk)
                bar.update(len(chunk))
    if hash_prefix is not None and not digest.hexdigest().startswith(hash_prefix):
        os.remove(partial.name)
        raise RuntimeError(f'invalid hash value (expected "{hash_prefix}", got "{digest.hexdigest()}")')
    shutil.move(partial.name, dst)


def load_state_dict_from_url(url: str, model_dir=None, map_location=None, progress: bool = True,
                             check_hash: bool = False, file_name: str | None = None, weights_only: bool = False):
    """A state dict saved with runtime.save, downloaded once into model_dir (default get_dir()/checkpoints) and
    loaded from there; check_hash takes the hash prefix from the file name (`name-<sha256 prefix>.ext`), as torch's
    hub names checkpoints."""
    from .serialization import load

    model_dir = os.fspath(model_dir) if model_dir is not None else os.path.join(get_dir(), "checkpoints")
    os.makedirs(model_dir, exist_ok=True)
    name = file_name or os.path.basename(urllib.parse.urlparse(url).path)
    path = os.path.join(model_dir, name)
    if not os.path.exists(path):
        stem = os.path.splitext(name)[0]
        prefix = stem.rsplit("-", 1)[-1] if check_hash and "-" in stem else None
        download_url_to_file(url, path, prefix, progress=progress)
    return load(path, map_location=map_location)


def _runs_repository_code(name: str):
    def refuse(*args, **kwargs):
        raise RuntimeError(f"runtime.hub.{name}: loading from a repository runs its hubconf.py, code downloaded "
                           f"from it, which runtime never does; build the model from its code and load its weights "
                           f"with hub.load_state_dict_from_url or runtime.load")

    refuse.__name__ = name
    return refuse


load, list, help = (_runs_repository_code(n) for n in ("load", "list", "help"))  # noqa: A001 (torch's names)
