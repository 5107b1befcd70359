//! Copies between global memory and shared-memory stages that run while the block
//! works on other stages. On sm_90 one thread (`COPY_THREAD`) starts bulk copies and
//! bulk stores (`cp.async.bulk`, the TMA): a stage's load completes on its mbarrier
//! with no registers held, and its store leaves shared memory in whole lines instead of
//! scattered 16-byte pieces. Before sm_90 the block copies the stage itself.

#[cfg(target_feature = "sm_90")]
use core::arch::asm;

use super::thread_idx_x;
#[cfg(not(target_feature = "sm_90"))]
use super::{block_dim_x, load_global_v4, store_shared_v4_f32};

/// The thread that starts the bulk copies and stores: the first of warp 1, so that
/// warp 0 stays free for other work (blocks of at least 64 threads).
pub const COPY_THREAD: u32 = 32;

/// Bytes of one stage's mbarrier.
pub const STAGE_BARRIER_BYTES: u32 = 8;

/// Stages of shared memory filled from global memory, one mbarrier each.
pub struct StagedCopy {
    /// Shared-window address of the first stage's mbarrier.
    barriers: u32,
}

impl StagedCopy {
    /// Sets up `stages` mbarriers at the shared-window address `barriers`.
    ///
    /// # Safety
    /// Every thread of the block calls it with the same arguments; `barriers` is 8-byte
    /// aligned and `stages * STAGE_BARRIER_BYTES` bytes of dynamic shared memory that
    /// nothing else uses; the block passes a barrier before the first [`Self::start`].
    #[inline(always)]
    pub unsafe fn new(barriers: u32, stages: u32) -> Self {
        #[cfg(target_feature = "sm_90")]
        if thread_idx_x() == COPY_THREAD {
            for stage in 0..stages {
                // SAFETY: the caller gives this memory to the mbarriers; one arrival
                // (the copy thread's, in `start`) completes each phase.
                unsafe {
                    asm!(
                        "mbarrier.init.shared::cta.b64 [{b}], 1;",
                        b = in(reg32) barriers + stage * STAGE_BARRIER_BYTES,
                        options(nostack),
                    )
                };
            }
            // SAFETY: makes the initialization visible to the bulk copies' proxy.
            unsafe { asm!("fence.mbarrier_init.release.cluster;", options(nostack)) };
        }
        #[cfg(not(target_feature = "sm_90"))]
        let _ = stages;
        Self { barriers }
    }

    /// Starts copying `bytes` from global `source` to the shared-window address
    /// `destination` as the next fill of `stage`.
    ///
    /// # Safety
    /// Every thread of the block calls it with the same arguments; both addresses are
    /// 16-byte aligned and `bytes` a multiple of 16; the source is readable and the
    /// destination is dynamic shared memory that no thread reads or writes until
    /// [`Self::wait`] for this fill returns; every earlier fill of the stage was waited
    /// for.
    #[inline(always)]
    pub unsafe fn start(&self, stage: u32, destination: u32, source: *const u8, bytes: u32) {
        #[cfg(target_feature = "sm_90")]
        if thread_idx_x() == COPY_THREAD {
            // SAFETY: waits until this thread's earlier bulk stores have read their
            // shared memory, which the copy may now overwrite.
            unsafe { asm!("cp.async.bulk.wait_group.read 0;", options(nostack)) };
            let barrier = self.barriers + stage * STAGE_BARRIER_BYTES;
            // SAFETY: the caller guarantees the ranges; the mbarrier's phase completes
            // once this arrival is made and the copy's bytes have landed.
            unsafe {
                if bytes == 0 {
                    asm!("mbarrier.arrive.shared::cta.b64 _, [{b}];", b = in(reg32) barrier, options(nostack));
                } else {
                    asm!(
                        "mbarrier.arrive.expect_tx.shared::cta.b64 _, [{b}], {n};",
                        "cvta.to.global.u64 {s}, {s};",
                        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [{d}], [{s}], {n}, [{b}];",
                        b = in(reg32) barrier,
                        n = in(reg32) bytes,
                        d = in(reg32) destination,
                        s = inout(reg64) source as u64 => _,
                        options(nostack),
                    );
                }
            }
        }
        #[cfg(not(target_feature = "sm_90"))]
        {
            let _ = (self.barriers, stage);
            // Four vectors in flight per thread per step.
            let step = 4 * 16 * block_dim_x();
            let mut offset = 16 * thread_idx_x();
            while offset < bytes {
                let mut words = [[0u32; 4]; 4];
                for (k, w) in words.iter_mut().enumerate() {
                    let at = offset + k as u32 * 16 * block_dim_x();
                    if at < bytes {
                        // SAFETY: inside the source range, 16-byte aligned.
                        *w = unsafe { load_global_v4(source.add(at as usize) as *const u32) };
                    }
                }
                for (k, w) in words.iter().enumerate() {
                    let at = offset + k as u32 * 16 * block_dim_x();
                    if at < bytes {
                        // SAFETY: inside the destination range, 16-byte aligned.
                        unsafe { store_shared_v4_f32(destination + at, w.map(f32::from_bits)) };
                    }
                }
                offset += step;
            }
        }
    }

