//! The forward pass on warpgroup MMA (`wgmma`, sm_90a): persistent blocks of three
//! warpgroups, one block per SM. The producer warpgroup copies A (a tile's rows per
//! k-tile) and B (the plan's `tile_n` rows: 128, or 64 for narrow problems) into two
//! rings of stages, by bulk tensor copies (TMA: im2col over NHWC x, or row strips, one
//! per kernel row that all its taps read) where the plan takes them, else with
//! `cp.async`. With NHWC row strips the two consumer warpgroups take the block's tiles
//! in turns (CUTLASS's ping-pong): one multiplies a tile straight from the swizzled
//! stages while the other stores the sums of the tile before, so that the stores
//! overlap the multiplies; their GEMM is transposed, the weights as `wgmma`'s A (64
//! output channels) and the strip's pixels as its B (256, one m64n256k8 per step of 8
//! K). Otherwise they share tiles of 256 rows, 128 each, and so each stage of B and the
//! producer's work per k-tile (see [`WgmmaSchedule`]). The
//! tensor cores truncate FP32 to TF32, so every operand is rounded to nearest first: B
//! by the host; A of NHWC bulk copies by the copies themselves (TFLOAT32 tensor maps),
//! read by the tensor cores from shared memory like B; A of NCHW boxes and `cp.async`
//! tiles through registers, rounded on the way. Full and empty mbarriers per stage
//! order the two sides: a stage of B serves one k-tile, a stage of A one k-tile or one
//! strip.

use super::epilogue::{
    ChannelRowSums, InPlace, Output, Placement, TileOrigin, WarpTiles, bias_sums, channel_row_sums,
    store_channel_rows, store_channel_rows_first,
};
use super::operands::{
    Filters, KTiles, NchwPatches, Operand, Patches, ScalarFilters, ScalarPatches, SharedOrigins, Stagers,
    VectorFilters, VectorPatches, staged,
};
use super::staged_epilogue::store_staged;
use super::*;
use crate::conv::sub_pixel::SubPixelArgs;
use crate::device::{
    PIPELINE_BARRIER_BYTES, Shuffle, StagePipeline, WarpgroupAccumulators, arrive_group, async_copy_commit,
    async_copy_wait, block_idx_x, fence_async_shared, fence_tensor_map, grid_dim_x, lane_id, load_matrix_x4,
    load_shared_f32, set_max_registers, shared_base, store_shared_f32, swizzled_k_major_descriptor,
    sync_group, sync_threads, thread_idx_x, to_tf32, warpgroup_commit, warpgroup_fence, warpgroup_wait,
};
use crate::tensor_map::TensorMap;

/// Threads of a warpgroup.
const WARPGROUP: u32 = 128;
/// Rows of a tile that `cp.async` gathers (never in row strips).
const GATHER_TILE_ROWS: u32 = WgmmaSchedule::of(false, true).tile_rows;
/// Staged rows per producer thread: of A (NHWC), of A (NCHW), of B.
const A_ROWS: usize = (GATHER_TILE_ROWS * TC_BK / 4 / WARPGROUP) as usize;
const NCHW_ROWS: usize = (GATHER_TILE_ROWS / WARPGROUP) as usize;
const B_ROWS: usize = (TC_BN * TC_BK / 4 / WARPGROUP) as usize;

/// Registers per thread of the producer and of each consumer, with bulk copies and
/// with `cp.async`. Together they may take no more than the block got at launch (the
/// 64K of the SM over its threads, in steps of 8): a consumer's `setmaxnreg.inc` waits
/// for registers that never come otherwise.
const BULK_REGISTERS: [u32; 2] = [40, 232];
const GATHER_REGISTERS: [u32; 2] = [104, 200];
const LAUNCH_REGISTERS: u32 = 65536 / WGMMA_THREADS / 8 * 8;

const _: () = assert!(PIPELINE_BARRIER_BYTES == WGMMA_BARRIER_BYTES && WGMMA_BM == 128);
/// The second consumer's staging in a shared strip of NCHW boxes starts past the
/// first consumer's reads (its 128 pixels and the margin).
const _: () = assert!(strip_bytes(2 * WGMMA_BM) - tile_bytes(WGMMA_BM) >= strip_bytes(WGMMA_BM));
const _: () = assert!(BULK_REGISTERS[0] + 2 * BULK_REGISTERS[1] <= 3 * LAUNCH_REGISTERS);
const _: () = assert!(GATHER_REGISTERS[0] + 2 * GATHER_REGISTERS[1] <= 3 * LAUNCH_REGISTERS);

/// The bias of the first `WGMMA_SHARED_BIAS` output channels, at the start of shared
/// memory: read at the start of every tile, from global memory its loads would hold
/// back the tile's first `wgmma`.
#[inline(always)]
fn bias_table() -> u32 {
    shared_base()
}

/// The producer's table of window origins, after the bias.
#[inline(always)]
fn origin_table() -> u32 {
    bias_table() + WGMMA_BIAS_BYTES
}

