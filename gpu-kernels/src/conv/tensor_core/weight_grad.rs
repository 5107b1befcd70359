//! The weight gradient on the tensor cores (`mma.sync` m16n8k8 TF32, sm_80 and up) over
//! NHWC tensors. Per group it is the GEMM `dw = dy^T patches(x)`: M the group's output
//! channels, N the weights' K in their NHWC order (tap-major, channel fastest, as
//! `w[out][kh][kw][in / groups]`), K the output pixels of the batch. In NHWC a pixel's
//! dy is contiguous along M and its patch along N, so both operands are staged as they
//! lie: K-rows of `TC_BM` floats, padded to `WGRAD_PITCH` so that a warp's fragment
//! reads (4 K-rows by 8 columns) hit 32 distinct banks, and the fragments are read one
//! element at a time, rounded to TF32 to nearest. K is long and M x N small, so K is
//! split over blocks into partial gradients that `reduce::split_sum` adds in FP64 in a
//! fixed order: results are the same from run to run.

use super::{TC_BK, TC_BLOCKS_PER_SM, TC_BM, TC_BN, TC_STAGES, TC_THREADS};
use crate::conv::ConvProblem;
use crate::conv::reduce::{self, SplitSumArgs};
use crate::launch::{DevicePtr, DevicePtrMut, Launch, LaunchGeometry, ScratchLayout, kernel_args};

/// Floats per staged K-row of an operand tile: `TC_BM` and 8 more (bank spread).
pub const WGRAD_PITCH: u32 = TC_BM + 8;
/// Bytes of a staged operand tile: `TC_BK` K-rows.
pub const WGRAD_TILE_BYTES: u32 = TC_BK * WGRAD_PITCH * 4;
/// The fewest k-tiles per split, so that a block's pipeline fills.
pub const WGRAD_MIN_K_TILES: u32 = 8;
/// The most splits of K.
pub const WGRAD_MAX_SPLIT: u32 = 64;

const _: () = assert!(TC_BM == TC_BN && WGRAD_PITCH % 32 == 8);

/// How the tensor-core weight gradient is launched: grid x the tiles (N fastest, then
/// M, then the split), grid y the group.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WeightGradPlan {
    /// Tiles of the group's output channels (`TC_BM` each).
    pub m_tiles: u32,
    /// Tiles of the weights' K (`TC_BN` each).
    pub n_tiles: u32,
    pub groups: u32,
    /// Parts of the output pixels summed separately.
    pub split: u32,
    /// K-tiles (`TC_BK` output pixels) per split.
    pub k_tiles: u32,
    /// Whether dy is copied 16 bytes at a time (output channels per group a multiple
    /// of 4), as 1 or 0.
    pub a_vector: u32,
    /// Whether x is copied 16 bytes at a time (input channels per group a multiple of
    /// 4), as 1 or 0.
    pub b_vector: u32,
}

impl WeightGradPlan {
    /// The plan on `multiprocessors` SMs, split by [`wave_filling_split`]. Call only on
    /// problems with a batch.
    pub const fn new(problem: &ConvProblem, multiprocessors: u32) -> Self {
        let p = problem;
        let m_tiles = p.out_per_group().div_ceil(TC_BM);
        let n_tiles = (p.in_per_group() * p.taps()).div_ceil(TC_BN);
        let tiles = m_tiles as u64 * n_tiles as u64 * p.groups as u64;
        let pixel_tiles = (p.batch as u64 * p.out_pixels() as u64).div_ceil(TC_BK as u64);
        let k_tiles = pixel_tiles.div_ceil(wave_filling_split(tiles, pixel_tiles, multiprocessors));
        Self {
            m_tiles,
            n_tiles,
            groups: p.groups,
            split: pixel_tiles.div_ceil(k_tiles) as u32,
            k_tiles: k_tiles as u32,
            a_vector: p.out_per_group().is_multiple_of(4) as u32,
            b_vector: p.in_per_group().is_multiple_of(4) as u32,
        }
    }

