//! The forward pass on `mma.sync` (sm_80 and up), one block per `TC_BM x TC_BN` tile:
//! every thread copies `TC_STAGES` stages ahead with `cp.async`, and each warp
//! multiplies its 64 x 32 share of the tile from fragments that `ldmatrix` reads, the
//! operands rounded to TF32 (to nearest) as they leave shared memory.

use super::epilogue::{TileOrigin, WarpTiles, bias_sums, store};
use super::operands::{
    Filters, KTiles, NchwPatches, Operand, Patches, ScalarFilters, ScalarPatches, Stagers, VectorFilters,
    VectorPatches, staged,
};
use super::*;
use crate::device::{
    async_copy_commit, async_copy_wait, block_idx_x, block_idx_y, block_idx_z, lane_id, load_matrix_x4,
    mma_tf32_16x8x8, shared_base, sync_threads, thread_idx_x, to_tf32,
};

/// Staged rows per thread of each operand tile.
const ROWS: usize = (TC_BM * TC_BK / 4 / TC_THREADS) as usize;

/// y = conv(x, w) + bias over NHWC tensors.
///
/// # Safety
/// x, w and y hold the problem's NHWC tensors (w `[out][kh][kw][in / groups]`), bias
/// null or `out_channels` floats; `plan` is the problem's forward plan in NHWC for
/// `mma.sync`, the launch the one it builds.
#[inline(always)]
pub unsafe fn forward_nhwc(args: TensorCoreArgs) {
    let (p, plan) = (&args.problem, &args.plan);
    let (tile, k_tiles) = (block_tile(), KTiles::new(p, plan));
    let patches = Patches::<ROWS, _>::new(args.x.as_ptr(), p, k_tiles, tile.m0, tile.group, all_threads());
    // SAFETY: forwarded from the launch's contract.
    unsafe {
        if plan.a_vector != 0 {
            with_filters(&args, tile, k_tiles, VectorPatches(patches))
        } else {
            with_filters(&args, tile, k_tiles, ScalarPatches(patches))
        }
    }
}

/// y = conv(x, w) + bias over NCHW tensors.
///
/// # Safety
/// As [`forward_nhwc`], with NCHW tensors (w `[out][in / groups][kh][kw]`) and the
/// forward plan in NCHW.
#[inline(always)]
pub unsafe fn forward_nchw(args: TensorCoreArgs) {
    let (p, plan) = (&args.problem, &args.plan);
    let (tile, k_tiles) = (block_tile(), KTiles::new(p, plan));
    let patches = NchwPatches::<1>::new(args.x.as_ptr(), p, tile.m0, tile.group, TC_BM, all_threads());
    // SAFETY: forwarded from the launch's contract.
    unsafe { with_filters(&args, tile, k_tiles, patches) };
}

/// The block's tile: grid x the tiles of M, y the group, z the tiles of channels.
#[inline(always)]
fn block_tile() -> TileOrigin {
    TileOrigin {
        m0: block_idx_x() * TC_BM,
        group: block_idx_y(),
        n0: block_idx_z() * TC_BN,
    }
}

#[inline(always)]
fn all_threads() -> Stagers {
    Stagers {
        index: thread_idx_x(),
        count: TC_THREADS,
    }
}

/// The mainloop over `patches` and the weights (copied 16 or 4 bytes at a time as the
/// plan says), then the epilogue.
///
/// # Safety
/// As the entry points'.
#[inline(always)]
unsafe fn with_filters<A: Operand>(args: &TensorCoreArgs, tile: TileOrigin, k_tiles: KTiles, patches: A) {
    let filters = Filters::<ROWS>::new(
        args.w.as_ptr(),
        &args.problem,
        k_tiles,
        tile.n0,
        tile.group,
        all_threads(),
    );
    // SAFETY: forwarded.
    unsafe {
        let sums = if args.plan.b_vector != 0 {
            product(args, tile, &patches, &VectorFilters(filters), k_tiles.count())
        } else {
            product(args, tile, &patches, &ScalarFilters(filters), k_tiles.count())
        };
        store(args, tile, &sums);
    }
}

