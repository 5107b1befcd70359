//! The columns kernel: a scan down an axis of many columns (`inner > 1`), each column
//! walked whole with a running sum by `parts` threads of one block; no look-back, no
//! status. A launch may take a range of an array's columns and start each column's sum
//! at a carry in, handing its total on as a carry out: a device group's scan along the
//! split axis, pipelined over column chunks from shard to shard.

use super::{BLOCK_THREADS, ScanOperands, ScanProblem};
use crate::element::{Sum, Summed, sum_bytes};
use crate::launch::{DevicePtr, DevicePtrMut, Kernel, Launch, LaunchGeometry, kernel_args};

/// Bytes of loads in flight the columns kernel aims for (more than 3 TB/s over a
/// microsecond of latency); columns take up to `COLUMN_MAX_PARTS` threads each to reach
/// it. Axis 0 of 2^30 f32 on the H100 (128 bytes per thread): 32768 columns 3.17 ms with
/// one part, 3.11 with two; 16384 columns 3.01 with two, 3.12 with four; 8192 columns
/// 3.02 with four, 3.29 with eight.
pub const COLUMN_TARGET_BYTES: u64 = 1 << 22;
/// Columns from which the columns kernel takes the scan from the strided one. Axis 0 of
/// 2^30 f32 on the H100, columns against strided kernel: 65536 columns 3.24 against 3.88
/// ms, 32768 3.17 against 3.79, 16384 3.01 against 3.73, 8192 3.02 against 4.04, 4096
/// 3.17 against 4.42; 65536 x 2048 f32 took the strided kernel at 48% of the copy
/// bandwidth.
pub const COLUMNS_PLAN_MIN_COLUMNS: u64 = 2048;
/// Most threads sharing a column (a power of two): 2048 columns take 16, enough threads
/// for `COLUMN_TARGET_BYTES` and a block on each of 128 SMs (8 would fill 64 blocks); a
/// warp then covers 16 columns, two 64-byte pieces of f32 rows.
pub const COLUMN_MAX_PARTS: u32 = 16;
/// Dynamic shared memory of a columns block: each thread's batch total, twice (8-byte
/// values at most), so that one barrier per batch suffices.
pub const COLUMN_SHARED_BYTES: u32 = 2 * BLOCK_THREADS * 8;
/// Bytes of rows each columns thread loads ahead (axis 0 of 32768 x 32768 f32 on the
/// H100, one thread per column: 3.17 ms with 128, 3.20 with 256, 3.62 with 64).
pub const COLUMN_BATCH_BYTES: usize = 128;

/// Columns (lanes) of one chunk of a device group's pipelined scan along the split
/// axis, at least: each rank scans chunk after chunk, a chunk behind the rank before
/// it, so more chunks shorten that lag (two ranks take `chunks + 1` chunk times against
/// one device's `2 * chunks`) while narrower chunks keep fewer loads in flight.
pub const PIPELINE_CHUNK_MIN_COLUMNS: u64 = 2048;
/// Chunks of a pipelined scan, at most: each costs a launch and a send per rank.
pub const PIPELINE_MAX_CHUNKS: u64 = 16;

/// The inner width of each chunk of a device group's pipelined scan of `problem` (the
/// last chunk may be narrower): at most `PIPELINE_MAX_CHUNKS` chunks of at least
/// `PIPELINE_CHUNK_MIN_COLUMNS` lanes, each a multiple of 32 columns wide (a warp's
/// loads of a row stay whole sectors) unless it is the whole width.
pub const fn pipeline_chunk_width(problem: &ScanProblem) -> u64 {
    let chunks = problem.columns() / PIPELINE_CHUNK_MIN_COLUMNS;
    let chunks = if chunks > PIPELINE_MAX_CHUNKS {
        PIPELINE_MAX_CHUNKS
    } else if chunks < 1 {
        1
    } else {
        chunks
    };
    let width = problem.inner.div_ceil(chunks).next_multiple_of(32);
    if width > problem.inner {
        problem.inner
    } else {
        width
    }
}

