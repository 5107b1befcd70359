//! The weight gradient on warpgroup MMA (`wgmma` TF32, sm_90a) over NCHW tensors of
//! stride-1 convolutions, or NHWC tensors of any stride. Per output channel and weight it is the GEMM
//! `dw = dy patches(x)^T` over the pixels. `wgmma` reads TF32 operands from shared
//! memory only K-major (contiguous along the pixels); A may come from registers in any
//! layout. So dy is A, read from registers, and x is B: in NCHW it is K-major as it
//! lies, in NHWC (channels fastest) it is transposed in shared memory.
//!
//! Bulk tensor copies (TMA) stage both, zeros outside the tensors, but fault unless a
//! box starts at a 16-byte multiple along its innermost dimension. In NCHW the k-tiles
//! run over x's columns in aligned runs of `TC_BK`: x's rows (one per window row) land
//! as they lie in the swizzled layout `wgmma` reads, and dy, which a window column
//! displaces by a few pixels, is copied from its image's plane (rows of any length) in
//! plain rows 4 floats wider from the aligned pixel before; the consumers read their
//! fragments from the displaced pixel on, zeros where the output pixel lies outside the
//! row. In NHWC the k-tiles run over the batch's output pixels, `TC_BK` at a time
//! across rows and images (maps of any width): dy is copied as it lies, pixels of
//! `DY_NHWC_ROW` channels (a few past the tile's, so that a warp's fragment reads fall
//! in distinct banks), and x by im2col boxes of those pixels' window taps (zeros in the
//! padding), swizzled, each the transpose of the K-major layout of the same bytes.
//!
//! A tile is `WGMMA_WGRAD_ROWS` output channels (64 per consumer warpgroup) by
//! `WGMMA_WGRAD_BLOCKS` column blocks of one window column, each a window row and
//! `WGMMA_WGRAD_CHANNELS` input channels. One thread of the producer warpgroup copies
//! the stages; its other warps round the staged x to TF32 in place (transposing it in
//! NHWC; the tensor cores would drop its low mantissa bits, which biases the products)
//! and signal the consumers, which multiply dy from registers (rounded on the way) by x
//! from shared memory. The pixels are split over blocks into partial gradients that
//! `reduce::split_sum` adds in FP64 in a fixed order: results are the same from run to
//! run.
//!
//! In NCHW, columns of a k-tile whose output pixel lies outside the output row have no
//! dy (zeros), so their x values add nothing unless they are infinite or NaN.
//!
//! NHWC tensors of bf16 or f16 have a kernel of their own (`sixteen_bit.rs`): the same
//! tiles and split, both operands read from shared memory as they land.

mod sixteen_bit;

use super::weight_grad::wave_filling_split;
use super::{
    TC_BK, TensorCoreOperand, WGMMA_BARRIER_BYTES, WGMMA_THREADS, bulk_copies_fit, im2col_map, nchw_rows_map,
    tile_bytes,
};
use crate::conv::reduce::{self, SplitSumArgs};
use crate::conv::{ConvLayout, ConvProblem};
use crate::launch::{
    DeviceLimits, DevicePtr, DevicePtrMut, Launch, LaunchGeometry, ScratchLayout, kernel_args,
};
use crate::tensor_map::{TensorMapPair, TensorMapSpec, TensorMapSwizzle};

/// Output channels per tile: 64 for each of the two consumer warpgroups.
pub const WGMMA_WGRAD_ROWS: u32 = 128;
/// Input channels of a column block (one window row).
pub const WGMMA_WGRAD_CHANNELS: u32 = 64;
/// Column blocks per tile: one m64n192k8 `wgmma` per consumer and 8 pixels.
pub const WGMMA_WGRAD_BLOCKS: u32 = 3;
/// Shared-memory stages.
pub const WGMMA_WGRAD_STAGES: u32 = 4;

/// Floats per staged row of dy: a k-tile and the 4 more that its unaligned start may
/// take. 36 floats apart, the fragment reads of a warp (rows `g`, columns `t`) fall in
/// 32 distinct banks.
const DY_PITCH: u32 = TC_BK + 4;
/// Floats per staged pixel of dy in NHWC: the tile's output channels and 8 more. 136
/// floats apart, the fragment reads of a warp (columns `t`, rows `g`) fall in 32
/// distinct banks.
const DY_NHWC_ROW: u32 = WGMMA_WGRAD_ROWS + 8;
/// Input channels of a box of x in NHWC: 128 bytes, the swizzle's span.
const X_NHWC_BOX_CHANNELS: u32 = 32;
/// Bytes of a stage: the column blocks (1024-byte aligned for the swizzle), then dy.
const BLOCK_BYTES: u32 = tile_bytes(WGMMA_WGRAD_CHANNELS);
const B_BYTES: u32 = WGMMA_WGRAD_BLOCKS * BLOCK_BYTES;
const A_BYTES: u32 = WGMMA_WGRAD_ROWS * DY_PITCH * 4;
const STAGE_BYTES: u32 = B_BYTES + A_BYTES;
/// Bytes the copies of a stage bring in NHWC: x, and `TC_BK` pixels of dy.
const STAGE_NHWC_COPY_BYTES: u32 = B_BYTES + TC_BK * DY_NHWC_ROW * 4;
/// Dynamic shared memory: the stages, then per stage the full, empty and rounded
/// mbarriers.
const SHARED_BYTES: u32 = WGMMA_WGRAD_STAGES * (STAGE_BYTES + WGMMA_BARRIER_BYTES + 8);

const _: () = assert!(WGMMA_THREADS == 3 * 128 && WGMMA_WGRAD_ROWS == 2 * 64);
const _: () = assert!(WGMMA_WGRAD_BLOCKS * WGMMA_WGRAD_CHANNELS == 192 && STAGE_BYTES.is_multiple_of(1024));
const _: () = assert!(STAGE_NHWC_COPY_BYTES <= STAGE_BYTES && X_NHWC_BOX_CHANNELS == TC_BK);

