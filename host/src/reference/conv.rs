//! Convolution and its three gradients on the CPU, in f64, straight from the
//! definition `y[n, o, i, j] = b[o] + sum over c, r, s of x[n, g*C + c, i*sh - ph + r*dh,
//! j*sw - pw + s*dw] * w[o, c, r, s]` (zero outside x), parallel over output planes.
//! Tensors in NHWC (`params.layout`) are read and written through permuted views of
//! the same definition; the precision asked is ignored: these are the exact results,
//! through the activation (and plus the residual) the forward pass fuses.

use ndarray::{Array1, Array4, ArrayView1, ArrayView4, Axis};
use rayon::prelude::*;

use crate::conv::{Activation, Conv2dParams, ConvLayout, conv2d_problem};
use crate::error::{Error, Result};

/// The geometry shared by the four functions: the validated problem, whose output size
/// the kernels use too, in `usize`.
#[derive(Clone, Copy)]
struct Geometry {
    in_per_group: usize,
    out_per_group: usize,
    kernel: [usize; 2],
    input: [usize; 2],
    output: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
}

impl Geometry {
    fn new(x_shape: &[usize], w_shape: &[usize], params: &Conv2dParams) -> Result<(Self, Vec<usize>)> {
        let (p, y_shape) = conv2d_problem(x_shape, w_shape, params)?;
        let pair = |a: u32, b: u32| [a as usize, b as usize];
        Ok((
            Self {
                in_per_group: p.in_per_group() as usize,
                out_per_group: p.out_per_group() as usize,
                kernel: pair(p.kernel_h, p.kernel_w),
                input: pair(p.height, p.width),
                output: pair(p.out_h, p.out_w),
                stride: pair(p.stride_h, p.stride_w),
                padding: pair(p.pad_h, p.pad_w),
                dilation: pair(p.dilation_h, p.dilation_w),
            },
            y_shape,
        ))
    }

    /// Calls `f(out_y, out_x, in_y, in_x)` for every output pixel whose window puts tap
    /// (r, s) inside the input.
    fn for_each_pair(&self, r: usize, s: usize, mut f: impl FnMut(usize, usize, usize, usize)) {
        let input = |axis: usize, out: usize, tap: usize| {
            (out * self.stride[axis] + tap * self.dilation[axis]).wrapping_sub(self.padding[axis])
        };
        for oy in 0..self.output[0] {
            let iy = input(0, oy, r);
            if iy >= self.input[0] {
                continue;
            }
            for ox in 0..self.output[1] {
                let ix = input(1, ox, s);
                if ix < self.input[1] {
                    f(oy, ox, iy, ix);
                }
            }
        }
    }
}

/// `conv2d(x, w) + bias` in f64.
fn conv2d_nchw(
    x: ArrayView4<f32>,
    w: ArrayView4<f32>,
    bias: Option<ArrayView1<f32>>,
    params: &Conv2dParams,
) -> Result<Array4<f64>> {
    let (g, y_shape) = Geometry::new(x.shape(), w.shape(), params)?;
    let mut y = Array4::<f64>::zeros([y_shape[0], y_shape[1], y_shape[2], y_shape[3]]);
    y.axis_iter_mut(Axis(0))
        .into_par_iter()
        .enumerate()
        .for_each(|(n, mut image)| {
            for (o, mut plane) in image.axis_iter_mut(Axis(0)).enumerate() {
                plane.fill(bias.map_or(0.0, |b| b[o] as f64));
                let first = o / g.out_per_group * g.in_per_group;
                for c in 0..g.in_per_group {
                    for r in 0..g.kernel[0] {
                        for s in 0..g.kernel[1] {
                            let weight = w[[o, c, r, s]] as f64;
                            g.for_each_pair(r, s, |oy, ox, iy, ix| {
                                plane[[oy, ox]] += weight * x[[n, first + c, iy, ix]] as f64;
                            });
                        }
                    }
                }
            }
        });
    Ok(y)
}

