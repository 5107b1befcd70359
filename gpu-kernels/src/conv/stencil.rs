//! The depthwise stencil: the forward pass of depthwise convolutions (one input channel
//! per group) and their input gradient at stride 1, which is the same stencil run over
//! dy through the flipped window. A block takes a tile of one output plane (NCHW) or of
//! 32 planes (NHWC, a lane each) and stages the window of inputs the tile reads in
//! shared memory once, zero-padded, so that each input is loaded from global memory
//! about once and then read `taps` times from shared memory: the pass runs near the
//! copy's rate, where a loop over the window per output from global memory is bound by
//! its instructions. Each output sums its window in a fixed order, in exact FP32. The
//! weight gradient of 3x3 and 5x5 windows stages the same windows of x: each thread
//! sums dy times the window per tap over its outputs, the block adds its threads' sums
//! in a fixed order into a gradient per image and tile, and those are added in order.
//!
//! Where the tensors are NHWC, one plane is read per plane written, the stride is 1 and
//! the window 3 x 3 or 5 x 5, undilated, the three passes run on the column kernels
//! instead (`stencil_columns.rs`): no staged window, each thread four channels of a
//! column of outputs, the same sums.
//!
//! The direct kernels (`direct.rs`) take what this one does not: strided input
//! gradients, the weight gradient of other windows, and windows too large to stage.

use super::reduce::{self, SplitSumArgs};
use super::stencil_columns::ColumnRuns;
#[cfg(target_arch = "nvptx64")]
use super::stencil_columns::kernel::{columns, weight_grad_columns};
use super::{ConvEpilogue, ConvLayout, ConvProblem, FastDiv};
use crate::launch::{DevicePtr, DevicePtrMut, Kernel, Launch, LaunchGeometry, ScratchLayout, kernel_args};

/// Threads per block.
pub const STENCIL_THREADS: u32 = 256;
/// Output planes of an NHWC block: one per lane.
pub const STENCIL_PLANES: u32 = 32;
/// Warps per block.
const WARPS: u32 = STENCIL_THREADS / 32;
/// Outputs each thread sums: in NCHW, tile outputs `STENCIL_THREADS` apart; in NHWC,
/// tile pixels `WARPS` apart, of its lane's plane.
const OUTPUTS_PER_THREAD: u32 = 8;
/// Most bytes of a block's staged window of inputs.
const WINDOW_BYTES: u32 = 32 * 1024;
/// Most taps of a block's staged filter, a weight per lane each: in NHWC a 7 x 7
/// window. With the window and the sums, a block takes at most 48 KiB.
const NHWC_MAX_TAPS: u32 = 49;
const NCHW_MAX_TAPS: u32 = 2048;
/// Tile columns of an NHWC block at most: square tiles read the fewest halo pixels.
const NHWC_TILE_W: u32 = 8;
/// Square windows of these sizes take kernels with their taps unrolled and the
/// filter in registers; the others loop over the taps at run time (several times the
/// instructions per output).
const UNROLLED_SIZES: [u32; 2] = [3, 5];

/// How the stencil runs a pass: the planes it reads (x, or dy) and writes (y, or dx),
/// the window, and the tiles.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StencilPlan {
    pub batch: u32,
    /// Extent of the planes read and of the planes written.
    pub in_h: u32,
    pub in_w: u32,
    pub out_h: u32,
    pub out_w: u32,
    pub in_planes: u32,
    pub out_planes: u32,
    pub kernel_h: u32,
    pub kernel_w: u32,
    pub stride_h: u32,
    pub stride_w: u32,
    pub dilation_h: u32,
    pub dilation_w: u32,
    /// Input coordinate of an output's first tap, less `out * stride`: `-padding`,
    /// wrapping (the flipped window of the input gradient may start past its output).
    pub pad_h: u32,
    pub pad_w: u32,
    /// Planes read into each output plane: 1 (forward), or the channel multiplier (the
    /// input gradient sums the output channels of its input channel).
    pub terms: u32,
    /// Divides a filter `plane * terms + term` into the plane it reads: by the channel
    /// multiplier (forward) or 1.
    pub div_source: FastDiv,
    /// Whether the window is flipped (the input gradient), as 1 or 0.
    pub flip: u32,
    /// Output rows and columns of a tile, and of the window it stages.
    pub tile_h: u32,
    pub div_tile_w: FastDiv,
    pub window_h: u32,
    pub div_window_w: FastDiv,
    /// Tiles across a plane's columns, and per plane.
    pub div_column_tiles: FastDiv,
    pub tiles: u32,
    /// Whether the tensors are channels last (NHWC), as 1 or 0 (NCHW).
    pub channels_last: u32,
    /// The runs of output rows of the column kernels, where they take the plan.
    pub runs: ColumnRuns,
}

/// The extents of a stencil pass, before its tiles.
struct Extents {
    input: [u32; 2],
    output: [u32; 2],
    planes: [u32; 2],
    padding: [u32; 2],
    stride: [u32; 2],
    terms: u32,
    source_divisor: u32,
    flip: bool,
}

impl StencilPlan {
    /// The forward pass of `problem` over tensors in `layout`, when it is depthwise
    /// and its window fits the shared memory.
    pub const fn forward(problem: &ConvProblem, layout: ConvLayout) -> Option<Self> {
        let p = problem;
        if p.in_per_group() != 1 {
            return None;
        }
        let extents = Extents {
            input: [p.height, p.width],
            output: [p.out_h, p.out_w],
            planes: [p.in_channels, p.out_channels],
            padding: [p.pad_h, p.pad_w],
            stride: [p.stride_h, p.stride_w],
            terms: 1,
            source_divisor: p.out_per_group(),
            flip: false,
        };
        Self::new(p, extents, layout)
    }

