//! The strided input gradient as one forward pass whose output channels are the phases
//! (a sub-pixel convolution). At stride (sh, sw) the input positions `(sh i + qh, sw j +
//! qw)` of phase (qh, qw) take dy only through the window's taps congruent to `(qh +
//! ph, qw + pw)` modulo the stride ([`axis_taps`]): along an axis, position `s i + q`
//! takes dy at `i + offset - t` by tap `first + s t`. Every phase reads dy within one
//! window of `taps` positions from `i + lo` ([`SubPixelAxis`]), so each is a stride-1
//! convolution of dy by that window (zeros where the phase has no tap), and all of
//! them one convolution whose output channels are (phase, channel of x): `sh sw` times
//! x's channels per group, its weights gathered from w
//! ([`SubPixelPhases::filter_source`]). Its epilogue stores every output at its phase's
//! pixel of dx ([`PhaseShuffle`]).
//!
//! Against the forward pass over dy upsampled by the stride, whose products over the
//! inserted zeros cost the stride's square, it multiplies `taps_h taps_w sh sw` per
//! channel pair and pixel of dx where the upsampled pass multiplies `kh kw`: 3x3 at
//! stride 2 takes 2x2 windows, 16 products where the upsampled pass takes 36, and no
//! upsampling, no interleaving. The window's padding is the forward problem's,
//! symmetric: outputs before the phases' first position (`skip`) and past their last
//! are computed and dropped (R6: 29 x 29 outputs for 28 x 28 positions).

use super::phases::axis_taps;
use super::tensor_core::{TensorCoreArgs, TensorCoreOperand, TensorCorePlan, WGMMA_THREADS, WgmmaSchedule};
use super::{ConvLayout, ConvProblem, ConvShape, FastDiv};
use crate::launch::{DeviceLimits, DevicePtr, DevicePtrMut, Launch, LaunchGeometry, kernel_args};
use crate::tensor_map::TensorMapPair;

/// Threads per block of the filter gathering.
pub const SUB_PIXEL_FILTER_THREADS: u32 = 256;

/// The phases' common window along one axis of stride `stride`: `taps` positions of dy,
/// the forward problem's padding, and its outputs before the phases' first position.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubPixelAxis {
    pub stride: u32,
    pub taps: u32,
    pub padding: u32,
    pub skip: u32,
}

impl SubPixelAxis {
    /// The window of an axis of `input` positions and `output` outputs, by `kernel`
    /// undilated taps at `stride` with `pad`; `None` where a phase with positions has no
    /// tap.
    pub const fn new(input: u32, output: u32, kernel: u32, stride: u32, pad: u32) -> Option<Self> {
        // Phase 0 has the most positions.
        let positions = input.div_ceil(stride) as i64;
        let (mut lo, mut hi) = (i64::MAX, i64::MIN);
        let mut q = 0;
        while q < stride && q < input {
            let (_, taps, offset) = axis_taps(q, kernel, stride, pad);
            if taps == 0 {
                return None;
            }
            // Phase q's taps read dy from i + offset - (taps - 1) to i + offset.
            let (first, last) = (offset as i64 - taps as i64 + 1, offset as i64);
            lo = if first < lo { first } else { lo };
            hi = if last > hi { last } else { hi };
            q += 1;
        }
        let taps = hi - lo + 1;
        // Output u reads dy from u - padding: u = i + lo + padding. The padding makes
        // u >= 0 at i = 0, and the last position's output one of the problem's
        // (output + 2 padding - taps + 1 of them).
        let (least, fit) = (-lo, positions + taps - 1 + lo - output as i64);
        let padding = if least > fit { least } else { fit };
        let padding = if padding > 0 { padding } else { 0 };
        Some(Self {
            stride,
            taps: taps as u32,
            padding: padding as u32,
            skip: (lo + padding) as u32,
        })
    }

    /// The tap of w along the axis (`kernel` taps, `pad`) that phase `q` multiplies
    /// at window position `a`, `None` where the phase has none there.
    pub const fn tap(&self, q: u32, a: u32, kernel: u32, pad: u32) -> Option<u32> {
        let (first, taps, offset) = axis_taps(q, kernel, self.stride, pad);
        // Position a reads dy at i + lo + a = i + offset - t.
        let lo = self.skip as i64 - self.padding as i64;
        let t = offset as i64 - lo - a as i64;
        if t < 0 || t >= taps as i64 {
            None
        } else {
            Some(first + self.stride * t as u32)
        }
    }
}