/// The gradient of `conv2d(x, w)` with respect to x, for x of shape `x_shape`.
fn conv2d_grad_input_nchw(
    grad_y: ArrayView4<f32>,
    w: ArrayView4<f32>,
    x_shape: &[usize],
    params: &Conv2dParams,
) -> Result<Array4<f64>> {
    let (g, _) = Geometry::new(x_shape, w.shape(), params)?;
    let mut dx = Array4::<f64>::zeros([x_shape[0], x_shape[1], x_shape[2], x_shape[3]]);
    dx.axis_iter_mut(Axis(0))
        .into_par_iter()
        .enumerate()
        .for_each(|(n, mut image)| {
            for (channel, mut plane) in image.axis_iter_mut(Axis(0)).enumerate() {
                let (group, c) = (channel / g.in_per_group, channel % g.in_per_group);
                for o in group * g.out_per_group..(group + 1) * g.out_per_group {
                    for r in 0..g.kernel[0] {
                        for s in 0..g.kernel[1] {
                            let weight = w[[o, c, r, s]] as f64;
                            g.for_each_pair(r, s, |oy, ox, iy, ix| {
                                plane[[iy, ix]] += weight * grad_y[[n, o, oy, ox]] as f64;
                            });
                        }
                    }
                }
            }
        });
    Ok(dx)
}

/// The gradient of `conv2d(x, w)` with respect to w, for w of shape `w_shape`.
fn conv2d_grad_weight_nchw(
    x: ArrayView4<f32>,
    grad_y: ArrayView4<f32>,
    w_shape: &[usize],
    params: &Conv2dParams,
) -> Result<Array4<f64>> {
    let (g, _) = Geometry::new(x.shape(), w_shape, params)?;
    let mut dw = Array4::<f64>::zeros([w_shape[0], w_shape[1], w_shape[2], w_shape[3]]);
    dw.axis_iter_mut(Axis(0))
        .into_par_iter()
        .enumerate()
        .for_each(|(o, mut filter)| {
            let first = o / g.out_per_group * g.in_per_group;
            for n in 0..x.shape()[0] {
                for c in 0..g.in_per_group {
                    for r in 0..g.kernel[0] {
                        for s in 0..g.kernel[1] {
                            let mut sum = 0.0;
                            g.for_each_pair(r, s, |oy, ox, iy, ix| {
                                sum += grad_y[[n, o, oy, ox]] as f64 * x[[n, first + c, iy, ix]] as f64;
                            });
                            filter[[c, r, s]] += sum;
                        }
                    }
                }
            }
        });
    Ok(dw)
}

/// `conv2d(x, w) + bias` in f64, in `params.layout`.
pub fn conv2d(
    x: ArrayView4<f32>,
    w: ArrayView4<f32>,
    bias: Option<ArrayView1<f32>>,
    params: &Conv2dParams,
) -> Result<Array4<f64>> {
    conv2d_residual(x, w, bias, None, params)
}

/// `params.activation(conv2d(x, w) + bias) + residual`, the residual in y's shape and
/// layout.
pub fn conv2d_residual(
    x: ArrayView4<f32>,
    w: ArrayView4<f32>,
    bias: Option<ArrayView1<f32>>,
    residual: Option<ArrayView4<f32>>,
    params: &Conv2dParams,
) -> Result<Array4<f64>> {
    let nchw = channels_first_params(params);
    let mut y = to_layout(
        conv2d_nchw(to_nchw(x, params), to_nchw(w, params), bias, &nchw)?,
        params,
    );
    y.mapv_inplace(|v| activate(params.activation, v));
    if let Some(r) = residual {
        if r.shape() != y.shape() {
            return Err(Error::ShapeMismatch {
                what: "the residual (against conv2d(x, w))",
                expected: y.shape().to_vec(),
                actual: r.shape().to_vec(),
            });
        }
        y.zip_mut_with(&r, |y, &r| *y += r as f64);
    }
    Ok(y)
}

/// `activation(v)`, exactly (in f64).
pub fn activate(activation: Activation, v: f64) -> f64 {
    match activation {
        Activation::Identity => v,
        Activation::Relu => {
            if v < 0.0 {
                0.0
            } else {
                v
            }
        }
        Activation::Silu => v / (1.0 + (-v).exp()),
        Activation::GeluTanh => {
            let z = (2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v);
            0.5 * v * (1.0 + z.tanh())
        }
    }
}

