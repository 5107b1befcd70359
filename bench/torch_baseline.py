"""Times the PyTorch equivalents of the benchmark's workloads on the same GPU.

Writes JSON {"device": ..., "results": {key: {"ms": median}}} for `bench --baseline`.
Each operation: warm-up, then the median of many runs, each timed with CUDA events.
"""
import argparse
import json
import time

import torch

# Warm-up as the Rust benchmark's: WARMUP runs (cuDNN's algorithm search among them),
# then WARMUP_S seconds of runs (heavy work reaches the power cap within 50-300 ms and
# its clocks stay lower while it lasts: every row is timed in that sustained regime).
WARMUP = 3
WARMUP_S = 0.3


def warm_up(fn):
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    started = time.perf_counter()
    while time.perf_counter() - started < WARMUP_S:
        fn()
        torch.cuda.synchronize()


def median_ms(fn, reps):
    warm_up(fn)
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def copy(reps):
    x = torch.rand(1 << 31, device="cuda")
    y = torch.empty_like(x)
    ms = median_ms(lambda: y.copy_(x), reps)
    del x, y
    return {"copy": {"ms": ms, "op": "y.copy_(x), 8 GiB f32"}}


def scans(reps):
    x = torch.rand(32768, 32768, device="cuda") * 2 - 1
    zeros = torch.zeros(32768, 1, device="cuda")
    results = {
        "scan1": {"ms": median_ms(lambda: torch.cumsum(x, 1), reps), "op": "torch.cumsum(x, 1), 32768x32768 f32"},
        # The original model: cat, slice, then cumsum (12.47 ms in WORKLOADS.md); the
        # same with the slice first moves less data.
        "scan1_model": {
            "ms": median_ms(lambda: torch.cumsum(torch.cat([zeros, x], 1)[:, :-1], 1), reps),
            "op": "cumsum(cat([0, x], 1)[:, :-1], 1), the original model",
        },
        "scan1_model_slice_first": {
            "ms": median_ms(lambda: torch.cumsum(torch.cat([zeros, x[:, :-1]], 1), 1), reps),
            "op": "cumsum(cat([0, x[:, :-1]], 1), 1)",
        },
        "scan0": {"ms": median_ms(lambda: torch.cumsum(x, 0), reps), "op": "torch.cumsum(x, 0), 32768x32768 f32"},
    }
    del x, zeros
    v = torch.rand(1 << 28, device="cuda") * 2 - 1
    results["scan1d"] = {"ms": median_ms(lambda: torch.cumsum(v, 0), reps), "op": "torch.cumsum(x, 0), 2^28 f32"}
    del v
    # Beyond the headline: odd-length rows, and an axis of few columns.
    odd = torch.rand(65536, 4095, device="cuda") * 2 - 1
    results["scan1_odd"] = {"ms": median_ms(lambda: torch.cumsum(odd, 1), reps), "op": "torch.cumsum(x, 1), 65536x4095 f32"}
    del odd
    narrow = torch.rand(65536, 2048, device="cuda") * 2 - 1
    results["scan0_narrow"] = {
        "ms": median_ms(lambda: torch.cumsum(narrow, 0), reps),
        "op": "torch.cumsum(x, 0), 65536x2048 f32",
    }
    del narrow
    # 16-bit: torch sums in f32 and rounds each output once, as ours does.
    for dtype, suffix in [(torch.bfloat16, "_bf16"), (torch.float16, "_f16")]:
        name = str(dtype).removeprefix("torch.")
        for key, shape, dim in [
            ("scan1", (32768, 32768), 1),
            ("scan0", (32768, 32768), 0),
            ("scan1d", (1 << 28,), 0),
            ("scan1_odd", (65536, 4095), 1),
            ("scan0_narrow", (65536, 2048), 0),
        ]:
            x = (torch.rand(*shape, device="cuda") * 2 - 1).to(dtype)
            results[key + suffix] = {
                "ms": median_ms(lambda: torch.cumsum(x, dim), reps),
                "op": f"torch.cumsum(x, {dim}), {'x'.join(map(str, shape))} {name}",
            }
            del x
    return results


