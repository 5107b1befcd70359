//! The rows kernel: one block per row of `[outer, scan]`, walking the row tile by tile
//! with a carry; no look-back, no status.

use super::{SHARED_BYTES, ScanOperands, ScanProblem};
use crate::launch::{DevicePtr, DevicePtrMut, Kernel, Launch, LaunchGeometry, kernel_args};

/// Threads per block of the rows kernel: twice the look-back kernels', so each row
/// takes half the steps (the dim-1 headline ran at 94% of the copy bandwidth with 512,
/// 76% with 256, on the H100).
pub const ROWS_THREADS: u32 = 512;
/// Warps per rows block.
pub const ROWS_WARPS: usize = (ROWS_THREADS / 32) as usize;
/// Rows from which a block per row fills the GPU many times over (132 SMs, several
/// blocks each), so that rows at least a tile long need no look-back.
pub const ROWS_PLAN_MIN_ROWS: u64 = 2048;

// The warp totals (8-byte values at most) fit the look-back kernels' shared memory.
const _: () = assert!(ROWS_THREADS.is_multiple_of(32) && ROWS_WARPS * 8 <= SHARED_BYTES as usize);

/// Many long rows of whole 128-bit runs: a block per row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowsPlan {
    pub rows: u64,
}

kernel_args! {
    /// The rows kernel's arguments: `x` scanned into `y` (the same array in place),
    /// both `[outer, scan]`, with the `EXCLUSIVE` option bit.
    pub struct RowsArgs<T> {
        pub x: DevicePtr<T>,
        pub y: DevicePtrMut<T>,
        pub problem: ScanProblem,
        pub options: u32,
    }
    impl RowsKernel for f32 {
        const ROWS = "scan_rows_f32" => kernel::rows::<f32, { super::items_per_thread(4) }, false>;
        const ROWS_REVERSE = "scan_rows_reverse_f32" => kernel::rows::<f32, { super::items_per_thread(4) }, true>;
    }
    impl RowsKernel for f64 {
        const ROWS = "scan_rows_f64" => kernel::rows::<f64, { super::items_per_thread(8) }, false>;
        const ROWS_REVERSE = "scan_rows_reverse_f64" => kernel::rows::<f64, { super::items_per_thread(8) }, true>;
    }
    impl RowsKernel for i32 {
        const ROWS = "scan_rows_i32" => kernel::rows::<i32, { super::items_per_thread(4) }, false>;
        const ROWS_REVERSE = "scan_rows_reverse_i32" => kernel::rows::<i32, { super::items_per_thread(4) }, true>;
    }
    impl RowsKernel for i64 {
        const ROWS = "scan_rows_i64" => kernel::rows::<i64, { super::items_per_thread(8) }, false>;
        const ROWS_REVERSE = "scan_rows_reverse_i64" => kernel::rows::<i64, { super::items_per_thread(8) }, true>;
    }
    entry points in ENTRY_POINTS;
}

/// The rows kernel of one element type, forward and reversed.
pub trait RowsKernel: Sized {
    const ROWS: Kernel<RowsArgs<Self>>;
    const ROWS_REVERSE: Kernel<RowsArgs<Self>>;
}

impl RowsPlan {
    /// The launch of the scan.
    pub fn launch<T: RowsKernel>(&self, operands: ScanOperands<T>) -> Launch<RowsArgs<T>> {
        let (x, y, problem, options) = operands.parts();
        let kernel = if operands.reverse() {
            T::ROWS_REVERSE
        } else {
            T::ROWS
        };
        let geometry = LaunchGeometry::linear(self.rows, ROWS_THREADS).with_shared(SHARED_BYTES);
        Launch::new(
            kernel,
            geometry,
            RowsArgs {
                x,
                y,
                problem,
                options,
            },
        )
    }
}

#[cfg(target_arch = "nvptx64")]
mod kernel {
    use super::*;
    use crate::device::{SharedCarver, block_dim_x, block_idx_x, sync_threads, thread_idx_x};
    use crate::scan::EXCLUSIVE;
    use crate::scan::tile::{ScanValue, load_run, scan_tile, store_run};

    /// Scans one row per block, tile by tile, carrying the row's running sum: each
    /// tile is a block scan of `ITEMS` consecutive elements per thread (128-bit loads and
    /// stores), then a barrier before the next tile reuses the warp totals.
    ///
    /// # Safety
    /// `x` and `y` hold `outer * scan` elements, 16-byte aligned (they may be the same
    /// array); `scan` is a multiple of `ITEMS`; one block of `ROWS_THREADS` per row
    /// with `SHARED_BYTES` of dynamic shared memory.
    #[inline(always)]
    pub unsafe fn rows<T: ScanValue, const ITEMS: usize, const REVERSE_ORDER: bool>(args: RowsArgs<T>) {
        let (x, y, scan) = (args.x.as_ptr(), args.y.as_mut_ptr(), args.problem.scan);
        let mut carver = SharedCarver::new();
        // SAFETY: SHARED_BYTES covers ROWS_WARPS values.
        let warp_totals: *mut T = unsafe { carver.take(ROWS_WARPS) };
        let base = block_idx_x() as u64 * scan;
        let exclusive = args.options & EXCLUSIVE != 0;
        let tile = ITEMS as u64 * block_dim_x() as u64;
        // This thread's run of a tile: its physical start, aligned (ITEMS and scan are
        // multiples of PER_VECTOR; logical `q` is physical `scan - 1 - q` reversed), or
        // none past the row's end (rows hold whole runs: scan is a multiple of ITEMS).
        let run = |tile_start: u64| {
            let first = tile_start + thread_idx_x() as u64 * ITEMS as u64;
            (first < scan).then(|| {
                base + if REVERSE_ORDER {
                    scan - first - ITEMS as u64
                } else {
                    first
                }
            })
        };
        let load = |start: Option<u64>| match start {
            // SAFETY: the run lies inside the row, 16-byte aligned.
            Some(start) => unsafe { load_run::<T, ITEMS, REVERSE_ORDER>(x, start) },
            None => [T::identity(); ITEMS],
        };
        let mut carry = T::identity();
        let mut tile_start = 0;
        let mut start = run(0);
        let mut items = load(start);
        while tile_start < scan {
            // The next tile's loads go out before this tile's scan and stores.
            let next_start = run(tile_start + tile);
            let next_items = load(next_start);
            // SAFETY: every thread calls it; the warp totals are this block's.
            let total =
                unsafe { scan_tile::<T, ITEMS, ROWS_WARPS>(&mut items, carry, exclusive, warp_totals) };
            if let Some(start) = start {
                // SAFETY: the run lies inside the row, 16-byte aligned.
                unsafe { store_run::<T, ITEMS, REVERSE_ORDER>(y, start, &items) };
            }
            carry = carry.combine(total);
            (items, start) = (next_items, next_start);
            tile_start += tile;
            // SAFETY: every thread reaches it; the next tile rewrites the warp totals.
            unsafe { sync_threads() };
        }
    }
}
