//! Shared-memory stages passed between producer threads, which fill them with
//! `cp.async` copies, and consumer threads, which read them (sm_90): per stage, a
//! "full" mbarrier that completes when every producer's copies have landed, and an
//! "empty" one that completes when every consumer has released the stage.

use core::arch::asm;

use super::thread_idx_x;

/// Bytes of mbarriers per stage.
pub const PIPELINE_BARRIER_BYTES: u32 = 16;

/// The mbarriers of a producer-consumer pipeline. The `f`-th fill of a stage (counted
/// from 0) completes phase `f` of its full barrier, and its release phase `f` of its
/// empty one.
pub struct StagePipeline {
    full: u32,
    empty: u32,
}

impl StagePipeline {
    /// Sets up the mbarriers of `stages` stages at the shared-window address
    /// `barriers`: `producers` arrivals fill a stage, `consumers` release it.
    ///
    /// # Safety
    /// Every thread of the block calls it with the same arguments; `barriers` is
    /// 8-byte aligned and `stages * PIPELINE_BARRIER_BYTES` bytes of dynamic shared
    /// memory that nothing else uses; the block passes a barrier before any other
    /// method is called.
    #[inline(always)]
    pub unsafe fn new(barriers: u32, stages: u32, producers: u32, consumers: u32) -> Self {
        let pipeline = Self {
            full: barriers,
            empty: barriers + stages * 8,
        };
        if thread_idx_x() == 0 {
            for stage in 0..stages {
                // SAFETY: the caller gives this memory to the mbarriers.
                unsafe {
                    asm!(
                        "mbarrier.init.shared::cta.b64 [{f}], {p};",
                        "mbarrier.init.shared::cta.b64 [{e}], {c};",
                        f = in(reg32) pipeline.full + 8 * stage,
                        e = in(reg32) pipeline.empty + 8 * stage,
                        p = in(reg32) producers,
                        c = in(reg32) consumers,
                        options(nostack),
                    )
                };
            }
            // SAFETY: makes the initialization visible to the other threads' arrivals.
            unsafe { asm!("fence.mbarrier_init.release.cluster;", options(nostack)) };
        }
        pipeline
    }

    /// Producer: waits until fill `fill - 1` of `stage` is released (fill 0 at once).
    ///
    /// # Safety
    /// The pipeline was set up and published; this thread is a producer.
    #[inline(always)]
    pub unsafe fn acquire(&self, stage: u32, fill: u32) {
        // SAFETY: an initialized mbarrier.
        unsafe { wait_parity(self.empty + 8 * stage, (fill & 1) ^ 1) };
    }

    /// Producer: arrives on the stage's full barrier once every `cp.async` copy this
    /// thread started so far has landed.
    ///
    /// # Safety
    /// As [`Self::acquire`]; each producer commits each fill once.
    #[inline(always)]
    pub unsafe fn commit_copies(&self, stage: u32) {
        // SAFETY: an initialized mbarrier; the arrival is counted in its producers.
        unsafe {
            asm!(
                "cp.async.mbarrier.arrive.noinc.shared::cta.b64 [{b}];",
                b = in(reg32) self.full + 8 * stage,
                options(nostack),
            )
        };
    }

    /// Consumer: waits until fill `fill` of `stage` has landed.
    ///
    /// # Safety
    /// The pipeline was set up and published; this thread is a consumer.
    #[inline(always)]
    pub unsafe fn wait_full(&self, stage: u32, fill: u32) {
        // SAFETY: an initialized mbarrier.
        unsafe { wait_parity(self.full + 8 * stage, fill & 1) };
    }

    /// Consumer: releases the stage to the producers, its reads done.
    ///
    /// # Safety
    /// As [`Self::wait_full`]; each consumer releases each fill once.
    #[inline(always)]
    pub unsafe fn release(&self, stage: u32) {
        // SAFETY: an initialized mbarrier; the arrival is counted in its consumers.
        unsafe {
            asm!(
                "mbarrier.arrive.shared::cta.b64 _, [{b}];",
                b = in(reg32) self.empty + 8 * stage,
                options(nostack),
            )
        };
    }
}

/// Spins until the phase of parity `parity` of the mbarrier at `barrier` completes.
///
/// # Safety
/// `barrier` is an initialized mbarrier in shared memory.
#[inline(always)]
unsafe fn wait_parity(barrier: u32, parity: u32) {
    loop {
        let done: u32;
        // SAFETY: polls an initialized mbarrier; no memory is written.
        unsafe {
            asm!(
                "{{",
                ".reg .pred complete;",
                "mbarrier.try_wait.parity.shared::cta.b64 complete, [{b}], {parity};",
                "selp.u32 {done}, 1, 0, complete;",
                "}}",
                b = in(reg32) barrier,
                parity = in(reg32) parity,
                done = out(reg32) done,
                options(nostack),
            )
        };
        if done != 0 {
            break;
        }
    }
}
