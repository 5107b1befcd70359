//! Direct convolution kernels, a loop over the window per output element, for the
//! problems an implicit GEMM tiles badly: the passes of depthwise convolutions (one
//! input channel per group; `out / in` output channels read each input channel) that
//! the stencil (`stencil.rs`) does not take, whose
//! GEMMs have a K of `taps` and are memory-bound, and the input gradient of any
//! convolution with at most `DIRECT_MAX_IN_GROUP` input channels per group (a stem's
//! 3), whose GEMM has an N that small. Exact FP32 in every precision (the tensor cores'
//! tiles would be as empty), each sum in a fixed order.
//!
//! The forward pass takes one image per grid z and a thread per output element, flat
//! in the output's layout, along x. The input gradient takes a thread per pixel, a
//! group per grid y, and sums the group's input channels at once (each dy read once
//! for them) over the taps that reach its pixel and the group's output channels. Its
//! pixels are ordered by phase (the pixel's remainders by the stride), so that the
//! threads of a warp share their taps, and its block stages the group's weights in
//! shared memory, a chunk of output channels at a time, 16 bytes per output channel
//! and tap (the input channels zero-padded to 4) for one load each. The
//! weight gradient takes a block per tap
//! and output channel (NCHW: its threads along the pixels) or per tap and 32 output
//! channels (NHWC: a warp along the channels, 8 warps along the pixels), and per part
//! of the outputs (grid y) when that many blocks would not fill the GPU; it sums in
//! FP64, adds the threads' sums in a fixed order, and the parts' partials in order in
//! a second pass.

use super::reduce::{self, SplitSumArgs};
use super::staged_input_grad;
use super::{ConvEpilogue, ConvLayout, ConvProblem, FastDiv};
use crate::launch::{
    DevicePtr, DevicePtrMut, Launch, LaunchGeometry, ScratchLayout, THREADS_PER_SM, kernel_args,
};

/// Threads per block of every direct kernel.
pub const DEPTHWISE_THREADS: u32 = 256;
/// Output channels per block of the NHWC weight gradient: one per lane.
pub const WGRAD_CHANNELS: u32 = 32;
/// Bytes of shared memory of the weight gradient: an FP64 sum per thread.
const WGRAD_SHARED_BYTES: u32 = DEPTHWISE_THREADS * 8;
/// Blocks per SM of the input gradient: its sums and addresses take up to 64
/// registers a thread.
const INPUT_GRAD_BLOCKS_PER_SM: u32 = 4;
/// Most bytes of the input gradient's staged weights: 16 per output channel and tap.
const INPUT_GRAD_SHARED_BYTES: u32 = 40 * 1024;
/// Input channels per group up to which the input gradient takes the direct kernel.
pub const DIRECT_MAX_IN_GROUP: u32 = 4;
/// Outputs per thread below which the weight gradient splits no further.
const WGRAD_MIN_OUTPUTS_PER_THREAD: u64 = 16;

/// How the direct kernels run a problem.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectPlan {
    /// Divides a flat NHWC index by the output channels (pixel, channel).
    pub div_out_channels: FastDiv,
    /// Divides an output channel by the channel multiplier (`out / in`): its input
    /// channel.
    pub div_multiplier: FastDiv,
    /// Parts of the outputs the weight gradient splits its sums into (grid y).
    pub split: u32,
    /// Whether the NHWC input gradient reads dy 16 bytes at a time (output channels per
    /// group a multiple of 4), as 1 or 0.
    pub dy_vector: u32,
    /// The input gradient's pixels of a phase (`ceil(h / stride_h) x ceil(w /
    /// stride_w)`, some past the edges), and their columns.
    pub div_phase_pixels: FastDiv,
    pub div_phase_columns: FastDiv,
    /// Output channels of the input gradient's staged chunks of weights.
    pub input_grad_chunk: u32,
    /// Groups of an input gradient's block (a power of two, the threads' fastest
    /// index: in NHWC a warp's loads of dy then span its groups' channels).
    pub input_grad_groups: u32,
    /// Whether the input gradient takes the staged kernel (`staged_input_grad.rs`),
    /// as 1 or 0.
    pub staged_input_grad: u32,
    /// Whether the tensors are channels last (NHWC), as 1 or 0 (NCHW).
    pub channels_last: u32,
}

