//! Min and amin of arrays over the group.

use gpu_kernels::launch::DevicePtrMut;
use gpu_kernels::min::{MinOutputs, combine};

use super::matvec::starts;
use super::{GpuGroup, ShardedArray, Sharding, invalid};
use std::ops::Range;

use gpu_kernels::min::MinProblem;

use super::pipeline::MAX_STEPS;
use crate::array::Element;
use crate::driver::StreamHandle;
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
        let problem = min_problem(op, x.shape(), axis)?;
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
        let (ranks, MinProblem { outer, inner, .. }) = (self.len(), problem);
        if ranks == 1 {
            // The device's own reduction: nothing to exchange.
            return match indices {
                Some(indices) => {
                    self.gpus[0].min_into(&x.parts[0], axis, &mut values.parts[0], &mut indices.parts[0])
                }
                None => self.gpus[0].amin_into(&x.parts[0], axis, &mut values.parts[0]),
            };
        }
        let outputs = (outer * inner) as usize;
        if outputs == 0 {
            return Ok(());
        }
        let offsets: Vec<i64> = starts(split).map(|s| s as i64).collect();
        // Every rank's minima of its shard, then all of them gathered on every rank,
        // window by window (`[rank][window's outputs]` from `ranks * window.first`), each
        // window merged while the next ones reduce.
        let mut local = Vec::with_capacity(ranks);
        let mut gathered = Vec::with_capacity(ranks);
        let mut shard_offsets = Vec::with_capacity(ranks);
        for gpu in &self.gpus {
            local.push((
                gpu.temporary::<T>(&[outputs])?,
                gpu.temporary::<i64>(&[if with_index { outputs } else { 0 }])?,
            ));
            gathered.push((
                gpu.temporary::<T>(&[ranks * outputs])?,
                gpu.temporary::<i64>(&[if with_index { ranks * outputs } else { 0 }])?,
            ));
            shard_offsets.push(gpu.temporary_from(&offsets)?);
        }
        let windows = windows(outer, inner);
        let reduce_window = |window: &Window| -> Result<()> {
            for (rank, (gpu, part)) in self.gpus.iter().zip(&x.parts).enumerate() {
                let reduce = split[rank] as u64;
                let (v, i) = &local[rank];
                let first = window.first(inner);
                let outputs = MinOutputs {
                    values: DevicePtrMut::from_address(v.address()).offset(first),
                    indices: if with_index {
                        DevicePtrMut::from_address(i.address()).offset(first)
                    } else {
                        DevicePtrMut::NULL
                    },
                };
                let x = part.ptr().offset(window.x_offset(reduce, inner));
                gpu.reduce_min_window(x, &window.problem(reduce), inner, outputs)?;
            }
            Ok(())
        };
        let exchange_window = |window: &Window, lanes: &[StreamHandle]| -> Result<()> {
            let (first, count) = (window.first(inner) as usize, window.outputs() as usize);
            self.exchange.group(|| {
                let at =
                    |base: u64, size: usize, rank_stride: usize| base + (first * rank_stride * size) as u64;
                // SAFETY: the window's `count` outputs lie inside every rank's local
                // arrays from `first` on, and `ranks` times as many inside its gathered
                // ones from `ranks * first` on; the temporaries are freed on the ranks'
                // streams, which the pipeline leaves behind every exchange.
                unsafe {
                    self.all_gather_at(
                        lanes,
                        count * size_of::<T>(),
                        local.iter().map(|(v, _)| at(v.address(), size_of::<T>(), 1)),
                        gathered
                            .iter()
                            .map(|(v, _)| at(v.address(), size_of::<T>(), ranks)),
                    )?;
                    if with_index {
                        self.all_gather_at(
                            lanes,
                            count * 8,
                            local.iter().map(|(_, i)| at(i.address(), 8, 1)),
                            gathered.iter().map(|(_, i)| at(i.address(), 8, ranks)),
                        )?;
                    }
                }
                Ok(())
            })
        };
        let values_out: Vec<DevicePtrMut<T>> = values.parts.iter_mut().map(|v| v.ptr_mut()).collect();
        let indices_out: Vec<DevicePtrMut<i64>> = match indices {
            Some(indices) => indices.parts.iter_mut().map(|i| i.ptr_mut()).collect(),
            None => vec![DevicePtrMut::NULL; ranks],
        };
        let merge_window = |window: &Window| -> Result<()> {
            let (first, count) = (window.first(inner), window.outputs());
            for (rank, gpu) in self.gpus.iter().enumerate() {
                let (v, i) = &gathered[rank];
                let partials = MinOutputs {
                    values: DevicePtrMut::from_address(v.address()).offset(ranks as u64 * first),
                    indices: if with_index {
                        DevicePtrMut::from_address(i.address()).offset(ranks as u64 * first)
                    } else {
                        DevicePtrMut::NULL
                    },
                };
                let to = MinOutputs {
                    values: values_out[rank].offset(first),
                    indices: if with_index {
                        indices_out[rank].offset(first)
                    } else {
                        DevicePtrMut::NULL
                    },
                };
                gpu.launch(&combine::launch_shards(
                    count,
                    ranks as u64,
                    partials,
                    shard_offsets[rank].ptr(),
                    to,
                ))?;
            }
            Ok(())
        };
        self.pipeline(
            windows.len(),
            |step| reduce_window(&windows[step]),
            |step, lanes| exchange_window(&windows[step], lanes),
            |step| merge_window(&windows[step]),
        )
    }
}

