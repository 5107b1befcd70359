//! Convolution on the tensor cores (TF32, FP32 accumulation) as an implicit GEMM: per
//! group, M = batch * output pixels, N = output channels, K = taps * input channels,
//! ordered as the weights store it, so that B (the weights) is contiguous along K: the
//! channel fastest in NHWC (`w[out][kh][kw][in]`, and x's channels at one tap are
//! contiguous too), the tap fastest in NCHW (`w[out][in][kh][kw]`; x is gathered one
//! element at a time, consecutive output pixels side by side).
//!
//! The operands are staged as `TC_BM x TC_BK` tiles of A and `TC_BN x TC_BK` of B in
//! shared memory, filled by `cp.async` (16-byte copies of four consecutive K where the
//! operand allows, else one element at a time) and zero-filled outside the tensors.
//! Two kinds of kernel multiply them. On Hopper, warpgroup MMA (`wgmma`: B from shared
//! memory, rounded beforehand; A from shared memory where TFLOAT32 bulk copies rounded
//! it, else from registers rounded to TF32) in persistent blocks where a producer
//! warpgroup copies the stages while two consumer warpgroups multiply and store, in
//! turns or side by side ([`WgmmaSchedule`]). There, at stride 1 with long output rows,
//! x is staged in row strips, one per kernel row that all its taps read: NHWC x in two
//! boxes (the GEMM then transposed: output channels as `wgmma`'s M, a tile's 256
//! pixels as its N, so that each step reads 10 KB of shared memory rather than 12 for
//! as many products), NCHW x as it lies (boxes of `TC_BK` channels by
//! `NCHW_BOX_PIXELS` pixels of a row, A read transposed from them); other NCHW operands
//! that bulk copies could stage in NHWC are changed to NHWC by the host; y stays NCHW. Elsewhere `mma.sync`
//! m16n8k8 TF32 (fragments by `ldmatrix`, rounded to TF32 to nearest), every thread
//! copying and multiplying, one block per tile. Sums stay FP32,
//! in a fixed order, so results are the same from run to run. The weight gradient has
//! kernels of its own, its GEMM running over the output pixels: on `wgmma` over NCHW
//! or NHWC tensors (`warpgroup_weight_grad`), and on `mma.sync` over NHWC
//! (`weight_grad`).

#[cfg(target_arch = "nvptx64")]
mod epilogue;
#[cfg(target_arch = "nvptx64")]
mod operands;
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
mod staged_epilogue;
#[cfg(target_arch = "nvptx64")]
mod warp_mma;
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
mod warpgroup_mma;
pub mod warpgroup_weight_grad;
pub mod weight_grad;

#[cfg(target_arch = "nvptx64")]
pub(crate) use epilogue::Output;
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
pub(crate) use warpgroup_mma::input_grad_sub_pixel;
pub use warpgroup_weight_grad::WarpgroupWeightGradPlan;
pub use weight_grad::WeightGradPlan;

use super::reduce::{self, SplitEpilogueArgs};
use super::{ConvEpilogue, ConvLayout, ConvProblem, FastDiv};
use crate::launch::{
    DeviceLimits, DevicePtr, DevicePtrMut, Launch, LaunchGeometry, ScratchLayout, kernel_args,
};
use crate::tensor_map::{TensorMapElement, TensorMapMode, TensorMapPair, TensorMapSpec, TensorMapSwizzle};

/// Rows of C (output pixels) per block of the `mma.sync` kernels.
pub const TC_BM: u32 = 128;
/// Columns of C (output channels) per block.
pub const TC_BN: u32 = 128;
/// Columns of C per tile of the `wgmma` kernels on narrow problems (64 output channels
/// per group or fewer), which 128-column tiles would leave half empty.
pub const WGMMA_NARROW_BN: u32 = 64;
/// Depth of one staged slice of K (a k-tile): 32 floats, 128 bytes per row.
pub const TC_BK: u32 = 32;
/// Shared-memory stages of the `mma.sync` mainloop.
pub const TC_STAGES: u32 = 4;
/// Threads per block of the `mma.sync` kernels: 8 warps, 2 along M by 4 along N.
pub const TC_THREADS: u32 = 256;
/// Blocks resident per SM of the `mma.sync` kernels.
pub const TC_BLOCKS_PER_SM: u32 = 1;

/// Rows of C a consumer warpgroup of the `wgmma` forward kernels multiplies per tile.
pub const WGMMA_BM: u32 = 64 * WGMMA_CONSUMER_BLOCKS;
/// Blocks of 64 rows (one `wgmma` each per step of K) a consumer warpgroup multiplies.
pub const WGMMA_CONSUMER_BLOCKS: u32 = 2;
/// Threads per block of the `wgmma` kernels: a producer warpgroup that copies the
/// stages and two consumer warpgroups that multiply them and store the sums.
pub const WGMMA_THREADS: u32 = 384;
/// Stages of A in the `wgmma` forward kernels: a stage serves one k-tile, or with row
/// strips every tap of a kernel row.
pub const WGMMA_STAGES: u32 = 4;
/// Bytes of the mbarriers of one `wgmma` stage (full and empty).
pub const WGMMA_BARRIER_BYTES: u32 = 16;
/// Output channels whose bias the `wgmma` forward kernel keeps in shared memory (the
/// rest it reads from global memory), and their bytes.
pub const WGMMA_SHARED_BIAS: u32 = 2048;
pub const WGMMA_BIAS_BYTES: u32 = 4 * WGMMA_SHARED_BIAS;
/// Bytes of the `wgmma` producer's table of window origins (NHWC), 16 per row of the
/// largest tile.
pub const WGMMA_TABLE_BYTES: u32 = 16 * 2 * WGMMA_BM;

