//! The rows kernel: one block per `ROWS_PER_BLOCK` rows of `[outer, scan]`, walking
//! them tile by tile with a carry; no look-back, no status.

use super::{ScanOperands, ScanProblem, VECTORS_PER_THREAD};
use crate::element::sum_bytes;
use crate::launch::{DevicePtr, DevicePtrMut, Kernel, Launch, LaunchGeometry, kernel_args};

/// Threads per block of the rows kernel: twice the look-back kernels', so each row
/// takes half the steps (the dim-1 headline ran at 94% of the copy bandwidth with 512,
/// 76% with 256, on the H100).
pub const ROWS_THREADS: u32 = 512;
/// Warps per rows block.
pub const ROWS_WARPS: usize = (ROWS_THREADS / 32) as usize;
/// Rows blocks an SM holds for 16-bit elements: the launch bounds cap the registers at
/// 64 a thread, which the wider types would spill (one block an SM holds them).
pub const ROWS_16_BIT_BLOCKS_PER_SM: u32 = 2;
/// Rows from which a block per `ROWS_PER_BLOCK` rows fills the GPU many times over
/// (132 SMs, several blocks each), so that rows at least a tile long need no look-back.
pub const ROWS_PLAN_MIN_ROWS: u64 = 2048;
/// Consecutive rows each block scans, the next tile's loads in flight across row ends,
/// so that a block start exposes a load latency once per so many rows.
pub const ROWS_PER_BLOCK: u64 = 4;

/// Elements each rows thread holds: `VECTORS_PER_THREAD` vectors of their sums, so that
/// 16-bit elements, widened to f32, take as many registers as 4-byte ones (the bf16
/// dim-1 headline on the H100: 1.61 ms with 16 per thread, two blocks per SM; 1.78 ms
/// with 32, one block).
pub const fn rows_items(element_bytes: usize) -> usize {
    VECTORS_PER_THREAD * 16 / sum_bytes(element_bytes)
}

/// 128-bit vectors of one thread's run: 2 for 16-bit elements, 4 for the others.
pub const fn rows_vectors(element_bytes: usize) -> usize {
    rows_items(element_bytes) * element_bytes / 16
}

/// Bytes of a rows block's transpose buffers: 32 runs a warp.
pub const fn rows_buffer_bytes(element_bytes: usize) -> u32 {
    (ROWS_WARPS * 32 * rows_vectors(element_bytes) * 16) as u32
}

/// Dynamic shared memory of a rows block: each warp's transpose buffer of 32 runs,
/// then the warp totals (8 bytes at most each).
pub const fn rows_shared_bytes(element_bytes: usize) -> u32 {
    rows_buffer_bytes(element_bytes) + ROWS_WARPS as u32 * 8
}

const _: () = assert!(ROWS_THREADS.is_multiple_of(32) && ROWS_THREADS * ROWS_16_BIT_BLOCKS_PER_SM <= 2048);
// The swizzle of the transpose buffers needs a power-of-two count of vectors a run.
const _: () = assert!(
    rows_vectors(2).is_power_of_two()
        && rows_vectors(4).is_power_of_two()
        && rows_vectors(8).is_power_of_two()
);

