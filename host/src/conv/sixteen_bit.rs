//! The passes of bf16 and f16 convolutions on kernels of their own operands, where
//! those take the problem: the forward pass on row strips or im2col boxes, K split or
//! not (a bias, ReLU or neither; NCHW x and w changed to NHWC first, y written in its
//! layout); in NHWC, the input gradient as that forward pass of dy by the flipped
//! weights (at stride 1, or where strided as the phases' one forward pass, else over
//! dy upsampled) or, where a window narrower than the stride leaves phases without
//! taps, by phases (as the TF32 path chooses), and the
//! weight gradient on `wgmma`; the bias gradient in any layout. Each reads the 16-bit
//! tensors as they are and rounds its output once (a phase's outputs are dx's).
//! Depthwise convolutions run on the stencil where the TF32 path does (the forward pass
//! without a residual, the stride-1 input gradient, the weight gradient of 3 x 3 and 5 x
//! 5 windows), reading 16-bit tensors in either layout. The three passes of NHWC
//! convolutions with few input channels (a stem's 3) run on kernels of their own,
//! which stage each tile's patch of x or dy in shared memory.

use gpu_kernels::conv::few_channels::FewChannelsKernel;
use gpu_kernels::conv::few_channels_input_grad::FewChannelsInputGradKernel;
use gpu_kernels::conv::few_channels_weight_grad::FewChannelsWeightGradKernel;
use gpu_kernels::conv::reduce::{self, BiasGradKernels, BiasGradPlan, SplitSumArgs, SplitSumKernel};
use gpu_kernels::conv::stencil::{StencilKernels, StencilWeightGradKernels};
use gpu_kernels::conv::tensor_core::{ForwardScratch, TensorCoreOperand};
use gpu_kernels::conv::{
    self as kernel, Activation, ConvAlgorithm, ConvEpilogue, ConvLayout, ConvPass, ConvPrecision,
    ConvProblem, FewChannelsInputGradPlan, FewChannelsPlan, FewChannelsWeightGradPlan, PhasePlan,
    StencilPlan, SubPixelPlan, TensorCorePlan, WarpgroupWeightGradPlan, phases, transposed,
};
use gpu_kernels::launch::{DevicePtr, DevicePtrMut, KernelArgs, Launch, ScratchLayout};
use gpu_kernels::tensor_map::TensorMapPair;

use super::{Conv2dParams, ConvElement, ConvGradientArrays, kernel_problem};
use crate::array::DeviceArray;
use crate::error::Result;
use crate::gpu::Gpu;

/// The plans of the kernels of 16-bit operands that a convolution takes, each `None`
/// where that pass runs in TF32 over f32 copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SixteenBitPlans {
    /// The forward pass (without a residual).
    pub forward: Option<SixteenBitForward>,
    pub input_grad: Option<SixteenBitInputGrad>,
    pub weight_grad: Option<SixteenBitWeightGrad>,
}

/// How the weight gradient of tensors of a 16-bit operand runs on kernels of its
/// operands, summed in f32 and rounded once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SixteenBitWeightGrad {
    /// On `wgmma` over NHWC tensors.
    Warpgroup(WarpgroupWeightGradPlan),
    /// On the depthwise stencil (3 x 3 and 5 x 5 windows), tensors of this operand.
    Stencil(StencilPlan, TensorCoreOperand),
    /// On the few-channel kernel (NHWC, a stem's few input channels), tensors of this
    /// operand.
    FewChannels(FewChannelsWeightGradPlan, TensorCoreOperand),
}

impl SixteenBitWeightGrad {
    /// The tensors' type.
    pub const fn operand(&self) -> TensorCoreOperand {
        match self {
            Self::Warpgroup(plan) => plan.operand,
            Self::Stencil(_, operand) | Self::FewChannels(_, operand) => *operand,
        }
    }
}

/// How the forward pass of tensors of a 16-bit operand runs on kernels of its operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SixteenBitForward {
    /// On the tensor cores ([`TensorCorePlan::forward_16_bit`]).
    TensorCore(TensorCorePlan),
    /// On the depthwise stencil, tensors of this operand.
    Stencil(StencilPlan, TensorCoreOperand),
    /// On the few-channel kernel (NHWC, a stem's few input channels), tensors of this
    /// operand.
    FewChannels(FewChannelsPlan, TensorCoreOperand),
}

