//! `bench [--only scan,matvec,min,conv,layers,group,group-shared] [--layers R1,R4] [--reps N] [--baseline torch.json] [--json OUT]`
//!
//! Runs each workload on its headline shape (../shared/WORKLOADS.md), checks the result,
//! times it with CUDA events (warm-up, then the median of `--reps` runs) and prints one
//! table: time, rate, percent of the copy bandwidth measured in the same run, and
//! PyTorch's time from `bench/torch_baseline.py` when `--baseline` names its JSON.
//! The `layers` family (layers.rs) adds a table of convolution layers in four modes.

mod conv_reference;
mod group;
mod layers;

use std::error::Error;
use std::time::Instant;

use host::{Gpu, ScanKind};
use ndarray::{Array1, ArrayD, IxDyn};
use rayon::prelude::*;
use serde_json::{Value, json};

use conv_reference::{ConvReference, Samples, as_nchw, tolerance};

type Result<T = ()> = std::result::Result<T, Box<dyn Error>>;

/// Before a row is timed: this many runs (where PyTorch's first ones pick cuDNN's
/// algorithm), then runs for `WARMUP_S`.
const WARMUP: usize = 3;
/// Seconds of steady warm-up runs. On the H100 heavy work (tensor-core convolutions,
/// ours and cuDNN's alike) reaches the 700 W power cap within 50-300 ms and its clocks
/// fall 5-17% there while it lasts; a row timed from an idle GPU would mix the two
/// regimes, so every row (and PyTorch's, `torch_baseline.py`) is timed in the sustained
/// one.
const WARMUP_S: f64 = 0.3;

/// One timed operation.
struct Row {
    /// Matches the key in torch_baseline.py's JSON.
    key: String,
    what: String,
    timing: Timing,
    /// Bytes that must move (read + written), for GB/s.
    bytes: f64,
    /// Floating-point operations, for TFLOP/s (0 for memory-bound workloads).
    flops: f64,
}

impl Row {
    fn median_ms(&self) -> f64 {
        let mut t = self.timing.ms.clone();
        t.sort_by(f32::total_cmp);
        t[t.len() / 2] as f64
    }
    fn gbps(&self) -> f64 {
        self.bytes / (self.median_ms() * 1e-3) / 1e9
    }
    /// The row in the `--json` output.
    fn record(&self, copy_bw: f64, torch_ms: Option<f64>) -> Value {
        let (ms, gbps) = (self.median_ms(), self.gbps());
        json!({
            "key": self.key, "workload": self.what, "median_ms": ms, "gbps": gbps,
            "percent_of_copy": 100.0 * gbps / copy_bw, "torch_ms": torch_ms,
            "tflops": self.flops / (ms * 1e-3) / 1e12, "times_ms": self.timing.ms,
            "window_s": self.timing.window_s,
        })
    }
}

struct Options {
    only: Option<Vec<String>>,
    /// The layers of the suite to time (all when `None`).
    layers: Option<Vec<String>>,
    reps: usize,
    baseline: Option<Value>,
    json: Option<String>,
}

fn parse_args() -> Result<Options> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let baseline = match value("--baseline") {
        Some(path) => Some(serde_json::from_str(
            &std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?,
        )?),
        None => None,
    };
    Ok(Options {
        only: value("--only").map(|s| s.split(',').map(String::from).collect()),
        layers: value("--layers").map(|s| s.split(',').map(String::from).collect()),
        reps: value("--reps").map(|r| r.parse()).transpose()?.unwrap_or(30),
        baseline,
        json: value("--json"),
    })
}

/// The times of a row's runs, and when they ran.
struct Timing {
    ms: Vec<f32>,
    /// Seconds since the Unix epoch at the first run's start and the last one's end, so
    /// that the GPU's clocks and power sampled meanwhile (`run.sh bench`) can be told
    /// per row.
    window_s: [f64; 2],
}

/// Seconds since the Unix epoch.
fn now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Runs `run` (an operation and a wait for it) `WARMUP` times, then for `WARMUP_S`
/// seconds.
fn warm_up(mut run: impl FnMut() -> Result) -> Result {
    for _ in 0..WARMUP {
        run()?;
    }
    let started = Instant::now();
    while started.elapsed().as_secs_f64() < WARMUP_S {
        run()?;
    }
    Ok(())
}

/// Times `reps` runs of `op` after a warm-up, one event pair per run.
fn time(gpu: &Gpu, reps: usize, mut op: impl FnMut(&Gpu) -> host::Result<()>) -> Result<Timing> {
    warm_up(|| {
        op(gpu)?;
        Ok(gpu.synchronize()?)
    })?;
    let start = now_s();
    let ms = (0..reps)
        .map(|_| Ok(gpu.time_ms(&mut op)?))
        .collect::<Result<_>>()?;
    Ok(Timing {
        ms,
        window_s: [start, now_s()],
    })
}

