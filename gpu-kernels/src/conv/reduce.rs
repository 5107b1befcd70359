//! The convolution's reductions outside the GEMMs: the sum of a split weight
//! gradient's partials, the sum of a split forward pass's partials through its
//! epilogue, and the bias gradient. All add in FP64 in a fixed order.
//!
//! The bias gradient reads dy in its layout: in NCHW a block sums one channel's
//! planes, in NHWC 32 channels (a lane each, 8 warps down the pixels). Its blocks
//! split the pixels into parts until they fill the GPU, the parts' partials added by
//! `split_sum`. Where NCHW dy moves to NHWC for other passes, the move sums it on the
//! way ([`BiasGradToNhwc`]): dy is read once for both.

use super::{ConvEpilogue, ConvLayout, ConvProblem, FastDiv};
use crate::launch::THREADS_PER_SM;
use crate::launch::{DevicePtr, DevicePtrMut, Launch, LaunchGeometry, ScratchLayout, kernel_args};

/// Threads of the bias-gradient and split-sum kernels.
pub const REDUCE_THREADS: u32 = 256;

kernel_args! {
    /// The split sum's arguments: `out[i] = sum over s of partials[s * count + i]`, or
    /// of `partials[i * split + s]` when `by_output` is 1 (each output's partials
    /// together).
    pub struct SplitSumArgs {
        pub partials: DevicePtr<f32>,
        pub out: DevicePtrMut<f32>,
        pub count: u64,
        pub split: u32,
        pub by_output: u32,
    }
    /// The sum of `split` partials.
    pub const CONV_SPLIT_SUM = "conv_split_sum_f32" => kernel::split_sum::<f32>;
    /// The same into bf16 outputs (`out` holds bf16), each rounded from the f32 sum.
    pub const CONV_SPLIT_SUM_BF16 = "conv_split_sum_bf16" => kernel::split_sum::<half::bf16>;
    /// The same into f16 outputs.
    pub const CONV_SPLIT_SUM_F16 = "conv_split_sum_f16" => kernel::split_sum::<half::f16>;
    entry points in SPLIT_SUM_ENTRY_POINTS;
}

/// The split sum writing outputs of an element type (f32, bf16, f16; the 16-bit ones
/// rounded from the f32 sum, as a narrowing after an f32 sum would).
pub trait SplitSumKernel: Sized {
    const SPLIT_SUM: crate::launch::Kernel<SplitSumArgs>;
}

impl SplitSumKernel for f32 {
    const SPLIT_SUM: crate::launch::Kernel<SplitSumArgs> = CONV_SPLIT_SUM;
}

impl SplitSumKernel for half::bf16 {
    const SPLIT_SUM: crate::launch::Kernel<SplitSumArgs> = CONV_SPLIT_SUM_BF16;
}

impl SplitSumKernel for half::f16 {
    const SPLIT_SUM: crate::launch::Kernel<SplitSumArgs> = CONV_SPLIT_SUM_F16;
}

kernel_args! {
    /// The split epilogue's arguments: `y[i] = epilogue(sum over s of partials[s *
    /// count + i] + bias[c])`, c the output channel of element `i` of y: `i / run %
    /// channels`, `run` 1 in NHWC and the output pixels in NCHW.
    pub struct SplitEpilogueArgs {
        pub partials: DevicePtr<f32>,
        pub epilogue: ConvEpilogue,
        pub y: DevicePtrMut<f32>,
        /// Elements of y, below 2^31.
        pub count: u32,
        pub split: u32,
        pub run: FastDiv,
        pub channels: FastDiv,
    }
    /// The sum of a split forward pass's partials through its epilogue.
    pub const CONV_SPLIT_EPILOGUE = "conv_split_epilogue_f32" => kernel::split_epilogue::<f32>;
    /// The same into bf16 y (`y` holds bf16), each output rounded once.
    pub const CONV_SPLIT_EPILOGUE_BF16 = "conv_split_epilogue_bf16" => kernel::split_epilogue::<half::bf16>;
    /// The same into f16 y.
    pub const CONV_SPLIT_EPILOGUE_F16 = "conv_split_epilogue_f16" => kernel::split_epilogue::<half::f16>;
    entry points in SPLIT_EPILOGUE_ENTRY_POINTS;
}