/// Where the sub-pixel pass's outputs lie in dx (NHWC, fewer than 2^31 elements):
/// output pixel (n, u, v) holds phase (qh, qw)'s dx at (n, sh (u - skip_h) + qh, sw (v -
/// skip_w) + qw), output channel `g sh sw cg + (qh sw + qw) cg + c` (cg x's channels per
/// group) its channel `g cg + c`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PhaseShuffle {
    pub stride_h: u32,
    pub stride_w: u32,
    pub skip_h: u32,
    pub skip_w: u32,
    /// dx's extent and channels, and its channels per group.
    pub height: u32,
    pub width: u32,
    pub channels: u32,
    pub in_group: u32,
    pub div_in_group: FastDiv,
    pub div_stride_w: FastDiv,
}

/// An output pixel's phases in dx: the element of phase (0, 0)'s pixel (channel 0),
/// and how many phases along each axis lie inside dx.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShuffledPixel {
    pub at: u32,
    pub rows: u32,
    pub columns: u32,
}

/// An output channel's phase, and its element's offset from phase (0, 0)'s pixel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShuffledChannel {
    pub row: u32,
    pub column: u32,
    pub offset: u32,
}

impl ShuffledPixel {
    /// Where `channel` of this pixel lies in dx, `None` past its edge.
    #[inline(always)]
    pub const fn place(&self, channel: ShuffledChannel) -> Option<u32> {
        if channel.row < self.rows && channel.column < self.columns {
            Some(self.at + channel.offset)
        } else {
            None
        }
    }
}

impl PhaseShuffle {
    /// Where output pixel `m` of the sub-pixel problem `p` lies in dx; `None` where
    /// none of its phases does.
    #[inline(always)]
    pub const fn pixel(&self, p: &ConvProblem, m: u32) -> Option<ShuffledPixel> {
        let (image, pixel) = p.div_out_pixels.divmod(m);
        let (u, v) = p.div_out_w.divmod(pixel);
        if u < self.skip_h || v < self.skip_w {
            return None;
        }
        let (y, x) = (
            self.stride_h * (u - self.skip_h),
            self.stride_w * (v - self.skip_w),
        );
        if y >= self.height || x >= self.width {
            return None;
        }
        // Within dx: fewer than 2^31 elements.
        let at = ((image * self.height + y) * self.width + x) * self.channels;
        Some(ShuffledPixel {
            at,
            rows: self.height - y,
            columns: self.width - x,
        })
    }

    /// Output channel `c` of `group`: its phase and offset.
    #[inline(always)]
    pub const fn channel(&self, group: u32, c: u32) -> ShuffledChannel {
        let (phase, channel) = self.div_in_group.divmod(c);
        let (row, column) = self.div_stride_w.divmod(phase);
        ShuffledChannel {
            row,
            column,
            offset: (row * self.width + column) * self.channels + group * self.in_group + channel,
        }
    }
}

/// The phases' one forward problem of an undilated problem (see the module's docs):
/// the problem, its window along each axis, where its outputs lie in dx.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubPixelPhases {
    /// dy by the gathered weights, `sh sw` times x's channels out.
    pub problem: ConvProblem,
    pub rows: SubPixelAxis,
    pub columns: SubPixelAxis,
    pub shuffle: PhaseShuffle,
}

impl SubPixelPhases {
    /// The phases of `problem` (undilated, dx fewer than 2^31 elements), `None` where a
    /// phase has no taps or their problem is not valid.
    pub const fn new(problem: &ConvProblem) -> Option<Self> {
        let p = problem;
        if p.dilation_h != 1 || p.dilation_w != 1 || p.input_count() >= 1 << 31 {
            return None;
        }
        let (Some(rows), Some(columns)) = (
            SubPixelAxis::new(p.height, p.out_h, p.kernel_h, p.stride_h, p.pad_h),
            SubPixelAxis::new(p.width, p.out_w, p.kernel_w, p.stride_w, p.pad_w),
        ) else {
            return None;
        };
        let shape = ConvShape {
            input: [p.batch, p.out_channels, p.out_h, p.out_w],
            weight: [
                p.stride_h * p.stride_w * p.in_channels,
                p.out_per_group(),
                rows.taps,
                columns.taps,
            ],
            stride: [1, 1],
            padding: [rows.padding, columns.padding],
            dilation: [1, 1],
            groups: p.groups,
        };
        let Ok(union) = ConvProblem::new(&shape) else {
            return None;
        };
        Some(Self {
            problem: union,
            rows,
            columns,
            shuffle: PhaseShuffle {
                stride_h: p.stride_h,
                stride_w: p.stride_w,
                skip_h: rows.skip,
                skip_w: columns.skip,
                height: p.height,
                width: p.width,
                channels: p.in_channels,
                in_group: p.in_per_group(),
                div_in_group: FastDiv::new(p.in_per_group()),
                div_stride_w: FastDiv::new(p.stride_w),
            },
        })
    }

