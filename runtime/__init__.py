"""runtime: a PyTorch-compatible eager tensor library on numpy; `import runtime as torch` works."""
from __future__ import annotations

import math as _math

from . import api as _api
from .dtypes import (ALL_DTYPES as _ALL_DTYPES, bfloat16, complex64, complex128, dtype, float16, float32,  # noqa: F401
                     float64, int8, int16, int32, int64, uint8, get_default_dtype, promote_types, set_default_dtype)
from .dtypes import bool_ as bool  # noqa: F401  (runtime.bool, as torch.bool)
from .typeinfo import finfo, iinfo  # noqa: F401
from .device import device, get_default_device, set_default_device  # noqa: F401
from .memory_formats import (channels_last, channels_last_3d, contiguous_format, memory_format,  # noqa: F401
                             preserve_format)
from .tensor import Size, Tensor  # noqa: F401
from ._tensor_str import set_printoptions  # noqa: F401
from .threads import get_num_threads, set_num_threads  # noqa: F401
from .legacy_linalg import (cholesky, cholesky_inverse, cholesky_solve, pinverse, qr, svd,  # noqa: F401
                            triangular_solve)
from .factories import (arange, as_tensor, asarray, empty, frombuffer, empty_like, eye, from_numpy, full, full_like,  # noqa: F401
                        linspace, ones, ones_like, rand, rand_like, randint, randint_like, randn, randn_like,
                        randperm, tensor, zeros, zeros_like)
from .random import Generator, default_generator, get_rng_state, initial_seed, manual_seed, seed, set_rng_state  # noqa: F401
from .autograd import enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled  # noqa: F401
from .autograd.grad_mode import is_inference_mode_enabled  # noqa: F401
from .autograd.anomaly_mode import is_anomaly_check_nan_enabled, is_anomaly_enabled  # noqa: F401
from . import accelerator, amp, autograd, backends, cpu, cuda, fft, hub, jit, linalg, nn, ops, testing, xpu  # noqa: F401
from .amp import autocast, get_autocast_dtype, is_autocast_enabled  # noqa: F401
from .backends import (are_deterministic_algorithms_enabled, get_float32_matmul_precision,  # noqa: F401
                       is_deterministic_algorithms_warn_only_enabled, set_float32_matmul_precision,
                       use_deterministic_algorithms)

half, float, double, long, int, short = float16, float32, float64, int64, int32, int16
cfloat, cdouble = complex64, complex128

# Every public API function is also a module-level function: runtime.exp(x), runtime.cat([...]).
# runtime.float etc. are dtypes, not the methods of those names
_METHOD_ONLY = {"float", "double", "half", "bfloat16", "long", "int", "short", "byte", "char", "bool", "type_as",
                "cfloat", "cdouble"}
_MODULE_FUNCTIONS = {name: fn for name, fn in _api.METHODS.items()
                     if not name.startswith("new_") and name not in _METHOD_ONLY}
_MODULE_FUNCTIONS.update(where=_api.where, cat=_api.cat, concat=_api.cat, concatenate=_api.cat, stack=_api.stack,
                         result_type=_api.result_type, is_tensor=lambda obj: isinstance(obj, Tensor),
                         numel=lambda input: input.numel(), is_floating_point=lambda input: input.is_floating_point())
_MODULE_FUNCTIONS.update({name: _api.with_out(fn) for name, fn in _MODULE_FUNCTIONS.items()
                          if getattr(fn, "__module__", "") == "runtime.api" and name != "result_type"})
_MODULE_FUNCTIONS.update({name: _api.with_out(fn) for name, fn in _api.FUNCTIONS.items()})
globals().update(_MODULE_FUNCTIONS)