/// How the `wgmma` weight gradient is launched: one block per tile (column tiles
/// fastest, then output channels) and split of the k-tiles.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WarpgroupWeightGradPlan {
    /// Tiles of `WGMMA_WGRAD_ROWS` output channels.
    pub m_tiles: u32,
    /// Tiles of column blocks: window columns by `column_tiles`.
    pub n_tiles: u32,
    /// Tiles of `WGMMA_WGRAD_BLOCKS` column blocks per window column.
    pub column_tiles: u32,
    /// Column blocks of a window column: window rows by chunks of
    /// `WGMMA_WGRAD_CHANNELS` input channels, chunks fastest.
    pub column_blocks: u32,
    pub channel_chunks: u32,
    /// k-tiles per row of x in NCHW: `TC_BK` columns each, the last one partial (0 in
    /// NHWC).
    pub row_tiles: u32,
    /// k-tiles of the batch: in NCHW images by output rows by `row_tiles`, in NHWC
    /// output pixels by `TC_BK`.
    pub total_k_tiles: u32,
    /// Parts of the k-tiles summed separately.
    pub split: u32,
    /// k-tiles per split.
    pub k_tiles: u32,
    /// Whether x, dy and dw are channels last (NHWC), as 1 or 0 (NCHW).
    pub channels_last: u32,
    /// The operands' type: TF32 (f32 tensors, dw written as f32), or in NHWC a 16-bit
    /// float (x and dy of it; dw still f32 sums).
    pub operand: TensorCoreOperand,
}

impl WarpgroupWeightGradPlan {
    /// The plan of `problem`'s weight gradient over f32 tensors in `layout` on TF32
    /// `wgmma`, when the device has the kernel and the problem suits it: one group, at
    /// least half a chunk of input channels and three column blocks per window column
    /// (the tiles mostly full), a batch, and tensors the maps can describe. In NCHW:
    /// stride 1, rows of x and planes of dy in 16-byte multiples, and half a k-tile of
    /// row; in NHWC: pixels of x and dy in 16-byte multiples, within the im2col limits,
    /// and the batch's output pixels under 2^31.
    pub const fn of(problem: &ConvProblem, layout: ConvLayout, device: &DeviceLimits) -> Option<Self> {
        Self::of_operand(problem, layout, TensorCoreOperand::Tf32, device)
    }

    /// The plan of `problem`'s weight gradient over NHWC tensors of the 16-bit
    /// `operand`, as [`Self::of`] says for NHWC but with any number of column blocks,
    /// on the kernel of their own.
    pub const fn of_16_bit(
        problem: &ConvProblem,
        operand: TensorCoreOperand,
        device: &DeviceLimits,
    ) -> Option<Self> {
        if matches!(operand, TensorCoreOperand::Tf32) {
            return None;
        }
        Self::of_operand(problem, ConvLayout::Nhwc, operand, device)
    }

    const fn of_operand(
        problem: &ConvProblem,
        layout: ConvLayout,
        operand: TensorCoreOperand,
        device: &DeviceLimits,
    ) -> Option<Self> {
        let p = problem;
        let channels_last = matches!(layout, ConvLayout::Nhwc);
        let sixteen_bit = !matches!(operand, TensorCoreOperand::Tf32);
        let (k_tile_pixels, shared_bytes) = if sixteen_bit {
            (sixteen_bit::K_TILE_PIXELS, sixteen_bit::SHARED_BYTES)
        } else {
            (TC_BK, SHARED_BYTES)
        };
        // Elements of 16 bytes: the maps' strides are multiples of it.
        let vector = 16 / operand.bytes();
        let batch_pixels = p.batch as u64 * p.out_pixels() as u64;
        let layout_suits = if channels_last {
            p.out_channels.is_multiple_of(vector)
                && p.in_channels.is_multiple_of(vector)
                && bulk_copies_fit(p)
                && batch_pixels <= i32::MAX as u64
                && fits_a_map(p.out_channels, batch_pixels)
        } else {
            p.width.is_multiple_of(4)
                && p.out_pixels().is_multiple_of(4)
                && p.stride_h == 1
                && p.stride_w == 1
                && p.width >= TC_BK / 2
                && fits_a_map(p.out_channels, p.out_pixels() as u64)
        };
        let suits = device.warpgroup_mma
            && device.tensor_maps
            && device.max_shared_bytes_per_block >= shared_bytes
            && layout_suits
            && p.groups == 1
            && p.in_channels >= WGMMA_WGRAD_CHANNELS / 2
            && p.batch > 0
            && fits_a_map(p.in_channels, p.pixels() as u64);
        let channel_chunks = p.in_channels.div_ceil(WGMMA_WGRAD_CHANNELS);
        let column_blocks = p.kernel_h * channel_chunks;
        let row_tiles = if channels_last { 0 } else { p.width.div_ceil(TC_BK) };
        let total = if channels_last {
            batch_pixels.div_ceil(k_tile_pixels as u64)
        } else {
            p.batch as u64 * p.out_h as u64 * row_tiles as u64
        };
        // TF32 NHWC tiles mostly full, or the `mma.sync` kernel; 16-bit and NCHW ones
        // even with one column block of three (a 1 x 1 window over 64 channels): its
        // other two repeat it, unstored, and cost less than a pass over f32 copies of x
        // and dy, or than moving both to NHWC.
        let least_blocks = if sixteen_bit || !channels_last {
            1
        } else {
            WGMMA_WGRAD_BLOCKS
        };
        if !suits || column_blocks < least_blocks || total > u32::MAX as u64 {
            return None;
        }
        let m_tiles = p.out_channels.div_ceil(WGMMA_WGRAD_ROWS);
        let column_tiles = column_blocks.div_ceil(WGMMA_WGRAD_BLOCKS);
        let n_tiles = p.kernel_w * column_tiles;
        let split = wave_filling_split(m_tiles as u64 * n_tiles as u64, total, device.multiprocessors);
        let k_tiles = total.div_ceil(split);
        Some(Self {
            m_tiles,
            n_tiles,
            column_tiles,
            column_blocks,
            channel_chunks,
            row_tiles,
            total_k_tiles: total as u32,
            split: total.div_ceil(k_tiles) as u32,
            k_tiles: k_tiles as u32,
            channels_last: channels_last as u32,
            operand,
        })
    }

