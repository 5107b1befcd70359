//! The input gradient of a convolution of few input channels (a stem's 3) and one
//! group over NCHW tensors, by phases over dy tiles staged in shared memory.
//!
//! Its GEMM has an N of the input channels: the implicit GEMM's tiles would be empty,
//! and the direct kernel's thread per pixel loads dy and a weight for every 4
//! multiply-adds. Here a block takes one phase (the pixels' remainders by the
//! stride: every pixel of a phase reads dy through the same taps, `phases::axis_taps`)
//! and a tile of `STAGED_ROWS x STAGED_COLUMNS` of its pixels; it stages the dy rows
//! and columns those reach, `STAGED_CHANNELS` output channels at a time, with the
//! phase's weights (the input channels zero-padded to 4), by `cp.async` copies all in
//! flight at once. A stem's 3 input channels have an entry point of their own, whose
//! multiply-adds skip the padding; fewer channels take the 4-channel one. A thread takes 4
//! consecutive pixels of a row: per output channel and tap row, two 16-byte loads of
//! dy and one of weights per tap column feed 16 multiply-adds. Sums run in a fixed
//! order (channel, tap row, tap column).

use super::ConvProblem;
use super::direct::{DEPTHWISE_THREADS, DIRECT_MAX_IN_GROUP};
use crate::launch::LaunchGeometry;

/// Rows and columns of a phase's pixels per block.
pub const STAGED_ROWS: u32 = 16;
pub const STAGED_COLUMNS: u32 = 64;
/// Consecutive pixels of a row per thread.
const PIXELS: u32 = 4;
/// Most taps of a phase along each axis (`ceil(kernel / stride)`).
pub const STAGED_MAX_TAPS: u32 = 4;
/// Output channels per staged chunk.
const STAGED_CHANNELS: u32 = 8;
/// The staged dy rows of a channel, and their pitch in floats (16-byte aligned, the
/// last of a thread's 8 loaded columns inside it).
const STAGE_ROWS: u32 = STAGED_ROWS + STAGED_MAX_TAPS - 1;
const STAGE_PITCH: u32 = STAGED_COLUMNS + PIXELS;
/// A staged row's segments, each copied by one thread.
const SEGMENTS: u32 = 4;
const SEGMENT: u32 = STAGE_PITCH / SEGMENTS;
/// Floats of staged dy and of staged weights (4 per output channel and tap).
const DY_STAGE: u32 = STAGED_CHANNELS * STAGE_ROWS * STAGE_PITCH;
const W_STAGE: u32 = STAGED_CHANNELS * STAGED_MAX_TAPS * STAGED_MAX_TAPS * 4;
/// Shared memory of a block.
pub const STAGED_SHARED_BYTES: u32 = (DY_STAGE + W_STAGE) * 4;

const _: () = assert!(STAGED_ROWS * STAGED_COLUMNS / PIXELS == DEPTHWISE_THREADS);
const _: () = assert!(SEGMENT * SEGMENTS == STAGE_PITCH);
const _: () = assert!(DIRECT_MAX_IN_GROUP == 4 && STAGED_MAX_TAPS + PIXELS - 1 <= 2 * 4);

/// Whether the staged kernel takes `problem`'s input gradient: one group of at most
/// `DIRECT_MAX_IN_GROUP` input channels, undilated, at most `STAGED_MAX_TAPS` taps
/// per phase along each axis.
pub const fn takes(problem: &ConvProblem) -> bool {
    let p = problem;
    p.groups == 1
        && p.in_channels <= DIRECT_MAX_IN_GROUP
        && p.dilation_h == 1
        && p.dilation_w == 1
        && p.kernel_h.div_ceil(p.stride_h) <= STAGED_MAX_TAPS
        && p.kernel_w.div_ceil(p.stride_w) <= STAGED_MAX_TAPS
}

/// Phase rows and columns (`ceil(h / stride_h)`, `ceil(w / stride_w)`), and the
/// tiles of them along each axis.
const fn tiles(p: &ConvProblem) -> (u32, u32) {
    let (rows, columns) = (p.height.div_ceil(p.stride_h), p.width.div_ceil(p.stride_w));
    (rows.div_ceil(STAGED_ROWS), columns.div_ceil(STAGED_COLUMNS))
}