    /// The input gradient of `problem` over tensors in `layout`, when it is depthwise
    /// with stride 1 and its window fits: `dx = dy` through the flipped window, which
    /// reads dy's pixel `in + padding - tap dilation`, and so starts `(kernel - 1)
    /// dilation - padding` before it.
    pub const fn input_grad(problem: &ConvProblem, layout: ConvLayout) -> Option<Self> {
        let p = problem;
        if p.in_per_group() != 1 || p.stride_h != 1 || p.stride_w != 1 {
            return None;
        }
        let extents = Extents {
            input: [p.out_h, p.out_w],
            output: [p.height, p.width],
            planes: [p.out_channels, p.in_channels],
            padding: [
                ((p.kernel_h - 1) * p.dilation_h).wrapping_sub(p.pad_h),
                ((p.kernel_w - 1) * p.dilation_w).wrapping_sub(p.pad_w),
            ],
            stride: [1, 1],
            terms: p.out_per_group(),
            source_divisor: 1,
            flip: true,
        };
        Self::new(p, extents, layout)
    }

    /// The weight gradient of `problem` over tensors in `layout`: the forward pass's
    /// tiles, when its window is one the kernels unroll.
    pub const fn weight_grad(problem: &ConvProblem, layout: ConvLayout) -> Option<Self> {
        let Some(plan) = Self::forward(problem, layout) else {
            return None;
        };
        if plan.unrolled_size() == 0 {
            None
        } else {
            Some(plan)
        }
    }

    /// The window's size when it is square and of `UNROLLED_SIZES`, else 0.
    const fn unrolled_size(&self) -> u32 {
        let mut i = 0;
        while i < UNROLLED_SIZES.len() {
            if self.kernel_h == UNROLLED_SIZES[i] && self.kernel_w == UNROLLED_SIZES[i] {
                return UNROLLED_SIZES[i];
            }
            i += 1;
        }
        0
    }

    /// The index in `UNROLLED_SIZES` of the window's kernels (its length for any
    /// window).
    const fn kernel_index(&self) -> usize {
        let mut i = 0;
        while i < UNROLLED_SIZES.len() && UNROLLED_SIZES[i] != self.unrolled_size() {
            i += 1;
        }
        i
    }

    /// Parts of the weight gradient: one per image and tile.
    const fn parts(&self) -> u32 {
        self.batch * self.tiles
    }

    /// The weight gradient's scratch: a gradient per part, of the tiles or of the
    /// column kernel, whichever has more.
    pub const fn weight_grad_scratch(&self) -> ScratchLayout {
        let parts = if self.parts() > self.column_parts() {
            self.parts()
        } else {
            self.column_parts()
        };
        reduce::partials_scratch(parts, self.weights())
    }

    /// Elements of the weights (one input channel per group).
    const fn weights(&self) -> u64 {
        self.out_planes as u64 * (self.kernel_h * self.kernel_w) as u64
    }

    /// The weight-gradient launches over x and dy of `T`: a gradient per part into
    /// `partials` ([`Self::weight_grad_scratch`]), or `dw` itself for one part, then
    /// their sum into `dw` (f32) in order; on the column kernel where it takes the
    /// tensors. Call with at least one image.
    pub fn weight_grad_launches<T: StencilWeightGradKernels>(
        &self,
        x: DevicePtr<T>,
        dy: DevicePtr<T>,
        partials: DevicePtrMut<u8>,
        dw: DevicePtrMut<f32>,
    ) -> (Launch<StencilWeightGradArgs<T>>, Option<Launch<SplitSumArgs>>) {
        if self.takes_columns(x.address() | dy.address(), size_of::<T>() as u32) {
            let (out, sum) = reduce::split_outputs(self.column_parts(), self.weights(), partials, dw);
            let args = StencilWeightGradArgs {
                x,
                dy,
                out,
                plan: *self,
            };
            let kernel = [T::NHWC_COLUMNS_3, T::NHWC_COLUMNS_5][self.kernel_index()];
            return (
                Launch::new(kernel, self.weight_grad_columns_geometry(), args),
                sum,
            );
        }
        let (out, sum) = reduce::split_outputs(self.parts(), self.weights(), partials, dw);
        let (kernels, lanes) = if self.channels_last == 1 {
            ([T::NHWC_3, T::NHWC_5], STENCIL_PLANES)
        } else {
            ([T::NCHW_3, T::NCHW_5], WARPS)
        };
        let mut geometry = self.geometry();
        // After the window, a sum per tap and lane (NHWC) or warp (NCHW).
        geometry.shared_bytes = self.shared_offsets()[0] + self.kernel_h * self.kernel_w * lanes * 4;
        let args = StencilWeightGradArgs {
            x,
            dy,
            out,
            plan: *self,
        };
        (Launch::new(kernels[self.kernel_index()], geometry, args), sum)
    }