    /// The scratch of the partial gradients: `split` of them, when split.
    pub const fn scratch(&self, problem: &ConvProblem) -> ScratchLayout {
        reduce::partials_scratch(self.split, problem.weight_count())
    }

    /// The launches: the products into `dw` (NHWC weights), or with a split into
    /// `partials` (the scratch laid out by [`Self::scratch`]), then their sum into `dw`.
    pub fn launches(
        &self,
        problem: &ConvProblem,
        x: DevicePtr<f32>,
        dy: DevicePtr<f32>,
        partials: DevicePtrMut<u8>,
        dw: DevicePtrMut<f32>,
    ) -> (Launch<WeightGradArgs>, Option<Launch<SplitSumArgs>>) {
        let (out, sum) = reduce::split_outputs(self.split, problem.weight_count(), partials, dw);
        let geometry = LaunchGeometry {
            grid: [
                self.m_tiles as u64 * self.n_tiles as u64 * self.split as u64,
                self.groups as u64,
                1,
            ],
            threads: TC_THREADS,
            shared_bytes: TC_STAGES * 2 * WGRAD_TILE_BYTES,
        };
        let args = WeightGradArgs {
            x,
            dy,
            out,
            problem: *problem,
            plan: *self,
        };
        (Launch::new(CONV_WEIGHT_GRAD_NHWC_TF32, geometry, args), sum)
    }
}

/// How many parts to split `k_tiles` k-tiles of each of `tiles` tiles into on
/// `multiprocessors` SMs: the split that fills the SMs' waves best (the fewest splits
/// unless more fill them by a 32nd more), each part at least `WGRAD_MIN_K_TILES`
/// k-tiles, at most `WGRAD_MAX_SPLIT` parts.
pub const fn wave_filling_split(tiles: u64, k_tiles: u64, multiprocessors: u32) -> u64 {
    let most = k_tiles / WGRAD_MIN_K_TILES as u64;
    let most = if most > WGRAD_MAX_SPLIT as u64 {
        WGRAD_MAX_SPLIT as u64
    } else {
        most
    };
    // The SMs' slots that `blocks` blocks take: whole waves.
    let sms = multiprocessors as u64;
    let (mut best, mut best_blocks, mut best_slots) = (1, tiles, tiles.div_ceil(sms) * sms);
    let mut split = 2;
    while split <= most {
        let blocks = tiles * split;
        let slots = blocks.div_ceil(sms) * sms;
        // blocks / slots > best_blocks / best_slots + 1 / 32
        if 32 * blocks * best_slots > (32 * best_blocks + best_slots) * slots {
            (best, best_blocks, best_slots) = (split, blocks, slots);
        }
        split += 1;
    }
    best
}

kernel_args! {
    /// The tensor-core weight gradient's arguments: x and dy in NHWC, and the gradient
    /// (`[out][kh][kw][in / groups]`), or with `plan.split > 1` the partials, `split`
    /// such gradients, in `out`.
    pub struct WeightGradArgs {
        pub x: DevicePtr<f32>,
        pub dy: DevicePtr<f32>,
        pub out: DevicePtrMut<f32>,
        pub problem: ConvProblem,
        pub plan: WeightGradPlan,
    }
    /// The TF32 weight gradient over NHWC tensors on `mma.sync`.
    pub const CONV_WEIGHT_GRAD_NHWC_TF32 = "conv_weight_grad_nhwc_tf32" =>
        kernel::weight_grad_nhwc, bounds(TC_THREADS, TC_BLOCKS_PER_SM);
    entry points in ENTRY_POINTS;
}

#[cfg(target_arch = "nvptx64")]
mod kernel {
    use super::super::operands::{Operand, window_origin};
    use super::super::warp_mma::pipeline;
    use super::*;
    use crate::device::{
        async_copy, async_copy_cached, block_idx_x, block_idx_y, lane_id, load_shared_f32, mma_tf32_16x8x8,
        thread_idx_x, to_tf32,
    };

    /// Shared-window address of (K-row `k`, column `column`) of a staged tile.
    #[inline(always)]
    fn staged(tile: u32, k: u32, column: u32) -> u32 {
        tile + (k * WGRAD_PITCH + column) * 4
    }

