//! The strided kernel of the min reduction (`inner > 1`): blocks of lanes along `inner`
//! by `slices` slices of the reduced axis, merged through shared memory. Wide rows, in
//! enough blocks to fill the GPU twice, take one slice, every lane of the block side by
//! side along a row: a block then reads `BLOCK_THREADS * lane_columns` consecutive
//! columns of a row, and where rows are not aligned the sector shared by two lanes'
//! columns is read by one SM rather than by two blocks (narrow blocks' 128 columns of
//! unaligned 16-bit rows read 9 sectors of L2 for 8 of data).

use super::{BLOCK_THREADS, MinOutputs, MinProblem};
use crate::launch::{DevicePtr, DevicePtrMut, Kernel, Launch, LaunchGeometry, kernel_args};

/// Slices of the reduced axis in a block over narrow rows (a warp's lanes along `inner`).
pub const NARROW_SLICES: u32 = BLOCK_THREADS / 32;
/// Rows each strided thread loads before it uses the first: enough that a lane keeps
/// 64 bytes of its columns in flight (16-bit lanes take 8 bytes a row: with 4 rows,
/// 32 bytes in flight held both their paths near 92% of the bandwidth).
pub const fn run_rows(element_bytes: usize) -> usize {
    let row_bytes = lane_columns(element_bytes) as usize * element_bytes;
    if row_bytes >= 16 { 4 } else { 64 / row_bytes }
}
/// Strided blocks that fit on one SM at once (64 registers a thread): with three, rows
/// of 16-bit columns loaded one by one kept too few loads in flight.
pub const STRIDED_BLOCKS_PER_SM: u32 = 4;
/// Dynamic shared memory of a strided block: a value (at most 8 bytes) and an index per
/// thread and column, for the most columns per lane (4).
pub const STRIDED_SHARED_BYTES: u32 = BLOCK_THREADS * 4 * 16;

/// Columns each lane takes: 16 bytes' worth, but at most 4. Eight 16-bit columns per
/// lane would keep eight running minima and their loads in flight in some 120
/// registers, two blocks per SM: too few loads in flight to reach the bandwidth.
pub const fn lane_columns(element_bytes: usize) -> u64 {
    let columns = (super::VECTOR_BYTES / element_bytes) as u64;
    if columns > 4 { 4 } else { columns }
}

/// Blocks of columns by slices of the reduced axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StridedPlan {
    /// Whether each lane loads its columns as one 128-bit vector (rows and the pitch
    /// aligned).
    pub vector: bool,
    /// Work items per output column (grid y).
    pub split: u64,
    /// Slices of the reduced axis in a block: 1 (every lane along `inner`) or
    /// [`NARROW_SLICES`] (a warp's lanes).
    pub slices: u32,
    /// Blocks along `inner` for one `outer` index.
    pub tiles_per_outer: u64,
}

kernel_args! {
    /// The strided kernel's arguments: `x` as `[outer, reduce, inner]`, its rows of
    /// `inner` elements `pitch` apart (`inner`, or more for a window of the columns of a
    /// wider array), reduced into `outer * inner * split` slots of `values` and
    /// `indices` (null for `amin`); `vector` (1 or 0) says whether rows keep 16-byte
    /// alignment.
    pub struct StridedArgs<T> {
        pub x: DevicePtr<T>,
        pub values: DevicePtrMut<T>,
        pub indices: DevicePtrMut<i64>,
        pub problem: MinProblem,
        pub pitch: u64,
        pub split: u64,
        pub tiles_per_outer: u64,
        pub slices: u32,
        pub vector: u32,
    }
    impl StridedKernel for f32 {
        const MIN_STRIDED = "min_strided_f32" => kernel::strided_rows::<f32, true, { super::VECTOR_BYTES / 4 }, { run_rows(4) }>, bounds(BLOCK_THREADS, STRIDED_BLOCKS_PER_SM);
        const AMIN_STRIDED = "amin_strided_f32" => kernel::strided_rows::<f32, false, { super::VECTOR_BYTES / 4 }, { run_rows(4) }>, bounds(BLOCK_THREADS, STRIDED_BLOCKS_PER_SM);
    }
    impl StridedKernel for f64 {
        const MIN_STRIDED = "min_strided_f64" => kernel::strided_rows::<f64, true, { super::VECTOR_BYTES / 8 }, { run_rows(8) }>, bounds(BLOCK_THREADS, STRIDED_BLOCKS_PER_SM);
        const AMIN_STRIDED = "amin_strided_f64" => kernel::strided_rows::<f64, false, { super::VECTOR_BYTES / 8 }, { run_rows(8) }>, bounds(BLOCK_THREADS, STRIDED_BLOCKS_PER_SM);
    }
    impl StridedKernel for i32 {
        const MIN_STRIDED = "min_strided_i32" => kernel::strided_rows::<i32, true, { super::VECTOR_BYTES / 4 }, { run_rows(4) }>, bounds(BLOCK_THREADS, STRIDED_BLOCKS_PER_SM);
        const AMIN_STRIDED = "amin_strided_i32" => kernel::strided_rows::<i32, false, { super::VECTOR_BYTES / 4 }, { run_rows(4) }>, bounds(BLOCK_THREADS, STRIDED_BLOCKS_PER_SM);
    }
    impl StridedKernel for half::bf16 {
        const MIN_STRIDED = "min_strided_bf16" => kernel::strided_rows::<half::bf16, true, 4, { run_rows(2) }>, bounds(BLOCK_THREADS, STRIDED_BLOCKS_PER_SM);
        const AMIN_STRIDED = "amin_strided_bf16" => kernel::strided_rows::<half::bf16, false, 4, { run_rows(2) }>, bounds(BLOCK_THREADS, STRIDED_BLOCKS_PER_SM);
    }
    impl StridedKernel for half::f16 {
        const MIN_STRIDED = "min_strided_f16" => kernel::strided_rows::<half::f16, true, 4, { run_rows(2) }>, bounds(BLOCK_THREADS, STRIDED_BLOCKS_PER_SM);
        const AMIN_STRIDED = "amin_strided_f16" => kernel::strided_rows::<half::f16, false, 4, { run_rows(2) }>, bounds(BLOCK_THREADS, STRIDED_BLOCKS_PER_SM);
    }
    entry points in ENTRY_POINTS;
}

