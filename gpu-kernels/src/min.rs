//! Min reduction along one axis: values and the index of the first minimum
//! (`torch.min(x, dim)`), or values alone (`torch.amin`). NaN wins: a lane holding NaN
//! reduces to NaN and the index of its first NaN.
//!
//! The array is seen as `[outer, reduce, inner]` (row-major), the output as
//! `[outer, inner]`. Two layouts, two kernels:
//! - `rows` (`inner == 1`, the reduced axis contiguous): a group of `group_lanes` lanes
//!   (1..=32, a power of two) per row, 128-bit loads after a scalar head that reaches
//!   alignment, then a shuffle reduction inside the group;
//! - `strided` (`inner > 1`): a block of `TX` lanes along `inner` (each lane 16 bytes of
//!   consecutive columns, one 128-bit load when `inner` keeps rows aligned) by `TY` slices
//!   of the reduced axis, combined through shared memory.
//!
//! When the output alone cannot fill the GPU, the reduced axis is also split over
//! `split` work items per output; those write `[output][split]` partials that the
//! `combine` kernel reduces in a fixed order. All offsets are 64-bit.

/// Threads per block of every min kernel.
pub const BLOCK_THREADS: u32 = 256;
/// Lanes of a strided block along `inner`.
pub const STRIDED_TX: u32 = 32;
/// Slices of the reduced axis in a strided block.
pub const STRIDED_TY: u32 = BLOCK_THREADS / STRIDED_TX;
/// Bytes of one vector load.
pub const VECTOR_BYTES: usize = 16;
/// Vector loads each thread of the rows kernel issues before it uses the first.
pub const UNROLL: usize = 4;
/// Rows each strided thread loads before it uses the first.
pub const STRIDED_ROWS: usize = 4;
/// Threads that fill an H100-class SM (2048 resident); the plan aims at this many per SM.
pub const THREADS_PER_SM: u64 = 2048;
/// A split never makes a work item shorter than this many elements of the reduced axis.
pub const MIN_SPLIT_CHUNK: u64 = 2048;
/// Dynamic shared memory of a strided block: a value (at most 8 bytes) and an index per
/// slice and column, for the widest vector (4 columns per lane).
pub const STRIDED_SHARED_BYTES: u32 = STRIDED_TY * STRIDED_TX * 4 * 16;

const _: () = assert!(BLOCK_THREADS.is_multiple_of(32) && STRIDED_TX == 32);

/// The array as `[outer, reduce, inner]`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MinProblem {
    pub outer: u64,
    pub reduce: u64,
    pub inner: u64,
}

impl MinProblem {
    /// The number of output elements.
    pub const fn outputs(&self) -> u64 {
        self.outer * self.inner
    }
}

/// How a problem is launched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MinPlan {
    Rows {
        /// Lanes per row (work item), a power of two up to 32.
        group_lanes: u32,
        /// Work items per row.
        split: u64,
        blocks: u64,
    },
    Strided {
        /// Whether each lane loads its columns as one 128-bit vector (rows aligned).
        vector: bool,
        /// Work items per output column (grid y).
        split: u64,
        /// Blocks along `inner` for one `outer` index.
        tiles_per_outer: u64,
    },
}

impl MinPlan {
    /// The split of the reduced axis (1: no partials, no combine pass).
    pub const fn split(&self) -> u64 {
        match *self {
            MinPlan::Rows { split, .. } | MinPlan::Strided { split, .. } => split,
        }
    }
}

