//! The segments kernel: long rows of `[outer, scan]` cut into segments of one run per
//! thread, chained by decoupled look-back within each row; persistent blocks, one per
//! SM, walk the segments through shared-memory stages that bulk copies (sm_90) fill and
//! drain while the block scans.

use super::{LaunchStatus, SHARED_BYTES, ScanOperands, ScanProblem, layout_variant};
use crate::element::{Sum, Summed};
use crate::launch::{DevicePtr, DevicePtrMut, Kernel, Launch, LaunchGeometry, kernel_args};

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

// Runs 4 mod 8 vectors long; the mbarriers 8-byte aligned; the warp totals (8-byte
// values at most) 16 bytes into the look-back block's shared memory.
const _: () = assert!(
    SEGMENT_VECTORS % 8 == 4
        && SEGMENT_BARRIERS_OFFSET.is_multiple_of(8)
        && 16 + SEGMENT_WARPS * 8 <= SHARED_BYTES as usize
);

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
pub const fn stages(max_shared_bytes: u32) -> u32 {
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

/// Few long rows: segments of `segment_items` chained by look-back within each row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentsPlan {
    /// Segments of all rows.
    pub tiles: u64,
    /// Whether rows keep 16-byte alignment (whole vector runs, bulk stores).
    pub vector: bool,
    /// Shared-memory stages per block.
    pub stages: u32,
    /// Persistent blocks: `SEGMENT_BLOCKS_PER_SM` per SM, at most one per segment.
    pub blocks: u64,
}

impl SegmentsPlan {
    /// The plan of `tiles` segments in blocks of `stages` stages on `multiprocessors`
    /// SMs.
    pub const fn new(tiles: u64, vector: bool, stages: u32, multiprocessors: u32) -> Self {
        let resident = (multiprocessors * SEGMENT_BLOCKS_PER_SM) as u64;
        Self {
            tiles,
            vector,
            stages,
            blocks: if tiles < resident { tiles } else { resident },
        }
    }

    /// The launch of the scan, with its look-back status in `scratch`, laid out and
    /// zeroed as `ScanPlan::scratch` says.
    pub fn launch<T: SegmentsKernel>(
        &self,
        operands: ScanOperands<T>,
        scratch: DevicePtrMut<u8>,
    ) -> Launch<SegmentsArgs<T>> {
        self.launch_carried(operands, scratch, RowCarries::NONE)
    }

    /// The launch of the scan with each row's sum starting at its `carries`.
    pub fn launch_carried<T: SegmentsKernel>(
        &self,
        operands: ScanOperands<T>,
        scratch: DevicePtrMut<u8>,
        carries: RowCarries<T>,
    ) -> Launch<SegmentsArgs<T>> {
        let (x, y, problem, options) = operands.parts();
        let status = LaunchStatus::in_scratch(scratch, self.tiles, 1);
        let kernels = [
            T::SEGMENTS,
            T::SEGMENTS_REVERSE,
            T::SEGMENTS_VECTOR,
            T::SEGMENTS_VECTOR_REVERSE,
        ];
        let kernel = layout_variant(kernels, self.vector, operands.reverse());
        let geometry = LaunchGeometry::linear(self.blocks, SEGMENT_THREADS)
            .with_shared(segment_shared_bytes(self.stages));
        let stages = self.stages;
        Launch::new(
            kernel,
            geometry,
            SegmentsArgs {
                x,
                y,
                problem,
                options,
                status,
                stages,
                carries: carries.carries,
                terms: carries.terms,
            },
        )
    }
}

/// What a segments launch's rows start from: `terms` sums per row,
/// `carries[term * outer + row]`, added in term order before the row's first element
/// (the totals of a device group's shards before this one); none when `terms` is 0.
#[derive(Debug, Clone, Copy)]
pub struct RowCarries<T: Summed> {
    pub carries: DevicePtr<Sum<T>>,
    pub terms: u64,
}

impl<T: Summed> RowCarries<T> {
    pub const NONE: Self = Self {
        carries: DevicePtr::NULL,
        terms: 0,
    };
}

