"""runtime.optim: optimizers and learning-rate schedulers, as torch.optim."""
from . import lr_scheduler, swa_utils  # noqa: F401
from .adadelta import Adadelta, Adagrad, Adamax  # noqa: F401
from .adafactor import Adafactor  # noqa: F401
from .adam import Adam, AdamW  # noqa: F401
from .asgd import ASGD, Rprop  # noqa: F401
from .lbfgs import LBFGS  # noqa: F401
from .muon import Muon  # noqa: F401
from .nadam import NAdam, RAdam  # noqa: F401
from .optimizer import Optimizer, required  # noqa: F401
from .rmsprop import RMSprop  # noqa: F401
from .sgd import SGD  # noqa: F401

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "RMSprop", "Adadelta", "Adagrad", "Adamax", "NAdam", "RAdam", "ASGD",
           "Rprop", "LBFGS", "Adafactor", "Muon", "lr_scheduler",
           "swa_utils"]