    /// The plan, when the grid holds it (at most 65535 images and plane blocks, fewer
    /// than 2^31 elements per image) and a window of one output fits `WINDOW_BYTES`.
    /// Tiles as wide as the planes allow (NCHW) or `NHWC_TILE_W`, as tall as the window
    /// and `OUTPUTS_PER_THREAD` allow.
    const fn new(p: &ConvProblem, e: Extents, layout: ConvLayout) -> Option<Self> {
        let channels_last = matches!(layout, ConvLayout::Nhwc);
        let plane_blocks = if channels_last {
            e.planes[1].div_ceil(STENCIL_PLANES)
        } else {
            e.planes[1]
        };
        let in_image = e.planes[0] as u64 * e.input[0] as u64 * e.input[1] as u64;
        let out_image = e.planes[1] as u64 * e.output[0] as u64 * e.output[1] as u64;
        let taps = p.kernel_h * p.kernel_w;
        if p.batch > 65535
            || plane_blocks > 65535
            || in_image >= 1 << 31
            || out_image >= 1 << 31
            || taps
                > if channels_last {
                    NHWC_MAX_TAPS
                } else {
                    NCHW_MAX_TAPS
                }
        {
            return None;
        }
        let (pixel_bytes, most_outputs) = if channels_last {
            (4 * STENCIL_PLANES, OUTPUTS_PER_THREAD * WARPS)
        } else {
            (4, OUTPUTS_PER_THREAD * STENCIL_THREADS)
        };
        let most_pixels = (WINDOW_BYTES / pixel_bytes) as u64;
        let reach_h = (p.kernel_h as u64 - 1) * p.dilation_h as u64 + 1;
        let reach_w = (p.kernel_w as u64 - 1) * p.dilation_w as u64 + 1;
        if reach_h * reach_w > most_pixels {
            return None;
        }
        // Columns: as many as fit one row of outputs.
        let fit_w = ((most_pixels / reach_h - reach_w) / e.stride[1] as u64 + 1) as u32;
        let mut tile_w = min(min(e.output[1], most_outputs), fit_w);
        if channels_last {
            tile_w = min(tile_w, NHWC_TILE_W);
        }
        let window_w = (tile_w - 1) * e.stride[1] + reach_w as u32;
        let fit_h = ((most_pixels / window_w as u64 - reach_h) / e.stride[0] as u64 + 1) as u32;
        let tile_h = min(min(e.output[0], most_outputs / tile_w), fit_h);
        let window_h = (tile_h - 1) * e.stride[0] + reach_h as u32;
        let column_tiles = e.output[1].div_ceil(tile_w);
        Some(Self {
            batch: p.batch,
            in_h: e.input[0],
            in_w: e.input[1],
            out_h: e.output[0],
            out_w: e.output[1],
            in_planes: e.planes[0],
            out_planes: e.planes[1],
            kernel_h: p.kernel_h,
            kernel_w: p.kernel_w,
            stride_h: e.stride[0],
            stride_w: e.stride[1],
            dilation_h: p.dilation_h,
            dilation_w: p.dilation_w,
            pad_h: e.padding[0],
            pad_w: e.padding[1],
            terms: e.terms,
            div_source: FastDiv::new(e.source_divisor),
            flip: e.flip as u32,
            tile_h,
            div_tile_w: FastDiv::new(tile_w),
            window_h,
            div_window_w: FastDiv::new(window_w),
            div_column_tiles: FastDiv::new(column_tiles),
            tiles: e.output[0].div_ceil(tile_h) * column_tiles,
            channels_last: channels_last as u32,
            runs: ColumnRuns::new(e.output[0], e.output[1]),
        })
    }

    /// The layout of the tensors.
    pub const fn layout(&self) -> ConvLayout {
        ConvLayout::of_channels_last(self.channels_last)
    }

    /// Shared-window addresses of a block's staged window, its filter (the windows
    /// that loop over their taps: a weight per tap and lane) and its sums kept between
    /// terms (a float per output), from the start of the dynamic shared memory.
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    fn shared_layout(&self) -> (u32, u32, u32) {
        let [weights, sums, _] = self.shared_offsets();
        let base = crate::device::shared_base();
        (base, base + weights, base + sums)
    }

    /// Byte offsets of the filter and of the sums in a block's shared memory, and its
    /// size: the window, `taps` weights and (with several terms) a sum per output, each
    /// a float per lane.
    const fn shared_offsets(&self) -> [u32; 3] {
        let lanes = if self.channels_last == 1 {
            STENCIL_PLANES
        } else {
            1
        };
        let window = self.window_h * self.div_window_w.divisor;
        let weights = window * lanes * 4;
        let sums = weights + self.kernel_h * self.kernel_w * lanes * 4;
        let outputs = if self.terms > 1 {
            self.tile_h * self.div_tile_w.divisor
        } else {
            0
        };
        [weights, sums, sums + outputs * lanes * 4]
    }

    /// Bytes of a block's shared memory.
    const fn shared_bytes(&self) -> u32 {
        self.shared_offsets()[2]
    }

    /// A block per tile, plane (NCHW) or 32 planes (NHWC), and image.
    const fn geometry(&self) -> LaunchGeometry {
        let plane_blocks = if self.channels_last == 1 {
            self.out_planes.div_ceil(STENCIL_PLANES)
        } else {
            self.out_planes
        };
        LaunchGeometry {
            grid: [self.tiles as u64, plane_blocks as u64, self.batch as u64],
            threads: STENCIL_THREADS,
            shared_bytes: self.shared_bytes(),
        }
    }

    /// `output = epilogue(stencil(input, w))`: the forward pass (x into y) or, with no
    /// epilogue, the input gradient (dy into dx), input and output of `T` (a residual
    /// with f32 only), w and the bias f32; on the column kernels where they take it.
    /// Call with at least one image.
    pub fn launch<T: StencilKernels>(
        &self,
        input: DevicePtr<T>,
        w: DevicePtr<f32>,
        epilogue: ConvEpilogue,
        output: DevicePtrMut<T>,
    ) -> Launch<StencilArgs<T>> {
        let args = StencilArgs {
            input,
            w,
            epilogue,
            output,
            plan: *self,
        };
        let addresses = input.address() | output.address();
        if self.takes_columns(addresses, size_of::<T>() as u32) {
            let kernel = [T::NHWC_COLUMNS_3, T::NHWC_COLUMNS_5][self.kernel_index()];
            return Launch::new(kernel, self.columns_geometry(), args);
        }
        let kernels = if self.channels_last == 1 {
            [T::NHWC_3, T::NHWC_5, T::NHWC]
        } else {
            [T::NCHW_3, T::NCHW_5, T::NCHW]
        };
        Launch::new(kernels[self.kernel_index()], self.geometry(), args)
    }
}

