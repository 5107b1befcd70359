//! The epilogue of both tensor-core kernels: each warp's sums, which start from the
//! bias, through the fused epilogue (activation, residual), stored from registers in
//! the plan's layout.

use super::*;
use crate::device::{lane_id, store_global_v2_f32};

/// Where a tile of the GEMM lies: its first output pixel, its group, and its first
/// output channel of the group.
#[derive(Clone, Copy)]
pub struct TileOrigin {
    pub m0: u32,
    pub group: u32,
    pub n0: u32,
}

/// A warp's sums: `I x J` tiles of 16 x 8 outputs, tile (i, j) at `origin + (row_step
/// i, 8 j)` (row, column within the tile of the GEMM). With lane `4 g + t`, a tile's four
/// sums are at (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1).
pub struct WarpTiles<const I: usize, const J: usize> {
    pub sums: [[[f32; 4]; J]; I],
    pub origin: (u32, u32),
    pub row_step: u32,
}

/// The sums a warp's tiles start from: the bias of each tile's columns (zero without
/// one, or past the group's channels), so that the epilogue stores the sums as they are.
/// `bias_of(c)` is the bias of output channel c.
///
/// # Safety
/// `args` are the launch's (bias null or `out_channels` floats); `bias_of` reads a
/// channel's bias where there is one.
#[inline(always)]
pub unsafe fn bias_sums<const I: usize, const J: usize>(
    args: &TensorCoreArgs,
    tile: TileOrigin,
    column0: u32,
    bias_of: impl Fn(u32) -> f32,
) -> [[[f32; 4]; J]; I] {
    let out_group = args.problem.out_per_group();
    let bias = args.epilogue.bias.as_ptr();
    let t = lane_id() % 4;
    let columns: [[f32; 2]; J] = core::array::from_fn(|j| {
        let column = tile.n0 + column0 + 8 * j as u32 + 2 * t;
        [column, column + 1].map(|c| {
            if bias.is_null() || c >= out_group {
                0.0
            } else {
                bias_of(tile.group * out_group + c)
            }
        })
    });
    [columns.map(|[b0, b1]| [b0, b1, b0, b1]); I]
}

/// Writes the warp's sums through the epilogue to y.
///
/// # Safety
/// `args` are the launch's (y and the residual hold the problem's output in the plan's
/// layout), `tile` a tile of its GEMM.
#[inline(always)]
pub unsafe fn store<const I: usize, const J: usize>(
    args: &TensorCoreArgs,
    tile: TileOrigin,
    warp: &WarpTiles<I, J>,
) {
    // SAFETY: forwarded.
    unsafe {
        if args.epilogue.fits_register_stores() {
            store_plain(args, tile, warp)
        } else {
            store_fused(args, tile, warp)
        }
    }
}

/// Writes the warp's sums, rectified where the activation is ReLU, to y: output pixel
/// m and channel c of the group at `y[m][channel]` (NHWC) or `y[image][channel][pixel]`
/// (NCHW).
///
/// # Safety
/// `args` are the launch's (y holds the problem's output in the plan's layout, the
/// epilogue [`ConvEpilogue::fits_register_stores`]), `tile` a tile of its GEMM.
#[inline(always)]
pub unsafe fn store_plain<const I: usize, const J: usize>(
    args: &TensorCoreArgs,
    tile: TileOrigin,
    warp: &WarpTiles<I, J>,
) {
    let p = &args.problem;
    let lane = lane_id();
    let (g, t) = (lane / 4, lane % 4);
    let (first, live) = args.plan.tile_pixels(p, tile.m0);
    let out_group = p.out_per_group();
    let y = args.y.as_mut_ptr();
    let channels_last = args.plan.y_channels_last == 1;
    // Two neighbouring channels of a pixel are 8-byte aligned in NHWC when the first is
    // even: the group's first channel is, and so the pixel's.
    let pairs = channels_last && out_group.is_multiple_of(2);
    // Constant loop bounds throughout: an index the compiler cannot unroll would move
    // the sums to local memory.
    for (i, row_tiles) in warp.sums.iter().enumerate() {
        for (j, sums) in row_tiles.iter().enumerate() {
            let column = tile.n0 + warp.origin.1 + 8 * j as u32 + 2 * t;
            // The two output channels of this lane's column pair.
            let channels = [column, column + 1].map(|c| (c < out_group, tile.group * out_group + c));
            for half in 0..2 {
                let row = warp.origin.0 + warp.row_step * i as u32 + g + 8 * half;
                if row >= live {
                    continue;
                }
                let m = first + row;
                let values = [0, 1].map(|e| args.epilogue.rectify(sums[2 * half as usize + e]));
                if channels_last {
                    let at = m as usize * p.out_channels as usize + channels[0].1 as usize;
                    if pairs && channels[1].0 {
                        // SAFETY: both channels are outputs of pixel m, 8-byte aligned.
                        unsafe { store_global_v2_f32(y.add(at), values) };
                        continue;
                    }
                    for (e, &(valid, _)) in channels.iter().enumerate() {
                        if valid {
                            // SAFETY: (m, channel) is an output of the problem, inside y.
                            unsafe { *y.add(at + e) = values[e] };
                        }
                    }
                } else {
                    let (image, pixel) = p.div_out_pixels.divmod(m);
                    for (e, &(valid, channel)) in channels.iter().enumerate() {
                        if valid {
                            let at = (image as usize * p.out_channels as usize + channel as usize)
                                * p.out_pixels() as usize
                                + pixel as usize;
                            // SAFETY: (m, channel) is an output of the problem, inside y.
                            unsafe { *y.add(at) = values[e] };
                        }
                    }
                }
            }
        }
    }
}

