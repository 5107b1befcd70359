//! The weight gradient over NHWC tensors of bf16 or f16 on `wgmma`: the tiles, split
//! and stores of the TF32 kernel, but 16-bit `wgmma` reads either operand from shared
//! memory in either major order, so both land by bulk copies as they lie, nothing
//! rounded, transposed or read through registers. A k-tile is `K_TILE_PIXELS` output
//! pixels of the batch; dy's (pixels by output channels) is A, M-major, in two boxes of
//! 64 channels, and x's im2col boxes (pixels by the column block's 64 input channels,
//! one per block) are B, N-major; every box lands with the 128-byte swizzle, a pixel a
//! row of 128 bytes, as [`swizzled_mn_major_descriptor`] describes. One thread of the
//! producer warpgroup copies; each consumer multiplies its 64 output channels by the
//! tile's 192 columns, one `m64n192k16` per 16 pixels.
//!
//! [`swizzled_mn_major_descriptor`]: crate::device::swizzled_mn_major_descriptor

use super::{WGMMA_WGRAD_BLOCKS, WGMMA_WGRAD_CHANNELS, WGMMA_WGRAD_ROWS};
use crate::conv::ConvProblem;
use crate::conv::tensor_core::{TensorCoreOperand, WGMMA_BARRIER_BYTES, im2col_map};
use crate::launch::DevicePtr;
use crate::tensor_map::{TensorMapSpec, TensorMapSwizzle};

/// Output pixels of a k-tile: four `wgmma` steps of 16.
pub const K_TILE_PIXELS: u32 = 64;
/// Bytes of a staged box: a k-tile's pixels by 64 channels (128 bytes a pixel).
const BOX_BYTES: u32 = K_TILE_PIXELS * 128;
/// Bytes of a stage: the column blocks of x, then the two boxes of dy.
const B_BYTES: u32 = WGMMA_WGRAD_BLOCKS * BOX_BYTES;
const STAGE_BYTES: u32 = B_BYTES + WGMMA_WGRAD_ROWS / 64 * BOX_BYTES;
/// Shared-memory stages.
const STAGES: u32 = 5;
/// Dynamic shared memory: the stages, then per stage the full and empty mbarriers.
pub const SHARED_BYTES: u32 = STAGES * (STAGE_BYTES + WGMMA_BARRIER_BYTES);

const _: () = assert!(WGMMA_WGRAD_CHANNELS * 2 == 128 && WGMMA_WGRAD_ROWS == 2 * 64);
const _: () = assert!(STAGE_BYTES.is_multiple_of(1024) && K_TILE_PIXELS.is_multiple_of(16));

/// The tensor maps of `operand`s: of dy, as `[c][pixels of the batch][1]`, in boxes of
/// 64 output channels by `K_TILE_PIXELS` pixels; of x, for im2col, in boxes of those
/// pixels' window taps by 64 input channels; both swizzled.
pub(super) fn tensor_maps(
    problem: &ConvProblem,
    operand: TensorCoreOperand,
    x: DevicePtr<f32>,
    dy: DevicePtr<f32>,
) -> [TensorMapSpec; 2] {
    let p = problem;
    let batch_pixels = p.batch as u64 * p.out_pixels() as u64;
    let dy = TensorMapSpec::tiled_of(
        operand.map_element(false),
        dy.address(),
        &[p.out_channels as u64, batch_pixels, 1],
        &[64, K_TILE_PIXELS, 1],
        TensorMapSwizzle::Bytes128,
    );
    [dy, im2col_map(p, x, operand, K_TILE_PIXELS)]
}

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
pub(super) mod kernel {
    use super::super::WarpgroupWeightGradArgs;
    use super::super::kernel::{NhwcKTiles, Sums, Work, copy_nhwc_k_tiles, fenced_maps, store};
    use super::*;
    use crate::device::{
        Shuffle, StagePipeline, WarpgroupAccumulators, shared_base, swizzled_mn_major_descriptor,
        sync_threads, thread_idx_x, warpgroup_commit, warpgroup_fence, warpgroup_wait,
    };

    /// Threads of a warpgroup.
    const WARPGROUP: u32 = 128;
    /// Bytes of 16 pixels of a box: one `wgmma` step.
    const STEP_BYTES: u32 = 16 * 128;

    /// A 16-bit operand type: bf16 or f16.
    pub trait WeightGradOperand {
        /// `sums += A B^T` over 16 pixels, A and B MN-major through descriptors.
        ///
        /// # Safety
        /// As [`WarpgroupAccumulators::multiply_bf16_shared_mn_major`].
        unsafe fn multiply(sums: &mut Sums, a: u64, b: u64);
    }

    impl WeightGradOperand for half::bf16 {
        #[inline(always)]
        unsafe fn multiply(sums: &mut Sums, a: u64, b: u64) {
            // SAFETY: forwarded.
            unsafe { sums.multiply_bf16_shared_mn_major(a, b) }
        }
    }

    impl WeightGradOperand for half::f16 {
        #[inline(always)]
        unsafe fn multiply(sums: &mut Sums, a: u64, b: u64) {
            // SAFETY: forwarded.
            unsafe { sums.multiply_f16_shared_mn_major(a, b) }
        }
    }

    /// The stage's column blocks of x (`BOX_BYTES` each).
    #[inline(always)]
    fn stage_x(stage: u32) -> u32 {
        shared_base() + stage * STAGE_BYTES
    }

    /// The stage's two boxes of dy.
    #[inline(always)]
    fn stage_dy(stage: u32) -> u32 {
        stage_x(stage) + B_BYTES
    }