/// The gradient of `conv2d(x, w)` with respect to x, for x of shape `x_shape`, in
/// `params.layout`.
pub fn conv2d_grad_input(
    grad_y: ArrayView4<f32>,
    w: ArrayView4<f32>,
    x_shape: &[usize],
    params: &Conv2dParams,
) -> Result<Array4<f64>> {
    let nchw = channels_first_params(params);
    let x_shape = shape_in_nchw(x_shape, params);
    Ok(to_layout(
        conv2d_grad_input_nchw(to_nchw(grad_y, params), to_nchw(w, params), &x_shape, &nchw)?,
        params,
    ))
}

/// The gradient of `conv2d(x, w)` with respect to w, for w of shape `w_shape`, in
/// `params.layout`.
pub fn conv2d_grad_weight(
    x: ArrayView4<f32>,
    grad_y: ArrayView4<f32>,
    w_shape: &[usize],
    params: &Conv2dParams,
) -> Result<Array4<f64>> {
    let nchw = channels_first_params(params);
    let w_shape = shape_in_nchw(w_shape, params);
    Ok(to_layout(
        conv2d_grad_weight_nchw(to_nchw(x, params), to_nchw(grad_y, params), &w_shape, &nchw)?,
        params,
    ))
}

/// The gradient of `conv2d(x, w) + bias` with respect to the bias, for `grad_y` in
/// `layout`.
pub fn conv2d_grad_bias(grad_y: ArrayView4<f32>, layout: ConvLayout) -> Array1<f64> {
    let channel_axis = if layout == ConvLayout::Nchw { 1 } else { 3 };
    let channels: Vec<f64> = (0..grad_y.shape()[channel_axis])
        .into_par_iter()
        .map(|o| {
            grad_y
                .index_axis(Axis(channel_axis), o)
                .iter()
                .map(|&v| v as f64)
                .sum()
        })
        .collect();
    Array1::from(channels)
}

/// The parameters as they read NCHW tensors.
fn channels_first_params(params: &Conv2dParams) -> Conv2dParams {
    Conv2dParams {
        layout: ConvLayout::Nchw,
        ..*params
    }
}

/// A tensor in `params.layout` viewed as NCHW (no copy).
fn to_nchw<'a>(a: ArrayView4<'a, f32>, params: &Conv2dParams) -> ArrayView4<'a, f32> {
    match params.layout {
        ConvLayout::Nchw => a,
        ConvLayout::Nhwc => a.permuted_axes([0, 3, 1, 2]),
    }
}

/// A shape in `params.layout` as NCHW.
fn shape_in_nchw(shape: &[usize], params: &Conv2dParams) -> Vec<usize> {
    match (params.layout, shape) {
        (ConvLayout::Nhwc, &[n, h, w, c]) => vec![n, c, h, w],
        _ => shape.to_vec(),
    }
}