/// The launch plan for a problem of `element_bytes`-byte elements on a GPU with
/// `multiprocessors` SMs. The problem must be non-empty.
pub fn plan(problem: &MinProblem, element_bytes: usize, multiprocessors: u32) -> MinPlan {
    let target_threads = multiprocessors as u64 * THREADS_PER_SM;
    let per_vector = (VECTOR_BYTES / element_bytes) as u64;
    // More work items per output only while each stays long, and never past grid y.
    let split_for = |threads: u64| {
        let wanted = target_threads.div_ceil(threads.max(1));
        wanted.min(problem.reduce / MIN_SPLIT_CHUNK).clamp(1, 65535)
    };
    if problem.inner == 1 {
        // Enough lanes that each loads a few vectors; whole warps for long rows.
        let vectors = problem.reduce.div_ceil(per_vector * UNROLL as u64);
        let group_lanes = vectors.next_power_of_two().clamp(1, 32) as u32;
        let split = even_split(problem.reduce, split_for(problem.outer * group_lanes as u64));
        let threads = problem.outer * split * group_lanes as u64;
        MinPlan::Rows {
            group_lanes,
            split,
            blocks: threads.div_ceil(BLOCK_THREADS as u64),
        }
    } else {
        let vector = problem.inner.is_multiple_of(per_vector);
        let columns_per_block = STRIDED_TX as u64 * per_vector;
        let tiles_per_outer = problem.inner.div_ceil(columns_per_block);
        let split = even_split(
            problem.reduce,
            split_for(problem.outer * tiles_per_outer * BLOCK_THREADS as u64),
        );
        MinPlan::Strided {
            vector,
            split,
            tiles_per_outer,
        }
    }
}

/// The number of chunks of `ceil(reduce / split)` elements that covers `reduce`: at
/// most `split`, none empty, and with the same chunk length (the kernels recompute it).
const fn even_split(reduce: u64, split: u64) -> u64 {
    reduce.div_ceil(reduce.div_ceil(split))
}

/// Which of the three kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MinKernel {
    Rows,
    Strided,
    Combine,
}

/// Element types of the min kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MinDType {
    F32,
    F64,
    I32,
}

/// Entry points, `[kernel][dtype][with index]`.
const NAMES: [[[&str; 2]; 3]; 3] = [
    [
        ["amin_rows_f32", "min_rows_f32"],
        ["amin_rows_f64", "min_rows_f64"],
        ["amin_rows_i32", "min_rows_i32"],
    ],
    [
        ["amin_strided_f32", "min_strided_f32"],
        ["amin_strided_f64", "min_strided_f64"],
        ["amin_strided_i32", "min_strided_i32"],
    ],
    [
        ["amin_combine_f32", "min_combine_f32"],
        ["amin_combine_f64", "min_combine_f64"],
        ["amin_combine_i32", "min_combine_i32"],
    ],
];

/// The entry point for a kernel, dtype and output kind.
pub const fn kernel_name(kernel: MinKernel, dtype: MinDType, with_index: bool) -> &'static str {
    NAMES[kernel as usize][dtype as usize][with_index as usize]
}

/// Every min entry point.
pub const KERNELS: [&str; 18] = {
    let mut all = [""; 18];
    let mut i = 0;
    while i < 18 {
        all[i] = NAMES[i / 6][(i / 2) % 3][i % 2];
        i += 1;
    }
    all
};

#[cfg(target_arch = "nvptx64")]
mod kernel {
    use super::*;
    use crate::device::{
        SharedCarver, Shuffle, block_dim_x, block_idx_x, block_idx_y, load_global_nc_v4, sync_threads,
        thread_idx_x,
    };

    /// An element type the min kernels reduce.
    pub trait MinValue: Copy + PartialOrd + Shuffle {
        /// Elements in one 128-bit vector.
        const PER_VECTOR: usize;
        fn is_nan(self) -> bool;
        /// Element `i` of a vector loaded as four words.
        fn from_words(words: [u32; 4], i: usize) -> Self;
    }

    impl MinValue for f32 {
        const PER_VECTOR: usize = 4;
        #[inline(always)]
        fn is_nan(self) -> bool {
            self != self
        }
        #[inline(always)]
        fn from_words(words: [u32; 4], i: usize) -> Self {
            f32::from_bits(words[i])
        }
    }

