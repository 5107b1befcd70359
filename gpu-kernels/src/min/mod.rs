//! Min reduction along one axis: values and the index of the first minimum
//! (`torch.min(x, dim)`), or values alone (`torch.amin`). NaN wins: a lane holding NaN
//! reduces to NaN and the index of its first NaN.
//!
//! The array is seen as `[outer, reduce, inner]` (row-major), the output as
//! `[outer, inner]`. Two layouts, three kernels:
//! - [`rows`] (`inner == 1`, the reduced axis contiguous): a group of `group_lanes` lanes
//!   (1..=32, a power of two) per row, 128-bit loads after a scalar head that reaches
//!   alignment, then a shuffle reduction inside the group;
//! - [`strided`] (`inner > 1`): a block of lanes along `inner` (each lane up to 16 bytes
//!   of consecutive columns, one vector load when `inner` keeps rows aligned) by slices
//!   of the reduced axis (8, or 1 for wide rows in enough blocks), combined through
//!   shared memory;
//! - [`slab`] (`inner > 1`, rows not vector-aligned, of 1025 to 4096 elements): a block
//!   takes whole rows of a chunk of the reduced axis, copied as one span into a ring of
//!   shared-memory stages, each thread 4 columns.
//!
//! Every kernel takes its elements by runs (a few vectors of a row, a few rows of a
//! column) and keep only each run's least element, found with packed `min.NaN` (two
//! 16-bit elements an instruction). For `min`, a run holding a new least (a few runs of
//! a row or column, on most data) is searched at once for where it first is, so no
//! run's elements stay in registers. Comparing every element's value and index ran
//! 16-bit rows at 80% of the bandwidth.
//!
//! When the output alone cannot fill the GPU, the reduced axis is also split over
//! `split` work items per output; those write `[output][split]` partials that the
//! [`combine`] kernel reduces in a fixed order. All offsets are 64-bit.

#[cfg(target_arch = "nvptx64")]
mod argmin;
pub mod combine;
pub mod rows;
pub mod slab;
pub mod strided;

use crate::launch::{
    DeviceLimits, DevicePtrMut, EntryPoint, Kernel, Launch, ScratchLayout, THREADS_PER_SM, lanes_for,
};
use combine::{CombineArgs, CombineKernel};
use rows::{RowsKernel, RowsPlan};
use slab::{SLAB_THREADS, SlabKernel, SlabPlan};
use strided::{NARROW_SLICES, STRIDED_BLOCKS_PER_SM, StridedKernel, StridedPlan, lane_columns};

/// Threads per block of every min kernel.
pub const BLOCK_THREADS: u32 = 256;
/// Bytes of one vector load.
pub const VECTOR_BYTES: usize = 16;
/// A split never makes a work item shorter than this many elements of the reduced axis.
pub const MIN_SPLIT_CHUNK: u64 = 2048;

const _: () = assert!(BLOCK_THREADS.is_multiple_of(32));

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

/// An element type of `min` and `amin`: every min entry point exists for it.
pub trait MinType: RowsKernel + StridedKernel + SlabKernel + CombineKernel {}

impl MinType for f32 {}
impl MinType for f64 {}
impl MinType for i32 {}
impl MinType for half::bf16 {}
impl MinType for half::f16 {}

/// Every min entry point.
pub const ENTRY_POINTS: &[&[EntryPoint]] = &[
    rows::ENTRY_POINTS,
    strided::ENTRY_POINTS,
    slab::ENTRY_POINTS,
    combine::ENTRY_POINTS,
];

/// Where a reduction writes: values, and indices (null for `amin`).
#[derive(Debug, Clone, Copy)]
pub struct MinOutputs<T> {
    pub values: DevicePtrMut<T>,
    pub indices: DevicePtrMut<i64>,
}

impl<T> MinOutputs<T> {
    /// Whether indices are wanted (`min`, not `amin`).
    pub fn with_index(&self) -> bool {
        !self.indices.is_null()
    }

    /// The kernel of a pair that writes these outputs: `min` with indices, else `amin`.
    pub fn pick<A>(&self, min: Kernel<A>, amin: Kernel<A>) -> Kernel<A> {
        if self.with_index() { min } else { amin }
    }
}

/// Which kernel takes the first pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MinPlan {
    Rows(RowsPlan),
    Strided(StridedPlan),
    Slab(SlabPlan),
}

