//! The device's warp and block collectives run alone, one small kernel each, so that
//! tests can check them at awkward sizes apart from the kernels built on them. Every
//! sum is inclusive and wraps.

use gpu_kernels::primitives::{
    self as kernel, ChainScanKernel, GroupSumsArgs, GroupSumsKernel, RowScanArgs, RowScanKernel,
};

use crate::array::{DeviceArray, Element};
use crate::error::{Error, Result};
use crate::gpu::Gpu;

/// `y[i]` = the sum of `x` over the aligned group of `lanes` lanes (1, 2, 4, ... 32)
/// that holds `i`, by a warp reduction per group; elements past the end count as zero.
pub fn group_sums<T: Element + GroupSumsKernel>(
    gpu: &Gpu,
    x: &DeviceArray<T>,
    lanes: u32,
) -> Result<DeviceArray<T>> {
    if !lanes.is_power_of_two() || lanes > 32 {
        return Err(Error::InvalidParameter {
            parameter: "lanes",
            detail: format!("{lanes} is not a power of two up to 32"),
        });
    }
    let mut y = gpu.alloc(x.shape())?;
    if !x.is_empty() {
        let args = GroupSumsArgs {
            x: x.ptr(),
            y: y.ptr_mut(),
            n: x.len() as u64,
            lanes,
        };
        gpu.launch(&kernel::group_sums(args))?;
    }
    Ok(y)
}

/// The inclusive scan of each row of `x` (`[rows, len]`), by one block per row that
/// walks the row a tile at a time with a block scan: one warp, or several (`wide`).
pub fn row_scan<T: Element + RowScanKernel>(
    gpu: &Gpu,
    x: &DeviceArray<T>,
    wide: bool,
) -> Result<DeviceArray<T>> {
    let &[rows, len] = x.shape() else {
        return Err(Error::WrongRank {
            what: "the rows",
            expected: "rank 2",
            shape: x.shape().to_vec(),
        });
    };
    let mut y = gpu.alloc(x.shape())?;
    if rows > 0 && len > 0 {
        let args = RowScanArgs {
            x: x.ptr(),
            y: y.ptr_mut(),
            len: len as u64,
        };
        gpu.launch(&kernel::row_scan(args, rows as u64, wide))?;
    }
    Ok(y)
}

/// The inclusive scan of `x` read flat, in tiles of one warp's elements chained by
/// decoupled look-back.
pub fn chain_scan<T: Element + ChainScanKernel>(gpu: &Gpu, x: &DeviceArray<T>) -> Result<DeviceArray<T>> {
    let mut y = gpu.alloc(x.shape())?;
    let n = x.len() as u64;
    if n > 0 {
        let (_scratch, scratch) = gpu.scratch(kernel::chain_scratch(n, size_of::<T>()))?;
        gpu.launch(&kernel::chain_scan(x.ptr(), y.ptr_mut(), n, scratch))?;
    }
    Ok(y)
}
