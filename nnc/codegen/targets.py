"""Code generation by target: the module that generates and compiles a kernel for "cpu" (numba's parallel CPU
target, nnc.codegen.cpu) or "cuda" (numba.cuda, nnc.codegen.cuda). Everything above this (graphs, fusion into
Kernels, memory planning) and the scalar layer below it (nnc.codegen.scalar, indexing) is target-neutral."""
from __future__ import annotations

import importlib
from types import ModuleType

from ..kernel import Kernel

TARGETS = {"cpu": "nnc.codegen.cpu", "cuda": "nnc.codegen.cuda"}


def check_target(target: str) -> str:
    """The target's name, or a ValueError naming the targets there are."""
    if target not in TARGETS:
        raise ValueError(f"unknown code generation target {target!r}; the targets are {', '.join(TARGETS)}")
    return target


def backend(target: str) -> ModuleType:
    """The code generator module of a target (imported on first use: numba.cuda only when CUDA is asked for)."""
    return importlib.import_module(TARGETS[check_target(target)])


def generate(kernel: Kernel, target: str = "cpu"):
    """The generated module of a kernel for a target (cpu.Generated or cuda.CudaGenerated); no compilation."""
    return backend(target).generate(kernel)


def compile_kernel(kernel: Kernel, target: str = "cpu"):
    """A kernel generated and compiled for a target; raises KernelCompileError (the caller interprets instead)."""
    return backend(target).compile_kernel(kernel)


def launch_configuration(generated) -> list[str]:
    """One line per GPU kernel of a generated module (its grid and block); [] for a CPU module."""
    summary = getattr(generated, "launch_summary", None)
    return summary() if summary is not None else []