/// Many long rows of whole 128-bit runs: a block per `ROWS_PER_BLOCK` rows.
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
        const ROWS = "scan_rows_f32" => kernel::rows::<f32, { rows_items(4) }, false>;
        const ROWS_REVERSE = "scan_rows_reverse_f32" => kernel::rows::<f32, { rows_items(4) }, true>;
    }
    impl RowsKernel for f64 {
        const ROWS = "scan_rows_f64" => kernel::rows::<f64, { rows_items(8) }, false>;
        const ROWS_REVERSE = "scan_rows_reverse_f64" => kernel::rows::<f64, { rows_items(8) }, true>;
    }
    impl RowsKernel for i32 {
        const ROWS = "scan_rows_i32" => kernel::rows::<i32, { rows_items(4) }, false>;
        const ROWS_REVERSE = "scan_rows_reverse_i32" => kernel::rows::<i32, { rows_items(4) }, true>;
    }
    impl RowsKernel for i64 {
        const ROWS = "scan_rows_i64" => kernel::rows::<i64, { rows_items(8) }, false>;
        const ROWS_REVERSE = "scan_rows_reverse_i64" => kernel::rows::<i64, { rows_items(8) }, true>;
    }
    impl RowsKernel for half::bf16 {
        const ROWS = "scan_rows_bf16" => kernel::rows::<half::bf16, { rows_items(2) }, false>, bounds(ROWS_THREADS, ROWS_16_BIT_BLOCKS_PER_SM);
        const ROWS_REVERSE = "scan_rows_reverse_bf16" => kernel::rows::<half::bf16, { rows_items(2) }, true>, bounds(ROWS_THREADS, ROWS_16_BIT_BLOCKS_PER_SM);
    }
    impl RowsKernel for half::f16 {
        const ROWS = "scan_rows_f16" => kernel::rows::<half::f16, { rows_items(2) }, false>, bounds(ROWS_THREADS, ROWS_16_BIT_BLOCKS_PER_SM);
        const ROWS_REVERSE = "scan_rows_reverse_f16" => kernel::rows::<half::f16, { rows_items(2) }, true>, bounds(ROWS_THREADS, ROWS_16_BIT_BLOCKS_PER_SM);
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
        let geometry = LaunchGeometry::linear(self.rows.div_ceil(ROWS_PER_BLOCK), ROWS_THREADS)
            .with_shared(rows_shared_bytes(size_of::<T>()));
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
    use crate::block::ScanOp;
    use crate::device::{
        SharedCarver, block_dim_x, block_idx_x, lane_id, shared_base, sync_threads, thread_idx_x,
    };
    use crate::scan::EXCLUSIVE;
    use crate::scan::tile::{ScanValue, ValidRuns, WarpRuns, narrow_run, scan_tile, widen_run};

    /// Scans `ROWS_PER_BLOCK` consecutive rows per block (fewer in the last block), tile
    /// by tile, carrying each row's running sum: each tile is a block scan of `ITEMS`
    /// consecutive elements per thread (a run; lane `l` of a warp takes the warp's run
    /// `l`, reversed `31 - l`), then a barrier before the next tile reuses the warp
    /// totals. Loads and stores are 128-bit and consecutive across the lanes (see
    /// `WarpRuns`). The next tile's loads, of this row or the next, go out before the
    /// current tile's scan.
    ///
    /// # Safety
    /// `x` and `y` hold `outer * scan` elements, 16-byte aligned (they may be the same
    /// array); `scan` is a multiple of `ITEMS`; blocks of `ROWS_THREADS`, as many as
    /// cover `outer` rows by `ROWS_PER_BLOCK`, with `rows_shared_bytes` of dynamic shared
    /// memory.
    #[inline(always)]
    pub unsafe fn rows<T: ScanValue, const ITEMS: usize, const REVERSE_ORDER: bool>(args: RowsArgs<T>) {
        let (x, y) = (args.x.as_ptr(), args.y.as_mut_ptr());
        let ScanProblem { outer, scan, .. } = args.problem;
        let vectors = (ITEMS / T::PER_VECTOR) as u32;
        let warp = thread_idx_x() / 32;
        let buffer_bytes = ROWS_WARPS * 32 * vectors as usize * 16;
        let mut carver = SharedCarver::new();
        // SAFETY: rows_shared_bytes covers the warps' buffers, then ROWS_WARPS sums.
        let warp_totals: *mut T::Sum = unsafe {
            carver.take::<u8>(buffer_bytes);
            carver.take(ROWS_WARPS)
        };
        let buffer = shared_base() + warp * 32 * vectors * 16;
        let first_row = block_idx_x() as u64 * ROWS_PER_BLOCK;
        let end_row = (first_row + ROWS_PER_BLOCK).min(outer);
        let exclusive = args.options & EXCLUSIVE != 0;
        let tile = ITEMS as u64 * block_dim_x() as u64;
        let warp_items = 32 * ITEMS as u64;
        // The lane's run, in the warp's physical order.
        let own_run = if REVERSE_ORDER { 31 - lane_id() } else { lane_id() };
        // The tile after the one at `tile_start` of `row`: the row's next, or the next
        // row's first.
        let advance = |(row, tile_start): (u64, u64)| {
            if tile_start + tile < scan {
                (row, tile_start + tile)
            } else {
                (row + 1, 0)
            }
        };
        // The warp's runs of a tile: logically from `first`, those before the row's end
        // valid (scan is a multiple of ITEMS), none past the block's last row; logical
        // `q` is physical `scan - 1 - q` reversed.
        let runs = |(row, tile_start): (u64, u64)| {
            let first = tile_start + warp as u64 * warp_items;
            let inside = if row < end_row {
                (scan.saturating_sub(first) / ITEMS as u64).min(32) as u32
            } else {
                0
            };
            let (start, first, end) = if REVERSE_ORDER {
                (
                    (row * scan + scan).wrapping_sub(first + warp_items),
                    32 - inside,
                    32,
                )
            } else {
                (row * scan + first, 0, inside)
            };
            (
                WarpRuns {
                    buffer,
                    vectors,
                    start,
                },
                ValidRuns { first, end },
            )
        };
        let mut carry = T::Sum::identity();
        let mut at = (first_row, 0);
        let (mut current, mut valid) = runs(at);
        // SAFETY: the valid runs lie inside the rows, 16-byte aligned.
        let mut words = unsafe { current.load(x, valid) };
        while at.0 < end_row {
            // The next tile's loads go out before this tile's scan and stores.
            let next = advance(at);
            let (next_runs, next_valid) = runs(next);
            // SAFETY: as above.
            let next_words = unsafe { next_runs.load(x, next_valid) };
            if at.1 == 0 {
                carry = T::Sum::identity();
            }
            // SAFETY: every lane of every warp calls it; the buffer is the warp's.
            let run_words = unsafe { current.gather(&words, own_run) };
            let mut items = widen_run::<T, ITEMS, REVERSE_ORDER>(&run_words);
            // SAFETY: every thread calls it; the warp totals are this block's.
            let total =
                unsafe { scan_tile::<_, ITEMS, ROWS_WARPS>(&mut items, carry, exclusive, warp_totals) };
            // SAFETY: as `gather`; then the valid runs, inside the rows.
            unsafe {
                let striped = current.scatter(&narrow_run::<T, ITEMS, REVERSE_ORDER>(&items), own_run);
                current.store(y, valid, &striped);
            }
            carry = carry.combine(total);
            (words, current, valid, at) = (next_words, next_runs, next_valid, next);
            // SAFETY: every thread reaches it; the next tile rewrites the warp totals.
            unsafe { sync_threads() };
        }
    }
}