/// The strided kernel of one element type, with indices (`min`) and without (`amin`).
pub trait StridedKernel: Sized {
    const MIN_STRIDED: Kernel<StridedArgs<Self>>;
    const AMIN_STRIDED: Kernel<StridedArgs<Self>>;
}

impl StridedPlan {
    /// The launch reducing `x`, its rows `pitch` elements apart, into `outputs` (the
    /// partials, with a split).
    pub fn launch<T: StridedKernel>(
        &self,
        problem: &MinProblem,
        pitch: u64,
        x: DevicePtr<T>,
        outputs: MinOutputs<T>,
    ) -> Launch<StridedArgs<T>> {
        let kernel = outputs.pick(T::MIN_STRIDED, T::AMIN_STRIDED);
        let geometry = LaunchGeometry {
            grid: [problem.outer * self.tiles_per_outer, self.split, 1],
            threads: BLOCK_THREADS,
            shared_bytes: STRIDED_SHARED_BYTES,
        };
        let args = StridedArgs {
            x,
            values: outputs.values,
            indices: outputs.indices,
            problem: *problem,
            pitch,
            split: self.split,
            tiles_per_outer: self.tiles_per_outer,
            slices: self.slices,
            vector: self.vector as u32,
        };
        Launch::new(kernel, geometry, args)
    }
}

#[cfg(target_arch = "nvptx64")]
mod kernel {
    use super::*;
    use crate::device::{
        SharedCarver, block_idx_x, block_idx_y, load_global_nc_v2, load_global_nc_v4, sync_threads,
        thread_idx_x,
    };
    use crate::launch::chunk;
    use crate::min::argmin::{ArgMin, MinValue};

    /// [`strided`], aligned or not as `args.vector` says, in wide or narrow blocks as
    /// `args.slices` does (constants, so that rows a slice apart cost no multiply).
    ///
    /// # Safety
    /// As [`strided`]; `COLUMNS` is [`lane_columns`] and `ROWS` [`run_rows`] of the
    /// element size; `vector` only when `inner` is a multiple of `COLUMNS`; `slices` 1
    /// or [`NARROW_SLICES`].
    #[inline(always)]
    pub unsafe fn strided_rows<T: MinValue, const INDEX: bool, const COLUMNS: usize, const ROWS: usize>(
        args: StridedArgs<T>,
    ) {
        // SAFETY: forwarded from the caller.
        unsafe {
            match (args.vector != 0, args.slices == 1) {
                (true, true) => strided::<T, INDEX, COLUMNS, ROWS, true, 1>(args),
                (false, true) => strided::<T, INDEX, COLUMNS, ROWS, false, 1>(args),
                (true, false) => strided::<T, INDEX, COLUMNS, ROWS, true, NARROW_SLICES>(args),
                (false, false) => strided::<T, INDEX, COLUMNS, ROWS, false, NARROW_SLICES>(args),
            }
        }
    }