    /// Writes `bytes` of shared memory from the shared-window address `source` to global
    /// `destination` after the block's earlier shared-memory writes (one block barrier
    /// inside). On sm_90 one thread starts a bulk store, which the next [`Self::start`]
    /// waits for before it overwrites shared memory; before sm_90 the block copies.
    ///
    /// # Safety
    /// Every thread of the block calls it with the same arguments; both addresses are
    /// 16-byte aligned and `bytes` a multiple of 16; the destination is writable, and the
    /// source stays unwritten until the next [`Self::start`].
    #[inline(always)]
    pub unsafe fn store(&self, source: u32, destination: *mut u8, bytes: u32) {
        #[cfg(target_feature = "sm_90")]
        // SAFETY: the fence orders this thread's shared-memory writes before the bulk
        // store's reads (another proxy); the barrier gathers every thread's; the caller
        // guarantees the ranges.
        unsafe {
            asm!("fence.proxy.async.shared::cta;", options(nostack));
            super::sync_threads();
            if thread_idx_x() == COPY_THREAD {
                asm!(
                    "cvta.to.global.u64 {d}, {d};",
                    "cp.async.bulk.global.shared::cta.bulk_group [{d}], [{s}], {n};",
                    "cp.async.bulk.commit_group;",
                    d = inout(reg64) destination as u64 => _,
                    s = in(reg32) source,
                    n = in(reg32) bytes,
                    options(nostack),
                );
            }
        }
        #[cfg(not(target_feature = "sm_90"))]
        {
            // SAFETY: every thread arrives; publishes the block's shared-memory writes.
            unsafe { super::sync_threads() };
            let mut offset = 16 * thread_idx_x();
            while offset < bytes {
                // SAFETY: inside both ranges, 16-byte aligned.
                unsafe {
                    let words = super::load_shared_v4_f32(source + offset);
                    super::store_global_v4(
                        destination.add(offset as usize) as *mut u32,
                        words.map(f32::to_bits),
                    );
                }
                offset += 16 * block_dim_x();
            }
        }
    }

    /// Waits until the bulk stores are complete, before the block exits.
    ///
    /// # Safety
    /// Every thread of the block calls it.
    #[inline(always)]
    pub unsafe fn finish(&self) {
        #[cfg(target_feature = "sm_90")]
        if thread_idx_x() == COPY_THREAD {
            // SAFETY: waits on this thread's own bulk stores.
            unsafe { asm!("cp.async.bulk.wait_group 0;", options(nostack)) };
        }
    }

    /// Waits until the `fill`-th fill of `stage` (counted from 0) has landed in shared
    /// memory (before sm_90, a block barrier that publishes the block's own copies).
    ///
    /// # Safety
    /// Every thread of the block calls it with the same arguments, and the fill was
    /// started.
    #[inline(always)]
    pub unsafe fn wait(&self, stage: u32, fill: u32) {
        #[cfg(target_feature = "sm_90")]
        loop {
            let done: u32;
            // SAFETY: polls an initialized mbarrier; no memory is written.
            unsafe {
                asm!(
                    "{{",
                    ".reg .pred landed;",
                    "mbarrier.try_wait.parity.shared::cta.b64 landed, [{b}], {parity};",
                    "selp.u32 {done}, 1, 0, landed;",
                    "}}",
                    b = in(reg32) self.barriers + stage * STAGE_BARRIER_BYTES,
                    parity = in(reg32) fill & 1,
                    done = out(reg32) done,
                    options(nostack),
                )
            };
            if done != 0 {
                break;
            }
        }
        #[cfg(not(target_feature = "sm_90"))]
        {
            let _ = (stage, fill);
            // SAFETY: every thread calls it (the caller's contract): the block's own
            // copies become visible to all.
            unsafe { super::sync_threads() };
        }
    }
}