/// Rows each columns thread loads ahead: as many 16-bit rows as 32-bit ones, since each
/// takes a register of its own.
pub const fn column_batch(element_bytes: usize) -> usize {
    COLUMN_BATCH_BYTES / sum_bytes(element_bytes)
}

/// Threads that keep `COLUMN_TARGET_BYTES` in flight: twice as many for 16-bit elements
/// as for wider ones.
pub const fn column_target_threads(element_bytes: usize) -> u64 {
    COLUMN_TARGET_BYTES / (column_batch(element_bytes) * element_bytes) as u64
}

/// Many columns: `parts` threads per column, `BLOCK_THREADS / parts` columns per block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColumnsPlan {
    pub column_blocks: u64,
    /// A power of two up to `COLUMN_MAX_PARTS`.
    pub parts: u32,
}

kernel_args! {
    /// The columns kernel's arguments: the scan operands, the threads per column and
    /// the columns' carries.
    pub struct ColumnsArgs<T: Summed> {
        pub x: DevicePtr<T>,
        pub y: DevicePtrMut<T>,
        pub problem: ScanProblem,
        pub options: u32,
        pub parts: u32,
        pub row_pitch: u64,
        pub carry_in: DevicePtr<Sum<T>>,
        pub carry_out: DevicePtrMut<Sum<T>>,
    }
    impl ColumnsKernel for f32 {
        const COLUMNS = "scan_columns_f32" => kernel::columns::<f32, { column_batch(4) }>;
    }
    impl ColumnsKernel for f64 {
        const COLUMNS = "scan_columns_f64" => kernel::columns::<f64, { column_batch(8) }>;
    }
    impl ColumnsKernel for i32 {
        const COLUMNS = "scan_columns_i32" => kernel::columns::<i32, { column_batch(4) }>;
    }
    impl ColumnsKernel for i64 {
        const COLUMNS = "scan_columns_i64" => kernel::columns::<i64, { column_batch(8) }>;
    }
    impl ColumnsKernel for half::bf16 {
        const COLUMNS = "scan_columns_bf16" => kernel::columns::<half::bf16, { column_batch(2) }>;
    }
    impl ColumnsKernel for half::f16 {
        const COLUMNS = "scan_columns_f16" => kernel::columns::<half::f16, { column_batch(2) }>;
    }
    entry points in ENTRY_POINTS;
}

/// The columns kernel of one element type (the direction is an option bit).
pub trait ColumnsKernel: Summed {
    const COLUMNS: Kernel<ColumnsArgs<Self>>;
}

/// Where a launch's columns lie and what they carry: `problem.inner` columns of an
/// array `row_pitch` elements wide along its inner axis (x and y point at the first),
/// each column's sum starting at its carry in and its total, carry in included, written
/// to its carry out; a null carry is none (zero, not written). Carries are indexed by
/// the launch's column, `outer * inner` of them.
#[derive(Debug, Clone, Copy)]
pub struct ColumnCarries<T: Summed> {
    pub row_pitch: u64,
    pub carry_in: DevicePtr<Sum<T>>,
    pub carry_out: DevicePtrMut<Sum<T>>,
}

impl<T: Summed> ColumnCarries<T> {
    /// A whole array's columns, without carries.
    pub const fn none(problem: &ScanProblem) -> Self {
        Self {
            row_pitch: problem.inner,
            carry_in: DevicePtr::NULL,
            carry_out: DevicePtrMut::NULL,
        }
    }
}

impl ColumnsPlan {
    /// The plan for the columns of `problem`: as many threads per column as keep
    /// `COLUMN_TARGET_BYTES` in flight, up to `COLUMN_MAX_PARTS`.
    pub const fn new(problem: &ScanProblem, element_bytes: usize) -> Self {
        let mut parts = 1;
        while problem.columns() * (parts as u64) < column_target_threads(element_bytes)
            && parts < COLUMN_MAX_PARTS
        {
            parts *= 2;
        }
        Self {
            column_blocks: problem.columns().div_ceil((BLOCK_THREADS / parts) as u64),
            parts,
        }
    }

