//! Products with a matrix split by rows over the group.

use gpu_kernels::element::Summed;

use super::{GpuGroup, ShardedArray, Sharding};
use crate::array::DeviceArray;
use crate::error::Result;
use crate::matvec::{GemvElement, Op, gemv_problem};

impl GpuGroup {
    /// `A x` for A `[m, k]` split by rows and x `[k]`, `[k, 1]` or `[k, v]` replicated:
    /// each device multiplies its rows, then every device gathers all of y, which comes
    /// back replicated.
    pub fn matvec<T>(&self, a: &ShardedArray<T>, x: &ShardedArray<T>) -> Result<ShardedArray<T>>
    where
        T: GemvElement + Summed<Sum = T>,
    {
        let lengths = self.axis0_lengths(a, "matvec A")?;
        self.check_replicated(x, "matvec x")?;
        let (_, y_shape) = gemv_problem(a.shape(), x.shape(), Op::N)?;
        // y's elements per row of A: 1, or v for X with v columns.
        let row_elements = y_shape.iter().product::<usize>() / a.shape()[0].max(1);
        let local = self
            .gpus
            .iter()
            .zip(a.parts.iter().zip(&x.parts))
            .map(|(gpu, (a, x))| {
                let (_, shape) = gemv_problem(a.shape(), x.shape(), Op::N)?;
                let mut y = gpu.temporary(&shape)?;
                gpu.gemv(T::Sum::ONE, Op::N, a, x, T::Sum::ZERO, &mut y)?;
                Ok(y)
            })
            .collect::<Result<Vec<_>>>()?;
        let mut y = self.alloc_replicated::<T>(&y_shape)?;
        let sends: Vec<&DeviceArray<T>> = local.iter().map(|l| &**l).collect();
        let mut receives: Vec<&mut DeviceArray<T>> = y.iter_mut().collect();
        if lengths.iter().all(|&l| l == lengths[0]) {
            self.all_gather(&sends, &mut receives)?;
        } else {
            let row_bytes = row_elements * size_of::<T>();
            let offsets: Vec<usize> = starts(&lengths).map(|s| s * row_bytes).collect();
            self.gather_uneven(&sends, &offsets, &mut receives)?;
        }
        Ok(ShardedArray::new(&y_shape, Sharding::Replicated, y))
    }

    /// `A^T x` for A `[m, k]` and x `[m]` or `[m, 1]`, both split by rows alike: each
    /// device multiplies its rows, every device gathers the partial products and adds
    /// them in rank order (the same sum on every device and every run); y comes back
    /// replicated.
    pub fn matvec_t<T>(&self, a: &ShardedArray<T>, x: &ShardedArray<T>) -> Result<ShardedArray<T>>
    where
        T: GemvElement + Summed<Sum = T>,
    {
        let lengths = self.axis0_lengths(a, "matvec_t A")?;
        self.axis0_alike(&lengths, x, "matvec_t x")?;
        let (_, y_shape) = gemv_problem(a.shape(), x.shape(), Op::T)?;
        let partials = self
            .gpus
            .iter()
            .zip(a.parts.iter().zip(&x.parts))
            .map(|(gpu, (a, x))| {
                let mut partial = gpu.temporary(&y_shape)?;
                gpu.gemv(T::Sum::ONE, Op::T, a, x, T::Sum::ZERO, &mut partial)?;
                Ok(partial)
            })
            .collect::<Result<Vec<_>>>()?;
        self.sum_in_rank_order(&partials.iter().map(|p| &**p).collect::<Vec<_>>())
    }

    /// Every rank's partial (all of one shape) gathered on every device and added in
    /// rank order: the same sum on every device and every run, replicated.
    pub(super) fn sum_in_rank_order<T>(&self, partials: &[&DeviceArray<T>]) -> Result<ShardedArray<T>>
    where
        T: GemvElement + Summed<Sum = T>,
    {
        let shape = partials[0].shape();
        let mut sums = self.alloc_replicated(shape)?;
        self.sum_in_rank_order_into(partials, &mut sums)?;
        Ok(ShardedArray::new(shape, Sharding::Replicated, sums))
    }

    /// [`GpuGroup::sum_in_rank_order`] into `sums`, one per rank, of the partials' shape.
    pub(super) fn sum_in_rank_order_into<T>(
        &self,
        partials: &[&DeviceArray<T>],
        sums: &mut [DeviceArray<T>],
    ) -> Result<()>
    where
        T: GemvElement + Summed<Sum = T>,
    {
        let (ranks, shape, n) = (self.len(), partials[0].shape().to_vec(), partials[0].len());
        let ones = vec![T::Sum::ONE; ranks];
        let mut stacks = self
            .gpus
            .iter()
            .map(|gpu| gpu.temporary::<T>(&[ranks, n]))
            .collect::<Result<Vec<_>>>()?;
        let mut receives: Vec<&mut DeviceArray<T>> = stacks.iter_mut().map(|s| &mut **s).collect();
        self.all_gather(partials, &mut receives)?;
        for ((gpu, stack), sum) in self.gpus.iter().zip(&stacks).zip(sums) {
            // The partials are the rows of `stack`: their column sums, in row order,
            // into the sum seen as a vector.
            sum.set_shape(&[n]);
            let ones = gpu.temporary_from(&ones)?;
            let summed = gpu.gemv(T::Sum::ONE, Op::T, stack, &ones, T::Sum::ZERO, sum);
            sum.set_shape(&shape);
            summed?;
        }
        Ok(())
    }
}

/// Where each of `lengths` starts.
pub(super) fn starts(lengths: &[usize]) -> impl Iterator<Item = usize> + '_ {
    lengths.iter().scan(0, |start, &len| {
        let this = *start;
        *start += len;
        Some(this)
    })
}
