//! The input gradient of a strided convolution by phases (CUTLASS's strided dgrad). At
//! stride (sh, sw) the input positions (sh i + qh, sw j + qw) of phase (qh, qw) take dy
//! only through the window's taps congruent to (qh + ph, qw + pw) modulo the stride: a
//! stride-1 convolution of dy by those taps, flipped and group-transposed
//! ([`phase_filters`]). Each phase with taps runs as a forward pass of its own (on the
//! tensor cores in TF32, on the CUDA cores in FP32, over NCHW tensors) into a
//! compact gradient, and [`interleave`] writes dx from them, zeros where a phase has no
//! taps: none of the products over the zeros of an upsampled dy, which cost the
//! stride's square in work.
//!
//! In FP32 the phases always run: the implicit GEMM's input gradient computes the
//! products of the zero taps too (3x3 at stride 2 on the H100: 1.22 ms against about a
//! third of that by phases). On the tensor cores they run where a window narrower than
//! the stride leaves phases without taps (a 1x1 window at stride 2 has one phase of
//! four), whose products the upsampled pass would spend on zeros whole. Where every
//! phase has taps (3x3 at stride 2), four passes of 4 to 16 k-tiles leave SMs idle and
//! the interleaving costs as much as an upsampling (R6 on the H100: 0.394 ms for the
//! whole backward pass against 0.316 over dy upsampled): there the phases run as one
//! forward pass ([`sub_pixel`](super::sub_pixel)), straight into dx.
//!
//! Along an axis of stride s, padding p and k taps, position `s i + q` takes dy at
//! `i + (q + p - r) / s` by tap r, for the taps `r = first + s t` with `first = (q + p)
//! mod s`: the convolution of dy by those `taps`, reversed, padded by `taps - 1 -
//! offset` (`offset = (q + p - first) / s`). Where that padding is negative, or its
//! outputs end before the phase's last position, the padding grows by `skip` and the
//! phase's positions start `skip` outputs in.

use super::{ConvLayout, ConvProblem, ConvShape, FastDiv};
use crate::launch::{DevicePtr, DevicePtrMut, Launch, LaunchGeometry, kernel_args};

/// Largest stride along an axis whose input gradient runs by phases.
pub const MAX_PHASE_STRIDE: u32 = 4;
/// Threads per block of the filter and interleaving kernels.
pub const PHASE_THREADS: u32 = 256;

/// The taps of `phase` along an axis of `kernel` undilated taps at `stride` with
/// `pad`: the first, how many, and the offset: position `stride i + phase` takes dy
/// at `i + offset - t` by tap `first + stride t`.
pub const fn axis_taps(phase: u32, kernel: u32, stride: u32, pad: u32) -> (u32, u32, u32) {
    let first = (phase + pad) % stride;
    let taps = if first < kernel {
        (kernel - 1 - first) / stride + 1
    } else {
        0
    };
    (first, taps, (phase + pad - first) / stride)
}

/// One phase of one axis (see the module's docs).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AxisPhase {
    /// The window's first tap of the phase, and how many (0: the phase's gradient is
    /// zero).
    pub first: u32,
    pub taps: u32,
    /// The phase convolution's padding, and its outputs before the phase's first
    /// position.
    pub padding: u32,
    pub skip: u32,
    /// The phase's positions along the axis, and its convolution's outputs.
    pub positions: u32,
    pub extent: u32,
}

impl AxisPhase {
    const NONE: Self = Self {
        first: 0,
        taps: 0,
        padding: 0,
        skip: 0,
        positions: 0,
        extent: 0,
    };

    /// Phase `phase` of an axis of `input` positions and `output` outputs, by a window
    /// of `kernel` undilated taps at `stride` with `pad`.
    pub const fn new(phase: u32, input: u32, output: u32, kernel: u32, stride: u32, pad: u32) -> Self {
        let (first, taps, offset) = axis_taps(phase, kernel, stride, pad);
        let positions = if input > phase {
            (input - phase).div_ceil(stride)
        } else {
            0
        };
        if taps == 0 || positions == 0 {
            return Self {
                positions,
                ..Self::NONE
            };
        }
        let padding = taps as i64 - 1 - offset as i64;
        let natural = output as i64 + 2 * padding - taps as i64 + 1;
        let mut skip = if padding < 0 { -padding } else { 0 };
        if natural + skip < positions as i64 {
            skip = positions as i64 - natural;
        }
        Self {
            first,
            taps,
            padding: (padding + skip) as u32,
            skip: skip as u32,
            positions,
            extent: (natural + 2 * skip) as u32,
        }
    }
}

