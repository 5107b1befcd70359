//! The depthwise stencil's column kernels, for NHWC tensors of one channel per group,
//! stride 1 and undilated square windows of 3 or 5: the forward pass, the input
//! gradient through the flipped window, and the weight gradient. A thread takes `COLUMN_CHANNELS` adjacent
//! channels of one output column and walks down a run of its output rows, loading each
//! input row's window columns once, as one 8-byte (16-bit) or 16-byte (f32) vector
//! each, and adding that row into the `SIZE` outputs it serves (a rolling set of sums
//! in registers). The block's filters go through shared memory once, into registers.
//! Where the shared-window stencil stages each window in shared memory and reads every
//! input `SIZE * SIZE` times from there, one scalar per lane (bound by its
//! instructions), this one reads each input from L1 about `SIZE (rows + SIZE - 1) /
//! rows` times, four channels an access. Each output sums its taps in the stencil's
//! order (window rows, then columns, from zero), then the bias and the epilogue: the
//! same bits as the shared-window kernels. The weight gradient walks the same runs,
//! holding the last `SIZE` rows of its window of x, and sums dy times the window per
//! tap; the warps' sums meet in shared memory, a gradient per block.

use super::FastDiv;
use super::stencil::{STENCIL_THREADS, StencilPlan};
use crate::launch::LaunchGeometry;

/// Channels of a thread: one vector access of the element type.
pub const COLUMN_CHANNELS: u32 = 4;
/// Channels of a block (grid y): a thread's per lane.
pub const COLUMN_BLOCK_CHANNELS: u32 = 32 * COLUMN_CHANNELS;
/// Output columns of a block: a warp each.
const COLUMN_WARPS: u32 = STENCIL_THREADS / 32;
/// Output rows of a thread's run at most: more rows load fewer halo rows per output,
/// fewer make more threads.
const MOST_ROWS: u32 = 8;

/// How the column kernels split a pass's outputs: runs of `rows` output rows,
/// `div_runs` of them per plane column, and groups of `COLUMN_WARPS` output columns,
/// `div_groups` per row.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColumnRuns {
    pub rows: u32,
    pub div_runs: FastDiv,
    pub div_groups: FastDiv,
}

impl ColumnRuns {
    /// Runs of at most `MOST_ROWS` rows, as even as they go, over planes of `out_h x
    /// out_w` outputs.
    pub const fn new(out_h: u32, out_w: u32) -> Self {
        let runs = out_h.div_ceil(MOST_ROWS);
        Self {
            rows: out_h.div_ceil(runs),
            div_runs: FastDiv::new(runs),
            div_groups: FastDiv::new(out_w.div_ceil(COLUMN_WARPS)),
        }
    }
}

impl StencilPlan {
    /// Whether the column kernels take this plan over tensors at `addresses` (the input's
    /// and the output's, or-ed) of `element_bytes` elements: NHWC, one plane read per
    /// plane written (no channel multiplier), stride 1, undilated windows of 3 or 5,
    /// planes in whole vectors from aligned tensors, and a grid that holds the runs.
    pub const fn takes_columns(&self, addresses: u64, element_bytes: u32) -> bool {
        let vector_bytes = (COLUMN_CHANNELS * element_bytes) as u64;
        let blocks =
            self.batch as u64 * self.runs.div_runs.divisor as u64 * self.runs.div_groups.divisor as u64;
        self.channels_last == 1
            && self.terms == 1
            && self.in_planes == self.out_planes
            && self.stride_h == 1
            && self.stride_w == 1
            && self.dilation_h == 1
            && self.dilation_w == 1
            && self.kernel_h == self.kernel_w
            && (self.kernel_h == 3 || self.kernel_h == 5)
            && self.out_planes.is_multiple_of(COLUMN_CHANNELS)
            && addresses.is_multiple_of(vector_bytes)
            && blocks < 1 << 31
            && self.out_planes.div_ceil(COLUMN_BLOCK_CHANNELS) <= 65535
    }

    /// Blocks of the column kernels along x: one per image, run of rows and group of
    /// columns. The weight gradient's parts: a gradient of each.
    pub const fn column_parts(&self) -> u32 {
        self.batch * self.runs.div_runs.divisor * self.runs.div_groups.divisor
    }

    /// The column kernels' grid: [`Self::column_parts`] (x) by `COLUMN_BLOCK_CHANNELS`
    /// channels (y); the block's filters in shared memory.
    pub const fn columns_geometry(&self) -> LaunchGeometry {
        LaunchGeometry {
            grid: [
                self.column_parts() as u64,
                self.out_planes.div_ceil(COLUMN_BLOCK_CHANNELS) as u64,
                1,
            ],
            threads: STENCIL_THREADS,
            shared_bytes: self.kernel_h * self.kernel_w * COLUMN_BLOCK_CHANNELS * 4,
        }
    }

