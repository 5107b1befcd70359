//! Several devices of one host used as one: arrays split along an axis into one
//! contiguous shard per device ([`ShardedArray`]), and the operations on them, each
//! local work on every device followed by an exchange through NCCL and, where partial
//! results meet, a merge by this library's kernels in a fixed order, so that a result
//! is the same on every run.
//!
//! One thread drives the whole group: every call queues its work on each device's
//! stream and returns; downloads wait. The devices' work overlaps, as the devices do.

mod conv;
mod exchange;
mod lane;
mod matvec;
mod min;
mod nccl;
mod scan;

pub use scan::GroupScanPlan;

use ndarray::{ArrayBase, ArrayD, Axis, Data, Dimension, Slice};

use crate::array::{DeviceArray, Element};
use crate::driver::StreamHandle;
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use exchange::Exchange;
use lane::Lane;
use nccl::{Communicators, Part};

/// The devices of a group, one NCCL communicator each (rank `i` is the `i`-th device),
/// and a second stream each for exchanges that overlap kernels.
pub struct GpuGroup {
    // Before the devices: a lane's stream and events go while its context is held.
    lanes: Vec<Lane>,
    gpus: Vec<Gpu>,
    exchange: Exchange,
}

/// How the elements of a [`ShardedArray`] lie on the devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sharding {
    /// Split along `axis`: rank `i` holds `lengths[i]` consecutive slices of it, in
    /// rank order.
    Split { axis: usize, lengths: Vec<usize> },
    /// Every rank holds the whole array.
    Replicated,
}

/// An array over the devices of a [`GpuGroup`]: one part per rank, each on its device.
pub struct ShardedArray<T: Element> {
    shape: Vec<usize>,
    sharding: Sharding,
    parts: Vec<DeviceArray<T>>,
}

impl<T: Element> ShardedArray<T> {
    fn new(shape: &[usize], sharding: Sharding, parts: Vec<DeviceArray<T>>) -> Self {
        Self {
            shape: shape.to_vec(),
            sharding,
            parts,
        }
    }

    /// The shape of the whole array.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// How the array is laid over the devices.
    pub fn sharding(&self) -> &Sharding {
        &self.sharding
    }

    /// The part on each device, in rank order.
    pub fn parts(&self) -> &[DeviceArray<T>] {
        &self.parts
    }

    /// The axis the array is split along, `None` when replicated.
    pub fn split_axis(&self) -> Option<usize> {
        match self.sharding {
            Sharding::Split { axis, .. } => Some(axis),
            Sharding::Replicated => None,
        }
    }
}

impl<T: Element> std::fmt::Debug for ShardedArray<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ShardedArray<{:?}>{:?} {:?}",
            T::DTYPE,
            self.shape,
            self.sharding
        )
    }
}

/// `len` slices cut into `ranks` lengths that differ by one at most, the longer last.
pub fn even_lengths(len: usize, ranks: usize) -> Vec<usize> {
    let mut lengths = vec![len / ranks; ranks];
    for length in lengths.iter_mut().rev().take(len % ranks) {
        *length += 1;
    }
    lengths
}

impl GpuGroup {
    /// The devices with the given CUDA ordinals, each once, in rank order.
    pub fn new(ordinals: &[u32]) -> Result<Self> {
        if ordinals.is_empty() {
            return Err(invalid("device group", "it names no device".into()));
        }
        if let Some(twice) = ordinals
            .iter()
            .enumerate()
            .find(|(i, o)| ordinals[..*i].contains(o))
        {
            return Err(invalid(
                "device group",
                format!("device {} is named twice", twice.1),
            ));
        }
        let gpus = ordinals
            .iter()
            .map(|&ordinal| Gpu::with_device(ordinal))
            .collect::<Result<Vec<_>>>()?;
        let exchange = Exchange::Nccl(Communicators::new(ordinals)?);
        Self::with_exchange(gpus, exchange)
    }

    /// `ranks` ranks on the one device `ordinal`, exchanging by device copies instead
    /// of NCCL: the group's splits, exchanges and merges at any number of ranks, for
    /// testing them where a machine has one GPU. No faster than the device alone.
    pub fn on_one_device(ordinal: u32, ranks: usize) -> Result<Self> {
        if ranks == 0 {
            return Err(invalid("device group", "it has no rank".into()));
        }
        let gpus = (0..ranks)
            .map(|_| Gpu::with_device(ordinal))
            .collect::<Result<Vec<_>>>()?;
        Self::with_exchange(gpus, Exchange::OneDevice)
    }

