//! Cumulative sum along one axis, exclusive (`y[i] = x[0] + ... + x[i-1]`, `y[0] = 0`)
//! or inclusive, forward or reversed, in one pass that reads the input once and writes
//! the output once (in place allowed).
//!
//! The array is seen as `[outer, scan, inner]`. Six kernels, one file each, chosen by
//! [`plan`]. Three need no look-back:
//! - [`rows`] (`inner == 1`, at least `ROWS_PLAN_MIN_ROWS` rows of whole 128-bit runs, a
//!   tile or longer): a block per `ROWS_PER_BLOCK` rows walks them tile by tile with a
//!   carry, the next tile's loads in flight during the current one's scan;
//! - [`packed_rows`] (other `inner == 1` with enough rows for hundreds of blocks of a
//!   tile's work or more, or of one tile in all): as rows, a block per few rows walking
//!   them as one flat span, the sum restarting at each row's first element;
//! - [`columns`] (`inner > 1`, at least `COLUMNS_PLAN_MIN_COLUMNS` columns, the `outer *
//!   inner` lanes of the scan): each column walked whole with a running sum by `parts`
//!   threads of one block, each taking its part of every batch of rows, with the next
//!   batch's loads in flight during the current batch's scan.
//!
//! The other three cut the work into tiles that take their ids from a counter in
//! launch order and chain their prefixes by decoupled look-back (`block::TileChain`,
//! one 64-bit word per tile for 4-byte values), so any shape fills the GPU:
//! - [`segments`] (other `inner == 1`, rows of at least `segment_items`): each row cut into
//!   segments of one run per thread; persistent blocks, one per SM, take segment after
//!   segment through shared-memory stages: bulk copies (sm_90) bring the next segments
//!   in and take finished ones out while the block scans the current one from shared
//!   memory and looks back once for its prefix within the row;
//! - [`contiguous`] (other `inner == 1`: few short rows): the rows laid end to end as
//!   one flat sequence of tiles; each thread holds consecutive elements (128-bit loads
//!   when rows keep 16-byte alignment); a new row starts a new chain, so one tile may
//!   hold the ends of several short rows, and a long row spans many tiles;
//! - [`strided`] (other `inner > 1`): one thread per column, tiles of `BLOCK_THREADS`
//!   columns by `rows` rows; the look-back runs down each column block, one running
//!   sum per column.
//!
//! Reversal maps logical position `q` to `len - 1 - q` (flat for contiguous, per
//! column for columns and strided).
//!
//! A device group's scan along the split axis starts each shard at the totals of the
//! shards before it: the columns kernel takes a range of columns with carries in and
//! out (a pipeline over column chunks), the segments kernel rows' carries after
//! [`totals`] summed the shards before, and otherwise [`carry`] adds them in a second
//! pass.

pub mod carry;
pub mod columns;
pub mod contiguous;
pub mod packed_rows;
pub mod rows;
pub mod segments;
pub mod strided;
#[cfg(target_arch = "nvptx64")]
pub(crate) mod tile;
pub mod totals;

use crate::element::sum_bytes;
use crate::launch::{DeviceLimits, DevicePtr, DevicePtrMut, EntryPoint, ScratchLayout};
use columns::{COLUMNS_PLAN_MIN_COLUMNS, ColumnsKernel, ColumnsPlan};
use contiguous::{ContiguousKernel, ContiguousPlan};
use packed_rows::{PackedRowsKernel, PackedRowsPlan};
use rows::{ROWS_PLAN_MIN_ROWS, RowsKernel, RowsPlan, rows_items};
use segments::{SEGMENT_MIN_STAGES, SegmentsKernel, SegmentsPlan};
use strided::{StridedKernel, StridedPlan};