/// Pixels of one row per bulk copy of NCHW x: 128 bytes, the swizzle's span.
pub const NCHW_BOX_PIXELS: u32 = 32;
/// Bytes of an NCHW box: `TC_BK` channels of `NCHW_BOX_PIXELS` pixels.
pub const NCHW_BOX_BYTES: u32 = TC_BK * NCHW_BOX_PIXELS * 4;
/// Pixels a row strip of NCHW boxes holds beyond its tile's row: the window's width,
/// and the up to 3 pixels before it that the start of the boxes at 16-byte multiples
/// adds.
pub const STRIP_MARGIN: u32 = NCHW_BOX_PIXELS;

/// Bytes of a row strip of NCHW boxes for tiles of `tile_rows` pixels: boxes covering
/// the tile's row and the margin.
pub const fn strip_bytes(tile_rows: u32) -> u32 {
    (tile_rows + STRIP_MARGIN) * TC_BK * 4
}

/// Pixels of each of the two boxes of an NHWC row strip: together a tile's 256 and up
/// to `NHWC_STRIP_MARGIN` more of the window's width, each box a whole number of the
/// swizzle's 1024-byte spans (8 pixels), as the second box's start must be.
pub const NHWC_STRIP_BOX_PIXELS: u32 = (NHWC_STRIP_TILE_ROWS + NHWC_STRIP_MARGIN) / 2;
/// Pixels of the window's width an NHWC row strip holds beyond its tile's row.
pub const NHWC_STRIP_MARGIN: u32 = 16;
/// Pixels per tile of the kernel on NHWC row strips: N of its `wgmma` (m64n256k8).
pub const NHWC_STRIP_TILE_ROWS: u32 = 256;
const _: () = assert!(NHWC_STRIP_BOX_PIXELS.is_multiple_of(8) && NHWC_STRIP_BOX_PIXELS <= 256);

/// How a `wgmma` forward kernel schedules its tiles, and the stages it keeps in shared
/// memory. With NHWC row strips the two consumers take the tiles (`WGMMA_NARROW_BN`
/// output channels by `NHWC_STRIP_TILE_ROWS` pixels) in turns (CUTLASS's ping-pong),
/// each storing one tile while the other multiplies the next: a stage of A holds a
/// strip that several k-tiles read, so B has more stages than A. Otherwise both
/// consumers multiply each tile (`2 WGMMA_BM` rows, one half each, one B for both: half
/// the copies of B and of the producer's work per row, which bound gathers, short tiles
/// and NCHW boxes), a stage of A (a tile, or a strip of NCHW boxes) and one of B per
/// k-tile.
#[derive(Clone, Copy)]
pub struct WgmmaSchedule {
    /// Whether the consumers take the tiles in turns.
    pub ping_pong: bool,
    /// Rows of C per tile.
    pub tile_rows: u32,
    /// Bytes of a stage of A.
    pub a_bytes: u32,
    /// Stages of B.
    pub b_stages: u32,
    /// Rows (output channels) of a stage of B.
    pub b_rows: u32,
}

impl WgmmaSchedule {
    /// The schedule of the kernels with row strips (`row_strips`) or without, over NHWC
    /// x (`channels_last`) or NCHW x.
    pub const fn of(row_strips: bool, channels_last: bool) -> Self {
        if row_strips && channels_last {
            Self {
                ping_pong: true,
                tile_rows: NHWC_STRIP_TILE_ROWS,
                a_bytes: tile_bytes(2 * NHWC_STRIP_BOX_PIXELS),
                b_stages: 2 * WGMMA_STAGES,
                b_rows: WGMMA_NARROW_BN,
            }
        } else {
            let tile_rows = 2 * WGMMA_BM;
            Self {
                ping_pong: false,
                tile_rows,
                a_bytes: if row_strips {
                    strip_bytes(tile_rows)
                } else {
                    tile_bytes(tile_rows)
                },
                b_stages: WGMMA_STAGES,
                b_rows: TC_BN,
            }
        }
    }

    /// Bytes of shared memory: the bias, the producer's table, the stages of A and of
    /// B (1024-byte aligned for the swizzle), their mbarriers.
    pub const fn shared_bytes(&self) -> u32 {
        WGMMA_BIAS_BYTES
            + WGMMA_TABLE_BYTES
            + WGMMA_STAGES * (self.a_bytes + WGMMA_BARRIER_BYTES)
            + self.b_stages * (tile_bytes(self.b_rows) + WGMMA_BARRIER_BYTES)
    }
}

const _: () = assert!((WGMMA_BIAS_BYTES + WGMMA_TABLE_BYTES).is_multiple_of(1024));
const _: () = assert!(NCHW_BOX_BYTES.is_multiple_of(1024));
/// A block fits an SM's 228 KB of shared memory (1 KB of it reserved).
const _: () = assert!(WgmmaSchedule::of(true, true).shared_bytes() + 1024 <= 228 * 1024);
const _: () = assert!(WgmmaSchedule::of(true, false).shared_bytes() + 1024 <= 228 * 1024);
const _: () = assert!(WgmmaSchedule::of(false, true).shared_bytes() + 1024 <= 228 * 1024);

/// Fewest k-tiles of a split of K: fewer would spend more of each part filling and
/// draining the pipeline than multiplying.
pub const MIN_SPLIT_K_TILES: u32 = 16;

/// Bytes of a staged operand tile of `rows` rows.
pub const fn tile_bytes(rows: u32) -> u32 {
    rows * TC_BK * 4
}

const _: () = assert!(TC_BM == TC_BN && TC_BK == 32 && TC_THREADS == 256 && TC_STAGES >= 2);
const _: () = assert!(TC_BN == 128 && WGMMA_THREADS == 3 * 128 && WGMMA_STAGES >= 2);

