//! Winograd's F(2x2, 3x3) for 3x3 windows at stride 1 without dilation: 16 multiplies
//! per 2x2 outputs and channel pair instead of 36 (see the family's docs).

#[cfg(target_arch = "nvptx64")]
mod kernels;
#[cfg(target_arch = "nvptx64")]
mod transform;

use super::gemm::{WGRAD_BLOCKS_PER_SM, WGRAD_MAX_CHUNK};
use super::reduce::{self, SplitSumArgs};
use super::{ConvEpilogue, ConvPass, ConvProblem, FastDiv, MAIN_BLOCKS_PER_SM};
use crate::launch::{DevicePtr, DevicePtrMut, Launch, LaunchGeometry, ScratchLayout, kernel_args};

/// Rows of the GEMM tile of a Winograd block: output tiles (2x2 pixels each,
/// consecutive in (image, tile row, tile column) order, so that small maps fill the
/// block) in the data passes, input channels in the weight gradient.
pub const WINOGRAD_ROWS: u32 = 32;
/// Output channels of a Winograd block.
pub const WINOGRAD_OUT: u32 = 32;
/// Depth of one staged chunk of a Winograd block's reduction: input channels in the
/// data passes, output tiles in the weight gradient.
pub const WINOGRAD_CHUNK: u32 = 8;
/// Threads of a Winograd block: one per (row, k) of a chunk for the transforms, 16 per
/// tile position for the products, 8 x 8 each.
pub const WINOGRAD_THREADS: u32 = 256;
/// Floats per staged row of a Winograd operand, `[16][CHUNK][PITCH]`: 4 more than the
/// tile's width, so that threads writing one column of a chunk hit distinct banks.
pub const WINOGRAD_PITCH: u32 = WINOGRAD_ROWS + 4;
/// Bytes of one staged operand.
pub const WINOGRAD_PART: u32 = 16 * WINOGRAD_CHUNK * WINOGRAD_PITCH * 4;
/// Shared memory of a Winograd block: two stages of both operands, reused at the end
/// of the data passes for the 16 products of every (tile, out channel).
pub const WINOGRAD_SHARED_BYTES: u32 = 4 * WINOGRAD_PART;
/// Output tiles one split of the Winograd weight gradient sums in FP32, before the
/// splits are added in FP64 (as `WGRAD_MAX_CHUNK` for the implicit GEMM).
pub const WINOGRAD_WGRAD_MAX_TILES: u32 = WGRAD_MAX_CHUNK;
/// Threads of the weight-transform and weight-gradient finishing kernels.
pub const FILTER_THREADS: u32 = 256;

const _: () = assert!(
    WINOGRAD_THREADS == WINOGRAD_ROWS * WINOGRAD_CHUNK
        && WINOGRAD_THREADS == 16 * (WINOGRAD_ROWS / 8) * (WINOGRAD_OUT / 8)
        && WINOGRAD_SHARED_BYTES >= 16 * WINOGRAD_ROWS * WINOGRAD_OUT * 4
        && WINOGRAD_ROWS == WINOGRAD_OUT
);

/// A 3x3, stride-1 convolution as the Winograd kernels see it: `input` `[batch,
/// channels, height, width]` to `output` `[batch, out_channels, out_h, out_w]` (in the
/// weight gradient, x and dy).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WinogradProblem {
    pub batch: u32,
    pub channels: u32,
    pub height: u32,
    pub width: u32,
    pub out_channels: u32,
    pub out_h: u32,
    pub out_w: u32,
    pub pad_h: u32,
    pub pad_w: u32,
    pub groups: u32,
    /// Input channels per group, padded: to a multiple of `WINOGRAD_CHUNK` in U, of
    /// `WINOGRAD_ROWS` in the weight gradient.
    pub channels_padded: u32,
    /// Output channels per group, padded to a multiple of `WINOGRAD_OUT`.
    pub out_padded: u32,
    /// Whether U comes from the flipped, transposed weights (the input gradient).
    pub flip: u32,
    /// Division by the tile slots of a tile row (see `tile_pitch`) and by the tiles
    /// along a column.
    pub div_tiles_w: FastDiv,
    pub div_tiles_h: FastDiv,
}