/// Threads per block of the look-back kernels and of the columns kernel.
pub const BLOCK_THREADS: u32 = 256;
/// Warps per look-back block.
pub const WARPS: usize = (BLOCK_THREADS / 32) as usize;
/// Dynamic shared memory of the look-back kernels: the tile id, the tile prefix and the
/// warp totals of the block scan (head flag + value), with padding.
pub const SHARED_BYTES: u32 = 64 + (WARPS as u32) * 16;
/// Predecessors each lane of a one-value-per-tile look-back examines per step (a
/// window of 32 times as many tiles).
pub const LOOK_BACK_WINDOW: usize = 4;

/// 128-bit vectors each thread of the rows and contiguous kernels holds: of elements
/// (contiguous), or of their sums (rows).
pub const VECTORS_PER_THREAD: usize = 4;

const _: () = assert!(BLOCK_THREADS.is_multiple_of(32) && SHARED_BYTES.is_multiple_of(16));

/// Elements each thread of the contiguous kernel holds.
pub const fn items_per_thread(element_bytes: usize) -> usize {
    VECTORS_PER_THREAD * 16 / element_bytes
}

/// Elements of one contiguous tile.
pub const fn tile_items(element_bytes: usize) -> u64 {
    BLOCK_THREADS as u64 * items_per_thread(element_bytes) as u64
}

/// Option bit: exclusive (else inclusive).
pub const EXCLUSIVE: u32 = 1;
/// Option bit: scan from the end.
pub const REVERSE: u32 = 2;

/// The array as `[outer, scan, inner]`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanProblem {
    pub outer: u64,
    pub scan: u64,
    pub inner: u64,
}

impl ScanProblem {
    /// Elements of the array.
    pub const fn elements(&self) -> u64 {
        self.outer * self.scan * self.inner
    }

    /// Lanes scanned across the axis: `outer * inner`.
    pub const fn columns(&self) -> u64 {
        self.outer * self.inner
    }
}

/// What every scan kernel takes: the input, the output (the input itself when in
/// place), the problem and the option bits.
#[derive(Debug, Clone, Copy)]
pub struct ScanOperands<T> {
    pub x: DevicePtr<T>,
    pub y: DevicePtrMut<T>,
    pub problem: ScanProblem,
    pub options: u32,
}

impl<T> ScanOperands<T> {
    pub const fn reverse(&self) -> bool {
        self.options & REVERSE != 0
    }

    /// The input, the output, the problem and the options, in the order every scan
    /// kernel's arguments start with.
    pub const fn parts(&self) -> (DevicePtr<T>, DevicePtrMut<T>, ScanProblem, u32) {
        (self.x, self.y, self.problem, self.options)
    }
}

/// Of a look-back kernel's entry points `[scalar, reversed, vector, vector reversed]`,
/// the one for vector runs or not, forward or reversed.
pub const fn layout_variant<K: Copy>(kernels: [K; 4], vector: bool, reverse: bool) -> K {
    match (vector, reverse) {
        (false, false) => kernels[0],
        (false, true) => kernels[1],
        (true, false) => kernels[2],
        (true, true) => kernels[3],
    }
}

/// An element type of the scans: every scan entry point exists for it.
/// Sums are kept in [`Sum<T>`](crate::element::Sum): f32 for the 16-bit floats, each
/// output rounded once.
pub trait ScanType:
    RowsKernel
    + PackedRowsKernel
    + ContiguousKernel
    + SegmentsKernel
    + ColumnsKernel
    + StridedKernel
    + carry::CarryKernel
    + totals::TotalsKernel
{
}

impl ScanType for f32 {}
impl ScanType for f64 {}
impl ScanType for i32 {}
impl ScanType for i64 {}
impl ScanType for half::bf16 {}
impl ScanType for half::f16 {}

/// Every scan entry point.
pub const ENTRY_POINTS: &[&[EntryPoint]] = &[
    carry::ENTRY_POINTS,
    rows::ENTRY_POINTS,
    packed_rows::ENTRY_POINTS,
    columns::ENTRY_POINTS,
    contiguous::ENTRY_POINTS,
    segments::ENTRY_POINTS,
    strided::ENTRY_POINTS,
    totals::ENTRY_POINTS,
];