/// What the tensor cores multiply: f32 rounded to TF32, or 16-bit floats as they are
/// (16 K per `wgmma` step where TF32 takes 8: the same 32 bytes of each row).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorCoreOperand {
    Tf32,
    Bf16,
    F16,
}

impl TensorCoreOperand {
    /// Bytes of one element in the tensors.
    pub const fn bytes(self) -> u32 {
        match self {
            Self::Tf32 => 4,
            Self::Bf16 | Self::F16 => 2,
        }
    }

    /// Channels of a k-tile of one tap: a staged row's 128 bytes.
    pub const fn k_tile_channels(self) -> u32 {
        TC_BK * 4 / self.bytes()
    }

    /// The element of the bulk copies' tensor maps: TF32 operands rounded on the way
    /// where `round` (else already TF32 values), 16-bit ones as they are.
    const fn map_element(self, round: bool) -> TensorMapElement {
        match self {
            Self::Tf32 if round => TensorMapElement::Tf32,
            Self::Tf32 => TensorMapElement::F32,
            Self::Bf16 => TensorMapElement::Bf16,
            Self::F16 => TensorMapElement::F16,
        }
    }
}

/// How a tensor-core pass is launched. Its GEMM has `m_tiles x groups x n_tiles` tiles
/// (M by the kernel's rows per tile, `TC_BN` output channels of a group). The
/// `mma.sync` kernels take one per block (grid x, y, z); the `wgmma` kernels are
/// persistent: `blocks` blocks take every `blocks`-th unit of work, a tile's k-tiles
/// of one split of K, output channels fastest, splits slowest. Split, each part
/// writes its partial sums to a scratch copy of y, which the split epilogue adds in
/// order.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorCorePlan {
    pub m_tiles: u32,
    pub n_tiles: u32,
    /// Columns of C per tile: `TC_BN`, or `WGMMA_NARROW_BN` on `wgmma` with bulk copies
    /// for groups of that many output channels or fewer, and on NHWC row strips.
    pub tile_n: u32,
    pub groups: u32,
    pub blocks: u32,
    /// Whether x is copied four channels at a time (NHWC, channels per group a
    /// multiple of 4), as 1 or 0.
    pub a_vector: u32,
    /// Whether w is copied four K at a time (K a multiple of 4), as 1 or 0.
    pub b_vector: u32,
    /// Whether a k-tile is one tap of `TC_BK` channels (NHWC, channels per group a
    /// multiple of `TC_BK`, or bulk copies), as 1 or 0 (K in the weights' order).
    pub channel_tiles: u32,
    /// Whether bulk tensor copies (TMA) stage A and B, as 1 or 0: on `wgmma`, where
    /// the tensor maps can describe the problem; A by im2col over NHWC x, or in row
    /// strips.
    pub bulk_copies: u32,
    /// Whether A is staged by row strips, as 1 or 0 (stride 1, bulk copies): a tile is
    /// part of one output row, and per kernel row and `TC_BK` channels one strip of the
    /// row of x that its pixels' windows read serves every tap of that kernel row (the
    /// taps' k-tiles read it `dilation_w` pixels apart). The rows of the GEMM are then
    /// output rows padded to `row_pitch`, whole tiles, the pixels past `out_w`
    /// computed and dropped. NHWC x: a strip is two boxes of `NHWC_STRIP_BOX_PIXELS`
    /// pixels. NCHW x, as it lies: boxes of `NCHW_BOX_PIXELS` pixels of each channel
    /// that cover a tile's row and the margin, from a 16-byte multiple; B is the weights
    /// in [`box_filter_index`] order.
    pub row_strips: u32,
    /// Rows of the GEMM per output row: `out_w`, or with row strips the tiles' rows
    /// that cover it (division by it).
    pub row_pitch: FastDiv,
    /// The k-tiles of the GEMM: `TC_BK` K each, or with channel tiles, one per tap and
    /// `TC_BK` channels (a partial last chunk zero-filled by the bulk copies).
    pub k_tiles: u32,
    /// Whether x and w are channels last (NHWC), as 1 or 0 (NCHW).
    pub channels_last: u32,
    /// Whether y (and the residual) are channels last, as 1 or 0.
    pub y_channels_last: u32,
    /// Whether the kernel is on `wgmma` (sm_90a), as 1 or 0 (`mma.sync`).
    pub warpgroup_mma: u32,
    /// Parts K is split into (1: not split), `split_k_tiles` k-tiles each but the last.
    pub splits: u32,
    pub split_k_tiles: u32,
    /// The operands' type: TF32, or on NHWC bulk copies ([`Self::forward_16_bit`]) a
    /// 16-bit float, x, w and y all of it.
    pub operand: TensorCoreOperand,
}

impl TensorCorePlan {
    /// The plan of the forward pass of `problem` over tensors in `layout`, on `wgmma`
    /// where the device's kernels have it.
    pub const fn forward(problem: &ConvProblem, layout: ConvLayout, device: &DeviceLimits) -> Self {
        Self::forward_staged(problem, layout, device, true)
    }

    /// The plan of the forward pass of `problem` over NHWC tensors on `wgmma` with
    /// im2col boxes in tiles of `TC_BN` output channels, K whole (neither row strips nor
    /// splits): the one its kernels with an epilogue of their own take
    /// ([`SubPixelPlan`](super::sub_pixel::SubPixelPlan)), where the device has them
    /// and the tensor maps describe the problem.
    pub const fn im2col(problem: &ConvProblem, device: &DeviceLimits) -> Option<Self> {
        let plan = Self::forward_staged(problem, ConvLayout::Nhwc, device, false);
        let im2col = plan.warpgroup_mma == 1 && plan.bulk_copies == 1 && plan.channels_last == 1;
        if im2col && plan.row_strips == 0 && plan.splits == 1 && plan.tile_n == TC_BN {
            Some(plan)
        } else {
            None
        }
    }