    /// The layout of x, dy and dw.
    pub const fn layout(&self) -> ConvLayout {
        ConvLayout::of_channels_last(self.channels_last)
    }

    /// Bytes of the partial gradients at the start of the scratch (when split),
    /// rounded up to the tensor maps' alignment.
    const fn partials_bytes(&self, problem: &ConvProblem) -> u64 {
        let partials = reduce::partials_scratch(self.split, problem.weight_count()).bytes;
        partials.next_multiple_of(size_of::<TensorMapPair>() as u64)
    }

    /// The scratch: the partial gradients, then the tensor maps.
    pub const fn scratch(&self, problem: &ConvProblem) -> ScratchLayout {
        ScratchLayout {
            bytes: self.partials_bytes(problem) + size_of::<TensorMapPair>() as u64,
            zeroed: 0,
        }
    }

    /// Where in `scratch` (laid out by [`Self::scratch`]) the tensor maps go.
    pub fn maps_at(&self, problem: &ConvProblem, scratch: DevicePtrMut<u8>) -> DevicePtrMut<TensorMapPair> {
        scratch.offset(self.partials_bytes(problem)).cast()
    }

    /// The tensor maps of dy and x in the plan's layout.
    pub fn tensor_maps(
        &self,
        problem: &ConvProblem,
        x: DevicePtr<f32>,
        dy: DevicePtr<f32>,
    ) -> [TensorMapSpec; 2] {
        if !matches!(self.operand, TensorCoreOperand::Tf32) {
            sixteen_bit::tensor_maps(problem, self.operand, x, dy)
        } else if self.channels_last == 1 {
            nhwc_tensor_maps(problem, x, dy)
        } else {
            nchw_tensor_maps(problem, x, dy)
        }
    }

    /// The launches: the products into `dw` (in the plan's layout), or with a split
    /// into the partials at the start of `scratch`, then their sum into `dw`; `maps` the
    /// [`Self::tensor_maps`] in device memory.
    pub fn launches(
        &self,
        problem: &ConvProblem,
        maps: DevicePtr<TensorMapPair>,
        scratch: DevicePtrMut<u8>,
        dw: DevicePtrMut<f32>,
    ) -> (Launch<WarpgroupWeightGradArgs>, Option<Launch<SplitSumArgs>>) {
        let (out, sum) = reduce::split_outputs(self.split, problem.weight_count(), scratch, dw);
        let (kernel, shared_bytes) = match self.operand {
            TensorCoreOperand::Bf16 => (CONV_WEIGHT_GRAD_NHWC_BF16_WGMMA, sixteen_bit::SHARED_BYTES),
            TensorCoreOperand::F16 => (CONV_WEIGHT_GRAD_NHWC_F16_WGMMA, sixteen_bit::SHARED_BYTES),
            TensorCoreOperand::Tf32 if self.channels_last == 1 => {
                (CONV_WEIGHT_GRAD_NHWC_TF32_WGMMA, SHARED_BYTES)
            }
            TensorCoreOperand::Tf32 => (CONV_WEIGHT_GRAD_NCHW_TF32_WGMMA, SHARED_BYTES),
        };
        let geometry = LaunchGeometry {
            grid: [
                self.m_tiles as u64 * self.n_tiles as u64 * self.split as u64,
                1,
                1,
            ],
            threads: WGMMA_THREADS,
            shared_bytes,
        };
        let args = WarpgroupWeightGradArgs {
            out,
            maps,
            problem: *problem,
            plan: *self,
        };
        (Launch::new(kernel, geometry, args), sum)
    }
}

/// The NCHW tensor maps: of dy, as `[pixels][c][n]` (its rows need not be 16-byte
/// multiples), in boxes of `DY_PITCH` pixels of `WGMMA_WGRAD_ROWS` output channels as
/// they lie; of x, as `[w][h][c][n]`, in boxes of one row of `TC_BK` pixels of
/// `WGMMA_WGRAD_CHANNELS` input channels, swizzled.
fn nchw_tensor_maps(problem: &ConvProblem, x: DevicePtr<f32>, dy: DevicePtr<f32>) -> [TensorMapSpec; 2] {
    let p = problem;
    let dy = TensorMapSpec::tiled(
        dy.address(),
        &[p.out_pixels() as u64, p.out_channels as u64, p.batch as u64],
        &[DY_PITCH, WGMMA_WGRAD_ROWS, 1],
        TensorMapSwizzle::None,
    );
    [dy, nchw_rows_map(p, x, WGMMA_WGRAD_CHANNELS)]
}

/// The NHWC tensor maps: of dy, as `[c][pixels of the batch][1]`, in boxes of `TC_BK`
/// pixels of `DY_NHWC_ROW` output channels as they lie; of x, as `[c][w][h][n]` for
/// im2col, in boxes of `TC_BK` output pixels' taps by `X_NHWC_BOX_CHANNELS` input
/// channels, swizzled.
fn nhwc_tensor_maps(problem: &ConvProblem, x: DevicePtr<f32>, dy: DevicePtr<f32>) -> [TensorMapSpec; 2] {
    let p = problem;
    let batch_pixels = p.batch as u64 * p.out_pixels() as u64;
    let dy = TensorMapSpec::tiled(
        dy.address(),
        &[p.out_channels as u64, batch_pixels, 1],
        &[DY_NHWC_ROW, TC_BK, 1],
        TensorMapSwizzle::None,
    );
    let x = im2col_map(p, x, TensorCoreOperand::Tf32, TC_BK);
    [dy, x]
}

