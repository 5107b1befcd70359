//! Decoupled look-back (Merrill and Garland, as in CUB's single-pass scan): each tile
//! publishes its aggregate as soon as it has it, then walks back over its predecessors,
//! summing aggregates until it meets a published inclusive prefix; it then publishes
//! its own inclusive prefix. Tiles take their ids in launch order from a counter, so a
//! tile only ever waits for tiles that are already running.
//!
//! Two shapes of status: one value per tile ([`TileStatus::publish_one`],
//! [`TileStatus::look_back_warp`]: one thread publishes, one warp looks back over 32
//! predecessors at a time), or one value per thread of the block, for one running sum
//! per column ([`TileStatus::publish_each`], [`TileStatus::look_back_block`]).

use crate::device::{
    Coherent, WARP_SIZE, ballot, fence_gpu, lane_id, load_acquire_u32, store_release_u32, sync_threads,
    thread_idx_x,
};
use crate::warp;

use super::ScanOp;

/// Flag: the tile's aggregate is published.
pub const AGGREGATE: u32 = 1;
/// Flag: the tile's inclusive prefix is published.
pub const INCLUSIVE: u32 = 2;

/// The status of every tile of a launch, in global memory.
pub struct TileStatus<T> {
    /// One flag per tile, zero (nothing published) before the launch.
    pub flags: *mut u32,
    /// `width` values per tile.
    pub aggregates: *mut T,
    /// `width` values per tile.
    pub inclusives: *mut T,
    pub width: u32,
}

impl<T: ScanOp + Coherent> TileStatus<T> {
    /// Slot of value `lane` of `tile` in `values`.
    #[inline(always)]
    fn slot(&self, values: *mut T, tile: u64, lane: u32) -> *mut T {
        // SAFETY (of the callers' dereference): tile and lane are in range.
        values.wrapping_add((tile * self.width as u64 + lane as u64) as usize)
    }

    /// Publishes `tile`'s single value under `flag`: the value, then the flag with
    /// release order. Called by one thread.
    ///
    /// # Safety
    /// `width` is 1 and `tile` is in range.
    #[inline(always)]
    pub unsafe fn publish_one(&self, tile: u64, value: T, flag: u32) {
        let target = if flag == INCLUSIVE {
            self.inclusives
        } else {
            self.aggregates
        };
        // SAFETY: the slot and flag are this tile's; release orders the value first.
        unsafe {
            T::store_relaxed(self.slot(target, tile, 0), value);
            store_release_u32(self.flags.add(tile as usize), flag);
        }
    }

    /// The combined values of tiles `tile - 1`, `tile - 2`, ... back to the nearest one
    /// with a published inclusive prefix, read by one warp 32 tiles at a time: each lane
    /// waits for one predecessor's flag, a ballot finds the nearest inclusive one, and
    /// a warp reduction sums the window. Every lane returns the result.
    ///
    /// # Safety
    /// `width` is 1; all 32 lanes of one warp call it; a predecessor of `tile` publishes
    /// an inclusive prefix without waiting on `tile`, and tile 0 publishes one.
    #[inline(always)]
    pub unsafe fn look_back_warp(&self, tile: u64) -> T {
        let lane = lane_id();
        let mut prefix = T::identity();
        let mut window_end = tile;
        loop {
            // Lane i looks at tile window_end - 1 - i; lanes past tile 0 see nothing.
            let exists = window_end > lane as u64;
            let predecessor = window_end.wrapping_sub(1 + lane as u64);
            let mut flag = INCLUSIVE;
            loop {
                if exists {
                    // SAFETY: predecessor < tile, in range.
                    flag = unsafe { load_acquire_u32(self.flags.add(predecessor as usize)) };
                }
                if ballot(flag == 0) == 0 {
                    break;
                }
            }
            let inclusive = ballot(flag == INCLUSIVE && exists);
            let stop = if inclusive != 0 {
                inclusive.trailing_zeros()
            } else {
                WARP_SIZE
            };
            let mut value = T::identity();
            if exists && lane <= stop {
                let source = if lane == stop {
                    self.inclusives
                } else {
                    self.aggregates
                };
                // SAFETY: published before the flag this lane acquired.
                value = unsafe { T::load_relaxed(self.slot(source, predecessor, 0)) };
            }
            prefix = warp::reduce(value, T::combine).combine(prefix);
            if stop < WARP_SIZE || window_end <= WARP_SIZE as u64 {
                return prefix;
            }
            window_end -= WARP_SIZE as u64;
        }
    }

    /// Publishes each thread's value (threads below `width`) for `tile` under `flag`:
    /// every thread writes and fences; after a barrier, thread 0 releases the flag.
    ///
    /// # Safety
    /// Every thread of the block calls it; `tile` is in range.
    #[inline(always)]
    pub unsafe fn publish_each(&self, tile: u64, value: T, flag: u32) {
        let lane = thread_idx_x();
        if lane < self.width {
            let target = if flag == INCLUSIVE {
                self.inclusives
            } else {
                self.aggregates
            };
            // SAFETY: the slot is this tile's and this thread's.
            unsafe { T::store_relaxed(self.slot(target, tile, lane), value) };
        }
        fence_gpu();
        // SAFETY: all threads reach the barrier; thread 0 writes the tile's own flag.
        unsafe {
            sync_threads();
            if lane == 0 {
                store_release_u32(self.flags.add(tile as usize), flag);
            }
        }
    }

    /// Each thread's combined values of the tiles at `tile - step`, `tile - 2 * step`,
    /// ... back to the nearest one with a published inclusive prefix. Thread 0 waits for
    /// each predecessor's flag and shares it through `shared_flag`; every thread then
    /// reads its own value. Two barriers per step.
    ///
    /// # Safety
    /// Every thread of the block calls it; some predecessor at a multiple of `step`
    /// publishes an inclusive prefix without waiting on this tile; `shared_flag` is a
    /// shared `u32` no other code uses meanwhile.
    #[inline(always)]
    pub unsafe fn look_back_block(&self, tile: u64, step: u64, shared_flag: *mut u32) -> T {
        let lane = thread_idx_x();
        let mut prefix = T::identity();
        let mut predecessor = tile;
        loop {
            predecessor -= step;
            // SAFETY: `predecessor` is a tile of this launch; the shared slot is ours.
            let flag = unsafe {
                if lane == 0 {
                    let flag_ptr = self.flags.add(predecessor as usize);
                    let mut flag = load_acquire_u32(flag_ptr);
                    while flag == 0 {
                        flag = load_acquire_u32(flag_ptr);
                    }
                    *shared_flag = flag;
                }
                sync_threads();
                *shared_flag
            };
            fence_gpu();
            if lane < self.width {
                let source = if flag == INCLUSIVE {
                    self.inclusives
                } else {
                    self.aggregates
                };
                // SAFETY: published before the flag that thread 0 acquired.
                prefix = unsafe { T::load_relaxed(self.slot(source, predecessor, lane)) }.combine(prefix);
            }
            // SAFETY: all threads reach it; the shared flag is free again after it.
            unsafe { sync_threads() };
            if flag == INCLUSIVE {
                return prefix;
            }
        }
    }
}