    /// [`Self::forward`], with row strips and splits of K where `strips_and_splits`.
    const fn forward_staged(
        problem: &ConvProblem,
        layout: ConvLayout,
        device: &DeviceLimits,
        strips_and_splits: bool,
    ) -> Self {
        let y_channels_last = matches!(layout, ConvLayout::Nhwc);
        let warpgroup_mma = device.warpgroup_mma;
        // The bulk copies stage NHWC operands many times faster than the NCHW producer
        // gathers them, far more than x's change of layout costs; NCHW boxes spare
        // that change.
        let maps = warpgroup_mma && device.tensor_maps;
        let boxes_rows = WgmmaSchedule::of(true, false).tile_rows;
        let nchw_boxes = maps
            && !y_channels_last
            && nchw_boxes_fit(problem)
            && row_strips_fit(problem, boxes_rows, STRIP_MARGIN - 3);
        let bulk_copies = nchw_boxes || (maps && bulk_copies_fit(problem));
        let nhwc_strips = strips_and_splits
            && bulk_copies
            && row_strips_fit(problem, NHWC_STRIP_TILE_ROWS, NHWC_STRIP_MARGIN);
        let row_strips = nchw_boxes || nhwc_strips;
        let channels_last = y_channels_last || (bulk_copies && !nchw_boxes);
        let rows = if warpgroup_mma {
            WgmmaSchedule::of(row_strips, channels_last).tile_rows
        } else {
            TC_BM
        };
        let row_pitch = if row_strips {
            strips_row_pitch(problem, rows)
        } else {
            problem.out_w
        };
        let m = problem.batch as u64 * problem.out_h as u64 * row_pitch as u64;
        let m_tiles = m.div_ceil(rows as u64) as u32;
        let tile_n =
            if (bulk_copies && problem.out_per_group() <= WGMMA_NARROW_BN) || (nhwc_strips && !nchw_boxes) {
                WGMMA_NARROW_BN
            } else {
                TC_BN
            };
        let n_tiles = problem.out_per_group().div_ceil(tile_n);
        let tiles = m_tiles as u64 * problem.groups as u64 * n_tiles as u64;
        let in_group = problem.in_per_group();
        let channel_tiles = bulk_copies || (channels_last && in_group.is_multiple_of(TC_BK));
        let k_tiles = if channel_tiles {
            problem.taps() * in_group.div_ceil(TC_BK)
        } else {
            (in_group * problem.taps()).div_ceil(TC_BK)
        };
        let splits = if strips_and_splits && warpgroup_mma && problem.output_count() < 1 << 31 {
            split_count(tiles, k_tiles, device.multiprocessors)
        } else {
            1
        };
        let split_k_tiles = k_tiles.div_ceil(splits);
        let splits = k_tiles.div_ceil(split_k_tiles);
        let units = tiles * splits as u64;
        Self {
            m_tiles,
            n_tiles,
            tile_n,
            groups: problem.groups,
            blocks: if units < device.multiprocessors as u64 {
                units as u32
            } else {
                device.multiprocessors
            },
            a_vector: (channels_last && in_group.is_multiple_of(4)) as u32,
            b_vector: (in_group * problem.taps()).is_multiple_of(4) as u32,
            channel_tiles: channel_tiles as u32,
            bulk_copies: bulk_copies as u32,
            row_strips: row_strips as u32,
            row_pitch: FastDiv::new(row_pitch),
            k_tiles,
            channels_last: channels_last as u32,
            y_channels_last: y_channels_last as u32,
            warpgroup_mma: warpgroup_mma as u32,
            splits,
            split_k_tiles,
            operand: TensorCoreOperand::Tf32,
        }
    }

    /// The plan of the forward pass of `problem` over NHWC x and w of the 16-bit
    /// `operand` on `wgmma` with bulk copies (row strips or im2col boxes, as the TF32
    /// plan), y in `y_layout`, where the device has them and they fit: channels per
    /// group a multiple of a k-tile's. Split, the parts' sums are f32 and the split
    /// epilogue rounds y once.
    pub const fn forward_16_bit(
        problem: &ConvProblem,
        operand: TensorCoreOperand,
        y_layout: ConvLayout,
        device: &DeviceLimits,
    ) -> Option<Self> {
        Self::forward(problem, ConvLayout::Nhwc, device).of_operand(problem, operand, y_layout)
    }

    /// This TF32 plan of `problem` for tensors of the 16-bit `operand`, y in
    /// `y_layout`: where it stages NHWC x by bulk copies (row strips or im2col boxes)
    /// and x's channels per group are a multiple of a k-tile's.
    pub const fn of_operand(
        self,
        problem: &ConvProblem,
        operand: TensorCoreOperand,
        y_layout: ConvLayout,
    ) -> Option<Self> {
        let channels = operand.k_tile_channels();
        let bulk = self.warpgroup_mma == 1 && self.bulk_copies == 1 && self.channels_last == 1;
        if !bulk || !problem.in_per_group().is_multiple_of(channels) {
            return None;
        }
        // K split as the TF32 plan splits it, over half as many k-tiles.
        let k_tiles = problem.taps() * (problem.in_per_group() / channels);
        let split_k_tiles = k_tiles.div_ceil(self.splits);
        Some(Self {
            k_tiles,
            splits: k_tiles.div_ceil(split_k_tiles),
            split_k_tiles,
            operand,
            y_channels_last: matches!(y_layout, ConvLayout::Nhwc) as u32,
            ..self
        })
    }