/// How a strided input gradient runs by phases: the axes' phases, and the length of
/// each phase's slot in the phases' outputs (phase `q = qh sw + qw` at `q slot_len`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PhasePlan {
    pub stride_h: u32,
    pub stride_w: u32,
    pub rows: [AxisPhase; MAX_PHASE_STRIDE as usize],
    pub columns: [AxisPhase; MAX_PHASE_STRIDE as usize],
    pub slot_len: u64,
    /// Division by x's channels.
    pub div_channels: FastDiv,
    /// Whether the tensors are channels last (NHWC), as 1 or 0 (NCHW).
    pub channels_last: u32,
    /// Whether the phases run on the tensor cores (TF32, their weights rounded to it),
    /// as 1 or 0 (FP32 on the CUDA cores).
    pub tensor_cores: u32,
}

impl PhasePlan {
    /// The phases of `problem`'s input gradient over tensors in `layout`, on the tensor
    /// cores or not: where it is strided (at most `MAX_PHASE_STRIDE` along each axis)
    /// and undilated, on the tensor cores some phase has no taps, x holds fewer than
    /// 2^31 elements, and every phase with taps is a valid problem; `None` otherwise.
    pub const fn of(problem: &ConvProblem, layout: ConvLayout, tensor_cores: bool) -> Option<Self> {
        let p = problem;
        let (sh, sw) = (p.stride_h, p.stride_w);
        let strided = sh > 1 || sw > 1;
        if !strided
            || sh > MAX_PHASE_STRIDE
            || sw > MAX_PHASE_STRIDE
            || p.dilation_h != 1
            || p.dilation_w != 1
        {
            return None;
        }
        if p.input_count() >= 1 << 31 {
            return None;
        }
        let mut plan = Self {
            stride_h: sh,
            stride_w: sw,
            rows: [AxisPhase::NONE; MAX_PHASE_STRIDE as usize],
            columns: [AxisPhase::NONE; MAX_PHASE_STRIDE as usize],
            slot_len: 0,
            div_channels: FastDiv::new(p.in_channels),
            channels_last: matches!(layout, ConvLayout::Nhwc) as u32,
            tensor_cores: tensor_cores as u32,
        };
        let (mut most_h, mut most_w) = (0, 0);
        let mut tapless = false;
        let mut q = 0;
        while q < MAX_PHASE_STRIDE {
            if q < sh {
                let row = AxisPhase::new(q, p.height, p.out_h, p.kernel_h, sh, p.pad_h);
                plan.rows[q as usize] = row;
                tapless |= row.taps == 0 && row.positions > 0;
                most_h = if row.extent > most_h { row.extent } else { most_h };
            }
            if q < sw {
                let column = AxisPhase::new(q, p.width, p.out_w, p.kernel_w, sw, p.pad_w);
                plan.columns[q as usize] = column;
                tapless |= column.taps == 0 && column.positions > 0;
                most_w = if column.extent > most_w {
                    column.extent
                } else {
                    most_w
                };
            }
            q += 1;
        }
        if tensor_cores && !tapless {
            return None;
        }
        plan.slot_len = p.batch as u64 * p.in_channels as u64 * most_h as u64 * most_w as u64;
        let mut q = 0;
        while q < sh * sw {
            if let Some(shape) = plan.phase_shape(p, q)
                && ConvProblem::new(&shape).is_err()
            {
                return None;
            }
            q += 1;
        }
        Some(plan)
    }

    /// The layout of the tensors, the phases' gradients and their forward passes' y.
    pub const fn layout(&self) -> ConvLayout {
        ConvLayout::of_channels_last(self.channels_last)
    }

    /// The phases, `stride_h * stride_w` of them.
    pub const fn phases(&self) -> u32 {
        self.stride_h * self.stride_w
    }

    /// The phases' outputs: a slot each.
    pub const fn outputs_len(&self) -> u64 {
        self.phases() as u64 * self.slot_len
    }

    /// Phase `q`'s axes.
    pub const fn axes(&self, q: u32) -> (AxisPhase, AxisPhase) {
        (
            self.rows[(q / self.stride_w) as usize],
            self.columns[(q % self.stride_w) as usize],
        )
    }