/// Writes the warp's sums through the fused epilogue to y: output pixel m and channel c
/// of the group at `y[m][channel]` (NHWC) or `y[image][channel][pixel]` (NCHW).
///
/// # Safety
/// `args` are the launch's (y and the residual hold the problem's output in the plan's
/// layout), `tile` a tile of its GEMM.
#[inline(always)]
unsafe fn store_fused<const I: usize, const J: usize>(
    args: &TensorCoreArgs,
    tile: TileOrigin,
    warp: &WarpTiles<I, J>,
) {
    let p = &args.problem;
    let lane = lane_id();
    let (g, t) = (lane / 4, lane % 4);
    let (first, live) = args.plan.tile_pixels(p, tile.m0);
    let out_group = p.out_per_group() as usize;
    let y = args.y.as_mut_ptr();
    let channels_last = args.plan.y_channels_last == 1;
    // Neighbouring channels are neighbours in memory in NHWC, 8-byte aligned when the
    // first is even: the group's first channel is, and so the pixel's.
    let pairs = channels_last && out_group.is_multiple_of(2);
    let channel_stride = if channels_last { 1 } else { p.out_pixels() as usize };
    // One pass per row of tiles, the row picked out of the registers by selects: this
    // loop may stay rolled (the epilogue of every row at once is past what the compiler
    // unrolls, and a rolled loop indexing the sums would move them to local memory);
    // the loops inside it unroll.
    for i in 0..I {
        let row_tiles = row_of_tiles(&warp.sums, i);
        for half in 0..2 {
            let row = warp.origin.0 + warp.row_step * i as u32 + g + 8 * half;
            if row >= live {
                continue;
            }
            let m = first + row;
            // The element of (m, the group's first channel).
            let row = if channels_last {
                m as usize * p.out_channels as usize
            } else {
                let (image, pixel) = p.div_out_pixels.divmod(m);
                image as usize * p.out_channels as usize * channel_stride + pixel as usize
            } + (tile.group as usize * out_group) * channel_stride;
            for (j, sums) in row_tiles.iter().enumerate() {
                let column = (tile.n0 + warp.origin.1 + 8 * j as u32 + 2 * t) as usize;
                let at = row + column * channel_stride;
                // Selects, not an index: the loop over halves may stay rolled too.
                let values = if half == 0 {
                    [sums[0], sums[1]]
                } else {
                    [sums[2], sums[3]]
                };
                let valid = [column < out_group, column + 1 < out_group];
                let at = [at, at + channel_stride];
                // SAFETY: a valid (m, channel) is an output of the problem, inside the
                // residual.
                let values = [0, 1].map(|e| {
                    if valid[e] {
                        unsafe { args.epilogue.apply(values[e], at[e]) }
                    } else {
                        0.0
                    }
                });
                if pairs && valid[1] {
                    // SAFETY: both are outputs of the problem, neighbours in y, 8-byte
                    // aligned.
                    unsafe { store_global_v2_f32(y.add(at[0]), values) };
                    continue;
                }
                for e in 0..2 {
                    if valid[e] {
                        // SAFETY: (m, column + e) is an output of the problem, inside y.
                        unsafe { *y.add(at[e]) = values[e] };
                    }
                }
            }
        }
    }
}

/// Row `i` of the tiles, by comparisons with constant indices only.
#[inline(always)]
fn row_of_tiles<const I: usize, const J: usize>(sums: &[[[f32; 4]; J]; I], i: usize) -> [[f32; 4]; J] {
    let mut row = sums[0];
    for (k, candidate) in sums.iter().enumerate().skip(1) {
        if k == i {
            row = *candidate;
        }
    }
    row
}
