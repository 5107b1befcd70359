//! 2-D convolution of f32 tensors as `torch.nn.functional.conv2d`: forward with an
//! optional bias, and the gradients of input, weight and bias, in FP32 or TF32
//! ([`ConvPrecision`]), channels first or last ([`ConvLayout`]). Every sum is taken in a
//! fixed order, so results are the same from run to run.
//!
//! In NCHW, x is `[batch, in_channels, height, width]`, w `[out_channels, in_channels /
//! groups, kernel_h, kernel_w]`, y `[batch, out_channels, out_h, out_w]`, with torch's
//! `out = (in + 2 * padding - dilation * (kernel - 1) - 1) / stride + 1`; in NHWC the
//! channels come last in each. A pass whose kernels read the other layout changes the
//! layout around them. Host arrays and views of any memory order go through
//! [`Gpu::conv2d_of`] and [`Gpu::conv2d_backward_of`], which upload them row-major.

mod element;
mod sixteen_bit;

use gpu_kernels::conv::{
    self as kernel, ConvAlgorithm, ConvEpilogue, ConvPass, ConvProblem, ConvShape, ConvShapeError,
    CudaCoreAlgorithm, PhasePlan, SubPixelPlan, TensorCorePlan, WinogradProblem, WinogradSplit, phases,
    reduce::{BiasGradPlan, BiasGradToNhwc},
    tensor_core::{ForwardScratch, TensorCoreOperand},
    transposed,
};
pub use gpu_kernels::conv::{Activation, ConvLayout, ConvPrecision};
use gpu_kernels::launch::{DevicePtr, DevicePtrMut, ScratchLayout};
use gpu_kernels::tensor_map::TensorMapPair;
use ndarray::{ArrayBase, ArrayD, Data, Dimension};

use crate::array::{DeviceArray, Element};
use crate::driver::Temporary;
use crate::error::{Error, Result};
use crate::gpu::Gpu;
pub use element::ConvElement;
use element::F32Output;
pub use sixteen_bit::{SixteenBitForward, SixteenBitInputGrad, SixteenBitPlans, SixteenBitWeightGrad};

/// Stride, padding, dilation (each `[along height, along width]`), groups, the
/// tensors' layout, the arithmetic, and the activation the forward pass applies after
/// the bias (fused: `y = activation(conv(x, w) + bias) [+ residual]`, written once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv2dParams {
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
    pub layout: ConvLayout,
    pub precision: ConvPrecision,
    pub activation: Activation,
}

impl Default for Conv2dParams {
    /// Stride 1, no padding, no dilation, one group, NCHW, FP32, no activation: torch's
    /// defaults (with TF32 off).
    fn default() -> Self {
        Self {
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
            layout: ConvLayout::Nchw,
            precision: ConvPrecision::Fp32,
            activation: Activation::Identity,
        }
    }
}

/// A 4-D shape in `layout` as NCHW (`[n, c, h, w]`; the weights' `[out, in, kh, kw]`).
fn channels_first(shape: [usize; 4], layout: ConvLayout) -> [usize; 4] {
    match layout {
        ConvLayout::Nchw => shape,
        ConvLayout::Nhwc => [shape[0], shape[3], shape[1], shape[2]],
    }
}

/// An NCHW shape in `layout`.
fn in_layout(shape: [usize; 4], layout: ConvLayout) -> [usize; 4] {
    match layout {
        ConvLayout::Nchw => shape,
        ConvLayout::Nhwc => [shape[0], shape[2], shape[3], shape[1]],
    }
}

/// Which gradients [`Gpu::conv2d_backward`] computes (torch's `output_mask`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvGradients {
    pub input: bool,
    pub weight: bool,
    pub bias: bool,
}

impl ConvGradients {
    /// All three gradients.
    pub const ALL: Self = Self {
        input: true,
        weight: true,
        bias: true,
    };
}

/// The gradients of input, weight and bias, each present when asked for.
pub type ConvGradientArrays<A> = (Option<A>, Option<A>, Option<A>);

fn invalid(parameter: &'static str, detail: String) -> Error {
    Error::InvalidParameter { parameter, detail }
}

/// Validates a convolution of x by w and returns its problem and y's shape (computed
/// once, by the problem).
pub fn conv2d_problem(
    x_shape: &[usize],
    w_shape: &[usize],
    params: &Conv2dParams,
) -> Result<(ConvProblem, Vec<usize>)> {
    let rank4 = |what, shape: &[usize]| {
        <[usize; 4]>::try_from(shape).map_err(|_| Error::WrongRank {
            what,
            expected: "rank 4",
            shape: shape.to_vec(),
        })
    };
    let x = channels_first(rank4("the input x", x_shape)?, params.layout);
    let w = channels_first(rank4("the weight w", w_shape)?, params.layout);
    let too_large = || Error::TooLarge {
        shape: x_shape.to_vec(),
        detail: "a dimension, or a GEMM extent of the convolution, passes the kernels' 32-bit index limits"
            .into(),
    };
    let narrow = |v: usize| u32::try_from(v).map_err(|_| too_large());
    let narrow_all = |v: &[usize]| v.iter().map(|&d| narrow(d)).collect::<Result<Vec<u32>>>();
    let pair = |v: [usize; 2]| Ok::<_, Error>([narrow(v[0])?, narrow(v[1])?]);
    let shape = ConvShape {
        input: narrow_all(&x)?.try_into().expect("four extents"),
        weight: narrow_all(&w)?.try_into().expect("four extents"),
        stride: pair(params.stride)?,
        padding: pair(params.padding)?,
        dilation: pair(params.dilation)?,
        groups: narrow(params.groups)?,
    };
    let problem = ConvProblem::new(&shape).map_err(|e| shape_error(e, x, w, params, too_large()))?;
    let y_shape = in_layout(problem.output_shape().map(|d| d as usize), params.layout).to_vec();
    Ok((problem, y_shape))
}

/// [`conv2d_problem`] as the kernels run it: a pointwise problem over images of one
/// row ([`ConvProblem::pointwise_as_row`]), the same tensors.
fn kernel_problem(
    x_shape: &[usize],
    w_shape: &[usize],
    params: &Conv2dParams,
) -> Result<(ConvProblem, Vec<usize>)> {
    let (problem, y_shape) = conv2d_problem(x_shape, w_shape, params)?;
    Ok((problem.pointwise_as_row().unwrap_or(problem), y_shape))
}