    /// The forward convolution of phase `q` (dy by its taps), `None` where the phase
    /// has no taps or no positions.
    const fn phase_shape(&self, p: &ConvProblem, q: u32) -> Option<ConvShape> {
        let (row, column) = self.axes(q);
        if row.taps == 0 || column.taps == 0 {
            return None;
        }
        Some(ConvShape {
            input: [p.batch, p.out_channels, p.out_h, p.out_w],
            weight: [p.in_channels, p.out_per_group(), row.taps, column.taps],
            stride: [1, 1],
            padding: [row.padding, column.padding],
            dilation: [1, 1],
            groups: p.groups,
        })
    }

    /// The forward problem of phase `q`, `None` where the phase has no taps.
    pub fn phase(&self, problem: &ConvProblem, q: u32) -> Option<ConvProblem> {
        // A valid problem: `of` checked every phase with taps.
        self.phase_shape(problem, q)
            .and_then(|shape| ConvProblem::new(&shape).ok())
    }
}

kernel_args! {
    /// The phase filters' arguments: `filters`, the weights of phase `(row, column)`'s
    /// forward problem `phase`, from `w`, both in the layout `channels_last` names, of
    /// `T` (f32 rounded to TF32 when `round` is 1, or a 16-bit float's bits as they
    /// are).
    pub struct PhaseFiltersArgs<T> {
        pub w: DevicePtr<T>,
        pub filters: DevicePtrMut<T>,
        pub problem: ConvProblem,
        pub phase: ConvProblem,
        pub row: AxisPhase,
        pub column: AxisPhase,
        pub channels_last: u32,
        pub round: u32,
    }
    impl PhaseKernels for f32 {
        const FILTERS = "conv_phase_filters_f32" => kernel::phase_filters::<f32>;
    }
    impl PhaseKernels for u16 {
        const FILTERS = "conv_phase_filters_b16" => kernel::phase_filters::<u16>;
    }
    entry points in FILTERS_ENTRY_POINTS;
}

kernel_args! {
    /// The interleaving's arguments: dx from the phases' compact gradients in
    /// `phases` (laid out by the plan), both in the plan's layout, of `T`.
    pub struct InterleaveArgs<T> {
        pub phases: DevicePtr<T>,
        pub dx: DevicePtrMut<T>,
        pub problem: ConvProblem,
        pub plan: PhasePlan,
    }
    impl InterleaveKernel for f32 {
        const INTERLEAVE = "conv_interleave_phases_f32" => kernel::interleave::<f32>;
    }
    impl InterleaveKernel for u16 {
        const INTERLEAVE = "conv_interleave_phases_b16" => kernel::interleave::<u16>;
    }
    entry points in INTERLEAVE_ENTRY_POINTS;
}

/// The kernel gathering phase filters of an element: f32, or 2 bytes (bf16 and f16
/// alike, moved as they are).
pub trait PhaseKernels: Sized {
    /// Gathers a phase's weights, one thread per element.
    const FILTERS: crate::launch::Kernel<PhaseFiltersArgs<Self>>;
}

/// The interleaving kernel of an element, as [`PhaseKernels`].
pub trait InterleaveKernel: Sized {
    /// Writes dx from the phases, one thread per element, or per 4 channels of a pixel
    /// or 4 columns of a row ([`interleaved_per_thread`]).
    const INTERLEAVE: crate::launch::Kernel<InterleaveArgs<Self>>;
}

/// The launch gathering phase `q`'s weights (its forward problem `phase`) from `w` into
/// `filters`, both in `layout` (f32 rounded to TF32 where the phases run on the tensor
/// cores).
pub const fn phase_filters<T: PhaseKernels>(
    problem: &ConvProblem,
    plan: &PhasePlan,
    q: u32,
    phase: &ConvProblem,
    layout: ConvLayout,
    w: DevicePtr<T>,
    filters: DevicePtrMut<T>,
) -> Launch<PhaseFiltersArgs<T>> {
    let (row, column) = plan.axes(q);
    let args = PhaseFiltersArgs {
        w,
        filters,
        problem: *problem,
        phase: *phase,
        row,
        column,
        channels_last: matches!(layout, ConvLayout::Nhwc) as u32,
        round: plan.tensor_cores,
    };
    Launch::new(
        T::FILTERS,
        LaunchGeometry::per_item(phase.weight_count(), PHASE_THREADS),
        args,
    )
}