    fn with_exchange(gpus: Vec<Gpu>, exchange: Exchange) -> Result<Self> {
        // An event per exchange round of a call, and one to join.
        let lanes = gpus
            .iter()
            .map(|gpu| Lane::new(gpu, gpus.len()))
            .collect::<Result<_>>()?;
        Ok(Self {
            lanes,
            gpus,
            exchange,
        })
    }

    /// Every CUDA device of the machine.
    pub fn all() -> Result<Self> {
        match Gpu::device_count()? {
            0 => Err(Error::NoDevice {
                reason: "the driver reports no CUDA device".into(),
            }),
            count => Self::new(&(0..count).collect::<Vec<_>>()),
        }
    }

    /// The version of the NCCL library groups run on, as (major, minor, patch).
    pub fn nccl_version() -> Result<(u32, u32, u32)> {
        nccl::version()
    }

    /// The number of devices (ranks).
    pub fn len(&self) -> usize {
        self.gpus.len()
    }

    /// Always false: a group has a device at least.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The devices, in rank order.
    pub fn gpus(&self) -> &[Gpu] {
        &self.gpus
    }

    /// Waits for the work queued on every device.
    pub fn synchronize(&self) -> Result<()> {
        self.gpus.iter().try_for_each(Gpu::synchronize)
    }

    /// Copies `host` to the devices split along `axis` in lengths that differ by one at
    /// most ([`even_lengths`]).
    pub fn upload_split<T: Element, S: Data<Elem = T>, D: Dimension>(
        &self,
        host: &ArrayBase<S, D>,
        axis: usize,
    ) -> Result<ShardedArray<T>> {
        let len = *host.shape().get(axis).ok_or(Error::InvalidAxis {
            axis,
            rank: host.ndim(),
        })?;
        self.upload_split_lengths(host, axis, &even_lengths(len, self.len()))
    }

    /// Copies `host` to the devices split along `axis`, rank `i` taking `lengths[i]`
    /// slices (each at least one, their sum the axis's length).
    pub fn upload_split_lengths<T: Element, S: Data<Elem = T>, D: Dimension>(
        &self,
        host: &ArrayBase<S, D>,
        axis: usize,
        lengths: &[usize],
    ) -> Result<ShardedArray<T>> {
        let sharding = self.check_split(host.shape(), axis, lengths)?;
        let mut start = 0;
        let parts = self
            .gpus
            .iter()
            .zip(lengths)
            .map(|(gpu, &len)| {
                let slice = Slice::from(start..start + len);
                start += len;
                gpu.upload(&host.slice_axis(Axis(axis), slice))
            })
            .collect::<Result<_>>()?;
        Ok(ShardedArray {
            shape: host.shape().to_vec(),
            sharding,
            parts,
        })
    }

    /// Copies `host` whole to every device.
    pub fn upload_replicated<T: Element, S: Data<Elem = T>, D: Dimension>(
        &self,
        host: &ArrayBase<S, D>,
    ) -> Result<ShardedArray<T>> {
        Ok(ShardedArray {
            shape: host.shape().to_vec(),
            sharding: Sharding::Replicated,
            parts: self
                .gpus
                .iter()
                .map(|gpu| gpu.upload(host))
                .collect::<Result<_>>()?,
        })
    }

    /// Waits for the queued work and copies the whole array to the host (a replicated
    /// one from rank 0).
    pub fn download<T: Element>(&self, array: &ShardedArray<T>) -> Result<ArrayD<T>> {
        self.check_parts(array)?;
        match array.sharding {
            Sharding::Replicated => self.gpus[0].download(&array.parts[0]),
            Sharding::Split { axis, .. } => {
                let parts = self
                    .gpus
                    .iter()
                    .zip(&array.parts)
                    .map(|(gpu, part)| gpu.download(part))
                    .collect::<Result<Vec<_>>>()?;
                let views: Vec<_> = parts.iter().map(|p| p.view()).collect();
                Ok(ndarray::concatenate(Axis(axis), &views).expect("the parts tile the array"))
            }
        }
    }

