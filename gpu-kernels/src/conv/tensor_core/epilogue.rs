//! The epilogue of both tensor-core kernels: each warp's sums, which start from the
//! bias, through the fused epilogue (activation, residual), stored from registers in
//! the plan's layout.

use super::*;
use crate::conv::sub_pixel::PhaseShuffle;
use crate::device::{Float16, Shuffle, lane_id, store_global_v2_f32, store_global_v4, thread_idx_x};

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

/// A warpgroup's sums of the transposed GEMM (a tile of 64 output channels by 256
/// pixels, m64n256): warp `w`, lane `4 g + t` holds channels `16 w + g` (in elements 0
/// and 1 of each four) and `16 w + g + 8` (elements 2 and 3), pixels `8 j + 2 t` and
/// `8 j + 2 t + 1` of `self[j]`.
pub type ChannelRowSums = [[f32; 4]; 32];

/// The lane's first channel of a transposed tile, of its group (the second is 8 on).
#[inline(always)]
fn lane_channel(tile: TileOrigin) -> u32 {
    tile.n0 + 16 * (thread_idx_x() / 32 % 4) + lane_id() / 4
}

/// The sums a warpgroup's transposed tile starts from: the bias of each of the lane's
/// two channels (zero without one, or past the group's channels).
///
/// # Safety
/// As [`bias_sums`].
#[inline(always)]
pub unsafe fn channel_row_sums(
    args: &TensorCoreArgs,
    tile: TileOrigin,
    bias_of: impl Fn(u32) -> f32,
) -> ChannelRowSums {
    let out_group = args.problem.out_per_group();
    let bias = args.epilogue.bias.as_ptr();
    let first = lane_channel(tile);
    let [b0, b1] = [first, first + 8].map(|c| {
        if bias.is_null() || c >= out_group {
            0.0
        } else {
            bias_of(tile.group * out_group + c)
        }
    });
    [[b0, b0, b1, b1]; 32]
}

/// An element type of y: f32, or a 16-bit float each output is rounded to once.
pub trait Output: Copy {
    /// Whether the per-output epilogue (SiLU, GELU, a residual) has a path for it:
    /// only f32 (16-bit plans take a bias, ReLU or neither).
    const PER_OUTPUT: bool;
    /// Whether this is f32, the type the parts of a split K write whatever y's is: a
    /// kernel of f32 y then has one store path, not two copies of it.
    const IS_F32: bool;
    fn from_f32(value: f32) -> Self;

    /// Writes `values` to the two elements at `at` with one access.
    ///
    /// # Safety
    /// `at` points to two writable elements of global memory, aligned to their size.
    unsafe fn store_pair(at: *mut Self, values: [f32; 2]);
}

impl Output for f32 {
    const PER_OUTPUT: bool = true;
    const IS_F32: bool = true;
    #[inline(always)]
    fn from_f32(value: f32) -> Self {
        value
    }

    #[inline(always)]
    unsafe fn store_pair(at: *mut Self, values: [f32; 2]) {
        // SAFETY: the caller's contract.
        unsafe { crate::device::store_global_v2_f32(at, values) };
    }
}

macro_rules! output_of_half {
    ($($t:ty),*) => {$(
        impl Output for $t {
            const PER_OUTPUT: bool = false;
            const IS_F32: bool = false;
            #[inline(always)]
            fn from_f32(value: f32) -> Self {
                <$t as crate::device::Float16>::narrow(value)
            }

            #[inline(always)]
            unsafe fn store_pair(at: *mut Self, [a, b]: [f32; 2]) {
                let bits = <$t as crate::device::Float16>::narrow_pair(a, b);
                // SAFETY: the caller's contract: 4 bytes, 4-byte aligned.
                unsafe { *at.cast::<u32>() = bits };
            }
        }
    )*};
}

output_of_half!(half::bf16, half::f16);

/// Writes a warpgroup's transposed sums through the epilogue to y (of `T`s), in the
/// plan's layout.
///
/// # Safety
/// As [`store`]; y holds `T`s, and without `T::PER_OUTPUT` the epilogue fits register
/// stores.
#[inline(always)]
pub unsafe fn store_channel_rows<T: Output>(args: &TensorCoreArgs, tile: TileOrigin, sums: &ChannelRowSums) {
    // SAFETY: forwarded.
    unsafe { ChannelRows::<T>::of(args, tile).store_through(args, sums) }
}