    /// The element of `problem`'s NHWC weights (`[out][kh][kw][in / groups]`) that
    /// element `j` of the phases' weights (NHWC, `[g sh sw cg + q cg + c][a][b][co]`)
    /// takes, `None` where it is zero: phase q's tap at window position (a, b), of dy's
    /// channel co and x's channel c of group g.
    pub const fn filter_source(&self, problem: &ConvProblem, j: u64) -> Option<u64> {
        let (p, union) = (problem, &self.problem);
        let out_group = p.out_per_group() as u64;
        let (taps_h, taps_w) = (self.rows.taps as u64, self.columns.taps as u64);
        let co = j % out_group;
        let b = (j / out_group % taps_w) as u32;
        let a = (j / (out_group * taps_w) % taps_h) as u32;
        let output = j / (out_group * taps_w * taps_h);
        let (group, within) = (
            output / union.out_per_group() as u64,
            output % union.out_per_group() as u64,
        );
        let in_group = p.in_per_group() as u64;
        let (phase, c) = ((within / in_group) as u32, within % in_group);
        let (qh, qw) = (phase / p.stride_w, phase % p.stride_w);
        let (Some(r), Some(s)) = (
            self.rows.tap(qh, a, p.kernel_h, p.pad_h),
            self.columns.tap(qw, b, p.kernel_w, p.pad_w),
        ) else {
            return None;
        };
        let o = group * out_group + co;
        Some(((o * p.kernel_h as u64 + r as u64) * p.kernel_w as u64 + s as u64) * in_group + c)
    }
}

/// The input gradient of a strided problem as its phases' one forward pass on `wgmma`,
/// over NHWC tensors of the forward plan's operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubPixelPlan {
    pub phases: SubPixelPhases,
    /// The phases' forward plan: im2col boxes, K whole, tiles of `TC_BN` channels.
    pub forward: TensorCorePlan,
}

impl SubPixelPlan {
    /// The plan of `problem`'s input gradient over tensors in `layout` of `operand`:
    /// NHWC, strided, x's channels per group even, with [`SubPixelPhases`] that
    /// multiply fewer products than the forward pass over dy upsampled, which
    /// [`TensorCorePlan::im2col`] (for 16-bit operands [`TensorCorePlan::of_operand`]
    /// of it) takes; `None` otherwise.
    pub const fn of(
        problem: &ConvProblem,
        layout: ConvLayout,
        operand: TensorCoreOperand,
        device: &DeviceLimits,
    ) -> Option<Self> {
        let p = problem;
        let strided = p.stride_h > 1 || p.stride_w > 1;
        // The epilogue stores pairs of channels of x, which even groups keep together.
        if !strided || !matches!(layout, ConvLayout::Nhwc) || !p.in_per_group().is_multiple_of(2) {
            return None;
        }
        let Some(phases) = SubPixelPhases::new(p) else {
            return None;
        };
        let union = &phases.problem;
        // Products per channel of dy: the phases' outputs by their window, against dx's
        // elements by the whole window (the upsampled pass).
        let products = union.output_count() * union.taps() as u64;
        if products >= p.input_count() * p.taps() as u64 {
            return None;
        }
        let forward = match TensorCorePlan::im2col(union, device) {
            Some(tf32) if matches!(operand, TensorCoreOperand::Tf32) => tf32,
            Some(tf32) => match tf32.of_operand(union, operand, ConvLayout::Nhwc) {
                Some(plan) => plan,
                None => return None,
            },
            None => return None,
        };
        Some(Self { phases, forward })
    }

    /// The launch gathering the phases' weights from `w` into `filters` (f32 rounded to
    /// TF32, 16-bit bits as they are).
    pub const fn filters<T: SubPixelFilterKernel>(
        &self,
        problem: &ConvProblem,
        w: DevicePtr<T>,
        filters: DevicePtrMut<T>,
    ) -> Launch<SubPixelFiltersArgs<T>> {
        let args = SubPixelFiltersArgs {
            w,
            filters,
            problem: *problem,
            phases: self.phases,
        };
        Launch::new(
            T::FILTERS,
            LaunchGeometry::per_item(self.phases.problem.weight_count(), SUB_PIXEL_FILTER_THREADS),
            args,
        )
    }

