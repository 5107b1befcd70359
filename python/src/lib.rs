//! `gpu_kernels._gpu_kernels`: the library's operations on memory that PyTorch owns.
//!
//! The Python package checks its tensors (device, dtype, contiguity, alignment) and
//! passes each one as its data pointer and shape (a `TensorArg`), with the device's
//! current stream; each function here borrows them as [`DeviceArray`]s (module
//! `tensor`) and queues its work on that stream. Shapes and problems are validated by the library itself, so the
//! errors (and the fake tensors' shapes) are the Rust API's.

mod tensor;

use host::{
    Activation, Conv2dParams, ConvLayout, ConvPrecision, DeviceArray, Error, GemvElement, GemvSum, Gpu, Op,
    ScanKind, bf16, f16,
};
use pyo3::exceptions::{PyMemoryError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;

use crate::tensor::{Tensor, TensorArg, borrow_optional, on_device};

/// The library's error as the Python exception a PyTorch user expects: `ValueError`
/// for arguments, `MemoryError` for device memory, `RuntimeError` for the device.
fn to_python(error: Error) -> PyErr {
    let message = error.to_string();
    match error {
        Error::ShapeMismatch { .. }
        | Error::ZeroRank { .. }
        | Error::WrongRank { .. }
        | Error::InvalidAxis { .. }
        | Error::EmptyAxis { .. }
        | Error::InvalidParameter { .. }
        | Error::TooLarge { .. } => PyValueError::new_err(message),
        Error::OutOfMemory { .. } => PyMemoryError::new_err(message),
        _ => PyRuntimeError::new_err(message),
    }
}

fn unsupported(op: &str, dtype: &str) -> PyErr {
    PyTypeError::new_err(format!("{op} does not take dtype {dtype}"))
}

/// Runs `$body` with `$T` the element type that `$dtype` names, among those listed.
macro_rules! by_dtype {
    ($op:literal, $dtype:expr, [$($name:literal => $t:ty),*], |$T:ident| $body:expr) => {
        match $dtype {
            $($name => {
                type $T = $t;
                $body
            })*
            other => Err(unsupported($op, other)),
        }
    };
}

/// `cumsum(x)` along `axis` into y (x's shape).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn cumsum(
    py: Python<'_>,
    device: u32,
    stream: usize,
    dtype: &str,
    x: TensorArg,
    y: u64,
    axis: usize,
    exclusive: bool,
    reverse: bool,
) -> PyResult<()> {
    let kind = if exclusive {
        ScanKind::Exclusive
    } else {
        ScanKind::Inclusive
    };
    by_dtype!("cumsum", dtype, ["float32" => f32, "float64" => f64, "int32" => i32, "int64" => i64,
        "bfloat16" => bf16, "float16" => f16], |T| {
        on_device(py, device, stream, |gpu| {
            let mut y = Tensor::<T>::new(y, &x.1).borrow()?;
            let x = Tensor::<T>::of(&x).borrow()?;
            gpu.cumsum_into(&x, &mut y, axis, kind, reverse)
        })
    })
}

/// `min(x, axis)` into values (and the first indices, int64 of the same shape, when
/// given): the reduced shape, with or without the axis kept.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn min(
    py: Python<'_>,
    device: u32,
    stream: usize,
    dtype: &str,
    x: TensorArg,
    axis: usize,
    values: TensorArg,
    indices: Option<u64>,
) -> PyResult<()> {
    by_dtype!("min", dtype, ["float32" => f32, "float64" => f64, "int32" => i32,
        "bfloat16" => bf16, "float16" => f16], |T| {
        on_device(py, device, stream, |gpu| {
            let x = Tensor::<T>::of(&x).borrow()?;
            let mut values_array = Tensor::<T>::of(&values).borrow()?;
            match indices {
                Some(indices) => {
                    let mut indices = Tensor::<i64>::new(indices, &values.1).borrow()?;
                    gpu.min_into(&x, axis, &mut values_array, &mut indices)
                }
                None => gpu.amin_into(&x, axis, &mut values_array),
            }
        })
    })
}

