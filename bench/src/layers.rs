//! The convolution layer suite: ResNet-50, UNet and depthwise layers in FP32 and TF32,
//! NCHW and NHWC, forward (with a bias) and backward (all three gradients), each
//! checked at sampled elements against f64 sums, then timed; torch_baseline.py's
//! `layers` times cuDNN on the same table.

use host::{Conv2dParams, ConvLayout, ConvPrecision, DeviceArray, Gpu};
use ndarray::{Array4, Ix4};
use rayon::prelude::*;
use serde_json::{Value, json};

use crate::conv_reference::{ConvReference, Samples, as_nchw, tolerance};
use crate::{Result, Row, random_f32, sampled_error, time};

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

/// Precision x layout, with the key's suffix.
const MODES: [(ConvPrecision, ConvLayout, &str); 4] = [
    (ConvPrecision::Fp32, ConvLayout::Nchw, "fp32_nchw"),
    (ConvPrecision::Fp32, ConvLayout::Nhwc, "fp32_nhwc"),
    (ConvPrecision::Tf32, ConvLayout::Nchw, "tf32_nchw"),
    (ConvPrecision::Tf32, ConvLayout::Nhwc, "tf32_nhwc"),
];

const PASSES: [&str; 2] = ["fwd", "bwd"];

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

/// A host NCHW tensor on the GPU in `layout`.
fn upload(gpu: &Gpu, a: &Array4<f32>, layout: ConvLayout) -> Result<DeviceArray<f32>> {
    let a = gpu.upload(a)?;
    Ok(match layout {
        ConvLayout::Nchw => a,
        ConvLayout::Nhwc => gpu.to_channels_last(&a)?,
    })
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
    let b = gpu.upload(&hb)?;

    let mut rows = Vec::new();
    for (precision, layout, mode) in MODES {
        let p = Conv2dParams {
            precision,
            layout,
            ..params
        };
        let (x, w, dy) = (
            upload(gpu, &hx, layout)?,
            upload(gpu, &hw, layout)?,
            upload(gpu, &hdy, layout)?,
        );
        let limit = tolerance(precision);
        let check = |pass: &str, errors: &[(&str, f64)]| -> Result {
            let list: Vec<String> = errors.iter().map(|(t, e)| format!("{t} {e:.2e}")).collect();
            eprintln!(
                "layer {} {mode} {pass}: relative error {}",
                layer.name,
                list.join(", ")
            );
            match errors.iter().find(|(_, e)| e.is_nan() || *e > limit) {
                Some((tensor, e)) => Err(format!(
                    "layer {} {mode} {pass}: {tensor} relative error {e:e} over {limit:e}",
                    layer.name
                )
                .into()),
                None => Ok(()),
            }
        };

        // y has dy's shape, in the mode's layout.
        let mut y = gpu.alloc::<f32>(dy.shape())?;
        gpu.poison(&mut y)?;
        gpu.conv2d_into(&x, &w, Some(&b), &p, &mut y)?;
        let got = gpu.download(&y)?;
        check("fwd", &[("y", y_want.error(as_nchw(&got, layout)?))])?;
        let forward = time(gpu, reps, |g| g.conv2d_into(&x, &w, Some(&b), &p, &mut y))?;

        let (mut dx, mut dw) = (gpu.alloc::<f32>(x.shape())?, gpu.alloc::<f32>(w.shape())?);
        let mut db = gpu.alloc::<f32>(&[out_channels])?;
        for g in [&mut dx, &mut dw, &mut db] {
            gpu.poison(g)?;
        }
        gpu.conv2d_backward_into(&x, &w, &dy, &p, (Some(&mut dx), Some(&mut dw), Some(&mut db)))?;
        let (got_dx, got_dw, got_db) = (gpu.download(&dx)?, gpu.download(&dw)?, gpu.download(&db)?);
        let db_pairs: Vec<(f32, f64)> = got_db.iter().copied().zip(db_want.iter().copied()).collect();
        check(
            "bwd",
            &[
                ("dx", dx_want.error(as_nchw(&got_dx, layout)?)),
                ("dw", dw_want.error(as_nchw(&got_dw, layout)?)),
                ("db", sampled_error(&db_pairs)),
            ],
        )?;
        let backward = time(gpu, reps, |g| {
            g.conv2d_backward_into(&x, &w, &dy, &p, (Some(&mut dx), Some(&mut dw), Some(&mut db)))
        })?;

        let operands = (x.bytes() + w.bytes()) as f64;
        let what = |pass| format!("{} {} {pass} {}", layer.name, layer.what, label(mode));
        rows.push(Row {
            key: key(layer.name, "fwd", mode),
            what: what("fwd"),
            times_ms: forward,
            bytes: operands + (b.bytes() + y.bytes()) as f64,
            flops,
        });
        rows.push(Row {
            key: key(layer.name, "bwd", mode),
            what: what("bwd"),
            times_ms: backward,
            bytes: 2.0 * operands + (dy.bytes() + db.bytes()) as f64,
            flops: 2.0 * flops,
        });
    }
    Ok(rows)
}

/// Ours and torch's median ms for a key, each where it was timed.
fn medians(rows: &[Row], torch_ms: &impl Fn(&str) -> Option<f64>, key: &str) -> (Option<f64>, Option<f64>) {
    (
        rows.iter().find(|r| r.key == key).map(Row::median_ms),
        torch_ms(key),
    )
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

    /// The summary over made-up timings: torch twice as slow as ours everywhere but in
    /// R4's TF32 NHWC forward pass, where it is four times as fast.
    #[test]
    fn summary_has_the_geomean_and_the_lowest_layer() {
        let rows: Vec<Row> = LAYERS
            .iter()
            .flat_map(|l| PASSES.map(|pass| (l, pass)))
            .flat_map(|(l, pass)| MODES.map(|(.., mode)| key(l.name, pass, mode)))
            .map(|key| Row {
                key,
                what: String::new(),
                times_ms: vec![1.0, 3.0, 2.0],
                bytes: 0.0,
                flops: 0.0,
            })
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