kernel_args! {
    /// The bias gradient's arguments: `out[part * c + o] = sum of dy at output channel
    /// `o` over the part's pixels` (`db` itself without a split), dy of `T`, the sums
    /// f32.
    pub struct BiasGradArgs<T> {
        pub dy: DevicePtr<T>,
        pub out: DevicePtrMut<f32>,
        pub problem: ConvProblem,
        pub plan: BiasGradPlan,
    }
    impl BiasGradKernels for f32 {
        const NCHW = "conv_bias_grad_nchw_f32" => kernel::bias_grad::<f32, false>;
        const NHWC = "conv_bias_grad_nhwc_f32" => kernel::bias_grad::<f32, true>;
    }
    impl BiasGradKernels for half::bf16 {
        const NCHW = "conv_bias_grad_nchw_bf16" => kernel::bias_grad::<half::bf16, false>;
        const NHWC = "conv_bias_grad_nhwc_bf16" => kernel::bias_grad::<half::bf16, true>;
    }
    impl BiasGradKernels for half::f16 {
        const NCHW = "conv_bias_grad_nchw_f16" => kernel::bias_grad::<half::f16, false>;
        const NHWC = "conv_bias_grad_nhwc_f16" => kernel::bias_grad::<half::f16, true>;
    }
    entry points in BIAS_GRAD_ENTRY_POINTS;
}

/// The bias gradient kernels of dy of an element type, over NCHW and NHWC dy.
pub trait BiasGradKernels: Sized {
    const NCHW: crate::launch::Kernel<BiasGradArgs<Self>>;
    const NHWC: crate::launch::Kernel<BiasGradArgs<Self>>;
}

kernel_args! {
    /// The bias gradient while NCHW dy moves to NHWC: `dy_nhwc` the transpose of each
    /// image's `[channels][pixels]`, and `out[c * parts + part]` the sum of dy at
    /// channel c over part `image * pixel_tiles + t`'s pixels (tile `t` of
    /// [`TILE`](crate::transpose::TILE)), `db` itself with one part.
    pub struct BiasGradToNhwcArgs {
        pub dy: DevicePtr<f32>,
        pub dy_nhwc: DevicePtrMut<f32>,
        pub out: DevicePtrMut<f32>,
        pub channels: u64,
        pub pixels: u64,
    }
    /// The bias gradient of NCHW dy, moving it to NHWC.
    pub const CONV_BIAS_GRAD_TO_NHWC = "conv_bias_grad_to_nhwc_f32" => kernel::bias_grad_to_nhwc;
    entry points in BIAS_GRAD_TO_NHWC_ENTRY_POINTS;
}

/// Channels of an NHWC bias-gradient block: one per lane.
const BIAS_NHWC_CHANNELS: u32 = 32;
/// Elements per thread below which the bias gradient splits no further.
const BIAS_MIN_PER_THREAD: u64 = 16;

/// Parts to split a reduction over `blocks` blocks into (grid y): as many as
/// `wanted_blocks` in all take, at most `most` (the parts that keep enough work each),
/// at least 1, at most 65535.
pub const fn grid_split(wanted_blocks: u64, blocks: u64, most: u64) -> u32 {
    let wanted = wanted_blocks.div_ceil(blocks);
    let split = if wanted < most { wanted } else { most };
    if split < 1 {
        1
    } else if split > 65535 {
        65535
    } else {
        split as u32
    }
}

/// Most rows of threads a split-sum block spreads an output's partials over: all of
/// them, for the few outputs of a bias gradient over thousands of parts.
const SPLIT_SUM_MAX_ROWS: u32 = REDUCE_THREADS;
/// Threads that fill a large GPU (an H100 holds 270336): a split sum with fewer
/// outputs spreads each output's partials over rows of threads, so a sum of many
/// partials (a bias gradient's thousands of parts) is not one thread's chain of loads.
const SPLIT_SUM_THREADS: u64 = 1 << 18;

/// Rows of threads per output of a split sum of `count` outputs of `split` partials:
/// a power of two, at most `split` and `SPLIT_SUM_MAX_ROWS`, the fewest that give
/// `SPLIT_SUM_THREADS`.
const fn split_sum_rows(count: u64, split: u32) -> u32 {
    let mut rows = 1;
    while rows < SPLIT_SUM_MAX_ROWS && 2 * rows <= split && count * (rows as u64) < SPLIT_SUM_THREADS {
        rows *= 2;
    }
    rows
}

/// Outputs a thread takes in the vector paths of the split sum and split epilogue.
const VECTOR: u32 = 4;

/// Whether `count` outputs of partials at `partials` into `out` take the vector path:
/// `VECTOR` consecutive outputs a thread, each partial's four in one 16-byte load.
fn in_vectors(count: u64, partials: u64, out: u64) -> bool {
    count.is_multiple_of(VECTOR as u64) && (partials | out).is_multiple_of(16)
}