impl MinPlan {
    /// The split of the reduced axis (1: no partials, no combine pass).
    pub const fn split(&self) -> u64 {
        match self {
            MinPlan::Rows(p) => p.split,
            MinPlan::Strided(p) => p.split,
            MinPlan::Slab(p) => p.split,
        }
    }

    /// The scratch memory of the partials: `[output][split]` values (256-byte aligned),
    /// then as many indices; none without a split.
    pub const fn scratch(&self, problem: &MinProblem, element_bytes: usize) -> ScratchLayout {
        if self.split() == 1 {
            return ScratchLayout { bytes: 0, zeroed: 0 };
        }
        let slots = problem.outputs() * self.split();
        ScratchLayout {
            bytes: (slots * element_bytes as u64).next_multiple_of(256) + slots * 8,
            zeroed: 0,
        }
    }

    /// Where the first pass writes: `outputs`, or with a split the partials in
    /// `scratch` (laid out by [`Self::scratch`]).
    pub fn first_pass_outputs<T>(
        &self,
        problem: &MinProblem,
        outputs: MinOutputs<T>,
        scratch: DevicePtrMut<u8>,
    ) -> MinOutputs<T> {
        if self.split() == 1 {
            return outputs;
        }
        let values_bytes = (problem.outputs() * self.split() * size_of::<T>() as u64).next_multiple_of(256);
        MinOutputs {
            values: scratch.cast(),
            indices: if outputs.with_index() {
                scratch.offset(values_bytes).cast()
            } else {
                DevicePtrMut::NULL
            },
        }
    }

    /// The second pass, with a split: the partials merged in order into `outputs`.
    pub fn combine<T: CombineKernel>(
        &self,
        problem: &MinProblem,
        partials: MinOutputs<T>,
        outputs: MinOutputs<T>,
    ) -> Option<Launch<CombineArgs<T>>> {
        (self.split() > 1).then(|| combine::launch(problem.outputs(), self.split(), partials, outputs))
    }
}

/// The launch plan for a problem of `element_bytes`-byte elements in a 16-byte aligned
/// array. The problem must be non-empty.
pub fn plan(problem: &MinProblem, element_bytes: usize, device: &DeviceLimits) -> MinPlan {
    plan_window(problem, problem.inner, element_bytes, true, device)
}

/// The launch plan for a problem whose rows of `inner` elements lie `pitch` apart
/// (`pitch >= inner`): the whole array (`pitch == inner`), or a window of the columns of
/// a wider one, which the strided kernel reduces whatever `inner`; `aligned` when the
/// array starts at a 16-byte boundary.
pub fn plan_window(
    problem: &MinProblem,
    pitch: u64,
    element_bytes: usize,
    aligned: bool,
    device: &DeviceLimits,
) -> MinPlan {
    let per_vector = (VECTOR_BYTES / element_bytes) as u64;
    // More work items per output (`threads` of them without a split) only while the
    // GPU holds twice as many or more (`threads_per_sm` each SM; a second wave of
    // blocks would run alone), each at least `min_chunk` elements of the reduced axis
    // long, and never past grid y.
    let split_for = |threads: u64, threads_per_sm: u64, min_chunk: u64| {
        let wanted = device.multiprocessors as u64 * threads_per_sm / threads.max(1);
        let split = wanted.min(problem.reduce / min_chunk).clamp(1, 65535);
        even_split(problem.reduce, split)
    };
    if problem.inner == 1 && pitch == 1 {
        // Enough lanes that each loads a few vectors; whole warps for long rows.
        let vectors = problem.reduce.div_ceil(per_vector * rows::UNROLL as u64);
        let group_lanes = lanes_for(vectors);
        let split = split_for(
            problem.outer * group_lanes as u64,
            THREADS_PER_SM,
            MIN_SPLIT_CHUNK,
        );
        let threads = problem.outer * split * group_lanes as u64;
        MinPlan::Rows(RowsPlan {
            group_lanes,
            split,
            blocks: threads.div_ceil(BLOCK_THREADS as u64),
        })
    } else {
        let columns = lane_columns(element_bytes);
        let vector = problem.inner.is_multiple_of(columns) && pitch.is_multiple_of(columns);
        // Unaligned rows that a block can take whole are read as one span a block, a
        // block an SM: 128 x 4096 x 4095 along dim 1 at 103% of the copy rate in bf16
        // (the strided kernel: 95%), 105% in f32 (101%) on an H100.
        if !vector
            && aligned
            && pitch == problem.inner
            && slab::fits(problem.inner, device.max_shared_bytes_per_block)
        {
            let split = split_for(
                problem.outer * SLAB_THREADS as u64,
                SLAB_THREADS as u64,
                slab::min_chunk_rows(problem.inner * element_bytes as u64),
            );
            return MinPlan::Slab(SlabPlan { split });
        }
        // Rows that fill a block's lanes side by side take one slice (a block then
        // shares only its edge sectors with others) where such blocks fill the GPU
        // twice over. Fewer each walk the whole axis: 512 of them (128 x 4096 x 4095
        // along dim 1, one wave) read at 74% of the copy rate, narrow blocks at 90%.
        let wide_columns = BLOCK_THREADS as u64 * columns;
        let wide_blocks = problem.outer * problem.inner.div_ceil(wide_columns);
        let blocks_at_once = device.multiprocessors as u64 * STRIDED_BLOCKS_PER_SM as u64;
        let slices = if problem.inner >= wide_columns && wide_blocks >= 2 * blocks_at_once {
            1
        } else {
            NARROW_SLICES
        };
        let tiles_per_outer = problem.inner.div_ceil(wide_columns / slices as u64);
        let resident = (STRIDED_BLOCKS_PER_SM * BLOCK_THREADS) as u64;
        let split = split_for(
            problem.outer * tiles_per_outer * BLOCK_THREADS as u64,
            resident,
            MIN_SPLIT_CHUNK,
        );
        MinPlan::Strided(StridedPlan {
            vector,
            split,
            slices,
            tiles_per_outer,
        })
    }
}

