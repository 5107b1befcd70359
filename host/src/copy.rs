//! Device-to-device copy: the copy kernel, and the driver's copy beside it for
//! comparison.

use gpu_kernels::copy as policy;

use crate::array::{DeviceArray, Element};
use crate::driver::{self, LaunchConfig, kernel_args};
use crate::error::{Error, Result};
use crate::gpu::Gpu;

impl Gpu {
    /// Copies `src` into `dst` with the project's copy kernel (128-bit accesses).
    pub fn copy<T: Element>(&self, src: &DeviceArray<T>, dst: &mut DeviceArray<T>) -> Result<()> {
        check_same_shape(src, dst)?;
        let words = (src.bytes() / 4) as u64;
        let blocks = policy::grid_blocks(words);
        if blocks == 0 {
            return Ok(());
        }
        let (src_ptr, dst_ptr) = (src.buffer.as_device_ptr(), dst.buffer.as_device_ptr());
        let config = LaunchConfig::linear(blocks, policy::BLOCK_THREADS);
        // SAFETY: copy_words(src: *const u32, dst: *mut u32, words: u64); both buffers
        // hold `words` words (Element sizes are multiples of 4), start 256-byte aligned,
        // and are distinct allocations; the grid is the policy's.
        unsafe {
            self.launch(
                policy::KERNEL,
                &config,
                &mut kernel_args![src_ptr, dst_ptr, words],
            )
        }
    }

    /// Copies `src` into `dst` with the driver's `cuMemcpyDtoDAsync`.
    pub fn copy_with_driver<T: Element>(&self, src: &DeviceArray<T>, dst: &mut DeviceArray<T>) -> Result<()> {
        check_same_shape(src, dst)?;
        self.bind()?;
        driver::memcpy_device(src, dst, self.stream())
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
