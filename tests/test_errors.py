"""Bad input gives clear errors that name what was wrong, never a raw numpy traceback.

Every check runs against runtime alone; when torch is installed, the exception type is also compared
with torch's for the same call (runtime's error must be an instance of torch's builtin error class).
"""
import re
import traceback

import numpy as np
import pytest

import runtime

from helpers import torch  # None without torch: the runtime-only assertions still run

DATA_RNG = np.random.default_rng(7)
NUMPY_WORDS = ("ufunc", "operands could not be broadcast", "numpy.core", "numpy._core")


def _builtin_base(exc_type):
    """The first builtin exception class in exc_type's MRO (torch's errors may subclass them)."""
    for cls in exc_type.__mro__:
        if cls.__module__ == "builtins":
            return cls
    return Exception


def assert_clear(err):
    """The error is raised by runtime itself, not leaked from numpy, and its message has no numpy jargon."""
    frames = traceback.extract_tb(err.__traceback__)
    assert frames, "no traceback"
    last = frames[-1].filename.replace("\\", "/")
    assert "/numpy/" not in last, f"raised from inside numpy: {last}"
    assert err.__cause__ is None, f"chained to {err.__cause__!r}"
    assert err.__context__ is None or err.__suppress_context__, f"shows context {err.__context__!r}"
    message = str(err).lower()
    for word in NUMPY_WORDS:
        assert word not in message, f"numpy jargon {word!r} in message: {err}"


def check_error(call, expected_type, *substrings, torch_call=None, compare_torch=True):
    """call(runtime) raises expected_type with every substring (str or compiled regex) in its message;
    the same call on torch (or torch_call(torch)) raises a compatible type. Returns runtime's exception."""
    with pytest.raises(expected_type) as info:
        call(runtime)
    err = info.value
    message = str(err)
    for s in substrings:
        if isinstance(s, re.Pattern):
            assert s.search(message), f"{s.pattern!r} not found in: {message}"
        else:
            assert s in message, f"{s!r} not found in: {message}"
    assert_clear(err)
    if torch is not None and compare_torch:
        with pytest.raises(Exception) as t_info:
            (torch_call or call)(torch)
        t_type = _builtin_base(type(t_info.value))
        assert isinstance(err, t_type), (
            f"torch raises {type(t_info.value).__name__} ({t_info.value}); runtime raises "
            f"{type(err).__name__} ({err})")
    return err


def floats(m, *shape, dtype=None):
    data = DATA_RNG.standard_normal(shape).astype(np.float32)
    return m.tensor(data, dtype=dtype)


def shape_named(shape):
    """Either '[2, 3]' or '2x3' (torch's mm style) names the shape."""
    square = re.escape("[" + ", ".join(map(str, shape)) + "]")
    cross = re.escape("x".join(map(str, shape)))
    paren = re.escape("(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")")
    return re.compile(f"{square}|(?<![\\dx]){cross}(?![\\dx])|{paren}")


# ---------------------------------------------------------------------------------------------
# matmul
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("a,b", [((2, 3), (4, 5)), ((3,), (4,)), ((2, 3), (4,)), ((5,), (4, 2)),
                                 ((2, 2, 3), (2, 4, 5)), ((7, 3), (2, 4, 5))])
def test_matmul_shape_mismatch_names_both_shapes(a, b):
    check_error(lambda m: floats(m, *a) @ floats(m, *b), RuntimeError, shape_named(a), shape_named(b))
    check_error(lambda m: m.matmul(floats(m, *a), floats(m, *b)), RuntimeError, shape_named(a), shape_named(b))


def test_mm_shape_mismatch():
    check_error(lambda m: m.ones(2, 3).mm(m.ones(2, 3)), RuntimeError, shape_named((2, 3)))


def test_matmul_dtype_mismatch_names_both_dtypes():
    err = check_error(lambda m: floats(m, 2, 3) @ floats(m, 3, 2, dtype=m.float64), RuntimeError)
    message = str(err)
    assert "float32" in message and "float64" in message, message


def test_matmul_zero_dim():
    check_error(lambda m: m.tensor(2.0) @ m.ones(3), RuntimeError, "1D")