    /// The output pixels of the tile whose first GEMM row is `m0`: the first one's
    /// index in the batch (`image * out_pixels + pixel`), and how many of the tile's
    /// rows have one, consecutive from there (the rest lie past the batch or, with
    /// row strips, past `out_w` in the tile's output row).
    #[inline(always)]
    pub const fn tile_pixels(&self, problem: &ConvProblem, m0: u32) -> (u32, u32) {
        let pixels = problem.batch * problem.out_pixels();
        let (first, live) = if self.row_strips == 1 {
            let (row, column) = self.row_pitch.divmod(m0);
            (row * problem.out_w + column, problem.out_w.saturating_sub(column))
        } else {
            (m0, u32::MAX)
        };
        let live = if live < pixels.saturating_sub(first) {
            live
        } else {
            pixels.saturating_sub(first)
        };
        (first, live)
    }

    /// The units of work of the `wgmma` kernels: every tile once per split.
    pub const fn units(&self) -> u32 {
        self.m_tiles * self.groups * self.n_tiles * self.splits
    }

    /// Whether row strips stage NCHW x as it lies (in boxes of its rows).
    pub const fn nchw_boxes(&self) -> bool {
        self.row_strips == 1 && self.channels_last == 0
    }

    /// The layout of x and w.
    pub const fn layout(&self) -> ConvLayout {
        ConvLayout::of_channels_last(self.channels_last)
    }

    /// The layout of y and the residual.
    pub const fn output_layout(&self) -> ConvLayout {
        ConvLayout::of_channels_last(self.y_channels_last)
    }

    /// The tensor maps of the bulk copies, when the plan takes them: NHWC x for
    /// im2col (`[C][W][H][N]`, boxes of `TC_BK` channels of a tile's pixels) or in
    /// row strips (boxes of `TC_BK` channels of `NHWC_STRIP_BOX_PIXELS` pixels of a row),
    /// NCHW x in boxes of its rows, and w as `[in / groups][taps][out]` (boxes of
    /// `TC_BK` x 1 x `tile_n`).
    pub fn tensor_maps(
        &self,
        problem: &ConvProblem,
        x: DevicePtr<f32>,
        w: DevicePtr<f32>,
    ) -> Option<[TensorMapSpec; 2]> {
        if self.bulk_copies == 0 {
            return None;
        }
        let p = problem;
        // NHWC strips and im2col tiles are rounded on the way: the consumers read them
        // straight from shared memory.
        let patches = if self.nchw_boxes() {
            nchw_rows_map(p, x, TC_BK)
        } else if self.row_strips == 1 {
            TensorMapSpec::tiled_of(
                self.operand.map_element(true),
                x.address(),
                &[
                    p.in_channels as u64,
                    p.width as u64,
                    p.height as u64,
                    p.batch as u64,
                ],
                &[self.operand.k_tile_channels(), NHWC_STRIP_BOX_PIXELS, 1, 1],
                TensorMapSwizzle::Bytes128,
            )
        } else {
            let map = im2col_map(p, x, self.operand, WgmmaSchedule::of(false, true).tile_rows);
            TensorMapSpec {
                element: self.operand.map_element(true),
                ..map
            }
        };
        let in_group = p.in_per_group() as u64;
        let filters = TensorMapSpec::tiled_of(
            self.operand.map_element(false),
            w.address(),
            &[in_group, p.taps() as u64, p.out_channels as u64],
            &[self.operand.k_tile_channels(), 1, self.tile_n],
            TensorMapSwizzle::Bytes128,
        );
        Some([patches, filters])
    }

    /// The scratch of the partial sums of a split K: none when it is not split.
    pub const fn partials_scratch(&self, problem: &ConvProblem) -> ScratchLayout {
        reduce::partials_scratch(self.splits, problem.output_count())
    }

    /// The forward launches: `y = epilogue(conv(x, w))` in the plan's layout. Split,
    /// the GEMM writes its partial sums to the scratch's partials and the second
    /// launch adds them into y.
    pub fn forward_launches(
        &self,
        problem: &ConvProblem,
        x: DevicePtr<f32>,
        w: DevicePtr<f32>,
        epilogue: ConvEpilogue,
        y: DevicePtrMut<f32>,
        scratch: ForwardScratch,
    ) -> (Launch<TensorCoreArgs>, Option<Launch<SplitEpilogueArgs>>) {
        let ForwardScratch { maps, partials } = scratch;
        if self.splits <= 1 {
            return (self.gemm_launch(problem, x, w, epilogue, y, maps), None);
        }
        let partials = partials.cast::<f32>();
        let layout = self.output_layout();
        let kernel = match self.operand {
            TensorCoreOperand::Tf32 => reduce::CONV_SPLIT_EPILOGUE,
            TensorCoreOperand::Bf16 => reduce::CONV_SPLIT_EPILOGUE_BF16,
            TensorCoreOperand::F16 => reduce::CONV_SPLIT_EPILOGUE_F16,
        };
        let finish = reduce::split_epilogue(
            kernel,
            problem,
            layout,
            self.splits,
            partials.as_const(),
            epilogue,
            y,
        );
        let gemm = self.gemm_launch(problem, x, w, ConvEpilogue::NONE, partials, maps);
        (gemm, Some(finish))
    }