/// Distinct, non-constant f32 values from an index hash, generated in parallel.
fn random_f32(shape: &[usize], seed: u64) -> ArrayD<f32> {
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n as u64)
        .into_par_iter()
        .map(|i| {
            let mut z = (i ^ seed).wrapping_add(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    ArrayD::from_shape_vec(IxDyn(shape), data).expect("length matches")
}

/// 8 GiB device-to-device copy: the copy kernel and the driver's memcpy.
fn copy_rows(gpu: &Gpu, reps: usize) -> Result<Vec<Row>> {
    let shape = [1usize << 31];
    let host = random_f32(&shape, 1);
    let src = gpu.upload(&host)?;
    let mut dst = gpu.alloc::<f32>(&shape)?;
    gpu.poison(&mut dst)?;
    gpu.copy(&src, &mut dst)?;
    let out = gpu.download(&dst)?;
    let same = out
        .as_slice()
        .unwrap()
        .par_iter()
        .zip(host.as_slice().unwrap())
        .all(|(a, b)| a.to_bits() == b.to_bits());
    if !same {
        return Err("copy kernel: output differs from input".into());
    }
    drop((out, host));
    let bytes = 2.0 * src.bytes() as f64;
    let kernel = time(gpu, reps, |g| g.copy(&src, &mut dst))?;
    let driver = time(gpu, reps, |g| g.copy_with_driver(&src, &mut dst))?;
    Ok(vec![
        Row {
            key: "copy".into(),
            what: "copy kernel, 8 GiB f32".into(),
            timing: kernel,
            bytes,
            flops: 0.0,
        },
        Row {
            key: "memcpy".into(),
            what: "cuMemcpyDtoD, 8 GiB f32".into(),
            timing: driver,
            bytes,
            flops: 0.0,
        },
    ])
}

/// A float type of the benchmark rows: f32, or a 16-bit type rounded from it.
trait BenchFloat: host::MinElement + host::ScanElement + host::GemvElement<Sum = f32> {
    /// The suffix of its rows' keys: empty for f32, `_bf16` or `_f16`.
    const KEY: &str;
    /// The relative error of the final rounding of an f32 sum to this type (none for
    /// f32 itself).
    const ROUNDING: f64;
    fn from_f32(x: f32) -> Self;
    fn to_f32(self) -> f32;
}

impl BenchFloat for f32 {
    const KEY: &str = "";
    const ROUNDING: f64 = 0.0;
    fn from_f32(x: f32) -> Self {
        x
    }
    fn to_f32(self) -> f32 {
        self
    }
}

impl BenchFloat for host::bf16 {
    const KEY: &str = "_bf16";
    const ROUNDING: f64 = host::bf16::EPSILON.to_f64_const();
    fn from_f32(x: f32) -> Self {
        host::bf16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        host::bf16::to_f32(self)
    }
}

impl BenchFloat for host::f16 {
    const KEY: &str = "_f16";
    const ROUNDING: f64 = host::f16::EPSILON.to_f64_const();
    fn from_f32(x: f32) -> Self {
        host::f16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        host::f16::to_f32(self)
    }
}

/// The min headline: 128 x 4096 x 4095 (0.02% under 2^31 elements), `min` and `amin`
/// along each axis, checked at sampled outputs against a CPU scan of their lanes.
fn min_rows<T: BenchFloat>(gpu: &Gpu, reps: usize) -> Result<Vec<Row>> {
    min_shape_rows::<T>(gpu, reps, &[128, 4096, 4095], &[0, 1, 2], "")
}

/// Beyond the headline: `min` and `amin` of 16-bit 128 x 4096 x 4096 along dim 1, rows
/// of whole 16-byte vectors (the headline's rows of 4095 are not), the same bytes.
fn aligned_min_rows<T: BenchFloat>(gpu: &Gpu, reps: usize) -> Result<Vec<Row>> {
    min_shape_rows::<T>(gpu, reps, &[128, 4096, 4096], &[1], "_aligned")
}

/// Beyond the headline: `min` and `amin` of f32 1 x 65536 x 1030 along dim 1, unaligned
/// rows of one outer index (the slab kernel split over the SMs).
fn few_outer_min_rows(gpu: &Gpu, reps: usize) -> Result<Vec<Row>> {
    min_shape_rows::<f32>(gpu, reps, &[1, 65536, 1030], &[1], "_1x65536x1030")
}

/// `min` and `amin` of a 3-D array along each of `axes`, checked at sampled outputs
/// against a CPU scan of their lanes; row keys `min{axis}{tag}{type}`.
fn min_shape_rows<T: BenchFloat>(
    gpu: &Gpu,
    reps: usize,
    shape: &[usize; 3],
    axes: &[usize],
    tag: &str,
) -> Result<Vec<Row>> {
    const SAMPLES: usize = 20_000;
    let host = random_f32(shape, 2).mapv_into_any(T::from_f32);
    let x = gpu.upload(&host)?;
    let flat = host.as_slice().expect("standard layout");
    let element_bytes = size_of::<T>() as f64;
    let [d0, d1, d2] = *shape;
    let mut rows = Vec::new();
    for &axis in axes {
        let problem = host::min_problem("min", shape, axis)?;
        let out_shape = host::reduced_shape(shape, axis, false);
        let (mut values, mut indices) = (gpu.alloc::<T>(&out_shape)?, gpu.alloc::<i64>(&out_shape)?);
        let mut amin_values = gpu.alloc::<T>(&out_shape)?;
        for array in [&mut values, &mut amin_values] {
            gpu.poison(array)?;
        }
        gpu.poison(&mut indices)?;
        gpu.min_into(&x, axis, &mut values, &mut indices)?;
        gpu.amin_into(&x, axis, &mut amin_values)?;
        let (v, i, a) = (
            gpu.download(&values)?,
            gpu.download(&indices)?,
            gpu.download(&amin_values)?,
        );
        let (v, i, a) = (
            v.as_slice().unwrap(),
            i.as_slice().unwrap(),
            a.as_slice().unwrap(),
        );
        let outputs = problem.outputs() as usize;
        let bad = (0..SAMPLES)
            .into_par_iter()
            .map(|s| (s as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) as usize % outputs)
            .chain([0, outputs - 1].into_par_iter())
            .filter(|&m| {
                let (outer, inner) = ((m as u64 / problem.inner), (m as u64 % problem.inner));
                let at = |r: u64| flat[((outer * problem.reduce + r) * problem.inner + inner) as usize];
                let (best, at) =
                    (1..problem.reduce).fold(
                        (at(0), 0),
                        |(b, i), r| {
                            if at(r) < b { (at(r), r) } else { (b, i) }
                        },
                    );
                v[m] != best || a[m] != best || i[m] != at as i64
            })
            .count();
        if bad > 0 {
            return Err(format!(
                "min{tag}{} along axis {axis}: {bad} of {SAMPLES} sampled outputs differ from the CPU",
                T::KEY
            )
            .into());
        }
        let out_bytes = outputs as f64 * element_bytes;
        let bytes = x.bytes() as f64;
        let of = if tag.is_empty() {
            String::new()
        } else {
            format!(" of {d0}x{d1}x{d2}")
        };
        let times = time(gpu, reps, |g| g.min_into(&x, axis, &mut values, &mut indices))?;
        rows.push(Row {
            key: format!("min{axis}{tag}{}", T::KEY),
            what: format!("min (values+indices){}{of}, dim {axis}", T::KEY),
            timing: times,
            bytes: bytes + out_bytes + outputs as f64 * 8.0,
            flops: 0.0,
        });
        let times = time(gpu, reps, |g| g.amin_into(&x, axis, &mut amin_values))?;
        rows.push(Row {
            key: format!("amin{axis}{tag}{}", T::KEY),
            what: format!("amin{}{of}, dim {axis}", T::KEY),
            timing: times,
            bytes: bytes + out_bytes,
            flops: 0.0,
        });
    }
    Ok(rows)
}

/// Checks sampled lanes of an exclusive scan of `x` (row-major `[outer, scan, inner]`)
/// against an f64 scan, within `scan * eps(f32) * sum(|lane|)` plus the final rounding
/// to `T`.
fn check_scan_lanes<T: BenchFloat>(x: &[T], y: &[T], problem: (usize, usize, usize), lanes: usize) -> Result {
    let (outer, scan, inner) = problem;
    let count = outer * inner;
    for s in 0..lanes.min(count) {
        let lane = (s as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) as usize % count;
        let (o, i) = (lane / inner, lane % inner);
        let at = |r: usize| (o * scan + r) * inner + i;
        let value = |v: T| -> f64 { v.into() };
        let lane_abs: f64 = (0..scan).map(|r| value(x[at(r)]).abs()).sum();
        let bound = scan as f64 * f32::EPSILON as f64 * lane_abs;
        let mut sum = 0.0f64;
        for r in 0..scan {
            let err = (value(y[at(r)]) - sum).abs();
            // NaN (an unwritten, poisoned output) fails too.
            if err.is_nan() || err > bound + T::ROUNDING * sum.abs() {
                return Err(
                    format!("scan lane {lane} row {r}: error {err:e} over the bound {bound:e}").into(),
                );
            }
            sum += value(x[at(r)]);
        }
    }
    Ok(())
}

/// The scan workloads: exclusive cumsum of 32768 x 32768 along axis 1 and axis 0, and
/// of 2^28; each checked on sampled lanes (the 1-D one whole). 16-bit types sum in f32
/// and round each output once.
fn scan_rows<T: BenchFloat>(gpu: &Gpu, reps: usize) -> Result<Vec<Row>> {
    use host::ScanKind::Exclusive;
    let mut rows = Vec::new();
    let square = [32768usize, 32768];
    // Beyond the headline: rows of an odd length, and an axis of 2048 columns (16
    // threads a column).
    let cases: [(&str, &[usize], usize, &str); 5] = [
        ("scan1", &square, 1, "exclusive cumsum 32768x32768, dim 1"),
        ("scan0", &square, 0, "exclusive cumsum 32768x32768, dim 0"),
        ("scan1d", &[1 << 28], 0, "exclusive cumsum 2^28, 1-D"),
        (
            "scan1_odd",
            &[65536, 4095],
            1,
            "exclusive cumsum 65536x4095, dim 1",
        ),
        (
            "scan0_narrow",
            &[65536, 2048],
            0,
            "exclusive cumsum 65536x2048, dim 0",
        ),
    ];
    for (key, shape, axis, what) in cases {
        let host = random_f32(shape, 3).mapv_into_any(T::from_f32);
        let x = gpu.upload(&host)?;
        let mut y = gpu.alloc::<T>(shape)?;
        gpu.poison(&mut y)?;
        gpu.cumsum_into(&x, &mut y, axis, Exclusive, false)?;
        let out = gpu.download(&y)?;
        let p = host::scan_problem(shape, axis)?;
        let view = (p.outer as usize, p.scan as usize, p.inner as usize);
        check_scan_lanes(host.as_slice().unwrap(), out.as_slice().unwrap(), view, 64)?;
        drop(out);
        let times = time(gpu, reps, |g| g.cumsum_into(&x, &mut y, axis, Exclusive, false))?;
        rows.push(Row {
            key: format!("{key}{}", T::KEY),
            what: format!("{what}{}", T::KEY),
            timing: times,
            bytes: 2.0 * x.bytes() as f64,
            flops: 0.0,
        });
    }
    Ok(rows)
}

/// One matvec row: `op(A) x` for A of `shape`, checked whole against the f64 reference.
fn gemv_row<T: BenchFloat>(
    gpu: &Gpu,
    reps: usize,
    key: &str,
    shape: [usize; 2],
    op: host::Op,
) -> Result<Row> {
    use ndarray::Ix2;
    let host_a = random_f32(&shape, 4)
        .mapv_into_any(T::from_f32)
        .into_dimensionality::<Ix2>()?;
    let inner = if op == host::Op::N { shape[1] } else { shape[0] };
    let host_x = random_f32(&[inner], 5)
        .mapv_into_any(T::from_f32)
        .into_dimensionality::<ndarray::Ix1>()?;
    let (a, x) = (gpu.upload(&host_a)?, gpu.upload(&host_x)?);
    let (_, out_shape) = host::gemv_problem(&shape, &[inner], op)?;
    let mut y = gpu.alloc::<T>(&out_shape)?;
    gpu.poison(&mut y)?;
    gpu.gemv(1.0, op, &a, &x, 0.0, &mut y)?;
    let got = gpu.download(&y)?;
    let (want, scale) = host::reference::matvec::gemv(1.0, op, host_a.view(), host_x.view(), 0.0, None)?;
    let bad = got
        .iter()
        .zip(want.iter().zip(&scale))
        .filter(|&(&g, (&w, &s))| {
            let err = (g.into() - w).abs();
            err.is_nan() || err > (inner as f64 + 2.0) * f32::EPSILON as f64 * s + T::ROUNDING * w.abs()
        })
        .count();
    let key = format!("{key}{}", T::KEY);
    if bad > 0 {
        return Err(format!("{key}: {bad} outputs outside the error bound").into());
    }
    drop((host_a, got));
    let times = time(gpu, reps, |g| g.gemv(1.0, op, &a, &x, 0.0, &mut y))?;
    let what = format!(
        "{} x, A {}x{}{}",
        if op == host::Op::N { "A" } else { "A^T" },
        shape[0],
        shape[1],
        T::KEY
    );
    Ok(Row {
        key,
        what,
        timing: times,
        bytes: (a.bytes() + x.bytes() + y.bytes()) as f64,
        flops: 0.0,
    })
}

/// One row of `A X` with `vectors` columns of X, checked at every 64th row of A
/// against the f64 reference.
fn vectors_row(gpu: &Gpu, reps: usize, key: &str, shape: [usize; 2], vectors: usize) -> Result<Row> {
    use ndarray::{Ix2, s};
    let host_a = random_f32(&shape, 6).into_dimensionality::<Ix2>()?;
    let host_x = random_f32(&[shape[1], vectors], 7).into_dimensionality::<Ix2>()?;
    let (a, x) = (gpu.upload(&host_a)?, gpu.upload(&host_x)?);
    let mut y = gpu.alloc::<f32>(&[shape[0], vectors])?;
    gpu.poison(&mut y)?;
    gpu.gemv(1.0, host::Op::N, &a, &x, 0.0, &mut y)?;
    let got = gpu.download(&y)?.into_dimensionality::<Ix2>()?;
    let sampled = host_a.slice(s![..;64, ..]);
    let (want, scale) = host::reference::matvec::gemv_vectors(1.0, sampled, host_x.view(), 0.0, None)?;
    let bad = got
        .slice(s![..;64, ..])
        .iter()
        .zip(want.iter().zip(&scale))
        .filter(|&(&g, (&w, &s))| {
            let err = (g as f64 - w).abs();
            err.is_nan() || err > (shape[1] as f64 + 2.0) * f32::EPSILON as f64 * s
        })
        .count();
    if bad > 0 {
        return Err(format!("{key}: {bad} outputs outside the error bound").into());
    }
    drop((host_a, host_x, got));
    let times = time(gpu, reps, |g| g.gemv(1.0, host::Op::N, &a, &x, 0.0, &mut y))?;
    Ok(Row {
        key: key.into(),
        what: format!("A X, A {}x{} f32, X {vectors} columns", shape[0], shape[1]),
        timing: times,
        bytes: (a.bytes() + x.bytes() + y.bytes()) as f64,
        flops: 0.0,
    })
}

/// The matvec workloads: the headline A x, A^T x with A (2^20, 2048), and M = 16; the
/// first two in bf16 and f16 too; A X with 8 columns on the headline A, and with 2 and
/// 16 columns, and on a tall A.
fn matvec_rows(gpu: &Gpu, reps: usize) -> Result<Vec<Row>> {
    Ok(vec![
        gemv_row::<f32>(gpu, reps, "matvec", [2048, 1 << 20], host::Op::N)?,
        gemv_row::<f32>(gpu, reps, "matvec_t", [1 << 20, 2048], host::Op::T)?,
        gemv_row::<f32>(gpu, reps, "matvec16", [16, 1 << 24], host::Op::N)?,
        gemv_row::<host::bf16>(gpu, reps, "matvec", [2048, 1 << 20], host::Op::N)?,
        gemv_row::<host::f16>(gpu, reps, "matvec", [2048, 1 << 20], host::Op::N)?,
        gemv_row::<host::bf16>(gpu, reps, "matvec_t", [1 << 20, 2048], host::Op::T)?,
        gemv_row::<host::f16>(gpu, reps, "matvec_t", [1 << 20, 2048], host::Op::T)?,
        vectors_row(gpu, reps, "matvec_x8", [2048, 1 << 20], 8)?,
        vectors_row(gpu, reps, "matvec_x2", [2048, 1 << 20], 2)?,
        vectors_row(gpu, reps, "matvec_x16", [2048, 1 << 20], 16)?,
        vectors_row(gpu, reps, "matvec_x8_tall", [1 << 20, 2048], 8)?,
    ])
}

/// `||got - want|| / ||want||` over sampled elements.
fn sampled_error(samples: &[(f32, f64)]) -> f64 {
    let diff: f64 = samples.iter().map(|&(g, w)| (g as f64 - w).powi(2)).sum();
    let norm: f64 = samples.iter().map(|&(_, w)| w * w).sum();
    if samples.iter().any(|(g, _)| g.is_nan()) {
        return f64::INFINITY;
    }
    (diff / norm).sqrt()
}

/// Spread sample indices in `0..count`: a multiplicative hash, plus both ends.
fn sample_indices(count: usize, samples: usize) -> Vec<usize> {
    (0..samples as u64)
        .map(|s| (s.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11) as usize % count)
        .chain([0, count - 1])
        .collect()
}

/// The conv headline in a 16-bit type: forward from NCHW and from NHWC tensors, and the
/// backward pass (input and weight gradients) from NHWC ones, each checked at sampled
/// outputs against f64 sums of the rounded inputs, within the output's rounding.
fn conv_half_rows<T: BenchFloat + host::ConvElement>(gpu: &Gpu, reps: usize) -> Result<Vec<Row>> {
    use host::ConvLayout;
    use ndarray::{ArrayD, Ix4};
    let (x_shape, w_shape) = ([8, 64, 512, 1024], [128, 64, 3, 3]);
    let nchw = host::Conv2dParams::default();
    let nhwc = host::Conv2dParams {
        layout: ConvLayout::Nhwc,
        ..nchw
    };
    let (_, y_shape) = host::conv2d_problem(&x_shape, &w_shape, &nchw)?;
    // The inputs' values in T, as f32 for the reference.
    let rounded = |shape: &[usize], seed| {
        random_f32(shape, seed)
            .mapv(|v| T::from_f32(v).to_f32())
            .into_dimensionality::<Ix4>()
    };
    let (hx, hw, hdy) = (
        rounded(&x_shape, 6)?,
        rounded(&w_shape, 7)?,
        rounded(&y_shape, 8)?,
    );
    let reference = ConvReference::new(hx.view(), hw.view(), hdy.view(), &nchw)?;
    let y_dims: [usize; 4] = hdy.dim().into();
    let [_, _, oh, ow] = y_dims;
    let flops = 2.0 * (8 * 128 * oh * ow) as f64 * (64 * 9) as f64;
    let upload = |a: &ndarray::Array4<f32>, layout| {
        let a = match layout {
            ConvLayout::Nchw => a.view(),
            ConvLayout::Nhwc => a.view().permuted_axes([0, 2, 3, 1]),
        };
        gpu.upload(&a.as_standard_layout().mapv(T::from_f32))
    };
    let check = |what: &str, want: &Samples, got: &ArrayD<T>, layout| -> Result {
        let got = got.mapv(T::to_f32);
        let error = want.error(as_nchw(&got, layout)?);
        eprintln!(
            "conv {what}: relative error {error:.2e} over {} sampled outputs",
            want.len()
        );
        if error.is_nan() || error > T::ROUNDING {
            return Err(format!("conv {what}: relative error {error:e} over {:e}", T::ROUNDING).into());
        }
        Ok(())
    };
    let name = &T::KEY[1..];
    let mut rows = Vec::new();
    let y_want = Samples::new(y_dims, 10_000, |at| reference.output(at));
    for (params, key, layout_name) in [(nchw, "conv_fwd", "NCHW"), (nhwc, "conv_fwd_nhwc", "NHWC")] {
        let (x, w) = (upload(&hx, params.layout)?, upload(&hw, params.layout)?);
        let (_, shape) = host::conv2d_problem(x.shape(), w.shape(), &params)?;
        let mut y = gpu.alloc::<T>(&shape)?;
        gpu.poison(&mut y)?;
        gpu.conv2d_into(&x, &w, None, &params, &mut y)?;
        let what = format!("conv2d forward {name}, {layout_name}");
        check(&what, &y_want, &gpu.download(&y)?, params.layout)?;
        rows.push(Row {
            key: format!("{key}{}", T::KEY),
            what,
            timing: time(gpu, reps, |g| g.conv2d_into(&x, &w, None, &params, &mut y))?,
            bytes: (x.bytes() + w.bytes() + y.bytes()) as f64,
            flops,
        });
    }
    let (x, w, dy) = (
        upload(&hx, ConvLayout::Nhwc)?,
        upload(&hw, ConvLayout::Nhwc)?,
        upload(&hdy, ConvLayout::Nhwc)?,
    );
    let (mut dx, mut dw) = (gpu.alloc::<T>(x.shape())?, gpu.alloc::<T>(w.shape())?);
    gpu.poison(&mut dx)?;
    gpu.poison(&mut dw)?;
    gpu.conv2d_backward_into(&x, &w, &dy, &nhwc, (Some(&mut dx), Some(&mut dw), None))?;
    let what = format!("conv2d backward {name}, NHWC");
    let dx_want = Samples::new(x_shape, 10_000, |at| reference.input_grad(at));
    check(
        &format!("{what}, input gradient"),
        &dx_want,
        &gpu.download(&dx)?,
        ConvLayout::Nhwc,
    )?;
    let dw_want = Samples::new(w_shape, 62, |at| reference.weight_grad(at));
    check(
        &format!("{what}, weight gradient"),
        &dw_want,
        &gpu.download(&dw)?,
        ConvLayout::Nhwc,
    )?;
    rows.push(Row {
        key: format!("conv_bwd_nhwc{}", T::KEY),
        what,
        timing: time(gpu, reps, |g| {
            g.conv2d_backward_into(&x, &w, &dy, &nhwc, (Some(&mut dx), Some(&mut dw), None))
        })?,
        bytes: (2 * x.bytes() + w.bytes() + dy.bytes()) as f64,
        flops: 2.0 * flops,
    });
    Ok(rows)
}

/// The conv headline: x 8x64x512x1024, w 128x64x3x3, stride 1, no padding, no bias:
/// the forward pass, and the backward pass (input and weight gradients), each checked
/// against f64 sums at sampled outputs (relative norm error at most 1e-5).
fn conv_rows(gpu: &Gpu, reps: usize) -> Result<Vec<Row>> {
    use host::{ConvLayout, ConvPrecision};
    use ndarray::{ArrayView4, Ix4};
    let params = host::Conv2dParams::default();
    let (x_shape, w_shape) = ([8, 64, 512, 1024], [128, 64, 3, 3]);
    let (_, y_shape) = host::conv2d_problem(&x_shape, &w_shape, &params)?;
    let hx = random_f32(&x_shape, 6).into_dimensionality::<Ix4>()?;
    let hw = random_f32(&w_shape, 7).into_dimensionality::<Ix4>()?;
    let hdy = random_f32(&y_shape, 8).into_dimensionality::<Ix4>()?;
    let (x, w, dy) = (gpu.upload(&hx)?, gpu.upload(&hw)?, gpu.upload(&hdy)?);
    let y_dims: [usize; 4] = hdy.dim().into();
    let [_, _, oh, ow] = y_dims;
    let flops = 2.0 * (8 * 128 * oh * ow) as f64 * (64 * 9) as f64;
    let reference = ConvReference::new(hx.view(), hw.view(), hdy.view(), &params)?;
    let check = |what: &str, want: &Samples, got: ArrayView4<f32>, precision| -> Result {
        let (error, tolerance) = (want.error(got), tolerance(precision));
        eprintln!(
            "conv {what}: relative error {error:.2e} over {} sampled outputs",
            want.len()
        );
        if error.is_nan() || error > tolerance {
            return Err(format!("conv {what}: relative error {error:e} over {tolerance:e}").into());
        }
        Ok(())
    };

    let y_want = Samples::new(y_dims, 10_000, |at| reference.output(at));
    let mut y = gpu.alloc::<f32>(&y_shape)?;
    gpu.poison(&mut y)?;
    gpu.conv2d_into(&x, &w, None, &params, &mut y)?;
    let got = gpu.download(&y)?;
    check(
        "forward",
        &y_want,
        as_nchw(&got, ConvLayout::Nchw)?,
        ConvPrecision::Fp32,
    )?;
    drop(got);
    let forward = time(gpu, reps, |g| g.conv2d_into(&x, &w, None, &params, &mut y))?;

    // TF32 on the tensor cores: from NCHW tensors, from NHWC tensors, and from NHWC
    // tensors with a bias and ReLU fused (torch: F.relu(F.conv2d(x, w, b))); checked
    // against the same FP64 sums, NHWC results through an NCHW view on the host,
    // within TF32's rounding.
    let tf32 = |layout| host::Conv2dParams {
        precision: ConvPrecision::Tf32,
        layout,
        ..params
    };
    let (x_last, w_last) = (gpu.to_channels_last(&x)?, gpu.to_channels_last(&w)?);
    let mut y_last = gpu.to_channels_last(&y)?;
    let hb = random_f32(&[128], 9);
    let b = gpu.upload(&hb)?;
    let fused_want = Samples::new(y_dims, 10_000, |at| {
        (reference.output(at) + hb[at[1]] as f64).max(0.0)
    });
    let mut tf32_rows = Vec::new();
    for (layout, fused, key, what) in [
        (
            ConvLayout::Nchw,
            false,
            "conv_fwd_tf32",
            "conv2d forward TF32, NCHW",
        ),
        (
            ConvLayout::Nhwc,
            false,
            "conv_fwd_tf32_nhwc",
            "conv2d forward TF32, NHWC",
        ),
        (
            ConvLayout::Nhwc,
            true,
            "conv_fwd_tf32_nhwc_bias_relu",
            "conv2d + bias + ReLU TF32, NHWC",
        ),
    ] {
        let p = host::Conv2dParams {
            activation: if fused {
                host::Activation::Relu
            } else {
                host::Activation::Identity
            },
            ..tf32(layout)
        };
        let bias = fused.then_some(&b);
        let (xs, ws, ys) = match layout {
            ConvLayout::Nchw => (&x, &w, &mut y),
            ConvLayout::Nhwc => (&x_last, &w_last, &mut y_last),
        };
        gpu.poison(ys)?;
        gpu.conv2d_into(xs, ws, bias, &p, ys)?;
        let got = gpu.download(ys)?;
        let want = if fused { &fused_want } else { &y_want };
        check(what, want, as_nchw(&got, layout)?, ConvPrecision::Tf32)?;
        let times = time(gpu, reps, |g| g.conv2d_into(xs, ws, bias, &p, ys))?;
        tf32_rows.push(Row {
            key: key.into(),
            what: what.into(),
            timing: times,
            bytes: (x.bytes() + w.bytes() + ys.bytes()) as f64,
            flops,
        });
    }
    drop((y, y_last, x_last, w_last));

    let (mut dx, mut dw) = (gpu.alloc::<f32>(&x_shape)?, gpu.alloc::<f32>(&w_shape)?);
    gpu.poison(&mut dx)?;
    gpu.poison(&mut dw)?;
    gpu.conv2d_backward_into(&x, &w, &dy, &params, (Some(&mut dx), Some(&mut dw), None))?;
    let dx_want = Samples::new(x_shape, 10_000, |at| reference.input_grad(at));
    let got = gpu.download(&dx)?;
    check(
        "input gradient",
        &dx_want,
        as_nchw(&got, ConvLayout::Nchw)?,
        ConvPrecision::Fp32,
    )?;
    // Each weight-gradient element sums 4 million products: fewer samples.
    let dw_want = Samples::new(w_shape, 62, |at| reference.weight_grad(at));
    let got = gpu.download(&dw)?;
    check(
        "weight gradient",
        &dw_want,
        as_nchw(&got, ConvLayout::Nchw)?,
        ConvPrecision::Fp32,
    )?;
    let backward = time(gpu, reps, |g| {
        g.conv2d_backward_into(&x, &w, &dy, &params, (Some(&mut dx), Some(&mut dw), None))
    })?;
    let input_only = time(gpu, reps, |g| {
        g.conv2d_backward_into(&x, &w, &dy, &params, (Some(&mut dx), None, None))
    })?;
    let weight_only = time(gpu, reps, |g| {
        g.conv2d_backward_into(&x, &w, &dy, &params, (None, Some(&mut dw), None))
    })?;
    let bytes = (x.bytes() + w.bytes() + dy.bytes()) as f64;
    let mut rows = vec![
        Row {
            key: "conv_fwd".into(),
            what: "conv2d forward 8x64x512x1024, 3x3".into(),
            timing: forward,
            bytes,
            flops,
        },
        Row {
            key: "conv_bwd".into(),
            what: "conv2d backward (input + weight)".into(),
            timing: backward,
            bytes: bytes + x.bytes() as f64,
            flops: 2.0 * flops,
        },
        Row {
            key: "conv_bwd_input".into(),
            what: "  of which the input gradient".into(),
            timing: input_only,
            bytes,
            flops,
        },
        Row {
            key: "conv_bwd_weight".into(),
            what: "  of which the weight gradient".into(),
            timing: weight_only,
            bytes,
            flops,
        },
    ];
    rows.extend(tf32_rows);

    // TF32 backward from NCHW and from NHWC tensors, checked against the same sums.
    let (x_last, w_last, dy_last) = (
        gpu.to_channels_last(&x)?,
        gpu.to_channels_last(&w)?,
        gpu.to_channels_last(&dy)?,
    );
    drop((dx, dw));
    for (layout, key, what) in [
        (ConvLayout::Nchw, "conv_bwd_tf32", "conv2d backward TF32, NCHW"),
        (
            ConvLayout::Nhwc,
            "conv_bwd_tf32_nhwc",
            "conv2d backward TF32, NHWC",
        ),
    ] {
        let p = tf32(layout);
        let (xs, ws, dys) = match layout {
            ConvLayout::Nchw => (&x, &w, &dy),
            ConvLayout::Nhwc => (&x_last, &w_last, &dy_last),
        };
        let (mut gx, mut gw) = (gpu.alloc::<f32>(xs.shape())?, gpu.alloc::<f32>(ws.shape())?);
        gpu.poison(&mut gx)?;
        gpu.poison(&mut gw)?;
        gpu.conv2d_backward_into(xs, ws, dys, &p, (Some(&mut gx), Some(&mut gw), None))?;
        let got = gpu.download(&gx)?;
        let which = format!("{what}, input gradient");
        check(&which, &dx_want, as_nchw(&got, layout)?, ConvPrecision::Tf32)?;
        drop(got);
        let got = gpu.download(&gw)?;
        let which = format!("{what}, weight gradient");
        check(&which, &dw_want, as_nchw(&got, layout)?, ConvPrecision::Tf32)?;
        let times = time(gpu, reps, |g| {
            g.conv2d_backward_into(xs, ws, dys, &p, (Some(&mut gx), Some(&mut gw), None))
        })?;
        let input_only = time(gpu, reps, |g| {
            g.conv2d_backward_into(xs, ws, dys, &p, (Some(&mut gx), None, None))
        })?;
        let weight_only = time(gpu, reps, |g| {
            g.conv2d_backward_into(xs, ws, dys, &p, (None, Some(&mut gw), None))
        })?;
        rows.push(Row {
            key: key.into(),
            what: what.into(),
            timing: times,
            bytes: bytes + x.bytes() as f64,
            flops: 2.0 * flops,
        });
        for (which, timing) in [("input", input_only), ("weight", weight_only)] {
            rows.push(Row {
                key: format!("{key}_{which}"),
                what: format!("  of which the {which} gradient"),
                timing,
                bytes,
                flops,
            });
        }
    }
    Ok(rows)
}

/// Host time per call of a scan too small to keep the GPU busy: the API's own cost.
fn cumsum_call_us(gpu: &Gpu) -> Result<f64> {
    let x = gpu.upload(&Array1::<f32>::ones(32))?;
    let mut y = gpu.alloc::<f32>(&[32])?;
    Ok(gpu.host_us_per_call(1000, 7, |gpu| {
        gpu.cumsum_into(&x, &mut y, 0, ScanKind::Exclusive, false)
    })?)
}

fn main() -> Result {
    let opts = parse_args()?;
    let gpu = Gpu::new()?;
    let info = gpu.info();
    println!(
        "device: {} (cc {}.{}, {} SMs, driver CUDA {}.{}), kernels: {}",
        info.name,
        info.compute_capability.0,
        info.compute_capability.1,
        info.multiprocessors,
        info.driver_version.0,
        info.driver_version.1,
        info.kernel_image
    );
    let wanted = |family: &str| {
        opts.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|o| o == family))
    };
    let mut rows = Vec::new();
    // The copy always runs: every other rate is quoted against its bandwidth.
    let started = Instant::now();
    rows.extend(copy_rows(&gpu, opts.reps)?);
    eprintln!("copy: {:.1} s", started.elapsed().as_secs_f64());
    println!(
        "per call, 32 floats: Rust API cumsum_into {:.2} us (host time, what a Python call adds to)",
        cumsum_call_us(&gpu)?
    );
    if wanted("scan") {
        let started = Instant::now();
        rows.extend(scan_rows::<f32>(&gpu, opts.reps)?);
        rows.extend(scan_rows::<host::bf16>(&gpu, opts.reps)?);
        rows.extend(scan_rows::<host::f16>(&gpu, opts.reps)?);
        eprintln!("scan: {:.1} s", started.elapsed().as_secs_f64());
    }
    if wanted("matvec") {
        let started = Instant::now();
        rows.extend(matvec_rows(&gpu, opts.reps)?);
        eprintln!("matvec: {:.1} s", started.elapsed().as_secs_f64());
    }
    if wanted("min") {
        let started = Instant::now();
        rows.extend(min_rows::<f32>(&gpu, opts.reps)?);
        rows.extend(min_rows::<host::bf16>(&gpu, opts.reps)?);
        rows.extend(min_rows::<host::f16>(&gpu, opts.reps)?);
        rows.extend(aligned_min_rows::<host::bf16>(&gpu, opts.reps)?);
        rows.extend(few_outer_min_rows(&gpu, opts.reps)?);
        eprintln!("min: {:.1} s", started.elapsed().as_secs_f64());
    }
    if wanted("conv") {
        let started = Instant::now();
        rows.extend(conv_rows(&gpu, opts.reps)?);
        rows.extend(conv_half_rows::<host::bf16>(&gpu, opts.reps)?);
        rows.extend(conv_half_rows::<host::f16>(&gpu, opts.reps)?);
        eprintln!("conv: {:.1} s", started.elapsed().as_secs_f64());
    }
    // Asked for by name only: they need the whole machine, or one device for minutes
    // of uploads.
    let named = |name: &str| {
        opts.only
            .as_ref()
            .is_some_and(|only| only.iter().any(|o| o == name))
    };
    for (name, table) in [
        (
            "group",
            group::group_table as fn(usize, Option<&Value>) -> Result<Value>,
        ),
        ("group-shared", |reps, _| group::shared_device_scans(reps)),
    ] {
        if named(name) {
            let table = table(opts.reps, opts.baseline.as_ref())?;
            if let Some(path) = &opts.json {
                std::fs::write(
                    format!("{path}.{name}.json"),
                    serde_json::to_string_pretty(&table)?,
                )?;
            }
        }
    }
    // Printed in a table of their own, after the main one.
    let mut layer_rows = Vec::new();
    if wanted("layers") {
        let started = Instant::now();
        layer_rows = layers::layer_rows(&gpu, opts.reps, opts.layers.as_deref())?;
        eprintln!("layers: {:.1} s", started.elapsed().as_secs_f64());
    }

    let copy_bw = rows
        .iter()
        .find(|r| r.key == "memcpy")
        .map(Row::gbps)
        .unwrap_or(f64::NAN);
    let torch_ms = |key: &str| {
        opts.baseline
            .as_ref()
            .and_then(|b| b["results"][key]["ms"].as_f64())
    };
    println!();
    println!(
        "| {:<34} | {:>9} | {:>8} | {:>7} | {:>9} | {:>13} |",
        "workload", "ours ms", "GB/s", "% copy", "torch ms", "torch / ours"
    );
    println!(
        "|{:-<36}|{:->11}|{:->10}|{:->9}|{:->11}|{:->15}|",
        "", "", "", "", "", ""
    );
    for r in &rows {
        let (ms, gbps) = (r.median_ms(), r.gbps());
        let torch = torch_ms(&r.key);
        println!(
            "| {:<34} | {:>9.3} | {:>8.0} | {:>6.1}% | {:>9} | {:>13} |",
            r.what,
            ms,
            gbps,
            100.0 * gbps / copy_bw,
            torch.map_or("-".into(), |t| format!("{t:.3}")),
            torch.map_or("-".into(), |t| format!("{:.3}x", t / ms)),
        );
    }
    for r in rows.iter().filter(|r| r.flops > 0.0) {
        let rate = |ms: f64| r.flops / (ms * 1e-3) / 1e12;
        println!(
            "{}: {:.1} TFLOP/s{}",
            r.what,
            rate(r.median_ms()),
            torch_ms(&r.key).map_or(String::new(), |t| format!(" (torch {:.1} TFLOP/s)", rate(t)))
        );
    }
    for r in &rows {
        let model_key = format!("{}_model", r.key);
        if let Some(model) = torch_ms(&model_key) {
            println!(
                "{}: {:.3}x as fast as {model_key} ({model:.3} ms)",
                r.what,
                model / r.median_ms()
            );
        }
    }
    println!(
        "\ncopy bandwidth (cuMemcpyDtoD, read + write): {copy_bw:.0} GB/s; median of {} runs after {WARMUP} + {WARMUP_S} s of warm-up",
        opts.reps
    );
    let layer_summary = (!layer_rows.is_empty()).then(|| layers::report(&layer_rows, torch_ms));
    if let Some(path) = &opts.json {
        let records: Vec<Value> = rows
            .iter()
            .chain(&layer_rows)
            .map(|r| r.record(copy_bw, torch_ms(&r.key)))
            .collect();
        let doc = json!({
            "device": info.name, "kernel_image": info.kernel_image, "reps": opts.reps,
            "rows": records, "layer_summary": layer_summary,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)?;
    }
    Ok(())
}
