//! The input gradient of a convolution as a forward convolution, so that the forward
//! kernels (the tensor cores') serve it: dx is dy convolved by the weights flipped in
//! space and transposed within each group,
//! `w'[g ci][co][r][s] = w[g co][ci][kh - 1 - r][kw - 1 - s]`, padded by
//! `dilation (kernel - 1) - padding`, with the same dilation and groups. Its output
//! extent is x's: `out + 2 (d (k - 1) - p) - d (k - 1) = in` at stride 1. At stride s,
//! dy is first upsampled: `dy[o]` at `s o`, zeros between and after, to the extent
//! `in + 2 p - d (k - 1)` (the stride-1 output extent), and the forward pass runs over
//! that: s^2 times the products of the gradient, on the tensor cores.
//!
//! The kernel that flips the weights also rounds them to TF32, as the tensor cores
//! read them; without the flip it prepares the weights of a forward pass on `wgmma`,
//! which would otherwise truncate them (in the NCHW boxes' order where that pass
//! reads them so).

use super::{ConvLayout, ConvProblem, ConvShape, FastDiv};
use crate::launch::{DevicePtr, DevicePtrMut, Launch, LaunchGeometry, kernel_args};
use crate::transpose;

/// Blocks along a grid's z, at most.
const MAX_GRID_Z: u64 = 65535;

/// Threads per block of the filter preparation.
pub const PREPARE_THREADS: u32 = 256;