/// The error of a rejected shape, with what was expected.
fn shape_error(
    error: ConvShapeError,
    x: [usize; 4],
    w: [usize; 4],
    params: &Conv2dParams,
    too_large: Error,
) -> Error {
    let [_, in_channels, height, width] = x;
    let [out_channels, _, kernel_h, kernel_w] = w;
    let groups = params.groups;
    match error {
        ConvShapeError::NoGroups => invalid("groups", "must be at least 1".into()),
        ConvShapeError::ZeroStep { dilation } => {
            let (name, value) = if dilation {
                ("dilation", params.dilation)
            } else {
                ("stride", params.stride)
            };
            invalid(
                name,
                format!("{value:?} has a zero; every entry must be at least 1"),
            )
        }
        ConvShapeError::NoChannels => invalid(
            "channels",
            format!("x has {in_channels} and w {out_channels} channels; both must be at least 1"),
        ),
        ConvShapeError::GroupsDivide { input } => {
            let (name, channels) = if input {
                ("in channels", in_channels)
            } else {
                ("out channels", out_channels)
            };
            invalid(
                "groups",
                format!("{name} ({channels}) are not divisible by groups ({groups})"),
            )
        }
        ConvShapeError::WeightMismatch => Error::ShapeMismatch {
            what: "the weight w (against x and groups; kernel extents at least 1)",
            expected: vec![
                out_channels,
                in_channels / groups,
                kernel_h.max(1),
                kernel_w.max(1),
            ],
            actual: w.to_vec(),
        },
        ConvShapeError::EmptyImage => invalid("x", format!("shape {x:?} has an empty spatial extent")),
        ConvShapeError::WindowTooLarge => invalid(
            "kernel",
            format!(
                "the dilated {kernel_h}x{kernel_w} window (dilation {:?}) is larger than the padded {}x{} input",
                params.dilation,
                height + 2 * params.padding[0],
                width + 2 * params.padding[1]
            ),
        ),
        ConvShapeError::TooLarge => too_large,
    }
}

fn expect_shape(what: &'static str, expected: Vec<usize>, actual: &[usize]) -> Result<()> {
    if actual != expected {
        return Err(Error::ShapeMismatch {
            what,
            expected,
            actual: actual.to_vec(),
        });
    }
    Ok(())
}

/// The weights a tensor-core pass reads.
#[derive(Clone, Copy)]
enum Weights {
    /// As the caller gave them.
    AsGiven(DevicePtr<f32>),
    /// Already TF32 values (rounded by the filter preparation).
    Tf32(DevicePtr<f32>),
}

impl Weights {
    const fn ptr(self) -> DevicePtr<f32> {
        match self {
            Self::AsGiven(w) | Self::Tf32(w) => w,
        }
    }
}

/// The output gradient of a backward pass as given, in its layout, and its copy in the
/// other layout once a pass asked for it: made once for all the passes that read it so.
/// The bias gradient, while still to compute, comes with an NCHW -> NHWC copy (which
/// reads dy anyway), else from [`GradY::finish_bias_grad`].
struct GradY<'a, 'g> {
    given: &'a DeviceArray<f32>,
    layout: ConvLayout,
    copy: Option<Temporary<'g, f32>>,
    bias: Option<&'a mut DeviceArray<f32>>,
}

impl<'g> GradY<'_, 'g> {
    fn in_layout(&mut self, gpu: &'g Gpu, layout: ConvLayout) -> Result<&DeviceArray<f32>> {
        if layout == self.layout {
            return Ok(self.given);
        }
        let copy = match &mut self.copy {
            Some(copy) => copy,
            empty => empty.insert(Self::relayout(gpu, self.given, self.layout, &mut self.bias)?),
        };
        Ok(copy)
    }

    /// The copy of `given` (in `layout`) in the other layout, with the bias gradient
    /// into `bias` (taken) on the way where the copy is NCHW -> NHWC.
    fn relayout(
        gpu: &'g Gpu,
        given: &DeviceArray<f32>,
        layout: ConvLayout,
        bias: &mut Option<&mut DeviceArray<f32>>,
    ) -> Result<Temporary<'g, f32>> {
        let fused = match (layout, given.shape()) {
            (ConvLayout::Nchw, &[n, c, h, w]) => {
                BiasGradToNhwc::new(n as u64, c as u64, (h * w) as u64).map(|plan| (plan, [n, h, w, c]))
            }
            _ => None,
        };
        match (fused, bias.take()) {
            (Some((plan, shape)), Some(db)) => gpu.to_nhwc_with_bias_grad(&plan, given, &shape, db),
            (_, taken) => {
                *bias = taken;
                gpu.relayout(given, layout)
            }
        }
    }

    /// The bias gradient, where no layout change computed it.
    fn finish_bias_grad(&mut self, gpu: &Gpu, problem: &ConvProblem) -> Result<()> {
        match self.bias.take() {
            Some(db) => gpu.bias_grad(problem, self.given, self.layout, db),
            None => Ok(()),
        }
    }
}

impl Gpu {
    /// `conv2d(x, w) + bias` for x `[batch, in_channels, h, w]` and w `[out_channels,
    /// in_channels / groups, kh, kw]`; bias, when given, is `[out_channels]`.
    pub fn conv2d<T: ConvElement>(
        &self,
        x: &DeviceArray<T>,
        w: &DeviceArray<T>,
        bias: Option<&DeviceArray<T>>,
        params: &Conv2dParams,
    ) -> Result<DeviceArray<T>> {
        let (_, y_shape) = conv2d_problem(x.shape(), w.shape(), params)?;
        let mut y = self.alloc(&y_shape)?;
        self.conv2d_into(x, w, bias, params, &mut y)?;
        Ok(y)
    }