impl DirectPlan {
    /// The plan of every pass of `problem` over tensors in `layout`, when it is
    /// depthwise (one input channel per group) and fits the grid (as `fits` says).
    pub const fn of_depthwise(
        problem: &ConvProblem,
        layout: ConvLayout,
        multiprocessors: u32,
    ) -> Option<Self> {
        if problem.in_per_group() != 1 {
            return None;
        }
        Self::fits(problem, layout, multiprocessors)
    }

    /// The plan of the input gradient of `problem` over tensors in `layout`, when it
    /// has at most `DIRECT_MAX_IN_GROUP` input channels per group and fits the grid.
    /// With one group it reads NCHW tensors in either layout: in NHWC the threads'
    /// lanes would span pixels, reading dy a channel row apart.
    pub const fn of_input_grad(
        problem: &ConvProblem,
        layout: ConvLayout,
        multiprocessors: u32,
    ) -> Option<Self> {
        if problem.in_per_group() > DIRECT_MAX_IN_GROUP {
            return None;
        }
        let layout = if problem.groups == 1 {
            ConvLayout::Nchw
        } else {
            layout
        };
        Self::fits(problem, layout, multiprocessors)
    }

    /// The plan, when the problem fits the grid: at most 65535 images (grid z) and
    /// groups (the input gradient's grid y), fewer than 2^31 elements of x and of y per
    /// image, the weights of an output channel in the input gradient's staged chunk.
    /// The weight gradient splits its outputs until its blocks fill the
    /// `multiprocessors`.
    const fn fits(problem: &ConvProblem, layout: ConvLayout, multiprocessors: u32) -> Option<Self> {
        let p = problem;
        let out_image = p.out_channels as u64 * p.out_pixels() as u64;
        let in_image = p.in_channels as u64 * p.pixels() as u64;
        if p.batch > 65535
            || p.groups > 65535
            || out_image >= 1 << 31
            || in_image >= 1 << 31
            || p.taps() > INPUT_GRAD_SHARED_BYTES / 16
        {
            return None;
        }
        let channels_last = matches!(layout, ConvLayout::Nhwc);
        let blocks = weight_grad_channel_blocks(p, channels_last) as u64 * p.taps() as u64;
        let wanted = multiprocessors as u64 * THREADS_PER_SM / DEPTHWISE_THREADS as u64;
        let rows = if channels_last {
            DEPTHWISE_THREADS / WGRAD_CHANNELS
        } else {
            DEPTHWISE_THREADS
        };
        let outputs = p.batch as u64 * p.out_pixels() as u64;
        let most = outputs / (rows as u64 * WGRAD_MIN_OUTPUTS_PER_THREAD);
        let dy_vector = channels_last && p.out_per_group().is_multiple_of(4);
        let groups = if channels_last { input_grad_groups(p) } else { 1 };
        let phase_columns = p.width.div_ceil(p.stride_w);
        Some(Self {
            div_out_channels: FastDiv::new(p.out_channels),
            div_multiplier: FastDiv::new(p.out_per_group()),
            split: reduce::grid_split(wanted, blocks, most),
            dy_vector: dy_vector as u32,
            div_phase_pixels: FastDiv::new(p.height.div_ceil(p.stride_h) * phase_columns),
            div_phase_columns: FastDiv::new(phase_columns),
            input_grad_chunk: input_grad_chunk(p, groups, dy_vector),
            input_grad_groups: groups,
            staged_input_grad: (!channels_last && staged_input_grad::takes(p)) as u32,
            channels_last: channels_last as u32,
        })
    }

    /// The layout of the tensors.
    pub const fn layout(&self) -> ConvLayout {
        ConvLayout::of_channels_last(self.channels_last)
    }

    /// `y = epilogue(conv(x, w))`; call with at least one image.
    pub const fn forward(
        &self,
        problem: &ConvProblem,
        x: DevicePtr<f32>,
        w: DevicePtr<f32>,
        epilogue: ConvEpilogue,
        y: DevicePtrMut<f32>,
    ) -> Launch<DepthwiseForwardArgs> {
        let per_image = problem.out_channels as u64 * problem.out_pixels() as u64;
        let args = DepthwiseForwardArgs {
            x,
            w,
            epilogue,
            y,
            problem: *problem,
            plan: *self,
        };
        let kernel = if self.channels_last == 1 {
            CONV_DEPTHWISE_FORWARD_NHWC
        } else {
            CONV_DEPTHWISE_FORWARD_NCHW
        };
        Launch::new(kernel, per_image_geometry(per_image, problem.batch), args)
    }

