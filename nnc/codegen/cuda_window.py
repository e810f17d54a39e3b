"""CUDA window kernels (im2col, col2im, max_pool, max_pool_backward): the CPU window skeleton's independent tasks
(nnc.codegen.cpu_conv: a row of im2col's columns, or a (sample, channel) plane that only its task writes), one GPU
thread a task in a grid-stride loop. Correct, and parallel over the tasks only: not tuned for a GPU."""
from __future__ import annotations

import re

from .cpu_conv import gen_window as gen_cpu_window
from .cuda_elementwise import CudaFunction, CudaKernelBuilder, elementwise_launch
from .scalar import Unsupported

_TASK_LOOP = re.compile(r"^for t in p?range\((\d+)\):$")


def gen_window(kb: CudaKernelBuilder) -> None:
    """The window kernel: the CPU skeleton's task loop as a grid-stride loop over threads."""
    gen_cpu_window(kb)
    cpu = kb.functions.pop()
    match = _TASK_LOOP.match(cpu.lines[0]) if cpu.lines else None
    if match is None or kb.functions:
        raise Unsupported("the CPU window skeleton no longer starts with one task loop (`for t in prange(N):`)")
    tasks = int(match.group(1))
    lines = [f"for t in range(cuda.grid(1), {tasks}, cuda.gridsize(1)):"] + cpu.lines[1:]
    f = CudaFunction(kb.name, cpu.args, lines, elementwise_launch(tasks))
    kb.functions.append(f)
    kb.launch = [f.launch_line()]
