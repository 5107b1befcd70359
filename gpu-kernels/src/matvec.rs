//! Matrix-vector products `y = alpha * op(A) x + beta * y`, `op(A)` = A or A^T, for a
//! row-major A of shape `[rows, cols]`; deterministic (every sum is taken in a fixed
//! order, no floating-point atomics).
//!
//! - `rows` (`y = A x`): a group of `group_lanes` lanes (1..=32) per work item, an item
//!   being one row or, when the rows alone cannot fill the GPU, one of `split` chunks
//!   of a row, over `ROWS_PER_ITEM` rows at once so that each load of x serves them
//!   all; 128-bit loads of A (read-only path) and of x (from L2) when `cols` keeps rows
//!   aligned, `ROWS_UNROLL` vectors per row in flight with as many accumulators, then
//!   a shuffle reduction inside the group;
//! - `columns` (`y = A^T x`): blocks of `TX` lanes along `cols` (16 bytes of columns
//!   each) by `TY` slices of rows, summed through shared memory, rows split over
//!   `split` blocks when the columns cannot fill the GPU.
//!
//! With `split > 1` the first pass writes `[output][split]` partials and `combine`
//! adds them in order and applies alpha and beta; otherwise the first pass does. With
//! `beta == 0`, y is not read (it may hold anything, NaN included).

/// Threads per block of every matvec kernel.
pub const BLOCK_THREADS: u32 = 256;
/// Lanes of a `columns` block along `cols`.
pub const COLUMNS_TX: u32 = 32;
/// Slices of rows in a `columns` block.
pub const COLUMNS_TY: u32 = BLOCK_THREADS / COLUMNS_TX;
/// Rows of A each `columns` thread loads before the first use.
pub const COLUMNS_UNROLL: usize = 4;
/// Threads that fill an H100-class SM.
pub const THREADS_PER_SM: u64 = 2048;
/// Work items per SM that `rows` aims at, so that every SM gets many.
pub const ROWS_ITEMS_PER_SM: u64 = 256;
/// Rows of one `rows` item, which share each load of x.
pub const ROWS_PER_ITEM: usize = 4;
/// Vectors of each row a `rows` lane loads before the first use.
pub const ROWS_UNROLL: usize = 2;
/// A split never makes an item shorter than this many elements.
pub const MIN_SPLIT_CHUNK: u64 = 65536;
/// Dynamic shared memory of a `columns` block: one sum (at most 8 bytes) per slice and
/// column, 16 bytes of columns per lane.
pub const COLUMNS_SHARED_BYTES: u32 = COLUMNS_TY * COLUMNS_TX * 16;

const _: () = assert!(BLOCK_THREADS.is_multiple_of(32) && COLUMNS_TX == 32);

/// A as `[rows, cols]`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemvProblem {
    pub rows: u64,
    pub cols: u64,
    /// Whether y = A^T x (else y = A x).
    pub transpose: bool,
}

impl GemvProblem {
    /// Elements of y.
    pub const fn outputs(&self) -> u64 {
        if self.transpose { self.cols } else { self.rows }
    }
}

/// How a product is launched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemvPlan {
    Rows {
        group_lanes: u32,
        /// Items per row.
        split: u64,
        blocks: u64,
        /// Whether rows are 16-byte aligned (128-bit loads).
        vector: bool,
    },
    Columns {
        /// Blocks along `cols`.
        tiles: u64,
        /// Blocks along `rows` (grid y).
        split: u64,
        vector: bool,
    },
}

impl GemvPlan {
    /// The split (1: no partials, no combine pass).
    pub const fn split(&self) -> u64 {
        match *self {
            GemvPlan::Rows { split, .. } | GemvPlan::Columns { split, .. } => split,
        }
    }
}