impl SixteenBitForward {
    /// The tensors' type.
    pub const fn operand(&self) -> TensorCoreOperand {
        match self {
            Self::TensorCore(plan) => plan.operand,
            Self::Stencil(_, operand) | Self::FewChannels(_, operand) => *operand,
        }
    }
}

/// How the input gradient of tensors of a 16-bit operand runs on kernels of its
/// operands (NHWC on the tensor cores, either layout on the stencil).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SixteenBitInputGrad {
    /// The forward pass of [`ConvProblem::input_grad_as_forward`] (over dy upsampled
    /// where strided) by this plan.
    AsForward(TensorCorePlan),
    /// By phases, each phase with taps a forward pass of the operand (their plans
    /// [`TensorCorePlan::forward_16_bit`] of the phase's problem).
    Phases(PhasePlan, TensorCoreOperand),
    /// As the phases' one forward pass, their outputs shuffled into dx.
    SubPixel(SubPixelPlan),
    /// On the depthwise stencil (stride 1), tensors of this operand.
    Stencil(StencilPlan, TensorCoreOperand),
    /// On the few-channel kernel (NHWC, a stem's few input channels), tensors of this
    /// operand.
    FewChannels(FewChannelsInputGradPlan, TensorCoreOperand),
}

impl SixteenBitInputGrad {
    /// The operands' type of its forward passes.
    pub const fn operand(&self) -> TensorCoreOperand {
        match self {
            Self::AsForward(plan) => plan.operand,
            Self::SubPixel(plan) => plan.forward.operand,
            Self::Phases(_, operand) | Self::Stencil(_, operand) | Self::FewChannels(_, operand) => *operand,
        }
    }
}

impl Gpu {
    /// The depthwise stencil's plan of `pass` over tensors in `layout`, where the TF32
    /// path takes it.
    fn own_stencil_plan(
        &self,
        problem: &ConvProblem,
        pass: ConvPass,
        layout: ConvLayout,
    ) -> Option<StencilPlan> {
        match kernel::algorithm(problem, pass, ConvPrecision::Tf32, layout, &self.limits()) {
            ConvAlgorithm::Stencil(plan) => Some(plan),
            _ => None,
        }
    }

    /// The plan of the forward pass of tensors of the 16-bit `operand` on a kernel of
    /// its own operands, where one takes the problem (with a residual or not): the
    /// depthwise stencil or the few-channel kernel (any activation, no residual), or
    /// the tensor cores (a bias, ReLU or neither).
    fn own_forward_plan(
        &self,
        problem: &ConvProblem,
        params: &Conv2dParams,
        operand: TensorCoreOperand,
        residual: bool,
    ) -> Option<SixteenBitForward> {
        if residual {
            return None;
        }
        if let Some(plan) = self.own_stencil_plan(problem, ConvPass::Forward, params.layout) {
            return Some(SixteenBitForward::Stencil(plan, operand));
        }
        if let Some(plan) = FewChannelsPlan::new(problem, params.layout, &self.limits(), 2) {
            log::debug!("conv2d Forward {operand:?} Nhwc {problem:?}: {plan:?}");
            return Some(SixteenBitForward::FewChannels(plan, operand));
        }
        let registers = matches!(params.activation, Activation::Identity | Activation::Relu);
        if !registers {
            return None;
        }
        let plan = TensorCorePlan::forward_16_bit(problem, operand, params.layout, &self.limits());
        log::debug!(
            "conv2d Forward {operand:?} {:?} {problem:?}: {plan:?}",
            params.layout
        );
        plan.map(SixteenBitForward::TensorCore)
    }

