//! The convolution layer suite: ResNet-50, UNet and depthwise layers in FP32 and TF32,
//! NCHW and NHWC, and in bf16 NHWC, forward (with a bias) and backward (all three gradients), each
//! checked at sampled elements against f64 sums, then timed; torch_baseline.py's
//! `layers` times cuDNN on the same table. The backward pass's two parts (the input
//! gradient; the weight and bias gradients) are timed alone too, ours only, to tell
//! which part limits a layer.

use host::{Conv2dParams, ConvElement, ConvLayout, ConvPrecision, DeviceArray, Gpu};
use ndarray::{Array1, Array4, ArrayD, Ix4};
use rayon::prelude::*;
use serde_json::{Value, json};

use crate::conv_reference::{ConvReference, Samples, as_nchw, tolerance};
use crate::{BenchFloat, Result, Row, random_f32, sampled_error, time};

/// One layer: NCHW shapes, stride and padding (the same along both axes), groups;
/// dilation 1.
struct Layer {
    name: &'static str,
    what: &'static str,
    x: [usize; 4],
    w: [usize; 4],
    stride: usize,
    padding: usize,
    groups: usize,
}

const fn layer(
    name: &'static str,
    what: &'static str,
    x: [usize; 4],
    w: [usize; 4],
    stride: usize,
    padding: usize,
    groups: usize,
) -> Layer {
    Layer {
        name,
        what,
        x,
        w,
        stride,
        padding,
        groups,
    }
}

/// The same table as `LAYERS` in torch_baseline.py: name, what, x, w, stride, padding,
/// groups.
const LAYERS: [Layer; 9] = [
    layer("R1", "1x1", [32, 64, 56, 56], [256, 64, 1, 1], 1, 0, 1),
    layer("R2", "3x3", [32, 128, 28, 28], [128, 128, 3, 3], 1, 1, 1),
    layer("R3", "3x3", [32, 256, 14, 14], [256, 256, 3, 3], 1, 1, 1),
    layer("R4", "3x3", [32, 512, 7, 7], [512, 512, 3, 3], 1, 1, 1),
    layer("R5", "1x1 down", [32, 256, 56, 56], [512, 256, 1, 1], 2, 0, 1),
    layer("R6", "3x3 down", [32, 128, 56, 56], [128, 128, 3, 3], 2, 1, 1),
    layer("R7", "stem 7x7", [32, 3, 224, 224], [64, 3, 7, 7], 2, 3, 1),
    layer("U1", "UNet 3x3", [4, 64, 256, 256], [64, 64, 3, 3], 1, 1, 1),
    layer("D1", "depthwise", [32, 256, 28, 28], [256, 1, 3, 3], 1, 1, 256),
];

/// Precision x layout, with the key's suffix: f32 in FP32 and TF32, and bf16 (on the
/// tensor cores whatever the precision says).
const MODES: [(ConvPrecision, ConvLayout, &str); 5] = [
    (ConvPrecision::Fp32, ConvLayout::Nchw, "fp32_nchw"),
    (ConvPrecision::Fp32, ConvLayout::Nhwc, "fp32_nhwc"),
    (ConvPrecision::Tf32, ConvLayout::Nchw, "tf32_nchw"),
    (ConvPrecision::Tf32, ConvLayout::Nhwc, "tf32_nhwc"),
    (ConvPrecision::Tf32, ConvLayout::Nhwc, "bf16_nhwc"),
];

const PASSES: [&str; 2] = ["fwd", "bwd"];

/// The backward pass's parts, timed alone: the input gradient, and the weight and bias
/// gradients (keys `layer_R1_bwd_input_fp32_nchw`, ...; ours only).
const BACKWARD_PARTS: [&str; 2] = ["bwd_input", "bwd_weight"];

/// Sampled elements per checked tensor (each bias gradient is checked whole).
const SAMPLES: usize = 500;

/// The key in torch_baseline.py's JSON, e.g. `layer_R1_fwd_fp32_nchw`.
fn key(layer: &str, pass: &str, mode: &str) -> String {
    format!("layer_{layer}_{pass}_{mode}")
}

