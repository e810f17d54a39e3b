"""runtime.nn: Module, containers and layers, Parameter, functional, init and utils (torch.nn's layout)."""
from . import functional, init, modules, utils  # noqa: F401
from .modules import *  # noqa: F401,F403
from .modules import Module  # noqa: F401
from .parameter import Buffer, Parameter, UninitializedBuffer, UninitializedParameter  # noqa: F401
from . import parallel  # noqa: E402,F401  (runtime.nn.parallel.DistributedDataParallel)
from .parallel import DataParallel  # noqa: E402,F401
from . import attention  # noqa: E402,F401
