//! The launch layer: the only module that calls the CUDA driver directly or launches a
//! kernel, and so the only `unsafe` code of the host. Each function checks what it
//! can (limits, sizes) and states what it cannot.

use std::collections::HashMap;
use std::ffi::CStr;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::os::raw::c_char;

use cust::memory::{DeviceBuffer, DeviceCopy};
use cust::module::Module;
use cust::sys as cu;
use gpu_kernels::launch::{DevicePtrMut, EntryPoint, KernelArgs, Launch, LaunchGeometry};
use gpu_kernels::tensor_map::{TensorMap, TensorMapElement, TensorMapMode, TensorMapSpec, TensorMapSwizzle};

use crate::array::{DeviceArray, Element};
use crate::error::{Error, Result};

/// Turns a driver status into `Err(Error::Driver)` carrying the driver's own message.
pub(crate) fn check(call: &'static str, status: cu::CUresult) -> Result<()> {
    if status == cu::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let text = |f: unsafe extern "C" fn(cu::CUresult, *mut *const c_char) -> cu::CUresult| {
        let mut ptr: *const c_char = std::ptr::null();
        // SAFETY: the driver writes a pointer to a static NUL-terminated string, or
        // leaves it null for an unknown code.
        unsafe {
            f(status, &mut ptr);
            if ptr.is_null() {
                "unknown".to_string()
            } else {
                CStr::from_ptr(ptr).to_string_lossy().into_owned()
            }
        }
    };
    Err(Error::Driver {
        call,
        code: status as i32,
        name: text(cu::cuGetErrorName),
        message: text(cu::cuGetErrorString),
    })
}

/// `cuInit`, with the failures that mean "no usable device" told apart.
pub(crate) fn init() -> Result<()> {
    // SAFETY: cuInit takes no pointers and may be called any number of times.
    let status = unsafe { cu::cuInit(0) };
    match check("cuInit", status) {
        Err(Error::Driver { name, message, .. }) => Err(Error::NoDevice {
            reason: format!("cuInit failed: {name}: {message}"),
        }),
        other => other,
    }
}

/// The CUDA version the installed driver supports, as (major, minor).
pub(crate) fn driver_version() -> Result<(u32, u32)> {
    let mut version = 0;
    // SAFETY: writes one int.
    check("cuDriverGetVersion", unsafe {
        cu::cuDriverGetVersion(&mut version)
    })?;
    Ok((version as u32 / 1000, (version as u32 % 1000) / 10))
}

/// The number of CUDA devices.
pub(crate) fn device_count() -> Result<u32> {
    let mut count = 0;
    // SAFETY: writes one int.
    check("cuDeviceGetCount", unsafe { cu::cuDeviceGetCount(&mut count) })?;
    Ok(count as u32)
}

/// One attribute of a device.
pub(crate) fn device_attribute(
    device: &cust::device::Device,
    attribute: cu::CUdevice_attribute,
) -> Result<u32> {
    let mut value = 0;
    // SAFETY: writes one int; `device` is a valid handle from cust.
    check("cuDeviceGetAttribute", unsafe {
        cu::cuDeviceGetAttribute(&mut value, attribute, device.as_raw())
    })?;
    Ok(value as u32)
}

/// Device memory for `len` elements, contents unspecified.
pub(crate) fn alloc<T: DeviceCopy>(len: usize, shape: &[usize]) -> Result<DeviceBuffer<T>> {
    // SAFETY: the contents of the buffer are left unspecified, which is sound for the
    // plain-old-data Element types; every reader is a kernel or a copy that the caller
    // orders after a write, and a fresh buffer has no other owner.
    unsafe { DeviceBuffer::uninitialized(len) }.map_err(|e| match e {
        cust::error::CudaError::OutOfMemory => Error::OutOfMemory {
            bytes: len * size_of::<T>(),
            shape: shape.to_vec(),
        },
        other => Error::Driver {
            call: "cuMemAlloc",
            code: other as i32,
            name: format!("{other:?}"),
            message: other.to_string(),
        },
    })
}

/// A memory pool of the library's own on one device, which the stream-ordered
/// temporaries draw from. It keeps the memory given back to it (no release threshold),
/// so that temporaries reuse it rather than map pages on every call; the device's
/// default pool, which other libraries of the process may use, is left as it is.
pub(crate) struct MemoryPool(cu::CUmemoryPool);