/// Whether an image of `channels` planes of `pixels` floats is under the 2^40 bytes
/// that a tensor map's strides may reach.
const fn fits_a_map(channels: u32, pixels: u64) -> bool {
    (channels as u64 * pixels * 4) < 1 << 40
}

kernel_args! {
    /// The `wgmma` weight gradient's arguments: the gradient (in the plan's layout), or with
    /// `plan.split > 1` the partials, `split` such gradients, in `out`; the tensor maps
    /// of dy and x.
    pub struct WarpgroupWeightGradArgs {
        pub out: DevicePtrMut<f32>,
        pub maps: DevicePtr<TensorMapPair>,
        pub problem: ConvProblem,
        pub plan: WarpgroupWeightGradPlan,
    }
    /// The TF32 weight gradient over NCHW tensors on `wgmma`.
    pub const CONV_WEIGHT_GRAD_NCHW_TF32_WGMMA = "conv_weight_grad_nchw_tf32_wgmma" =>
        kernel::weight_grad::<false>, bounds(WGMMA_THREADS, 1), requires("sm_90a");
    /// The TF32 weight gradient over NHWC tensors on `wgmma`.
    pub const CONV_WEIGHT_GRAD_NHWC_TF32_WGMMA = "conv_weight_grad_nhwc_tf32_wgmma" =>
        kernel::weight_grad::<true>, bounds(WGMMA_THREADS, 1), requires("sm_90a");
    /// The weight gradient over NHWC tensors of bf16 on `wgmma`.
    pub const CONV_WEIGHT_GRAD_NHWC_BF16_WGMMA = "conv_weight_grad_nhwc_bf16_wgmma" =>
        sixteen_bit::kernel::weight_grad::<half::bf16>, bounds(WGMMA_THREADS, 1), requires("sm_90a");
    /// The weight gradient over NHWC tensors of f16 on `wgmma`.
    pub const CONV_WEIGHT_GRAD_NHWC_F16_WGMMA = "conv_weight_grad_nhwc_f16_wgmma" =>
        sixteen_bit::kernel::weight_grad::<half::f16>, bounds(WGMMA_THREADS, 1), requires("sm_90a");
    entry points in ENTRY_POINTS;
}

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
pub(super) mod kernel {
    use super::*;
    use crate::device::{
        Shuffle, StagePipeline, StageSignal, WarpgroupAccumulators, block_idx_x, fence_async_shared,
        fence_tensor_map, lane_id, load_shared_f32, load_shared_v4_f32, shared_base, store_shared_v4_f32,
        swizzled_k_major_descriptor, sync_group, sync_threads, thread_idx_x, to_tf32, warpgroup_commit,
        warpgroup_fence, warpgroup_wait,
    };
    use crate::tensor_map::TensorMap;

    /// Threads of a warpgroup.
    const WARPGROUP: u32 = 128;
    const STAGES: u32 = WGMMA_WGRAD_STAGES;
    /// The producer's threads that round the staged x: its warps but the first.
    const ROUNDERS: u32 = WARPGROUP - 32;
    const _: () = assert!((B_BYTES / 16).is_multiple_of(ROUNDERS));
    /// Squares of 4 by 4 floats of the staged x that each rounder transposes (NHWC).
    const SQUARES_PER_ROUNDER: u32 = B_BYTES / 64 / ROUNDERS;
    const _: () = assert!(SQUARES_PER_ROUNDER * 64 * ROUNDERS == B_BYTES);
    /// The named barrier that the rounders synchronize on.
    const ROUNDERS_BARRIER: u32 = 1;

    /// The accumulators of a consumer: its 64 output channels by the tile's 192 columns.
    pub(super) type Sums = [[f32; 4]; 24];

    /// The stage's column blocks of x (swizzled, `BLOCK_BYTES` each).
    #[inline(always)]
    fn stage_x(stage: u32) -> u32 {
        shared_base() + stage * STAGE_BYTES
    }

    /// The stage's rows of dy (`DY_PITCH` floats each).
    #[inline(always)]
    fn stage_dy(stage: u32) -> u32 {
        stage_x(stage) + B_BYTES
    }

    /// The block's share: its tile, its split's k-tiles, and what its window column
    /// does to dy.
    pub(super) struct Work {
        /// The tile's first output channel, window column and tile of column blocks
        /// of that column.
        pub(super) m0: u32,
        pub(super) window_column: u32,
        column_tile: u32,
        split: u32,
        pub(super) first: u32,
        pub(super) count: u32,
        /// x's column minus the output column of the products: the window column's
        /// displacement less the padding.
        displacement: i32,
    }

    impl Work {
        /// This block's share of the plan's tiles and splits.
        #[inline(always)]
        pub(super) fn of(args: &WarpgroupWeightGradArgs) -> Self {
            let (p, plan) = (&args.problem, &args.plan);
            let tiles = plan.m_tiles * plan.n_tiles;
            let (split, tile) = (block_idx_x() / tiles, block_idx_x() % tiles);
            let n_tile = tile % plan.n_tiles;
            let window_column = n_tile / plan.column_tiles;
            let first = split * plan.k_tiles;
            Self {
                m0: tile / plan.n_tiles * WGMMA_WGRAD_ROWS,
                window_column,
                column_tile: n_tile % plan.column_tiles,
                split,
                first,
                count: plan.k_tiles.min(plan.total_k_tiles - first),
                displacement: (window_column * p.dilation_w) as i32 - p.pad_w as i32,
            }
        }

