"""Shared by the scripts tests/test_distributed.py runs under mpiexec: start the process group, report, compare."""
from __future__ import annotations

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import runtime  # noqa: E402
import runtime.distributed as dist  # noqa: E402


def start():
    """Initialize the group; the kernel cache NNC_TEST_CACHE (if set), which the ranks share, as ranks on one machine
    share ~/.cache/nnc: each kernel module compiles in one rank, the other loads it (nnc.codegen.cache.compiling)."""
    dist.init_process_group("mpi")
    base = os.environ.get("NNC_TEST_CACHE")
    if base:
        os.environ["NNC_CACHE_DIR"] = base
    return dist.get_rank(), dist.get_world_size()


def done(name: str) -> None:
    dist.barrier()
    print(f"OK {name} rank {dist.get_rank()} of {dist.get_world_size()}", flush=True)
    dist.destroy_process_group()


def same_everywhere(array) -> bool:
    """True when every rank holds the same values (checked with an all_gather)."""
    t = runtime.tensor(np.ascontiguousarray(array))
    out = [runtime.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return all(np.array_equal(o.numpy(), out[0].numpy(), equal_nan=True) for o in out)