/// Outputs per thread of a split sum: `VECTOR` where a partial's outputs lie together
/// and come in vectors, else one.
fn split_sum_outputs_per_thread(args: &SplitSumArgs) -> u32 {
    let (partials, out) = (args.partials.address(), args.out.address());
    if args.by_output == 0 && in_vectors(args.count, partials, out) {
        VECTOR
    } else {
        1
    }
}

/// The launch adding `args.split` partials of `args.count` f32 values: a block takes
/// `REDUCE_THREADS / rows` lanes by `rows` rows of threads, each lane one output or
/// `VECTOR` of them (`split_sum_outputs_per_thread`).
pub fn split_sum(args: SplitSumArgs) -> Launch<SplitSumArgs> {
    split_sum_into::<f32>(args)
}

/// [`split_sum`] writing its outputs as `T`s: `args.out` holds `count` of them.
pub fn split_sum_into<T: SplitSumKernel>(args: SplitSumArgs) -> Launch<SplitSumArgs> {
    let per_thread = split_sum_outputs_per_thread(&args);
    let lanes = REDUCE_THREADS / split_sum_rows(args.count / per_thread as u64, args.split);
    let blocks = args.count.div_ceil(lanes as u64 * per_thread as u64);
    Launch::new(
        T::SPLIT_SUM,
        LaunchGeometry::linear(blocks, REDUCE_THREADS).with_shared(REDUCE_THREADS * 8 * per_thread),
        args,
    )
}

/// Outputs per thread of a split epilogue: `VECTOR` where they come in vectors, else
/// one.
fn split_epilogue_outputs_per_thread(args: &SplitEpilogueArgs) -> u32 {
    if in_vectors(args.count as u64, args.partials.address(), args.y.address()) {
        VECTOR
    } else {
        1
    }
}

/// The launch finishing a forward pass whose K was split into `split` parts by
/// `kernel`, one of the split epilogues (y of its type): the partials (each a copy of y
/// of `problem` in `layout`) added in order, then the epilogue, one thread per output
/// (or per `VECTOR` outputs).
pub fn split_epilogue(
    kernel: crate::launch::Kernel<SplitEpilogueArgs>,
    problem: &ConvProblem,
    layout: ConvLayout,
    split: u32,
    partials: DevicePtr<f32>,
    epilogue: ConvEpilogue,
    y: DevicePtrMut<f32>,
) -> Launch<SplitEpilogueArgs> {
    let count = problem.output_count();
    let run = match layout {
        ConvLayout::Nhwc => 1,
        ConvLayout::Nchw => problem.out_pixels(),
    };
    let args = SplitEpilogueArgs {
        partials,
        epilogue,
        y,
        count: count as u32,
        split,
        run: FastDiv::new(run),
        channels: FastDiv::new(problem.out_channels),
    };
    let threads = count.div_ceil(split_epilogue_outputs_per_thread(&args) as u64);
    Launch::new(kernel, LaunchGeometry::per_item(threads, REDUCE_THREADS), args)
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
        by_output: 0,
    });
    (partials.cast(), Some(sum))
}

/// How the bias gradient runs: blocks of channels (grid x) by parts of the pixels of
/// the batch (grid y).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BiasGradPlan {
    pub split: u32,
    /// Whether dy is channels last (NHWC), as 1 or 0 (NCHW).
    pub channels_last: u32,
}

impl BiasGradPlan {
    /// The plan of `problem`'s bias gradient over dy in `layout`: parts enough for four
    /// waves of blocks, each thread summing at least `BIAS_MIN_PER_THREAD` elements.
    pub const fn new(problem: &ConvProblem, layout: ConvLayout, multiprocessors: u32) -> Self {
        let channels_last = matches!(layout, ConvLayout::Nhwc);
        let blocks = Self::channel_blocks(problem.out_channels, channels_last) as u64;
        let wanted = 4 * multiprocessors as u64 * THREADS_PER_SM / REDUCE_THREADS as u64;
        let per_channel = problem.batch as u64 * problem.out_pixels() as u64;
        let rows = if channels_last {
            REDUCE_THREADS / BIAS_NHWC_CHANNELS
        } else {
            REDUCE_THREADS
        };
        let most = per_channel / (rows as u64 * BIAS_MIN_PER_THREAD);
        Self {
            split: grid_split(wanted, blocks, most),
            channels_last: channels_last as u32,
        }
    }