// SAFETY: a driver handle, valid in every thread of the process until it is destroyed
// (by its own drop).
unsafe impl Send for MemoryPool {}

impl MemoryPool {
    /// A pool on device `ordinal`; `None` where the device has no memory pools.
    pub(crate) fn create(device: &cust::device::Device, ordinal: u32) -> Result<Option<Self>> {
        if device_attribute(
            device,
            cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
        )? == 0
        {
            return Ok(None);
        }
        let props = cu::CUmemPoolProps {
            allocType: cu::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            handleTypes: cu::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
            location: cu::CUmemLocation {
                type_: cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: ordinal as i32,
            },
            win32SecurityAttributes: std::ptr::null_mut(),
            reserved: [0; 64],
        };
        let mut handle = std::ptr::null_mut();
        // SAFETY: writes one handle; the properties are complete.
        check("cuMemPoolCreate", unsafe {
            cu::cuMemPoolCreate(&mut handle, &props)
        })?;
        let pool = Self(handle);
        let mut threshold = u64::MAX;
        // SAFETY: the release threshold is a u64 attribute of a valid pool.
        check("cuMemPoolSetAttribute", unsafe {
            cu::cuMemPoolSetAttribute(
                pool.0,
                cu::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold as *mut u64).cast(),
            )
        })?;
        Ok(Some(pool))
    }

    /// [`alloc`] in stream order from the pool: usable by the work queued on `stream`
    /// after it, given back with `cuMemFreeAsync` (by [`Temporary`]) on the same stream.
    pub(crate) fn alloc<T: DeviceCopy>(
        &self,
        len: usize,
        shape: &[usize],
        stream: StreamHandle,
    ) -> Result<DeviceBuffer<T>> {
        let bytes = len * size_of::<T>();
        if bytes == 0 {
            return alloc(len, shape);
        }
        let mut address = 0;
        // SAFETY: writes one address; the pool and the stream are valid handles.
        let status = unsafe { cu::cuMemAllocFromPoolAsync(&mut address, bytes, self.0, stream.0) };
        if status == cu::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            return Err(Error::OutOfMemory {
                bytes,
                shape: shape.to_vec(),
            });
        }
        check("cuMemAllocFromPoolAsync", status)?;
        // SAFETY: `len` elements of plain-old-data at a fresh address that nothing else
        // owns; its contents are unspecified, as `alloc`'s are.
        Ok(unsafe { DeviceBuffer::from_raw_parts(cust::memory::DevicePointer::from_raw(address), len) })
    }

    /// Returns the pool's unused memory to the device, once `stream`'s work is done.
    pub(crate) fn trim(&self, stream: StreamHandle) -> Result<()> {
        stream.synchronize()?;
        // SAFETY: a valid pool; memory still in use is kept.
        check("cuMemPoolTrimTo", unsafe { cu::cuMemPoolTrimTo(self.0, 0) })
    }
}

impl Drop for MemoryPool {
    fn drop(&mut self) {
        // SAFETY: a valid pool, destroyed once; memory still in use or being freed in
        // stream order is released by the driver when that is done.
        let _ = unsafe { cu::cuMemPoolDestroy(self.0) };
    }
}

/// Sets every byte of `array` to `byte`, in stream order.
pub(crate) fn memset_bytes<T: Element>(
    array: &mut DeviceArray<T>,
    byte: u8,
    stream: StreamHandle,
) -> Result<()> {
    if array.is_empty() {
        return Ok(());
    }
    // SAFETY: the range is exactly the array's own live memory.
    check("cuMemsetD8Async", unsafe {
        cu::cuMemsetD8Async(array.memory.address(), byte, array.bytes(), stream.0)
    })
}

/// The driver's device-to-device copy of `src` into `dst` (same shape), in stream order.
pub(crate) fn memcpy_device<T: Element>(
    src: &DeviceArray<T>,
    dst: &mut DeviceArray<T>,
    stream: StreamHandle,
) -> Result<()> {
    debug_assert_eq!(src.shape(), dst.shape());
    if src.is_empty() {
        return Ok(());
    }
    // SAFETY: both ranges are the whole live memory of an array, of equal size.
    check("cuMemcpyDtoDAsync", unsafe {
        cu::cuMemcpyDtoDAsync_v2(dst.memory.address(), src.memory.address(), src.bytes(), stream.0)
    })
}

