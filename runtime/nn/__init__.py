"""runtime.nn: Module and containers, Parameter, and (as they land) layers, functional and init."""
from . import modules  # noqa: F401
from .modules import *  # noqa: F401,F403
from .modules import Module  # noqa: F401
from .parameter import Buffer, Parameter, UninitializedParameter  # noqa: F401