impl WinogradProblem {
    /// The Winograd form of `pass` of `problem`, or `None` when it does not qualify: a
    /// 3x3 window at stride 1 without dilation (and for the input gradient, padding at
    /// most 2).
    pub const fn of(problem: &ConvProblem, pass: ConvPass) -> Option<Self> {
        let p = problem;
        if p.kernel_h != 3 || p.kernel_w != 3 || p.stride_h != 1 || p.stride_w != 1 {
            return None;
        }
        if p.dilation_h != 1 || p.dilation_w != 1 {
            return None;
        }
        let (ci, co) = (p.in_per_group(), p.out_per_group());
        let forward = Self {
            batch: p.batch,
            channels: p.in_channels,
            height: p.height,
            width: p.width,
            out_channels: p.out_channels,
            out_h: p.out_h,
            out_w: p.out_w,
            pad_h: p.pad_h,
            pad_w: p.pad_w,
            groups: p.groups,
            channels_padded: ci.next_multiple_of(WINOGRAD_CHUNK),
            out_padded: co.next_multiple_of(WINOGRAD_OUT),
            flip: 0,
            div_tiles_w: FastDiv::new(tile_pitch(p.out_w.div_ceil(2))),
            div_tiles_h: FastDiv::new(p.out_h.div_ceil(2)),
        };
        match pass {
            ConvPass::Forward => Some(forward),
            ConvPass::WeightGrad => Some(Self {
                channels_padded: ci.next_multiple_of(WINOGRAD_ROWS),
                ..forward
            }),
            ConvPass::InputGrad if p.pad_h <= 2 && p.pad_w <= 2 => Some(Self {
                channels: p.out_channels,
                height: p.out_h,
                width: p.out_w,
                out_channels: p.in_channels,
                out_h: p.height,
                out_w: p.width,
                pad_h: 2 - p.pad_h,
                pad_w: 2 - p.pad_w,
                channels_padded: co.next_multiple_of(WINOGRAD_CHUNK),
                out_padded: ci.next_multiple_of(WINOGRAD_OUT),
                flip: 1,
                div_tiles_w: FastDiv::new(tile_pitch(p.width.div_ceil(2))),
                div_tiles_h: FastDiv::new(p.height.div_ceil(2)),
                ..forward
            }),
            ConvPass::InputGrad => None,
        }
    }

    pub const fn in_per_group(&self) -> u32 {
        self.channels / self.groups
    }
    pub const fn out_per_group(&self) -> u32 {
        self.out_channels / self.groups
    }
    /// Output tiles along a row and along a column.
    pub const fn tiles(&self) -> (u32, u32) {
        (self.out_w.div_ceil(2), self.out_h.div_ceil(2))
    }
    /// Tile slots of all images, `tile_pitch` per tile row: below 2^31, as the
    /// problem's output pixels.
    pub const fn tile_count(&self) -> u32 {
        self.batch * self.tiles().1 * self.div_tiles_w.divisor
    }
    /// The place of the output tile in slot `tile`: (image, tile row, tile column), or
    /// `None` past the last tile or in a row's padding.
    #[inline(always)]
    pub const fn tile_place(&self, tile: u32) -> Option<(u32, u32, u32)> {
        let (rest, column) = self.div_tiles_w.divmod(tile);
        let (image, row) = self.div_tiles_h.divmod(rest);
        if image < self.batch && column < self.tiles().0 {
            Some((image, row, column))
        } else {
            None
        }
    }
    /// Blocks along the output channels of a group.
    pub const fn out_blocks(&self) -> u32 {
        self.out_padded / WINOGRAD_OUT
    }
    /// Blocks per group of the data passes (grid x): out-channel blocks fastest, then
    /// runs of `WINOGRAD_ROWS` tiles.
    pub const fn blocks(&self) -> u64 {
        self.out_blocks() as u64 * self.tile_count().div_ceil(WINOGRAD_ROWS) as u64
    }
    /// Floats of the transformed weights, `[groups][16][channels_padded][out_padded]`
    /// (in the weight gradient: of one split's products).
    pub const fn filter_len(&self) -> u64 {
        self.groups as u64 * 16 * self.channels_padded as u64 * self.out_padded as u64
    }
    /// Chunks of the weight gradient's reduction: `WINOGRAD_CHUNK` consecutive tiles
    /// each.
    pub const fn tile_chunks(&self) -> u64 {
        self.tile_count().div_ceil(WINOGRAD_CHUNK) as u64
    }
}

