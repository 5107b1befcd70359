//! Cumulative sum along one axis, exclusive (`y[i] = x[0] + ... + x[i-1]`, `y[0] = 0`)
//! or inclusive, forward or reversed, in one pass that reads the input once and writes
//! the output once (in place allowed).
//!
//! The array is seen as `[outer, scan, inner]`. Five kernels, chosen by the shape. Two
//! need no look-back:
//! - `rows` (`inner == 1`, at least `ROWS_PLAN_MIN_ROWS` rows of whole 128-bit runs, a
//!   tile or longer): a block per row walks the row tile by tile with a carry, the next
//!   tile's loads in flight during the current one's scan;
//! - `columns` (`inner > 1`, at least `COLUMNS_PLAN_MIN_COLUMNS` columns, the `outer *
//!   inner` lanes of the scan): each column walked whole with a
//!   running sum by `parts` threads of one block, each taking its part of every batch of
//!   rows, with the next batch's loads in flight during the current batch's scan.
//!
//! The other three cut the work into tiles that take their ids from a counter in
//! launch order and chain their prefixes by decoupled look-back (`block::TileChain`,
//! one 64-bit word per tile for 4-byte values), so any shape fills the GPU:
//! - `segments` (`inner == 1`, rows of at least `segment_items`): each row cut into
//!   segments of one run per thread; persistent blocks, one per SM, take segment after
//!   segment through shared-memory stages: bulk copies (sm_90) bring the next segments
//!   in and take finished ones out while the block scans the current one from shared
//!   memory and looks back once for its prefix within the row;
//! - `contiguous` (other `inner == 1`): the rows laid end to end as one flat sequence of
//!   `TILE_ITEMS`-element tiles; each thread holds `ITEMS` consecutive elements
//!   (128-bit loads when rows keep 16-byte alignment); a new row starts a new segment,
//!   so one tile may hold the ends of several short rows, and a long row spans many
//!   tiles;
//! - `strided` (other `inner > 1`): one thread per column, tiles of `BLOCK_THREADS`
//!   columns by `rows` rows; the look-back runs down each column block, one running
//!   sum per column.
//!
//! Reversal maps logical position `q` to `len - 1 - q` (flat for contiguous, per
//! column for columns and strided).

/// Threads per block of the look-back kernels.
pub const BLOCK_THREADS: u32 = 256;
/// Warps per look-back block.
pub const WARPS: usize = (BLOCK_THREADS / 32) as usize;
/// Threads per block of the rows kernel: twice the look-back kernels', so each row
/// takes half the steps (the dim-1 headline ran at 94% of the copy bandwidth with 512,
/// 76% with 256, on the H100).
pub const ROWS_THREADS: u32 = 512;
/// Warps per rows block.
pub const ROWS_WARPS: usize = (ROWS_THREADS / 32) as usize;
/// 128-bit vectors each contiguous thread holds.
pub const VECTORS_PER_THREAD: usize = 4;
/// Bytes of rows each strided thread holds in registers: 64 rows of 4-byte elements.
pub const STRIDED_THREAD_BYTES: usize = 256;
/// Dynamic shared memory of every scan kernel: the tile id, the look-back flag, the tile
/// prefix and the warp totals of the block scan (head flag + value), with padding.
pub const SHARED_BYTES: u32 = 64 + (WARPS as u32) * 16;

/// Predecessors each lane of the contiguous look-back examines per step (a window of
/// 32 times as many tiles).
pub const LOOK_BACK_WINDOW: usize = 4;

/// Threads per block of the segments kernel: as many as three stages of
/// `SEGMENT_VECTORS` per thread fit the H100's 227 KiB, the third stage buying a round
/// between a segment's reduction and its look-back (the 2^28 scan on the H100: 0.80 ms
/// with 384 threads and three stages, 0.84 with 320; 0.87 with 576 and two stages, or 1.04
/// with 384, three stages and no such delay; 0.89 with 288 and four).
pub const SEGMENT_THREADS: u32 = 384;
/// Warps per segments block.
pub const SEGMENT_WARPS: usize = (SEGMENT_THREADS / 32) as usize;
/// 128-bit vectors of one thread's run in a segment. 4 mod 8, so that runs start 64
/// bytes apart modulo 128 and four-vector groups read in rotated order keep each quarter
/// warp on distinct banks.
pub const SEGMENT_VECTORS: usize = 12;
/// Bytes of one shared-memory stage: a segment of whole vector runs.
pub const SEGMENT_STAGE_BYTES: u32 = SEGMENT_THREADS * SEGMENT_VECTORS as u32 * 16;
/// Rounds between a segment's reduction (its aggregate published) and its look-back
/// where the stages allow (else one): the look-back then finds its predecessors'
/// aggregates out though their blocks run a little behind (the 2^28 scan on the H100:
/// three was no faster).
pub const SEGMENT_LOOK_BACK_DELAY: u32 = 2;
/// Fewest stages of a segments block: one in flight while the block scans another.
pub const SEGMENT_MIN_STAGES: u32 = 2;
/// Most stages a segments block cycles through (three fit the H100).
pub const SEGMENT_MAX_STAGES: u32 = 8;
/// `segments` blocks per SM: one, holding most of its shared memory.
pub const SEGMENT_BLOCKS_PER_SM: u32 = 1;
/// Shared-memory layout of a segments block: the look-back kernels' block, then the
/// segment id of each stage, the stages' mbarriers, and from `SEGMENT_HEADER_BYTES` the
/// stages.
pub const SEGMENT_IDS_OFFSET: u32 = SHARED_BYTES;
pub const SEGMENT_BARRIERS_OFFSET: u32 = SEGMENT_IDS_OFFSET + 4 * SEGMENT_MAX_STAGES;
pub const SEGMENT_HEADER_BYTES: u32 = 384;

const _: () = assert!(SEGMENT_VECTORS % 8 == 4 && SEGMENT_BARRIERS_OFFSET.is_multiple_of(8));

/// Shared-memory offset of a segments block's stage.
pub const fn segment_stage_offset(stage: u32) -> u32 {
    SEGMENT_HEADER_BYTES + stage * SEGMENT_STAGE_BYTES
}

/// Dynamic shared memory of a segments block with `stages` stages.
pub const fn segment_shared_bytes(stages: u32) -> u32 {
    segment_stage_offset(stages)
}

/// The stages a segments block takes where a block may have `max_shared_bytes` of
/// shared memory (fewer than `SEGMENT_MIN_STAGES` when the kernel does not fit).
pub const fn segment_stages(max_shared_bytes: u32) -> u32 {
    let fit = max_shared_bytes.saturating_sub(SEGMENT_HEADER_BYTES) / SEGMENT_STAGE_BYTES;
    if fit < SEGMENT_MAX_STAGES {
        fit
    } else {
        SEGMENT_MAX_STAGES
    }
}

/// Elements of one thread's run in a segment: whole vectors for rows that keep 16-byte
/// alignment, else one fewer (an odd count: scalar runs that far apart in shared memory
/// fall on distinct banks), so a segment plus its unaligned ends fits a stage.
pub const fn segment_run(element_bytes: usize, vector: bool) -> u64 {
    let items = (SEGMENT_VECTORS * 16 / element_bytes) as u64;
    if vector { items } else { items - 1 }
}

/// Elements of one segment.
pub const fn segment_items(element_bytes: usize, vector: bool) -> u64 {
    SEGMENT_THREADS as u64 * segment_run(element_bytes, vector)
}

/// Rows from which a block per row fills the GPU many times over (132 SMs, several
/// blocks each), so that rows at least a tile long need no look-back.
pub const ROWS_PLAN_MIN_ROWS: u64 = 2048;

/// Option bit: exclusive (else inclusive).
pub const EXCLUSIVE: u32 = 1;
/// Option bit: scan from the end.
pub const REVERSE: u32 = 2;

const _: () = assert!(
    BLOCK_THREADS.is_multiple_of(32)
        && ROWS_THREADS.is_multiple_of(32)
        && ROWS_WARPS * 8 <= WARPS * 16
        // The segments kernel's warp totals (8-byte values at most) start 16 bytes in.
        && 16 + SEGMENT_WARPS * 8 <= SHARED_BYTES as usize
        && SHARED_BYTES.is_multiple_of(16)
);