/// [`store_channel_rows`] of 16-bit outputs into NCHW y: where every channel row
/// starts at a 4-byte boundary (even output rows), in 16-byte runs aligned in y
/// ([`ChannelRows::store_runs`]).
///
/// # Safety
/// As [`store_channel_rows`].
#[inline(always)]
pub unsafe fn store_channel_rows_first<T: Output + Float16>(
    args: &TensorCoreArgs,
    tile: TileOrigin,
    sums: &ChannelRowSums,
) {
    let rows = ChannelRows::<T>::of(args, tile);
    // Channel rows at 4-byte boundaries: y's, and even planes and row starts. The
    // launch's alone, so that the warp stays converged for the shuffles.
    let words = (args.y.as_mut_ptr() as usize).is_multiple_of(4) && args.problem.out_w.is_multiple_of(2);
    // SAFETY: forwarded; 16-bit outputs take no per-output epilogue.
    unsafe {
        if args.plan.y_channels_last == 0 && words {
            rows.store_runs(sums, |value| args.epilogue.rectify(value));
        } else {
            rows.store_through(args, sums);
        }
    }
}

/// Where a lane's outputs of a transposed tile lie in y: its first channel at its first
/// pixel (`first`, the element `index`), the elements from pixel to pixel (`stride`) and
/// to its second channel (`second`), which channels are outputs, how many pixels from
/// its first are (`remaining`; from the tile's first, `live`), and whether both pixels
/// of a tile are stored with one access (`paired`: adjacent and aligned).
struct ChannelRows<T> {
    first: *mut T,
    index: usize,
    stride: usize,
    second: usize,
    valid: [bool; 2],
    remaining: u32,
    live: u32,
    paired: bool,
}

impl<T: Output> ChannelRows<T> {
    /// The lane's outputs of the warpgroup's transposed `tile`: its pixels lie in one
    /// output row, so that pixel `i` of a channel is `i` strides on from the channel's
    /// first (NHWC: `out_channels` elements, NCHW: one).
    #[inline(always)]
    fn of(args: &TensorCoreArgs, tile: TileOrigin) -> Self {
        let p = &args.problem;
        let (first, live) = args.plan.tile_pixels(p, tile.m0);
        let out_group = p.out_per_group();
        let lane = lane_id();
        let channel = lane_channel(tile);
        let valid = [channel < out_group, channel + 8 < out_group];
        let channel = (tile.group * out_group + channel) as usize;
        let (index, stride, second) = if args.plan.y_channels_last == 1 {
            let index = first as usize * p.out_channels as usize + channel;
            (index, p.out_channels as usize, 8)
        } else {
            let (image, pixel) = p.div_out_pixels.divmod(first);
            let plane = p.out_pixels() as usize;
            (
                (image as usize * p.out_channels as usize + channel) * plane + pixel as usize,
                1,
                8 * plane,
            )
        };
        // The lane's first pixel, 2t of the tile.
        let pixel = 2 * (lane % 4);
        let index = index + pixel as usize * stride;
        Self {
            // SAFETY: an element of y where the lane has outputs (else never written).
            first: args.y.as_mut_ptr().cast::<T>().wrapping_add(index),
            index,
            stride,
            second,
            valid,
            remaining: live.saturating_sub(pixel),
            live,
            // NCHW: the lane's two pixels of a tile are adjacent, one access where the
            // first is at an even element (`second`, 8 planes, keeps the parity).
            paired: stride == 1 && index.is_multiple_of(2),
        }
    }

    /// Writes the sums through the launch's epilogue.
    ///
    /// # Safety
    /// As [`store_channel_rows`]; `self` is of its tile.
    #[inline(always)]
    unsafe fn store_through(&self, args: &TensorCoreArgs, sums: &ChannelRowSums) {
        // SAFETY: forwarded. Both epilogues as code of their own: a test per output
        // would stay in the plain one; NHWC's second channel 8 elements on, an offset
        // the stores carry.
        unsafe {
            if T::PER_OUTPUT && !args.epilogue.fits_register_stores() {
                self.store::<false>(sums, |value, at| args.epilogue.apply(value, at));
            } else if args.plan.y_channels_last == 1 {
                self.store::<true>(sums, |value, _| args.epilogue.rectify(value));
            } else {
                self.store::<false>(sums, |value, _| args.epilogue.rectify(value));
            }
        }
    }

