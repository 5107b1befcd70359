"""Every operator against PyTorch on a GPU: random shapes, dtypes and dims, exact where
the data allows; torch.library.opcheck; gradients against gradcheck in float64; the
stream, non-contiguous and misaligned inputs."""

import random

import pytest
import torch
from torch.library import opcheck

import gpu_kernels

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="SKIPPED: no CUDA device here")

FLOATS = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def small_integers(shape, dtype, low=-8, high=8, seed=0):
    """Integers small enough that every sum the tests take is exact in `dtype`."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, shape, generator=generator).to(dtype).cuda()


def random_shape(rng, rank):
    return tuple(rng.choice([1, 2, 3, 7, 31, 64, 100, 513]) for _ in range(rank))


@pytest.mark.parametrize("dtype", FLOATS + [torch.int32, torch.int64])
@pytest.mark.parametrize("seed", range(6))
def test_cumsum_matches_torch(dtype, seed):
    rng = random.Random(seed)
    shape = random_shape(rng, rng.randint(1, 3))
    dim = rng.randrange(-len(shape), len(shape))
    # Small integers: every sum is exact in float32 (and float64), so rounding it once
    # to the element type, as both sides do, gives the same bits.
    x = small_integers(shape, dtype, -4, 4, seed)
    for exclusive in (False, True):
        for reverse in (False, True):
            expected = x.flip(dim) if reverse else x
            expected = torch.cumsum(expected.double(), dim)
            if exclusive:
                expected = expected - (x.flip(dim) if reverse else x).double()
            expected = (expected.flip(dim) if reverse else expected).to(dtype)
            got = gpu_kernels.cumsum(x, dim, exclusive=exclusive, reverse=reverse)
            assert torch.equal(got, expected), (shape, dim, exclusive, reverse)


@pytest.mark.parametrize("dtype", FLOATS + [torch.int32])
@pytest.mark.parametrize("seed", range(6))
def test_min_and_amin_match_torch(dtype, seed):
    rng = random.Random(seed)
    shape = random_shape(rng, rng.randint(1, 3))
    dim = rng.randrange(-len(shape), len(shape))
    keepdim = rng.random() < 0.5
    x = small_integers(shape, dtype, seed=seed)  # many ties: first indices matter
    if dtype.is_floating_point and x.numel() > 4:
        x.view(-1)[rng.randrange(x.numel())] = float("nan")
    values, indices = gpu_kernels.min(x, dim, keepdim)
    expected = torch.min(x, dim, keepdim)
    assert torch.equal(values, expected.values) or torch.allclose(values, expected.values, equal_nan=True)
    assert torch.equal(indices, expected.indices)
    torch.testing.assert_close(gpu_kernels.amin(x, dim, keepdim), torch.amin(x, dim, keepdim), equal_nan=True)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("columns", [None, 1, 2, 8, 16])
def test_matvec_matches_torch(dtype, columns):
    rng = random.Random(columns or 0)
    m, k = rng.choice([1, 5, 64, 333]), rng.choice([1, 3, 100, 1027])
    a = small_integers((m, k), dtype, -2, 2)
    shape = (k,) if columns is None else (k, columns)
    x = small_integers(shape, dtype, -2, 2, seed=1)
    expected = (a.double() @ x.double()).to(dtype)
    assert torch.equal(gpu_kernels.matvec(a, x), expected)
    if columns not in (None, 1):
        return  # A^T takes one vector
    xt = small_integers((m,) if columns is None else (m, columns), dtype, -2, 2, seed=2)
    assert torch.equal(gpu_kernels.matvec(a, xt, transpose=True), (a.double().T @ xt.double()).to(dtype))


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize(
    "stride, padding, dilation, groups",
    [(1, 0, 1, 1), (1, 1, 1, 1), (2, 1, 1, 1), (1, 2, 2, 1), (1, 1, 1, 2)],
)
def test_conv2d_matches_torch(channels_last, stride, padding, dilation, groups):
    x = small_integers((2, 8, 13, 17), torch.float32, -2, 2)
    w = small_integers((6, 8 // groups, 3, 3), torch.float32, -2, 2, seed=1)
    b = small_integers((6,), torch.float32, seed=2)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    expected = torch.nn.functional.conv2d(x.double(), w.double(), b.double(), stride, padding, dilation, groups)
    got = gpu_kernels.conv2d(x, w, b, stride, padding, dilation, groups, precision="fp32")
    assert got.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    assert torch.equal(got.double(), expected)
    relu = gpu_kernels.conv2d(x, w, b, stride, padding, dilation, groups, precision="fp32", activation="relu")
    assert torch.equal(relu.double(), expected.relu())
    skip = small_integers(expected.shape, torch.float32, seed=3)
    if channels_last:
        skip = skip.contiguous(memory_format=torch.channels_last)
    fused = gpu_kernels.conv2d(x, w, b, stride, padding, dilation, groups, "fp32", "relu", residual=skip)
    assert torch.equal(fused.double(), expected.relu() + skip.double())


@pytest.mark.parametrize("channels_last", [False, True])
def test_conv2d_gradients_match_float64(channels_last):
    torch.manual_seed(0)
    x = torch.randn(2, 8, 15, 9, device="cuda")
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(6, 8, 3, 3, device="cuda"), torch.randn(6, device="cuda")
    inputs = [t.requires_grad_() for t in (x, w, b)]
    wide = [t.detach().double().requires_grad_() for t in (x, w, b)]
    y = torch.nn.functional.conv2d(*wide, padding=1)
    grad = torch.randn_like(y)
    expected = torch.autograd.grad(y, wide, grad)
    got = torch.autograd.grad(gpu_kernels.conv2d(*inputs, padding=1, precision="fp32"), inputs, grad.float())
    for g, e in zip(got, expected):
        assert (g.double() - e).norm() <= 1e-5 * e.norm()
    # A residual takes the output's gradient as it is.
    skip = torch.randn(y.shape, device="cuda", requires_grad=True)
    with_skip = gpu_kernels.conv2d(*inputs, padding=1, precision="fp32", residual=skip)
    (grad_skip,) = torch.autograd.grad(with_skip, (skip,), grad.float())
    assert torch.equal(grad_skip, grad.float())


def test_gradients_of_cumsum_min_and_matvec_pass_gradcheck():
    torch.manual_seed(0)
    x = torch.randn(5, 7, dtype=torch.float64, device="cuda", requires_grad=True)
    for exclusive in (False, True):
        for reverse in (False, True):
            assert torch.autograd.gradcheck(lambda t: gpu_kernels.cumsum(t, 1, exclusive, reverse), (x,))
    assert torch.autograd.gradcheck(lambda t: gpu_kernels.min(t, 0)[0], (x,))
    assert torch.autograd.gradcheck(lambda t: gpu_kernels.amin(t, 1, True), (x,))
    a = torch.randn(6, 5, dtype=torch.float64, device="cuda", requires_grad=True)
    v = torch.randn(5, dtype=torch.float64, device="cuda", requires_grad=True)
    columns = torch.randn(5, 3, dtype=torch.float64, device="cuda", requires_grad=True)
    column = torch.randn(6, 1, dtype=torch.float64, device="cuda", requires_grad=True)
    assert torch.autograd.gradcheck(gpu_kernels.matvec, (a, v))
    assert torch.autograd.gradcheck(gpu_kernels.matvec, (a, columns))
    assert torch.autograd.gradcheck(lambda a, c: gpu_kernels.matvec(a, c, True), (a, column))


def test_opcheck_passes_for_every_operator():
    x = torch.randn(6, 40, device="cuda", requires_grad=True)
    opcheck(torch.ops.gpu_kernels.cumsum, (x, 1, True, False))
    opcheck(torch.ops.gpu_kernels.min, (x, 0, True))
    opcheck(torch.ops.gpu_kernels.amin, (x, 1, False))
    a = torch.randn(33, 40, device="cuda", requires_grad=True)
    opcheck(torch.ops.gpu_kernels.matvec, (a, torch.randn(40, device="cuda", requires_grad=True), False))
    image = torch.randn(2, 4, 9, 9, device="cuda", requires_grad=True)
    w = torch.randn(5, 4, 3, 3, device="cuda", requires_grad=True)
    b = torch.randn(5, device="cuda", requires_grad=True)
    opcheck(torch.ops.gpu_kernels.conv2d, (image, w, b, None, [1, 1], [1, 1], [1, 1], 1, "fp32", "identity"))
    skip = torch.randn(2, 5, 9, 9, device="cuda", requires_grad=True)
    opcheck(torch.ops.gpu_kernels.conv2d, (image, w, b, skip, [1, 1], [1, 1], [1, 1], 1, "tf32", "identity"))
    grad_y = torch.randn(2, 5, 9, 9, device="cuda")
    opcheck(
        torch.ops.gpu_kernels.conv2d_backward,
        (grad_y, image.detach(), w.detach(), [1, 1], [1, 1], [1, 1], 1, "fp32", [True, True, True]),
    )


def test_work_is_ordered_on_torchs_current_stream():
    x = small_integers((4096, 1024), torch.float32, -2, 2)
    for _ in range(3):  # fresh streams each time: the first call on one is not enough
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(100_000_000)  # about 50 ms: work on another stream would overtake
            y = x * 2  # queued on the side stream; ours must come after it
            got = gpu_kernels.cumsum(y, 1)
            expected = torch.cumsum(y, 1)
        torch.cuda.current_stream().wait_stream(side)
        assert torch.equal(got, expected)


def test_non_contiguous_and_misaligned_inputs_are_handled():
    base = small_integers((65, 130), torch.float32, -2, 2)
    transposed = base.T
    assert torch.equal(gpu_kernels.cumsum(transposed, 1), torch.cumsum(transposed, 1))
    shifted = base.view(-1)[1:8001].view(80, 100)  # 4 bytes past an aligned start
    assert shifted.data_ptr() % 16
    assert torch.equal(gpu_kernels.amin(shifted, 1), torch.amin(shifted, 1))


def test_bad_arguments_raise_clear_errors():
    x = torch.ones(3, 4, device="cuda")
    with pytest.raises(TypeError, match="min: x has dtype torch.int64"):
        gpu_kernels.min(x.long(), 0)
    with pytest.raises(TypeError, match="x has dtype torch.float64, a has torch.float32"):
        gpu_kernels.matvec(x, torch.ones(4, device="cuda", dtype=torch.float64))
    with pytest.raises(IndexError, match="dim -3"):
        gpu_kernels.cumsum(x, -3)
    with pytest.raises(ValueError, match="the axis is empty"):
        gpu_kernels.min(torch.ones(3, 0, device="cuda"), 1)
    with pytest.raises(ValueError, match="precision"):
        gpu_kernels.conv2d(torch.ones(1, 1, 3, 3, device="cuda"), torch.ones(1, 1, 1, 1, device="cuda"), precision="x")


def test_eager_calls_skip_the_dispatcher_and_agree_with_the_operator():
    x = small_integers((64, 300), torch.float32)
    assert gpu_kernels.ops._plain(x)
    assert not gpu_kernels.ops._plain(x.cpu())
    assert not gpu_kernels.ops._plain(x.clone().requires_grad_())
    with torch.no_grad():
        assert gpu_kernels.ops._plain(x.clone().requires_grad_())
    assert torch.equal(gpu_kernels.cumsum(x, 1, True), torch.ops.gpu_kernels.cumsum(x, 1, True, False))
    assert torch.equal(gpu_kernels.amin(x, 0), torch.ops.gpu_kernels.amin(x, 0, False))


def test_out_takes_the_result():
    x = small_integers((64, 300), torch.float32)
    sums = torch.cumsum(x, 1)
    out = torch.empty_like(x)
    assert gpu_kernels.cumsum(x, 1, out=out) is out and torch.equal(out, sums)
    in_place = x.clone()
    assert gpu_kernels.cumsum(in_place, 1, out=in_place) is in_place and torch.equal(in_place, sums)
    transposed = torch.empty(300, 64, device="cuda").T
    assert gpu_kernels.cumsum(x, 1, out=transposed) is transposed and torch.equal(transposed, sums)
    # Overlapping its input: the sums go through a stand-in, after every read of x.
    base = torch.zeros(2 * x.numel(), device="cuda")
    source, overlapping = base[: x.numel()].view(64, 300), base[150 : 150 + x.numel()].view(64, 300)
    source.copy_(x)
    gpu_kernels.cumsum(source, 1, out=overlapping)
    assert torch.equal(overlapping, sums)

    values, indices = torch.empty(300, device="cuda"), torch.empty(300, dtype=torch.int64, device="cuda")
    got = gpu_kernels.min(x, 0, out=(values, indices))
    expected = torch.min(x, 0)
    assert got[0] is values and got[1] is indices
    assert torch.equal(values, expected.values) and torch.equal(indices, expected.indices)
    lowest = torch.empty(64, 1, device="cuda")
    assert gpu_kernels.amin(x, 1, True, out=lowest) is lowest and torch.equal(lowest, torch.amin(x, 1, True))
    v = small_integers((300,), torch.float32, seed=1)
    y = torch.empty(64, device="cuda")
    assert gpu_kernels.matvec(x, v, out=y) is y
    assert torch.equal(y, (x.double() @ v.double()).float())  # small integers: exact


def test_out_is_refused_where_torch_refuses_it():
    x = small_integers((8, 5), torch.float32).requires_grad_()
    out = torch.empty(8, 5, device="cuda")
    with pytest.raises(RuntimeError, match="out= does not take part in autograd"):
        gpu_kernels.cumsum(x, 1, out=out)
    with torch.no_grad():
        assert torch.equal(gpu_kernels.cumsum(x, 1, out=out), torch.cumsum(x.detach(), 1))
    with pytest.raises(ValueError, match=r"out has shape \[8, 4\]; the result has \[8, 5\]"):
        gpu_kernels.cumsum(x.detach(), 1, out=out[:, :4])
    with pytest.raises(ValueError, match="out is on cpu; the result is on cuda"):
        gpu_kernels.amin(x.detach(), 1, out=torch.empty(8))
    with pytest.raises(TypeError, match=r"out\[1\] has dtype torch.int32"):
        pair = (torch.empty(8, device="cuda"), torch.empty(8, dtype=torch.int32, device="cuda"))
        gpu_kernels.min(x.detach(), 1, out=pair)


def test_out_under_torch_compile():
    x = small_integers((8, 5), torch.float32)
    out = torch.empty_like(x)
    torch.compile(lambda t, o: gpu_kernels.cumsum(t, 1, out=o), fullgraph=True)(x, out)
    assert torch.equal(out, torch.cumsum(x, 1))
