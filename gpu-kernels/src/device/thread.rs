//! Thread, block and grid indices; the block barrier.

use core::arch::nvptx;

/// `threadIdx.x`.
#[inline(always)]
pub fn thread_idx_x() -> u32 {
    // SAFETY: reads a special register; always defined inside a kernel.
    unsafe { nvptx::_thread_idx_x() as u32 }
}

/// `blockIdx.x`.
#[inline(always)]
pub fn block_idx_x() -> u32 {
    // SAFETY: reads a special register; always defined inside a kernel.
    unsafe { nvptx::_block_idx_x() as u32 }
}

/// `blockIdx.y`.
#[inline(always)]
pub fn block_idx_y() -> u32 {
    // SAFETY: reads a special register; always defined inside a kernel.
    unsafe { nvptx::_block_idx_y() as u32 }
}

/// `blockIdx.z`.
#[inline(always)]
pub fn block_idx_z() -> u32 {
    // SAFETY: reads a special register; always defined inside a kernel.
    unsafe { nvptx::_block_idx_z() as u32 }
}

/// `blockDim.x`.
#[inline(always)]
pub fn block_dim_x() -> u32 {
    // SAFETY: reads a special register; always defined inside a kernel.
    unsafe { nvptx::_block_dim_x() as u32 }
}

/// `gridDim.x`.
#[inline(always)]
pub fn grid_dim_x() -> u32 {
    // SAFETY: reads a special register; always defined inside a kernel.
    unsafe { nvptx::_grid_dim_x() as u32 }
}

/// `gridDim.z`.
#[inline(always)]
pub fn grid_dim_z() -> u32 {
    // SAFETY: reads a special register; always defined inside a kernel.
    unsafe { nvptx::_grid_dim_z() as u32 }
}

/// This thread's lane within its warp (`%laneid`).
#[inline(always)]
pub fn lane_id() -> u32 {
    let lane: u32;
    // SAFETY: reads a special register; no memory is touched.
    unsafe { core::arch::asm!("mov.u32 {0}, %laneid;", out(reg32) lane, options(pure, nomem, nostack)) };
    lane
}

/// Block-wide barrier; orders shared-memory accesses across it.
///
/// `barrier.sync 0` without `.aligned`: the threads of a warp may reach it from
/// different instructions. The compiler may duplicate a barrier into both sides of a
/// branch (thread 0's bookkeeping and everyone else's path), where the aligned form
/// (`bar.sync`, CUDA's `__syncthreads`) would hang the block.
///
/// # Safety
/// Every thread of the block must reach it the same number of times, or the block
/// deadlocks.
#[inline(always)]
pub unsafe fn sync_threads() {
    // SAFETY: the caller guarantees every thread arrives; the asm is a compiler memory
    // barrier too, so shared-memory accesses stay on their side of it.
    unsafe { core::arch::asm!("barrier.sync 0;", options(nostack)) }
}

/// Barrier `id` (1 to 15; 0 is the block's) among `threads` threads, a multiple of 32:
/// `barrier.sync id, threads`, for a group of warps that synchronizes apart from the
/// rest of the block.
///
/// # Safety
/// Exactly `threads` threads, whole warps, reach it each time, and no other group uses
/// `id` meanwhile.
#[inline(always)]
pub unsafe fn sync_group<const ID: u32>(threads: u32) {
    // SAFETY: the caller guarantees the arrivals; a compiler memory barrier as above.
    unsafe {
        core::arch::asm!("barrier.sync {id}, {n};", id = const ID, n = in(reg32) threads, options(nostack))
    }
}

/// Arrives at barrier `id` among `threads` threads without waiting:
/// `barrier.arrive id, threads`. The group that [`sync_group`]s on it waits for these
/// arrivals: one side of a handoff between groups of warps.
///
/// # Safety
/// As [`sync_group`]: the arrivals and the waiters are `threads` threads together,
/// whole warps, and no other group uses `id` meanwhile.
#[inline(always)]
pub unsafe fn arrive_group<const ID: u32>(threads: u32) {
    // SAFETY: the caller guarantees the arrivals; a compiler memory barrier as above.
    unsafe {
        core::arch::asm!("barrier.arrive {id}, {n};", id = const ID, n = in(reg32) threads, options(nostack))
    }
}

/// Barrier among the 32 lanes of a warp: `bar.warp.sync 0xffffffff` (`__syncwarp()`);
/// orders the lanes' shared-memory accesses across it.
///
/// # Safety
/// Every lane of the warp must reach it.
#[inline(always)]
pub unsafe fn sync_warp() {
    // SAFETY: the caller guarantees every lane arrives; a compiler memory barrier as above.
    unsafe { core::arch::asm!("bar.warp.sync 0xffffffff;", options(nostack)) }
}

/// Stops the kernel with an error the host sees at its next synchronization.
#[inline(always)]
pub fn trap() -> ! {
    // SAFETY: `trap` has no preconditions; it ends the grid.
    unsafe { nvptx::trap() }
}
