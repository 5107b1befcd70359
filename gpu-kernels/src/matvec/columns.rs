//! The columns kernel of `y = A^T x`: blocks of `COLUMNS_TX` lanes along `cols` by
//! `COLUMNS_TY` slices of rows, summed through shared memory.

use super::{BLOCK_THREADS, FirstPassKernels, GemvArgs, GemvOperands};
use crate::launch::{DevicePtrMut, Launch, LaunchGeometry};

/// Lanes of a `columns` block along `cols`.
pub const COLUMNS_TX: u32 = 32;
/// Slices of rows in a `columns` block.
pub const COLUMNS_TY: u32 = BLOCK_THREADS / COLUMNS_TX;
/// Rows of A each `columns` thread loads before the first use.
pub const COLUMNS_UNROLL: usize = 4;
/// Dynamic shared memory of a `columns` block: one sum per slice and column, 16 bytes
/// of columns per lane. 16-bit elements take the most: 8 columns of f32 sums.
pub const COLUMNS_SHARED_BYTES: u32 = COLUMNS_TY * COLUMNS_TX * 8 * 4;

const _: () = assert!(COLUMNS_TX == 32);

/// Blocks of a `columns` kernel an SM holds, its launch bounds, by element bytes: f32's
/// four sums a thread fit 32 registers (8 blocks); f64's two sums and 16-bit elements'
/// eight take 40 (6 blocks).
pub const fn blocks_per_sm(element_bytes: usize) -> u32 {
    if element_bytes == 4 { 8 } else { 6 }
}

/// Column tiles by parts of the rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColumnsPlan {
    /// Blocks along `cols`.
    pub tiles: u64,
    /// Blocks along `rows` (grid y).
    pub split: u64,
    /// Whether rows are 16-byte aligned (128-bit loads).
    pub vector: bool,
}

impl ColumnsPlan {
    /// The launch of the first pass, writing y, or `partials` with a split.
    pub fn launch<T: FirstPassKernels>(
        &self,
        operands: &GemvOperands<T>,
        partials: DevicePtrMut<T::Sum>,
    ) -> Launch<GemvArgs<T>> {
        let geometry = LaunchGeometry {
            grid: [self.tiles, self.split, 1],
            threads: BLOCK_THREADS,
            shared_bytes: COLUMNS_SHARED_BYTES,
        };
        let args = operands.arguments(partials, self.split, 0, self.vector);
        Launch::new(T::COLUMNS, geometry, args)
    }
}

#[cfg(target_arch = "nvptx64")]
pub(super) mod kernel {
    use super::*;
    use crate::device::{
        SharedCarver, block_idx_x, block_idx_y, load_global_nc_v4, sync_threads, thread_idx_x,
    };
    use crate::launch::chunk;
    use crate::matvec::GemvProblem;
    use crate::matvec::value::{Accumulator, GemvValue, finish};

    /// [`columns`], with 128-bit loads or not as `args.vector` says.
    ///
    /// # Safety
    /// As [`columns`]; `COLUMNS` is `T::PER_VECTOR`; `vector` only when `cols` is a
    /// multiple of it.
    #[inline(always)]
    pub unsafe fn columns_of<T: GemvValue, const COLUMNS: usize>(args: GemvArgs<T>) {
        // SAFETY: forwarded from the caller.
        unsafe {
            if args.vector != 0 {
                columns::<T, COLUMNS, true>(args)
            } else {
                columns::<T, COLUMNS, false>(args)
            }
        }
    }

    /// `y = alpha * A^T x + beta * y`, or the `[split][col]` partials of `A^T x`.
    /// Block (x, y) = (column tile, part of the rows).
    ///
    /// # Safety
    /// `a` holds `rows * cols` elements, `x` `rows`, `a` 16-byte aligned, `VECTOR` only
    /// when `cols` is a multiple of `COLUMNS`; `out` holds `cols * split` partials when
    /// `split > 1`, else `y` holds `cols`; blocks of `BLOCK_THREADS` threads with
    /// `COLUMNS_SHARED_BYTES` of dynamic shared memory.
    #[inline(always)]
    unsafe fn columns<T: GemvValue, const COLUMNS: usize, const VECTOR: bool>(args: GemvArgs<T>) {
        let GemvArgs {
            alpha,
            beta,
            problem,
            split,
            ..
        } = args;
        let (a, x, out, y) = args.pointers();
        let GemvProblem { rows, cols, .. } = problem;
        let (tile, part) = (block_idx_x() as u64, block_idx_y() as u64);
        let (tx, ty) = (thread_idx_x() % COLUMNS_TX, thread_idx_x() / COLUMNS_TX);
        let block_columns = COLUMNS_TX as u64 * COLUMNS as u64;
        let column = tile * block_columns + tx as u64 * COLUMNS as u64;
        let valid = cols.saturating_sub(column).min(COLUMNS as u64);
        let (begin, end) = chunk(rows, split, part, 1);
        let mut sums = [T::Sum::ZERO; COLUMNS];
        if valid > 0 {
            // A row's COLUMNS elements as loaded, one vector's words, widened only where
            // they are summed: held widened, 16-bit rows took twice the registers and
            // each unrolled load waited on the sums before it.
            let load = |r: u64| -> [u32; 4] {
                let at = (r * cols + column) as usize;
                if VECTOR {
                    // SAFETY: cols and column are multiples of COLUMNS == PER_VECTOR.
                    unsafe { load_global_nc_v4(a.add(at) as *const u32) }
                } else {
                    let mut words = [0; 4];
                    for i in 0..COLUMNS {
                        if (i as u64) < valid {
                            // SAFETY: r < rows, column + i < cols.
                            unsafe { *a.add(at + i) }.into_words(&mut words, i);
                        }
                    }
                    words
                }
            };
            let mut add_row = |words: [u32; 4], xr: T::Sum| {
                for (i, s) in sums.iter_mut().enumerate() {
                    *s = s.mul_add(T::from_words(words, i).widen(), xr);
                }
            };
            let step = COLUMNS_TY as u64;
            let mut r = begin + ty as u64;
            while r + (COLUMNS_UNROLL as u64 - 1) * step < end {
                let mut held = [([0; 4], T::Sum::ZERO); COLUMNS_UNROLL];
                for (u, h) in held.iter_mut().enumerate() {
                    let row = r + u as u64 * step;
                    // SAFETY: row < rows.
                    *h = (load(row), unsafe { *x.add(row as usize) }.widen());
                }
                for (words, xr) in held {
                    add_row(words, xr);
                }
                r += COLUMNS_UNROLL as u64 * step;
            }
            while r < end {
                // SAFETY: r < rows.
                let xr = unsafe { *x.add(r as usize) }.widen();
                add_row(load(r), xr);
                r += step;
            }
        }

        let mut carver = SharedCarver::new();
        // SAFETY: the launch gives COLUMNS_SHARED_BYTES, enough for [TY][block_columns]
        // values; each thread writes its own slots before the barrier.
        let shared = unsafe { carver.take::<T::Sum>((COLUMNS_TY as u64 * block_columns) as usize) };
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
                let mut sum = T::Sum::ZERO;
                for slice in 0..COLUMNS_TY as u64 {
                    // SAFETY: written before the barrier.
                    sum = sum + unsafe { *shared.add((slice * block_columns + c) as usize) };
                }
                // SAFETY: column < cols, part < split.
                unsafe {
                    if split == 1 {
                        finish(sum, alpha, beta, y.add(column as usize));
                    } else {
                        *out.add((part * cols + column) as usize) = sum;
                    }
                }
            }
            c += BLOCK_THREADS as u64;
        }
    }
}
