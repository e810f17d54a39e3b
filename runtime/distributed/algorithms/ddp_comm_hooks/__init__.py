"""DDP communication hooks: DistributedDataParallel.register_comm_hook(state, hook) with torch's default hooks."""
from . import default_hooks  # noqa: F401
