"""What holds without a GPU: the package imports, its operators are registered, their
fake implementations give the output shapes (and the library's errors), and tensors
that are not on a CUDA device are refused with an error naming the argument."""

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import gpu_kernels

OPS = ["cumsum", "min", "amin", "matvec", "conv2d", "conv2d_backward"]


def meta(*shape, dtype=torch.float32):
    return torch.empty(shape, device="meta", dtype=dtype)


@pytest.mark.parametrize("name", OPS)
def test_operators_are_registered_with_torch_library(name):
    op = getattr(torch.ops.gpu_kernels, name)
    assert op.default._schema.name == f"gpu_kernels::{name}"


def test_fake_tensors_have_the_output_shapes():
    x = meta(4, 6, 5)
    assert gpu_kernels.cumsum(x, -1, exclusive=True).shape == (4, 6, 5)
    values, indices = gpu_kernels.min(x, 1)
    assert values.shape == (4, 5) and indices.dtype == torch.int64
    assert gpu_kernels.amin(x, 0, keepdim=True).shape == (1, 6, 5)
    assert gpu_kernels.matvec(meta(7, 5), meta(5)).shape == (7,)
    assert gpu_kernels.matvec(meta(7, 5), meta(5, 1)).shape == (7, 1)
    assert gpu_kernels.matvec(meta(7, 5), meta(7, 8)[:5]).shape == (7, 8)
    assert gpu_kernels.matvec(meta(7, 5), meta(7), transpose=True).shape == (5,)
    y = gpu_kernels.conv2d(meta(2, 6, 9, 11), meta(4, 3, 3, 3), stride=2, padding=(1, 2), groups=2)
    assert y.shape == (2, 4, 5, 7)
    nhwc = meta(2, 6, 9, 11).contiguous(memory_format=torch.channels_last)
    assert gpu_kernels.conv2d(nhwc, meta(4, 6, 3, 3)).is_contiguous(memory_format=torch.channels_last)


def test_fake_tensors_raise_the_librarys_errors():
    with pytest.raises(IndexError, match="dim 3 is out of range for a tensor of rank 3"):
        gpu_kernels.cumsum(meta(2, 3, 4), 3)
    with pytest.raises(ValueError, match="the axis is empty"):
        gpu_kernels.min(meta(2, 0, 4), 1)
    with pytest.raises(ValueError, match="shape mismatch"):
        gpu_kernels.matvec(meta(7, 5), meta(6))
    with pytest.raises(ValueError, match=r"the weight w .* has shape \[4, 5, 3, 3\], expected \[4, 6, 3, 3\]"):
        gpu_kernels.conv2d(meta(2, 6, 9, 9), meta(4, 5, 3, 3))
    with pytest.raises(ValueError, match='activation "tanh": expected one of "identity", "relu"'):
        gpu_kernels.conv2d(meta(2, 6, 9, 9), meta(4, 6, 3, 3), activation="tanh")
    with pytest.raises(ValueError, match="stride"):
        gpu_kernels.conv2d(meta(2, 6, 9, 9), meta(4, 6, 3, 3), stride=(1, 2, 3))
    with pytest.raises(ValueError, match=r"A\^T takes one vector"):
        gpu_kernels.matvec(meta(7, 5), meta(7, 2), transpose=True)


@pytest.mark.parametrize(
    "call, argument",
    [
        (lambda: gpu_kernels.cumsum(torch.ones(3), 0), "x"),
        (lambda: gpu_kernels.min(torch.ones(3), 0), "x"),
        (lambda: gpu_kernels.amin(torch.ones(3), 0), "x"),
        (lambda: gpu_kernels.matvec(torch.ones(3, 2), torch.ones(2)), "a"),
        (lambda: gpu_kernels.conv2d(torch.ones(1, 1, 3, 3), torch.ones(1, 1, 1, 1)), "x"),
    ],
)
def test_cpu_tensors_are_refused_naming_the_argument(call, argument):
    with pytest.raises(ValueError, match=f": {argument} must be a CUDA tensor, got a tensor on cpu"):
        call()


def test_non_tensors_are_refused():
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
        gpu_kernels.ops._check("cumsum", "x", [1.0], gpu_kernels.ops._CUMSUM_DTYPES)


def test_without_a_gpu_opening_the_device_says_why():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the GPU tests cover it")
    with pytest.raises(RuntimeError, match="no usable CUDA device"):
        gpu_kernels.device_info(0)


class _DispatchPassthrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _FunctionPassthrough(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_calls_inside_a_mode_go_through_the_operator():
    # Eager calls skip PyTorch's dispatcher only where nothing would see the operator.
    assert gpu_kernels.ops._plain()
    with _DispatchPassthrough():
        assert not gpu_kernels.ops._plain()
    with _FunctionPassthrough():
        assert not gpu_kernels.ops._plain()
    assert gpu_kernels.ops._plain()


def test_out_is_checked_naming_it():
    check = gpu_kernels.ops._check_out
    with pytest.raises(TypeError, match="cumsum: out must be a torch.Tensor, got list"):
        check("cumsum", "out", [0.0], 0, [3], torch.float32)
    with pytest.raises(ValueError, match=r"min: out\[0\] is on cpu; the result is on cuda:0"):
        check("min", "out[0]", torch.empty(3), 0, [3], torch.float32)
    with pytest.raises(TypeError, match="out has dtype torch.float64; the result has torch.float32"):
        check("amin", "out", torch.empty(3, dtype=torch.float64), -1, [3], torch.float32)
    with pytest.raises(ValueError, match=r"out has shape \[3\]; the result has \[3, 1\]"):
        check("matvec", "out", torch.empty(3), -1, [3, 1], torch.float32)
    check("matvec", "out", torch.empty(3, 1), -1, [3, 1], torch.float32)


def test_results_go_straight_into_out_only_where_the_kernels_can_write_it():
    writable = gpu_kernels.ops._writable
    base = torch.zeros(256)
    x, out = base[:64], base[128:192]
    assert writable(out, (x,)) is out
    assert writable(x, (x,), same_as_first=True) is x  # an in-place scan
    for target in (
        x,  # in place where the op cannot be
        base[32:96],  # overlapping its input
        base[129:193],  # misaligned
        base[:128].view(64, 2).T,  # not contiguous
    ):
        stand_in = writable(target, (x,))
        assert stand_in is not target and stand_in.is_contiguous() and stand_in.shape == target.shape
    target = base[:128].view(64, 2).T
    written = writable(target, (x,))
    written.copy_(torch.arange(128.0).view(2, 64))
    assert gpu_kernels.ops._delivered(target, written) is target
    assert torch.equal(target, torch.arange(128.0).view(2, 64))