# ---------------------------------------------------------------------------------------------
# broadcasting
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "maximum", "eq", "lt", "pow"])
def test_non_broadcastable_shapes_name_the_sizes(op):
    err = check_error(lambda m: getattr(m, op)(m.ones(3), m.ones(4)), RuntimeError, "(3)", "(4)")
    assert "dimension 0" in str(err)


def test_non_broadcastable_2d_names_sizes_and_dimension():
    check_error(lambda m: m.ones(2, 3) * m.ones(3, 2), RuntimeError, "(3)", "(2)", "non-singleton dimension")


def test_where_non_broadcastable():
    check_error(lambda m: m.where(m.ones(3) > 0, m.ones(3), m.ones(4)), RuntimeError, "(3)", "(4)")


def test_expand_incompatible():
    check_error(lambda m: m.ones(2, 3).expand(4, 3), RuntimeError, "4", "[2, 3]")


# ---------------------------------------------------------------------------------------------
# dtype errors
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cond_dtype", ["int64", "int32", "float32"])
def test_where_with_non_bool_condition(cond_dtype):
    err = check_error(lambda m: m.where(m.tensor([1, 0, 1], dtype=getattr(m, cond_dtype)), m.ones(3), m.zeros(3)),
                      RuntimeError, "bool")
    assert cond_dtype in str(err) or {"int64": "Long", "int32": "Int", "float32": "Float"}[cond_dtype] in str(err)


def test_requires_grad_on_int_tensor():
    for make in [lambda m: m.tensor([1, 2], requires_grad=True),
                 lambda m: m.tensor([1, 2]).requires_grad_(),
                 lambda m: m.zeros(2, dtype=m.int64, requires_grad=True),
                 lambda m: m.tensor([True, False], requires_grad=True)]:
        check_error(make, RuntimeError, re.compile("(?i)floating point"))

    def set_attr(m):
        t = m.tensor([1, 2], dtype=m.int32)
        t.requires_grad = True

    check_error(set_attr, RuntimeError, re.compile("(?i)floating point"))


def test_float_index_tensor():
    check_error(lambda m: m.ones(3)[m.tensor([0.0, 1.0])], IndexError, "long", "bool")


def test_unsupported_numpy_dtype():
    err = check_error(lambda m: m.from_numpy(np.array(["a", "b"])), TypeError)
    assert "float32" in str(err)  # lists what is supported


def test_ragged_data():
    check_error(lambda m: m.tensor([[1, 2], [3]]), ValueError)


# ---------------------------------------------------------------------------------------------
# indexing
# ---------------------------------------------------------------------------------------------

def _index_message(index, size):
    return re.compile(rf"(?<!\d){index}(?!\d)"), re.compile(rf"size\D*{size}(?!\d)|\[{size}\]|\({size},?\)")


@pytest.mark.parametrize("index", [5, 3, -4])
def test_int_index_out_of_range_names_index_and_size(index):
    check_error(lambda m: m.ones(3)[index], IndexError, *_index_message(index, 3))


def test_int_index_out_of_range_in_second_dim():
    check_error(lambda m: m.ones(2, 4)[1, 7], IndexError, *_index_message(7, 4))


@pytest.mark.parametrize("call", [
    lambda m: m.ones(3)[5], lambda m: m.ones(2, 4)[1, 7], lambda m: m.ones(3)[m.tensor([0, 9])],
    lambda m: m.ones(3).__setitem__(5, 0.0),
], ids=["getitem", "getitem_2d", "tensor_index", "setitem"])
def test_index_errors_say_dimension_not_axis(call):
    """torch (and runtime's own op errors) say 'dimension'; numpy's 'axis' must not leak through."""
    err = check_error(call, IndexError, "dimension")
    assert "axis" not in str(err), str(err)


def test_tensor_index_out_of_range():
    check_error(lambda m: m.ones(3)[m.tensor([0, 9])], IndexError, *_index_message(9, 3))
    check_error(lambda m: m.ones(3)[[1, -5]], IndexError, *_index_message(-5, 3))


def test_too_many_indices():
    check_error(lambda m: m.ones(2, 3)[0, 0, 0], IndexError, re.compile(r"\b2\b"))