    /// The launch of the phases' forward pass: dy and the gathered `filters` (described
    /// by `maps`, the forward plan's [`TensorCorePlan::tensor_maps`]) into dx, all of
    /// the plan's operand.
    pub const fn launch(
        &self,
        dy: DevicePtr<f32>,
        filters: DevicePtr<f32>,
        dx: DevicePtrMut<f32>,
        maps: DevicePtr<TensorMapPair>,
    ) -> Launch<SubPixelArgs> {
        let geometry = LaunchGeometry {
            grid: [self.forward.blocks as u64, 1, 1],
            threads: WGMMA_THREADS,
            shared_bytes: WgmmaSchedule::of(false, true).shared_bytes(),
        };
        let args = SubPixelArgs {
            forward: TensorCoreArgs {
                x: dy,
                w: filters,
                epilogue: super::ConvEpilogue::NONE,
                y: dx,
                maps,
                problem: self.phases.problem,
                plan: self.forward,
            },
            shuffle: self.phases.shuffle,
        };
        let kernel = match self.forward.operand {
            TensorCoreOperand::Tf32 => CONV_INPUT_GRAD_SUB_PIXEL_TF32,
            TensorCoreOperand::Bf16 => CONV_INPUT_GRAD_SUB_PIXEL_BF16,
            TensorCoreOperand::F16 => CONV_INPUT_GRAD_SUB_PIXEL_F16,
        };
        Launch::new(kernel, geometry, args)
    }
}

kernel_args! {
    /// The filter gathering's arguments: the weights of `problem`'s `phases` into
    /// `filters` from `w`, `problem`'s NHWC weights, of `T` (f32, rounded to TF32; or a
    /// 16-bit float's bits, as they are).
    pub struct SubPixelFiltersArgs<T> {
        pub w: DevicePtr<T>,
        pub filters: DevicePtrMut<T>,
        pub problem: ConvProblem,
        pub phases: SubPixelPhases,
    }
    impl SubPixelFilterKernel for f32 {
        const FILTERS = "conv_sub_pixel_filters_f32" => kernel::filters::<f32>;
    }
    impl SubPixelFilterKernel for u16 {
        const FILTERS = "conv_sub_pixel_filters_b16" => kernel::filters::<u16>;
    }
    entry points in FILTERS_ENTRY_POINTS;
}

/// The kernel gathering the phases' weights of an element: f32 or 2 bytes.
pub trait SubPixelFilterKernel: Sized {
    /// One thread per element of the phases' weights.
    const FILTERS: crate::launch::Kernel<SubPixelFiltersArgs<Self>>;
}

kernel_args! {
    /// The phases' forward pass: `forward` (dy as x, the gathered weights as w, dx as
    /// y; no bias, no activation) stored into dx by `shuffle`.
    pub struct SubPixelArgs {
        pub forward: TensorCoreArgs,
        pub shuffle: PhaseShuffle,
    }
    /// Over f32 tensors on the tensor cores in TF32 (the weights rounded by the
    /// gathering, dy by the bulk copies).
    pub const CONV_INPUT_GRAD_SUB_PIXEL_TF32 = "conv_input_grad_sub_pixel_tf32_wgmma" =>
        super::tensor_core::input_grad_sub_pixel::<f32>,
        bounds(WGMMA_THREADS, 1), requires("sm_90a");
    /// Over bf16 tensors, dx rounded once.
    pub const CONV_INPUT_GRAD_SUB_PIXEL_BF16 = "conv_input_grad_sub_pixel_bf16_wgmma" =>
        super::tensor_core::input_grad_sub_pixel::<half::bf16>,
        bounds(WGMMA_THREADS, 1), requires("sm_90a");
    /// Over f16 tensors, dx rounded once.
    pub const CONV_INPUT_GRAD_SUB_PIXEL_F16 = "conv_input_grad_sub_pixel_f16_wgmma" =>
        super::tensor_core::input_grad_sub_pixel::<half::f16>,
        bounds(WGMMA_THREADS, 1), requires("sm_90a");
    entry points in ENTRY_POINTS;
}

#[cfg(target_arch = "nvptx64")]
mod kernel {
    use super::*;
    use crate::conv::phases::kernel::PhaseElement;
    use crate::device::{block_idx_x, thread_idx_x};