    /// [`Gpu::conv2d`] into an existing y of the output's shape (every element is
    /// written).
    pub fn conv2d_into<T: ConvElement>(
        &self,
        x: &DeviceArray<T>,
        w: &DeviceArray<T>,
        bias: Option<&DeviceArray<T>>,
        params: &Conv2dParams,
        y: &mut DeviceArray<T>,
    ) -> Result<()> {
        self.conv2d_residual_into(x, w, bias, None, params, y)
    }

    /// `activation(conv2d(x, w) + bias) + residual` in one pass that writes y, the
    /// residual of y's shape and layout (a block's skip connection).
    pub fn conv2d_residual<T: ConvElement>(
        &self,
        x: &DeviceArray<T>,
        w: &DeviceArray<T>,
        bias: Option<&DeviceArray<T>>,
        residual: &DeviceArray<T>,
        params: &Conv2dParams,
    ) -> Result<DeviceArray<T>> {
        let (_, y_shape) = conv2d_problem(x.shape(), w.shape(), params)?;
        let mut y = self.alloc(&y_shape)?;
        self.conv2d_residual_into(x, w, bias, Some(residual), params, &mut y)?;
        Ok(y)
    }

    /// [`Gpu::conv2d_residual`] into an existing y (every element is written); without
    /// a residual, [`Gpu::conv2d_into`]. In bf16 and f16 the sums, the bias, the
    /// activation and the residual are taken in f32 and y rounded once.
    pub fn conv2d_residual_into<T: ConvElement>(
        &self,
        x: &DeviceArray<T>,
        w: &DeviceArray<T>,
        bias: Option<&DeviceArray<T>>,
        residual: Option<&DeviceArray<T>>,
        params: &Conv2dParams,
        y: &mut DeviceArray<T>,
    ) -> Result<()> {
        let (problem, y_shape) = kernel_problem(x.shape(), w.shape(), params)?;
        if let Some(b) = bias {
            expect_shape("the bias (against w)", vec![w.shape()[0]], b.shape())?;
        }
        if let Some(r) = residual {
            expect_shape("the residual (against conv2d(x, w))", y_shape.clone(), r.shape())?;
        }
        expect_shape("the output y (against conv2d(x, w))", y_shape, y.shape())?;
        if y.is_empty() {
            return Ok(());
        }
        if T::forward_own(self, &problem, params, [x, w], [bias, residual], y)? {
            return Ok(());
        }
        let as_f32 = |a| T::as_f32(self, a);
        let (x, w) = (as_f32(x)?, as_f32(w)?);
        let bias = bias.map(as_f32).transpose()?;
        let residual = residual.map(as_f32).transpose()?;
        let mut y = T::f32_output(self, y)?;
        let params = T::f32_params(params);
        let operands = [&*x, &*w];
        self.forward_f32(
            &problem,
            &params,
            operands,
            bias.as_deref(),
            residual.as_deref(),
            y.array(),
        )?;
        y.finish(self)
    }

    /// The forward pass of a validated problem over f32 tensors (`[x, w]`, y not
    /// empty).
    fn forward_f32(
        &self,
        problem: &ConvProblem,
        params: &Conv2dParams,
        [x, w]: [&DeviceArray<f32>; 2],
        bias: Option<&DeviceArray<f32>>,
        residual: Option<&DeviceArray<f32>>,
        y: &mut DeviceArray<f32>,
    ) -> Result<()> {
        let bias = bias.map_or(DevicePtr::NULL, DeviceArray::ptr);
        let epilogue = |residual: Option<&DeviceArray<f32>>| {
            ConvEpilogue::new(
                bias,
                params.activation,
                residual.map_or(DevicePtr::NULL, DeviceArray::ptr),
            )
        };
        let algorithm = self.algorithm(problem, ConvPass::Forward, params);
        // The kernels read x and w, and write y, in their layouts: what is in another
        // changes around them.
        let (operands, output) = (algorithm.layout(), algorithm.output_layout());
        let (mut x_copy, mut w_copy) = (None, None);
        let x = self.as_layout(x, params.layout, operands, &mut x_copy)?;
        let w = self.as_layout(w, params.layout, operands, &mut w_copy)?;
        if output == params.layout {
            return self.forward(
                problem,
                algorithm,
                x.ptr(),
                w.ptr(),
                epilogue(residual),
                y.ptr_mut(),
            );
        }
        let residual = residual.map(|r| self.relayout(r, params.layout)).transpose()?;
        let mut y_native = self.temporary(&in_layout(problem.output_shape().map(|d| d as usize), output))?;
        self.forward(
            problem,
            algorithm,
            x.ptr(),
            w.ptr(),
            epilogue(residual.as_deref()),
            y_native.ptr_mut(),
        )?;
        self.change_layout(&y_native, y, output)
    }

    /// The forward pass by `algorithm`, over tensors in its layout. y is an array's
    /// start (the few-channel kernel stores it in 8-byte pairs) except in the input
    /// gradient's phases, whose algorithms are the GEMMs'.
    fn forward(
        &self,
        problem: &ConvProblem,
        algorithm: ConvAlgorithm,
        x: DevicePtr<f32>,
        w: DevicePtr<f32>,
        epilogue: ConvEpilogue,
        y: DevicePtrMut<f32>,
    ) -> Result<()> {
        match algorithm {
            ConvAlgorithm::Winograd(winograd) => self.winograd(&winograd, x, w, epilogue, y),
            ConvAlgorithm::ImplicitGemm(plan) => self.launch(&plan.forward(problem, x, w, epilogue, y)),
            ConvAlgorithm::Direct(plan) => self.launch(&plan.forward(problem, x, w, epilogue, y)),
            ConvAlgorithm::Stencil(plan) => self.launch(&plan.launch(x, w, epilogue, y)),
            ConvAlgorithm::TensorCore(plan) => {
                self.tensor_core_forward(problem, plan, x, Weights::AsGiven(w), epilogue, y)
            }
            ConvAlgorithm::FewChannels(plan) => self.launch(&plan.launch(x, w, epilogue, y)),
            ConvAlgorithm::TensorCoreWeightGrad(_)
            | ConvAlgorithm::WarpgroupWeightGrad(_)
            | ConvAlgorithm::Phases(_)
            | ConvAlgorithm::SubPixel(_) => Err(invalid(
                "algorithm",
                format!("{algorithm:?} is a gradient's plan, not a forward one"),
            )),
        }
    }