const fn min(a: u32, b: u32) -> u32 {
    if a < b { a } else { b }
}

kernel_args! {
    /// The stencil's arguments: `output = epilogue(stencil(input, w))`, input and
    /// output of `T`, w f32.
    pub struct StencilArgs<T> {
        pub input: DevicePtr<T>,
        pub w: DevicePtr<f32>,
        pub epilogue: ConvEpilogue,
        pub output: DevicePtrMut<T>,
        pub plan: StencilPlan,
    }
    impl StencilKernels for f32 {
        const NCHW_3 = "conv_depthwise_stencil_nchw_3x3_f32" =>
            kernel::stencil::<f32, false, 3>, bounds(STENCIL_THREADS, 4);
        const NCHW_5 = "conv_depthwise_stencil_nchw_5x5_f32" =>
            kernel::stencil::<f32, false, 5>, bounds(STENCIL_THREADS, 4);
        const NCHW = "conv_depthwise_stencil_nchw_f32" =>
            kernel::stencil::<f32, false, 0>, bounds(STENCIL_THREADS, 4);
        const NHWC_3 = "conv_depthwise_stencil_nhwc_3x3_f32" =>
            kernel::stencil::<f32, true, 3>, bounds(STENCIL_THREADS, 4);
        const NHWC_5 = "conv_depthwise_stencil_nhwc_5x5_f32" =>
            kernel::stencil::<f32, true, 5>, bounds(STENCIL_THREADS, 4);
        const NHWC = "conv_depthwise_stencil_nhwc_f32" =>
            kernel::stencil::<f32, true, 0>, bounds(STENCIL_THREADS, 4);
        const NHWC_COLUMNS_3 = "conv_depthwise_columns_nhwc_3x3_f32" =>
            columns::<f32, 3>, bounds(STENCIL_THREADS, 3);
        const NHWC_COLUMNS_5 = "conv_depthwise_columns_nhwc_5x5_f32" =>
            columns::<f32, 5>, bounds(STENCIL_THREADS, 1);
    }
    impl StencilKernels for half::bf16 {
        const NCHW_3 = "conv_depthwise_stencil_nchw_3x3_bf16" =>
            kernel::stencil::<half::bf16, false, 3>, bounds(STENCIL_THREADS, 4);
        const NCHW_5 = "conv_depthwise_stencil_nchw_5x5_bf16" =>
            kernel::stencil::<half::bf16, false, 5>, bounds(STENCIL_THREADS, 4);
        const NCHW = "conv_depthwise_stencil_nchw_bf16" =>
            kernel::stencil::<half::bf16, false, 0>, bounds(STENCIL_THREADS, 4);
        const NHWC_3 = "conv_depthwise_stencil_nhwc_3x3_bf16" =>
            kernel::stencil::<half::bf16, true, 3>, bounds(STENCIL_THREADS, 4);
        const NHWC_5 = "conv_depthwise_stencil_nhwc_5x5_bf16" =>
            kernel::stencil::<half::bf16, true, 5>, bounds(STENCIL_THREADS, 4);
        const NHWC = "conv_depthwise_stencil_nhwc_bf16" =>
            kernel::stencil::<half::bf16, true, 0>, bounds(STENCIL_THREADS, 4);
        const NHWC_COLUMNS_3 = "conv_depthwise_columns_nhwc_3x3_bf16" =>
            columns::<half::bf16, 3>, bounds(STENCIL_THREADS, 3);
        const NHWC_COLUMNS_5 = "conv_depthwise_columns_nhwc_5x5_bf16" =>
            columns::<half::bf16, 5>, bounds(STENCIL_THREADS, 1);
    }
    impl StencilKernels for half::f16 {
        const NCHW_3 = "conv_depthwise_stencil_nchw_3x3_f16" =>
            kernel::stencil::<half::f16, false, 3>, bounds(STENCIL_THREADS, 4);
        const NCHW_5 = "conv_depthwise_stencil_nchw_5x5_f16" =>
            kernel::stencil::<half::f16, false, 5>, bounds(STENCIL_THREADS, 4);
        const NCHW = "conv_depthwise_stencil_nchw_f16" =>
            kernel::stencil::<half::f16, false, 0>, bounds(STENCIL_THREADS, 4);
        const NHWC_3 = "conv_depthwise_stencil_nhwc_3x3_f16" =>
            kernel::stencil::<half::f16, true, 3>, bounds(STENCIL_THREADS, 4);
        const NHWC_5 = "conv_depthwise_stencil_nhwc_5x5_f16" =>
            kernel::stencil::<half::f16, true, 5>, bounds(STENCIL_THREADS, 4);
        const NHWC = "conv_depthwise_stencil_nhwc_f16" =>
            kernel::stencil::<half::f16, true, 0>, bounds(STENCIL_THREADS, 4);
        const NHWC_COLUMNS_3 = "conv_depthwise_columns_nhwc_3x3_f16" =>
            columns::<half::f16, 3>, bounds(STENCIL_THREADS, 3);
        const NHWC_COLUMNS_5 = "conv_depthwise_columns_nhwc_5x5_f16" =>
            columns::<half::f16, 5>, bounds(STENCIL_THREADS, 1);
    }
    entry points in ENTRY_POINTS;
}

/// The stencil kernels of an element (f32, bf16, f16): over NCHW and NHWC tensors, for
/// 3 x 3 and 5 x 5 windows (unrolled) and any window, summing in f32 and rounding each
/// output once.
pub trait StencilKernels: Sized {
    const NCHW_3: Kernel<StencilArgs<Self>>;
    const NCHW_5: Kernel<StencilArgs<Self>>;
    const NCHW: Kernel<StencilArgs<Self>>;
    const NHWC_3: Kernel<StencilArgs<Self>>;
    const NHWC_5: Kernel<StencilArgs<Self>>;
    const NHWC: Kernel<StencilArgs<Self>>;
    /// The column kernels ([`super::stencil_columns`]) of 3 x 3 and 5 x 5 windows.
    const NHWC_COLUMNS_3: Kernel<StencilArgs<Self>>;
    const NHWC_COLUMNS_5: Kernel<StencilArgs<Self>>;
}

