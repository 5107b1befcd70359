//! The forward pass on warpgroup MMA (`wgmma`, sm_90a): persistent blocks of three
//! warpgroups. The producer warpgroup copies k-tiles of A (`WGMMA_BM` rows) and B
//! (the plan's `tile_n` rows: 128, or 64 for narrow problems) into `WGMMA_STAGES`
//! stages, by bulk tensor copies (TMA: im2col over NHWC x, or strips of boxes along
//! NCHW x's rows) where the plan takes them, else with `cp.async`; each of the two
//! consumer warpgroups multiplies its 128 rows by the tile's columns straight from the
//! swizzled stages (A through registers, rounded to TF32 on the way; B, which the tensor cores
//! read from shared memory as TF32, rounded by the host beforehand) and stores its
//! sums, while the producer already copies the next tile's stages. Full and empty
//! mbarriers per stage order the two sides.

use super::epilogue::{TileOrigin, WarpTiles, bias_sums, store_plain};
use super::operands::{
    Filters, KTiles, NchwPatches, Operand, Patches, ScalarFilters, ScalarPatches, SharedOrigins, Stagers,
    VectorFilters, VectorPatches, staged,
};
use super::staged_epilogue::store_staged;
use super::*;
use crate::device::{
    PIPELINE_BARRIER_BYTES, Shuffle, StagePipeline, WarpgroupAccumulators, async_copy_commit,
    async_copy_wait, block_idx_x, fence_async_shared, fence_tensor_map, grid_dim_x, lane_id, load_matrix_x4,
    load_shared_f32, set_max_registers, shared_base, store_shared_f32, swizzled_k_major_descriptor,
    sync_group, sync_threads, thread_idx_x, to_tf32, warpgroup_commit, warpgroup_fence, warpgroup_wait,
};
use crate::tensor_map::TensorMap;

/// Threads of a warpgroup.
const WARPGROUP: u32 = 128;
/// Rows of the tile each consumer warpgroup multiplies (two `wgmma` of 64 rows).
const CONSUMER_ROWS: u32 = WGMMA_BM / 2;
/// Staged rows per producer thread: of A (NHWC), of A (NCHW), of B.
const A_ROWS: usize = (WGMMA_BM * TC_BK / 4 / WARPGROUP) as usize;
const NCHW_ROWS: usize = (WGMMA_BM / WARPGROUP) as usize;
const B_ROWS: usize = (TC_BN * TC_BK / 4 / WARPGROUP) as usize;
/// Bytes of a stage: A then B (of `TC_BN` rows at most).
const STAGE_BYTES: u32 = WGMMA_A_BYTES + tile_bytes(TC_BN);
/// Bytes of an NCHW box (`TC_BK` rows of channels).
const BOX_BYTES: u32 = TC_BK * NCHW_BOX_PIXELS * 4;
/// Where the second consumer's staged epilogue starts in the A of the last stage, the
/// first's at its start: `tile_bytes(CONSUMER_ROWS)` each, clear of the other's reads
/// in both layouts. A tile's rows of K: the first consumer reads the first half. An
/// NCHW strip: the first reads boxes 0 to 4 (its 128 pixels up to 3 into the strip),
/// the second boxes 4 to 8, so the second stages in the last four.
const STAGING_STEP: u32 = WGMMA_A_BYTES - tile_bytes(CONSUMER_ROWS);
const _: () = assert!(STAGING_STEP >= tile_bytes(CONSUMER_ROWS) && STAGING_STEP >= 5 * BOX_BYTES);

/// Registers per thread of the producer and of the consumers. Together they may take
/// no more than the block got at launch (the 64K of the SM over its threads, in steps
/// of 8): a consumer's `setmaxnreg.inc` waits for registers that never come otherwise.
const PRODUCER_REGISTERS: u32 = 104;
const CONSUMER_REGISTERS: u32 = 200;
const LAUNCH_REGISTERS: u32 = 65536 / WGMMA_THREADS / 8 * 8;

const _: () = assert!(PIPELINE_BARRIER_BYTES == WGMMA_BARRIER_BYTES && CONSUMER_ROWS == 128);
const _: () = assert!(PRODUCER_REGISTERS + 2 * CONSUMER_REGISTERS <= 3 * LAUNCH_REGISTERS);

