//! The fused epilogue of the forward pass, shared by every forward kernel: each output
//! is `act(conv + bias) + residual`, written once.

use crate::launch::DevicePtr;

/// The activation applied after the bias.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Activation {
    /// None: `y = conv + bias`.
    #[default]
    Identity = 0,
    /// `max(v, 0)` (NaN stays NaN, as in torch).
    Relu = 1,
    /// `v sigmoid(v)`: torch's `silu`.
    Silu = 2,
    /// `0.5 v (1 + tanh(sqrt(2 / pi) (v + 0.044715 v^3)))`: torch's
    /// `gelu(approximate='tanh')`.
    GeluTanh = 3,
}

/// What every forward kernel does to an output's sum: adds the bias of its channel
/// (the kernel does, where it suits it), then the activation and the residual
/// (`apply`, in the GPU build).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ConvEpilogue {
    /// `out_channels` floats; null when there is none.
    pub bias: DevicePtr<f32>,
    /// Added last, in y's shape and layout; null when there is none.
    pub residual: DevicePtr<f32>,
    /// An [`Activation`] as its `u32`.
    pub activation: u32,
}

impl ConvEpilogue {
    /// Nothing: the sums as they are.
    pub const NONE: Self = Self {
        bias: DevicePtr::NULL,
        residual: DevicePtr::NULL,
        activation: Activation::Identity as u32,
    };

    /// `bias`, then `activation`, then `residual` (null pointers: none).
    pub const fn new(bias: DevicePtr<f32>, activation: Activation, residual: DevicePtr<f32>) -> Self {
        Self {
            bias,
            residual,
            activation: activation as u32,
        }
    }

    /// The output at `index` of y (in its layout) whose sum plus bias is `value`.
    ///
    /// # Safety
    /// `index` is an element of y, and so of the residual when there is one.
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    pub unsafe fn apply(&self, value: f32, index: usize) -> f32 {
        // SAFETY: forwarded.
        unsafe { self.add_residual(self.activate(value), index) }
    }

    /// `value` plus the residual at `index`, when there is one.
    ///
    /// # Safety
    /// `index` is an element of y, and so of the residual when there is one.
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    pub unsafe fn add_residual(&self, value: f32, index: usize) -> f32 {
        let residual = self.residual.as_ptr();
        if residual.is_null() {
            value
        } else {
            // SAFETY: the caller's index is inside the residual.
            value + unsafe { *residual.add(index) }
        }
    }

    /// The epilogue's activation of `value`, in few instructions: the kernels apply it
    /// to every output in unrolled loops, and their code must stay small enough for the
    /// instruction cache. SiLU and GELU share one gated form, `v sigmoid(t)`, with
    /// `t = v` (SiLU) or `t = 2 sqrt(2 / pi) (v + 0.044715 v^3)` (GELU tanh, as
    /// `tanh(z) = 2 sigmoid(2z) - 1`).
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    pub fn activate(&self, value: f32) -> f32 {
        const TWO_SQRT_2_OVER_PI: f32 = 2.0 * 0.797_884_6;
        match self.activation {
            0 => value,
            1 => self.rectify(value),
            kind => {
                let (linear, cubic) = if kind == Activation::Silu as u32 {
                    (1.0, 0.0)
                } else {
                    (TWO_SQRT_2_OVER_PI, TWO_SQRT_2_OVER_PI * 0.044715)
                };
                let t = value * crate::device::fma_f32(cubic, value * value, linear);
                value * sigmoid(t)
            }
        }
    }
}

impl ConvEpilogue {
    /// Whether the outputs are the sums plus bias alone: the kernels then take their
    /// plain stores, whose code is as small and fast as without an epilogue.
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    pub fn is_plain(&self) -> bool {
        self.activation == Activation::Identity as u32 && self.residual.as_ptr().is_null()
    }

    /// Whether the outputs are the sums plus bias, rectified or not: what kernels that
    /// store their sums straight from registers apply there ([`Self::rectify`]), a
    /// comparison per output, where a longer activation or a residual would not fit
    /// their unrolled stores.
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    pub fn fits_register_stores(&self) -> bool {
        (self.activation == Activation::Identity as u32 || self.activation == Activation::Relu as u32)
            && self.residual.as_ptr().is_null()
    }

    /// `value` through ReLU when that is the activation, else as it is; the whole
    /// epilogue when [`Self::fits_register_stores`].
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    pub fn rectify(&self, value: f32) -> f32 {
        // A floor the value is raised to, the same for every output: a comparison and
        // a select each. NaN stays NaN, as in torch.
        let floor = if self.activation == Activation::Relu as u32 {
            0.0
        } else {
            f32::NEG_INFINITY
        };
        if value < floor { floor } else { value }
    }

    /// The activation of each of `values`, for kernels whose loops over register
    /// arrays would grow past what the compiler unrolls with the activation inside.
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    pub fn activate_all(&self, values: &mut [f32]) {
        if self.activation != Activation::Identity as u32 {
            values.iter_mut().for_each(|value| *value = self.activate(*value));
        }
    }
}

/// `1 / (1 + e^-t)`.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
fn sigmoid(t: f32) -> f32 {
    use crate::device::{exp2_approx, reciprocal_approx};
    reciprocal_approx(1.0 + exp2_approx(-t * core::f32::consts::LOG2_E))
}
