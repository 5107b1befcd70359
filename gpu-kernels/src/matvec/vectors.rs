//! The several-vectors kernel of `Y = A X`, X `[cols, vectors]` with 2 to `MAX_VECTORS`
//! columns, reading A once.
//!
//! Each block owns a chunk of A's columns and a range of its rows. It stages the
//! chunk's rows of X in shared memory transposed, `[vector][column]`, so that a lane's
//! 16-byte read of one vector is conflict-free, with the vectors past X's padded with
//! zeros up to a power of two `K`. Then each warp walks `R` rows at a time across the
//! chunk: every load of A serves all `K` vectors and every read of X all `R` rows. The
//! warp's `R * K` sums are added across its lanes by halving exchanges
//! (`warp::reduce_each`), and each output gets one partial per chunk, which
//! [`super::combine`] adds in a fixed order; with a single chunk the kernel writes Y.

use super::{BLOCK_THREADS, GemvProblem};
use crate::element::{Sum, Summed, sum_bytes};
use crate::launch::{DevicePtr, DevicePtrMut, Kernel, Launch, LaunchGeometry, kernel_args};

/// The most columns of X the kernel takes.
pub const MAX_VECTORS: u64 = 16;
/// Bytes of X's chunk in shared memory (before the row padding): the chunk of A's
/// columns is this over `K` vectors of the element size.
pub const VECTORS_CHUNK_BYTES: u64 = 64 * 1024;
/// 16-byte vectors of A a lane loads before the first use (over its `R` rows).
pub const VECTORS_LOADS_PER_LANE: usize = 8;
/// Blocks per SM that the plan aims at in all, so that the last wave is a small part.
const VECTORS_ITEMS_PER_SM: u64 = 16;

