"""nnc: trace runtime Modules into a graph IR and compile them into fused numba kernels (`nnc.compile`)."""
from . import passes  # noqa: F401
from .graph import Graph, GraphError, Node  # noqa: F401
from .graph_module import GraphModule  # noqa: F401
from .interpreter import Interpreter  # noqa: F401
from .prims import prims  # noqa: F401
from .trace import Proxy, TraceError, Tracer, symbolic_trace  # noqa: F401

from .compile import compile, mark_dynamic  # noqa: E402,F401
from .explain import explain  # noqa: E402,F401  (shadows the builtin inside this package's namespace only)
from .profile import profile  # noqa: E402,F401  (the class shadows its module's name, as compile's does)

trace = symbolic_trace

__all__ = ["compile", "explain", "mark_dynamic", "profile", "Graph", "GraphError", "GraphModule", "Interpreter", "Node",
           "Proxy", "TraceError", "Tracer", "prims", "symbolic_trace", "trace"]
