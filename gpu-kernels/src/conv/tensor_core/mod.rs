//! Convolution on the tensor cores (TF32, FP32 accumulation) as an implicit GEMM: per
//! group, M = batch * output pixels, N = output channels, K = taps * input channels,
//! ordered as the weights store it, so that B (the weights) is contiguous along K: the
//! channel fastest in NHWC (`w[out][kh][kw][in]`, and x's channels at one tap are
//! contiguous too), the tap fastest in NCHW (`w[out][in][kh][kw]`; x is gathered one
//! element at a time, consecutive output pixels side by side).
//!
//! The operands are staged as `TC_BM x TC_BK` tiles of A and `TC_BN x TC_BK` of B in
//! shared memory, filled by `cp.async` (16-byte copies of four consecutive K where the
//! operand allows, else one element at a time) and zero-filled outside the tensors.
//! Two mainloops multiply them: on Hopper, warpgroup MMA (`wgmma`, operands read from
//! shared memory by the tensor cores as TF32) through `WGMMA_STAGES` stages; elsewhere
//! `mma.sync` m16n8k8 TF32 (fragments by `ldmatrix`, rounded to TF32 to nearest) through
//! `TC_STAGES`. Sums stay FP32, in a fixed order, so results are the same from run to
//! run.

#[cfg(target_arch = "nvptx64")]
mod forward;
#[cfg(target_arch = "nvptx64")]
mod mainloop;
#[cfg(target_arch = "nvptx64")]
mod operands;
#[cfg(target_arch = "nvptx64")]
mod warp_mma;
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
mod warpgroup_mma;

use super::{ConvLayout, ConvProblem};
use crate::launch::{DeviceLimits, DevicePtr, DevicePtrMut, Launch, LaunchGeometry, kernel_args};

/// Rows of C (output pixels) per block.
pub const TC_BM: u32 = 128;
/// Columns of C (output channels) per block.
pub const TC_BN: u32 = 128;
/// Depth of one staged slice of K: 32 floats, 128 bytes per row.
pub const TC_BK: u32 = 32;
/// Shared-memory stages of the `mma.sync` mainloop.
pub const TC_STAGES: u32 = 4;
/// Shared-memory stages of the `wgmma` mainloop: four copied ahead, one being
/// multiplied, one that the previous multiply may still read.
pub const WGMMA_STAGES: u32 = 6;
/// Threads per block: 8 warps, 2 along M by 4 along N.
pub const TC_THREADS: u32 = 256;
/// Bytes of one staged operand tile.
pub const TC_TILE_BYTES: u32 = TC_BM * TC_BK * 4;
/// Dynamic shared memory of a block: both operands of every stage.
pub const fn shared_bytes(stages: u32) -> u32 {
    stages * 2 * TC_TILE_BYTES
}
/// Blocks resident per SM (two 96 KiB blocks fit the H100's 227 KiB).
pub const TC_BLOCKS_PER_SM: u32 = 1;

const _: () = assert!(TC_BM == TC_BN && TC_BK == 32 && TC_THREADS == 256 && TC_STAGES >= 2);

/// How a tensor-core pass is launched: blocks along x are tiles of M, grid y is the
/// group, grid z the tiles of `TC_BN` output channels of a group.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorCorePlan {
    pub m_tiles: u32,
    pub n_tiles: u32,
    pub groups: u32,
    /// Whether x is copied four channels at a time (NHWC, channels per group a
    /// multiple of 4), as 1 or 0.
    pub a_vector: u32,
    /// Whether w is copied four K at a time (K a multiple of 4), as 1 or 0.
    pub b_vector: u32,
    /// Whether the tensors are channels last (NHWC), as 1 or 0 (NCHW).
    pub channels_last: u32,
    /// Whether the mainloop is `wgmma` (sm_90a), as 1 or 0 (`mma.sync`).
    pub warpgroup_mma: u32,
}