/// The stages of A, after the table; then those of B, then the mbarriers of both rings.
#[inline(always)]
fn stages() -> u32 {
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

/// The two rings of stages, A and B, filled and released apart, as the kernel's
/// schedule lays them out.
struct Rings {
    a: StagePipeline,
    b: StagePipeline,
    schedule: WgmmaSchedule,
}

impl Rings {
    /// The rings of `schedule`, their mbarriers initialized: `producers` arrivals fill
    /// a stage, `consumers` release it.
    ///
    /// # Safety
    /// As [`StagePipeline::new`]: every thread calls it, before a barrier that precedes
    /// the mbarriers' use.
    #[inline(always)]
    unsafe fn new(schedule: WgmmaSchedule, producers: u32, consumers: u32) -> Self {
        let barriers =
            stages() + WGMMA_STAGES * schedule.a_bytes + schedule.b_stages * tile_bytes(schedule.b_rows);
        let b_barriers = barriers + WGMMA_STAGES * WGMMA_BARRIER_BYTES;
        // SAFETY: forwarded; the mbarriers follow the stages, inside the launch's shared
        // memory (`WgmmaSchedule::shared_bytes`).
        unsafe {
            Self {
                a: StagePipeline::new(barriers, WGMMA_STAGES, producers, consumers),
                b: StagePipeline::new(b_barriers, schedule.b_stages, producers, consumers),
                schedule,
            }
        }
    }

    /// Where stage `stage` of A lies.
    #[inline(always)]
    fn stage_a(&self, stage: u32) -> u32 {
        stages() + stage * self.schedule.a_bytes
    }

    /// Where stage `stage` of B lies.
    #[inline(always)]
    fn stage_b(&self, stage: u32) -> u32 {
        self.stage_a(WGMMA_STAGES) + stage * tile_bytes(self.schedule.b_rows)
    }

    /// The stage and round of fill `fill` of A.
    #[inline(always)]
    fn a_slot(&self, fill: u32) -> (u32, u32) {
        (fill % WGMMA_STAGES, fill / WGMMA_STAGES)
    }

    /// The stage and round of fill `fill` of B.
    #[inline(always)]
    fn b_slot(&self, fill: u32) -> (u32, u32) {
        (fill % self.schedule.b_stages, fill / self.schedule.b_stages)
    }
}

/// Fills of both rings so far (a stage's index and round follow from them).
#[derive(Clone, Copy, Default)]
struct Fills {
    a: u32,
    b: u32,
}

/// A unit of a block's work: a tile of the GEMM, and the k-tiles of its split of K.
#[derive(Clone, Copy)]
struct WorkUnit {
    tile: TileOrigin,
    split: u32,
    k_first: u32,
    k_count: u32,
}

/// Unit `index` of the plan's work (tiles of `tile_rows` rows): tiles with output
/// channels fastest, then groups, then M; splits of K slowest, so that the blocks at
/// work together share A's rows.
#[inline(always)]
fn work_unit(plan: &TensorCorePlan, tile_rows: u32, index: u32) -> WorkUnit {
    let tiles = plan.m_tiles * plan.groups * plan.n_tiles;
    let (split, index) = (index / tiles, index % tiles);
    let rest = index / plan.n_tiles;
    let k_first = split * plan.split_k_tiles;
    WorkUnit {
        tile: TileOrigin {
            m0: rest / plan.groups * tile_rows,
            group: rest % plan.groups,
            n0: index % plan.n_tiles * plan.tile_n,
        },
        split,
        k_first,
        k_count: plan.split_k_tiles.min(plan.k_tiles - k_first),
    }
}

/// An operand type of the kernel on NHWC row strips, y's type too: f32 (TF32 values
/// in shared memory), bf16 or f16.
pub trait StripOperand: Output {
    /// `sums += A B^T` over one step of 32 bytes of each operand's rows (8 TF32 K, or
    /// 16 of a 16-bit float), both K-major through descriptors.
    ///
    /// # Safety
    /// As [`WarpgroupAccumulators::multiply_tf32_shared`].
    unsafe fn multiply<S: WarpgroupAccumulators>(sums: &mut S, a: u64, b: u64);

    /// Writes a warpgroup's transposed sums to y of this type, by the kernel that
    /// writes NCHW y.
    ///
    /// # Safety
    /// As [`store_channel_rows`].
    unsafe fn store_rows_first(args: &TensorCoreArgs, tile: TileOrigin, sums: &ChannelRowSums);
}

impl StripOperand for f32 {
    #[inline(always)]
    unsafe fn multiply<S: WarpgroupAccumulators>(sums: &mut S, a: u64, b: u64) {
        // SAFETY: forwarded.
        unsafe { sums.multiply_tf32_shared(a, b) }
    }

    #[inline(always)]
    unsafe fn store_rows_first(args: &TensorCoreArgs, tile: TileOrigin, sums: &ChannelRowSums) {
        // SAFETY: forwarded. A quad's pairs of f32 fill a 32-byte sector already.
        unsafe { store_channel_rows::<f32>(args, tile, sums) }
    }
}

impl StripOperand for half::bf16 {
    #[inline(always)]
    unsafe fn multiply<S: WarpgroupAccumulators>(sums: &mut S, a: u64, b: u64) {
        // SAFETY: forwarded.
        unsafe { sums.multiply_bf16_shared(a, b) }
    }

    #[inline(always)]
    unsafe fn store_rows_first(args: &TensorCoreArgs, tile: TileOrigin, sums: &ChannelRowSums) {
        // SAFETY: forwarded.
        unsafe { store_channel_rows_first::<Self>(args, tile, sums) }
    }
}

impl StripOperand for half::f16 {
    #[inline(always)]
    unsafe fn multiply<S: WarpgroupAccumulators>(sums: &mut S, a: u64, b: u64) {
        // SAFETY: forwarded.
        unsafe { sums.multiply_f16_shared(a, b) }
    }

    #[inline(always)]
    unsafe fn store_rows_first(args: &TensorCoreArgs, tile: TileOrigin, sums: &ChannelRowSums) {
        // SAFETY: forwarded.
        unsafe { store_channel_rows_first::<Self>(args, tile, sums) }
    }
}

/// y = conv(x, w) + bias over NHWC (`CHANNELS_LAST`) or NCHW tensors, x staged by bulk
/// copies where `BULK` (by row strips where `ROW_STRIPS`), else gathered by `cp.async`,
/// in tiles of `8 J` output channels; on NHWC row strips the operands and y of `E`.
///
/// # Safety
/// x, w and y hold the problem's tensors in that layout (w `[out][kh][kw][in / groups]`
/// in NHWC, `[out][in / groups][kh][kw]` in NCHW, in [`box_filter_index`] order with
/// NCHW boxes), of `E` on NHWC row strips (else f32), bias null or `out_channels`
/// floats; `plan` is the problem's forward plan for `wgmma` in that layout with
/// `tile_n` `8 J`, `bulk_copies` as `BULK`, `row_strips` as `ROW_STRIPS` and its
/// operand `E`'s, the launch the one it builds.
#[inline(always)]
pub unsafe fn forward<
    E: StripOperand,
    const CHANNELS_LAST: bool,
    const BULK: bool,
    const ROW_STRIPS: bool,
    const J: usize,
>(
    args: TensorCoreArgs,
) where
    [[f32; 4]; J]: WarpgroupAccumulators,
{
    // SAFETY: forwarded.
    unsafe { forward_with::<E, CHANNELS_LAST, BULK, ROW_STRIPS, J, false>(args, InPlace) }
}

/// [`forward`] on NHWC row strips into NCHW y of `E`, by a kernel of its own: its
/// stores ([`StripOperand::store_rows_first`]) leave the code of the NHWC kernel as
/// it is (more code there slowed its multiplies).
///
/// # Safety
/// As [`forward`], with y in NCHW.
#[inline(always)]
pub unsafe fn forward_nchw_y<E: StripOperand>(args: TensorCoreArgs) {
    // SAFETY: forwarded.
    unsafe { forward_with::<E, true, true, true, 8, true>(args, InPlace) }
}

/// The strided input gradient as the phases' one forward pass
/// ([`SubPixelPlan`](crate::conv::sub_pixel::SubPixelPlan)): [`forward`] on NHWC
/// im2col boxes in tiles of `TC_BN` channels, K whole, every output stored at its
/// phase's pixel of dx.
///
/// # Safety
/// As [`forward`] for `args.forward` (dy, the gathered weights and the plan's forward
/// plan of its phases' problem), y dx as `args.shuffle` places it.
#[inline(always)]
pub unsafe fn input_grad_sub_pixel<E: StripOperand>(args: SubPixelArgs) {
    // SAFETY: forwarded.
    unsafe { forward_with::<E, true, true, false, 16, false>(args.forward, args.shuffle) }
}

/// [`forward`], its NHWC row strips storing y by [`StripOperand::store_rows_first`]
/// where `Y_FIRST`, its other register epilogues where `placement` puts them.
///
/// # Safety
/// As [`forward`], y laid out as `placement` writes it.
#[inline(always)]
unsafe fn forward_with<
    E: StripOperand,
    const CHANNELS_LAST: bool,
    const BULK: bool,
    const ROW_STRIPS: bool,
    const J: usize,
    const Y_FIRST: bool,
>(
    args: TensorCoreArgs,
    placement: impl Placement,
) where
    [[f32; 4]; J]: WarpgroupAccumulators,
{
    let (p, plan) = (&args.problem, &args.plan);
    let k_tiles = KTiles::new(p, plan);
    let units = plan.units();
    let schedule = WgmmaSchedule::of(ROW_STRIPS, CHANNELS_LAST);
    // With bulk copies one producer thread arrives per fill, else every producer; one
    // consumer releases a stage in turns, both where they share the tiles.
    let producers = if BULK { 1 } else { WARPGROUP };
    let consumers = if schedule.ping_pong {
        WARPGROUP
    } else {
        2 * WARPGROUP
    };
    // SAFETY: every thread calls them; the barrier below publishes the bias and the
    // mbarriers.
    let rings = unsafe {
        stage_bias(&args);
        Rings::new(schedule, producers, consumers)
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
            if BULK {
                set_max_registers::<false, { BULK_REGISTERS[0] }>();
                produce_bulk::<CHANNELS_LAST, ROW_STRIPS, J>(&args, units, &rings);
            } else {
                set_max_registers::<false, { GATHER_REGISTERS[0] }>();
                produce::<CHANNELS_LAST>(&args, k_tiles, units, &rings);
            }
        } else {
            if BULK {
                set_max_registers::<true, { BULK_REGISTERS[1] }>();
            } else {
                set_max_registers::<true, { GATHER_REGISTERS[1] }>();
            }
            // NHWC bulk copies round A to TF32 on the way (the plan's tensor maps), so
            // the tensor cores read it from shared memory like B.
            let consumer = warpgroup - 1;
            if CHANNELS_LAST && ROW_STRIPS {
                consume_in_turns::<E, Y_FIRST>(&args, units, &rings, consumer);
            } else if CHANNELS_LAST && BULK {
                consume::<E, CHANNELS_LAST, ROW_STRIPS, true, J>(&args, units, &rings, consumer, placement);
            } else {
                consume::<E, CHANNELS_LAST, ROW_STRIPS, false, J>(&args, units, &rings, consumer, placement);
            }
        }
    }
}