    /// This thread's share of a staged tile (`TC_BK` K-rows of 32 chunks of 4 floats):
    /// `R` K-rows and `C` chunks of each, `R C = 4`. Each row is copied by `32 / C`
    /// threads side by side: rows `thread / (32 / C)`, then every `TC_THREADS / (32 /
    /// C)`; chunks `thread % (32 / C)`, then every `32 / C`. With 4 chunks per row, a
    /// thread finds the pixel of its row once for 4 copies.
    #[derive(Clone, Copy)]
    struct Slots<const R: usize, const C: usize> {
        rows: [u32; R],
        /// The first column of each chunk.
        columns: [u32; C],
    }

    impl<const R: usize, const C: usize> Slots<R, C> {
        #[inline(always)]
        fn new() -> Self {
            const { assert!(R * C == 4 && (C == 1 || C == 4)) };
            let (t, per_row) = (thread_idx_x(), 32 / C as u32);
            Self {
                rows: core::array::from_fn(|i| t / per_row + TC_THREADS / per_row * i as u32),
                columns: core::array::from_fn(|j| 4 * (t % per_row + per_row * j as u32)),
            }
        }

        /// The column of element `e` of this thread's four: the first of chunk `e`, or
        /// with one chunk, its element `e`.
        #[inline(always)]
        fn column(&self, e: usize) -> u32 {
            if C == 4 {
                self.columns[e % C]
            } else {
                self.columns[0] + e as u32
            }
        }
    }

    /// Where a split's k-tiles lie: its first output pixel and the batch's pixels.
    #[derive(Clone, Copy)]
    struct Pixels {
        first: u32,
        count: u32,
    }

    impl Pixels {
        /// The output pixel of K-row `k` of k-tile `kt`.
        #[inline(always)]
        fn of(self, kt: u32, k: u32) -> u32 {
            self.first + kt * TC_BK + k
        }
    }

    /// dy as A, staged as K-rows (pixels) of the tile's `TC_BM` output channels.
    struct OutputGradients<const R: usize, const C: usize> {
        dy: *const f32,
        slots: Slots<R, C>,
        /// The offset of the tile's first channel in a pixel, the channels of the group
        /// from it, and the channels of a pixel.
        offset: u64,
        columns_left: u32,
        channels: u32,
        pixels: Pixels,
        /// Whether chunks are copied 16 bytes at a time (always with 4 chunks).
        vector: bool,
    }

    impl<const R: usize, const C: usize> Operand for OutputGradients<R, C> {
        #[inline(always)]
        unsafe fn stage(&self, tile: u32, kt: u32) {
            for &k in &self.slots.rows {
                let pixel = self.pixels.of(kt, k);
                let at = pixel as u64 * self.channels as u64 + self.offset;
                // Elements past the batch's pixels or the group's channels are zeros.
                let copy = |column: u32, elements: u32| {
                    let valid = pixel < self.pixels.count && column + elements <= self.columns_left;
                    let source = if valid {
                        self.dy.wrapping_add((at + column as u64) as usize)
                    } else {
                        self.dy
                    };
                    (source as *const u8, valid)
                };
                for &column in &self.slots.columns {
                    if self.vector {
                        let (source, valid) = copy(column, 4);
                        // SAFETY: a valid chunk is 4 channels of the group at a pixel
                        // of dy, 16-byte aligned (channels and the group's first a
                        // multiple of 4); else nothing is read.
                        unsafe { async_copy::<16>(staged(tile, k, column), source, 16 * valid as u32) };
                    } else {
                        for e in 0..4 {
                            let (source, valid) = copy(column + e, 1);
                            // SAFETY: a valid element is a channel of the group at a
                            // pixel of dy; else nothing is read.
                            unsafe { async_copy::<4>(staged(tile, k, column + e), source, 4 * valid as u32) };
                        }
                    }
                }
            }
        }
    }

    /// A tap and channel of the group (a column of B): its offset from a window's
    /// origin in x, its displacement, and whether it lies inside the weights' K.
    #[derive(Clone, Copy)]
    struct Column {
        offset: i64,
        dy: i32,
        dx: i32,
        in_k: bool,
    }