/// `op(A) x` into y (`transpose`: `A^T x`), x a vector or up to 16 columns.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn gemv(
    py: Python<'_>,
    device: u32,
    stream: usize,
    dtype: &str,
    a: TensorArg,
    x: TensorArg,
    y: TensorArg,
    transpose: bool,
) -> PyResult<()> {
    let op = if transpose { Op::T } else { Op::N };
    by_dtype!("gemv", dtype, ["float32" => f32, "float64" => f64, "bfloat16" => bf16, "float16" => f16],
        |T| {
        on_device(py, device, stream, |gpu| {
            let a = Tensor::<T>::of(&a).borrow()?;
            let x = Tensor::<T>::of(&x).borrow()?;
            let mut y = Tensor::<T>::of(&y).borrow()?;
            product(gpu, op, &a, &x, &mut y)
        })
    })
}

/// `y = op(A) x`.
fn product<T: GemvElement>(
    gpu: &Gpu,
    op: Op,
    a: &DeviceArray<T>,
    x: &DeviceArray<T>,
    y: &mut DeviceArray<T>,
) -> host::Result<()> {
    gpu.gemv(T::Sum::ONE, op, a, x, T::Sum::ZERO, y)
}

/// The shape of `op(A) x`, validated as the library does.
#[pyfunction]
fn gemv_output_shape(a_shape: Vec<usize>, x_shape: Vec<usize>, transpose: bool) -> PyResult<Vec<usize>> {
    let op = if transpose { Op::T } else { Op::N };
    host::gemv_problem(&a_shape, &x_shape, op)
        .map(|(_, shape)| shape)
        .map_err(to_python)
}

/// The shape of `min(x, axis)`, validated as the library does.
#[pyfunction]
fn min_output_shape(shape: Vec<usize>, axis: usize, keepdim: bool) -> PyResult<Vec<usize>> {
    host::min_problem("min", &shape, axis).map_err(to_python)?;
    Ok(host::reduced_shape(&shape, axis, keepdim))
}

/// Validates a cumsum of `shape` along `axis` as the library does.
#[pyfunction]
fn check_cumsum(shape: Vec<usize>, axis: usize) -> PyResult<()> {
    host::scan_problem(&shape, axis).map(drop).map_err(to_python)
}

/// The option that `name` spells among `options`, or a `ValueError` listing them.
fn choose<T: Copy>(what: &str, name: &str, options: &[(&str, T)]) -> PyResult<T> {
    options
        .iter()
        .find(|(spelling, _)| *spelling == name)
        .map(|&(_, option)| option)
        .ok_or_else(|| {
            let expected: Vec<String> = options
                .iter()
                .map(|(spelling, _)| format!("{spelling:?}"))
                .collect();
            PyValueError::new_err(format!(
                "{what} {name:?}: expected one of {}",
                expected.join(", ")
            ))
        })
}

/// A convolution's parameters ([`Conv2dParams`]) from their Python spelling, checked
/// once for the calls that take them.
#[pyclass(frozen, name = "ConvParams")]
struct ConvParams(Conv2dParams);

#[pymethods]
impl ConvParams {
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        groups: usize,
        layout: &str,
        precision: &str,
        activation: &str,
    ) -> PyResult<Self> {
        let layout = choose(
            "layout",
            layout,
            &[("nchw", ConvLayout::Nchw), ("nhwc", ConvLayout::Nhwc)],
        )?;
        let precision = choose(
            "precision",
            precision,
            &[("fp32", ConvPrecision::Fp32), ("tf32", ConvPrecision::Tf32)],
        )?;
        let activation = choose(
            "activation",
            activation,
            &[
                ("identity", Activation::Identity),
                ("relu", Activation::Relu),
                ("silu", Activation::Silu),
                ("gelu_tanh", Activation::GeluTanh),
            ],
        )?;
        Ok(Self(Conv2dParams {
            stride,
            padding,
            dilation,
            groups,
            layout,
            precision,
            activation,
        }))
    }

    /// The shape of `conv2d(x, w)` (in the parameters' layout), validated as the
    /// library does.
    fn output_shape(&self, x_shape: Vec<usize>, w_shape: Vec<usize>) -> PyResult<Vec<usize>> {
        host::conv2d_problem(&x_shape, &w_shape, &self.0)
            .map(|(_, shape)| shape)
            .map_err(to_python)
    }
}

