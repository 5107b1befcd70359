"""The four original models, their ModelNews and PyTorch's best built-in op for each, on
the headline inputs, in one run; then the per-call cost of the Python path.

Times are CUDA-event medians of 30 rounds after warm-up, the candidates of a row timed
in turn (in a random order every round), 5 calls back to back each per round. The
convolution's forward is also timed in bursts, as the Rust benchmark times its rows
(`burst_ms`).
`python bench.py [--only models|per-call] [--json FILE]`; the seed models come from
$SEED_MODELS (default ../../shared/seed_models.py beside the repo). `--only per-call`
times the per-call cost in a process that has run nothing else.
"""

import argparse
import json
import os
import pathlib
import random
import runpy
import statistics
import time
from types import SimpleNamespace

import torch

import gpu_kernels
from gpu_kernels import _gpu_kernels as _rust

HERE = pathlib.Path(__file__).resolve().parent
SEED_MODELS = pathlib.Path(os.environ.get("SEED_MODELS", HERE.parents[1] / "shared" / "seed_models.py"))


def model_new(workload):
    return runpy.run_path(str(HERE / "examples" / f"{workload}.py"))["ModelNew"]


def event_ms(fn, calls=5):
    """Milliseconds per call of `fn`, called `calls` times back to back between two
    CUDA events, as a model queues its work: a lone call would also count the host's
    time before its first kernel starts."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / calls


def burst_ms(fn, reps=30):
    """Milliseconds of one call as the Rust benchmark (and `torch_baseline.py`) times its
    rows: 3 warm-up calls, then 0.3 s of them, then the median of `reps` single-call
    event pairs. On the H100 heavy tensor-core work reaches the power cap within
    50-300 ms and its clocks stay lower while it lasts; the warm-up puts every timed
    call in that sustained regime."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    started = time.perf_counter()
    while time.perf_counter() - started < 0.3:
        fn()
        torch.cuda.synchronize()
    return statistics.median(event_ms(fn, calls=1) for _ in range(reps))


def host_us_per_call(candidates, calls=1000, batches=7):
    """Wall time per call of calls too small to keep the GPU busy: what the host pays.
    Each candidate (a function timing `calls` calls itself, in microseconds each) runs
    one batch per round, the candidates in turn; medians over the rounds, the machine's
    other load being uneven, and the rounds' values for differences taken round by
    round."""
    rounds = {name: [] for name in candidates}
    for _ in range(batches + 1):  # the first round warms up
        for name, batch in candidates.items():
            rounds[name].append(batch(calls))
    rounds = {name: values[1:] for name, values in rounds.items()}
    return {name: statistics.median(values) for name, values in rounds.items()}, rounds


def batch_of(fn):
    """A candidate for `host_us_per_call`: `calls` calls of fn, then a device synchronize."""

    def batch(calls):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / calls * 1e6

    return batch


def conv_binding(model, x):
    """The ModelNew's forward pass as one call of the binding (the Rust API) into a given
    output, without the Python operator around it."""
    params = _rust.ConvParams([1, 1], [0, 0], [1, 1], 1, "nchw", "tf32", "identity")
    w = model.conv2d.weight.detach()
    y = torch.empty(params.output_shape(list(x.shape), list(w.shape)), device=x.device)
    at = lambda t: (t.data_ptr(), list(t.shape))  # noqa: E731
    stream = torch.cuda.current_stream().cuda_stream
    return lambda: _rust.conv2d(x.device.index, stream, at(x), at(w), None, None, at(y), params)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--only", choices=["models", "per-call"])
    args = parser.parse_args()
    rows = models() if args.only != "per-call" else []
    per_call = per_call_us() if args.only != "models" else {}
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"rows": rows, "per_call": per_call}, indent=1))