#[inline(always)]
fn stage_a(stage: u32) -> u32 {
    shared_base() + stage * STAGE_BYTES
}

#[inline(always)]
fn stage_b(stage: u32) -> u32 {
    stage_a(stage) + WGMMA_A_BYTES
}

/// The producer's table of window origins, after the stages' mbarriers.
#[inline(always)]
fn origin_table() -> u32 {
    stage_a(WGMMA_STAGES) + WGMMA_STAGES * WGMMA_BARRIER_BYTES
}

/// The bias of the first `WGMMA_SHARED_BIAS` output channels, after the table: read at
/// the start of every tile, from global memory its loads would hold back the tile's
/// first `wgmma`.
#[inline(always)]
fn bias_table() -> u32 {
    origin_table() + WGMMA_TABLE_BYTES
}

/// Copies the first `WGMMA_SHARED_BIAS` channels of the bias (if any) to the bias table.
///
/// # Safety
/// Every thread of the block calls it before a barrier that precedes the table's reads;
/// the bias is null or `out_channels` floats.
#[inline(always)]
unsafe fn stage_bias(args: &TensorCoreArgs) {
    let bias = args.epilogue.bias.as_ptr();
    if bias.is_null() {
        return;
    }
    let channels = args.problem.out_channels.min(WGMMA_SHARED_BIAS);
    for c in (thread_idx_x()..channels).step_by(WGMMA_THREADS as usize) {
        // SAFETY: c is a channel of the bias and of the table.
        unsafe { store_shared_f32(bias_table() + 4 * c, *bias.add(c as usize)) };
    }
}

/// The bias of output channel `c`: from the bias table where it holds it.
///
/// # Safety
/// The bias is `out_channels` floats, the table staged and published; c is a channel.
#[inline(always)]
unsafe fn bias_of(args: &TensorCoreArgs, c: u32) -> f32 {
    // SAFETY: forwarded.
    unsafe {
        if c < WGMMA_SHARED_BIAS {
            load_shared_f32(bias_table() + 4 * c)
        } else {
            *args.epilogue.bias.as_ptr().add(c as usize)
        }
    }
}

/// A unit of a block's work: a tile of the GEMM, and the k-tiles of its split of K.
#[derive(Clone, Copy)]
struct WorkUnit {
    tile: TileOrigin,
    split: u32,
    k_first: u32,
    k_count: u32,
}

/// Unit `index` of the plan's work: tiles with output channels fastest, then groups,
/// then M; splits of K slowest, so that the blocks at work together share A's rows.
#[inline(always)]
fn work_unit(plan: &TensorCorePlan, index: u32) -> WorkUnit {
    let tiles = plan.m_tiles * plan.groups * plan.n_tiles;
    let (split, index) = (index / tiles, index % tiles);
    let rest = index / plan.n_tiles;
    let k_first = split * plan.split_k_tiles;
    WorkUnit {
        tile: TileOrigin {
            m0: rest / plan.groups * WGMMA_BM,
            group: rest % plan.groups,
            n0: index % plan.n_tiles * plan.tile_n,
        },
        split,
        k_first,
        k_count: plan.split_k_tiles.min(plan.k_tiles - k_first),
    }
}