    /// The GEMM's launch, writing `epilogue(conv(x, w))` to y (or to the partials of
    /// each split of K, where `y` is the first, the epilogue none).
    const fn gemm_launch(
        &self,
        problem: &ConvProblem,
        x: DevicePtr<f32>,
        w: DevicePtr<f32>,
        epilogue: ConvEpilogue,
        y: DevicePtrMut<f32>,
        maps: DevicePtr<TensorMapPair>,
    ) -> Launch<TensorCoreArgs> {
        let geometry = if self.warpgroup_mma == 1 {
            LaunchGeometry {
                grid: [self.blocks as u64, 1, 1],
                threads: WGMMA_THREADS,
                shared_bytes: WgmmaSchedule::of(self.row_strips == 1, self.channels_last == 1).shared_bytes(),
            }
        } else {
            LaunchGeometry {
                grid: [self.m_tiles as u64, self.groups as u64, self.n_tiles as u64],
                threads: TC_THREADS,
                shared_bytes: TC_STAGES * (tile_bytes(TC_BM) + tile_bytes(TC_BN)),
            }
        };
        let args = TensorCoreArgs {
            x,
            w,
            epilogue,
            y,
            maps,
            problem: *problem,
            plan: *self,
        };
        let narrow = self.tile_n == WGMMA_NARROW_BN;
        let (strips, bulk) = (self.row_strips == 1, self.bulk_copies == 1);
        let y_first = self.y_channels_last == 0;
        let kernel = match (self.channels_last == 1, self.warpgroup_mma == 1) {
            _ if matches!(self.operand, TensorCoreOperand::Bf16) && strips && y_first => {
                CONV_FORWARD_NHWC_STRIPS_BF16_WGMMA_NCHW_Y
            }
            _ if matches!(self.operand, TensorCoreOperand::F16) && strips && y_first => {
                CONV_FORWARD_NHWC_STRIPS_F16_WGMMA_NCHW_Y
            }
            _ if matches!(self.operand, TensorCoreOperand::Bf16) && strips => {
                CONV_FORWARD_NHWC_STRIPS_BF16_WGMMA
            }
            _ if matches!(self.operand, TensorCoreOperand::F16) && strips => {
                CONV_FORWARD_NHWC_STRIPS_F16_WGMMA
            }
            _ if matches!(self.operand, TensorCoreOperand::Bf16) && narrow => {
                CONV_FORWARD_NHWC_IM2COL_BF16_WGMMA_NARROW
            }
            _ if matches!(self.operand, TensorCoreOperand::Bf16) => CONV_FORWARD_NHWC_IM2COL_BF16_WGMMA,
            _ if matches!(self.operand, TensorCoreOperand::F16) && narrow => {
                CONV_FORWARD_NHWC_IM2COL_F16_WGMMA_NARROW
            }
            _ if matches!(self.operand, TensorCoreOperand::F16) => CONV_FORWARD_NHWC_IM2COL_F16_WGMMA,
            (true, false) => CONV_FORWARD_NHWC_TF32,
            (false, false) => CONV_FORWARD_NCHW_TF32,
            (true, true) if strips => CONV_FORWARD_NHWC_STRIPS_TF32_WGMMA,
            (true, true) if bulk && narrow => CONV_FORWARD_NHWC_IM2COL_TF32_WGMMA_NARROW,
            (true, true) if bulk => CONV_FORWARD_NHWC_IM2COL_TF32_WGMMA,
            (true, true) => CONV_FORWARD_NHWC_TF32_WGMMA,
            (false, true) if strips && narrow => CONV_FORWARD_NCHW_BOXES_TF32_WGMMA_NARROW,
            (false, true) if strips => CONV_FORWARD_NCHW_BOXES_TF32_WGMMA,
            (false, true) => CONV_FORWARD_NCHW_TF32_WGMMA,
        };
        Launch::new(kernel, geometry, args)
    }
}

/// Parts to split K into where `tiles` tiles leave SMs idle: as many as give every
/// SM a unit of work at most, each of `MIN_SPLIT_K_TILES` k-tiles at least. The
/// whole waves of units this leaves keep every part equally long.
const fn split_count(tiles: u64, k_tiles: u32, multiprocessors: u32) -> u32 {
    let fill = multiprocessors as u64 / tiles;
    let most = (k_tiles / MIN_SPLIT_K_TILES) as u64;
    let splits = if fill < most { fill } else { most };
    if splits < 1 { 1 } else { splits as u32 }
}

/// Where a tensor-core forward pass's scratch lies: the [`TensorCorePlan::tensor_maps`]
/// in device memory (null without them), and the partial sums of a split K (laid out by
/// [`TensorCorePlan::partials_scratch`]).
#[derive(Debug, Clone, Copy)]
pub struct ForwardScratch {
    pub maps: DevicePtr<TensorMapPair>,
    pub partials: DevicePtrMut<u8>,
}

/// The im2col tensor map of NHWC x (`[C][W][H][N]`, swizzled) of `operand`s: boxes of
/// a k-tile's channels (128 bytes) of `pixels` output pixels' window taps, zeros in
/// the padding.
pub(crate) fn im2col_map(
    problem: &ConvProblem,
    x: DevicePtr<f32>,
    operand: TensorCoreOperand,
    pixels: u32,
) -> TensorMapSpec {
    let p = problem;
    let (c, bytes) = (p.in_channels as u64, operand.bytes() as u64);
    let window = |kernel: u32, dilation: u32| ((kernel - 1) * dilation) as i32;
    TensorMapSpec {
        address: x.address(),
        rank: 4,
        dims: [c, p.width as u64, p.height as u64, p.batch as u64, 0],
        strides: [
            c * bytes,
            c * bytes * p.width as u64,
            c * bytes * p.pixels() as u64,
            0,
        ],
        element_strides: [1, p.stride_w, p.stride_h, 1, 0],
        mode: TensorMapMode::Im2col {
            lower: [-(p.pad_w as i32), -(p.pad_h as i32), 0],
            upper: [
                p.pad_w as i32 - window(p.kernel_w, p.dilation_w),
                p.pad_h as i32 - window(p.kernel_h, p.dilation_h),
                0,
            ],
            channels: operand.k_tile_channels(),
            pixels,
        },
        swizzle: TensorMapSwizzle::Bytes128,
        element: operand.map_element(false),
    }
}