    /// Writes `output(sum, index)` of each of the lane's outputs to y at its index, in
    /// parts of two tiles written out one after another: a loop over the parts may
    /// stay rolled where `output` is long (the fused epilogue), and one that indexes
    /// the sums would move them to local memory. `NHWC`: `second` is 8.
    ///
    /// # Safety
    /// The fields describe outputs of the problem inside y, and `output` may read the
    /// residual at their indices.
    #[inline(always)]
    unsafe fn store<const NHWC: bool>(&self, sums: &ChannelRowSums, output: impl Fn(f32, usize) -> f32) {
        let (parts, _) = sums.as_chunks::<2>();
        macro_rules! store_parts {
            ($($part:literal)*) => {
                // SAFETY: forwarded.
                $( unsafe { self.store_part::<NHWC>(&parts[$part], 2 * $part, &output) }; )*
            };
        }
        store_parts!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
    }

    /// [`Self::store`] of the tiles `first` and `first + 1`: pointers stepped from
    /// pixel to pixel, so that each store costs an add or none.
    ///
    /// # Safety
    /// As [`Self::store`].
    #[inline(always)]
    unsafe fn store_part<const NHWC: bool>(
        &self,
        part: &[[f32; 4]; 2],
        first: u32,
        output: &impl Fn(f32, usize) -> f32,
    ) {
        let second = if NHWC { 8 } else { self.second };
        let step = 8 * self.stride;
        let mut at = self.index + first as usize * step;
        let mut row = self.first.wrapping_add(first as usize * step);
        for (j, pair) in part.iter().enumerate() {
            if !NHWC && self.paired && 8 * (first + j as u32) + 1 < self.remaining {
                // SAFETY: as below, both pixels; `paired` says they are adjacent and
                // the first at an even element.
                unsafe {
                    if self.valid[0] {
                        T::store_pair(row, [output(pair[0], at), output(pair[1], at + 1)]);
                    }
                    if self.valid[1] {
                        let values = [output(pair[2], at + second), output(pair[3], at + second + 1)];
                        T::store_pair(row.add(second), values);
                    }
                }
                at += step;
                row = row.wrapping_add(step);
                continue;
            }
            for e in 0..2 {
                if 8 * (first + j as u32) + e < self.remaining {
                    let (at, row) = (
                        at + e as usize * self.stride,
                        row.wrapping_add(e as usize * self.stride),
                    );
                    // SAFETY: the caller's contract: a remaining pixel of a valid
                    // channel is an output.
                    unsafe {
                        if self.valid[0] {
                            *row = T::from_f32(output(pair[e as usize], at));
                        }
                        if self.valid[1] {
                            *row.add(second) = T::from_f32(output(pair[2 + e as usize], at + second));
                        }
                    }
                }
            }
            at += step;
            row = row.wrapping_add(step);
        }
    }
}

impl<T: Output + Float16> ChannelRows<T> {
    /// Writes `output(sum)` of each of the lane's outputs into NCHW rows that start at
    /// 4-byte boundaries, in runs of 8 outputs that start at 16-byte boundaries: the
    /// lanes of each quad (one channel, pixels `2t` and `2t + 1` of each
    /// tile of 8) exchange their pairs so that lane `t` holds tile `4 q + t` of quad
    /// `q` of tiles, then the words of the tile before, so that it stores the aligned
    /// run that ends inside its tile. A warp then writes whole 32-byte sectors but at
    /// the tile's two ends, where pairs wrote halves of sectors of 8 planes at a time
    /// (which L2 merged, reading some back from memory).
    ///
    /// # Safety
    /// The fields describe outputs of the problem inside NCHW y whose channel rows start
    /// at 4-byte boundaries; the warp calls it converged (shuffles).
    #[inline(always)]
    unsafe fn store_runs(&self, sums: &ChannelRowSums, output: impl Fn(f32) -> f32) {
        let t = lane_id() % 4;
        // The tile's first pixel of the lane's first channel, and the words (pairs) it
        // lies past a 16-byte boundary: its runs start that many words earlier.
        let tile_start = self.first.wrapping_sub(2 * t as usize);
        let shift = tile_start as usize % 16 / 4;
        let (quads, _) = sums.as_chunks::<4>();
        // Per channel, the last 3 words of the tile before the quad's first (lane 0's).
        let mut carried = [[0u32; 3]; 2];
        macro_rules! store_quads {
            ($($quad:literal)*) => {
                // SAFETY: forwarded.
                $( unsafe {
                    self.store_quad(&quads[$quad], 4 * $quad, tile_start, shift, &mut carried, &output)
                }; )*
            };
        }
        store_quads!(0 1 2 3 4 5 6 7);
    }

