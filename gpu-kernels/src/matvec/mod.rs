//! Matrix-vector products `y = alpha * op(A) x + beta * y`, `op(A)` = A or A^T, for a
//! row-major A of shape `[rows, cols]`; deterministic (every sum is taken in a fixed
//! order, no floating-point atomics).
//!
//! - [`rows`] (`y = A x`): a group of `group_lanes` lanes (1..=32) per work item, an
//!   item being one row or, when the rows alone cannot fill the GPU, one of `split`
//!   chunks of a row, over `ROWS_PER_ITEM` rows at once so that each load of x serves
//!   them all; 128-bit loads of A (read-only path) and of x (from L2) when `cols` keeps
//!   rows aligned, `ROWS_UNROLL` vectors per row in flight with as many accumulators,
//!   then a shuffle reduction inside the group;
//! - [`columns`] (`y = A^T x`): blocks of `TX` lanes along `cols` (16 bytes of columns
//!   each) by `TY` slices of rows, summed through shared memory, rows split over
//!   `split` blocks when the columns cannot fill the GPU;
//! - [`vectors`] (`Y = A X`, X with 2 to 16 columns): A read once, each block holding
//!   a chunk of X in shared memory for many rows, `split` = the chunks of columns.
//!
//! With `split > 1` the first pass writes `[split][output]` partials and [`combine`]
//! adds them in a fixed order and applies alpha and beta; otherwise the first pass
//! does. With `beta == 0`, y is not read (it may hold anything, NaN included).

pub mod columns;
pub mod combine;
pub mod rows;
#[cfg(target_arch = "nvptx64")]
mod value;
pub mod vectors;

use crate::element::{Sum, Summed, sum_bytes};
use crate::launch::{
    DeviceLimits, DevicePtr, DevicePtrMut, EntryPoint, Kernel, Launch, ScratchLayout, kernel_args, lanes_for,
};
use columns::{COLUMNS_TX, ColumnsPlan};
use combine::{CombineArgs, CombineKernel};
use rows::{MIN_SPLIT_CHUNK, ROWS_ITEMS_PER_SM, ROWS_PER_ITEM, ROWS_UNROLL, RowsPlan};
use vectors::{VectorsKernels, VectorsPlan};

/// Threads per block of every matvec kernel.
pub const BLOCK_THREADS: u32 = 256;

const _: () = assert!(BLOCK_THREADS.is_multiple_of(32));

/// A as `[rows, cols]`, times `vectors` vectors (the columns of X).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemvProblem {
    pub rows: u64,
    pub cols: u64,
    /// Columns of X and of y: 1, or up to `vectors::MAX_VECTORS` without the transpose.
    pub vectors: u64,
    /// Whether y = A^T x (else y = A x).
    pub transpose: bool,
}

impl GemvProblem {
    /// Elements of y.
    pub const fn outputs(&self) -> u64 {
        (if self.transpose { self.cols } else { self.rows }) * self.vectors
    }
}

/// An element type of the matrix-vector products: every matvec entry point exists for
/// it.
pub trait GemvType: FirstPassKernels + VectorsKernels + CombineKernel {}

/// The first-pass kernels of one element type: rows (`A x`) and columns (`A^T x`).
pub trait FirstPassKernels: Summed {
    const ROWS: Kernel<GemvArgs<Self>>;
    const COLUMNS: Kernel<GemvArgs<Self>>;
}

impl GemvType for f32 {}
impl GemvType for f64 {}
impl GemvType for half::bf16 {}
impl GemvType for half::f16 {}

/// Every matvec entry point.
pub const ENTRY_POINTS: &[&[EntryPoint]] = &[
    FIRST_PASS_ENTRY_POINTS,
    vectors::ENTRY_POINTS,
    combine::ENTRY_POINTS,
];

kernel_args! {
    /// The first pass's arguments, for either kernel: `y = alpha * op(A) x + beta * y`,
    /// or with `split > 1` the `[output][split]` partials of `op(A) x` in `out`;
    /// `group_lanes` (the rows kernel's lanes per item) and `vector` (1 or 0: rows keep
    /// 16-byte alignment) as the plan says.
    pub struct GemvArgs<T: Summed> {
        pub a: DevicePtr<T>,
        pub x: DevicePtr<T>,
        pub out: DevicePtrMut<Sum<T>>,
        pub y: DevicePtrMut<T>,
        pub alpha: Sum<T>,
        pub beta: Sum<T>,
        pub problem: GemvProblem,
        pub split: u64,
        pub group_lanes: u32,
        pub vector: u32,
    }
    impl FirstPassKernels for f32 {
        const ROWS = "gemv_rows_f32" => rows::kernel::rows_of::<f32>;
        const COLUMNS = "gemv_columns_f32" => columns::kernel::columns_of::<f32, 4>,
            bounds(BLOCK_THREADS, columns::blocks_per_sm(4));
    }
    impl FirstPassKernels for f64 {
        const ROWS = "gemv_rows_f64" => rows::kernel::rows_of::<f64>;
        const COLUMNS = "gemv_columns_f64" => columns::kernel::columns_of::<f64, 2>,
            bounds(BLOCK_THREADS, columns::blocks_per_sm(8));
    }
    impl FirstPassKernels for half::bf16 {
        const ROWS = "gemv_rows_bf16" => rows::kernel::rows_of::<half::bf16>;
        const COLUMNS = "gemv_columns_bf16" => columns::kernel::columns_of::<half::bf16, 8>,
            bounds(BLOCK_THREADS, columns::blocks_per_sm(2));
    }
    impl FirstPassKernels for half::f16 {
        const ROWS = "gemv_rows_f16" => rows::kernel::rows_of::<half::f16>;
        const COLUMNS = "gemv_columns_f16" => columns::kernel::columns_of::<half::f16, 8>,
            bounds(BLOCK_THREADS, columns::blocks_per_sm(2));
    }
    entry points in FIRST_PASS_ENTRY_POINTS;
}

