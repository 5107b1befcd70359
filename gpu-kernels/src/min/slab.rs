//! The slab kernel of the min reduction: strided problems whose rows are not
//! vector-aligned and short enough for one block to take them whole (`inner` up to
//! [`SLAB_MAX_INNER`]). A block takes a chunk of consecutive rows of one `outer` index,
//! which lie in memory as one span; its threads copy the span, from the 16-byte
//! boundary at or before it, into a ring of shared-memory stages by 16-byte `cp.async`
//! copies, and each thread reduces its columns of each row as soon as the row has
//! landed. So the array is read as a copy reads it, each sector once, where the
//! strided kernel's blocks read the sectors they share at their tiles' edges twice and
//! load unaligned columns one element at a time.

use super::{MinOutputs, MinProblem};
use crate::launch::{DevicePtr, DevicePtrMut, Kernel, Launch, LaunchGeometry, kernel_args};

/// Threads of a slab block (one block an SM).
pub const SLAB_THREADS: u32 = 1024;
/// Columns each thread takes, `SLAB_THREADS` apart, so that a warp reads 32
/// consecutive elements of a row from shared memory.
pub const SLAB_COLUMNS: usize = 4;
/// The longest rows a block takes whole.
pub const SLAB_MAX_INNER: u64 = SLAB_THREADS as u64 * SLAB_COLUMNS as u64;
/// Rows shorter than this keep the strided kernel (a slab block's threads would idle).
pub const SLAB_MIN_INNER: u64 = 1025;
/// Bytes of one stage of the ring: 2 16-byte copies a thread.
pub const STAGE_BYTES: u32 = 32 * 1024;
/// Stages of the ring, and how many are in flight while the block reduces another:
/// rows read from the stage that just landed and from the one before it (a row spans
/// at most two), so the stages filled meanwhile must be others.
pub const RING_STAGES: u32 = 4;
pub const PREFETCH: u32 = 2;
/// Dynamic shared memory of a slab block: the ring.
pub const SLAB_SHARED_BYTES: u32 = STAGE_BYTES * RING_STAGES;

const _: () = assert!(SLAB_MAX_INNER * 8 <= STAGE_BYTES as u64);
const _: () = assert!(RING_STAGES.is_power_of_two() && PREFETCH + 2 <= RING_STAGES);
const _: () = assert!((STAGE_BYTES / 16).is_multiple_of(SLAB_THREADS));

kernel_args! {
    /// The slab kernel's arguments: `x` as `[outer, reduce, inner]` (16-byte aligned,
    /// rows `inner` apart), reduced into `outer * inner * split` slots of `values` and
    /// `indices` (null for `amin`).
    pub struct SlabArgs<T> {
        pub x: DevicePtr<T>,
        pub values: DevicePtrMut<T>,
        pub indices: DevicePtrMut<i64>,
        pub problem: MinProblem,
        pub split: u64,
    }
    impl SlabKernel for f32 {
        const MIN_SLAB = "min_slab_f32" => kernel::slab::<f32, true>, bounds(SLAB_THREADS, 1);
        const AMIN_SLAB = "amin_slab_f32" => kernel::slab::<f32, false>, bounds(SLAB_THREADS, 1);
    }
    impl SlabKernel for f64 {
        const MIN_SLAB = "min_slab_f64" => kernel::slab::<f64, true>, bounds(SLAB_THREADS, 1);
        const AMIN_SLAB = "amin_slab_f64" => kernel::slab::<f64, false>, bounds(SLAB_THREADS, 1);
    }
    impl SlabKernel for i32 {
        const MIN_SLAB = "min_slab_i32" => kernel::slab::<i32, true>, bounds(SLAB_THREADS, 1);
        const AMIN_SLAB = "amin_slab_i32" => kernel::slab::<i32, false>, bounds(SLAB_THREADS, 1);
    }
    impl SlabKernel for half::bf16 {
        const MIN_SLAB = "min_slab_bf16" => kernel::slab::<half::bf16, true>, bounds(SLAB_THREADS, 1);
        const AMIN_SLAB = "amin_slab_bf16" => kernel::slab::<half::bf16, false>, bounds(SLAB_THREADS, 1);
    }
    impl SlabKernel for half::f16 {
        const MIN_SLAB = "min_slab_f16" => kernel::slab::<half::f16, true>, bounds(SLAB_THREADS, 1);
        const AMIN_SLAB = "amin_slab_f16" => kernel::slab::<half::f16, false>, bounds(SLAB_THREADS, 1);
    }
    entry points in ENTRY_POINTS;
}