    const fn channel_blocks(channels: u32, channels_last: bool) -> u32 {
        if channels_last {
            channels.div_ceil(BIAS_NHWC_CHANNELS)
        } else {
            channels
        }
    }

    /// The scratch: a partial gradient per part when split.
    pub const fn scratch(&self, problem: &ConvProblem) -> ScratchLayout {
        partials_scratch(self.split, problem.out_channels as u64)
    }

    /// The launches of the bias gradient of `dy` into `db`: into the partials at the
    /// start of `scratch` (laid out by [`Self::scratch`]) and their sum, when split.
    pub fn launches<T: BiasGradKernels>(
        &self,
        problem: &ConvProblem,
        dy: DevicePtr<T>,
        scratch: DevicePtrMut<u8>,
        db: DevicePtrMut<f32>,
    ) -> (Launch<BiasGradArgs<T>>, Option<Launch<SplitSumArgs>>) {
        let (out, sum) = split_outputs(self.split, problem.out_channels as u64, scratch, db);
        let blocks = Self::channel_blocks(problem.out_channels, self.channels_last == 1);
        let geometry = LaunchGeometry {
            grid: [blocks as u64, self.split as u64, 1],
            threads: REDUCE_THREADS,
            shared_bytes: REDUCE_THREADS * 8,
        };
        let args = BiasGradArgs {
            dy,
            out,
            problem: *problem,
            plan: *self,
        };
        let kernel = if self.channels_last == 1 { T::NHWC } else { T::NCHW };
        (Launch::new(kernel, geometry, args), sum)
    }
}

/// The bias gradient of NCHW dy (`batch` images of `channels x pixels`) summed while
/// the batched transpose moves dy to NHWC: a partial sum per image and tile of
/// [`TILE`](crate::transpose::TILE) pixels, each channel's together (so that
/// [`split_sum`] reads them along its rows of threads).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BiasGradToNhwc {
    batch: u64,
    channels: u64,
    pixels: u64,
    parts: u32,
}

impl BiasGradToNhwc {
    /// The plan for dy of `[batch, channels, pixels]`: `None` when dy is empty or its
    /// parts pass a `u32`.
    pub fn new(batch: u64, channels: u64, pixels: u64) -> Option<Self> {
        if batch == 0 || channels == 0 || pixels == 0 {
            return None;
        }
        let parts = u32::try_from(batch.checked_mul(Self::pixel_blocks(pixels))?).ok()?;
        Some(Self {
            batch,
            channels,
            pixels,
            parts,
        })
    }

    const fn pixel_blocks(pixels: u64) -> u64 {
        pixels.div_ceil(crate::transpose::TILE as u64)
    }

    /// The scratch: the parts' partial gradients.
    pub const fn scratch(&self) -> ScratchLayout {
        partials_scratch(self.parts, self.channels)
    }

    /// The launches moving `dy` to `dy_nhwc` while summing its parts into the partials
    /// at the start of `scratch` (laid out by [`Self::scratch`]), and their sum into
    /// `db` when there are several. Images past 65535 or channels past 2^21 pass the
    /// grid's limits, which the launch reports.
    pub fn launches(
        &self,
        dy: DevicePtr<f32>,
        dy_nhwc: DevicePtrMut<f32>,
        scratch: DevicePtrMut<u8>,
        db: DevicePtrMut<f32>,
    ) -> (Launch<BiasGradToNhwcArgs>, Option<Launch<SplitSumArgs>>) {
        use crate::transpose::{SHARED_BYTES, THREADS, TILE};
        let (out, sum) = if self.parts > 1 {
            let partials = scratch.cast::<f32>();
            let sum = split_sum(SplitSumArgs {
                partials: partials.as_const(),
                out: db,
                count: self.channels,
                split: self.parts,
                by_output: 1,
            });
            (partials, Some(sum))
        } else {
            (db, None)
        };
        let geometry = LaunchGeometry {
            grid: [
                Self::pixel_blocks(self.pixels),
                self.channels.div_ceil(TILE as u64),
                self.batch,
            ],
            threads: THREADS,
            shared_bytes: SHARED_BYTES,
        };
        let args = BiasGradToNhwcArgs {
            dy,
            dy_nhwc,
            out,
            channels: self.channels,
            pixels: self.pixels,
        };
        (Launch::new(CONV_BIAS_GRAD_TO_NHWC, geometry, args), sum)
    }
}