    /// The weight gradient of conv for NHWC dy and x of `E`, in f32, or with
    /// `plan.split > 1` its per-split partials.
    ///
    /// # Safety
    /// `args.maps` holds the plan's tensor maps of the problem's dy and x (of `E`),
    /// `out` the gradient or `split` of them when split (f32, NHWC); the launch is the
    /// one [`WarpgroupWeightGradPlan::launches`](super::super::WarpgroupWeightGradPlan::launches)
    /// builds from this problem's plan.
    #[inline(always)]
    pub unsafe fn weight_grad<E: WeightGradOperand>(args: WarpgroupWeightGradArgs) {
        let work = Work::of(&args);
        // SAFETY: every thread calls it; the mbarriers follow the stages in the
        // launch's shared memory, and the barrier below publishes them.
        let pipeline = unsafe { StagePipeline::new(stage_x(STAGES), STAGES, 1, 2 * WARPGROUP) };
        // SAFETY: every thread reaches it.
        unsafe { sync_threads() };
        // From lane 0, so that ptxas sees the role as warp-uniform.
        let warpgroup = (thread_idx_x() / WARPGROUP).shfl_idx(0);
        // SAFETY: both sides run the same k-tiles in the same order, so every fill is
        // consumed and every release awaited.
        unsafe {
            if warpgroup != 0 {
                consume::<E>(&args, &work, &pipeline, warpgroup - 1);
            } else if thread_idx_x() == 0 {
                produce(&args, &work, &pipeline);
            }
        }
    }

    /// The copying thread: k-tile `kt` is the batch's output pixels
    /// `K_TILE_PIXELS kt ..`; dy in two boxes of 64 output channels, and per column
    /// block an im2col box of 64 channels at the block's window tap.
    ///
    /// # Safety
    /// As [`weight_grad`]; thread 0 calls it.
    #[inline(always)]
    unsafe fn produce(args: &WarpgroupWeightGradArgs, work: &Work, pipeline: &StagePipeline) {
        // SAFETY: the host wrote both maps before the launch.
        let (dy_map, x_map) = unsafe { fenced_maps(args) };
        let k_tiles = NhwcKTiles {
            stages: STAGES,
            pixels: K_TILE_PIXELS,
            bytes: STAGE_BYTES,
        };
        let copy_dy = |stage, first_pixel| {
            for half in 0..2 {
                let dy_at = [(work.m0 + 64 * half) as i32, first_pixel, 0];
                // SAFETY: into the stage the loop acquired.
                unsafe { pipeline.load_tile_3d(stage, stage_dy(stage) + half * BOX_BYTES, dy_map, dy_at) };
            }
        };
        let copy_x = |stage, j, at, offsets| {
            // SAFETY: as above.
            unsafe { pipeline.load_im2col(stage, stage_x(stage) + j * BOX_BYTES, x_map, at, offsets) };
        };
        // SAFETY: the caller's contract; the copies are the stage's bytes.
        unsafe { copy_nhwc_k_tiles(args, work, pipeline, k_tiles, copy_dy, copy_x) };
    }

    /// K-tile `kt` of the block's product: `sums += dy x^T` over its pixels for this
    /// consumer's 64 output channels, one `wgmma` per 16 pixels, each followed by a wait
    /// that leaves one in flight; the k-tile before is released once its last `wgmma`
    /// is done.
    ///
    /// # Safety
    /// The consumer warpgroup calls it together for the k-tiles in order.
    #[inline(always)]
    unsafe fn multiply_k_tile<E: WeightGradOperand>(
        sums: &mut Sums,
        pipeline: &StagePipeline,
        kt: u32,
        consumer: u32,
    ) {
        let stage = kt % STAGES;
        // SAFETY: the caller's contract; the full barrier says the stage landed.
        unsafe {
            pipeline.wait_full(stage, kt / STAGES);
            for step in 0..K_TILE_PIXELS / 16 {
                let dy = stage_dy(stage) + consumer * BOX_BYTES + step * STEP_BYTES;
                let a = swizzled_mn_major_descriptor(dy, BOX_BYTES);
                let b = swizzled_mn_major_descriptor(stage_x(stage) + step * STEP_BYTES, BOX_BYTES);
                warpgroup_fence();
                E::multiply(sums, a, b);
                warpgroup_commit();
                warpgroup_wait::<1>();
                if step == 0 && kt > 0 {
                    pipeline.release((kt - 1) % STAGES);
                }
            }
        }
    }

    /// A consumer: multiplies its 64 output channels of the tile over the split's
    /// k-tiles and stores them.
    ///
    /// # Safety
    /// As [`weight_grad`]; consumer warpgroup `consumer` (0 or 1) calls it.
    #[inline(always)]
    unsafe fn consume<E: WeightGradOperand>(
        args: &WarpgroupWeightGradArgs,
        work: &Work,
        pipeline: &StagePipeline,
        consumer: u32,
    ) {
        let mut sums: Sums = [[0.0; 4]; 24];
        sums.pin();
        // The first k-tile before the loop, so that the sums enter it defined by a
        // `wgmma` as they leave it (else ptxas serializes the loop's `wgmma`s).
        // SAFETY: forwarded; a split has at least one k-tile.
        unsafe { multiply_k_tile::<E>(&mut sums, pipeline, 0, consumer) };
        for kt in 1..work.count {
            // SAFETY: as above.
            unsafe { multiply_k_tile::<E>(&mut sums, pipeline, kt, consumer) };
        }
        // SAFETY: the sums are final after the wait, and the last stage read.
        unsafe {
            warpgroup_wait::<0>();
            pipeline.release((work.count - 1) % STAGES);
            store::<true>(args, work, &sums, consumer * 64);
        }
    }
}
