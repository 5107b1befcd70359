"""torch.distributed (NCCL) doing the device group's decompositions on the same shapes,
one process per GPU: `python -m torch.distributed.run --standalone --nproc_per_node=N
torch_distributed.py --json OUT`.

Each row is the wall time of the operation and a CUDA synchronize, the slowest rank's,
after a barrier (median of --reps after warm-up), as the Rust bench times the group.
"""

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    dev = torch.device("cuda", rank)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    rows = {}

    def ints(*shape):
        return torch.randint(-4, 5, shape, device=dev, dtype=torch.float32)

    def warm_up(op):
        # As the Rust bench: 3 runs, then 0.3 s of them (the clocks settle at the power
        # cap within 50-300 ms of heavy work); every rank runs while any still warms up.
        for _ in range(3):
            op()
        torch.cuda.synchronize()
        started = time.perf_counter()
        more = torch.ones(1, device=dev)
        while more.item():
            op()
            torch.cuda.synchronize()
            more[0] = float(time.perf_counter() - started < 0.3)
            dist.all_reduce(more, op=dist.ReduceOp.MAX)

    def timed(key, op):
        warm_up(op)
        times = []
        slowest = torch.zeros(1, device=dev)
        for _ in range(args.reps):
            dist.barrier()
            torch.cuda.synchronize()
            start = time.perf_counter()
            op()
            torch.cuda.synchronize()
            slowest[0] = (time.perf_counter() - start) * 1e3
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            times.append(slowest.item())
        rows[f"group_{key}"] = {"ms": statistics.median(times)}
        if rank == 0:
            print(f"{key:14} {statistics.median(times):9.3f} ms", flush=True)

    def gather(t):
        out = torch.empty((world, *t.shape), device=dev, dtype=t.dtype)
        dist.all_gather_into_tensor(out, t.contiguous())
        return out

    # matvec: A 4096 x 2^20 split by rows.
    a, x = ints(4096 // world, 1 << 20), ints(1 << 20)
    y = torch.empty(4096, device=dev)
    timed("matvec", lambda: dist.all_gather_into_tensor(y, torch.mv(a, x)))
    xt = ints(4096 // world)
    timed("matvec_t", lambda: gather(torch.mv(a.t(), xt)).sum(0))
    del a, x, xt

    # min: x 256 x 4096 x 4095 split on dim 0.
    x = ints(256 // world, 4096, 4095)
    timed("min_d1", lambda: torch.min(x, 1))

    def to_owners(t):
        """Every rank's rows of t, as many for each rank, sent to that rank (all to
        all): `[rank][rows of this rank's part]`, the result split along its dim 0."""
        got = torch.empty((world, t.shape[0] // world, *t.shape[1:]), device=dev, dtype=t.dtype)
        dist.all_to_all_single(got, t)
        return got

    def min_d0():
        # Each rank merges the shards' minima of its rows (first shard first on ties).
        values, indices = torch.min(x, 0)
        indices += rank * x.shape[0]
        got_values, got_indices = to_owners(values), to_owners(indices)
        best, shard = torch.min(got_values, 0)
        return best, got_indices.gather(0, shard.unsqueeze(0))[0]

    timed("min_d0", min_d0)
    timed("amin_d0", lambda: torch.amin(to_owners(torch.amin(x, 0)), 0))
    timed("amin_d2", lambda: torch.amin(x, 2))
    del x

    # scans: 65536 x 32768 split evenly on dim 0; a 1-D scan of 2^30. Along the split
    # axis each rank scans its shard, then adds the totals of the shards before it.
    def carried_scan(x, out):
        torch.cumsum(x, 0, out=out)
        totals = gather(out[-1])
        if rank > 0:
            out += totals[:rank].sum(0)

    x = ints(65536 // world, 32768)
    out = torch.empty_like(x)
    timed("scan_d1", lambda: torch.cumsum(x, 1, out=out))
    del x, out
    x = ints(65536 // world, 32768)
    out = torch.empty_like(x)
    timed("scan_d0", lambda: carried_scan(x, out))
    del x, out
    x = ints((1 << 30) // world)
    out = torch.empty_like(x)
    timed("scan_1d", lambda: carried_scan(x, out))
    del x, out

    # conv: the headline at batch 16, TF32, the batch split; weight gradients all-reduced.
    x, w = ints(16 // world, 64, 512, 1024), ints(128, 64, 3, 3) / 8
    grad_y = ints(16 // world, 128, 510, 1022)
    timed("conv_fwd", lambda: F.conv2d(x, w))

    def step():
        F.conv2d(x, w)
        _, grad_w, _ = torch.ops.aten.convolution_backward(
            grad_y, x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [True, True, False]
        )
        dist.all_reduce(grad_w)

    timed("conv_fwd_bwd", step)
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