kernel_args! {
    /// `Y = alpha * A X + beta * Y` (Y `[rows, vectors]`), or with `chunks > 1` the
    /// `[chunk][row][vector]` partials of `A X` in `out`. Block `b` takes chunk
    /// `b % chunks` of `chunk_columns` columns over rows `(b / chunks) * rows_per_block`
    /// onwards; `vector` (1 or 0) says whether rows keep 16-byte alignment.
    pub struct GemvVectorsArgs<T: Summed> {
        pub a: DevicePtr<T>,
        pub x: DevicePtr<T>,
        pub out: DevicePtrMut<Sum<T>>,
        pub y: DevicePtrMut<T>,
        pub alpha: Sum<T>,
        pub beta: Sum<T>,
        pub problem: GemvProblem,
        pub chunk_columns: u64,
        pub chunks: u64,
        pub rows_per_block: u64,
        pub vector: u32,
    }
    impl VectorsKernels for f32 {
        const VECTORS_2 = "gemv_vectors_2_f32" => kernel::vectors_of::<f32, 2, 8, 16>, bounds(BLOCK_THREADS, vectors_blocks_per_sm(2, size_of::<f32>()));
        const VECTORS_4 = "gemv_vectors_4_f32" => kernel::vectors_of::<f32, 4, 8, 32>, bounds(BLOCK_THREADS, vectors_blocks_per_sm(4, size_of::<f32>()));
        const VECTORS_8 = "gemv_vectors_8_f32" => kernel::vectors_of::<f32, 8, 4, 32>, bounds(BLOCK_THREADS, vectors_blocks_per_sm(8, size_of::<f32>()));
        const VECTORS_16 = "gemv_vectors_16_f32" => kernel::vectors_of::<f32, 16, 4, 64>, bounds(BLOCK_THREADS, vectors_blocks_per_sm(16, size_of::<f32>()));
    }
    impl VectorsKernels for half::bf16 {
        const VECTORS_2 = "gemv_vectors_2_bf16" => kernel::vectors_of::<half::bf16, 2, 8, 16>, bounds(BLOCK_THREADS, vectors_blocks_per_sm(2, size_of::<half::bf16>()));
        const VECTORS_4 = "gemv_vectors_4_bf16" => kernel::vectors_of::<half::bf16, 4, 4, 16>, bounds(BLOCK_THREADS, vectors_blocks_per_sm(4, size_of::<half::bf16>()));
        const VECTORS_8 = "gemv_vectors_8_bf16" => kernel::vectors_of::<half::bf16, 8, 4, 32>, bounds(BLOCK_THREADS, vectors_blocks_per_sm(8, size_of::<half::bf16>()));
        const VECTORS_16 = "gemv_vectors_16_bf16" => kernel::vectors_of::<half::bf16, 16, 4, 64>, bounds(BLOCK_THREADS, vectors_blocks_per_sm(16, size_of::<half::bf16>()));
    }
    impl VectorsKernels for half::f16 {
        const VECTORS_2 = "gemv_vectors_2_f16" => kernel::vectors_of::<half::f16, 2, 8, 16>, bounds(BLOCK_THREADS, vectors_blocks_per_sm(2, size_of::<half::f16>()));
        const VECTORS_4 = "gemv_vectors_4_f16" => kernel::vectors_of::<half::f16, 4, 4, 16>, bounds(BLOCK_THREADS, vectors_blocks_per_sm(4, size_of::<half::f16>()));
        const VECTORS_8 = "gemv_vectors_8_f16" => kernel::vectors_of::<half::f16, 8, 4, 32>, bounds(BLOCK_THREADS, vectors_blocks_per_sm(8, size_of::<half::f16>()));
        const VECTORS_16 = "gemv_vectors_16_f16" => kernel::vectors_of::<half::f16, 16, 4, 64>, bounds(BLOCK_THREADS, vectors_blocks_per_sm(16, size_of::<half::f16>()));
    }
    impl VectorsKernels for f64 {
        const VECTORS_2 = "gemv_vectors_2_f64" => kernel::vectors_of::<f64, 2, 8, 16>, bounds(BLOCK_THREADS, vectors_blocks_per_sm(2, size_of::<f64>()));
        const VECTORS_4 = "gemv_vectors_4_f64" => kernel::vectors_of::<f64, 4, 4, 16>, bounds(BLOCK_THREADS, vectors_blocks_per_sm(4, size_of::<f64>()));
        const VECTORS_8 = "gemv_vectors_8_f64" => kernel::vectors_of::<f64, 8, 4, 32>, bounds(BLOCK_THREADS, vectors_blocks_per_sm(8, size_of::<f64>()));
        const VECTORS_16 = "gemv_vectors_16_f64" => kernel::vectors_of::<f64, 16, 2, 32>, bounds(BLOCK_THREADS, vectors_blocks_per_sm(16, size_of::<f64>()));
    }
    entry points in ENTRY_POINTS;
}

/// The several-vectors kernels of one element type, one per padded vector count.
pub trait VectorsKernels: Summed {
    const VECTORS_2: Kernel<GemvVectorsArgs<Self>>;
    const VECTORS_4: Kernel<GemvVectorsArgs<Self>>;
    const VECTORS_8: Kernel<GemvVectorsArgs<Self>>;
    const VECTORS_16: Kernel<GemvVectorsArgs<Self>>;
}

/// The vectors a kernel computes for `vectors` columns of X: the next power of two.
pub const fn padded_vectors(vectors: u64) -> u64 {
    let k = vectors.next_power_of_two();
    if k < 2 { 2 } else { k }
}

/// Rows a warp takes at once for `k` padded vectors of `element_bytes`-byte elements:
/// the `R * K` sums stay within 64 registers, and `R` rows share each read of X (for
/// 4 vectors of 16-bit elements, 8 rows would leave no registers for the 8 elements
/// that each 16-byte load brings).
pub const fn rows_per_warp(k: u64, element_bytes: usize) -> u64 {
    match (k, element_bytes) {
        (2, _) => 8,
        (4, 4) => 8,
        (16, 8) => 2,
        _ => 4,
    }
}

