//! The input gradient of a stride-1 convolution as a forward convolution, so that the
//! forward kernels (the tensor cores') serve it: dx is dy convolved by the weights
//! flipped in space and transposed within each group,
//! `w'[g ci][co][r][s] = w[g co][ci][kh - 1 - r][kw - 1 - s]`, padded by
//! `dilation (kernel - 1) - padding`, with the same dilation and groups. Its output
//! extent is x's: `out + 2 (d (k - 1) - p) - d (k - 1) = in` at stride 1.
//!
//! The kernel that flips the weights also rounds them to TF32, as the tensor cores
//! read them; without the flip it prepares the weights of a forward pass on `wgmma`,
//! which would otherwise truncate them.

use super::{ConvLayout, ConvProblem, ConvShape};
use crate::launch::{DevicePtr, DevicePtrMut, Launch, LaunchGeometry, kernel_args};

/// Threads per block of the filter preparation.
pub const PREPARE_THREADS: u32 = 256;

impl ConvProblem {
    /// The forward problem whose output is this problem's input gradient, with the
    /// weights of [`flip_filters`]: at stride 1 with padding at most the dilated window
    /// on both axes (else the padding would be negative), `None` otherwise.
    pub const fn input_grad_as_forward(&self) -> Option<ConvProblem> {
        if self.stride_h != 1 || self.stride_w != 1 {
            return None;
        }
        // Within the index limits: the padded image with its window is under 2^29.
        let window_h = self.dilation_h * (self.kernel_h - 1);
        let window_w = self.dilation_w * (self.kernel_w - 1);
        if self.pad_h > window_h || self.pad_w > window_w {
            return None;
        }
        let shape = ConvShape {
            input: [self.batch, self.out_channels, self.out_h, self.out_w],
            weight: [
                self.in_channels,
                self.out_per_group(),
                self.kernel_h,
                self.kernel_w,
            ],
            stride: [1, 1],
            padding: [window_h - self.pad_h, window_w - self.pad_w],
            dilation: [self.dilation_h, self.dilation_w],
            groups: self.groups,
        };
        match ConvProblem::new(&shape) {
            Ok(transposed) => Some(transposed),
            Err(_) => None,
        }
    }
}

kernel_args! {
    /// The filter preparation's arguments: `prepared` from `w` (the weights of
    /// `problem`), both in the layout `channels_last` names (1 NHWC, 0 NCHW), rounded
    /// to TF32 and, when `flip` is 1, flipped and group-transposed (the weights of
    /// [`ConvProblem::input_grad_as_forward`]).
    pub struct PrepareFiltersArgs {
        pub w: DevicePtr<f32>,
        pub prepared: DevicePtrMut<f32>,
        pub problem: ConvProblem,
        pub channels_last: u32,
        pub flip: u32,
    }
    /// Rounds (and flips) the weights, one thread per element.
    pub const CONV_PREPARE_FILTERS = "conv_prepare_filters_f32" => kernel::prepare_filters;
    entry points in PREPARE_ENTRY_POINTS;
}

/// The launch writing `problem`'s weights `w` (in `layout`) to `flipped` (as many
/// elements, in the same layout) flipped, group-transposed and rounded to TF32.
pub const fn flip_filters(
    problem: &ConvProblem,
    layout: ConvLayout,
    w: DevicePtr<f32>,
    flipped: DevicePtrMut<f32>,
) -> Launch<PrepareFiltersArgs> {
    prepare_filters(problem, layout, w, flipped, true)
}

/// The launch writing `problem`'s weights `w` to `rounded` (as many elements, in the
/// same order) rounded to TF32, to nearest.
pub const fn round_filters(
    problem: &ConvProblem,
    w: DevicePtr<f32>,
    rounded: DevicePtrMut<f32>,
) -> Launch<PrepareFiltersArgs> {
    prepare_filters(problem, ConvLayout::Nchw, w, rounded, false)
}