kernel_args! {
    /// The stencil weight gradient's arguments: a gradient per part (image, tile) into
    /// `out` (f32), from x and dy of `T`.
    pub struct StencilWeightGradArgs<T> {
        pub x: DevicePtr<T>,
        pub dy: DevicePtr<T>,
        pub out: DevicePtrMut<f32>,
        pub plan: StencilPlan,
    }
    impl StencilWeightGradKernels for f32 {
        const NCHW_3 = "conv_depthwise_stencil_weight_grad_nchw_3x3_f32" =>
            kernel::weight_grad::<f32, false, 3>, bounds(STENCIL_THREADS, 4);
        const NCHW_5 = "conv_depthwise_stencil_weight_grad_nchw_5x5_f32" =>
            kernel::weight_grad::<f32, false, 5>, bounds(STENCIL_THREADS, 4);
        const NHWC_3 = "conv_depthwise_stencil_weight_grad_nhwc_3x3_f32" =>
            kernel::weight_grad::<f32, true, 3>, bounds(STENCIL_THREADS, 4);
        const NHWC_5 = "conv_depthwise_stencil_weight_grad_nhwc_5x5_f32" =>
            kernel::weight_grad::<f32, true, 5>, bounds(STENCIL_THREADS, 4);
        const NHWC_COLUMNS_3 = "conv_depthwise_columns_weight_grad_nhwc_3x3_f32" =>
            weight_grad_columns::<f32, 3>, bounds(STENCIL_THREADS, 2);
        const NHWC_COLUMNS_5 = "conv_depthwise_columns_weight_grad_nhwc_5x5_f32" =>
            weight_grad_columns::<f32, 5>, bounds(STENCIL_THREADS, 1);
    }
    impl StencilWeightGradKernels for half::bf16 {
        const NCHW_3 = "conv_depthwise_stencil_weight_grad_nchw_3x3_bf16" =>
            kernel::weight_grad::<half::bf16, false, 3>, bounds(STENCIL_THREADS, 4);
        const NCHW_5 = "conv_depthwise_stencil_weight_grad_nchw_5x5_bf16" =>
            kernel::weight_grad::<half::bf16, false, 5>, bounds(STENCIL_THREADS, 4);
        const NHWC_3 = "conv_depthwise_stencil_weight_grad_nhwc_3x3_bf16" =>
            kernel::weight_grad::<half::bf16, true, 3>, bounds(STENCIL_THREADS, 4);
        const NHWC_5 = "conv_depthwise_stencil_weight_grad_nhwc_5x5_bf16" =>
            kernel::weight_grad::<half::bf16, true, 5>, bounds(STENCIL_THREADS, 4);
        const NHWC_COLUMNS_3 = "conv_depthwise_columns_weight_grad_nhwc_3x3_bf16" =>
            weight_grad_columns::<half::bf16, 3>, bounds(STENCIL_THREADS, 2);
        const NHWC_COLUMNS_5 = "conv_depthwise_columns_weight_grad_nhwc_5x5_bf16" =>
            weight_grad_columns::<half::bf16, 5>, bounds(STENCIL_THREADS, 1);
    }
    impl StencilWeightGradKernels for half::f16 {
        const NCHW_3 = "conv_depthwise_stencil_weight_grad_nchw_3x3_f16" =>
            kernel::weight_grad::<half::f16, false, 3>, bounds(STENCIL_THREADS, 4);
        const NCHW_5 = "conv_depthwise_stencil_weight_grad_nchw_5x5_f16" =>
            kernel::weight_grad::<half::f16, false, 5>, bounds(STENCIL_THREADS, 4);
        const NHWC_3 = "conv_depthwise_stencil_weight_grad_nhwc_3x3_f16" =>
            kernel::weight_grad::<half::f16, true, 3>, bounds(STENCIL_THREADS, 4);
        const NHWC_5 = "conv_depthwise_stencil_weight_grad_nhwc_5x5_f16" =>
            kernel::weight_grad::<half::f16, true, 5>, bounds(STENCIL_THREADS, 4);
        const NHWC_COLUMNS_3 = "conv_depthwise_columns_weight_grad_nhwc_3x3_f16" =>
            weight_grad_columns::<half::f16, 3>, bounds(STENCIL_THREADS, 2);
        const NHWC_COLUMNS_5 = "conv_depthwise_columns_weight_grad_nhwc_5x5_f16" =>
            weight_grad_columns::<half::f16, 5>, bounds(STENCIL_THREADS, 1);
    }
    entry points in WEIGHT_GRAD_ENTRY_POINTS;
}

/// The stencil's weight-gradient kernels of an element (f32, bf16, f16), over NCHW and
/// NHWC tensors, for 3 x 3 and 5 x 5 windows: products exact, sums in f32.
pub trait StencilWeightGradKernels: Sized {
    const NCHW_3: Kernel<StencilWeightGradArgs<Self>>;
    const NCHW_5: Kernel<StencilWeightGradArgs<Self>>;
    const NHWC_3: Kernel<StencilWeightGradArgs<Self>>;
    const NHWC_5: Kernel<StencilWeightGradArgs<Self>>;
    /// The column kernels ([`super::stencil_columns`]) of 3 x 3 and 5 x 5 windows.
    const NHWC_COLUMNS_3: Kernel<StencilWeightGradArgs<Self>>;
    const NHWC_COLUMNS_5: Kernel<StencilWeightGradArgs<Self>>;
}