kernel_args! {
    /// The segments kernel's arguments: the scan operands, the look-back status of
    /// every segment, the stages of each block, and the rows' carries
    /// ([`RowCarries`]).
    pub struct SegmentsArgs<T: Summed> {
        pub x: DevicePtr<T>,
        pub y: DevicePtrMut<T>,
        pub problem: ScanProblem,
        pub options: u32,
        pub status: LaunchStatus<Sum<T>>,
        pub stages: u32,
        pub carries: DevicePtr<Sum<T>>,
        pub terms: u64,
    }
    impl SegmentsKernel for f32 {
        const SEGMENTS = "scan_segments_f32"
            => kernel::segments::<f32, { segment_run(4, false) as usize }, false, false>, bounds(SEGMENT_THREADS, SEGMENT_BLOCKS_PER_SM);
        const SEGMENTS_REVERSE = "scan_segments_reverse_f32"
            => kernel::segments::<f32, { segment_run(4, false) as usize }, false, true>, bounds(SEGMENT_THREADS, SEGMENT_BLOCKS_PER_SM);
        const SEGMENTS_VECTOR = "scan_segments_vector_f32"
            => kernel::segments::<f32, { segment_run(4, true) as usize }, true, false>, bounds(SEGMENT_THREADS, SEGMENT_BLOCKS_PER_SM);
        const SEGMENTS_VECTOR_REVERSE = "scan_segments_vector_reverse_f32"
            => kernel::segments::<f32, { segment_run(4, true) as usize }, true, true>, bounds(SEGMENT_THREADS, SEGMENT_BLOCKS_PER_SM);
    }
    impl SegmentsKernel for f64 {
        const SEGMENTS = "scan_segments_f64"
            => kernel::segments::<f64, { segment_run(8, false) as usize }, false, false>, bounds(SEGMENT_THREADS, SEGMENT_BLOCKS_PER_SM);
        const SEGMENTS_REVERSE = "scan_segments_reverse_f64"
            => kernel::segments::<f64, { segment_run(8, false) as usize }, false, true>, bounds(SEGMENT_THREADS, SEGMENT_BLOCKS_PER_SM);
        const SEGMENTS_VECTOR = "scan_segments_vector_f64"
            => kernel::segments::<f64, { segment_run(8, true) as usize }, true, false>, bounds(SEGMENT_THREADS, SEGMENT_BLOCKS_PER_SM);
        const SEGMENTS_VECTOR_REVERSE = "scan_segments_vector_reverse_f64"
            => kernel::segments::<f64, { segment_run(8, true) as usize }, true, true>, bounds(SEGMENT_THREADS, SEGMENT_BLOCKS_PER_SM);
    }
    impl SegmentsKernel for i32 {
        const SEGMENTS = "scan_segments_i32"
            => kernel::segments::<i32, { segment_run(4, false) as usize }, false, false>, bounds(SEGMENT_THREADS, SEGMENT_BLOCKS_PER_SM);
        const SEGMENTS_REVERSE = "scan_segments_reverse_i32"
            => kernel::segments::<i32, { segment_run(4, false) as usize }, false, true>, bounds(SEGMENT_THREADS, SEGMENT_BLOCKS_PER_SM);
        const SEGMENTS_VECTOR = "scan_segments_vector_i32"
            => kernel::segments::<i32, { segment_run(4, true) as usize }, true, false>, bounds(SEGMENT_THREADS, SEGMENT_BLOCKS_PER_SM);
        const SEGMENTS_VECTOR_REVERSE = "scan_segments_vector_reverse_i32"
            => kernel::segments::<i32, { segment_run(4, true) as usize }, true, true>, bounds(SEGMENT_THREADS, SEGMENT_BLOCKS_PER_SM);
    }
    impl SegmentsKernel for i64 {
        const SEGMENTS = "scan_segments_i64"
            => kernel::segments::<i64, { segment_run(8, false) as usize }, false, false>, bounds(SEGMENT_THREADS, SEGMENT_BLOCKS_PER_SM);
        const SEGMENTS_REVERSE = "scan_segments_reverse_i64"
            => kernel::segments::<i64, { segment_run(8, false) as usize }, false, true>, bounds(SEGMENT_THREADS, SEGMENT_BLOCKS_PER_SM);
        const SEGMENTS_VECTOR = "scan_segments_vector_i64"
            => kernel::segments::<i64, { segment_run(8, true) as usize }, true, false>, bounds(SEGMENT_THREADS, SEGMENT_BLOCKS_PER_SM);
        const SEGMENTS_VECTOR_REVERSE = "scan_segments_vector_reverse_i64"
            => kernel::segments::<i64, { segment_run(8, true) as usize }, true, true>, bounds(SEGMENT_THREADS, SEGMENT_BLOCKS_PER_SM);
    }
    impl SegmentsKernel for half::bf16 {
        const SEGMENTS = "scan_segments_bf16"
            => kernel::segments::<half::bf16, { segment_run(2, false) as usize }, false, false>, bounds(SEGMENT_THREADS, SEGMENT_BLOCKS_PER_SM);
        const SEGMENTS_REVERSE = "scan_segments_reverse_bf16"
            => kernel::segments::<half::bf16, { segment_run(2, false) as usize }, false, true>, bounds(SEGMENT_THREADS, SEGMENT_BLOCKS_PER_SM);
        const SEGMENTS_VECTOR = "scan_segments_vector_bf16"
            => kernel::segments::<half::bf16, { segment_run(2, true) as usize }, true, false>, bounds(SEGMENT_THREADS, SEGMENT_BLOCKS_PER_SM);
        const SEGMENTS_VECTOR_REVERSE = "scan_segments_vector_reverse_bf16"
            => kernel::segments::<half::bf16, { segment_run(2, true) as usize }, true, true>, bounds(SEGMENT_THREADS, SEGMENT_BLOCKS_PER_SM);
    }
    impl SegmentsKernel for half::f16 {
        const SEGMENTS = "scan_segments_f16"
            => kernel::segments::<half::f16, { segment_run(2, false) as usize }, false, false>, bounds(SEGMENT_THREADS, SEGMENT_BLOCKS_PER_SM);
        const SEGMENTS_REVERSE = "scan_segments_reverse_f16"
            => kernel::segments::<half::f16, { segment_run(2, false) as usize }, false, true>, bounds(SEGMENT_THREADS, SEGMENT_BLOCKS_PER_SM);
        const SEGMENTS_VECTOR = "scan_segments_vector_f16"
            => kernel::segments::<half::f16, { segment_run(2, true) as usize }, true, false>, bounds(SEGMENT_THREADS, SEGMENT_BLOCKS_PER_SM);
        const SEGMENTS_VECTOR_REVERSE = "scan_segments_vector_reverse_f16"
            => kernel::segments::<half::f16, { segment_run(2, true) as usize }, true, true>, bounds(SEGMENT_THREADS, SEGMENT_BLOCKS_PER_SM);
    }
    entry points in ENTRY_POINTS;
}

