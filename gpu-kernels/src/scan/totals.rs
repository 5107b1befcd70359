//! Row totals: the sums of the rows of `[outer, scan]` (`inner == 1`), read once and
//! nothing written but `parts` partial sums per row, each a block's over a fixed set of
//! its row's chunks, so that the result is the same on every run. A device group's scan
//! along the split axis sends them ahead: the ranks after a shard then scan theirs in
//! one pass, starting at the partials of the shards before (the segments kernel sums
//! them as its rows' carries).

use super::ScanProblem;
use crate::element::{Sum, Summed};
use crate::launch::{DevicePtr, DevicePtrMut, Kernel, Launch, LaunchGeometry, kernel_args};

/// Threads per block of the totals kernel.
pub const TOTALS_THREADS: u32 = 256;
/// Warps per totals block.
pub const TOTALS_WARPS: usize = (TOTALS_THREADS / 32) as usize;
/// 128-bit vectors each thread loads per chunk: a chunk is `TOTALS_THREADS *
/// TOTALS_VECTORS` vectors of a row, all loads out before any is summed.
pub const TOTALS_VECTORS: usize = 8;
/// Dynamic shared memory of a totals block: the warp totals (8-byte sums at most).
pub const TOTALS_SHARED_BYTES: u32 = TOTALS_WARPS as u32 * 8;
/// Blocks per SM the partials of all rows fill, as many as 32-register threads fit
/// (f32: ptxas keeps two of a thread's 16-byte loads in flight, so the rate comes from
/// the threads; the 16-bit kernels take 59 registers, half as many blocks at once).
pub const TOTALS_BLOCKS_PER_SM: u64 = 8;

/// Partial sums per row: one wave of blocks over all rows, at most a block per chunk.
pub const fn totals_parts(problem: &ScanProblem, element_bytes: usize, multiprocessors: u32) -> u64 {
    let chunk = TOTALS_THREADS as u64 * TOTALS_VECTORS as u64 * (16 / element_bytes) as u64;
    let chunks = problem.scan.div_ceil(chunk);
    let wave = (multiprocessors as u64 * TOTALS_BLOCKS_PER_SM).div_ceil(problem.outer);
    let parts = if chunks < wave { chunks } else { wave };
    if parts < 1 { 1 } else { parts }
}

kernel_args! {
    /// The totals kernel's arguments: rows `[outer, scan]` of x, and `totals[part *
    /// outer + row]`, `parts` partials of each row.
    pub struct TotalsArgs<T: Summed> {
        pub x: DevicePtr<T>,
        pub totals: DevicePtrMut<Sum<T>>,
        pub problem: ScanProblem,
        pub parts: u64,
    }
    impl TotalsKernel for f32 {
        const TOTALS = "scan_totals_f32" => kernel::totals::<f32>;
    }
    impl TotalsKernel for f64 {
        const TOTALS = "scan_totals_f64" => kernel::totals::<f64>;
    }
    impl TotalsKernel for i32 {
        const TOTALS = "scan_totals_i32" => kernel::totals::<i32>;
    }
    impl TotalsKernel for i64 {
        const TOTALS = "scan_totals_i64" => kernel::totals::<i64>;
    }
    impl TotalsKernel for half::bf16 {
        const TOTALS = "scan_totals_bf16" => kernel::totals::<half::bf16>;
    }
    impl TotalsKernel for half::f16 {
        const TOTALS = "scan_totals_f16" => kernel::totals::<half::f16>;
    }
    entry points in ENTRY_POINTS;
}

/// The totals kernel of one element type.
pub trait TotalsKernel: Summed {
    const TOTALS: Kernel<TotalsArgs<Self>>;
}

/// The launch writing `parts` partials of each row of `problem` (`inner == 1`, x 16-byte
/// aligned) to `totals`, `parts * outer` sums; `None` for an empty problem.
pub fn launch<T: TotalsKernel>(
    x: DevicePtr<T>,
    totals: DevicePtrMut<Sum<T>>,
    problem: ScanProblem,
    parts: u64,
) -> Option<Launch<TotalsArgs<T>>> {
    let geometry = LaunchGeometry {
        grid: [problem.outer, parts, 1],
        threads: TOTALS_THREADS,
        shared_bytes: TOTALS_SHARED_BYTES,
    };
    (problem.elements() > 0 && problem.inner == 1).then(|| {
        Launch::new(
            T::TOTALS,
            geometry,
            TotalsArgs {
                x,
                totals,
                problem,
                parts,
            },
        )
    })
}