def matvecs(reps):
    torch.backends.cuda.matmul.allow_tf32 = False
    results = {}
    for key, (m, k), transpose in (
        ("matvec", (2048, 1 << 20), False),
        ("matvec_t", (1 << 20, 2048), True),
        ("matvec16", (16, 1 << 24), False),
    ):
        a = torch.rand(m, k, device="cuda") * 2 - 1
        x = torch.rand(m if transpose else k, device="cuda") * 2 - 1
        op = (lambda: torch.matmul(a.t(), x)) if transpose else (lambda: torch.matmul(a, x))
        name = "A^T x" if transpose else "A x"
        results[key] = {"ms": median_ms(op, reps), "op": f"torch.matmul, {name}, A {m}x{k} f32"}
        del a, x
    for key, (m, k), transpose in (
        ("matvec", (2048, 1 << 20), False),
        ("matvec_t", (1 << 20, 2048), True),
    ):
        for dtype, suffix in [(torch.bfloat16, "_bf16"), (torch.float16, "_f16")]:
            a = torch.rand(m, k, device="cuda", dtype=dtype) * 2 - 1
            x = torch.rand(m if transpose else k, device="cuda", dtype=dtype) * 2 - 1
            op = (lambda: torch.matmul(a.t(), x)) if transpose else (lambda: torch.matmul(a, x))
            name = "A^T x" if transpose else "A x"
            results[key + suffix] = {"ms": median_ms(op, reps), "op": f"torch.matmul, {name}, A {m}x{k} {suffix[1:]}"}
            del a, x
    for key, (m, k), vectors in (
        ("matvec_x8", (2048, 1 << 20), 8),
        ("matvec_x2", (2048, 1 << 20), 2),
        ("matvec_x16", (2048, 1 << 20), 16),
        ("matvec_x8_tall", (1 << 20, 2048), 8),
    ):
        a = torch.rand(m, k, device="cuda") * 2 - 1
        x = torch.rand(k, vectors, device="cuda") * 2 - 1
        results[key] = {
            "ms": median_ms(lambda: torch.matmul(a, x), reps),
            "op": f"torch.matmul, A X, A {m}x{k} f32, X {vectors} columns",
        }
        del a, x
    return results


def min_reductions(reps):
    results = {}
    for dtype, suffix in [(torch.float32, ""), (torch.bfloat16, "_bf16"), (torch.float16, "_f16")]:
        x = torch.rand(128, 4096, 4095, device="cuda", dtype=dtype)
        name = str(dtype).removeprefix("torch.")
        for dim in range(3):
            ms = median_ms(lambda: torch.min(x, dim), reps)
            results[f"min{dim}{suffix}"] = {"ms": ms, "op": f"torch.min(x, {dim}), 128x4096x4095 {name}"}
            ms = median_ms(lambda: torch.amin(x, dim), reps)
            results[f"amin{dim}{suffix}"] = {"ms": ms, "op": f"torch.amin(x, {dim}), 128x4096x4095 {name}"}
        del x
        torch.cuda.empty_cache()
    # Beyond the headline: rows of whole 16-byte vectors along dim 1, the same bytes.
    x = torch.rand(128, 4096, 4096, device="cuda", dtype=torch.bfloat16)
    results["min1_aligned_bf16"] = {"ms": median_ms(lambda: torch.min(x, 1), reps), "op": "torch.min(x, 1), 128x4096x4096 bfloat16"}
    results["amin1_aligned_bf16"] = {"ms": median_ms(lambda: torch.amin(x, 1), reps), "op": "torch.amin(x, 1), 128x4096x4096 bfloat16"}
    del x
    torch.cuda.empty_cache()
    # Beyond the headline: unaligned rows of one outer index.
    x = torch.rand(1, 65536, 1030, device="cuda")
    results["min1_1x65536x1030"] = {"ms": median_ms(lambda: torch.min(x, 1), reps), "op": "torch.min(x, 1), 1x65536x1030 float32"}
    results["amin1_1x65536x1030"] = {"ms": median_ms(lambda: torch.amin(x, 1), reps), "op": "torch.amin(x, 1), 1x65536x1030 float32"}
    return results


def fastest_ms(op, reps):
    """The median time of `op` under the faster of cuDNN's two ways to pick an algorithm:
    its benchmark search (`cudnn.benchmark = True`) and its default heuristics (what a
    model runs unless it asks for the search), each warmed up before timing."""
    times = []
    for search in (True, False):
        torch.backends.cudnn.benchmark = search
        times.append(median_ms(op, reps))
    torch.backends.cudnn.benchmark = True
    return min(times)