impl ConvProblem {
    /// The forward problem whose output is this problem's input gradient, with the
    /// weights of [`flip_filters`] and, when strided, the input of [`upsample`]: with
    /// padding at most the dilated window on both axes (else the padding would be
    /// negative) and an upsampled dy of fewer than 2^31 elements (the upsampling's
    /// index limit), `None` otherwise.
    pub const fn input_grad_as_forward(&self) -> Option<ConvProblem> {
        // Within the index limits: the padded image with its window is under 2^29.
        let window_h = self.dilation_h * (self.kernel_h - 1);
        let window_w = self.dilation_w * (self.kernel_w - 1);
        if self.pad_h > window_h || self.pad_w > window_w {
            return None;
        }
        // The stride-1 output extent, which holds every dy[o] at s o.
        let (up_h, up_w) = (
            self.height + 2 * self.pad_h - window_h,
            self.width + 2 * self.pad_w - window_w,
        );
        let upsampled_count = self.batch as u64 * self.out_channels as u64 * up_h as u64 * up_w as u64;
        if upsampled(self) && upsampled_count >= 1 << 31 {
            return None;
        }
        let shape = ConvShape {
            input: [self.batch, self.out_channels, up_h, up_w],
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
    /// `problem`, in the layout `channels_last` names: 1 NHWC, 0 NCHW), rounded to
    /// TF32 and placed as `order` says.
    pub struct PrepareFiltersArgs {
        pub w: DevicePtr<f32>,
        pub prepared: DevicePtrMut<f32>,
        pub problem: ConvProblem,
        pub channels_last: u32,
        pub order: u32,
    }
    /// Rounds (and flips) the weights, one thread per element.
    pub const CONV_PREPARE_FILTERS = "conv_prepare_filters_f32" => kernel::prepare_filters;
    /// Rounds and flips NHWC weights, a tile of a tap's (output, input) channel matrix
    /// per block, through shared memory.
    pub const CONV_FLIP_FILTERS_NHWC = "conv_flip_filters_nhwc_f32" => kernel::flip_filters_nhwc;
    entry points in PREPARE_ENTRY_POINTS;
}

kernel_args! {
    /// The flip of 16-bit weights: `flipped` from `w`, the NHWC weights of `problem`
    /// (bf16 or f16: moved as they are, nothing rounded).
    pub struct FlipFilters16Args {
        pub w: DevicePtr<u16>,
        pub flipped: DevicePtrMut<u16>,
        pub problem: ConvProblem,
        /// Whether the tiles move in 4-byte pairs (`flips_in_pairs`), as 1 or 0.
        pub pairs: u32,
    }
    /// Flips NHWC weights of 2-byte elements, as [`CONV_FLIP_FILTERS_NHWC`] does.
    pub const CONV_FLIP_FILTERS_NHWC_16 = "conv_flip_filters_nhwc_b16" => kernel::flip_filters_nhwc_16;
    entry points in FLIP_16_ENTRY_POINTS;
}

/// Orders of prepared filters: as given; flipped and group-transposed, in the same
/// layout (the weights of [`ConvProblem::input_grad_as_forward`]); from NCHW into the
/// order the NCHW boxes' forward pass reads
/// ([`box_filter_index`](super::tensor_core::box_filter_index)).
pub const FILTERS_AS_GIVEN: u32 = 0;
pub const FILTERS_FLIPPED: u32 = 1;
pub const FILTERS_IN_BOX_ORDER: u32 = 2;

/// Whether the input gradient as a forward pass reads dy upsampled.
pub const fn upsampled(problem: &ConvProblem) -> bool {
    problem.stride_h > 1 || problem.stride_w > 1
}

kernel_args! {
    /// The upsampling's arguments: `up`, the input of `transposed` (the problem's
    /// [`ConvProblem::input_grad_as_forward`]), from dy: `dy[o]` at `stride o`, zeros
    /// elsewhere, both in the layout `channels_last` names, of `T` (f32, or a 16-bit
    /// float's bits).
    pub struct UpsampleArgs<T> {
        pub dy: DevicePtr<T>,
        pub up: DevicePtrMut<T>,
        pub problem: ConvProblem,
        pub transposed: ConvProblem,
        pub channels_last: u32,
        /// Division by up's channels (dy's).
        pub div_channels: FastDiv,
    }
    impl UpsampleKernel for f32 {
        const UPSAMPLE = "conv_upsample_f32" => kernel::upsample::<f32>;
    }
    impl UpsampleKernel for u16 {
        const UPSAMPLE = "conv_upsample_b16" => kernel::upsample::<u16>;
    }
    entry points in UPSAMPLE_ENTRY_POINTS;
}

/// The upsampling kernel of an element: f32, or 2 bytes (bf16 and f16 alike: zero is
/// their zero bits).
pub trait UpsampleKernel: Sized {
    /// Upsamples dy, one thread per element of `up`.
    const UPSAMPLE: crate::launch::Kernel<UpsampleArgs<Self>>;
}

/// The launch upsampling `problem`'s dy (in `layout`) into `up`, the input of its
/// `transposed` problem.
pub const fn upsample<T: UpsampleKernel>(
    problem: &ConvProblem,
    transposed: &ConvProblem,
    layout: ConvLayout,
    dy: DevicePtr<T>,
    up: DevicePtrMut<T>,
) -> Launch<UpsampleArgs<T>> {
    let t = transposed;
    let count = t.input_count();
    let args = UpsampleArgs {
        dy,
        up,
        problem: *problem,
        transposed: *transposed,
        channels_last: matches!(layout, ConvLayout::Nhwc) as u32,
        div_channels: FastDiv::new(t.in_channels),
    };
    Launch::new(
        T::UPSAMPLE,
        LaunchGeometry::per_item(count, PREPARE_THREADS),
        args,
    )
}

/// The launch writing `problem`'s weights `w` (in `layout`) to `flipped` (as many
/// elements, in the same layout) flipped, group-transposed and rounded to TF32. In
/// NHWC a tap's weights of a group are a matrix, `[out][in]` in `w` and `[in][out]`
/// in `flipped`, transposed by tiles (one thread per element would scatter its
/// writes); in NCHW each (out, in) pair's taps lie together on both sides.
pub const fn flip_filters(
    problem: &ConvProblem,
    layout: ConvLayout,
    w: DevicePtr<f32>,
    flipped: DevicePtrMut<f32>,
) -> Launch<PrepareFiltersArgs> {
    let matrices = problem.groups as u64 * problem.taps() as u64;
    if !matches!(layout, ConvLayout::Nhwc) || matrices > MAX_GRID_Z {
        return prepare_filters(problem, layout, w, flipped, FILTERS_FLIPPED);
    }
    let args = prepare_args(problem, layout, w, flipped, FILTERS_FLIPPED);
    Launch::new(CONV_FLIP_FILTERS_NHWC, flip_geometry(problem, false), args)
}

/// The launch writing `problem`'s NHWC weights `w` of a 16-bit float to `flipped` (as
/// many elements) flipped and group-transposed, as [`flip_filters`] does without the
/// rounding; `None` where the grid cannot hold a block per group and tap.
pub fn flip_filters_16_bit(
    problem: &ConvProblem,
    w: DevicePtr<u16>,
    flipped: DevicePtrMut<u16>,
) -> Option<Launch<FlipFilters16Args>> {
    let matrices = problem.groups as u64 * problem.taps() as u64;
    if matrices > MAX_GRID_Z {
        return None;
    }
    let pairs = flips_in_pairs(problem, w.address() | flipped.address());
    let args = FlipFilters16Args {
        w,
        flipped,
        problem: *problem,
        pairs: pairs as u32,
    };
    Some(Launch::new(
        CONV_FLIP_FILTERS_NHWC_16,
        flip_geometry(problem, pairs),
        args,
    ))
}

/// Whether the flip of 16-bit weights moves them in 4-byte pairs: where both sides of
/// each group's matrix are even (each pair of a row of w and of flipped starts at an
/// even element) and both buffers' `addresses` (or-ed) are 4-byte aligned.
const fn flips_in_pairs(problem: &ConvProblem, addresses: u64) -> bool {
    let even = problem.in_per_group().is_multiple_of(2) && problem.out_per_group().is_multiple_of(2);
    even && addresses.is_multiple_of(4)
}

/// A block per tile of every group's and tap's `out / groups x in / groups` matrix:
/// tiles of 4-byte elements, or of 2-byte pairs.
const fn flip_geometry(problem: &ConvProblem, pairs: bool) -> LaunchGeometry {
    let (tile, shared_bytes) = if pairs {
        (transpose::PAIRS_TILE, transpose::PAIRS_SHARED_BYTES)
    } else {
        (transpose::TILE, transpose::SHARED_BYTES)
    };
    LaunchGeometry {
        grid: [
            problem.in_per_group().div_ceil(tile) as u64,
            problem.out_per_group().div_ceil(tile) as u64,
            problem.groups as u64 * problem.taps() as u64,
        ],
        threads: transpose::THREADS,
        shared_bytes,
    }
}

/// The launch writing `problem`'s weights `w` to `rounded` (as many elements, in the
/// same order) rounded to TF32, to nearest.
pub const fn round_filters(
    problem: &ConvProblem,
    w: DevicePtr<f32>,
    rounded: DevicePtrMut<f32>,
) -> Launch<PrepareFiltersArgs> {
    prepare_filters(problem, ConvLayout::Nchw, w, rounded, FILTERS_AS_GIVEN)
}

/// The launch writing `problem`'s NCHW weights `w` to `ordered` rounded to TF32, in
/// the order the NCHW boxes' forward pass reads
/// ([`box_filter_index`](super::tensor_core::box_filter_index)).
pub const fn box_order_filters(
    problem: &ConvProblem,
    w: DevicePtr<f32>,
    ordered: DevicePtrMut<f32>,
) -> Launch<PrepareFiltersArgs> {
    prepare_filters(problem, ConvLayout::Nchw, w, ordered, FILTERS_IN_BOX_ORDER)
}

const fn prepare_args(
    problem: &ConvProblem,
    layout: ConvLayout,
    w: DevicePtr<f32>,
    prepared: DevicePtrMut<f32>,
    order: u32,
) -> PrepareFiltersArgs {
    PrepareFiltersArgs {
        w,
        prepared,
        problem: *problem,
        channels_last: matches!(layout, ConvLayout::Nhwc) as u32,
        order,
    }
}

const fn prepare_filters(
    problem: &ConvProblem,
    layout: ConvLayout,
    w: DevicePtr<f32>,
    prepared: DevicePtrMut<f32>,
    order: u32,
) -> Launch<PrepareFiltersArgs> {
    let args = prepare_args(problem, layout, w, prepared, order);
    let per_thread = if order == FILTERS_AS_GIVEN {
        ROUNDED_PER_THREAD
    } else {
        1
    };
    Launch::new(
        CONV_PREPARE_FILTERS,
        LaunchGeometry::per_item(problem.weight_count().div_ceil(per_thread), PREPARE_THREADS),
        args,
    )
}

/// Weights each thread rounds where the preparation keeps their order: 16 bytes.
const ROUNDED_PER_THREAD: u64 = 4;

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

/// Where weight `(co, ci)` of an NHWC group's tap lies in the weights and in the
/// flipped weights.
#[inline(always)]
pub const fn nhwc_flip_places(problem: &ConvProblem, [group, tap]: [u64; 2], co: u64, ci: u64) -> (u64, u64) {
    let (in_group, out_group) = (problem.in_per_group() as u64, problem.out_per_group() as u64);
    let taps = problem.taps() as u64;
    (
        ((group * out_group + co) * taps + tap) * in_group + ci,
        ((group * in_group + ci) * taps + taps - 1 - tap) * out_group + co,
    )
}

#[cfg(target_arch = "nvptx64")]
mod kernel {
    use super::*;
    use crate::conv::problem::{element_index, element_place};
    use crate::conv::tensor_core::box_filter_index;
    use crate::device::{
        block_idx_x, block_idx_y, block_idx_z, load_global_v4, store_global_v4, thread_idx_x, to_tf32,
    };

    /// `prepared[j] = tf32(w[i])` for every weight `i`, `j` its [`flipped_index`]
    /// or [`box_filter_index`] as the order says, else `i` (`ROUNDED_PER_THREAD`
    /// weights a thread).
    ///
    /// # Safety
    /// `w` and `prepared` hold the problem's weights (`out * in / groups * taps`), in
    /// the layout `channels_last` names, from 16-byte-aligned addresses; the grid
    /// covers them, `PREPARE_THREADS` a block.
    #[inline(always)]
    pub unsafe fn prepare_filters(args: PrepareFiltersArgs) {
        let p = args.problem;
        let thread = block_idx_x() as u64 * PREPARE_THREADS as u64 + thread_idx_x() as u64;
        if args.order == FILTERS_AS_GIVEN {
            let (first, count) = (thread * ROUNDED_PER_THREAD, p.weight_count());
            let (w, rounded) = (args.w.as_ptr(), args.prepared.as_mut_ptr());
            if first + ROUNDED_PER_THREAD <= count {
                // SAFETY: weights first..first + 4, 16-byte aligned on both sides.
                unsafe {
                    let values = load_global_v4(w.add(first as usize).cast());
                    let values = values.map(|v| to_tf32(f32::from_bits(v)));
                    store_global_v4(rounded.add(first as usize).cast(), values);
                }
            } else {
                for i in first..count {
                    // SAFETY: i < count.
                    unsafe { *rounded.add(i as usize) = f32::from_bits(to_tf32(*w.add(i as usize))) };
                }
            }
            return;
        }
        let i = thread;
        if i >= p.weight_count() {
            return;
        }
        let j = if args.order == FILTERS_FLIPPED {
            flipped_index(&p, args.channels_last == 1, i)
        } else {
            box_filter_index(&p, i)
        };
        // SAFETY: i < count, and both indices are permutations of [0, count).
        unsafe {
            let value = *args.w.as_ptr().add(i as usize);
            *args.prepared.as_mut_ptr().add(j as usize) = f32::from_bits(to_tf32(value));
        }
    }

    /// The NHWC flip: block z is group `g` and tap `t`; its matrix
    /// `w[g out + co][t][ci]` goes to `prepared[g in + ci][taps - 1 - t][co]` (the
    /// window turned: row `kh - 1 - r`, column `kw - 1 - s`), rounded to TF32.
    ///
    /// # Safety
    /// As [`prepare_filters`], NHWC, flipping; the grid is the tiles of every group's
    /// and tap's `out / groups x in / groups` matrix ([`flip_filters`]).
    #[inline(always)]
    pub unsafe fn flip_filters_nhwc(args: PrepareFiltersArgs) {
        // SAFETY: forwarded.
        unsafe {
            flip_tile(
                &args.problem,
                args.w.as_ptr().cast::<u32>(),
                args.prepared.as_mut_ptr().cast(),
                |value| to_tf32(f32::from_bits(value)),
            )
        };
    }

    /// The NHWC flip of 2-byte weights, as [`flip_filters_nhwc`] without the rounding:
    /// in 4-byte pairs where the launch says so.
    ///
    /// # Safety
    /// `w` and `flipped` hold the problem's NHWC weights, distinct; the grid is
    /// [`flip_filters_16_bit`]'s.
    #[inline(always)]
    pub unsafe fn flip_filters_nhwc_16(args: FlipFilters16Args) {
        let (p, w, flipped) = (&args.problem, args.w.as_ptr(), args.flipped.as_mut_ptr());
        if args.pairs == 0 {
            // SAFETY: forwarded.
            unsafe { flip_tile(p, w, flipped, |value| value) };
            return;
        }
        let (group, tap) = (block_idx_z() / p.taps(), block_idx_z() % p.taps());
        let matrix = [group as u64, tap as u64];
        // SAFETY: every (co, ci) of the matrix indexes a weight of both tensors; with
        // both sides even and the buffers 4-byte aligned (`flips_in_pairs`), a row of w
        // runs along ci and a row of flipped along co, from even elements.
        unsafe {
            crate::transpose::transpose_pairs_tile(
                w,
                flipped,
                [p.out_per_group() as u64, p.in_per_group() as u64],
                [block_idx_y() as u64, block_idx_x() as u64],
                |co, ci| nhwc_flip_places(p, matrix, co, ci).0,
                |co, ci| nhwc_flip_places(p, matrix, co, ci).1,
            )
        };
    }

    /// This block's tile of the NHWC flip from `w` to `flipped`, each value through
    /// `map`.
    ///
    /// # Safety
    /// As [`flip_filters_nhwc`], for elements of `E`.
    #[inline(always)]
    unsafe fn flip_tile<E: Copy>(p: &ConvProblem, w: *const E, flipped: *mut E, map: impl FnMut(E) -> E) {
        // In 32 bits: a 64-bit division costs a subroutine.
        let (group, tap) = (block_idx_z() / p.taps(), block_idx_z() % p.taps());
        let matrix = [group as u64, tap as u64];
        let rows_cols = [p.out_per_group() as u64, p.in_per_group() as u64];
        // SAFETY: every (co, ci) of the matrix indexes a weight of both tensors.
        unsafe {
            crate::transpose::transpose_tile(
                w,
                flipped,
                rows_cols,
                [block_idx_y() as u64, block_idx_x() as u64],
                |co, ci| nhwc_flip_places(p, matrix, co, ci).0,
                |co, ci| nhwc_flip_places(p, matrix, co, ci).1,
                map,
            )
        };
    }

    /// `up[n][c][y][x] = dy[n][c][y / sh][x / sw]` where both divide evenly and the
    /// quotients lie inside dy, else 0 (in either layout).
    ///
    /// # Safety
    /// dy holds the problem's output gradient and `up` the transposed problem's input
    /// (fewer than 2^31 elements), in the layout `channels_last` names; the grid covers
    /// `up`, `PREPARE_THREADS` a block.
    #[inline(always)]
    pub unsafe fn upsample<T: Copy + Default>(args: UpsampleArgs<T>) {
        let (p, t) = (&args.problem, &args.transposed);
        // Every index below 2^31: in 32 bits, divided by multiplies.
        let i = block_idx_x() * PREPARE_THREADS + thread_idx_x();
        if i >= t.batch * t.in_channels * t.pixels() {
            return;
        }
        let channels_last = args.channels_last == 1;
        let [n, c, y, x] = element_place(i, channels_last, args.div_channels, t.div_pixels, t.div_width);
        let ((oy, y_rest), (ox, x_rest)) = (p.div_stride_h.divmod(y), p.div_stride_w.divmod(x));
        let inside = y_rest == 0 && x_rest == 0 && oy < p.out_h && ox < p.out_w;
        let value = if inside {
            let at = element_index([n, c, oy, ox], channels_last, [t.in_channels, p.out_h, p.out_w]);
            // SAFETY: (n, c, oy, ox) is an element of dy.
            unsafe { *args.dy.as_ptr().add(at as usize) }
        } else {
            // Zero: 0.0, or a 16-bit float's zero bits.
            T::default()
        };
        // SAFETY: i is an element of up.
        unsafe { *args.up.as_mut_ptr().add(i as usize) = value };
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
        // Strided: over dy upsampled to the stride-1 output extent, x's coming out.
        let strided = problem([2, 3], [1, 0], [1, 1]);
        let u = strided.input_grad_as_forward().unwrap();
        assert_eq!(u.input_shape(), [2, 4, 9, 10]);
        assert!(upsampled(&strided) && !upsampled(&p));
        assert_eq!(u.output_shape(), [2, 6, 9, 11]);
        // Padded past the window: no forward problem.
        assert_eq!(problem([1, 1], [1, 2], [1, 1]).input_grad_as_forward(), None);
        // An upsampled dy of 2^32 elements passes the upsampling's index limit.
        let large = ConvProblem::new(&ConvShape {
            input: [64, 8, 256, 256],
            weight: [1024, 8, 1, 1],
            stride: [2, 2],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
        })
        .unwrap();
        assert_eq!(large.input_grad_as_forward(), None);
        // The NHWC flip by tiles moves every weight where the flip by elements does.
        let taps = p.taps() as u64;
        for matrix in (0..p.groups as u64 * taps).map(|m| [m / taps, m % taps]) {
            for (co, ci) in (0..2).flat_map(|co| (0..3).map(move |ci| (co, ci))) {
                let (from, to) = nhwc_flip_places(&p, matrix, co, ci);
                assert_eq!(flipped_index(&p, true, from), to);
            }
        }
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