/// Elements each contiguous thread holds for `element_bytes`-byte elements.
pub const fn items_per_thread(element_bytes: usize) -> usize {
    VECTORS_PER_THREAD * 16 / element_bytes
}

/// Elements of one contiguous tile.
pub const fn tile_items(element_bytes: usize) -> u64 {
    BLOCK_THREADS as u64 * items_per_thread(element_bytes) as u64
}

/// Threads the columns kernel aims for, each with `COLUMN_BATCH_BYTES` of loads in
/// flight (4 MiB in all: more than 3 TB/s over a microsecond of latency); columns take
/// up to `COLUMN_MAX_PARTS` threads each to reach it. Axis 0 of 2^30 f32 on the H100:
/// 32768 columns 3.17 ms with one part, 3.11 with two; 16384 columns 3.01 with two, 3.12
/// with four; 8192 columns 3.02 with four, 3.29 with eight.
pub const COLUMN_TARGET_THREADS: u64 = 1 << 15;
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

/// Rows each columns thread loads ahead.
pub const fn column_batch(element_bytes: usize) -> usize {
    COLUMN_BATCH_BYTES / element_bytes
}

/// Rows of one strided tile.
pub const fn strided_rows(element_bytes: usize) -> u64 {
    (STRIDED_THREAD_BYTES / element_bytes) as u64
}

/// The array as `[outer, scan, inner]`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanProblem {
    pub outer: u64,
    pub scan: u64,
    pub inner: u64,
}

/// How a problem is launched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanPlan {
    /// Many long aligned rows: a block per row, walking its tiles with a carry; no
    /// look-back, no status.
    Rows { rows: u64 },
    Contiguous {
        tiles: u64,
        /// Whether rows keep 16-byte alignment (128-bit loads and stores).
        vector: bool,
    },
    /// Few long rows: each row cut into segments of `segment_items`, chained by
    /// look-back within the row; persistent blocks walk the segments through shared
    /// memory stages.
    Segments {
        /// Segments of all rows.
        tiles: u64,
        vector: bool,
        /// Shared-memory stages per block.
        stages: u32,
    },
    /// Many columns: `parts` threads per column, `BLOCK_THREADS / parts` columns per
    /// block; no look-back, no status.
    Columns { column_blocks: u64, parts: u32 },
    Strided {
        /// Blocks of `BLOCK_THREADS` columns.
        column_blocks: u64,
        /// Tiles down the scanned axis.
        chunks: u64,
    },
}

impl ScanPlan {
    /// Tiles: one block each, except segments, which persistent blocks share.
    pub const fn tiles(&self) -> u64 {
        match *self {
            ScanPlan::Rows { rows } => rows,
            ScanPlan::Columns { column_blocks, .. } => column_blocks,
            ScanPlan::Contiguous { tiles, .. } | ScanPlan::Segments { tiles, .. } => tiles,
            ScanPlan::Strided {
                column_blocks,
                chunks,
            } => column_blocks * chunks,
        }
    }

    /// Threads per block.
    pub const fn threads(&self) -> u32 {
        match self {
            ScanPlan::Rows { .. } => ROWS_THREADS,
            ScanPlan::Segments { .. } => SEGMENT_THREADS,
            ScanPlan::Contiguous { .. } | ScanPlan::Columns { .. } | ScanPlan::Strided { .. } => {
                BLOCK_THREADS
            }
        }
    }

    /// Blocks of the launch on a GPU of `multiprocessors` SMs.
    pub const fn blocks(&self, multiprocessors: u32) -> u64 {
        match *self {
            ScanPlan::Segments { tiles, .. } => {
                let resident = (multiprocessors * SEGMENT_BLOCKS_PER_SM) as u64;
                if tiles < resident { tiles } else { resident }
            }
            _ => self.tiles(),
        }
    }

    /// Dynamic shared memory per block.
    pub const fn shared_bytes(&self) -> u32 {
        match *self {
            ScanPlan::Segments { stages, .. } => segment_shared_bytes(stages),
            ScanPlan::Columns { .. } => COLUMN_SHARED_BYTES,
            _ => SHARED_BYTES,
        }
    }

    /// Values each tile publishes: one, or one per column.
    pub const fn status_width(&self) -> u32 {
        match self {
            ScanPlan::Rows { .. } | ScanPlan::Columns { .. } => 0,
            ScanPlan::Contiguous { .. } | ScanPlan::Segments { .. } => 1,
            ScanPlan::Strided { .. } => BLOCK_THREADS,
        }
    }
}

/// The plan for a non-empty problem of `element_bytes`-byte elements, on a GPU whose
/// blocks may have `max_shared_bytes` of shared memory.
pub const fn plan(problem: &ScanProblem, element_bytes: usize, max_shared_bytes: u32) -> ScanPlan {
    let elements = problem.outer * problem.scan * problem.inner;
    let per_vector = (16 / element_bytes) as u64;
    let aligned = problem.scan.is_multiple_of(per_vector);
    let whole_runs = problem
        .scan
        .is_multiple_of(items_per_thread(element_bytes) as u64);
    let long = problem.scan >= tile_items(element_bytes);
    if problem.inner == 1 && whole_runs && long && problem.outer >= ROWS_PLAN_MIN_ROWS {
        ScanPlan::Rows { rows: problem.outer }
    } else if problem.inner == 1
        && problem.scan >= segment_items(element_bytes, aligned)
        && segment_stages(max_shared_bytes) >= SEGMENT_MIN_STAGES
    {
        ScanPlan::Segments {
            tiles: problem.outer * problem.scan.div_ceil(segment_items(element_bytes, aligned)),
            vector: aligned,
            stages: segment_stages(max_shared_bytes),
        }
    } else if problem.inner == 1 {
        ScanPlan::Contiguous {
            tiles: elements.div_ceil(tile_items(element_bytes)),
            vector: aligned,
        }
    } else if problem.outer * problem.inner >= COLUMNS_PLAN_MIN_COLUMNS {
        let columns = problem.outer * problem.inner;
        let mut parts = 1;
        while columns * (parts as u64) < COLUMN_TARGET_THREADS && parts < COLUMN_MAX_PARTS {
            parts *= 2;
        }
        ScanPlan::Columns {
            column_blocks: columns.div_ceil((BLOCK_THREADS / parts) as u64),
            parts,
        }
    } else {
        ScanPlan::Strided {
            column_blocks: (problem.outer * problem.inner).div_ceil(BLOCK_THREADS as u64),
            chunks: problem.scan.div_ceil(strided_rows(element_bytes)),
        }
    }
}

/// Whether the contiguous kernel's status packs each tile's flag and value into one
/// 64-bit word (4-byte values): then the status is the counter, 4 bytes of padding and
/// one zeroed word per tile, with no value arrays.
pub const fn packed_status(element_bytes: usize) -> bool {
    element_bytes == 4
}

/// The look-back status of a launch, as the host passes it (device addresses).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct LaunchStatus<T> {
    /// `[counter, flag per tile...]`, all zero before the launch.
    pub counter_and_flags: *mut u32,
    pub aggregates: *mut T,
    pub inclusives: *mut T,
}

/// Element types of the scan kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanDType {
    F32,
    F64,
    I32,
    I64,
}