/// Blocks per SM the launch bounds ask for: two (two chunks of X fit in shared memory),
/// or one where the sums take 64 registers, leaving room for the next steps' loads in
/// flight (a prefetch), unless the elements are f32: 16 f32 vectors keep more loads in
/// flight as two blocks of 128 registers than as one block that prefetches (A X, A
/// 2048 x 1048576, 16 columns: 3.35 ms against 4.11 on the H100). 16-bit elements need
/// more registers to unpack (two blocks would spill 820 bytes).
pub const fn vectors_blocks_per_sm(k: u64, element_bytes: usize) -> u32 {
    let sums = k * rows_per_warp(k, element_bytes) * sum_bytes(element_bytes) as u64;
    if sums > 256 || (sums > 128 && element_bytes != size_of::<f32>()) {
        1
    } else {
        2
    }
}

/// Columns of A per chunk for `k` padded vectors: X's chunk fills `VECTORS_CHUNK_BYTES`.
pub const fn chunk_columns(k: u64, element_bytes: usize) -> u64 {
    VECTORS_CHUNK_BYTES / (k * element_bytes as u64)
}

/// Shared memory of X's chunk: `k` rows of the chunk's columns, each padded by 16 bytes
/// so that the staging stores of consecutive vectors fall in different banks.
pub const fn vectors_shared_bytes(k: u64, element_bytes: usize) -> u32 {
    (k * (chunk_columns(k, element_bytes) * element_bytes as u64 + 16)) as u32
}

/// Chunks, rows per block and blocks of `Y = A X`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VectorsPlan {
    /// Padded vectors (2, 4, 8 or 16).
    pub k: u64,
    pub chunk_columns: u64,
    /// Chunks of A's columns (the split: partials per output).
    pub chunks: u64,
    /// Rows per block, a multiple of the rows the block's warps take at once.
    pub rows_per_block: u64,
    pub blocks: u64,
    /// Whether rows are 16-byte aligned (128-bit loads).
    pub vector: bool,
}

impl VectorsPlan {
    /// The plan of `problem` (`vectors > 1`, not transposed) on `multiprocessors` SMs.
    pub const fn new(
        problem: &GemvProblem,
        element_bytes: usize,
        vector: bool,
        multiprocessors: u32,
    ) -> Self {
        let k = padded_vectors(problem.vectors);
        let chunk_columns = chunk_columns(k, element_bytes);
        let chunks = problem.cols.div_ceil(chunk_columns);
        let rows_at_once = rows_per_warp(k, element_bytes) * (BLOCK_THREADS / 32) as u64;
        let row_steps = problem.rows.div_ceil(rows_at_once);
        // Enough row ranges to give every SM several blocks, but none under one step.
        let wanted = (multiprocessors as u64 * VECTORS_ITEMS_PER_SM).div_ceil(chunks);
        let ranges = if wanted < row_steps { wanted } else { row_steps };
        let rows_per_block = row_steps.div_ceil(ranges) * rows_at_once;
        let blocks = chunks * problem.rows.div_ceil(rows_per_block);
        Self {
            k,
            chunk_columns,
            chunks,
            rows_per_block,
            blocks,
            vector,
        }
    }

    /// The launch of the first pass, writing y, or `partials` with several chunks.
    pub fn launch<T: VectorsKernels>(
        &self,
        operands: &super::GemvOperands<T>,
        partials: DevicePtrMut<T::Sum>,
    ) -> Launch<GemvVectorsArgs<T>> {
        let kernel = match self.k {
            2 => T::VECTORS_2,
            4 => T::VECTORS_4,
            8 => T::VECTORS_8,
            _ => T::VECTORS_16,
        };
        let args = GemvVectorsArgs {
            a: operands.a,
            x: operands.x,
            out: partials,
            y: operands.y,
            alpha: operands.alpha,
            beta: operands.beta,
            problem: operands.problem,
            chunk_columns: self.chunk_columns,
            chunks: self.chunks,
            rows_per_block: self.rows_per_block,
            vector: self.vector as u32,
        };
        let shared = vectors_shared_bytes(self.k, size_of::<T>());
        Launch::new(
            kernel,
            LaunchGeometry::linear(self.blocks, BLOCK_THREADS).with_shared(shared),
            args,
        )
    }
}

