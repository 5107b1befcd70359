//! One CUDA device: its context, the kernels loaded once, and the stream every
//! operation is ordered on.

use std::cell::{Cell, RefCell};
use std::ffi::c_void;

use cust::context::{Context, CurrentContext};
use cust::device::Device;
use cust::memory::DeviceCopy;
use cust::module::Module;
use cust::sys::CUdevice_attribute as Attr;
use gpu_kernels::launch::{
    DeviceLimits, DevicePtr, DevicePtrMut, KernelArgs, Launch, ScratchLayout, WARPGROUP_MMA_ARCH,
};
use gpu_kernels::tensor_map::{self, TensorMapPair, TensorMapSpec, TensorMapWords};
use ndarray::{ArrayBase, ArrayD, Data, Dimension, IxDyn};

use crate::array::{DeviceArray, Element};
use crate::driver::{
    self, Event, Kernels, LaunchLimits, MemoryPool, OwnedStream, Scratch, StreamHandle, Temporary,
    TensorMapEncoders, cust_error,
};
use crate::error::{Error, Result};
use crate::image::{self, ImageFormat};

/// The oldest driver that loads the embedded PTX (ISA 7.8 is CUDA 11.8).
const REQUIRED_DRIVER: (u32, u32) = (11, 8);

/// What the library knows of its device.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub ordinal: u32,
    pub name: String,
    pub compute_capability: (u32, u32),
    pub multiprocessors: u32,
    pub total_memory_bytes: usize,
    pub l2_cache_bytes: u32,
    pub max_threads_per_block: u32,
    /// The most dynamic shared memory one block can opt in to.
    pub max_shared_bytes_per_block: u32,
    /// The CUDA version the driver supports.
    pub driver_version: (u32, u32),
    /// The embedded image that was loaded, e.g. "sm_90 cubin".
    pub kernel_image: String,
}

/// A CUDA device ready to run the kernels.
///
/// Operations are queued on the handle's stream and run in order; downloads wait for
/// them. The stream is the handle's own, or another library's ([`Gpu::with_stream`]).
/// The context is the device's primary context, which CUDA's runtime and PyTorch use
/// too. A `Gpu` may move between threads (it makes its context current on every call)
/// but is not shared between threads at once: wrap it in a `Mutex` for that.
pub struct Gpu {
    kernels: Kernels,
    /// Whether the loaded image holds the `wgmma` entry points.
    warpgroup_mma: bool,
    /// The driver's tensor-map encoders, where it has them.
    encoders: Option<TensorMapEncoders>,
    scratch: RefCell<Scratch>,
    /// The pool of the stream-ordered temporaries, where the device has one.
    pool: Option<MemoryPool>,
    /// The stream operations are queued on: `own_stream`, or a borrowed one.
    stream: Cell<StreamHandle>,
    own_stream: OwnedStream,
    /// Orders the handle's own stream and a borrowed one.
    handoff: Event,
    /// Whether the own stream queued work since the handoff was last recorded.
    own_since_handoff: Cell<bool>,
    /// Whether the own stream has yet to wait for the handoff a borrowed stream recorded.
    own_behind: Cell<bool>,
    /// The last borrowed stream, found to be of the handle's context.
    checked_stream: Cell<StreamHandle>,
    /// The stream the handoff was last recorded on, where that record succeeded.
    handoff_on: Cell<Option<StreamHandle>>,
    info: DeviceInfo,
    context: Context,
}

impl Gpu {
    /// The first CUDA device.
    pub fn new() -> Result<Self> {
        Self::with_device(0)
    }

    /// The number of CUDA devices the driver reports.
    pub fn device_count() -> Result<u32> {
        driver::init()?;
        driver::device_count()
    }

    /// The device with the given ordinal.
    pub fn with_device(ordinal: u32) -> Result<Self> {
        Self::open(ordinal, true)
    }

    /// The device with the given ordinal, running only the kernels that every device of
    /// its major architecture has: on Hopper, the `sm_90` build instead of `sm_90a`, so
    /// plans take `mma.sync` rather than `wgmma`. For comparing and testing those paths.
    pub fn with_portable_kernels(ordinal: u32) -> Result<Self> {
        Self::open(ordinal, false)
    }

