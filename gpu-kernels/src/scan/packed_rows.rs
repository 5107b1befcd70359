//! The packed-rows kernel: rows of any length (`inner == 1`) laid end to end, a block
//! per `rows_per_block` consecutive rows walking their elements as one flat span, tile
//! by tile, with a running sum that restarts at each row's first element; no
//! look-back, no status. It takes the rows the rows kernel cannot (not of whole 128-bit
//! runs, or shorter than a tile) wherever they make enough blocks of a tile's work, and
//! any array of one tile (one block, no scratch to zero): look-back tiles ran 65536
//! rows of 4095 f32 at 52% of the copy bandwidth.

use super::rows::{
    ROWS_PER_BLOCK, ROWS_PLAN_MIN_ROWS, ROWS_THREADS, ROWS_WARPS, rows_buffer_bytes, rows_items,
};
use super::{ScanOperands, ScanProblem};
use crate::launch::{DevicePtr, DevicePtrMut, Kernel, Launch, LaunchGeometry, kernel_args};

/// Tiles of work a block aims for, so that its start and its span's unaligned ends
/// weigh little (the rows kernel's blocks take 4 rows of a tile or more).
pub const PACKED_BLOCK_TILES: u64 = 4;
/// Blocks a packed-rows launch keeps at least, unless one block takes the whole array:
/// as many as the rows kernel's fewest (2048 rows, 4 a block), several an SM.
pub const PACKED_MIN_BLOCKS: u64 = ROWS_PLAN_MIN_ROWS / ROWS_PER_BLOCK;
/// Packed-rows blocks an SM holds for 16-bit elements, as rows blocks: the launch
/// bounds cap the registers at 64 a thread (the others take one block an SM).
pub const PACKED_16_BIT_BLOCKS_PER_SM: u32 = 2;

/// Elements of one packed-rows tile: a run of `rows_items` per thread.
pub const fn packed_tile_items(element_bytes: usize) -> u64 {
    ROWS_THREADS as u64 * rows_items(element_bytes) as u64
}

/// Dynamic shared memory of a packed-rows block: the rows kernel's transpose buffers,
/// then the warp totals of the block scan (head flag and value, 16 bytes at most each).
pub const fn packed_shared_bytes(element_bytes: usize) -> u32 {
    rows_buffer_bytes(element_bytes) + ROWS_WARPS as u32 * 16
}

/// Rows of any length: a block per `rows_per_block` consecutive rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackedRowsPlan {
    pub rows: u64,
    pub rows_per_block: u64,
}

impl PackedRowsPlan {
    /// The plan for `problem` where the kernel suits it: one block for an array of a
    /// tile at most; else rows for `PACKED_BLOCK_TILES` tiles a block, fewer where that
    /// leaves under `PACKED_MIN_BLOCKS` blocks, as long as a block has a tile's work.
    pub const fn new(problem: &ScanProblem, element_bytes: usize) -> Option<Self> {
        let tile = packed_tile_items(element_bytes);
        let rows = problem.outer;
        if problem.inner != 1 || problem.elements() == 0 {
            return None;
        }
        if problem.elements() <= tile {
            return Some(Self {
                rows,
                rows_per_block: rows,
            });
        }
        let wanted = (PACKED_BLOCK_TILES * tile).div_ceil(problem.scan);
        let most = rows / PACKED_MIN_BLOCKS;
        let rows_per_block = if wanted < most { wanted } else { most };
        if rows_per_block >= 1 && rows_per_block * problem.scan >= tile {
            Some(Self { rows, rows_per_block })
        } else {
            None
        }
    }

    /// Blocks of the launch.
    pub const fn blocks(&self) -> u64 {
        self.rows.div_ceil(self.rows_per_block)
    }

    /// The launch of the scan.
    pub fn launch<T: PackedRowsKernel>(&self, operands: ScanOperands<T>) -> Launch<PackedRowsArgs<T>> {
        let (x, y, problem, options) = operands.parts();
        let kernel = if operands.reverse() {
            T::PACKED_ROWS_REVERSE
        } else {
            T::PACKED_ROWS
        };
        let geometry = LaunchGeometry::linear(self.blocks(), ROWS_THREADS)
            .with_shared(packed_shared_bytes(size_of::<T>()));
        Launch::new(
            kernel,
            geometry,
            PackedRowsArgs {
                x,
                y,
                problem,
                options,
                rows_per_block: self.rows_per_block,
            },
        )
    }
}

