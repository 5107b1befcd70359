//! The element types of the convolutions. f32 runs as [`Conv2dParams`] says. bf16 and
//! f16 run on the tensor cores with f32 sums, each output rounded once to the type, as
//! cuDNN's 16-bit convolutions: on kernels of their own operands where those take the
//! pass (`sixteen_bit.rs`), else in TF32 over f32 copies, which is exact for them
//! (10 mantissa bits hold their 7 or 10, and f32's exponent their range).

use gpu_kernels::cast::{self, NarrowArgs, NarrowKernel, WidenArgs};
use gpu_kernels::conv::tensor_core::TensorCoreOperand;
use gpu_kernels::conv::{ConvPrecision, ConvProblem};

use super::{Conv2dParams, ConvGradientArrays};
use crate::array::{DeviceArray, Element};
use crate::driver::Temporary;
use crate::error::Result;
use crate::gpu::Gpu;

/// An element type of [`Gpu::conv2d`] and [`Gpu::conv2d_backward`]: f32, bf16 or f16.
pub trait ConvElement: Element {
    /// `array` as the f32 passes read it: itself, or widened into a temporary.
    #[doc(hidden)]
    fn as_f32<'a>(gpu: &'a Gpu, array: &'a DeviceArray<Self>) -> Result<AsF32<'a>>;

    /// Where the f32 passes write an output of this type: itself, or a temporary that
    /// [`F32Output::finish`] rounds into it.
    #[doc(hidden)]
    fn f32_output<'a>(gpu: &'a Gpu, array: &'a mut DeviceArray<Self>) -> Result<F32Output<'a, Self>>;

    /// The parameters of the f32 passes.
    #[doc(hidden)]
    fn f32_params(params: &Conv2dParams) -> Conv2dParams;

    /// The forward pass of a validated problem (y not empty) on a kernel of this type's
    /// own operands, where one takes it: `Ok(false)` where none does.
    #[doc(hidden)]
    fn forward_own(
        _gpu: &Gpu,
        _problem: &ConvProblem,
        _params: &Conv2dParams,
        _operands: [&DeviceArray<Self>; 2],
        _epilogue: [Option<&DeviceArray<Self>>; 2],
        _y: &mut DeviceArray<Self>,
    ) -> Result<bool> {
        Ok(false)
    }

    /// The gradients of a validated problem that kernels of this type's own operands
    /// take, computed; the others back, for the f32 passes.
    #[doc(hidden)]
    fn backward_own<'a>(
        _gpu: &Gpu,
        _problem: &ConvProblem,
        _params: &Conv2dParams,
        _operands: [&DeviceArray<Self>; 3],
        gradients: ConvGradientArrays<&'a mut DeviceArray<Self>>,
    ) -> Result<ConvGradientArrays<&'a mut DeviceArray<Self>>> {
        Ok(gradients)
    }
}

/// An input as f32.
#[doc(hidden)]
pub struct AsF32<'a>(Input<'a>);

enum Input<'a> {
    Itself(&'a DeviceArray<f32>),
    Widened(Temporary<'a, f32>),
}

impl std::ops::Deref for AsF32<'_> {
    type Target = DeviceArray<f32>;

    fn deref(&self) -> &DeviceArray<f32> {
        match &self.0 {
            Input::Itself(array) => array,
            Input::Widened(copy) => copy,
        }
    }
}

/// An output written as f32.
#[doc(hidden)]
pub struct F32Output<'a, T: Element>(Output<'a, T>);

enum Output<'a, T: Element> {
    Itself(&'a mut DeviceArray<f32>),
    Narrowed {
        sums: Temporary<'a, f32>,
        into: &'a mut DeviceArray<T>,
        narrow: fn(&Gpu, &DeviceArray<f32>, &mut DeviceArray<T>) -> Result<()>,
    },
}

impl<T: Element> F32Output<'_, T> {
    /// The f32 array the passes write.
    pub(crate) fn array(&mut self) -> &mut DeviceArray<f32> {
        match &mut self.0 {
            Output::Itself(array) => array,
            Output::Narrowed { sums, .. } => sums,
        }
    }

    /// The output's values in place: the f32 ones rounded into it where it has another
    /// type.
    pub(crate) fn finish(self, gpu: &Gpu) -> Result<()> {
        match self.0 {
            Output::Itself(_) => Ok(()),
            Output::Narrowed { sums, into, narrow } => narrow(gpu, &sums, into),
        }
    }
}

impl ConvElement for f32 {
    fn as_f32<'a>(_: &'a Gpu, array: &'a DeviceArray<f32>) -> Result<AsF32<'a>> {
        Ok(AsF32(Input::Itself(array)))
    }

    fn f32_output<'a>(_: &'a Gpu, array: &'a mut DeviceArray<f32>) -> Result<F32Output<'a, f32>> {
        Ok(F32Output(Output::Itself(array)))
    }

    fn f32_params(params: &Conv2dParams) -> Conv2dParams {
        *params
    }
}

macro_rules! conv_element_of_half {
    ($($t:ty => $operand:ident),*) => {$(
        impl ConvElement for $t {
            fn forward_own(
                gpu: &Gpu,
                problem: &ConvProblem,
                params: &Conv2dParams,
                operands: [&DeviceArray<$t>; 2],
                epilogue: [Option<&DeviceArray<$t>>; 2],
                y: &mut DeviceArray<$t>,
            ) -> Result<bool> {
                gpu.forward_16_bit(problem, params, TensorCoreOperand::$operand, operands, epilogue, y)
            }

            fn backward_own<'a>(
                gpu: &Gpu,
                problem: &ConvProblem,
                params: &Conv2dParams,
                operands: [&DeviceArray<$t>; 3],
                gradients: ConvGradientArrays<&'a mut DeviceArray<$t>>,
            ) -> Result<ConvGradientArrays<&'a mut DeviceArray<$t>>> {
                gpu.backward_16_bit(problem, params, TensorCoreOperand::$operand, operands, gradients)
            }

            fn as_f32<'a>(gpu: &'a Gpu, array: &'a DeviceArray<$t>) -> Result<AsF32<'a>> {
                let mut wide = gpu.temporary(array.shape())?;
                let args = WidenArgs { x: array.ptr(), y: wide.ptr_mut(), n: array.len() as u64 };
                if let Some(launch) = cast::widen(args) {
                    gpu.launch(&launch)?;
                }
                Ok(AsF32(Input::Widened(wide)))
            }

            fn f32_output<'a>(gpu: &'a Gpu, array: &'a mut DeviceArray<$t>) -> Result<F32Output<'a, $t>> {
                Ok(F32Output(Output::Narrowed {
                    sums: gpu.temporary(array.shape())?,
                    into: array,
                    narrow: narrow_into::<$t>,
                }))
            }

            fn f32_params(params: &Conv2dParams) -> Conv2dParams {
                // Exact in TF32: the tensor cores lose nothing.
                Conv2dParams { precision: ConvPrecision::Tf32, ..*params }
            }
        }
    )*};
}

conv_element_of_half!(half::bf16 => Bf16, half::f16 => F16);

/// Rounds `sums` into `into` (of its shape), to nearest even.
fn narrow_into<T: Element + NarrowKernel>(
    gpu: &Gpu,
    sums: &DeviceArray<f32>,
    into: &mut DeviceArray<T>,
) -> Result<()> {
    let args = NarrowArgs {
        x: sums.ptr(),
        y: into.ptr_mut(),
        n: sums.len() as u64,
    };
    match cast::narrow(args) {
        Some(launch) => gpu.launch(&launch),
        None => Ok(()),
    }
}
