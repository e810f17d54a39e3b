"""Graph passes, one module each, run in order by nnc/pipeline.py.

shapes (propagation), decompose (into primitives), functionalize (in-place writes as pure ops and extra
outputs), simplify (CSE, DCE, constant folding, no-ops), autodiff (the backward graph), fusion (kernels) and
memory (buffer reuse)."""
from .shapes import ShapeProp, propagate_shapes  # noqa: F401