def models():
    """The models' rows: each workload's original model, ModelNew and built-in op, then
    the convolution's training step."""
    seed = SimpleNamespace(**runpy.run_path(str(SEED_MODELS)))
    rows = []

    def row(workload, what, ms, baseline_ms):
        rows.append({"workload": workload, "what": what, "ms": ms, "original_over_this": baseline_ms / ms})
        print(f"{workload:8} {what:34} {ms:9.3f} ms   original/this {baseline_ms / ms:5.2f}x", flush=True)

    def compare(workload, candidates, reps=30):
        """Times the candidates in turn, round by round after a warm-up, in a fresh
        random order every round, so that no candidate always follows the same one (the
        clocks depend on the work before: a rotated order keeps every candidate's
        predecessor); each row is a median, against the first candidate (the
        original)."""
        for fn in candidates.values():
            for _ in range(3):  # warm-up
                fn()
        names = list(candidates)
        times = {name: [] for name in names}
        order = random.Random(0)
        for _ in range(reps):
            for name in order.sample(names, len(names)):
                times[name].append(event_ms(candidates[name]))
        medians = {name: statistics.median(t) for name, t in times.items()}
        base = next(iter(medians.values()))
        for name, ms in medians.items():
            row(workload, name, ms, base)

    def cudnn(benchmark, tf32, fn):
        def run():
            with torch.backends.cudnn.flags(enabled=True, benchmark=benchmark, deterministic=False, allow_tf32=tf32):
                return fn()

        return run

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
            candidates = {"original model": lambda: original(*inputs), "ModelNew": lambda: new(*inputs)}
            if builtin is not None:
                candidates["built-in op"] = lambda: builtin(*inputs)
            else:
                candidates["built-in op (cudnn.benchmark)"] = cudnn(True, True, candidates["original model"])
                candidates["original model, TF32 off"] = cudnn(False, False, candidates["original model"])
                candidates["the binding alone, output given"] = conv_binding(new, *inputs)
            compare(workload, candidates)
            if workload == "conv":
                # Three alternating bursts each, the median of their medians: on the
                # seed's inputs (uniform in [0, 1)) and on the Rust benchmark's (uniform
                # in [-1, 1)), so that its ratio has a like-for-like row here too.
                (x,) = inputs
                data = {"": x, ", x in [-1, 1)": torch.rand_like(x) * 2 - 1}
                conv_models = {"original model": original, "ModelNew": new}
                times = {(model, kind): [] for kind in data for model in conv_models}
                for _ in range(3):
                    for (model, kind), samples in times.items():
                        samples.append(burst_ms(lambda m=conv_models[model], d=data[kind]: m(d)))
                for (model, kind), samples in times.items():
                    base = statistics.median(times[("original model", kind)])
                    row(workload, f"{model}{kind}, burst", statistics.median(samples), base)
                del x, data
            del inputs, original, new, candidates
            torch.cuda.empty_cache()
        (x,) = seed.get_inputs("min")
        for dim in (0, 2):
            original, new = seed.WORKLOADS["min"][0](dim), model_new("min")(dim)
            compare(f"min d{dim}", {"original model": lambda: original(x), "ModelNew": lambda: new(x)})
        del x

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

    compare("conv fwd+bwd", {"original model": lambda: step(original), "ModelNew": lambda: step(new)}, reps=10)
    del x, original, new
    torch.cuda.empty_cache()
    return rows


def per_call_us():
    """Per-call cost on a tiny input: the Rust API called from Rust in this process (on
    the handle's own stream, and borrowing torch's stream each call), the binding alone
    (the Rust API with its argument conversion, on torch's stream), the public function
    (eager: no dispatcher; allocating its output, and with out=), the registered
    operator (through PyTorch's dispatcher, as under autograd), and torch's own op for
    scale."""
    tiny = torch.rand(32, device="cuda")
    out = torch.empty_like(tiny)
    device, stream = tiny.device.index, torch.cuda.current_stream().cuda_stream

    def binding():
        _rust.cumsum(device, stream, "float32", (tiny.data_ptr(), [32]), out.data_ptr(), 0, True, False)

    per_call, rounds = host_us_per_call(
        {
            "rust_api_us": lambda calls: _rust.rust_api_cumsum_us(device, calls, 1),
            "rust_api_on_torch_stream_us": lambda calls: _rust.rust_api_cumsum_us(device, calls, 1, stream),
            "binding_us": batch_of(binding),
            "function_us": batch_of(lambda: gpu_kernels.cumsum(tiny, 0, exclusive=True)),
            "function_out_us": batch_of(lambda: gpu_kernels.cumsum(tiny, 0, exclusive=True, out=out)),
            "operator_us": batch_of(lambda: torch.ops.gpu_kernels.cumsum(tiny, 0, True, False)),
            "torch_cumsum_us": batch_of(lambda: torch.cumsum(tiny, 0)),
        }
    )
    # Over the Rust API, round by round: `cumsum_into` writes into a given output, as
    # the call with out= does; the call without allocates its output too.
    for name, function in (("python_path", "function_us"), ("python_path_into_output", "function_out_us")):
        per_call[f"{name}_over_rust_api_us"] = statistics.median(
            f - r for f, r in zip(rounds[function], rounds["rust_api_us"])
        )
    print("per call, 32 floats (host us): " + ", ".join(f"{k[:-3]} {v:.2f}" for k, v in per_call.items()))
    return per_call


if __name__ == "__main__":
    main()