    /// [`Self::store_runs`] of the tiles `first..first + 4`.
    ///
    /// # Safety
    /// As [`Self::store_runs`]; `tile_start` is the tile's first output of the lane's
    /// first channel, `shift` the words it lies past a 16-byte boundary.
    #[inline(always)]
    unsafe fn store_quad(
        &self,
        tiles: &[[f32; 4]; 4],
        first: u32,
        tile_start: *mut T,
        shift: usize,
        carried: &mut [[u32; 3]; 2],
        output: &impl Fn(f32) -> f32,
    ) {
        let t = lane_id() % 4;
        let before = (lane_id() & !3) | ((t + 3) % 4);
        let tile = first + t;
        // Tile pixel of the run's first output: `2 shift` before the tile's.
        let run_start = 8 * tile as usize;
        for (h, valid) in self.valid.into_iter().enumerate() {
            let pairs = tiles.map(|sums| T::narrow_pair(output(sums[2 * h]), output(sums[2 * h + 1])));
            let own = transpose_quad(pairs, t);
            let last = [own[1], own[2], own[3]].map(|word| word.shfl_idx(before));
            let previous = if t == 0 { carried[h] } else { last };
            carried[h] = last;
            // The run: words `3 - shift..` of the tile before's last three and the
            // tile's four, moved by one word and by two as `shift`'s bits say, by
            // selects of single words (selects of an array's elements become an index
            // into it, which puts the array in local memory).
            let ([p0, p1, p2], [o0, o1, o2, o3]) = (previous, own);
            let pick = |take_first: bool, first: u32, second: u32| if take_first { first } else { second };
            let by_one = shift & 1 == 1;
            let (b0, b1, b2) = (pick(by_one, p0, p1), pick(by_one, p1, p2), pick(by_one, p2, o0));
            let (b3, b4, b5) = (pick(by_one, o0, o1), pick(by_one, o1, o2), pick(by_one, o2, o3));
            let by_two = shift & 2 == 2;
            let run = [
                pick(by_two, b0, b2),
                pick(by_two, b1, b3),
                pick(by_two, b2, b4),
                pick(by_two, b3, b5),
            ];
            let row = tile_start.wrapping_add(h * self.second);
            // Pixel `p` of the tile is stored where `p` lies in 0..live, the run's
            // (`p` from `run_start - 2 shift`) and, past the quads' last run, the words
            // of the last tile it leaves.
            let live = |p: usize| p < self.live as usize;
            if !valid {
                continue;
            }
            // SAFETY: the caller's contract: these pixels of a valid channel lie in
            // its row of the tile (`live`), words at 4-byte boundaries, runs at 16-byte
            // ones (`shift`; `second`, 8 planes, keeps both).
            unsafe {
                if run_start >= 2 * shift && live(run_start - 2 * shift + 7) {
                    store_global_v4(row.wrapping_add(run_start - 2 * shift).cast(), run);
                } else {
                    for (i, word) in run.into_iter().enumerate() {
                        let p = (run_start + 2 * i).wrapping_sub(2 * shift);
                        if run_start + 2 * i >= 2 * shift && live(p) {
                            *row.wrapping_add(p).cast::<u32>() = word;
                        }
                    }
                }
                if tile == NHWC_STRIP_TILE_ROWS / 8 - 1 {
                    for (i, word) in own.into_iter().enumerate() {
                        let p = run_start + 2 * i;
                        if i + shift >= 4 && live(p) {
                            *row.wrapping_add(p).cast::<u32>() = word;
                        }
                    }
                }
            }
        }
    }
}