/// The slab kernel of one element type, with indices (`min`) and without (`amin`).
pub trait SlabKernel: Sized {
    const MIN_SLAB: Kernel<SlabArgs<Self>>;
    const AMIN_SLAB: Kernel<SlabArgs<Self>>;
}

/// Whether rows of `inner` elements (not vector-aligned) take the slab kernel on a
/// device that gives a block `max_shared_bytes`.
pub const fn fits(inner: u64, max_shared_bytes: u32) -> bool {
    SLAB_MIN_INNER <= inner && inner <= SLAB_MAX_INNER && SLAB_SHARED_BYTES <= max_shared_bytes
}

/// A block per `outer` index and chunk of the reduced axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlabPlan {
    /// Chunks of the reduced axis per output (grid y).
    pub split: u64,
}

impl SlabPlan {
    /// The launch reducing `x` into `outputs` (the partials, with a split).
    pub fn launch<T: SlabKernel>(
        &self,
        problem: &MinProblem,
        x: DevicePtr<T>,
        outputs: MinOutputs<T>,
    ) -> Launch<SlabArgs<T>> {
        let geometry = LaunchGeometry {
            grid: [problem.outer, self.split, 1],
            threads: SLAB_THREADS,
            shared_bytes: SLAB_SHARED_BYTES,
        };
        let args = SlabArgs {
            x,
            values: outputs.values,
            indices: outputs.indices,
            problem: *problem,
            split: self.split,
        };
        Launch::new(outputs.pick(T::MIN_SLAB, T::AMIN_SLAB), geometry, args)
    }
}

#[cfg(target_arch = "nvptx64")]
mod kernel {
    use super::*;
    use crate::device::{
        SharedCarver, async_copy, async_copy_commit, async_copy_wait, block_idx_x, block_idx_y, shared_base,
        sync_threads, thread_idx_x,
    };
    use crate::launch::chunk;
    use crate::min::argmin::{ArgMin, MinValue, same_key};