    impl MinValue for f64 {
        const PER_VECTOR: usize = 2;
        #[inline(always)]
        fn is_nan(self) -> bool {
            self != self
        }
        #[inline(always)]
        fn from_words(words: [u32; 4], i: usize) -> Self {
            f64::from_bits(words[2 * i] as u64 | (words[2 * i + 1] as u64) << 32)
        }
    }

    impl MinValue for i32 {
        const PER_VECTOR: usize = 4;
        #[inline(always)]
        fn is_nan(self) -> bool {
            false
        }
        #[inline(always)]
        fn from_words(words: [u32; 4], i: usize) -> Self {
            words[i] as i32
        }
    }

    /// A running minimum and, when `INDEX`, where it is. `index == u64::MAX` marks an
    /// empty state (no element seen), which every real element beats.
    #[derive(Clone, Copy)]
    struct ArgMin<T, const INDEX: bool> {
        value: T,
        index: u64,
    }

    impl<T: MinValue, const INDEX: bool> ArgMin<T, INDEX> {
        #[inline(always)]
        fn empty(value: T) -> Self {
            Self {
                value,
                index: u64::MAX,
            }
        }

        /// Takes element `index`, which comes after every element seen so far.
        #[inline(always)]
        fn push(&mut self, value: T, index: u64) {
            let empty = self.index == u64::MAX;
            let wins = value < self.value || (value.is_nan() && !self.value.is_nan());
            if empty || wins {
                self.value = value;
                self.index = index;
            }
        }

        /// Combines with a state over other elements, in any order: NaN first, then the
        /// smaller value, then (with indices) the smaller index.
        #[inline(always)]
        fn merge(self, other: Self) -> Self {
            if other.index == u64::MAX {
                return self;
            }
            if self.index == u64::MAX {
                return other;
            }
            let (a, b) = (self.value, other.value);
            let other_wins = if INDEX {
                (b.is_nan() && (!a.is_nan() || other.index < self.index))
                    || (!a.is_nan() && (b < a || (b == a && other.index < self.index)))
            } else {
                (b.is_nan() && !a.is_nan()) || b < a
            };
            if other_wins { other } else { self }
        }

        /// Merges across the `lanes` lanes (a power of two) of an aligned lane group.
        /// All 32 lanes of the warp must call it together.
        #[inline(always)]
        fn merge_group(mut self, lanes: u32) -> Self {
            let mut mask = 16;
            while mask > 0 {
                if mask < lanes {
                    let other = Self {
                        value: self.value.shfl_xor(mask),
                        index: self.index.shfl_xor(mask),
                    };
                    self = self.merge(other);
                }
                mask /= 2;
            }
            self
        }

        /// Writes the state at `slot`.
        ///
        /// # Safety
        /// `slot` is in bounds of `values` (and of `indices` when `INDEX`).
        #[inline(always)]
        unsafe fn store(self, values: *mut T, indices: *mut i64, slot: u64) {
            // SAFETY: the caller guarantees `slot` is in bounds.
            unsafe {
                *values.add(slot as usize) = self.value;
                if INDEX {
                    *indices.add(slot as usize) = self.index as i64;
                }
            }
        }
    }

    /// Reduces one row segment per group of `group_lanes` lanes.
    ///
    /// Work item `w` (one per group) is chunk `w % split` of row `w / split`; with
    /// `split == 1` it writes the output, else the partial at `w`.
    ///
    /// # Safety
    /// `x` holds `items / split` rows of `reduce` elements, 16-byte aligned; `values`
    /// and `indices` hold `items` slots; the grid covers `items * group_lanes` threads.
    #[inline(always)]
    pub unsafe fn rows<T: MinValue, const INDEX: bool>(
        x: *const T,
        values: *mut T,
        indices: *mut i64,
        reduce: u64,
        items: u64,
        split: u64,
        group_lanes: u32,
    ) {
        let thread = block_idx_x() as u64 * block_dim_x() as u64 + thread_idx_x() as u64;
        let item = thread / group_lanes as u64;
        let lane = (thread % group_lanes as u64) as u32;
        // SAFETY: `x` holds at least one element (the host never launches empty problems).
        let mut state = ArgMin::<T, INDEX>::empty(unsafe { *x });
        if item < items {
            let (row, part) = (item / split, item % split);
            let chunk = reduce.div_ceil(split);
            let begin = (part * chunk).min(reduce);
            let end = (begin + chunk).min(reduce);
            // SAFETY: [begin, end) lies inside row `row`.
            unsafe { scan_segment(&mut state, x, row * reduce, begin, end, lane, group_lanes) };
        }
        let state = state.merge_group(group_lanes);
        if item < items && lane == 0 {
            // SAFETY: `item < items`.
            unsafe { state.store(values, indices, item) };
        }
    }