    /// The forward pass on the tensor cores. `wgmma` reads the weights from shared
    /// memory as TF32 by dropping their low mantissa bits, which biases the products:
    /// unless they are TF32 values already, a rounded copy (to nearest) goes to the
    /// scratch buffer first (always where NCHW boxes read the weights in their order), followed by the plan's tensor maps and, where the plan
    /// splits K, the partial sums.
    fn tensor_core_forward(
        &self,
        problem: &ConvProblem,
        plan: TensorCorePlan,
        x: DevicePtr<f32>,
        w: Weights,
        epilogue: ConvEpilogue,
        y: DevicePtrMut<f32>,
    ) -> Result<()> {
        // NCHW boxes read the weights in an order of their own, rounded on the way.
        let (w, prepare) = match w {
            _ if plan.nchw_boxes() => (w.ptr(), Some(transposed::box_order_filters as fn(_, _, _) -> _)),
            Weights::AsGiven(w) if plan.warpgroup_mma == 1 => (w, Some(transposed::round_filters as _)),
            Weights::AsGiven(w) | Weights::Tf32(w) => (w, None),
        };
        let rounded_bytes = if prepare.is_some() {
            (problem.weight_count() * 4).next_multiple_of(size_of::<TensorMapPair>() as u64)
        } else {
            0
        };
        let map_bytes = if plan.bulk_copies == 1 {
            size_of::<TensorMapPair>() as u64
        } else {
            0
        };
        let partials_at = rounded_bytes + map_bytes;
        let (_scratch, start) = self.scratch(ScratchLayout {
            bytes: partials_at + plan.partials_scratch(problem).bytes,
            zeroed: 0,
        })?;
        let w = match prepare {
            Some(prepare) => {
                let prepared = start.cast::<f32>();
                self.launch(&prepare(problem, w, prepared))?;
                prepared.as_const()
            }
            None => w,
        };
        let maps = match plan.tensor_maps(problem, x, w) {
            Some(specs) => self.write_tensor_maps(&specs, start.offset(rounded_bytes).cast())?,
            None => DevicePtr::NULL,
        };
        let scratch = ForwardScratch {
            maps,
            partials: start.offset(partials_at),
        };
        let (gemm, finish) = plan.forward_launches(problem, x, w, epilogue, y, scratch);
        self.launch(&gemm)?;
        match finish {
            Some(finish) => self.launch(&finish),
            None => Ok(()),
        }
    }

    /// [`Gpu::conv2d`] of host arrays or views: uploads, convolves, downloads.
    pub fn conv2d_of<T, S1, S2, S3, D1, D2, D3>(
        &self,
        x: &ArrayBase<S1, D1>,
        w: &ArrayBase<S2, D2>,
        bias: Option<&ArrayBase<S3, D3>>,
        params: &Conv2dParams,
    ) -> Result<ArrayD<T>>
    where
        T: ConvElement,
        S1: Data<Elem = T>,
        S2: Data<Elem = T>,
        S3: Data<Elem = T>,
        D1: Dimension,
        D2: Dimension,
        D3: Dimension,
    {
        conv2d_problem(x.shape(), w.shape(), params)?;
        let bias = bias.map(|b| self.upload(b)).transpose()?;
        let y = self.conv2d(&self.upload(x)?, &self.upload(w)?, bias.as_ref(), params)?;
        self.download(&y)
    }

    /// The gradients of `conv2d(x, w) + bias` with respect to x, w and the bias, for
    /// the output gradient `grad_y` (y's shape); each is computed when `which` asks.
    pub fn conv2d_backward<T: ConvElement>(
        &self,
        x: &DeviceArray<T>,
        w: &DeviceArray<T>,
        grad_y: &DeviceArray<T>,
        params: &Conv2dParams,
        which: ConvGradients,
    ) -> Result<ConvGradientArrays<DeviceArray<T>>> {
        conv2d_problem(x.shape(), w.shape(), params)?;
        let alloc = |wanted: bool, shape: &[usize]| wanted.then(|| self.alloc(shape)).transpose();
        let mut input = alloc(which.input, x.shape())?;
        let mut weight = alloc(which.weight, w.shape())?;
        let mut bias = alloc(which.bias, &w.shape()[..1])?;
        self.conv2d_backward_into(
            x,
            w,
            grad_y,
            params,
            (input.as_mut(), weight.as_mut(), bias.as_mut()),
        )?;
        Ok((input, weight, bias))
    }

    /// [`Gpu::conv2d_backward`] into existing gradients (x's, w's and `[out_channels]`
    /// shapes); each one present is computed, every element written. In bf16 and f16
    /// each gradient is summed in f32 and rounded once.
    pub fn conv2d_backward_into<T: ConvElement>(
        &self,
        x: &DeviceArray<T>,
        w: &DeviceArray<T>,
        grad_y: &DeviceArray<T>,
        params: &Conv2dParams,
        gradients: ConvGradientArrays<&mut DeviceArray<T>>,
    ) -> Result<()> {
        let (problem, y_shape) = kernel_problem(x.shape(), w.shape(), params)?;
        if params.activation != Activation::Identity {
            return Err(invalid(
                "activation",
                format!(
                    "{:?}: the backward pass is the convolution's alone; give it the gradient \
                     of its output (the activation's gradient applied to grad_y)",
                    params.activation
                ),
            ));
        }
        expect_shape(
            "the output gradient grad_y (against conv2d(x, w))",
            y_shape,
            grad_y.shape(),
        )?;
        let checks = [
            (&gradients.0, "the input gradient (against x)", x.shape()),
            (&gradients.1, "the weight gradient (against w)", w.shape()),
            (&gradients.2, "the bias gradient (against w)", &w.shape()[..1]),
        ];
        for (gradient, what, shape) in checks {
            if let Some(g) = gradient {
                expect_shape(what, shape.to_vec(), g.shape())?;
            }
        }
        let (input, weight, bias) = T::backward_own(self, &problem, params, [x, w, grad_y], gradients)?;
        if input.is_none() && weight.is_none() && bias.is_none() {
            return Ok(());
        }
        // As f32 what the passes left read: dy, w for the input gradient, x for the
        // weight gradient.
        let as_f32 = |a, wanted: bool| wanted.then(|| T::as_f32(self, a)).transpose();
        let grad_y = T::as_f32(self, grad_y)?;
        let (w, x) = (as_f32(w, input.is_some())?, as_f32(x, weight.is_some())?);
        let [input, weight, bias] =
            [input, weight, bias].map(|g| g.map(|g| T::f32_output(self, g)).transpose());
        let mut outputs = [input?, weight?, bias?];
        let [input, weight, bias] = outputs.each_mut().map(|g| g.as_mut().map(F32Output::array));
        let params = T::f32_params(params);
        let input = input.zip(w.as_deref());
        let weight = weight.zip(x.as_deref());
        self.backward_f32(&problem, &params, &grad_y, [input, weight], bias)?;
        outputs.into_iter().flatten().try_for_each(|g| g.finish(self))
    }