/// What a product takes: `y = alpha * op(A) x + beta * y`.
#[derive(Debug, Clone, Copy)]
pub struct GemvOperands<T: Summed> {
    pub a: DevicePtr<T>,
    pub x: DevicePtr<T>,
    pub y: DevicePtrMut<T>,
    pub alpha: T::Sum,
    pub beta: T::Sum,
    pub problem: GemvProblem,
}

impl<T: Summed> GemvOperands<T> {
    /// The first pass's arguments, writing y, or `partials` with a split.
    pub const fn arguments(
        &self,
        partials: DevicePtrMut<T::Sum>,
        split: u64,
        group_lanes: u32,
        vector: bool,
    ) -> GemvArgs<T> {
        GemvArgs {
            a: self.a,
            x: self.x,
            out: partials,
            y: self.y,
            alpha: self.alpha,
            beta: self.beta,
            problem: self.problem,
            split,
            group_lanes,
            vector: vector as u32,
        }
    }
}

/// Which kernel takes the first pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemvPlan {
    Rows(RowsPlan),
    Columns(ColumnsPlan),
    Vectors(VectorsPlan),
}

impl GemvPlan {
    /// The split (1: no partials, no combine pass).
    pub const fn split(&self) -> u64 {
        match self {
            GemvPlan::Rows(p) => p.split,
            GemvPlan::Columns(p) => p.split,
            GemvPlan::Vectors(p) => p.chunks,
        }
    }

    /// The scratch memory of the partials, `[split][output]` sums of `element_bytes`-byte
    /// elements; none without a split.
    pub const fn scratch(&self, problem: &GemvProblem, element_bytes: usize) -> ScratchLayout {
        let bytes = if self.split() > 1 {
            problem.outputs() * self.split() * sum_bytes(element_bytes) as u64
        } else {
            0
        };
        ScratchLayout { bytes, zeroed: 0 }
    }

    /// Where the first pass writes its partials: `scratch` with a split, else nowhere
    /// (it writes y).
    pub fn partials<T: Summed>(&self, scratch: DevicePtrMut<u8>) -> DevicePtrMut<T::Sum> {
        if self.split() > 1 {
            scratch.cast()
        } else {
            DevicePtrMut::NULL
        }
    }

    /// The second pass, with a split: the partials added in order into y.
    pub fn combine<T: CombineKernel>(
        &self,
        operands: &GemvOperands<T>,
        partials: DevicePtrMut<T::Sum>,
    ) -> Option<Launch<CombineArgs<T>>> {
        (self.split() > 1).then(|| combine::launch(operands, partials, self.split()))
    }
}

/// The plan for a product with `element_bytes`-byte elements.
pub fn plan(problem: &GemvProblem, element_bytes: usize, device: &DeviceLimits) -> GemvPlan {
    let per_vector = (16 / element_bytes) as u64;
    let vector = problem.cols.is_multiple_of(per_vector);
    let sms = device.multiprocessors as u64;
    if problem.vectors > 1 {
        GemvPlan::Vectors(VectorsPlan::new(
            problem,
            element_bytes,
            vector,
            device.multiprocessors,
        ))
    } else if !problem.transpose {
        let vectors = problem.cols.div_ceil(per_vector * ROWS_UNROLL as u64);
        let group_lanes = lanes_for(vectors);
        let groups = problem.rows.div_ceil(ROWS_PER_ITEM as u64);
        let wanted = (sms * ROWS_ITEMS_PER_SM).div_ceil(groups.max(1));
        let split = wanted.min(problem.cols / MIN_SPLIT_CHUNK).max(1);
        let threads = groups * split * group_lanes as u64;
        GemvPlan::Rows(RowsPlan {
            group_lanes,
            split,
            blocks: threads.div_ceil(BLOCK_THREADS as u64),
            vector,
        })
    } else {
        let tiles = problem.cols.div_ceil(COLUMNS_TX as u64 * per_vector);
        // One wave of blocks: a last partial wave would leave most SMs idle.
        let wanted = (sms * columns::blocks_per_sm(element_bytes) as u64).div_ceil(tiles);
        let split = wanted.min(problem.rows / 256).clamp(1, 65535);
        GemvPlan::Columns(ColumnsPlan { tiles, split, vector })
    }
}
