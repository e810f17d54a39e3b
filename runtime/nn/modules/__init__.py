"""The nn module classes: Module, the containers, and the built-in layers."""
from .container import ModuleDict, ModuleList, ParameterDict, ParameterList, Sequential  # noqa: F401
from .layers import (AdaptiveAvgPool2d, AvgPool2d, BatchNorm1d, BatchNorm2d, BCELoss, BCEWithLogitsLoss,  # noqa: F401
                     Bilinear, Conv1d, Conv2d, CrossEntropyLoss, Dropout, Embedding, Flatten, GELU, Identity,
                     L1Loss, LayerNorm, LazyLinear, LeakyReLU, Linear, LogSoftmax, MaxPool2d, MSELoss,
                     MultiheadAttention, NLLLoss, ReLU, Sigmoid, SiLU, Softmax, Tanh, Unflatten)
from .module import (Module, register_module_forward_hook, register_module_forward_pre_hook,  # noqa: F401
                     register_module_full_backward_hook)
from .rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNBase, RNNCell, RNNCellBase  # noqa: F401
from .transformer import (Transformer, TransformerDecoder, TransformerDecoderLayer, TransformerEncoder,  # noqa: F401
                          TransformerEncoderLayer)
from .activation import *  # noqa: F401,F403
from .extra import *  # noqa: F401,F403
from .layers import BatchNorm3d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d  # noqa: F401
from .lazy import (LazyBatchNorm1d, LazyBatchNorm2d, LazyBatchNorm3d, LazyConv1d, LazyConv2d, LazyConv3d,  # noqa: F401
                   LazyConvTranspose1d, LazyConvTranspose2d, LazyConvTranspose3d, LazyInstanceNorm1d,
                   LazyInstanceNorm2d, LazyInstanceNorm3d)
from .sync_batchnorm import SyncBatchNorm  # noqa: F401
from .loss import *  # noqa: F401,F403
from .more import *  # noqa: F401,F403
from .adaptive import AdaptiveLogSoftmaxWithLoss  # noqa: F401