def convs(reps):
    """The conv headline in exact FP32 (no TF32) and in TF32, cuDNN's faster choice of
    algorithm (`fastest_ms`)."""
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    x = torch.rand(8, 64, 512, 1024, device="cuda") * 2 - 1
    w = torch.rand(128, 64, 3, 3, device="cuda") * 2 - 1
    y = torch.nn.functional.conv2d(x, w)
    dy = torch.rand_like(y) * 2 - 1
    del y
    forward = fastest_ms(lambda: torch.nn.functional.conv2d(x, w), reps)
    # What autograd's backward of conv2d runs, for the input and weight gradients.
    backward = fastest_ms(
        lambda: torch.ops.aten.convolution_backward(
            dy, x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [True, True, False]
        ),
        reps,
    )
    # TF32 (PyTorch's default for convolutions), NCHW and channels last.
    torch.backends.cudnn.allow_tf32 = True
    forward_tf32 = fastest_ms(lambda: torch.nn.functional.conv2d(x, w), reps)
    x_last = x.contiguous(memory_format=torch.channels_last)
    w_last = w.contiguous(memory_format=torch.channels_last)
    forward_tf32_nhwc = fastest_ms(lambda: torch.nn.functional.conv2d(x_last, w_last), reps)
    b = torch.rand(128, device="cuda") * 2 - 1
    bias_relu_nhwc = fastest_ms(
        lambda: torch.nn.functional.relu(torch.nn.functional.conv2d(x_last, w_last, b)), reps
    )
    dy_last = dy.contiguous(memory_format=torch.channels_last)
    backward_tf32, backward_tf32_nhwc = (
        fastest_ms(
            lambda: torch.ops.aten.convolution_backward(
                g, a, f, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [True, True, False]
            ),
            reps,
        )
        for g, a, f in ((dy, x, w), (dy_last, x_last, w_last))
    )
    torch.backends.cudnn.allow_tf32 = False
    # 16-bit: forward from NCHW and channels_last tensors, backward from channels_last.
    halves = {}
    for dtype, suffix in [(torch.bfloat16, "_bf16"), (torch.float16, "_f16")]:
        xh, wh, dyh = (t.to(dtype) for t in (x, w, dy))
        xl, wl, dyl = (t.contiguous(memory_format=torch.channels_last) for t in (xh, wh, dyh))
        halves[f"conv_fwd{suffix}"] = {
            "ms": fastest_ms(lambda: torch.nn.functional.conv2d(xh, wh), reps),
            "op": f"F.conv2d, {dtype} cuDNN, NCHW",
        }
        halves[f"conv_fwd_nhwc{suffix}"] = {
            "ms": fastest_ms(lambda: torch.nn.functional.conv2d(xl, wl), reps),
            "op": f"F.conv2d, {dtype} cuDNN, channels_last",
        }
        halves[f"conv_bwd_nhwc{suffix}"] = {
            "ms": fastest_ms(
                lambda: torch.ops.aten.convolution_backward(
                    dyl, xl, wl, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [True, True, False]
                ),
                reps,
            ),
            "op": f"convolution_backward, input + weight grads, {dtype} cuDNN, channels_last",
        }
        del xh, wh, dyh, xl, wl, dyl
    del x, w, dy, x_last, w_last, b, dy_last
    return halves | {
        "conv_fwd": {"ms": forward, "op": "F.conv2d, x 8x64x512x1024, w 128x64x3x3, FP32 cuDNN"},
        "conv_bwd": {"ms": backward, "op": "convolution_backward, input + weight grads, FP32 cuDNN"},
        "conv_fwd_tf32": {"ms": forward_tf32, "op": "F.conv2d, TF32 cuDNN, NCHW"},
        "conv_fwd_tf32_nhwc": {"ms": forward_tf32_nhwc, "op": "F.conv2d, TF32 cuDNN, channels_last"},
        "conv_bwd_tf32": {"ms": backward_tf32, "op": "convolution_backward, input + weight grads, TF32 cuDNN, NCHW"},
        "conv_bwd_tf32_nhwc": {
            "ms": backward_tf32_nhwc,
            "op": "convolution_backward, input + weight grads, TF32 cuDNN, channels_last",
        },
        "conv_fwd_tf32_nhwc_bias_relu": {
            "ms": bias_relu_nhwc,
            "op": "F.relu(F.conv2d(x, w, b)), TF32 cuDNN, channels_last",
        },
    }