/// The bias plus `A B^T` over `k_tiles` k-tiles for the block's tile: 8 warps, 2 along M by 4 along
/// N, each 4 x 4 tiles of 16 x 8.
///
/// # Safety
/// The launch has `TC_THREADS` threads and `TC_STAGES` stages of dynamic shared memory;
/// every thread of the block calls it with the same `k_tiles`.
#[inline(always)]
unsafe fn product<A: Operand, B: Operand>(
    args: &TensorCoreArgs,
    tile: TileOrigin,
    a: &A,
    b: &B,
    k_tiles: u32,
) -> WarpTiles<4, 4> {
    let warp = thread_idx_x() / 32;
    let (row0, col0) = ((warp % 2) * 64, (warp / 2) * 32);
    let lane = lane_id();
    let bias = args.epilogue.bias.as_ptr();
    // SAFETY: the launch's arguments; `bias_of` reads a channel of the bias.
    let acc = unsafe { bias_sums::<4, 4>(args, tile, col0, |c| *bias.add(c as usize)) };
    let multiply = |(tile_a, tile_b): (u32, u32), mut acc: [[[f32; 4]; 4]; 4]| {
        // Lane `i` addresses row `i % 8` of matrix `i / 8` of each `ldmatrix.x4`.
        let (row_in, matrix) = (lane % 8, lane / 8);
        for kk in 0..TC_BK / 8 {
            let fragment = |address: u32| {
                // SAFETY: 16-byte rows of the stage, landed and published by the
                // barrier; the whole warp calls it.
                unsafe { load_matrix_x4(address) }.map(|bits| to_tf32(f32::from_bits(bits)))
            };
            // A: matrices (rows 0-7, k 0-3), (rows 8-15, k 0-3), (0-7, 4-7), (8-15, 4-7).
            let a_frags: [[u32; 4]; 4] = core::array::from_fn(|i| {
                let row = row0 + i as u32 * 16 + row_in + 8 * (matrix % 2);
                fragment(staged(tile_a, row, kk * 8 + 4 * (matrix / 2)))
            });
            // B: for n tiles 2p and 2p + 1, matrices (k 0-3), (k 4-7) of each.
            let b_pairs: [[u32; 4]; 2] = core::array::from_fn(|p| {
                let row = col0 + p as u32 * 16 + row_in + 8 * (matrix / 2);
                fragment(staged(tile_b, row, kk * 8 + 4 * (matrix % 2)))
            });
            let b_frags: [[u32; 2]; 4] =
                core::array::from_fn(|j| [b_pairs[j / 2][2 * (j % 2)], b_pairs[j / 2][2 * (j % 2) + 1]]);
            for (i, a) in a_frags.iter().enumerate() {
                for (j, b) in b_frags.iter().enumerate() {
                    acc[i][j] = mma_tf32_16x8x8(*a, *b, acc[i][j]);
                }
            }
        }
        acc
    };
    let tiles = (tile_bytes(TC_BM), tile_bytes(TC_BN));
    // SAFETY: every thread of the block calls it with the same `k_tiles`; the launch
    // has `TC_STAGES` stages of both tiles.
    let acc = unsafe { pipeline(k_tiles, acc, (a, b), tiles, multiply) };
    WarpTiles {
        sums: acc,
        origin: (row0, col0),
        row_step: 16,
    }
}

/// The `mma.sync` mainloop over `k_tiles` k-tiles of the operands `a` and `b`, staged in
/// `TC_STAGES` stages of shared memory (a tile of `a` then one of `b`, of `bytes` each):
/// `multiply((tile_a, tile_b), sums)` adds the products of a stage to the sums once
/// every thread's copies into it landed and a barrier published them; the sums after
/// the last. Each stage is refilled only after the barrier that follows every thread's
/// last read of it.
///
/// # Safety
/// Every thread of the block calls it with the same `k_tiles`; the launch has the
/// stages' dynamic shared memory.
#[inline(always)]
pub(super) unsafe fn pipeline<S, A: Operand, B: Operand>(
    k_tiles: u32,
    mut sums: S,
    (a, b): (&A, &B),
    bytes: (u32, u32),
    multiply: impl Fn((u32, u32), S) -> S,
) -> S {
    let tiles = |s: u32| {
        let tile_a = shared_base() + s * (bytes.0 + bytes.1);
        (tile_a, tile_a + bytes.0)
    };
    // SAFETY (of every `stage` call): the stage filled is one that every thread
    // finished reading before the barrier of the iteration that fills it.
    for s in 0..TC_STAGES - 1 {
        if s < k_tiles {
            unsafe {
                a.stage(tiles(s).0, s);
                b.stage(tiles(s).1, s);
            }
        }
        async_copy_commit();
    }
    for kt in 0..k_tiles {
        async_copy_wait::<{ TC_STAGES - 2 }>();
        // SAFETY: every thread reaches it; the stage of `kt` landed for every thread.
        unsafe { sync_threads() };
        let refill = kt + TC_STAGES - 1;
        if refill < k_tiles {
            // Stage `refill % TC_STAGES` was last read in iteration `kt - 1`, before
            // the barrier.
            let (tile_a, tile_b) = tiles(refill % TC_STAGES);
            unsafe {
                a.stage(tile_a, refill);
                b.stage(tile_b, refill);
            }
        }
        async_copy_commit();
        sums = multiply(tiles(kt % TC_STAGES), sums);
    }
    sums
}
