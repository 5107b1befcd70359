//! The strided kernel: a scan down an axis of few columns (`inner > 1`), in tiles of
//! `BLOCK_THREADS` columns by `rows` rows chained by decoupled look-back down each
//! column block, one running sum per column.

use super::{BLOCK_THREADS, LaunchStatus, SHARED_BYTES, ScanOperands, ScanProblem};
use crate::element::{Sum, Summed, sum_bytes};
use crate::launch::{DevicePtr, DevicePtrMut, Kernel, Launch, LaunchGeometry, kernel_args};

/// Bytes of rows each strided thread holds in registers: 64 rows of 4-byte elements.
pub const STRIDED_THREAD_BYTES: usize = 256;

/// Rows of one strided tile: as many 16-bit rows as 32-bit ones, since each takes a
/// register of its own.
pub const fn rows_per_tile(element_bytes: usize) -> u64 {
    (STRIDED_THREAD_BYTES / sum_bytes(element_bytes)) as u64
}

/// Few columns: tiles of `BLOCK_THREADS` columns by `rows_per_tile` rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StridedPlan {
    /// Blocks of `BLOCK_THREADS` columns.
    pub column_blocks: u64,
    /// Tiles down the scanned axis.
    pub chunks: u64,
}

kernel_args! {
    /// The strided kernel's arguments: the scan operands, the look-back status of
    /// `column_blocks * chunks` tiles of `BLOCK_THREADS` values, and the column blocks.
    pub struct StridedArgs<T: Summed> {
        pub x: DevicePtr<T>,
        pub y: DevicePtrMut<T>,
        pub problem: ScanProblem,
        pub options: u32,
        pub status: LaunchStatus<Sum<T>>,
        pub column_blocks: u64,
    }
    impl StridedKernel for f32 {
        const STRIDED = "scan_strided_f32" => kernel::strided::<f32, { rows_per_tile(4) as usize }>;
    }
    impl StridedKernel for f64 {
        const STRIDED = "scan_strided_f64" => kernel::strided::<f64, { rows_per_tile(8) as usize }>;
    }
    impl StridedKernel for i32 {
        const STRIDED = "scan_strided_i32" => kernel::strided::<i32, { rows_per_tile(4) as usize }>;
    }
    impl StridedKernel for i64 {
        const STRIDED = "scan_strided_i64" => kernel::strided::<i64, { rows_per_tile(8) as usize }>;
    }
    impl StridedKernel for half::bf16 {
        const STRIDED = "scan_strided_bf16" => kernel::strided::<half::bf16, { rows_per_tile(2) as usize }>;
    }
    impl StridedKernel for half::f16 {
        const STRIDED = "scan_strided_f16" => kernel::strided::<half::f16, { rows_per_tile(2) as usize }>;
    }
    entry points in ENTRY_POINTS;
}

/// The strided kernel of one element type (the direction is an option bit).
pub trait StridedKernel: Summed {
    const STRIDED: Kernel<StridedArgs<Self>>;
}

impl StridedPlan {
    /// The launch of the scan, with its look-back status in `scratch`, laid out and
    /// zeroed as `ScanPlan::scratch` says.
    pub fn launch<T: StridedKernel>(
        &self,
        operands: ScanOperands<T>,
        scratch: DevicePtrMut<u8>,
    ) -> Launch<StridedArgs<T>> {
        let (x, y, problem, options) = operands.parts();
        let status = LaunchStatus::in_scratch(scratch, self.column_blocks * self.chunks, BLOCK_THREADS);
        let geometry =
            LaunchGeometry::linear(self.column_blocks * self.chunks, BLOCK_THREADS).with_shared(SHARED_BYTES);
        let column_blocks = self.column_blocks;
        Launch::new(
            T::STRIDED,
            geometry,
            StridedArgs {
                x,
                y,
                problem,
                options,
                status,
                column_blocks,
            },
        )
    }
}

#[cfg(target_arch = "nvptx64")]
mod kernel {
    use super::*;
    use crate::block::ScanOp;
    use crate::device::thread_idx_x;
    use crate::scan::tile::{ScanValue, Shared, zero};
    use crate::scan::{EXCLUSIVE, REVERSE};

    /// Scans `ROWS` rows of `BLOCK_THREADS` columns per tile; tile ids run over the
    /// column blocks first, so a tile's predecessor down its columns started earlier.
    ///
    /// # Safety
    /// `x` and `y` hold `outer * scan * inner` elements (they may be the same array);
    /// the status holds `column_blocks * chunks` flags and `BLOCK_THREADS` values per
    /// tile after a zero counter; the grid has that many blocks of `BLOCK_THREADS`
    /// threads with `SHARED_BYTES` of dynamic shared memory.
    #[inline(always)]
    pub unsafe fn strided<T: ScanValue, const ROWS: usize>(args: StridedArgs<T>) {
        let StridedArgs {
            problem,
            options,
            status,
            column_blocks,
            ..
        } = args;
        let (x, y) = (args.x.as_ptr(), args.y.as_mut_ptr());
        let shared = Shared::<T::Sum>::carve();
        let tiles = status.tiles(BLOCK_THREADS);
        // SAFETY: every thread calls it; the counter heads the status.
        let tile = unsafe { shared.next_tile(status.counter()) };
        let (chunk, column_block) = (tile / column_blocks, tile % column_blocks);
        let ScanProblem { outer, scan, inner } = problem;
        let column = column_block * BLOCK_THREADS as u64 + thread_idx_x() as u64;
        let valid = column < outer * inner;
        let base = (column / inner) * scan * inner + column % inner;
        let reverse = options & REVERSE != 0;
        let address = |r: u64| base + if reverse { scan - 1 - r } else { r } * inner;
        let first_row = chunk * ROWS as u64;

        let mut loaded = [zero::<T>(); ROWS];
        for (k, item) in loaded.iter_mut().enumerate() {
            if valid && first_row + (k as u64) < scan {
                // SAFETY: column < outer * inner and row < scan.
                *item = unsafe { *x.add(address(first_row + k as u64) as usize) };
            }
        }
        let items = loaded.map(|item| item.widen_apart());
        let mut total = T::Sum::identity();
        for &item in &items {
            total = total.combine(item);
        }
        // SAFETY: every thread calls it; the chain down the column block starts at chunk 0
        // (tiles below `column_blocks`), which never waits.
        let prefix = unsafe { tiles.chain_columns(tile, column_blocks, total) };

        let exclusive = options & EXCLUSIVE != 0;
        let mut running = prefix;
        for (k, &item) in items.iter().enumerate() {
            let next = running.combine(item);
            if valid && first_row + (k as u64) < scan {
                // SAFETY: column < outer * inner and row < scan.
                unsafe {
                    *y.add(address(first_row + k as u64) as usize) =
                        T::narrow(if exclusive { running } else { next })
                };
            }
            running = next;
        }
    }
}