    /// Pushes elements `[begin, end)` of the row starting at flat offset `row_start`
    /// into `state`, this lane taking its share in increasing index order: a scalar head
    /// up to 16-byte alignment, whole vectors, then a scalar tail.
    ///
    /// # Safety
    /// The elements lie inside `x`, which is 16-byte aligned.
    #[inline(always)]
    unsafe fn scan_segment<T: MinValue, const INDEX: bool>(
        state: &mut ArgMin<T, INDEX>,
        x: *const T,
        row_start: u64,
        begin: u64,
        end: u64,
        lane: u32,
        lanes: u32,
    ) {
        let per_vector = T::PER_VECTOR as u64;
        let (lane, lanes) = (lane as u64, lanes as u64);
        let (flat_begin, flat_end) = (row_start + begin, row_start + end);
        let aligned = flat_begin.next_multiple_of(per_vector).min(flat_end);
        let vectors = (flat_end - aligned) / per_vector;
        let tail = aligned + vectors * per_vector;
        let element = |flat: u64| {
            // SAFETY: every `flat` below is in [flat_begin, flat_end).
            unsafe { *x.add(flat as usize) }
        };
        let vector = |v: u64| {
            // SAFETY: vector `v < vectors` lies in [aligned, tail), 16-byte aligned.
            unsafe { load_global_nc_v4(x.add((aligned + v * per_vector) as usize) as *const u32) }
        };
        // Head and tail hold fewer than PER_VECTOR elements, but a group may be narrower.
        let mut flat = flat_begin + lane;
        while flat < aligned {
            state.push(element(flat), flat - row_start);
            flat += lanes;
        }
        let push_vector = |state: &mut ArgMin<T, INDEX>, v: u64, words: [u32; 4]| {
            let first = aligned + v * per_vector - row_start;
            for i in 0..T::PER_VECTOR {
                state.push(T::from_words(words, i), first + i as u64);
            }
        };
        let mut v = lane;
        while v + (UNROLL as u64 - 1) * lanes < vectors {
            let mut held = [[0u32; 4]; UNROLL];
            for (u, words) in held.iter_mut().enumerate() {
                *words = vector(v + u as u64 * lanes);
            }
            for (u, words) in held.iter().enumerate() {
                push_vector(state, v + u as u64 * lanes, *words);
            }
            v += UNROLL as u64 * lanes;
        }
        while v < vectors {
            push_vector(state, v, vector(v));
            v += lanes;
        }
        let mut flat = tail + lane;
        while flat < flat_end {
            state.push(element(flat), flat - row_start);
            flat += lanes;
        }
    }