    /// Reduces `reduce` rows of `BLOCK_THREADS / SLICES * COLUMNS` columns per block:
    /// each lane takes `COLUMNS` consecutive columns ([`lane_columns`]: one 128- or
    /// 64-bit load per row when `ALIGNED`, else one load per column, so that a warp
    /// still reads whole sectors when rows are not aligned); each of the `SLICES` slices
    /// takes every `SLICES`-th row of its chunk, by runs of `ROWS` rows, then the lanes
    /// merge the slices through shared memory (one barrier).
    ///
    /// Block (x, y): x = outer index * tiles_per_outer + tile, y = chunk of the reduced
    /// axis. Output column `m = outer * inner + column`; with `split > 1` the partial
    /// goes to slot `m * split + chunk`.
    ///
    /// # Safety
    /// `x` holds `outer * reduce` rows of `inner` elements, `pitch` apart (`pitch >=
    /// inner`), 16-byte aligned; `ALIGNED` only when `inner` and `pitch` are multiples of
    /// `COLUMNS`; `SLICES` divides `BLOCK_THREADS` by a multiple of 32; the output holds
    /// `outer * inner * split` slots; the block has `BLOCK_THREADS` threads and
    /// `STRIDED_SHARED_BYTES` of dynamic shared memory.
    #[inline(always)]
    unsafe fn strided<
        T: MinValue,
        const INDEX: bool,
        const COLUMNS: usize,
        const ROWS: usize,
        const ALIGNED: bool,
        const SLICES: u32,
    >(
        args: StridedArgs<T>,
    ) {
        let StridedArgs {
            problem,
            pitch,
            split,
            tiles_per_outer,
            ..
        } = args;
        let (x, values, indices) = (
            args.x.as_ptr(),
            args.values.as_mut_ptr(),
            args.indices.as_mut_ptr(),
        );
        let MinProblem { reduce, inner, .. } = problem;
        let (outer, tile) = (
            block_idx_x() as u64 / tiles_per_outer,
            block_idx_x() as u64 % tiles_per_outer,
        );
        let part = block_idx_y() as u64;
        let lanes = BLOCK_THREADS / SLICES;
        let (tx, ty) = (thread_idx_x() % lanes, thread_idx_x() / lanes);
        let block_columns = lanes as u64 * COLUMNS as u64;
        let column = tile * block_columns + tx as u64 * COLUMNS as u64;
        let (begin, end) = chunk(reduce, split, part, 1);

        let first = begin + ty as u64;
        let state = if first < end {
            ArgMin::<T, INDEX>::starting_at(first)
        } else {
            ArgMin::empty(T::LARGEST)
        };
        let mut states = [state; COLUMNS];
        let valid = inner.saturating_sub(column).min(COLUMNS as u64);
        if valid > 0 {
            let load = |r: u64| -> [T; COLUMNS] {
                let at = (outer * reduce + r) * pitch + column;
                let mut out = [T::LARGEST; COLUMNS];
                if ALIGNED {
                    let address = x.wrapping_add(at as usize) as *const u32;
                    // SAFETY: `inner`, `pitch` and `column` are multiples of COLUMNS, so
                    // the COLUMNS elements (8 or 16 bytes) are aligned and inside the row.
                    let words = unsafe {
                        if COLUMNS * size_of::<T>() == 16 {
                            load_global_nc_v4(address)
                        } else {
                            let [a, b] = load_global_nc_v2(address);
                            [a, b, 0, 0]
                        }
                    };
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
            let step = SLICES as u64;
            // Per column, the least element so far and where it first is, taken a run of
            // rows at a time. A run past the last row repeats its first.
            let take_run = |states: &mut [ArgMin<T, INDEX>; COLUMNS], held: [[T; COLUMNS]; ROWS], r: u64| {
                for (i, state) in states.iter_mut().enumerate() {
                    if (i as u64) < valid {
                        state.push_run(core::array::from_fn::<T, ROWS, _>(|u| held[u][i]), r, step);
                    }
                }
            };
            let mut r = first;
            while r + (ROWS as u64 - 1) * step < end {
                take_run(
                    &mut states,
                    core::array::from_fn(|u| load(r + u as u64 * step)),
                    r,
                );
                r += ROWS as u64 * step;
            }
            if r < end {
                let first = load(r);
                let held = core::array::from_fn(|u| {
                    let row = r + u as u64 * step;
                    if u > 0 && row < end { load(row) } else { first }
                });
                take_run(&mut states, held, r);
            }
        }

        // Shared: [SLICES][block_columns] values, then the same of indices.
        let mut carver = SharedCarver::new();
        // SAFETY: the launch gives STRIDED_SHARED_BYTES, enough for both regions at the
        // widest vector; each thread writes only its own slots before the barrier.
        let (shared_values, shared_indices) = unsafe {
            let slots = (SLICES as u64 * block_columns) as usize;
            (carver.take::<T>(slots), carver.take::<u64>(slots))
        };
        for (v, s) in states.iter().enumerate() {
            let slot = (ty as u64 * block_columns + tx as u64 * COLUMNS as u64 + v as u64) as usize;
            // SAFETY: slot < SLICES * block_columns.
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
                for slice in 1..SLICES as u64 {
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
}
