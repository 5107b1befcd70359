//! The rows kernel of `y = A x`: a group of lanes per work item of `ROWS_PER_ITEM` rows
//! (or a chunk of them, with a split), so that each load of x serves them all.

use super::{BLOCK_THREADS, FirstPassKernels, GemvArgs, GemvOperands};
use crate::launch::{DevicePtrMut, Launch, LaunchGeometry};

/// Work items per SM that `rows` aims at, so that every SM gets many.
pub const ROWS_ITEMS_PER_SM: u64 = 256;
/// Rows of one `rows` item, which share each load of x.
pub const ROWS_PER_ITEM: usize = 4;
/// Vectors of each row a `rows` lane loads before the first use.
pub const ROWS_UNROLL: usize = 2;
/// A split never makes an item shorter than this many elements.
pub const MIN_SPLIT_CHUNK: u64 = 65536;

/// Items of `ROWS_PER_ITEM` rows, `split` per row group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowsPlan {
    pub group_lanes: u32,
    /// Items per row group.
    pub split: u64,
    pub blocks: u64,
    /// Whether rows are 16-byte aligned (128-bit loads).
    pub vector: bool,
}

impl RowsPlan {
    /// The launch of the first pass, writing y, or `partials` with a split.
    pub fn launch<T: FirstPassKernels>(
        &self,
        operands: &GemvOperands<T>,
        partials: DevicePtrMut<T::Sum>,
    ) -> Launch<GemvArgs<T>> {
        let args = operands.arguments(partials, self.split, self.group_lanes, self.vector);
        Launch::new(T::ROWS, LaunchGeometry::linear(self.blocks, BLOCK_THREADS), args)
    }
}

#[cfg(target_arch = "nvptx64")]
pub(super) mod kernel {
    use super::*;
    use crate::device::{block_dim_x, block_idx_x, load_global_nc_v4, thread_idx_x};
    use crate::launch::chunk;
    use crate::matvec::value::{Accumulator, GemvValue, finish};
    use crate::warp;

    /// [`rows`], with 128-bit loads or not as `args.vector` says.
    ///
    /// # Safety
    /// As [`rows`]; `vector` only when `cols` is a multiple of `PER_VECTOR`.
    #[inline(always)]
    pub unsafe fn rows_of<T: GemvValue>(args: GemvArgs<T>) {
        // SAFETY: forwarded from the caller.
        unsafe {
            if args.vector != 0 {
                rows::<T, true>(args)
            } else {
                rows::<T, false>(args)
            }
        }
    }

    /// `y = alpha * A x + beta * y`, or the `[split][row]` partials of `A x`. Each item
    /// covers `ROWS_PER_ITEM` rows over one chunk of columns, so each piece of x is
    /// loaded once for that many rows.
    ///
    /// # Safety
    /// `a` holds `rows * cols` elements, `x` `cols`, both 16-byte aligned, `VECTOR` only
    /// when `cols` is a multiple of `PER_VECTOR`; `out` holds `rows * split` partials when
    /// `split > 1`, else `y` holds `rows`; the grid covers
    /// `ceil(rows / ROWS_PER_ITEM) * split * group_lanes` threads.
    #[inline(always)]
    unsafe fn rows<T: GemvValue, const VECTOR: bool>(args: GemvArgs<T>) {
        let GemvArgs {
            alpha,
            beta,
            problem,
            split,
            group_lanes,
            ..
        } = args;
        let (a, x, out, y) = args.pointers();
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
        let mut sums = [[T::Sum::ZERO; ROWS_UNROLL]; R];
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
                                row_sums[u] = row_sums[u]
                                    .mul_add(T::from_words(h[u], e).widen(), T::from_words(xs[u], e).widen());
                            }
                        }
                    }
                    v += ROWS_UNROLL * lanes;
                }
            } else {
                let mut j = begin as usize + lane;
                while j < end as usize {
                    let mut xs = [T::Sum::ZERO; ROWS_UNROLL];
                    let mut held = [[T::Sum::ZERO; ROWS_UNROLL]; R];
                    for u in 0..ROWS_UNROLL {
                        let col = j + u * lanes;
                        if col < end as usize {
                            // SAFETY: col < end <= cols, in x and in every valid row.
                            unsafe {
                                xs[u] = (*x.add(col)).widen();
                                for (i, h) in held.iter_mut().enumerate() {
                                    if i < valid_rows {
                                        h[u] = (*row_start(i).add(col)).widen();
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
            let mut sum = T::Sum::ZERO;
            for &s in row_sums {
                sum = sum + s;
            }
            // Fixed-order butterfly inside the group (all 32 lanes take part).
            let sum = warp::reduce_groups(sum, group_lanes, |a, b| a + b);
            if i < valid_rows && lane == 0 {
                let row = first_row + i as u64;
                // SAFETY: row < rows, part < split.
                unsafe {
                    if split == 1 {
                        finish(sum, alpha, beta, y.add(row as usize));
                    } else {
                        *out.add((part * problem.rows + row) as usize) = sum;
                    }
                }
            }
        }
    }
}