        /// The window row and first input channel of the tile's column block `j`.
        /// Blocks past the window column's copy the last one again; their sums are not
        /// stored.
        #[inline(always)]
        pub(super) fn block(&self, plan: &WarpgroupWeightGradPlan, j: u32) -> (u32, u32) {
            let block = (self.column_tile * WGMMA_WGRAD_BLOCKS + j).min(plan.column_blocks - 1);
            (
                block / plan.channel_chunks,
                block % plan.channel_chunks * WGMMA_WGRAD_CHANNELS,
            )
        }
    }

    /// Where a k-tile lies: its image, output row and first column of x; stepped
    /// through a split's k-tiles in order: across a band of `BAND` k-tiles of a row,
    /// then down the output rows, then the next band. The rows of x a k-tile copies are
    /// copied again a band later (the other window rows), and the 16 bytes past a row
    /// of dy at once (the next k-tile's), while L2 holds them: the bands of all blocks
    /// take a few megabytes.
    #[derive(Clone, Copy, Default)]
    struct KTile {
        image: u32,
        row: u32,
        /// The band's first column and its k-tiles, and the k-tile in it.
        band: u32,
        band_tiles: u32,
        tile: u32,
    }

    /// k-tiles of a band.
    const BAND: u32 = 4;

    impl KTile {
        /// K-tile `kt`.
        #[inline(always)]
        fn at(problem: &ConvProblem, plan: &WarpgroupWeightGradPlan, kt: u32) -> Self {
            let per_image = problem.out_h * plan.row_tiles;
            let (image, rest) = (kt / per_image, kt % per_image);
            let band = rest / (problem.out_h * BAND) * BAND;
            let band_tiles = (plan.row_tiles - band).min(BAND);
            let rest = rest - band * problem.out_h;
            Self {
                image,
                row: rest / band_tiles,
                band,
                band_tiles,
                tile: rest % band_tiles,
            }
        }

        /// The k-tile's first column of x.
        #[inline(always)]
        fn column(&self) -> u32 {
            (self.band + self.tile) * TC_BK
        }

        /// The k-tile after this one.
        #[inline(always)]
        fn advance(&mut self, problem: &ConvProblem, plan: &WarpgroupWeightGradPlan) {
            self.tile += 1;
            if self.tile < self.band_tiles {
                return;
            }
            self.tile = 0;
            self.row += 1;
            if self.row < problem.out_h {
                return;
            }
            self.row = 0;
            self.band += BAND;
            if self.band == plan.row_tiles.next_multiple_of(BAND) {
                self.band = 0;
                self.image += 1;
            }
            self.band_tiles = (plan.row_tiles - self.band).min(BAND);
        }

        /// The pixel of dy (in its image's plane) that the k-tile's first column of x
        /// multiplies: the window column displaces it by `displacement`. It may lie
        /// outside the row (those products are zeros).
        #[inline(always)]
        fn dy_pixel(&self, problem: &ConvProblem, displacement: i32) -> i32 {
            (self.row * problem.out_w + self.column()) as i32 - displacement
        }
    }

    /// The weight gradient of conv for dy (NHWC if `CHANNELS_LAST`, else NCHW), or
    /// with `plan.split > 1` its per-split partials.
    ///
    /// # Safety
    /// `args.maps` holds the plan's tensor maps of the problem's dy and x, `out` the
    /// gradient or `split` of them when split, all in the plan's layout; the launch is
    /// the one [`WarpgroupWeightGradPlan::launches`] builds from this problem's plan.
    #[inline(always)]
    pub unsafe fn weight_grad<const CHANNELS_LAST: bool>(args: WarpgroupWeightGradArgs) {
        let work = Work::of(&args);
        let barriers = stage_x(STAGES);
        // SAFETY: every thread calls them; the mbarriers follow the stages in the
        // launch's shared memory, and the barrier below publishes them.
        let (pipeline, rounded) = unsafe {
            (
                StagePipeline::new(barriers, STAGES, 1, 2 * WARPGROUP),
                StageSignal::new(barriers + STAGES * WGMMA_BARRIER_BYTES, STAGES, ROUNDERS),
            )
        };
        // SAFETY: every thread reaches it.
        unsafe { sync_threads() };
        // From lane 0, so that ptxas sees the role as warp-uniform (a `wgmma` under a
        // divergent branch is serialized).
        let warpgroup = (thread_idx_x() / WARPGROUP).shfl_idx(0);
        // SAFETY: both sides run the same k-tiles in the same order, so every fill is
        // rounded and consumed, and every release awaited.
        unsafe {
            if warpgroup == 0 {
                produce::<CHANNELS_LAST>(&args, &work, &pipeline, &rounded);
            } else {
                consume::<CHANNELS_LAST>(&args, &work, &pipeline, &rounded, warpgroup - 1);
            }
        }
    }