/// Copies `host` into `array` in stream order on `stream`: the driver stages pageable
/// memory before it returns, so `host` may go at once.
pub(crate) fn copy_from_host_async<T: Element>(
    host: &[T::Bits],
    array: &mut DeviceArray<T>,
    stream: StreamHandle,
) -> Result<()> {
    assert_eq!(host.len(), array.len(), "copy_from_host_async: lengths differ");
    if host.is_empty() {
        return Ok(());
    }
    // SAFETY: the source is `array.bytes()` bytes of the slice, which the driver has
    // read (staged) when a copy from pageable memory returns; the destination is the
    // array's whole live memory.
    check("cuMemcpyHtoDAsync", unsafe {
        cu::cuMemcpyHtoDAsync_v2(
            array.memory.address(),
            host.as_ptr().cast(),
            array.bytes(),
            stream.0,
        )
    })
}

/// `rows` rows of `row_bytes` bytes from `src` (rows `src_pitch` bytes apart) to `dst`
/// (rows `dst_pitch` apart), device to device, in stream order on `stream`.
///
/// # Safety
/// Both ranges are live device memory of the stream's context until the copy is done.
pub(crate) unsafe fn copy_rows_async(
    (src, src_pitch): (u64, usize),
    (dst, dst_pitch): (u64, usize),
    row_bytes: usize,
    rows: usize,
    stream: StreamHandle,
) -> Result<()> {
    if row_bytes == 0 || rows == 0 {
        return Ok(());
    }
    // One row needs no pitch; the driver bounds pitches (2 GiB).
    let pitch = |p: usize| if rows == 1 { row_bytes } else { p };
    let copy = cu::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: cu::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        srcHost: std::ptr::null(),
        srcDevice: src,
        srcArray: std::ptr::null_mut(),
        srcPitch: pitch(src_pitch),
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: cu::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst,
        dstArray: std::ptr::null_mut(),
        dstPitch: pitch(dst_pitch),
        WidthInBytes: row_bytes,
        Height: rows,
    };
    // SAFETY: the descriptor names two device ranges the caller keeps live.
    check("cuMemcpy2DAsync", unsafe {
        cu::cuMemcpy2DAsync_v2(&copy, stream.0)
    })
}

/// Copies `array` into `host` (as many elements), once the work queued before is done.
pub(crate) fn copy_to_host<T: Element>(array: &DeviceArray<T>, host: &mut [T::Bits]) -> Result<()> {
    assert_eq!(host.len(), array.len(), "copy_to_host: lengths differ");
    if host.is_empty() {
        return Ok(());
    }
    // SAFETY: the destination is `array.bytes()` bytes of the slice, the source the
    // array's whole live memory; the copy is synchronous.
    check("cuMemcpyDtoH", unsafe {
        cu::cuMemcpyDtoH_v2(host.as_mut_ptr().cast(), array.memory.address(), array.bytes())
    })
}

/// The device memory behind an array: an allocation of its own, or memory it borrows
/// from an owner that outlives it (another library's tensor).
pub(crate) enum Memory<B: DeviceCopy> {
    Owned(DeviceBuffer<B>),
    Borrowed { address: cu::CUdeviceptr, len: usize },
}

impl<B: DeviceCopy> Memory<B> {
    pub(crate) fn address(&self) -> cu::CUdeviceptr {
        match self {
            Self::Owned(buffer) => buffer.as_device_ptr().as_raw(),
            Self::Borrowed { address, .. } => *address,
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Self::Owned(buffer) => buffer.len(),
            Self::Borrowed { len, .. } => *len,
        }
    }
}

/// Checks that `bytes` bytes at `address` (at least one) are device memory of device
/// `ordinal`: inside the allocation the driver reports for the first byte, or else (an
/// array over several mapped allocations) with the last byte on the device too.
pub(crate) fn check_device_range(address: cu::CUdeviceptr, bytes: usize, ordinal: u32) -> Result<()> {
    let fail = |at: u64| Error::InvalidParameter {
        parameter: "device address",
        detail: format!("{at:#x} (of {bytes} bytes at {address:#x}) is not memory of CUDA device {ordinal}"),
    };
    let end = address.checked_add(bytes as u64).ok_or_else(|| fail(u64::MAX))?;
    let first = pointer_range(address, ordinal).ok_or_else(|| fail(address))?;
    if end <= first.end || pointer_range(end - 1, ordinal).is_some() {
        Ok(())
    } else {
        Err(fail(end - 1))
    }
}

