"""The four original models, their ModelNews and PyTorch's best built-in op for each, on
the headline inputs, in one run; then the per-call cost of the Python path.

Times are CUDA-event medians after warm-up. `python bench.py [--json FILE]`; the seed
models come from $SEED_MODELS (default ../../shared/seed_models.py beside the repo).
"""

import argparse
import json
import os
import pathlib
import runpy
import time
from types import SimpleNamespace

import torch

import gpu_kernels
from gpu_kernels import _gpu_kernels as _rust

HERE = pathlib.Path(__file__).resolve().parent
SEED_MODELS = pathlib.Path(os.environ.get("SEED_MODELS", HERE.parents[1] / "shared" / "seed_models.py"))


# The CUDA-event median of the Rust benchmark's PyTorch baseline, beside this file in
# the bundle and in bench/ in the repository.
BASELINE = next(p for p in (HERE.parent / "torch_baseline.py", HERE.parent / "bench" / "torch_baseline.py") if p.exists())
_median_ms = runpy.run_path(str(BASELINE))["median_ms"]


def median_ms(fn, reps=15):
    return _median_ms(fn, reps)


def model_new(workload):
    return runpy.run_path(str(HERE / "examples" / f"{workload}.py"))["ModelNew"]


def host_us_per_call(fn, calls=3000):
    """Wall time per call of a call too small to keep the GPU busy: what the host pays."""
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    seed = SimpleNamespace(**runpy.run_path(str(SEED_MODELS)))
    rows = []

    def row(workload, what, ms, baseline_ms):
        rows.append({"workload": workload, "what": what, "ms": ms, "original_over_this": baseline_ms / ms})
        print(f"{workload:8} {what:34} {ms:9.3f} ms   original/this {baseline_ms / ms:5.2f}x", flush=True)

    with torch.no_grad():
        for workload, builtin in [
            ("scan", lambda x: torch.cumsum(x, 1)),
            ("matvec", torch.matmul),
            ("min", lambda x: torch.amin(x, 1)),
            ("conv", None),
        ]:
            model_class = seed.WORKLOADS[workload][0]
            init = seed.get_init_inputs(workload)
            torch.manual_seed(0)
            original = model_class(*init).cuda()
            new = model_new(workload)(*init).cuda()
            if workload == "conv":
                new.load_state_dict(original.state_dict())
            inputs = seed.get_inputs(workload)
            base = median_ms(lambda: original(*inputs))
            row(workload, "original model", base, base)
            row(workload, "ModelNew", median_ms(lambda: new(*inputs)), base)
            if builtin is not None:
                row(workload, "built-in op", median_ms(lambda: builtin(*inputs)), base)
            else:
                torch.backends.cudnn.benchmark = True
                row(workload, "built-in op (cudnn.benchmark)", median_ms(lambda: original(*inputs)), base)
                torch.backends.cudnn.allow_tf32 = False
                row(workload, "original model, TF32 off", median_ms(lambda: original(*inputs)), base)
                torch.backends.cudnn.allow_tf32 = True
                torch.backends.cudnn.benchmark = False
            del inputs, original, new
            torch.cuda.empty_cache()
        for dim in (0, 2):
            (x,) = seed.get_inputs("min")
            original, new = seed.WORKLOADS["min"][0](dim), model_new("min")(dim)
            base = median_ms(lambda: original(x))
            row(f"min d{dim}", "original model", base, base)
            row(f"min d{dim}", "ModelNew", median_ms(lambda: new(x)), base)

    # Training step of the convolution: forward and backward.
    torch.manual_seed(0)
    conv_class = seed.WORKLOADS["conv"][0]
    original = conv_class(*seed.get_init_inputs("conv")).cuda()
    new = model_new("conv")(*seed.get_init_inputs("conv")).cuda()
    new.load_state_dict(original.state_dict())
    (x,) = seed.get_inputs("conv")
    x.requires_grad_()

    def step(model):
        model(x).sum().backward()

    base = median_ms(lambda: step(original), reps=7)
    row("conv fwd+bwd", "original model", base, base)
    row("conv fwd+bwd", "ModelNew", median_ms(lambda: step(new), reps=7), base)
    del x, original, new
    torch.cuda.empty_cache()

    # Per-call cost on a tiny input: the binding alone (the Rust API with its argument
    # conversion), the public function (eager: no dispatcher), the registered operator
    # (through PyTorch's dispatcher, as under autograd), and torch's own op for scale.
    tiny = torch.rand(32, device="cuda")
    out = torch.empty_like(tiny)
    device, stream = tiny.device.index, torch.cuda.current_stream().cuda_stream
    per_call = {
        "binding_us": host_us_per_call(
            lambda: _rust.cumsum(device, stream, "float32", (tiny.data_ptr(), [32]), out.data_ptr(), 0, True, False)
        ),
        "function_us": host_us_per_call(lambda: gpu_kernels.cumsum(tiny, 0, exclusive=True)),
        "operator_us": host_us_per_call(lambda: torch.ops.gpu_kernels.cumsum(tiny, 0, True, False)),
        "torch_cumsum_us": host_us_per_call(lambda: torch.cumsum(tiny, 0)),
    }
    print("per call, 32 floats (host us): " + ", ".join(f"{k[:-3]} {v:.2f}" for k, v in per_call.items()))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"rows": rows, "per_call": per_call}, indent=1))


if __name__ == "__main__":
    main()
