"""runtime.nn.parallel: DistributedDataParallel over MPI (torch.nn.parallel's layout)."""
from .distributed import DistributedDataParallel  # noqa: F401

DDP = DistributedDataParallel