/// The tensor map of NCHW x as `[w][h][c][n]`, swizzled: boxes of one row of
/// `TC_BK` pixels of `channels` channels, zeros past the edges.
pub(crate) fn nchw_rows_map(problem: &ConvProblem, x: DevicePtr<f32>, channels: u32) -> TensorMapSpec {
    let p = problem;
    TensorMapSpec::tiled(
        x.address(),
        &[
            p.width as u64,
            p.height as u64,
            p.in_channels as u64,
            p.batch as u64,
        ],
        &[TC_BK, 1, channels, 1],
        TensorMapSwizzle::Bytes128,
    )
}

/// The GEMM rows per output row with row strips: whole tiles of `tile_rows`.
const fn strips_row_pitch(p: &ConvProblem, tile_rows: u32) -> u32 {
    p.out_w.div_ceil(tile_rows) * tile_rows
}

/// Whether row strips of tiles of `tile_rows` pixels can stage `problem`'s x (in a
/// layout the bulk copies take): stride 1 (a strip's pixels are consecutive in x),
/// output rows that whole tiles cover with at most 1/16 more (computed and dropped),
/// the padded rows' pixels under 2^31 (the divisions' range), and windows whose width
/// is `window` pixels at most (what the strip holds past the tile's row).
const fn row_strips_fit(p: &ConvProblem, tile_rows: u32, window: u32) -> bool {
    let pitch = strips_row_pitch(p, tile_rows) as u64;
    p.stride_h == 1
        && p.stride_w == 1
        && pitch * 16 <= p.out_w as u64 * 17
        && (p.batch as u64 * p.out_h as u64 * pitch) < 1 << 31
        && (p.kernel_w as u64 - 1) * p.dilation_w as u64 <= window as u64
}

/// Whether NCHW boxes can stage `problem`'s x where row strips fit: rows of x in
/// 16-byte multiples within the maps' 2^40-byte strides, and channels per group a
/// multiple of the 8 that [`box_filter_index`] interleaves, their chunks in their
/// group.
const fn nchw_boxes_fit(p: &ConvProblem) -> bool {
    let in_group = p.in_per_group();
    p.width.is_multiple_of(4)
        && (p.in_channels as u64 * p.pixels() as u64 * 4) < 1 << 40
        && in_group.is_multiple_of(8)
        && (p.groups == 1 || in_group.is_multiple_of(TC_BK))
}

/// Where weight `i` of `problem` (NCHW, `[out][in / groups][taps]`) lies in the order
/// the NCHW boxes' B takes: `[out][taps][in / groups]`, each whole 8 channels
/// interleaved as 0, 2, 4, 6, 1, 3, 5, 7. The consumers read A's columns k and k + 4
/// of an 8-wide step from channels 2k and 2k + 1: rows of the swizzled box whose
/// 16-byte chunks differ for all four k, so a warp's transposed reads meet no bank
/// twice.
pub const fn box_filter_index(problem: &ConvProblem, i: u64) -> u64 {
    let (in_group, taps) = (problem.in_per_group() as u64, problem.taps() as u64);
    let (out, channel, tap) = (i / (in_group * taps), i / taps % in_group, i % taps);
    let within = channel % 8;
    let place = if channel - within + 8 <= in_group {
        channel - within + within / 2 + 4 * (within % 2)
    } else {
        channel
    };
    (out * taps + tap) * in_group + place
}

/// Whether the tensor maps of the bulk copies can describe `problem` (NHWC): 16-byte
/// strides (channels per group a multiple of 4), channel chunks that stay in their
/// group, and the im2col limits (window corners within [-128, 127], strides at most 8,
/// offsets under 256).
const fn bulk_copies_fit(p: &ConvProblem) -> bool {
    let in_group = p.in_per_group();
    in_group.is_multiple_of(4)
        && (p.groups == 1 || in_group.is_multiple_of(TC_BK))
        && p.stride_h <= 8
        && p.stride_w <= 8
        && corners_fit(p.pad_h, p.kernel_h, p.dilation_h)
        && corners_fit(p.pad_w, p.kernel_w, p.dilation_w)
}

/// Whether the im2col corners along one axis (`-pad` and `pad - window`) lie within
/// [-128, 127] and the window's last offset under 255.
const fn corners_fit(pad: u32, kernel: u32, dilation: u32) -> bool {
    let window = (kernel - 1) as i64 * dilation as i64;
    let upper = pad as i64 - window;
    pad <= 128 && window < 255 && upper >= -128 && upper <= 127
}

