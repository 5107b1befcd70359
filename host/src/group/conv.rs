//! Data-parallel convolution: the batch split over the group, the filters replicated.

use super::{GpuGroup, ShardedArray, Sharding};
use crate::array::DeviceArray;
use crate::conv::{Conv2dParams, ConvGradientArrays, ConvGradients, conv2d_problem};
use crate::error::{Error, Result};

impl GpuGroup {
    /// `conv2d(x, w) + bias` (as [`Gpu::conv2d`](crate::Gpu::conv2d)) for x split along
    /// the batch (axis 0) and w and the bias replicated: each device convolves its part
    /// of the batch; y is split as x.
    pub fn conv2d(
        &self,
        x: &ShardedArray<f32>,
        w: &ShardedArray<f32>,
        bias: Option<&ShardedArray<f32>>,
        params: &Conv2dParams,
    ) -> Result<ShardedArray<f32>> {
        self.axis0_lengths(x, "conv2d x")?;
        let (_, y_shape) = conv2d_problem(x.shape(), w.shape(), params)?;
        let ys = (0..self.len())
            .map(|r| {
                let (_, shape) = conv2d_problem(x.parts[r].shape(), w.shape(), params)?;
                self.gpus[r].alloc(&shape)
            })
            .collect::<Result<Vec<_>>>()?;
        let mut y = ShardedArray::new(&y_shape, x.sharding.clone(), ys);
        self.conv2d_into(x, w, bias, params, &mut y)?;
        Ok(y)
    }

    /// [`GpuGroup::conv2d`] into y, split as x along the batch.
    pub fn conv2d_into(
        &self,
        x: &ShardedArray<f32>,
        w: &ShardedArray<f32>,
        bias: Option<&ShardedArray<f32>>,
        params: &Conv2dParams,
        y: &mut ShardedArray<f32>,
    ) -> Result<()> {
        let lengths = self.axis0_lengths(x, "conv2d x")?;
        self.axis0_alike(&lengths, y, "conv2d y")?;
        self.check_replicated(w, "conv2d w")?;
        if let Some(bias) = bias {
            self.check_replicated(bias, "conv2d bias")?;
        }
        for r in 0..self.len() {
            let bias = bias.map(|b| &b.parts[r]);
            self.gpus[r].conv2d_into(&x.parts[r], &w.parts[r], bias, params, &mut y.parts[r])?;
        }
        Ok(())
    }

    /// The gradients of [`GpuGroup::conv2d`] for `grad_y` split as x: each device takes
    /// its part of the batch; the input gradient comes back split as x, and the weight
    /// and bias gradients summed over the devices in rank order (the same on every
    /// device and every run), replicated.
    pub fn conv2d_backward(
        &self,
        x: &ShardedArray<f32>,
        w: &ShardedArray<f32>,
        grad_y: &ShardedArray<f32>,
        params: &Conv2dParams,
        which: ConvGradients,
    ) -> Result<ConvGradientArrays<ShardedArray<f32>>> {
        self.check_parts(x)?;
        conv2d_problem(x.shape(), w.shape(), params)?;
        let replicated = |shape: &[usize]| -> Result<ShardedArray<f32>> {
            Ok(ShardedArray::new(
                shape,
                Sharding::Replicated,
                self.alloc_replicated(shape)?,
            ))
        };
        let mut input = which.input.then(|| self.alloc_like(x)).transpose()?;
        let mut weight = which.weight.then(|| replicated(w.shape())).transpose()?;
        let mut bias = which.bias.then(|| replicated(&w.shape()[..1])).transpose()?;
        self.conv2d_backward_into(
            x,
            w,
            grad_y,
            params,
            (input.as_mut(), weight.as_mut(), bias.as_mut()),
        )?;
        Ok((input, weight, bias))
    }

    /// [`GpuGroup::conv2d_backward`] into existing gradients: the input's split as x,
    /// the weight's and the bias's replicated; each one present is computed.
    pub fn conv2d_backward_into(
        &self,
        x: &ShardedArray<f32>,
        w: &ShardedArray<f32>,
        grad_y: &ShardedArray<f32>,
        params: &Conv2dParams,
        (mut input, weight, bias): ConvGradientArrays<&mut ShardedArray<f32>>,
    ) -> Result<()> {
        let lengths = self.axis0_lengths(x, "conv2d_backward x")?;
        self.axis0_alike(&lengths, grad_y, "conv2d_backward grad_y")?;
        self.check_replicated(w, "conv2d_backward w")?;
        conv2d_problem(x.shape(), w.shape(), params)?;
        if let Some(input) = &input {
            self.check_alike(x, input, "conv2d_backward input gradient")?;
        }
        for (gradient, shape, what) in [
            (&weight, w.shape(), "conv2d_backward weight gradient"),
            (&bias, &w.shape()[..1], "conv2d_backward bias gradient"),
        ] {
            if let Some(gradient) = gradient {
                self.check_replicated(gradient, what)?;
                if gradient.shape() != shape {
                    return Err(Error::ShapeMismatch {
                        what,
                        expected: shape.to_vec(),
                        actual: gradient.shape().to_vec(),
                    });
                }
            }
        }
        // Each rank's gradients of its part of the batch; the weight's and the bias's
        // are partial sums, in temporaries, added over the ranks below.
        let (mut weights, mut biases) = (Vec::new(), Vec::new());
        for r in 0..self.len() {
            let gpu = &self.gpus[r];
            let mut weight_partial = weight
                .is_some()
                .then(|| gpu.temporary::<f32>(w.shape()))
                .transpose()?;
            let mut bias_partial = bias
                .is_some()
                .then(|| gpu.temporary::<f32>(&w.shape()[..1]))
                .transpose()?;
            gpu.conv2d_backward_into(
                &x.parts[r],
                &w.parts[r],
                &grad_y.parts[r],
                params,
                (
                    input.as_deref_mut().map(|i| &mut i.parts[r]),
                    weight_partial.as_deref_mut(),
                    bias_partial.as_deref_mut(),
                ),
            )?;
            weights.extend(weight_partial);
            biases.extend(bias_partial);
        }
        for (partials, gradient) in [(weights, weight), (biases, bias)] {
            if let Some(gradient) = gradient {
                let partials: Vec<&DeviceArray<f32>> = partials.iter().map(|p| &**p).collect();
                self.sum_in_rank_order_into(&partials, &mut gradient.parts)?;
            }
        }
        Ok(())
    }
}