    /// The plan of the input gradient of NHWC tensors of `operand`: on the few-channel
    /// kernel where it takes the problem, else where the TF32 path runs it on the tensor
    /// cores (not on the direct kernels, which serve few input channels): by phases where
    /// that path takes them and each phase's forward pass has a plan, as the phases' one
    /// forward pass where it takes that and the operand's plan, else the forward plan of
    /// its transposed problem.
    fn own_input_grad_plan(
        &self,
        problem: &ConvProblem,
        params: &Conv2dParams,
        operand: TensorCoreOperand,
    ) -> Option<SixteenBitInputGrad> {
        if let Some(plan) = self.own_stencil_plan(problem, ConvPass::InputGrad, params.layout) {
            return Some(SixteenBitInputGrad::Stencil(plan, operand));
        }
        if let Some(plan) = FewChannelsInputGradPlan::new(problem, params.layout, &self.limits()) {
            log::debug!("conv2d InputGrad {operand:?} Nhwc {problem:?}: {plan:?}");
            return Some(SixteenBitInputGrad::FewChannels(plan, operand));
        }
        if params.layout != ConvLayout::Nhwc {
            return None;
        }
        let limits = self.limits();
        let forward = |p: &ConvProblem| TensorCorePlan::forward_16_bit(p, operand, ConvLayout::Nhwc, &limits);
        let tf32 = kernel::algorithm(
            problem,
            ConvPass::InputGrad,
            ConvPrecision::Tf32,
            ConvLayout::Nhwc,
            &limits,
        );
        let plan = match tf32 {
            ConvAlgorithm::Phases(phases) => (0..phases.phases())
                .all(|q| {
                    phases
                        .phase(problem, q)
                        .is_none_or(|phase| forward(&phase).is_some())
                })
                .then_some(SixteenBitInputGrad::Phases(phases, operand)),
            ConvAlgorithm::SubPixel(_) => SubPixelPlan::of(problem, ConvLayout::Nhwc, operand, &limits)
                .map(SixteenBitInputGrad::SubPixel),
            ConvAlgorithm::TensorCore(_) => problem
                .input_grad_as_forward()
                .and_then(|transposed| forward(&transposed))
                .map(SixteenBitInputGrad::AsForward),
            _ => None,
        };
        log::debug!("conv2d InputGrad {operand:?} Nhwc {problem:?}: {plan:?}");
        plan
    }

    /// The plan of the weight gradient of tensors of `operand`: the depthwise stencil
    /// where the TF32 path takes it (either layout), the few-channel kernel where it
    /// takes the problem, else `wgmma` over NHWC tensors.
    fn own_weight_grad_plan(
        &self,
        problem: &ConvProblem,
        params: &Conv2dParams,
        operand: TensorCoreOperand,
    ) -> Option<SixteenBitWeightGrad> {
        let stencil = self.own_stencil_plan(problem, ConvPass::WeightGrad, params.layout);
        if let Some(plan) = stencil.filter(|_| problem.batch > 0) {
            return Some(SixteenBitWeightGrad::Stencil(plan, operand));
        }
        if let Some(plan) = FewChannelsWeightGradPlan::new(problem, params.layout, &self.limits()) {
            log::debug!("conv2d WeightGrad {operand:?} Nhwc {problem:?}: {plan:?}");
            return Some(SixteenBitWeightGrad::FewChannels(plan, operand));
        }
        if params.layout != ConvLayout::Nhwc {
            return None;
        }
        let plan = WarpgroupWeightGradPlan::of_16_bit(problem, operand, &self.limits());
        log::debug!("conv2d WeightGrad {operand:?} Nhwc {problem:?}: {plan:?}");
        plan.map(SixteenBitWeightGrad::Warpgroup)
    }

    /// The plans [`Gpu::conv2d`] (without a residual) and [`Gpu::conv2d_backward`]
    /// take for tensors of the 16-bit `operand` on kernels of their own operands.
    pub fn conv2d_16_bit_plans(
        &self,
        x_shape: &[usize],
        w_shape: &[usize],
        params: &Conv2dParams,
        operand: TensorCoreOperand,
    ) -> Result<SixteenBitPlans> {
        let (problem, _) = kernel_problem(x_shape, w_shape, params)?;
        Ok(SixteenBitPlans {
            forward: self.own_forward_plan(&problem, params, operand, false),
            input_grad: self.own_input_grad_plan(&problem, params, operand),
            weight_grad: self.own_weight_grad_plan(&problem, params, operand),
        })
    }