    /// The producer warpgroup: its first thread copies each k-tile of dy and the
    /// tile's column blocks of x into a stage; its other warps (`ROUNDERS` threads)
    /// round each landed stage's x (transposing it in NHWC) and signal it. The copies
    /// wait for stages that the consumers released, the rounding only for landed ones,
    /// so neither holds up the other.
    ///
    /// # Safety
    /// As [`weight_grad`]; the producer warpgroup calls it.
    #[inline(always)]
    unsafe fn produce<const CHANNELS_LAST: bool>(
        args: &WarpgroupWeightGradArgs,
        work: &Work,
        pipeline: &StagePipeline,
        rounded: &StageSignal,
    ) {
        let warp = thread_idx_x() / 32;
        if warp != 0 {
            for fill in 0..work.count {
                let stage = fill % STAGES;
                // SAFETY: the stage's copies landed once the full barrier is passed;
                // nothing reads its x until the signal, which the fence orders after
                // these stores for the tensor cores.
                unsafe {
                    pipeline.wait_full(stage, fill / STAGES);
                    if CHANNELS_LAST {
                        transpose_to_tf32(stage_x(stage), thread_idx_x() - 32);
                    } else {
                        round_to_tf32(stage_x(stage), thread_idx_x() - 32);
                    }
                    fence_async_shared();
                    rounded.arrive(stage);
                }
            }
            return;
        }
        if thread_idx_x() != 0 {
            return;
        }
        let (p, plan) = (&args.problem, &args.plan);
        // SAFETY: the host wrote both maps before the launch.
        let (dy_map, x_map) = unsafe { fenced_maps(args) };
        if CHANNELS_LAST {
            // SAFETY: forwarded.
            unsafe { produce_nhwc(args, work, pipeline, dy_map, x_map) };
            return;
        }
        let mut k_tile = KTile::at(p, plan, work.first);
        for fill in 0..work.count {
            let stage = fill % STAGES;
            let (image, column) = (k_tile.image as i32, k_tile.column() as i32);
            // dy from the 16-byte-aligned pixel at or before the first one the k-tile's
            // products take.
            let dy_at = [k_tile.dy_pixel(p, work.displacement) & !3, work.m0 as i32, image];
            // SAFETY: the stage is released before the copies start; the full barrier
            // expects every box's bytes (zero-filled parts included).
            unsafe {
                pipeline.acquire(stage, fill / STAGES);
                pipeline.arrive_expecting(stage, STAGE_BYTES);
                pipeline.load_tile_3d(stage, stage_dy(stage), dy_map, dy_at);
            }
            for j in 0..WGMMA_WGRAD_BLOCKS {
                let (window_row, channel) = work.block(plan, j);
                let to = stage_x(stage) + j * BLOCK_BYTES;
                let row = (k_tile.row + window_row * p.dilation_h) as i32 - p.pad_h as i32;
                // SAFETY: as above.
                unsafe { pipeline.load_tile_4d(stage, to, x_map, [column, row, channel as i32, image]) };
            }
            k_tile.advance(p, plan);
        }
    }

    /// The copying thread in NHWC: k-tile `kt` is the batch's output pixels
    /// `TC_BK kt ..`; dy as it lies, and per column block two im2col boxes of 32
    /// channels (rows 0-31 and 32-63 of the block) at the block's window tap.
    ///
    /// # Safety
    /// As [`produce`]; `dy_map` and `x_map` are the plan's fenced tensor maps.
    #[inline(always)]
    unsafe fn produce_nhwc(
        args: &WarpgroupWeightGradArgs,
        work: &Work,
        pipeline: &StagePipeline,
        dy_map: *const u8,
        x_map: *const u8,
    ) {
        let k_tiles = NhwcKTiles {
            stages: STAGES,
            pixels: TC_BK,
            bytes: STAGE_NHWC_COPY_BYTES,
        };
        let copy_dy = |stage, first_pixel| {
            let dy_at = [work.m0 as i32, first_pixel, 0];
            // SAFETY: into the stage the loop acquired.
            unsafe { pipeline.load_tile_3d(stage, stage_dy(stage), dy_map, dy_at) };
        };
        let copy_x = |stage, j, [channel, column, row, image]: [i32; 4], offsets| {
            for half in 0..2 {
                let at = [channel + (half * X_NHWC_BOX_CHANNELS) as i32, column, row, image];
                let to = stage_x(stage) + j * BLOCK_BYTES + half * X_NHWC_BOX_CHANNELS * TC_BK * 4;
                // SAFETY: as above.
                unsafe { pipeline.load_im2col(stage, to, x_map, at, offsets) };
            }
        };
        // SAFETY: the caller's contract; the copies are the stage's bytes.
        unsafe { copy_nhwc_k_tiles(args, work, pipeline, k_tiles, copy_dy, copy_x) };
    }

    /// How the NHWC k-tiles are staged: in `stages` stages, `pixels` output pixels
    /// each, `bytes` copied per stage.
    pub(super) struct NhwcKTiles {
        pub stages: u32,
        pub pixels: u32,
        pub bytes: u32,
    }

    /// The copying thread's loop over the split's NHWC k-tiles: per fill, once its
    /// stage is released, the stage expects `k_tiles.bytes`, `copy_dy(stage, first
    /// pixel)` copies dy's k-tile and `copy_x(stage, j, at, offsets)` column block
    /// `j`'s im2col boxes, `at` its first channel and the window origin of the first
    /// pixel, `offsets` its window tap.
    ///
    /// # Safety
    /// As [`produce`]; the copies land in the stage and bring `k_tiles.bytes` in all.
    #[inline(always)]
    pub(super) unsafe fn copy_nhwc_k_tiles(
        args: &WarpgroupWeightGradArgs,
        work: &Work,
        pipeline: &StagePipeline,
        k_tiles: NhwcKTiles,
        copy_dy: impl Fn(u32, i32),
        copy_x: impl Fn(u32, u32, [i32; 4], [u16; 2]),
    ) {
        let (p, plan) = (&args.problem, &args.plan);
        let column_offset = (work.window_column * p.dilation_w) as u16;
        for fill in 0..work.count {
            let stage = fill % k_tiles.stages;
            let first_pixel = (work.first + fill) * k_tiles.pixels;
            let [column, row, image] = p.window_origin(first_pixel);
            // SAFETY: the stage is released before the copies start; the full barrier
            // expects every box's bytes (zero-filled parts included).
            unsafe {
                pipeline.acquire(stage, fill / k_tiles.stages);
                pipeline.arrive_expecting(stage, k_tiles.bytes);
            }
            copy_dy(stage, first_pixel as i32);
            for j in 0..WGMMA_WGRAD_BLOCKS {
                let (window_row, channel) = work.block(plan, j);
                let offsets = [column_offset, (window_row * p.dilation_h) as u16];
                copy_x(stage, j, [channel as i32, column, row, image], offsets);
            }
        }
    }

