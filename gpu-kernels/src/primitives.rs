//! The warp and block collectives run alone, one small kernel each, so that tests can
//! check them at awkward sizes (one element, a warp and a bit, partial last tiles)
//! apart from the kernels built on them:
//! - [`GroupSumsArgs`]: `warp::reduce_groups` over aligned groups of lanes;
//! - [`RowScanArgs`]: `block::exclusive_scan` walking rows tile by tile with a carry;
//! - [`ChainScanArgs`]: a flat scan whose tiles chain by decoupled look-back
//!   (`TileChain::look_back_and_share`), packed for 4-byte values and not for 8-byte.
//!
//! Every sum is inclusive and wraps (integers).

use crate::launch::{DevicePtr, DevicePtrMut, Kernel, Launch, LaunchGeometry, kernel_args};
use crate::scan::{LaunchStatus, status_layout};

/// Threads per block of every primitive kernel but the row scan's wide variant.
pub const THREADS: u32 = 32;
/// Threads of the row scan's wide variant: several warps share the block scan.
pub const WIDE_THREADS: u32 = 256;

kernel_args! {
    /// `y[i]` = the sum of `x` over the aligned group of `lanes` lanes (a power of two
    /// up to 32) that holds `i`, elements past `n` counting as zero.
    pub struct GroupSumsArgs<T> {
        pub x: DevicePtr<T>,
        pub y: DevicePtrMut<T>,
        pub n: u64,
        pub lanes: u32,
    }
    impl GroupSumsKernel for i32 {
        const GROUP_SUMS = "primitive_group_sums_i32" => kernel::group_sums::<i32>;
    }
    impl GroupSumsKernel for i64 {
        const GROUP_SUMS = "primitive_group_sums_i64" => kernel::group_sums::<i64>;
    }
    entry points in GROUP_SUMS_ENTRY_POINTS;
}

kernel_args! {
    /// The inclusive scan of each of `rows` rows of `len` elements, one block per row.
    pub struct RowScanArgs<T> {
        pub x: DevicePtr<T>,
        pub y: DevicePtrMut<T>,
        pub len: u64,
    }
    impl RowScanKernel for i64 {
        const ROW_SCAN = "primitive_row_scan_i64" => kernel::row_scan::<i64, 1>;
        const ROW_SCAN_WIDE = "primitive_row_scan_wide_i64" => kernel::row_scan::<i64, { (WIDE_THREADS / 32) as usize }>;
    }
    entry points in ROW_SCAN_ENTRY_POINTS;
}

kernel_args! {
    /// The inclusive scan of `n` elements in tiles of `THREADS`, chained by look-back
    /// through `status` (laid out by `scan::status_layout` for one value per tile).
    pub struct ChainScanArgs<T> {
        pub x: DevicePtr<T>,
        pub y: DevicePtrMut<T>,
        pub n: u64,
        pub status: LaunchStatus<T>,
    }
    impl ChainScanKernel for i32 {
        const CHAIN_SCAN = "primitive_chain_scan_i32" => kernel::chain_scan::<i32>;
    }
    impl ChainScanKernel for i64 {
        const CHAIN_SCAN = "primitive_chain_scan_i64" => kernel::chain_scan::<i64>;
    }
    entry points in CHAIN_SCAN_ENTRY_POINTS;
}

/// The group-sums kernel of one element type.
pub trait GroupSumsKernel: Sized {
    const GROUP_SUMS: Kernel<GroupSumsArgs<Self>>;
}

/// The row-scan kernel of one element type: one warp, or `WIDE_THREADS` threads.
pub trait RowScanKernel: Sized {
    const ROW_SCAN: Kernel<RowScanArgs<Self>>;
    const ROW_SCAN_WIDE: Kernel<RowScanArgs<Self>>;
}

/// The chained-scan kernel of one element type.
pub trait ChainScanKernel: Sized {
    const CHAIN_SCAN: Kernel<ChainScanArgs<Self>>;
}

/// Every primitive entry point.
pub const ENTRY_POINTS: &[&[crate::launch::EntryPoint]] = &[
    GROUP_SUMS_ENTRY_POINTS,
    ROW_SCAN_ENTRY_POINTS,
    CHAIN_SCAN_ENTRY_POINTS,
];

/// The group sums of `args.n` elements: whole warps, the lanes past `n` idle.
pub const fn group_sums<T: GroupSumsKernel>(args: GroupSumsArgs<T>) -> Launch<GroupSumsArgs<T>> {
    Launch::new(T::GROUP_SUMS, LaunchGeometry::per_item(args.n, THREADS), args)
}

/// The scan of `rows` rows of `args.len`, by blocks of one warp or of `WIDE_THREADS`.
pub const fn row_scan<T: RowScanKernel>(
    args: RowScanArgs<T>,
    rows: u64,
    wide: bool,
) -> Launch<RowScanArgs<T>> {
    let (kernel, threads) = if wide {
        (T::ROW_SCAN_WIDE, WIDE_THREADS)
    } else {
        (T::ROW_SCAN, THREADS)
    };
    Launch::new(
        kernel,
        LaunchGeometry::linear(rows, threads).with_shared(8 * 32),
        args,
    )
}

/// Tiles of the chained scan of `n` elements.
pub const fn chain_tiles(n: u64) -> u64 {
    n.div_ceil(THREADS as u64)
}