/// Elements of dx each thread of the interleaving writes: 4 channels of a pixel in NHWC
/// with channels in multiples of 4 (one place, one phase, copies of 4 elements: the
/// slots hold whole pixels too), 4 columns of a row in NCHW with rows in multiples of 4
/// (one place and row phase, a store of 4), else 1.
pub const fn interleaved_per_thread(problem: &ConvProblem, plan: &PhasePlan) -> u32 {
    let whole = if plan.channels_last == 1 {
        problem.in_channels
    } else {
        problem.width
    };
    if whole.is_multiple_of(4) { 4 } else { 1 }
}

/// The launch writing `problem`'s dx from the phases' gradients.
pub const fn interleave<T: InterleaveKernel>(
    problem: &ConvProblem,
    plan: &PhasePlan,
    phases: DevicePtr<T>,
    dx: DevicePtrMut<T>,
) -> Launch<InterleaveArgs<T>> {
    let count = problem.input_count();
    let args = InterleaveArgs {
        phases,
        dx,
        problem: *problem,
        plan: *plan,
    };
    let threads = count.div_ceil(interleaved_per_thread(problem, plan) as u64);
    Launch::new(
        T::INTERLEAVE,
        LaunchGeometry::per_item(threads, PHASE_THREADS),
        args,
    )
}

#[cfg(target_arch = "nvptx64")]
pub(crate) mod kernel {
    use super::*;
    use crate::conv::problem::{element_index, element_place};
    use crate::device::{block_idx_x, load_global_v4, store_global_v4, thread_idx_x, to_tf32};

    /// An element the phases move: f32, or a 16-bit float's bits.
    pub trait PhaseElement: Copy + Default {
        /// The value rounded to TF32 (f32); 16-bit bits as they are.
        fn tf32(self) -> Self;
        /// The four elements at `at` with one access.
        ///
        /// # Safety
        /// `at..at + 4` are readable global elements, `at` aligned to 4 of them.
        unsafe fn load4(at: *const Self) -> [Self; 4];
        /// Writes four elements to `at` with one access.
        ///
        /// # Safety
        /// `at..at + 4` are writable global elements, `at` aligned to 4 of them.
        unsafe fn store4(at: *mut Self, values: [Self; 4]);
    }

    impl PhaseElement for f32 {
        #[inline(always)]
        fn tf32(self) -> Self {
            f32::from_bits(to_tf32(self))
        }

        #[inline(always)]
        unsafe fn load4(at: *const Self) -> [Self; 4] {
            // SAFETY: the caller's contract: 16 bytes, 16-byte aligned.
            unsafe { load_global_v4(at.cast()) }.map(f32::from_bits)
        }

        #[inline(always)]
        unsafe fn store4(at: *mut Self, values: [Self; 4]) {
            // SAFETY: the caller's contract: 16 bytes, 16-byte aligned.
            unsafe { store_global_v4(at.cast(), values.map(f32::to_bits)) }
        }
    }

    impl PhaseElement for u16 {
        #[inline(always)]
        fn tf32(self) -> Self {
            self
        }

        #[inline(always)]
        unsafe fn load4(at: *const Self) -> [Self; 4] {
            // SAFETY: the caller's contract: 8 bytes, 8-byte aligned.
            let word = unsafe { *at.cast::<u64>() };
            [0, 16, 32, 48].map(|shift| (word >> shift) as u16)
        }

        #[inline(always)]
        unsafe fn store4(at: *mut Self, values: [Self; 4]) {
            let word = values.iter().rev().fold(0u64, |word, &v| word << 16 | v as u64);
            // SAFETY: the caller's contract: 8 bytes, 8-byte aligned.
            unsafe { *at.cast::<u64>() = word };
        }
    }

