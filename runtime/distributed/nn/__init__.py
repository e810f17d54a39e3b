"""torch.distributed.nn: collectives that autograd differentiates (functional)."""
from . import functional  # noqa: F401
