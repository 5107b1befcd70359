//! Convolution on the tensor cores (TF32, FP32 accumulation) as an implicit GEMM over
//! channels-last (NHWC) tensors: per group, M = batch * output pixels, N = output
//! channels, K = taps * input channels with the channel fastest, so that both operands
//! are contiguous along K (x's channels at one tap; w's `[out][kh][kw][in]` rows).
//!
//! One mainloop ([`mainloop`]) stages `TC_BM x TC_BK` tiles of A and `TC_BN x TC_BK` of B
//! through `TC_STAGES` shared-memory stages filled by `cp.async` (16-byte copies of four
//! channels when the channels per group are a multiple of four, else one element at a
//! time), zero-filled outside the tensors, and multiplies them with `mma.sync`
//! m16n8k8 TF32: 8 warps of 64 x 32 outputs each. Operands are rounded to TF32 (to
//! nearest) as they leave shared memory; sums stay FP32, in a fixed order, so results are
//! the same from run to run.

#[cfg(target_arch = "nvptx64")]
mod mainloop;

use super::ConvProblem;
use crate::launch::{DevicePtr, DevicePtrMut, Launch, LaunchGeometry, kernel_args};

/// Rows of C (output pixels) per block.
pub const TC_BM: u32 = 128;
/// Columns of C (output channels) per block.
pub const TC_BN: u32 = 128;
/// Depth of one staged slice of K: 32 floats, 128 bytes per row.
pub const TC_BK: u32 = 32;
/// Shared-memory stages in flight.
pub const TC_STAGES: u32 = 4;
/// Threads per block: 8 warps, 2 along M by 4 along N.
pub const TC_THREADS: u32 = 256;
/// Bytes of one staged operand tile.
pub const TC_TILE_BYTES: u32 = TC_BM * TC_BK * 4;
/// Dynamic shared memory of a block: both operands of every stage.
pub const TC_SHARED_BYTES: u32 = TC_STAGES * 2 * TC_TILE_BYTES;
/// Blocks resident per SM (two 96 KiB blocks fit the H100's 227 KiB).
pub const TC_BLOCKS_PER_SM: u32 = 1;

const _: () = assert!(TC_BM == TC_BN && TC_BK == 32 && TC_THREADS == 256 && TC_STAGES >= 2);

/// How a tensor-core pass is launched: blocks along x are tiles of M, grid y is the
/// group. One tile along N covers up to `TC_BN` output channels per group; wider
/// groups take grid z.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorCorePlan {
    pub m_tiles: u32,
    pub n_tiles: u32,
    pub groups: u32,
    /// Whether the channels per group are a multiple of 4 (16-byte copies), as 1 or 0.
    pub vector: u32,
}

impl TensorCorePlan {
    /// The plan of the forward pass of `problem`.
    pub const fn forward(problem: &ConvProblem) -> Self {
        let m = problem.batch as u64 * problem.out_pixels() as u64;
        Self {
            m_tiles: m.div_ceil(TC_BM as u64) as u32,
            n_tiles: problem.out_per_group().div_ceil(TC_BN),
            groups: problem.groups,
            vector: problem.in_per_group().is_multiple_of(4) as u32,
        }
    }

    /// The forward launch over NHWC tensors: `y = conv(x, w) + bias`, bias null when
    /// absent; x `[batch, h, w, in]`, w `[out, kh, kw, in / groups]`, y `[batch, oh, ow,
    /// out]`.
    pub const fn forward_nhwc(
        &self,
        problem: &ConvProblem,
        x: DevicePtr<f32>,
        w: DevicePtr<f32>,
        bias: DevicePtr<f32>,
        y: DevicePtrMut<f32>,
    ) -> Launch<ForwardNhwcArgs> {
        let geometry = LaunchGeometry {
            grid: [self.m_tiles as u64, self.groups as u64, self.n_tiles as u64],
            threads: TC_THREADS,
            shared_bytes: TC_SHARED_BYTES,
        };
        let args = ForwardNhwcArgs {
            x,
            w,
            bias,
            y,
            problem: *problem,
            plan: *self,
        };
        Launch::new(CONV_FORWARD_NHWC_TF32, geometry, args)
    }
}

kernel_args! {
    /// The tensor-core forward pass's arguments, NHWC: `y = conv(x, w) + bias`.
    pub struct ForwardNhwcArgs {
        pub x: DevicePtr<f32>,
        pub w: DevicePtr<f32>,
        pub bias: DevicePtr<f32>,
        pub y: DevicePtrMut<f32>,
        pub problem: ConvProblem,
        pub plan: TensorCorePlan,
    }
    /// The TF32 tensor-core forward pass over NHWC tensors.
    pub const CONV_FORWARD_NHWC_TF32 = "conv_forward_nhwc_tf32" => mainloop::forward_nhwc,
        bounds(TC_THREADS, TC_BLOCKS_PER_SM);
    entry points in ENTRY_POINTS;
}