    /// `dx` from `dy` and `w`; call with at least one image.
    pub const fn input_grad(
        &self,
        problem: &ConvProblem,
        dy: DevicePtr<f32>,
        w: DevicePtr<f32>,
        dx: DevicePtrMut<f32>,
    ) -> Launch<DirectInputGradArgs> {
        let args = DirectInputGradArgs {
            dy,
            w,
            dx,
            problem: *problem,
            plan: *self,
        };
        if self.staged_input_grad == 1 {
            let geometry = staged_input_grad::geometry(problem);
            let kernel = if problem.in_channels == 3 {
                CONV_DIRECT_INPUT_GRAD_STAGED_3
            } else {
                CONV_DIRECT_INPUT_GRAD_STAGED_4
            };
            return Launch::new(kernel, geometry, args);
        }
        let p = problem;
        let phases = p.stride_h as u64 * p.stride_w as u64;
        let pixels = phases * self.div_phase_pixels.divisor as u64;
        let groups = self.input_grad_groups;
        let geometry = LaunchGeometry {
            grid: [
                pixels.div_ceil((DEPTHWISE_THREADS / groups) as u64),
                p.groups.div_ceil(groups) as u64,
                p.batch as u64,
            ],
            threads: DEPTHWISE_THREADS,
            shared_bytes: groups * self.input_grad_chunk * p.taps() * 16,
        };
        let kernel = if self.channels_last == 1 {
            CONV_DIRECT_INPUT_GRAD_NHWC
        } else {
            CONV_DIRECT_INPUT_GRAD_NCHW
        };
        Launch::new(kernel, geometry, args)
    }

    /// The scratch of the weight gradient: a partial gradient per part of the split.
    pub const fn weight_grad_scratch(&self, problem: &ConvProblem) -> ScratchLayout {
        reduce::partials_scratch(self.split, weights(problem))
    }

    /// The weight-gradient launches: `dw` from `x` and `dy`, or with a split, the
    /// partials into `partials` ([`Self::weight_grad_scratch`]) and then their sum into
    /// `dw`. Call with at least one image.
    pub fn weight_grad(
        &self,
        problem: &ConvProblem,
        x: DevicePtr<f32>,
        dy: DevicePtr<f32>,
        partials: DevicePtrMut<u8>,
        dw: DevicePtrMut<f32>,
    ) -> (Launch<DepthwiseWeightGradArgs>, Option<Launch<SplitSumArgs>>) {
        let channels_last = self.channels_last == 1;
        let kernel = if channels_last {
            CONV_DEPTHWISE_WEIGHT_GRAD_NHWC
        } else {
            CONV_DEPTHWISE_WEIGHT_GRAD_NCHW
        };
        let blocks = weight_grad_channel_blocks(problem, channels_last) as u64 * problem.taps() as u64;
        let geometry = LaunchGeometry {
            grid: [blocks, self.split as u64, 1],
            threads: DEPTHWISE_THREADS,
            shared_bytes: WGRAD_SHARED_BYTES,
        };
        let (out, sum) = reduce::split_outputs(self.split, weights(problem), partials, dw);
        let args = DepthwiseWeightGradArgs {
            x,
            dy,
            out,
            problem: *problem,
            plan: *self,
        };
        (Launch::new(kernel, geometry, args), sum)
    }
}

/// Groups per block of the NHWC input gradient: up to a warp's, while a chunk of one
/// output channel per group fits.
const fn input_grad_groups(problem: &ConvProblem) -> u32 {
    let mut groups = 32;
    while groups > 1
        && (groups / 2 >= problem.groups || groups * problem.taps() * 16 > INPUT_GRAD_SHARED_BYTES)
    {
        groups /= 2;
    }
    groups
}

