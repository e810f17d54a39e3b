"""Utilities: hook handles, the module-state version, data loading and activation checkpointing."""
from . import hooks, state_version  # noqa: F401


def __getattr__(name):
    # NOTE: checkpoint imports the tensor and autograd modules, which import this package: it loads on first use
    if name == "checkpoint":
        import importlib

        return importlib.import_module(f"{__name__}.checkpoint")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