    /// The weight-gradient column kernel's grid: that of the forward pass, with each
    /// warp's sums of every tap and channel of the block in shared memory.
    pub const fn weight_grad_columns_geometry(&self) -> LaunchGeometry {
        let mut geometry = self.columns_geometry();
        geometry.shared_bytes *= COLUMN_WARPS;
        geometry
    }
}

#[cfg(target_arch = "nvptx64")]
pub(super) mod kernel {
    use super::*;
    use crate::conv::stencil::{StencilArgs, StencilWeightGradArgs};
    use crate::conv::tensor_core::Output;
    use crate::device::{
        Widen, block_idx_x, block_idx_y, fma_f32, load_global_nc_v2, load_global_nc_v4, load_shared_f32,
        load_shared_v4_f32, shared_base, store_shared_f32, sync_threads, thread_idx_x,
    };

    /// The element types of the column kernels: `COLUMN_CHANNELS` adjacent elements
    /// loaded with one access and widened to f32.
    pub trait ColumnElement: Widen<Sum = f32> + Output {
        /// # Safety
        /// `at` points to `COLUMN_CHANNELS` readable elements, aligned to their size
        /// together, that no thread writes during the launch.
        unsafe fn load_vector(at: *const Self) -> [f32; COLUMN_CHANNELS as usize];
    }

    impl ColumnElement for f32 {
        #[inline(always)]
        unsafe fn load_vector(at: *const f32) -> [f32; COLUMN_CHANNELS as usize] {
            // SAFETY: the caller's contract: 16 aligned bytes.
            unsafe { load_global_nc_v4(at.cast()) }.map(f32::from_bits)
        }
    }

    macro_rules! column_element_of_half {
        ($($t:ty),*) => {$(
            impl ColumnElement for $t {
                #[inline(always)]
                unsafe fn load_vector(at: *const $t) -> [f32; COLUMN_CHANNELS as usize] {
                    // SAFETY: the caller's contract: 8 aligned bytes.
                    let [low, high] = unsafe { load_global_nc_v2(at.cast()) };
                    let half = |word: u32, shift: u32| Widen::widen(<$t>::from_bits((word >> shift) as u16));
                    [half(low, 0), half(low, 16), half(high, 0), half(high, 16)]
                }
            }
        )*};
    }

    column_element_of_half!(half::bf16, half::f16);

    /// Taps of the largest window.
    const MOST_TAPS: usize = 25;