/// A k-tile's tap's column of the window (`s` of `kh x kw`), its tap, its chunk of
/// channels.
#[inline(always)]
fn tap_of(p: &ConvProblem, kt: u32) -> (u32, u32, u32) {
    let (chunk, tap) = p.div_taps.divmod(kt);
    (p.div_kernel_w.divmod(tap).1, tap, chunk)
}

/// Pixels a row strip starts before the first output pixel's window: the padding, and
/// in NCHW the up to 3 more that a start at a 16-byte multiple (where bulk copies of
/// NCHW rows must start) adds.
#[inline(always)]
fn strip_lead<const CHANNELS_LAST: bool>(p: &ConvProblem) -> u32 {
    if CHANNELS_LAST {
        p.pad_w
    } else {
        (p.pad_w + 3) & !3
    }
}

/// Where the rows of the taps at window column `s` start in a row strip: the tap's
/// offset in the window past the strip's lead.
#[inline(always)]
fn strip_skip<const CHANNELS_LAST: bool>(p: &ConvProblem, s: u32) -> u32 {
    s * p.dilation_w + strip_lead::<CHANNELS_LAST>(p) - p.pad_w
}

/// The producer on bulk tensor copies: its first thread stages the k-tiles of every
/// unit of this block. B: per k-tile a box of `8 J` filters of its tap and `TC_BK`
/// channels. A: per k-tile an im2col box of a tile's pixels at its tap; or with
/// `ROW_STRIPS`, per kernel row (and at a unit's first k-tile) the strip of the row of
/// x that its taps read: two boxes of `NHWC_STRIP_BOX_PIXELS` NHWC pixels, or NCHW
/// boxes of `NCHW_BOX_PIXELS` pixels (a tile's row and the margin).
///
/// # Safety
/// As [`forward`]; the producer warpgroup calls it; `args.maps` holds the plan's tensor
/// maps.
#[inline(always)]
unsafe fn produce_bulk<const CHANNELS_LAST: bool, const ROW_STRIPS: bool, const J: usize>(
    args: &TensorCoreArgs,
    units: u32,
    rings: &Rings,
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
    let box_pixels = if CHANNELS_LAST {
        NHWC_STRIP_BOX_PIXELS
    } else {
        NCHW_BOX_PIXELS
    };
    let a_bytes = rings.schedule.a_bytes;
    let boxes = match (ROW_STRIPS, CHANNELS_LAST) {
        (false, _) => 1,
        (true, true) => a_bytes / tile_bytes(NHWC_STRIP_BOX_PIXELS),
        (true, false) => a_bytes / NCHW_BOX_BYTES,
    };
    let mut fills = Fills::default();
    let mut index = block_idx_x();
    while index < units {
        let unit = work_unit(plan, rings.schedule.tile_rows, index);
        let tile = unit.tile;
        // Row strips: the tile is part of one output row (padded to whole tiles), at
        // stride 1 its strips' start the row's shifted by the tile's first column.
        let origin = if ROW_STRIPS {
            let (row, column) = plan.row_pitch.divmod(tile.m0);
            let [_, y, image] = p.window_origin(row * p.out_w);
            [column as i32 - strip_lead::<CHANNELS_LAST>(p) as i32, y, image]
        } else {
            p.window_origin(tile.m0)
        };
        let filter = (tile.group * p.out_per_group() + tile.n0) as i32;
        for kt in unit.k_first..unit.k_first + unit.k_count {
            let (s, tap, chunk) = tap_of(p, kt);
            let r = p.div_kernel_w.divmod(tap).0;
            let channel = chunk * plan.operand.k_tile_channels();
            let x_channel = (tile.group * p.in_per_group() + channel) as i32;
            // SAFETY: each stage is released before the copies into it start; a full
            // barrier expects all its boxes' bytes (zero-filled parts included).
            unsafe {
                if !ROW_STRIPS || s == 0 || kt == unit.k_first {
                    let (stage, round) = rings.a_slot(fills.a);
                    rings.a.acquire(stage, round);
                    rings.a.arrive_expecting(stage, a_bytes);
                    let row = origin[1] + (r * p.dilation_h) as i32;
                    for b in 0..boxes {
                        let destination = rings.stage_a(stage) + b * a_bytes / boxes;
                        let column = origin[0] + (b * box_pixels) as i32;
                        match (ROW_STRIPS, CHANNELS_LAST) {
                            (false, _) => {
                                let at = [x_channel, origin[0], origin[1], origin[2]];
                                let offsets = [(s * p.dilation_w) as u16, (r * p.dilation_h) as u16];
                                rings.a.load_im2col(stage, destination, patches_map, at, offsets);
                            }
                            (true, true) => {
                                let at = [x_channel, column, row, origin[2]];
                                rings.a.load_tile_4d(stage, destination, patches_map, at);
                            }
                            (true, false) => {
                                let at = [column, row, x_channel, origin[2]];
                                rings.a.load_tile_4d(stage, destination, patches_map, at);
                            }
                        }
                    }
                    fills.a += 1;
                }
                let (stage, round) = rings.b_slot(fills.b);
                rings.b.acquire(stage, round);
                rings.b.arrive_expecting(stage, tile_bytes(8 * J as u32));
                let at = [channel as i32, tap as i32, filter];
                rings.b.load_tile_3d(stage, rings.stage_b(stage), filters_map, at);
                fills.b += 1;
            }
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
    rings: &Rings,
) {
    let (p, plan) = (&args.problem, &args.plan);
    let stagers = Stagers {
        index: thread_idx_x(),
        count: WARPGROUP,
    };
    let mut fills = 0;
    let mut index = block_idx_x();
    while index < units {
        let unit = work_unit(plan, rings.schedule.tile_rows, index);
        let tile = unit.tile;
        let filters = Filters::<B_ROWS>::new(args.w.as_ptr(), p, k_tiles, tile.n0, tile.group, stagers);
        let x = args.x.as_ptr();
        // SAFETY: forwarded.
        unsafe {
            if CHANNELS_LAST {
                // The table is rewritten once every producer finished reading it.
                sync_group::<1>(WARPGROUP);
                let table =
                    SharedOrigins::write(origin_table(), p, tile.m0, tile.group, GATHER_TILE_ROWS, stagers);
                sync_group::<1>(WARPGROUP);
                let patches = Patches::<A_ROWS, _>::with_table(x, p, k_tiles, table, stagers);
                if plan.a_vector != 0 {
                    with_filters(plan, VectorPatches(patches), filters, &unit, rings, &mut fills);
                } else {
                    with_filters(plan, ScalarPatches(patches), filters, &unit, rings, &mut fills);
                }
            } else {
                let patches =
                    NchwPatches::<NCHW_ROWS>::new(x, p, tile.m0, tile.group, GATHER_TILE_ROWS, stagers);
                with_filters(plan, patches, filters, &unit, rings, &mut fills);
            }
        }
        index += grid_dim_x();
    }
    // SAFETY: after the last fill.
    unsafe { finish_fills(rings, fills) };
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
    rings: &Rings,
    fills: &mut u32,
) {
    let k_tiles = unit.k_first..unit.k_first + unit.k_count;
    // SAFETY: forwarded.
    unsafe {
        if plan.b_vector != 0 {
            fill(&patches, &VectorFilters(filters), k_tiles, rings, fills);
        } else {
            fill(&patches, &ScalarFilters(filters), k_tiles, rings, fills);
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

/// Stages `k_tiles` of `a` and `b`, `fills` counting the stages filled by this block
/// so far (the same in both rings: one stage of A per k-tile); arrives on the fill
/// `FILL_LAG` before each ([`finish_fills`] arrives on the last ones).
///
/// # Safety
/// As [`produce`].
#[inline(always)]
unsafe fn fill<A: Operand, B: Operand>(
    a: &A,
    b: &B,
    k_tiles: core::ops::Range<u32>,
    rings: &Rings,
    fills: &mut u32,
) {
    for kt in k_tiles {
        let (stage, round) = rings.a_slot(*fills);
        let (b_stage, b_round) = rings.b_slot(*fills);
        // SAFETY: the stages are released (their previous fills consumed) before the
        // copies start; a fill is arrived on once this thread's copies of it landed.
        unsafe {
            rings.a.acquire(stage, round);
            rings.b.acquire(b_stage, b_round);
            a.stage(rings.stage_a(stage), kt);
            b.stage(rings.stage_b(b_stage), kt);
            async_copy_commit();
            async_copy_wait::<FILL_LAG>();
            if *fills >= FILL_LAG {
                arrive_both(rings, *fills - FILL_LAG);
            }
        }
        *fills += 1;
    }
}

/// Arrives on fill `fill` of both rings.
///
/// # Safety
/// As [`fill`], this thread's copies of the fill landed.
#[inline(always)]
unsafe fn arrive_both(rings: &Rings, fill: u32) {
    // SAFETY: forwarded.
    unsafe {
        rings.a.arrive(rings.a_slot(fill).0);
        rings.b.arrive(rings.b_slot(fill).0);
    }
}

/// Arrives on the fills [`fill`] left in flight, once they landed.
///
/// # Safety
/// As [`produce`], after the last [`fill`].
#[inline(always)]
unsafe fn finish_fills(rings: &Rings, fills: u32) {
    async_copy_wait::<0>();
    for done in fills.saturating_sub(FILL_LAG)..fills {
        // SAFETY: this thread's copies of every fill landed.
        unsafe { arrive_both(rings, done) };
    }
}

/// This thread's A fragment of the `wgmma` over rows `rows ..` (64) and k `8 kk ..` of
/// the staged A at `tile`, as staged (FP32 bits: [`to_tf32_fragment`] rounds it).
/// Registers 0 to 3 hold (row, column) (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4)
/// of the warp's 16 rows, g the lane's quad and t its place in it. Rows of K (im2col
/// and `cp.async` tiles, NHWC row strips from row `skip` on): lane `i` of warp `w`
/// addresses row `16 w + i % 8 + 8 (i / 8 % 2)`, k `8 kk + 4 (i / 16)`, so that
/// `ldmatrix` hands out the four registers. NCHW boxes (rows of pixels, one per
/// channel, the tile's first pixel `skip` into the strip): column t of the step is
/// channel 2t, column t + 4 channel 2t + 1 ([`box_filter_index`]).
///
/// # Safety
/// The whole warpgroup calls it; the tile's copies landed and are visible to it.
#[inline(always)]
unsafe fn a_fragment(nchw_boxes: bool, tile: u32, rows: u32, kk: u32, skip: u32) -> [u32; 4] {
    let (lane, warp) = (lane_id(), thread_idx_x() / 32 % 4);
    if nchw_boxes {
        let (row, channel) = (skip + rows + 16 * warp + lane / 4, 8 * kk + 2 * (lane % 4));
        let places = [
            boxed(tile, row, channel),
            boxed(tile, row + 8, channel),
            boxed(tile, row, channel + 1),
            boxed(tile, row + 8, channel + 1),
        ];
        // SAFETY: elements of the landed tile.
        return places.map(|place| unsafe { load_shared_f32(place) }.to_bits());
    }
    let row = skip + rows + 16 * warp + lane % 8 + 8 * (lane / 8 % 2);
    // SAFETY: 16-byte rows of the landed tile; the warp converges here.
    unsafe { load_matrix_x4(staged(tile, row, kk * 8 + 4 * (lane / 16))) }
}

/// An A fragment rounded to TF32 to nearest: the tensor cores would truncate the low
/// mantissa bits, which biases the products and more than doubles the error.
#[inline(always)]
fn to_tf32_fragment(staged: [u32; 4]) -> [u32; 4] {
    staged.map(|bits| to_tf32(f32::from_bits(bits)))
}

/// Where the element of pixel `row` of the strip and channel `channel` of the k-tile
/// lies among the NCHW boxes staged at `tile`: in box `row / NCHW_BOX_PIXELS`, at row
/// `channel`, its 16-byte chunk swizzled by the row as the bulk copy wrote it.
#[inline(always)]
fn boxed(tile: u32, row: u32, channel: u32) -> u32 {
    let (pixel, chunk) = (row % NCHW_BOX_PIXELS, row % NCHW_BOX_PIXELS / 4);
    tile + row / NCHW_BOX_PIXELS * NCHW_BOX_BYTES
        + channel * 128
        + 16 * (chunk ^ (channel % 8))
        + 4 * (pixel % 4)
}

/// `wgmma` batches left in flight after each issue, A through registers: the
/// multiplies of the ones before overlap the loads of the next fragments. Two would
/// hold a fourth set of A fragments, past a consumer's registers.
const BATCHES_IN_FLIGHT: u32 = 1;
const _: () = assert!(BATCHES_IN_FLIGHT >= 1 && BATCHES_IN_FLIGHT <= TC_BK / 8);

/// Where a k-tile's operands lie: the fills of A and B it reads (B one per k-tile;
/// A one per k-tile, or per row strip), whether its A is a fill the tile has not read
/// before, and the row of A where the consumer's rows start (`skip`): with row strips,
/// the strip's row of its taps' first pixel; in a tile both consumers share, the
/// second consumer's half.
#[derive(Clone, Copy)]
struct KTileFills {
    a: u32,
    b: u32,
    new_a: bool,
    skip: u32,
}

/// A k-tile of a tile's product, the `first` of its unit or not: `sums += A B^T` over
/// the k-tile for the tile's rows. A through registers: one batch of two `wgmma` (64
/// rows each) per 8 k, each followed by a wait that leaves `BATCHES_IN_FLIGHT` in
/// flight. With `SHARED_A` (NHWC im2col copies, which rounded A to TF32) the tensor
/// cores read A from shared memory too: the k-tile's eight `wgmma` in one batch, the
/// wait leaving it in flight.
///
/// # Safety
/// The consumer warpgroup calls it together for the k-tiles of a tile in order. The
/// stages' copies landed once the full barriers are passed, and are fenced for the
/// tensor cores' reads of B; each batch's A fragments stay untouched until a wait
/// says the batch is done; a stage is released once the last batch reading it is done
/// (at the wait of the next k-tile's batch `BATCHES_IN_FLIGHT - 1` here, A only where
/// that k-tile reads another fill, else after the tile's last wait).
#[inline(always)]
unsafe fn multiply_k_tile<
    E: StripOperand,
    const CHANNELS_LAST: bool,
    const ROW_STRIPS: bool,
    const SHARED_A: bool,
    const J: usize,
>(
    sums: &mut [[[f32; 4]; J]; 2],
    rings: &Rings,
    fills: KTileFills,
    first: bool,
) where
    [[f32; 4]; J]: WarpgroupAccumulators,
{
    let nchw_boxes = ROW_STRIPS && !CHANNELS_LAST;
    let (a_stage, a_round) = rings.a_slot(fills.a);
    let (b_stage, b_round) = rings.b_slot(fills.b);
    let a = rings.stage_a(a_stage);
    // The bottom 64 rows: among NCHW boxes two boxes on, at the same places.
    let (bottom, bottom_rows) = if nchw_boxes {
        (a + 64 / NCHW_BOX_PIXELS * NCHW_BOX_BYTES, 0)
    } else {
        (a, 64)
    };
    // SAFETY: the caller's contract.
    let fragments = |kk| unsafe {
        [
            a_fragment(nchw_boxes, a, 0, kk, fills.skip),
            a_fragment(nchw_boxes, bottom, bottom_rows, kk, fills.skip),
        ]
    };
    // SAFETY: the caller's contract.
    unsafe {
        if fills.new_a {
            rings.a.wait_full(a_stage, a_round);
        }
        rings.b.wait_full(b_stage, b_round);
        fence_async_shared();
        if SHARED_A {
            let a_rows = a + 4 * TC_BK * fills.skip;
            let a = |row: u32, kk: u32| swizzled_k_major_descriptor(a_rows + 4 * TC_BK * row + 32 * kk);
            let [top, bottom] = &mut *sums;
            warpgroup_fence();
            for kk in 0..TC_BK / 8 {
                let b = swizzled_k_major_descriptor(rings.stage_b(b_stage) + kk * 32);
                E::multiply(top, a(0, kk), b);
                E::multiply(bottom, a(64, kk), b);
            }
            warpgroup_commit();
            warpgroup_wait::<1>();
            if !first {
                release_previous(rings, fills);
            }
            return;
        }
        // With NCHW boxes the next step's loads overlap the wait (a third set of
        // fragments beside the two batches in flight); the `cp.async` kernels' consumers
        // have no registers for them beside their producer's.
        let prefetch = ROW_STRIPS;
        let mut staged = fragments(0);
        for kk in 0..TC_BK / 8 {
            if !prefetch && kk > 0 {
                staged = fragments(kk);
            }
            let [a_top, a_bottom] = staged.map(to_tf32_fragment);
            let b = swizzled_k_major_descriptor(rings.stage_b(b_stage) + kk * 32);
            // Written out rather than looped: a loop indexes the sums in local memory,
            // whose loads ptxas cannot overlap with the multiplies.
            let [top, bottom] = &mut *sums;
            warpgroup_fence();
            top.multiply_tf32(a_top, b);
            bottom.multiply_tf32(a_bottom, b);
            warpgroup_commit();
            if prefetch && kk + 1 < TC_BK / 8 {
                staged = fragments(kk + 1);
            }
            warpgroup_wait::<BATCHES_IN_FLIGHT>();
            if kk == BATCHES_IN_FLIGHT - 1 && !first {
                release_previous(rings, fills);
            }
        }
    }
}

/// Releases the stages of the k-tile before `fills`: its B, and its A where `fills`
/// reads another.
///
/// # Safety
/// The consumer warpgroup calls it together, once its batches reading them are done.
#[inline(always)]
unsafe fn release_previous(rings: &Rings, fills: KTileFills) {
    // SAFETY: forwarded.
    unsafe {
        rings.b.release(rings.b_slot(fills.b - 1).0);
        if fills.new_a {
            rings.a.release(rings.a_slot(fills.a - 1).0);
        }
    }
}

/// Named barriers that hand the turn to multiply to consumer 0 and to consumer 1.
const TURN_TO_FIRST: u32 = 5;
const TURN_TO_SECOND: u32 = 4;

/// A k-tile of a unit on NHWC row strips, the `first` of its unit or not: `sums +=
/// W X^T` over the k-tile, W the unit's 64 filters (the stage of B, `wgmma`'s A) and X
/// the strip's 256 pixels from the tap's first (`wgmma`'s B), both TF32 already: one
/// batch of four m64n256k8, the wait leaving it in flight. The rows of 128 bytes may
/// start anywhere in the strip: the tensor cores swizzle by the address (as
/// `tf32_passes_round_inputs_to_nearest` checks, taps 1 and 2 of its strips).
///
/// # Safety
/// As [`multiply_k_tile`].
#[inline(always)]
unsafe fn multiply_in_turns<E: StripOperand>(
    sums: &mut ChannelRowSums,
    rings: &Rings,
    fills: KTileFills,
    first: bool,
) {
    let (a_stage, a_round) = rings.a_slot(fills.a);
    let (b_stage, b_round) = rings.b_slot(fills.b);
    let pixels = rings.stage_a(a_stage) + 4 * TC_BK * fills.skip;
    // SAFETY: the caller's contract.
    unsafe {
        if fills.new_a {
            rings.a.wait_full(a_stage, a_round);
        }
        rings.b.wait_full(b_stage, b_round);
        fence_async_shared();
        warpgroup_fence();
        for kk in 0..TC_BK / 8 {
            let filters = swizzled_k_major_descriptor(rings.stage_b(b_stage) + 32 * kk);
            E::multiply(sums, filters, swizzled_k_major_descriptor(pixels + 32 * kk));
        }
        warpgroup_commit();
        warpgroup_wait::<1>();
        if !first {
            release_previous(rings, fills);
        }
    }
}

/// A consumer on NHWC row strips: multiplies every other unit of this block (consumer
/// 0 the first) and stores it (split, into its split's copy of y), so that each one's
/// stores overlap the other's multiplies (ping-pong). A consumer starts a unit once the
/// other has passed the full barriers of the unit before (which also keeps it from
/// waiting on a fill a round early, whose parity the barrier would pass), and hands
/// over the turn once it has passed its own.
///
/// # Safety
/// As [`forward`]; consumer warpgroup `consumer` (0 or 1) calls it.
#[inline(always)]
unsafe fn consume_in_turns<E: StripOperand, const Y_FIRST: bool>(
    args: &TensorCoreArgs,
    units: u32,
    rings: &Rings,
    consumer: u32,
) {
    let p = &args.problem;
    let outputs = p.output_count();
    let handoff = 2 * WARPGROUP;
    let mut fills = Fills::default();
    let mut index = block_idx_x();
    let mut ordinal = 0;
    while index < units {
        let unit = work_unit(&args.plan, rings.schedule.tile_rows, index);
        let unit_fills = Fills {
            a: a_fills::<true>(p, &unit),
            b: unit.k_count,
        };
        let more = index + grid_dim_x() < units;
        index += grid_dim_x();
        let (mine, waits) = (ordinal % 2 == consumer, ordinal > 0);
        ordinal += 1;
        if !mine {
            fills.a += unit_fills.a;
            fills.b += unit_fills.b;
            continue;
        }
        let args = &TensorCoreArgs {
            y: args.y.offset(unit.split as u64 * outputs),
            ..*args
        };
        // SAFETY: the launch's arguments.
        let mut sums = unsafe { channel_row_sums(args, unit.tile, |c| bias_of(args, c)) };
        sums.pin();
        // K-tile kt's fills: a new strip where its tap starts a kernel row.
        let mut a = fills.a;
        let mut k_tile_fills = |kt: u32| {
            let s = tap_of(p, unit.k_first + kt).0;
            let new_a = kt == 0 || s == 0;
            if new_a && kt > 0 {
                a += 1;
            }
            KTileFills {
                a,
                b: fills.b + kt,
                new_a,
                skip: strip_skip::<true>(p, s),
            }
        };
        // SAFETY: the turns order the units' fills (above); every handoff has its
        // waiter: the other consumer's next unit. The first k-tile runs before the
        // loop, so that the sums enter it defined by a `wgmma` as they leave it.
        unsafe {
            if waits {
                if consumer == 0 {
                    sync_group::<TURN_TO_FIRST>(handoff);
                } else {
                    sync_group::<TURN_TO_SECOND>(handoff);
                }
            }
            let first = k_tile_fills(0);
            multiply_in_turns::<E>(&mut sums, rings, first, true);
            for kt in 1..unit.k_count {
                let next = k_tile_fills(kt);
                multiply_in_turns::<E>(&mut sums, rings, next, false);
            }
            if more {
                if consumer == 0 {
                    arrive_group::<TURN_TO_SECOND>(handoff);
                } else {
                    arrive_group::<TURN_TO_FIRST>(handoff);
                }
            }
        }
        let (last_a, last_b) = (rings.a_slot(a).0, rings.b_slot(fills.b + unit.k_count - 1).0);
        fills.a += unit_fills.a;
        fills.b += unit_fills.b;
        // SAFETY: as above; the sums are final after the wait, the stages back with the
        // producer since the epilogue reads only registers.
        unsafe {
            warpgroup_wait::<0>();
            rings.a.release(last_a);
            rings.b.release(last_b);
            // Split, the parts' sums are f32 whatever y's type (in the partials' layout).
            let split = args.plan.splits > 1;
            if Y_FIRST && !split {
                E::store_rows_first(args, unit.tile, &sums);
            } else if E::IS_F32 || !split {
                store_channel_rows::<E>(args, unit.tile, &sums);
            } else {
                store_channel_rows::<f32>(args, unit.tile, &sums);
            }
        }
    }
}

/// The fills of A a unit's k-tiles take: one per k-tile, or with row strips one per
/// kernel row the unit starts, and one more where it starts inside a kernel row.
#[inline(always)]
fn a_fills<const ROW_STRIPS: bool>(p: &ConvProblem, unit: &WorkUnit) -> u32 {
    if !ROW_STRIPS {
        return unit.k_count;
    }
    (0..unit.k_count)
        .filter(|&kt| kt == 0 || tap_of(p, unit.k_first + kt).0 == 0)
        .count() as u32
}

/// A consumer beside the other: multiplies its half of the rows of every unit of this
/// block and stores it (split, into its split's copy of y), where `placement` puts
/// register epilogues.
///
/// # Safety
/// As [`forward_with`]; consumer warpgroup `consumer` (0 or 1) calls it.
#[inline(always)]
unsafe fn consume<
    E: StripOperand,
    const CHANNELS_LAST: bool,
    const ROW_STRIPS: bool,
    const SHARED_A: bool,
    const J: usize,
>(
    args: &TensorCoreArgs,
    units: u32,
    rings: &Rings,
    consumer: u32,
    placement: impl Placement,
) where
    [[f32; 4]; J]: WarpgroupAccumulators,
{
    let p = &args.problem;
    let outputs = p.output_count();
    let warp = thread_idx_x() / 32 % 4;
    // The consumer's first row of a tile, and where it stages a fused epilogue in the
    // tile's last A: at the start for the first consumer, at the end for the second,
    // clear of each other's reads (a tile's rows of K: the halves; NCHW boxes: the
    // first consumer reads boxes 0 to 4, the second 4 to 8).
    let half = consumer * WGMMA_BM;
    let staging = consumer * (rings.schedule.a_bytes - tile_bytes(WGMMA_BM));
    let mut fills = Fills::default();
    let mut index = block_idx_x();
    while index < units {
        let unit = work_unit(&args.plan, rings.schedule.tile_rows, index);
        let k_tiles = unit.k_count;
        let tile = TileOrigin {
            m0: unit.tile.m0 + half,
            ..unit.tile
        };
        let unit_fills = Fills {
            a: a_fills::<ROW_STRIPS>(p, &unit),
            b: k_tiles,
        };
        index += grid_dim_x();
        let args = &TensorCoreArgs {
            y: args.y.offset(unit.split as u64 * outputs),
            ..*args
        };
        // SAFETY: the launch's arguments.
        let mut sums = unsafe { bias_sums::<2, J>(args, tile, 0, |c| bias_of(args, c)) };
        let [top, bottom] = &mut sums;
        top.pin();
        bottom.pin();
        // K-tile kt's fills: with row strips a new A where its tap starts a kernel row.
        let mut a = fills.a;
        let mut k_tile_fills = |kt: u32| {
            let s = if ROW_STRIPS {
                tap_of(p, unit.k_first + kt).0
            } else {
                0
            };
            let new_a = kt == 0 || !ROW_STRIPS || s == 0;
            if new_a && kt > 0 {
                a += 1;
            }
            let skip = if ROW_STRIPS {
                strip_skip::<CHANNELS_LAST>(p, s) + half
            } else {
                half
            };
            KTileFills {
                a,
                b: fills.b + kt,
                new_a,
                skip,
            }
        };
        // The first k-tile runs before the loop, so that the sums enter it defined by a
        // `wgmma` as they leave it: else ptxas serializes every `wgmma` of the loop.
        // SAFETY: forwarded; there is at least one k-tile.
        unsafe {
            let first = k_tile_fills(0);
            multiply_k_tile::<E, CHANNELS_LAST, ROW_STRIPS, SHARED_A, J>(&mut sums, rings, first, true);
        }
        for kt in 1..k_tiles {
            // SAFETY: as above.
            unsafe {
                let next = k_tile_fills(kt);
                multiply_k_tile::<E, CHANNELS_LAST, ROW_STRIPS, SHARED_A, J>(&mut sums, rings, next, false);
            }
        }
        let (last_a, last_b) = (rings.a_slot(a).0, rings.b_slot(fills.b + k_tiles - 1).0);
        fills.a += unit_fills.a;
        fills.b += unit_fills.b;
        // SAFETY: as above; the sums are final after the wait.
        unsafe {
            warpgroup_wait::<0>();
            // 16-bit plans take only register epilogues (a bias, ReLU or neither).
            if args.epilogue.fits_register_stores() || !E::PER_OUTPUT {
                // Straight from the registers, the stages already back with the producer.
                rings.a.release(last_a);
                rings.b.release(last_b);
                let warp_tiles = WarpTiles {
                    sums,
                    origin: (16 * warp, 0),
                    row_step: 64,
                };
                // Split, the parts' sums are f32 whatever y's type.
                if E::IS_F32 || args.plan.splits == 1 {
                    placement.store::<E, 2, J>(args, tile, &warp_tiles);
                } else {
                    placement.store::<f32, 2, J>(args, tile, &warp_tiles);
                }
            } else {
                // Through this consumer's part of the last A, which only it reads.
                rings.b.release(last_b);
                store_staged(args, tile, &sums, rings.stage_a(last_a) + staging, consumer);
                fence_async_shared();
                rings.a.release(last_a);
            }
        }
    }
}