#[cfg(target_arch = "nvptx64")]
mod kernel {
    use super::*;
    use crate::conv::tensor_core::Output;
    use crate::device::{
        SharedCarver, Widen, block_idx_x, block_idx_y, block_idx_z, grid_dim_x, grid_dim_z,
        load_global_nc_v4, sync_threads, thread_idx_x,
    };
    use crate::warp;

    /// The sum in FP64 of `load(at)` for `at` from `first` below `end` by `step`, in
    /// order, four loads in flight.
    #[inline(always)]
    fn strided_sum(first: u64, end: u64, step: u64, load: impl Fn(u64) -> f64) -> f64 {
        strided_sums(first, end, step, |at| [load(at)])[0]
    }

    /// [`strided_sum`] of `N` values at a time, each summed apart.
    #[inline(always)]
    fn strided_sums<const N: usize>(
        first: u64,
        end: u64,
        step: u64,
        load: impl Fn(u64) -> [f64; N],
    ) -> [f64; N] {
        let (mut sums, mut at) = ([0.0; N], first);
        // Indexed loops over N unroll; iterators over arrays of arrays can go to local
        // memory.
        let mut add = |values: [f64; N]| {
            for k in 0..N {
                sums[k] += values[k];
            }
        };
        while at + 3 * step < end {
            let (a, b, c, d) = (
                load(at),
                load(at + step),
                load(at + 2 * step),
                load(at + 3 * step),
            );
            add(a);
            add(b);
            add(c);
            add(d);
            at += 4 * step;
        }
        while at < end {
            add(load(at));
            at += step;
        }
        sums
    }

    /// The `VECTOR` f32 values at `at` (16-byte aligned) in FP64.
    ///
    /// # Safety
    /// `at` points to `VECTOR` readable floats that no thread writes during the launch.
    #[inline(always)]
    unsafe fn load_vector(at: *const f32) -> [f64; VECTOR as usize] {
        // SAFETY: the caller's contract.
        let words = unsafe { load_global_nc_v4(at.cast()) };
        words.map(|word| f32::from_bits(word) as f64)
    }

    /// Writes `values` to the `VECTOR` outputs at `at` (aligned to two of them), each
    /// rounded to `T`.
    ///
    /// # Safety
    /// `at` points to `VECTOR` writable `T`s.
    #[inline(always)]
    unsafe fn store_vector<T: Output>(at: *mut T, values: [f32; VECTOR as usize]) {
        // SAFETY: the caller's contract: two aligned pairs.
        unsafe {
            T::store_pair(at, [values[0], values[1]]);
            T::store_pair(at.add(2), [values[2], values[3]]);
        }
    }

    /// `out[i] = sum over s of partials[s * count + i]` in FP64 in a fixed order: row
    /// `r` of the block's [`split_sum_rows`] adds partials `r`, `r + rows`, ... in
    /// order (four loads in flight), then the first row adds the rows' sums in order;
    /// each thread of a row one output, or `VECTOR` of them.
    ///
    /// # Safety
    /// `partials` holds `split * count` values, `out` `count` `T`s; the launch is
    /// [`split_sum_into`](super::split_sum_into)'s.
    #[inline(always)]
    pub unsafe fn split_sum<T: Output>(args: SplitSumArgs) {
        // SAFETY: forwarded, with the launch's outputs per thread.
        unsafe {
            if split_sum_outputs_per_thread(&args) == VECTOR {
                split_sum_by::<T, { VECTOR as usize }>(args)
            } else {
                split_sum_by::<T, 1>(args)
            }
        }
    }