/// Which kernel runs a scan, and its geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanPlan {
    Rows(RowsPlan),
    PackedRows(PackedRowsPlan),
    Contiguous(ContiguousPlan),
    Segments(SegmentsPlan),
    Columns(ColumnsPlan),
    Strided(StridedPlan),
}

impl ScanPlan {
    /// Tiles: one block each, except segments, which persistent blocks share, rows and
    /// packed rows, a row each (a block takes several), and columns, a block per group
    /// of columns.
    pub const fn tiles(&self) -> u64 {
        match self {
            ScanPlan::Rows(p) => p.rows,
            ScanPlan::PackedRows(p) => p.rows,
            ScanPlan::Contiguous(p) => p.tiles,
            ScanPlan::Segments(p) => p.tiles,
            ScanPlan::Columns(p) => p.column_blocks,
            ScanPlan::Strided(p) => p.column_blocks * p.chunks,
        }
    }

    /// The scratch memory of the launch: the look-back kernels' status, of sums of
    /// `element_bytes`-byte elements.
    pub const fn scratch(&self, element_bytes: usize) -> ScratchLayout {
        let element_bytes = sum_bytes(element_bytes);
        match self {
            ScanPlan::Rows(_) | ScanPlan::PackedRows(_) | ScanPlan::Columns(_) => {
                ScratchLayout { bytes: 0, zeroed: 0 }
            }
            ScanPlan::Contiguous(p) => status_layout(p.tiles, 1, element_bytes),
            ScanPlan::Segments(p) => status_layout(p.tiles, 1, element_bytes),
            ScanPlan::Strided(p) => status_layout(p.column_blocks * p.chunks, BLOCK_THREADS, element_bytes),
        }
    }
}

/// The plan for a non-empty problem of `element_bytes`-byte elements.
pub const fn plan(problem: &ScanProblem, element_bytes: usize, device: &DeviceLimits) -> ScanPlan {
    let per_vector = (16 / element_bytes) as u64;
    let aligned = problem.scan.is_multiple_of(per_vector);
    let whole_runs = problem.scan.is_multiple_of(rows_items(element_bytes) as u64);
    let long = problem.scan >= tile_items(element_bytes);
    let stages = segments::stages(device.max_shared_bytes_per_block);
    if problem.inner == 1 && whole_runs && long && problem.outer >= ROWS_PLAN_MIN_ROWS {
        ScanPlan::Rows(RowsPlan { rows: problem.outer })
    } else if let Some(packed) = PackedRowsPlan::new(problem, element_bytes) {
        ScanPlan::PackedRows(packed)
    } else if problem.inner == 1
        && problem.scan >= segments::segment_items(element_bytes, aligned)
        && stages >= SEGMENT_MIN_STAGES
    {
        let tiles = problem.outer
            * problem
                .scan
                .div_ceil(segments::segment_items(element_bytes, aligned));
        ScanPlan::Segments(SegmentsPlan::new(tiles, aligned, stages, device.multiprocessors))
    } else if problem.inner == 1 {
        // Runs start at multiples of a run in the flat array, so they are 16-byte
        // aligned forward whatever the rows' length, and reversed when the flat length
        // is a multiple of a vector (65536 rows of 4095 f32 on the H100: 3.48 ms with
        // scalar loads).
        ScanPlan::Contiguous(ContiguousPlan {
            tiles: problem.elements().div_ceil(tile_items(element_bytes)),
            vector: problem.elements().is_multiple_of(per_vector),
        })
    } else if problem.columns() >= COLUMNS_PLAN_MIN_COLUMNS {
        ScanPlan::Columns(ColumnsPlan::new(problem, element_bytes))
    } else {
        ScanPlan::Strided(StridedPlan {
            column_blocks: problem.columns().div_ceil(BLOCK_THREADS as u64),
            chunks: problem.scan.div_ceil(strided::rows_per_tile(element_bytes)),
        })
    }
}

