//! Min and amin of arrays over the group.

use gpu_kernels::launch::DevicePtrMut;
use gpu_kernels::min::{MinOutputs, combine};

use super::matvec::starts;
use super::{GpuGroup, ShardedArray, Sharding, invalid};
use crate::array::{DeviceArray, Element};
use crate::error::Result;
use crate::min::{MinElement, min_problem, reduced_shape};

impl GpuGroup {
    /// The minimum along `axis` and the index of its first occurrence (as
    /// [`Gpu::min`](crate::Gpu::min)). Along another axis than the split one, each
    /// device reduces its shard and the result stays split; along the split axis, the
    /// devices exchange their shards' (value, index) minima and each merges them in
    /// rank order (first index wins, NaN first), so the result comes back replicated,
    /// the same as one device's.
    pub fn min<T: MinElement>(
        &self,
        x: &ShardedArray<T>,
        axis: usize,
        keepdim: bool,
    ) -> Result<(ShardedArray<T>, ShardedArray<i64>)> {
        let (values, indices) = self.reduce_min("min", x, axis, keepdim, true)?;
        Ok((values, indices.expect("indices asked for")))
    }

    /// The minimum along `axis` (as [`Gpu::amin`](crate::Gpu::amin)), split or
    /// replicated as [`GpuGroup::min`] says.
    pub fn amin<T: MinElement>(
        &self,
        x: &ShardedArray<T>,
        axis: usize,
        keepdim: bool,
    ) -> Result<ShardedArray<T>> {
        Ok(self.reduce_min("amin", x, axis, keepdim, false)?.0)
    }

    /// [`GpuGroup::min`] into existing arrays, shaped as the result with or without
    /// keepdim and laid over the devices as it would be: reused from call to call, they
    /// spare the allocations (and `cuMemFree`'s device-wide waits) of every call.
    pub fn min_into<T: MinElement>(
        &self,
        x: &ShardedArray<T>,
        axis: usize,
        values: &mut ShardedArray<T>,
        indices: &mut ShardedArray<i64>,
    ) -> Result<()> {
        self.reduce_min_into("min", x, axis, values, Some(indices))
    }

    /// [`GpuGroup::amin`] into an existing array, as [`GpuGroup::min_into`].
    pub fn amin_into<T: MinElement>(
        &self,
        x: &ShardedArray<T>,
        axis: usize,
        values: &mut ShardedArray<T>,
    ) -> Result<()> {
        self.reduce_min_into("amin", x, axis, values, None)
    }

    fn reduce_min<T: MinElement>(
        &self,
        op: &'static str,
        x: &ShardedArray<T>,
        axis: usize,
        keepdim: bool,
        with_index: bool,
    ) -> Result<(ShardedArray<T>, Option<ShardedArray<i64>>)> {
        self.check_parts(x)?;
        min_problem(op, x.shape(), axis)?;
        let mut values = self.alloc_reduced(x, axis, keepdim)?;
        let mut indices = with_index
            .then(|| self.alloc_reduced(x, axis, keepdim))
            .transpose()?;
        self.reduce_min_into(op, x, axis, &mut values, indices.as_mut())?;
        Ok((values, indices))
    }

    /// How the result of a reduction of x along `axis` lies over the devices: along
    /// another axis than the split one, split as x (the split axis one lower when an
    /// axis before it goes); along the split one, replicated.
    fn reduced_sharding<T: Element>(x: &ShardedArray<T>, axis: usize, keepdim: bool) -> Sharding {
        match &x.sharding {
            Sharding::Split { axis: s, .. } if *s == axis => Sharding::Replicated,
            Sharding::Split { axis: s, lengths } if *s > axis && !keepdim => Sharding::Split {
                axis: s - 1,
                lengths: lengths.clone(),
            },
            other => other.clone(),
        }
    }

    /// An uninitialized array for the reduction of x along `axis`.
    fn alloc_reduced<T: Element, U: Element>(
        &self,
        x: &ShardedArray<U>,
        axis: usize,
        keepdim: bool,
    ) -> Result<ShardedArray<T>> {
        let sharding = Self::reduced_sharding(x, axis, keepdim);
        let parts = self
            .gpus
            .iter()
            .zip(&x.parts)
            .map(|(gpu, part)| match sharding {
                Sharding::Replicated => gpu.alloc(&reduced_shape(x.shape(), axis, keepdim)),
                Sharding::Split { .. } => gpu.alloc(&reduced_shape(part.shape(), axis, keepdim)),
            })
            .collect::<Result<_>>()?;
        Ok(ShardedArray::new(
            &reduced_shape(x.shape(), axis, keepdim),
            sharding,
            parts,
        ))
    }

