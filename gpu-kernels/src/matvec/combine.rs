//! The combine kernel of a split product: each output's `split` partials added in a
//! fixed order, then alpha and beta applied. The partials lie `[split][output]`, so a
//! block takes `combine_width(split)` consecutive outputs by `lanes_for(split)` slices
//! of the split: slice `j` adds partials `j`, `j + slices`, ..., reading whole sectors
//! of consecutive outputs, and the slices' sums are added through shared memory. An
//! output's partials are loaded side by side (not one after another, each load waiting
//! on the last), and every load still serves at least a sector of outputs.

use super::{BLOCK_THREADS, GemvOperands};
use crate::element::{Sum, Summed};
use crate::launch::{DevicePtr, DevicePtrMut, Kernel, Launch, LaunchGeometry, kernel_args, lanes_for};

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
        /// Slices of the split a block takes: a power of two up to a warp.
        pub slices: u32,
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

/// Outputs of a combine block: the block's threads over the slices of the split, at
/// least 8 (a sector of f32 sums).
pub const fn combine_width(split: u64) -> u32 {
    BLOCK_THREADS / lanes_for(split)
}

const _: () = assert!(combine_width(1 << 62) >= 8);

/// The launch adding `split` partials per output of `operands` into y.
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
        slices: lanes_for(split),
    };
    let blocks = outputs.div_ceil(combine_width(split) as u64);
    let shared = BLOCK_THREADS * size_of::<T::Sum>() as u32;
    Launch::new(
        T::COMBINE,
        LaunchGeometry::linear(blocks, BLOCK_THREADS).with_shared(shared),
        args,
    )
}

#[cfg(target_arch = "nvptx64")]
mod kernel {
    use super::*;
    use crate::device::{SharedCarver, block_idx_x, sync_threads, thread_idx_x};
    use crate::matvec::value::{Accumulator, GemvValue, finish};

    /// `y[i] = alpha * (partials[i] + partials[outputs + i] + ...) + beta * y[i]`,
    /// `slices` threads an output (the partials are `[split][output]`).
    ///
    /// # Safety
    /// `partials` holds `outputs * split` values, `y` `outputs`; `slices` is a power of
    /// two up to 32; the block has `BLOCK_THREADS` threads and as many sums of shared
    /// memory.
    #[inline(always)]
    pub unsafe fn combine<T: GemvValue>(args: CombineArgs<T>) {
        let CombineArgs {
            alpha,
            beta,
            outputs,
            split,
            slices,
            ..
        } = args;
        let (partials, y) = (args.partials.as_ptr(), args.y.as_mut_ptr());
        let width = BLOCK_THREADS >> slices.trailing_zeros();
        let thread = thread_idx_x();
        let (column, slice) = (thread & (width - 1), thread / width);
        let i = block_idx_x() as u64 * width as u64 + column as u64;
        let mut sum = T::Sum::ZERO;
        if i < outputs {
            for s in (slice as u64..split).step_by(slices as usize) {
                // SAFETY: s * outputs + i < split * outputs.
                sum = sum + unsafe { *partials.add((s * outputs + i) as usize) };
            }
        }
        // SAFETY: the launch gives BLOCK_THREADS sums; each thread writes its own slot
        // before the barrier, and the slots are read only after it.
        let shared = unsafe {
            let shared = SharedCarver::new().take::<T::Sum>(BLOCK_THREADS as usize);
            *shared.add(thread as usize) = sum;
            shared
        };
        // SAFETY: every thread reaches the barrier.
        unsafe { sync_threads() };
        if thread < width && i < outputs {
            let mut total = T::Sum::ZERO;
            for j in 0..slices {
                // SAFETY: slot j * width + thread < BLOCK_THREADS, written before the barrier.
                total = total + unsafe { *shared.add((j * width + thread) as usize) };
            }
            // SAFETY: i < outputs.
            unsafe { finish(total, alpha, beta, y.add(i as usize)) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matvec::GemvProblem;

    #[test]
    fn a_block_takes_sectors_of_outputs_by_slices_of_the_split() {
        let operands = GemvOperands::<f32> {
            a: DevicePtr::from_address(1 << 20),
            x: DevicePtr::from_address(1 << 24),
            y: DevicePtrMut::from_address(1 << 28),
            alpha: 1.0,
            beta: 0.0,
            problem: GemvProblem {
                rows: 16,
                cols: 1 << 24,
                vectors: 1,
                transpose: false,
            },
        };
        let partials = DevicePtrMut::from_address(1 << 30);
        for (split, slices, width) in [(2, 2, 128), (3, 4, 64), (16, 16, 16), (256, 32, 8), (1024, 32, 8)] {
            let combine = launch(&operands, partials, split);
            assert_eq!(combine.arguments().slices, slices, "split {split}");
            assert_eq!(combine_width(split), width);
            let geometry = combine.geometry();
            assert_eq!(geometry.grid[0], 16u64.div_ceil(width as u64));
            assert_eq!(geometry.threads, slices * width);
            assert_eq!(geometry.shared_bytes, 256 * 4);
        }
    }
}