/// Whether a look-back status packs each tile's flag and value into one 64-bit word:
/// one value per tile, of 4 bytes.
pub const fn packed_status(width: u32, element_bytes: usize) -> bool {
    width == 1 && element_bytes == 4
}

/// The look-back status of `tiles` tiles of `width` values each: packed, the counter,
/// 4 bytes of padding and one word per tile, all zeroed; else the counter and a flag
/// per tile (zeroed), then the aggregates and the inclusive prefixes, each
/// 256-byte aligned.
pub const fn status_layout(tiles: u64, width: u32, element_bytes: usize) -> ScratchLayout {
    let (flags, values) = status_parts(tiles, width, element_bytes);
    if packed_status(width, element_bytes) {
        let bytes = 8 * (tiles + 1);
        ScratchLayout { bytes, zeroed: bytes }
    } else {
        ScratchLayout {
            bytes: flags + 2 * values,
            zeroed: flags,
        }
    }
}

/// Bytes of the counter and flags, and of one value array, of an unpacked status.
const fn status_parts(tiles: u64, width: u32, element_bytes: usize) -> (u64, u64) {
    (
        (4 * (tiles + 1)).next_multiple_of(256),
        (tiles * width as u64 * element_bytes as u64).next_multiple_of(256),
    )
}

/// A look-back launch's status, as the kernels take it, in a scratch buffer laid out by
/// [`status_layout`]. The value pointers are unused when the status is packed.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct LaunchStatus<T> {
    /// `[counter, flag per tile...]`, or `[counter, padding, word per tile...]` packed.
    pub counter_and_flags: DevicePtrMut<u32>,
    pub aggregates: DevicePtrMut<T>,
    pub inclusives: DevicePtrMut<T>,
}

