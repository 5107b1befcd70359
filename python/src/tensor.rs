//! The bridge to PyTorch's memory and streams: the only `unsafe` code of the package.
//! The Python side hands over what it checked; the library checks again what costs no
//! driver call per tensor (the alignment, the shapes) and the stream's context.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::Mutex;

use host::{DeviceArray, Element, Gpu, Result};
use pyo3::prelude::*;

use crate::to_python;

/// One handle per device, opened on first use and kept for the process: it holds the
/// loaded kernels and the scratch memory that later calls reuse.
static DEVICES: Mutex<BTreeMap<u32, Gpu>> = Mutex::new(BTreeMap::new());

/// Runs `f` on device `device`'s handle without holding the GIL.
pub(crate) fn with_gpu<R: Send>(
    py: Python<'_>,
    device: u32,
    f: impl FnOnce(&Gpu) -> Result<R> + Send,
) -> PyResult<R> {
    py.detach(|| {
        let mut devices = DEVICES.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let gpu = match devices.entry(device) {
            std::collections::btree_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::btree_map::Entry::Vacant(entry) => entry.insert(Gpu::with_device(device)?),
        };
        f(gpu)
    })
    .map_err(to_python)
}

/// Runs `f` on device `device`'s handle with its work queued on `stream`, PyTorch's
/// current stream of that device (as `torch.cuda.current_stream(device).cuda_stream`
/// gives it).
pub(crate) fn on_device(
    py: Python<'_>,
    device: u32,
    stream: usize,
    f: impl FnOnce(&Gpu) -> Result<()> + Send,
) -> PyResult<()> {
    with_gpu(py, device, |gpu| on_stream(gpu, stream, f))
}

/// Runs `f` on `gpu` with its work queued on `stream`, a PyTorch stream of its device.
pub(crate) fn on_stream<R>(gpu: &Gpu, stream: usize, f: impl FnOnce(&Gpu) -> Result<R>) -> Result<R> {
    // SAFETY: PyTorch keeps its current stream alive while the Python call that passed
    // it runs, which `with_gpu` waits for, and never destroys the streams of its pools,
    // so a handle names one stream for the process (a stream wrapped by
    // `torch.cuda.ExternalStream` is its owner's to keep so); the library checks that
    // the stream is of the device's primary context, PyTorch's context.
    unsafe { gpu.with_stream(stream as *mut c_void, f) }
}

/// A tensor as the Python side passes it: `(data pointer, shape)`.
pub(crate) type TensorArg = (u64, Vec<usize>);

/// A tensor as the Python side passes it: the data pointer of a contiguous CUDA tensor
/// of element type `T` and shape `shape`, which the calling Python frame holds.
pub(crate) struct Tensor<'a, T> {
    address: u64,
    shape: &'a [usize],
    element: PhantomData<T>,
}

impl<'a, T: Element> Tensor<'a, T> {
    pub(crate) fn new(address: u64, shape: &'a [usize]) -> Self {
        Self {
            address,
            shape,
            element: PhantomData,
        }
    }

    pub(crate) fn of(arg: &'a TensorArg) -> Self {
        Self::new(arg.0, &arg.1)
    }

    /// The tensor's memory as an array, without a copy, for the handle of its device.
    pub(crate) fn borrow(&self) -> Result<DeviceArray<T>> {
        // SAFETY: the Python package passes only tensors it checked to be CUDA tensors
        // of the device whose handle runs the call, contiguous, of this dtype and shape
        // (PyTorch keeps such a tensor's elements in that device's memory); the calling
        // frame holds them until the work is queued, and PyTorch's caching allocator
        // reuses their memory only in the order of the stream the work is queued on.
        // The library checks the alignment.
        unsafe { DeviceArray::from_raw_parts_unchecked(self.address, self.shape) }
    }
}

/// The tensor at `address`, if one is given, as an array.
pub(crate) fn borrow_optional<T: Element>(
    address: Option<u64>,
    shape: &[usize],
) -> Result<Option<DeviceArray<T>>> {
    address.map(|a| Tensor::<T>::new(a, shape).borrow()).transpose()
}