/// The number of chunks of `ceil(reduce / split)` elements that covers `reduce`: at
/// most `split`, none empty, and with the same chunk length (the kernels recompute it).
const fn even_split(reduce: u64, split: u64) -> u64 {
    reduce.div_ceil(reduce.div_ceil(split))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::launch::H100;

    fn plan_of(outer: u64, reduce: u64, inner: u64, bytes: usize) -> MinPlan {
        plan(&MinProblem { outer, reduce, inner }, bytes, &H100)
    }

    #[test]
    fn headline_axes_fill_the_gpu_without_a_split() {
        assert_eq!(
            plan_of(128 * 4096, 4095, 1, 4),
            MinPlan::Rows(RowsPlan {
                group_lanes: 32,
                split: 1,
                blocks: 65536
            })
        );
        assert_eq!(plan_of(128, 4096, 4095, 4), MinPlan::Slab(SlabPlan { split: 1 }));
        assert_eq!(
            plan_of(1, 128, 4096 * 4095, 4),
            MinPlan::Strided(StridedPlan {
                vector: true,
                split: 1,
                slices: 1,
                tiles_per_outer: 4096 * 4095 / 1024
            })
        );
    }

    #[test]
    fn wide_blocks_only_where_they_fill_the_gpu_twice() {
        let slices = |outer, inner, bytes| match plan_of(outer, 7, inner, bytes) {
            MinPlan::Strided(p) => (p.slices, p.split),
            other => panic!("{other:?}"),
        };
        // H100: 132 SMs of 4 blocks; 1032 columns are 2 wide blocks (1024 columns each),
        // unaligned rows of 4102 (past the slab kernel's) 5.
        assert_eq!(slices(528, 1032, 2), (1, 1));
        assert_eq!(slices(528, 1032, 4), (1, 1));
        assert_eq!(slices(527, 1032, 2).0, NARROW_SLICES);
        assert_eq!(slices(212, 4102, 2), (1, 1));
        assert_eq!(slices(211, 4102, 4).0, NARROW_SLICES);
        assert_eq!(slices(4000, 1023, 4).0, NARROW_SLICES);
        // f64 lanes take 2 columns: 512 make a wide block.
        assert_eq!(slices(1056, 512, 8), (1, 1));
    }

    #[test]
    fn unaligned_rows_of_whole_blocks_take_the_slab_kernel() {
        let problem = |outer, reduce, inner| MinProblem { outer, reduce, inner };
        assert_eq!(plan_of(128, 4096, 4095, 2), MinPlan::Slab(SlabPlan { split: 1 }));
        assert_eq!(plan_of(70, 10, 1029, 4), MinPlan::Slab(SlabPlan { split: 1 }));
        // Few outputs: a block an SM, chunks of at least two stages (64 KB): 8 rows of
        // 8200 bytes, 16 of 4116, 6 of 12004 (111 chunks of 7).
        assert_eq!(plan_of(2, 33, 1025, 8), MinPlan::Slab(SlabPlan { split: 4 }));
        assert_eq!(
            plan_of(3, 100_000, 2047, 2),
            MinPlan::Slab(SlabPlan { split: 44 })
        );
        assert_eq!(plan_of(3, 5000, 1029, 4), MinPlan::Slab(SlabPlan { split: 44 }));
        assert_eq!(plan_of(1, 777, 3001, 4), MinPlan::Slab(SlabPlan { split: 111 }));
        let strided = |plan: MinPlan| matches!(plan, MinPlan::Strided(_));
        // Too short, too long, vector-aligned, or the array not 16-byte aligned.
        assert!(strided(plan_of(128, 4096, 1023, 2)));
        assert!(strided(plan_of(128, 4096, 4097, 2)));
        assert!(strided(plan_of(128, 4096, 4096, 2)));
        assert!(strided(plan_window(
            &problem(128, 4096, 4095),
            4095,
            2,
            false,
            &H100
        )));
        // A window of a wider array.
        assert!(strided(plan_window(
            &problem(128, 4096, 4095),
            4097,
            2,
            true,
            &H100
        )));
        // A device without the ring's shared memory.
        let small = DeviceLimits {
            max_shared_bytes_per_block: 99 * 1024,
            ..H100
        };
        assert!(strided(plan_window(
            &problem(128, 4096, 4095),
            4095,
            2,
            true,
            &small
        )));
    }

    #[test]
    fn few_outputs_split_the_axis_into_nonempty_chunks() {
        for (outer, reduce, inner, bytes) in [
            (1, 1 << 31, 1, 4),
            (3, 1_000_003, 1, 8),
            (1, 200_000, 3, 4),
            (2, 65_537 * 2048 + 5, 1, 4),
        ] {
            let plan = plan_of(outer, reduce, inner, bytes);
            let split = plan.split();
            assert!(split > 1 && split <= 65535, "{plan:?}");
            let size = reduce.div_ceil(split);
            assert!(size >= MIN_SPLIT_CHUNK && (split - 1) * size < reduce, "{plan:?}");
            assert_eq!(
                crate::launch::chunk(reduce, split, split - 1, 1).1,
                reduce,
                "{plan:?}"
            );
        }
    }

    #[test]
    fn short_rows_share_warps_and_odd_inner_loads_scalars() {
        let rows = |reduce| match plan_of(1000, reduce, 1, 4) {
            MinPlan::Rows(p) => p.group_lanes,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            (rows(1), rows(16), rows(17), rows(100), rows(4096)),
            (1, 1, 2, 8, 32)
        );
        let vector = |inner, bytes| matches!(plan_of(5, 7, inner, bytes), MinPlan::Strided(p) if p.vector);
        assert!(vector(8, 4) && vector(6, 8) && !vector(6, 4) && !vector(3, 8));
        // 16-bit lanes take 4 columns (8 bytes), not 8.
        assert!(vector(4, 2) && vector(12, 2) && !vector(6, 2));
    }

    #[test]
    fn partials_sit_in_scratch_only_with_a_split() {
        let problem = MinProblem {
            outer: 3,
            reduce: 1_000_003,
            inner: 1,
        };
        let plan = plan(&problem, 8, &H100);
        let split = plan.split();
        assert_eq!(
            plan.scratch(&problem, 8).bytes,
            (3 * split * 8).next_multiple_of(256) + 3 * split * 8
        );
        let outputs = MinOutputs::<f64> {
            values: DevicePtrMut::from_address(1 << 30),
            indices: DevicePtrMut::NULL,
        };
        let first = plan.first_pass_outputs(&problem, outputs, DevicePtrMut::from_address(1 << 20));
        assert_eq!(first.values.address(), 1 << 20);
        assert!(first.indices.is_null());
        let unsplit = plan_of(128 * 4096, 4095, 1, 4);
        let problem = MinProblem {
            outer: 128 * 4096,
            reduce: 4095,
            inner: 1,
        };
        assert_eq!(unsplit.scratch(&problem, 4).bytes, 0);
        assert!(
            unsplit
                .combine::<f32>(&problem, outputs_f32(), outputs_f32())
                .is_none()
        );
    }

    fn outputs_f32() -> MinOutputs<f32> {
        MinOutputs {
            values: DevicePtrMut::from_address(256),
            indices: DevicePtrMut::from_address(512),
        }
    }
}
