//! Single elements of a convolution and of its three gradients as f64 sums straight
//! from the definition (stride, padding, dilation, groups, either layout), to check GPU
//! results at sampled elements: the whole references of `host::reference::conv` take
//! too long on the benchmark's shapes.

use host::{Conv2dParams, ConvLayout, ConvPrecision};
use ndarray::{ArrayD, ArrayView4, Axis, Ix4};
use rayon::prelude::*;

use crate::{Result, sample_indices, sampled_error};

/// The relative error allowed at the sampled elements: FP32 sums in another order, or
/// inputs rounded to TF32's 10-bit mantissa.
pub(crate) fn tolerance(precision: ConvPrecision) -> f64 {
    match precision {
        ConvPrecision::Fp32 => 1e-5,
        ConvPrecision::Tf32 => 5e-3,
    }
}

/// A tensor in `layout` viewed as NCHW (w as `[out, in / groups, kh, kw]`), without a copy.
pub(crate) fn nchw<A>(a: ArrayView4<'_, A>, layout: ConvLayout) -> ArrayView4<'_, A> {
    match layout {
        ConvLayout::Nchw => a,
        ConvLayout::Nhwc => a.permuted_axes([0, 3, 1, 2]),
    }
}

/// A downloaded tensor in `layout`, viewed as NCHW.
pub(crate) fn as_nchw(a: &ArrayD<f32>, layout: ConvLayout) -> Result<ArrayView4<'_, f32>> {
    Ok(nchw(a.view().into_dimensionality::<Ix4>()?, layout))
}

/// The operands of a convolution, viewed as NCHW, and its geometry.
pub(crate) struct ConvReference<'a> {
    x: ArrayView4<'a, f32>,
    w: ArrayView4<'a, f32>,
    /// The output gradient, for the backward pass.
    dy: ArrayView4<'a, f32>,
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    in_per_group: usize,
    out_per_group: usize,
}

impl<'a> ConvReference<'a> {
    /// x, w and the output gradient dy, each in `params.layout`, validated as the GPU
    /// operations validate them.
    pub(crate) fn new(
        x: ArrayView4<'a, f32>,
        w: ArrayView4<'a, f32>,
        dy: ArrayView4<'a, f32>,
        params: &Conv2dParams,
    ) -> Result<Self> {
        let (_, y_shape) = host::conv2d_problem(x.shape(), w.shape(), params)?;
        if dy.shape() != y_shape {
            return Err(format!("dy has shape {:?}, not the output's {y_shape:?}", dy.shape()).into());
        }
        let w = nchw(w, params.layout);
        Ok(Self {
            x: nchw(x, params.layout),
            dy: nchw(dy, params.layout),
            stride: params.stride,
            padding: params.padding,
            dilation: params.dilation,
            in_per_group: w.dim().1,
            out_per_group: w.dim().0 / params.groups,
            w,
        })
    }

    /// The kernel taps (r, s).
    fn taps(&self) -> impl Iterator<Item = (usize, usize)> {
        let (_, _, kh, kw) = self.w.dim();
        (0..kh).flat_map(move |r| (0..kw).map(move |s| (r, s)))
    }

    /// The row (`axis` 0) or column (1) of x that output `out` reads through tap `tap`,
    /// unless that falls in the padding.
    fn input_at(&self, axis: usize, out: usize, tap: usize) -> Option<usize> {
        (out * self.stride[axis] + tap * self.dilation[axis])
            .checked_sub(self.padding[axis])
            .filter(|&i| i < self.x.shape()[2 + axis])
    }

    /// The row or column of y that reads `input` through tap `tap`, if one does.
    fn output_at(&self, axis: usize, input: usize, tap: usize) -> Option<usize> {
        let offset = (input + self.padding[axis]).checked_sub(tap * self.dilation[axis])?;
        let out = offset / self.stride[axis];
        (offset % self.stride[axis] == 0 && out < self.dy.shape()[2 + axis]).then_some(out)
    }

    /// `y[n, o, i, j]` without the bias: over the input channels of o's group and the taps.
    pub(crate) fn output(&self, [n, o, i, j]: [usize; 4]) -> f64 {
        let first = o / self.out_per_group * self.in_per_group;
        let mut sum = 0.0;
        for c in 0..self.in_per_group {
            for (r, s) in self.taps() {
                if let (Some(iy), Some(ix)) = (self.input_at(0, i, r), self.input_at(1, j, s)) {
                    sum += self.x[[n, first + c, iy, ix]] as f64 * self.w[[o, c, r, s]] as f64;
                }
            }
        }
        sum
    }

    /// `dx[n, c, iy, ix]`: over the output channels of c's group and the taps through
    /// which an output reads x there.
    pub(crate) fn input_grad(&self, [n, c, iy, ix]: [usize; 4]) -> f64 {
        let (group, k) = (c / self.in_per_group, c % self.in_per_group);
        let mut sum = 0.0;
        for o in group * self.out_per_group..(group + 1) * self.out_per_group {
            for (r, s) in self.taps() {
                if let (Some(i), Some(j)) = (self.output_at(0, iy, r), self.output_at(1, ix, s)) {
                    sum += self.dy[[n, o, i, j]] as f64 * self.w[[o, k, r, s]] as f64;
                }
            }
        }
        sum
    }

    /// `dw[o, c, r, s]`: over the images and the outputs whose tap (r, s) reads x.
    pub(crate) fn weight_grad(&self, [o, c, r, s]: [usize; 4]) -> f64 {
        let channel = o / self.out_per_group * self.in_per_group + c;
        let (batch, _, out_h, out_w) = self.dy.dim();
        let mut sum = 0.0;
        for n in 0..batch {
            for i in 0..out_h {
                let Some(iy) = self.input_at(0, i, r) else {
                    continue;
                };
                for j in 0..out_w {
                    if let Some(ix) = self.input_at(1, j, s) {
                        sum += self.dy[[n, o, i, j]] as f64 * self.x[[n, channel, iy, ix]] as f64;
                    }
                }
            }
        }
        sum
    }

