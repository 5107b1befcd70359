//! Min reduction along an axis: `min` (values and the index of the first minimum, as
//! `torch.min(x, dim)`) and `amin` (values, as `torch.amin`). NaN propagates: a lane
//! holding NaN gives NaN and the index of its first NaN.

use gpu_kernels::launch::{DevicePtr, DevicePtrMut};
use gpu_kernels::min::{self as kernel, MinOutputs, MinPlan, MinProblem, MinType};
use ndarray::{ArrayBase, ArrayD, Data, Dimension};

use crate::array::{DeviceArray, Element};
use crate::error::{Error, Result};
use crate::gpu::Gpu;

/// Element types `min` and `amin` handle.
pub trait MinElement: Element + PartialOrd + MinType {
    /// Whether the value is NaN (never, for integers).
    fn is_nan(self) -> bool;
}

impl MinElement for f32 {
    fn is_nan(self) -> bool {
        self.is_nan()
    }
}

impl MinElement for f64 {
    fn is_nan(self) -> bool {
        self.is_nan()
    }
}

impl MinElement for i32 {
    fn is_nan(self) -> bool {
        false
    }
}

impl MinElement for half::bf16 {
    fn is_nan(self) -> bool {
        self.is_nan()
    }
}

impl MinElement for half::f16 {
    fn is_nan(self) -> bool {
        self.is_nan()
    }
}

/// Validates a min over `axis` of `shape` and views it as `[outer, reduce, inner]`.
pub fn min_problem(op: &'static str, shape: &[usize], axis: usize) -> Result<MinProblem> {
    if shape.is_empty() {
        return Err(Error::ZeroRank { op });
    }
    if axis >= shape.len() {
        return Err(Error::InvalidAxis {
            axis,
            rank: shape.len(),
        });
    }
    if shape[axis] == 0 {
        return Err(Error::EmptyAxis {
            op,
            axis,
            shape: shape.to_vec(),
        });
    }
    let product = |dims: &[usize]| dims.iter().map(|&d| d as u64).product();
    Ok(MinProblem {
        outer: product(&shape[..axis]),
        reduce: shape[axis] as u64,
        inner: product(&shape[axis + 1..]),
    })
}

/// The output shape: `axis` removed, or kept with extent 1.
pub fn reduced_shape(shape: &[usize], axis: usize, keepdim: bool) -> Vec<usize> {
    let mut out = shape.to_vec();
    if keepdim {
        out[axis] = 1;
    } else {
        out.remove(axis);
    }
    out
}

impl Gpu {
    /// The minimum along `axis` and the index of its first occurrence.
    pub fn min<T: MinElement>(
        &self,
        x: &DeviceArray<T>,
        axis: usize,
        keepdim: bool,
    ) -> Result<(DeviceArray<T>, DeviceArray<i64>)> {
        min_problem("min", x.shape(), axis)?;
        let shape = reduced_shape(x.shape(), axis, keepdim);
        let (mut values, mut indices) = (self.alloc(&shape)?, self.alloc(&shape)?);
        self.min_into(x, axis, &mut values, &mut indices)?;
        Ok((values, indices))
    }

    /// The minimum along `axis`.
    pub fn amin<T: MinElement>(
        &self,
        x: &DeviceArray<T>,
        axis: usize,
        keepdim: bool,
    ) -> Result<DeviceArray<T>> {
        min_problem("amin", x.shape(), axis)?;
        let shape = reduced_shape(x.shape(), axis, keepdim);
        let mut values = self.alloc(&shape)?;
        self.amin_into(x, axis, &mut values)?;
        Ok(values)
    }

    /// [`Gpu::min`] into existing arrays, shaped as the output with or without keepdim.
    pub fn min_into<T: MinElement>(
        &self,
        x: &DeviceArray<T>,
        axis: usize,
        values: &mut DeviceArray<T>,
        indices: &mut DeviceArray<i64>,
    ) -> Result<()> {
        self.reduce_min("min", x, axis, values, Some(indices))
    }

    /// [`Gpu::amin`] into an existing array, shaped as the output with or without keepdim.
    pub fn amin_into<T: MinElement>(
        &self,
        x: &DeviceArray<T>,
        axis: usize,
        values: &mut DeviceArray<T>,
    ) -> Result<()> {
        self.reduce_min("amin", x, axis, values, None)
    }

