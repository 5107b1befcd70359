//! The mainloop on warpgroup MMA (`wgmma`, sm_90a): two warpgroups, each multiplying
//! 64 rows of the tile by all its 128 columns straight from the swizzled stages, while
//! the same threads copy the stages ahead. The tensor cores read the operands as TF32
//! (the low mantissa bits ignored).

use super::mainloop::{Mainloop, WarpTiles};
use super::operands::Operand;
use super::*;
use crate::device::{
    async_copy_commit, async_copy_wait, fence_async_shared, shared_base, swizzled_k_major_descriptor,
    sync_threads, thread_idx_x, warpgroup_commit, warpgroup_fence, warpgroup_mma_tf32_m64n128k8,
    warpgroup_wait,
};

const _: () = assert!(TC_BN == 128 && TC_BM == 128 && TC_THREADS == 256 && WGMMA_STAGES >= 3);

/// Warpgroup `g` holds rows `64 g ..` of the tile, each warp 16 rows by 128 columns.
pub struct WarpgroupMma;

impl Mainloop for WarpgroupMma {
    type Sums = WarpTiles<1, 16>;

    #[inline(always)]
    unsafe fn product<A: Operand, B: Operand>(a: &A, b: &B, k_tiles: u32) -> Self::Sums {
        const STAGES: u32 = WGMMA_STAGES;
        let stage_a = |s: u32| shared_base() + s * 2 * TC_TILE_BYTES;
        let stage_b = |s: u32| stage_a(s) + TC_TILE_BYTES;
        // Copies run `STAGES - 2` slices ahead, one multiply stays in flight: the stage
        // refilled in iteration `kt` was last read by the multiply of `kt - 2`, which
        // every warpgroup waited for (at the end of `kt - 1`) before the barrier of `kt`.
        // SAFETY (of every `stage` call): that stage is free.
        for s in 0..STAGES - 2 {
            if s < k_tiles {
                unsafe {
                    a.stage(stage_a(s), s * TC_BK);
                    b.stage(stage_b(s), s * TC_BK);
                }
            }
            async_copy_commit();
        }
        let warp = thread_idx_x() / 32;
        let group_row = (warp / 4) * 64;
        let mut sums = [[0.0; 4]; 16];
        for kt in 0..k_tiles {
            async_copy_wait::<{ STAGES - 3 }>();
            fence_async_shared();
            // SAFETY: every thread reaches it; the stage of `kt` landed for every thread
            // and was fenced for the tensor cores' reads.
            unsafe { sync_threads() };
            let (tile_a, tile_b) = (stage_a(kt % STAGES), stage_b(kt % STAGES));
            // SAFETY: the warpgroup runs these together; the stage is published, and it
            // is not written again before the wait of the next iteration.
            unsafe {
                warpgroup_fence();
                for kk in 0..TC_BK / 8 {
                    let a = swizzled_k_major_descriptor(tile_a + group_row * TC_BK * 4 + kk * 32);
                    let b = swizzled_k_major_descriptor(tile_b + kk * 32);
                    warpgroup_mma_tf32_m64n128k8(&mut sums, a, b);
                }
                warpgroup_commit();
            }
            let refill = kt + STAGES - 2;
            if refill < k_tiles {
                let s = refill % STAGES;
                unsafe {
                    a.stage(stage_a(s), refill * TC_BK);
                    b.stage(stage_b(s), refill * TC_BK);
                }
            }
            async_copy_commit();
            // SAFETY: the warpgroup runs it together.
            unsafe { warpgroup_wait::<1>() };
        }
        // SAFETY: as above; the sums are final after it.
        unsafe { warpgroup_wait::<0>() };
        WarpTiles {
            sums: [sums],
            origin: (warp * 16, 0),
        }
    }
}
