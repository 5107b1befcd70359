//! The passes of bf16 and f16 convolutions on kernels of their own operands, where
//! those take the problem: the forward pass on row strips or im2col boxes, K split or
//! not (a bias, ReLU or neither; NCHW x and w changed to NHWC first, y written in its
//! layout); in NHWC, the stride-1 input gradient as that forward pass of dy by the
//! flipped weights, and the weight gradient on `wgmma`; the bias gradient in any
//! layout. Each reads the 16-bit tensors as they are and rounds its output once.

use gpu_kernels::conv::reduce::{BiasGradKernels, BiasGradPlan};
use gpu_kernels::conv::tensor_core::{ForwardScratch, TensorCoreOperand};
use gpu_kernels::conv::{
    Activation, ConvEpilogue, ConvLayout, ConvProblem, TensorCorePlan, WarpgroupWeightGradPlan, transposed,
};
use gpu_kernels::launch::{DevicePtr, DevicePtrMut, ScratchLayout};
use gpu_kernels::tensor_map::TensorMapPair;

use super::{Conv2dParams, ConvElement, ConvGradientArrays, conv2d_problem};
use crate::array::DeviceArray;
use crate::error::Result;
use crate::gpu::Gpu;

/// The plans of the kernels of 16-bit operands that a convolution takes, each `None`
/// where that pass runs in TF32 over f32 copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SixteenBitPlans {
    /// The forward pass (without a residual).
    pub forward: Option<TensorCorePlan>,
    /// The input gradient: the forward plan of
    /// [`ConvProblem::input_grad_as_forward`].
    pub input_grad: Option<TensorCorePlan>,
    pub weight_grad: Option<WarpgroupWeightGradPlan>,
}

impl Gpu {
    /// The plan of the forward pass of tensors of the 16-bit `operand` on the kernel of
    /// its own operands, where it takes the problem (with a residual or not) and the
    /// epilogue is a bias, ReLU or neither.
    fn own_forward_plan(
        &self,
        problem: &ConvProblem,
        params: &Conv2dParams,
        operand: TensorCoreOperand,
        residual: bool,
    ) -> Option<TensorCorePlan> {
        let registers = !residual && matches!(params.activation, Activation::Identity | Activation::Relu);
        if !registers {
            return None;
        }
        let plan = TensorCorePlan::forward_16_bit(problem, operand, params.layout, &self.limits());
        log::debug!(
            "conv2d Forward {operand:?} {:?} {problem:?}: {plan:?}",
            params.layout
        );
        plan
    }

    /// The plan of the input gradient of NHWC tensors of `operand`: the forward plan of
    /// its stride-1 transposed problem.
    fn own_input_grad_plan(
        &self,
        problem: &ConvProblem,
        params: &Conv2dParams,
        operand: TensorCoreOperand,
    ) -> Option<(ConvProblem, TensorCorePlan)> {
        let transposed = problem.input_grad_as_forward()?;
        if params.layout != ConvLayout::Nhwc || transposed::upsampled(problem) {
            return None;
        }
        let plan = TensorCorePlan::forward_16_bit(&transposed, operand, ConvLayout::Nhwc, &self.limits());
        log::debug!("conv2d InputGrad {operand:?} Nhwc {problem:?}: {plan:?}");
        Some((transposed, plan?))
    }

    /// The plan of the weight gradient of NHWC tensors of `operand`.
    fn own_weight_grad_plan(
        &self,
        problem: &ConvProblem,
        params: &Conv2dParams,
        operand: TensorCoreOperand,
    ) -> Option<WarpgroupWeightGradPlan> {
        if params.layout != ConvLayout::Nhwc {
            return None;
        }
        let plan = WarpgroupWeightGradPlan::of_16_bit(problem, operand, &self.limits());
        log::debug!("conv2d WeightGrad {operand:?} Nhwc {problem:?}: {plan:?}");
        plan
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
        let (problem, _) = conv2d_problem(x_shape, w_shape, params)?;
        Ok(SixteenBitPlans {
            forward: self.own_forward_plan(&problem, params, operand, false),
            input_grad: self
                .own_input_grad_plan(&problem, params, operand)
                .map(|(_, plan)| plan),
            weight_grad: self.own_weight_grad_plan(&problem, params, operand),
        })
    }