/// Tile slots per tile row of `tiles` tiles: rounded up to whole runs of
/// `WINOGRAD_ROWS` where that leaves at most a sixteenth of the slots empty, so that
/// the runs of wide maps start at aligned columns of one row (fewer sectors per load
/// than runs across rows at any column); else the tiles themselves, so that the runs
/// of narrow maps stay full across rows and images.
const fn tile_pitch(tiles: u32) -> u32 {
    let padded = tiles.next_multiple_of(WINOGRAD_ROWS);
    if (padded - tiles) * 16 <= padded {
        padded
    } else {
        tiles
    }
}

/// How the Winograd weight gradient splits its chunks over blocks.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WinogradSplit {
    /// Chunks per split.
    pub chunks: u32,
    pub split: u32,
}

impl WinogradSplit {
    /// Enough splits to give every SM `WGRAD_BLOCKS_PER_SM` blocks, and no split over
    /// `WINOGRAD_WGRAD_MAX_TILES` tiles.
    pub fn new(problem: &WinogradProblem, multiprocessors: u32) -> Self {
        let total = problem.tile_chunks();
        let blocks = (problem.channels_padded / WINOGRAD_ROWS) as u64
            * problem.out_blocks() as u64
            * problem.groups as u64;
        let fill = (multiprocessors as u64 * WGRAD_BLOCKS_PER_SM as u64).div_ceil(blocks);
        let accuracy = total.div_ceil((WINOGRAD_WGRAD_MAX_TILES / WINOGRAD_CHUNK) as u64);
        let chunks = total.div_ceil(fill.max(accuracy).clamp(1, total.max(1)));
        Self {
            chunks: chunks as u32,
            split: total.div_ceil(chunks) as u32,
        }
    }

    /// Blocks per group (grid x): out-channel blocks fastest, then channel blocks, then
    /// splits.
    pub const fn blocks(&self, problem: &WinogradProblem) -> u64 {
        (problem.channels_padded / WINOGRAD_ROWS) as u64 * problem.out_blocks() as u64 * self.split as u64
    }
}

kernel_args! {
    /// The weight transform's arguments: `U = G g G^T` of `w` into `u`
    /// (`problem.filter_len()` floats).
    pub struct FilterArgs {
        pub w: DevicePtr<f32>,
        pub u: DevicePtrMut<f32>,
        pub problem: WinogradProblem,
    }
    /// The Winograd weight transform.
    pub const CONV_WINOGRAD_FILTER = "conv_winograd_filter_f32" => kernels::filter;
    entry points in FILTER_ENTRY_POINTS;
}

kernel_args! {
    /// The data pass's arguments: `output = epilogue(conv(input))` for the transformed
    /// weights `u`.
    pub struct WinogradArgs {
        pub input: DevicePtr<f32>,
        pub u: DevicePtr<f32>,
        pub epilogue: ConvEpilogue,
        pub output: DevicePtrMut<f32>,
        pub problem: WinogradProblem,
    }
    /// The Winograd forward and input-gradient pass.
    pub const CONV_WINOGRAD = "conv_winograd_f32" => kernels::winograd, bounds(WINOGRAD_THREADS, MAIN_BLOCKS_PER_SM);
    entry points in WINOGRAD_ENTRY_POINTS;
}

kernel_args! {
    /// The weight gradient's arguments: each split's products of the transformed x and
    /// dy tiles, into `partials` (`split.split * problem.filter_len()` floats).
    pub struct WeightGradArgs {
        pub x: DevicePtr<f32>,
        pub dy: DevicePtr<f32>,
        pub partials: DevicePtrMut<f32>,
        pub problem: WinogradProblem,
        pub split: WinogradSplit,
    }
    /// The Winograd weight gradient's products.
    pub const CONV_WINOGRAD_WEIGHT_GRAD = "conv_winograd_weight_grad_f32" => kernels::weight_grad, bounds(WINOGRAD_THREADS, MAIN_BLOCKS_PER_SM);
    entry points in WEIGHT_GRAD_ENTRY_POINTS;
}