/// The allocation holding `address`, when it is device memory of device `ordinal`.
fn pointer_range(address: cu::CUdeviceptr, ordinal: u32) -> Option<std::ops::Range<u64>> {
    let (mut memory_type, mut device, mut start, mut size) = (0u32, -1i32, 0u64, 0usize);
    let mut attributes = [
        cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    ];
    let mut values: [*mut c_void; 4] = [
        (&mut memory_type as *mut u32).cast(),
        (&mut device as *mut i32).cast(),
        (&mut start as *mut u64).cast(),
        (&mut size as *mut usize).cast(),
    ];
    // SAFETY: writes one value per attribute, each of its type (a 32-bit enum, an int,
    // a device pointer, a size_t), to the locals; for an address the driver does not
    // know it writes zeros.
    let status =
        unsafe { cu::cuPointerGetAttributes(4, attributes.as_mut_ptr(), values.as_mut_ptr(), address) };
    let on_device = status == cu::CUresult::CUDA_SUCCESS
        && memory_type == cu::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32
        && device == ordinal as i32;
    on_device.then(|| start..start.saturating_add(size as u64))
}

/// A CUDA stream as the driver names it: the handle's own, or one that another library
/// owns (null is the legacy default stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StreamHandle(pub(crate) cu::CUstream);

// SAFETY: a driver handle, usable from any thread on which its context is current (Gpu
// makes it current before every call).
unsafe impl Send for StreamHandle {}

impl StreamHandle {
    /// Whether this is the per-thread default stream (`CU_STREAM_PER_THREAD`), which
    /// names another stream on every thread.
    pub(crate) fn is_per_thread_default(self) -> bool {
        self.0 as usize == 0x2
    }

    /// Waits for the work queued on the stream; reports errors raised inside kernels.
    pub(crate) fn synchronize(self) -> Result<()> {
        // SAFETY: a live stream (its owner's promise, for a borrowed one).
        check("cuStreamSynchronize", unsafe { cu::cuStreamSynchronize(self.0) })
    }

    /// The context the stream belongs to (the current one, for the legacy stream).
    pub(crate) fn context(self) -> Result<cu::CUcontext> {
        let mut context = std::ptr::null_mut();
        // SAFETY: writes one handle; the stream is live (its owner's promise).
        check("cuStreamGetCtx", unsafe {
            cu::cuStreamGetCtx(self.0, &mut context)
        })?;
        Ok(context)
    }

    /// Makes the work queued on this stream from now on wait for the work before the
    /// point `event` last recorded (none, if it never was), without blocking the host.
    pub(crate) fn wait(self, event: &Event) -> Result<()> {
        // SAFETY: a live event and stream; the wait takes the event's state now, so
        // recording it again later does not change what this stream waits for.
        check("cuStreamWaitEvent", unsafe {
            cu::cuStreamWaitEvent(self.0, event.0, 0)
        })
    }
}

/// A stream this library creates (in the current context) and destroys. Non-blocking:
/// the legacy default stream, which PyTorch and other libraries queue on, neither waits
/// for it nor makes it wait (cust's `Stream::new` drops that flag).
pub(crate) struct OwnedStream(cu::CUstream);

// SAFETY: a driver handle, usable from any thread on which its context is current.
unsafe impl Send for OwnedStream {}

impl OwnedStream {
    /// A non-blocking stream of `priority` (lower is more urgent; the driver clamps it
    /// to the device's range).
    pub(crate) fn new(priority: i32) -> Result<Self> {
        let mut stream = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check("cuStreamCreateWithPriority", unsafe {
            cu::cuStreamCreateWithPriority(
                &mut stream,
                cu::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
                priority,
            )
        })?;
        Ok(Self(stream))
    }

    pub(crate) fn handle(&self) -> StreamHandle {
        StreamHandle(self.0)
    }
}

impl Drop for OwnedStream {
    fn drop(&mut self) {
        // SAFETY: a stream made by `new`, destroyed once; its queued work still runs.
        let status = unsafe { cu::cuStreamDestroy_v2(self.0) };
        if let Err(e) = check("cuStreamDestroy", status) {
            log::warn!("{e}");
        }
    }
}

/// A CUDA event of the current context.
pub(crate) struct Event(cu::CUevent);