    /// This thread's run: the block stages its channels' filters (flipped for the input
    /// gradient) as `[tap][channel]` in shared memory, each thread takes its four
    /// channels' into registers, then walks down the input rows of its run, adding each
    /// into the outputs it serves and storing each output once its last row is in.
    ///
    /// # Safety
    /// `input`, `w` and `output` (and the epilogue's bias and residual) hold the plan's
    /// tensors, NHWC; the plan takes the column kernels for them
    /// ([`StencilPlan::takes_columns`]); the launch is [`StencilPlan::launch`]'s, with
    /// [`StencilPlan::columns_geometry`].
    #[inline(always)]
    pub unsafe fn columns<T: ColumnElement, const SIZE: u32>(args: StencilArgs<T>) {
        let plan = args.plan;
        let taps = SIZE * SIZE;
        let t = thread_idx_x();
        let (lane, warp) = (t % 32, t / 32);
        let block_channel = block_idx_y() * COLUMN_BLOCK_CHANNELS;
        let filters = shared_base();
        let w = args.w.as_ptr();
        let mut e = t;
        // Consecutive threads read consecutive weights: a channel's taps lie together.
        while e < taps * COLUMN_BLOCK_CHANNELS {
            let (c, tap) = (e / taps, e % taps);
            let channel = block_channel + c;
            let tap_read = if plan.flip == 1 { taps - 1 - tap } else { tap };
            let weight = if channel < plan.out_planes {
                // SAFETY: a tap of the channel's filter.
                unsafe { *w.add((channel * taps + tap_read) as usize) }
            } else {
                0.0
            };
            // SAFETY: slot (tap, c) of the staged filters, this thread's alone.
            unsafe { store_shared_f32(filters + (tap * COLUMN_BLOCK_CHANNELS + c) * 4, weight) };
            e += STENCIL_THREADS;
        }
        // SAFETY: the whole block; the filters are read after it.
        unsafe { sync_threads() };
        let channel = block_channel + lane * COLUMN_CHANNELS;
        let (rest, group) = plan.runs.div_groups.divmod(block_idx_x());
        let (image, run) = plan.runs.div_runs.divmod(rest);
        let ow = group * COLUMN_WARPS + warp;
        let first_row = run * plan.runs.rows;
        if channel >= plan.out_planes || ow >= plan.out_w || first_row >= plan.out_h {
            return;
        }
        let rows = plan.runs.rows.min(plan.out_h - first_row);
        let mut weights = [[0.0f32; COLUMN_CHANNELS as usize]; MOST_TAPS];
        for (tap, weight) in weights.iter_mut().enumerate().take(taps as usize) {
            let address = filters + (tap as u32 * COLUMN_BLOCK_CHANNELS + lane * COLUMN_CHANNELS) * 4;
            // SAFETY: the thread's four channels of the tap, staged before the barrier.
            *weight = unsafe { load_shared_v4_f32(address) };
        }
        let bias = args.epilogue.bias.as_ptr();
        let bias: [f32; COLUMN_CHANNELS as usize] = core::array::from_fn(|k| {
            // SAFETY: the bias, when there is one, holds out_planes values.
            if bias.is_null() {
                0.0
            } else {
                unsafe { *bias.add(channel as usize + k) }
            }
        });
        let planes = plan.out_planes as usize;
        let input = args.input.as_ptr();
        let in_image = image as usize * plan.in_h as usize * plan.in_w as usize * planes;
        let out_image = image as usize * plan.out_h as usize * plan.out_w as usize * planes;
        // sums[j]: the output row `i - (SIZE - 1) + j` of input row `i`, which that row
        // reaches through tap row `SIZE - 1 - j`.
        let mut sums = [[0.0f32; COLUMN_CHANNELS as usize]; 5];
        for i in 0..rows + SIZE - 1 {
            let ih = (first_row + i).wrapping_sub(plan.pad_h);
            let mut row = [[0.0f32; COLUMN_CHANNELS as usize]; 5];
            if ih < plan.in_h {
                for (kw, values) in row.iter_mut().enumerate().take(SIZE as usize) {
                    let iw = (ow + kw as u32).wrapping_sub(plan.pad_w);
                    if iw < plan.in_w {
                        let at = in_image + (ih as usize * plan.in_w as usize + iw as usize) * planes;
                        // SAFETY: the pixel lies inside the image, its four channels
                        // inside the planes (a multiple of four), aligned.
                        *values = unsafe { T::load_vector(input.add(at + channel as usize)) };
                    }
                }
            }
            for (j, sum) in sums.iter_mut().enumerate().take(SIZE as usize) {
                let tap_row = SIZE as usize - 1 - j;
                for kw in 0..SIZE as usize {
                    let weight = weights[tap_row * SIZE as usize + kw];
                    for k in 0..COLUMN_CHANNELS as usize {
                        sum[k] = fma_f32(row[kw][k], weight[k], sum[k]);
                    }
                }
            }
            if i >= SIZE - 1 {
                let oh = first_row + i - (SIZE - 1);
                let at =
                    out_image + (oh as usize * plan.out_w as usize + ow as usize) * planes + channel as usize;
                // SAFETY: each of the four outputs is an element of the output (and of
                // the residual); `at` is a multiple of four: two aligned pairs.
                unsafe {
                    let value = |k: usize| args.epilogue.apply(sums[0][k] + bias[k], at + k);
                    let output = args.output.as_mut_ptr().add(at);
                    T::store_pair(output, [value(0), value(1)]);
                    T::store_pair(output.add(2), [value(2), value(3)]);
                }
            }
            for j in 0..SIZE as usize - 1 {
                sums[j] = sums[j + 1];
            }
            sums[SIZE as usize - 1] = [0.0; COLUMN_CHANNELS as usize];
        }
    }