/// Output channels per staged chunk of the input gradient's weights for `groups`
/// groups a block: chunks as even as `INPUT_GRAD_SHARED_BYTES` allows, in multiples of
/// 4 where dy is read 16 bytes at a time and 4 fit.
const fn input_grad_chunk(problem: &ConvProblem, groups: u32, dy_vector: bool) -> u32 {
    let most = INPUT_GRAD_SHARED_BYTES / 16 / problem.taps() / groups;
    let unit = if dy_vector && most >= 4 { 4 } else { 1 };
    let most_units = if most / unit < 1 { 1 } else { most / unit };
    let units = problem.out_per_group().div_ceil(unit);
    units.div_ceil(units.div_ceil(most_units)) * unit
}

/// Elements of the weights (one input channel per group).
const fn weights(problem: &ConvProblem) -> u64 {
    problem.out_channels as u64 * problem.taps() as u64
}

/// The weight gradient's blocks per tap: one per output channel (NCHW) or per
/// `WGRAD_CHANNELS` (NHWC).
const fn weight_grad_channel_blocks(problem: &ConvProblem, channels_last: bool) -> u32 {
    if channels_last {
        problem.out_channels.div_ceil(WGRAD_CHANNELS)
    } else {
        problem.out_channels
    }
}

/// A thread per element of an image along x, an image per z.
const fn per_image_geometry(per_image: u64, batch: u32) -> LaunchGeometry {
    LaunchGeometry {
        grid: [per_image.div_ceil(DEPTHWISE_THREADS as u64), 1, batch as u64],
        threads: DEPTHWISE_THREADS,
        shared_bytes: 0,
    }
}

kernel_args! {
    /// The depthwise forward pass's arguments: `y = epilogue(conv(x, w))`.
    pub struct DepthwiseForwardArgs {
        pub x: DevicePtr<f32>,
        pub w: DevicePtr<f32>,
        pub epilogue: ConvEpilogue,
        pub y: DevicePtrMut<f32>,
        pub problem: ConvProblem,
        pub plan: DirectPlan,
    }
    /// The depthwise forward pass over NCHW tensors.
    pub const CONV_DEPTHWISE_FORWARD_NCHW = "conv_depthwise_forward_nchw_f32" =>
        kernel::forward::<false>, bounds(DEPTHWISE_THREADS, 8);
    /// The depthwise forward pass over NHWC tensors.
    pub const CONV_DEPTHWISE_FORWARD_NHWC = "conv_depthwise_forward_nhwc_f32" =>
        kernel::forward::<true>, bounds(DEPTHWISE_THREADS, 8);
    entry points in FORWARD_ENTRY_POINTS;
}

kernel_args! {
    /// The direct input gradient's arguments: `dx` from `dy` and `w`.
    pub struct DirectInputGradArgs {
        pub dy: DevicePtr<f32>,
        pub w: DevicePtr<f32>,
        pub dx: DevicePtrMut<f32>,
        pub problem: ConvProblem,
        pub plan: DirectPlan,
    }
    /// The direct input gradient over NCHW tensors.
    pub const CONV_DIRECT_INPUT_GRAD_NCHW = "conv_direct_input_grad_nchw_f32" =>
        kernel::input_grad::<false>, bounds(DEPTHWISE_THREADS, INPUT_GRAD_BLOCKS_PER_SM);
    /// The direct input gradient over NHWC tensors.
    pub const CONV_DIRECT_INPUT_GRAD_NHWC = "conv_direct_input_grad_nhwc_f32" =>
        kernel::input_grad::<true>, bounds(DEPTHWISE_THREADS, INPUT_GRAD_BLOCKS_PER_SM);
    /// The input gradient of one group of 3 input channels (a stem's), and of 1, 2 or
    /// 4, over staged dy tiles, NCHW.
    pub const CONV_DIRECT_INPUT_GRAD_STAGED_3 = "conv_direct_input_grad_staged3_f32" =>
        staged_input_grad::kernel::input_grad::<3>, bounds(DEPTHWISE_THREADS, INPUT_GRAD_BLOCKS_PER_SM);
    pub const CONV_DIRECT_INPUT_GRAD_STAGED_4 = "conv_direct_input_grad_staged4_f32" =>
        staged_input_grad::kernel::input_grad::<4>, bounds(DEPTHWISE_THREADS, INPUT_GRAD_BLOCKS_PER_SM);
    entry points in INPUT_GRAD_ENTRY_POINTS;
}

