"""runtime.nn.parallel: DistributedDataParallel over MPI, and DataParallel (torch.nn.parallel's layout)."""
from .data_parallel import DataParallel  # noqa: F401
from .distributed import DistributedDataParallel  # noqa: F401

DDP = DistributedDataParallel
