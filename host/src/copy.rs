//! Device-to-device copy: the copy kernel, and the driver's copy beside it for
//! comparison.

use gpu_kernels::copy::{self as kernel, CopyArgs};

use crate::array::{DeviceArray, Element};
use crate::driver;
use crate::error::{Error, Result};
use crate::gpu::Gpu;

impl Gpu {
    /// Copies `src` into `dst` with the project's copy kernel (128-bit accesses).
    pub fn copy<T: Element>(&self, src: &DeviceArray<T>, dst: &mut DeviceArray<T>) -> Result<()> {
        check_same_shape(src, dst)?;
        // Element sizes are multiples of 4 bytes, and arrays start 256-byte aligned.
        let args = CopyArgs {
            src: src.ptr().cast(),
            dst: dst.ptr_mut().cast(),
            words: (src.bytes() / 4) as u64,
        };
        match kernel::launch(args) {
            Some(launch) => self.launch(&launch),
            None => Ok(()),
        }
    }

    /// Copies `src` into `dst` with the driver's `cuMemcpyDtoDAsync`.
    pub fn copy_with_driver<T: Element>(&self, src: &DeviceArray<T>, dst: &mut DeviceArray<T>) -> Result<()> {
        check_same_shape(src, dst)?;
        self.bind()?;
        driver::memcpy_device(src, dst, self.stream()?)
    }
}

fn check_same_shape<T: Element>(src: &DeviceArray<T>, dst: &DeviceArray<T>) -> Result<()> {
    if src.shape() != dst.shape() {
        return Err(Error::ShapeMismatch {
            what: "copy destination",
            expected: src.shape().to_vec(),
            actual: dst.shape().to_vec(),
        });
    }
    Ok(())
}