kernel_args! {
    /// The depthwise weight gradient's arguments: `dw` from `x` and `dy`, or with a
    /// split, a partial per part into `out` (`split` gradients one after another).
    pub struct DepthwiseWeightGradArgs {
        pub x: DevicePtr<f32>,
        pub dy: DevicePtr<f32>,
        pub out: DevicePtrMut<f32>,
        pub problem: ConvProblem,
        pub plan: DirectPlan,
    }
    /// The depthwise weight gradient over NCHW tensors.
    pub const CONV_DEPTHWISE_WEIGHT_GRAD_NCHW = "conv_depthwise_weight_grad_nchw_f32" =>
        kernel::weight_grad::<false>, bounds(DEPTHWISE_THREADS, 8);
    /// The depthwise weight gradient over NHWC tensors.
    pub const CONV_DEPTHWISE_WEIGHT_GRAD_NHWC = "conv_depthwise_weight_grad_nhwc_f32" =>
        kernel::weight_grad::<true>, bounds(DEPTHWISE_THREADS, 8);
    entry points in WEIGHT_GRAD_ENTRY_POINTS;
}

#[cfg(target_arch = "nvptx64")]
mod kernel {
    use super::*;
    use crate::device::{
        SharedCarver, block_idx_x, block_idx_y, block_idx_z, fma_f32, load_global_nc_v4, load_shared_v4_f32,
        shared_base, store_shared_f32, sync_threads, thread_idx_x,
    };
    use crate::launch::chunk;

    /// A coordinate of the window along one axis, `out * stride + tap * dilation -
    /// padding`, or `None` outside `[0, extent)` (the subtraction wraps below zero; the
    /// index limits keep every sum under 2^29).
    #[inline(always)]
    fn input_coordinate(
        out: u32,
        stride: u32,
        tap: u32,
        dilation: u32,
        padding: u32,
        extent: u32,
    ) -> Option<u32> {
        let at = (out * stride + tap * dilation).wrapping_sub(padding);
        if at < extent { Some(at) } else { None }
    }

    /// The output coordinate that reads input `at` through `tap`, `(at + padding - tap
    /// * dilation) / stride`, when it is whole and inside `[0, extent)`.
    #[inline(always)]
    fn output_coordinate(
        at: u32,
        tap: u32,
        dilation: u32,
        padding: u32,
        stride: FastDiv,
        extent: u32,
    ) -> Option<u32> {
        let offset = (at + padding).wrapping_sub(tap * dilation);
        // Below zero the subtraction wraps past 2^31, where the division is not exact.
        if offset >= 1 << 30 {
            return None;
        }
        let (out, remainder) = stride.divmod(offset);
        if remainder == 0 && out < extent {
            Some(out)
        } else {
            None
        }
    }

    /// `(channel, pixel)` of a flat index into an image of `channels` planes of
    /// `pixels` (NCHW) or `pixels` rows of `channels` (NHWC).
    #[inline(always)]
    fn channel_and_pixel<const CHANNELS_LAST: bool>(
        i: u32,
        channels: FastDiv,
        pixels: FastDiv,
    ) -> (u32, u32) {
        if CHANNELS_LAST {
            let (pixel, channel) = channels.divmod(i);
            (channel, pixel)
        } else {
            pixels.divmod(i)
        }
    }

    /// Element `(channel, pixel)` of an image of `channels x pixels`, flat in its layout.
    #[inline(always)]
    fn image_index<const CHANNELS_LAST: bool>(channel: u32, pixel: u32, channels: u32, pixels: u32) -> usize {
        if CHANNELS_LAST {
            pixel as usize * channels as usize + channel as usize
        } else {
            channel as usize * pixels as usize + pixel as usize
        }
    }

