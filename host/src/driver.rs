//! The launch layer: the only module that calls the CUDA driver directly or launches a
//! kernel, and so the only `unsafe` code of the host. Each function checks what it
//! can (limits, sizes) and states what it cannot in a `# Safety` section.

use std::ffi::{CStr, c_void};
use std::marker::PhantomData;
use std::os::raw::c_char;

use cust::memory::DeviceBuffer;
use cust::module::Module;
use cust::stream::Stream;
use cust::sys as cu;

use crate::array::{DeviceArray, Element};
use crate::error::{Error, Result};
use crate::gpu::DeviceInfo;

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

/// A kernel's handle in a loaded module.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KernelHandle(cu::CUfunction);

// SAFETY: a CUfunction is an opaque handle that the driver accepts from any thread on
// which its context is current (Gpu makes it current before every call).
unsafe impl Send for KernelHandle {}

/// Looks up an entry point of `module`.
pub(crate) fn kernel_handle(module: &Module, name: &str) -> Result<KernelHandle> {
    let function = module.get_function(name).map_err(|e| Error::Driver {
        call: "cuModuleGetFunction",
        code: 500,
        name: format!("{e:?}"),
        message: format!("kernel entry point `{name}` not found in the loaded image"),
    })?;
    Ok(KernelHandle(function.to_raw()))
}

/// Device memory for `len` elements, contents unspecified.
pub(crate) fn alloc<T: cust::memory::DeviceCopy>(len: usize, shape: &[usize]) -> Result<DeviceBuffer<T>> {
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

/// Sets every byte of `array` to `byte`, in stream order.
pub(crate) fn memset_bytes<T: Element>(array: &mut DeviceArray<T>, byte: u8, stream: &Stream) -> Result<()> {
    if array.is_empty() {
        return Ok(());
    }
    // SAFETY: the range is exactly the array's own live allocation.
    check("cuMemsetD8Async", unsafe {
        cu::cuMemsetD8Async(
            array.buffer.as_device_ptr().as_raw(),
            byte,
            array.bytes(),
            stream.as_inner(),
        )
    })
}

/// The driver's device-to-device copy of `src` into `dst` (same shape), in stream order.
pub(crate) fn memcpy_device<T: Element>(
    src: &DeviceArray<T>,
    dst: &mut DeviceArray<T>,
    stream: &Stream,
) -> Result<()> {
    debug_assert_eq!(src.shape(), dst.shape());
    if src.is_empty() {
        return Ok(());
    }
    // SAFETY: both ranges are whole live allocations of equal size, distinct because
    // `dst` is borrowed mutably.
    check("cuMemcpyDtoDAsync", unsafe {
        cu::cuMemcpyDtoDAsync_v2(
            dst.buffer.as_device_ptr().as_raw(),
            src.buffer.as_device_ptr().as_raw(),
            src.bytes(),
            stream.as_inner(),
        )
    })
}

/// Grid, block and dynamic shared memory of one launch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LaunchConfig {
    pub grid: [u64; 3],
    pub block: [u32; 3],
    pub shared_bytes: u32,
}

impl LaunchConfig {
    /// A one-dimensional grid of one-dimensional blocks, no shared memory.
    pub fn linear(blocks: u64, threads: u32) -> Self {
        Self {
            grid: [blocks, 1, 1],
            block: [threads, 1, 1],
            shared_bytes: 0,
        }
    }

    /// Checks the configuration against the device's limits.
    fn validate(&self, kernel: &'static str, info: &DeviceInfo) -> Result<()> {
        let fail = |detail: String| Err(Error::LaunchLimits { kernel, detail });
        let [gx, gy, gz] = self.grid;
        if gx == 0 || gy == 0 || gz == 0 {
            return fail(format!("empty grid {:?}", self.grid));
        }
        if gx > i32::MAX as u64 || gy > 65535 || gz > 65535 {
            return fail(format!(
                "grid {:?} is over the limit [2^31-1, 65535, 65535]",
                self.grid
            ));
        }
        let threads: u64 = self.block.iter().map(|&b| b as u64).product();
        if threads == 0 || threads > info.max_threads_per_block as u64 || self.block[2] > 64 {
            return fail(format!(
                "block {:?} is outside 1..={} threads (z at most 64)",
                self.block, info.max_threads_per_block
            ));
        }
        if self.shared_bytes > info.max_shared_bytes_per_block {
            return fail(format!(
                "{} bytes of shared memory requested, the device allows {} per block",
                self.shared_bytes, info.max_shared_bytes_per_block
            ));
        }
        Ok(())
    }
}

/// Default dynamic shared memory a kernel may use without opting in.
const SHARED_BYTES_WITHOUT_OPT_IN: u32 = 48 * 1024;

/// The addresses of a launch's arguments, in order, for [`launch`]. Each is borrowed
/// from the caller's binding until the launch, so an argument cannot go out of scope
/// before the driver reads it.
pub(crate) struct KernelArgs<'a> {
    addresses: Vec<*mut c_void>,
    borrows: PhantomData<&'a ()>,
}

impl<'a> KernelArgs<'a> {
    pub(crate) fn new() -> Self {
        Self {
            addresses: Vec::new(),
            borrows: PhantomData,
        }
    }