#[cfg(target_arch = "nvptx64")]
pub(super) mod kernel {
    use super::*;
    use crate::device::{
        SharedCarver, block_idx_x, lane_id, load_global_nc_v4, load_shared_v4_f32, shared_base, sync_threads,
        thread_idx_x,
    };
    use crate::matvec::value::{Accumulator, GemvValue, finish};
    use crate::warp;

    /// [`vectors`], with 128-bit loads or not as `args.vector` says.
    ///
    /// # Safety
    /// As [`vectors`].
    #[inline(always)]
    pub unsafe fn vectors_of<T: GemvValue, const K: usize, const R: usize, const N: usize>(
        args: GemvVectorsArgs<T>,
    ) {
        const { assert!(N == R * K && R as u64 == rows_per_warp(K as u64, size_of::<T>())) };
        // SAFETY: forwarded from the caller.
        unsafe {
            if args.vector != 0 {
                vectors::<T, K, R, N, true>(args)
            } else {
                vectors::<T, K, R, N, false>(args)
            }
        }
    }

    /// `Y = alpha * A X + beta * Y`, or the `[chunk][row][vector]` partials of `A X`,
    /// for one chunk of columns over one range of rows.
    ///
    /// # Safety
    /// `a` holds `rows * cols` elements, 16-byte aligned, `VECTOR` only when `cols` is a
    /// multiple of `PER_VECTOR`; `x` holds `cols * vectors` and `vectors <= K`; `out`
    /// holds `chunks * rows * vectors` partials when `chunks > 1`, else `y` holds `rows
    /// * vectors`; the launch is the plan's: `K` and `R` as [`padded_vectors`] and
    /// [`rows_per_warp`] say, `chunk_columns` as [`chunk_columns`], blocks of
    /// `BLOCK_THREADS` threads with [`vectors_shared_bytes`] of shared memory.
    #[inline(always)]
    unsafe fn vectors<T: GemvValue, const K: usize, const R: usize, const N: usize, const VECTOR: bool>(
        args: GemvVectorsArgs<T>,
    ) {
        let GemvVectorsArgs {
            alpha,
            beta,
            problem,
            chunk_columns,
            chunks,
            rows_per_block,
            ..
        } = args;
        let (a, x, out, y) = (
            args.a.as_ptr(),
            args.x.as_ptr(),
            args.out.as_mut_ptr(),
            args.y.as_mut_ptr(),
        );
        let vectors = problem.vectors as u32;
        let (chunk, range) = (block_idx_x() as u64 % chunks, block_idx_x() as u64 / chunks);
        let first_column = chunk * chunk_columns;
        let width = (problem.cols - first_column).min(chunk_columns) as u32;
        // Elements per row of staged X, padded by 16 bytes.
        let pitch = chunk_columns as u32 + T::PER_VECTOR as u32;

        // SAFETY: the launch gives K rows of `pitch` elements (`vectors_shared_bytes`).
        let staged: *mut T = unsafe { SharedCarver::new().take(K * pitch as usize) };
        let threads = BLOCK_THREADS;
        // Slot e is vector e % K of column e / K (K a power of two: no division); the
        // vectors past X's are zeros.
        let mut e = thread_idx_x();
        while e < width * K as u32 {
            let (column, v) = (e / K as u32, e % K as u32);
            let value = if v < vectors {
                // SAFETY: column < width and v < vectors: inside X.
                unsafe { *x.add(((first_column + column as u64) * vectors as u64 + v as u64) as usize) }
            } else {
                T::narrow(T::Sum::ZERO)
            };
            // SAFETY: v < K, column < width <= pitch: inside the staged rows.
            unsafe { *staged.add((v * pitch + column) as usize) = value };
            e += threads;
        }
        // SAFETY: every thread reaches it; X is staged before it is read.
        unsafe { sync_threads() };

        let warp_index = thread_idx_x() / 32;
        let lane = lane_id();
        let warps = (threads / 32) as u64;
        let first_row = range * rows_per_block;
        let last_row = (first_row + rows_per_block).min(problem.rows);
        let per_lane = if VECTOR { T::PER_VECTOR } else { 1 };
        let steps = width as usize / per_lane;
        // At most two steps: a longer unrolled loop would not be unrolled whole, and the
        // loaded vectors would go to local memory.
        let unroll = (VECTORS_LOADS_PER_LANE / R).min(2);
        let base = shared_base();
        // The lanes of a warp take the same rows, so they reach the exchanges together.
        let mut group_row = first_row + warp_index as u64 * R as u64;
        while group_row < last_row {
            let valid_rows = last_row.saturating_sub(group_row).min(R as u64) as usize;
            // Row i of the group at the chunk; rows past the range point at the first
            // row of the group and are never read.
            let row_at = |i: usize| {
                let r = if i < valid_rows {
                    group_row + i as u64
                } else {
                    group_row
                };
                a.wrapping_add((r * problem.cols + first_column) as usize)
            };
            let mut sums = [T::Sum::ZERO; N];
            // Up to `unroll` steps of every row, loaded together.
            let load_steps = |step: usize| {
                let mut held = [[0u32; 4]; VECTORS_LOADS_PER_LANE];
                for u in 0..unroll {
                    let s = step + u * 32;
                    if s < steps {
                        for i in 0..R {
                            if i < valid_rows {
                                held[u * R + i] = if VECTOR {
                                    // SAFETY: vector s of a valid row of the chunk, inside
                                    // the row, 16-byte aligned.
                                    unsafe { load_global_nc_v4(row_at(i).add(s * per_lane) as *const u32) }
                                } else {
                                    let mut words = [0u32; 4];
                                    // SAFETY: column s of a valid row of the chunk.
                                    unsafe { (*row_at(i).add(s)).into_words(&mut words, 0) };
                                    words
                                };
                            }
                        }
                    }
                }
                held
            };
            // With one block per SM, the next steps' loads are in flight while these are
            // multiplied (two blocks have no registers to spare for it, nor the need).
            let prefetch = vectors_blocks_per_sm(K as u64, size_of::<T>()) == 1;
            let mut step = lane as usize;
            let mut next = if prefetch {
                load_steps(step)
            } else {
                [[0u32; 4]; VECTORS_LOADS_PER_LANE]
            };
            while step < steps {
                let held = if prefetch {
                    let held = next;
                    next = load_steps(step + unroll * 32);
                    held
                } else {
                    load_steps(step)
                };
                for u in 0..unroll {
                    let s = step + u * 32;
                    if s < steps {
                        for v in 0..K {
                            let xs = if VECTOR {
                                let address =
                                    base + ((v * pitch as usize + s * per_lane) * size_of::<T>()) as u32;
                                // SAFETY: 16-byte aligned (pitch and the column are
                                // multiples of PER_VECTOR), inside the staged rows,
                                // written before the barrier.
                                unsafe { load_shared_v4_f32(address) }.map(f32::to_bits)
                            } else {
                                let mut words = [0u32; 4];
                                // SAFETY: inside the staged rows, written before the barrier.
                                unsafe { (*staged.add(v * pitch as usize + s)).into_words(&mut words, 0) };
                                words
                            };
                            for i in 0..R {
                                for e in 0..per_lane {
                                    sums[i * K + v] = sums[i * K + v].mul_add(
                                        T::from_words(held[u * R + i], e).widen(),
                                        T::from_words(xs, e).widen(),
                                    );
                                }
                            }
                        }
                    }
                }
                step += unroll * 32;
            }
            warp::reduce_each(&mut sums, |p, q| p + q);
            let first = warp::reduced_first(N, lane);
            for (h, &sum) in sums.iter().take(warp::reduced_held(N)).enumerate() {
                let (i, v) = ((first + h) / K, ((first + h) % K) as u32);
                if i < valid_rows && v < vectors && warp::reduced_writer(N, lane) {
                    let output = ((group_row + i as u64) * vectors as u64 + v as u64) as usize;
                    // SAFETY: the row is in the range, v < vectors, chunk < chunks.
                    unsafe {
                        if chunks == 1 {
                            finish(sum, alpha, beta, y.add(output));
                        } else {
                            let outputs = (problem.rows * vectors as u64) as usize;
                            *out.add(chunk as usize * outputs + output) = sum;
                        }
                    }
                }
            }
            group_row += warps * R as u64;
        }
    }
}