# name, x (NCHW), w, stride, padding, groups (dilation 1): the same table as LAYERS in
# bench/src/layers.rs.
LAYERS = (
    ("R1", (32, 64, 56, 56), (256, 64, 1, 1), 1, 0, 1),
    ("R2", (32, 128, 28, 28), (128, 128, 3, 3), 1, 1, 1),
    ("R3", (32, 256, 14, 14), (256, 256, 3, 3), 1, 1, 1),
    ("R4", (32, 512, 7, 7), (512, 512, 3, 3), 1, 1, 1),
    ("R5", (32, 256, 56, 56), (512, 256, 1, 1), 2, 0, 1),
    ("R6", (32, 128, 56, 56), (128, 128, 3, 3), 2, 1, 1),
    ("R7", (32, 3, 224, 224), (64, 3, 7, 7), 2, 3, 1),
    ("U1", (4, 64, 256, 256), (64, 64, 3, 3), 1, 1, 1),
    ("D1", (32, 256, 28, 28), (256, 1, 3, 3), 1, 1, 256),
)


def layers(reps):
    """The layer suite: forward with a bias and backward with all three gradients, in
    FP32 and TF32 (cudnn.allow_tf32), NCHW and channels_last, and in bf16 channels_last,
    cuDNN in benchmark mode."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    results = {}
    for name, x_shape, w_shape, stride, padding, groups in LAYERS:
        x = torch.rand(x_shape, device="cuda") * 2 - 1
        w = torch.rand(w_shape, device="cuda") * 2 - 1
        b = torch.rand(w_shape[0], device="cuda") * 2 - 1
        dy = torch.rand_like(torch.nn.functional.conv2d(x, w, b, stride, padding, 1, groups)) * 2 - 1
        shapes = f"x {x_shape}, w {w_shape}, stride {stride}, padding {padding}, groups {groups}"
        modes = [
            (f"{precision}_{layout}", torch.float32, precision == "tf32", memory_format)
            for precision in ("fp32", "tf32")
            for layout, memory_format in (("nchw", torch.contiguous_format), ("nhwc", torch.channels_last))
        ] + [("bf16_nhwc", torch.bfloat16, False, torch.channels_last)]
        for mode, dtype, tf32, memory_format in modes:
            torch.backends.cudnn.allow_tf32 = tf32
            xs, ws, dys = (t.to(dtype).contiguous(memory_format=memory_format) for t in (x, w, dy))
            bs = b.to(dtype)
            results[f"layer_{name}_fwd_{mode}"] = {
                "ms": median_ms(lambda: torch.nn.functional.conv2d(xs, ws, bs, stride, padding, 1, groups), reps),
                "op": f"F.conv2d with bias, {shapes}, {mode}",
            }
            results[f"layer_{name}_bwd_{mode}"] = {
                "ms": median_ms(
                    lambda: torch.ops.aten.convolution_backward(
                        dys, xs, ws, [w_shape[0]], [stride] * 2, [padding] * 2, [1, 1], False, [0, 0],
                        groups, [True, True, True],
                    ),
                    reps,
                ),
                "op": f"convolution_backward, input + weight + bias grads, {shapes}, {mode}",
            }
            del xs, ws, dys, bs
        del x, w, b, dy
    torch.backends.cudnn.allow_tf32 = False
    return results


WORKLOADS = {
    "copy": copy,
    "scan": scans,
    "matvec": matvecs,
    "min": min_reductions,
    "conv": convs,
    "layers": layers,
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--json", required=True)
    parser.add_argument("--only", default="", help="comma-separated families (default: all)")
    args = parser.parse_args()
    only = [f for f in args.only.split(",") if f]
    results = {}
    for family, workload in WORKLOADS.items():
        if only and family not in only:
            continue
        results.update(workload(args.reps))
        torch.cuda.empty_cache()
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": results}
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=2)
    for key, r in results.items():
        print(f"torch {key:<24} {r['ms']:9.3f} ms  ({r['op']})")


if __name__ == "__main__":
    main()