/// y = conv(x, w) + bias over NHWC (`CHANNELS_LAST`) or NCHW tensors, x staged by NCHW
/// boxes where `NCHW_BOXES`, in tiles of `8 J` output channels.
///
/// # Safety
/// x, w and y hold the problem's tensors in that layout (w `[out][kh][kw][in / groups]`
/// in NHWC, `[out][in / groups][kh][kw]` in NCHW, in [`box_filter_index`] order with
/// NCHW boxes), bias null or `out_channels` floats; `plan` is the problem's forward
/// plan for `wgmma` in that layout with `tile_n` `8 J` and `nchw_boxes` as
/// `NCHW_BOXES`, the launch the one it builds.
#[inline(always)]
pub unsafe fn forward<const CHANNELS_LAST: bool, const NCHW_BOXES: bool, const J: usize>(args: TensorCoreArgs)
where
    [[f32; 4]; J]: WarpgroupAccumulators,
{
    let (p, plan) = (&args.problem, &args.plan);
    let k_tiles = KTiles::new(p, plan);
    let units = plan.units();
    // With bulk copies one producer thread arrives per fill, else every producer.
    let bulk = NCHW_BOXES || (CHANNELS_LAST && plan.bulk_copies == 1);
    let producers = if bulk { 1 } else { WARPGROUP };
    // SAFETY: every thread calls them; the mbarriers follow the stages in the launch's
    // shared memory, the bias table the producer's table, and the barrier below
    // publishes both.
    let pipeline = unsafe {
        stage_bias(&args);
        StagePipeline::new(stage_a(WGMMA_STAGES), WGMMA_STAGES, producers, 2 * WARPGROUP)
    };
    // SAFETY: every thread reaches it.
    unsafe { sync_threads() };
    // Broadcast from lane 0 so that ptxas sees the role as warp-uniform: a `wgmma`
    // under a branch it takes for divergent is serialized.
    let warpgroup = (thread_idx_x() / WARPGROUP).shfl_idx(0);
    // SAFETY: each side runs the same tiles in the same order, so every fill is
    // consumed and every release awaited. The producer's registers go to the
    // consumers' sums.
    unsafe {
        if warpgroup == 0 {
            set_max_registers::<false, PRODUCER_REGISTERS>();
            if bulk {
                produce_bulk::<NCHW_BOXES, J>(&args, units, &pipeline);
            } else {
                produce::<CHANNELS_LAST>(&args, k_tiles, units, &pipeline);
            }
        } else {
            set_max_registers::<true, CONSUMER_REGISTERS>();
            consume::<NCHW_BOXES, J>(&args, units, &pipeline, warpgroup - 1);
        }
    }
}

/// The window origin (column, row, image) of output pixel `m` of the batch.
#[inline(always)]
fn window_origin(p: &ConvProblem, m: u32) -> [i32; 3] {
    let (image, pixel) = p.div_out_pixels.divmod(m);
    let (oy, ox) = p.div_out_w.divmod(pixel);
    [
        (ox * p.stride_w) as i32 - p.pad_w as i32,
        (oy * p.stride_h) as i32 - p.pad_h as i32,
        image as i32,
    ]
}

/// Where the NCHW strip of k-tile `kt` starts along x's row, relative to the tile's
/// first output column: at the 16-byte multiple (bulk copies start no elsewhere) at or
/// before the tap's first column; and how many pixels before that column (0 to 3).
#[inline(always)]
fn strip_shift(p: &ConvProblem, kt: u32) -> (i32, u32) {
    let s = p.div_kernel_w.divmod(p.div_taps.divmod(kt).1).1;
    let shift = (s * p.dilation_w) as i32 - p.pad_w as i32;
    (shift & !3, (shift & 3) as u32)
}