    /// [`Gpu::min`] of a host array or view: uploads, reduces, downloads.
    pub fn min_of<T: MinElement, S: Data<Elem = T>, D: Dimension>(
        &self,
        x: &ArrayBase<S, D>,
        axis: usize,
        keepdim: bool,
    ) -> Result<(ArrayD<T>, ArrayD<i64>)> {
        min_problem("min", x.shape(), axis)?;
        let (values, indices) = self.min(&self.upload(x)?, axis, keepdim)?;
        Ok((self.download(&values)?, self.download(&indices)?))
    }

    /// [`Gpu::amin`] of a host array or view: uploads, reduces, downloads.
    pub fn amin_of<T: MinElement, S: Data<Elem = T>, D: Dimension>(
        &self,
        x: &ArrayBase<S, D>,
        axis: usize,
        keepdim: bool,
    ) -> Result<ArrayD<T>> {
        min_problem("amin", x.shape(), axis)?;
        self.download(&self.amin(&self.upload(x)?, axis, keepdim)?)
    }

    /// The plan of a min or amin of a whole array of `shape` along `axis` on this
    /// device: which kernel runs it and how (`None` for an empty output, which launches
    /// nothing). Arrays from this library start 16-byte aligned; a view that does not
    /// (a window of columns, or one starting inside a row) may take another kernel.
    pub fn min_plan<T: MinElement>(&self, shape: &[usize], axis: usize) -> Result<Option<MinPlan>> {
        let problem = min_problem("min", shape, axis)?;
        Ok((problem.outputs() > 0).then(|| kernel::plan(&problem, size_of::<T>(), &self.limits())))
    }

    fn reduce_min<T: MinElement>(
        &self,
        op: &'static str,
        x: &DeviceArray<T>,
        axis: usize,
        values: &mut DeviceArray<T>,
        indices: Option<&mut DeviceArray<i64>>,
    ) -> Result<()> {
        let problem = min_problem(op, x.shape(), axis)?;
        let expected = reduced_shape(x.shape(), axis, false);
        let check_output = |what, shape: &[usize]| {
            if shape == expected || shape == reduced_shape(x.shape(), axis, true) {
                Ok(())
            } else {
                Err(Error::ShapeMismatch {
                    what,
                    expected: expected.clone(),
                    actual: shape.to_vec(),
                })
            }
        };
        check_output("min values output", values.shape())?;
        if let Some(indices) = &indices {
            check_output("min indices output", indices.shape())?;
        }
        if problem.outputs() == 0 {
            return Ok(());
        }
        log::debug!("{op} {:?} axis {axis}", x.shape());
        let outputs = MinOutputs {
            values: values.ptr_mut(),
            indices: indices.map_or(DevicePtrMut::NULL, |i| i.ptr_mut()),
        };
        self.reduce_min_window(x.ptr(), &problem, problem.inner, outputs)
    }

    /// Reduces `problem` (non-empty), its rows `pitch` elements apart from `x` on (a
    /// window of columns of a wider array when `pitch > inner`), into `outputs`,
    /// `[outer][inner]`.
    pub(crate) fn reduce_min_window<T: MinElement>(
        &self,
        x: DevicePtr<T>,
        problem: &MinProblem,
        pitch: u64,
        outputs: MinOutputs<T>,
    ) -> Result<()> {
        let aligned = x.address().is_multiple_of(16);
        let mut plan = kernel::plan_window(problem, pitch, size_of::<T>(), aligned, &self.limits());
        if let MinPlan::Strided(strided) = &mut plan {
            // A window may start between two lanes' vectors.
            let vector_bytes = kernel::strided::lane_columns(size_of::<T>()) * size_of::<T>() as u64;
            strided.vector &= x.address().is_multiple_of(vector_bytes);
        }
        log::debug!("min of {problem:?}, rows {pitch} apart -> {plan:?}");
        // With a split, the first pass writes partials to the scratch buffer, which
        // stays reserved until both passes are queued.
        let (_scratch, scratch) = self.scratch(plan.scratch(problem, size_of::<T>()))?;
        let first = plan.first_pass_outputs(problem, outputs, scratch);
        match plan {
            MinPlan::Rows(rows) => self.launch(&rows.launch(problem, x, first))?,
            MinPlan::Strided(strided) => self.launch(&strided.launch(problem, pitch, x, first))?,
            MinPlan::Slab(slab) => self.launch(&slab.launch(problem, x, first))?,
        }
        if let Some(combine) = plan.combine(problem, first, outputs) {
            self.launch(&combine)?;
        }
        Ok(())
    }
}
