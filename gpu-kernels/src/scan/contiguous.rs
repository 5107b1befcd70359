//! The contiguous kernel: the rows of `[outer, scan]` laid end to end as one flat
//! sequence of tiles chained by decoupled look-back; a row's first element starts a new
//! chain, so one tile may hold the ends of several short rows, and a long row spans
//! many tiles.

use super::{BLOCK_THREADS, LaunchStatus, SHARED_BYTES, ScanOperands, ScanProblem, layout_variant};
use crate::element::{Sum, Summed};
use crate::launch::{DevicePtr, DevicePtrMut, Kernel, Launch, LaunchGeometry, kernel_args};

/// Blocks of the vector contiguous kernel of 4- and 8-byte types resident on one SM (64
/// registers a thread): each block waits on its look-back once, and more blocks keep
/// loads in flight meanwhile (65536 rows of 4095 f32 on the H100: 1.51 ms with three,
/// 1.36 with four). The 16-bit runs and the scalar runs would spill at 64.
pub const CONTIGUOUS_BLOCKS_PER_SM: u32 = 4;

/// Rows that fill no GPU alone: tiles of `BLOCK_THREADS` runs of consecutive elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContiguousPlan {
    pub tiles: u64,
    /// Whether the flat length is a multiple of a 128-bit vector: every whole run is
    /// then 16-byte aligned, forward or reversed (128-bit loads and stores).
    pub vector: bool,
}

kernel_args! {
    /// The contiguous kernel's arguments: the scan operands and the look-back status
    /// of `tiles` tiles.
    pub struct ContiguousArgs<T: Summed> {
        pub x: DevicePtr<T>,
        pub y: DevicePtrMut<T>,
        pub problem: ScanProblem,
        pub options: u32,
        pub status: LaunchStatus<Sum<T>>,
    }
    impl ContiguousKernel for f32 {
        const CONTIGUOUS = "scan_contiguous_f32" => kernel::contiguous::<f32, { super::items_per_thread(4) }, false, false>;
        const CONTIGUOUS_REVERSE = "scan_contiguous_reverse_f32" => kernel::contiguous::<f32, { super::items_per_thread(4) }, false, true>;
        const CONTIGUOUS_VECTOR = "scan_contiguous_vector_f32" => kernel::contiguous::<f32, { super::items_per_thread(4) }, true, false>, bounds(BLOCK_THREADS, CONTIGUOUS_BLOCKS_PER_SM);
        const CONTIGUOUS_VECTOR_REVERSE = "scan_contiguous_vector_reverse_f32" => kernel::contiguous::<f32, { super::items_per_thread(4) }, true, true>, bounds(BLOCK_THREADS, CONTIGUOUS_BLOCKS_PER_SM);
    }
    impl ContiguousKernel for f64 {
        const CONTIGUOUS = "scan_contiguous_f64" => kernel::contiguous::<f64, { super::items_per_thread(8) }, false, false>;
        const CONTIGUOUS_REVERSE = "scan_contiguous_reverse_f64" => kernel::contiguous::<f64, { super::items_per_thread(8) }, false, true>;
        const CONTIGUOUS_VECTOR = "scan_contiguous_vector_f64" => kernel::contiguous::<f64, { super::items_per_thread(8) }, true, false>, bounds(BLOCK_THREADS, CONTIGUOUS_BLOCKS_PER_SM);
        const CONTIGUOUS_VECTOR_REVERSE = "scan_contiguous_vector_reverse_f64" => kernel::contiguous::<f64, { super::items_per_thread(8) }, true, true>, bounds(BLOCK_THREADS, CONTIGUOUS_BLOCKS_PER_SM);
    }
    impl ContiguousKernel for i32 {
        const CONTIGUOUS = "scan_contiguous_i32" => kernel::contiguous::<i32, { super::items_per_thread(4) }, false, false>;
        const CONTIGUOUS_REVERSE = "scan_contiguous_reverse_i32" => kernel::contiguous::<i32, { super::items_per_thread(4) }, false, true>;
        const CONTIGUOUS_VECTOR = "scan_contiguous_vector_i32" => kernel::contiguous::<i32, { super::items_per_thread(4) }, true, false>, bounds(BLOCK_THREADS, CONTIGUOUS_BLOCKS_PER_SM);
        const CONTIGUOUS_VECTOR_REVERSE = "scan_contiguous_vector_reverse_i32" => kernel::contiguous::<i32, { super::items_per_thread(4) }, true, true>, bounds(BLOCK_THREADS, CONTIGUOUS_BLOCKS_PER_SM);
    }
    impl ContiguousKernel for i64 {
        const CONTIGUOUS = "scan_contiguous_i64" => kernel::contiguous::<i64, { super::items_per_thread(8) }, false, false>;
        const CONTIGUOUS_REVERSE = "scan_contiguous_reverse_i64" => kernel::contiguous::<i64, { super::items_per_thread(8) }, false, true>;
        const CONTIGUOUS_VECTOR = "scan_contiguous_vector_i64" => kernel::contiguous::<i64, { super::items_per_thread(8) }, true, false>, bounds(BLOCK_THREADS, CONTIGUOUS_BLOCKS_PER_SM);
        const CONTIGUOUS_VECTOR_REVERSE = "scan_contiguous_vector_reverse_i64" => kernel::contiguous::<i64, { super::items_per_thread(8) }, true, true>, bounds(BLOCK_THREADS, CONTIGUOUS_BLOCKS_PER_SM);
    }
    impl ContiguousKernel for half::bf16 {
        const CONTIGUOUS = "scan_contiguous_bf16" => kernel::contiguous::<half::bf16, { super::items_per_thread(2) }, false, false>;
        const CONTIGUOUS_REVERSE = "scan_contiguous_reverse_bf16" => kernel::contiguous::<half::bf16, { super::items_per_thread(2) }, false, true>;
        const CONTIGUOUS_VECTOR = "scan_contiguous_vector_bf16" => kernel::contiguous::<half::bf16, { super::items_per_thread(2) }, true, false>;
        const CONTIGUOUS_VECTOR_REVERSE = "scan_contiguous_vector_reverse_bf16" => kernel::contiguous::<half::bf16, { super::items_per_thread(2) }, true, true>;
    }
    impl ContiguousKernel for half::f16 {
        const CONTIGUOUS = "scan_contiguous_f16" => kernel::contiguous::<half::f16, { super::items_per_thread(2) }, false, false>;
        const CONTIGUOUS_REVERSE = "scan_contiguous_reverse_f16" => kernel::contiguous::<half::f16, { super::items_per_thread(2) }, false, true>;
        const CONTIGUOUS_VECTOR = "scan_contiguous_vector_f16" => kernel::contiguous::<half::f16, { super::items_per_thread(2) }, true, false>;
        const CONTIGUOUS_VECTOR_REVERSE = "scan_contiguous_vector_reverse_f16" => kernel::contiguous::<half::f16, { super::items_per_thread(2) }, true, true>;
    }
    entry points in ENTRY_POINTS;
}

