//! The columns kernel: a scan down an axis of many columns (`inner > 1`), each column
//! walked whole with a running sum by `parts` threads of one block; no look-back, no
//! status.

use super::{BLOCK_THREADS, ScanOperands, ScanProblem};
use crate::element::{Summed, sum_bytes};
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
/// 3.17 against 4.42.
pub const COLUMNS_PLAN_MIN_COLUMNS: u64 = 4096;
/// Most threads sharing a column (a power of two); warps still cover 32 columns.
pub const COLUMN_MAX_PARTS: u32 = 8;
/// Dynamic shared memory of a columns block: each thread's batch total, twice (8-byte
/// values at most), so that one barrier per batch suffices.
pub const COLUMN_SHARED_BYTES: u32 = 2 * BLOCK_THREADS * 8;
/// Bytes of rows each columns thread loads ahead (axis 0 of 32768 x 32768 f32 on the
/// H100, one thread per column: 3.17 ms with 128, 3.20 with 256, 3.62 with 64).
pub const COLUMN_BATCH_BYTES: usize = 128;

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
    /// The columns kernel's arguments: the scan operands and the threads per column.
    pub struct ColumnsArgs<T> {
        pub x: DevicePtr<T>,
        pub y: DevicePtrMut<T>,
        pub problem: ScanProblem,
        pub options: u32,
        pub parts: u32,
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

impl ColumnsPlan {
    /// The launch of the scan.
    pub fn launch<T: ColumnsKernel>(&self, operands: ScanOperands<T>) -> Launch<ColumnsArgs<T>> {
        let (x, y, problem, options) = operands.parts();
        let geometry =
            LaunchGeometry::linear(self.column_blocks, BLOCK_THREADS).with_shared(COLUMN_SHARED_BYTES);
        let parts = self.parts;
        Launch::new(
            T::COLUMNS,
            geometry,
            ColumnsArgs {
                x,
                y,
                problem,
                options,
                parts,
            },
        )
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
    /// memory (one barrier per batch).
    ///
    /// # Safety
    /// `x` and `y` hold `outer * scan * inner` elements (they may be the same array);
    /// `parts` divides `BLOCK_THREADS` by a power of two up to `COLUMN_MAX_PARTS`; blocks
    /// of `BLOCK_THREADS` threads with `COLUMN_SHARED_BYTES` of dynamic shared memory, as
    /// many as cover `outer * inner` columns.
    #[inline(always)]
    pub unsafe fn columns<T: ScanValue, const BATCH: usize>(args: ColumnsArgs<T>) {
        let ColumnsArgs {
            problem,
            options,
            parts,
            ..
        } = args;
        let (x, y) = (args.x.as_ptr(), args.y.as_mut_ptr());
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
            let base = (column / inner) * scan * inner + column % inner;
            if options & REVERSE != 0 {
                (base + (scan - 1) * inner, -(inner as isize))
            } else {
                (base, inner as isize)
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
        let mut carry = T::Sum::identity();
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
    }
}
