"""runtime.utils.data: datasets, samplers, DataLoader and DistributedSampler, as torch.utils.data."""
from .dataloader import DataLoader, default_collate, default_convert  # noqa: F401
from .dataset import (ChainDataset, ConcatDataset, Dataset, IterableDataset, StackDataset, Subset,  # noqa: F401
                      TensorDataset, random_split)
from .distributed import DistributedSampler  # noqa: F401
from ._worker import WorkerInfo, get_worker_info  # noqa: F401
from .sampler import (BatchSampler, RandomSampler, Sampler, SequentialSampler, SubsetRandomSampler,  # noqa: F401
                      WeightedRandomSampler)