impl TensorCorePlan {
    /// The plan of the forward pass of `problem` over tensors in `layout`, on `wgmma`
    /// where the device's kernels have it.
    pub const fn forward(problem: &ConvProblem, layout: ConvLayout, device: &DeviceLimits) -> Self {
        let m = problem.batch as u64 * problem.out_pixels() as u64;
        let channels_last = matches!(layout, ConvLayout::Nhwc);
        Self {
            m_tiles: m.div_ceil(TC_BM as u64) as u32,
            n_tiles: problem.out_per_group().div_ceil(TC_BN),
            groups: problem.groups,
            a_vector: (channels_last && problem.in_per_group().is_multiple_of(4)) as u32,
            b_vector: (problem.in_per_group() * problem.taps()).is_multiple_of(4) as u32,
            channels_last: channels_last as u32,
            warpgroup_mma: device.warpgroup_mma as u32,
        }
    }

    /// The layout of the tensors.
    pub const fn layout(&self) -> ConvLayout {
        if self.channels_last == 1 {
            ConvLayout::Nhwc
        } else {
            ConvLayout::Nchw
        }
    }

    /// The forward launch: `y = conv(x, w) + bias` in the plan's layout, bias null when
    /// absent.
    pub const fn forward_launch(
        &self,
        problem: &ConvProblem,
        x: DevicePtr<f32>,
        w: DevicePtr<f32>,
        bias: DevicePtr<f32>,
        y: DevicePtrMut<f32>,
    ) -> Launch<TensorCoreArgs> {
        let stages = if self.warpgroup_mma == 1 {
            WGMMA_STAGES
        } else {
            TC_STAGES
        };
        let geometry = LaunchGeometry {
            grid: [self.m_tiles as u64, self.groups as u64, self.n_tiles as u64],
            threads: TC_THREADS,
            shared_bytes: shared_bytes(stages),
        };
        let args = TensorCoreArgs {
            x,
            w,
            bias,
            y,
            problem: *problem,
            plan: *self,
        };
        let kernel = match (self.channels_last == 1, self.warpgroup_mma == 1) {
            (true, false) => CONV_FORWARD_NHWC_TF32,
            (false, false) => CONV_FORWARD_NCHW_TF32,
            (true, true) => CONV_FORWARD_NHWC_TF32_WGMMA,
            (false, true) => CONV_FORWARD_NCHW_TF32_WGMMA,
        };
        Launch::new(kernel, geometry, args)
    }
}

kernel_args! {
    /// The tensor-core forward pass's arguments: `y = conv(x, w) + bias` in the plan's
    /// layout.
    pub struct TensorCoreArgs {
        pub x: DevicePtr<f32>,
        pub w: DevicePtr<f32>,
        pub bias: DevicePtr<f32>,
        pub y: DevicePtrMut<f32>,
        pub problem: ConvProblem,
        pub plan: TensorCorePlan,
    }
    /// The TF32 forward pass over NHWC tensors on `mma.sync`.
    pub const CONV_FORWARD_NHWC_TF32 = "conv_forward_nhwc_tf32" =>
        forward::forward_nhwc::<warp_mma::WarpMma>, bounds(TC_THREADS, TC_BLOCKS_PER_SM);
    /// The TF32 forward pass over NCHW tensors on `mma.sync`.
    pub const CONV_FORWARD_NCHW_TF32 = "conv_forward_nchw_tf32" =>
        forward::forward_nchw::<warp_mma::WarpMma>, bounds(TC_THREADS, TC_BLOCKS_PER_SM);
    /// The TF32 forward pass over NHWC tensors on `wgmma`.
    pub const CONV_FORWARD_NHWC_TF32_WGMMA = "conv_forward_nhwc_tf32_wgmma" =>
        forward::forward_nhwc::<warpgroup_mma::WarpgroupMma>, bounds(TC_THREADS, 1), requires("sm_90a");
    /// The TF32 forward pass over NCHW tensors on `wgmma`.
    pub const CONV_FORWARD_NCHW_TF32_WGMMA = "conv_forward_nchw_tf32_wgmma" =>
        forward::forward_nchw::<warpgroup_mma::WarpgroupMma>, bounds(TC_THREADS, 1), requires("sm_90a");
    entry points in ENTRY_POINTS;
}