#[cfg(target_arch = "nvptx64")]
mod kernel {
    use super::*;
    use crate::conv::tensor_core::Output;
    use crate::device::{
        Shuffle, Widen, block_idx_x, block_idx_y, block_idx_z, fma_f32, load_shared_f32, store_shared_f32,
        sync_threads, thread_idx_x,
    };

    /// Weights of the largest unrolled window.
    const MAX_UNROLLED_TAPS: usize = 25;
    const _: () = assert!(MAX_UNROLLED_TAPS == (UNROLLED_SIZES[1] * UNROLLED_SIZES[1]) as usize);

    /// This thread's part of its block's tile. NCHW: a plane per block, outputs
    /// `STENCIL_THREADS` apart per thread; NHWC: a plane per lane, pixels `WARPS` apart
    /// per warp.
    struct Tile {
        plane: u32,
        active: bool,
        first: u32,
        step: u32,
        lanes: u32,
        lane: u32,
        image: usize,
        r0: u32,
        c0: u32,
        outputs: u32,
        window: u32,
    }

    impl Tile {
        #[inline(always)]
        fn of<const CHANNELS_LAST: bool>(plan: &StencilPlan) -> Self {
            let t = thread_idx_x();
            let (plane, first, step, lanes, lane) = if CHANNELS_LAST {
                (
                    block_idx_y() * STENCIL_PLANES + t % 32,
                    t / 32,
                    WARPS,
                    STENCIL_PLANES,
                    t % 32,
                )
            } else {
                (block_idx_y(), t, STENCIL_THREADS, 1, 0)
            };
            let (tile_row, tile_column) = plan.div_column_tiles.divmod(block_idx_x());
            let tile_w = plan.div_tile_w.divisor;
            Self {
                plane,
                active: plane < plan.out_planes,
                first,
                step,
                lanes,
                lane,
                image: block_idx_z() as usize,
                r0: tile_row * plan.tile_h,
                c0: tile_column * tile_w,
                outputs: plan.tile_h * tile_w,
                window: plan.window_h * plan.div_window_w.divisor,
            }
        }

        /// Byte offset of this thread's float `i` of a buffer of a float per lane.
        #[inline(always)]
        fn slot(&self, i: u32) -> u32 {
            (i * self.lanes + self.lane) * 4
        }

        /// Stages the window of plane `source` of this tile's image of `input` at the
        /// shared-window address `base`, widened to f32, zero outside the plane.
        ///
        /// # Safety
        /// `input` holds the plan's input tensor; the block calls it together, `base`
        /// holds the window, which no thread reads until a barrier after it.
        #[inline(always)]
        unsafe fn stage_window<T: Widen<Sum = f32>, const CHANNELS_LAST: bool>(
            &self,
            plan: &StencilPlan,
            input: *const T,
            source: usize,
            base: u32,
        ) {
            let in_plane = plan.in_h as usize * plan.in_w as usize;
            let image_start = self.image * plan.in_planes as usize * in_plane;
            let mut e = self.first;
            while e < self.window {
                let (row, column) = plan.div_window_w.divmod(e);
                let ih = (self.r0 * plan.stride_h + row).wrapping_sub(plan.pad_h);
                let iw = (self.c0 * plan.stride_w + column).wrapping_sub(plan.pad_w);
                let value = if self.active && ih < plan.in_h && iw < plan.in_w {
                    let pixel = ih as usize * plan.in_w as usize + iw as usize;
                    let at = if CHANNELS_LAST {
                        pixel * plan.in_planes as usize + source
                    } else {
                        source * in_plane + pixel
                    };
                    // SAFETY: (source, ih, iw) lies inside the image.
                    unsafe { *input.add(image_start + at) }.widen()
                } else {
                    0.0
                };
                // SAFETY: slot (e, lane) of the window, this thread's alone.
                unsafe { store_shared_f32(base + self.slot(e), value) };
                e += self.step;
            }
        }

        /// Output `i` of the tile: its offset in the window's rows and columns, and
        /// its index in the output tensor when it lies inside the plane.
        #[inline(always)]
        fn output<const CHANNELS_LAST: bool>(&self, plan: &StencilPlan, i: u32) -> (u32, Option<usize>) {
            let (row, column) = plan.div_tile_w.divmod(i);
            let corner = row * plan.stride_h * plan.div_window_w.divisor + column * plan.stride_w;
            let (oh, ow) = (self.r0 + row, self.c0 + column);
            if !self.active || oh >= plan.out_h || ow >= plan.out_w {
                return (corner, None);
            }
            let out_plane = plan.out_h as usize * plan.out_w as usize;
            let pixel = oh as usize * plan.out_w as usize + ow as usize;
            let at = self.image * plan.out_planes as usize * out_plane
                + if CHANNELS_LAST {
                    pixel * plan.out_planes as usize + self.plane as usize
                } else {
                    self.plane as usize * out_plane + pixel
                };
            (corner, Some(at))
        }
    }