/// The contiguous kernel of one element type: scalar or 128-bit runs, forward or
/// reversed (each its own entry point, so that each gets its own register budget).
pub trait ContiguousKernel: Summed {
    const CONTIGUOUS: Kernel<ContiguousArgs<Self>>;
    const CONTIGUOUS_REVERSE: Kernel<ContiguousArgs<Self>>;
    const CONTIGUOUS_VECTOR: Kernel<ContiguousArgs<Self>>;
    const CONTIGUOUS_VECTOR_REVERSE: Kernel<ContiguousArgs<Self>>;
}

impl ContiguousPlan {
    /// The launch of the scan, with its look-back status in `scratch`, laid out and
    /// zeroed as `ScanPlan::scratch` says.
    pub fn launch<T: ContiguousKernel>(
        &self,
        operands: ScanOperands<T>,
        scratch: DevicePtrMut<u8>,
    ) -> Launch<ContiguousArgs<T>> {
        let (x, y, problem, options) = operands.parts();
        let status = LaunchStatus::in_scratch(scratch, self.tiles, 1);
        let kernels = [
            T::CONTIGUOUS,
            T::CONTIGUOUS_REVERSE,
            T::CONTIGUOUS_VECTOR,
            T::CONTIGUOUS_VECTOR_REVERSE,
        ];
        let kernel = layout_variant(kernels, self.vector, operands.reverse());
        let geometry = LaunchGeometry::linear(self.tiles, BLOCK_THREADS).with_shared(SHARED_BYTES);
        Launch::new(
            kernel,
            geometry,
            ContiguousArgs {
                x,
                y,
                problem,
                options,
                status,
            },
        )
    }
}

#[cfg(target_arch = "nvptx64")]
mod kernel {
    use super::*;
    use crate::block::{AGGREGATE, INCLUSIVE, ScanOp, TileChain, exclusive_scan};
    use crate::device::{block_dim_x, sync_threads, thread_idx_x};
    use crate::scan::tile::{
        HeadedSum, ScanSum, ScanValue, Shared, load_run, narrow_run, store_run, widen_run, zero,
    };
    use crate::scan::{EXCLUSIVE, LOOK_BACK_WINDOW, WARPS};