/// `fp32_nchw` as `FP32 NCHW`.
fn label(mode: &str) -> String {
    mode.to_uppercase().replace('_', " ")
}

/// Every layer named in `only` (all when `None`), each mode, both passes.
pub(crate) fn layer_rows(gpu: &Gpu, reps: usize, only: Option<&[String]>) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for layer in &LAYERS {
        if only.is_none_or(|names| names.iter().any(|n| n == layer.name)) {
            rows.extend(one_layer(gpu, reps, layer)?);
        }
    }
    Ok(rows)
}

/// A host NCHW tensor on the GPU in `layout`, of `T`.
fn upload<T: BenchFloat>(gpu: &Gpu, a: &Array4<f32>, layout: ConvLayout) -> Result<DeviceArray<T>> {
    let a = match layout {
        ConvLayout::Nchw => a.view(),
        ConvLayout::Nhwc => a.view().permuted_axes([0, 2, 3, 1]),
    };
    Ok(gpu.upload(&a.as_standard_layout().mapv(T::from_f32))?)
}

/// A downloaded tensor as f32.
fn download<T: BenchFloat>(gpu: &Gpu, a: &DeviceArray<T>) -> Result<ArrayD<f32>> {
    Ok(gpu.download(a)?.mapv(T::to_f32))
}

/// What one layer's modes compare with: sampled f64 sums of the f32 host tensors, and
/// the bias.
struct Wanted {
    y: Samples,
    dx: Samples,
    dw: Samples,
    db: Vec<f64>,
    bias: Array1<f32>,
}

/// One layer's rows. The wanted values are computed once from the NCHW host tensors;
/// NHWC results are read back through an NCHW view on the host, so the GPU's layout
/// changes are checked too. Device memory lives for one mode.
fn one_layer(gpu: &Gpu, reps: usize, layer: &Layer) -> Result<Vec<Row>> {
    let params = Conv2dParams {
        stride: [layer.stride; 2],
        padding: [layer.padding; 2],
        groups: layer.groups,
        ..Default::default()
    };
    let (_, y_shape) = host::conv2d_problem(&layer.x, &layer.w, &params)?;
    let y_shape: [usize; 4] = y_shape.try_into().expect("rank 4");
    let [batch, channels, _, _] = layer.x;
    let [out_channels, _, kh, kw] = layer.w;
    let [_, _, out_h, out_w] = y_shape;
    let flops =
        2.0 * (batch * out_channels * out_h * out_w) as f64 * (channels / layer.groups * kh * kw) as f64;

    let random = |shape: &[usize], seed| random_f32(shape, seed).into_dimensionality::<Ix4>();
    let (hx, hw, hdy) = (
        random(&layer.x, 10)?,
        random(&layer.w, 11)?,
        random(&y_shape, 12)?,
    );
    let hb = random_f32(&[out_channels], 13);
    let reference = ConvReference::new(hx.view(), hw.view(), hdy.view(), &params)?;
    let y_want = Samples::new(y_shape, SAMPLES, |at| reference.output(at) + hb[at[1]] as f64);
    let dx_want = Samples::new(layer.x, SAMPLES, |at| reference.input_grad(at));
    let dw_want = Samples::new(layer.w, SAMPLES, |at| reference.weight_grad(at));
    let db_want: Vec<f64> = (0..out_channels)
        .into_par_iter()
        .map(|o| reference.bias_grad(o))
        .collect();
    let wanted = Wanted {
        y: y_want,
        dx: dx_want,
        dw: dw_want,
        db: db_want,
        bias: hb.into_dimensionality()?,
    };
    let tensors = [&hx, &hw, &hdy];
    let mut rows = Vec::new();
    for (precision, layout, mode) in MODES {
        let p = Conv2dParams {
            precision,
            layout,
            ..params
        };
        let mode = Mode {
            params: p,
            name: mode,
            flops,
        };
        rows.extend(if mode.name.starts_with("bf16") {
            one_mode::<host::bf16>(gpu, reps, layer, &mode, tensors, &wanted)?
        } else {
            one_mode::<f32>(gpu, reps, layer, &mode, tensors, &wanted)?
        });
    }
    Ok(rows)
}