/// Blocks along x: phases, then tile rows, then tile columns (fastest); an image per
/// z.
pub const fn geometry(problem: &ConvProblem) -> LaunchGeometry {
    let p = problem;
    let (row_tiles, column_tiles) = tiles(p);
    let phases = p.stride_h as u64 * p.stride_w as u64;
    LaunchGeometry {
        grid: [phases * row_tiles as u64 * column_tiles as u64, 1, p.batch as u64],
        threads: DEPTHWISE_THREADS,
        shared_bytes: STAGED_SHARED_BYTES,
    }
}

#[cfg(target_arch = "nvptx64")]
pub(super) mod kernel {
    use super::*;
    use crate::conv::direct::DirectInputGradArgs;
    use crate::conv::phases::axis_taps;
    use crate::device::{
        async_copy, async_copy_commit, async_copy_wait, block_idx_x, block_idx_z, fma_f32,
        load_shared_v4_f32, shared_base, sync_threads, thread_idx_x,
    };

    /// dx of the block's phase tile (see the module's docs), summed for `CHANNELS`
    /// input channels (those past the problem's stay zero: their weights are).
    ///
    /// # Safety
    /// dy, w and dx hold the problem's tensors in NCHW, at most `CHANNELS` input
    /// channels;
    /// [`takes`] holds; the launch is [`geometry`]'s.
    #[inline(always)]
    pub unsafe fn input_grad<const CHANNELS: usize>(args: DirectInputGradArgs) {
        let p = args.problem;
        let (t, image) = (thread_idx_x(), block_idx_z() as usize);
        let (row_tiles, column_tiles) = tiles(&p);
        let b = block_idx_x();
        let (rest, column_tile) = (b / column_tiles, b % column_tiles);
        let (phase, row_tile) = (rest / row_tiles, rest % row_tiles);
        let (qh, qw) = (phase / p.stride_w, phase % p.stride_w);
        let (first_h, taps_h, offset_h) = axis_taps(qh, p.kernel_h, p.stride_h, p.pad_h);
        let (first_w, taps_w, offset_w) = axis_taps(qw, p.kernel_w, p.stride_w, p.pad_w);
        let (i0, j0) = (row_tile * STAGED_ROWS, column_tile * STAGED_COLUMNS);
        // dy's first staged row and column: pixel row i reads row i + offset_h - tap.
        let oh0 = (i0 + offset_h) as i32 - taps_h as i32 + 1;
        let ow0 = (j0 + offset_w) as i32 - taps_w as i32 + 1;
        let (row, group) = (t / (STAGED_COLUMNS / PIXELS), t % (STAGED_COLUMNS / PIXELS));
        let (channels, out_pixels) = (p.out_channels, p.out_pixels() as usize);
        let dy = args.dy.as_ptr();
        let dy_stage = shared_base();
        let w_stage = dy_stage + DY_STAGE * 4;
        let mut sums = [[0.0f32; CHANNELS]; PIXELS as usize];
        let mut first = 0;
        while first < channels {
            // SAFETY: the whole block stages and waits, the same chunks; the previous
            // chunk's reads end at the first barrier.
            unsafe { sync_threads() };
            // Every copy of the chunk in flight at once, zeros past dy's edges and
            // channels and past the phase's taps.
            // A thread copies a segment of a staged row: the index arithmetic once per
            // `SEGMENT` copies.
            let mut e = t;
            while e < STAGED_CHANNELS * STAGE_ROWS * SEGMENTS {
                let (k, rest) = (e / (STAGE_ROWS * SEGMENTS), e % (STAGE_ROWS * SEGMENTS));
                let (staged_row, segment) = (rest / SEGMENTS, rest % SEGMENTS);
                let (channel, oh) = (first + k, oh0 + staged_row as i32);
                let row_inside = channel < channels && (oh as u32) < p.out_h;
                let ow_first = ow0 + (segment * SEGMENT) as i32;
                let row = (image * channels as usize + channel as usize) * out_pixels
                    + oh as usize * p.out_w as usize;
                let destination =
                    dy_stage + ((k * STAGE_ROWS + staged_row) * STAGE_PITCH + segment * SEGMENT) * 4;
                for x in 0..SEGMENT {
                    let ow = ow_first + x as i32;
                    let inside = row_inside && (ow as u32) < p.out_w;
                    // SAFETY: inside the launch's shared memory, untouched until the
                    // barrier after the wait; inside, (image, channel, oh, ow) is an
                    // element of dy, and outside nothing is read.
                    unsafe {
                        let source = if inside {
                            dy.wrapping_add(row + ow as usize)
                        } else {
                            dy
                        };
                        async_copy::<4>(destination + x * 4, source.cast(), 4 * inside as u32);
                    }
                }
                e += DEPTHWISE_THREADS;
            }
            let mut e = t;
            while e < W_STAGE {
                let (c, u) = (e % 4, e / 4 % STAGED_MAX_TAPS);
                let (tap, k) = (
                    e / (4 * STAGED_MAX_TAPS) % STAGED_MAX_TAPS,
                    e / (16 * STAGED_MAX_TAPS),
                );
                let channel = first + k;
                let inside = channel < channels && c < p.in_channels && tap < taps_h && u < taps_w;
                let (r, s) = (first_h + p.stride_h * tap, first_w + p.stride_w * u);
                let at = ((channel * p.in_channels + c) * p.kernel_h + r) * p.kernel_w + s;
                let w = args.w.as_ptr();
                // SAFETY: as above; inside, (channel, c, r, s) is a weight of the problem.
                unsafe {
                    let source = if inside { w.wrapping_add(at as usize) } else { w };
                    async_copy::<4>(w_stage + e * 4, source.cast(), 4 * inside as u32);
                }
                e += DEPTHWISE_THREADS;
            }
            async_copy_commit();
            async_copy_wait::<0>();
            // SAFETY: reached by the whole block, after each thread's copies landed.
            unsafe { sync_threads() };
            for k in 0..STAGED_CHANNELS {
                for tap in 0..taps_h {
                    // Pixel row i0 + row reads staged row row + taps_h - 1 - tap, pixel
                    // column 4 group + x staged column 4 group + x + (taps_w - 1 - u).
                    let staged_row = k * STAGE_ROWS + row + taps_h - 1 - tap;
                    let at = dy_stage + (staged_row * STAGE_PITCH + group * PIXELS) * 4;
                    // SAFETY: 16-byte aligned (the pitch and the offsets are multiples of
                    // 4 floats), inside the channel's staged rows.
                    let (low, high) = unsafe { (load_shared_v4_f32(at), load_shared_v4_f32(at + 16)) };
                    let d = [low[0], low[1], low[2], low[3], high[0], high[1], high[2], high[3]];
                    // Tap column u = taps_w - 1 - v reads d[x + v]: called with constant
                    // v, so that d stays in registers (a loop the compiler kept would
                    // index it by selects).
                    let mut tap_column = |v: u32| {
                        if v >= taps_w {
                            return;
                        }
                        let u = taps_w - 1 - v;
                        let w_at = w_stage + ((k * STAGED_MAX_TAPS + tap) * STAGED_MAX_TAPS + u) * 16;
                        // SAFETY: the tap's 4 staged weights, 16-byte aligned.
                        let w = unsafe { load_shared_v4_f32(w_at) };
                        for (x, sum) in sums.iter_mut().enumerate() {
                            for c in 0..CHANNELS {
                                sum[c] = fma_f32(d[x + v as usize], w[c], sum[c]);
                            }
                        }
                    };
                    const _: () = assert!(STAGED_MAX_TAPS == 4);
                    tap_column(0);
                    tap_column(1);
                    tap_column(2);
                    tap_column(3);
                }
            }
            first += STAGED_CHANNELS;
        }
        let ih = (i0 + row) * p.stride_h + qh;
        if ih >= p.height {
            return;
        }
        let in_pixels = p.pixels() as usize;
        for (x, sum) in sums.iter().enumerate() {
            let iw = (j0 + group * PIXELS + x as u32) * p.stride_w + qw;
            for (c, &value) in sum.iter().enumerate() {
                if iw < p.width && (c as u32) < p.in_channels {
                    let plane = (image * p.in_channels as usize + c) * in_pixels;
                    // SAFETY: (image, c, ih, iw) is inside dx.
                    unsafe {
                        *args
                            .dx
                            .as_mut_ptr()
                            .add(plane + ih as usize * p.width as usize + iw as usize) = value
                    };
                }
            }
        }
    }
}