// SAFETY: a driver handle, usable from any thread on which its context is current.
unsafe impl Send for Event {}

impl Event {
    pub(crate) fn new(flags: cu::CUevent_flags) -> Result<Self> {
        let mut event = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check("cuEventCreate", unsafe {
            cu::cuEventCreate(&mut event, flags as u32)
        })?;
        Ok(Self(event))
    }

    /// Marks the point of `stream` after the work queued so far.
    pub(crate) fn record(&self, stream: StreamHandle) -> Result<()> {
        // SAFETY: a live event and stream.
        check("cuEventRecord", unsafe { cu::cuEventRecord(self.0, stream.0) })
    }

    /// Milliseconds from `start` to this event, once this one has happened.
    pub(crate) fn elapsed_ms_since(&self, start: &Event) -> Result<f32> {
        // SAFETY: a live event.
        check("cuEventSynchronize", unsafe { cu::cuEventSynchronize(self.0) })?;
        let mut ms = 0.0;
        // SAFETY: two live events of the context, both recorded; writes one float.
        check("cuEventElapsedTime", unsafe {
            cu::cuEventElapsedTime(&mut ms, start.0, self.0)
        })?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: a live event, destroyed once; the driver finishes pending work on it.
        let _ = unsafe { cu::cuEventDestroy_v2(self.0) };
    }
}

/// The driver's tensor-map encoders (CUDA 12 and up), looked up at run time so that
/// older drivers still load the library: without them plans do not use bulk tensor
/// copies.
#[derive(Clone, Copy)]
pub(crate) struct TensorMapEncoders {
    tiled: EncodeTiled,
    im2col: EncodeIm2col,
}

type EncodeTiled = unsafe extern "C" fn(
    map: *mut TensorMap,
    data_type: u32,
    rank: u32,
    address: *mut c_void,
    dims: *const u64,
    strides: *const u64,
    box_dims: *const u32,
    element_strides: *const u32,
    interleave: u32,
    swizzle: u32,
    l2_promotion: u32,
    oob_fill: u32,
) -> cu::CUresult;

type EncodeIm2col = unsafe extern "C" fn(
    map: *mut TensorMap,
    data_type: u32,
    rank: u32,
    address: *mut c_void,
    dims: *const u64,
    strides: *const u64,
    lower: *const i32,
    upper: *const i32,
    channels: u32,
    pixels: u32,
    element_strides: *const u32,
    interleave: u32,
    swizzle: u32,
    l2_promotion: u32,
    oob_fill: u32,
) -> cu::CUresult;

// The driver API's enumerators (cuda.h, CUDA 12).
const DATA_TYPE_FLOAT16: u32 = 6;
const DATA_TYPE_FLOAT32: u32 = 7;
const DATA_TYPE_BFLOAT16: u32 = 9;
const DATA_TYPE_TFLOAT32: u32 = 11;
const INTERLEAVE_NONE: u32 = 0;
const SWIZZLE_NONE: u32 = 0;
const SWIZZLE_128B: u32 = 3;
const L2_PROMOTION_128B: u32 = 2;
const OOB_FILL_ZERO: u32 = 0;

impl TensorMapEncoders {
    /// The encoders, or `None` when the driver has none.
    pub(crate) fn find() -> Option<Self> {
        let find = |name: &CStr| {
            let mut function = std::ptr::null_mut();
            // SAFETY: looks up a driver entry point by its NUL-terminated name; writes one
            // pointer.
            let status = unsafe { cu::cuGetProcAddress(name.as_ptr(), &mut function, 12000, 0) };
            (status == cu::CUresult::CUDA_SUCCESS && !function.is_null()).then_some(function)
        };
        let tiled = find(c"cuTensorMapEncodeTiled")?;
        let im2col = find(c"cuTensorMapEncodeIm2col")?;
        // SAFETY: the driver's functions of these names have these signatures (cuda.h).
        unsafe {
            Some(Self {
                tiled: std::mem::transmute::<*mut c_void, EncodeTiled>(tiled),
                im2col: std::mem::transmute::<*mut c_void, EncodeIm2col>(im2col),
            })
        }
    }