    /// An uninitialized array of `shape` on every device.
    fn alloc_replicated<T: Element>(&self, shape: &[usize]) -> Result<Vec<DeviceArray<T>>> {
        self.gpus.iter().map(|gpu| gpu.alloc(shape)).collect()
    }

    /// An uninitialized array of the shape and split of `like`.
    pub fn alloc_like<T: Element, U: Element>(&self, like: &ShardedArray<U>) -> Result<ShardedArray<T>> {
        self.check_parts(like)?;
        let parts = self
            .gpus
            .iter()
            .zip(&like.parts)
            .map(|(gpu, part)| gpu.alloc(part.shape()))
            .collect::<Result<_>>()?;
        Ok(ShardedArray::new(&like.shape, like.sharding.clone(), parts))
    }

    /// Fills every byte of every shard with 0xFF (as [`Gpu::poison`]), so that
    /// elements a kernel fails to write are caught.
    pub fn poison<T: Element>(&self, array: &mut ShardedArray<T>) -> Result<()> {
        self.check_parts(array)?;
        for (gpu, part) in self.gpus.iter().zip(&mut array.parts) {
            gpu.poison(part)?;
        }
        Ok(())
    }

    /// Checks that `output` is this group's, of the shape and split of `like`.
    fn check_alike<T: Element, U: Element>(
        &self,
        like: &ShardedArray<T>,
        output: &ShardedArray<U>,
        what: &'static str,
    ) -> Result<()> {
        self.check_parts(like)?;
        self.check_parts(output)?;
        if output.shape != like.shape || output.sharding != like.sharding {
            return Err(invalid(
                what,
                format!(
                    "it is {:?} {:?}; {:?} {:?} expected",
                    output.shape, output.sharding, like.shape, like.sharding
                ),
            ));
        }
        Ok(())
    }

    /// Checks that the array is this group's and replicated.
    fn check_replicated<T: Element>(&self, array: &ShardedArray<T>, what: &'static str) -> Result<()> {
        self.check_parts(array)?;
        match array.sharding {
            Sharding::Replicated => Ok(()),
            ref other => Err(invalid(what, format!("it must be replicated; it is {other:?}"))),
        }
    }

    /// The lengths of an array of the group split along axis 0 (a matrix by rows, a
    /// batch).
    fn axis0_lengths<T: Element>(&self, array: &ShardedArray<T>, what: &'static str) -> Result<Vec<usize>> {
        self.check_parts(array)?;
        match &array.sharding {
            Sharding::Split { axis: 0, lengths } => Ok(lengths.clone()),
            other => Err(invalid(
                what,
                format!("it must be split along axis 0; it is {other:?}"),
            )),
        }
    }

    /// Checks that `array` is split along axis 0 in `lengths`, as the operand it goes
    /// with row for row.
    fn axis0_alike<T: Element>(
        &self,
        lengths: &[usize],
        array: &ShardedArray<T>,
        what: &'static str,
    ) -> Result<()> {
        if self.axis0_lengths(array, what)? != lengths {
            return Err(invalid(
                what,
                format!(
                    "it is split as {:?}; it must be split along axis 0 in {lengths:?}",
                    array.sharding
                ),
            ));
        }
        Ok(())
    }

    /// A split of `shape` along `axis` in `lengths`, checked.
    fn check_split(&self, shape: &[usize], axis: usize, lengths: &[usize]) -> Result<Sharding> {
        let len = *shape.get(axis).ok_or(Error::InvalidAxis {
            axis,
            rank: shape.len(),
        })?;
        if lengths.len() != self.len() || lengths.contains(&0) || lengths.iter().sum::<usize>() != len {
            return Err(invalid(
                "shard lengths",
                format!(
                    "{lengths:?} must be {} lengths (one per device, none zero) adding up to {len}, axis {axis} of {shape:?}",
                    self.len()
                ),
            ));
        }
        Ok(Sharding::Split {
            axis,
            lengths: lengths.to_vec(),
        })
    }

    /// Checks that the array is this group's: a part per device, each on its device.
    fn check_parts<T: Element>(&self, array: &ShardedArray<T>) -> Result<()> {
        if array.parts.len() != self.len() {
            return Err(invalid(
                "sharded array",
                format!(
                    "it has {} parts, the group {} devices",
                    array.parts.len(),
                    self.len()
                ),
            ));
        }
        Ok(())
    }