    /// The forward pass of a validated problem (y not empty) over tensors of the 16-bit
    /// `operand`, on the kernel of its own operands where its plan takes the problem
    /// and the epilogue is a bias, ReLU or neither; `Ok(false)` elsewhere. NCHW x and w
    /// go to NHWC copies first.
    pub(super) fn forward_16_bit<T: ConvElement + StencilKernels + FewChannelsKernel>(
        &self,
        problem: &ConvProblem,
        params: &Conv2dParams,
        operand: TensorCoreOperand,
        [x, w]: [&DeviceArray<T>; 2],
        [bias, residual]: [Option<&DeviceArray<T>>; 2],
        y: &mut DeviceArray<T>,
    ) -> Result<bool> {
        let Some(plan) = self.own_forward_plan(problem, params, operand, residual.is_some()) else {
            return Ok(false);
        };
        // The bias as the epilogue reads it: f32.
        let bias = bias.map(|b| T::as_f32(self, b)).transpose()?;
        let bias = bias.as_deref().map_or(DevicePtr::NULL, DeviceArray::ptr);
        let epilogue = ConvEpilogue::new(bias, params.activation, DevicePtr::NULL);
        let plan = match plan {
            SixteenBitForward::TensorCore(plan) => plan,
            SixteenBitForward::Stencil(stencil, _) => {
                // The filter as the stencil reads it: f32.
                let w = T::as_f32(self, w)?;
                self.launch(&stencil.launch(x.ptr(), w.ptr(), epilogue, y.ptr_mut()))?;
                return Ok(true);
            }
            SixteenBitForward::FewChannels(plan, _) => {
                // y is stored in 4-byte pairs.
                if !y.ptr().address().is_multiple_of(4) {
                    return Ok(false);
                }
                self.launch(&plan.launch(x.ptr(), w.ptr(), epilogue, y.ptr_mut()))?;
                return Ok(true);
            }
        };
        let (mut x_copy, mut w_copy) = (None, None);
        let x = self.as_layout(x, params.layout, ConvLayout::Nhwc, &mut x_copy)?;
        let w = self.as_layout(w, params.layout, ConvLayout::Nhwc, &mut w_copy)?;
        self.bulk_16_bit(
            problem,
            plan,
            [x.ptr().cast(), w.ptr().cast()],
            epilogue,
            y.ptr_mut().cast(),
        )
    }

    /// The forward pass of `problem` by its 16-bit `plan` (x, w and y of its operand,
    /// seen as f32 pointers), split or not; `Ok(false)` where the tensor maps cannot
    /// describe them.
    fn bulk_16_bit(
        &self,
        problem: &ConvProblem,
        plan: TensorCorePlan,
        [x, w]: [DevicePtr<f32>; 2],
        epilogue: ConvEpilogue,
        y: DevicePtrMut<f32>,
    ) -> Result<bool> {
        // The tensor maps, then the parts' f32 sums where K is split.
        let map_bytes = size_of::<TensorMapPair>() as u64;
        let (_scratch, start) = self.scratch(ScratchLayout {
            bytes: map_bytes + plan.partials_scratch(problem).bytes,
            zeroed: 0,
        })?;
        let Some(specs) = plan.tensor_maps(problem, x, w) else {
            return Ok(false);
        };
        let scratch = ForwardScratch {
            maps: self.write_tensor_maps(&specs, start.cast())?,
            partials: start.offset(map_bytes),
        };
        let (gemm, finish) = plan.forward_launches(problem, x, w, epilogue, y, scratch);
        self.launch(&gemm)?;
        if let Some(finish) = finish {
            self.launch(&finish)?;
        }
        Ok(true)
    }