    /// The launch of the scan of the whole array.
    pub fn launch<T: ColumnsKernel>(&self, operands: ScanOperands<T>) -> Launch<ColumnsArgs<T>> {
        self.launch_carried(operands, ColumnCarries::none(&operands.problem))
    }

    /// The launch of the scan of the columns that `carries` places.
    pub fn launch_carried<T: ColumnsKernel>(
        &self,
        operands: ScanOperands<T>,
        carries: ColumnCarries<T>,
    ) -> Launch<ColumnsArgs<T>> {
        let (x, y, problem, options) = operands.parts();
        let geometry =
            LaunchGeometry::linear(self.column_blocks, BLOCK_THREADS).with_shared(COLUMN_SHARED_BYTES);
        let ColumnCarries {
            row_pitch,
            carry_in,
            carry_out,
        } = carries;
        Launch::new(
            T::COLUMNS,
            geometry,
            ColumnsArgs {
                x,
                y,
                problem,
                options,
                parts: self.parts,
                row_pitch,
                carry_in,
                carry_out,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn width(outer: u64, inner: u64) -> u64 {
        pipeline_chunk_width(&ScanProblem {
            outer,
            scan: 1000,
            inner,
        })
    }

    #[test]
    fn pipeline_chunks_are_whole_warps_of_columns_up_to_the_most_chunks() {
        // The headline's 32768 columns: 16 chunks of 2048.
        assert_eq!(width(1, 32768), 2048);
        // 8200 columns: 4 chunks of 2080 (whole warps), the last 1960.
        assert_eq!(width(1, 8200), 2080);
        // Lanes count the outer slices: 4 x 1024 lanes make 2 chunks of 512 columns.
        assert_eq!(width(4, 1024), 512);
        // Few lanes: one chunk, the whole width even when not whole warps.
        assert_eq!(width(1, 100), 100);
        assert_eq!(width(1, 2047), 2047);
        // 3 x 2047 lanes: 2 chunks of 1024 columns.
        assert_eq!(width(3, 2047), 1024);
        // A headline chunk takes 16 threads a column: a block on each of 128 SMs.
        let chunk = ScanProblem {
            outer: 1,
            scan: 32768,
            inner: 2048,
        };
        assert_eq!(
            ColumnsPlan::new(&chunk, 4),
            ColumnsPlan {
                column_blocks: 128,
                parts: 16
            }
        );
    }
}

#[cfg(target_arch = "nvptx64")]
mod kernel {
    use super::*;
    use crate::block::ScanOp;
    use crate::device::{SharedCarver, block_idx_x, sync_threads, thread_idx_x};
    use crate::scan::tile::{ScanValue, zero};
    use crate::scan::{EXCLUSIVE, REVERSE};

    /// Scans each column whole with a running sum, `parts` threads per column: batches of
    /// `parts * BATCH` rows, each thread loading its `BATCH` consecutive rows of each
    /// batch. The next batch's loads go out before the current batch is scanned and
    /// stored, so each thread keeps a batch of loads in flight; with several parts, the
    /// threads of a column add the totals of the parts before theirs through shared
    /// memory (one barrier per batch). Each column's sum starts at its carry in, if
    /// any, and its total goes to its carry out, if any.
    ///
    /// # Safety
    /// `x` and `y` hold the columns of an `[outer, scan, row_pitch]` array, `inner <=
    /// row_pitch` of them from the first (they may be the same array); the carries,
    /// unless null, hold `outer * inner` sums; `parts` divides `BLOCK_THREADS` by a power
    /// of two up to `COLUMN_MAX_PARTS`; blocks of `BLOCK_THREADS` threads with
    /// `COLUMN_SHARED_BYTES` of dynamic shared memory, as many as cover `outer * inner`
    /// columns.
    #[inline(always)]
    pub unsafe fn columns<T: ScanValue, const BATCH: usize>(args: ColumnsArgs<T>) {
        let ColumnsArgs {
            problem,
            options,
            parts,
            row_pitch,
            ..
        } = args;
        let (x, y) = (args.x.as_ptr(), args.y.as_mut_ptr());
        let (carry_in, carry_out) = (args.carry_in.as_ptr(), args.carry_out.as_mut_ptr());
        let ScanProblem { outer, scan, inner } = problem;
        let width = BLOCK_THREADS / parts;
        let (lane, part) = (thread_idx_x() % width, thread_idx_x() / width);
        let column = block_idx_x() as u64 * width as u64 + lane as u64;
        let valid = column < outer * inner;
        // SAFETY: COLUMN_SHARED_BYTES holds two totals per thread.
        let totals: *mut T::Sum = unsafe { SharedCarver::new().take(2 * BLOCK_THREADS as usize) };
        let exclusive = options & EXCLUSIVE != 0;
        // Row r of the column sits at `origin + r * step` (one add per row).
        let (origin, step) = {
            let base = (column / inner) * scan * row_pitch + column % inner;
            if options & REVERSE != 0 {
                (base + (scan - 1) * row_pitch, -(row_pitch as isize))
            } else {
                (base, row_pitch as isize)
            }
        };
        let offset = |r: u64| origin as isize + r as isize * step;
        let batch_rows = (parts as usize * BATCH) as u64;
        let part_start = |batch_first: u64| batch_first + (part as usize * BATCH) as u64;
        // Elements as loaded, widened once the batch is scanned (see `zero`).
        let load = |batch_first: u64| -> [T; BATCH] {
            let first = part_start(batch_first);
            let mut at = offset(first);
            core::array::from_fn(|k| {
                let item = if valid && first + (k as u64) < scan {
                    // SAFETY: row first + k of a column below outer * inner.
                    unsafe { *x.offset(at) }
                } else {
                    zero()
                };
                at += step;
                item
            })
        };
        let slot =
            |buffer: usize, part: u32| buffer * BLOCK_THREADS as usize + (part * width + lane) as usize;
        let mut carry = if valid && !carry_in.is_null() {
            // SAFETY: a carry per column below outer * inner.
            unsafe { *carry_in.add(column as usize) }
        } else {
            T::Sum::identity()
        };
        let mut batch_first = 0;
        let mut loaded = load(0);
        let mut buffer = 0;
        while batch_first < scan {
            let next = load(batch_first + batch_rows);
            let items = loaded.map(|item| item.widen_apart());
            let mut own = T::Sum::identity();
            for &item in &items {
                own = own.combine(item);
            }
            // The parts before this thread's in the batch, and the whole batch.
            let (before, batch_total) = if parts == 1 {
                (T::Sum::identity(), own)
            } else {
                // SAFETY: this thread's slot of this batch's buffer; the other buffer's
                // readers of the batch before passed this batch's barrier below before any
                // thread writes it again.
                unsafe {
                    *totals.add(slot(buffer, part)) = own;
                    sync_threads();
                }
                let (mut before, mut batch_total) = (T::Sum::identity(), T::Sum::identity());
                for p in 0..parts {
                    // SAFETY: written before the barrier by the thread of part p.
                    let total = unsafe { *totals.add(slot(buffer, p)) };
                    if p < part {
                        before = before.combine(total);
                    }
                    batch_total = batch_total.combine(total);
                }
                buffer ^= 1;
                (before, batch_total)
            };
            let mut running = carry.combine(before);
            let first = part_start(batch_first);
            let mut at = offset(first);
            for (k, &item) in items.iter().enumerate() {
                let sum = running.combine(item);
                if valid && first + (k as u64) < scan {
                    // SAFETY: as for the loads; in place, this row was loaded already.
                    unsafe { *y.offset(at) = T::narrow(if exclusive { running } else { sum }) };
                }
                running = sum;
                at += step;
            }
            carry = carry.combine(batch_total);
            loaded = next;
            batch_first += batch_rows;
        }
        // Every part of a column holds its total; the first writes it.
        if valid && part == 0 && !carry_out.is_null() {
            // SAFETY: as for the carry in.
            unsafe { *carry_out.add(column as usize) = carry };
        }
    }
}