/// A mode of the suite: the parameters, the key's suffix, the flops of a forward pass.
struct Mode {
    params: Conv2dParams,
    name: &'static str,
    flops: f64,
}

/// One layer's rows in one mode, its tensors of `T` (from the NCHW host `[x, w, dy]`),
/// checked within the mode's tolerance: FP32's or TF32's, or for 16-bit the type's
/// epsilon (inputs and outputs rounded to it).
fn one_mode<T: BenchFloat + ConvElement>(
    gpu: &Gpu,
    reps: usize,
    layer: &Layer,
    mode: &Mode,
    [hx, hw, hdy]: [&Array4<f32>; 3],
    wanted: &Wanted,
) -> Result<[Row; 4]> {
    let (p, name) = (&mode.params, mode.name);
    let layout = p.layout;
    let (x, w, dy) = (
        upload::<T>(gpu, hx, layout)?,
        upload::<T>(gpu, hw, layout)?,
        upload::<T>(gpu, hdy, layout)?,
    );
    let b = gpu.upload(&wanted.bias.mapv(T::from_f32))?;
    let limit = if T::ROUNDING > 0.0 {
        T::ROUNDING
    } else {
        tolerance(p.precision)
    };
    let check = |pass: &str, errors: &[(&str, f64)]| -> Result {
        let list: Vec<String> = errors.iter().map(|(t, e)| format!("{t} {e:.2e}")).collect();
        eprintln!(
            "layer {} {name} {pass}: relative error {}",
            layer.name,
            list.join(", ")
        );
        match errors.iter().find(|(_, e)| e.is_nan() || *e > limit) {
            Some((tensor, e)) => Err(format!(
                "layer {} {name} {pass}: {tensor} relative error {e:e} over {limit:e}",
                layer.name
            )
            .into()),
            None => Ok(()),
        }
    };

    // y has dy's shape, in the mode's layout.
    let mut y = gpu.alloc::<T>(dy.shape())?;
    gpu.poison(&mut y)?;
    gpu.conv2d_into(&x, &w, Some(&b), p, &mut y)?;
    let got = download(gpu, &y)?;
    check("fwd", &[("y", wanted.y.error(as_nchw(&got, layout)?))])?;
    let forward = time(gpu, reps, |g| g.conv2d_into(&x, &w, Some(&b), p, &mut y))?;

    let (mut dx, mut dw) = (gpu.alloc::<T>(x.shape())?, gpu.alloc::<T>(w.shape())?);
    let mut db = gpu.alloc::<T>(b.shape())?;
    for g in [&mut dx, &mut dw, &mut db] {
        gpu.poison(g)?;
    }
    gpu.conv2d_backward_into(&x, &w, &dy, p, (Some(&mut dx), Some(&mut dw), Some(&mut db)))?;
    let (got_dx, got_dw, got_db) = (download(gpu, &dx)?, download(gpu, &dw)?, download(gpu, &db)?);
    let db_pairs: Vec<(f32, f64)> = got_db.iter().copied().zip(wanted.db.iter().copied()).collect();
    check(
        "bwd",
        &[
            ("dx", wanted.dx.error(as_nchw(&got_dx, layout)?)),
            ("dw", wanted.dw.error(as_nchw(&got_dw, layout)?)),
            ("db", sampled_error(&db_pairs)),
        ],
    )?;
    let backward = time(gpu, reps, |g| {
        g.conv2d_backward_into(&x, &w, &dy, p, (Some(&mut dx), Some(&mut dw), Some(&mut db)))
    })?;
    let input_part = time(gpu, reps, |g| {
        g.conv2d_backward_into(&x, &w, &dy, p, (Some(&mut dx), None, None))
    })?;
    let weight_part = time(gpu, reps, |g| {
        g.conv2d_backward_into(&x, &w, &dy, p, (None, Some(&mut dw), Some(&mut db)))
    })?;

    let operands = (x.bytes() + w.bytes()) as f64;
    let what = |pass| format!("{} {} {pass} {}", layer.name, layer.what, label(name));
    Ok([
        Row {
            key: key(layer.name, "fwd", name),
            what: what("fwd"),
            timing: forward,
            bytes: operands + (b.bytes() + y.bytes()) as f64,
            flops: mode.flops,
        },
        Row {
            key: key(layer.name, "bwd", name),
            what: what("bwd"),
            timing: backward,
            bytes: 2.0 * operands + (dy.bytes() + db.bytes()) as f64,
            flops: 2.0 * mode.flops,
        },
        Row {
            key: key(layer.name, BACKWARD_PARTS[0], name),
            what: what("bwd, input gradient"),
            timing: input_part,
            bytes: (w.bytes() + dy.bytes() + dx.bytes()) as f64,
            flops: mode.flops,
        },
        Row {
            key: key(layer.name, BACKWARD_PARTS[1], name),
            what: what("bwd, weight and bias gradients"),
            timing: weight_part,
            bytes: (x.bytes() + dy.bytes() + dw.bytes() + db.bytes()) as f64,
            flops: mode.flops,
        },
    ])
}