/// The segments kernel of one element type: scalar or vector runs, forward or
/// reversed.
pub trait SegmentsKernel: Summed {
    const SEGMENTS: Kernel<SegmentsArgs<Self>>;
    const SEGMENTS_REVERSE: Kernel<SegmentsArgs<Self>>;
    const SEGMENTS_VECTOR: Kernel<SegmentsArgs<Self>>;
    const SEGMENTS_VECTOR_REVERSE: Kernel<SegmentsArgs<Self>>;
}

#[cfg(target_arch = "nvptx64")]
mod kernel {
    use super::*;
    use crate::block::ScanOp;
    use crate::block::{AGGREGATE, INCLUSIVE, TileChain, exclusive_scan};
    use crate::device::{
        STAGE_BARRIER_BYTES, SharedCarver, StagedCopy, atomic_add_u32, load_shared_v4_f32, shared_base,
        store_shared_v4_f32, sync_threads, thread_idx_x,
    };
    use crate::scan::tile::{ScanSum, ScanValue, Shared};
    use crate::scan::{EXCLUSIVE, LOOK_BACK_WINDOW};
    use crate::warp;

    const _: () =
        assert!(SEGMENT_BARRIERS_OFFSET + STAGE_BARRIER_BYTES * SEGMENT_MAX_STAGES <= SEGMENT_HEADER_BYTES);

