//! The rows kernel of the min reduction: the reduced axis contiguous (`inner == 1`), a
//! group of lanes per row (or per chunk of a row, with a split), 128-bit loads.

use super::{BLOCK_THREADS, MinOutputs, MinProblem, VECTOR_BYTES};
use crate::launch::{DevicePtr, DevicePtrMut, Kernel, Launch, LaunchGeometry, kernel_args};

/// Vector loads each thread of the rows kernel issues before it uses the first.
pub const UNROLL: usize = 4;

/// Rows reduced by groups of `group_lanes` lanes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowsPlan {
    /// Lanes per row (work item), a power of two up to 32.
    pub group_lanes: u32,
    /// Work items per row.
    pub split: u64,
    pub blocks: u64,
}

kernel_args! {
    /// The rows kernel's arguments: rows of `reduce` elements from `skew` elements past
    /// `x` (16-byte aligned) on, reduced in `items` work items of `group_lanes` lanes
    /// (`split` per row) into `values` and `indices` (null for `amin`), one slot per
    /// work item.
    pub struct RowsArgs<T> {
        pub x: DevicePtr<T>,
        pub skew: u64,
        pub values: DevicePtrMut<T>,
        pub indices: DevicePtrMut<i64>,
        pub reduce: u64,
        pub items: u64,
        pub split: u64,
        pub group_lanes: u32,
    }
    impl RowsKernel for f32 {
        const MIN_ROWS = "min_rows_f32" => kernel::rows::<f32, true>;
        const AMIN_ROWS = "amin_rows_f32" => kernel::rows::<f32, false>;
    }
    impl RowsKernel for f64 {
        const MIN_ROWS = "min_rows_f64" => kernel::rows::<f64, true>;
        const AMIN_ROWS = "amin_rows_f64" => kernel::rows::<f64, false>;
    }
    impl RowsKernel for i32 {
        const MIN_ROWS = "min_rows_i32" => kernel::rows::<i32, true>;
        const AMIN_ROWS = "amin_rows_i32" => kernel::rows::<i32, false>;
    }
    impl RowsKernel for half::bf16 {
        const MIN_ROWS = "min_rows_bf16" => kernel::rows::<half::bf16, true>;
        const AMIN_ROWS = "amin_rows_bf16" => kernel::rows::<half::bf16, false>;
    }
    impl RowsKernel for half::f16 {
        const MIN_ROWS = "min_rows_f16" => kernel::rows::<half::f16, true>;
        const AMIN_ROWS = "amin_rows_f16" => kernel::rows::<half::f16, false>;
    }
    entry points in ENTRY_POINTS;
}

/// The rows kernel of one element type, with indices (`min`) and without (`amin`).
pub trait RowsKernel: Sized {
    const MIN_ROWS: Kernel<RowsArgs<Self>>;
    const AMIN_ROWS: Kernel<RowsArgs<Self>>;
}

impl RowsPlan {
    /// The launch reducing `x` into `outputs` (the partials, with a split). `x` may
    /// start anywhere (a window of a larger array): the kernel reads from the 16-byte
    /// boundary before it, which lies in the same allocation.
    pub fn launch<T: RowsKernel>(
        &self,
        problem: &MinProblem,
        x: DevicePtr<T>,
        outputs: MinOutputs<T>,
    ) -> Launch<RowsArgs<T>> {
        let kernel = outputs.pick(T::MIN_ROWS, T::AMIN_ROWS);
        let skew = x.address() % VECTOR_BYTES as u64 / size_of::<T>() as u64;
        let args = RowsArgs {
            x: DevicePtr::from_address(x.address() - skew * size_of::<T>() as u64),
            skew,
            values: outputs.values,
            indices: outputs.indices,
            reduce: problem.reduce,
            items: problem.outer * self.split,
            split: self.split,
            group_lanes: self.group_lanes,
        };
        Launch::new(kernel, LaunchGeometry::linear(self.blocks, BLOCK_THREADS), args)
    }
}

#[cfg(target_arch = "nvptx64")]
mod kernel {
    use super::*;
    use crate::device::{block_dim_x, block_idx_x, load_global_nc_v4, thread_idx_x};
    use crate::launch::chunk;
    use crate::min::argmin::{ArgMin, MinValue, same_key};

