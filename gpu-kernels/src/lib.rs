//! GPU kernels in `no_std` Rust, compiled to PTX through rustc's `nvptx64-nvidia-cuda`
//! target, and the contract that the host launches them by.
//!
//! Levels, bottom up:
//! - `device`: the only code that touches `core::arch::nvptx` or inline PTX (indices,
//!   barriers, shared memory, shuffles, vector memory access);
//! - `warp` and `block` (nvptx64 only): warp- and block-wide collectives built on the device layer;
//! - [`launch`]: the contract between a kernel and its launch (typed device pointers,
//!   argument structs, entry points, geometry, scratch), compiled by both sides;
//! - one module per kernel family, each holding its problem, its tuning policy and plans
//!   (compiled on both sides), one file per kernel with its argument struct, its entry
//!   points and, for nvptx64 only, its body.
//!
//! On the host this crate compiles to the contract alone.
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

pub mod launch;

pub mod cast;
pub mod conv;
pub mod copy;
pub mod element;
pub mod matvec;
pub mod min;
pub mod primitives;
pub mod scan;
pub mod tensor_map;
pub mod transpose;

/// Every kernel entry point the module exports. The PTX build fails if one is missing
/// or if the PTX has one that is not listed; the host looks each one up when it loads
/// the module.
pub fn entry_points() -> impl Iterator<Item = launch::EntryPoint> {
    [
        &[copy::ENTRY_POINTS][..],
        scan::ENTRY_POINTS,
        cast::ENTRY_POINTS,
        min::ENTRY_POINTS,
        matvec::ENTRY_POINTS,
        conv::ENTRY_POINTS,
        primitives::ENTRY_POINTS,
        &[transpose::ENTRY_POINTS, transpose::PAIRS_ENTRY_POINTS][..],
        &[tensor_map::ENTRY_POINTS][..],
    ]
    .into_iter()
    .flatten()
    .flat_map(|kernel| kernel.iter().copied())
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
    use std::collections::BTreeSet;
    use std::vec::Vec;

    #[test]
    fn entry_point_names_are_distinct() {
        let names: Vec<&str> = super::entry_points().map(|e| e.name).collect();
        let distinct: BTreeSet<&str> = names.iter().copied().collect();
        assert_eq!(names.len(), distinct.len(), "{names:?}");
    }
}