    /// `filters[ci][co][t][u] = w[g co][ci][r][s]` (f32 rounded to TF32 when asked), the
    /// taps reversed: `r =
    /// first_h + sh (T_h - 1 - t)`, `s = first_w + sw (T_w - 1 - u)` (NCHW; NHWC keeps
    /// the taps before the channels), ci a channel of x in group g.
    ///
    /// # Safety
    /// `w` holds the problem's weights, `filters` the phase's, in the layout
    /// `channels_last` names; the grid covers the phase's weights, `PHASE_THREADS` a
    /// block.
    #[inline(always)]
    pub unsafe fn phase_filters<T: PhaseElement>(args: PhaseFiltersArgs<T>) {
        let (p, phase) = (&args.problem, &args.phase);
        let j = block_idx_x() as u64 * PHASE_THREADS as u64 + thread_idx_x() as u64;
        if j >= phase.weight_count() {
            return;
        }
        let (taps_h, taps_w) = (args.row.taps as u64, args.column.taps as u64);
        let (in_group, out_group) = (p.in_per_group() as u64, p.out_per_group() as u64);
        // (x's channel, dy's channel in its group, tap row, tap column) of the phase.
        let (ci, co, t, u) = if args.channels_last == 1 {
            (
                j / (taps_h * taps_w * out_group),
                j % out_group,
                j / (taps_w * out_group) % taps_h,
                j / out_group % taps_w,
            )
        } else {
            (
                j / (out_group * taps_h * taps_w),
                j / (taps_h * taps_w) % out_group,
                j / taps_w % taps_h,
                j % taps_w,
            )
        };
        let (group, c) = (ci / in_group, ci % in_group);
        let o = group * out_group + co;
        let r = (args.row.first + p.stride_h * (args.row.taps - 1)) as u64 - p.stride_h as u64 * t;
        let s = (args.column.first + p.stride_w * (args.column.taps - 1)) as u64 - p.stride_w as u64 * u;
        let (kh, kw) = (p.kernel_h as u64, p.kernel_w as u64);
        let i = if args.channels_last == 1 {
            ((o * kh + r) * kw + s) * in_group + c
        } else {
            ((o * in_group + c) * kh + r) * kw + s
        };
        // SAFETY: (o, c, r, s) is a weight of the problem, j one of the phase's.
        unsafe {
            let value = *args.w.as_ptr().add(i as usize);
            let value = if args.round == 1 { value.tf32() } else { value };
            *args.filters.as_mut_ptr().add(j as usize) = value;
        }
    }

    /// `dx[n][c][sh i + qh][sw j + qw]` = phase (qh, qw)'s gradient at (i + skip_h, j
    /// + skip_w), or 0 where the phase has no taps (in either layout).
    ///
    /// # Safety
    /// `phases` holds the phases' gradients as the plan lays them out, dx the problem's
    /// input gradient (fewer than 2^31 elements), in the plan's layout; the grid covers
    /// dx, `PHASE_THREADS` a block.
    #[inline(always)]
    pub unsafe fn interleave<T: PhaseElement>(args: InterleaveArgs<T>) {
        let (p, plan) = (&args.problem, &args.plan);
        let per_thread = interleaved_per_thread(p, plan);
        // Every index of dx below 2^31: in 32 bits, divided by multiplies.
        let i = (block_idx_x() * PHASE_THREADS + thread_idx_x()) * per_thread;
        if i >= p.batch * p.in_channels * p.pixels() {
            return;
        }
        let channels_last = plan.channels_last == 1;
        let [n, c, y, x] = element_place(i, channels_last, plan.div_channels, p.div_pixels, p.div_width);
        let (i_h, qh) = p.div_stride_h.divmod(y);
        let row = pick(&plan.rows, qh);
        // The phases' element of dx's (n, c, y, x), at column x: none where the phase
        // has no taps.
        let source = |x: u32| {
            let (i_w, qw) = p.div_stride_w.divmod(x);
            let column = pick(&plan.columns, qw);
            if row.taps == 0 || column.taps == 0 {
                return None;
            }
            let (y, x) = (i_h + row.skip, i_w + column.skip);
            let at = element_index(
                [n, c, y, x],
                channels_last,
                [p.in_channels, row.extent, column.extent],
            );
            let slot = (qh * plan.stride_w + qw) as u64 * plan.slot_len;
            Some(args.phases.as_ptr().wrapping_add((slot + at) as usize))
        };
        let dx = args.dx.as_mut_ptr().wrapping_add(i as usize);
        // SAFETY: each source lies inside its phase's output, in its slot; dx's
        // elements i.. are the thread's.
        unsafe {
            // Zero where no phase has taps: 0.0, or a 16-bit float's zero bits.
            let zero = T::default();
            match per_thread {
                1 => *dx = source(x).map_or(zero, |from| *from),
                // Channels c..c + 4 of the pixel, aligned to 4 elements on both sides
                // (channels, slots and allocations in multiples of 4).
                _ if channels_last => T::store4(dx, source(x).map_or([zero; 4], |from| T::load4(from))),
                // Columns x..x + 4 of the row (rows in multiples of 4), each from its
                // column phase.
                _ => {
                    let value = |k: u32| source(x + k).map_or(zero, |from| *from);
                    T::store4(dx, [value(0), value(1), value(2), value(3)]);
                }
            }
        }
    }