    /// [`split_sum`] with `N` outputs a thread (1, or `VECTOR` in 16-byte loads and
    /// aligned pairs of stores).
    ///
    /// # Safety
    /// As [`split_sum`]; with `N` of `VECTOR`, [`split_sum_outputs_per_thread`] is
    /// `VECTOR`.
    #[inline(always)]
    unsafe fn split_sum_by<T: Output, const N: usize>(args: SplitSumArgs) {
        let SplitSumArgs {
            count,
            split,
            by_output,
            ..
        } = args;
        let (partials, out) = (args.partials.as_ptr(), args.out.as_mut_ptr().cast::<T>());
        let rows = split_sum_rows(count / N as u64, split);
        let lanes = REDUCE_THREADS / rows;
        let t = thread_idx_x();
        let (lane, row) = (t % lanes, t / lanes);
        let i = (block_idx_x() as u64 * lanes as u64 + lane as u64) * N as u64;
        let load = |s: u64| -> [f64; N] {
            if N == VECTOR as usize {
                // SAFETY: s < split and i + VECTOR <= count (count a multiple of
                // VECTOR): inside the partials, 16-byte aligned.
                let values = unsafe { load_vector(partials.add((s * count + i) as usize)) };
                core::array::from_fn(|k| values[k])
            } else {
                let at = if by_output == 1 {
                    i * split as u64 + s
                } else {
                    s * count + i
                };
                // SAFETY: s < split and i < count: either place is below split * count.
                core::array::from_fn(|_| unsafe { *partials.add(at as usize) } as f64)
            }
        };
        let mut sums = [0.0f64; N];
        if i < count {
            sums = strided_sums(row as u64, split as u64, rows as u64, load);
        }
        if rows > 1 {
            // SAFETY: the launch provides `N` f64 per thread.
            let shared: *mut [f64; N] = unsafe { SharedCarver::new().take(REDUCE_THREADS as usize) };
            // SAFETY: each thread its own slot, read after the barrier (`rows` is the
            // same for the whole block).
            unsafe {
                *shared.add(t as usize) = sums;
                sync_threads();
            }
            if row > 0 {
                return;
            }
            sums = [0.0; N];
            for r in 0..rows {
                // SAFETY: written before the barrier.
                let row_sums = unsafe { *shared.add((r * lanes + lane) as usize) };
                for k in 0..N {
                    sums[k] += row_sums[k];
                }
            }
        }
        if i >= count {
            return;
        }
        let values = sums.map(|sum| sum as f32);
        if N == VECTOR as usize {
            // SAFETY: outputs i .. i + VECTOR of `out`, 16-byte aligned.
            unsafe { store_vector(out.add(i as usize), core::array::from_fn(|k| values[k])) };
        } else {
            // SAFETY: i < count.
            unsafe { *out.add(i as usize) = T::from_f32(values[0]) };
        }
    }

    /// `y[i] = epilogue(sum of the partials at i + bias)`, the partials added in order
    /// in FP64, y of `T` (16-bit ones rounded once).
    ///
    /// # Safety
    /// `partials` holds `split * count` values, y `count` `T`s (and the residual, when
    /// there is one, `count` floats: f32 y only), the bias null or `channels` floats;
    /// the grid covers `count` threads.
    #[inline(always)]
    pub unsafe fn split_epilogue<T: Output>(args: SplitEpilogueArgs) {
        let SplitEpilogueArgs { count, split, .. } = args;
        let (partials, y) = (args.partials.as_ptr(), args.y.as_mut_ptr().cast::<T>());
        let (count, split) = (count as u64, split as u64);
        let bias = args.epilogue.bias.as_ptr();
        // The output at `i` of its partials' sum.
        let finish = |i: u64, mut sum: f64| {
            if !bias.is_null() {
                let (_, channel) = args.channels.divmod(args.run.divmod(i as u32).0);
                // SAFETY: a channel of the bias.
                sum += unsafe { *bias.add(channel as usize) } as f64;
            }
            // SAFETY: i < count, an element of y and of the residual.
            unsafe { args.epilogue.apply(sum as f32, i as usize) }
        };
        let thread = block_idx_x() as u64 * REDUCE_THREADS as u64 + thread_idx_x() as u64;
        if split_epilogue_outputs_per_thread(&args) == VECTOR {
            let i = thread * VECTOR as u64;
            if i < count {
                // SAFETY: i + VECTOR <= count (count a multiple of VECTOR), s < split:
                // inside the partials, 16-byte aligned.
                let load = |s: u64| unsafe { load_vector(partials.add((s * count + i) as usize)) };
                let sums = strided_sums(0, split, 1, load);
                let values = core::array::from_fn(|k| finish(i + k as u64, sums[k]));
                // SAFETY: outputs i .. i + VECTOR of y, 16-byte aligned.
                unsafe { store_vector(y.add(i as usize), values) };
            }
        } else if thread < count {
            // SAFETY: s * count + thread < split * count.
            let load = |s: u64| unsafe { *partials.add((s * count + thread) as usize) } as f64;
            let sum = strided_sum(0, split, 1, load);
            // SAFETY: an element of y.
            unsafe { *y.add(thread as usize) = T::from_f32(finish(thread, sum)) };
        }
    }

