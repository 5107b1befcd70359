//! The convolution's reductions outside the GEMMs: the sum of a split weight
//! gradient's partials, and the bias gradient. Both add in FP64 in a fixed order.

use super::ConvProblem;
use crate::launch::{DevicePtr, DevicePtrMut, Launch, LaunchGeometry, ScratchLayout, kernel_args};

/// Threads of the bias-gradient and split-sum kernels.
pub const REDUCE_THREADS: u32 = 256;

kernel_args! {
    /// The split sum's arguments: `out[i] = sum over s of partials[s * count + i]`.
    pub struct SplitSumArgs {
        pub partials: DevicePtr<f32>,
        pub out: DevicePtrMut<f32>,
        pub count: u64,
        pub split: u32,
    }
    /// The sum of `split` partial weight gradients.
    pub const CONV_SPLIT_SUM = "conv_split_sum_f32" => kernel::split_sum;
    entry points in SPLIT_SUM_ENTRY_POINTS;
}

kernel_args! {
    /// The bias gradient's arguments: `db[c] = sum of dy[.., c, .., ..]`.
    pub struct BiasGradArgs {
        pub dy: DevicePtr<f32>,
        pub db: DevicePtrMut<f32>,
        pub problem: ConvProblem,
    }
    /// The bias gradient.
    pub const CONV_BIAS_GRAD = "conv_bias_grad_f32" => kernel::bias_grad;
    entry points in BIAS_GRAD_ENTRY_POINTS;
}

/// The launch adding `args.split` partials of `args.count` values, one thread each.
pub const fn split_sum(args: SplitSumArgs) -> Launch<SplitSumArgs> {
    Launch::new(
        CONV_SPLIT_SUM,
        LaunchGeometry::per_item(args.count, REDUCE_THREADS),
        args,
    )
}

/// The scratch of a pass split into `split` partial results of `count` floats each:
/// none when it is not split.
pub const fn partials_scratch(split: u32, count: u64) -> ScratchLayout {
    let bytes = if split > 1 { split as u64 * count * 4 } else { 0 };
    ScratchLayout { bytes, zeroed: 0 }
}

/// Where a pass split into `split` parts writes (`partials`, laid out by
/// [`partials_scratch`], or `out` itself when not split), and the launch that adds the
/// partials into `out` when split.
pub fn split_outputs(
    split: u32,
    count: u64,
    partials: DevicePtrMut<u8>,
    out: DevicePtrMut<f32>,
) -> (DevicePtrMut<f32>, Option<Launch<SplitSumArgs>>) {
    if split <= 1 {
        return (out, None);
    }
    let sum = split_sum(SplitSumArgs {
        partials: partials.cast().as_const(),
        out,
        count,
        split,
    });
    (partials.cast(), Some(sum))
}

/// The launch of the bias gradient of `dy` into `db`: one block per channel, reducing
/// through shared memory (a double per warp).
pub const fn bias_grad(
    problem: &ConvProblem,
    dy: DevicePtr<f32>,
    db: DevicePtrMut<f32>,
) -> Launch<BiasGradArgs> {
    let geometry = LaunchGeometry::linear(problem.out_channels as u64, REDUCE_THREADS)
        .with_shared(REDUCE_THREADS / 32 * 8);
    let args = BiasGradArgs {
        dy,
        db,
        problem: *problem,
    };
    Launch::new(CONV_BIAS_GRAD, geometry, args)
}

#[cfg(target_arch = "nvptx64")]
mod kernel {
    use super::*;
    use crate::device::{SharedCarver, block_idx_x, sync_threads, thread_idx_x};
    use crate::warp;

    /// `out[i] = sum over s of partials[s * count + i]`, added in order in FP64.
    ///
    /// # Safety
    /// `partials` holds `split * count` values, `out` `count`; the grid covers `count`
    /// threads.
    #[inline(always)]
    pub unsafe fn split_sum(args: SplitSumArgs) {
        let SplitSumArgs { count, split, .. } = args;
        let (partials, out) = (args.partials.as_ptr(), args.out.as_mut_ptr());
        let i = block_idx_x() as u64 * REDUCE_THREADS as u64 + thread_idx_x() as u64;
        if i >= count {
            return;
        }
        let mut sum = 0.0f64;
        for s in 0..split as u64 {
            // SAFETY: s * count + i < split * count.
            sum += unsafe { *partials.add((s * count + i) as usize) } as f64;
        }
        // SAFETY: i < count.
        unsafe { *out.add(i as usize) = sum as f32 };
    }

    /// `db[c] = sum of dy[.., c, .., ..]`, one block per channel, in FP64 in a fixed order.
    ///
    /// # Safety
    /// dy holds the problem's output gradient, `db` `out_channels` values; the grid is
    /// `out_channels` blocks of `REDUCE_THREADS`, with `REDUCE_THREADS / 32` f64 of shared
    /// memory.
    #[inline(always)]
    pub unsafe fn bias_grad(args: BiasGradArgs) {
        let (dy, db, problem) = (args.dy.as_ptr(), args.db.as_mut_ptr(), args.problem);
        let channel = block_idx_x() as u64;
        let t = thread_idx_x();
        let pixels = problem.out_pixels() as u64;
        let mut sum = 0.0f64;
        for image in 0..problem.batch as u64 {
            let plane = (image * problem.out_channels as u64 + channel) * pixels;
            let mut p = t as u64;
            while p < pixels {
                // SAFETY: p < pixels of a valid plane.
                sum += unsafe { *dy.add((plane + p) as usize) } as f64;
                p += REDUCE_THREADS as u64;
            }
        }
        let sum = warp::reduce(sum, |a, b| a + b);
        // SAFETY: the launch provides REDUCE_THREADS / 32 f64.
        let warp_sums: *mut f64 = unsafe { SharedCarver::new().take(REDUCE_THREADS as usize / 32) };
        if t.is_multiple_of(32) {
            // SAFETY: one writer per warp, inside the region.
            unsafe { *warp_sums.add(t as usize / 32) = sum };
        }
        // SAFETY: reached by the whole block.
        unsafe { sync_threads() };
        if t == 0 {
            let mut total = 0.0f64;
            for w in 0..REDUCE_THREADS as usize / 32 {
                // SAFETY: written before the barrier.
                total += unsafe { *warp_sums.add(w) };
            }
            // SAFETY: channel < out_channels.
            unsafe { *db.add(channel as usize) = total as f32 };
        }
    }
}