    /// `db[o]`: dy summed over the images and the outputs.
    pub(crate) fn bias_grad(&self, o: usize) -> f64 {
        self.dy.index_axis(Axis(1), o).iter().map(|&v| v as f64).sum()
    }
}

/// Wanted values at spread elements of a 4-D tensor, by NCHW coordinates: computed
/// once, then compared with every result of that tensor.
pub(crate) struct Samples {
    at: Vec<[usize; 4]>,
    want: Vec<f64>,
}

impl Samples {
    /// `count` elements of a tensor of NCHW `shape` (from [`sample_indices`], so with
    /// both ends), and `want` at each, in parallel.
    pub(crate) fn new(shape: [usize; 4], count: usize, want: impl Fn([usize; 4]) -> f64 + Sync) -> Self {
        let [_, c, h, w] = shape;
        let at: Vec<[usize; 4]> = sample_indices(shape.iter().product(), count)
            .into_iter()
            .map(|e| [e / (c * h * w), e / (h * w) % c, e / w % h, e % w])
            .collect();
        let want = at.par_iter().map(|&a| want(a)).collect();
        Self { at, want }
    }

    pub(crate) fn len(&self) -> usize {
        self.at.len()
    }

    /// The relative norm error ([`sampled_error`]) of `got`, viewed as NCHW.
    pub(crate) fn error(&self, got: ArrayView4<f32>) -> f64 {
        let pairs: Vec<(f32, f64)> = self
            .at
            .iter()
            .zip(&self.want)
            .map(|(&a, &w)| (got[a], w))
            .collect();
        sampled_error(&pairs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random_f32;
    use host::reference::conv as full;
    use ndarray::Array4;

    /// Every element against the whole f64 reference, on small awkward shapes in both
    /// layouts: stride, padding, dilation and groups each away from 1 or 0.
    #[test]
    fn matches_the_full_reference() {
        let cases = [
            // x, w (NCHW), stride, padding, dilation, groups
            ([2, 6, 9, 7], [4, 3, 3, 2], [2, 1], [1, 2], [1, 2], 2),
            ([1, 4, 8, 8], [4, 1, 3, 3], [1, 1], [1, 1], [1, 1], 4),
            ([3, 3, 11, 10], [5, 3, 5, 5], [2, 2], [2, 2], [1, 1], 1),
            ([2, 5, 6, 6], [3, 5, 1, 1], [2, 2], [0, 0], [1, 1], 1),
        ];
        for (x_shape, w_shape, stride, padding, dilation, groups) in cases {
            for layout in [ConvLayout::Nchw, ConvLayout::Nhwc] {
                let params = Conv2dParams {
                    stride,
                    padding,
                    dilation,
                    groups,
                    layout,
                    ..Default::default()
                };
                let in_layout = |shape: [usize; 4], seed| {
                    let a = random_f32(&shape, seed).into_dimensionality::<Ix4>().unwrap();
                    match layout {
                        ConvLayout::Nchw => a,
                        ConvLayout::Nhwc => a.permuted_axes([0, 2, 3, 1]),
                    }
                };
                let (x, w) = (in_layout(x_shape, 1), in_layout(w_shape, 2));
                let (_, y_shape) = host::conv2d_problem(x.shape(), w.shape(), &params).unwrap();
                let dy = random_f32(&y_shape, 3).into_dimensionality::<Ix4>().unwrap();
                let reference = ConvReference::new(x.view(), w.view(), dy.view(), &params).unwrap();
                let close = |got: f64, want: f64| (got - want).abs() <= 1e-12 * (1.0 + want.abs());
                let each = |want: Array4<f64>, element: &dyn Fn([usize; 4]) -> f64| {
                    for (at, &v) in nchw(want.view(), layout).indexed_iter() {
                        let at = [at.0, at.1, at.2, at.3];
                        assert!(close(element(at), v), "{params:?} at {at:?}");
                    }
                };
                each(full::conv2d(x.view(), w.view(), None, &params).unwrap(), &|at| {
                    reference.output(at)
                });
                each(
                    full::conv2d_grad_input(dy.view(), w.view(), x.shape(), &params).unwrap(),
                    &|at| reference.input_grad(at),
                );
                each(
                    full::conv2d_grad_weight(x.view(), dy.view(), w.shape(), &params).unwrap(),
                    &|at| reference.weight_grad(at),
                );
                for (o, &v) in full::conv2d_grad_bias(dy.view(), layout).iter().enumerate() {
                    assert!(close(reference.bias_grad(o), v), "{params:?} bias {o}");
                }
            }
        }
    }

    #[test]
    fn samples_index_nchw_and_see_a_wrong_element() {
        let shape = [2, 3, 4, 5];
        let a = random_f32(&shape, 4).into_dimensionality::<Ix4>().unwrap();
        let samples = Samples::new(shape, 50, |at| a[at] as f64);
        assert_eq!(samples.error(a.view()), 0.0);
        // The same values in NHWC, viewed back as NCHW.
        let last = a
            .view()
            .permuted_axes([0, 2, 3, 1])
            .as_standard_layout()
            .into_owned();
        assert_eq!(samples.error(nchw(last.view(), ConvLayout::Nhwc)), 0.0);
        // The last element is always sampled.
        let mut wrong = a.clone();
        wrong[[1, 2, 3, 4]] += 1.0;
        assert!(samples.error(wrong.view()) > 1e-3);
    }
}
