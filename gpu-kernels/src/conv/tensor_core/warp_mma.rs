//! The mainloop on `mma.sync` (sm_80 and up): `TC_STAGES` stages of `cp.async` copies,
//! each warp multiplying its 64 x 32 share of the tile from fragments that `ldmatrix`
//! reads, the operands rounded to TF32 (to nearest) as they leave shared memory.

use super::mainloop::{Mainloop, WarpTiles};
use super::operands::{Operand, staged};
use super::*;
use crate::device::{
    async_copy_commit, async_copy_wait, lane_id, load_matrix_x4, mma_tf32_16x8x8, shared_base, sync_threads,
    thread_idx_x, to_tf32,
};

/// 8 warps, 2 along M by 4 along N, each 4 x 4 tiles of 16 x 8.
pub struct WarpMma;

impl Mainloop for WarpMma {
    type Sums = WarpTiles<4, 4>;

    #[inline(always)]
    unsafe fn product<A: Operand, B: Operand>(a: &A, b: &B, k_tiles: u32) -> Self::Sums {
        let stage_a = |s: u32| shared_base() + s * 2 * TC_TILE_BYTES;
        let stage_b = |s: u32| stage_a(s) + TC_TILE_BYTES;
        // SAFETY (of every `stage` call): the stage filled is one that every thread
        // finished reading before the barrier of the iteration that fills it.
        for s in 0..TC_STAGES - 1 {
            if s < k_tiles {
                unsafe {
                    a.stage(stage_a(s), s * TC_BK);
                    b.stage(stage_b(s), s * TC_BK);
                }
            }
            async_copy_commit();
        }
        let warp = thread_idx_x() / 32;
        let (row0, col0) = ((warp % 2) * 64, (warp / 2) * 32);
        let lane = lane_id();
        let mut acc = [[[0.0; 4]; 4]; 4];
        for kt in 0..k_tiles {
            async_copy_wait::<{ TC_STAGES - 2 }>();
            // SAFETY: every thread reaches it; the stage of `kt` landed for every thread.
            unsafe { sync_threads() };
            let refill = kt + TC_STAGES - 1;
            if refill < k_tiles {
                let s = refill % TC_STAGES;
                // SAFETY: stage `s` was last read in iteration `kt - 1`, before the barrier.
                unsafe {
                    a.stage(stage_a(s), refill * TC_BK);
                    b.stage(stage_b(s), refill * TC_BK);
                }
            }
            async_copy_commit();
            let (tile_a, tile_b) = (stage_a(kt % TC_STAGES), stage_b(kt % TC_STAGES));
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
        }
        WarpTiles {
            sums: acc,
            origin: (row0, col0),
        }
    }
}