    /// Checks that `output` holds the reduction of x along `axis`, with or without
    /// keepdim (its rank says which), laid over the devices as it comes out.
    fn check_reduced<T: Element, U: Element>(
        &self,
        x: &ShardedArray<T>,
        axis: usize,
        output: &ShardedArray<U>,
        what: &'static str,
    ) -> Result<()> {
        self.check_parts(output)?;
        let keepdim = output.shape.len() == x.shape.len();
        let (shape, sharding) = (
            reduced_shape(x.shape(), axis, keepdim),
            Self::reduced_sharding(x, axis, keepdim),
        );
        if output.shape != shape || output.sharding != sharding {
            return Err(invalid(
                what,
                format!(
                    "it is {:?} {:?}; {shape:?} {sharding:?} expected",
                    output.shape, output.sharding
                ),
            ));
        }
        Ok(())
    }

    fn reduce_min_into<T: MinElement>(
        &self,
        op: &'static str,
        x: &ShardedArray<T>,
        axis: usize,
        values: &mut ShardedArray<T>,
        mut indices: Option<&mut ShardedArray<i64>>,
    ) -> Result<()> {
        self.check_parts(x)?;
        min_problem(op, x.shape(), axis)?;
        self.check_reduced(x, axis, values, "min values")?;
        if let Some(indices) = &indices {
            self.check_reduced(x, axis, indices, "min indices")?;
        }
        let with_index = indices.is_some();
        let split = match &x.sharding {
            Sharding::Split { axis: s, lengths } if *s == axis => lengths,
            _ => {
                // Each device reduces its own part.
                for (rank, (gpu, part)) in self.gpus.iter().zip(&x.parts).enumerate() {
                    match indices.as_deref_mut() {
                        Some(indices) => {
                            gpu.min_into(part, axis, &mut values.parts[rank], &mut indices.parts[rank])?
                        }
                        None => gpu.amin_into(part, axis, &mut values.parts[rank])?,
                    }
                }
                return Ok(());
            }
        };
        let shape = values.shape.clone();
        let (ranks, outputs) = (self.len(), shape.iter().product::<usize>());
        let offsets: Vec<i64> = starts(split).map(|s| s as i64).collect();
        // The shard minima, then all of them gathered on every device, rank after rank.
        let mut local = Vec::with_capacity(ranks);
        let mut gathered = Vec::with_capacity(ranks);
        for (gpu, part) in self.gpus.iter().zip(&x.parts) {
            let local_shape = reduced_shape(part.shape(), axis, false);
            let mut v = gpu.temporary::<T>(&local_shape)?;
            let mut i = gpu.temporary::<i64>(&local_shape)?;
            if with_index {
                gpu.min_into(part, axis, &mut v, &mut i)?;
            } else {
                gpu.amin_into(part, axis, &mut v)?;
            }
            local.push((v, i));
            gathered.push((
                gpu.temporary::<T>(&[ranks, outputs])?,
                gpu.temporary::<i64>(&[ranks, outputs])?,
            ));
        }
        let sends: Vec<&DeviceArray<T>> = local.iter().map(|(v, _)| &**v).collect();
        let mut receives: Vec<&mut DeviceArray<T>> = gathered.iter_mut().map(|(v, _)| &mut **v).collect();
        self.all_gather(&sends, &mut receives)?;
        if with_index {
            let sends: Vec<&DeviceArray<i64>> = local.iter().map(|(_, i)| &**i).collect();
            let mut receives: Vec<&mut DeviceArray<i64>> =
                gathered.iter_mut().map(|(_, i)| &mut **i).collect();
            self.all_gather(&sends, &mut receives)?;
        }
        for (rank, (gpu, (v, i))) in self.gpus.iter().zip(&mut gathered).enumerate() {
            let offsets = gpu.temporary_from(&offsets)?;
            let index_out = indices
                .as_deref_mut()
                .map_or(DevicePtrMut::NULL, |all| all.parts[rank].ptr_mut());
            let launch = combine::launch_shards(
                outputs as u64,
                ranks as u64,
                MinOutputs {
                    values: v.ptr_mut(),
                    indices: if with_index {
                        i.ptr_mut()
                    } else {
                        DevicePtrMut::NULL
                    },
                },
                offsets.ptr(),
                MinOutputs {
                    values: values.parts[rank].ptr_mut(),
                    indices: index_out,
                },
            );
            if outputs > 0 {
                gpu.launch(&launch)?;
            }
        }
        Ok(())
    }
}
