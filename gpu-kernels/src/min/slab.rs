//! The slab kernel of the min reduction: strided problems whose rows are not
//! vector-aligned and short enough for one block to take them whole (`inner` up to
//! [`SLAB_MAX_INNER`]). A block takes a chunk of consecutive rows of one `outer` index,
//! which lie in memory as one span; one thread bulk-copies the span (the TMA), from the
//! 16-byte boundary at or before it, into a ring of shared-memory stages, and each
//! thread reduces its columns of each row from shared memory as soon as the row has
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
/// Bytes of one stage of the ring (one bulk copy): at least the longest row, so that a
/// row lies in at most two stages.
pub const STAGE_BYTES: u32 = 32 * 1024;
/// Stages of the ring, and how many are in flight while the block reduces another:
/// rows read from the stage that just landed and from the one before it (a row spans
/// at most two), so the stages filled meanwhile must be others.
pub const RING_STAGES: u32 = 4;
pub const PREFETCH: u32 = 2;
/// Bytes of the ring.
pub const RING_BYTES: u32 = STAGE_BYTES * RING_STAGES;
/// Dynamic shared memory of a slab block: the ring, then an 8-byte mbarrier per stage.
pub const SLAB_SHARED_BYTES: u32 = RING_BYTES + RING_STAGES * 8;

const _: () = assert!(SLAB_MAX_INNER * 8 <= STAGE_BYTES as u64);
const _: () = assert!(RING_STAGES.is_power_of_two() && PREFETCH + 2 <= RING_STAGES);

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