#[cfg(target_arch = "nvptx64")]
mod kernel {
    use super::*;
    use crate::block::{ScanOp, exclusive_scan};
    use crate::device::{SharedCarver, block_idx_x, block_idx_y, load_global_v4, thread_idx_x};
    use crate::scan::tile::ScanValue;

    /// Block (row, part) sums the row's chunks `part`, `part + parts`, ... of whole
    /// 128-bit vectors (consecutive threads on consecutive vectors), and part 0 also the
    /// fewer than a vector at the row's unaligned ends; a block scan gives the total.
    ///
    /// # Safety
    /// x holds `outer * scan` elements from a 16-byte-aligned start; `totals` holds
    /// `parts * outer` sums; a grid of `[outer, parts]` blocks of `TOTALS_THREADS`
    /// threads with `TOTALS_SHARED_BYTES` of dynamic shared memory.
    #[inline(always)]
    pub unsafe fn totals<T: ScanValue>(args: TotalsArgs<T>) {
        let TotalsArgs { problem, parts, .. } = args;
        let (x, totals) = (args.x.as_ptr(), args.totals.as_mut_ptr());
        let (row, part) = (block_idx_x() as u64, block_idx_y() as u64);
        let thread = thread_idx_x() as u64;
        let per_vector = T::PER_VECTOR as u64;
        let (start, end) = (row * problem.scan, (row + 1) * problem.scan);
        let body_start = start.next_multiple_of(per_vector).min(end);
        let body_end = (end / per_vector * per_vector).max(body_start);
        let mut sum = T::Sum::identity();
        if part == 0 && thread < 2 * per_vector {
            let (p, limit) = if thread < per_vector {
                (start + thread, body_start)
            } else {
                (body_end + thread - per_vector, end)
            };
            if p < limit {
                // SAFETY: p is an element of the row.
                sum = unsafe { *x.add(p as usize) }.widen();
            }
        }
        let body_vectors = (body_end - body_start) / per_vector;
        let chunk_vectors = TOTALS_THREADS as u64 * TOTALS_VECTORS as u64;
        // A sum per load of a chunk, so that no load waits for the sums of the others.
        let mut sums = [T::Sum::identity(); TOTALS_VECTORS];
        let mut chunk = part;
        while chunk * chunk_vectors < body_vectors {
            let first = chunk * chunk_vectors + thread;
            let vector = |k: usize| first + (k as u64) * TOTALS_THREADS as u64;
            // Every load unconditional (past the body: its last vector again, dropped
            // below), so that all of them are out before the first sum.
            let words: [[u32; 4]; TOTALS_VECTORS] = core::array::from_fn(|k| {
                let v = vector(k).min(body_vectors - 1);
                // SAFETY: vector v of the row's aligned body.
                unsafe { load_global_v4(x.add((body_start + v * per_vector) as usize) as *const u32) }
            });
            for (k, words) in words.into_iter().enumerate() {
                if vector(k) < body_vectors {
                    for i in 0..T::PER_VECTOR {
                        sums[k] = sums[k].combine(T::from_words(words, i).widen());
                    }
                }
            }
            chunk += parts;
        }
        for k_sum in sums {
            sum = sum.combine(k_sum);
        }
        // SAFETY: TOTALS_SHARED_BYTES holds a sum per warp.
        let warp_totals: *mut T::Sum = unsafe { SharedCarver::new().take(TOTALS_WARPS) };
        // SAFETY: every thread calls it; the warp totals are this block's alone.
        let (_, total) = unsafe { exclusive_scan::<T::Sum, TOTALS_WARPS>(sum, warp_totals) };
        if thread == 0 {
            // SAFETY: part < parts and row < outer.
            unsafe { *totals.add((part * problem.outer + row) as usize) = total };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_fill_a_wave_of_blocks_at_most_a_block_per_chunk() {
        let parts = |outer: u64, scan: u64, bytes: usize| {
            totals_parts(
                &ScanProblem {
                    outer,
                    scan,
                    inner: 1,
                },
                bytes,
                132,
            )
        };
        // 2^29 f32: 1056 blocks (8 an SM on 132 SMs); 8192-element chunks, 65536 of them.
        assert_eq!(parts(1, 1 << 29, 4), 1056);
        // Three rows share the wave.
        assert_eq!(parts(3, 1 << 29, 4), 352);
        // A short row: one block per chunk of 16384 bf16, a block at least.
        assert_eq!(parts(1, 40000, 2), 3);
        assert_eq!(parts(1000, 5, 8), 1);
    }
}