# torch.relu_(t) and its kind: the in-place methods torch also offers as functions of the tensor they write
_INPLACE_FUNCTIONS = """abs_ acos_ acosh_ addmv_ arccos_ arccosh_ arcsin_ arcsinh_ arctan_ arctanh_ asin_ asinh_ atan_
    atanh_ ceil_ clamp_ clamp_max_ clamp_min_ clip_ cos_ cosh_ deg2rad_ detach_ erf_ erfc_ exp2_ exp_ expm1_ fill_ fix_
    floor_ frac_ gcd_ i0_ index_put_ lcm_ ldexp_ log10_ log1p_ log2_ log_ logit_ nan_to_num_ neg_ negative_ rad2deg_
    reciprocal_ relu_ resize_as_ round_ rsqrt_ sigmoid_ sin_ sinc_ sinh_ sqrt_ square_ tan_ tanh_ trunc_ xlogy_
    zero_""".split()


def _inplace_function(name: str):
    def write(input, *args, **kwargs):
        return getattr(input, name)(*args, **kwargs)

    write.__name__ = write.__qualname__ = name
    return write


globals().update({_name: _inplace_function(_name) for _name in _INPLACE_FUNCTIONS if hasattr(Tensor, _name)})
inf, nan, pi, e = _math.inf, _math.nan, _math.pi, _math.e


def compile(model=None, **options):
    """torch.compile's spelling, which runs `model` eagerly, unchanged: runtime does not import nnc (the compiler sits
    above it). nnc.compile(model) compiles a module into fused kernels. Usable as a decorator too."""
    import warnings

    warnings.warn("runtime.compile returns the model unchanged and runs it eagerly; use nnc.compile(model) to "
                  "compile it", UserWarning, stacklevel=2)
    if model is None:
        return lambda fn: fn
    return model

from . import version  # noqa: E402
from .func import vmap  # noqa: E402, F401  (torch.vmap)


def is_same_size(input, other) -> bool:
    return tuple(input.shape) == tuple(other.shape)


def typename(obj) -> str:
    """torch's name of a tensor's type ("torch.FloatTensor"), else the object's qualified class name."""
    if isinstance(obj, Tensor):
        return obj.type()
    cls = obj if isinstance(obj, type) else type(obj)
    module = cls.__module__
    return cls.__qualname__ if module in ("builtins", None) else f"{module}.{cls.__qualname__}"

__version__ = version.__version__
from . import optim  # noqa: E402,F401
from . import multiprocessing  # noqa: E402,F401  (registers how shared tensors travel between processes)
from . import profiler  # noqa: E402,F401
from . import func  # noqa: E402,F401
from . import sparse, special  # noqa: E402,F401
from .sparse import sparse_coo, sparse_coo_tensor, strided  # noqa: E402,F401
spmm = _api.spmm
from .legacy import (BFloat16Tensor, BoolTensor, ByteTensor, CharTensor, DoubleTensor, FloatTensor, HalfTensor,  # noqa: E402,F401
                     IntTensor, LongTensor, ShortTensor)
from .serialization import load, load_safetensors, save, save_safetensors  # noqa: E402,F401
from .functional_aliases import (adaptive_avg_pool1d, adaptive_max_pool1d, alpha_dropout, avg_pool1d,  # noqa: E402,F401
                                 batch_norm, bilinear, celu, channel_shuffle, conv1d, conv2d, conv3d, conv_transpose1d,
                                 conv_transpose2d, conv_transpose3d, cosine_similarity, dropout, embedding,
                                 feature_alpha_dropout, group_norm, hardshrink, instance_norm, layer_norm, max_pool1d,
                                 max_pool2d, max_pool3d, pairwise_distance, pdist, pixel_shuffle, pixel_unshuffle,
                                 prelu, rms_norm, row_stack, rrelu, rsub, selu, threshold)
from .utils import data as _utils_data  # noqa: E402,F401  (sets runtime.utils.data, as torch.utils.data)
from . import distributed  # noqa: E402,F401
from . import _foreach  # noqa: E402

globals().update(_foreach.functions())  # torch._foreach_add_ and the rest: runtime._foreach_add_, ...


def __getattr__(name):
    # NOTE: runtime.distributions (30 ms of imports) loads on first use, as `import runtime.distributions` would
    if name == "distributions":
        import importlib

        return importlib.import_module(f"{__name__}.distributions")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
