//! The one error type of the library.

use thiserror::Error;

/// Everything that can go wrong; each message says what was expected.
#[derive(Debug, Error)]
pub enum Error {
    #[error("no usable CUDA device: {reason}")]
    NoDevice { reason: String },

    #[error("CUDA device {ordinal} does not exist: {count} device(s) found")]
    NoSuchDevice { ordinal: u32, count: u32 },

    #[error(
        "the CUDA driver supports CUDA {found_major}.{found_minor}, but {required_major}.{required_minor} or newer is needed; update the NVIDIA driver"
    )]
    DriverTooOld {
        found_major: u32,
        found_minor: u32,
        required_major: u32,
        required_minor: u32,
    },

    #[error(
        "no kernel image runs on compute capability {major}.{minor}: this build holds {available}; add the architecture to ptx_builder::DEFAULT_ARCHES and rebuild"
    )]
    NoKernelImage {
        major: u32,
        minor: u32,
        available: String,
    },

    #[error("the embedded kernel image for {arch} is unreadable: {detail}")]
    CorruptKernelImage { arch: &'static str, detail: String },

    #[error("out of device memory: allocating {bytes} bytes for an array of shape {shape:?} failed")]
    OutOfMemory { bytes: usize, shape: Vec<usize> },

    #[error("shape mismatch: {what} has shape {actual:?}, expected {expected:?}")]
    ShapeMismatch {
        what: &'static str,
        expected: Vec<usize>,
        actual: Vec<usize>,
    },

    #[error("{op} needs an array of rank 1 or more; got a 0-dimensional array")]
    ZeroRank { op: &'static str },

    #[error("{what} must have {expected}; got shape {shape:?}")]
    WrongRank {
        what: &'static str,
        expected: &'static str,
        shape: Vec<usize>,
    },

    #[error("axis {axis} is out of range for an array of rank {rank} (valid axes: 0..{rank})")]
    InvalidAxis { axis: usize, rank: usize },

    #[error("{op} over axis {axis} of shape {shape:?}: the axis is empty, so there is no minimum")]
    EmptyAxis {
        op: &'static str,
        axis: usize,
        shape: Vec<usize>,
    },

    #[error("invalid {parameter}: {detail}")]
    InvalidParameter { parameter: &'static str, detail: String },

    #[error("array of shape {shape:?} is too large: {detail}")]
    TooLarge { shape: Vec<usize>, detail: String },

    #[error("launch of `{kernel}` exceeds the device's limits: {detail}")]
    LaunchLimits { kernel: &'static str, detail: String },

    #[error("NCCL is not available: {detail}; install NCCL 2 or point NCCL_LIBRARY at libnccl.so.2")]
    NcclUnavailable { detail: String },

    #[error("NCCL call {call} failed ({code}): {message}")]
    Nccl {
        call: &'static str,
        code: i32,
        message: String,
    },

    #[error("CUDA driver call {call} failed: {name} ({code}): {message}")]
    Driver {
        call: &'static str,
        code: i32,
        name: String,
        message: String,
    },
}

/// `Result` with this crate's [`Error`](enum@Error).
pub type Result<T> = std::result::Result<T, Error>;