/// Entry points, `[variant][dtype]`: contiguous scalar, reversed, vector, vector
/// reversed (each its own entry so that each gets its own register budget), strided,
/// rows, rows reversed, segments as contiguous, then columns.
const NAMES: [[&str; 4]; 12] = [
    [
        "scan_contiguous_f32",
        "scan_contiguous_f64",
        "scan_contiguous_i32",
        "scan_contiguous_i64",
    ],
    [
        "scan_contiguous_reverse_f32",
        "scan_contiguous_reverse_f64",
        "scan_contiguous_reverse_i32",
        "scan_contiguous_reverse_i64",
    ],
    [
        "scan_contiguous_vector_f32",
        "scan_contiguous_vector_f64",
        "scan_contiguous_vector_i32",
        "scan_contiguous_vector_i64",
    ],
    [
        "scan_contiguous_vector_reverse_f32",
        "scan_contiguous_vector_reverse_f64",
        "scan_contiguous_vector_reverse_i32",
        "scan_contiguous_vector_reverse_i64",
    ],
    [
        "scan_strided_f32",
        "scan_strided_f64",
        "scan_strided_i32",
        "scan_strided_i64",
    ],
    ["scan_rows_f32", "scan_rows_f64", "scan_rows_i32", "scan_rows_i64"],
    [
        "scan_rows_reverse_f32",
        "scan_rows_reverse_f64",
        "scan_rows_reverse_i32",
        "scan_rows_reverse_i64",
    ],
    [
        "scan_segments_f32",
        "scan_segments_f64",
        "scan_segments_i32",
        "scan_segments_i64",
    ],
    [
        "scan_segments_reverse_f32",
        "scan_segments_reverse_f64",
        "scan_segments_reverse_i32",
        "scan_segments_reverse_i64",
    ],
    [
        "scan_segments_vector_f32",
        "scan_segments_vector_f64",
        "scan_segments_vector_i32",
        "scan_segments_vector_i64",
    ],
    [
        "scan_segments_vector_reverse_f32",
        "scan_segments_vector_reverse_f64",
        "scan_segments_vector_reverse_i32",
        "scan_segments_vector_reverse_i64",
    ],
    [
        "scan_columns_f32",
        "scan_columns_f64",
        "scan_columns_i32",
        "scan_columns_i64",
    ],
];

/// The entry point for a plan, dtype and direction.
pub const fn kernel_name(plan: &ScanPlan, dtype: ScanDType, reverse: bool) -> &'static str {
    let variant = match plan {
        ScanPlan::Contiguous { vector, .. } => 2 * (*vector as usize) + reverse as usize,
        ScanPlan::Strided { .. } => 4,
        ScanPlan::Rows { .. } => 5 + reverse as usize,
        ScanPlan::Segments { vector, .. } => 7 + 2 * (*vector as usize) + reverse as usize,
        ScanPlan::Columns { .. } => 11,
    };
    NAMES[variant][dtype as usize]
}

/// Launch bounds of the `segments` kernels.
pub const LAUNCH_BOUNDS: [crate::LaunchBounds; 16] = {
    let mut all = [const {
        crate::LaunchBounds {
            kernel: "",
            threads: SEGMENT_THREADS,
            blocks_per_sm: SEGMENT_BLOCKS_PER_SM,
        }
    }; 16];
    let mut i = 0;
    while i < 16 {
        all[i].kernel = NAMES[7 + i / 4][i % 4];
        i += 1;
    }
    all
};

/// Every scan entry point.
pub const KERNELS: [&str; 48] = {
    let mut all = [""; 48];
    let mut i = 0;
    while i < 48 {
        all[i] = NAMES[i / 4][i % 4];
        i += 1;
    }
    all
};

#[cfg(target_arch = "nvptx64")]
mod kernel {
    use super::*;
    use crate::block::{AGGREGATE, INCLUSIVE, PackedStatus, ScanOp, TileChain, TileStatus, exclusive_scan};
    use crate::device::{
        Coherent, STAGE_BARRIER_BYTES, SharedCarver, Shuffle, StagedCopy, atomic_add_u32, block_dim_x,
        block_idx_x, load_global_v4, load_shared_v4_f32, shared_base, store_global_v4, store_shared_v4_f32,
        sync_threads, thread_idx_x,
    };

    const _: () =
        assert!(SEGMENT_BARRIERS_OFFSET + STAGE_BARRIER_BYTES * SEGMENT_MAX_STAGES <= SEGMENT_HEADER_BYTES);

    /// An element type the scan kernels sum: wrapping for integers.
    pub trait ScanValue: ScanOp + Coherent {
        /// Elements in one 128-bit vector.
        const PER_VECTOR: usize;
        /// Element `i` of a vector loaded as four words.
        fn from_words(words: [u32; 4], i: usize) -> Self;
        /// Writes the element into its place `i` of a vector.
        fn into_words(self, words: &mut [u32; 4], i: usize);
        /// The contiguous kernel's chain of tiles, in the layout `packed_status` gives
        /// the host.
        type Chain: TileChain<Self>;
        fn chain(status: &LaunchStatus<Self>) -> Self::Chain;
    }

    /// The packed chain, for 4-byte values: words right after the counter, 8-byte
    /// aligned.
    fn packed<T>(status: &LaunchStatus<T>) -> PackedStatus<T> {
        PackedStatus {
            words: status.counter_and_flags.wrapping_add(2) as *mut u64,
            value: core::marker::PhantomData,
        }
    }

    macro_rules! scan_value {
        ($($t:ty, $per:literal, $add:expr, $from:expr, $into:expr, $chain:ty, $make:expr;)*) => {$(
            impl ScanOp for $t {
                #[inline(always)]
                fn identity() -> Self {
                    0 as $t
                }
                #[inline(always)]
                fn combine(self, later: Self) -> Self {
                    $add(self, later)
                }
            }
            impl ScanValue for $t {
                const PER_VECTOR: usize = $per;
                #[inline(always)]
                fn from_words(words: [u32; 4], i: usize) -> Self {
                    $from(words, i)
                }
                #[inline(always)]
                fn into_words(self, words: &mut [u32; 4], i: usize) {
                    $into(self, words, i)
                }
                type Chain = $chain;
                #[inline(always)]
                fn chain(status: &LaunchStatus<Self>) -> Self::Chain {
                    const { assert!(packed_status(size_of::<$t>()) == ($per == 4)) };
                    $make(status)
                }
            }
        )*};
    }

    fn word64(words: [u32; 4], i: usize) -> u64 {
        words[2 * i] as u64 | (words[2 * i + 1] as u64) << 32
    }
    fn put64(bits: u64, words: &mut [u32; 4], i: usize) {
        words[2 * i] = bits as u32;
        words[2 * i + 1] = (bits >> 32) as u32;
    }

    scan_value! {
        f32, 4, |a: f32, b| a + b, |w: [u32; 4], i| f32::from_bits(w[i]), |v: f32, w: &mut [u32; 4], i| w[i] = v.to_bits(),
            PackedStatus<f32>, packed;
        i32, 4, i32::wrapping_add, |w: [u32; 4], i| w[i] as i32, |v: i32, w: &mut [u32; 4], i| w[i] = v as u32,
            PackedStatus<i32>, packed;
        f64, 2, |a: f64, b| a + b, |w, i| f64::from_bits(word64(w, i)), |v: f64, w: &mut [u32; 4], i| put64(v.to_bits(), w, i),
            TileStatus<f64>, |s: &LaunchStatus<f64>| s.tiles(1);
        i64, 2, i64::wrapping_add, |w, i| word64(w, i) as i64, |v: i64, w: &mut [u32; 4], i| put64(v as u64, w, i),
            TileStatus<i64>, |s: &LaunchStatus<i64>| s.tiles(1);
    }

    /// A running sum that restarts at segment heads: `(head, value)` combined as
    /// `(h1 | h2, if h2 { v2 } else { v1 + v2 })`.
    #[derive(Clone, Copy)]
    struct Segment<T> {
        head: u32,
        value: T,
    }

    impl<T: ScanValue> Shuffle for Segment<T> {
        #[inline(always)]
        fn shfl_xor(self, mask: u32) -> Self {
            Segment {
                head: self.head.shfl_xor(mask),
                value: self.value.shfl_xor(mask),
            }
        }
        #[inline(always)]
        fn shfl_down(self, delta: u32) -> Self {
            Segment {
                head: self.head.shfl_down(delta),
                value: self.value.shfl_down(delta),
            }
        }
        #[inline(always)]
        fn shfl_up(self, delta: u32) -> Self {
            Segment {
                head: self.head.shfl_up(delta),
                value: self.value.shfl_up(delta),
            }
        }
        #[inline(always)]
        fn shfl_idx(self, src: u32) -> Self {
            Segment {
                head: self.head.shfl_idx(src),
                value: self.value.shfl_idx(src),
            }
        }
    }