const fn prepare_filters(
    problem: &ConvProblem,
    layout: ConvLayout,
    w: DevicePtr<f32>,
    prepared: DevicePtrMut<f32>,
    flip: bool,
) -> Launch<PrepareFiltersArgs> {
    let args = PrepareFiltersArgs {
        w,
        prepared,
        problem: *problem,
        channels_last: matches!(layout, ConvLayout::Nhwc) as u32,
        flip: flip as u32,
    };
    Launch::new(
        CONV_PREPARE_FILTERS,
        LaunchGeometry::per_item(problem.weight_count(), PREPARE_THREADS),
        args,
    )
}

/// Where element `i` of `problem`'s weights goes among the flipped weights.
pub const fn flipped_index(problem: &ConvProblem, channels_last: bool, i: u64) -> u64 {
    let (in_group, out_group) = (problem.in_per_group() as u64, problem.out_per_group() as u64);
    let (kh, kw) = (problem.kernel_h as u64, problem.kernel_w as u64);
    // (output channel, input channel in its group, window row, window column)
    let (o, ci, r, s) = if channels_last {
        (
            i / (kh * kw * in_group),
            i % in_group,
            i / (kw * in_group) % kh,
            i / in_group % kw,
        )
    } else {
        (
            i / (in_group * kh * kw),
            i / (kh * kw) % in_group,
            i / kw % kh,
            i % kw,
        )
    };
    let (group, co) = (o / out_group, o % out_group);
    let channel = group * in_group + ci;
    let (r, s) = (kh - 1 - r, kw - 1 - s);
    if channels_last {
        ((channel * kh + r) * kw + s) * out_group + co
    } else {
        ((channel * out_group + co) * kh + r) * kw + s
    }
}

#[cfg(target_arch = "nvptx64")]
mod kernel {
    use super::*;
    use crate::device::{block_idx_x, thread_idx_x, to_tf32};

    /// `prepared[j] = tf32(w[i])` for every weight `i`, `j` its [`flipped_index`]
    /// when flipping, else `i`.
    ///
    /// # Safety
    /// `w` and `prepared` hold the problem's weights (`out * in / groups * taps`), in
    /// the layout `channels_last` names; the grid covers them, `PREPARE_THREADS` a
    /// block.
    #[inline(always)]
    pub unsafe fn prepare_filters(args: PrepareFiltersArgs) {
        let p = args.problem;
        let i = block_idx_x() as u64 * PREPARE_THREADS as u64 + thread_idx_x() as u64;
        if i >= p.weight_count() {
            return;
        }
        let j = if args.flip == 1 {
            flipped_index(&p, args.channels_last == 1, i)
        } else {
            i
        };
        // SAFETY: i < count, and flipped_index is a permutation of [0, count).
        unsafe {
            let value = *args.w.as_ptr().add(i as usize);
            *args.prepared.as_mut_ptr().add(j as usize) = f32::from_bits(to_tf32(value));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_transposed_problem_computes_the_input_gradient() {
        let problem = |stride, padding, dilation| {
            ConvProblem::new(&ConvShape {
                input: [2, 6, 9, 11],
                weight: [4, 3, 3, 2],
                stride,
                padding,
                dilation,
                groups: 2,
            })
            .unwrap()
        };
        let p = problem([1, 1], [1, 0], [2, 1]);
        let t = p.input_grad_as_forward().unwrap();
        assert_eq!(t.output_shape(), [2, 6, 9, 11]);
        assert_eq!((t.in_channels, t.out_channels, t.groups), (4, 6, 2));
        assert_eq!((t.pad_h, t.pad_w, t.dilation_h), (3, 1, 2));
        // Strided, or padded past the window: no forward problem.
        assert_eq!(problem([2, 1], [1, 0], [1, 1]).input_grad_as_forward(), None);
        assert_eq!(problem([1, 1], [1, 2], [1, 1]).input_grad_as_forward(), None);
        // The flip is a permutation, in both layouts, and an involution through the
        // transposed problem.
        for channels_last in [false, true] {
            let mut seen = [false; 4 * 3 * 6];
            for i in 0..seen.len() as u64 {
                let j = flipped_index(&p, channels_last, i);
                assert!(!seen[j as usize]);
                seen[j as usize] = true;
                assert_eq!(flipped_index(&t, channels_last, j), i);
            }
        }
    }
}
