//! Min reduction along an axis: `min` (values and the index of the first minimum, as
//! `torch.min(x, dim)`) and `amin` (values, as `torch.amin`). NaN propagates: a lane
//! holding NaN gives NaN and the index of its first NaN.

use gpu_kernels::min::{self as policy, MinDType, MinKernel, MinPlan, MinProblem};
use ndarray::{ArrayBase, ArrayD, Data, Dimension};

use crate::array::{DeviceArray, Element};
use crate::driver::{LaunchConfig, kernel_args};
use crate::error::{Error, Result};
use crate::gpu::Gpu;

/// Element types `min` and `amin` handle.
pub trait MinElement: Element + PartialOrd {
    #[doc(hidden)]
    const MIN_DTYPE: MinDType;
    /// Whether the value is NaN (never, for integers).
    fn is_nan(self) -> bool;
}

impl MinElement for f32 {
    const MIN_DTYPE: MinDType = MinDType::F32;
    fn is_nan(self) -> bool {
        self.is_nan()
    }
}

impl MinElement for f64 {
    const MIN_DTYPE: MinDType = MinDType::F64;
    fn is_nan(self) -> bool {
        self.is_nan()
    }
}

impl MinElement for i32 {
    const MIN_DTYPE: MinDType = MinDType::I32;
    fn is_nan(self) -> bool {
        false
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
        let outputs = problem.outputs();
        if outputs == 0 {
            return Ok(());
        }
        let with_index = indices.is_some();
        let plan = policy::plan(&problem, size_of::<T>(), self.info().multiprocessors);
        log::debug!("{op} {:?} axis {axis}: {problem:?} -> {plan:?}", x.shape());
        let split = plan.split();
        let address = |a: Option<&DeviceArray<i64>>| a.map_or(0, |a| a.buffer.as_device_ptr().as_raw());
        let (values_ptr, indices_ptr) = (
            values.buffer.as_device_ptr().as_raw(),
            address(indices.as_deref()),
        );

        // With a split, the first pass writes [output][split] partials (values, then
        // indices) to the scratch buffer, which stays reserved until both passes are queued.
        let slots = (outputs * split) as usize;
        let partial_values_bytes = (slots * size_of::<T>()).next_multiple_of(256);
        let scratch_bytes = if split > 1 {
            partial_values_bytes + slots * size_of::<i64>()
        } else {
            0
        };
        let (_scratch, partials) = self.scratch(scratch_bytes)?;
        let partial_indices = if with_index {
            partials + partial_values_bytes as u64
        } else {
            0
        };
        let (first_values, first_indices) = if split > 1 {
            (partials, partial_indices)
        } else {
            (values_ptr, indices_ptr)
        };
        let x_ptr = x.buffer.as_device_ptr().as_raw();
        let name = |kernel| policy::kernel_name(kernel, T::MIN_DTYPE, with_index);
        match plan {
            MinPlan::Rows {
                group_lanes,
                split,
                blocks,
            } => {
                let (reduce, items) = (problem.reduce, problem.outer * split);
                let config = LaunchConfig::linear(blocks, policy::BLOCK_THREADS);
                let mut args = kernel_args![
                    x_ptr,
                    first_values,
                    first_indices,
                    reduce,
                    items,
                    split,
                    group_lanes
                ];
                // SAFETY: matches rows(x, values, indices, reduce, items, split, group_lanes):
                // x holds outer * reduce elements (indices 0 = null when not wanted), the
                // first-pass outputs hold
                // outer * split slots, and the plan's blocks cover items * group_lanes threads.
                unsafe { self.launch(name(MinKernel::Rows), &config, &mut args)? };
            }
            MinPlan::Strided {
                vector,
                split,
                tiles_per_outer,
            } => {
                let config = LaunchConfig {
                    grid: [problem.outer * tiles_per_outer, split, 1],
                    block: [policy::BLOCK_THREADS, 1, 1],
                    shared_bytes: policy::STRIDED_SHARED_BYTES,
                };
                let vector = vector as u32;
                let mut args = kernel_args![
                    x_ptr,
                    first_values,
                    first_indices,
                    problem,
                    split,
                    tiles_per_outer,
                    vector
                ];
                // SAFETY: matches strided(x, values, indices, problem, split, tiles_per_outer,
                // vector): x holds outer * reduce * inner elements, the outputs
                // outer * inner * split slots; the plan sets vector only when inner keeps
                // rows 16-byte aligned; the block and shared memory are the policy's.
                unsafe { self.launch(name(MinKernel::Strided), &config, &mut args)? };
            }
        }
        if split > 1 {
            let config = LaunchConfig::linear(
                outputs.div_ceil(policy::BLOCK_THREADS as u64),
                policy::BLOCK_THREADS,
            );
            let mut args = kernel_args![partials, partial_indices, values_ptr, indices_ptr, outputs, split];
            // SAFETY: matches combine(partial_values, partial_indices, values, indices,
            // outputs, split): the scratch holds the first pass's outputs * split slots
            // of each, the outputs `outputs`; one thread per output.
            unsafe { self.launch(name(MinKernel::Combine), &config, &mut args)? };
        }
        Ok(())
    }
}