/// The plan for a product with `element_bytes`-byte elements on `multiprocessors` SMs.
pub fn plan(problem: &GemvProblem, element_bytes: usize, multiprocessors: u32) -> GemvPlan {
    let per_vector = (16 / element_bytes) as u64;
    let vector = problem.cols.is_multiple_of(per_vector);
    let sms = multiprocessors as u64;
    if !problem.transpose {
        let vectors = problem.cols.div_ceil(per_vector * ROWS_UNROLL as u64);
        let group_lanes = vectors.next_power_of_two().clamp(1, 32) as u32;
        let groups = problem.rows.div_ceil(ROWS_PER_ITEM as u64);
        let wanted = (sms * ROWS_ITEMS_PER_SM).div_ceil(groups.max(1));
        let split = wanted.min(problem.cols / MIN_SPLIT_CHUNK).max(1);
        let threads = groups * split * group_lanes as u64;
        GemvPlan::Rows {
            group_lanes,
            split,
            blocks: threads.div_ceil(BLOCK_THREADS as u64),
            vector,
        }
    } else {
        let tiles = problem.cols.div_ceil(COLUMNS_TX as u64 * per_vector);
        let wanted = (sms * THREADS_PER_SM).div_ceil(tiles * BLOCK_THREADS as u64);
        let split = wanted.min(problem.rows / 256).clamp(1, 65535);
        GemvPlan::Columns { tiles, split, vector }
    }
}

/// The chunk of a split axis of `len` elements that part `part` of `split` covers;
/// chunk starts are multiples of `align`.
pub const fn chunk(len: u64, split: u64, part: u64, align: u64) -> (u64, u64) {
    let size = len.div_ceil(split).next_multiple_of(align);
    let begin = if part * size < len { part * size } else { len };
    let end = if begin + size < len { begin + size } else { len };
    (begin, end)
}

/// Element types of the matvec kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemvDType {
    F32,
    F64,
}

/// Entry points, `[kernel][dtype]`: rows, columns, combine.
const NAMES: [[&str; 2]; 3] = [
    ["gemv_rows_f32", "gemv_rows_f64"],
    ["gemv_columns_f32", "gemv_columns_f64"],
    ["gemv_combine_f32", "gemv_combine_f64"],
];

/// Which kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemvKernel {
    Rows,
    Columns,
    Combine,
}

/// The entry point of a kernel for a dtype.
pub const fn kernel_name(kernel: GemvKernel, dtype: GemvDType) -> &'static str {
    NAMES[kernel as usize][dtype as usize]
}

/// Every matvec entry point.
pub const KERNELS: [&str; 6] = [
    NAMES[0][0],
    NAMES[0][1],
    NAMES[1][0],
    NAMES[1][1],
    NAMES[2][0],
    NAMES[2][1],
];

#[cfg(target_arch = "nvptx64")]
mod kernel {
    use super::*;
    use crate::device::{
        SharedCarver, Shuffle, block_dim_x, block_idx_x, block_idx_y, fma_f32, fma_f64, load_global_nc_v4,
        sync_threads, thread_idx_x,
    };

    /// A float type the matvec kernels multiply.
    pub trait GemvValue:
        Copy + Shuffle + core::ops::Add<Output = Self> + core::ops::Mul<Output = Self>
    {
        const PER_VECTOR: usize;
        const ZERO: Self;
        fn from_words(words: [u32; 4], i: usize) -> Self;
        /// `self + a * b`, fused.
        fn mul_add(self, a: Self, b: Self) -> Self;
    }

    impl GemvValue for f32 {
        const PER_VECTOR: usize = 4;
        const ZERO: Self = 0.0;
        #[inline(always)]
        fn from_words(words: [u32; 4], i: usize) -> Self {
            f32::from_bits(words[i])
        }
        #[inline(always)]
        fn mul_add(self, a: Self, b: Self) -> Self {
            fma_f32(a, b, self)
        }
    }

    impl GemvValue for f64 {
        const PER_VECTOR: usize = 2;
        const ZERO: Self = 0.0;
        #[inline(always)]
        fn from_words(words: [u32; 4], i: usize) -> Self {
            f64::from_bits(words[2 * i] as u64 | (words[2 * i + 1] as u64) << 32)
        }
        #[inline(always)]
        fn mul_add(self, a: Self, b: Self) -> Self {
            fma_f64(a, b, self)
        }
    }

    /// `alpha * sum + beta * y`, not reading y when beta is zero.
    ///
    /// # Safety
    /// `y` is in bounds.
    #[inline(always)]
    unsafe fn finish<T: GemvValue + PartialEq>(sum: T, alpha: T, beta: T, y: *mut T) {
        // SAFETY: the caller guarantees y is in bounds.
        unsafe {
            *y = if beta == T::ZERO {
                alpha * sum
            } else {
                (alpha * sum).mul_add(beta, *y)
            }
        };
    }

