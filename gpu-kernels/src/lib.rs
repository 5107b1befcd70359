//! GPU kernels in `no_std` Rust, compiled to PTX through rustc's `nvptx64-nvidia-cuda`
//! target, and the launch geometry that the host derives its launches from.
//!
//! Levels, bottom up:
//! - [`device`]: the only code that touches `core::arch::nvptx` or inline PTX (indices,
//!   barriers, shared memory, shuffles, vector memory access);
//! - [`warp`] and [`block`]: warp- and block-wide collectives built on the device layer;
//! - one module per kernel family, each holding its tuning policy (compiled on both
//!   sides) and, for nvptx64 only, its block-level functions and thin entry points.
//!
//! On the host this crate compiles to the policies alone.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", allow(internal_features))]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(abi_ptx, asm_experimental_arch, stdarch_nvptx, core_intrinsics)
)]

#[cfg(target_arch = "nvptx64")]
pub mod block;
#[cfg(target_arch = "nvptx64")]
pub mod device;
#[cfg(target_arch = "nvptx64")]
pub mod warp;

pub mod conv;
pub mod copy;
pub mod matvec;
pub mod min;
pub mod scan;

/// Every kernel entry point the PTX must export. The PTX build fails if one is missing,
/// and the host looks each one up when it loads the module.
pub fn kernel_entry_points() -> impl Iterator<Item = &'static str> {
    core::iter::once(copy::KERNEL)
        .chain(min::KERNELS)
        .chain(scan::KERNELS)
        .chain(matvec::KERNELS)
        .chain(conv::KERNELS)
}

/// Launch bounds (`__launch_bounds__`) that the PTX build adds to entry points: the
/// block size every launch uses, and the blocks that must fit on one SM at once, which
/// caps the registers ptxas may give each thread.
pub struct LaunchBounds {
    pub kernel: &'static str,
    pub threads: u32,
    pub blocks_per_sm: u32,
}

/// Every entry point's launch bounds, where a family sets them.
pub fn launch_bounds() -> impl Iterator<Item = &'static LaunchBounds> {
    conv::LAUNCH_BOUNDS.iter().chain(&scan::LAUNCH_BOUNDS)
}

/// A panic in device code (only reachable through a failed bounds check) stops the
/// kernel: the launch then reports an illegal-instruction error to the host.
#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    device::trap()
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    #[test]
    fn every_family_kernel_is_an_entry_point_once() {
        let all: Vec<&str> = super::kernel_entry_points().collect();
        let families = [
            &[super::copy::KERNEL][..],
            &super::min::KERNELS,
            &super::scan::KERNELS,
            &super::matvec::KERNELS,
            &super::conv::KERNELS,
        ];
        for name in families.iter().flat_map(|f| f.iter()) {
            assert_eq!(all.iter().filter(|n| *n == name).count(), 1, "{name}");
        }
        assert_eq!(all.len(), families.iter().map(|f| f.len()).sum::<usize>());
    }
}
