//! GPU kernels written in Rust, launched from Rust.
//!
//! ```no_run
//! use host::Gpu;
//! use ndarray::Array2;
//!
//! let gpu = Gpu::new()?;
//! let x = gpu.upload(&Array2::<f32>::from_shape_fn((3, 5), |(i, j)| (i * 5 + j) as f32))?;
//! let mut y = gpu.alloc::<f32>(x.shape())?;
//! gpu.copy(&x, &mut y)?;
//! assert_eq!(gpu.download(&y)?, gpu.download(&x)?);
//! # Ok::<(), host::Error>(())
//! ```
//!
//! - [`Gpu`]: one device, its context, the loaded kernels and a stream;
//! - [`DeviceArray`]: a row-major array in device memory with its shape, of f32, f64,
//!   i32, i64, or the 16-bit floats [`bf16`](struct@bf16) and [`f16`](struct@f16);
//! - one module per kernel family, adding its operations to [`Gpu`];
//! - [`reference`](mod@reference): the CPU references every kernel is tested against.
//!
//! Every operation validates its arguments before touching the device and returns
//! [`Error`] on bad input, a missing device or a failing driver.

mod array;
mod conv;
mod copy;
mod driver;
mod error;
mod gpu;
mod group;
mod image;
mod layout;
mod matvec;
mod min;
pub mod primitives;
pub mod reference;
mod scan;

pub use array::{ARRAY_ALIGNMENT, DType, DeviceArray, Element};
pub use conv::{
    Activation, Conv2dParams, ConvElement, ConvGradientArrays, ConvGradients, ConvLayout, ConvPrecision,
    conv2d_problem,
};
pub use error::{Error, Result};
pub use gpu::{DeviceInfo, Gpu};
pub use group::{GpuGroup, GroupScanPlan, ShardedArray, Sharding, even_lengths};
/// The 16-bit float types every family takes (`half`'s, re-exported).
pub use half::{bf16, f16};
pub use matvec::{GemvElement, GemvSum, Op, gemv_problem};
pub use min::{MinElement, min_problem, reduced_shape};
pub use scan::{ScanElement, ScanKind, scan_problem};

/// The plans the operations choose, which their `*_plan` methods report.
pub mod plans {
    pub use crate::conv::{SixteenBitForward, SixteenBitInputGrad, SixteenBitPlans, SixteenBitWeightGrad};
    pub use gpu_kernels::conv::tensor_core::{TensorCoreOperand, TensorCorePlan};
    pub use gpu_kernels::conv::{
        ConvAlgorithm, ConvPass, GemmPlan, WarpgroupWeightGradPlan, WinogradProblem,
    };
    pub use gpu_kernels::matvec::{
        GemvPlan, columns::ColumnsPlan as GemvColumnsPlan, rows::RowsPlan as GemvRowsPlan,
    };
    pub use gpu_kernels::min::{
        MinPlan, rows::RowsPlan as MinRowsPlan, strided::StridedPlan as MinStridedPlan,
    };
    pub use gpu_kernels::scan::{
        ScanPlan, columns::ColumnsPlan, contiguous::ContiguousPlan, packed_rows::PackedRowsPlan,
        rows::RowsPlan, segments::SegmentsPlan, segments::segment_items, strided::StridedPlan,
    };
}