/// `activation(conv2d(x, w) + bias) + residual` into y, float32; the bias `[out]` and
/// the residual (y's shape) when given.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn conv2d(
    py: Python<'_>,
    device: u32,
    stream: usize,
    x: TensorArg,
    w: TensorArg,
    bias: Option<u64>,
    residual: Option<u64>,
    y: TensorArg,
    params: &Bound<'_, ConvParams>,
) -> PyResult<()> {
    let params = params.get().0;
    on_device(py, device, stream, |gpu| {
        let bias = borrow_optional(bias, &w.1[..1])?;
        let residual = borrow_optional(residual, &y.1)?;
        let mut y = Tensor::<f32>::of(&y).borrow()?;
        let (x, w) = (Tensor::<f32>::of(&x).borrow()?, Tensor::<f32>::of(&w).borrow()?);
        gpu.conv2d_residual_into(&x, &w, bias.as_ref(), residual.as_ref(), &params, &mut y)
    })
}

/// The gradients of `conv2d(x, w) + bias` for `grad_y`, into those given (x's, w's and
/// `[out]` shapes), float32.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn conv2d_backward(
    py: Python<'_>,
    device: u32,
    stream: usize,
    x: TensorArg,
    w: TensorArg,
    grad_y: TensorArg,
    grad_x: Option<u64>,
    grad_w: Option<u64>,
    grad_bias: Option<u64>,
    params: &Bound<'_, ConvParams>,
) -> PyResult<()> {
    let params = params.get().0;
    on_device(py, device, stream, |gpu| {
        let mut grad_x = borrow_optional(grad_x, &x.1)?;
        let mut grad_w = borrow_optional(grad_w, &w.1)?;
        let mut grad_bias = borrow_optional(grad_bias, &w.1[..1])?;
        let (x, w) = (Tensor::<f32>::of(&x).borrow()?, Tensor::<f32>::of(&w).borrow()?);
        let grad_y = Tensor::<f32>::of(&grad_y).borrow()?;
        gpu.conv2d_backward_into(
            &x,
            &w,
            &grad_y,
            &params,
            (grad_x.as_mut(), grad_w.as_mut(), grad_bias.as_mut()),
        )
    })
}

/// What the library knows of CUDA device `device`, opening it on first use.
#[pyfunction]
fn device_info(py: Python<'_>, device: u32) -> PyResult<String> {
    tensor::with_gpu(py, device, |gpu| Ok(format!("{:?}", gpu.info())))
}

/// Host microseconds per call of the Rust API's `cumsum_into` (32 floats, exclusive)
/// on device `device`, timed as [`Gpu::host_us_per_call`] does: what the Python path's
/// per-call cost is measured against, in the same process. On the device's own stream,
/// or with `stream` each call borrows that stream (`Gpu::with_stream`), as the binding
/// does: the two apart are the cost of borrowing.
#[pyfunction]
#[pyo3(signature = (device, calls, batches, stream=None))]
fn rust_api_cumsum_us(
    py: Python<'_>,
    device: u32,
    calls: usize,
    batches: usize,
    stream: Option<usize>,
) -> PyResult<f64> {
    tensor::with_gpu(py, device, |gpu| {
        let x = gpu.upload(&ndarray::Array1::<f32>::ones(32))?;
        let mut y = gpu.alloc::<f32>(&[32])?;
        let mut scan = |gpu: &Gpu| gpu.cumsum_into(&x, &mut y, 0, ScanKind::Exclusive, false);
        gpu.host_us_per_call(calls, batches, |gpu| match stream {
            None => scan(gpu),
            Some(stream) => tensor::on_stream(gpu, stream, &mut scan),
        })
    })
}

#[pymodule]
fn _gpu_kernels(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add("ARRAY_ALIGNMENT", host::ARRAY_ALIGNMENT)?;
    module.add_class::<ConvParams>()?;
    module.add_function(wrap_pyfunction!(cumsum, module)?)?;
    module.add_function(wrap_pyfunction!(check_cumsum, module)?)?;
    module.add_function(wrap_pyfunction!(min, module)?)?;
    module.add_function(wrap_pyfunction!(min_output_shape, module)?)?;
    module.add_function(wrap_pyfunction!(gemv, module)?)?;
    module.add_function(wrap_pyfunction!(gemv_output_shape, module)?)?;
    module.add_function(wrap_pyfunction!(conv2d, module)?)?;
    module.add_function(wrap_pyfunction!(conv2d_backward, module)?)?;
    module.add_function(wrap_pyfunction!(device_info, module)?)?;
    module.add_function(wrap_pyfunction!(rust_api_cumsum_us, module)?)?;
    Ok(())
}
