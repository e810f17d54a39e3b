"""Code generation: Kernels to numba functions (CPU; CUDA later), with an on-disk cache."""