    /// Sums this block's tile: stages the window of each plane it reads (one per term)
    /// in shared memory, zero outside the planes, then each thread adds the window of
    /// its outputs times the filter, keeping the sums of all terms but the last in
    /// shared memory; the epilogue, and the stores, each output rounded once to `T`.
    /// `SIZE` is the window's, square, when the kernel unrolls its taps (its filter in
    /// registers), else 0.
    ///
    /// # Safety
    /// `input`, `w` and `output` (and the epilogue's bias and residual) hold the plan's
    /// tensors in its layout, the residual (f32 `T` only) as y; the launch is
    /// [`StencilPlan::launch`]'s, with its shared memory.
    #[inline(always)]
    pub unsafe fn stencil<T: Widen<Sum = f32> + Output, const CHANNELS_LAST: bool, const SIZE: u32>(
        args: StencilArgs<T>,
    ) {
        let plan = args.plan;
        let tile = Tile::of::<CHANNELS_LAST>(&plan);
        let taps = plan.kernel_h * plan.kernel_w;
        let window_w = plan.div_window_w.divisor;
        let (window_base, weights_base, sums_base) = plan.shared_layout();
        let bias = args.epilogue.bias.as_ptr();
        // SAFETY: the bias, when there is one, holds out_planes values.
        let bias = if bias.is_null() || !tile.active {
            0.0
        } else {
            unsafe { *bias.add(tile.plane as usize) }
        };
        for term in 0..plan.terms {
            let filter = tile.plane * plan.terms + term;
            let source = plan.div_source.divmod(filter).0 as usize;
            // SAFETY: the whole block; the last term's window was read before the
            // barrier.
            unsafe {
                if term > 0 {
                    sync_threads();
                }
                tile.stage_window::<T, CHANNELS_LAST>(&plan, args.input.as_ptr(), source, window_base);
            }
            // SAFETY: filter < out_planes * terms, the filters, of `taps` weights each.
            let w = unsafe { args.w.as_ptr().add(filter as usize * taps as usize) };
            let flipped = |j: u32| if plan.flip == 1 { taps - 1 - j } else { j };
            // The unrolled kernels' filter in registers, flipped for the input gradient.
            let mut weights = [0.0f32; MAX_UNROLLED_TAPS];
            for (j, weight) in weights.iter_mut().enumerate().take((SIZE * SIZE) as usize) {
                // SAFETY: the tap lies inside the filter.
                *weight = if tile.active {
                    unsafe { *w.add(flipped(j as u32) as usize) }
                } else {
                    0.0
                };
            }
            if SIZE == 0 {
                let mut tap = tile.first;
                while tap < taps {
                    // SAFETY: the lane's filter holds `taps` weights; its slot is its own.
                    unsafe {
                        let weight = if tile.active {
                            *w.add(flipped(tap) as usize)
                        } else {
                            0.0
                        };
                        store_shared_f32(weights_base + tile.slot(tap), weight);
                    }
                    tap += tile.step;
                }
            }
            // SAFETY: the whole block: the window and the weights are staged.
            unsafe { sync_threads() };
            let mut i = tile.first;
            while i < tile.outputs {
                let (corner, at) = tile.output::<CHANNELS_LAST>(&plan, i);
                let mut total = if term == 0 {
                    0.0
                } else {
                    // SAFETY: this thread's own sum, written by it last term.
                    unsafe { load_shared_f32(sums_base + tile.slot(i)) }
                };
                let (rows, columns) = if SIZE > 0 {
                    (SIZE, SIZE)
                } else {
                    (plan.kernel_h, plan.kernel_w)
                };
                for r in 0..rows {
                    let window_row = corner + r * plan.dilation_h * window_w;
                    for s in 0..columns {
                        let at = window_row + s * plan.dilation_w;
                        // SAFETY: the tap's input lies in the staged window, its weight
                        // in the staged filter.
                        let (value, weight) = unsafe {
                            (
                                load_shared_f32(window_base + tile.slot(at)),
                                if SIZE > 0 {
                                    weights[(r * SIZE + s) as usize]
                                } else {
                                    load_shared_f32(weights_base + tile.slot(r * columns + s))
                                },
                            )
                        };
                        total = fma_f32(value, weight, total);
                    }
                }
                if term + 1 < plan.terms {
                    // SAFETY: this thread's own sum.
                    unsafe { store_shared_f32(sums_base + tile.slot(i), total) };
                } else if let Some(at) = at {
                    // SAFETY: `at` is an element of the output (and of the residual).
                    unsafe {
                        *args.output.as_mut_ptr().add(at) = T::from_f32(args.epilogue.apply(total + bias, at))
                    };
                }
                i += tile.step;
            }
        }
    }

