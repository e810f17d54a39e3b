"""nn.DataParallel: single-process data parallelism over GPUs. With no GPU to spread over (runtime runs on the CPU),
torch's DataParallel is a transparent wrapper that runs its module, and so is this one."""
from __future__ import annotations

from ..modules.module import Module


class DataParallel(Module):
    """Holds `module` as `self.module` (so state_dict keys start with "module.", as torch's) and runs it. torch
    ignores device_ids and output_device when no GPU is available; so does runtime, which has none to split over.
    For several processes, use DistributedDataParallel over MPI."""

    def __init__(self, module: Module, device_ids=None, output_device=None, dim: int = 0):
        super().__init__()
        self.module = module
        self.device_ids: list = []
        self.output_device = None
        self.dim = dim

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)