    /// The tensor maps of dy and x in `args`, fenced for this thread's copies.
    ///
    /// # Safety
    /// The host wrote both maps before the launch.
    #[inline(always)]
    pub(super) unsafe fn fenced_maps(args: &WarpgroupWeightGradArgs) -> (*const u8, *const u8) {
        let dy_map = args.maps.as_ptr() as *const u8;
        let x_map = dy_map.wrapping_add(size_of::<TensorMap>());
        // SAFETY: the caller's contract.
        unsafe {
            fence_tensor_map(dy_map);
            fence_tensor_map(x_map);
        }
        (dy_map, x_map)
    }

    /// Rounds the staged x at `tile` to TF32 to nearest in place, rounder `rounder`
    /// every `ROUNDERS`-th 16-byte chunk.
    ///
    /// # Safety
    /// The rounders call it on a landed stage that nothing else accesses.
    #[inline(always)]
    unsafe fn round_to_tf32(tile: u32, rounder: u32) {
        for i in 0..B_BYTES / 16 / ROUNDERS {
            let at = tile + 16 * (i * ROUNDERS + rounder);
            // SAFETY: a 16-byte chunk of the stage, which the caller owns.
            unsafe {
                let values = load_shared_v4_f32(at);
                store_shared_v4_f32(at, values.map(|v| f32::from_bits(to_tf32(v))));
            }
        }
    }

    /// Transposes the staged x at `tile` (NHWC) in place into the K-major layout and
    /// rounds it to TF32 to nearest; rounder `rounder` takes `SQUARES_PER_ROUNDER`
    /// squares of 4 by 4 floats.
    ///
    /// Each box of 4096 bytes holds 32 pixels `k` by 32 channels `n`, `k` at `128 k`,
    /// 16-byte chunk `n / 4 ^ k % 8`, and is transposed into `n` at `128 n`, chunk
    /// `k / 4 ^ n % 8`: the same bytes, as `wgmma` reads them. Square `(i, j)` (pixels
    /// `4 i ..`, channels `4 j ..`) goes to square `(j, i)`. The 8 threads of a
    /// quarter-warp, which share a cycle of shared memory, take squares `(g ^ l, l)`
    /// for `l` in 0..8: their chunks lie in distinct banks both when read and when
    /// written. All squares are read before any is written, apart from the
    /// consumers and the copying thread.
    ///
    /// # Safety
    /// The rounders call it together on a landed stage that nothing else accesses.
    #[inline(always)]
    unsafe fn transpose_to_tf32(tile: u32, rounder: u32) {
        let square = |s: u32| {
            let (box_at, index) = (tile + s / 64 * 4096, s % 64);
            let (g, l) = (index / 8, index % 8);
            (box_at, g ^ l, l)
        };
        let mut squares = [[[0.0f32; 4]; 4]; SQUARES_PER_ROUNDER as usize];
        for (s, values) in squares.iter_mut().enumerate() {
            let (box_at, i, j) = square(s as u32 * ROUNDERS + rounder);
            for (q, row) in values.iter_mut().enumerate() {
                let k = 4 * i + q as u32;
                // SAFETY: 16 bytes of the stage, which the caller owns.
                *row = unsafe { load_shared_v4_f32(box_at + 128 * k + 16 * (j ^ (k % 8))) };
            }
        }
        // SAFETY: every rounder reaches it once per stage.
        unsafe { sync_group::<ROUNDERS_BARRIER>(ROUNDERS) };
        for (s, values) in squares.iter().enumerate() {
            let (box_at, i, j) = square(s as u32 * ROUNDERS + rounder);
            for c in 0..4 {
                let n = 4 * j + c as u32;
                let column = values.map(|row| f32::from_bits(to_tf32(row[c])));
                // SAFETY: as above; every square was read before the barrier.
                unsafe { store_shared_v4_f32(box_at + 128 * n + 16 * (i ^ (n % 8)), column) };
            }
        }
    }

    /// How a consumer reads a k-tile's staged dy: its pixels start `shift` before the
    /// k-tile's first product, and the products of columns `valid` of the k-tile have
    /// their output pixel inside the row (the others are zeros).
    #[derive(Clone, Copy)]
    struct DyView {
        shift: u32,
        valid: (i32, i32),
    }

    impl DyView {
        /// The view of an NCHW k-tile.
        #[inline(always)]
        fn of(problem: &ConvProblem, displacement: i32, k_tile: &KTile) -> Self {
            let first = displacement - k_tile.column() as i32;
            Self {
                shift: (k_tile.dy_pixel(problem, displacement) & 3) as u32,
                valid: (first, first + problem.out_w as i32),
            }
        }

        /// In NHWC dy is staged from the k-tile's first pixel on, and every column is
        /// a product (x holds zeros in the padding).
        const WHOLE: Self = Self {
            shift: 0,
            valid: (0, TC_BK as i32),
        };
    }

    /// This thread's A fragment of the `wgmma` over rows `rows ..` (64) and columns
    /// `8 kk ..` of the k-tile, from the staged dy at `tile` (rows of `DY_PITCH` pixels
    /// in NCHW, pixels of `DY_NHWC_ROW` channels in NHWC), rounded to TF32 to nearest.
    /// Lane `4 g + t` of warp `w` holds rows `16 w + g` and `+ 8`, columns `t` and
    /// `t + 4`.
    ///
    /// # Safety
    /// The tile landed and is visible to this thread.
    #[inline(always)]
    unsafe fn a_fragment<const CHANNELS_LAST: bool>(tile: u32, rows: u32, kk: u32, view: DyView) -> [u32; 4] {
        let lane = lane_id();
        let row = rows + 16 * (thread_idx_x() / 32 % 4) + lane / 4;
        let column = 8 * kk + lane % 4;
        let element = |row: u32, column: u32| {
            let inside = (column as i32) >= view.valid.0 && (column as i32) < view.valid.1;
            let pixel = view.shift + column;
            let at = if CHANNELS_LAST {
                pixel * DY_NHWC_ROW + row
            } else {
                row * DY_PITCH + pixel
            };
            // SAFETY: a float of the landed tile.
            let value = unsafe { load_shared_f32(tile + at * 4) };
            if inside { to_tf32(value) } else { 0 }
        };
        [
            element(row, column),
            element(row + 8, column),
            element(row, column + 4),
            element(row + 8, column + 4),
        ]
    }

