//! Min and amin of arrays over the group.

use std::ops::Range;

use gpu_kernels::launch::DevicePtrMut;
use gpu_kernels::min::{MinOutputs, MinProblem, combine};

use super::matvec::starts;
use super::nccl::Transfer;
use super::{GpuGroup, ShardedArray, Sharding, even_lengths, invalid};
use crate::array::Element;
use crate::driver::Temporary;
use crate::error::Result;
use crate::gpu::Gpu;
use crate::min::{MinElement, min_problem, reduced_shape};

impl GpuGroup {
    /// The minimum along `axis` and the index of its first occurrence (as
    /// [`Gpu::min`](crate::Gpu::min)). Along another axis than the split one, each
    /// device reduces its shard and the result stays split. Along the split axis, the
    /// result comes back split along its first axis (the one after a kept axis 0) in
    /// even lengths, or replicated where that axis has fewer slices than the group has
    /// devices: each device reduces its shard for every other device's part of the
    /// result and sends it there (through NCCL, on a second stream, while it reduces
    /// the next part), then its own part, and merges the (value, index) minima of every
    /// shard (first index wins, NaN first), the same as one device's.
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
    /// axis before it goes); along the split one, split evenly along the result's first
    /// axis (the second when a kept axis 0 is the first), whose parts are runs of the
    /// flat result, or replicated where that axis is shorter than the group.
    fn reduced_sharding<T: Element>(x: &ShardedArray<T>, axis: usize, keepdim: bool) -> Sharding {
        match &x.sharding {
            Sharding::Split { axis: s, .. } if *s == axis => {
                let ranks = x.parts.len();
                let first = usize::from(keepdim && axis == 0);
                match reduced_shape(x.shape(), axis, keepdim).get(first) {
                    Some(&len) if len >= ranks => Sharding::Split {
                        axis: first,
                        lengths: even_lengths(len, ranks),
                    },
                    _ => Sharding::Replicated,
                }
            }
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
        let shape = reduced_shape(x.shape(), axis, keepdim);
        let parts = self
            .gpus
            .iter()
            .enumerate()
            .map(|(rank, gpu)| match &sharding {
                Sharding::Replicated => gpu.alloc(&shape),
                Sharding::Split { axis, lengths } => {
                    let mut part = shape.clone();
                    part[*axis] = lengths[rank];
                    gpu.alloc(&part)
                }
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
        let outputs = outer * inner;
        if outputs == 0 {
            return Ok(());
        }
        // The flat outputs each rank's part of the result holds.
        let owned: Vec<Range<u64>> = match &values.sharding {
            Sharding::Split { axis, lengths } => {
                let per_slice = values.shape[axis + 1..].iter().product::<usize>() as u64;
                starts(lengths)
                    .zip(lengths)
                    .map(|(start, len)| start as u64 * per_slice..(start + len) as u64 * per_slice)
                    .collect()
            }
            Sharding::Replicated => vec![0..outputs; ranks],
        };
        let replicated = values.sharding == Sharding::Replicated;
        // Each rank's minima of every shard over its outputs, `[shard][output]`, its own
        // shard's reduced in place, the others' received.
        let mut gathered = Vec::with_capacity(ranks);
        let mut shard_offsets = Vec::with_capacity(ranks);
        let offsets: Vec<i64> = starts(split).map(|s| s as i64).collect();
        for (gpu, outputs) in self.gpus.iter().zip(&owned) {
            let count = (outputs.end - outputs.start) as usize;
            gathered.push(Minima::<T>::new(gpu, ranks * count, with_index)?);
            shard_offsets.push(gpu.temporary_from(&offsets)?);
        }
        // Rank r's minima over the outputs `owned[s]`, into `to` (slot `r` of rank
        // `s`'s gathered minima when s is r).
        let reduce = |r: usize, s: usize, to: MinOutputs<T>| {
            let window = Window::of(owned[s].clone(), inner);
            let reduce = split[r] as u64;
            let x = x.parts[r].ptr().offset(window.x_offset(reduce, inner));
            self.gpus[r].reduce_min_window(x, &window.problem(reduce), inner, to)
        };
        let slot = |r: usize, s: usize| gathered[s].at(r * (owned[s].end - owned[s].start) as usize);
        let lanes = self.lane_streams();
        let mut sends = Vec::with_capacity(ranks);
        for round in 1..ranks {
            let mut transfers = Vec::with_capacity(2 * ranks);
            for r in 0..ranks {
                let s = (r + round) % ranks;
                let count = (owned[s].end - owned[s].start) as usize;
                // Replicated: every rank gets the one reduction of the whole shard.
                let from = if replicated {
                    if round == 1 {
                        reduce(r, r, slot(r, r))?;
                    }
                    slot(r, r)
                } else {
                    let send = Minima::<T>::new(&self.gpus[r], count, with_index)?;
                    reduce(r, s, send.at(0))?;
                    let at = send.at(0);
                    sends.push(send);
                    at
                };
                self.lanes[r].follow(&self.gpus[r], round - 1)?;
                transfers.extend(Minima::<T>::transfers(r, s, from, slot(r, s), count, with_index));
            }
            // SAFETY: every range lies inside a live temporary of its rank's device
            // (`count` minima of the sender's, a slot of the receiver's gathered ones),
            // freed on the ranks' own streams, which wait for the lanes below first.
            unsafe { self.exchange.transfer(&transfers, &lanes)? };
        }
        for r in 0..ranks {
            if !replicated {
                reduce(r, r, slot(r, r))?;
            }
            self.lanes[r].join(&self.gpus[r], ranks - 1)?;
        }
        for (r, gpu) in self.gpus.iter().enumerate() {
            let to = MinOutputs {
                values: values.parts[r].ptr_mut(),
                indices: indices
                    .as_deref_mut()
                    .map_or(DevicePtrMut::NULL, |i| i.parts[r].ptr_mut()),
            };
            let count = owned[r].end - owned[r].start;
            gpu.launch(&combine::launch_shards(
                count,
                ranks as u64,
                gathered[r].at(0),
                shard_offsets[r].ptr(),
                to,
            ))?;
        }
        // Freed on the ranks' streams, which joined the lanes' transfers above.
        drop(sends);
        Ok(())
    }
}

/// Values and (for `min`) indices of minima, in temporaries of one device.
struct Minima<'g, T: Element> {
    values: Temporary<'g, T>,
    indices: Temporary<'g, i64>,
    with_index: bool,
}

impl<'g, T: MinElement> Minima<'g, T> {
    fn new(gpu: &'g Gpu, len: usize, with_index: bool) -> Result<Self> {
        Ok(Self {
            values: gpu.temporary(&[len])?,
            indices: gpu.temporary(&[if with_index { len } else { 0 }])?,
            with_index,
        })
    }

    /// Where minima go from element `at` on.
    fn at(&self, at: usize) -> MinOutputs<T> {
        MinOutputs {
            values: DevicePtrMut::from_address(self.values.address()).offset(at as u64),
            indices: if self.with_index {
                DevicePtrMut::from_address(self.indices.address()).offset(at as u64)
            } else {
                DevicePtrMut::NULL
            },
        }
    }

    /// `count` minima from rank `from`'s `send` to rank `to`'s `receive`.
    fn transfers(
        from: usize,
        to: usize,
        send: MinOutputs<T>,
        receive: MinOutputs<T>,
        count: usize,
        with_index: bool,
    ) -> impl Iterator<Item = Transfer> {
        let transfer = |send: DevicePtrMut<u8>, receive: DevicePtrMut<u8>, size: usize| Transfer {
            from,
            to,
            send: send.address(),
            receive: receive.address(),
            bytes: count * size,
        };
        let values = transfer(send.values.cast(), receive.values.cast(), size_of::<T>());
        let indices =
            with_index.then(|| transfer(send.indices.cast(), receive.indices.cast(), size_of::<i64>()));
        std::iter::once(values).chain(indices)
    }
}

/// A run of the flat outputs `[outer, inner]` of a reduction, as a part of the array to
/// reduce: a run of outer indices, each with all its columns, or (one outer index, or
/// the run within one) a run of columns.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Window {
    outer: Range<u64>,
    columns: Range<u64>,
}

impl Window {
    /// The flat outputs `run` of rows of `inner` columns.
    fn of(run: Range<u64>, inner: u64) -> Self {
        if run.start.is_multiple_of(inner) && run.end.is_multiple_of(inner) {
            Self {
                outer: run.start / inner..run.end / inner,
                columns: 0..inner,
            }
        } else {
            let row = run.start / inner;
            debug_assert_eq!(row, (run.end - 1) / inner, "a run of columns stays in its row");
            Self {
                outer: row..row + 1,
                columns: run.start % inner..run.end - row * inner,
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_of_outputs_are_runs_of_outer_indices_or_of_columns() {
        let whole_rows = Window::of(6..15, 3);
        assert_eq!(
            whole_rows,
            Window {
                outer: 2..5,
                columns: 0..3
            }
        );
        assert_eq!(whole_rows.x_offset(7, 3), 2 * 7 * 3);
        let columns = Window::of(4..9, 20);
        assert_eq!(
            columns,
            Window {
                outer: 0..1,
                columns: 4..9
            }
        );
        assert_eq!(columns.x_offset(7, 20), 4);
        let in_a_row = Window::of(45..52, 20);
        assert_eq!(
            in_a_row,
            Window {
                outer: 2..3,
                columns: 5..12
            }
        );
        assert_eq!(in_a_row.x_offset(7, 20), 2 * 7 * 20 + 5);
        assert_eq!(
            columns.problem(7),
            MinProblem {
                outer: 1,
                reduce: 7,
                inner: 5
            }
        );
    }
}