    fn open(ordinal: u32, arch_specific: bool) -> Result<Self> {
        driver::init()?;
        let (major, minor) = driver::driver_version()?;
        if (major, minor) < REQUIRED_DRIVER {
            return Err(Error::DriverTooOld {
                found_major: major,
                found_minor: minor,
                required_major: REQUIRED_DRIVER.0,
                required_minor: REQUIRED_DRIVER.1,
            });
        }
        let count = driver::device_count()?;
        if count == 0 {
            return Err(Error::NoDevice {
                reason: "the driver reports no CUDA device".into(),
            });
        }
        if ordinal >= count {
            return Err(Error::NoSuchDevice { ordinal, count });
        }
        let device = Device::get_device(ordinal).map_err(|e| cust_error("cuDeviceGet", e))?;
        let attr = |a| driver::device_attribute(&device, a);
        let capability = (
            attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let chosen = image::select(image::KERNEL_IMAGES, capability, arch_specific).ok_or_else(|| {
            Error::NoKernelImage {
                major: capability.0,
                minor: capability.1,
                available: image::describe(image::KERNEL_IMAGES),
            }
        })?;

        let context = Context::new(device).map_err(|e| cust_error("cuDevicePrimaryCtxRetain", e))?;
        let bytes = chosen.decompress()?;
        let module = match chosen.format {
            ImageFormat::Cubin => Module::from_cubin(&bytes, &[]),
            ImageFormat::Ptx => Module::from_ptx(
                std::str::from_utf8(&bytes).expect("ptx-builder writes ASCII PTX"),
                &[],
            ),
        }
        .map_err(|e| cust_error("cuModuleLoadData", e))?;
        let stream = OwnedStream::new(0)?;

        let info = DeviceInfo {
            ordinal,
            name: device.name().map_err(|e| cust_error("cuDeviceGetName", e))?,
            compute_capability: capability,
            multiprocessors: attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            total_memory_bytes: device
                .total_memory()
                .map_err(|e| cust_error("cuDeviceTotalMem", e))?,
            l2_cache_bytes: attr(Attr::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?,
            max_threads_per_block: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            max_shared_bytes_per_block: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
            driver_version: (major, minor),
            kernel_image: format!("{} {:?}", chosen.arch, chosen.format).to_lowercase(),
        };
        let limits = LaunchLimits {
            max_threads_per_block: info.max_threads_per_block,
            max_shared_bytes_per_block: info.max_shared_bytes_per_block,
        };
        let entry_points = gpu_kernels::entry_points().filter(|entry| entry.built_for(chosen.arch));
        let kernels = Kernels::load(module, entry_points, limits)?;
        log::debug!(
            "loaded {} on {} (cc {}.{})",
            info.kernel_image,
            info.name,
            capability.0,
            capability.1
        );
        let own = stream.handle();
        Ok(Self {
            kernels,
            warpgroup_mma: chosen.arch == WARPGROUP_MMA_ARCH,
            encoders: TensorMapEncoders::find(),
            scratch: RefCell::default(),
            pool: MemoryPool::create(&device, ordinal)?,
            stream: Cell::new(own),
            own_stream: stream,
            handoff: Event::new(cust::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)?,
            own_since_handoff: Cell::new(false),
            own_behind: Cell::new(false),
            checked_stream: Cell::new(own),
            handoff_on: Cell::new(None),
            info,
            context,
        })
    }

    /// The device's properties.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// What the kernels' plans need to know of the device.
    pub(crate) fn limits(&self) -> DeviceLimits {
        DeviceLimits {
            multiprocessors: self.info.multiprocessors,
            max_shared_bytes_per_block: self.info.max_shared_bytes_per_block,
            warpgroup_mma: self.warpgroup_mma,
            tensor_maps: self.encoders.is_some(),
        }
    }

    /// Encodes two tensor maps and writes them to `at` (64-byte aligned device memory
    /// that stays reserved until the launches that read them are queued), in stream
    /// order: their address.
    pub(crate) fn write_tensor_maps(
        &self,
        specs: &[TensorMapSpec; 2],
        at: DevicePtrMut<TensorMapPair>,
    ) -> Result<DevicePtr<TensorMapPair>> {
        let encoders = self.encoders.ok_or_else(|| Error::Driver {
            call: "cuGetProcAddress",
            code: 500,
            name: "CUDA_ERROR_NOT_FOUND".into(),
            message: "the driver has no tensor-map encoder (CUDA 12 or newer needed)".into(),
        })?;
        let maps = [encoders.encode(&specs[0])?, encoders.encode(&specs[1])?];
        self.launch(&tensor_map::write_launch(at, TensorMapWords::of(&maps)))?;
        Ok(at.as_const())
    }

    /// Makes this handle's context current on the calling thread.
    pub(crate) fn bind(&self) -> Result<()> {
        CurrentContext::set_current(&self.context).map_err(|e| cust_error("cuCtxSetCurrent", e))
    }

    /// The stream to queue work on now. The own stream first waits for the work that a
    /// borrowed stream queued last, as the scratch memory is reused in stream order.
    pub(crate) fn stream(&self) -> Result<StreamHandle> {
        let current = self.stream.get();
        if current == self.own_stream() {
            if self.own_behind.replace(false) {
                current.wait(&self.handoff)?;
            }
            self.own_since_handoff.set(true);
        }
        Ok(current)
    }

    /// Runs `f` with the handle's work queued on `stream`, a stream of another library
    /// (PyTorch's current stream, say) in this device's primary context, so that it is
    /// ordered with that library's work; null is the legacy default stream. The handle's
    /// scratch memory is reused in stream order across streams: the work `f` queues
    /// comes after the work queued before on the handle's own stream, and the work
    /// queued later on the own stream comes after it.
    ///
    /// # Safety
    /// `stream` is null or a stream of this device's primary context that stays live
    /// until `f` returns; a handle passed before names the stream it named then (a
    /// stream destroyed while its work here runs is not followed by another at its
    /// address).
    pub unsafe fn with_stream<R>(
        &self,
        stream: *mut c_void,
        f: impl FnOnce(&Self) -> Result<R>,
    ) -> Result<R> {
        let (own, borrowed) = (self.own_stream(), StreamHandle(stream.cast()));
        if self.stream.get() != own {
            return Err(Error::InvalidParameter {
                parameter: "stream",
                detail: "the handle already runs on a borrowed stream".into(),
            });
        }
        self.bind()?;
        // A stream seen before was checked then.
        if borrowed != self.checked_stream.get() && borrowed.context()? != self.context.as_raw() {
            return Err(Error::InvalidParameter {
                parameter: "stream",
                detail: format!(
                    "it belongs to another context than CUDA device {}'s primary context",
                    self.info.ordinal
                ),
            });
        }
        self.checked_stream.set(borrowed);
        // After the own stream's work, and the last borrowed stream's (the handoff's
        // record either way)...
        if self.own_since_handoff.replace(false) {
            self.record_handoff(own)?;
        }
        // (a wait for a record on this very stream would wait for nothing: it is
        // already behind that work; the per-thread default stream is a different
        // stream on every thread)...
        if self.handoff_on.get() != Some(borrowed) || borrowed.is_per_thread_default() {
            borrowed.wait(&self.handoff)?;
        }
        self.stream.set(borrowed);
        let result = f(self);
        self.stream.set(own);
        // ...and before what comes next on any stream: the own stream waits at its next
        // use (`stream`), the next borrowed one at its start.
        self.record_handoff(borrowed)?;
        self.own_behind.set(true);
        result
    }

    /// Records the handoff on `stream`, and remembers where once that succeeded.
    fn record_handoff(&self, stream: StreamHandle) -> Result<()> {
        self.handoff_on.set(None);
        self.handoff.record(stream)?;
        self.handoff_on.set(Some(stream));
        Ok(())
    }

    fn own_stream(&self) -> StreamHandle {
        self.own_stream.handle()
    }

    /// The shared scratch buffer, laid out as `layout` asks (its leading bytes zeroed in
    /// stream order), and its start. It stays reserved while the guard lives: hold it
    /// until the launches that use it are queued.
    pub(crate) fn scratch(
        &self,
        layout: ScratchLayout,
    ) -> Result<(std::cell::RefMut<'_, Scratch>, DevicePtrMut<u8>)> {
        self.bind()?;
        let mut scratch = self.scratch.borrow_mut();
        let too_large = || Error::TooLarge {
            shape: vec![layout.bytes as usize],
            detail: "the operation's scratch memory passes the address space".into(),
        };
        let bytes = usize::try_from(layout.bytes).map_err(|_| too_large())?;
        let zeroed = usize::try_from(layout.zeroed).map_err(|_| too_large())?;
        let start = scratch.reserve(bytes, zeroed, self.stream()?)?;
        Ok((scratch, start))
    }

    /// Queues a launch that a kernel's plan built.
    pub(crate) fn launch<A: KernelArgs>(&self, launch: &Launch<A>) -> Result<()> {
        self.bind()?;
        self.kernels.launch(self.stream()?, launch)
    }

    /// Allocates an array of the given shape; its contents are unspecified until written.
    pub fn alloc<T: Element>(&self, shape: &[usize]) -> Result<DeviceArray<T>> {
        self.bind()?;
        let len = element_count::<T::Bits>(shape)?;
        let buffer = self.trimming_pool_if_short(|| driver::alloc(len, shape))?;
        Ok(DeviceArray::new(buffer, shape.to_vec()))
    }

    /// An array for the length of one operation, allocated and given back in stream
    /// order from the handle's memory pool: no device-wide synchronization as
    /// `cuMemFree` makes, and the memory reused from call to call.
    pub(crate) fn temporary<T: Element>(&self, shape: &[usize]) -> Result<Temporary<'_, T>> {
        let Some(pool) = &self.pool else {
            return Ok(Temporary::plain(self.alloc(shape)?));
        };
        self.bind()?;
        let len = element_count::<T::Bits>(shape)?;
        let buffer = self.trimming_pool_if_short(|| pool.alloc(len, shape, self.stream()?))?;
        Ok(Temporary::pooled(
            DeviceArray::new(buffer, shape.to_vec()),
            pool,
            self.stream()?,
        ))
    }

    /// A [`Gpu::temporary`] holding a copy of `host`, written in stream order: for the
    /// small operands (offsets, weights) an operation makes on the host.
    pub(crate) fn temporary_from<T: Element>(&self, host: &[T]) -> Result<Temporary<'_, T>> {
        let mut array = self.temporary(&[host.len()])?;
        driver::copy_from_host_async(T::as_bits(host), &mut array, self.stream()?)?;
        Ok(array)
    }