    /// The forward pass of a validated problem (y not empty) over tensors of the 16-bit
    /// `operand`, on the kernel of its own operands where its plan takes the problem
    /// and the epilogue is a bias, ReLU or neither; `Ok(false)` elsewhere. NCHW x and w
    /// go to NHWC copies first.
    pub(super) fn forward_16_bit<T: ConvElement>(
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
    pub(super) fn backward_16_bit<'a, T: ConvElement + BiasGradKernels>(
        &self,
        problem: &ConvProblem,
        params: &Conv2dParams,
        operand: TensorCoreOperand,
        [x, w, grad_y]: [&DeviceArray<T>; 3],
        (input, weight, bias): ConvGradientArrays<&'a mut DeviceArray<T>>,
    ) -> Result<ConvGradientArrays<&'a mut DeviceArray<T>>> {
        let input = match input {
            Some(dx) if !dx.is_empty() => {
                let done = self.input_grad_16_bit(problem, params, operand, w, grad_y, dx)?;
                (!done).then_some(dx)
            }
            other => other,
        };
        let weight = match (weight, self.own_weight_grad_plan(problem, params, operand)) {
            (Some(dw), Some(plan)) => {
                self.weight_grad_16_bit(problem, &plan, x, grad_y, dw)?;
                None
            }
            (other, _) => other,
        };
        if let Some(db) = bias {
            let plan = BiasGradPlan::new(problem, params.layout, self.info().multiprocessors);
            let mut sums = T::f32_output(self, db)?;
            {
                let (_scratch, scratch) = self.scratch(plan.scratch(problem))?;
                let (partials, sum) = plan.launches(problem, grad_y.ptr(), scratch, sums.array().ptr_mut());
                self.launch(&partials)?;
                sum.map_or(Ok(()), |sum| self.launch(&sum))?;
            }
            sums.finish(self)?;
        }
        Ok((input, weight, None))
    }

    /// The input gradient (dx not empty) as the forward pass of dy by the flipped
    /// weights on the kernels of 16-bit operands, where their plan takes it;
    /// `Ok(false)` elsewhere.
    fn input_grad_16_bit<T: ConvElement>(
        &self,
        problem: &ConvProblem,
        params: &Conv2dParams,
        operand: TensorCoreOperand,
        w: &DeviceArray<T>,
        grad_y: &DeviceArray<T>,
        dx: &mut DeviceArray<T>,
    ) -> Result<bool> {
        let Some((transposed, plan)) = self.own_input_grad_plan(problem, params, operand) else {
            return Ok(false);
        };
        let mut flipped = self.temporary::<T>(w.shape())?;
        let Some(flip) = transposed::flip_filters_16_bit(problem, w.ptr().cast(), flipped.ptr_mut().cast())
        else {
            return Ok(false);
        };
        self.launch(&flip)?;
        let operands = [grad_y.ptr().cast(), flipped.ptr().cast()];
        self.bulk_16_bit(
            &transposed,
            plan,
            operands,
            ConvEpilogue::NONE,
            dx.ptr_mut().cast(),
        )
    }

    /// The weight gradient by its 16-bit `plan`, summed in f32 and rounded once into
    /// `dw`.
    fn weight_grad_16_bit<T: ConvElement>(
        &self,
        problem: &ConvProblem,
        plan: &WarpgroupWeightGradPlan,
        x: &DeviceArray<T>,
        grad_y: &DeviceArray<T>,
        dw: &mut DeviceArray<T>,
    ) -> Result<()> {
        let mut sums = T::f32_output(self, dw)?;
        {
            let (_scratch, scratch) = self.scratch(plan.scratch(problem))?;
            let specs = plan.tensor_maps(problem, x.ptr().cast(), grad_y.ptr().cast());
            let maps = self.write_tensor_maps(&specs, plan.maps_at(problem, scratch))?;
            let (products, sum) = plan.launches(problem, maps, scratch, sums.array().ptr_mut());
            self.launch(&products)?;
            sum.map_or(Ok(()), |sum| self.launch(&sum))?;
        }
        sums.finish(self)
    }
}