    /// The backward pass of a validated problem over f32 tensors: for `grad_y`, the
    /// input gradient with w (`input`: dx and w), the weight gradient with x (`weight`:
    /// dw and x) and the bias gradient, each where present.
    fn backward_f32(
        &self,
        problem: &ConvProblem,
        params: &Conv2dParams,
        grad_y: &DeviceArray<f32>,
        [input, weight]: [Option<(&mut DeviceArray<f32>, &DeviceArray<f32>)>; 2],
        bias: Option<&mut DeviceArray<f32>>,
    ) -> Result<()> {
        // The passes whose kernels read the tensors' layout (the tensor cores', the
        // direct ones) run on them as they are; the bias gradient with the first change
        // of dy's layout, or after them.
        let mut grad_y = GradY {
            given: grad_y,
            layout: params.layout,
            copy: None,
            bias,
        };
        let input = match input {
            Some((dx, w)) => self
                .input_grad_in_layout(problem, params, &mut grad_y, w, dx)?
                .map(|dx| (dx, w)),
            None => None,
        };
        let weight = match weight {
            Some((dw, x)) => self
                .weight_grad_in_layout(problem, params, x, &mut grad_y, dw)?
                .map(|dw| (dw, x)),
            None => None,
        };
        grad_y.finish_bias_grad(self, problem)?;
        // The rest on the CUDA cores in FP32 (more exact than TF32), over NCHW tensors:
        // NHWC ones change to it, and the gradients back.
        if input.is_none() && weight.is_none() {
            return Ok(());
        }
        let layout = params.layout;
        let (mut x_nchw, mut w_nchw) = (None, None);
        let grad_y = grad_y.in_layout(self, ConvLayout::Nchw)?;
        if let Some((dx, w)) = input {
            let w = self.as_layout(w, layout, ConvLayout::Nchw, &mut w_nchw)?;
            self.through_layout(layout, ConvLayout::Nchw, problem.input_shape(), dx, |dx| {
                self.input_grad(problem, grad_y, w, dx)
            })?;
        }
        if let Some((dw, x)) = weight {
            let x = self.as_layout(x, layout, ConvLayout::Nchw, &mut x_nchw)?;
            self.through_layout(layout, ConvLayout::Nchw, problem.weight_shape(), dw, |dw| {
                self.weight_grad(problem, x, grad_y, dw)
            })?;
        }
        Ok(())
    }