/// The producer on bulk tensor copies: its first thread stages the k-tiles of every
/// unit of this block, A at one tap and `TC_BK` channels as an im2col box of
/// `WGMMA_BM` pixels, or with `NCHW_BOXES` as a strip of `NCHW_BOXES_PER_STRIP` boxes
/// of `NCHW_BOX_PIXELS` pixels along the row of x the tap reads ([`strip_shift`]), B
/// as a box of `8 J` filters of that tap and those channels.
///
/// # Safety
/// As [`forward`]; the producer warpgroup calls it; `args.maps` holds the plan's tensor
/// maps.
#[inline(always)]
unsafe fn produce_bulk<const NCHW_BOXES: bool, const J: usize>(
    args: &TensorCoreArgs,
    units: u32,
    pipeline: &StagePipeline,
) {
    if thread_idx_x() != 0 {
        return;
    }
    let (p, plan) = (&args.problem, &args.plan);
    let patches_map = args.maps.as_ptr() as *const u8;
    let filters_map = patches_map.wrapping_add(size_of::<TensorMap>());
    // SAFETY: the host wrote both maps before the launch.
    unsafe {
        fence_tensor_map(patches_map);
        fence_tensor_map(filters_map);
    }
    let a_bytes = if NCHW_BOXES {
        NCHW_BOXES_PER_STRIP * BOX_BYTES
    } else {
        tile_bytes(WGMMA_BM)
    };
    let mut fills = 0;
    let mut index = block_idx_x();
    while index < units {
        let unit = work_unit(plan, index);
        let tile = unit.tile;
        // NCHW boxes: the tile is part of one output row (padded to whole tiles), at
        // stride 1 its window's origin the row's shifted by the tile's first column.
        let origin = if NCHW_BOXES {
            let (row, column) = plan.row_pitch.divmod(tile.m0);
            let [_, y, image] = window_origin(p, row * p.out_w);
            [column as i32, y, image]
        } else {
            window_origin(p, tile.m0)
        };
        let filter = (tile.group * p.out_per_group() + tile.n0) as i32;
        for kt in unit.k_first..unit.k_first + unit.k_count {
            let (chunk, tap) = p.div_taps.divmod(kt);
            let (r, s) = p.div_kernel_w.divmod(tap);
            let channel = chunk * TC_BK;
            let offsets = [(s * p.dilation_w) as u16, (r * p.dilation_h) as u16];
            let (stage, fill) = (fills % WGMMA_STAGES, fills / WGMMA_STAGES);
            // SAFETY: the stage is released before the copies start; the full barrier
            // expects both boxes' bytes (zero-filled parts included).
            unsafe {
                pipeline.acquire(stage, fill);
                pipeline.arrive_expecting(stage, a_bytes + tile_bytes(8 * J as u32));
                let x_channel = (tile.group * p.in_per_group() + channel) as i32;
                if NCHW_BOXES {
                    let (start, _) = strip_shift(p, kt);
                    let row = origin[1] + offsets[1] as i32;
                    for b in 0..NCHW_BOXES_PER_STRIP {
                        let column = origin[0] + start + (b * NCHW_BOX_PIXELS) as i32;
                        let at = [column, row, x_channel, origin[2]];
                        pipeline.load_tile_4d(stage, stage_a(stage) + b * BOX_BYTES, patches_map, at);
                    }
                } else {
                    let at = [x_channel, origin[0], origin[1], origin[2]];
                    pipeline.load_im2col(stage, stage_a(stage), patches_map, at, offsets);
                }
                pipeline.load_tile_3d(
                    stage,
                    stage_b(stage),
                    filters_map,
                    [channel as i32, tap as i32, filter],
                );
            }
            fills += 1;
        }
        index += grid_dim_x();
    }
}

/// The producer: stages the k-tiles of every unit of this block.
///
/// # Safety
/// As [`forward`]; the producer warpgroup calls it.
#[inline(always)]
unsafe fn produce<const CHANNELS_LAST: bool>(
    args: &TensorCoreArgs,
    k_tiles: KTiles,
    units: u32,
    pipeline: &StagePipeline,
) {
    let (p, plan) = (&args.problem, &args.plan);
    let stagers = Stagers {
        index: thread_idx_x(),
        count: WARPGROUP,
    };
    let mut fills = 0;
    let mut index = block_idx_x();
    while index < units {
        let unit = work_unit(plan, index);
        let tile = unit.tile;
        let filters = Filters::<B_ROWS>::new(args.w.as_ptr(), p, k_tiles, tile.n0, tile.group, stagers);
        let x = args.x.as_ptr();
        // SAFETY: forwarded.
        unsafe {
            if CHANNELS_LAST {
                // The table is rewritten once every producer finished reading it.
                sync_group::<1>(WARPGROUP);
                let table = SharedOrigins::write(origin_table(), p, tile.m0, tile.group, WGMMA_BM, stagers);
                sync_group::<1>(WARPGROUP);
                let patches = Patches::<A_ROWS, _>::with_table(x, p, k_tiles, table, stagers);
                if plan.a_vector != 0 {
                    with_filters(plan, VectorPatches(patches), filters, &unit, pipeline, &mut fills);
                } else {
                    with_filters(plan, ScalarPatches(patches), filters, &unit, pipeline, &mut fills);
                }
            } else {
                let patches = NchwPatches::<NCHW_ROWS>::new(x, p, tile.m0, tile.group, WGMMA_BM, stagers);
                with_filters(plan, patches, filters, &unit, pipeline, &mut fills);
            }
        }
        index += grid_dim_x();
    }
    // SAFETY: after the last fill.
    unsafe { finish_fills(pipeline, fills) };
}