/// The fewest rows of `row_bytes` a split gives a slab block: two stages' worth, so that
/// a block streams more than its first copies' latency (few outer indices would
/// otherwise leave most SMs idle, as a split by the other kernels' 2048 rows would).
pub const fn min_chunk_rows(row_bytes: u64) -> u64 {
    (2 * STAGE_BYTES as u64).div_ceil(row_bytes)
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
        STAGE_BARRIER_BYTES, StagedCopy, block_idx_x, block_idx_y, load_shared_element, shared_base,
        store_shared_u16, sync_threads, thread_idx_x,
    };
    use crate::launch::chunk;
    use crate::min::argmin::{ArgMin, MinValue};

    const _: () = assert!(RING_BYTES + RING_STAGES * STAGE_BARRIER_BYTES <= SLAB_SHARED_BYTES);

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
        let MinProblem {
            outer: outers,
            reduce,
            inner,
        } = args.problem;
        let (outer, part) = (block_idx_x() as u64, block_idx_y() as u64);
        let (begin, end) = chunk(reduce, args.split, part, 1);
        let size = size_of::<T>() as u64;
        let x = args.x.as_ptr().cast::<u8>();
        let state = if begin < end {
            ArgMin::<T, INDEX>::starting_at(begin)
        } else {
            ArgMin::empty(T::LARGEST)
        };
        let mut states = [state; SLAB_COLUMNS];
        let ring = shared_base();
        // SAFETY: every thread sets up the same mbarriers, in the launch's shared memory
        // past the ring; the barrier below comes before the first copy.
        let copies = unsafe { StagedCopy::new(ring + RING_BYTES, RING_STAGES) };
        // SAFETY: every thread of the block reaches it.
        unsafe { sync_threads() };
        if begin < end {
            // The chunk's rows as one span of bytes from x, read from the 16-byte
            // boundary at or before its start; stage k holds the STAGE_BYTES from
            // `start + k * STAGE_BYTES` at ring offset `(k % RING_STAGES) * STAGE_BYTES`,
            // so a byte at `offset` from `start` lies at `offset % RING_BYTES`.
            let row_bytes = inner * size;
            let row_at = |r: u64| (outer * reduce + r) * row_bytes;
            let start = row_at(begin) & !15;
            let stop = row_at(end);
            // Whole 16-byte vectors are bulk-copied (past `stop` where the array goes
            // on); the array's last bytes after its last whole vector, threads copy.
            let bulk_stop = stop.next_multiple_of(16).min((outers * reduce * row_bytes) & !15);
            let stages = (stop - start).div_ceil(STAGE_BYTES as u64);
            let fill_stage = |k: u64| {
                if k < stages {
                    let slot = (k % RING_STAGES as u64) as u32;
                    let from = start + k * STAGE_BYTES as u64;
                    let to = from + STAGE_BYTES as u64;
                    let bulk = bulk_stop.min(to).saturating_sub(from);
                    let destination = ring + slot * STAGE_BYTES;
                    // SAFETY: every thread passes the same arguments; `from` and `bulk`
                    // are multiples of 16, the bytes lie in x (below its last whole
                    // vector) and land in the slot, which no thread reads before its
                    // wait; the slot's earlier fill was waited for (its rows taken).
                    unsafe { copies.start(slot, destination, x.wrapping_add(from as usize), bulk as u32) };
                    let half = from + bulk + 2 * thread_idx_x() as u64;
                    if half < stop.min(to) {
                        // SAFETY: a 2-byte aligned half-element inside the span; its slot
                        // is read after the barrier that ends this iteration.
                        unsafe {
                            let bits = *x.add(half as usize).cast::<u16>();
                            store_shared_u16(destination + (half - from) as u32, bits);
                        }
                    }
                }
            };
            for k in 0..PREFETCH as u64 {
                fill_stage(k);
            }
            // Row r, where it starts in the ring (modulo 2^32, which the ring divides)
            // and where it ends from `start`.
            let mut r = begin;
            let mut row = (row_at(begin) - start) as u32;
            let mut row_end = row_at(begin + 1) - start;
            let run = Run {
                ring,
                row_bytes: row_bytes as u32,
                columns: core::array::from_fn(|j| column_of(j) as u32 * size as u32),
                valid: core::array::from_fn(|j| column_of(j) < inner),
            };
            for k in 0..stages {
                let slot = (k % RING_STAGES as u64) as u32;
                // SAFETY: every thread waits for the fill of stage k, started earlier.
                unsafe { copies.wait(slot, (k / RING_STAGES as u64) as u32) };
                // Every thread is done with the rows before stage k, so the slot of
                // stage k + PREFETCH (neither k nor k - 1) may be refilled; the threads'
                // own copies of stage k are visible.
                // SAFETY: every thread of the block runs the same number of stages.
                unsafe { sync_threads() };
                fill_stage(k + PREFETCH as u64);
                // The rows that end in stage k (those ending before were taken in their
                // own stage's turn), each in stages k - 1 and k, in runs of up to 4.
                let landed = (k + 1) * STAGE_BYTES as u64;
                let mut last = r;
                while last < end && row_end <= landed {
                    last += 1;
                    row_end += row_bytes;
                }
                while r + 4 <= last {
                    run.take::<T, INDEX, 4>(&mut states, r, row);
                    (r, row) = (r + 4, row.wrapping_add(4 * run.row_bytes));
                }
                if r + 2 <= last {
                    run.take::<T, INDEX, 2>(&mut states, r, row);
                    (r, row) = (r + 2, row.wrapping_add(2 * run.row_bytes));
                }
                if r < last {
                    run.take::<T, INDEX, 1>(&mut states, r, row);
                    (r, row) = (r + 1, row.wrapping_add(run.row_bytes));
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
    /// consecutive elements of a row from shared memory.
    #[inline(always)]
    fn column_of(j: usize) -> u64 {
        thread_idx_x() as u64 + (j * SLAB_THREADS as usize) as u64
    }

    /// A thread's view of the landed rows.
    struct Run {
        /// Shared-window address of the ring.
        ring: u32,
        row_bytes: u32,
        /// The thread's columns as byte offsets in a row, and whether each exists.
        columns: [u32; SLAB_COLUMNS],
        valid: [bool; SLAB_COLUMNS],
    }

    impl Run {
        /// Rows `r..r + N`, the first at ring offset `row` (modulo 2^32), as a run of
        /// each column. Where the run lies whole before the ring's end (the offset is
        /// the same in every thread), each column is a fixed offset from its row's start,
        /// which the loads take as an immediate; else each element's offset is taken
        /// modulo the ring.
        #[inline(always)]
        fn take<T: MinValue, const INDEX: bool, const N: usize>(
            &self,
            states: &mut [ArgMin<T, INDEX>; SLAB_COLUMNS],
            r: u64,
            row: u32,
        ) {
            let row = row % RING_BYTES;
            if row + N as u32 * self.row_bytes <= RING_BYTES {
                self.take_at::<T, INDEX, N>(states, r, |u, j| row + u * self.row_bytes + self.columns[j]);
            } else {
                self.take_at::<T, INDEX, N>(states, r, |u, j| {
                    (row + u * self.row_bytes + self.columns[j]) % RING_BYTES
                });
            }
        }

        /// The run of each column, element `u` of column `j` at ring offset `at(u, j)`.
        #[inline(always)]
        fn take_at<T: MinValue, const INDEX: bool, const N: usize>(
            &self,
            states: &mut [ArgMin<T, INDEX>; SLAB_COLUMNS],
            r: u64,
            at: impl Fn(u32, usize) -> u32,
        ) {
            for (j, state) in states.iter_mut().enumerate() {
                if self.valid[j] {
                    let held: [T; N] = core::array::from_fn(|u| {
                        // SAFETY: the row lies in the two stages the caller waited for,
                        // and `at` gives an aligned element of the ring.
                        unsafe { load_shared_element(self.ring + at(u as u32, j)) }
                    });
                    state.push_run(held, r, 1);
                }
            }
        }
    }
}