    /// `alloc()`, tried again once the pool has given its unused memory back when the
    /// device is out of memory.
    fn trimming_pool_if_short<B>(&self, alloc: impl Fn() -> Result<B>) -> Result<B> {
        match (alloc(), &self.pool) {
            (Err(Error::OutOfMemory { .. }), Some(pool)) => {
                pool.trim(self.stream()?)?;
                alloc()
            }
            (result, _) => result,
        }
    }

    /// Copies an `ndarray` array or view of any layout to the device, row-major.
    pub fn upload<T: Element, S: Data<Elem = T>, D: Dimension>(
        &self,
        host: &ArrayBase<S, D>,
    ) -> Result<DeviceArray<T>> {
        let mut array = self.alloc(host.shape())?;
        if !array.is_empty() {
            let standard = host.as_standard_layout();
            let slice = standard.as_slice().expect("standard layout is contiguous");
            // In stream order: a synchronous copy runs on the legacy default stream,
            // which the handle's non-blocking stream does not wait for.
            self.bind()?;
            driver::copy_from_host_async(T::as_bits(slice), &mut array, self.stream()?)?;
        }
        Ok(array)
    }

    /// Waits for the queued work, then copies the array to the host.
    pub fn download<T: Element>(&self, array: &DeviceArray<T>) -> Result<ArrayD<T>> {
        self.synchronize()?;
        let mut bits = vec![T::Bits::default(); array.len()];
        driver::copy_to_host(array, &mut bits)?;
        Ok(ArrayD::from_shape_vec(IxDyn(array.shape()), T::from_bits(bits))
            .expect("length matches the shape"))
    }

