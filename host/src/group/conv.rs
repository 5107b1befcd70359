//! Data-parallel convolution: the batch split over the group, the filters replicated.

use super::{GpuGroup, ShardedArray, invalid};
use crate::array::DeviceArray;
use crate::conv::{Conv2dParams, ConvGradientArrays, ConvGradients, conv2d_problem};
use crate::error::Result;

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
        if self.axis0_lengths(y, "conv2d y")? != lengths {
            return Err(invalid(
                "conv2d y",
                format!("it must be split as x, {:?}", x.sharding),
            ));
        }
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
        let lengths = self.axis0_lengths(x, "conv2d_backward x")?;
        if self.axis0_lengths(grad_y, "conv2d_backward grad_y")? != lengths {
            return Err(invalid(
                "conv2d_backward grad_y",
                format!(
                    "it is split as {:?}, x as {:?}: split them alike",
                    grad_y.sharding, x.sharding
                ),
            ));
        }
        self.check_replicated(w, "conv2d_backward w")?;
        conv2d_problem(x.shape(), w.shape(), params)?;
        let local = (0..self.len())
            .map(|r| self.gpus[r].conv2d_backward(&x.parts[r], &w.parts[r], &grad_y.parts[r], params, which))
            .collect::<Result<Vec<_>>>()?;
        let (mut inputs, mut weights, mut biases) = (Vec::new(), Vec::new(), Vec::new());
        for (input, weight, bias) in local {
            inputs.extend(input);
            weights.extend(weight);
            biases.extend(bias);
        }
        let summed = |partials: Vec<DeviceArray<f32>>| {
            (!partials.is_empty())
                .then(|| self.sum_in_rank_order(&partials.iter().collect::<Vec<_>>()))
                .transpose()
        };
        let input = (!inputs.is_empty()).then(|| ShardedArray::new(x.shape(), x.sharding.clone(), inputs));
        Ok((input, summed(weights)?, summed(biases)?))
    }
}