/// Ours and torch's median ms for a key, each where it was timed.
fn medians(rows: &[Row], torch_ms: &impl Fn(&str) -> Option<f64>, key: &str) -> (Option<f64>, Option<f64>) {
    (ours_ms(rows, key), torch_ms(key))
}

/// Our median ms for a key, where it was timed.
fn ours_ms(rows: &[Row], key: &str) -> Option<f64> {
    rows.iter().find(|r| r.key == key).map(Row::median_ms)
}

/// torch / ours over the layers for one pass and mode.
struct Summary {
    pass: &'static str,
    mode: &'static str,
    geomean: f64,
    lowest: f64,
    lowest_layer: &'static str,
}

/// Prints the layer table (per mode: ours, torch and torch / ours), then per pass and
/// mode the geometric mean and the lowest of torch / ours; returns those for the JSON.
pub(crate) fn report(rows: &[Row], torch_ms: impl Fn(&str) -> Option<f64>) -> Value {
    println!();
    let dims = |shape: [usize; 4]| shape.map(|d| d.to_string()).join("x");
    for l in &LAYERS {
        println!(
            "{} {}: x {}, w {}, stride {}, padding {}, groups {}",
            l.name,
            l.what,
            dims(l.x),
            dims(l.w),
            l.stride,
            l.padding,
            l.groups
        );
    }
    let header: String = MODES
        .iter()
        .map(|(.., mode)| format!(" {:>9} | {:>8} | {:>6} |", label(mode), "torch", "t / o"))
        .collect();
    println!("\n| {:<16} | {:<4} |{header}", "layer", "pass");
    println!(
        "|{:-<18}|{:-<6}|{}",
        "",
        "",
        "-----------|----------|--------|".repeat(MODES.len())
    );
    let show = |v: Option<f64>, unit: &str| v.map_or("-".into(), |v| format!("{v:.3}{unit}"));
    for layer in &LAYERS {
        for pass in PASSES {
            let cells: String = MODES
                .iter()
                .map(|(.., mode)| {
                    let (ours, torch) = medians(rows, &torch_ms, &key(layer.name, pass, mode));
                    let ratio = ours.zip(torch).map(|(o, t)| t / o);
                    format!(
                        " {:>9} | {:>8} | {:>6} |",
                        show(ours, ""),
                        show(torch, ""),
                        show(ratio, "x")
                    )
                })
                .collect();
            let name = format!("{} {}", layer.name, layer.what);
            println!("| {name:<16} | {pass:<4} |{cells}");
        }
    }

    if rows.iter().any(|r| r.key.contains(BACKWARD_PARTS[0])) {
        println!("\nbackward parts, ours alone (ms): input gradient / weight and bias gradients");
        for layer in &LAYERS {
            let cells: String = MODES
                .iter()
                .map(|(.., mode)| {
                    let [input, weight] =
                        BACKWARD_PARTS.map(|part| ours_ms(rows, &key(layer.name, part, mode)));
                    format!(
                        " {:>9}: {} / {} |",
                        label(mode),
                        show(input, ""),
                        show(weight, "")
                    )
                })
                .collect();
            println!("| {:<16} |{cells}", format!("{} {}", layer.name, layer.what));
        }
    }

    let mut summaries = Vec::new();
    for pass in PASSES {
        for (.., mode) in MODES {
            let ratios: Vec<(&str, f64)> = LAYERS
                .iter()
                .filter_map(|l| match medians(rows, &torch_ms, &key(l.name, pass, mode)) {
                    (Some(ours), Some(torch)) => Some((l.name, torch / ours)),
                    _ => None,
                })
                .collect();
            if let Some(&(lowest_layer, lowest)) = ratios.iter().min_by(|a, b| a.1.total_cmp(&b.1)) {
                let mean_log = ratios.iter().map(|(_, r)| r.ln()).sum::<f64>() / ratios.len() as f64;
                summaries.push(Summary {
                    pass,
                    mode,
                    geomean: mean_log.exp(),
                    lowest,
                    lowest_layer,
                });
            }
        }
    }
    if !summaries.is_empty() {
        println!("\ntorch / ours over the layers: geometric mean (lowest, its layer)");
    }
    for s in &summaries {
        println!(
            "  {} {:<9}: {:.3}x ({:.3}x, {})",
            s.pass,
            label(s.mode),
            s.geomean,
            s.lowest,
            s.lowest_layer
        );
    }
    summaries
        .iter()
        .map(|s| {
            json!({
                "pass": s.pass, "mode": s.mode, "geomean": s.geomean,
                "lowest": s.lowest, "lowest_layer": s.lowest_layer,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Timing;

    /// The summary over made-up timings: torch twice as slow as ours everywhere but in
    /// R4's TF32 NHWC forward pass, where it is four times as fast; the backward parts,
    /// far slower, count in no summary.
    #[test]
    fn summary_has_the_geomean_and_the_lowest_layer() {
        let row = |key, ms: Vec<f32>| Row {
            key,
            what: String::new(),
            timing: Timing {
                ms,
                window_s: [0.0; 2],
            },
            bytes: 0.0,
            flops: 0.0,
        };
        let keys = |passes: &'static [&'static str]| {
            LAYERS
                .iter()
                .flat_map(move |l| passes.iter().map(move |pass| (l, pass)))
                .flat_map(|(l, pass)| MODES.map(|(.., mode)| key(l.name, pass, mode)))
        };
        let rows: Vec<Row> = keys(&PASSES)
            .map(|key| row(key, vec![1.0, 3.0, 2.0]))
            .chain(keys(&BACKWARD_PARTS).map(|key| row(key, vec![100.0])))
            .collect();
        let torch_ms = |key: &str| Some(if key == "layer_R4_fwd_tf32_nhwc" { 0.5 } else { 4.0 });
        let summary = report(&rows, torch_ms);
        let summary = summary.as_array().unwrap();
        assert_eq!(summary.len(), PASSES.len() * MODES.len());
        for s in summary {
            if s["pass"] == "fwd" && s["mode"] == "tf32_nhwc" {
                assert_eq!(s["lowest_layer"], "R4");
                assert_eq!(s["lowest"], 0.25);
                let geomean = (2f64.powi(8) * 0.25).powf(1.0 / 9.0);
                assert!((s["geomean"].as_f64().unwrap() - geomean).abs() < 1e-12);
            } else {
                assert_eq!(s["geomean"], 2.0);
                assert_eq!(s["lowest"], 2.0);
            }
        }
        // Without a baseline: the table alone, no summary.
        assert_eq!(report(&rows, |_| None), json!([]));
    }
}