    impl<T: ScanValue> ScanOp for Segment<T> {
        #[inline(always)]
        fn identity() -> Self {
            Segment {
                head: 0,
                value: T::identity(),
            }
        }
        #[inline(always)]
        fn combine(self, later: Self) -> Self {
            Segment {
                head: self.head | later.head,
                value: if later.head != 0 {
                    later.value
                } else {
                    self.value.combine(later.value)
                },
            }
        }
    }

    /// Shared memory of one scan block, carved in the order of `SHARED_BYTES`.
    struct Shared<T> {
        tile: *mut u32,
        flag: *mut u32,
        prefix: *mut T,
        warp_totals: *mut Segment<T>,
    }

    impl<T: ScanValue> Shared<T> {
        #[inline(always)]
        fn carve() -> Self {
            let mut carver = SharedCarver::new();
            // SAFETY: the launch gives SHARED_BYTES, which covers these regions at
            // their largest (8-byte values, 16-byte segments).
            unsafe {
                Shared {
                    tile: carver.take(1),
                    flag: carver.take(1),
                    prefix: carver.take(1),
                    warp_totals: carver.take(WARPS),
                }
            }
        }

        /// Takes the next tile id from the launch's counter and shares it (one barrier).
        ///
        /// # Safety
        /// Every thread of the block calls it; `counter` is the launch's zeroed counter.
        #[inline(always)]
        unsafe fn next_tile(&self, counter: *mut u32) -> u64 {
            // SAFETY: thread 0 alone writes the shared slot before the barrier.
            unsafe {
                if thread_idx_x() == 0 {
                    *self.tile = atomic_add_u32(counter, 1);
                }
                sync_threads();
                *self.tile as u64
            }
        }
    }

    impl<T> LaunchStatus<T> {
        #[inline(always)]
        fn tiles(&self, width: u32) -> TileStatus<T> {
            TileStatus {
                // SAFETY: the flags follow the counter in one allocation.
                flags: unsafe { self.counter_and_flags.add(1) },
                aggregates: self.aggregates,
                inclusives: self.inclusives,
                width,
            }
        }
    }

    /// `ITEMS` elements from physical position `start` by 128-bit loads, in logical
    /// order (reversed when `REVERSE_ORDER`).
    ///
    /// # Safety
    /// `x[start..start + ITEMS]` is readable and 16-byte aligned.
    #[inline(always)]
    unsafe fn load_run<T: ScanValue, const ITEMS: usize, const REVERSE_ORDER: bool>(
        x: *const T,
        start: u64,
    ) -> [T; ITEMS] {
        let mut items = [T::identity(); ITEMS];
        for v in 0..ITEMS / T::PER_VECTOR {
            // SAFETY: inside the run, which the caller guarantees.
            let words = unsafe { load_global_v4(x.add(start as usize + v * T::PER_VECTOR) as *const u32) };
            for i in 0..T::PER_VECTOR {
                let k = v * T::PER_VECTOR + i;
                items[if REVERSE_ORDER { ITEMS - 1 - k } else { k }] = T::from_words(words, i);
            }
        }
        items
    }

    /// Writes `items` (logical order) to physical positions `start..start + ITEMS` by
    /// 128-bit stores: the inverse of [`load_run`].
    ///
    /// # Safety
    /// `y[start..start + ITEMS]` is writable and 16-byte aligned.
    #[inline(always)]
    unsafe fn store_run<T: ScanValue, const ITEMS: usize, const REVERSE_ORDER: bool>(
        y: *mut T,
        start: u64,
        items: &[T; ITEMS],
    ) {
        for v in 0..ITEMS / T::PER_VECTOR {
            let mut words = [0u32; 4];
            for i in 0..T::PER_VECTOR {
                let k = v * T::PER_VECTOR + i;
                items[if REVERSE_ORDER { ITEMS - 1 - k } else { k }].into_words(&mut words, i);
            }
            // SAFETY: inside the run, which the caller guarantees.
            unsafe { store_global_v4(y.add(start as usize + v * T::PER_VECTOR) as *mut u32, words) };
        }
    }

    /// Scans one tile (`ITEMS` consecutive elements per thread, `WARPS` warps) after
    /// `carry`: each item becomes its exclusive or inclusive prefix; returns the tile's
    /// total.
    ///
    /// # Safety
    /// Every thread of the block calls it; `warp_totals` holds `WARPS` values in shared
    /// memory that nothing else uses until the caller's next barrier.
    #[inline(always)]
    unsafe fn scan_tile<T: ScanValue, const ITEMS: usize, const WARPS: usize>(
        items: &mut [T; ITEMS],
        carry: T,
        exclusive: bool,
        warp_totals: *mut T,
    ) -> T {
        let mut own = T::identity();
        for &item in items.iter() {
            own = own.combine(item);
        }
        // SAFETY: forwarded from the caller.
        let (before, total) = unsafe { exclusive_scan::<_, WARPS>(own, warp_totals) };
        let mut running = carry.combine(before);
        for item in items.iter_mut() {
            let next = running.combine(*item);
            *item = if exclusive { running } else { next };
            running = next;
        }
        total
    }