    /// K-tile `kt` of the block's product: `sums += dy x^T` over its pixels for this
    /// consumer's rows `rows ..` (64), one `wgmma` per 8 pixels, each followed by a
    /// wait that leaves one in flight; the k-tile before is released once its last
    /// `wgmma` is done.
    ///
    /// # Safety
    /// The consumer warpgroup calls it together for the k-tiles in order; each
    /// `wgmma`'s A fragment stays untouched until a wait says it is done.
    #[inline(always)]
    unsafe fn multiply_k_tile<const CHANNELS_LAST: bool>(
        sums: &mut Sums,
        pipeline: &StagePipeline,
        rounded: &StageSignal,
        kt: u32,
        rows: u32,
        view: DyView,
    ) {
        let stage = kt % STAGES;
        // SAFETY: the caller's contract; the signal says the stage landed and its x
        // was rounded and fenced for the tensor cores.
        unsafe {
            rounded.wait(stage, kt / STAGES);
            for kk in 0..TC_BK / 8 {
                let a = a_fragment::<CHANNELS_LAST>(stage_dy(stage), rows, kk, view);
                let b = swizzled_k_major_descriptor(stage_x(stage) + kk * 32);
                warpgroup_fence();
                sums.multiply_tf32(a, b);
                warpgroup_commit();
                warpgroup_wait::<1>();
                if kk == 0 && kt > 0 {
                    pipeline.release((kt - 1) % STAGES);
                }
            }
        }
    }

    /// A consumer: multiplies its 64 output channels of the tile over the split's
    /// k-tiles and stores them.
    ///
    /// # Safety
    /// As [`weight_grad`]; consumer warpgroup `consumer` (0 or 1) calls it.
    #[inline(always)]
    unsafe fn consume<const CHANNELS_LAST: bool>(
        args: &WarpgroupWeightGradArgs,
        work: &Work,
        pipeline: &StagePipeline,
        rounded: &StageSignal,
        consumer: u32,
    ) {
        let (p, plan) = (&args.problem, &args.plan);
        let rows = consumer * 64;
        // NHWC k-tiles need no place: every one is read whole.
        let mut k_tile = if CHANNELS_LAST {
            KTile::default()
        } else {
            KTile::at(p, plan, work.first)
        };
        let view = |k_tile: &KTile| {
            if CHANNELS_LAST {
                DyView::WHOLE
            } else {
                DyView::of(p, work.displacement, k_tile)
            }
        };
        let mut sums: Sums = [[0.0; 4]; 24];
        sums.pin();
        // The first k-tile runs before the loop, so that the sums enter it defined by a
        // `wgmma` as they leave it: else ptxas serializes every `wgmma` of the loop.
        // SAFETY: forwarded; a split has at least one k-tile.
        unsafe { multiply_k_tile::<CHANNELS_LAST>(&mut sums, pipeline, rounded, 0, rows, view(&k_tile)) };
        for kt in 1..work.count {
            if !CHANNELS_LAST {
                k_tile.advance(p, plan);
            }
            let view = view(&k_tile);
            // SAFETY: as above.
            unsafe { multiply_k_tile::<CHANNELS_LAST>(&mut sums, pipeline, rounded, kt, rows, view) };
        }
        // SAFETY: the sums are final after the wait, and the last stage read.
        unsafe {
            warpgroup_wait::<0>();
            pipeline.release((work.count - 1) % STAGES);
            store::<CHANNELS_LAST>(args, work, &sums, rows);
        }
    }

    /// Stores a consumer's sums: lane `4 g + t` of warp `w` holds rows `16 w + g` and
    /// `+ 8`, columns `8 j + 2 t` and `+ 1` (`wgmma`'s accumulator layout); column `c`
    /// of the tile is channel `c % 64` of its column block `c / 64`.
    ///
    /// # Safety
    /// As [`consume`].
    #[inline(always)]
    pub(super) unsafe fn store<const CHANNELS_LAST: bool>(
        args: &WarpgroupWeightGradArgs,
        work: &Work,
        sums: &Sums,
        rows: u32,
    ) {
        let (p, plan) = (&args.problem, &args.plan);
        let (lane, warp) = (lane_id(), thread_idx_x() / 32 % 4);
        let (g, t) = (lane / 4, lane % 4);
        let out = args.out.as_mut_ptr();
        let base = work.split as u64 * p.weight_count();
        for (j, tile) in sums.iter().enumerate() {
            let column = 8 * j as u32 + 2 * t;
            let block = work.column_tile * WGMMA_WGRAD_BLOCKS + column / WGMMA_WGRAD_CHANNELS;
            let (window_row, chunk) = (block / plan.channel_chunks, block % plan.channel_chunks);
            let tap = window_row * p.kernel_w + work.window_column;
            for (e, &sum) in tile.iter().enumerate() {
                let m = work.m0 + rows + 16 * warp + g + 8 * (e as u32 / 2);
                let channel = chunk * WGMMA_WGRAD_CHANNELS + column % WGMMA_WGRAD_CHANNELS + e as u32 % 2;
                if block < plan.column_blocks && m < p.out_channels && channel < p.in_channels {
                    let (m, channel, tap) = (m as u64, channel as u64, tap as u64);
                    let at = if CHANNELS_LAST {
                        (m * p.taps() as u64 + tap) * p.in_channels as u64 + channel
                    } else {
                        (m * p.in_channels as u64 + channel) * p.taps() as u64 + tap
                    };
                    // SAFETY: weight (m, channel, tap) of this split's gradient.
                    unsafe { *out.add((base + at) as usize) = sum };
                }
            }
        }
    }
}
