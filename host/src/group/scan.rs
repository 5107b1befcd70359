//! Cumulative sums of arrays over the group.

use gpu_kernels::launch::DevicePtrMut;
use gpu_kernels::scan::ScanProblem;
use gpu_kernels::scan::carry::{self, CarryArgs};

use super::{GpuGroup, ShardedArray};
use crate::array::DeviceArray;
use crate::driver;
use crate::error::Result;
use crate::scan::{ScanElement, ScanKind, scan_problem};

impl GpuGroup {
    /// The cumulative sum along `axis` (as [`Gpu::cumsum`](crate::Gpu::cumsum)), split
    /// as x is. Along another axis than the split one, each device scans its shard.
    /// Along the split axis, each device scans its shard, the devices exchange their
    /// shards' totals (the edge slice of the scan, plus the input's for an exclusive
    /// one), and each adds those of the shards before it (after it, reversed) in rank
    /// order. 16-bit floats are rounded once more there.
    pub fn cumsum<T: ScanElement>(
        &self,
        x: &ShardedArray<T>,
        axis: usize,
        kind: ScanKind,
        reverse: bool,
    ) -> Result<ShardedArray<T>> {
        self.check_parts(x)?;
        let mut y = self.alloc_like(x)?;
        self.cumsum_into(x, &mut y, axis, kind, reverse)?;
        Ok(y)
    }

    /// [`GpuGroup::cumsum`] into y, of x's shape and split alike.
    pub fn cumsum_into<T: ScanElement>(
        &self,
        x: &ShardedArray<T>,
        y: &mut ShardedArray<T>,
        axis: usize,
        kind: ScanKind,
        reverse: bool,
    ) -> Result<()> {
        self.check_alike(x, y, "cumsum output")?;
        scan_problem(x.shape(), axis)?;
        for ((gpu, x), y) in self.gpus.iter().zip(&x.parts).zip(&mut y.parts) {
            gpu.cumsum_into(x, y, axis, kind, reverse)?;
        }
        if x.split_axis() == Some(axis) {
            self.add_carries(x, &mut y.parts, axis, kind, reverse)?;
        }
        Ok(())
    }

    fn add_carries<T: ScanElement>(
        &self,
        x: &ShardedArray<T>,
        ys: &mut [DeviceArray<T>],
        axis: usize,
        kind: ScanKind,
        reverse: bool,
    ) -> Result<()> {
        let ranks = self.len();
        // A shard's total: the edge of its scan, and for an exclusive scan the edge of
        // its input too.
        let per_rank = if kind == ScanKind::Exclusive { 2 } else { 1 };
        let problems = ys
            .iter()
            .map(|y| scan_problem(y.shape(), axis))
            .collect::<Result<Vec<ScanProblem>>>()?;
        let ScanProblem { outer, inner, .. } = problems[0];
        let columns = (outer * inner) as usize;
        let mut totals = Vec::with_capacity(ranks);
        let mut gathered = Vec::with_capacity(ranks);
        for (((gpu, x), y), problem) in self.gpus.iter().zip(&x.parts).zip(ys.iter()).zip(&problems) {
            let total = gpu.temporary::<T>(&[per_rank * columns])?;
            let edge = if reverse { 0 } else { problem.scan - 1 } as usize;
            let (row_bytes, size) = (inner as usize * size_of::<T>(), size_of::<T>());
            let pitch = problem.scan as usize * row_bytes;
            for (slot, source) in [y, x].into_iter().take(per_rank).enumerate() {
                let src = source.address() + (edge * row_bytes) as u64;
                let dst = total.address() + (slot * columns * size) as u64;
                // SAFETY: `outer` rows of `row_bytes` bytes at the edge of `source`, one
                // per outer index, and as many packed into `total`'s slot; both arrays
                // live past the copy (the temporary is freed in stream order).
                unsafe {
                    driver::copy_rows_async(
                        (src, pitch),
                        (dst, row_bytes),
                        row_bytes,
                        outer as usize,
                        gpu.stream()?,
                    )?
                };
            }
            totals.push(total);
            gathered.push(gpu.temporary::<T>(&[ranks * per_rank * columns])?);
        }
        let sends: Vec<&DeviceArray<T>> = totals.iter().map(|t| &**t).collect();
        let mut receives: Vec<&mut DeviceArray<T>> = gathered.iter_mut().map(|g| &mut **g).collect();
        self.all_gather(&sends, &mut receives)?;
        for (rank, ((gpu, y), problem)) in self.gpus.iter().zip(ys.iter_mut()).zip(&problems).enumerate() {
            let (first, count) = if reverse {
                ((rank + 1) * per_rank, (ranks - rank - 1) * per_rank)
            } else {
                (0, rank * per_rank)
            };
            let args = CarryArgs {
                y: DevicePtrMut::from_address(y.address()),
                carries: gathered[rank].ptr().offset((first * columns) as u64),
                problem: *problem,
                terms: count as u64,
            };
            if let Some(launch) = carry::launch(args) {
                gpu.launch(&launch)?;
            }
        }
        Ok(())
    }
}