    /// Reduces one row segment per group of `group_lanes` lanes.
    ///
    /// Work item `w` (one per group) is chunk `w % split` of row `w / split`; with
    /// `split == 1` it writes the output, else the partial at `w`.
    ///
    /// # Safety
    /// `x` is 16-byte aligned, and `items / split` rows of `reduce` elements follow
    /// `skew` elements past it; `values` and `indices` hold `items` slots; the grid
    /// covers `items * group_lanes` threads.
    #[inline(always)]
    pub unsafe fn rows<T: MinValue, const INDEX: bool>(args: RowsArgs<T>) {
        let RowsArgs {
            skew,
            reduce,
            items,
            split,
            group_lanes,
            ..
        } = args;
        let (x, values, indices) = (
            args.x.as_ptr(),
            args.values.as_mut_ptr(),
            args.indices.as_mut_ptr(),
        );
        let thread = block_idx_x() as u64 * block_dim_x() as u64 + thread_idx_x() as u64;
        let item = thread / group_lanes as u64;
        let lane = (thread % group_lanes as u64) as u32;
        // SAFETY: the rows hold at least one element (the host never launches empty
        // problems).
        let mut state = ArgMin::<T, INDEX>::empty(unsafe { *x.add(skew as usize) });
        if item < items {
            let (row, part) = (item / split, item % split);
            let (begin, end) = chunk(reduce, split, part, 1);
            // SAFETY: [begin, end) lies inside row `row`.
            unsafe { scan_segment(&mut state, x, skew + row * reduce, begin, end, lane, group_lanes) };
        }
        let state = state.merge_group(group_lanes);
        if item < items && lane == 0 {
            // SAFETY: `item < items`.
            unsafe { state.store(values, indices, item) };
        }
    }

    /// Pushes elements `[begin, end)` of the row starting at flat offset `row_start`
    /// into `state`, this lane taking its share: a scalar head up to 16-byte alignment,
    /// whole vectors, then a scalar tail. The lane's first head and tail elements are
    /// loaded before the vectors, so that their latency overlaps the vectors' instead of
    /// adding to it; the head then joins through `merge`, which takes any order.
    ///
    /// The vectors go by runs of `UNROLL`: of each run only its least element is kept
    /// (packed `min.NaN`, two 16-bit elements per instruction). For `min`, a run whose
    /// least is new is searched element by element for where it first is, at once.
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
        let (head_first, tail_first) = (flat_begin + lane, tail + lane);
        let head_value = (head_first < aligned).then(|| element(head_first));
        let tail_value = (tail_first < flat_end).then(|| element(tail_first));
        // The least element of the runs so far and (for `min`) where it first is: a run
        // holding a new least (a few runs of a row, on most data) is searched while its
        // vectors are still in registers. A run past the last vector repeats its first.
        let mut runs = ArgMin::<T, INDEX>::empty(state.value);
        let mut take_run = |held: [[u32; 4]; UNROLL], v: u64| {
            let least = held[1..]
                .iter()
                .fold(held[0], |least, words| T::least_of_vectors(least, *words));
            let least = T::least_in_vector(least);
            if runs.push(least, v) && INDEX {
                let (u, i) = held
                    .iter()
                    .enumerate()
                    .find_map(|(u, words)| {
                        (0..T::PER_VECTOR)
                            .position(|i| same_key(T::from_words(*words, i), least))
                            .map(|i| (u, i))
                    })
                    .unwrap_or((0, 0));
                runs.index = aligned + (v + u as u64 * lanes) * per_vector + i as u64 - row_start;
            }
        };
        let mut v = lane;
        while v + (UNROLL as u64 - 1) * lanes < vectors {
            take_run(core::array::from_fn(|u| vector(v + u as u64 * lanes)), v);
            v += UNROLL as u64 * lanes;
        }
        if v < vectors {
            let first = vector(v);
            let held = core::array::from_fn(|u| {
                let w = v + u as u64 * lanes;
                if u > 0 && w < vectors { vector(w) } else { first }
            });
            take_run(held, v);
        }
        *state = runs;
        // Head and tail hold fewer than PER_VECTOR elements each, but a group may be
        // narrower: then a lane takes more than one.
        let mut head = ArgMin::<T, INDEX>::empty(state.value);
        if let Some(value) = head_value {
            head.push(value, head_first - row_start);
        }
        let mut flat = head_first + lanes;
        while flat < aligned {
            head.push(element(flat), flat - row_start);
            flat += lanes;
        }
        *state = head.merge(*state);
        if let Some(value) = tail_value {
            state.push(value, tail_first - row_start);
        }
        let mut flat = tail_first + lanes;
        while flat < flat_end {
            state.push(element(flat), flat - row_start);
            flat += lanes;
        }
    }
}