    /// Moves block `(t, c, image)`'s tile of dy (pixels `TILE t ..`, channels `TILE c
    /// ..`) to NHWC and writes its channels' sums over those pixels, added in a fixed
    /// order: each thread's elements of its channel (eight at most, in FP32), then the
    /// block's rows of threads in order (in FP64).
    ///
    /// # Safety
    /// dy and `dy_nhwc` hold `batch * channels * pixels` floats and do not overlap,
    /// `out` the partials of [`BiasGradToNhwc`] (or `channels` floats with one part);
    /// the launch is [`BiasGradToNhwc::launches`]'.
    #[inline(always)]
    pub unsafe fn bias_grad_to_nhwc(args: BiasGradToNhwcArgs) {
        use crate::transpose::{THREADS, TILE, transpose_tile};
        let BiasGradToNhwcArgs { channels, pixels, .. } = args;
        let image = block_idx_z() as u64;
        let matrix = image * channels * pixels;
        let mut sum = 0.0f32;
        // SAFETY: every (channel, pixel) of the image indexes an element of both tensors.
        unsafe {
            transpose_tile(
                args.dy.as_ptr().cast(),
                args.dy_nhwc.as_mut_ptr().cast(),
                [channels, pixels],
                [block_idx_y() as u64, block_idx_x() as u64],
                |c, p| matrix + c * pixels + p,
                |c, p| matrix + p * channels + c,
                |value| {
                    sum += f32::from_bits(value);
                    value
                },
            )
        };
        let t = thread_idx_x();
        let (lane, row) = (t % TILE, t / TILE);
        // The rows of threads hold sums of the same channels, a lane each: they meet in
        // the tile's shared memory once every thread has read the tile.
        // SAFETY: the launch provides the tile's bytes, more than THREADS f64; each
        // thread writes its own slot between the barriers, which every thread reaches.
        let sums: *mut f64 = unsafe {
            sync_threads();
            let sums: *mut f64 = SharedCarver::new().take(THREADS as usize);
            *sums.add(t as usize) = sum as f64;
            sync_threads();
            sums
        };
        let channel = block_idx_y() as u64 * TILE as u64 + lane as u64;
        if row == 0 && channel < channels {
            let mut total = 0.0f64;
            for r in 0..THREADS / TILE {
                // SAFETY: written before the barrier.
                total += unsafe { *sums.add((r * TILE + lane) as usize) };
            }
            let parts = grid_dim_z() as u64 * grid_dim_x() as u64;
            let part = image * grid_dim_x() as u64 + block_idx_x() as u64;
            // SAFETY: channel `channel` of the part's gradient.
            unsafe { *args.out.as_mut_ptr().add((channel * parts + part) as usize) = total as f32 };
        }
    }

