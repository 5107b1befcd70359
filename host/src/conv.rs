//! 2-D convolution in FP32, NCHW, as `torch.nn.functional.conv2d`: forward with an
//! optional bias, and the gradients of input, weight and bias. Every sum is taken in
//! a fixed order, so results are the same from run to run.
//!
//! x is `[batch, in_channels, height, width]`, w `[out_channels, in_channels / groups,
//! kernel_h, kernel_w]`, y `[batch, out_channels, out_h, out_w]` with torch's
//! `out = (in + 2 * padding - dilation * (kernel - 1) - 1) / stride + 1`. Host arrays
//! and views of any layout go through [`Gpu::conv2d_of`] and
//! [`Gpu::conv2d_backward_of`], which upload them row-major.

use gpu_kernels::conv::{
    self as policy, ConvAlgorithm, ConvKernel, ConvPass, ConvProblem, ConvShape, FILTER_THREADS,
    GEMM_SHARED_BYTES, GEMM_THREADS, GemmPlan, REDUCE_THREADS, WINOGRAD_SHARED_BYTES, WINOGRAD_THREADS,
    WinogradProblem, WinogradSplit,
};
use ndarray::{ArrayBase, ArrayD, Data, Dimension};

use crate::array::DeviceArray;
use crate::driver::{LaunchConfig, kernel_args};
use crate::error::{Error, Result};
use crate::gpu::Gpu;

/// Stride, padding, dilation (each `[along height, along width]`) and groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv2dParams {
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
}

