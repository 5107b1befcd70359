//! Cumulative sum along one axis, exclusive (`y[i] = x[0] + ... + x[i-1]`, `y[0] = 0`)
//! or inclusive, forward or reversed, in one pass that reads the input once and writes
//! the output once (in place allowed).
//!
//! The array is seen as `[outer, scan, inner]`. Four kernels, chosen by the shape:
//! - `rows` (`inner == 1`, at least `ROWS_PLAN_MIN_ROWS` rows of whole 128-bit runs, a
//!   tile or longer): a block per row walks the row tile by tile with a carry, the next
//!   tile's loads in flight during the current one's scan; no look-back.
//!
//! The other three cut the work into tiles that take their ids from a counter in
//! launch order and chain their prefixes by decoupled look-back (`block::TileChain`,
//! one 64-bit word per tile for 4-byte values), so any shape fills the GPU:
//! - `segments` (`inner == 1`, rows of at least `segment_items`): each row cut into
//!   segments of `SEGMENT_TILES` tiles; a block scans its segment tile by tile with a
//!   carry like `rows`, stages its local results in shared memory, looks back once for
//!   the segment's prefix within the row, then writes;
//! - `contiguous` (other `inner == 1`): the rows laid end to end as one flat sequence of
//!   `TILE_ITEMS`-element tiles; each thread holds `ITEMS` consecutive elements
//!   (128-bit loads when rows keep 16-byte alignment); a new row starts a new segment,
//!   so one tile may hold the ends of several short rows, and a long row spans many
//!   tiles;
//! - `strided` (`inner > 1`): one thread per column (the `outer * inner` lanes of the
//!   scan), tiles of `BLOCK_THREADS` columns by `rows` rows; the look-back runs down
//!   each column block, one running sum per column.
//!
//! Reversal maps logical position `q` to `len - 1 - q` (flat for contiguous, per
//! column for strided).

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

/// Threads per block of the segments kernel (the 2^28 scan on the H100: 1.13 ms with
/// 256 threads and two blocks per SM, 1.09 ms with 512 and one).
pub const SEGMENT_THREADS: u32 = 512;
/// Warps per segments block.
pub const SEGMENT_WARPS: usize = (SEGMENT_THREADS / 32) as usize;
/// Tiles (`SEGMENT_THREADS * items_per_thread`) of one segment of a long row: a
/// `segments` block stages its segment's local scan in shared memory, so it looks back
/// once per segment.
pub const SEGMENT_TILES: usize = 6;
/// `segments` blocks that must fit one SM (its shared memory holds one).
pub const SEGMENT_BLOCKS_PER_SM: u32 = 1;
/// Dynamic shared memory of a `segments` block: the look-back kernels' plus the staged
/// segment (`VECTORS_PER_THREAD` 16-byte vectors per thread and tile).
pub const SEGMENT_SHARED_BYTES: u32 =
    SHARED_BYTES + (SEGMENT_TILES * VECTORS_PER_THREAD * 16) as u32 * SEGMENT_THREADS;

/// Elements of one segment.
pub const fn segment_items(element_bytes: usize) -> u64 {
    SEGMENT_TILES as u64 * SEGMENT_THREADS as u64 * items_per_thread(element_bytes) as u64
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
        && SEGMENT_WARPS * 8 <= WARPS * 16
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
    /// Few long rows: each row cut into segments of `segment_items`, a block per
    /// segment, chained by look-back within the row.
    Segments {
        /// Segments of all rows.
        tiles: u64,
        vector: bool,
    },
    Strided {
        /// Blocks of `BLOCK_THREADS` columns.
        column_blocks: u64,
        /// Tiles down the scanned axis.
        chunks: u64,
    },
}

impl ScanPlan {
    /// Tiles, one block each.
    pub const fn tiles(&self) -> u64 {
        match *self {
            ScanPlan::Rows { rows } => rows,
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
            ScanPlan::Contiguous { .. } | ScanPlan::Strided { .. } => BLOCK_THREADS,
        }
    }

    /// Dynamic shared memory per block.
    pub const fn shared_bytes(&self) -> u32 {
        match self {
            ScanPlan::Segments { .. } => SEGMENT_SHARED_BYTES,
            _ => SHARED_BYTES,
        }
    }

    /// Values each tile publishes: one, or one per column.
    pub const fn status_width(&self) -> u32 {
        match self {
            ScanPlan::Rows { .. } => 0,
            ScanPlan::Contiguous { .. } | ScanPlan::Segments { .. } => 1,
            ScanPlan::Strided { .. } => BLOCK_THREADS,
        }
    }
}