    /// x's patches as B, staged as K-rows (pixels) of the tile's `TC_BN` taps and
    /// channels.
    struct Patches<const R: usize, const C: usize> {
        x: *const f32,
        slots: Slots<R, C>,
        /// This thread's four elements ([`Slots::column`]).
        columns: [Column; 4],
        problem: ConvProblem,
        group: u32,
        pixels: Pixels,
        vector: bool,
    }

    impl<const R: usize, const C: usize> Patches<R, C> {
        #[inline(always)]
        fn new(
            x: *const f32,
            problem: &ConvProblem,
            group: u32,
            n0: u32,
            pixels: Pixels,
            vector: bool,
        ) -> Self {
            let p = problem;
            let slots = Slots::new();
            let in_group = p.in_per_group();
            let columns = core::array::from_fn(|e| {
                let n = n0 + slots.column(e);
                let (tap, channel) = (n / in_group, n % in_group);
                let (r, s) = p.div_kernel_w.divmod(tap);
                let (dy, dx) = ((r * p.dilation_h) as i32, (s * p.dilation_w) as i32);
                Column {
                    offset: (dy as i64 * p.width as i64 + dx as i64) * p.in_channels as i64 + channel as i64,
                    dy,
                    dx,
                    in_k: tap < p.taps(),
                }
            });
            Self {
                x,
                slots,
                columns,
                problem: *p,
                group,
                pixels,
                vector,
            }
        }
    }

    impl<const R: usize, const C: usize> Operand for Patches<R, C> {
        #[inline(always)]
        unsafe fn stage(&self, tile: u32, kt: u32) {
            let p = &self.problem;
            for &k in &self.slots.rows {
                // Past the batch's pixels the origin lies outside the image: zeros.
                let origin = window_origin(p, self.pixels.of(kt, k), self.group);
                let source = |c: Column| {
                    let inside =
                        ((origin.1 + c.dy) as u32) < p.height && ((origin.2 + c.dx) as u32) < p.width;
                    if c.in_k && inside {
                        (
                            self.x.wrapping_offset((origin.0 + c.offset) as isize) as *const u8,
                            true,
                        )
                    } else {
                        (self.x as *const u8, false)
                    }
                };
                if self.vector {
                    for (j, &column) in self.slots.columns.iter().enumerate() {
                        let (source, valid) = source(self.columns[j]);
                        // SAFETY: a valid chunk is 4 channels of the group (their count a
                        // multiple of 4) at a pixel inside x, 16-byte aligned; else
                        // nothing is read. Through L1: the block's other taps read the
                        // same pixels.
                        unsafe { async_copy_cached(staged(tile, k, column), source, 16 * valid as u32) };
                    }
                } else {
                    for (e, &c) in self.columns.iter().enumerate() {
                        let (source, valid) = source(c);
                        // SAFETY: a valid element is a channel of the group at a pixel
                        // inside x; else nothing is read.
                        unsafe {
                            async_copy::<4>(staged(tile, k, self.slots.column(e)), source, 4 * valid as u32)
                        };
                    }
                }
            }
        }
    }

    /// The weight gradient of conv for dy (NHWC), or with `plan.split > 1` its per-split
    /// partials.
    ///
    /// # Safety
    /// x and dy hold the problem's NHWC tensors and `out` the gradient in NHWC
    /// (`split` of them when split); the launch is the one [`WeightGradPlan::launches`]
    /// builds from this problem's plan.
    #[inline(always)]
    pub unsafe fn weight_grad_nhwc(args: WeightGradArgs) {
        // SAFETY: forwarded.
        unsafe {
            if args.plan.a_vector == 1 && args.plan.b_vector == 1 {
                weight_grad::<1, 4>(args)
            } else {
                weight_grad::<4, 1>(args)
            }
        }
    }

