"""runtime.distributed.algorithms: DDP communication hooks (torch.distributed.algorithms)."""
from . import ddp_comm_hooks  # noqa: F401
