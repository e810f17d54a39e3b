"""Small utilities shared by the runtime (hook handles, the module-state version)."""
from . import hooks, state_version  # noqa: F401