    /// Reduces `reduce` rows of `STRIDED_TX * COLUMNS` columns per block: each lane
    /// takes `COLUMNS` consecutive columns (`COLUMNS = T::PER_VECTOR`, one 128-bit load
    /// per row when `ALIGNED`, else one load per column, so that a warp still reads whole
    /// sectors when rows are not 16-byte aligned); each of the `STRIDED_TY` slices takes
    /// every `STRIDED_TY`-th row of its chunk, then the lanes merge the slices through
    /// shared memory (one barrier).
    ///
    /// Block (x, y): x = outer index * tiles_per_outer + tile, y = chunk of the reduced
    /// axis. Output column `m = outer * inner + column`; with `split > 1` the partial
    /// goes to slot `m * split + chunk`.
    ///
    /// # Safety
    /// `x` holds `outer * reduce * inner` elements, 16-byte aligned; `ALIGNED` only when
    /// `inner` is a multiple of `COLUMNS`; the output holds `outer * inner * split`
    /// slots; the block has `BLOCK_THREADS` threads and `STRIDED_SHARED_BYTES` of
    /// dynamic shared memory.
    #[inline(always)]
    pub unsafe fn strided<T: MinValue, const INDEX: bool, const COLUMNS: usize, const ALIGNED: bool>(
        x: *const T,
        values: *mut T,
        indices: *mut i64,
        problem: MinProblem,
        split: u64,
        tiles_per_outer: u64,
    ) {
        let MinProblem { reduce, inner, .. } = problem;
        let (outer, tile) = (
            block_idx_x() as u64 / tiles_per_outer,
            block_idx_x() as u64 % tiles_per_outer,
        );
        let part = block_idx_y() as u64;
        let (tx, ty) = (thread_idx_x() % STRIDED_TX, thread_idx_x() / STRIDED_TX);
        let block_columns = STRIDED_TX as u64 * COLUMNS as u64;
        let column = tile * block_columns + tx as u64 * COLUMNS as u64;
        let chunk = reduce.div_ceil(split);
        let begin = (part * chunk).min(reduce);
        let end = (begin + chunk).min(reduce);

        // SAFETY: `x` holds at least one element.
        let fill = unsafe { *x };
        let mut states = [ArgMin::<T, INDEX>::empty(fill); COLUMNS];
        let valid = inner.saturating_sub(column).min(COLUMNS as u64);
        if valid > 0 {
            let load = |r: u64| -> [T; COLUMNS] {
                let at = (outer * reduce + r) * inner + column;
                let mut out = [fill; COLUMNS];
                if ALIGNED {
                    // SAFETY: `inner` and `column` are multiples of COLUMNS == PER_VECTOR,
                    // so the vector is aligned and inside the row.
                    let words = unsafe { load_global_nc_v4(x.add(at as usize) as *const u32) };
                    for (i, o) in out.iter_mut().enumerate() {
                        *o = T::from_words(words, i);
                    }
                } else {
                    for (i, o) in out.iter_mut().enumerate() {
                        if (i as u64) < valid {
                            // SAFETY: row r < reduce, column + i < inner.
                            *o = unsafe { *x.add(at as usize + i) };
                        }
                    }
                }
                out
            };
            let push = |states: &mut [ArgMin<T, INDEX>; COLUMNS], row: &[T; COLUMNS], r: u64| {
                for (i, (s, &value)) in states.iter_mut().zip(row).enumerate() {
                    if (i as u64) < valid {
                        s.push(value, r);
                    }
                }
            };
            let step = STRIDED_TY as u64;
            let mut r = begin + ty as u64;
            while r + (STRIDED_ROWS as u64 - 1) * step < end {
                let mut held = [[fill; COLUMNS]; STRIDED_ROWS];
                for (u, h) in held.iter_mut().enumerate() {
                    *h = load(r + u as u64 * step);
                }
                for (u, h) in held.iter().enumerate() {
                    push(&mut states, h, r + u as u64 * step);
                }
                r += STRIDED_ROWS as u64 * step;
            }
            while r < end {
                push(&mut states, &load(r), r);
                r += step;
            }
        }

        // Shared: [STRIDED_TY][block_columns] values, then the same of indices.
        let mut carver = SharedCarver::new();
        // SAFETY: the launch gives STRIDED_SHARED_BYTES, enough for both regions at the
        // widest vector; each thread writes only its own slots before the barrier.
        let (shared_values, shared_indices) = unsafe {
            let slots = (STRIDED_TY as u64 * block_columns) as usize;
            (carver.take::<T>(slots), carver.take::<u64>(slots))
        };
        for (v, s) in states.iter().enumerate() {
            let slot = (ty as u64 * block_columns + tx as u64 * COLUMNS as u64 + v as u64) as usize;
            // SAFETY: slot < STRIDED_TY * block_columns.
            unsafe {
                *shared_values.add(slot) = s.value;
                *shared_indices.add(slot) = s.index;
            }
        }
        // SAFETY: every thread of the block reaches this barrier.
        unsafe { sync_threads() };
        let mut c = thread_idx_x() as u64;
        while c < block_columns {
            let column = tile * block_columns + c;
            if column < inner {
                let read = |slice: u64| {
                    let slot = (slice * block_columns + c) as usize;
                    // SAFETY: written before the barrier by the thread owning the slot.
                    unsafe {
                        ArgMin::<T, INDEX> {
                            value: *shared_values.add(slot),
                            index: *shared_indices.add(slot),
                        }
                    }
                };
                let mut merged = read(0);
                for slice in 1..STRIDED_TY as u64 {
                    merged = merged.merge(read(slice));
                }
                let m = outer * inner + column;
                let slot = if split == 1 { m } else { m * split + part };
                // SAFETY: m < outer * inner, part < split.
                unsafe { merged.store(values, indices, slot) };
            }
            c += BLOCK_THREADS as u64;
        }
    }