kernel_args! {
    /// The weight gradient's finishing arguments: the sum of the splits' `products`
    /// transformed back into `dw`.
    pub struct FinishArgs {
        pub products: DevicePtr<f32>,
        pub dw: DevicePtrMut<f32>,
        pub problem: WinogradProblem,
    }
    /// The Winograd weight gradient's finishing pass.
    pub const CONV_WINOGRAD_WEIGHT_GRAD_FINISH = "conv_winograd_weight_grad_finish_f32" => kernels::weight_grad_finish;
    entry points in FINISH_ENTRY_POINTS;
}

impl WinogradProblem {
    /// The scratch of the transformed weights.
    pub const fn filter_scratch(&self) -> ScratchLayout {
        ScratchLayout {
            bytes: self.filter_len() * 4,
            zeroed: 0,
        }
    }

    /// The weight transform into `u`, the scratch laid out by [`Self::filter_scratch`].
    pub const fn filter(&self, w: DevicePtr<f32>, u: DevicePtrMut<f32>) -> Launch<FilterArgs> {
        let geometry = LaunchGeometry::per_item(self.filter_len() / 16, FILTER_THREADS);
        Launch::new(
            CONV_WINOGRAD_FILTER,
            geometry,
            FilterArgs { w, u, problem: *self },
        )
    }

    /// The data pass over `input` with the transformed weights `u` written by
    /// [`Self::filter`].
    pub const fn data_pass(
        &self,
        input: DevicePtr<f32>,
        u: DevicePtr<f32>,
        epilogue: ConvEpilogue,
        output: DevicePtrMut<f32>,
    ) -> Launch<WinogradArgs> {
        let geometry = LaunchGeometry {
            grid: [self.blocks(), self.groups as u64, 1],
            threads: WINOGRAD_THREADS,
            shared_bytes: WINOGRAD_SHARED_BYTES,
        };
        let args = WinogradArgs {
            input,
            u,
            epilogue,
            output,
            problem: *self,
        };
        Launch::new(CONV_WINOGRAD, geometry, args)
    }
}

impl WinogradSplit {
    /// The scratch of the weight gradient's partial products, and of their sum when
    /// split.
    pub const fn scratch(&self, problem: &WinogradProblem) -> ScratchLayout {
        let slots = if self.split > 1 { self.split + 1 } else { 1 };
        ScratchLayout {
            bytes: slots as u64 * problem.filter_len() * 4,
            zeroed: 0,
        }
    }

    /// The weight gradient's products into `partials`, the scratch laid out by
    /// [`Self::scratch`].
    pub const fn weight_grad(
        &self,
        problem: &WinogradProblem,
        x: DevicePtr<f32>,
        dy: DevicePtr<f32>,
        partials: DevicePtrMut<f32>,
    ) -> Launch<WeightGradArgs> {
        let geometry = LaunchGeometry {
            grid: [self.blocks(problem), problem.groups as u64, 1],
            threads: WINOGRAD_THREADS,
            shared_bytes: WINOGRAD_SHARED_BYTES,
        };
        let args = WeightGradArgs {
            x,
            dy,
            partials,
            problem: *problem,
            split: *self,
        };
        Launch::new(CONV_WINOGRAD_WEIGHT_GRAD, geometry, args)
    }

    /// The finishing pass from the `partials` of [`Self::weight_grad`] into `dw`: when
    /// split, the sum of the splits into the scratch's last slot first (over the
    /// products, so many splits of a few channels still fill the GPU), then the
    /// transform back, one thread per (out channel, in channel).
    pub fn finish(
        &self,
        problem: &WinogradProblem,
        partials: DevicePtrMut<f32>,
        dw: DevicePtrMut<f32>,
    ) -> (Option<Launch<SplitSumArgs>>, Launch<FinishArgs>) {
        let len = problem.filter_len();
        let (products, sum) = if self.split > 1 {
            let total = partials.offset(self.split as u64 * len);
            let sum = reduce::split_sum(SplitSumArgs {
                partials: partials.as_const(),
                out: total,
                count: len,
                split: self.split,
                by_output: 0,
            });
            (total, Some(sum))
        } else {
            (partials, None)
        };
        let pairs = problem.out_channels as u64 * problem.in_per_group() as u64;
        let args = FinishArgs {
            products: products.as_const(),
            dw,
            problem: *problem,
        };
        let finish = Launch::new(
            CONV_WINOGRAD_WEIGHT_GRAD_FINISH,
            LaunchGeometry::per_item(pairs, FILTER_THREADS),
            args,
        );
        (sum, finish)
    }
}