    /// `filters[j] = w[phases.filter_source(j)]` (rounded to TF32 for f32), or zero.
    ///
    /// # Safety
    /// `w` holds the problem's NHWC weights, `filters` the phases' weights; the grid
    /// covers the latter, `SUB_PIXEL_FILTER_THREADS` a block.
    #[inline(always)]
    pub unsafe fn filters<T: PhaseElement>(args: SubPixelFiltersArgs<T>) {
        let j = block_idx_x() as u64 * SUB_PIXEL_FILTER_THREADS as u64 + thread_idx_x() as u64;
        if j >= args.phases.problem.weight_count() {
            return;
        }
        let value = match args.phases.filter_source(&args.problem, j) {
            // SAFETY: the source is an element of w.
            Some(i) => unsafe { *args.w.as_ptr().add(i as usize) }.tf32(),
            None => T::default(),
        };
        // SAFETY: j is an element of the phases' weights.
        unsafe { *args.filters.as_mut_ptr().add(j as usize) = value };
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::launch::H100;
    use std::{vec, vec::Vec};

    fn problem(
        input: [u32; 4],
        weight: [u32; 4],
        stride: [u32; 2],
        padding: [u32; 2],
        groups: u32,
    ) -> ConvProblem {
        ConvProblem::new(&ConvShape {
            input,
            weight,
            stride,
            padding,
            dilation: [1, 1],
            groups,
        })
        .unwrap()
    }

    /// `product(x, y, w)` for every product of the convolution `p` (NHWC tensors): the
    /// indices of x's element, y's and the weight.
    fn each_product(p: &ConvProblem, mut product: impl FnMut(usize, usize, usize)) {
        let (cg, og) = (p.in_per_group() as usize, p.out_per_group() as usize);
        let [h, w, oh, ow] = [p.height, p.width, p.out_h, p.out_w].map(|d| d as usize);
        let [kh, kw, sh, sw] = [p.kernel_h, p.kernel_w, p.stride_h, p.stride_w].map(|d| d as usize);
        let places = (0..p.batch as usize).flat_map(move |n| {
            (0..oh).flat_map(move |oy| {
                (0..ow).flat_map(move |ox| (0..kh).flat_map(move |r| (0..kw).map(move |s| (n, oy, ox, r, s))))
            })
        });
        for (n, oy, ox, r, s) in places {
            let y = (oy * sh + r) as i64 - p.pad_h as i64;
            let x = (ox * sw + s) as i64 - p.pad_w as i64;
            if y < 0 || x < 0 || y >= h as i64 || x >= w as i64 {
                continue;
            }
            let pixel = (n * h + y as usize) * w + x as usize;
            let out_pixel = (n * oh + oy) * ow + ox;
            for o in 0..p.out_channels as usize {
                for c in 0..cg {
                    let weight = ((o * kh + r) * kw + s) * cg + c;
                    let input = pixel * p.in_channels as usize + o / og * cg + c;
                    product(input, out_pixel * p.out_channels as usize + o, weight);
                }
            }
        }
    }

    /// dx of `p` from dy and w by the definition.
    fn input_grad(p: &ConvProblem, dy: &[f64], w: &[f64]) -> Vec<f64> {
        let mut dx = vec![0.0; p.input_count() as usize];
        each_product(p, |x, y, weight| dx[x] += dy[y] * w[weight]);
        dx
    }

    /// dx by the phases: their weights gathered by `filter_source`, their forward pass
    /// by the definition, every output stored where the shuffle places it (each place
    /// written once; a place never written stays NaN).
    fn by_phases(p: &ConvProblem, plan: &SubPixelPhases, dy: &[f64], w: &[f64]) -> Vec<f64> {
        let u = &plan.problem;
        let filters: Vec<f64> = (0..u.weight_count())
            .map(|j| plan.filter_source(p, j).map_or(0.0, |i| w[i as usize]))
            .collect();
        let y = forward(u, dy, &filters);
        let mut dx = vec![f64::NAN; p.input_count() as usize];
        let og = u.out_per_group();
        for m in 0..u.batch * u.out_pixels() {
            let Some(pixel) = plan.shuffle.pixel(u, m) else {
                continue;
            };
            for o in 0..u.out_channels {
                if let Some(at) = pixel.place(plan.shuffle.channel(o / og, o % og)) {
                    let at = at as usize;
                    assert!(dx[at].is_nan(), "{at} twice");
                    dx[at] = y[(m * u.out_channels + o) as usize];
                }
            }
        }
        dx
    }

    /// y of `p` by the definition.
    fn forward(p: &ConvProblem, x: &[f64], w: &[f64]) -> Vec<f64> {
        let mut y = vec![0.0; p.output_count() as usize];
        each_product(p, |input, output, weight| y[output] += x[input] * w[weight]);
        y
    }

    /// Small integers: every sum exact in f64.
    fn values(count: u64, seed: u64) -> Vec<f64> {
        (0..count)
            .map(|i| ((i * 7 + seed * 13) % 11) as f64 - 5.0)
            .collect()
    }

    /// The gathered weights, the phases' forward pass and the shuffle give the input
    /// gradient exactly, over strides 2 to 4 (one axis or both), windows from 2 to 7
    /// taps, paddings up to the window's, odd and even extents, groups.
    #[test]
    fn the_phases_forward_pass_is_the_input_gradient() {
        let mut checked = 0;
        for (input, weight, stride, padding, groups) in [
            ([2, 4, 9, 8], [6, 4, 3, 3], [2, 2], [1, 1], 1),
            ([1, 2, 8, 8], [3, 2, 3, 3], [2, 2], [0, 0], 1),
            ([1, 3, 11, 7], [2, 3, 5, 3], [3, 2], [2, 1], 1),
            ([2, 4, 10, 9], [4, 2, 4, 2], [2, 2], [1, 0], 2),
            ([1, 2, 13, 12], [2, 2, 7, 7], [2, 2], [3, 3], 1),
            ([1, 2, 9, 10], [2, 2, 3, 4], [1, 4], [1, 2], 1),
            ([1, 1, 5, 6], [1, 1, 3, 3], [3, 3], [2, 2], 1),
            ([1, 2, 3, 3], [2, 2, 2, 2], [2, 2], [1, 1], 1),
        ] {
            let p = problem(input, weight, stride, padding, groups);
            let phases = SubPixelPhases::new(&p).unwrap();
            let dy = values(p.output_count(), 1);
            let w = values(p.weight_count(), 2);
            assert_eq!(by_phases(&p, &phases, &dy, &w), input_grad(&p, &dy, &w), "{p:?}");
            checked += 1;
        }
        assert_eq!(checked, 8);
    }

    /// R6's input gradient (3x3 at stride 2) runs as 2x2 windows over dy, 512 output
    /// channels of 29 x 29 pixels, on im2col boxes in every operand, and a 2x2 window
    /// at stride 2 as 1x1 windows; a 1x1 window at stride 2 (phases without taps),
    /// stride 1 and NCHW tensors do not.
    #[test]
    fn plans() {
        let r6 = problem([32, 128, 56, 56], [128, 128, 3, 3], [2, 2], [1, 1], 1);
        for operand in [
            TensorCoreOperand::Tf32,
            TensorCoreOperand::Bf16,
            TensorCoreOperand::F16,
        ] {
            let plan = SubPixelPlan::of(&r6, ConvLayout::Nhwc, operand, &H100).unwrap();
            let u = &plan.phases.problem;
            assert_eq!(
                (u.kernel_h, u.kernel_w, u.out_channels, u.out_h, u.out_w),
                (2, 2, 512, 29, 29)
            );
            assert_eq!((plan.phases.rows.skip, plan.phases.columns.skip), (1, 1));
            let f = &plan.forward;
            assert_eq!(
                (f.row_strips, f.splits, f.tile_n, f.operand),
                (0, 1, 128, operand)
            );
            assert_eq!(SubPixelPlan::of(&r6, ConvLayout::Nchw, operand, &H100), None);
        }
        let patches = problem([32, 128, 56, 56], [128, 128, 2, 2], [2, 2], [0, 0], 1);
        let plan = SubPixelPlan::of(&patches, ConvLayout::Nhwc, TensorCoreOperand::Bf16, &H100).unwrap();
        let u = &plan.phases.problem;
        assert_eq!(
            (u.kernel_h, u.kernel_w, u.out_channels, u.out_h, u.out_w),
            (1, 1, 512, 28, 28)
        );
        for (weight, stride, padding) in [
            ([128, 128, 1, 1], [2, 2], [0, 0]),
            ([128, 128, 3, 3], [1, 1], [1, 1]),
        ] {
            let p = problem([32, 128, 56, 56], weight, stride, padding, 1);
            assert_eq!(
                SubPixelPlan::of(&p, ConvLayout::Nhwc, TensorCoreOperand::Tf32, &H100),
                None
            );
        }
    }
}