    /// `a` (in `from`) in the layout `to`: itself, or a copy kept in `copy`.
    fn as_layout<'a, 'g: 'a, T: Element>(
        &'g self,
        a: &'a DeviceArray<T>,
        from: ConvLayout,
        to: ConvLayout,
        copy: &'a mut Option<Temporary<'g, T>>,
    ) -> Result<&'a DeviceArray<T>> {
        if from == to {
            return Ok(a);
        }
        Ok(copy.insert(self.relayout(a, from)?))
    }

    /// `pass` writing `gradient` (in `layout`, `shape` in NCHW) in the layout `native`,
    /// through a temporary in it when the layouts differ.
    fn through_layout(
        &self,
        layout: ConvLayout,
        native: ConvLayout,
        shape: [u32; 4],
        gradient: &mut DeviceArray<f32>,
        pass: impl FnOnce(&mut DeviceArray<f32>) -> Result<()>,
    ) -> Result<()> {
        if layout == native {
            return pass(gradient);
        }
        let mut temporary = self.temporary(&in_layout(shape.map(|d| d as usize), native))?;
        pass(&mut temporary)?;
        self.change_layout(&temporary, gradient, native)
    }

    /// The input gradient where its plan reads a layout of its own: the direct kernel,
    /// the stencil, the tensor cores' forward pass of the transposed problem, or its
    /// phases. `dx` back when the plan is another.
    fn input_grad_in_layout<'a, 'g>(
        &'g self,
        problem: &ConvProblem,
        params: &Conv2dParams,
        grad_y: &mut GradY<'_, 'g>,
        w: &DeviceArray<f32>,
        dx: &'a mut DeviceArray<f32>,
    ) -> Result<Option<&'a mut DeviceArray<f32>>> {
        if dx.is_empty() {
            return Ok(None);
        }
        let algorithm = self.algorithm(problem, ConvPass::InputGrad, params);
        let layouts = [params.layout, algorithm.layout()];
        match algorithm {
            ConvAlgorithm::Stencil(plan) => {
                self.input_grad_native(problem, layouts, grad_y, w, dx, |grad_y, w, dx| {
                    let dy = grad_y.in_layout(self, plan.layout())?.ptr();
                    self.launch(&plan.launch(dy, w.ptr(), ConvEpilogue::NONE, dx.ptr_mut()))
                })?
            }
            ConvAlgorithm::Direct(plan) => {
                self.input_grad_native(problem, layouts, grad_y, w, dx, |grad_y, w, dx| {
                    let dy = grad_y.in_layout(self, plan.layout())?.ptr();
                    self.launch(&plan.input_grad(problem, dy, w.ptr(), dx.ptr_mut()))
                })?
            }
            ConvAlgorithm::TensorCore(plan) => match problem.input_grad_as_forward() {
                Some(transposed) => self.input_grad_as_forward(problem, &transposed, plan, grad_y, w, dx)?,
                None => return Ok(Some(dx)),
            },
            ConvAlgorithm::Phases(plan) => {
                self.input_grad_native(problem, layouts, grad_y, w, dx, |grad_y, w, dx| {
                    self.input_grad_by_phases(problem, &plan, grad_y, w, dx)
                })?
            }
            ConvAlgorithm::SubPixel(plan) => {
                // NHWC, the tensors' layout.
                let dy = grad_y.in_layout(self, ConvLayout::Nhwc)?.ptr();
                self.input_grad_sub_pixel(problem, &plan, w.ptr(), dy, dx.ptr_mut())?
            }
            ConvAlgorithm::ImplicitGemm(_)
            | ConvAlgorithm::Winograd(_)
            | ConvAlgorithm::TensorCoreWeightGrad(_)
            | ConvAlgorithm::WarpgroupWeightGrad(_)
            | ConvAlgorithm::FewChannels(_) => {
                return Ok(Some(dx));
            }
        }
        Ok(None)
    }

    /// `pass` computing dx from dy and w in a layout of its own, `layouts` the tensors'
    /// and the pass's: w changed to it, and dx through a temporary in it where they
    /// differ.
    fn input_grad_native<'g>(
        &'g self,
        problem: &ConvProblem,
        layouts: [ConvLayout; 2],
        grad_y: &mut GradY<'_, 'g>,
        w: &DeviceArray<f32>,
        dx: &mut DeviceArray<f32>,
        pass: impl FnOnce(&mut GradY<'_, 'g>, &DeviceArray<f32>, &mut DeviceArray<f32>) -> Result<()>,
    ) -> Result<()> {
        let [layout, native] = layouts;
        let mut w_copy = None;
        let w = self.as_layout(w, layout, native, &mut w_copy)?;
        self.through_layout(layout, native, problem.input_shape(), dx, |dx| {
            pass(grad_y, w, dx)
        })
    }

    /// `pass` computing dw from x and dy in a layout of its own, `layouts` the tensors'
    /// and the pass's: x and dy changed to it, and dw through a temporary in it where
    /// they differ.
    fn weight_grad_native<'g>(
        &'g self,
        problem: &ConvProblem,
        layouts: [ConvLayout; 2],
        x: &DeviceArray<f32>,
        grad_y: &mut GradY<'_, 'g>,
        dw: &mut DeviceArray<f32>,
        pass: impl FnOnce(DevicePtr<f32>, DevicePtr<f32>, DevicePtrMut<f32>) -> Result<()>,
    ) -> Result<()> {
        let [layout, native] = layouts;
        let mut x_copy = None;
        let x = self.as_layout(x, layout, native, &mut x_copy)?;
        let dy = grad_y.in_layout(self, native)?;
        self.through_layout(layout, native, problem.weight_shape(), dw, |dw| {
            pass(x.ptr(), dy.ptr(), dw.ptr_mut())
        })
    }

    /// The weight gradient where its plan reads a layout of its own: the depthwise
    /// kernels (the tensors'), `wgmma` (the tensors' where it reads them, else NHWC),
    /// `mma.sync` (NHWC); `dw` back when the plan's is another.
    fn weight_grad_in_layout<'a, 'g>(
        &'g self,
        problem: &ConvProblem,
        params: &Conv2dParams,
        x: &DeviceArray<f32>,
        grad_y: &mut GradY<'_, 'g>,
        dw: &'a mut DeviceArray<f32>,
    ) -> Result<Option<&'a mut DeviceArray<f32>>> {
        match self.algorithm(problem, ConvPass::WeightGrad, params) {
            ConvAlgorithm::Direct(_) | ConvAlgorithm::Stencil(_) if problem.batch == 0 => {
                self.fill_zero(dw)?
            }
            ConvAlgorithm::Stencil(plan) => {
                // The tensors' layout: the stencil takes either.
                let (_scratch, partials) = self.scratch(plan.weight_grad_scratch())?;
                let (products, sum) =
                    plan.weight_grad_launches(x.ptr(), grad_y.given.ptr(), partials, dw.ptr_mut());
                self.launch(&products)?;
                if let Some(sum) = sum {
                    self.launch(&sum)?;
                }
            }
            ConvAlgorithm::Direct(plan) => {
                let (_scratch, partials) = self.scratch(plan.weight_grad_scratch(problem))?;
                let (products, sum) =
                    plan.weight_grad(problem, x.ptr(), grad_y.given.ptr(), partials, dw.ptr_mut());
                self.launch(&products)?;
                if let Some(sum) = sum {
                    self.launch(&sum)?;
                }
            }
            ConvAlgorithm::WarpgroupWeightGrad(plan) => {
                let native = [params.layout, plan.layout()];
                self.weight_grad_native(problem, native, x, grad_y, dw, |x, dy, dw| {
                    let (_scratch, scratch) = self.scratch(plan.scratch(problem))?;
                    let specs = plan.tensor_maps(problem, x, dy);
                    let maps = self.write_tensor_maps(&specs, plan.maps_at(problem, scratch))?;
                    let (products, sum) = plan.launches(problem, maps, scratch, dw);
                    self.launch(&products)?;
                    sum.map_or(Ok(()), |sum| self.launch(&sum))
                })?
            }
            ConvAlgorithm::TensorCoreWeightGrad(_) if problem.batch == 0 => self.fill_zero(dw)?,
            ConvAlgorithm::TensorCoreWeightGrad(plan) => {
                let native = [params.layout, ConvLayout::Nhwc];
                self.weight_grad_native(problem, native, x, grad_y, dw, |x, dy, dw| {
                    let (_scratch, partials) = self.scratch(plan.scratch(problem))?;
                    let (products, sum) = plan.launches(problem, x, dy, partials, dw);
                    self.launch(&products)?;
                    sum.map_or(Ok(()), |sum| self.launch(&sum))
                })?
            }
            _ => return Ok(Some(dw)),
        }
        Ok(None)
    }

    /// [`Gpu::conv2d_backward`] of host arrays or views.
    pub fn conv2d_backward_of<T, S1, S2, S3, D1, D2, D3>(
        &self,
        x: &ArrayBase<S1, D1>,
        w: &ArrayBase<S2, D2>,
        grad_y: &ArrayBase<S3, D3>,
        params: &Conv2dParams,
        which: ConvGradients,
    ) -> Result<ConvGradientArrays<ArrayD<T>>>
    where
        T: ConvElement,
        S1: Data<Elem = T>,
        S2: Data<Elem = T>,
        S3: Data<Elem = T>,
        D1: Dimension,
        D2: Dimension,
        D3: Dimension,
    {
        conv2d_problem(x.shape(), w.shape(), params)?;
        let (x, w, grad_y) = (self.upload(x)?, self.upload(w)?, self.upload(grad_y)?);
        let (gx, gw, gb) = self.conv2d_backward(&x, &w, &grad_y, params, which)?;
        let download = |a: Option<DeviceArray<T>>| a.map(|a| self.download(&a)).transpose();
        Ok((download(gx)?, download(gw)?, download(gb)?))
    }

    /// The algorithm and plan of one pass of a convolution of x by w on this device.
    pub fn conv2d_algorithm(
        &self,
        x_shape: &[usize],
        w_shape: &[usize],
        params: &Conv2dParams,
        pass: ConvPass,
    ) -> Result<ConvAlgorithm> {
        let (problem, _) = kernel_problem(x_shape, w_shape, params)?;
        Ok(self.algorithm(&problem, pass, params))
    }

    fn algorithm(&self, problem: &ConvProblem, pass: ConvPass, params: &Conv2dParams) -> ConvAlgorithm {
        let (precision, layout) = (params.precision, params.layout);
        let algorithm = kernel::algorithm(problem, pass, precision, layout, &self.limits());
        log::debug!("conv2d {pass:?} {precision:?} {layout:?} {problem:?}: {algorithm:?}");
        algorithm
    }

    fn cuda_core_algorithm(&self, problem: &ConvProblem, pass: ConvPass) -> CudaCoreAlgorithm {
        let algorithm = kernel::cuda_core_algorithm(problem, pass, self.info().multiprocessors);
        log::debug!("conv2d {pass:?} {problem:?}: {algorithm:?}");
        algorithm
    }

    /// Transforms the weights into the scratch buffer, then runs the Winograd pass.
    fn winograd(
        &self,
        problem: &WinogradProblem,
        input: DevicePtr<f32>,
        w: DevicePtr<f32>,
        epilogue: ConvEpilogue,
        output: DevicePtrMut<f32>,
    ) -> Result<()> {
        let (_scratch, u) = self.scratch(problem.filter_scratch())?;
        let u = u.cast::<f32>();
        self.launch(&problem.filter(w, u))?;
        self.launch(&problem.data_pass(input, u.as_const(), epilogue, output))
    }

    /// The input gradient of `problem` as the forward pass of `transposed` (its
    /// [`ConvProblem::input_grad_as_forward`]) by `plan`: dy (upsampled when strided)
    /// convolved by the flipped, group-transposed weights, dy and the weights in the
    /// plan's layout, dx in its output layout (the tensors').
    fn input_grad_as_forward<'g>(
        &'g self,
        problem: &ConvProblem,
        transposed: &ConvProblem,
        plan: TensorCorePlan,
        grad_y: &mut GradY<'_, 'g>,
        w: &DeviceArray<f32>,
        dx: &mut DeviceArray<f32>,
    ) -> Result<()> {
        if dx.is_empty() {
            return Ok(());
        }
        let (operands, layout) = (plan.layout(), plan.output_layout());
        let mut w_copy = None;
        let mut grad_y = grad_y.in_layout(self, operands)?.ptr();
        let _upsampled = if transposed::upsampled(problem) {
            let shape = in_layout(transposed.input_shape().map(|d| d as usize), operands);
            let mut up = self.temporary::<f32>(&shape)?;
            self.launch(&transposed::upsample(
                problem,
                transposed,
                operands,
                grad_y,
                up.ptr_mut(),
            ))?;
            grad_y = up.ptr();
            Some(up)
        } else {
            None
        };
        let w = self.as_layout(w, layout, operands, &mut w_copy)?;
        let [out, in_group, kh, kw] = transposed.weight_shape();
        let mut flipped =
            self.temporary::<f32>(&in_layout([out, in_group, kh, kw].map(|d| d as usize), operands))?;
        self.launch(&transposed::flip_filters(
            problem,
            operands,
            w.ptr(),
            flipped.ptr_mut(),
        ))?;
        self.tensor_core_forward(
            transposed,
            plan,
            grad_y,
            Weights::Tf32(flipped.ptr()),
            ConvEpilogue::NONE,
            dx.ptr_mut(),
        )
    }

    /// The strided input gradient by phases ([`phases`]): each phase with taps a
    /// forward pass (on the tensor cores or the CUDA cores, as the plan says) into its
    /// slot of the phases' gradients, dx interleaved from them; w and dx in the plan's
    /// layout.
    fn input_grad_by_phases<'g>(
        &'g self,
        problem: &ConvProblem,
        plan: &PhasePlan,
        grad_y: &mut GradY<'_, 'g>,
        w: &DeviceArray<f32>,
        dx: &mut DeviceArray<f32>,
    ) -> Result<()> {
        let layout = plan.layout();
        let limits = self.limits();
        let mut outputs = self.temporary::<f32>(&[plan.outputs_len() as usize])?;
        let mut w_copy: Option<Temporary<f32>> = None;
        for q in 0..plan.phases() {
            let Some(phase) = plan.phase(problem, q) else {
                continue;
            };
            let algorithm = match plan.tensor_cores {
                1 => ConvAlgorithm::TensorCore(TensorCorePlan::forward(&phase, layout, &limits)),
                _ => self.cuda_core_algorithm(&phase, ConvPass::Forward).into(),
            };
            let operands = algorithm.layout();
            let dy = grad_y.in_layout(self, operands)?.ptr();
            let w = match (&w_copy, operands == layout) {
                (_, true) => w.ptr(),
                (Some(copy), false) => copy.ptr(),
                (None, false) => w_copy.insert(self.relayout(w, layout)?).ptr(),
            };
            let mut filters = self.temporary::<f32>(&[phase.weight_count() as usize])?;
            let filters_launch =
                phases::phase_filters(problem, plan, q, &phase, operands, w, filters.ptr_mut());
            self.launch(&filters_launch)?;
            let slot = outputs.ptr_mut().offset(q as u64 * plan.slot_len);
            match algorithm {
                // Rounded by the filters' gathering.
                ConvAlgorithm::TensorCore(forward) => {
                    let weights = Weights::Tf32(filters.ptr());
                    self.tensor_core_forward(&phase, forward, dy, weights, ConvEpilogue::NONE, slot)?
                }
                other => self.forward(&phase, other, dy, filters.ptr(), ConvEpilogue::NONE, slot)?,
            }
        }
        self.launch(&phases::interleave(problem, plan, outputs.ptr(), dx.ptr_mut()))
    }

    /// The strided input gradient as its phases' one forward pass by `plan`: their
    /// weights gathered from w, then the pass over dy, which stores each output into
    /// dx; w, dy and dx NHWC, of the plan's operand (`T`: f32, or a 16-bit float).
    pub(super) fn input_grad_sub_pixel<T: Element>(
        &self,
        problem: &ConvProblem,
        plan: &SubPixelPlan,
        w: DevicePtr<T>,
        dy: DevicePtr<T>,
        dx: DevicePtrMut<T>,
    ) -> Result<()> {
        let phases = &plan.phases.problem;
        let mut filters = self.temporary::<T>(&[phases.weight_count() as usize])?;
        let gathered = filters.ptr_mut();
        match plan.forward.operand {
            TensorCoreOperand::Tf32 => {
                self.launch(&plan.filters::<f32>(problem, w.cast(), gathered.cast()))?
            }
            TensorCoreOperand::Bf16 | TensorCoreOperand::F16 => {
                self.launch(&plan.filters::<u16>(problem, w.cast(), gathered.cast()))?
            }
        }
        let (dy, filters) = (dy.cast::<f32>(), filters.ptr().cast::<f32>());
        let specs = plan
            .forward
            .tensor_maps(phases, dy, filters)
            .ok_or_else(|| invalid("plan", format!("{plan:?} stages no tensor maps")))?;
        let (_scratch, at) = self.scratch(ScratchLayout {
            bytes: size_of::<TensorMapPair>() as u64,
            zeroed: 0,
        })?;
        let maps = self.write_tensor_maps(&specs, at.cast())?;
        self.launch(&plan.launch(dy, filters, dx.cast(), maps))
    }

    fn input_grad(
        &self,
        problem: &ConvProblem,
        grad_y: &DeviceArray<f32>,
        w: &DeviceArray<f32>,
        dx: &mut DeviceArray<f32>,
    ) -> Result<()> {
        if dx.is_empty() {
            return Ok(());
        }
        match self.cuda_core_algorithm(problem, ConvPass::InputGrad) {
            CudaCoreAlgorithm::Winograd(winograd) => {
                self.winograd(&winograd, grad_y.ptr(), w.ptr(), ConvEpilogue::NONE, dx.ptr_mut())
            }
            CudaCoreAlgorithm::ImplicitGemm(plan) => {
                self.launch(&plan.input_grad(problem, grad_y.ptr(), w.ptr(), dx.ptr_mut()))
            }
        }
    }

    fn weight_grad(
        &self,
        problem: &ConvProblem,
        x: &DeviceArray<f32>,
        grad_y: &DeviceArray<f32>,
        dw: &mut DeviceArray<f32>,
    ) -> Result<()> {
        if problem.batch == 0 {
            return self.fill_zero(dw);
        }
        let (x, dy, dw) = (x.ptr(), grad_y.ptr(), dw.ptr_mut());
        match self.cuda_core_algorithm(problem, ConvPass::WeightGrad) {
            CudaCoreAlgorithm::Winograd(winograd) => {
                let split = WinogradSplit::new(&winograd, self.info().multiprocessors);
                log::debug!("conv2d weight gradient: Winograd {split:?}");
                let (_scratch, partials) = self.scratch(split.scratch(&winograd))?;
                let partials = partials.cast::<f32>();
                self.launch(&split.weight_grad(&winograd, x, dy, partials))?;
                let (sum, finish) = split.finish(&winograd, partials, dw);
                if let Some(sum) = sum {
                    self.launch(&sum)?;
                }
                self.launch(&finish)
            }
            CudaCoreAlgorithm::ImplicitGemm(plan) => {
                let (_scratch, partials) = self.scratch(plan.weight_grad_scratch(problem))?;
                let (products, sum) = plan.weight_grad(problem, x, dy, partials, dw);
                self.launch(&products)?;
                sum.map_or(Ok(()), |sum| self.launch(&sum))
            }
        }
    }

    fn bias_grad(
        &self,
        problem: &ConvProblem,
        grad_y: &DeviceArray<f32>,
        layout: ConvLayout,
        db: &mut DeviceArray<f32>,
    ) -> Result<()> {
        let plan = BiasGradPlan::new(problem, layout, self.info().multiprocessors);
        let (_scratch, scratch) = self.scratch(plan.scratch(problem))?;
        let (partials, sum) = plan.launches(problem, grad_y.ptr(), scratch, db.ptr_mut());
        self.launch(&partials)?;
        sum.map_or(Ok(()), |sum| self.launch(&sum))
    }

    /// NCHW `grad_y` moved to NHWC (`nhwc_shape`) by `plan`, its bias gradient summed
    /// on the way into `db`.
    fn to_nhwc_with_bias_grad(
        &self,
        plan: &BiasGradToNhwc,
        grad_y: &DeviceArray<f32>,
        nhwc_shape: &[usize],
        db: &mut DeviceArray<f32>,
    ) -> Result<Temporary<'_, f32>> {
        let mut copy = self.temporary(nhwc_shape)?;
        let (_scratch, scratch) = self.scratch(plan.scratch())?;
        let (moved, sum) = plan.launches(grad_y.ptr(), copy.ptr_mut(), scratch, db.ptr_mut());
        self.launch(&moved)?;
        sum.map_or(Ok(()), |sum| self.launch(&sum))?;
        Ok(copy)
    }
}