/// Stages the k-tiles of one unit, the weights copied 16 or 4 bytes at a time as the
/// plan says.
///
/// # Safety
/// As [`produce`].
#[inline(always)]
unsafe fn with_filters<A: Operand>(
    plan: &TensorCorePlan,
    patches: A,
    filters: Filters<B_ROWS>,
    unit: &WorkUnit,
    pipeline: &StagePipeline,
    fills: &mut u32,
) {
    let k_tiles = unit.k_first..unit.k_first + unit.k_count;
    // SAFETY: forwarded.
    unsafe {
        if plan.b_vector != 0 {
            fill(&patches, &VectorFilters(filters), k_tiles, pipeline, fills);
        } else {
            fill(&patches, &ScalarFilters(filters), k_tiles, pipeline, fills);
        }
    }
}

/// Fills whose `cp.async` copies a producer thread keeps in flight beyond the newest:
/// it arrives on a fill's full barrier once the copies landed, `FILL_LAG` fills later,
/// so that the barrier's release orders them before the consumers' reads. With two
/// stages fewer than there are, the fill the consumers wait for next was arrived on
/// before the producer waits for a free stage.
const FILL_LAG: u32 = WGMMA_STAGES - 2;
const _: () = assert!(FILL_LAG >= 1);

/// Stages `k_tiles` of `a` and `b`, `fills` counting the stages filled by
/// this block so far; arrives on the fill `FILL_LAG` before each ([`finish_fills`]
/// arrives on the last ones).
///
/// # Safety
/// As [`produce`].
#[inline(always)]
unsafe fn fill<A: Operand, B: Operand>(
    a: &A,
    b: &B,
    k_tiles: core::ops::Range<u32>,
    pipeline: &StagePipeline,
    fills: &mut u32,
) {
    for kt in k_tiles {
        let (stage, fill) = (*fills % WGMMA_STAGES, *fills / WGMMA_STAGES);
        // SAFETY: the stage is released (its previous fill consumed) before the copies
        // start; a fill is arrived on once this thread's copies of it landed.
        unsafe {
            pipeline.acquire(stage, fill);
            a.stage(stage_a(stage), kt);
            b.stage(stage_b(stage), kt);
            async_copy_commit();
            async_copy_wait::<FILL_LAG>();
            if *fills >= FILL_LAG {
                pipeline.arrive((*fills - FILL_LAG) % WGMMA_STAGES);
            }
        }
        *fills += 1;
    }
}

/// Arrives on the fills [`fill`] left in flight, once they landed.
///
/// # Safety
/// As [`produce`], after the last [`fill`].
#[inline(always)]
unsafe fn finish_fills(pipeline: &StagePipeline, fills: u32) {
    async_copy_wait::<0>();
    for done in fills.saturating_sub(FILL_LAG)..fills {
        // SAFETY: this thread's copies of every fill landed.
        unsafe { pipeline.arrive(done % WGMMA_STAGES) };
    }
}

