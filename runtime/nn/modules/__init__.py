"""The nn module classes: Module, the containers, and (as they land) the layers."""
from .container import ModuleDict, ModuleList, ParameterDict, ParameterList, Sequential  # noqa: F401
from .module import (Module, register_module_forward_hook, register_module_forward_pre_hook,  # noqa: F401
                     register_module_full_backward_hook)