    /// The sum of dy at each output channel over the part's pixels of the batch (grid
    /// y), in FP64 in a fixed order: in NCHW a block per channel, each thread every
    /// `REDUCE_THREADS`-th pixel; in NHWC a block per 32 channels, warp `w` every 8th
    /// pixel from the `w`-th.
    ///
    /// # Safety
    /// dy holds the problem's output gradient in the plan's layout, `out` `split`
    /// gradients of `out_channels`; the launch is [`BiasGradPlan::launches`]'.
    #[inline(always)]
    pub unsafe fn bias_grad<T: Widen<Sum = f32>, const CHANNELS_LAST: bool>(args: BiasGradArgs<T>) {
        let (dy, p) = (args.dy.as_ptr(), args.problem);
        let (t, part) = (thread_idx_x(), block_idx_y());
        let channels = p.out_channels as u64;
        let pixels = p.batch as u64 * p.out_pixels() as u64;
        let per_part = pixels.div_ceil(args.plan.split as u64);
        let first = part as u64 * per_part;
        let last = pixels.min(first + per_part);
        // SAFETY: the launch provides REDUCE_THREADS f64.
        let sums: *mut f64 = unsafe { SharedCarver::new().take(REDUCE_THREADS as usize) };
        let (channel, sum) = if CHANNELS_LAST {
            let channel = block_idx_x() * BIAS_NHWC_CHANNELS + t % BIAS_NHWC_CHANNELS;
            let pixel = first + (t / BIAS_NHWC_CHANNELS) as u64;
            // SAFETY: a pixel of the batch (below `last`), a channel of dy.
            let load = |pixel: u64| unsafe { (*dy.add((pixel * channels + channel as u64) as usize)).widen() }
                as f64;
            let step = (REDUCE_THREADS / BIAS_NHWC_CHANNELS) as u64;
            let sum = if channel < p.out_channels {
                strided_sum(pixel, last, step, load)
            } else {
                0.0
            };
            (channel, sum)
        } else {
            let channel = block_idx_x();
            let mut sum = 0.0f64;
            let plane = p.out_pixels() as u64;
            // The part's run of each image's plane in turn, four loads in flight.
            let mut start = first;
            while start < last {
                let image = start / plane;
                let end = last.min((image + 1) * plane);
                let base = (image * channels + channel as u64) * plane - image * plane;
                // SAFETY: `base + at` for `at` in [start, end) is a pixel of the image's
                // plane of the channel.
                let load = |at: u64| unsafe { (*dy.add((base + at) as usize)).widen() } as f64;
                sum += strided_sum(start + t as u64, end, REDUCE_THREADS as u64, load);
                start = end;
            }
            (channel, warp::reduce(sum, |a, b| a + b))
        };
        // SAFETY: each thread its own slot, read after the barrier.
        unsafe {
            *sums.add(t as usize) = sum;
            sync_threads();
        }
        // The first warp adds the lanes' (NHWC) or warps' (NCHW) sums in order.
        let (count, step) = if CHANNELS_LAST {
            (REDUCE_THREADS / BIAS_NHWC_CHANNELS, BIAS_NHWC_CHANNELS)
        } else {
            (REDUCE_THREADS / 32, 32)
        };
        let leads = if CHANNELS_LAST {
            t < BIAS_NHWC_CHANNELS
        } else {
            t == 0
        };
        if leads && channel < p.out_channels {
            let mut total = 0.0f64;
            for k in 0..count {
                // SAFETY: written before the barrier.
                total += unsafe { *sums.add((t + k * step) as usize) };
            }
            let at = part as u64 * channels + channel as u64;
            // SAFETY: channel `channel` of the part's gradient.
            unsafe { *args.out.as_mut_ptr().add(at as usize) = total as f32 };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv::ConvShape;

    #[test]
    fn split_sums_of_few_outputs_spread_their_partials_over_rows() {
        // A bias gradient's 64 channels of 2112 parts: every row; a depthwise weight
        // gradient's 2304 weights of 512: the rows that fill the GPU.
        assert_eq!(split_sum_rows(64, 2112), SPLIT_SUM_MAX_ROWS);
        assert_eq!(split_sum_rows(2304, 512), 128);
        // No more rows than partials; none where the outputs fill the GPU.
        assert_eq!(split_sum_rows(64, 3), 2);
        assert_eq!(split_sum_rows(512 * 512 * 9, 5), 1);
        assert_eq!(split_sum_rows(SPLIT_SUM_THREADS / 2, 64), 2);
    }

    #[test]
    fn the_bias_gradient_splits_the_fixed_test_cases_pixels() {
        let problem = |input, weight, groups| {
            ConvProblem::new(&ConvShape {
                input,
                weight,
                stride: [1, 1],
                padding: [1, 1],
                dilation: [1, 1],
                groups,
            })
            .expect("a valid problem")
        };
        // The two cases of `every_conv_kernel_matches_the_reference_on_fixed_cases`
        // whose bias gradients are split.
        let nhwc = BiasGradPlan::new(&problem([3, 8, 30, 50], [32, 8, 3, 3], 1), ConvLayout::Nhwc, 132);
        let nchw = BiasGradPlan::new(&problem([2, 5, 70, 70], [5, 1, 3, 3], 5), ConvLayout::Nchw, 132);
        assert!(nhwc.split > 1 && nchw.split > 1, "{nhwc:?} {nchw:?}");
        // A small problem is not split.
        let small = BiasGradPlan::new(&problem([1, 3, 9, 7], [4, 3, 3, 3], 1), ConvLayout::Nchw, 132);
        assert_eq!(small.split, 1);
    }

    #[test]
    fn the_bias_gradient_moving_dy_has_a_part_per_image_and_tile_of_pixels() {
        use crate::transpose::TILE;
        // R1's dy: 32 images of 3136 pixels (98 tiles), 256 channels.
        let r1 = BiasGradToNhwc::new(32, 256, 3136).expect("a plan");
        assert_eq!(r1.parts, 32 * 98);
        assert_eq!(r1.scratch().bytes, 32 * 98 * 256 * 4);
        // One image of one tile needs no partials.
        let one = BiasGradToNhwc::new(1, 5, TILE as u64).expect("a plan");
        assert_eq!((one.parts, one.scratch().bytes), (1, 0));
        // Nothing to move, or parts past a u32: no plan (the separate pass runs).
        assert_eq!(BiasGradToNhwc::new(0, 8, 9), None);
        assert_eq!(BiasGradToNhwc::new(2, 0, 9), None);
        assert_eq!(BiasGradToNhwc::new(2, 8, 0), None);
        assert_eq!(BiasGradToNhwc::new(1 << 20, 1, 1 << 20), None);
    }
}
