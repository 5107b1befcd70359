//! Matrix-vector products: `y = A x`, `y = A^T x` (without forming the transpose), and
//! the general `y = alpha * op(A) x + beta * y`, deterministic from run to run.
//!
//! A is a row-major `[m, k]` [`DeviceArray`]; a strided or transposed `ndarray` view
//! passed to [`Gpu::matvec_of`] is copied to row-major on upload, so it is never read
//! wrongly. x is `[n]` or `[n, 1]`, and y takes the same form; `A X` also takes up to 16
//! vectors at once, X `[k, v]` giving y `[m, v]`, for one pass over A.

use gpu_kernels::matvec::vectors::MAX_VECTORS;
use gpu_kernels::matvec::{self as kernel, GemvOperands, GemvPlan, GemvProblem, GemvType};
use ndarray::{ArrayBase, ArrayD, Data, Dimension};

use crate::array::{DeviceArray, Element};
use crate::error::{Error, Result};
use crate::gpu::Gpu;

/// Which matrix multiplies x.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// A.
    N,
    /// A^T.
    T,
}

/// Element types the matvec kernels handle: f32 and f64, summed in their own type, and
/// bf16 and f16, summed in f32 (as `torch.matmul`) with y rounded once.
pub trait GemvElement: Element + PartialEq + Into<f64> + GemvType<Sum: GemvSum> {}

impl GemvElement for f32 {}
impl GemvElement for f64 {}
impl GemvElement for half::bf16 {}
impl GemvElement for half::f16 {}

/// The type products sum in, which alpha and beta take: f32 or f64.
pub trait GemvSum: Copy + PartialEq + From<f32> + Into<f64> + std::fmt::Debug {
    const ZERO: Self;
    const ONE: Self;
}

impl GemvSum for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
}

impl GemvSum for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
}

/// Validates `op(A) x` for the shapes of A and x; returns the problem and y's shape.
/// x is a vector `[n]` or `[n, 1]`, or with `Op::N` the `vectors` columns of X `[n,
/// vectors]` (up to [`MAX_VECTORS`]); y takes the same form: `[m]`, `[m, 1]` or `[m,
/// vectors]`.
pub fn gemv_problem(a_shape: &[usize], x_shape: &[usize], op: Op) -> Result<(GemvProblem, Vec<usize>)> {
    let &[rows, cols] = a_shape else {
        return Err(Error::WrongRank {
            what: "the matrix",
            expected: "rank 2",
            shape: a_shape.to_vec(),
        });
    };
    let (inner, outer) = if op == Op::N { (cols, rows) } else { (rows, cols) };
    let vectors = match *x_shape {
        [_] => 1,
        [_, 1] => 1,
        [_, v] if op == Op::N && v as u64 <= MAX_VECTORS => v,
        _ => {
            return Err(Error::WrongRank {
                what: "the vector",
                expected: if op == Op::N {
                    "shape [n], [n, 1], or [n, v] (v vectors, at most 16)"
                } else {
                    "shape [n] or [n, 1] (A^T takes one vector)"
                },
                shape: x_shape.to_vec(),
            });
        }
    };
    let mut y_shape = x_shape.to_vec();
    y_shape[0] = outer;
    if x_shape[0] != inner {
        let mut expected = x_shape.to_vec();
        expected[0] = inner;
        return Err(Error::ShapeMismatch {
            what: "the vector (against the matrix)",
            expected,
            actual: x_shape.to_vec(),
        });
    }
    let problem = GemvProblem {
        rows: rows as u64,
        cols: cols as u64,
        vectors: vectors as u64,
        transpose: op == Op::T,
    };
    Ok((problem, y_shape))
}

impl Gpu {
    /// `A x` for A `[m, k]` and x `[k]` or `[k, 1]`; y is `[m]` or `[m, 1]`. With X `[k,
    /// v]` (v up to 16 vectors), `A X`, y `[m, v]`, reading A once.
    pub fn matvec<T: GemvElement>(&self, a: &DeviceArray<T>, x: &DeviceArray<T>) -> Result<DeviceArray<T>> {
        self.product(Op::N, a, x)
    }