    /// One output per thread: the window of its input channel times its filter, plus
    /// the epilogue.
    ///
    /// # Safety
    /// x, w, y (and the epilogue's bias and residual) hold the problem's tensors in the
    /// plan's layout; the grid is [`per_image_geometry`] of y's image, `batch` images.
    #[inline(always)]
    pub unsafe fn forward<const CHANNELS_LAST: bool>(args: DepthwiseForwardArgs) {
        let (p, plan) = (args.problem, args.plan);
        let per_image = p.out_channels * p.out_pixels();
        let i = block_idx_x() * DEPTHWISE_THREADS + thread_idx_x();
        if i >= per_image {
            return;
        }
        let image = block_idx_z() as usize;
        let (o, pixel) = channel_and_pixel::<CHANNELS_LAST>(i, plan.div_out_channels, p.div_out_pixels);
        let (oh, ow) = p.div_out_w.divmod(pixel);
        let channel = plan.div_multiplier.divmod(o).0;
        let in_image = p.in_channels as usize * p.pixels() as usize;
        // SAFETY: the image's offset lies inside x.
        let x = unsafe { args.x.as_ptr().add(image * in_image) };
        // SAFETY: o < out_channels, whose filter holds `taps` weights.
        let w = unsafe { args.w.as_ptr().add((o * p.taps()) as usize) };
        let mut sum = 0.0f32;
        for r in 0..p.kernel_h {
            let Some(ih) = input_coordinate(oh, p.stride_h, r, p.dilation_h, p.pad_h, p.height) else {
                continue;
            };
            for s in 0..p.kernel_w {
                let Some(iw) = input_coordinate(ow, p.stride_w, s, p.dilation_w, p.pad_w, p.width) else {
                    continue;
                };
                let at = image_index::<CHANNELS_LAST>(channel, ih * p.width + iw, p.in_channels, p.pixels());
                // SAFETY: (channel, ih, iw) is inside the image, (r, s) inside the filter.
                sum = fma_f32(
                    unsafe { *x.add(at) },
                    unsafe { *w.add((r * p.kernel_w + s) as usize) },
                    sum,
                );
            }
        }
        let bias = args.epilogue.bias.as_ptr();
        if !bias.is_null() {
            // SAFETY: the bias holds out_channels values.
            sum += unsafe { *bias.add(o as usize) };
        }
        let at = image * per_image as usize + i as usize;
        // SAFETY: `at` is an element of y (and of the residual).
        unsafe { *args.y.as_mut_ptr().add(at) = args.epilogue.apply(sum, at) };
    }