    /// Fills every byte of the array with 0xFF (NaN for floats, -1 for integers), so
    /// that elements a kernel fails to write are caught.
    pub fn poison<T: Element>(&self, array: &mut DeviceArray<T>) -> Result<()> {
        self.bind()?;
        driver::memset_bytes(array, 0xFF, self.stream()?)
    }

    /// Sets every element of the array to zero bits, in stream order.
    pub(crate) fn fill_zero<T: Element>(&self, array: &mut DeviceArray<T>) -> Result<()> {
        self.bind()?;
        driver::memset_bytes(array, 0, self.stream()?)
    }

    /// Waits for all queued work; reports errors raised inside kernels.
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        self.stream()?.synchronize()
    }

    /// Host microseconds per call of `f`, whose work is too small to keep the device
    /// busy: an API's own cost per call. The median over `batches` batches of `calls`
    /// calls after a warm-up, each batch ending once the device is done (the machine's
    /// other load being uneven).
    pub fn host_us_per_call(
        &self,
        calls: usize,
        batches: usize,
        mut f: impl FnMut(&Self) -> Result<()>,
    ) -> Result<f64> {
        for _ in 0..calls.div_ceil(5) {
            f(self)?;
        }
        self.synchronize()?;
        let mut per_batch = Vec::with_capacity(batches);
        for _ in 0..batches.max(1) {
            let started = std::time::Instant::now();
            for _ in 0..calls {
                f(self)?;
            }
            self.synchronize()?;
            per_batch.push(started.elapsed().as_secs_f64() * 1e6 / calls.max(1) as f64);
        }
        per_batch.sort_by(f64::total_cmp);
        Ok(per_batch[per_batch.len() / 2])
    }

    /// Device time in milliseconds of the work `f` queues, measured with CUDA events.
    pub fn time_ms(&self, f: impl FnOnce(&Self) -> Result<()>) -> Result<f32> {
        self.bind()?;
        let event = || Event::new(cust::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let (start, stop) = (event()?, event()?);
        start.record(self.stream()?)?;
        f(self)?;
        stop.record(self.stream()?)?;
        stop.elapsed_ms_since(&start)
    }
}

/// The element count of `shape`, or `TooLarge` when it or its byte size overflows.
pub(crate) fn element_count<T: DeviceCopy>(shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .filter(|n| {
            n.checked_mul(size_of::<T>())
                .is_some_and(|b| b <= isize::MAX as usize)
        })
        .ok_or_else(|| Error::TooLarge {
            shape: shape.to_vec(),
            detail: "its byte size overflows".into(),
        })
}