def test_bool_mask_wrong_shape():
    check_error(lambda m: m.ones(3)[m.tensor([True, False])], IndexError, re.compile(r"\b2\b"), re.compile(r"\b3\b"))


def test_setitem_index_out_of_range():
    def call(m):
        t = m.ones(3)
        t[5] = 0.0

    check_error(call, IndexError, *_index_message(5, 3))


@pytest.mark.parametrize("method,args,kind", [("select", (0, 4), IndexError), ("narrow", (0, 2, 5), RuntimeError)])
def test_select_narrow_out_of_range(method, args, kind):
    check_error(lambda m: getattr(m.ones(3, 2), method)(*args), kind, str(args[1]))


@pytest.mark.parametrize("call", [
    lambda m: m.ones(2, 3).sum(3), lambda m: m.ones(2, 3).size(2), lambda m: m.ones(2, 3).softmax(-3),
    lambda m: m.ones(2, 3).transpose(0, 2), lambda m: m.ones(2, 3).unsqueeze(4),
    lambda m: m.cat([m.ones(2), m.ones(2)], dim=1),
], ids=["sum", "size", "softmax", "transpose", "unsqueeze", "cat"])
def test_dim_out_of_range(call):
    check_error(call, IndexError, re.compile(r"(?i)dimension out of range"))


# ---------------------------------------------------------------------------------------------
# shapes
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["reshape", "view"])
def test_reshape_to_incompatible_size(method):
    check_error(lambda m: getattr(m.ones(2, 3), method)(4, 2), RuntimeError, "[4, 2]", "6")
    check_error(lambda m: getattr(m.ones(2, 3), method)(4, -1), RuntimeError, "6")
    check_error(lambda m: getattr(m.ones(2, 3), method)(-1, -1), RuntimeError, "one dimension")


def test_view_of_non_contiguous_tensor():
    check_error(lambda m: m.ones(2, 3).t().view(6), RuntimeError, "view", "reshape")
    check_error(lambda m: m.ones(4, 4)[:, :2].view(8), RuntimeError, "view", "reshape")
    # a strided tensor whose elements are evenly spaced can be viewed, as in torch
    base = runtime.zeros(4, 4)
    flat = base[:, ::2].view(8)
    flat.fill_(1.0)
    assert base.sum().item() == 8.0


def test_cat_and_stack_mismatch():
    check_error(lambda m: m.cat([m.ones(2, 3), m.ones(2, 4)]), RuntimeError, re.compile(r"\b3\b"), re.compile(r"\b4\b"))
    check_error(lambda m: m.cat([m.ones(2, 3), m.ones(3)]), RuntimeError)
    check_error(lambda m: m.stack([m.ones(2, 3), m.ones(2, 4)]), RuntimeError, "[2, 3]", "[2, 4]")


def test_cat_empty_list():
    check_error(lambda m: m.cat([]), (RuntimeError, ValueError), "non-empty")


def test_permute_bad_dims():
    check_error(lambda m: m.ones(2, 3).permute(0, 0), RuntimeError)


# ---------------------------------------------------------------------------------------------
# autograd
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", [
    lambda x: x.add_(1), lambda x: x.mul_(2), lambda x: x.zero_(), lambda x: x.fill_(3.0),
    lambda x: x.copy_(x.detach() * 2), lambda x: x.clamp_(0, 1), lambda x: x.__setitem__(0, 5.0),
    lambda x: x.__iadd__(1), lambda x: x.uniform_(),
], ids=["add_", "mul_", "zero_", "fill_", "copy_", "clamp_", "setitem", "iadd", "uniform_"])
def test_inplace_on_leaf_that_requires_grad(op):
    data = DATA_RNG.standard_normal(3).astype(np.float32)
    leaves = {}

    def call(m):
        leaves[m.__name__] = x = m.tensor(data, requires_grad=True)
        op(x)

    check_error(call, RuntimeError, "leaf", "in-place")
    np.testing.assert_array_equal(leaves["runtime"].detach().numpy(), data)  # left unchanged
    assert leaves["runtime"].grad_fn is None and leaves["runtime"].is_leaf


def test_inplace_on_view_of_leaf_that_requires_grad():
    check_error(lambda m: m.ones(3, requires_grad=True)[:2].add_(1), RuntimeError, "leaf", "in-place")