    /// Scans the rows of `[outer, scan]` laid end to end; one tile per block.
    ///
    /// # Safety
    /// `x` and `y` hold `outer * scan` elements, 16-byte aligned (they may be the same
    /// array); `VECTOR` only when `outer * scan` is a multiple of `PER_VECTOR`; the status holds
    /// `tiles` zeroed words (packed) or flags and values after a zero counter; the grid
    /// has `tiles` blocks of `BLOCK_THREADS` threads with `SHARED_BYTES` of dynamic
    /// shared memory.
    #[inline(always)]
    pub unsafe fn contiguous<
        T: ScanValue,
        const ITEMS: usize,
        const VECTOR: bool,
        const REVERSE_ORDER: bool,
    >(
        args: ContiguousArgs<T>,
    ) {
        let ContiguousArgs {
            problem,
            options,
            status,
            ..
        } = args;
        let (x, y) = (args.x.as_ptr(), args.y.as_mut_ptr());
        let shared = Shared::<T::Sum>::carve();
        let chain = T::Sum::chain(&status);
        // SAFETY: every thread calls it; the counter heads the status.
        let tile = unsafe { shared.next_tile(status.counter()) };
        let n = problem.outer * problem.scan;
        let reverse = REVERSE_ORDER;
        let first = tile * (ITEMS as u64 * block_dim_x() as u64) + thread_idx_x() as u64 * ITEMS as u64;
        // Logical position q lives at physical `reverse ? n - 1 - q : q`.
        let physical = |q: u64| if reverse { n - 1 - q } else { q };

        // Physical start of this thread's run when it is whole and vectorized (aligned:
        // ITEMS and n are multiples of PER_VECTOR).
        let vector_start = (VECTOR && first + ITEMS as u64 <= n)
            .then(|| if reverse { n - first - ITEMS as u64 } else { first });
        let mut items = match vector_start {
            // SAFETY: the run lies inside x and is 16-byte aligned.
            Some(start) => widen_run::<T, ITEMS, REVERSE_ORDER>(&unsafe { load_run::<T, ITEMS>(x, start) }),
            None => {
                let mut loaded = [zero::<T>(); ITEMS];
                for (k, item) in loaded.iter_mut().enumerate() {
                    if first + (k as u64) < n {
                        // SAFETY: the position is below n.
                        *item = unsafe { *x.add(physical(first + k as u64) as usize) };
                    }
                }
                loaded.map(|item| item.widen_apart())
            }
        };

        // Heads: logical positions that start a row. The first head among this thread's
        // items, then one every `scan` items (one 64-bit division per thread; 32-bit
        // tests per item).
        let offset_in_row = first % problem.scan;
        let first_head = if offset_in_row == 0 {
            0
        } else {
            problem.scan - offset_in_row
        };
        let short_rows = problem.scan < ITEMS as u64;
        let is_head = |k: usize| {
            let k = k as u64;
            if short_rows {
                k >= first_head && ((k - first_head) as u32).is_multiple_of(problem.scan as u32)
            } else {
                k == first_head
            }
        };
        let mut own = HeadedSum::<T::Sum>::identity();
        for (k, &item) in items.iter().enumerate() {
            own = own.combine(HeadedSum {
                head: is_head(k) as u32,
                value: item,
            });
        }
        // SAFETY: every thread calls it; the warp totals are this block's.
        let (before, total) = unsafe { exclusive_scan::<_, WARPS>(own, shared.warp_totals) };

        // A tile holding a row start knows its inclusive prefix at once; a tile whose
        // first element continues a row needs the prefix of the tiles before it.
        let first_of_tile = tile * ITEMS as u64 * block_dim_x() as u64;
        let needs_prefix = !first_of_tile.is_multiple_of(problem.scan);
        let thread = thread_idx_x();
        if thread == 0 {
            let flag = if total.head != 0 { INCLUSIVE } else { AGGREGATE };
            // SAFETY: this tile's status.
            unsafe { chain.publish(tile, total.value, flag) };
        }
        if needs_prefix && thread < 32 {
            // SAFETY: warp 0 entire; tile > 0 (tile 0 starts a row), and the chain ends
            // at the latest tile holding a row start, which never waits; the prefix slot
            // is read after the barrier below.
            unsafe {
                chain.look_back_and_share::<LOOK_BACK_WINDOW>(
                    tile,
                    total.value,
                    total.head != 0,
                    shared.prefix,
                )
            };
        }
        // SAFETY: every thread reaches the barrier; the prefix was written before it.
        let tile_prefix = unsafe {
            sync_threads();
            if needs_prefix {
                *shared.prefix
            } else {
                T::Sum::identity()
            }
        };

        let mut running = HeadedSum {
            head: 0,
            value: tile_prefix,
        }
        .combine(before)
        .value;
        let exclusive = options & EXCLUSIVE != 0;
        for (k, item) in items.iter_mut().enumerate() {
            if is_head(k) {
                running = T::Sum::identity();
            }
            let next = running.combine(*item);
            *item = if exclusive { running } else { next };
            running = next;
        }

        if let Some(start) = vector_start {
            // SAFETY: the run lies inside y and is 16-byte aligned.
            unsafe { store_run::<T, ITEMS>(y, start, &narrow_run::<T, ITEMS, REVERSE_ORDER>(&items)) };
        } else {
            for (k, &item) in items.iter().enumerate() {
                if first + (k as u64) < n {
                    // SAFETY: the position is below n.
                    unsafe { *y.add(physical(first + k as u64) as usize) = T::narrow(item) };
                }
            }
        }
    }
}
