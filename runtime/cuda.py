"""runtime.cuda: the torch.cuda queries; the eager runtime keeps tensors on the CPU."""


def is_available() -> bool:
    return False


def device_count() -> int:
    return 0


def manual_seed(seed: int) -> None:
    """Accepted for compatibility: there is no CUDA generator to seed."""


manual_seed_all = manual_seed