    /// The input gradient at one pixel for one group's input channels: over the taps
    /// that reach the pixel, and the group's output channels, dy times the weights.
    /// A block takes `input_grad_groups` groups (its threads' fastest index) by pixels
    /// `j`, pixel `j % phase_pixels` of phase `j / phase_pixels`: the taps that reach a
    /// pixel depend only on its phase.
    ///
    /// # Safety
    /// dy, w and dx hold the problem's tensors in the plan's layout, at most
    /// `DIRECT_MAX_IN_GROUP` input channels per group; the launch is
    /// [`DirectPlan::input_grad`]'s, with its shared memory.
    #[inline(always)]
    pub unsafe fn input_grad<const CHANNELS_LAST: bool>(args: DirectInputGradArgs) {
        const MAX: usize = DIRECT_MAX_IN_GROUP as usize;
        const _: () = assert!(MAX == 4);
        let (p, plan) = (args.problem, args.plan);
        let block_groups = plan.input_grad_groups;
        let (t, image) = (thread_idx_x(), block_idx_z() as usize);
        let (j, local_group) = (
            block_idx_x() * (DEPTHWISE_THREADS / block_groups) + t / block_groups,
            t % block_groups,
        );
        let group = block_idx_y() * block_groups + local_group;
        let (phase, at) = plan.div_phase_pixels.divmod(j);
        let (row, column) = plan.div_phase_columns.divmod(at);
        let (phase_h, phase_w) = p.div_stride_w.divmod(phase);
        let (ih, iw) = (row * p.stride_h + phase_h, column * p.stride_w + phase_w);
        let active = phase < p.stride_h * p.stride_w && ih < p.height && iw < p.width && group < p.groups;
        let (in_group, out_group) = (p.in_per_group(), p.out_per_group());
        let out_image = p.out_channels as usize * p.out_pixels() as usize;
        // SAFETY: the image's offset lies inside dy.
        let dy = unsafe { args.dy.as_ptr().add(image * out_image) };
        // Steps between consecutive output channels in dy.
        let dy_step = if CHANNELS_LAST { 1 } else { p.out_pixels() as usize };
        let vector = CHANNELS_LAST && plan.dy_vector == 1 && plan.input_grad_chunk.is_multiple_of(4);
        let chunk_bytes = plan.input_grad_chunk * p.taps() * 16;
        let weights = shared_base() + local_group * chunk_bytes;
        let mut sums = [0.0f32; MAX];
        let mut first = 0;
        while first < out_group {
            let count = plan.input_grad_chunk.min(out_group - first);
            // SAFETY: every thread of the block stages and waits, the same chunks.
            unsafe {
                sync_threads();
                stage_weights::<CHANNELS_LAST>(&args, first, count);
                sync_threads();
            }
            for r in 0..p.kernel_h * active as u32 {
                let Some(oh) = output_coordinate(ih, r, p.dilation_h, p.pad_h, p.div_stride_h, p.out_h)
                else {
                    continue;
                };
                for s in 0..p.kernel_w {
                    let Some(ow) = output_coordinate(iw, s, p.dilation_w, p.pad_w, p.div_stride_w, p.out_w)
                    else {
                        continue;
                    };
                    let mut dy_at = image_index::<CHANNELS_LAST>(
                        group * out_group + first,
                        oh * p.out_w + ow,
                        p.out_channels,
                        p.out_pixels(),
                    );
                    let mut w_at = weights + (r * p.kernel_w + s) * plan.input_grad_chunk * 16;
                    // dy at one output channel times its 4 staged weights, then the next.
                    let mut accumulate = |g: f32| {
                        // SAFETY: the chunk's weights of this tap, staged above.
                        let w = unsafe { load_shared_v4_f32(w_at) };
                        for c in 0..MAX {
                            sums[c] = fma_f32(g, w[c], sums[c]);
                        }
                        w_at += 16;
                    };
                    if vector {
                        for _ in 0..count / 4 {
                            // SAFETY: four of the chunk's output channels, contiguous and
                            // 16-byte aligned (channel counts and chunks multiples of 4);
                            // dy is read-only here.
                            let g = unsafe { load_global_nc_v4(dy.add(dy_at).cast()) };
                            for g in g {
                                accumulate(f32::from_bits(g));
                            }
                            dy_at += 4;
                        }
                    } else {
                        for _ in 0..count {
                            // SAFETY: an output channel of the chunk, (oh, ow) inside dy.
                            accumulate(unsafe { *dy.add(dy_at) });
                            dy_at += dy_step;
                        }
                    }
                }
            }
            first += count;
        }
        if !active {
            return;
        }
        let in_image = p.in_channels as usize * p.pixels() as usize;
        let pixel = ih * p.width + iw;
        for (c, &sum) in sums.iter().enumerate() {
            if (c as u32) < in_group {
                let channel = group * in_group + c as u32;
                let at = image * in_image
                    + image_index::<CHANNELS_LAST>(channel, pixel, p.in_channels, p.pixels());
                // SAFETY: the element is inside dx.
                unsafe { *args.dx.as_mut_ptr().add(at) = sum };
            }
        }
    }

    /// Stages the weights of the block's groups' output channels `first ..` (`count`
    /// of them in each group): per group, 4 floats per tap and channel, tap-major
    /// (`input_grad_chunk` channels apart), the input channels past the group's and the
    /// groups past the problem's zeros.
    ///
    /// # Safety
    /// The block calls it together between barriers; `w` holds the problem's weights in
    /// the plan's layout and the shared memory the launch's chunks.
    #[inline(always)]
    unsafe fn stage_weights<const CHANNELS_LAST: bool>(args: &DirectInputGradArgs, first: u32, count: u32) {
        let (p, chunk) = (&args.problem, args.plan.input_grad_chunk);
        let (in_group, out_group, taps) = (p.in_per_group(), p.out_per_group(), p.taps());
        let block_groups = args.plan.input_grad_groups;
        let mut e = thread_idx_x();
        while e < block_groups * count * taps * 4 {
            let (rest, c) = (e / 4, e % 4);
            // The plan's chunks hold at least one output channel.
            let (rest, out) = (
                rest.checked_div(count).unwrap_or(0),
                rest.checked_rem(count).unwrap_or(0),
            );
            let (local_group, tap) = p.div_taps.divmod(rest);
            let group = block_idx_y() * block_groups + local_group;
            let value = if c < in_group && group < p.groups {
                let filter = ((group * out_group + first + out) * in_group * taps) as usize;
                let at = if CHANNELS_LAST {
                    tap * in_group + c
                } else {
                    c * taps + tap
                };
                // SAFETY: input channel c of the filter at the tap, inside w.
                unsafe { *args.w.as_ptr().add(filter + at as usize) }
            } else {
                0.0
            };
            let at = (local_group * taps + tap) * chunk + out;
            // SAFETY: inside the launch's shared memory (`chunk * taps * 16` bytes a group).
            unsafe { store_shared_f32(shared_base() + (at * 4 + c) * 4, value) };
            e += DEPTHWISE_THREADS;
        }
    }