/// Transposes a quad's 4 x 4 values: lane `t` of the quad holds element `(j, t)` in
/// `values[j]` and gets element `(t, j)` there. Two exchanges, each swapping one bit
/// of the lane with that bit of the index (lanes 1 apart, then 2 apart), each of two
/// shuffles: a lane sends the values whose bit differs from its own.
///
/// The warp calls it converged.
#[inline(always)]
fn transpose_quad(mut values: [u32; 4], t: u32) -> [u32; 4] {
    for bit in [1, 2] {
        let high = t & bit != 0;
        for low in [0, 1] {
            // The pair of indices that differ in `bit` only.
            let (i0, i1) = if bit == 1 {
                (2 * low, 2 * low + 1)
            } else {
                (low, low + 2)
            };
            let sent = if high { values[i0] } else { values[i1] };
            let got = sent.shfl_xor(bit);
            if high {
                values[i0] = got;
            } else {
                values[i1] = got;
            }
        }
    }
    values
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
            store_plain::<f32, I, J>(args, tile, warp)
        } else {
            store_fused(args, tile, warp)
        }
    }
}

/// Writes the warp's sums, rectified where the activation is ReLU, to y (of `T`s): output
/// pixel m and channel c of the group at `y[m][channel]` (NHWC) or
/// `y[image][channel][pixel]` (NCHW).
///
/// # Safety
/// `args` are the launch's (y holds the problem's output in the plan's layout, the
/// epilogue [`ConvEpilogue::fits_register_stores`]), `tile` a tile of its GEMM.
#[inline(always)]
pub unsafe fn store_plain<T: Output, const I: usize, const J: usize>(
    args: &TensorCoreArgs,
    tile: TileOrigin,
    warp: &WarpTiles<I, J>,
) {
    let p = &args.problem;
    let t = lane_id() % 4;
    let out_group = p.out_per_group();
    let y = args.y.as_mut_ptr().cast::<T>();
    let channels_last = args.plan.y_channels_last == 1;
    // Two neighbouring channels of a pixel are aligned to two elements in NHWC when the
    // first is even: the group's first channel is, and so the pixel's.
    let pairs = channels_last && out_group.is_multiple_of(2);
    let channel_stride = if channels_last { 1 } else { p.out_pixels() as usize };
    let row_starts = lane_rows(args, tile, warp, |m| {
        Some(if channels_last {
            m as usize * p.out_channels as usize
        } else {
            let (image, pixel) = p.div_out_pixels.divmod(m);
            image as usize * p.out_channels as usize * channel_stride + pixel as usize
        })
    });
    // Every tile written out: a loop left rolled (the 16-bit stores are long enough for
    // the unroller to give up) would index the sums in local memory.
    let store_tile = |i: usize, j: usize| {
        let Some(sums) = warp.sums.get(i).and_then(|row_tiles| row_tiles.get(j)) else {
            return;
        };
        let column = tile.n0 + warp.origin.1 + 8 * j as u32 + 2 * t;
        // The two output channels of this lane's column pair.
        let channels = [column, column + 1].map(|c| (c < out_group, tile.group * out_group + c));
        for (half, row_start) in row_starts[i].into_iter().enumerate() {
            let Some(row_start) = row_start else { continue };
            let values = [0, 1].map(|e| args.epilogue.rectify(sums[2 * half + e]));
            let at = row_start + channels[0].1 as usize * channel_stride;
            if pairs && channels[1].0 {
                // SAFETY: both channels are outputs of the row's pixel, adjacent and
                // aligned to two elements in NHWC.
                unsafe { T::store_pair(y.add(at), values) };
                continue;
            }
            for (e, &(valid, _)) in channels.iter().enumerate() {
                if valid {
                    // SAFETY: (pixel, channel) is an output of the problem, inside y.
                    unsafe { *y.add(at + e * channel_stride) = T::from_f32(values[e]) };
                }
            }
        }
    };
    each_tile::<I, J>(store_tile);
}