/// This thread's A fragment of the `wgmma` over rows `rows ..` (64) and k `8 kk ..` of
/// the staged A tile at `tile`, rounded to TF32 to nearest: the tensor cores would
/// truncate the low mantissa bits, which biases the products (from registers or from
/// shared memory alike: truncated, the headline's error rises from 2.6e-4 to
/// 4.1e-4). Registers 0 to 3 hold (row, column) (g, t), (g + 8, t), (g, t + 4),
/// (g + 8, t + 4) of the warp's 16 rows, g the lane's quad and t its place in it.
/// Rows of K (the im2col and `cp.async` tiles): lane `i` of warp `w` addresses row
/// `16 w + i % 8 + 8 (i / 8 % 2)`, k `8 kk + 4 (i / 16)`, so that `ldmatrix` hands out
/// the four registers. NCHW boxes (rows of pixels, one per channel, the tile's first
/// pixel `skip` into the strip): column t of the step is channel 2t, column t + 4
/// channel 2t + 1 ([`box_filter_index`]).
///
/// # Safety
/// The whole warpgroup calls it; the tile's copies landed and are visible to it.
#[inline(always)]
unsafe fn a_fragment<const NCHW_BOXES: bool>(tile: u32, rows: u32, kk: u32, skip: u32) -> [u32; 4] {
    let (lane, warp) = (lane_id(), thread_idx_x() / 32 % 4);
    if NCHW_BOXES {
        let (row, channel) = (skip + rows + 16 * warp + lane / 4, 8 * kk + 2 * (lane % 4));
        let places = [
            boxed(tile, row, channel),
            boxed(tile, row + 8, channel),
            boxed(tile, row, channel + 1),
            boxed(tile, row + 8, channel + 1),
        ];
        // SAFETY: elements of the landed tile.
        return places.map(|place| to_tf32(unsafe { load_shared_f32(place) }));
    }
    let row = rows + 16 * warp + lane % 8 + 8 * (lane / 8 % 2);
    // SAFETY: 16-byte rows of the landed tile; the warp converges here.
    unsafe { load_matrix_x4(staged(tile, row, kk * 8 + 4 * (lane / 16))) }
        .map(|bits| to_tf32(f32::from_bits(bits)))
}

/// Where the element of pixel `row` of the strip and channel `channel` of the k-tile
/// lies among the NCHW boxes staged at `tile`: in box `row / NCHW_BOX_PIXELS`, at row
/// `channel`, its 16-byte chunk swizzled by the row as the bulk copy wrote it.
#[inline(always)]
fn boxed(tile: u32, row: u32, channel: u32) -> u32 {
    let (pixel, chunk) = (row % NCHW_BOX_PIXELS, row % NCHW_BOX_PIXELS / 4);
    tile + row / NCHW_BOX_PIXELS * BOX_BYTES + channel * 128 + 16 * (chunk ^ (channel % 8)) + 4 * (pixel % 4)
}

/// `wgmma` batches left in flight after each issue: the multiplies of the ones before
/// overlap the loads of the next fragments. Two would hold a third set of A fragments,
/// past the consumers' 200 registers (ptxas spills).
const BATCHES_IN_FLIGHT: u32 = 1;
const _: () = assert!(BATCHES_IN_FLIGHT >= 1 && BATCHES_IN_FLIGHT <= TC_BK / 8);

/// K-tile `kt` of a tile's product, its k-tiles staged from fill `first_fill` on:
/// `sums += A B^T` over the k-tile for this consumer's rows `rows ..` (`skip` pixels
/// further into an NCHW strip), one batch of two
/// `wgmma` (64 rows each) per 8 k, each followed by a wait that leaves
/// `BATCHES_IN_FLIGHT` in flight.
///
/// # Safety
/// The consumer warpgroup calls it together for the k-tiles of a tile in order. The
/// stage's copies landed once the full barrier is passed, and are fenced for the
/// tensor cores' reads of B; each batch's A fragments stay untouched until a wait
/// says the batch is done; a stage is released once the last batch reading it is done
/// (at the wait of the next k-tile's batch `BATCHES_IN_FLIGHT - 1` here, else after
/// the tile's last wait).
#[inline(always)]
unsafe fn multiply_k_tile<const NCHW_BOXES: bool, const J: usize>(
    sums: &mut [[[f32; 4]; J]; 2],
    pipeline: &StagePipeline,
    first_fill: u32,
    kt: u32,
    rows: u32,
    skip: u32,
) where
    [[f32; 4]; J]: WarpgroupAccumulators,
{
    let fill = first_fill + kt;
    let stage = fill % WGMMA_STAGES;
    // SAFETY: the caller's contract.
    unsafe {
        pipeline.wait_full(stage, fill / WGMMA_STAGES);
        fence_async_shared();
        for kk in 0..TC_BK / 8 {
            // The bottom 64 rows: in an NCHW strip two boxes on, at the same places.
            let (bottom, bottom_rows) = if NCHW_BOXES {
                (stage_a(stage) + 64 / NCHW_BOX_PIXELS * BOX_BYTES, rows)
            } else {
                (stage_a(stage), rows + 64)
            };
            let a_top = a_fragment::<NCHW_BOXES>(stage_a(stage), rows, kk, skip);
            let a_bottom = a_fragment::<NCHW_BOXES>(bottom, bottom_rows, kk, skip);
            let b = swizzled_k_major_descriptor(stage_b(stage) + kk * 32);
            // Written out rather than looped: a loop indexes the sums in local memory,
            // whose loads ptxas cannot overlap with the multiplies.
            let [top, bottom] = &mut *sums;
            warpgroup_fence();
            top.multiply_tf32(a_top, b);
            bottom.multiply_tf32(a_bottom, b);
            warpgroup_commit();
            warpgroup_wait::<BATCHES_IN_FLIGHT>();
            if kk == BATCHES_IN_FLIGHT - 1 && kt > 0 {
                pipeline.release((fill - 1) % WGMMA_STAGES);
            }
        }
    }
}