    /// `phases[q]` by selects over constant indices: an index the compiler cannot
    /// resolve copies the kernel's arguments to local memory.
    #[inline(always)]
    fn pick(phases: &[AxisPhase; MAX_PHASE_STRIDE as usize], q: u32) -> AxisPhase {
        let mut picked = phases[0];
        for (i, phase) in phases.iter().enumerate().skip(1) {
            if i as u32 == q {
                picked = *phase;
            }
        }
        picked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every (input position, tap) pair of an axis whose dy position exists is summed
    /// by exactly one phase, at the dy position the convolution reads.
    #[test]
    fn phases_take_every_tap_once_at_its_output() {
        for stride in 2..=MAX_PHASE_STRIDE {
            for kernel in 1..=7 {
                for pad in 0..=kernel + 1 {
                    for input in 1..=13u32 {
                        let span = input + 2 * pad;
                        if span < kernel {
                            continue;
                        }
                        let output = (span - kernel) / stride + 1;
                        for position in 0..input {
                            let phase = AxisPhase::new(position % stride, input, output, kernel, stride, pad);
                            let i = position / stride;
                            assert!(i < phase.positions);
                            // The taps the phase sums for this position, at the dy
                            // positions its convolution reads.
                            let mut taken = [None; 8];
                            if phase.taps > 0 {
                                assert!(i + phase.skip < phase.extent);
                                for t in 0..phase.taps {
                                    let r = phase.first + stride * (phase.taps - 1 - t);
                                    let at = (i + phase.skip + t) as i64 - phase.padding as i64;
                                    if (0..output as i64).contains(&at) {
                                        taken[r as usize] = Some(at);
                                    }
                                }
                            }
                            // The taps the convolution's gradient sums: dy[o] by tap r
                            // where s o - pad + r = position.
                            for r in 0..kernel {
                                let shifted = (position + pad) as i64 - r as i64;
                                let wanted = (shifted >= 0 && shifted % stride as i64 == 0)
                                    .then_some(shifted / stride as i64)
                                    .filter(|&o| o < output as i64);
                                assert_eq!(
                                    taken[r as usize], wanted,
                                    "stride {stride}, kernel {kernel}, pad {pad}, input {input}, position {position}, tap {r}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn strided_undilated_problems_run_by_phases() {
        let problem = |stride, padding, dilation| {
            ConvProblem::new(&ConvShape {
                input: [2, 6, 9, 11],
                weight: [4, 3, 3, 3],
                stride,
                padding,
                dilation,
                groups: 2,
            })
            .unwrap()
        };
        let nchw = ConvLayout::Nchw;
        let strided = problem([2, 4], [1, 0], [1, 1]);
        let plan = PhasePlan::of(&strided, nchw, true).expect("phases");
        assert_eq!((plan.phases(), plan.stride_h, plan.stride_w), (8, 2, 4));
        // Along w, phase 3 has no taps: (3 + 0) mod 4 is past the window.
        assert_eq!((plan.columns[3].taps, plan.columns[0].taps), (0, 1));
        assert!(plan.phase(&strided, 3).is_none());
        let phase = plan.phase(&strided, 0).expect("taps");
        assert_eq!((phase.in_channels, phase.out_channels, phase.groups), (4, 6, 2));
        // Stride 1, dilated, or past the largest stride: no phases.
        for (stride, dilation) in [([1, 1], [1, 1]), ([2, 4], [2, 1]), ([5, 4], [1, 1])] {
            for tensor_cores in [false, true] {
                let problem = problem(stride, [1, 1], dilation);
                assert!(PhasePlan::of(&problem, nchw, tensor_cores).is_none());
            }
        }
        // Every phase with taps: by phases in FP32 only.
        let every_phase = problem([2, 3], [1, 1], [1, 1]);
        assert!(PhasePlan::of(&every_phase, nchw, true).is_none());
        let plan = PhasePlan::of(&every_phase, nchw, false).expect("FP32 phases");
        assert!((0..plan.phases()).all(|q| plan.phase(&every_phase, q).is_some()));
    }
}