/// The most outputs a window of the pipeline holds at least, unless there are fewer in
/// all: under it, the windows' launches and exchanges cost more than their overlap saves.
const MIN_WINDOW_OUTPUTS: u64 = 1 << 18;
/// Column windows start at multiples of this many columns: whole blocks of the strided
/// kernel, whose vector loads stay aligned.
const WINDOW_COLUMNS: u64 = 128;

/// A part of the outputs `[outer, inner]` of a reduction that the pipeline reduces,
/// exchanges and merges as one step: a run of outer indices, each with all its
/// columns, or (one outer index) a run of columns; its outputs are consecutive.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Window {
    outer: Range<u64>,
    columns: Range<u64>,
}

impl Window {
    fn outputs(&self) -> u64 {
        (self.outer.end - self.outer.start) * (self.columns.end - self.columns.start)
    }

    /// The index of its first output.
    fn first(&self, inner: u64) -> u64 {
        self.outer.start * inner + self.columns.start
    }

    /// Its part of a shard of `reduce` slices, rows `inner` apart.
    fn problem(&self, reduce: u64) -> MinProblem {
        MinProblem {
            outer: self.outer.end - self.outer.start,
            reduce,
            inner: self.columns.end - self.columns.start,
        }
    }

    /// Where it starts in a shard of `reduce` slices of `inner` columns, in elements.
    fn x_offset(&self, reduce: u64, inner: u64) -> u64 {
        self.outer.start * reduce * inner + self.columns.start
    }
}

/// The windows of the outputs `[outer, inner]` (not empty): at most
/// [`pipeline::MAX_STEPS`], each of [`MIN_WINDOW_OUTPUTS`] at least where there are
/// enough, cut along `outer` when it has more than one index, else along the columns.
fn windows(outer: u64, inner: u64) -> Vec<Window> {
    let wanted = (outer * inner / MIN_WINDOW_OUTPUTS).clamp(1, MAX_STEPS as u64);
    let cuts = |len: u64, count: u64, unit: u64| -> Vec<Range<u64>> {
        let bounds: Vec<u64> = (0..=count)
            .map(|k| {
                if k == count {
                    len
                } else {
                    k * len / count / unit * unit
                }
            })
            .collect();
        bounds
            .windows(2)
            .filter(|b| b[0] < b[1])
            .map(|b| b[0]..b[1])
            .collect()
    };
    if outer > 1 {
        cuts(outer, wanted.min(outer), 1)
            .into_iter()
            .map(|outer| Window {
                outer,
                columns: 0..inner,
            })
            .collect()
    } else {
        cuts(inner, wanted, WINDOW_COLUMNS)
            .into_iter()
            .map(|columns| Window { outer: 0..1, columns })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_cover_the_outputs_in_order() {
        for (outer, inner) in [
            (1, 1),
            (1, 5),
            (3, 7),
            (1, 4096 * 4095),
            (64, 1 << 20),
            (5, 1 << 20),
            (1 << 20, 1),
        ] {
            let windows = windows(outer, inner);
            assert!((1..=MAX_STEPS).contains(&windows.len()), "{outer} x {inner}");
            let mut next = 0;
            for w in &windows {
                assert_eq!(w.first(inner), next, "{outer} x {inner}: {windows:?}");
                next += w.outputs();
                if w.columns != (0..inner) {
                    assert!(outer == 1 && w.columns.start % WINDOW_COLUMNS == 0, "{w:?}");
                }
            }
            assert_eq!(next, outer * inner, "{outer} x {inner}");
        }
        assert_eq!(windows(1, 4096 * 4095).len(), MAX_STEPS);
        assert_eq!(windows(5, 1 << 20).len(), 5);
        assert_eq!(windows(3, 7).len(), 1);
        // The shapes of the GPU test of windows.
        assert_eq!(windows(1, (1 << 19) + 37).len(), 2);
        assert_eq!(windows(1, 1 << 19).len(), 2);
        assert_eq!(windows(4, 1 << 17).len(), 2);
    }
}