kernel_args! {
    /// The packed-rows kernel's arguments: `x` scanned into `y` (the same array in
    /// place), both `[outer, scan]`, with the `EXCLUSIVE` option bit, and the rows of
    /// each block.
    pub struct PackedRowsArgs<T> {
        pub x: DevicePtr<T>,
        pub y: DevicePtrMut<T>,
        pub problem: ScanProblem,
        pub options: u32,
        pub rows_per_block: u64,
    }
    impl PackedRowsKernel for f32 {
        const PACKED_ROWS = "scan_packed_rows_f32" => kernel::packed_rows::<f32, { rows_items(4) }, false>, bounds(ROWS_THREADS, 1);
        const PACKED_ROWS_REVERSE = "scan_packed_rows_reverse_f32" => kernel::packed_rows::<f32, { rows_items(4) }, true>, bounds(ROWS_THREADS, 1);
    }
    impl PackedRowsKernel for f64 {
        const PACKED_ROWS = "scan_packed_rows_f64" => kernel::packed_rows::<f64, { rows_items(8) }, false>, bounds(ROWS_THREADS, 1);
        const PACKED_ROWS_REVERSE = "scan_packed_rows_reverse_f64" => kernel::packed_rows::<f64, { rows_items(8) }, true>, bounds(ROWS_THREADS, 1);
    }
    impl PackedRowsKernel for i32 {
        const PACKED_ROWS = "scan_packed_rows_i32" => kernel::packed_rows::<i32, { rows_items(4) }, false>, bounds(ROWS_THREADS, 1);
        const PACKED_ROWS_REVERSE = "scan_packed_rows_reverse_i32" => kernel::packed_rows::<i32, { rows_items(4) }, true>, bounds(ROWS_THREADS, 1);
    }
    impl PackedRowsKernel for i64 {
        const PACKED_ROWS = "scan_packed_rows_i64" => kernel::packed_rows::<i64, { rows_items(8) }, false>, bounds(ROWS_THREADS, 1);
        const PACKED_ROWS_REVERSE = "scan_packed_rows_reverse_i64" => kernel::packed_rows::<i64, { rows_items(8) }, true>, bounds(ROWS_THREADS, 1);
    }
    impl PackedRowsKernel for half::bf16 {
        const PACKED_ROWS = "scan_packed_rows_bf16" => kernel::packed_rows::<half::bf16, { rows_items(2) }, false>, bounds(ROWS_THREADS, PACKED_16_BIT_BLOCKS_PER_SM);
        const PACKED_ROWS_REVERSE = "scan_packed_rows_reverse_bf16" => kernel::packed_rows::<half::bf16, { rows_items(2) }, true>, bounds(ROWS_THREADS, PACKED_16_BIT_BLOCKS_PER_SM);
    }
    impl PackedRowsKernel for half::f16 {
        const PACKED_ROWS = "scan_packed_rows_f16" => kernel::packed_rows::<half::f16, { rows_items(2) }, false>, bounds(ROWS_THREADS, PACKED_16_BIT_BLOCKS_PER_SM);
        const PACKED_ROWS_REVERSE = "scan_packed_rows_reverse_f16" => kernel::packed_rows::<half::f16, { rows_items(2) }, true>, bounds(ROWS_THREADS, PACKED_16_BIT_BLOCKS_PER_SM);
    }
    entry points in ENTRY_POINTS;
}

/// The packed-rows kernel of one element type, forward and reversed.
pub trait PackedRowsKernel: Sized {
    const PACKED_ROWS: Kernel<PackedRowsArgs<Self>>;
    const PACKED_ROWS_REVERSE: Kernel<PackedRowsArgs<Self>>;
}