    /// [`weight_grad_nhwc`] with each thread staging `R` K-rows of `C` chunks.
    ///
    /// # Safety
    /// As [`weight_grad_nhwc`]; 4 chunks per row only when both operands are copied 16
    /// bytes at a time.
    #[inline(always)]
    unsafe fn weight_grad<const R: usize, const C: usize>(args: WeightGradArgs) {
        let (p, plan) = (&args.problem, &args.plan);
        let group = block_idx_y();
        let b = block_idx_x();
        let (rest, n_tile) = (b / plan.n_tiles, b % plan.n_tiles);
        let (m0, n0, split) = (rest % plan.m_tiles * TC_BM, n_tile * TC_BN, rest / plan.m_tiles);
        let pixels = Pixels {
            first: split * plan.k_tiles * TC_BK,
            count: p.batch * p.out_pixels(),
        };
        // The split's k-tiles (the last one's pixels end with the batch's).
        let k_tiles = plan.k_tiles.min((pixels.count - pixels.first).div_ceil(TC_BK));
        let out_group = p.out_per_group();
        let a = OutputGradients::<R, C> {
            dy: args.dy.as_ptr(),
            slots: Slots::new(),
            offset: (group * out_group + m0) as u64,
            columns_left: out_group - m0,
            channels: p.out_channels,
            pixels,
            vector: plan.a_vector == 1,
        };
        let b = Patches::<R, C>::new(args.x.as_ptr(), p, group, n0, pixels, plan.b_vector == 1);

        let warp = thread_idx_x() / 32;
        let (row0, col0) = ((warp % 2) * 64, (warp / 2) * 32);
        let lane = lane_id();
        let (g, t) = (lane / 4, lane % 4);
        let multiply = |(tile_a, tile_b): (u32, u32), mut acc: [[[f32; 4]; 4]; 4]| {
            // SAFETY: an element of the stage, landed and published by the barrier.
            let element =
                |tile: u32, k: u32, column: u32| to_tf32(unsafe { load_shared_f32(staged(tile, k, column)) });
            for kk in 0..TC_BK / 8 {
                let k = kk * 8 + t;
                // A (16 x 8) at (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4).
                let a_frags: [[u32; 4]; 4] = core::array::from_fn(|i| {
                    let m = row0 + 16 * i as u32 + g;
                    [
                        element(tile_a, k, m),
                        element(tile_a, k, m + 8),
                        element(tile_a, k + 4, m),
                        element(tile_a, k + 4, m + 8),
                    ]
                });
                // B (8 x 8) at (t, g), (t + 4, g).
                let b_frags: [[u32; 2]; 4] = core::array::from_fn(|j| {
                    let n = col0 + 8 * j as u32 + g;
                    [element(tile_b, k, n), element(tile_b, k + 4, n)]
                });
                for (i, a) in a_frags.iter().enumerate() {
                    for (j, b) in b_frags.iter().enumerate() {
                        acc[i][j] = mma_tf32_16x8x8(*a, *b, acc[i][j]);
                    }
                }
            }
            acc
        };
        let sums = [[[0.0f32; 4]; 4]; 4];
        let tiles = (WGRAD_TILE_BYTES, WGRAD_TILE_BYTES);
        // SAFETY: every thread of the block calls it with the same `k_tiles`; the
        // launch has `TC_STAGES` stages of both tiles.
        let acc = unsafe { pipeline(k_tiles, sums, (&a, &b), tiles, multiply) };

        // Sums (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1) of each 16 x 8 tile.
        let k = p.in_per_group() * p.taps();
        let out = args.out.as_mut_ptr();
        let base = split as u64 * p.weight_count() + (group * out_group) as u64 * k as u64;
        for (i, row) in acc.iter().enumerate() {
            for (j, sums) in row.iter().enumerate() {
                for (e, &sum) in sums.iter().enumerate() {
                    let m = m0 + row0 + 16 * i as u32 + g + 8 * (e as u32 / 2);
                    let n = n0 + col0 + 8 * j as u32 + 2 * t + e as u32 % 2;
                    if m < out_group && n < k {
                        // SAFETY: output channel m of the group, weight n of its K, in
                        // this split's gradient.
                        unsafe { *out.add((base + m as u64 * k as u64 + n as u64) as usize) = sum };
                    }
                }
            }
        }
    }
}
