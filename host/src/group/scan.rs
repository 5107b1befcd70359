//! Cumulative sums of arrays over the group.

use gpu_kernels::element::Sum;
use gpu_kernels::launch::{DevicePtr, DevicePtrMut};
use gpu_kernels::scan::carry::{self, CarryArgs};
use gpu_kernels::scan::columns::{
    ColumnCarries, ColumnsPlan, PIPELINE_CHUNK_MIN_COLUMNS, pipeline_chunk_width,
};
use gpu_kernels::scan::segments::RowCarries;
use gpu_kernels::scan::totals::{self, totals_parts};
use gpu_kernels::scan::{REVERSE, ScanOperands, ScanPlan, ScanProblem};

use super::nccl::Transfer;
use super::{GpuGroup, ShardedArray};
use crate::array::DeviceArray;
use crate::driver::{self, Temporary};
use crate::error::Result;
use crate::scan::{ScanElement, ScanKind, scan_options, scan_problem};

/// How a group scans along an axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupScanPlan {
    /// Across the split axis, or a replicated array: each device scans its part.
    Local,
    /// Along the split axis, of `inner > 1` and lanes for two chunks or more:
    /// the lanes cut into chunks `chunk_width` inner columns wide, which each rank
    /// scans once the rank before it (after it, reversed) has scanned them and sent
    /// their totals, so that every rank reads and writes its shard once.
    Pipelined { chunk_width: u64, chunks: u64 },
    /// Along the split axis of `inner == 1`, long rows (each shard taking the segments
    /// kernel): each rank sums its shard's rows (`parts` partials a row, read only),
    /// the ranks gather the partials, and each scans its shard once, its rows starting
    /// at the partials of the shards before it (after it, reversed).
    ReduceThenScan { parts: u64 },
    /// Along the split axis otherwise: each device scans its shard, then adds the
    /// totals of the shards before it (after it, reversed), a second pass.
    CarryPass,
}

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
        let options = scan_options(kind, reverse);
        match self.cumsum_plan(x, axis)? {
            GroupScanPlan::Pipelined { chunk_width, .. } => {
                self.pipelined_cumsum(x, y, axis, options, chunk_width)
            }
            GroupScanPlan::ReduceThenScan { parts } => self.reduced_cumsum(x, y, axis, options, parts),
            plan => {
                for ((gpu, x), y) in self.gpus.iter().zip(&x.parts).zip(&mut y.parts) {
                    gpu.cumsum_into(x, y, axis, kind, reverse)?;
                }
                if plan == GroupScanPlan::CarryPass {
                    self.add_carries(x, &mut y.parts, axis, kind, reverse)?;
                }
                Ok(())
            }
        }
    }

    /// How [`GpuGroup::cumsum`] scans x along `axis`.
    pub fn cumsum_plan<T: ScanElement>(&self, x: &ShardedArray<T>, axis: usize) -> Result<GroupScanPlan> {
        self.check_parts(x)?;
        let problem = scan_problem(x.shape(), axis)?;
        if x.split_axis() != Some(axis) {
            return Ok(GroupScanPlan::Local);
        }
        if self.len() == 1 || problem.elements() == 0 {
            return Ok(GroupScanPlan::CarryPass);
        }
        // Two chunks at least: with one, each rank would wait for the whole shard before.
        if problem.inner > 1 && problem.columns() >= 2 * PIPELINE_CHUNK_MIN_COLUMNS {
            let chunk_width = pipeline_chunk_width(&problem);
            return Ok(GroupScanPlan::Pipelined {
                chunk_width,
                chunks: problem.inner.div_ceil(chunk_width),
            });
        }
        let mut longest = ScanProblem { scan: 0, ..problem };
        for (gpu, part) in self.gpus.iter().zip(&x.parts) {
            let plan = gpu.cumsum_plan::<T>(part.shape(), axis)?;
            if !matches!(plan, Some(ScanPlan::Segments(_))) {
                return Ok(GroupScanPlan::CarryPass);
            }
            longest.scan = longest.scan.max(scan_problem(part.shape(), axis)?.scan);
        }
        let multiprocessors = self.gpus.iter().map(|gpu| gpu.limits().multiprocessors).min();
        let parts = totals_parts(&longest, size_of::<T>(), multiprocessors.unwrap_or(1));
        Ok(GroupScanPlan::ReduceThenScan { parts })
    }

    /// The scan along the split axis by shard totals first (see
    /// [`GroupScanPlan::ReduceThenScan`]): the partials are sums (f32 for 16-bit
    /// elements), so each output is rounded once, as on one device.
    fn reduced_cumsum<T: ScanElement>(
        &self,
        x: &ShardedArray<T>,
        y: &mut ShardedArray<T>,
        axis: usize,
        options: u32,
        parts: u64,
    ) -> Result<()> {
        let ranks = self.len();
        let outer = scan_problem(x.shape(), axis)?.outer;
        let count = (parts * outer) as usize;
        let mut totals = Vec::with_capacity(ranks);
        let mut gathered = Vec::with_capacity(ranks);
        for (gpu, part) in self.gpus.iter().zip(&x.parts) {
            let mut rank_totals = gpu.temporary::<Sum<T>>(&[count])?;
            let problem = scan_problem(part.shape(), axis)?;
            if let Some(launch) = totals::launch(part.ptr(), rank_totals.ptr_mut(), problem, parts) {
                gpu.launch(&launch)?;
            }
            totals.push(rank_totals);
            gathered.push(gpu.temporary::<Sum<T>>(&[ranks * count])?);
        }
        // The partials travel on the lanes: a rank whose rows need none (the first, the
        // last reversed) scans meanwhile.
        for (lane, gpu) in self.lanes.iter().zip(&self.gpus) {
            lane.follow(gpu, 0)?;
        }
        // SAFETY: each rank's totals hold `count` sums and its gathered `ranks * count`,
        // temporaries of its device, freed on its stream, which joins its lane below.
        unsafe {
            self.all_gather_at(
                &self.lane_streams(),
                count * size_of::<Sum<T>>(),
                totals.iter().map(|t| t.address()),
                gathered.iter().map(|g| g.address()),
            )?
        };
        for (rank, ((gpu, x), y)) in self.gpus.iter().zip(&x.parts).zip(&mut y.parts).enumerate() {
            // The partials of the shards before this one: `[term][row]`, `parts` terms a
            // shard, in rank order.
            let (first, shards) = if options & REVERSE != 0 {
                (rank + 1, ranks - rank - 1)
            } else {
                (0, rank)
            };
            let Some((problem, ScanPlan::Segments(plan))) = gpu.checked_scan_plan::<T>(x.shape(), axis)?
            else {
                unreachable!("the group plan checked that every shard takes the segments kernel");
            };
            let operands = ScanOperands {
                x: x.ptr(),
                y: y.ptr_mut(),
                problem,
                options,
            };
            let carries = RowCarries {
                carries: gathered[rank].ptr().offset((first * count) as u64),
                terms: shards as u64 * parts,
            };
            if shards > 0 {
                self.lanes[rank].join(gpu, 0)?;
            }
            // The scratch stays reserved until the launch is queued.
            let (_scratch, scratch) = gpu.scratch(ScanPlan::Segments(plan).scratch(size_of::<T>()))?;
            gpu.launch(&plan.launch_carried(operands, scratch, carries))?;
            if shards == 0 {
                self.lanes[rank].join(gpu, 0)?;
            }
        }
        Ok(())
    }

    /// The scan along the split axis as a pipeline over column chunks (see
    /// [`GroupScanPlan::Pipelined`]). Carries are sums (f32 for 16-bit elements), so
    /// each output is rounded once, as on one device. A rank receives a chunk's
    /// carries and sends its own on its lane, so that its stream runs chunk after chunk
    /// while the sends wait for their chunks and the receives for the rank before.
    fn pipelined_cumsum<T: ScanElement>(
        &self,
        x: &ShardedArray<T>,
        y: &mut ShardedArray<T>,
        axis: usize,
        options: u32,
        chunk_width: u64,
    ) -> Result<()> {
        let ranks = self.len();
        let order: Vec<usize> = if options & REVERSE != 0 {
            (0..ranks).rev().collect()
        } else {
            (0..ranks).collect()
        };
        let problems = x
            .parts
            .iter()
            .map(|part| scan_problem(part.shape(), axis))
            .collect::<Result<Vec<ScanProblem>>>()?;
        let ScanProblem { outer, inner, .. } = problems[0];
        let columns = (outer * inner) as usize;
        // Rank r's carries from the rank before it and to the rank after it: chunk c's
        // `outer * width` from `outer * c * chunk_width`. A middle rank's lane holds its
        // receives and sends in chunk order, so its chunk also waits for the send of the
        // chunk before (its receive by the next rank, posted early: a latency).
        let carries = |r: usize, wanted: bool| -> Result<Option<Temporary<'_, Sum<T>>>> {
            wanted
                .then(|| self.gpus[r].temporary::<Sum<T>>(&[columns]))
                .transpose()
        };
        let mut carries_in = Vec::with_capacity(ranks);
        let mut carries_out = Vec::with_capacity(ranks);
        for (place, &r) in order.iter().enumerate() {
            carries_in.push(carries(r, place > 0)?);
            carries_out.push(carries(r, place + 1 < ranks)?);
        }
        let lanes = self.lane_streams();
        let element = size_of::<Sum<T>>();
        let mut first = 0;
        while first < inner {
            let width = chunk_width.min(inner - first);
            let slot = (outer * first) as usize;
            for (place, &r) in order.iter().enumerate() {
                let gpu = &self.gpus[r];
                let carry_in = match &carries_in[place] {
                    Some(received) => {
                        let p = order[place - 1];
                        let sent = carries_out[place - 1].as_ref().expect("a rank before sends");
                        // The send waits for rank p's chunk, the chunk for the receive.
                        self.lanes[p].follow(&self.gpus[p], 0)?;
                        let transfer = Transfer {
                            from: p,
                            to: r,
                            send: sent.address() + (slot * element) as u64,
                            receive: received.address() + (slot * element) as u64,
                            bytes: (outer * width) as usize * element,
                        };
                        // SAFETY: both ranges are the chunk's slot of a temporary of
                        // `columns` sums on its rank's device, freed on the ranks'
                        // streams, which join their lanes at the end (below).
                        unsafe { self.exchange.transfer(&[transfer], &lanes)? };
                        self.lanes[r].join(gpu, 0)?;
                        received.ptr().offset(slot as u64)
                    }
                    None => DevicePtr::NULL,
                };
                let carry_out = carries_out[place]
                    .as_mut()
                    .map_or(DevicePtrMut::NULL, |sent| sent.ptr_mut().offset(slot as u64));
                let problem = ScanProblem {
                    inner: width,
                    ..problems[r]
                };
                let operands = ScanOperands {
                    x: x.parts[r].ptr().offset(first),
                    y: y.parts[r].ptr_mut().offset(first),
                    problem,
                    options,
                };
                let carries = ColumnCarries {
                    row_pitch: inner,
                    carry_in,
                    carry_out,
                };
                let plan = ColumnsPlan::new(&problem, size_of::<T>());
                gpu.launch(&plan.launch_carried(operands, carries))?;
            }
            first += width;
        }
        for (lane, gpu) in self.lanes.iter().zip(&self.gpus) {
            lane.join(gpu, 0)?;
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