    /// This block's part of the weight gradient: each thread walks down its run as the
    /// forward kernel does, keeping the last `SIZE` rows of its window of x in
    /// registers, and adds per tap dy times the window under it over its outputs
    /// (rows in order); the warps' sums meet in shared memory and are added in warp
    /// order into the part's gradient of the block's channels.
    ///
    /// # Safety
    /// `x` and `dy` hold the forward plan's input and output tensors, NHWC, and the
    /// plan takes the column kernels for them ([`StencilPlan::takes_columns`]); `out`
    /// holds a gradient per part ([`StencilPlan::column_parts`]); the launch is
    /// [`StencilPlan::weight_grad_launches`]', with
    /// [`StencilPlan::weight_grad_columns_geometry`].
    #[inline(always)]
    pub unsafe fn weight_grad_columns<T: ColumnElement, const SIZE: u32>(args: StencilWeightGradArgs<T>) {
        let plan = args.plan;
        let taps = SIZE * SIZE;
        let t = thread_idx_x();
        let (lane, warp) = (t % 32, t / 32);
        let block_channel = block_idx_y() * COLUMN_BLOCK_CHANNELS;
        let channel = block_channel + lane * COLUMN_CHANNELS;
        let (rest, group) = plan.runs.div_groups.divmod(block_idx_x());
        let (image, run) = plan.runs.div_runs.divmod(rest);
        let ow = group * COLUMN_WARPS + warp;
        let first_row = run * plan.runs.rows;
        let mut sums = [[0.0f32; COLUMN_CHANNELS as usize]; MOST_TAPS];
        if channel < plan.out_planes && ow < plan.out_w && first_row < plan.out_h {
            let rows = plan.runs.rows.min(plan.out_h - first_row);
            let planes = plan.out_planes as usize;
            let (x, dy) = (args.x.as_ptr(), args.dy.as_ptr());
            let in_image = image as usize * plan.in_h as usize * plan.in_w as usize * planes;
            let out_image = image as usize * plan.out_h as usize * plan.out_w as usize * planes;
            // window[r]: the row of x that tap row r reads for output row `i - (SIZE -
            // 1)`, once input row i is in.
            let mut window = [[[0.0f32; COLUMN_CHANNELS as usize]; 5]; 5];
            for i in 0..rows + SIZE - 1 {
                for r in 0..SIZE as usize - 1 {
                    window[r] = window[r + 1];
                }
                let ih = (first_row + i).wrapping_sub(plan.pad_h);
                let newest = &mut window[SIZE as usize - 1];
                *newest = [[0.0; COLUMN_CHANNELS as usize]; 5];
                if ih < plan.in_h {
                    for (kw, values) in newest.iter_mut().enumerate().take(SIZE as usize) {
                        let iw = (ow + kw as u32).wrapping_sub(plan.pad_w);
                        if iw < plan.in_w {
                            let at = in_image + (ih as usize * plan.in_w as usize + iw as usize) * planes;
                            // SAFETY: the pixel lies inside the image, its four
                            // channels inside the planes (a multiple of four), aligned.
                            *values = unsafe { T::load_vector(x.add(at + channel as usize)) };
                        }
                    }
                }
                if i >= SIZE - 1 {
                    let oh = first_row + i - (SIZE - 1);
                    let at = out_image + (oh as usize * plan.out_w as usize + ow as usize) * planes;
                    // SAFETY: an output pixel of dy; four channels inside the planes.
                    let gradient = unsafe { T::load_vector(dy.add(at + channel as usize)) };
                    for (tap, sum) in sums.iter_mut().enumerate().take(taps as usize) {
                        let values = window[tap / SIZE as usize][tap % SIZE as usize];
                        for k in 0..COLUMN_CHANNELS as usize {
                            sum[k] = fma_f32(gradient[k], values[k], sum[k]);
                        }
                    }
                }
            }
        }
        // Each warp's sums in a region of its own, `[channel][tap]` over the block's
        // channels, then every (channel, tap) of the block added in warp order.
        let region = |w: u32| shared_base() + w * COLUMN_BLOCK_CHANNELS * taps * 4;
        for (tap, sum) in sums.iter().enumerate().take(taps as usize) {
            for (k, &value) in sum.iter().enumerate() {
                let slot = (lane * COLUMN_CHANNELS + k as u32) * taps + tap as u32;
                // SAFETY: this thread's slot of its warp's region.
                unsafe { store_shared_f32(region(warp) + slot * 4, value) };
            }
        }
        // SAFETY: the whole block; the regions are read after it.
        unsafe { sync_threads() };
        let block_weights = COLUMN_BLOCK_CHANNELS * taps;
        let weights = plan.out_planes as usize * taps as usize;
        let part = block_idx_x() as usize * weights + (block_channel * taps) as usize;
        let mut e = t;
        while e < block_weights && block_channel + e / taps < plan.out_planes {
            let mut total = 0.0;
            for w in 0..COLUMN_WARPS {
                // SAFETY: slot e of warp w's region, written before the barrier.
                total += unsafe { load_shared_f32(region(w) + e * 4) };
            }
            // SAFETY: weight e of the block's channels in the part's gradient.
            unsafe { *args.out.as_mut_ptr().add(part + e as usize) = total };
            e += STENCIL_THREADS;
        }
    }
}
