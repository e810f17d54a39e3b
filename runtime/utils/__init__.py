"""Small utilities shared by the runtime (hook handles)."""
from . import hooks  # noqa: F401