/// `at(m)` for the output pixel m of each of the lane's rows of the warp's tiles (rows
/// of tiles by halves), none past the tile's live pixels: found once, where the
/// tiles' unrolled stores would otherwise each divide the pixel index again.
#[inline(always)]
fn lane_rows<R, const I: usize, const J: usize>(
    args: &TensorCoreArgs,
    tile: TileOrigin,
    warp: &WarpTiles<I, J>,
    at: impl Fn(u32) -> Option<R>,
) -> [[Option<R>; 2]; I] {
    let g = lane_id() / 4;
    let (first, live) = args.plan.tile_pixels(&args.problem, tile.m0);
    core::array::from_fn(|i| {
        [0, 1].map(|half| {
            let row = warp.origin.0 + warp.row_step * i as u32 + g + 8 * half;
            if row < live { at(first + row) } else { None }
        })
    })
}

/// Calls `store_tile(i, j)` for every tile of a warp's `I x J` and beyond, up to 4 x
/// 16 (those past the warp's it must skip), as unrolled code: a loop left rolled (the
/// 16-bit stores are long enough for the unroller to give up) would index the sums in
/// local memory.
#[inline(always)]
fn each_tile<const I: usize, const J: usize>(store_tile: impl Fn(usize, usize)) {
    const { assert!(I <= 4 && J <= 16) };
    macro_rules! store_tiles {
        ($($j:literal)*) => {
            $( store_tile(0, $j); store_tile(1, $j); store_tile(2, $j); store_tile(3, $j); )*
        };
    }
    store_tiles!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
}

/// Where the register epilogue (a bias, ReLU or neither) writes a tile's sums: y as
/// the plan lays it out, or dx by a [`PhaseShuffle`].
pub trait Placement: Copy {
    /// Writes the warp's sums through the epilogue, each output as `T`.
    ///
    /// # Safety
    /// As [`store_plain`], y laid out as this placement writes it.
    unsafe fn store<T: Output, const I: usize, const J: usize>(
        &self,
        args: &TensorCoreArgs,
        tile: TileOrigin,
        warp: &WarpTiles<I, J>,
    );
}

/// y as the plan lays it out ([`store_plain`]).
#[derive(Clone, Copy)]
pub struct InPlace;

impl Placement for InPlace {
    #[inline(always)]
    unsafe fn store<T: Output, const I: usize, const J: usize>(
        &self,
        args: &TensorCoreArgs,
        tile: TileOrigin,
        warp: &WarpTiles<I, J>,
    ) {
        // SAFETY: forwarded.
        unsafe { store_plain::<T, I, J>(args, tile, warp) }
    }
}

impl Placement for PhaseShuffle {
    /// Output pixel m and channels c, c + 1 of the group (phase q, x's channels c' and
    /// c' + 1: x's channels per group are even) at the phase's pixel of dx, channels c'
    /// and c' + 1 of the group, together; nothing where that pixel lies past dx's edge
    /// (or before the phases' first output).
    #[inline(always)]
    unsafe fn store<T: Output, const I: usize, const J: usize>(
        &self,
        args: &TensorCoreArgs,
        tile: TileOrigin,
        warp: &WarpTiles<I, J>,
    ) {
        let p = &args.problem;
        let t = lane_id() % 4;
        let out_group = p.out_per_group();
        let dx = args.y.as_mut_ptr().cast::<T>();
        let pixels = lane_rows(args, tile, warp, |m| self.pixel(p, m));
        let store_tile = |i: usize, j: usize| {
            let Some(sums) = warp.sums.get(i).and_then(|row_tiles| row_tiles.get(j)) else {
                return;
            };
            // Both columns of the pair, or neither: the group's channels are even.
            let column = tile.n0 + warp.origin.1 + 8 * j as u32 + 2 * t;
            if column >= out_group {
                return;
            }
            let channel = self.channel(tile.group, column);
            for (half, pixel) in pixels[i].into_iter().enumerate() {
                if let Some(at) = pixel.and_then(|pixel| pixel.place(channel)) {
                    let values = [0, 1].map(|e| args.epilogue.rectify(sums[2 * half + e]));
                    // SAFETY: two channels of one pixel of dx, aligned to two elements
                    // (dx's channels are even).
                    unsafe { T::store_pair(dx.add(at as usize), values) };
                }
            }
        };
        each_tile::<I, J>(store_tile);
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