impl Default for Conv2dParams {
    /// Stride 1, no padding, no dilation, one group: torch's defaults.
    fn default() -> Self {
        Self {
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
        }
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

/// Validates a convolution of x by w and returns its problem and y's shape.
pub fn conv2d_problem(
    x_shape: &[usize],
    w_shape: &[usize],
    params: &Conv2dParams,
) -> Result<(ConvProblem, Vec<usize>)> {
    let rank4 = |what, shape: &[usize]| {
        <[usize; 4]>::try_from(shape).map_err(|_| Error::WrongRank {
            what,
            expected: "rank 4 (NCHW)",
            shape: shape.to_vec(),
        })
    };
    let [batch, in_channels, height, width] = rank4("the input x", x_shape)?;
    let [out_channels, w_in, kernel_h, kernel_w] = rank4("the weight w", w_shape)?;
    let groups = params.groups;
    if groups == 0 {
        return Err(invalid("groups", "must be at least 1".into()));
    }
    for (name, value) in [("stride", params.stride), ("dilation", params.dilation)] {
        if value.contains(&0) {
            return Err(invalid(
                name,
                format!("{value:?} has a zero; every entry must be at least 1"),
            ));
        }
    }
    if in_channels == 0 || out_channels == 0 {
        return Err(invalid(
            "channels",
            format!("x has {in_channels} and w {out_channels} channels; both must be at least 1"),
        ));
    }
    for (name, channels) in [("in channels", in_channels), ("out channels", out_channels)] {
        if channels % groups != 0 {
            return Err(invalid(
                "groups",
                format!("{name} ({channels}) are not divisible by groups ({groups})"),
            ));
        }
    }
    if w_in != in_channels / groups || kernel_h == 0 || kernel_w == 0 {
        return Err(Error::ShapeMismatch {
            what: "the weight w (against x and groups; kernel extents at least 1)",
            expected: vec![
                out_channels,
                in_channels / groups,
                kernel_h.max(1),
                kernel_w.max(1),
            ],
            actual: w_shape.to_vec(),
        });
    }
    if height == 0 || width == 0 {
        return Err(invalid(
            "x",
            format!("shape {x_shape:?} has an empty spatial extent"),
        ));
    }
    let too_large = || Error::TooLarge {
        shape: x_shape.to_vec(),
        detail: "a dimension, or a GEMM extent of the convolution, passes the kernels' 32-bit index limits"
            .into(),
    };
    let narrow = |v: usize| u32::try_from(v).map_err(|_| too_large());
    let pair = |v: [usize; 2]| Ok::<_, Error>([narrow(v[0])?, narrow(v[1])?]);
    let shape = ConvShape {
        input: [
            narrow(batch)?,
            narrow(in_channels)?,
            narrow(height)?,
            narrow(width)?,
        ],
        weight: [
            narrow(out_channels)?,
            narrow(w_in)?,
            narrow(kernel_h)?,
            narrow(kernel_w)?,
        ],
        stride: pair(params.stride)?,
        padding: pair(params.padding)?,
        dilation: pair(params.dilation)?,
        groups: narrow(groups)?,
    };
    let extent = |axis: usize| {
        policy::output_extent(
            shape.input[2 + axis],
            shape.weight[2 + axis],
            shape.stride[axis],
            shape.padding[axis],
            shape.dilation[axis],
        )
    };
    let (Some(out_h), Some(out_w)) = (extent(0), extent(1)) else {
        return Err(invalid(
            "kernel",
            format!(
                "the dilated {kernel_h}x{kernel_w} window (dilation {:?}) is larger than the padded {}x{} input",
                params.dilation,
                height + 2 * params.padding[0],
                width + 2 * params.padding[1]
            ),
        ));
    };
    if !shape.fits_index_limits() {
        return Err(too_large());
    }
    let problem = ConvProblem::new(&shape);
    Ok((problem, vec![batch, out_channels, out_h as usize, out_w as usize]))
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

fn address(array: &DeviceArray<f32>) -> u64 {
    array.buffer.as_device_ptr().as_raw()
}

impl Gpu {
    /// `conv2d(x, w) + bias` for x `[batch, in_channels, h, w]` and w `[out_channels,
    /// in_channels / groups, kh, kw]`; bias, when given, is `[out_channels]`.
    pub fn conv2d(
        &self,
        x: &DeviceArray<f32>,
        w: &DeviceArray<f32>,
        bias: Option<&DeviceArray<f32>>,
        params: &Conv2dParams,
    ) -> Result<DeviceArray<f32>> {
        let (_, y_shape) = conv2d_problem(x.shape(), w.shape(), params)?;
        let mut y = self.alloc(&y_shape)?;
        self.conv2d_into(x, w, bias, params, &mut y)?;
        Ok(y)
    }

    /// [`Gpu::conv2d`] into an existing y of the output's shape (every element is
    /// written).
    pub fn conv2d_into(
        &self,
        x: &DeviceArray<f32>,
        w: &DeviceArray<f32>,
        bias: Option<&DeviceArray<f32>>,
        params: &Conv2dParams,
        y: &mut DeviceArray<f32>,
    ) -> Result<()> {
        let (problem, y_shape) = conv2d_problem(x.shape(), w.shape(), params)?;
        if let Some(b) = bias {
            expect_shape("the bias (against w)", vec![w.shape()[0]], b.shape())?;
        }
        expect_shape("the output y (against conv2d(x, w))", y_shape, y.shape())?;
        if y.is_empty() {
            return Ok(());
        }
        let bias_ptr = bias.map_or(0, address);
        let (x_ptr, w_ptr, y_ptr) = (address(x), address(w), address(y));
        match self.algorithm(&problem, ConvPass::Forward) {
            ConvAlgorithm::Winograd(winograd) => self.winograd(&winograd, x_ptr, w_ptr, bias_ptr, y_ptr),
            ConvAlgorithm::ImplicitGemm(plan) => {
                let mut args = kernel_args![x_ptr, w_ptr, bias_ptr, y_ptr, problem, plan];
                // SAFETY: matches conv_forward_f32(x, w, bias, y, problem, plan): x, w,
                // bias and y have the shapes the problem was validated from (bias null
                // when absent); the grid is the plan's.
                unsafe {
                    self.launch(
                        policy::kernel_name(ConvKernel::Forward),
                        &gemm_config(&plan),
                        &mut args,
                    )
                }
            }
        }
    }

    /// [`Gpu::conv2d`] of host arrays or views: uploads, convolves, downloads.
    pub fn conv2d_of<S1, S2, S3, D1, D2, D3>(
        &self,
        x: &ArrayBase<S1, D1>,
        w: &ArrayBase<S2, D2>,
        bias: Option<&ArrayBase<S3, D3>>,
        params: &Conv2dParams,
    ) -> Result<ArrayD<f32>>
    where
        S1: Data<Elem = f32>,
        S2: Data<Elem = f32>,
        S3: Data<Elem = f32>,
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
    pub fn conv2d_backward(
        &self,
        x: &DeviceArray<f32>,
        w: &DeviceArray<f32>,
        grad_y: &DeviceArray<f32>,
        params: &Conv2dParams,
        which: ConvGradients,
    ) -> Result<ConvGradientArrays<DeviceArray<f32>>> {
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
    /// shapes); each one present is computed, every element written.
    pub fn conv2d_backward_into(
        &self,
        x: &DeviceArray<f32>,
        w: &DeviceArray<f32>,
        grad_y: &DeviceArray<f32>,
        params: &Conv2dParams,
        gradients: ConvGradientArrays<&mut DeviceArray<f32>>,
    ) -> Result<()> {
        let (problem, y_shape) = conv2d_problem(x.shape(), w.shape(), params)?;
        expect_shape(
            "the output gradient grad_y (against conv2d(x, w))",
            y_shape,
            grad_y.shape(),
        )?;
        let (input, weight, bias) = gradients;
        let checks = [
            (&input, "the input gradient (against x)", x.shape()),
            (&weight, "the weight gradient (against w)", w.shape()),
            (&bias, "the bias gradient (against w)", &w.shape()[..1]),
        ];
        for (gradient, what, shape) in checks {
            if let Some(g) = gradient {
                expect_shape(what, shape.to_vec(), g.shape())?;
            }
        }
        if let Some(dx) = input {
            self.input_grad(&problem, grad_y, w, dx)?;
        }
        if let Some(dw) = weight {
            self.weight_grad(&problem, x, grad_y, dw)?;
        }
        if let Some(db) = bias {
            self.bias_grad(&problem, grad_y, db)?;
        }
        Ok(())
    }

    /// [`Gpu::conv2d_backward`] of host arrays or views.
    pub fn conv2d_backward_of<S1, S2, S3, D1, D2, D3>(
        &self,
        x: &ArrayBase<S1, D1>,
        w: &ArrayBase<S2, D2>,
        grad_y: &ArrayBase<S3, D3>,
        params: &Conv2dParams,
        which: ConvGradients,
    ) -> Result<ConvGradientArrays<ArrayD<f32>>>
    where
        S1: Data<Elem = f32>,
        S2: Data<Elem = f32>,
        S3: Data<Elem = f32>,
        D1: Dimension,
        D2: Dimension,
        D3: Dimension,
    {
        conv2d_problem(x.shape(), w.shape(), params)?;
        let (x, w, grad_y) = (self.upload(x)?, self.upload(w)?, self.upload(grad_y)?);
        let (gx, gw, gb) = self.conv2d_backward(&x, &w, &grad_y, params, which)?;
        let download = |a: Option<DeviceArray<f32>>| a.map(|a| self.download(&a)).transpose();
        Ok((download(gx)?, download(gw)?, download(gb)?))
    }

    fn algorithm(&self, problem: &ConvProblem, pass: ConvPass) -> ConvAlgorithm {
        let algorithm = policy::algorithm(problem, pass, self.info().multiprocessors);
        log::debug!("conv2d {pass:?} {problem:?}: {algorithm:?}");
        algorithm
    }

    /// Transforms the weights into the scratch buffer, then runs the Winograd pass.
    fn winograd(&self, problem: &WinogradProblem, input: u64, w: u64, bias: u64, output: u64) -> Result<()> {
        let (_scratch, u) = self.scratch(problem.filter_len() as usize * size_of::<f32>())?;
        let threads = problem.filter_len() / 16;
        let config = LaunchConfig::linear(threads.div_ceil(FILTER_THREADS as u64), FILTER_THREADS);
        let mut args = kernel_args![w, u, *problem];
        // SAFETY: matches conv_winograd_filter_f32(w, u, problem): w holds the validated
        // weights, the scratch filter_len floats; the grid covers filter_len / 16.
        unsafe {
            self.launch(
                policy::kernel_name(ConvKernel::WinogradFilter),
                &config,
                &mut args,
            )?
        };
        let config = LaunchConfig {
            grid: [problem.blocks(), problem.groups as u64, 1],
            block: [WINOGRAD_THREADS, 1, 1],
            shared_bytes: WINOGRAD_SHARED_BYTES,
        };
        let mut args = kernel_args![input, u, bias, output, *problem];
        // SAFETY: matches conv_winograd_f32(input, u, bias, output, problem): the
        // tensors have the problem's shapes (bias null or out_channels floats), U was
        // written just before in stream order; the grid is the problem's blocks.
        unsafe { self.launch(policy::kernel_name(ConvKernel::Winograd), &config, &mut args) }
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
        let (dy_ptr, w_ptr, dx_ptr) = (address(grad_y), address(w), address(dx));
        match self.algorithm(problem, ConvPass::InputGrad) {
            ConvAlgorithm::Winograd(winograd) => self.winograd(&winograd, dy_ptr, w_ptr, 0, dx_ptr),
            ConvAlgorithm::ImplicitGemm(plan) => {
                let mut args = kernel_args![dy_ptr, w_ptr, dx_ptr, *problem, plan];
                // SAFETY: matches conv_input_grad_f32(dy, w, dx, problem, plan): the
                // shapes are the validated problem's; the grid is the plan's.
                unsafe {
                    self.launch(
                        policy::kernel_name(ConvKernel::InputGrad),
                        &gemm_config(&plan),
                        &mut args,
                    )
                }
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
            self.bind()?;
            return crate::driver::memset_bytes(dw, 0, self.stream());
        }
        let (x_ptr, dy_ptr, dw_ptr) = (address(x), address(grad_y), address(dw));
        match self.algorithm(problem, ConvPass::WeightGrad) {
            ConvAlgorithm::Winograd(winograd) => self.winograd_weight_grad(&winograd, x_ptr, dy_ptr, dw_ptr),
            ConvAlgorithm::ImplicitGemm(plan) => self.gemm_weight_grad(problem, plan, x_ptr, dy_ptr, dw_ptr),
        }
    }

    fn gemm_weight_grad(
        &self,
        problem: &ConvProblem,
        plan: GemmPlan,
        x: u64,
        dy: u64,
        dw: u64,
    ) -> Result<()> {
        let (m, n, _) = problem.gemm(ConvPass::WeightGrad);
        let count = m * n * problem.groups as u64;
        let (_scratch, partials) = self.scratch(if plan.split > 1 {
            plan.split as usize * count as usize * size_of::<f32>()
        } else {
            0
        })?;
        let out = if plan.split > 1 { partials } else { dw };
        let mut args = kernel_args![x, dy, out, *problem, plan];
        // SAFETY: matches conv_weight_grad_f32(x, dy, out, problem, plan): shapes as
        // validated; `out` holds split * |dw| floats (the scratch when split > 1).
        unsafe {
            self.launch(
                policy::kernel_name(ConvKernel::WeightGrad),
                &gemm_config(&plan),
                &mut args,
            )?
        };
        if plan.split > 1 {
            let config = LaunchConfig::linear(count.div_ceil(REDUCE_THREADS as u64), REDUCE_THREADS);
            let mut args = kernel_args![partials, dw, count, plan.split];
            // SAFETY: matches conv_split_sum_f32(partials, out, count, split): the
            // scratch holds split * count partials, dw count floats.
            unsafe { self.launch(policy::kernel_name(ConvKernel::SplitSum), &config, &mut args)? };
        }
        Ok(())
    }

    fn winograd_weight_grad(&self, problem: &WinogradProblem, x: u64, dy: u64, dw: u64) -> Result<()> {
        let split = WinogradSplit::new(problem, self.info().multiprocessors);
        log::debug!("conv2d weight gradient: Winograd {split:?}");
        let (_scratch, partials) =
            self.scratch(split.split as usize * problem.filter_len() as usize * size_of::<f32>())?;
        let config = LaunchConfig {
            grid: [split.blocks(problem), problem.groups as u64, 1],
            block: [WINOGRAD_THREADS, 1, 1],
            shared_bytes: WINOGRAD_SHARED_BYTES,
        };
        let mut args = kernel_args![x, dy, partials, *problem, split];
        // SAFETY: matches conv_winograd_weight_grad_f32(x, dy, partials, problem, split):
        // x and dy have the problem's shapes, the scratch holds split * filter_len
        // floats; the grid is the split's blocks by groups.
        unsafe {
            self.launch(
                policy::kernel_name(ConvKernel::WinogradWeightGrad),
                &config,
                &mut args,
            )?
        };
        let threads = problem.out_channels as u64 * problem.in_per_group() as u64;
        let config = LaunchConfig::linear(threads.div_ceil(FILTER_THREADS as u64), FILTER_THREADS);
        let mut args = kernel_args![partials, dw, *problem, split.split];
        // SAFETY: matches conv_winograd_weight_grad_finish_f32(partials, dw, problem,
        // split): the scratch holds what the launch above wrote, dw the weight gradient;
        // the grid covers one thread per (out channel, in channel).
        unsafe {
            self.launch(
                policy::kernel_name(ConvKernel::WinogradWeightGradFinish),
                &config,
                &mut args,
            )
        }
    }

    fn bias_grad(
        &self,
        problem: &ConvProblem,
        grad_y: &DeviceArray<f32>,
        db: &mut DeviceArray<f32>,
    ) -> Result<()> {
        let config = LaunchConfig {
            shared_bytes: REDUCE_THREADS / 32 * 8,
            ..LaunchConfig::linear(problem.out_channels as u64, REDUCE_THREADS)
        };
        let (dy_ptr, db_ptr) = (address(grad_y), address(db));
        let mut args = kernel_args![dy_ptr, db_ptr, *problem];
        // SAFETY: matches conv_bias_grad_f32(dy, db, problem): dy has the problem's
        // output shape, db out_channels floats; one block per channel with the shared
        // memory the kernel reduces through.
        unsafe { self.launch(policy::kernel_name(ConvKernel::BiasGrad), &config, &mut args) }
    }
}

fn gemm_config(plan: &GemmPlan) -> LaunchConfig {
    LaunchConfig {
        grid: [plan.blocks(), plan.groups as u64, 1],
        block: [GEMM_THREADS, 1, 1],
        shared_bytes: GEMM_SHARED_BYTES,
    }
}