    /// Scans long rows cut into segments of `SEGMENT_THREADS * RUN` elements (ids in
    /// launch order, `scan.div_ceil(segment)` per row), one persistent block per SM
    /// walking segments through `stages` shared-memory stages: while the block scans
    /// one stage, the copies of the next segments into the other stages are in flight
    /// (on sm_90 bulk copies that hold no registers). Per segment: each thread sums its
    /// run of `RUN` elements from shared memory, a block scan gives each run its offset
    /// and the segment its total, warp 0 looks back for the segment's prefix within its
    /// row, then each thread scans its run again into the stage, whose 16-byte-aligned
    /// middle leaves in one bulk store (the whole segment in aligned rows; the fewer
    /// than a vector at an unaligned row's ends are stored by their threads).
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
        args: SegmentsArgs<T>,
    ) {
        let SegmentsArgs {
            problem,
            options,
            status,
            stages,
            terms,
            ..
        } = args;
        let (x, y, carries) = (args.x.as_ptr(), args.y.as_mut_ptr(), args.carries.as_ptr());
        const GROUP_VECTORS: usize = 4;
        let group_items = GROUP_VECTORS * T::PER_VECTOR;
        let groups = RUN / group_items;
        let shared = Shared::<T::Sum>::carve();
        // SAFETY: takes nothing; the base of the block's dynamic shared memory.
        let generic_base: *mut u8 = unsafe { SharedCarver::new().take(0) };
        let ids = generic_base.wrapping_add(SEGMENT_IDS_OFFSET as usize) as *mut u32;
        let stage_pointer =
            |stage: u32| generic_base.wrapping_add(segment_stage_offset(stage) as usize) as *mut T;
        let stage_address = |stage: u32| shared_base() + segment_stage_offset(stage);
        let chain = T::Sum::chain(&status);
        let counter = status.counter();
        let scan = problem.scan;
        let length = (RUN as u32 * SEGMENT_THREADS) as u64;
        let per_row = scan.div_ceil(length);
        let tiles = problem.outer * per_row;
        let thread = thread_idx_x();
        let per_vector = T::PER_VECTOR as u64;

        // A segment: its row, its position in the row and its physical elements `[low,
        // high)`.
        struct SegmentSpan {
            row: u64,
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
            SegmentSpan {
                row,
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
        let aligned_low = |s: &SegmentSpan| s.low / per_vector * per_vector;
        let stage_offset = |s: &SegmentSpan, p: u64| ((p - aligned_low(s)) as usize * size_of::<T>()) as u32;
        // The 16-byte-aligned middle `[head_end, tail_start)` of a segment, which bulk
        // copies move (all of it for aligned rows); fewer than a vector at either end.
        let aligned_middle = |s: &SegmentSpan| {
            let head_end = s.low.next_multiple_of(per_vector).min(s.high);
            (head_end, (s.high / per_vector * per_vector).max(head_end))
        };
        let physical = |s: &SegmentSpan, q: u64| s.base + if REVERSE_ORDER { scan - 1 - q } else { q };

        // SAFETY: every thread calls it; the mbarriers follow the ids.
        let copy = unsafe { StagedCopy::new(shared_base() + SEGMENT_BARRIERS_OFFSET, stages) };
        // Copies segment `tile` into `stage`: the 16-byte-aligned middle as one copy,
        // the unaligned ends (fewer than a vector each) by single threads.
        let fill = |stage: u32, tile: u64| {
            if tile >= tiles {
                return;
            }
            let s = segment_of(tile);
            let (head_end, tail_start) = aligned_middle(&s);
            let offset = |p: u64| stage_offset(&s, p);
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
        let warp_totals = shared.warp_totals as *mut T::Sum;
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
        let run_of = |s: &SegmentSpan| {
            let first = s.begin + thread as u64 * RUN as u64;
            let last = first + RUN as u64 - 1;
            let vector_start =
                (VECTOR && last < s.end).then(|| physical(s, if REVERSE_ORDER { last } else { first }));
            (first, vector_start)
        };
        let item = |stage: u32, s: &SegmentSpan, q: u64| {
            // SAFETY: q is a position of the segment, which the stage holds.
            unsafe { *stage_pointer(stage).add((physical(s, q) - aligned_low(s)) as usize) }
        };
        // Group g of a vector run: four vectors read rotated, put back in physical order.
        let group = |stage: u32, s: &SegmentSpan, start: u64, g: usize| {
            let address = stage_address(stage) + stage_offset(s, start);
            let mut vectors: [[u32; 4]; GROUP_VECTORS] = core::array::from_fn(|j| {
                let v = (g * GROUP_VECTORS + (j ^ rotation)) as u32;
                // SAFETY: inside the run, 16-byte aligned; the fill landed.
                unsafe { load_shared_v4_f32(address + v * 16) }.map(f32::to_bits)
            });
            unrotate(&mut vectors);
            vectors
        };
        // A row's carry, the sum of its `terms` carries, in warp 0 (every lane of which
        // calls it): each lane sums every 32nd term in order, then the warp its lanes'.
        let row_carry = |row: u64| {
            let mut carry = T::Sum::identity();
            let mut term = thread as u64;
            while term < terms {
                // SAFETY: term < terms and row < outer.
                carry = carry.combine(unsafe { *carries.add((term * problem.outer + row) as usize) });
                term += 32;
            }
            warp::reduce(carry, |a, b| a.combine(b))
        };
        // First pass over a landed segment: run totals, block-scanned, and the segment's
        // aggregate published (inclusive for a row's first segment, which ends every
        // chain inside its row, its row's carry included). Returns this run's offset in
        // the segment and the total.
        let reduce = |stage: u32, tile: u64| {
            let s = segment_of(tile);
            let (first, vector_start) = run_of(&s);
            let mut own = T::Sum::identity();
            match vector_start {
                Some(start) => {
                    for g in 0..groups {
                        for words in group(stage, &s, start, g) {
                            for i in 0..T::PER_VECTOR {
                                own = own.combine(T::from_words(words, i).widen());
                            }
                        }
                    }
                }
                None => {
                    for q in first..(first + RUN as u64).min(s.end) {
                        own = own.combine(item(stage, &s, q).widen());
                    }
                }
            }
            // SAFETY: every thread calls it; the warp totals are this block's, large
            // enough for SEGMENT_WARPS values of T, and free since the last barrier.
            let (before, total) = unsafe { exclusive_scan::<T::Sum, SEGMENT_WARPS>(own, warp_totals) };
            let carry = if s.index == 0 && terms > 0 && thread < 32 {
                row_carry(s.row)
            } else {
                T::Sum::identity()
            };
            if thread == 0 {
                let flag = if s.index == 0 { INCLUSIVE } else { AGGREGATE };
                // SAFETY: this segment's status.
                unsafe { chain.publish(tile, carry.combine(total), flag) };
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
        let mut reduced = [(T::Sum::identity(), T::Sum::identity()); SEGMENT_LOOK_BACK_DELAY as usize];
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
            // A row's first segment starts at the row's carry, if any.
            let carried = s.index == 0 && terms > 0;
            if s.index > 0 && thread < 32 {
                // SAFETY: warp 0 entire; the row's first segment never waits; the prefix
                // slot is read after the barrier below.
                unsafe { chain.look_back_and_share::<LOOK_BACK_WINDOW>(tile, total, false, shared.prefix) };
            } else if carried && thread < 32 {
                let carry = row_carry(s.row);
                if thread == 0 {
                    // SAFETY: the prefix slot, read after the barrier below.
                    unsafe { *shared.prefix = carry };
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
                if s.index > 0 || carried {
                    *shared.prefix
                } else {
                    T::Sum::identity()
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
            let mut step = |value: T::Sum| {
                let next = running.combine(value);
                let out = if exclusive { running } else { next };
                running = next;
                out
            };
            let (head_end, tail_start) = aligned_middle(&s);
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
                            T::narrow(step(T::from_words(vectors[v], i).widen()))
                                .into_words(&mut vectors[v], i);
                        }
                        // Back into the stage in the rotated order of the reads.
                        unrotate(&mut vectors);
                        let address = stage_address(stage) + stage_offset(&s, start);
                        for (j, words) in vectors.into_iter().enumerate() {
                            let v = (g * GROUP_VECTORS + (j ^ rotation)) as u32;
                            // SAFETY: this thread's own run, 16-byte aligned.
                            unsafe { store_shared_v4_f32(address + v * 16, words.map(f32::from_bits)) };
                        }
                    }
                }
                None => {
                    for q in first..(first + RUN as u64).min(s.end) {
                        let out = T::narrow(step(item(stage, &s, q).widen()));
                        let p = physical(&s, q);
                        if (head_end..tail_start).contains(&p) {
                            // SAFETY: this thread's own element of the stage.
                            unsafe { *stage_pointer(stage).add((p - aligned_low(&s)) as usize) = out };
                        } else {
                            // SAFETY: p is an element of the row.
                            unsafe { *y.add(p as usize) = out };
                        }
                    }
                }
            }
            // The aligned middle leaves the stage in one bulk store (element-wise stores
            // from threads lanes apart would touch a sector each); either way every
            // thread passes a barrier: the stage, the prefix, the warp totals and the ids
            // read above are free again.
            let bytes = stage_offset(&s, tail_start) - stage_offset(&s, head_end);
            if bytes > 0 {
                // SAFETY: every thread calls it; the middle is 16-byte aligned in y and in
                // the stage, which holds it; the stage is rewritten only after the next
                // `start`, which waits for the store.
                unsafe {
                    copy.store(
                        stage_address(stage) + stage_offset(&s, head_end),
                        y.add(head_end as usize) as *mut u8,
                        bytes,
                    )
                };
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
}