    /// This block's part of the weight gradient: stages the tile's window of x, then
    /// each thread adds, per tap, its outputs' dy times the window under that tap; the
    /// block's threads' sums per tap are added in a fixed order (NCHW: a warp's by
    /// shuffles, then the warps'; NHWC: the warps' one after another) into the part's
    /// gradient of its planes. `SIZE` as for [`stencil`], never 0.
    ///
    /// # Safety
    /// `x` and `dy` hold the forward plan's input and output tensors in its layout;
    /// `out` holds a gradient per part (image, tile); the launch is
    /// [`StencilPlan::weight_grad`]'s, with its shared memory.
    #[inline(always)]
    pub unsafe fn weight_grad<T: Widen<Sum = f32>, const CHANNELS_LAST: bool, const SIZE: u32>(
        args: StencilWeightGradArgs<T>,
    ) {
        const TAPS: usize = MAX_UNROLLED_TAPS;
        let plan = args.plan;
        let tile = Tile::of::<CHANNELS_LAST>(&plan);
        let taps = SIZE * SIZE;
        let window_w = plan.div_window_w.divisor;
        let (window_base, reduce_base, _) = plan.shared_layout();
        let source = plan.div_source.divmod(tile.plane).0 as usize;
        // SAFETY: the whole block; the window is read after the barrier.
        unsafe {
            tile.stage_window::<T, CHANNELS_LAST>(&plan, args.x.as_ptr(), source, window_base);
            sync_threads();
        }
        let mut sums = [0.0f32; TAPS];
        let mut i = tile.first;
        while i < tile.outputs {
            let (corner, at) = tile.output::<CHANNELS_LAST>(&plan, i);
            if let Some(at) = at {
                // SAFETY: `at` is an element of dy.
                let gradient = unsafe { *args.dy.as_ptr().add(at) }.widen();
                for r in 0..SIZE {
                    let window_row = corner + r * plan.dilation_h * window_w;
                    for s in 0..SIZE {
                        let tap = (r * SIZE + s) as usize;
                        // SAFETY: the tap's input lies in the staged window.
                        let value = unsafe {
                            load_shared_f32(window_base + tile.slot(window_row + s * plan.dilation_w))
                        };
                        sums[tap] = fma_f32(gradient, value, sums[tap]);
                    }
                }
            }
            i += tile.step;
        }
        let part = block_idx_z() as usize * plan.tiles as usize + block_idx_x() as usize;
        let weights = plan.out_planes as usize * taps as usize;
        // SAFETY: the part's gradient lies inside `out`.
        let out = unsafe { args.out.as_mut_ptr().add(part * weights) };
        let t = thread_idx_x();
        if CHANNELS_LAST {
            // The warps' sums, one warp after another, in the lanes' slots.
            for warp in 0..WARPS {
                // SAFETY: the whole block; the slots were read last round.
                unsafe { sync_threads() };
                if t / 32 == warp {
                    for (tap, &sum) in sums.iter().enumerate().take(taps as usize) {
                        let address = reduce_base + tile.slot(tap as u32);
                        // SAFETY: this lane's slot of the tap.
                        unsafe {
                            let before = if warp == 0 { 0.0 } else { load_shared_f32(address) };
                            store_shared_f32(address, before + sum);
                        }
                    }
                }
            }
            // SAFETY: the whole block: the last warp's sums are in.
            unsafe { sync_threads() };
            if t / 32 == 0 && tile.active {
                for tap in 0..taps {
                    // SAFETY: the plane's weight of the tap; its slot.
                    unsafe {
                        *out.add((tile.plane * taps + tap) as usize) =
                            load_shared_f32(reduce_base + tile.slot(tap))
                    };
                }
            }
        } else {
            // A warp's sums by shuffles, then the warps' in order.
            for (tap, sum) in sums.iter_mut().enumerate().take(taps as usize) {
                let mut mask = 16;
                while mask > 0 {
                    *sum += sum.shfl_xor(mask);
                    mask /= 2;
                }
                if t.is_multiple_of(32) {
                    // SAFETY: this warp's slot of the tap.
                    unsafe { store_shared_f32(reduce_base + (tap as u32 * WARPS + t / 32) * 4, *sum) };
                }
            }
            // SAFETY: the whole block: every warp's sums are in.
            unsafe { sync_threads() };
            if t < taps {
                let mut total = 0.0;
                for warp in 0..WARPS {
                    // SAFETY: the tap's slots.
                    total += unsafe { load_shared_f32(reduce_base + (t * WARPS + warp) * 4) };
                }
                // SAFETY: the plane's weight of the tap.
                unsafe { *out.add((tile.plane * taps + t) as usize) = total };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv::ConvShape;

    fn depthwise(size: u32, stride: u32, padding: u32, dilation: u32) -> ConvProblem {
        ConvProblem::new(&ConvShape {
            input: [32, 256, size, size],
            weight: [256, 1, 3, 3],
            stride: [stride; 2],
            padding: [padding; 2],
            dilation: [dilation; 2],
            groups: 256,
        })
        .expect("a valid problem")
    }

    #[test]
    fn tiles_fit_the_window_and_the_threads() {
        // A 28 x 28 plane in one NCHW tile, in 8 x 8 NHWC tiles.
        let p = depthwise(28, 1, 1, 1);
        let nchw = StencilPlan::forward(&p, ConvLayout::Nchw).expect("fits");
        assert_eq!((nchw.tile_h, nchw.div_tile_w.divisor, nchw.tiles), (28, 28, 1));
        assert_eq!((nchw.window_h, nchw.div_window_w.divisor), (30, 30));
        let nhwc = StencilPlan::input_grad(&p, ConvLayout::Nhwc).expect("fits");
        assert_eq!((nhwc.tile_h, nhwc.div_tile_w.divisor, nhwc.tiles), (8, 8, 16));
        assert_eq!((nhwc.pad_h, nhwc.flip, nhwc.terms), (1, 1, 1));
        // Large planes in tiles of at most a thread's outputs and the window's bytes.
        for layout in [ConvLayout::Nchw, ConvLayout::Nhwc] {
            let plan = StencilPlan::forward(&depthwise(300, 2, 1, 3), layout).expect("fits");
            let (tile_w, window_w) = (plan.div_tile_w.divisor, plan.div_window_w.divisor);
            let lanes = if layout == ConvLayout::Nhwc {
                STENCIL_PLANES
            } else {
                1
            };
            assert!(plan.shared_bytes() <= 48 * 1024);
            assert!(plan.tile_h * tile_w <= OUTPUTS_PER_THREAD * STENCIL_THREADS / lanes);
            assert_eq!(window_w, (tile_w - 1) * 2 + 7);
        }
        // The weight gradient of unrolled windows alone.
        assert!(StencilPlan::weight_grad(&p, ConvLayout::Nhwc).is_some());
        let five_by_seven = ConvProblem::new(&ConvShape {
            input: [2, 8, 20, 20],
            weight: [8, 1, 5, 7],
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 8,
        })
        .expect("a valid problem");
        assert!(StencilPlan::forward(&five_by_seven, ConvLayout::Nchw).is_some());
        assert!(StencilPlan::weight_grad(&five_by_seven, ConvLayout::Nchw).is_none());
        // Strided input gradients and windows too wide to stage take the direct kernels.
        assert!(StencilPlan::input_grad(&depthwise(28, 2, 1, 1), ConvLayout::Nchw).is_none());
        assert!(StencilPlan::forward(&depthwise(28, 1, 100, 100), ConvLayout::Nchw).is_none());
    }
}
