//! The GPU tests, one module per kernel family, in one test binary (the kernels are
//! embedded in every binary, so one binary keeps the GPU bundle small). Each GPU test
//! prints `SKIPPED (no GPU)` and passes on a machine without a device.

mod conv;
mod conv_half;
mod copy;
mod group;
mod matvec;
mod min;
mod primitives;
mod runtime;
mod scan;
