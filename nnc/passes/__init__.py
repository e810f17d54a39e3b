"""Graph passes: named `graph -> graph` functions (shape propagation so far)."""
from .shapes import ShapeProp, propagate_shapes  # noqa: F401