    /// Block (x, y) reduces rows `chunk(reduce, split, y)` of outer index x: output
    /// column `m = x * inner + column`, with `split > 1` into slot `m * split + y`.
    ///
    /// # Safety
    /// `x` holds `outer * reduce` rows of `inner` elements back to back, 16-byte
    /// aligned; `inner <= SLAB_MAX_INNER`; the outputs hold `outer * inner * split`
    /// slots; the block has `SLAB_THREADS` threads and `SLAB_SHARED_BYTES` of dynamic
    /// shared memory.
    #[inline(always)]
    pub unsafe fn slab<T: MinValue, const INDEX: bool>(args: SlabArgs<T>) {
        let MinProblem { reduce, inner, .. } = args.problem;
        let (outer, part) = (block_idx_x() as u64, block_idx_y() as u64);
        let (begin, end) = chunk(reduce, args.split, part, 1);
        let size = size_of::<T>() as u64;
        let x = args.x.as_ptr();
        // SAFETY: `x` holds at least one element.
        let fill = unsafe { *x };
        let mut states = [ArgMin::<T, INDEX>::empty(fill); SLAB_COLUMNS];
        if begin < end {
            // The chunk's rows as one span of bytes from x, read from the 16-byte
            // boundary at or before its start; stage k holds the STAGE_BYTES from
            // `start + k * STAGE_BYTES` at ring offset `(k % RING_STAGES) * STAGE_BYTES`,
            // so a byte at `offset` from `start` lies at `offset % SLAB_SHARED_BYTES`.
            let row_bytes = inner * size;
            let row_at = |r: u64| (outer * reduce + r) * row_bytes;
            let start = row_at(begin) & !15;
            let stop = row_at(end);
            let stages = (stop - start).div_ceil(STAGE_BYTES as u64);
            let ring_address = shared_base();
            // SAFETY: the launch gives SLAB_SHARED_BYTES; copies land in it between
            // barriers (below).
            let ring: *const u8 = unsafe { SharedCarver::new().take::<u8>(SLAB_SHARED_BYTES as usize) };
            let fill_stage = |k: u64| {
                if k < stages {
                    let slot = (k % RING_STAGES as u64) as u32 * STAGE_BYTES;
                    for i in 0..STAGE_BYTES / 16 / SLAB_THREADS {
                        let vector = i * SLAB_THREADS + thread_idx_x();
                        let from = start + k * STAGE_BYTES as u64 + vector as u64 * 16;
                        let valid = stop.saturating_sub(from).min(16) as u32;
                        // Past the span (the last stage's tail): zeros, from x itself.
                        let source = if valid > 0 { from } else { 0 };
                        // SAFETY: `source` is 16-byte aligned in x, and its first `valid`
                        // bytes lie inside the chunk's span (none past it; nothing is
                        // read where `valid == 0`); the slot is not read until the
                        // barrier after its wait, nor written while rows read it.
                        unsafe {
                            async_copy::<16>(
                                ring_address + slot + vector * 16,
                                x.cast::<u8>().wrapping_add(source as usize),
                                valid,
                            )
                        };
                    }
                }
                async_copy_commit();
            };
            for k in 0..PREFETCH as u64 {
                fill_stage(k);
            }
            // The stage holding the last byte of row r.
            let last_stage = |r: u64| (row_at(r + 1) - 1 - start) / STAGE_BYTES as u64;
            // Where row r starts in the ring, modulo 2^32 (the ring's size divides it).
            let ring_row = |r: u64| (row_at(r) - start) as u32;
            // The element `bytes` into a landed row that starts at ring offset `row`.
            let element = |row: u32, bytes: u32| {
                let at = row.wrapping_add(bytes) % SLAB_SHARED_BYTES;
                // SAFETY: the row lies in the two stages the caller waited for, and `at`
                // is an aligned element of the ring.
                unsafe { *ring.add(at as usize).cast::<T>() }
            };
            let mut r = begin;
            for k in 0..stages {
                // Stage k has landed for this thread's copies, and after the barrier for
                // every thread's; every thread is done with the rows before it, so the
                // slot of stage k + PREFETCH (neither k nor k - 1) may be refilled.
                async_copy_wait::<{ PREFETCH - 1 }>();
                // SAFETY: every thread of the block runs the same number of stages.
                unsafe { sync_threads() };
                fill_stage(k + PREFETCH as u64);
                // The rows that end in stage k (those ending before were taken in their
                // own stage's turn), each in stages k - 1 and k, in runs of up to 4.
                let mut last = r;
                while last < end && last_stage(last) <= k {
                    last += 1;
                }
                while r + 4 <= last {
                    take_run::<T, INDEX, 4>(&mut states, r, inner, ring_row, &element);
                    r += 4;
                }
                if r + 2 <= last {
                    take_run::<T, INDEX, 2>(&mut states, r, inner, ring_row, &element);
                    r += 2;
                }
                if r < last {
                    take_run::<T, INDEX, 1>(&mut states, r, inner, ring_row, &element);
                    r += 1;
                }
            }
        }
        for (j, state) in states.iter().enumerate() {
            let column = column_of(j);
            if column < inner {
                let m = outer * inner + column;
                let slot = if args.split == 1 { m } else { m * args.split + part };
                // SAFETY: m < outer * inner, part < split.
                unsafe { state.store(args.values.as_mut_ptr(), args.indices.as_mut_ptr(), slot) };
            }
        }
    }

    /// This thread's `j`-th column: `SLAB_THREADS` apart, so that a warp reads 32
    /// consecutive elements of a row.
    #[inline(always)]
    fn column_of(j: usize) -> u64 {
        thread_idx_x() as u64 + (j * SLAB_THREADS as usize) as u64
    }

    /// Rows `r..r + N` of this thread's columns: each column's least (`min.NaN`, packed
    /// for 16-bit elements), pushed once; a run holding a new least is searched for
    /// where it first is. `ring_row(r)` is where row r starts in the ring,
    /// `element(start, bytes)` reads the landed element `bytes` past a row's start.
    #[inline(always)]
    fn take_run<T: MinValue, const INDEX: bool, const N: usize>(
        states: &mut [ArgMin<T, INDEX>; SLAB_COLUMNS],
        r: u64,
        inner: u64,
        ring_row: impl Fn(u64) -> u32,
        element: &impl Fn(u32, u32) -> T,
    ) {
        let rows: [u32; N] = core::array::from_fn(|u| ring_row(r + u as u64));
        for (j, state) in states.iter_mut().enumerate() {
            let column = column_of(j);
            if column < inner {
                let bytes = column as u32 * size_of::<T>() as u32;
                let held: [T; N] = core::array::from_fn(|u| element(rows[u], bytes));
                let least = held[1..].iter().fold(held[0], |least, &value| least.least(value));
                if state.push(least, r) && INDEX {
                    let at = held.iter().position(|&value| same_key(value, least));
                    state.index = r + at.unwrap_or(0) as u64;
                }
            }
        }
    }
}