    /// Merges the `split` partials of each output in order, one thread per output.
    ///
    /// # Safety
    /// The partials hold `outputs * split` slots (`partial_indices` too when `INDEX`),
    /// the outputs `outputs`.
    #[inline(always)]
    pub unsafe fn combine<T: MinValue, const INDEX: bool>(
        partial_values: *const T,
        partial_indices: *const i64,
        values: *mut T,
        indices: *mut i64,
        outputs: u64,
        split: u64,
    ) {
        let m = block_idx_x() as u64 * block_dim_x() as u64 + thread_idx_x() as u64;
        if m >= outputs {
            return;
        }
        let read = |s: u64| {
            let slot = (m * split + s) as usize;
            // SAFETY: slot < outputs * split.
            unsafe {
                ArgMin::<T, INDEX> {
                    value: *partial_values.add(slot),
                    index: if INDEX {
                        *partial_indices.add(slot) as u64
                    } else {
                        s
                    },
                }
            }
        };
        let mut merged = read(0);
        for s in 1..split {
            merged = merged.merge(read(s));
        }
        // SAFETY: m < outputs.
        unsafe { merged.store(values, indices, m) };
    }

    macro_rules! entry_points {
        ($t:ty, $index:literal, $rows:ident, $strided:ident, $combine:ident) => {
            /// # Safety
            /// See [`rows`].
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $rows(
                x: *const $t,
                values: *mut $t,
                indices: *mut i64,
                reduce: u64,
                items: u64,
                split: u64,
                group_lanes: u32,
            ) {
                // SAFETY: forwarded from the launch's contract.
                unsafe { rows::<$t, $index>(x, values, indices, reduce, items, split, group_lanes) }
            }

            /// # Safety
            /// See [`strided`]; `vector` selects `ALIGNED`.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $strided(
                x: *const $t,
                values: *mut $t,
                indices: *mut i64,
                problem: MinProblem,
                split: u64,
                tiles_per_outer: u64,
                vector: u32,
            ) {
                const COLUMNS: usize = <$t as MinValue>::PER_VECTOR;
                // SAFETY: forwarded from the launch's contract.
                unsafe {
                    if vector != 0 {
                        strided::<$t, $index, COLUMNS, true>(
                            x,
                            values,
                            indices,
                            problem,
                            split,
                            tiles_per_outer,
                        )
                    } else {
                        strided::<$t, $index, COLUMNS, false>(
                            x,
                            values,
                            indices,
                            problem,
                            split,
                            tiles_per_outer,
                        )
                    }
                }
            }

            /// # Safety
            /// See [`combine`].
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $combine(
                partial_values: *const $t,
                partial_indices: *const i64,
                values: *mut $t,
                indices: *mut i64,
                outputs: u64,
                split: u64,
            ) {
                // SAFETY: forwarded from the launch's contract.
                unsafe {
                    combine::<$t, $index>(
                        partial_values,
                        partial_indices,
                        values,
                        indices,
                        outputs,
                        split,
                    )
                }
            }
        };
    }

    entry_points!(f32, true, min_rows_f32, min_strided_f32, min_combine_f32);
    entry_points!(f32, false, amin_rows_f32, amin_strided_f32, amin_combine_f32);
    entry_points!(f64, true, min_rows_f64, min_strided_f64, min_combine_f64);
    entry_points!(f64, false, amin_rows_f64, amin_strided_f64, amin_combine_f64);
    entry_points!(i32, true, min_rows_i32, min_strided_i32, min_combine_i32);
    entry_points!(i32, false, amin_rows_i32, amin_strided_i32, amin_combine_i32);
}