/// The scratch of the chained scan of `n` `element_bytes`-byte elements.
pub const fn chain_scratch(n: u64, element_bytes: usize) -> crate::launch::ScratchLayout {
    status_layout(chain_tiles(n), 1, element_bytes)
}

/// The chained scan of `n` elements, its status in `scratch` (laid out and zeroed as
/// [`chain_scratch`] says).
pub fn chain_scan<T: ChainScanKernel>(
    x: DevicePtr<T>,
    y: DevicePtrMut<T>,
    n: u64,
    scratch: DevicePtrMut<u8>,
) -> Launch<ChainScanArgs<T>> {
    let tiles = chain_tiles(n);
    let status = LaunchStatus::in_scratch(scratch, tiles, 1);
    let geometry = LaunchGeometry::linear(tiles, THREADS).with_shared(crate::scan::SHARED_BYTES);
    Launch::new(T::CHAIN_SCAN, geometry, ChainScanArgs { x, y, n, status })
}

#[cfg(target_arch = "nvptx64")]
mod kernel {
    use super::*;
    use crate::block::{AGGREGATE, INCLUSIVE, TileChain, exclusive_scan};
    use crate::device::{SharedCarver, block_dim_x, block_idx_x, sync_threads, thread_idx_x};
    use crate::scan::LOOK_BACK_WINDOW;
    use crate::scan::tile::{ScanSum, Shared};
    use crate::warp;

    /// # Safety
    /// `x` and `y` hold `n` elements; the grid covers `n` threads in whole warps.
    #[inline(always)]
    pub unsafe fn group_sums<T: ScanSum>(args: GroupSumsArgs<T>) {
        let i = block_idx_x() as u64 * block_dim_x() as u64 + thread_idx_x() as u64;
        let value = if i < args.n {
            // SAFETY: i < n.
            unsafe { *args.x.as_ptr().add(i as usize) }
        } else {
            T::identity()
        };
        let sum = warp::reduce_groups(value, args.lanes, T::combine);
        if i < args.n {
            // SAFETY: i < n.
            unsafe { *args.y.as_mut_ptr().add(i as usize) = sum };
        }
    }

    /// # Safety
    /// `x` and `y` hold `rows * len` elements; one block of `WARPS * 32` threads per row
    /// with `WARPS` values of shared memory.
    #[inline(always)]
    pub unsafe fn row_scan<T: ScanSum, const WARPS: usize>(args: RowScanArgs<T>) {
        // SAFETY: the launch gives 8 bytes per warp.
        let warp_totals: *mut T = unsafe { SharedCarver::new().take(WARPS) };
        let base = block_idx_x() as u64 * args.len;
        let mut carry = T::identity();
        let mut start = 0;
        while start < args.len {
            let i = start + thread_idx_x() as u64;
            let value = if i < args.len {
                // SAFETY: inside the row.
                unsafe { *args.x.as_ptr().add((base + i) as usize) }
            } else {
                T::identity()
            };
            // SAFETY: every thread calls it; the warp totals are this block's.
            let (before, total) = unsafe { exclusive_scan::<T, WARPS>(value, warp_totals) };
            if i < args.len {
                // SAFETY: inside the row.
                unsafe {
                    *args.y.as_mut_ptr().add((base + i) as usize) = carry.combine(before).combine(value)
                };
            }
            carry = carry.combine(total);
            start += block_dim_x() as u64;
            // SAFETY: every thread reaches it; the next tile rewrites the warp totals.
            unsafe { sync_threads() };
        }
    }

    /// # Safety
    /// `x` and `y` hold `n` elements; the status is laid out for `chain_tiles(n)` tiles
    /// and zeroed; the grid has that many blocks of `THREADS` threads with
    /// `SHARED_BYTES` of dynamic shared memory.
    #[inline(always)]
    pub unsafe fn chain_scan<T: ScanSum>(args: ChainScanArgs<T>) {
        let shared = Shared::<T>::carve();
        let chain = T::chain(&args.status);
        // SAFETY: every thread calls it; the counter heads the status.
        let tile = unsafe { shared.next_tile(args.status.counter()) };
        let i = tile * THREADS as u64 + thread_idx_x() as u64;
        let value = if i < args.n {
            // SAFETY: i < n.
            unsafe { *args.x.as_ptr().add(i as usize) }
        } else {
            T::identity()
        };
        // SAFETY: every thread calls it; the warp totals are this block's.
        let (before, total) = unsafe { exclusive_scan::<T, 1>(value, shared.warp_totals as *mut T) };
        if thread_idx_x() == 0 {
            let flag = if tile == 0 { INCLUSIVE } else { AGGREGATE };
            // SAFETY: this tile's status.
            unsafe { chain.publish(tile, total, flag) };
        }
        if tile > 0 {
            // SAFETY: the whole warp (the block); tile 0 publishes its inclusive prefix
            // without waiting; the prefix is read after the barrier below.
            unsafe { chain.look_back_and_share::<LOOK_BACK_WINDOW>(tile, total, false, shared.prefix) };
        }
        // SAFETY: every thread reaches it; the prefix was written before it.
        let prefix = unsafe {
            sync_threads();
            if tile > 0 { *shared.prefix } else { T::identity() }
        };
        if i < args.n {
            // SAFETY: i < n.
            unsafe { *args.y.as_mut_ptr().add(i as usize) = prefix.combine(before).combine(value) };
        }
    }
}
