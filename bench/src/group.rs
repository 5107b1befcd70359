//! The device group: each operation on one GPU and on every GPU of the machine, on
//! shapes twice the headline, beside `torch.distributed` doing the same decomposition
//! (`bench/torch_distributed.py`, whose JSON `--baseline` names).
//!
//! A multi-device call has no single stream to put events on, so every row is the wall
//! time of the call and a synchronize of every device (warm-up, then the median), for
//! the group and for torch alike.

use std::time::Instant;

use host::{Conv2dParams, ConvGradients, ConvPrecision, GpuGroup, ScanKind};
use ndarray::{ArrayD, IxDyn};
use rayon::prelude::*;
use serde_json::{Value, json};

use crate::{Result, warm_up};

/// Median wall milliseconds of `op` followed by a synchronize of the group.
fn wall_ms(group: &GpuGroup, reps: usize, mut op: impl FnMut() -> host::Result<()>) -> Result<f64> {
    warm_up(|| {
        op()?;
        Ok(group.synchronize()?)
    })?;
    let mut times: Vec<f64> = (0..reps)
        .map(|_| {
            let start = Instant::now();
            op()?;
            group.synchronize()?;
            Ok(start.elapsed().as_secs_f64() * 1e3)
        })
        .collect::<Result<_>>()?;
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Integers in [-4, 4] (exact sums), from an index hash, in parallel.
fn data(shape: &[usize], seed: u64) -> ArrayD<f32> {
    let n: usize = shape.iter().product();
    let values: Vec<f32> = (0..n as u64)
        .into_par_iter()
        .map(|i| {
            let z = (i ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            ((z >> 40) % 9) as f32 - 4.0
        })
        .collect();
    ArrayD::from_shape_vec(IxDyn(shape), values).expect("length matches")
}

/// The operations of the table, on `group`: (key, what, ms).
fn time_group(group: &GpuGroup, reps: usize) -> Result<Vec<(&'static str, &'static str, f64)>> {
    let mut rows = Vec::new();
    {
        let a = data(&[4096, 1 << 20], 1);
        let a = group.upload_split(&a, 0)?;
        let x = group.upload_replicated(&data(&[1 << 20], 2))?;
        rows.push((
            "matvec",
            "A x, A 4096 x 1048576 split by rows",
            wall_ms(group, reps, || group.matvec(&a, &x).map(drop))?,
        ));
        let xt = group.upload_split(&data(&[4096], 3), 0)?;
        rows.push((
            "matvec_t",
            "A^T x, A split by rows",
            wall_ms(group, reps, || group.matvec_t(&a, &xt).map(drop))?,
        ));
    }
    {
        // The results' memory allocated once, as torch's caching allocator keeps it.
        let x = group.upload_split(&data(&[256, 4096, 4095], 4), 0)?;
        for (key, what, axis) in [
            ("min_d1", "min dim 1, x 256 x 4096 x 4095 split on dim 0", 1),
            ("min_d0", "min dim 0 (the split one)", 0),
        ] {
            let (mut values, mut indices) = group.min(&x, axis, false)?;
            let min = || group.min_into(&x, axis, &mut values, &mut indices);
            rows.push((key, what, wall_ms(group, reps, min)?));
        }
        for (key, what, axis) in [
            ("amin_d0", "amin dim 0 (the split one)", 0),
            ("amin_d2", "amin dim 2", 2),
        ] {
            let mut values = group.amin(&x, axis, false)?;
            let amin = || group.amin_into(&x, axis, &mut values);
            rows.push((key, what, wall_ms(group, reps, amin)?));
        }
    }
    {
        let x = group.upload_split(&data(&[65536, 32768], 5), 0)?;
        let mut y = group.alloc_like::<f32, _>(&x)?;
        let cases = [
            ("scan_d1", "cumsum dim 1, 65536 x 32768 split on dim 0", 1),
            ("scan_d0", "cumsum dim 0 (the split one)", 0),
        ];
        for (key, what, axis) in cases {
            let scan = || group.cumsum_into(&x, &mut y, axis, ScanKind::Inclusive, false);
            rows.push((key, what, wall_ms(group, reps, scan)?));
        }
    }
    {
        let x = group.upload_split(&data(&[1 << 30], 6), 0)?;
        let mut y = group.alloc_like::<f32, _>(&x)?;
        let scan = || group.cumsum_into(&x, &mut y, 0, ScanKind::Inclusive, false);
        rows.push(("scan_1d", "cumsum of 2^30", wall_ms(group, reps, scan)?));
    }
    {
        let params = Conv2dParams {
            precision: ConvPrecision::Tf32,
            ..Conv2dParams::default()
        };
        let x = group.upload_split(&data(&[16, 64, 512, 1024], 7), 0)?;
        let w = group.upload_replicated(&data(&[128, 64, 3, 3], 8).mapv(|v| v / 8.0))?;
        let grad_y = group.upload_split(&data(&[16, 128, 510, 1022], 9), 0)?;
        let mut y = group.alloc_like::<f32, _>(&grad_y)?;
        let forward = || group.conv2d_into(&x, &w, None, &params, &mut y);
        rows.push((
            "conv_fwd",
            "conv2d TF32, x 16 x 64 x 512 x 1024 split on the batch",
            wall_ms(group, reps, forward)?,
        ));
        // The gradients' memory allocated once, as torch's caching allocator keeps it.
        let which = ConvGradients {
            bias: false,
            ..ConvGradients::ALL
        };
        let (dx, dw, _) = group.conv2d_backward(&x, &w, &grad_y, &params, which)?;
        let (mut dx, mut dw) = (dx.expect("asked for"), dw.expect("asked for"));
        let step = || {
            group.conv2d_into(&x, &w, None, &params, &mut y)?;
            group.conv2d_backward_into(&x, &w, &grad_y, &params, (Some(&mut dx), Some(&mut dw), None))
        };
        rows.push((
            "conv_fwd_bwd",
            "conv2d forward + input and weight gradients",
            wall_ms(group, reps, step)?,
        ));
    }
    Ok(rows)
}

/// The scans along the split axis on `group`: 65536 x 32768 along dim 0 and 2^30, split
/// on dim 0 as in the table: (key, what, ms).
fn time_split_scans(group: &GpuGroup, reps: usize) -> Result<Vec<(&'static str, String, f64)>> {
    let mut rows = Vec::new();
    for (key, shape) in [("scan_d0", vec![65536, 32768]), ("scan_1d", vec![1 << 30])] {
        let x = group.upload_split(&data(&shape, 5), 0)?;
        let mut y = group.alloc_like::<f32, _>(&x)?;
        let plan = group.cumsum_plan(&x, 0)?;
        let scan = || group.cumsum_into(&x, &mut y, 0, ScanKind::Inclusive, false);
        rows.push((
            key,
            format!("cumsum {shape:?} dim 0, {plan:?}"),
            wall_ms(group, reps, scan)?,
        ));
    }
    Ok(rows)
}

/// The scans along the split axis on two ranks sharing the first device against the
/// device alone: the work of the split path at one device's rate (1.0 when it reads
/// and writes each element once; two thirds when it reads the shards once more).
pub fn shared_device_scans(reps: usize) -> Result<Value> {
    let one = time_split_scans(&GpuGroup::new(&[0])?, reps)?;
    let shared = time_split_scans(&GpuGroup::on_one_device(0, 2)?, reps)?;
    println!(
        "
scans along the split axis, two ranks sharing device 0; wall ms, median of {reps}"
    );
    let mut records = Vec::new();
    for ((key, _, ms_one), (_, what, ms_shared)) in one.into_iter().zip(shared) {
        println!(
            "{what:<90} {ms_one:>9.3} {ms_shared:>9.3} {:>6.3}",
            ms_one / ms_shared
        );
        records.push(json!({"key": key, "what": what, "one_gpu_ms": ms_one, "shared_ms": ms_shared}));
    }
    Ok(Value::Array(records))
}

/// Times every operation on the first device alone and on the whole machine; prints
/// the table and returns its JSON.
pub fn group_table(reps: usize, baseline: Option<&Value>) -> Result<Value> {
    let all = GpuGroup::all()?;
    let (major, minor, patch) = GpuGroup::nccl_version()?;
    println!(
        "\ndevice group: {} GPUs, NCCL {major}.{minor}.{patch}; wall ms, median of {reps}",
        all.len()
    );
    let many = time_group(&all, reps)?;
    drop(all);
    let one = time_group(&GpuGroup::new(&[0])?, reps)?;
    let torch = |key: &str| {
        baseline
            .and_then(|b| b.get(key))
            .and_then(|v| v.get("ms"))
            .and_then(Value::as_f64)
    };
    println!(
        "{:<58} {:>9} {:>9} {:>8} {:>10} {:>10}",
        "operation", "1 GPU", "N GPUs", "speed-up", "torch N", "torch/ours"
    );
    let mut records = Vec::new();
    for ((key, what, ms_one), (_, _, ms_many)) in one.into_iter().zip(many) {
        let torch_many = torch(&format!("group_{key}"));
        println!(
            "{what:<58} {ms_one:>9.3} {ms_many:>9.3} {:>7.2}x {:>10} {:>10}",
            ms_one / ms_many,
            torch_many.map_or("-".into(), |t| format!("{t:.3}")),
            torch_many.map_or("-".into(), |t| format!("{:.2}x", t / ms_many)),
        );
        records.push(
            json!({"key": key, "what": what, "one_gpu_ms": ms_one, "group_ms": ms_many,
            "speed_up": ms_one / ms_many, "torch_group_ms": torch_many}),
        );
    }
    Ok(Value::Array(records))
}