    /// Encodes `spec` (f32, copied as it is or rounded to TF32, or bf16 or f16); the driver checks its limits and says
    /// what is wrong.
    pub(crate) fn encode(&self, spec: &TensorMapSpec) -> Result<TensorMap> {
        let mut map = TensorMap([0; 16]);
        let rank = spec.rank as usize;
        let (dims, strides, steps) = (
            &spec.dims[..rank],
            &spec.strides[..rank - 1],
            &spec.element_strides[..rank],
        );
        let address = spec.address as *mut c_void;
        let data_type = match spec.element {
            TensorMapElement::F32 => DATA_TYPE_FLOAT32,
            TensorMapElement::Tf32 => DATA_TYPE_TFLOAT32,
            TensorMapElement::Bf16 => DATA_TYPE_BFLOAT16,
            TensorMapElement::F16 => DATA_TYPE_FLOAT16,
        };
        let swizzle = match spec.swizzle {
            TensorMapSwizzle::None => SWIZZLE_NONE,
            TensorMapSwizzle::Bytes128 => SWIZZLE_128B,
        };
        // SAFETY: the arrays hold `rank` (strides `rank - 1`) entries and outlive the
        // call, which writes the 128 bytes of `map` (64-byte aligned by its type) and
        // reads no device memory.
        let status = unsafe {
            match spec.mode {
                TensorMapMode::Tiled { box_dims } => (self.tiled)(
                    &mut map,
                    data_type,
                    spec.rank,
                    address,
                    dims.as_ptr(),
                    strides.as_ptr(),
                    box_dims.as_ptr(),
                    steps.as_ptr(),
                    INTERLEAVE_NONE,
                    swizzle,
                    L2_PROMOTION_128B,
                    OOB_FILL_ZERO,
                ),
                TensorMapMode::Im2col {
                    lower,
                    upper,
                    channels,
                    pixels,
                } => (self.im2col)(
                    &mut map,
                    data_type,
                    spec.rank,
                    address,
                    dims.as_ptr(),
                    strides.as_ptr(),
                    lower.as_ptr(),
                    upper.as_ptr(),
                    channels,
                    pixels,
                    steps.as_ptr(),
                    INTERLEAVE_NONE,
                    swizzle,
                    L2_PROMOTION_128B,
                    OOB_FILL_ZERO,
                ),
            }
        };
        let call = match spec.mode {
            TensorMapMode::Tiled { .. } => "cuTensorMapEncodeTiled",
            TensorMapMode::Im2col { .. } => "cuTensorMapEncodeIm2col",
        };
        check(call, status).map(|()| map)
    }
}

/// A cust error as [`Error::Driver`].
pub(crate) fn cust_error(call: &'static str, e: cust::error::CudaError) -> Error {
    Error::Driver {
        call,
        code: e as i32,
        name: format!("{e:?}"),
        message: e.to_string(),
    }
}

/// What a launch must stay within on its device.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LaunchLimits {
    pub max_threads_per_block: u32,
    pub max_shared_bytes_per_block: u32,
}

/// Checks a launch's geometry against the device's limits.
fn validate(kernel: &'static str, geometry: &LaunchGeometry, limits: &LaunchLimits) -> Result<()> {
    let fail = |detail: String| Err(Error::LaunchLimits { kernel, detail });
    let [gx, gy, gz] = geometry.grid;
    if gx == 0 || gy == 0 || gz == 0 {
        return fail(format!("empty grid {:?}", geometry.grid));
    }
    if gx > i32::MAX as u64 || gy > 65535 || gz > 65535 {
        return fail(format!(
            "grid {:?} is over the limit [2^31-1, 65535, 65535]",
            geometry.grid
        ));
    }
    if geometry.threads == 0 || geometry.threads > limits.max_threads_per_block {
        return fail(format!(
            "{} threads per block, outside 1..={}",
            geometry.threads, limits.max_threads_per_block
        ));
    }
    if geometry.shared_bytes > limits.max_shared_bytes_per_block {
        return fail(format!(
            "{} bytes of shared memory requested, the device allows {} per block",
            geometry.shared_bytes, limits.max_shared_bytes_per_block
        ));
    }
    Ok(())
}

/// Default dynamic shared memory a kernel may use without opting in.
const SHARED_BYTES_WITHOUT_OPT_IN: u32 = 48 * 1024;

/// A kernel's handle in the loaded module.
#[derive(Clone, Copy, Debug)]
struct KernelHandle(cu::CUfunction);

// SAFETY: a CUfunction is an opaque handle that the driver accepts from any thread on
// which its context is current (Gpu makes it current before every call).
unsafe impl Send for KernelHandle {}

