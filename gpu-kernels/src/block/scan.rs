//! Exclusive scan of one value per thread across a block.

use crate::device::{Shuffle, WARP_SIZE, lane_id, sync_threads, thread_idx_x};

/// An associative operation with an identity, for [`exclusive_scan`].
pub trait ScanOp: Shuffle {
    fn identity() -> Self;
    /// `self` comes before `later`.
    fn combine(self, later: Self) -> Self;
}

/// Exclusive scan of `value` over the block's `WARPS` warps, in thread order; returns
/// (this thread's exclusive prefix, the block total).
///
/// Phases: a warp scan by shuffles (five steps), warp totals to `warp_totals`, one
/// barrier, then each thread folds the totals of the warps before its own.
///
/// # Safety
/// Every thread of a block of `WARPS * 32` threads calls it; `warp_totals` is shared
/// memory for `WARPS` values that no thread touches until the caller's next barrier.
#[inline(always)]
pub unsafe fn exclusive_scan<T: ScanOp, const WARPS: usize>(value: T, warp_totals: *mut T) -> (T, T) {
    let lane = lane_id();
    let warp = (thread_idx_x() / WARP_SIZE) as usize;
    let mut inclusive = value;
    let mut delta = 1;
    while delta < WARP_SIZE {
        let before = inclusive.shfl_up(delta);
        if lane >= delta {
            inclusive = before.combine(inclusive);
        }
        delta *= 2;
    }
    let exclusive_in_warp = inclusive.shfl_up(1);
    let exclusive_in_warp = if lane == 0 {
        T::identity()
    } else {
        exclusive_in_warp
    };
    // SAFETY: warp < WARPS; each warp's last lane writes its own slot before the barrier.
    unsafe {
        if lane == WARP_SIZE - 1 {
            *warp_totals.add(warp) = inclusive;
        }
        sync_threads();
    }
    let mut before = T::identity();
    let mut total = T::identity();
    for w in 0..WARPS {
        // SAFETY: written before the barrier.
        let t = unsafe { *warp_totals.add(w) };
        if w < warp {
            before = before.combine(t);
        }
        total = total.combine(t);
    }
    (before.combine(exclusive_in_warp), total)
}