/// A consumer: multiplies rows `CONSUMER_ROWS consumer ..` of every unit of this block
/// and stores them (split, into its split's copy of y).
///
/// # Safety
/// As [`forward`]; consumer warpgroup `consumer` (0 or 1) calls it.
#[inline(always)]
unsafe fn consume<const NCHW_BOXES: bool, const J: usize>(
    args: &TensorCoreArgs,
    units: u32,
    pipeline: &StagePipeline,
    consumer: u32,
) where
    [[f32; 4]; J]: WarpgroupAccumulators,
{
    let p = &args.problem;
    let outputs = p.output_count();
    let warp = thread_idx_x() / 32 % 4;
    let rows = consumer * CONSUMER_ROWS;
    let mut fills = 0;
    let mut index = block_idx_x();
    while index < units {
        let unit = work_unit(&args.plan, index);
        let (tile, k_tiles) = (unit.tile, unit.k_count);
        let args = &TensorCoreArgs {
            y: args.y.offset(unit.split as u64 * outputs),
            ..*args
        };
        // SAFETY: the launch's arguments.
        let mut sums = unsafe { bias_sums::<2, J>(args, tile, 0, |c| bias_of(args, c)) };
        let [top, bottom] = &mut sums;
        top.pin();
        bottom.pin();
        // The first k-tile runs before the loop, so that the sums enter it defined by a
        // `wgmma` as they leave it: else ptxas serializes every `wgmma` of the loop.
        // SAFETY: forwarded; there is at least one k-tile.
        // With NCHW boxes, where the tile's row starts in each k-tile's strip.
        let skip = |kt: u32| {
            if NCHW_BOXES {
                strip_shift(p, unit.k_first + kt).1
            } else {
                0
            }
        };
        unsafe { multiply_k_tile::<NCHW_BOXES, J>(&mut sums, pipeline, fills, 0, rows, skip(0)) };
        for kt in 1..k_tiles {
            // SAFETY: as above.
            unsafe { multiply_k_tile::<NCHW_BOXES, J>(&mut sums, pipeline, fills, kt, rows, skip(kt)) };
        }
        fills += k_tiles;
        // SAFETY: as above; the sums are final after the wait.
        unsafe {
            warpgroup_wait::<0>();
            let last = (fills - 1) % WGMMA_STAGES;
            if args.epilogue.fits_register_stores() {
                // Straight from the registers, the stage already back with the producer.
                pipeline.release(last);
                let warp_tiles = WarpTiles {
                    sums,
                    origin: (rows + 16 * warp, 0),
                    row_step: 64,
                };
                store_plain(args, tile, &warp_tiles);
            } else {
                // Through this consumer's part of A in the last stage, which nothing
                // else reads until its release; the fence orders the epilogue's
                // accesses before the producer's next copies into it.
                store_staged(
                    args,
                    tile,
                    &sums,
                    stage_a(last) + consumer * STAGING_STEP,
                    consumer,
                );
                fence_async_shared();
                pipeline.release(last);
            }
        }
        index += grid_dim_x();
    }
}