/// The plan for a non-empty problem of `element_bytes`-byte elements.
pub const fn plan(problem: &ScanProblem, element_bytes: usize) -> ScanPlan {
    let elements = problem.outer * problem.scan * problem.inner;
    let per_vector = (16 / element_bytes) as u64;
    let aligned = problem.scan.is_multiple_of(per_vector);
    let whole_runs = problem
        .scan
        .is_multiple_of(items_per_thread(element_bytes) as u64);
    let long = problem.scan >= tile_items(element_bytes);
    if problem.inner == 1 && whole_runs && long && problem.outer >= ROWS_PLAN_MIN_ROWS {
        ScanPlan::Rows { rows: problem.outer }
    } else if problem.inner == 1 && problem.scan >= segment_items(element_bytes) {
        ScanPlan::Segments {
            tiles: problem.outer * problem.scan.div_ceil(segment_items(element_bytes)),
            vector: aligned,
        }
    } else if problem.inner == 1 {
        ScanPlan::Contiguous {
            tiles: elements.div_ceil(tile_items(element_bytes)),
            vector: aligned,
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
/// rows, rows reversed, then segments as contiguous.
const NAMES: [[&str; 4]; 11] = [
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
];

/// The entry point for a plan, dtype and direction.
pub const fn kernel_name(plan: &ScanPlan, dtype: ScanDType, reverse: bool) -> &'static str {
    let variant = match plan {
        ScanPlan::Contiguous { vector, .. } => 2 * (*vector as usize) + reverse as usize,
        ScanPlan::Strided { .. } => 4,
        ScanPlan::Rows { .. } => 5 + reverse as usize,
        ScanPlan::Segments { vector, .. } => 7 + 2 * (*vector as usize) + reverse as usize,
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
pub const KERNELS: [&str; 44] = {
    let mut all = [""; 44];
    let mut i = 0;
    while i < 44 {
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
        Coherent, SharedCarver, Shuffle, atomic_add_u32, block_dim_x, block_idx_x, load_global_v4,
        load_shared_v4_f32, shared_base, store_global_v4, store_shared_v4_f32, sync_threads, thread_idx_x,
    };

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

    /// Scans one segment of a long row per block (`segments_per_row` segments per row,
    /// ids in launch order): tile by tile like [`rows`], carrying the segment's sum and
    /// staging each thread's local results in shared memory; then one look-back for
    /// the prefix of the segment within its row; then the staged results plus the
    /// prefix go out.
    ///
    /// # Safety
    /// As [`contiguous`] (`VECTOR` only when `scan` is a multiple of `PER_VECTOR`), with
    /// one block of `SEGMENT_THREADS` per segment and `SEGMENT_SHARED_BYTES`.
    #[inline(always)]
    pub unsafe fn segments<
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
        const { assert!(ITEMS / T::PER_VECTOR == VECTORS_PER_THREAD) };
        let shared = Shared::<T>::carve();
        let chain = T::chain(&status);
        // SAFETY: every thread calls it; the counter heads the status.
        let tile = unsafe { shared.next_tile(status.counter_and_flags) };
        let scan = problem.scan;
        let length = segment_items(size_of::<T>());
        let per_row = scan.div_ceil(length);
        let (row, segment) = (tile / per_row, tile % per_row);
        let begin = segment * length;
        let end = (begin + length).min(scan);
        let base = row * scan;
        let thread = thread_idx_x();
        let tile_items = ITEMS as u64 * SEGMENT_THREADS as u64;
        // Logical position q of the row lives at physical `reverse ? scan - 1 - q : q`.
        let physical = |q: u64| base + if REVERSE_ORDER { scan - 1 - q } else { q };
        // This thread's first logical position in tile t of the segment.
        let first = |t: usize| begin + t as u64 * tile_items + thread as u64 * ITEMS as u64;
        // Physical start of this thread's run of tile t when it is whole and vectorized.
        let vector_start = |t: usize| {
            let last = first(t) + ITEMS as u64 - 1;
            (VECTOR && last < end).then(|| physical(if REVERSE_ORDER { last } else { first(t) }))
        };
        let load = |t: usize| {
            let mut items = [T::identity(); ITEMS];
            if let Some(start) = vector_start(t) {
                // SAFETY: the run lies inside the row, 16-byte aligned.
                items = unsafe { load_run::<T, ITEMS, REVERSE_ORDER>(x, start) };
            } else {
                for (k, item) in items.iter_mut().enumerate() {
                    let q = first(t) + k as u64;
                    if q < end {
                        // SAFETY: q is a position of the row.
                        *item = unsafe { *x.add(physical(q) as usize) };
                    }
                }
            }
            items
        };
        // Vector v of this thread in staged tile t: consecutive threads, consecutive
        // 16 bytes (no bank conflicts).
        let staged = |t: usize, v: usize| {
            shared_base()
                + SHARED_BYTES
                + (((t * VECTORS_PER_THREAD + v) as u32) * SEGMENT_THREADS + thread) * 16
        };
        let tiles = (end - begin).div_ceil(tile_items) as usize;

        // Local scan of the segment, staged; the next tile's loads fly meanwhile.
        let exclusive = options & EXCLUSIVE != 0;
        let mut carry = T::identity();
        let mut items = load(0);
        for t in 0..SEGMENT_TILES {
            if t >= tiles {
                break;
            }
            let next = if t + 1 < tiles {
                load(t + 1)
            } else {
                [T::identity(); ITEMS]
            };
            let warp_totals = shared.warp_totals as *mut T;
            // SAFETY: every thread calls it; the warp totals are this block's, large
            // enough for SEGMENT_WARPS values of T.
            let total =
                unsafe { scan_tile::<T, ITEMS, SEGMENT_WARPS>(&mut items, carry, exclusive, warp_totals) };
            for v in 0..VECTORS_PER_THREAD {
                let mut words = [0u32; 4];
                for i in 0..T::PER_VECTOR {
                    items[v * T::PER_VECTOR + i].into_words(&mut words, i);
                }
                // SAFETY: this thread's own slot of the staged segment, 16-byte aligned.
                unsafe { store_shared_v4_f32(staged(t, v), words.map(f32::from_bits)) };
            }
            carry = carry.combine(total);
            items = next;
            // SAFETY: every thread reaches it (t < tiles is uniform); the next tile
            // rewrites the warp totals.
            unsafe { sync_threads() };
        }

        // The segment's prefix within its row: the first segment publishes its total
        // as inclusive at once, so every chain ends inside the row.
        if thread == 0 {
            let flag = if segment == 0 { INCLUSIVE } else { AGGREGATE };
            // SAFETY: this tile's status.
            unsafe { chain.publish(tile, carry, flag) };
        }
        if segment > 0 && thread < 32 {
            // SAFETY: warp 0 entire; the row's first segment never waits.
            let prefix = unsafe { chain.look_back::<LOOK_BACK_WINDOW>(tile) };
            if thread == 0 {
                // SAFETY: thread 0 alone writes the shared prefix before the barrier; this
                // tile's status.
                unsafe {
                    *shared.prefix = prefix;
                    chain.publish(tile, prefix.combine(carry), INCLUSIVE);
                }
            }
        }
        // SAFETY: every thread reaches the barrier; the prefix was written before it.
        let prefix = unsafe {
            sync_threads();
            if segment > 0 {
                *shared.prefix
            } else {
                T::identity()
            }
        };

        for t in 0..tiles.min(SEGMENT_TILES) {
            let mut items = [T::identity(); ITEMS];
            for v in 0..VECTORS_PER_THREAD {
                // SAFETY: written by this thread above.
                let words = unsafe { load_shared_v4_f32(staged(t, v)) }.map(f32::to_bits);
                for i in 0..T::PER_VECTOR {
                    items[v * T::PER_VECTOR + i] = prefix.combine(T::from_words(words, i));
                }
            }
            if let Some(start) = vector_start(t) {
                // SAFETY: the run lies inside the row, 16-byte aligned.
                unsafe { store_run::<T, ITEMS, REVERSE_ORDER>(y, start, &items) };
            } else {
                for (k, &item) in items.iter().enumerate() {
                    let q = first(t) + k as u64;
                    if q < end {
                        // SAFETY: q is a position of the row.
                        unsafe { *y.add(physical(q) as usize) = item };
                    }
                }
            }
        }
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
            ) {
                const ITEMS: usize = items_per_thread(size_of::<$t>());
                // SAFETY: forwarded from the launch's contract.
                unsafe { segments::<$t, ITEMS, $vector, $reverse>(x, y, problem, options, status) }
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

    fn problem(outer: u64, scan: u64, inner: u64) -> ScanProblem {
        ScanProblem { outer, scan, inner }
    }

    #[test]
    fn the_shape_picks_the_kernel() {
        assert_eq!(plan(&problem(32768, 32768, 1), 4), ScanPlan::Rows { rows: 32768 });
        assert_eq!(
            plan(&problem(2048, 4100, 1), 4),
            ScanPlan::Contiguous {
                tiles: 2050,
                vector: true
            }
        );
        // 2^28 in segments of SEGMENT_TILES * SEGMENT_THREADS * 16 elements.
        assert_eq!(
            plan(&problem(1, 1 << 28, 1), 4),
            ScanPlan::Segments {
                tiles: (1u64 << 28).div_ceil(segment_items(4)),
                vector: true
            }
        );
        assert_eq!(
            kernel_name(&plan(&problem(3, 100_001, 1), 8), ScanDType::F64, true),
            "scan_segments_reverse_f64"
        );
        assert_eq!(plan(&problem(3, 24575, 1), 4).threads(), BLOCK_THREADS);
        assert!(matches!(
            plan(&problem(3, 24575, 1), 4),
            ScanPlan::Contiguous { .. }
        ));
        assert_eq!(
            plan(&problem(3, 7, 1), 8),
            ScanPlan::Contiguous {
                tiles: 1,
                vector: false
            }
        );
        assert_eq!(
            plan(&problem(1, 32768, 32768), 4),
            ScanPlan::Strided {
                column_blocks: 128,
                chunks: 512
            }
        );
        assert_eq!(
            kernel_name(&plan(&problem(4096, 8192, 1), 8), ScanDType::I64, true),
            "scan_rows_reverse_i64"
        );
    }
}