/// The loaded kernel module: a handle per entry point, and the device's limits.
pub(crate) struct Kernels {
    handles: HashMap<&'static str, KernelHandle>,
    limits: LaunchLimits,
    _module: Module,
}

impl Kernels {
    /// Looks up every entry point of `module`; one missing is an error.
    pub(crate) fn load(
        module: Module,
        entry_points: impl Iterator<Item = EntryPoint>,
        limits: LaunchLimits,
    ) -> Result<Self> {
        let handles = entry_points
            .map(|entry| {
                let function = module.get_function(entry.name).map_err(|e| Error::Driver {
                    call: "cuModuleGetFunction",
                    code: e as i32,
                    name: format!("{e:?}"),
                    message: format!(
                        "kernel entry point `{}` not found in the loaded image",
                        entry.name
                    ),
                })?;
                Ok((entry.name, KernelHandle(function.to_raw())))
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            handles,
            limits,
            _module: module,
        })
    }

    /// Launches `launch` on `stream` after checking its geometry against the device's
    /// limits, raising the kernel's dynamic shared-memory limit first when it asks for
    /// more than 48 KiB. Launch errors are returned; errors inside the kernel surface
    /// at the next synchronization.
    ///
    /// # Safety
    /// The one launch of the host, safe to call because of what the types and the
    /// callers hold; this function cannot check these, and does not:
    /// - the parameters match the entry point's in type, order and count: `launch`'s
    ///   argument struct is the one its entry point was emitted with (one declaration
    ///   in `gpu-kernels` makes both), and its fields are passed in order;
    /// - the geometry is the one the kernel body assumes: a `Launch` is built only by
    ///   its kernel's plan in `gpu-kernels`, from the constants the body uses;
    /// - every device pointer among the arguments is live and holds what the kernel
    ///   reads and writes: pointers come only from `DeviceArray`s borrowed by the
    ///   calling operation (freed only by `cuMemFree`, which waits for the device) and
    ///   from the scratch buffer laid out for the launch, and every operation checks
    ///   its arrays' shapes against the problem in the arguments before it builds the
    ///   launch.
    pub(crate) fn launch<A: KernelArgs>(&self, stream: StreamHandle, launch: &Launch<A>) -> Result<()> {
        let name = launch.kernel().name();
        let geometry = launch.geometry();
        validate(name, &geometry, &self.limits)?;
        let handle = self.handles.get(name).ok_or_else(|| Error::Driver {
            call: "cuModuleGetFunction",
            code: 500,
            name: "CUDA_ERROR_NOT_FOUND".into(),
            message: format!("kernel entry point `{name}` was not loaded"),
        })?;
        if geometry.shared_bytes > SHARED_BYTES_WITHOUT_OPT_IN {
            // SAFETY: sets a documented attribute on a valid function handle.
            check("cuFuncSetAttribute", unsafe {
                cu::cuFuncSetAttribute(
                    handle.0,
                    cu::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    geometry.shared_bytes as i32,
                )
            })?;
        }
        let [gx, gy, gz] = geometry.grid;
        launch.arguments().with_parameters(|parameters| {
            // SAFETY: the limits were checked above; the parameters are the argument
            // struct's fields, borrowed until the launch is queued (the driver copies
            // them); see this function's `# Safety` for the rest.
            check("cuLaunchKernel", unsafe {
                cu::cuLaunchKernel(
                    handle.0,
                    gx as u32,
                    gy as u32,
                    gz as u32,
                    geometry.threads,
                    1,
                    1,
                    geometry.shared_bytes,
                    stream.0,
                    parameters.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H100: LaunchLimits = LaunchLimits {
        max_threads_per_block: 1024,
        max_shared_bytes_per_block: 227 * 1024,
    };

    fn detail(geometry: LaunchGeometry) -> String {
        match validate("k", &geometry, &H100) {
            Err(Error::LaunchLimits { kernel: "k", detail }) => detail,
            other => panic!("expected LaunchLimits, got {other:?}"),
        }
    }

    #[test]
    fn launch_limits_are_checked_before_launching() {
        assert!(validate("k", &LaunchGeometry::linear(i32::MAX as u64, 1024), &H100).is_ok());
        assert!(detail(LaunchGeometry::linear(1 << 31, 256)).contains("over the limit"));
        assert!(detail(LaunchGeometry::linear(0, 256)).contains("empty grid"));
        assert!(detail(LaunchGeometry::linear(1, 1025)).contains("outside 1..=1024"));
        assert!(detail(LaunchGeometry::linear(1, 0)).contains("outside"));
        let tall = LaunchGeometry {
            grid: [1, 65536, 1],
            threads: 32,
            shared_bytes: 0,
        };
        assert!(detail(tall).contains("over the limit"));
        assert!(
            detail(LaunchGeometry::linear(1, 32).with_shared(228 * 1024)).contains("allows 232448 per block")
        );
        let opt_in = LaunchGeometry::linear(1, 32).with_shared(100 * 1024);
        assert!(validate("k", &opt_in, &H100).is_ok());
    }
}

/// One device buffer reused by every operation that needs temporary storage (look-back
/// status, partials). Operations run in stream order, so one operation's use of it
/// ends before the next one's begins; growing it waits for the stream first.
#[derive(Default)]
pub(crate) struct Scratch {
    buffer: Option<DeviceBuffer<u8>>,
}

impl Scratch {
    /// Makes the buffer at least `bytes` long, zeroes its first `zeroed` bytes in
    /// stream order, and returns its start.
    pub fn reserve(&mut self, bytes: usize, zeroed: usize, stream: StreamHandle) -> Result<DevicePtrMut<u8>> {
        if self.buffer.as_ref().is_none_or(|b| b.len() < bytes) {
            stream.synchronize()?;
            self.buffer = None;
            self.buffer = Some(alloc_bytes(bytes.max(1 << 20))?);
        }
        let buffer = self.buffer.as_ref().expect("reserved above");
        let start = buffer.as_device_ptr().as_raw();
        if zeroed > 0 {
            assert!(zeroed <= bytes, "zeroing past the reserved bytes");
            // SAFETY: the range lies inside the live scratch allocation (reserved above).
            check("cuMemsetD8Async", unsafe {
                cu::cuMemsetD8Async(start, 0, zeroed, stream.0)
            })?;
        }
        Ok(DevicePtrMut::from_address(start))
    }
}

fn alloc_bytes(bytes: usize) -> Result<DeviceBuffer<u8>> {
    alloc::<u8>(bytes, &[bytes])
}

/// An array that [`Gpu::temporary`](crate::Gpu) made: a [`DeviceArray`] given back to
/// its pool in stream order when dropped.
pub(crate) struct Temporary<'g, T: Element> {
    array: ManuallyDrop<DeviceArray<T>>,
    /// The stream that frees it, `None` for a plain allocation.
    stream: Option<StreamHandle>,
    /// The pool it came from, which must outlive it.
    _pool: PhantomData<&'g MemoryPool>,
}

impl<'g, T: Element> Temporary<'g, T> {
    /// An array from `_pool`, freed in stream order on `stream`.
    pub(crate) fn pooled(array: DeviceArray<T>, _pool: &'g MemoryPool, stream: StreamHandle) -> Self {
        Self {
            array: ManuallyDrop::new(array),
            stream: Some(stream),
            _pool: PhantomData,
        }
    }

    /// A plain allocation, freed as any array.
    pub(crate) fn plain(array: DeviceArray<T>) -> Self {
        Self {
            array: ManuallyDrop::new(array),
            stream: None,
            _pool: PhantomData,
        }
    }
}

impl<T: Element> std::ops::Deref for Temporary<'_, T> {
    type Target = DeviceArray<T>;
    fn deref(&self) -> &DeviceArray<T> {
        &self.array
    }
}

impl<T: Element> std::ops::DerefMut for Temporary<'_, T> {
    fn deref_mut(&mut self) -> &mut DeviceArray<T> {
        &mut self.array
    }
}

impl<T: Element> Drop for Temporary<'_, T> {
    fn drop(&mut self) {
        // SAFETY: the array is taken once, here, and never touched again.
        let array = unsafe { ManuallyDrop::take(&mut self.array) };
        if let (Some(stream), Memory::Owned(buffer)) = (self.stream, array.memory) {
            let address = buffer.as_device_ptr().as_raw();
            std::mem::forget(buffer);
            // SAFETY: the pool's allocation, freed once, here. The work queued before on
            // the stream still reads it; the pool reuses it only for work queued after.
            // A failure here is a context error, which the next call on the stream
            // reports.
            let _ = unsafe { cu::cuMemFreeAsync(address, stream.0) };
        }
    }
}