def test_inplace_on_leaf_allowed_under_no_grad():
    x = runtime.ones(3, requires_grad=True)
    with runtime.no_grad():
        x.add_(1)
    np.testing.assert_array_equal(x.detach().numpy(), [2.0, 2.0, 2.0])
    assert x.requires_grad and x.is_leaf


@pytest.mark.parametrize("make", [
    lambda m, x: x.exp().sum(), lambda m, x: (x * x).sum(), lambda m, x: x.sigmoid().mean(),
    lambda m, x: (x.sin() * 2).sum(),
], ids=["exp", "mul", "sigmoid", "sin"])
def test_second_backward_through_freed_graph(make):
    def call(m):
        x = m.ones(3, requires_grad=True)
        y = make(m, x)
        y.backward()
        y.backward()

    check_error(call, RuntimeError, "Trying to backward through the graph a second time", "retain_graph=True")


def test_second_backward_with_retain_graph_works():
    x = runtime.ones(3, requires_grad=True)
    y = x.exp().sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * np.exp(np.ones(3, dtype=np.float32)), rtol=1e-6)


def test_autograd_grad_twice_through_freed_graph():
    def call(m):
        x = m.ones(3, requires_grad=True)
        y = (x * x).sum()
        m.autograd.grad(y, x)
        m.autograd.grad(y, x)

    check_error(call, RuntimeError, "Trying to backward through the graph a second time")


def test_backward_on_non_scalar_without_gradient():
    check_error(lambda m: (m.ones(3, requires_grad=True) * 2).backward(), RuntimeError,
                "grad can be implicitly created only for scalar outputs")


def test_backward_on_tensor_without_grad():
    check_error(lambda m: m.ones(3).sum().backward(), RuntimeError, "does not require grad")


def test_backward_with_wrong_gradient_shape():
    check_error(lambda m: (m.ones(3, requires_grad=True) * 2).backward(m.ones(4)), RuntimeError,
                re.compile(r"\[4\]|\b4\b"), re.compile(r"\[3\]|\b3\b"))


def test_saved_tensor_modified_in_place():
    def call(m):
        x = m.ones(3, requires_grad=True)
        y = x * 2
        z = y.sin()
        y.add_(1)
        z.sum().backward()

    check_error(call, RuntimeError, "modified by an inplace operation")


def test_assign_grad_of_wrong_shape():
    def call(m):
        x = m.ones(3, requires_grad=True)
        x.grad = m.ones(4)

    check_error(call, RuntimeError, re.compile(r"\b4\b"), re.compile(r"\b3\b"))


# ---------------------------------------------------------------------------------------------
# conversions
# ---------------------------------------------------------------------------------------------

def test_item_on_multi_element_tensor():
    check_error(lambda m: m.ones(3).item(), RuntimeError, "3 elements")
    check_error(lambda m: m.ones(2, 2).item(), RuntimeError, "4 elements")
    check_error(lambda m: m.ones(0).item(), RuntimeError, "0 elements")


def test_bool_of_multi_element_tensor():
    check_error(lambda m: bool(m.ones(3)), RuntimeError, "ambiguous")


@pytest.mark.skipif(runtime.cuda.is_available(), reason="this machine has CUDA (tests/cuda covers it)")
def test_cuda_unavailable():
    # torch's CPU build raises AssertionError here; runtime promises a RuntimeError that names CUDA
    check_error(lambda m: m.ones(2).cuda(), RuntimeError, re.compile("(?i)cuda"), compare_torch=False)
    check_error(lambda m: m.ones(2, device="cuda"), RuntimeError, re.compile("(?i)cuda"), compare_torch=False)


def test_randint_bad_bounds():
    check_error(lambda m: m.randint(5, 2, (3,)), RuntimeError, "5", "2")


# ---------------------------------------------------------------------------------------------
# a failed in-place op leaves the tensor unchanged
# ---------------------------------------------------------------------------------------------