#[cfg(test)]
mod tests {
    use super::*;

    const H100_SMS: u32 = 132;

    fn problem(outer: u64, reduce: u64, inner: u64) -> MinProblem {
        MinProblem { outer, reduce, inner }
    }

    #[test]
    fn headline_axes_fill_the_gpu_without_a_split() {
        let p = |o, r, i| plan(&problem(o, r, i), 4, H100_SMS);
        assert_eq!(
            p(128 * 4096, 4095, 1),
            MinPlan::Rows {
                group_lanes: 32,
                split: 1,
                blocks: 65536
            }
        );
        assert_eq!(
            p(128, 4096, 4095),
            MinPlan::Strided {
                vector: false,
                split: 1,
                tiles_per_outer: 32
            }
        );
        let dim0 = p(1, 128, 4096 * 4095);
        assert_eq!(
            dim0,
            MinPlan::Strided {
                vector: true,
                split: 1,
                tiles_per_outer: 4096 * 4095 / 128
            }
        );
    }

    #[test]
    fn few_outputs_split_the_axis_into_nonempty_chunks() {
        for (outer, reduce, inner, bytes) in [
            (1, 1 << 31, 1, 4),
            (3, 1_000_003, 1, 8),
            (1, 200_000, 3, 4),
            (2, 65_537 * 2048 + 5, 1, 4),
        ] {
            let plan = plan(&problem(outer, reduce, inner), bytes, H100_SMS);
            let split = plan.split();
            assert!(split > 1 && split <= 65535, "{plan:?}");
            let chunk = reduce.div_ceil(split);
            assert!(
                chunk >= MIN_SPLIT_CHUNK && (split - 1) * chunk < reduce,
                "{plan:?}"
            );
        }
    }

    #[test]
    fn short_rows_share_warps_and_odd_inner_loads_scalars() {
        let rows = |reduce| match plan(&problem(1000, reduce, 1), 4, H100_SMS) {
            MinPlan::Rows { group_lanes, .. } => group_lanes,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            (rows(1), rows(16), rows(17), rows(100), rows(4096)),
            (1, 1, 2, 8, 32)
        );
        let vector = |inner, bytes| {
            matches!(
                plan(&problem(5, 7, inner), bytes, H100_SMS),
                MinPlan::Strided { vector: true, .. }
            )
        };
        assert!(vector(8, 4) && vector(6, 8) && !vector(6, 4) && !vector(3, 8));
    }

    #[test]
    fn kernel_names_are_distinct_and_tabled() {
        for (i, a) in KERNELS.iter().enumerate() {
            assert!(KERNELS[i + 1..].iter().all(|b| a != b), "{a} twice");
        }
        assert_eq!(
            kernel_name(MinKernel::Strided, MinDType::F64, true),
            "min_strided_f64"
        );
        assert_eq!(
            kernel_name(MinKernel::Combine, MinDType::I32, false),
            "amin_combine_i32"
        );
    }
}
