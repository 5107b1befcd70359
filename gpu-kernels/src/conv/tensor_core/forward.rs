//! The forward pass on the tensor cores: y = conv(x, w) + bias, one block per
//! `TC_BM x TC_BN` tile of the group's GEMM, over whichever mainloop the entry point
//! names.

use super::mainloop::{Mainloop, Tiles};
use super::operands::{
    Filters, NchwPatches, Operand, Patches, ScalarFilters, ScalarPatches, VectorFilters, VectorPatches,
};
use super::*;
use crate::device::{block_idx_x, block_idx_y, block_idx_z, lane_id};

/// y = conv(x, w) + bias over NHWC tensors.
///
/// # Safety
/// x, w and y hold the problem's NHWC tensors (w `[out][kh][kw][in / groups]`), bias
/// null or `out_channels` floats; `plan` is the problem's forward plan in NHWC, the
/// launch the one it builds for mainloop `M`.
#[inline(always)]
pub unsafe fn forward_nhwc<M: Mainloop>(args: TensorCoreArgs) {
    let (p, plan) = (&args.problem, &args.plan);
    let (m0, group, _) = block_origin();
    let patches = Patches::new(args.x.as_ptr(), *p, m0, group);
    // SAFETY: forwarded from the launch's contract.
    let sums = unsafe {
        if plan.a_vector != 0 {
            with_filters::<M, _>(&args, VectorPatches(patches))
        } else {
            with_filters::<M, _>(&args, ScalarPatches(patches))
        }
    };
    // SAFETY: as above; NHWC: output pixel m's channels are contiguous.
    unsafe {
        store(&args, &sums, |m, channel| {
            m as u64 * p.out_channels as u64 + channel as u64
        })
    };
}

/// y = conv(x, w) + bias over NCHW tensors.
///
/// # Safety
/// As [`forward_nhwc`], with NCHW tensors (w `[out][in / groups][kh][kw]`) and the
/// forward plan in NCHW.
#[inline(always)]
pub unsafe fn forward_nchw<M: Mainloop>(args: TensorCoreArgs) {
    let p = &args.problem;
    let (m0, group, _) = block_origin();
    let patches = NchwPatches::new(args.x.as_ptr(), *p, m0, group);
    // SAFETY: forwarded from the launch's contract.
    let sums = unsafe { with_filters::<M, _>(&args, patches) };
    let store_at = |m: u32, channel: u32| {
        let (image, pixel) = p.div_out_pixels.divmod(m);
        (image as u64 * p.out_channels as u64 + channel as u64) * p.out_pixels() as u64 + pixel as u64
    };
    // SAFETY: as above; NCHW: each channel's plane of output pixels.
    unsafe { store(&args, &sums, store_at) };
}

/// The block's first output pixel, its group and its first output channel.
#[inline(always)]
fn block_origin() -> (u32, u32, u32) {
    (block_idx_x() * TC_BM, block_idx_y(), block_idx_z() * TC_BN)
}

/// The mainloop over `patches` and the weights, copied 16 or 4 bytes at a time as the
/// plan says.
///
/// # Safety
/// As the entry points'.
#[inline(always)]
unsafe fn with_filters<M: Mainloop, A: Operand>(args: &TensorCoreArgs, patches: A) -> M::Sums {
    let p = &args.problem;
    let (_, group, n0) = block_origin();
    let k_tiles = (p.in_per_group() * p.taps()).div_ceil(TC_BK);
    let filters = Filters::new(args.w.as_ptr(), p, n0, group);
    // SAFETY: forwarded.
    unsafe {
        if args.plan.b_vector != 0 {
            M::product(&patches, &VectorFilters(filters), k_tiles)
        } else {
            M::product(&patches, &ScalarFilters(filters), k_tiles)
        }
    }
}

/// Writes the warp's outputs plus the bias: output pixel m and the group's channel c go
/// to `y[store_at(m, channel)]`.
///
/// # Safety
/// `store_at` maps every output pixel and channel of the problem inside y.
#[inline(always)]
unsafe fn store(args: &TensorCoreArgs, sums: &impl Tiles, store_at: impl Fn(u32, u32) -> u64) {
    let p = &args.problem;
    let (m0, group, n0) = block_origin();
    let lane = lane_id();
    let (g, t) = (lane / 4, lane % 4);
    let m_total = p.batch * p.out_pixels();
    let out_group = p.out_per_group();
    let (y, bias) = (args.y.as_mut_ptr(), args.bias.as_ptr());
    sums.for_each(|row, column, tile| {
        let column = n0 + column + 2 * t;
        // The two output channels of this lane's column pair, with their biases.
        let channels = [column, column + 1].map(|c| {
            let channel = group * out_group + c;
            // SAFETY: a channel of the bias, when there is one and the column is valid.
            let b = if bias.is_null() || c >= out_group {
                0.0
            } else {
                unsafe { *bias.add(channel as usize) }
            };
            (c < out_group, channel, b)
        });
        for half in 0..2 {
            let m = m0 + row + g + 8 * half;
            for (e, &(valid, channel, b)) in channels.iter().enumerate() {
                if valid && m < m_total {
                    // SAFETY: (m, channel) is an output of the problem, inside y.
                    unsafe { *y.add(store_at(m, channel) as usize) = tile[2 * half as usize + e] + b };
                }
            }
        }
    });
}
