//! Min and amin of arrays over the group.

use gpu_kernels::launch::DevicePtrMut;
use gpu_kernels::min::{MinOutputs, combine};

use super::matvec::starts;
use super::{GpuGroup, ShardedArray, Sharding};
use crate::array::DeviceArray;
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
        let shape = reduced_shape(x.shape(), axis, keepdim);
        let split = match &x.sharding {
            Sharding::Split { axis: s, lengths } if *s == axis => lengths,
            sharding => {
                // Each device reduces its own part; the split axis, if any, moves down
                // one when an axis before it goes.
                let sharding = match sharding {
                    Sharding::Split { axis: s, lengths } if *s > axis && !keepdim => Sharding::Split {
                        axis: s - 1,
                        lengths: lengths.clone(),
                    },
                    other => other.clone(),
                };
                let mut values = Vec::with_capacity(self.len());
                let mut indices = Vec::with_capacity(self.len());
                for (gpu, part) in self.gpus.iter().zip(&x.parts) {
                    if with_index {
                        let (v, i) = gpu.min(part, axis, keepdim)?;
                        values.push(v);
                        indices.push(i);
                    } else {
                        values.push(gpu.amin(part, axis, keepdim)?);
                    }
                }
                let indices = with_index.then(|| ShardedArray::new(&shape, sharding.clone(), indices));
                return Ok((ShardedArray::new(&shape, sharding, values), indices));
            }
        };
        let (ranks, outputs) = (self.len(), shape.iter().product::<usize>());
        let offsets: Vec<i64> = starts(split).map(|s| s as i64).collect();
        let mut values = self.alloc_replicated::<T>(&shape)?;
        let mut indices = if with_index {
            Some(self.alloc_replicated::<i64>(&shape)?)
        } else {
            None
        };
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
                .as_mut()
                .map_or(DevicePtrMut::NULL, |all| all[rank].ptr_mut());
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
                    values: values[rank].ptr_mut(),
                    indices: index_out,
                },
            );
            if outputs > 0 {
                gpu.launch(&launch)?;
            }
        }
        let indices = indices.map(|parts| ShardedArray::new(&shape, Sharding::Replicated, parts));
        Ok((ShardedArray::new(&shape, Sharding::Replicated, values), indices))
    }
}