    /// `y = alpha * A x + beta * y`, or the `[row][split]` partials of `A x`. Each item
    /// covers `ROWS_PER_ITEM` rows over one chunk of columns, so each piece of x is
    /// loaded once for that many rows.
    ///
    /// # Safety
    /// `a` holds `rows * cols` elements, `x` `cols`, both 16-byte aligned, `VECTOR` only
    /// when `cols` is a multiple of `PER_VECTOR`; `out` holds `rows * split` partials when
    /// `split > 1`, else `y` holds `rows`; the grid covers
    /// `ceil(rows / ROWS_PER_ITEM) * split * group_lanes` threads.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn rows<T: GemvValue + PartialEq, const VECTOR: bool>(
        a: *const T,
        x: *const T,
        out: *mut T,
        y: *mut T,
        alpha: T,
        beta: T,
        problem: GemvProblem,
        split: u64,
        group_lanes: u32,
    ) {
        const R: usize = ROWS_PER_ITEM;
        let thread = block_idx_x() as u64 * block_dim_x() as u64 + thread_idx_x() as u64;
        let item = thread / group_lanes as u64;
        let lane = (thread % group_lanes as u64) as usize;
        let lanes = group_lanes as usize;
        // Items run over the row groups first: the groups that share a chunk of x run
        // side by side, so the chunk comes from DRAM once.
        let groups = problem.rows.div_ceil(R as u64);
        let items = groups * split;
        let (group, part) = (item % groups, item / groups);
        let first_row = group * R as u64;
        let valid_rows = if item < items {
            (problem.rows - first_row).min(R as u64) as usize
        } else {
            0
        };
        // Row i's start; rows past the matrix point at row 0 and are never read.
        let row_start = |i: usize| {
            let r = if i < valid_rows { first_row + i as u64 } else { 0 };
            a.wrapping_add((r * problem.cols) as usize)
        };
        let mut sums = [[T::ZERO; ROWS_UNROLL]; R];
        if valid_rows > 0 {
            let per_vector = T::PER_VECTOR as u64;
            let (begin, end) = chunk(problem.cols, split, part, if VECTOR { per_vector } else { 1 });
            if VECTOR {
                let (first, last) = ((begin / per_vector) as usize, (end / per_vector) as usize);
                let load = |p: *const T, v: usize| {
                    // SAFETY: vector v of a valid row (or of x) lies inside it, 16-byte
                    // aligned.
                    unsafe { load_global_nc_v4(p.add(v * T::PER_VECTOR) as *const u32) }
                };
                let mut v = first + lane;
                while v < last {
                    // Up to ROWS_UNROLL vectors per row, all loads before the first use.
                    let mut xs = [[0u32; 4]; ROWS_UNROLL];
                    let mut held = [[[0u32; 4]; ROWS_UNROLL]; R];
                    for u in 0..ROWS_UNROLL {
                        if v + u * lanes < last {
                            xs[u] = load(x, v + u * lanes);
                            for (i, h) in held.iter_mut().enumerate() {
                                if i < valid_rows {
                                    h[u] = load(row_start(i), v + u * lanes);
                                }
                            }
                        }
                    }
                    for (row_sums, h) in sums.iter_mut().zip(&held) {
                        for u in 0..ROWS_UNROLL {
                            for e in 0..T::PER_VECTOR {
                                row_sums[u] =
                                    row_sums[u].mul_add(T::from_words(h[u], e), T::from_words(xs[u], e));
                            }
                        }
                    }
                    v += ROWS_UNROLL * lanes;
                }
            } else {
                let mut j = begin as usize + lane;
                while j < end as usize {
                    let mut xs = [T::ZERO; ROWS_UNROLL];
                    let mut held = [[T::ZERO; ROWS_UNROLL]; R];
                    for u in 0..ROWS_UNROLL {
                        let col = j + u * lanes;
                        if col < end as usize {
                            // SAFETY: col < end <= cols, in x and in every valid row.
                            unsafe {
                                xs[u] = *x.add(col);
                                for (i, h) in held.iter_mut().enumerate() {
                                    if i < valid_rows {
                                        h[u] = *row_start(i).add(col);
                                    }
                                }
                            }
                        }
                    }
                    for (row_sums, h) in sums.iter_mut().zip(&held) {
                        for u in 0..ROWS_UNROLL {
                            row_sums[u] = row_sums[u].mul_add(h[u], xs[u]);
                        }
                    }
                    j += ROWS_UNROLL * lanes;
                }
            }
        }
        for (i, row_sums) in sums.iter().enumerate() {
            let mut sum = T::ZERO;
            for &s in row_sums {
                sum = sum + s;
            }
            // Fixed-order butterfly inside the group (all 32 lanes take part).
            let mut mask = 16;
            while mask > 0 {
                if mask < group_lanes {
                    sum = sum + sum.shfl_xor(mask);
                }
                mask /= 2;
            }
            if i < valid_rows && lane == 0 {
                let row = first_row + i as u64;
                // SAFETY: row < rows, part < split.
                unsafe {
                    if split == 1 {
                        finish(sum, alpha, beta, y.add(row as usize));
                    } else {
                        *out.add((row * split + part) as usize) = sum;
                    }
                }
            }
        }
    }

    /// `y = alpha * A^T x + beta * y`, or the `[col][split]` partials of `A^T x`.
    /// Block (x, y) = (column tile, part of the rows).
    ///
    /// # Safety
    /// `a` holds `rows * cols` elements, `x` `rows`, `a` 16-byte aligned, `VECTOR` only
    /// when `cols` is a multiple of `COLUMNS`; `out` holds `cols * split` partials when
    /// `split > 1`, else `y` holds `cols`; blocks of `BLOCK_THREADS` threads with
    /// `COLUMNS_SHARED_BYTES` of dynamic shared memory.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn columns<T: GemvValue + PartialEq, const COLUMNS: usize, const VECTOR: bool>(
        a: *const T,
        x: *const T,
        out: *mut T,
        y: *mut T,
        alpha: T,
        beta: T,
        problem: GemvProblem,
        split: u64,
    ) {
        let GemvProblem { rows, cols, .. } = problem;
        let (tile, part) = (block_idx_x() as u64, block_idx_y() as u64);
        let (tx, ty) = (thread_idx_x() % COLUMNS_TX, thread_idx_x() / COLUMNS_TX);
        let block_columns = COLUMNS_TX as u64 * COLUMNS as u64;
        let column = tile * block_columns + tx as u64 * COLUMNS as u64;
        let valid = cols.saturating_sub(column).min(COLUMNS as u64);
        let (begin, end) = chunk(rows, split, part, 1);
        let mut sums = [T::ZERO; COLUMNS];
        if valid > 0 {
            let load = |r: u64| -> [T; COLUMNS] {
                let at = (r * cols + column) as usize;
                let mut row = [T::ZERO; COLUMNS];
                if VECTOR {
                    // SAFETY: cols and column are multiples of COLUMNS == PER_VECTOR.
                    let words = unsafe { load_global_nc_v4(a.add(at) as *const u32) };
                    for (i, v) in row.iter_mut().enumerate() {
                        *v = T::from_words(words, i);
                    }
                } else {
                    for (i, v) in row.iter_mut().enumerate() {
                        if (i as u64) < valid {
                            // SAFETY: r < rows, column + i < cols.
                            *v = unsafe { *a.add(at + i) };
                        }
                    }
                }
                row
            };
            let step = COLUMNS_TY as u64;
            let mut r = begin + ty as u64;
            while r + (COLUMNS_UNROLL as u64 - 1) * step < end {
                let mut held = [([T::ZERO; COLUMNS], T::ZERO); COLUMNS_UNROLL];
                for (u, h) in held.iter_mut().enumerate() {
                    let row = r + u as u64 * step;
                    // SAFETY: row < rows.
                    *h = (load(row), unsafe { *x.add(row as usize) });
                }
                for (values, xr) in &held {
                    for (s, &v) in sums.iter_mut().zip(values) {
                        *s = s.mul_add(v, *xr);
                    }
                }
                r += COLUMNS_UNROLL as u64 * step;
            }
            while r < end {
                // SAFETY: r < rows.
                let xr = unsafe { *x.add(r as usize) };
                for (s, &v) in sums.iter_mut().zip(&load(r)) {
                    *s = s.mul_add(v, xr);
                }
                r += step;
            }
        }

        let mut carver = SharedCarver::new();
        // SAFETY: the launch gives COLUMNS_SHARED_BYTES, enough for [TY][block_columns]
        // values; each thread writes its own slots before the barrier.
        let shared = unsafe { carver.take::<T>((COLUMNS_TY as u64 * block_columns) as usize) };
        for (i, s) in sums.iter().enumerate() {
            let slot = (ty as u64 * block_columns + tx as u64 * COLUMNS as u64 + i as u64) as usize;
            // SAFETY: slot < TY * block_columns.
            unsafe { *shared.add(slot) = *s };
        }
        // SAFETY: every thread reaches the barrier.
        unsafe { sync_threads() };
        let mut c = thread_idx_x() as u64;
        while c < block_columns {
            let column = tile * block_columns + c;
            if column < cols {
                let mut sum = T::ZERO;
                for slice in 0..COLUMNS_TY as u64 {
                    // SAFETY: written before the barrier.
                    sum = sum + unsafe { *shared.add((slice * block_columns + c) as usize) };
                }
                // SAFETY: column < cols, part < split.
                unsafe {
                    if split == 1 {
                        finish(sum, alpha, beta, y.add(column as usize));
                    } else {
                        *out.add((column * split + part) as usize) = sum;
                    }
                }
            }
            c += BLOCK_THREADS as u64;
        }
    }

    /// `y[i] = alpha * (partials[i * split] + ... ) + beta * y[i]`, one thread per output.
    ///
    /// # Safety
    /// `partials` holds `outputs * split` values, `y` `outputs`.
    #[inline(always)]
    pub unsafe fn combine<T: GemvValue + PartialEq>(
        partials: *const T,
        y: *mut T,
        alpha: T,
        beta: T,
        outputs: u64,
        split: u64,
    ) {
        let i = block_idx_x() as u64 * block_dim_x() as u64 + thread_idx_x() as u64;
        if i < outputs {
            let mut sum = T::ZERO;
            for s in 0..split {
                // SAFETY: i * split + s < outputs * split.
                sum = sum + unsafe { *partials.add((i * split + s) as usize) };
            }
            // SAFETY: i < outputs.
            unsafe { finish(sum, alpha, beta, y.add(i as usize)) };
        }
    }

    macro_rules! entry_points {
        ($t:ty, $rows:ident, $columns:ident, $combine:ident) => {
            /// # Safety
            /// See [`rows`]; `vector` selects `VECTOR`.
            #[unsafe(no_mangle)]
            #[allow(clippy::too_many_arguments)]
            pub unsafe extern "ptx-kernel" fn $rows(
                a: *const $t,
                x: *const $t,
                out: *mut $t,
                y: *mut $t,
                alpha: $t,
                beta: $t,
                problem: GemvProblem,
                split: u64,
                group_lanes: u32,
                vector: u32,
            ) {
                // SAFETY: forwarded from the launch's contract.
                unsafe {
                    if vector != 0 {
                        rows::<$t, true>(a, x, out, y, alpha, beta, problem, split, group_lanes)
                    } else {
                        rows::<$t, false>(a, x, out, y, alpha, beta, problem, split, group_lanes)
                    }
                }
            }

            /// # Safety
            /// See [`columns`]; `vector` selects `VECTOR`.
            #[unsafe(no_mangle)]
            #[allow(clippy::too_many_arguments)]
            pub unsafe extern "ptx-kernel" fn $columns(
                a: *const $t,
                x: *const $t,
                out: *mut $t,
                y: *mut $t,
                alpha: $t,
                beta: $t,
                problem: GemvProblem,
                split: u64,
                vector: u32,
            ) {
                const COLUMNS: usize = <$t as GemvValue>::PER_VECTOR;
                // SAFETY: forwarded from the launch's contract.
                unsafe {
                    if vector != 0 {
                        columns::<$t, COLUMNS, true>(a, x, out, y, alpha, beta, problem, split)
                    } else {
                        columns::<$t, COLUMNS, false>(a, x, out, y, alpha, beta, problem, split)
                    }
                }
            }

            /// # Safety
            /// See [`combine`].
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $combine(
                partials: *const $t,
                y: *mut $t,
                alpha: $t,
                beta: $t,
                outputs: u64,
                split: u64,
            ) {
                // SAFETY: forwarded from the launch's contract.
                unsafe { combine::<$t>(partials, y, alpha, beta, outputs, split) }
            }
        };
    }

    entry_points!(f32, gemv_rows_f32, gemv_columns_f32, gemv_combine_f32);
    entry_points!(f64, gemv_rows_f64, gemv_columns_f64, gemv_combine_f64);
}