/// An NCHW result in `params.layout`, row-major.
fn to_layout(a: Array4<f64>, params: &Conv2dParams) -> Array4<f64> {
    match params.layout {
        ConvLayout::Nchw => a,
        ConvLayout::Nhwc => a.permuted_axes([0, 2, 3, 1]).as_standard_layout().into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array, array};

    #[test]
    fn a_small_case_by_hand() {
        // x 1x1x3x3 = 1..9, w 1x1x2x2 = [[1, 0], [0, -1]], stride 1, padding 0.
        let x = Array::from_shape_vec((1, 1, 3, 3), (1..=9).map(|v| v as f32).collect()).unwrap();
        let w = Array::from_shape_vec((1, 1, 2, 2), vec![1.0f32, 0.0, 0.0, -1.0]).unwrap();
        let b = array![0.5f32];
        let y = conv2d(x.view(), w.view(), Some(b.view()), &Conv2dParams::default()).unwrap();
        assert_eq!(y.into_raw_vec_and_offset().0, vec![-3.5, -3.5, -3.5, -3.5]);

        let dy = Array::from_shape_vec((1, 1, 2, 2), vec![1.0f32, 2.0, 3.0, 4.0]).unwrap();
        let dx = conv2d_grad_input(dy.view(), w.view(), &[1, 1, 3, 3], &Conv2dParams::default()).unwrap();
        assert_eq!(
            dx.into_raw_vec_and_offset().0,
            vec![1.0, 2.0, 0.0, 3.0, 3.0, -2.0, 0.0, -3.0, -4.0]
        );
        let dw = conv2d_grad_weight(x.view(), dy.view(), &[1, 1, 2, 2], &Conv2dParams::default()).unwrap();
        // dw[r][s] = sum dy[i][j] * x[i + r][j + s]
        assert_eq!(dw.into_raw_vec_and_offset().0, vec![37.0, 47.0, 67.0, 77.0]);
        assert_eq!(conv2d_grad_bias(dy.view(), ConvLayout::Nchw), array![10.0]);
    }

    #[test]
    fn channels_last_is_the_same_convolution_permuted() {
        let x = Array::from_shape_fn((2, 3, 5, 4), |(n, c, i, j)| (n * 60 + c * 20 + i * 4 + j) as f32);
        let w = Array::from_shape_fn((4, 3, 2, 3), |(o, c, r, s)| {
            (o as f32 - c as f32) * 0.5 + (r * 3 + s) as f32
        });
        let nchw = Conv2dParams {
            padding: [1, 0],
            ..Conv2dParams::default()
        };
        let nhwc = Conv2dParams {
            layout: ConvLayout::Nhwc,
            ..nchw
        };
        let to_nhwc = |a: &Array4<f32>| {
            a.view()
                .permuted_axes([0, 2, 3, 1])
                .as_standard_layout()
                .into_owned()
        };
        let y = conv2d(x.view(), w.view(), None, &nchw).unwrap();
        let y_last = conv2d(to_nhwc(&x).view(), to_nhwc(&w).view(), None, &nhwc).unwrap();
        assert_eq!(y_last, y.view().permuted_axes([0, 2, 3, 1]));
        let dy = y.mapv(|v| v as f32);
        let dx = conv2d_grad_input(dy.view(), w.view(), x.shape(), &nchw).unwrap();
        let dx_last =
            conv2d_grad_input(to_nhwc(&dy).view(), to_nhwc(&w).view(), &[2, 5, 4, 3], &nhwc).unwrap();
        assert_eq!(dx_last, dx.view().permuted_axes([0, 2, 3, 1]));
        let dw = conv2d_grad_weight(x.view(), dy.view(), w.shape(), &nchw).unwrap();
        let dw_last =
            conv2d_grad_weight(to_nhwc(&x).view(), to_nhwc(&dy).view(), &[4, 2, 3, 3], &nhwc).unwrap();
        assert_eq!(dw_last, dw.view().permuted_axes([0, 2, 3, 1]));
        assert_eq!(
            conv2d_grad_bias(to_nhwc(&dy).view(), ConvLayout::Nhwc),
            conv2d_grad_bias(dy.view(), ConvLayout::Nchw)
        );
    }

    #[test]
    fn stride_padding_dilation_and_groups_follow_the_definition() {
        // Two groups, stride 2, padding 1, dilation 2 on a 1x2x5x5 input of ones, with
        // 2x2 weights of ones: each output counts the taps that land inside x.
        let params = Conv2dParams {
            stride: [2, 2],
            padding: [1, 1],
            dilation: [2, 2],
            groups: 2,
            ..Conv2dParams::default()
        };
        let x = Array4::<f32>::ones((1, 2, 5, 5));
        let w = Array4::<f32>::ones((4, 1, 2, 2));
        let y = conv2d(x.view(), w.view(), None, &params).unwrap();
        // out = (5 + 2 - 2 - 1) / 2 + 1 = 3; output o's taps sit at rows 2o - 1 and
        // 2o + 1, both inside x only for o = 1.
        assert_eq!(y.shape(), &[1, 4, 3, 3]);
        let inside = |o: usize| if o == 1 { 2.0 } else { 1.0 };
        for o in 0..3 {
            for p in 0..3 {
                assert_eq!(y[[0, 3, o, p]], inside(o) * inside(p));
            }
        }
    }
}