FAILING_INPLACE = {
    "add_broadcast_bigger": (lambda m, x: x.add_(m.ones(2, 3)), "float32"),
    "mul_wrong_size": (lambda m, x: x.mul_(m.ones(4)), "float32"),
    "int_add_float": (lambda m, x: x.add_(m.tensor([0.5, 0.5, 0.5])), "int64"),
    "int_mul_float_scalar": (lambda m, x: x.mul_(1.5), "int64"),
    "int_div": (lambda m, x: x.div_(2), "int64"),
    "copy_wrong_size": (lambda m, x: x.copy_(m.ones(4)), "float32"),
    "setitem_wrong_shape": (lambda m, x: x.__setitem__(slice(None), m.ones(4)), "float32"),
    "setitem_out_of_range": (lambda m, x: x.__setitem__(m.tensor([0, 7]), 1.0), "float32"),
    "iadd_wrong_size": (lambda m, x: x.__iadd__(m.ones(5)), "float32"),
}


@pytest.mark.parametrize("name", list(FAILING_INPLACE))
def test_failed_inplace_leaves_tensor_unchanged(name):
    op, dtype = FAILING_INPLACE[name]
    data = np.array([1, 2, 3]).astype(dtype)
    seen = {}

    def call(m):
        x = m.tensor(data.copy())
        seen[m.__name__] = x
        op(m, x)

    check_error(call, (RuntimeError, IndexError))
    x = seen["runtime"]
    np.testing.assert_array_equal(x.numpy(), data)
    assert x.dtype is getattr(runtime, dtype)
    assert x._version == 0  # nothing was written


def test_failed_inplace_on_recorded_tensor_keeps_history():
    x = runtime.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 2
    before = y.detach().numpy().copy()
    with pytest.raises(RuntimeError) as info:
        y.add_(runtime.ones(2, 3))
    assert_clear(info.value)
    np.testing.assert_array_equal(y.detach().numpy(), before)
    assert y.grad_fn.name() == "MulBackward0"
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 2.0, 2.0])


# ---------------------------------------------------------------------------------------------
# more bad input found by probing: each must be runtime's own clear error
# ---------------------------------------------------------------------------------------------

def test_matmul_int_float_mismatch_names_both_dtypes():
    err = check_error(lambda m: m.tensor([[1, 2]]) @ m.ones(2, 1), RuntimeError)
    assert "int64" in str(err) and "float32" in str(err), str(err)


def test_masked_fill_with_non_bool_mask():
    check_error(lambda m: m.ones(3).masked_fill(m.tensor([1, 0, 1]), 0.0), RuntimeError, "bool")


@pytest.mark.parametrize("call", [
    lambda m: m.ones(3).gather(0, m.tensor([5])),
    lambda m: m.zeros(3).scatter_add(0, m.tensor([7]), m.ones(1)),
], ids=["gather", "scatter_add"])
def test_gather_scatter_index_out_of_range(call):
    check_error(call, RuntimeError, "out of bounds", "size 3")


@pytest.mark.parametrize("call", [
    lambda m: m.zeros(-1), lambda m: m.ones(2, -3), lambda m: m.empty(-2), lambda m: m.full((-1,), 1.0),
    lambda m: m.eye(-1), lambda m: m.linspace(0, 1, -1),
], ids=["zeros", "ones", "empty", "full", "eye", "linspace"])
def test_negative_sizes(call):
    check_error(call, RuntimeError, re.compile(r"(?i)negative|non-negative|-1|-2|-3|greater or equal"))


@pytest.mark.parametrize("convert", [int, float], ids=["int", "float"])
def test_python_number_of_multi_element_tensor(convert):
    check_error(lambda m: convert(m.ones(3)), ValueError, "one element")


def test_bitwise_op_on_float_tensor_has_no_numpy_message():
    with pytest.raises((TypeError, RuntimeError)) as info:
        runtime.ones(3) & runtime.ones(3)
    assert_clear(info.value)
    assert "float32" in str(info.value), str(info.value)


def test_negation_of_bool_tensor():
    check_error(lambda m: -m.tensor([True, False]), RuntimeError, "bool", "~")


def test_max_reduction_over_empty_dimension():
    check_error(lambda m: m.zeros(2, 0).amax(1), IndexError, "1")
    check_error(lambda m: m.zeros(0).max(), (RuntimeError, IndexError))
