//! Shared-memory stages passed between producer threads, which fill them with
//! `cp.async` copies or bulk tensor copies (TMA), and consumer threads, which read them
//! (sm_90): per stage, a "full" mbarrier that completes when every producer's arrival
//! and copies have landed, and an "empty" one that completes when every consumer has
//! released the stage.

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
        // SAFETY: the caller gives this memory to the mbarriers.
        unsafe {
            init_barriers(pipeline.full, stages, producers);
            init_barriers(pipeline.empty, stages, consumers);
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

    /// Producer: arrives on the stage's full barrier (a release: the consumers that wait
    /// on it then see what this thread wrote, and the `cp.async` copies it waited for
    /// with [`async_copy_wait`](super::async_copy_wait)).
    ///
    /// # Safety
    /// As [`Self::acquire`]; each producer arrives once per fill, after its copies of
    /// the fill landed.
    #[inline(always)]
    pub unsafe fn arrive(&self, stage: u32) {
        // SAFETY: an initialized mbarrier; the arrival is counted in its producers.
        unsafe {
            asm!(
                "mbarrier.arrive.shared::cta.b64 _, [{b}];",
                b = in(reg32) self.full + 8 * stage,
                options(nostack),
            )
        };
    }

    /// Producer (one thread): arrives on the stage's full barrier, which then also waits
    /// for `bytes` of bulk copies ([`Self::load_im2col`], [`Self::load_tile_3d`]).
    ///
    /// # Safety
    /// As [`Self::acquire`]; the full barriers count one producer arrival per fill.
    #[inline(always)]
    pub unsafe fn arrive_expecting(&self, stage: u32, bytes: u32) {
        // SAFETY: an initialized mbarrier.
        unsafe {
            asm!(
                "mbarrier.arrive.expect_tx.shared::cta.b64 _, [{b}], {n};",
                b = in(reg32) self.full + 8 * stage,
                n = in(reg32) bytes,
                options(nostack),
            )
        };
    }

    /// Producer: a bulk im2col copy into `destination` that completes on the stage's
    /// full barrier: `cp.async.bulk.tensor.4d ... im2col`, the window origin at
    /// `coordinates` ({channel, w, h, image}) displaced by `offsets` ({w, h}).
    ///
    /// # Safety
    /// `map` is the generic address of an im2col tensor map in global memory, fenced
    /// ([`fence_tensor_map`]); `destination` is a free, 1024-byte-aligned stage of the
    /// box's size; the bytes were announced with [`Self::arrive_expecting`].
    #[inline(always)]
    pub unsafe fn load_im2col(
        &self,
        stage: u32,
        destination: u32,
        map: *const u8,
        coordinates: [i32; 4],
        offsets: [u16; 2],
    ) {
        // SAFETY: the caller guarantees the map, the destination and the count.
        unsafe {
            asm!(
                "cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes [{d}], [{m}, {{{c}, {w}, {h}, {n}}}], [{b}], {{{ow}, {oh}}};",
                d = in(reg32) destination,
                m = in(reg64) map as u64,
                c = in(reg32) coordinates[0],
                w = in(reg32) coordinates[1],
                h = in(reg32) coordinates[2],
                n = in(reg32) coordinates[3],
                b = in(reg32) self.full + 8 * stage,
                ow = in(reg16) offsets[0],
                oh = in(reg16) offsets[1],
                options(nostack),
            )
        };
    }

    /// Producer: a bulk copy of the 3-D box at `coordinates` (innermost first) into
    /// `destination`, completing on the stage's full barrier.
    ///
    /// # Safety
    /// As [`Self::load_im2col`], with a tiled tensor map.
    #[inline(always)]
    pub unsafe fn load_tile_3d(&self, stage: u32, destination: u32, map: *const u8, coordinates: [i32; 3]) {
        let [x, y, z] = coordinates;
        // SAFETY: the caller guarantees the map, the destination and the count.
        unsafe {
            asm!(
                "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [{d}], [{m}, {{{x}, {y}, {z}}}], [{b}];",
                d = in(reg32) destination,
                m = in(reg64) map as u64,
                x = in(reg32) x,
                y = in(reg32) y,
                z = in(reg32) z,
                b = in(reg32) self.full + 8 * stage,
                options(nostack),
            )
        };
    }

    /// Producer: [`Self::load_tile_3d`] of a 4-D box.
    ///
    /// # Safety
    /// As [`Self::load_tile_3d`].
    #[inline(always)]
    pub unsafe fn load_tile_4d(&self, stage: u32, destination: u32, map: *const u8, coordinates: [i32; 4]) {
        let [x, y, z, w] = coordinates;
        // SAFETY: the caller guarantees the map, the destination and the count.
        unsafe {
            asm!(
                "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [{d}], [{m}, {{{x}, {y}, {z}, {w}}}], [{b}];",
                d = in(reg32) destination,
                m = in(reg64) map as u64,
                x = in(reg32) x,
                y = in(reg32) y,
                z = in(reg32) z,
                w = in(reg32) w,
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

/// One mbarrier per stage that completes when `count` threads have arrived: a signal
/// between the sides of a pipeline beyond its fills and releases (for example, that a
/// landed stage was changed in place and may be read). Its `f`-th arrival round for a
/// stage completes phase `f`.
pub struct StageSignal {
    barriers: u32,
}

impl StageSignal {
    /// Sets up the mbarriers of `stages` stages at the shared-window address
    /// `barriers`, each completing on `count` arrivals.
    ///
    /// # Safety
    /// As [`StagePipeline::new`], with `stages * 8` bytes at `barriers`.
    #[inline(always)]
    pub unsafe fn new(barriers: u32, stages: u32, count: u32) -> Self {
        // SAFETY: the caller gives this memory to the mbarriers.
        unsafe { init_barriers(barriers, stages, count) };
        Self { barriers }
    }

    /// Arrives on the stage's signal, ordering this thread's earlier memory accesses
    /// before the waiters' later ones.
    ///
    /// # Safety
    /// The signal was set up and published; each of the `count` threads arrives once
    /// per round.
    #[inline(always)]
    pub unsafe fn arrive(&self, stage: u32) {
        // SAFETY: an initialized mbarrier.
        unsafe {
            asm!(
                "mbarrier.arrive.shared::cta.b64 _, [{b}];",
                b = in(reg32) self.barriers + 8 * stage,
                options(nostack),
            )
        };
    }

    /// Waits until round `round` of the stage's signal has completed.
    ///
    /// # Safety
    /// The signal was set up and published, and round `round - 2` has completed (no
    /// round is passed unseen).
    #[inline(always)]
    pub unsafe fn wait(&self, stage: u32, round: u32) {
        // SAFETY: an initialized mbarrier.
        unsafe { wait_parity(self.barriers + 8 * stage, round & 1) };
    }
}

/// Thread 0 sets up `stages` mbarriers of `count` arrivals, 8 bytes apart from
/// `barriers`, and makes that visible to the other threads' arrivals.
///
/// # Safety
/// As [`StagePipeline::new`].
#[inline(always)]
unsafe fn init_barriers(barriers: u32, stages: u32, count: u32) {
    if thread_idx_x() != 0 {
        return;
    }
    for stage in 0..stages {
        // SAFETY: the caller gives this memory to the mbarriers.
        unsafe {
            asm!(
                "mbarrier.init.shared::cta.b64 [{b}], {n};",
                b = in(reg32) barriers + 8 * stage,
                n = in(reg32) count,
                options(nostack),
            )
        };
    }
    // SAFETY: makes the initialization visible to the other threads' arrivals.
    unsafe { asm!("fence.mbarrier_init.release.cluster;", options(nostack)) };
}

/// Makes a tensor map that the host wrote to global memory visible to this thread's
/// bulk tensor copies, and starts fetching it: `fence.proxy.tensormap::generic.acquire`.
///
/// # Safety
/// `map` is the generic address of a 128-byte tensor map in global memory.
#[inline(always)]
pub unsafe fn fence_tensor_map(map: *const u8) {
    // SAFETY: a fence and a prefetch of the caller's tensor map.
    unsafe {
        asm!(
            "fence.proxy.tensormap::generic.acquire.sys [{m}], 128;",
            "prefetch.tensormap [{m}];",
            m = in(reg64) map as u64,
            options(nostack),
        )
    };
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