    /// `A^T x` for A `[m, k]` and x `[m]` or `[m, 1]`; y is `[k]` or `[k, 1]`.
    pub fn matvec_t<T: GemvElement>(&self, a: &DeviceArray<T>, x: &DeviceArray<T>) -> Result<DeviceArray<T>> {
        self.product(Op::T, a, x)
    }

    /// [`Gpu::matvec`] of host arrays or views (any layout): uploads, multiplies,
    /// downloads.
    pub fn matvec_of<T: GemvElement, S1, S2, D1, D2>(
        &self,
        a: &ArrayBase<S1, D1>,
        x: &ArrayBase<S2, D2>,
    ) -> Result<ArrayD<T>>
    where
        S1: Data<Elem = T>,
        S2: Data<Elem = T>,
        D1: Dimension,
        D2: Dimension,
    {
        gemv_problem(a.shape(), x.shape(), Op::N)?;
        self.download(&self.matvec(&self.upload(a)?, &self.upload(x)?)?)
    }

    fn product<T: GemvElement>(
        &self,
        op: Op,
        a: &DeviceArray<T>,
        x: &DeviceArray<T>,
    ) -> Result<DeviceArray<T>> {
        let (_, shape) = gemv_problem(a.shape(), x.shape(), op)?;
        let mut y = self.alloc(&shape)?;
        self.gemv(T::Sum::ONE, op, a, x, T::Sum::ZERO, &mut y)?;
        Ok(y)
    }

    /// The plan of `op(A) x` for the shapes of A and x on this device: which kernels run
    /// it and how (`None` for an empty y, which launches nothing).
    pub fn gemv_plan<T: GemvElement>(
        &self,
        a_shape: &[usize],
        x_shape: &[usize],
        op: Op,
    ) -> Result<Option<GemvPlan>> {
        let (problem, _) = gemv_problem(a_shape, x_shape, op)?;
        Ok((problem.outputs() > 0).then(|| kernel::plan(&problem, size_of::<T>(), &self.limits())))
    }

    /// `y = alpha * op(A) x + beta * y`. With `beta == 0`, y's contents are not read.
    /// For one vector y may be `[n]` or `[n, 1]` whatever the form of x; for X `[k, v]`,
    /// y is `[m, v]`. alpha and beta are of the sum type (f32 for bf16 and f16), and y
    /// is rounded once from it.
    pub fn gemv<T: GemvElement>(
        &self,
        alpha: T::Sum,
        op: Op,
        a: &DeviceArray<T>,
        x: &DeviceArray<T>,
        beta: T::Sum,
        y: &mut DeviceArray<T>,
    ) -> Result<()> {
        let (problem, shape) = gemv_problem(a.shape(), x.shape(), op)?;
        let outputs = problem.outputs();
        let fits = if problem.vectors == 1 {
            matches!(y.shape(), &[n] | &[n, 1] if n == outputs as usize)
        } else {
            y.shape() == shape
        };
        if !fits {
            return Err(Error::ShapeMismatch {
                what: "gemv output y",
                expected: shape,
                actual: y.shape().to_vec(),
            });
        }
        let Some(plan) = self.gemv_plan::<T>(a.shape(), x.shape(), op)? else {
            return Ok(());
        };
        log::debug!("gemv {op:?} {:?} x {:?}: {plan:?}", a.shape(), x.shape());
        let operands = GemvOperands {
            a: a.ptr(),
            x: x.ptr(),
            y: y.ptr_mut(),
            alpha,
            beta,
            problem,
        };
        // With a split, the first pass writes partials to the scratch buffer, which
        // stays reserved until both passes are queued.
        let (_scratch, scratch) = self.scratch(plan.scratch(&problem, size_of::<T>()))?;
        let partials = plan.partials::<T>(scratch);
        match plan {
            GemvPlan::Rows(rows) => self.launch(&rows.launch(&operands, partials))?,
            GemvPlan::Columns(columns) => self.launch(&columns.launch(&operands, partials))?,
            GemvPlan::Vectors(vectors) => self.launch(&vectors.launch(&operands, partials))?,
        }
        if let Some(combine) = plan.combine(&operands, partials) {
            self.launch(&combine)?;
        }
        Ok(())
    }
}
