"""The four ModelNews against the original models of seed_models.py, on the headline
inputs (get_init_inputs() and get_inputs() unchanged), eager and under
torch.compile(fullgraph=True); one training step of the convolution."""

import os
import pathlib
import runpy

from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="SKIPPED: no CUDA device here")

HERE = pathlib.Path(__file__).resolve().parent
EXAMPLES = HERE.parent / "examples"
SEED_MODELS = pathlib.Path(os.environ.get("SEED_MODELS", HERE.parents[2] / "shared" / "seed_models.py"))


def model_new(workload):
    return runpy.run_path(str(EXAMPLES / f"{workload}.py"))["ModelNew"]


@pytest.fixture(scope="module")
def seed():
    if not SEED_MODELS.exists():
        pytest.skip(f"SKIPPED: {SEED_MODELS} not found (set SEED_MODELS)")
    return SimpleNamespace(**runpy.run_path(str(SEED_MODELS)))


def models(seed, workload, **inputs):
    """The original model and the ModelNew of `workload`, with the same parameters."""
    model_class = seed.WORKLOADS[workload][0]
    init = seed.get_init_inputs(workload)
    torch.manual_seed(0)
    original = model_class(*init).cuda()
    torch.manual_seed(0)
    new = model_new(workload)(*init).cuda()
    return original, new


def relative_error(got, expected):
    return ((got.double() - expected.double()).norm() / expected.double().norm()).item()


def test_scan_model(seed):
    original, new = models(seed, "scan")
    (x,) = seed.get_inputs("scan")
    reference = original(x.double())
    # Both float32 results within the bound of the Rust tests' float32 scans.
    assert relative_error(new(x), reference) < 1e-6
    assert relative_error(original(x), reference) < 1e-6
    assert torch.equal(new(x), new(x))  # deterministic


def test_matvec_model(seed):
    original, new = models(seed, "matvec")
    a, b = seed.get_inputs("matvec")
    got = new(a, b)
    assert got.shape == original(a, b).shape
    assert relative_error(got, a.double() @ b.double()) < 1e-6


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_min_model_gives_identical_values(seed, dim):
    model_class = seed.WORKLOADS["min"][0]
    (x,) = seed.get_inputs("min")
    new = model_new("min")(dim)
    assert torch.equal(new(x), model_class(dim)(x))


def test_conv_model_forward_and_one_training_step(seed):
    original, new = models(seed, "conv")
    assert torch.equal(original.conv2d.weight, new.conv2d.weight)
    (x,) = seed.get_inputs("conv")
    torch.backends.cudnn.allow_tf32 = False  # the original in FP32, as ours
    try:
        x_original = x.clone().requires_grad_()
        x_new = x.clone().requires_grad_()
        y_original, y_new = original(x_original), new(x_new)
        assert relative_error(y_new, y_original) < 1e-5
        y_original.square().mean().backward()
        y_new.square().mean().backward()
    finally:
        torch.backends.cudnn.allow_tf32 = True
    assert relative_error(x_new.grad, x_original.grad) < 1e-5
    assert relative_error(new.conv2d.weight.grad, original.conv2d.weight.grad) < 1e-5


@pytest.mark.parametrize(
    "workload, inputs",
    [
        ("scan", lambda: [torch.rand(64, 300, device="cuda")]),
        ("matvec", lambda: [torch.rand(100, 300, device="cuda"), torch.rand(300, 1, device="cuda")]),
        ("conv", lambda: [torch.rand(2, 64, 20, 24, device="cuda")]),
        ("min", lambda: [torch.rand(4, 30, 50, device="cuda")]),
    ],
)
def test_model_new_compiles_with_fullgraph(seed, workload, inputs):
    _, new = models(seed, workload)
    args = inputs()
    compiled = torch.compile(new, fullgraph=True)
    assert torch.equal(compiled(*args), new(*args))