    /// Scans the rows of `[outer, scan]` laid end to end; one tile per block.
    ///
    /// # Safety
    /// `x` and `y` hold `outer * scan` elements, 16-byte aligned (they may be the same
    /// array); `VECTOR` only when `scan` is a multiple of `PER_VECTOR`; the status holds
    /// `tiles` zeroed words (packed) or flags and values after a zero counter; the grid has `tiles` blocks of
    /// `BLOCK_THREADS` threads with `SHARED_BYTES` of dynamic shared memory.
    #[inline(always)]
    pub unsafe fn contiguous<
        T: ScanValue,
        const ITEMS: usize,
        const VECTOR: bool,
        const REVERSE_ORDER: bool,
    >(
        x: *const T,
        y: *mut T,
        problem: ScanProblem,
        options: u32,
        status: LaunchStatus<T>,
    ) {
        let shared = Shared::<T>::carve();
        let chain = T::chain(&status);
        // SAFETY: every thread calls it; the counter heads the status.
        let tile = unsafe { shared.next_tile(status.counter_and_flags) };
        let n = problem.outer * problem.scan;
        let reverse = REVERSE_ORDER;
        let first = tile * (ITEMS as u64 * block_dim_x() as u64) + thread_idx_x() as u64 * ITEMS as u64;
        // Logical position q lives at physical `reverse ? n - 1 - q : q`.
        let physical = |q: u64| if reverse { n - 1 - q } else { q };

        // Physical start of this thread's run when it is whole and vectorized (aligned:
        // ITEMS and n are multiples of PER_VECTOR).
        let vector_start = (VECTOR && first + ITEMS as u64 <= n)
            .then(|| if reverse { n - first - ITEMS as u64 } else { first });
        let mut items = [T::identity(); ITEMS];
        if let Some(start) = vector_start {
            // SAFETY: the run lies inside x and is 16-byte aligned.
            items = unsafe { load_run::<T, ITEMS, REVERSE_ORDER>(x, start) };
        } else {
            for (k, item) in items.iter_mut().enumerate() {
                if first + (k as u64) < n {
                    // SAFETY: the position is below n.
                    *item = unsafe { *x.add(physical(first + k as u64) as usize) };
                }
            }
        }

        // Segment heads: logical positions that start a row.
        // The first head among this thread's items, then one every `scan` items (one
        // 64-bit division per thread; 32-bit tests per item).
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
        let mut own = Segment::<T>::identity();
        for (k, &item) in items.iter().enumerate() {
            own = own.combine(Segment {
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
            // at the latest tile holding a row start, which never waits.
            let prefix = unsafe { chain.look_back::<LOOK_BACK_WINDOW>(tile) };
            if thread == 0 {
                // SAFETY: thread 0 alone writes the shared prefix before the barrier.
                unsafe { *shared.prefix = prefix };
                if total.head == 0 {
                    // SAFETY: this tile's status.
                    unsafe { chain.publish(tile, prefix.combine(total.value), INCLUSIVE) };
                }
            }
        }
        // SAFETY: every thread reaches the barrier; the prefix was written before it.
        let tile_prefix = unsafe {
            sync_threads();
            if needs_prefix {
                *shared.prefix
            } else {
                T::identity()
            }
        };

        let mut running = Segment {
            head: 0,
            value: tile_prefix,
        }
        .combine(before)
        .value;
        let exclusive = options & EXCLUSIVE != 0;
        for (k, item) in items.iter_mut().enumerate() {
            if is_head(k) {
                running = T::identity();
            }
            let next = running.combine(*item);
            *item = if exclusive { running } else { next };
            running = next;
        }

        if let Some(start) = vector_start {
            // SAFETY: the run lies inside y and is 16-byte aligned.
            unsafe { store_run::<T, ITEMS, REVERSE_ORDER>(y, start, &items) };
        } else {
            for (k, &item) in items.iter().enumerate() {
                if first + (k as u64) < n {
                    // SAFETY: the position is below n.
                    unsafe { *y.add(physical(first + k as u64) as usize) = item };
                }
            }
        }
    }

    /// Scans long rows cut into segments of `SEGMENT_THREADS * RUN` elements (ids in
    /// launch order, `scan.div_ceil(segment)` per row), one persistent block per SM
    /// walking segments through `stages` shared-memory stages: while the block scans
    /// one stage, the copies of the next segments into the other stages are in flight
    /// (on sm_90 bulk copies that hold no registers). Per segment: each thread sums its
    /// run of `RUN` elements from shared memory, a block scan gives each run its offset
    /// and the segment its total, warp 0 looks back for the segment's prefix within its
    /// row, then each thread scans its run again into the stage, which leaves in one
    /// bulk store (aligned rows; unaligned ones store element by element).
    ///
    /// Runs of 128-bit vectors (`VECTOR`) are read in groups of four vectors rotated by
    /// `(thread >> 1) & 3` (runs are 4 mod 8 vectors long), so each quarter warp's loads
    /// hit distinct banks; unaligned rows take odd runs of scalars, conflict-free too.
    ///
    /// # Safety
    /// `x` and `y` hold `outer * scan` elements, 16-byte aligned (they may be the same
    /// array); `VECTOR` only when `scan` is a multiple of `PER_VECTOR`; `RUN` is
    /// `segment_run(size_of::<T>(), VECTOR)`; the status is packed or holds flags and
    /// values for every segment after a zero counter; at most `SEGMENT_BLOCKS_PER_SM`
    /// blocks per SM of `SEGMENT_THREADS` threads, `SEGMENT_MIN_STAGES <= stages <=
    /// SEGMENT_MAX_STAGES` and `segment_shared_bytes(stages)` of dynamic shared memory.
    #[inline(always)]
    pub unsafe fn segments<T: ScanValue, const RUN: usize, const VECTOR: bool, const REVERSE_ORDER: bool>(
        x: *const T,
        y: *mut T,
        problem: ScanProblem,
        options: u32,
        status: LaunchStatus<T>,
        stages: u32,
    ) {
        const GROUP_VECTORS: usize = 4;
        let group_items = GROUP_VECTORS * T::PER_VECTOR;
        let groups = RUN / group_items;
        let shared = Shared::<T>::carve();
        // SAFETY: takes nothing; the base of the block's dynamic shared memory.
        let generic_base: *mut u8 = unsafe { SharedCarver::new().take(0) };
        let ids = generic_base.wrapping_add(SEGMENT_IDS_OFFSET as usize) as *mut u32;
        let stage_pointer =
            |stage: u32| generic_base.wrapping_add(segment_stage_offset(stage) as usize) as *mut T;
        let stage_address = |stage: u32| shared_base() + segment_stage_offset(stage);
        let chain = T::chain(&status);
        let counter = status.counter_and_flags;
        let scan = problem.scan;
        let length = (RUN as u32 * SEGMENT_THREADS) as u64;
        let per_row = scan.div_ceil(length);
        let tiles = problem.outer * per_row;
        let thread = thread_idx_x();
        let per_vector = T::PER_VECTOR as u64;

        // A segment: its position in its row and its physical elements `[low, high)`.
        struct Segment {
            index: u64,
            begin: u64,
            end: u64,
            base: u64,
            low: u64,
            high: u64,
        }
        let segment_of = |tile: u64| {
            let (row, index) = (tile / per_row, tile % per_row);
            let begin = index * length;
            let end = (begin + length).min(scan);
            let base = row * scan;
            let low = base + if REVERSE_ORDER { scan - end } else { begin };
            Segment {
                index,
                begin,
                end,
                base,
                low,
                high: low + (end - begin),
            }
        };
        // Element p of a segment sits in its stage at `p - aligned_low`, so that
        // 16-byte-aligned elements stay 16-byte aligned in shared memory.
        let aligned_low = |s: &Segment| s.low / per_vector * per_vector;
        let physical = |s: &Segment, q: u64| s.base + if REVERSE_ORDER { scan - 1 - q } else { q };

        // SAFETY: every thread calls it; the mbarriers follow the ids.
        let copy = unsafe { StagedCopy::new(shared_base() + SEGMENT_BARRIERS_OFFSET, stages) };
        // Copies segment `tile` into `stage`: the 16-byte-aligned middle as one copy,
        // the unaligned ends (fewer than a vector each) by single threads.
        let fill = |stage: u32, tile: u64| {
            if tile >= tiles {
                return;
            }
            let s = segment_of(tile);
            let head_end = s.low.next_multiple_of(per_vector).min(s.high);
            let tail_start = (s.high / per_vector * per_vector).max(head_end);
            let offset = |p: u64| ((p - aligned_low(&s)) as usize * size_of::<T>()) as u32;
            // SAFETY: every thread calls it with the same values; [head_end, tail_start)
            // lies in x and is 16-byte aligned at both ends, and its place in the stage
            // too; the stage is free (its last fill was waited for and read before the
            // caller's barrier).
            unsafe {
                copy.start(
                    stage,
                    stage_address(stage) + offset(head_end),
                    x.add(head_end as usize) as *const u8,
                    offset(tail_start) - offset(head_end),
                )
            };
            if !VECTOR && (thread as u64) < 2 * per_vector {
                let k = thread as u64;
                let p = if k < per_vector {
                    s.low + k
                } else {
                    tail_start + k - per_vector
                };
                if p < if k < per_vector { head_end } else { s.high } {
                    // SAFETY: p is an element of x outside the bulk range; its stage slot is
                    // this thread's alone until the barriers before the stage is read.
                    unsafe { *stage_pointer(stage).add((p - aligned_low(&s)) as usize) = *x.add(p as usize) };
                }
            }
            if !VECTOR {
                // SAFETY: every thread calls `fill` with the same tile: the ends are
                // published before any thread reads the stage (the copy's wait covers
                // only the bulk part).
                unsafe { sync_threads() };
            }
        };

        if thread == 0 {
            for stage in 0..stages {
                // SAFETY: thread 0 alone writes the ids before the barrier; the counter
                // heads the status.
                unsafe { *ids.add(stage as usize) = atomic_add_u32(counter, 1) };
            }
        }
        // SAFETY: every thread reaches it; it also orders the mbarriers' set-up before
        // the first fills.
        unsafe { sync_threads() };
        for stage in 0..stages {
            // SAFETY: written before the barrier.
            fill(stage, unsafe { *ids.add(stage as usize) } as u64);
        }

        let exclusive = options & EXCLUSIVE != 0;
        let warp_totals = shared.warp_totals as *mut T;
        let rotation = (thread >> 1) as usize & (GROUP_VECTORS - 1);
        // Puts a group read in rotated order back in physical order, and back again
        // (swapping vectors `j` and `j ^ rotation` is its own inverse).
        let unrotate = |vectors: &mut [[u32; 4]; GROUP_VECTORS]| {
            let mut bit = 1;
            while bit < GROUP_VECTORS {
                if rotation & bit != 0 {
                    for j in 0..GROUP_VECTORS {
                        if j & bit == 0 {
                            vectors.swap(j, j | bit);
                        }
                    }
                }
                bit <<= 1;
            }
        };
        // This thread's run of a segment: its first logical position, and for a whole
        // run of vectors its lowest physical element.
        let run_of = |s: &Segment| {
            let first = s.begin + thread as u64 * RUN as u64;
            let last = first + RUN as u64 - 1;
            let vector_start =
                (VECTOR && last < s.end).then(|| physical(s, if REVERSE_ORDER { last } else { first }));
            (first, vector_start)
        };
        let item = |stage: u32, s: &Segment, q: u64| {
            // SAFETY: q is a position of the segment, which the stage holds.
            unsafe { *stage_pointer(stage).add((physical(s, q) - aligned_low(s)) as usize) }
        };
        // Group g of a vector run: four vectors read rotated, put back in physical order.
        let group = |stage: u32, s: &Segment, start: u64, g: usize| {
            let address = stage_address(stage) + ((start - aligned_low(s)) as usize * size_of::<T>()) as u32;
            let mut vectors: [[u32; 4]; GROUP_VECTORS] = core::array::from_fn(|j| {
                let v = (g * GROUP_VECTORS + (j ^ rotation)) as u32;
                // SAFETY: inside the run, 16-byte aligned; the fill landed.
                unsafe { load_shared_v4_f32(address + v * 16) }.map(f32::to_bits)
            });
            unrotate(&mut vectors);
            vectors
        };
        // First pass over a landed segment: run totals, block-scanned, and the segment's
        // aggregate published (inclusive for a row's first segment, which ends every
        // chain inside its row). Returns this run's offset in the segment and the total.
        let reduce = |stage: u32, tile: u64| {
            let s = segment_of(tile);
            let (first, vector_start) = run_of(&s);
            let mut own = T::identity();
            match vector_start {
                Some(start) => {
                    for g in 0..groups {
                        for words in group(stage, &s, start, g) {
                            for i in 0..T::PER_VECTOR {
                                own = own.combine(T::from_words(words, i));
                            }
                        }
                    }
                }
                None => {
                    for q in first..(first + RUN as u64).min(s.end) {
                        own = own.combine(item(stage, &s, q));
                    }
                }
            }
            // SAFETY: every thread calls it; the warp totals are this block's, large
            // enough for SEGMENT_WARPS values of T, and free since the last barrier.
            let (before, total) = unsafe { exclusive_scan::<T, SEGMENT_WARPS>(own, warp_totals) };
            if thread == 0 {
                let flag = if s.index == 0 { INCLUSIVE } else { AGGREGATE };
                // SAFETY: this segment's status.
                unsafe { chain.publish(tile, total, flag) };
            }
            (before, total)
        };

        // Each round finishes one segment whose aggregate is already out: warp 0 looks
        // back for its prefix while the copy thread refills the stage of the round
        // before (whose bulk store drained meanwhile); the segment is scanned into its
        // stage and stored; then the stage refilled this round is waited for and
        // reduced, which publishes its segment's aggregate `ahead` rounds before that
        // segment's look-back. With a third stage to hold it meanwhile, that is two
        // rounds, so a look-back seldom waits for predecessors whose blocks run late.
        let ahead = if stages > SEGMENT_LOOK_BACK_DELAY {
            SEGMENT_LOOK_BACK_DELAY
        } else {
            1
        };
        // The reductions of the next `ahead` rounds' segments, in round order.
        let mut reduced = [(T::identity(), T::identity()); SEGMENT_LOOK_BACK_DELAY as usize];
        // SAFETY: written before the barrier above (thread 0 rewrites it in the first
        // round, after the barrier of the first reduction below).
        let mut tile = unsafe { *ids } as u64;
        for round in 0..ahead {
            // SAFETY: written before the barrier above.
            let early = unsafe { *ids.add(round as usize) } as u64;
            if early < tiles {
                // SAFETY: every thread calls them (tile is uniform): the stage's first fill
                // was started, and the barrier frees the warp totals of the reduction
                // before.
                unsafe {
                    copy.wait(round, 0);
                    if round > 0 {
                        sync_threads();
                    }
                }
                reduced[round as usize] = reduce(round, early);
            }
        }
        let mut round = 0u32;
        while tile < tiles {
            let stage = round % stages;
            let s = segment_of(tile);
            let (before, total) = reduced[0];
            if s.index > 0 && thread < 32 {
                // SAFETY: warp 0 entire; the row's first segment never waits.
                let prefix = unsafe { chain.look_back::<LOOK_BACK_WINDOW>(tile) };
                if thread == 0 {
                    // SAFETY: thread 0 alone writes the shared prefix before the barrier;
                    // this segment's status.
                    unsafe {
                        *shared.prefix = prefix;
                        chain.publish(tile, prefix.combine(total), INCLUSIVE);
                    }
                }
            }
            if thread == 0 {
                // The id this stage is refilled with, shared by the barrier below (every
                // thread read the stage's id before an earlier barrier).
                // SAFETY: thread 0 alone writes the ids; the counter heads the status.
                unsafe { *ids.add(stage as usize) = atomic_add_u32(counter, 1) };
            }
            // The previous round's stage is refilled only now, by the copy thread (warp
            // 1) once its bulk store has drained, while warp 0 looks back.
            if round > 0 {
                let previous = (round - 1) % stages;
                // SAFETY: written by thread 0 before a barrier that every thread passed.
                fill(previous, unsafe { *ids.add(previous as usize) } as u64);
            }
            // SAFETY: every thread reaches the barrier; the prefix was written before it.
            let prefix = unsafe {
                sync_threads();
                if s.index > 0 {
                    *shared.prefix
                } else {
                    T::identity()
                }
            };
            // The segments of the next round and of the one reduced at this round's end,
            // read here so that the barrier of the store below orders the reads before
            // thread 0 rewrites the ids next round.
            // SAFETY: written by thread 0 in an earlier round, before its barrier.
            let (next_tile, later_tile) = unsafe {
                (
                    *ids.add(((round + 1) % stages) as usize) as u64,
                    *ids.add(((round + ahead) % stages) as usize) as u64,
                )
            };

            let mut running = prefix.combine(before);
            let mut step = |value: T| {
                let next = running.combine(value);
                let out = if exclusive { running } else { next };
                running = next;
                out
            };
            let (first, vector_start) = run_of(&s);
            match vector_start {
                Some(start) => {
                    for logical in 0..groups {
                        let g = if REVERSE_ORDER {
                            groups - 1 - logical
                        } else {
                            logical
                        };
                        let mut vectors = group(stage, &s, start, g);
                        for k in 0..group_items {
                            let k = if REVERSE_ORDER { group_items - 1 - k } else { k };
                            let (v, i) = (k / T::PER_VECTOR, k % T::PER_VECTOR);
                            step(T::from_words(vectors[v], i)).into_words(&mut vectors[v], i);
                        }
                        // Back into the stage in the rotated order of the reads.
                        unrotate(&mut vectors);
                        let address = stage_address(stage)
                            + ((start - aligned_low(&s)) as usize * size_of::<T>()) as u32;
                        for (j, words) in vectors.into_iter().enumerate() {
                            let v = (g * GROUP_VECTORS + (j ^ rotation)) as u32;
                            // SAFETY: this thread's own run, 16-byte aligned.
                            unsafe { store_shared_v4_f32(address + v * 16, words.map(f32::from_bits)) };
                        }
                    }
                }
                None => {
                    for q in first..(first + RUN as u64).min(s.end) {
                        let out = step(item(stage, &s, q));
                        if VECTOR {
                            let at = (physical(&s, q) - aligned_low(&s)) as usize;
                            // SAFETY: this thread's own element of the stage.
                            unsafe { *stage_pointer(stage).add(at) = out };
                        } else {
                            // SAFETY: q is a position of the row.
                            unsafe { *y.add(physical(&s, q) as usize) = out };
                        }
                    }
                }
            }
            // Aligned segments leave the stage in one bulk store; either way every thread
            // passes a barrier: the stage, the prefix, the warp totals and the ids read
            // above are free again.
            if VECTOR {
                let bytes = ((s.high - s.low) as usize * size_of::<T>()) as u32;
                // SAFETY: every thread calls it; the segment is aligned (VECTOR) and its
                // stage holds it from offset 0; the stage is rewritten only after the next
                // `start`, which waits for the store.
                unsafe { copy.store(stage_address(stage), y.add(s.low as usize) as *mut u8, bytes) };
            } else {
                // SAFETY: every thread reaches it.
                unsafe { sync_threads() };
            }
            round += 1;
            tile = next_tile;
            reduced.copy_within(1.., 0);
            let later = round + ahead - 1;
            if later_tile < tiles {
                // SAFETY: every thread calls it (the tile is uniform); the fill was started.
                unsafe { copy.wait(later % stages, later / stages) };
                let r = reduce(later % stages, later_tile);
                // Constant indices keep the array in registers.
                if ahead == SEGMENT_LOOK_BACK_DELAY {
                    reduced[SEGMENT_LOOK_BACK_DELAY as usize - 1] = r;
                } else {
                    reduced[0] = r;
                }
            }
        }
        // SAFETY: every thread calls it.
        unsafe { copy.finish() };
    }

    /// Scans one row per block, tile by tile, carrying the row's running sum: each
    /// tile is a block scan of `ITEMS` consecutive elements per thread (128-bit loads and
    /// stores), then a barrier before the next tile reuses the warp totals.
    ///
    /// # Safety
    /// `x` and `y` hold `outer * scan` elements, 16-byte aligned (they may be the same
    /// array); `scan` is a multiple of `ITEMS`; one block of `BLOCK_THREADS` per row
    /// with `SHARED_BYTES` of dynamic shared memory.
    #[inline(always)]
    pub unsafe fn rows<T: ScanValue, const ITEMS: usize, const REVERSE_ORDER: bool>(
        x: *const T,
        y: *mut T,
        problem: ScanProblem,
        options: u32,
    ) {
        let mut carver = SharedCarver::new();
        // SAFETY: SHARED_BYTES covers ROWS_WARPS values.
        let warp_totals: *mut T = unsafe { carver.take(ROWS_WARPS) };
        let scan = problem.scan;
        let base = block_idx_x() as u64 * scan;
        let exclusive = options & EXCLUSIVE != 0;
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
    /// of `BLOCK_THREADS` threads with `COLUMN_SHARED_BYTES` of dynamic shared memory.
    #[inline(always)]
    pub unsafe fn columns<T: ScanValue, const BATCH: usize>(
        x: *const T,
        y: *mut T,
        problem: ScanProblem,
        options: u32,
        parts: u32,
    ) {
        let ScanProblem { outer, scan, inner } = problem;
        let width = BLOCK_THREADS / parts;
        let (lane, part) = (thread_idx_x() % width, thread_idx_x() / width);
        let column = block_idx_x() as u64 * width as u64 + lane as u64;
        let valid = column < outer * inner;
        // SAFETY: COLUMN_SHARED_BYTES holds two totals per thread.
        let totals: *mut T = unsafe { SharedCarver::new().take(2 * BLOCK_THREADS as usize) };
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
        let load = |batch_first: u64| -> [T; BATCH] {
            let first = part_start(batch_first);
            let mut at = offset(first);
            core::array::from_fn(|k| {
                let item = if valid && first + (k as u64) < scan {
                    // SAFETY: row first + k of a column below outer * inner.
                    unsafe { *x.offset(at) }
                } else {
                    T::identity()
                };
                at += step;
                item
            })
        };
        let slot =
            |buffer: usize, part: u32| buffer * BLOCK_THREADS as usize + (part * width + lane) as usize;
        let mut carry = T::identity();
        let mut batch_first = 0;
        let mut items = load(0);
        let mut buffer = 0;
        while batch_first < scan {
            let next = load(batch_first + batch_rows);
            let mut own = T::identity();
            for &item in &items {
                own = own.combine(item);
            }
            // The parts before this thread's in the batch, and the whole batch.
            let (before, batch_total) = if parts == 1 {
                (T::identity(), own)
            } else {
                // SAFETY: this thread's slot of this batch's buffer; the other buffer's
                // readers of the batch before passed this batch's barrier below before any
                // thread writes it again.
                unsafe {
                    *totals.add(slot(buffer, part)) = own;
                    sync_threads();
                }
                let (mut before, mut batch_total) = (T::identity(), T::identity());
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
                    unsafe { *y.offset(at) = if exclusive { running } else { sum } };
                }
                running = sum;
                at += step;
            }
            carry = carry.combine(batch_total);
            items = next;
            batch_first += batch_rows;
        }
    }

    /// Scans `ROWS` rows of `BLOCK_THREADS` columns per tile; tile ids run over the
    /// column blocks first, so a tile's predecessor down its columns started earlier.
    ///
    /// # Safety
    /// `x` and `y` hold `outer * scan * inner` elements (they may be the same array);
    /// the status holds `column_blocks * chunks` flags and `BLOCK_THREADS` values per
    /// tile after a zero counter; the grid has that many blocks of `BLOCK_THREADS`
    /// threads with `SHARED_BYTES` of dynamic shared memory.
    #[inline(always)]
    pub unsafe fn strided<T: ScanValue, const ROWS: usize>(
        x: *const T,
        y: *mut T,
        problem: ScanProblem,
        options: u32,
        status: LaunchStatus<T>,
        column_blocks: u64,
    ) {
        let shared = Shared::<T>::carve();
        let tiles = status.tiles(BLOCK_THREADS);
        // SAFETY: every thread calls it; the counter heads the status.
        let tile = unsafe { shared.next_tile(status.counter_and_flags) };
        let (chunk, column_block) = (tile / column_blocks, tile % column_blocks);
        let ScanProblem { outer, scan, inner } = problem;
        let column = column_block * BLOCK_THREADS as u64 + thread_idx_x() as u64;
        let valid = column < outer * inner;
        let base = (column / inner) * scan * inner + column % inner;
        let reverse = options & REVERSE != 0;
        let address = |r: u64| base + if reverse { scan - 1 - r } else { r } * inner;
        let first_row = chunk * ROWS as u64;

        let mut items = [T::identity(); ROWS];
        for (k, item) in items.iter_mut().enumerate() {
            if valid && first_row + (k as u64) < scan {
                // SAFETY: column < outer * inner and row < scan.
                *item = unsafe { *x.add(address(first_row + k as u64) as usize) };
            }
        }
        let mut total = T::identity();
        for &item in &items {
            total = total.combine(item);
        }
        let prefix = if chunk == 0 {
            // SAFETY: every thread calls it; this tile's status.
            unsafe { tiles.publish_each(tile, total, INCLUSIVE) };
            T::identity()
        } else {
            // SAFETY: as above; the chain down the column block ends at chunk 0,
            // which publishes its inclusive prefix without waiting.
            unsafe {
                tiles.publish_each(tile, total, AGGREGATE);
                let prefix = tiles.look_back_block(tile, column_blocks, shared.flag);
                tiles.publish_each(tile, prefix.combine(total), INCLUSIVE);
                prefix
            }
        };

        let exclusive = options & EXCLUSIVE != 0;
        let mut running = prefix;
        for (k, &item) in items.iter().enumerate() {
            let next = running.combine(item);
            if valid && first_row + (k as u64) < scan {
                // SAFETY: column < outer * inner and row < scan.
                unsafe {
                    *y.add(address(first_row + k as u64) as usize) = if exclusive { running } else { next }
                };
            }
            running = next;
        }
    }

    macro_rules! entry_points {
        ($t:ty, [$($contiguous:ident: $vector:literal, $reverse:literal;)*], $strided:ident) => {
            $(
                /// # Safety
                /// See [`contiguous`].
                #[unsafe(no_mangle)]
                pub unsafe extern "ptx-kernel" fn $contiguous(
                    x: *const $t,
                    y: *mut $t,
                    problem: ScanProblem,
                    options: u32,
                    status: LaunchStatus<$t>,
                ) {
                    const ITEMS: usize = items_per_thread(size_of::<$t>());
                    // SAFETY: forwarded from the launch's contract.
                    unsafe { contiguous::<$t, ITEMS, $vector, $reverse>(x, y, problem, options, status) }
                }
            )*

            /// # Safety
            /// See [`strided`].
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $strided(
                x: *const $t,
                y: *mut $t,
                problem: ScanProblem,
                options: u32,
                status: LaunchStatus<$t>,
                column_blocks: u64,
            ) {
                const ROWS: usize = strided_rows(size_of::<$t>()) as usize;
                // SAFETY: forwarded from the launch's contract.
                unsafe { strided::<$t, ROWS>(x, y, problem, options, status, column_blocks) }
            }
        };
    }

    macro_rules! segments_entry_points {
        ($($t:ty: [$($name:ident: $vector:literal, $reverse:literal;)*])*) => {$($(
            /// # Safety
            /// See [`segments`].
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $name(
                x: *const $t,
                y: *mut $t,
                problem: ScanProblem,
                options: u32,
                status: LaunchStatus<$t>,
                stages: u32,
            ) {
                const RUN: usize = segment_run(size_of::<$t>(), $vector) as usize;
                // SAFETY: forwarded from the launch's contract.
                unsafe { segments::<$t, RUN, $vector, $reverse>(x, y, problem, options, status, stages) }
            }
        )*)*};
    }

    segments_entry_points! {
        f32: [scan_segments_f32: false, false; scan_segments_reverse_f32: false, true;
            scan_segments_vector_f32: true, false; scan_segments_vector_reverse_f32: true, true;]
        f64: [scan_segments_f64: false, false; scan_segments_reverse_f64: false, true;
            scan_segments_vector_f64: true, false; scan_segments_vector_reverse_f64: true, true;]
        i32: [scan_segments_i32: false, false; scan_segments_reverse_i32: false, true;
            scan_segments_vector_i32: true, false; scan_segments_vector_reverse_i32: true, true;]
        i64: [scan_segments_i64: false, false; scan_segments_reverse_i64: false, true;
            scan_segments_vector_i64: true, false; scan_segments_vector_reverse_i64: true, true;]
    }

    macro_rules! rows_entry_points {
        ($($t:ty: $forward:ident, $reverse:ident;)*) => {$(
            /// # Safety
            /// See [`rows`].
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $forward(x: *const $t, y: *mut $t, problem: ScanProblem, options: u32) {
                const ITEMS: usize = items_per_thread(size_of::<$t>());
                // SAFETY: forwarded from the launch's contract.
                unsafe { rows::<$t, ITEMS, false>(x, y, problem, options) }
            }

            /// # Safety
            /// See [`rows`].
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $reverse(x: *const $t, y: *mut $t, problem: ScanProblem, options: u32) {
                const ITEMS: usize = items_per_thread(size_of::<$t>());
                // SAFETY: forwarded from the launch's contract.
                unsafe { rows::<$t, ITEMS, true>(x, y, problem, options) }
            }
        )*};
    }

    macro_rules! columns_entry_points {
        ($($t:ty: $name:ident;)*) => {$(
            /// # Safety
            /// See [`columns`]; the grid covers `outer * inner` columns.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $name(
                x: *const $t,
                y: *mut $t,
                problem: ScanProblem,
                options: u32,
                parts: u32,
            ) {
                const BATCH: usize = column_batch(size_of::<$t>());
                // SAFETY: forwarded from the launch's contract.
                unsafe { columns::<$t, BATCH>(x, y, problem, options, parts) }
            }
        )*};
    }

    columns_entry_points! {
        f32: scan_columns_f32;
        f64: scan_columns_f64;
        i32: scan_columns_i32;
        i64: scan_columns_i64;
    }

    rows_entry_points! {
        f32: scan_rows_f32, scan_rows_reverse_f32;
        f64: scan_rows_f64, scan_rows_reverse_f64;
        i32: scan_rows_i32, scan_rows_reverse_i32;
        i64: scan_rows_i64, scan_rows_reverse_i64;
    }

    macro_rules! dtype_entry_points {
        ($($t:ty: $plain:ident, $reverse:ident, $vector:ident, $vector_reverse:ident, $strided:ident;)*) => {$(
            entry_points!(
                $t,
                [$plain: false, false; $reverse: false, true; $vector: true, false; $vector_reverse: true, true;],
                $strided
            );
        )*};
    }

    dtype_entry_points! {
        f32: scan_contiguous_f32, scan_contiguous_reverse_f32, scan_contiguous_vector_f32,
            scan_contiguous_vector_reverse_f32, scan_strided_f32;
        f64: scan_contiguous_f64, scan_contiguous_reverse_f64, scan_contiguous_vector_f64,
            scan_contiguous_vector_reverse_f64, scan_strided_f64;
        i32: scan_contiguous_i32, scan_contiguous_reverse_i32, scan_contiguous_vector_i32,
            scan_contiguous_vector_reverse_i32, scan_strided_i32;
        i64: scan_contiguous_i64, scan_contiguous_reverse_i64, scan_contiguous_vector_i64,
            scan_contiguous_vector_reverse_i64, scan_strided_i64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H100_SHARED: u32 = 227 * 1024;

    fn problem(outer: u64, scan: u64, inner: u64) -> ScanProblem {
        ScanProblem { outer, scan, inner }
    }

    #[test]
    fn the_shape_picks_the_kernel() {
        assert_eq!(
            plan(&problem(32768, 32768, 1), 4, H100_SHARED),
            ScanPlan::Rows { rows: 32768 }
        );
        assert_eq!(
            plan(&problem(2048, 4100, 1), 4, H100_SHARED),
            ScanPlan::Contiguous {
                tiles: 2050,
                vector: true
            }
        );
        // 2^28 in segments of SEGMENT_THREADS runs of 48 elements, three 72 KiB stages.
        assert_eq!(
            plan(&problem(1, 1 << 28, 1), 4, H100_SHARED),
            ScanPlan::Segments {
                tiles: (1u64 << 28).div_ceil(384 * 48),
                vector: true,
                stages: 3
            }
        );
        // Unaligned rows: odd runs of 47; two stages where a block has 163 KiB (A100);
        // one would fit 99 KiB, but overlaps no copy with the scan: the contiguous
        // kernel takes the rows.
        assert_eq!(
            plan(&problem(2, 1 << 20 | 1, 1), 4, 163 * 1024),
            ScanPlan::Segments {
                tiles: 2 * (1u64 << 20 | 1).div_ceil(384 * 47),
                vector: false,
                stages: 2
            }
        );
        assert!(matches!(
            plan(&problem(2, 1 << 20, 1), 4, 99 * 1024),
            ScanPlan::Contiguous { .. }
        ));
        assert_eq!(
            kernel_name(
                &plan(&problem(3, 100_001, 1), 8, H100_SHARED),
                ScanDType::F64,
                true
            ),
            "scan_segments_reverse_f64"
        );
        assert_eq!(
            plan(&problem(3, 16000, 1), 4, H100_SHARED).threads(),
            BLOCK_THREADS
        );
        assert!(matches!(
            plan(&problem(3, 16000, 1), 4, H100_SHARED),
            ScanPlan::Contiguous { .. }
        ));
        assert_eq!(
            plan(&problem(3, 7, 1), 8, H100_SHARED),
            ScanPlan::Contiguous {
                tiles: 1,
                vector: false
            }
        );
        // Axis 0 of the headline: a thread per column; fewer columns take the look-back.
        assert_eq!(
            plan(&problem(1, 32768, 32768), 4, H100_SHARED),
            ScanPlan::Columns {
                column_blocks: 128,
                parts: 1
            }
        );
        // Fewer columns share the rows among up to 8 threads each; under 4096, the
        // look-back.
        assert_eq!(
            plan(&problem(2, 32768, 5000), 4, H100_SHARED),
            ScanPlan::Columns {
                column_blocks: 157,
                parts: 4
            }
        );
        assert_eq!(
            plan(&problem(1, 32768, 4095), 4, H100_SHARED),
            ScanPlan::Strided {
                column_blocks: 16,
                chunks: 512
            }
        );
        assert_eq!(
            kernel_name(
                &plan(&problem(4096, 8192, 1), 8, H100_SHARED),
                ScanDType::I64,
                true
            ),
            "scan_rows_reverse_i64"
        );
    }
}
