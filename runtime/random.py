"""Random number generators: runtime.Generator, manual_seed and the default generator."""
from __future__ import annotations

import numpy as np


class Generator:
    """A seedable random stream (numpy's PCG64), as torch.Generator."""

    def __init__(self, device="cpu"):
        self._seed = int(np.random.SeedSequence().entropy % (2 ** 63))
        self._rng = np.random.Generator(np.random.PCG64(self._seed))

    def manual_seed(self, seed: int) -> "Generator":
        self._seed = int(seed)
        self._rng = np.random.Generator(np.random.PCG64(self._seed & (2 ** 64 - 1)))
        return self

    def seed(self) -> int:
        self.manual_seed(int(np.random.SeedSequence().entropy % (2 ** 63)))
        return self._seed

    def initial_seed(self) -> int:
        return self._seed

    def get_state(self):
        """An opaque snapshot that set_state accepts (numpy's bit-generator state)."""
        return {"seed": self._seed, "bit_generator": self._rng.bit_generator.state}

    def set_state(self, state) -> "Generator":
        self._seed = state["seed"]
        self._rng.bit_generator.state = state["bit_generator"]
        return self

    @property
    def numpy(self) -> np.random.Generator:
        return self._rng


default_generator = Generator()


def manual_seed(seed: int) -> Generator:
    """Seed the default generator and, as torch does, the one CUDA tensors' random values come from."""
    from .cuda import default_generator as cuda_generator

    cuda_generator.manual_seed(seed)
    return default_generator.manual_seed(seed)


def seed() -> int:
    return default_generator.seed()


def initial_seed() -> int:
    return default_generator.initial_seed()


def get_rng_state():
    return default_generator.get_state()


def set_rng_state(state) -> None:
    default_generator.set_state(state)


def rng(generator) -> np.random.Generator:
    return (generator or default_generator).numpy