    /// Appends the address of the next argument.
    pub(crate) fn with<T>(mut self, value: &'a T) -> Self {
        self.addresses.push(value as *const T as *mut c_void);
        self
    }
}

/// The [`KernelArgs`] of the given bindings, in order.
macro_rules! kernel_args {
    ($($arg:expr),* $(,)?) => {
        $crate::driver::KernelArgs::new()$(.with(&$arg))*
    };
}
pub(crate) use kernel_args;

/// Launches `kernel` on `stream` after checking `config` against the device's limits,
/// and raises the kernel's dynamic shared-memory limit first when it asks for more than
/// 48 KiB. Launch errors are returned; errors inside the kernel surface at the next
/// synchronization.
///
/// # Safety
/// `args` must point to values whose types, order and count match the kernel's
/// parameters, and every pointer among them must be valid for everything the kernel
/// reads and writes under `config`.
pub(crate) unsafe fn launch(
    kernel: (&'static str, KernelHandle),
    config: &LaunchConfig,
    info: &DeviceInfo,
    stream: &Stream,
    args: &mut KernelArgs<'_>,
) -> Result<()> {
    let (name, handle) = kernel;
    config.validate(name, info)?;
    if config.shared_bytes > SHARED_BYTES_WITHOUT_OPT_IN {
        // SAFETY: sets a documented attribute on a valid function handle.
        check("cuFuncSetAttribute", unsafe {
            cu::cuFuncSetAttribute(
                handle.0,
                cu::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                config.shared_bytes as i32,
            )
        })?;
    }
    let [gx, gy, gz] = config.grid;
    let [bx, by, bz] = config.block;
    // SAFETY: the limits were checked above; the caller guarantees the arguments.
    check("cuLaunchKernel", unsafe {
        cu::cuLaunchKernel(
            handle.0,
            gx as u32,
            gy as u32,
            gz as u32,
            bx,
            by,
            bz,
            config.shared_bytes,
            stream.as_inner(),
            args.addresses.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100() -> DeviceInfo {
        DeviceInfo {
            ordinal: 0,
            name: "test".into(),
            compute_capability: (9, 0),
            multiprocessors: 132,
            total_memory_bytes: 80 << 30,
            l2_cache_bytes: 50 << 20,
            max_threads_per_block: 1024,
            max_shared_bytes_per_block: 227 * 1024,
            driver_version: (13, 0),
            kernel_image: "sm_90 cubin".into(),
        }
    }

    fn detail(config: LaunchConfig) -> String {
        match config.validate("k", &h100()) {
            Err(Error::LaunchLimits { kernel: "k", detail }) => detail,
            other => panic!("expected LaunchLimits, got {other:?}"),
        }
    }

    #[test]
    fn launch_limits_are_checked_before_launching() {
        assert!(
            LaunchConfig::linear(i32::MAX as u64, 1024)
                .validate("k", &h100())
                .is_ok()
        );
        assert!(detail(LaunchConfig::linear(1 << 31, 256)).contains("over the limit"));
        assert!(detail(LaunchConfig::linear(0, 256)).contains("empty grid"));
        assert!(detail(LaunchConfig::linear(1, 1025)).contains("outside 1..=1024"));
        assert!(detail(LaunchConfig::linear(1, 0)).contains("outside"));
        let tall = LaunchConfig {
            grid: [1, 65536, 1],
            block: [32, 1, 1],
            shared_bytes: 0,
        };
        assert!(detail(tall).contains("over the limit"));
        let smem = LaunchConfig {
            shared_bytes: 228 * 1024,
            ..LaunchConfig::linear(1, 32)
        };
        assert!(detail(smem).contains("allows 232448 per block"));
        let opt_in = LaunchConfig {
            shared_bytes: 100 * 1024,
            ..LaunchConfig::linear(1, 32)
        };
        assert!(opt_in.validate("k", &h100()).is_ok());
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
    /// Makes the buffer at least `bytes` long and returns its device address.
    pub fn reserve(&mut self, bytes: usize, stream: &Stream) -> Result<u64> {
        if self.buffer.as_ref().is_none_or(|b| b.len() < bytes) {
            stream
                .synchronize()
                .map_err(|e| crate::gpu::cust_error("cuStreamSynchronize", e))?;
            self.buffer = None;
            self.buffer = Some(alloc_bytes(bytes.max(1 << 20))?);
        }
        Ok(self
            .buffer
            .as_ref()
            .expect("reserved above")
            .as_device_ptr()
            .as_raw())
    }

    /// Zeroes `bytes` bytes from `offset`, in stream order.
    pub fn zero(&mut self, offset: usize, bytes: usize, stream: &Stream) -> Result<()> {
        let buffer = self.buffer.as_mut().expect("reserve before zero");
        assert!(offset + bytes <= buffer.len(), "zeroing past the scratch buffer");
        // SAFETY: the range lies inside the live scratch allocation (asserted).
        check("cuMemsetD8Async", unsafe {
            cu::cuMemsetD8Async(
                buffer.as_device_ptr().as_raw() + offset as u64,
                0,
                bytes,
                stream.as_inner(),
            )
        })
    }
}

fn alloc_bytes(bytes: usize) -> Result<DeviceBuffer<u8>> {
    alloc::<u8>(bytes, &[bytes])
}