    /// Every rank's `parts[rank]` (`bytes` bytes each, the same on every rank) gathered
    /// in rank order into every rank's `into[rank]`.
    fn all_gather<T: Element>(
        &self,
        parts: &[&DeviceArray<T>],
        into: &mut [&mut DeviceArray<T>],
    ) -> Result<()> {
        let bytes = parts[0].bytes();
        assert!(parts.iter().all(|p| p.bytes() == bytes), "equal parts");
        assert!(
            into.iter().all(|i| i.bytes() == bytes * self.len()),
            "room for all"
        );
        let streams = self.streams()?;
        // SAFETY: each part's send holds `bytes` bytes and its receive `bytes * ranks`
        // on its rank's device (checked above); the arrays outlive the queued work, as
        // the callers hold them or give them back in stream order.
        unsafe {
            self.all_gather_at(
                &streams,
                bytes,
                parts.iter().map(|p| p.address()),
                into.iter_mut().map(|i| i.address()),
            )
        }
    }

    /// Every rank's `bytes` bytes at `send[rank]` gathered in rank order to
    /// `receive[rank]` on every rank, queued on `streams[rank]`.
    ///
    /// # Safety
    /// `send[rank]` holds `bytes` bytes and `receive[rank]` `bytes * ranks`, device
    /// memory of the rank's device that stays live until the exchange is done on the
    /// rank's stream.
    unsafe fn all_gather_at(
        &self,
        streams: &[StreamHandle],
        bytes: usize,
        send: impl Iterator<Item = u64>,
        receive: impl Iterator<Item = u64>,
    ) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let parts = parts_on(streams, send, receive);
        // SAFETY: the caller's contract.
        unsafe { self.exchange.all_gather(bytes, &parts) }
    }

    /// Every rank's `parts[rank]` gathered into every rank's `into[rank]` at byte
    /// `offsets[rank]`, the parts of any sizes: one broadcast per rank, grouped.
    fn gather_uneven<T: Element>(
        &self,
        parts: &[&DeviceArray<T>],
        offsets: &[usize],
        into: &mut [&mut DeviceArray<T>],
    ) -> Result<()> {
        self.exchange.group(|| {
            for (root, (part, &offset)) in parts.iter().zip(offsets).enumerate() {
                let bytes = part.bytes();
                assert!(
                    into.iter().all(|i| offset + bytes <= i.bytes()),
                    "room for the part"
                );
                if bytes == 0 {
                    continue;
                }
                let send = parts.iter().map(|p| p.address());
                let receive = into.iter().map(|i| i.address() + offset as u64);
                let parts = parts_on(&self.streams()?, send, receive);
                // SAFETY: the root's send holds `bytes` bytes, each receive `bytes`
                // bytes past its offset (checked above), each on its rank's device; the
                // arrays outlive the queued work.
                unsafe { self.exchange.broadcast(root, bytes, &parts)? };
            }
            Ok(())
        })
    }

    /// Every rank's current stream, in rank order.
    fn streams(&self) -> Result<Vec<StreamHandle>> {
        self.gpus.iter().map(Gpu::stream).collect()
    }
}

/// Each rank's send and receive addresses with its stream.
fn parts_on(
    streams: &[StreamHandle],
    send: impl Iterator<Item = u64>,
    receive: impl Iterator<Item = u64>,
) -> Vec<Part> {
    streams
        .iter()
        .zip(send.zip(receive))
        .map(|(&stream, (send, receive))| Part {
            send,
            receive,
            stream,
        })
        .collect()
}

fn invalid(parameter: &'static str, detail: String) -> Error {
    Error::InvalidParameter { parameter, detail }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_cover_the_axis_and_leave_no_rank_empty() {
        assert_eq!(even_lengths(10, 3), [3, 3, 4]);
        assert_eq!(even_lengths(2, 2), [1, 1]);
        for ranks in 1..=8 {
            for len in ranks..200 {
                let lengths = even_lengths(len, ranks);
                assert_eq!(lengths.iter().sum::<usize>(), len);
                assert!(!lengths.contains(&0), "{len} over {ranks}: {lengths:?}");
            }
        }
    }
}
