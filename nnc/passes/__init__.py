"""Graph passes: named `graph -> graph` functions, one module each: shapes (propagation), decompose (into
primitives), simplify (CSE, DCE, constant folding, no-ops), autodiff (the backward graph), fusion (kernels) and memory
(buffer reuse). nnc/pipeline.py runs them in order."""
from .shapes import ShapeProp, propagate_shapes  # noqa: F401