    /// One weight per block (NCHW: a tap of one filter) or 32 (NHWC: a tap of 32
    /// filters, one per lane): the sum over every output of dy times the input its tap
    /// reads, in FP64, the threads' sums added in a fixed order.
    ///
    /// # Safety
    /// x, dy and dw hold the problem's tensors in the plan's layout, at least one
    /// image; the grid is [`DirectPlan::weight_grad`]'s, with its shared memory.
    #[inline(always)]
    pub unsafe fn weight_grad<const CHANNELS_LAST: bool>(args: DepthwiseWeightGradArgs) {
        let p = args.problem;
        let t = thread_idx_x();
        let (channel_block, tap) = p.div_taps.divmod(block_idx_x());
        let outputs = p.batch * p.out_pixels();
        let (begin, end) = chunk(outputs as u64, args.plan.split as u64, block_idx_y() as u64, 1);
        let (r, s) = p.div_kernel_w.divmod(tap);
        // NHWC: a lane per output channel, the warps along the outputs; NCHW: one output
        // channel, every thread along the outputs.
        let (o, first, step) = if CHANNELS_LAST {
            (
                channel_block * WGRAD_CHANNELS + t % 32,
                t / 32,
                DEPTHWISE_THREADS / 32,
            )
        } else {
            (channel_block, t, DEPTHWISE_THREADS)
        };
        let mut sum = 0.0f64;
        if o < p.out_channels {
            let channel = args.plan.div_multiplier.divmod(o).0;
            let mut q = begin as u32 + first;
            while q < end as u32 {
                let (image, pixel) = p.div_out_pixels.divmod(q);
                let (oh, ow) = p.div_out_w.divmod(pixel);
                let ih = input_coordinate(oh, p.stride_h, r, p.dilation_h, p.pad_h, p.height);
                let iw = input_coordinate(ow, p.stride_w, s, p.dilation_w, p.pad_w, p.width);
                if let (Some(ih), Some(iw)) = (ih, iw) {
                    let out_image = p.out_channels as usize * p.out_pixels() as usize;
                    let in_image = p.in_channels as usize * p.pixels() as usize;
                    let dy_at = image as usize * out_image
                        + image_index::<CHANNELS_LAST>(o, pixel, p.out_channels, p.out_pixels());
                    let x_at = image as usize * in_image
                        + image_index::<CHANNELS_LAST>(channel, ih * p.width + iw, p.in_channels, p.pixels());
                    // SAFETY: both elements lie inside their tensors.
                    let (g, v) = unsafe { (*args.dy.as_ptr().add(dy_at), *args.x.as_ptr().add(x_at)) };
                    sum += g as f64 * v as f64;
                }
                q += step;
            }
        }
        // SAFETY: the launch provides DEPTHWISE_THREADS f64.
        let sums: *mut f64 = unsafe { SharedCarver::new().take(DEPTHWISE_THREADS as usize) };
        // SAFETY: one slot per thread.
        unsafe { *sums.add(t as usize) = sum };
        // SAFETY: reached by the whole block.
        unsafe { sync_threads() };
        let (writers, stride) = if CHANNELS_LAST {
            (WGRAD_CHANNELS, WGRAD_CHANNELS)
        } else {
            (1, 1)
        };
        if t < writers && o < p.out_channels {
            let mut total = 0.0f64;
            for k in 0..DEPTHWISE_THREADS / stride {
                // SAFETY: written before the barrier.
                total += unsafe { *sums.add((k * stride + t) as usize) };
            }
            let at = block_idx_y() as u64 * weights(&p) + (o * p.taps() + tap) as u64;
            // SAFETY: o < out_channels, and `out` holds `split` gradients; in_per_group is
            // 1, so a filter is its taps in either layout.
            unsafe { *args.out.as_mut_ptr().add(at as usize) = total as f32 };
        }
    }
}