    /// The gradients of a validated problem over tensors of the 16-bit `operand` (`[x,
    /// w, grad_y]`) that kernels of their own operands take; the others back.
    pub(super) fn backward_16_bit<'a, T>(
        &self,
        problem: &ConvProblem,
        params: &Conv2dParams,
        operand: TensorCoreOperand,
        [x, w, grad_y]: [&DeviceArray<T>; 3],
        (input, weight, bias): ConvGradientArrays<&'a mut DeviceArray<T>>,
    ) -> Result<ConvGradientArrays<&'a mut DeviceArray<T>>>
    where
        T: ConvElement
            + BiasGradKernels
            + SplitSumKernel
            + StencilKernels
            + StencilWeightGradKernels
            + FewChannelsInputGradKernel
            + FewChannelsWeightGradKernel,
    {
        let input = match input {
            Some(dx) if !dx.is_empty() => {
                let done = self.input_grad_16_bit(problem, params, operand, w, grad_y, dx)?;
                (!done).then_some(dx)
            }
            other => other,
        };
        // The few-channel kernel reads dy 16 bytes at a time.
        let dy_vectors = grad_y.ptr().address().is_multiple_of(16);
        let weight_plan = self
            .own_weight_grad_plan(problem, params, operand)
            .filter(|plan| dy_vectors || !matches!(plan, SixteenBitWeightGrad::FewChannels(..)));
        let weight = match (weight, weight_plan) {
            (Some(dw), Some(plan)) => {
                self.weight_grad_16_bit(problem, &plan, x, grad_y, dw)?;
                None
            }
            (other, _) => other,
        };
        if let Some(db) = bias {
            let plan = BiasGradPlan::new(problem, params.layout, self.info().multiprocessors);
            let (_scratch, scratch) = self.scratch(plan.scratch(problem))?;
            self.reduce_into(db, |db| plan.launches(problem, grad_y.ptr(), scratch, db))?;
        }
        Ok((input, weight, None))
    }

    /// Runs a reduction whose `launches` write f32 sums into `out` of `T`: split, the
    /// sum of the partials writes `T`s itself; else the sums go to an f32 array that is
    /// rounded into `out` after.
    fn reduce_into<T, A>(
        &self,
        out: &mut DeviceArray<T>,
        launches: impl Fn(DevicePtrMut<f32>) -> (Launch<A>, Option<Launch<SplitSumArgs>>),
    ) -> Result<()>
    where
        T: ConvElement + SplitSumKernel,
        A: KernelArgs,
    {
        if let (products, Some(sum)) = launches(out.ptr_mut().cast()) {
            self.launch(&products)?;
            return self.launch(&reduce::split_sum_into::<T>(*sum.arguments()));
        }
        let mut sums = T::f32_output(self, out)?;
        let (products, sum) = launches(sums.array().ptr_mut());
        self.launch(&products)?;
        sum.map_or(Ok(()), |sum| self.launch(&sum))?;
        sums.finish(self)
    }

    /// The input gradient (dx not empty) on the forward kernels of 16-bit operands,
    /// where their plan takes it; `Ok(false)` elsewhere.
    fn input_grad_16_bit<T: ConvElement + StencilKernels + FewChannelsInputGradKernel>(
        &self,
        problem: &ConvProblem,
        params: &Conv2dParams,
        operand: TensorCoreOperand,
        w: &DeviceArray<T>,
        grad_y: &DeviceArray<T>,
        dx: &mut DeviceArray<T>,
    ) -> Result<bool> {
        match self.own_input_grad_plan(problem, params, operand) {
            Some(SixteenBitInputGrad::AsForward(plan)) => {
                self.input_grad_as_forward_16_bit(problem, plan, w, grad_y, dx)
            }
            Some(SixteenBitInputGrad::Phases(plan, operand)) => {
                self.input_grad_by_phases_16_bit(problem, &plan, operand, w, grad_y, dx)
            }
            Some(SixteenBitInputGrad::SubPixel(plan)) => {
                self.input_grad_sub_pixel(problem, &plan, w.ptr(), grad_y.ptr(), dx.ptr_mut())?;
                Ok(true)
            }
            Some(SixteenBitInputGrad::Stencil(stencil, _)) => {
                // The stencil flips the filter, which it reads as f32.
                let w = T::as_f32(self, w)?;
                self.launch(&stencil.launch(grad_y.ptr(), w.ptr(), ConvEpilogue::NONE, dx.ptr_mut()))?;
                Ok(true)
            }
            // dy is read 16 bytes at a time.
            Some(SixteenBitInputGrad::FewChannels(plan, _)) if grad_y.ptr().address().is_multiple_of(16) => {
                self.launch(&plan.launch(grad_y.ptr(), w.ptr(), dx.ptr_mut()))?;
                Ok(true)
            }
            Some(SixteenBitInputGrad::FewChannels(..)) | None => Ok(false),
        }
    }

    /// The input gradient as the forward pass by `plan` of dy (upsampled where
    /// strided) by the flipped weights; `Ok(false)` where the flip or the tensor maps
    /// cannot take it.
    fn input_grad_as_forward_16_bit<T: ConvElement>(
        &self,
        problem: &ConvProblem,
        plan: TensorCorePlan,
        w: &DeviceArray<T>,
        grad_y: &DeviceArray<T>,
        dx: &mut DeviceArray<T>,
    ) -> Result<bool> {
        let Some(transposed) = problem.input_grad_as_forward() else {
            return Ok(false);
        };
        let mut flipped = self.temporary::<T>(w.shape())?;
        let Some(flip) = transposed::flip_filters_16_bit(problem, w.ptr().cast(), flipped.ptr_mut().cast())
        else {
            return Ok(false);
        };
        self.launch(&flip)?;
        let mut up = None;
        let dy = if transposed::upsampled(problem) {
            let [n, c, h, w] = transposed.input_shape().map(|d| d as usize);
            let up = up.insert(self.temporary::<T>(&[n, h, w, c])?);
            let dy = grad_y.ptr().cast::<u16>();
            let layout = ConvLayout::Nhwc;
            self.launch(&transposed::upsample(
                problem,
                &transposed,
                layout,
                dy,
                up.ptr_mut().cast(),
            ))?;
            up.ptr()
        } else {
            grad_y.ptr()
        };
        let operands = [dy.cast(), flipped.ptr().cast()];
        self.bulk_16_bit(
            &transposed,
            plan,
            operands,
            ConvEpilogue::NONE,
            dx.ptr_mut().cast(),
        )
    }

    /// The input gradient by `plan`'s phases: each phase with taps a forward pass of
    /// dy by its gathered weights into its slot, dx interleaved from them; `Ok(false)`
    /// where a phase's tensor maps cannot take it.
    fn input_grad_by_phases_16_bit<T: ConvElement>(
        &self,
        problem: &ConvProblem,
        plan: &PhasePlan,
        operand: TensorCoreOperand,
        w: &DeviceArray<T>,
        grad_y: &DeviceArray<T>,
        dx: &mut DeviceArray<T>,
    ) -> Result<bool> {
        let (layout, limits) = (ConvLayout::Nhwc, self.limits());
        let mut outputs = self.temporary::<T>(&[plan.outputs_len() as usize])?;
        for q in 0..plan.phases() {
            let Some(phase) = plan.phase(problem, q) else {
                continue;
            };
            let Some(forward) = TensorCorePlan::forward_16_bit(&phase, operand, layout, &limits) else {
                return Ok(false);
            };
            let mut filters = self.temporary::<T>(&[phase.weight_count() as usize])?;
            let (w, gathered) = (w.ptr().cast::<u16>(), filters.ptr_mut().cast::<u16>());
            self.launch(&phases::phase_filters(
                problem, plan, q, &phase, layout, w, gathered,
            ))?;
            let slot = outputs.ptr_mut().offset(q as u64 * plan.slot_len);
            let operands = [grad_y.ptr().cast(), filters.ptr().cast()];
            if !self.bulk_16_bit(&phase, forward, operands, ConvEpilogue::NONE, slot.cast())? {
                return Ok(false);
            }
        }
        let interleave = phases::interleave::<u16>(problem, plan, outputs.ptr().cast(), dx.ptr_mut().cast());
        self.launch(&interleave)?;
        Ok(true)
    }

    /// The weight gradient by its 16-bit `plan`, summed in f32 and rounded once into
    /// `dw` (the problem has at least one image).
    fn weight_grad_16_bit<T>(
        &self,
        problem: &ConvProblem,
        plan: &SixteenBitWeightGrad,
        x: &DeviceArray<T>,
        grad_y: &DeviceArray<T>,
        dw: &mut DeviceArray<T>,
    ) -> Result<()>
    where
        T: ConvElement + SplitSumKernel + StencilWeightGradKernels + FewChannelsWeightGradKernel,
    {
        // Each scratch lives until its sum is launched.
        match plan {
            SixteenBitWeightGrad::Warpgroup(plan) => {
                let (_scratch, scratch) = self.scratch(plan.scratch(problem))?;
                let specs = plan.tensor_maps(problem, x.ptr().cast(), grad_y.ptr().cast());
                let maps = self.write_tensor_maps(&specs, plan.maps_at(problem, scratch))?;
                self.reduce_into(dw, |dw| plan.launches(problem, maps, scratch, dw))
            }
            SixteenBitWeightGrad::Stencil(plan, _) => {
                let (_scratch, partials) = self.scratch(plan.weight_grad_scratch())?;
                self.reduce_into(dw, |dw| {
                    plan.weight_grad_launches(x.ptr(), grad_y.ptr(), partials, dw)
                })
            }
            SixteenBitWeightGrad::FewChannels(plan, _) => {
                let (_scratch, partials) = self.scratch(plan.scratch())?;
                self.reduce_into(dw, |dw| plan.launches(x.ptr(), grad_y.ptr(), partials, dw))
            }
        }
    }
}
