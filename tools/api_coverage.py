"""How much of torch's public API runtime provides, per area, measured against the installed torch.

    python tools/api_coverage.py [--missing] [--area torch] [--json]

Areas: `nn` (module classes, `nn.init`, `nn.utils` with `rnn`/`parametrize`/`parametrizations`), `functional`,
`torch` (`torch.*` functions, `torch.linalg`, `torch.autograd` functions), `tensor` (Tensor methods, in-place ones
included) and `optim` (optimizers, `lr_scheduler`, `swa_utils`).

The universe of each area is read from torch itself (so a new torch release moves it), then these exclusion rules
are applied, in this order; every rule is a list or a pattern below, nothing is left out silently:

1. private names (leading underscore), and what a module merely imports (typing helpers, re-exported modules);
2. what means nothing for a CPU numpy library: lazy modules (`Lazy*`, `Uninitialized*`), quantization
   (`quantize*`, `q_*`, `*_qparams`, `fake_quantize*`, `int_repr`, `dequantize`), sparse layouts (`*sparse*`,
   `*csr*`, `*csc*`, `*bsr*`, `*bsc*`, `*coo*`, `*indices_copy`), CUDA and vendor back-ends (`cudnn_*`, `miopen_*`,
   `mkldnn_*`, `fbgemm_*`, `*vulkan*`, `cuda`, pinned memory, streams), distributed (`DataParallel`,
   `SyncBatchNorm`), memory formats and raw storage, the JIT/TorchScript and compiler plumbing (`parse_ir`, `fork`,
   `sym_*`, `vmap`, `cond`, `while_loop`...), complex numbers (runtime has no complex dtype), and named tensors;
3. deprecated names (torch warns on use or documents a replacement): `nn.init.normal` and the other init functions
   without the trailing underscore, `NLLLoss2d`, `Container`, `nn.utils.weight_norm`/`spectral_norm` (replaced by
   `parametrizations`), `torch.symeig`/`eig`/`lstsq`/`solve`/`chain_matmul`/`trapz`...;
4. in `torch.*`: the in-place function spellings (`torch.relu_`), the aliases that exist only as `*_copy` variants of
   views, and the neural-network kernels re-exported from `nn.functional` (counted there, once);
5. ATen internals that torch exposes but does not document (`batch_norm_backward_elemt`, `native_*`, ...).

A name is **present** when runtime has an object of that name and it is callable (a class or a function). For
`torch` and `tensor`, present names are also **probed** (only the names in `PROBE_EXEMPT` are not): each candidate
call in `CANDIDATES` is run in torch on small float64/int64/bool tensors; where torch accepts it, runtime gets the
same arguments and must give the same result (shape, dtype and values within 1e-6, nan where torch has nan; random
functions: shape and dtype only), or raise where torch raises is not asked. A present name **behaves** when every
candidate torch accepted gave runtime's same result; one that torch accepted none of is reported as unprobed (and
counted as present only). Module classes, functional, init and optimizers are counted present/missing only: their
behaviour is checked by the test suites (`tests/test_layers.py`, `tests/test_functional*.py`, `tests/test_optim.py`,
...). `--probe-functional` runs the same probe over nn.functional; the generic candidate calls fit few of its
signatures (most come out unprobed), and what it flags are edge cases (empty output sizes, bool targets).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import io
import json
import re
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# ---------------------------------------------------------------------------------------------------------------
# Exclusion rules (see the docstring).
# ---------------------------------------------------------------------------------------------------------------

MEANINGLESS = re.compile(
    r"quantiz|^q_|qparams|int_repr|dequantize|sparse|csr|csc|bsr|bsc|coo|indices_copy|values_copy|^cudnn|^miopen|"
    r"^mkldnn|^fbgemm|vulkan|^cuda$|pin_memory|is_pinned|record_stream|storage|^share_memory|is_shared|dlpack|"
    r"^sym_|complex|^conj|is_conj|resolve_conj|^real$|^imag$|^angle$|^polar$|view_as_real|is_neg|resolve_neg|"
    r"^rename|refine_names|align_as|align_to|^names$|^has_names|^unflatten_dense|mps|^ipu|^xpu|^hpu|nested|"
    r"autocast_(increment|decrement)|^is_autocast_(ipu|xla)|autocast_(ipu|xla|gpu)|memory_format|channels_last|"
    r"^is_vulkan|_nnpack|^lazy|^Lazy|^Uninitialized|^is_distributed|^is_inference$|^module_load$")

JIT_AND_PLUMBING = {
    "classproperty", "compiled_with_cxx11_abi", "fork", "wait", "import_ir_module", "import_ir_module_from_buffer",
    "merge_type_from_type_comment", "parse_ir", "parse_schema", "parse_type_comment", "unify_type_list",
    "prepare_multiprocessing_environment", "profiler_allow_cudagraph_cupti_lazy_reinit_cuda12", "get_file_path",
    "vmap", "cond", "while_loop", "compile", "from_file", "init_num_threads", "thread_safe_generator", "typename",
    "get_device_module", "hash_tensor", "set_default_tensor_type", "get_autocast_ipu_dtype", "get_autocast_xla_dtype",
    "get_autocast_gpu_dtype", "set_flush_denormal", "is_storage", "frombuffer", "segment_reduce", "empty_permuted",
    "empty_strided", "as_strided", "as_strided_copy", "as_strided_scatter", "slice_inverse", "nonzero_static",
    "asarray", "get_device", "set_default_device", "get_default_device", "set_deterministic_debug_mode",
    "get_deterministic_debug_mode", "is_deterministic_algorithms_warn_only_enabled", "is_warn_always_enabled",
    "set_warn_always", "use_deterministic_algorithms", "are_deterministic_algorithms_enabled", "clear_autocast_cache",
    "set_autocast_cache_enabled", "is_autocast_cache_enabled", "set_autocast_cpu_dtype", "set_autocast_cpu_enabled",
    "is_autocast_cpu_enabled", "get_autocast_cpu_dtype", "set_autocast_dtype", "set_autocast_enabled",
    "get_autocast_dtype", "is_autocast_enabled", "set_anomaly_enabled", "is_anomaly_enabled",
    "is_anomaly_check_nan_enabled", "set_num_interop_threads", "get_num_interop_threads",
    "set_float32_matmul_precision", "get_float32_matmul_precision",
}

DEPRECATED = {
    # torch.*: torch documents torch.linalg's functions as the replacements
    "symeig", "eig", "lstsq", "solve", "chain_matmul", "trapz", "matrix_rank", "lu", "lu_solve", "triangular_solve",
    "cholesky", "cholesky_solve", "cholesky_inverse", "qr", "svd", "pinverse", "ger", "row_stack", "range",
    "frobenius_norm", "nuclear_norm", "istft", "stft", "orgqr", "ormqr", "geqrf", "lobpcg", "pca_lowrank",
    "svd_lowrank", "unsafe_chunk", "unsafe_split", "unsafe_split_with_sizes", "rsub", "smm", "saddmm", "dsmm",
    "hsmm", "hspmm", "spmm", "sspaddmm", "feature_dropout", "alpha_dropout", "feature_alpha_dropout", "fix",
    # nn
    "nn.NLLLoss2d", "nn.Container", "nn.utils.clip_grad_norm", "nn.utils.weight_norm", "nn.utils.remove_weight_norm",
    "nn.utils.spectral_norm", "nn.utils.remove_spectral_norm", "nn.utils.stateless.functional_call",
    "nn.functional.upsample", "nn.functional.upsample_bilinear", "nn.functional.upsample_nearest",
    # Tensor
    "Tensor.resize", "Tensor.resize_as", "Tensor.ndimension", "Tensor.is_set_to", "Tensor.apply_", "Tensor.map_",
    "Tensor.map2_", "Tensor.symeig", "Tensor.eig", "Tensor.lstsq", "Tensor.solve", "Tensor.ger", "Tensor.fix",
    "Tensor.fix_", "Tensor.qr", "Tensor.svd", "Tensor.cholesky", "Tensor.lu", "Tensor.lu_solve",
    "Tensor.triangular_solve", "Tensor.cholesky_solve", "Tensor.cholesky_inverse", "Tensor.pinverse",
    "Tensor.geqrf", "Tensor.orgqr", "Tensor.ormqr", "Tensor.lobpcg", "Tensor.stft", "Tensor.istft", "Tensor.rsub",
}
# torch.* names that torch keeps only as ATen kernels behind nn layers or as autograd internals (rule 5)
ATEN_INTERNALS = re.compile(r"^batch_norm_|^native_|_backward|^affine_grid_generator|^grid_sampler|^conv_tbc|"
                            r"^convolution$|^constant_pad_nd|^embedding_renorm|^fused_|^_|^rnn_|^lstm|^gru|"
                            r"^quantized|_copy$|^choose_qparams|^index_put$|^put$|^is_same_size|^is_nonzero|"
                            r"^max_pool1d_with_indices|^instance_norm|^group_norm|^layer_norm|^batch_norm|"
                            r"^embedding_bag$|^ctc_loss|^bilinear|^cosine_embedding_loss|^hinge_embedding_loss|"
                            r"^kl_div|^margin_ranking_loss|^poisson_nll_loss|^triplet_margin_loss|^rrelu|^celu|"
                            r"^selu|^threshold|^hardshrink|^prelu|^dropout|^pdist|^pairwise_distance|"
                            r"^cosine_similarity|^pixel_|^channel_shuffle|^binary_cross_entropy_with_logits|"
                            r"^adaptive_|^avg_pool|^max_pool|^conv|^embedding$|^rms_norm")
NN_NOT_MODULES = {"Module", "RNNBase", "RNNCellBase", "LinearCrossEntropyOptions", "DataParallel", "SyncBatchNorm"}
TENSOR_EXCLUDED = {
    "is_cuda", "is_cpu", "is_meta", "is_mkldnn", "is_quantized", "is_sparse", "device",
    "new", "sspaddmm", "untyped_storage", "storage_offset", "storage_type", "nbytes",
    "itemsize", "ndimension", "dim_order", "is_inference", "cfloat", "cdouble", "chalf", "as_subclass",
    "to_padded_tensor", "to_mkldnn", "is_set_to", "positive", "put", "put_", "index_put",
    "index_put_", "coalesce", "is_coalesced", "retains_grad", "register_post_accumulate_grad_hook",
    "module_load", "as_strided", "as_strided_", "as_strided_scatter", "resize_as_sparse_",
    "set_", "data_ptr", "ipu", "xpu", "hpu", "mtia", "new_empty_strided",
    "is_nonzero", "is_same_size", "prelu", "hardshrink", "smm", "index", "indices", "values", "dense_dim", "to_dense",
    "ccol_indices", "col_indices", "crow_indices", "row_indices", "qscheme", "reinforce", "const_data_ptr",
    "unsafe_chunk", "unsafe_split", "unsafe_split_with_sizes",
}
TENSOR_INTERNALS = re.compile(r"^_|^grad_fn$|^is_leaf$|^output_nr$|^requires_grad$|^data$|^grad$|^shape$|^T$|^H$|"
                              r"^mT$|^mH$|^ndim$|^layout$|^dtype$|^names$|^is_|^__")
F_IMPORTS = {"Callable", "DType", "Optional", "ScalingType", "SwizzleType", "Tensor", "assert_int_or_pair",
             "boolean_dispatch", "handle_torch_function", "has_torch_function", "has_torch_function_unary",
             "has_torch_function_variadic", "grouped_mm", "scaled_grouped_mm", "scaled_mm", "native_channel_shuffle",
             "linear_cross_entropy", "multi_head_attention_forward"}
AUTOGRAD_FUNCTIONS = ["Function", "backward", "grad", "gradcheck", "gradgradcheck", "no_grad", "enable_grad",
                      "set_grad_enabled", "inference_mode", "detect_anomaly", "set_detect_anomaly",
                      "functional.jacobian", "functional.hessian", "functional.vjp", "functional.jvp",
                      "functional.hvp", "functional.vhp", "forward_ad.dual_level", "forward_ad.make_dual",
                      "forward_ad.unpack_dual", "graph.saved_tensors_hooks", "graph.save_on_cpu"]
LINALG_EXCLUDED = {"LinAlgError", "common_notes", "eig", "eigvals", "ldl_factor", "ldl_factor_ex", "ldl_solve",
                   "householder_product"}  # complex results (eig), LAPACK-internal factorizations

# ---------------------------------------------------------------------------------------------------------------
# The universe, read from torch.
# ---------------------------------------------------------------------------------------------------------------


def _public(module, predicate=callable):
    return [n for n in dir(module) if not n.startswith("_") and predicate(getattr(module, n))]


def _kept(qualified: str) -> bool:
    name = qualified.rsplit(".", 1)[-1]
    return not MEANINGLESS.search(name) and qualified not in DEPRECATED and name not in JIT_AND_PLUMBING


def universe(torch) -> dict:
    nn, F = torch.nn, torch.nn.functional
    areas = {}

    modules = [f"nn.{n}" for n in _public(nn, lambda o: isinstance(o, type))
               if _kept(f"nn.{n}") and n not in NN_NOT_MODULES]
    init = [f"nn.init.{n}" for n in _public(nn.init) if n.endswith("_") or n == "calculate_gain"]
    init = [n for n in init if _kept(n)]
    utils = [f"nn.utils.{n}" for n in _public(nn.utils) if not inspect.ismodule(getattr(nn.utils, n))]
    utils += [f"nn.utils.rnn.{n}" for n in _public(nn.utils.rnn)
              if getattr(getattr(nn.utils.rnn, n), "__module__", "") == "torch.nn.utils.rnn"
              and n not in ("PackedSequence_", "bind")]
    utils += ["nn.utils.parametrize.register_parametrization", "nn.utils.parametrize.remove_parametrizations",
              "nn.utils.parametrize.is_parametrized", "nn.utils.parametrize.cached",
              "nn.utils.parametrizations.weight_norm", "nn.utils.parametrizations.spectral_norm",
              "nn.utils.parametrizations.orthogonal", "nn.utils.stateless.functional_call"]
    utils = [n for n in utils if _kept(n)]
    areas["nn"] = sorted(set(modules + init + utils))

    functional = [n for n in _public(F) if n not in F_IMPORTS and _kept(f"nn.functional.{n}")
                  and not inspect.ismodule(getattr(F, n))]
    areas["functional"] = [f"nn.functional.{n}" for n in sorted(functional)]

    fns = {n for n in dir(torch) if not n.startswith("_") and not n.endswith("_")
           and type(getattr(torch, n)).__name__ in ("builtin_function_or_method", "function")}
    fns = {n for n in fns if _kept(n) and not ATEN_INTERNALS.search(n)}
    fns -= set(_public(F))  # counted in functional
    linalg = [f"linalg.{n}" for n in _public(torch.linalg) if n not in LINALG_EXCLUDED and _kept(f"linalg.{n}")]
    autograd = [f"autograd.{n}" for n in AUTOGRAD_FUNCTIONS]
    areas["torch"] = sorted(fns) + sorted(linalg) + autograd

    tensor = [n for n in dir(torch.Tensor) if not TENSOR_INTERNALS.search(n) and callable(getattr(torch.Tensor, n))]
    tensor += ["is_floating_point", "is_signed"]
    areas["tensor"] = sorted({n for n in tensor if _kept(f"Tensor.{n}") and n not in TENSOR_EXCLUDED})

    optim = [f"optim.{n}" for n in _public(torch.optim, lambda o: isinstance(o, type))
             if n not in ("SparseAdam", "Optimizer")]
    sched = [f"optim.lr_scheduler.{n}" for n in _public(torch.optim.lr_scheduler, lambda o: isinstance(o, type))
             if getattr(torch.optim.lr_scheduler, n).__module__ == "torch.optim.lr_scheduler"]
    swa = [f"optim.swa_utils.{n}" for n in _public(torch.optim.swa_utils)
           if getattr(getattr(torch.optim.swa_utils, n), "__module__", "") == "torch.optim.swa_utils"]
    areas["optim"] = sorted(optim + sched + swa)
    return areas


def resolve(root, dotted: str):
    """The object at root.dotted, importing submodules as needed; None when absent."""
    obj, path = root, root.__name__
    for part in dotted.split("."):
        path = f"{path}.{part}"
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        try:
            obj = importlib.import_module(path)
        except Exception:
            return None
    return obj


# ---------------------------------------------------------------------------------------------------------------
# Probing behaviour (torch.* functions and Tensor methods).
# ---------------------------------------------------------------------------------------------------------------

PROBE_EXEMPT = {"manual_seed", "seed", "initial_seed", "get_rng_state", "set_rng_state", "save", "load",
                "set_default_dtype", "get_default_dtype", "set_printoptions", "set_num_threads", "get_num_threads",
                "register_hook", "backward", "retain_grad", "numpy", "tolist", "item", "data_ptr", "requires_grad_",
                "detach_", "share_memory_", "to", "autograd.backward", "autograd.grad", "autograd.gradcheck",
                "autograd.gradgradcheck", "autograd.Function", "autograd.detect_anomaly", "autograd.set_detect_anomaly",
                "autograd.no_grad", "autograd.enable_grad", "autograd.inference_mode", "autograd.set_grad_enabled",
                "is_grad_enabled", "is_inference_mode_enabled", "register_post_accumulate_grad_hook"}
# torch still accepts legacy positional overloads for these (add(x, alpha, other)) and warns once per process
LEGACY_OVERLOADS = {"add", "sub", "subtract", "addcmul", "addcdiv", "add_", "sub_", "subtract_", "addcmul_",
                    "addcdiv_"}
RANDOM = re.compile(r"rand|bernoulli|multinomial|normal|poisson|binomial|uniform_|exponential_|geometric_|"
                    r"cauchy_|log_normal_|random_|dropout|empty|gumbel")


def _inputs(torch):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(3, 4, generator=g, dtype=torch.float64) * 0.8 + 0.1
    y = torch.rand(3, 4, generator=g, dtype=torch.float64) * 0.8 + 0.1
    v = torch.rand(4, generator=g, dtype=torch.float64) * 0.8 + 0.1
    a = torch.rand(3, 3, generator=g, dtype=torch.float64)
    m = a @ a.T + 3 * torch.eye(3, dtype=torch.float64)
    i = torch.tensor([[0, 1, 2, 1], [2, 0, 1, 0], [1, 1, 0, 2]])
    b = x > 0.5
    return dict(x=x, y=y, v=v, m=m, i=i, b=b)


# each candidate: a tuple of argument names (from _inputs) or literals; the first is `self` for methods
CANDIDATES = [
    ("x",), ("x", "y"), ("x", 1), ("x", 0), ("x", -1), ("x", 2), ("x", 0.5), ("x", "y", "y"), ("x", "y", 0.5),
    ("v",), ("v", "v"), ("m",), ("m", "m"), ("m", "v3"), ("i",), ("i", "i"), ("b",), ("b", "b"), ("x", "b"),
    ("b", "x", "y"), ("x", 1, "i"), ("x", 1, "i", "y"), ("x", 0, "i0"), ("x", 0, "i0", "y0"), ("x", "b", 0.0),
    ("x", 1, 2), ("x", 0, 1), ("x", (1, 0)), ("x", (4, 3)), ("x", 2, 1), ("v", 2), ("x", "i"), ("v", "v", "v"),
    ("x", "y", 1), ("m", "m", "m"), ("x", "v"), ("x", 0.2, 0.7), ("tensors",), ("x", "x34"), ("x", "x43"),
    ("x", "x43", "y"), ("x", 1, True), ("x", "float64"), ("v", 0, 2), ("x3",), ("x3", "x3", "x3"), (3,), (2, 3),
    ((2, 3),), (1, 7, 2), ("b3", "b3t"), ("x", 1, 1, 2), ("x", 1, (2, 2)), ("v", (3, 4)), ("v", 3, 4), ("x", 1, "iv"),
    ("x", (2,), 1.5), ("float64", "int64"), ("x", "y", "b"), ("x", "iv"), ("v", "iv"), ("x", 1, "i", "add"),
]


def _materialize(torch, name, values):
    """The value a candidate argument name stands for, in the library `torch` (torch or runtime)."""
    if not isinstance(name, str):
        return name
    if name in ("float64", "int64"):
        return getattr(torch, name)
    if name in ("b3", "b3t"):
        t = values["x"].reshape(2, 3, 2) if name == "b3" else values["y"].reshape(2, 2, 3)
        return t
    if name == "iv":
        return torch.tensor([0, 2])
    if name == "tensors":
        return [values["x"], values["y"]]
    if name == "v3":
        return values["v"][:3]
    if name == "i0":
        return values["i"][:2]
    if name == "y0":
        return values["y"][:2]
    if name == "x34":
        return values["y"] * 2
    if name == "x43":
        return values["y"].T.contiguous()
    if name == "x3":
        return values["x"][:3, :3].contiguous()
    return values.get(name, name)  # any other string is a literal argument ("add" for scatter's reduce)


def _to_numpy(value):
    import numpy as np

    if hasattr(value, "detach") and hasattr(value, "numpy"):
        value = value.detach()
        if str(value.dtype).endswith("bfloat16"):  # torch's numpy() refuses bfloat16; its values are float32's
            value = value.float()
        return np.asarray(value.numpy())
    return value


def _same(ref, got, shape_only: bool) -> bool:
    import numpy as np

    if isinstance(ref, (tuple, list)):
        return isinstance(got, (tuple, list)) and len(ref) == len(got) and all(
            _same(r, g, shape_only) for r, g in zip(ref, got))
    if hasattr(ref, "dtype") and hasattr(ref, "shape") and type(ref).__module__.startswith("torch"):
        if not (hasattr(got, "dtype") and hasattr(got, "shape")):
            return False
        if tuple(ref.shape) != tuple(got.shape) or str(ref.dtype).split(".")[-1] != str(got.dtype).split(".")[-1]:
            return False
        if shape_only:
            return True
        r, g = _to_numpy(ref), _to_numpy(got)
        if r.dtype.kind in "fc":
            return bool(np.allclose(r, g, rtol=1e-6, atol=1e-9, equal_nan=True))
        return bool(np.array_equal(r, g))
    if isinstance(ref, (bool, int, float)):
        return isinstance(got, (bool, int, float)) and (ref == got or abs(ref - got) <= 1e-6 * max(1, abs(ref)))
    if type(ref).__name__ in ("dtype", "Size", "device"):
        return str(ref).split(".")[-1] == str(got).split(".")[-1]
    return type(ref).__name__ == type(got).__name__


def probe(torch, runtime, name: str, method: bool):
    """'ok', 'differs: ...' or 'unprobed' (torch accepted no candidate)."""
    accepted, problems = 0, []
    for candidate in CANDIDATES:
        if name.rsplit(".", 1)[-1] in LEGACY_OVERLOADS and len(candidate) > 2 and not isinstance(candidate[1], str):
            continue
        t_in = _inputs(torch)
        r_in = {k: runtime.tensor(v.numpy().copy()) for k, v in t_in.items()}
        t_args = [_materialize(torch, a, t_in) for a in candidate]
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("always")
            try:
                t_fn = getattr(t_args[0], name) if method else resolve(torch, name)
                ref = t_fn(*t_args[1:]) if method else t_fn(*t_args)
            except Exception:
                continue
            if any("deprecated" in str(w.message) for w in caught):
                continue  # a legacy overload (torch.add(x, 1, other)): not what a program should rely on
            accepted += 1
            r_args = [_materialize(runtime, a, r_in) for a in candidate]
            try:
                r_fn = getattr(r_args[0], name) if method else resolve(runtime, name)
                got = r_fn(*r_args[1:]) if method else r_fn(*r_args)
            except Exception as e:
                problems.append(f"{_show(candidate)} raises {type(e).__name__}: {str(e)[:80]}")
                continue
            if not _same(ref, got, bool(RANDOM.search(name))):
                problems.append(f"{_show(candidate)} gives a different result")
            elif method and name.endswith("_") and not _same(t_args[0], r_args[0], bool(RANDOM.search(name))):
                problems.append(f"{_show(candidate)} leaves self different")
    if not accepted:
        return "unprobed"
    return "ok" if not problems else "differs: " + problems[0]


def _show(candidate) -> str:
    return "(" + ", ".join(str(a) for a in candidate) + ")"


# ---------------------------------------------------------------------------------------------------------------
# Report.
# ---------------------------------------------------------------------------------------------------------------


def measure(areas=None, probe_functional=False) -> dict:
    import torch

    import runtime

    out = {}
    for area, names in universe(torch).items():
        if areas and area not in areas:
            continue
        rows = {}
        for name in names:
            obj = getattr(runtime.Tensor, name, None) if area == "tensor" else resolve(runtime, name)
            if obj is None or not callable(obj):
                rows[name] = "missing"
            elif (area in ("torch", "tensor") or (area == "functional" and probe_functional)) \
                    and name not in PROBE_EXEMPT:
                rows[name] = probe(torch, runtime, name, method=area == "tensor")
            else:
                rows[name] = "present"
        out[area] = rows
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--missing", action="store_true", help="list the missing and differing names")
    parser.add_argument("--area", action="append", help="only these areas (nn, functional, torch, tensor, optim)")
    parser.add_argument("--json", action="store_true", help="print the per-name table as JSON")
    parser.add_argument("--probe-functional", action="store_true",
                        help="probe nn.functional names too (the candidate calls fit few of them: most are unprobed)")
    args = parser.parse_args(argv)
    result = measure(args.area, args.probe_functional)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{'area':<12}{'universe':>9}{'present':>9}{'behaves':>9}{'differs':>9}{'unprobed':>9}")
    for area, rows in result.items():
        n = len(rows)
        present = sum(v != "missing" for v in rows.values())
        ok = sum(v in ("ok", "present") for v in rows.values())
        differs = sum(v.startswith("differs") for v in rows.values())
        unprobed = sum(v == "unprobed" for v in rows.values())
        print(f"{area:<12}{n:>9}{present:>9}{ok:>9}{differs:>9}{unprobed:>9}")
    if args.missing:
        for area, rows in result.items():
            missing = [k for k, v in rows.items() if v == "missing"]
            print(f"\n{area}: {len(missing)} missing\n  " + " ".join(missing))
            for k, v in rows.items():
                if v.startswith("differs"):
                    print(f"  {k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
