//! The combine kernel of a split product: each output's `split` partials added in
//! order, then alpha and beta applied.

use super::{BLOCK_THREADS, GemvOperands};
use crate::element::{Sum, Summed};
use crate::launch::{DevicePtr, DevicePtrMut, Kernel, Launch, LaunchGeometry, kernel_args};

kernel_args! {
    /// The combine kernel's arguments: `y[i] = alpha * (partials[i] +
    /// partials[outputs + i] + ...) + beta * y[i]` for `outputs` elements.
    pub struct CombineArgs<T: Summed> {
        pub partials: DevicePtr<Sum<T>>,
        pub y: DevicePtrMut<T>,
        pub alpha: Sum<T>,
        pub beta: Sum<T>,
        pub outputs: u64,
        pub split: u64,
    }
    impl CombineKernel for f32 {
        const COMBINE = "gemv_combine_f32" => kernel::combine::<f32>;
    }
    impl CombineKernel for f64 {
        const COMBINE = "gemv_combine_f64" => kernel::combine::<f64>;
    }
    impl CombineKernel for half::bf16 {
        const COMBINE = "gemv_combine_bf16" => kernel::combine::<half::bf16>;
    }
    impl CombineKernel for half::f16 {
        const COMBINE = "gemv_combine_f16" => kernel::combine::<half::f16>;
    }
    entry points in ENTRY_POINTS;
}

/// The combine kernel of one element type.
pub trait CombineKernel: Summed {
    const COMBINE: Kernel<CombineArgs<Self>>;
}

/// The launch adding `split` partials per output of `operands` into y, one thread
/// each.
pub fn launch<T: CombineKernel>(
    operands: &GemvOperands<T>,
    partials: DevicePtrMut<T::Sum>,
    split: u64,
) -> Launch<CombineArgs<T>> {
    let outputs = operands.problem.outputs();
    let args = CombineArgs {
        partials: partials.as_const(),
        y: operands.y,
        alpha: operands.alpha,
        beta: operands.beta,
        outputs,
        split,
    };
    Launch::new(T::COMBINE, LaunchGeometry::per_item(outputs, BLOCK_THREADS), args)
}

#[cfg(target_arch = "nvptx64")]
mod kernel {
    use super::*;
    use crate::device::{block_dim_x, block_idx_x, thread_idx_x};
    use crate::matvec::value::{Accumulator, GemvValue, finish};

    /// `y[i] = alpha * (partials[i] + partials[outputs + i] + ...) + beta * y[i]`, one
    /// thread per output: the partials are `[split][output]`, so the reads coalesce.
    ///
    /// # Safety
    /// `partials` holds `outputs * split` values, `y` `outputs`.
    #[inline(always)]
    pub unsafe fn combine<T: GemvValue>(args: CombineArgs<T>) {
        let CombineArgs {
            alpha,
            beta,
            outputs,
            split,
            ..
        } = args;
        let (partials, y) = (args.partials.as_ptr(), args.y.as_mut_ptr());
        let i = block_idx_x() as u64 * block_dim_x() as u64 + thread_idx_x() as u64;
        if i < outputs {
            let mut sum = T::Sum::ZERO;
            for s in 0..split {
                // SAFETY: s * outputs + i < split * outputs.
                sum = sum + unsafe { *partials.add((s * outputs + i) as usize) };
            }
            // SAFETY: i < outputs.
            unsafe { finish(sum, alpha, beta, y.add(i as usize)) };
        }
    }
}