impl<T> LaunchStatus<T> {
    /// The status of `tiles` tiles of `width` values in `scratch`.
    pub fn in_scratch(scratch: DevicePtrMut<u8>, tiles: u64, width: u32) -> Self {
        let (flags, values) = status_parts(tiles, width, size_of::<T>());
        let packed = packed_status(width, size_of::<T>());
        let value_array = |offset: u64| {
            if packed {
                DevicePtrMut::NULL
            } else {
                scratch.offset(offset).cast()
            }
        };
        Self {
            counter_and_flags: scratch.cast(),
            aggregates: value_array(flags),
            inclusives: value_array(flags + values),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::launch::H100;

    fn plan_of(outer: u64, scan: u64, inner: u64, element_bytes: usize, device: &DeviceLimits) -> ScanPlan {
        plan(&ScanProblem { outer, scan, inner }, element_bytes, device)
    }

    #[test]
    fn the_shape_picks_the_kernel() {
        assert_eq!(
            plan_of(32768, 32768, 1, 4, &H100),
            ScanPlan::Rows(RowsPlan { rows: 32768 })
        );
        // Rows of any length, enough of them for 512 blocks of a tile's work: packed.
        assert_eq!(
            plan_of(2048, 4100, 1, 4, &H100),
            ScanPlan::PackedRows(PackedRowsPlan {
                rows: 2048,
                rows_per_block: 4
            })
        );
        assert_eq!(
            plan_of(65536, 4095, 1, 4, &H100),
            ScanPlan::PackedRows(PackedRowsPlan {
                rows: 65536,
                rows_per_block: 9
            })
        );
        assert!(matches!(
            plan_of(600, 100_001, 1, 2, &H100),
            ScanPlan::PackedRows(_)
        ));
        // 2^28 in segments of SEGMENT_THREADS runs of 48 elements, three 72 KiB stages,
        // a block per SM.
        let ScanPlan::Segments(segments) = plan_of(1, 1 << 28, 1, 4, &H100) else {
            panic!("2^28 takes the segments kernel");
        };
        assert_eq!(
            (segments.tiles, segments.vector, segments.stages, segments.blocks),
            ((1u64 << 28).div_ceil(384 * 48), true, 3, 132)
        );
        // Unaligned rows: odd runs of 47; two stages where a block has 163 KiB (A100);
        // one would fit 99 KiB, but overlaps no copy with the scan: the contiguous
        // kernel takes the rows.
        let a100 = DeviceLimits {
            multiprocessors: 108,
            max_shared_bytes_per_block: 163 * 1024,
            warpgroup_mma: false,
            tensor_maps: false,
        };
        let ScanPlan::Segments(segments) = plan_of(2, 1 << 20 | 1, 1, 4, &a100) else {
            panic!("long unaligned rows take the segments kernel");
        };
        assert_eq!(
            (segments.tiles, segments.vector, segments.stages),
            (2 * (1u64 << 20 | 1).div_ceil(384 * 47), false, 2)
        );
        let small = DeviceLimits {
            max_shared_bytes_per_block: 99 * 1024,
            ..a100
        };
        assert!(matches!(
            plan_of(2, 1 << 20, 1, 4, &small),
            ScanPlan::Contiguous(_)
        ));
        // Few short rows: look-back tiles, 128-bit runs when the flat length allows them.
        assert!(matches!(plan_of(3, 16000, 1, 4, &H100), ScanPlan::Contiguous(_)));
        assert_eq!(
            plan_of(1001, 17, 1, 4, &H100),
            ScanPlan::Contiguous(ContiguousPlan {
                tiles: 17017u64.div_ceil(4096),
                vector: false
            })
        );
        // An array of a tile at most: one packed-rows block, no status to zero.
        assert_eq!(
            plan_of(3, 7, 1, 8, &H100),
            ScanPlan::PackedRows(PackedRowsPlan {
                rows: 3,
                rows_per_block: 3
            })
        );
        // Axis 0 of the headline: a thread per column; fewer columns share the rows
        // among up to 16 threads each; under 2048, the look-back.
        assert_eq!(
            plan_of(1, 32768, 32768, 4, &H100),
            ScanPlan::Columns(ColumnsPlan {
                column_blocks: 128,
                parts: 1
            })
        );
        assert_eq!(
            plan_of(2, 32768, 5000, 4, &H100),
            ScanPlan::Columns(ColumnsPlan {
                column_blocks: 157,
                parts: 4
            })
        );
        assert_eq!(
            plan_of(1, 65536, 2048, 4, &H100),
            ScanPlan::Columns(ColumnsPlan {
                column_blocks: 128,
                parts: 16
            })
        );
        assert_eq!(
            plan_of(1, 32768, 2047, 4, &H100),
            ScanPlan::Strided(StridedPlan {
                column_blocks: 8,
                chunks: 512
            })
        );
    }

    #[test]
    fn status_layouts_zero_the_flags_and_hold_every_value() {
        // Packed: the counter and padding, then a word per tile, all zeroed.
        assert_eq!(
            status_layout(10, 1, 4),
            ScratchLayout {
                bytes: 88,
                zeroed: 88
            }
        );
        // 8-byte values: 44 flag bytes padded to 256, then two arrays of 10 values.
        assert_eq!(
            status_layout(10, 1, 8),
            ScratchLayout {
                bytes: 256 + 2 * 256,
                zeroed: 256
            }
        );
        let status = LaunchStatus::<f64>::in_scratch(DevicePtrMut::from_address(1 << 20), 10, 1);
        assert_eq!(
            (
                status.counter_and_flags.address(),
                status.aggregates.address(),
                status.inclusives.address()
            ),
            ((1 << 20), (1 << 20) + 256, (1 << 20) + 512)
        );
        // One value per column of a strided tile: 4 tiles of 256 4-byte values.
        assert_eq!(
            status_layout(4, BLOCK_THREADS, 4),
            ScratchLayout {
                bytes: 256 + 2 * 4096,
                zeroed: 256
            }
        );
        let packed = LaunchStatus::<f32>::in_scratch(DevicePtrMut::from_address(4096), 10, 1);
        assert!(packed.aggregates.is_null() && packed.inclusives.is_null());
    }
}