#[cfg(target_arch = "nvptx64")]
mod kernel {
    use super::*;
    use crate::block::{ScanOp, exclusive_scan};
    use crate::device::{SharedCarver, block_idx_x, lane_id, shared_base, sync_threads, thread_idx_x};
    use crate::scan::EXCLUSIVE;
    use crate::scan::tile::{HeadedSum, ScanValue, Span, WarpRuns, narrow_run, widen_run};

    /// Scans rows `rows_per_block * block ..` (fewer in the last block) as one span of
    /// the flat array, tile by tile: each tile a block scan of head-flagged sums (a
    /// row's first element is a head, where the sum restarts), `ITEMS` consecutive
    /// elements per thread, lane `l` of a warp taking the warp's run `l` (logically:
    /// reversed, physical run `31 - l`), after the carry of the tiles before. Tiles
    /// start at the span's start rounded down to a vector (its end rounded up,
    /// reversed), so loads and stores are 128-bit and consecutive across the lanes
    /// (`WarpRuns`) but for the vectors that the span's ends cut, element by element.
    /// The next tile's loads go out before the current tile's scan.
    ///
    /// # Safety
    /// `x` and `y` hold `outer * scan` elements, 16-byte aligned (they may be the same
    /// array); blocks of `ROWS_THREADS`, as many as cover `outer` rows by
    /// `rows_per_block`, with `packed_shared_bytes` of dynamic shared memory.
    #[inline(always)]
    pub unsafe fn packed_rows<T: ScanValue, const ITEMS: usize, const REVERSE_ORDER: bool>(
        args: PackedRowsArgs<T>,
    ) {
        let (x, y) = (args.x.as_ptr(), args.y.as_mut_ptr());
        let ScanProblem { outer, scan, .. } = args.problem;
        let per_vector = T::PER_VECTOR as u64;
        let vectors = (ITEMS / T::PER_VECTOR) as u32;
        let warp = thread_idx_x() / 32;
        let buffer_bytes = ROWS_WARPS * 32 * vectors as usize * 16;
        let mut carver = SharedCarver::new();
        // SAFETY: packed_shared_bytes covers the warps' buffers, then ROWS_WARPS
        // head-flagged sums.
        let warp_totals: *mut HeadedSum<T::Sum> = unsafe {
            carver.take::<u8>(buffer_bytes);
            carver.take(ROWS_WARPS)
        };
        let buffer = shared_base() + warp * 32 * vectors * 16;
        let first_row = block_idx_x() as u64 * args.rows_per_block;
        let end_row = (first_row + args.rows_per_block).min(outer);
        let span = Span {
            low: first_row * scan,
            len: (end_row - first_row) * scan,
        };
        let high = span.low + span.len;
        // Logical position q lies at physical `origin + q` (`origin - 1 - q` reversed).
        let origin = if REVERSE_ORDER {
            high.next_multiple_of(per_vector)
        } else {
            span.low / per_vector * per_vector
        };
        let covered = if REVERSE_ORDER {
            origin - span.low
        } else {
            high - origin
        };
        let exclusive = args.options & EXCLUSIVE != 0;
        let tile = ITEMS as u64 * ROWS_THREADS as u64;
        let warp_items = 32 * ITEMS as u64;
        // The lane's run, in the warp's physical order.
        let own_run = if REVERSE_ORDER { 31 - lane_id() } else { lane_id() };
        // The warp's runs of the tile from logical `tile_start`.
        let runs = |tile_start: u64| {
            let first = tile_start + warp as u64 * warp_items;
            let start = if REVERSE_ORDER {
                origin.wrapping_sub(first + warp_items)
            } else {
                origin + first
            };
            WarpRuns {
                buffer,
                vectors,
                start,
            }
        };

        // The thread's first head: the index in its run of the first row start at or
        // after its first item (rows start at multiples of `scan`, and end there
        // reversed); the next tile's is `tile` items further. Wrapping arithmetic is
        // right for the runs that hold an element of the span, the only ones whose
        // heads count.
        let first_logical = warp as u64 * warp_items + lane_id() as u64 * ITEMS as u64;
        let mut first_head = if REVERSE_ORDER {
            origin.wrapping_sub(first_logical) % scan
        } else {
            (scan - (origin + first_logical) % scan) % scan
        };
        let tile_in_rows = tile % scan;
        let short_rows = scan < ITEMS as u64;

        let mut carry = T::Sum::identity();
        let mut tile_start = 0;
        let mut current = runs(0);
        // SAFETY: the span's elements lie inside x; the warps' starts are aligned.
        let mut words = unsafe { current.load_span(x, span) };
        while tile_start < covered {
            // The next tile's loads go out before this tile's scan and stores.
            let next_runs = runs(tile_start + tile);
            // SAFETY: as above.
            let next_words = unsafe { next_runs.load_span(x, span) };
            // Bit k set where item k starts a row.
            let heads = if short_rows {
                let mut heads = 0u32;
                let mut k = first_head as u32;
                while k < ITEMS as u32 {
                    heads |= 1 << k;
                    k += scan as u32;
                }
                heads
            } else if first_head < ITEMS as u64 {
                1 << first_head
            } else {
                0
            };
            let is_head = |k: usize| heads & (1 << k) != 0;
            // SAFETY: every lane of every warp calls it; the buffer is the warp's.
            let run_words = unsafe { current.gather(&words, own_run) };
            let mut items = widen_run::<T, ITEMS, REVERSE_ORDER>(&run_words);
            let mut own = HeadedSum::<T::Sum>::identity();
            for (k, &item) in items.iter().enumerate() {
                own = own.combine(HeadedSum {
                    head: is_head(k) as u32,
                    value: item,
                });
            }
            // SAFETY: every thread calls it; the warp totals are this block's.
            let (before, total) = unsafe { exclusive_scan::<_, ROWS_WARPS>(own, warp_totals) };
            let carried = HeadedSum {
                head: 0,
                value: carry,
            };
            let mut running = carried.combine(before).value;
            for (k, item) in items.iter_mut().enumerate() {
                if is_head(k) {
                    running = T::Sum::identity();
                }
                let next = running.combine(*item);
                *item = if exclusive { running } else { next };
                running = next;
            }
            carry = carried.combine(total).value;
            // SAFETY: as `gather`; then the span's elements, inside y.
            unsafe {
                let striped = current.scatter(&narrow_run::<T, ITEMS, REVERSE_ORDER>(&items), own_run);
                current.store_span(y, span, &striped);
            }
            (words, current) = (next_words, next_runs);
            tile_start += tile;
            first_head = if first_head >= tile_in_rows {
                first_head - tile_in_rows
            } else {
                first_head + scan - tile_in_rows
            };
            // SAFETY: every thread reaches it; the next tile rewrites the warp totals.
            unsafe { sync_threads() };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(outer: u64, scan: u64, element_bytes: usize) -> Option<PackedRowsPlan> {
        PackedRowsPlan::new(
            &ScanProblem {
                outer,
                scan,
                inner: 1,
            },
            element_bytes,
        )
    }

    #[test]
    fn blocks_take_about_four_tiles_of_rows_and_fill_the_gpu() {
        // 65536 rows of 4095 f32: 9 rows (36855 elements, 4.5 tiles of 8192) a block.
        let rows = plan(65536, 4095, 4).unwrap();
        assert_eq!((rows.rows_per_block, rows.blocks()), (9, 7282));
        // 2048 rows of 4100: 8 a block would leave 256 blocks; 4 keep 512.
        assert_eq!(plan(2048, 4100, 4).unwrap().rows_per_block, 4);
        // Long rows: one a block.
        assert_eq!(plan(600, 100_001, 2).unwrap().rows_per_block, 1);
        // Rows of 3: 5859 a block keep 512 blocks of 17577 elements.
        assert_eq!(plan(3_000_000, 3, 4).unwrap().rows_per_block, 5859);
        // A tile at most: one block, whatever the rows.
        assert_eq!(
            plan(35, 3, 8).unwrap(),
            PackedRowsPlan {
                rows: 35,
                rows_per_block: 35
            }
        );
        assert_eq!(plan(1, 8192, 4).unwrap().blocks(), 1);
        // Too few rows for 512 blocks of a tile each.
        assert_eq!(plan(1000, 17, 4), None);
        assert_eq!(plan(511, 100_000, 4), None);
        assert_eq!(plan(1, 8193, 4), None);
    }
}