kernel_args! {
    /// The tensor-core forward pass's arguments: `y = epilogue(conv(x, w))` in the
    /// plan's layout.
    pub struct TensorCoreArgs {
        pub x: DevicePtr<f32>,
        pub w: DevicePtr<f32>,
        pub epilogue: ConvEpilogue,
        pub y: DevicePtrMut<f32>,
        pub maps: DevicePtr<TensorMapPair>,
        pub problem: ConvProblem,
        pub plan: TensorCorePlan,
    }
    /// The TF32 forward pass over NHWC tensors on `mma.sync`.
    pub const CONV_FORWARD_NHWC_TF32 = "conv_forward_nhwc_tf32" =>
        warp_mma::forward_nhwc, bounds(TC_THREADS, TC_BLOCKS_PER_SM);
    /// The TF32 forward pass over NCHW tensors on `mma.sync`.
    pub const CONV_FORWARD_NCHW_TF32 = "conv_forward_nchw_tf32" =>
        warp_mma::forward_nchw, bounds(TC_THREADS, TC_BLOCKS_PER_SM);
    /// The TF32 forward pass over NHWC tensors on `wgmma`, x gathered by `cp.async`.
    pub const CONV_FORWARD_NHWC_TF32_WGMMA = "conv_forward_nhwc_tf32_wgmma" =>
        warpgroup_mma::forward::<f32, true, false, false, 16>,
        bounds(WGMMA_THREADS, 1), requires("sm_90a");
    /// The TF32 forward pass over NHWC tensors on `wgmma`, x staged by im2col copies.
    pub const CONV_FORWARD_NHWC_IM2COL_TF32_WGMMA = "conv_forward_nhwc_im2col_tf32_wgmma" =>
        warpgroup_mma::forward::<f32, true, true, false, 16>,
        bounds(WGMMA_THREADS, 1), requires("sm_90a");
    /// The same in tiles of `WGMMA_NARROW_BN` output channels.
    pub const CONV_FORWARD_NHWC_IM2COL_TF32_WGMMA_NARROW = "conv_forward_nhwc_im2col_tf32_wgmma_narrow" =>
        warpgroup_mma::forward::<f32, true, true, false, 8>,
        bounds(WGMMA_THREADS, 1), requires("sm_90a");
    /// The TF32 forward pass over NHWC tensors on `wgmma`, x staged by row strips, in
    /// tiles of `WGMMA_NARROW_BN` output channels by `NHWC_STRIP_TILE_ROWS` pixels.
    pub const CONV_FORWARD_NHWC_STRIPS_TF32_WGMMA = "conv_forward_nhwc_strips_tf32_wgmma" =>
        warpgroup_mma::forward::<f32, true, true, true, 8>,
        bounds(WGMMA_THREADS, 1), requires("sm_90a");
    /// The same over bf16 tensors ([`TensorCorePlan::forward_16_bit`]): y rounded once
    /// to bf16, its epilogue from the registers (a bias, ReLU or none).
    pub const CONV_FORWARD_NHWC_STRIPS_BF16_WGMMA = "conv_forward_nhwc_strips_bf16_wgmma" =>
        warpgroup_mma::forward::<half::bf16, true, true, true, 8>,
        bounds(WGMMA_THREADS, 1), requires("sm_90a");
    /// The same over f16 tensors.
    pub const CONV_FORWARD_NHWC_STRIPS_F16_WGMMA = "conv_forward_nhwc_strips_f16_wgmma" =>
        warpgroup_mma::forward::<half::f16, true, true, true, 8>,
        bounds(WGMMA_THREADS, 1), requires("sm_90a");
    /// The bf16 kernel on row strips writing NCHW y, in aligned 16-byte runs.
    pub const CONV_FORWARD_NHWC_STRIPS_BF16_WGMMA_NCHW_Y = "conv_forward_nhwc_strips_bf16_wgmma_nchw_y" =>
        warpgroup_mma::forward_nchw_y::<half::bf16>,
        bounds(WGMMA_THREADS, 1), requires("sm_90a");
    /// The same over f16 tensors.
    pub const CONV_FORWARD_NHWC_STRIPS_F16_WGMMA_NCHW_Y = "conv_forward_nhwc_strips_f16_wgmma_nchw_y" =>
        warpgroup_mma::forward_nchw_y::<half::f16>,
        bounds(WGMMA_THREADS, 1), requires("sm_90a");
    /// The im2col forward pass over bf16 tensors ([`TensorCorePlan::forward_16_bit`]),
    /// y rounded once in its register epilogue.
    pub const CONV_FORWARD_NHWC_IM2COL_BF16_WGMMA = "conv_forward_nhwc_im2col_bf16_wgmma" =>
        warpgroup_mma::forward::<half::bf16, true, true, false, 16>,
        bounds(WGMMA_THREADS, 1), requires("sm_90a");
    /// The same in tiles of `WGMMA_NARROW_BN` output channels.
    pub const CONV_FORWARD_NHWC_IM2COL_BF16_WGMMA_NARROW = "conv_forward_nhwc_im2col_bf16_wgmma_narrow" =>
        warpgroup_mma::forward::<half::bf16, true, true, false, 8>,
        bounds(WGMMA_THREADS, 1), requires("sm_90a");
    /// The im2col forward pass over f16 tensors.
    pub const CONV_FORWARD_NHWC_IM2COL_F16_WGMMA = "conv_forward_nhwc_im2col_f16_wgmma" =>
        warpgroup_mma::forward::<half::f16, true, true, false, 16>,
        bounds(WGMMA_THREADS, 1), requires("sm_90a");
    /// The same in tiles of `WGMMA_NARROW_BN` output channels.
    pub const CONV_FORWARD_NHWC_IM2COL_F16_WGMMA_NARROW = "conv_forward_nhwc_im2col_f16_wgmma_narrow" =>
        warpgroup_mma::forward::<half::f16, true, true, false, 8>,
        bounds(WGMMA_THREADS, 1), requires("sm_90a");
    /// The TF32 forward pass over NCHW tensors on `wgmma`, x gathered by `cp.async`.
    pub const CONV_FORWARD_NCHW_TF32_WGMMA = "conv_forward_nchw_tf32_wgmma" =>
        warpgroup_mma::forward::<f32, false, false, false, 16>,
        bounds(WGMMA_THREADS, 1), requires("sm_90a");
    /// The TF32 forward pass over NCHW tensors on `wgmma`, x staged by NCHW boxes.
    pub const CONV_FORWARD_NCHW_BOXES_TF32_WGMMA = "conv_forward_nchw_boxes_tf32_wgmma" =>
        warpgroup_mma::forward::<f32, false, true, true, 16>,
        bounds(WGMMA_THREADS, 1), requires("sm_90a");
    /// The same in tiles of `WGMMA_NARROW_BN` output channels.
    pub const CONV_FORWARD_NCHW_BOXES_TF32_WGMMA_NARROW = "conv_forward_nchw_boxes_tf32_wgmma_narrow" =>
        warpgroup_mma::forward::<f32, false, true, true, 8>,
        bounds(WGMMA_THREADS, 1), requires("sm_90a");
    entry points in ENTRY_POINTS;
}
