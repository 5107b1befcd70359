//! The tensor-core mainloop and the NHWC forward pass built on it.
//!
//! Shared memory per stage: A `[TC_BM][TC_BK]` then B `[TC_BN][TC_BK]`, rows of 128
//! bytes whose eight 16-byte chunks are stored at `chunk ^ (row % 8)`, so that the
//! fragment reads of a warp (8 rows by 4 columns) hit 32 distinct banks.

use super::*;
use crate::conv::FastDiv;
use crate::device::{
    async_copy, async_copy_commit, async_copy_wait, block_idx_x, block_idx_y, block_idx_z, lane_id,
    load_matrix_x4, mma_tf32_16x8x8, shared_base, sync_threads, thread_idx_x, to_tf32,
};

/// Chunks (16 bytes, four elements) per staged row.
const CHUNKS: u32 = TC_BK / 4;
/// Staged rows each thread fills per operand and stage.
const ROWS_PER_THREAD: usize = (TC_BM * CHUNKS / TC_THREADS) as usize;

const _: () = assert!(TC_THREADS.is_multiple_of(CHUNKS) && ROWS_PER_THREAD == 4);

/// Shared-window address of element `k` of row `row` of an operand tile at `tile`.
#[inline(always)]
fn staged(tile: u32, row: u32, k: u32) -> u32 {
    tile + row * TC_BK * 4 + (((k / 4) ^ (row % 8)) * 16) + (k % 4) * 4
}

/// One operand of the GEMM as the mainloop stages it: where each of this thread's
/// rows starts, and the copies of one slice of K into a stage.
pub trait Operand {
    /// Starts the copies of this thread's share of K slice `k0..k0 + TC_BK` into the
    /// operand tile at `tile` (zeros outside the operand).
    ///
    /// # Safety
    /// `tile` is a stage of the launch's shared memory that no thread reads until the
    /// copies are waited for and a barrier passed.
    unsafe fn stage(&self, tile: u32, k0: u32);
}

/// This thread's rows of a staged tile (`thread / CHUNKS + 32 i`) and its chunk.
#[inline(always)]
fn staging_slot() -> ([u32; ROWS_PER_THREAD], u32) {
    let t = thread_idx_x();
    let step = TC_THREADS / CHUNKS;
    (core::array::from_fn(|i| t / CHUNKS + step * i as u32), t % CHUNKS)
}

/// The accumulators of a warp's 64 x 32 outputs: `[m tile][n tile][4]`.
pub type Accumulators = [[[f32; 4]; 4]; 4];

/// The warp's tile: (row of C within the block, column within the block).
#[inline(always)]
fn warp_origin() -> (u32, u32) {
    let warp = thread_idx_x() / 32;
    ((warp % 2) * 64, (warp / 2) * 32)
}

/// `A B^T` over K for the block's tile: `a` and `b` stage `k_tiles` slices through
/// `TC_STAGES` stages, and each warp multiplies its 64 x 32 share with `mma.sync`.
///
/// # Safety
/// The launch has `TC_THREADS` threads and `TC_SHARED_BYTES` of dynamic shared memory;
/// every thread of the block calls it with the same `k_tiles`.
#[inline(always)]
pub unsafe fn mainloop<A: Operand, B: Operand>(a: &A, b: &B, k_tiles: u32) -> Accumulators {
    let stage_a = |s: u32| shared_base() + s * 2 * TC_TILE_BYTES;
    let stage_b = |s: u32| stage_a(s) + TC_TILE_BYTES;
    // SAFETY (of every `stage` call): the stage filled is one that every thread
    // finished reading before the barrier of the iteration that fills it.
    for s in 0..TC_STAGES - 1 {
        if s < k_tiles {
            unsafe {
                a.stage(stage_a(s), s * TC_BK);
                b.stage(stage_b(s), s * TC_BK);
            }
        }
        async_copy_commit();
    }
    let (row0, col0) = warp_origin();
    let lane = lane_id();
    let mut acc: Accumulators = [[[0.0; 4]; 4]; 4];
    for kt in 0..k_tiles {
        async_copy_wait::<{ TC_STAGES - 2 }>();
        // SAFETY: every thread reaches it; the stage of `kt` landed for every thread.
        unsafe { sync_threads() };
        let refill = kt + TC_STAGES - 1;
        if refill < k_tiles {
            let s = refill % TC_STAGES;
            // SAFETY: stage `s` was last read in iteration `kt - 1`, before the barrier.
            unsafe {
                a.stage(stage_a(s), refill * TC_BK);
                b.stage(stage_b(s), refill * TC_BK);
            }
        }
        async_copy_commit();
        let (tile_a, tile_b) = (stage_a(kt % TC_STAGES), stage_b(kt % TC_STAGES));
        // Lane `i` addresses row `i % 8` of matrix `i / 8` of each `ldmatrix.x4`.
        let (row_in, matrix) = (lane % 8, lane / 8);
        for kk in 0..TC_BK / 8 {
            let fragment = |address: u32| {
                // SAFETY: 16-byte rows of the stage, landed and published by the barrier;
                // the whole warp calls it.
                unsafe { load_matrix_x4(address) }.map(|bits| to_tf32(f32::from_bits(bits)))
            };
            // A: matrices (rows 0-7, k 0-3), (rows 8-15, k 0-3), (0-7, 4-7), (8-15, 4-7).
            let a_frags: [[u32; 4]; 4] = core::array::from_fn(|i| {
                let row = row0 + i as u32 * 16 + row_in + 8 * (matrix % 2);
                fragment(staged(tile_a, row, kk * 8 + 4 * (matrix / 2)))
            });
            // B: for n tiles 2p and 2p + 1, matrices (k 0-3), (k 4-7) of each.
            let b_pairs: [[u32; 4]; 2] = core::array::from_fn(|p| {
                let row = col0 + p as u32 * 16 + row_in + 8 * (matrix / 2);
                fragment(staged(tile_b, row, kk * 8 + 4 * (matrix % 2)))
            });
            let b_frags: [[u32; 2]; 4] =
                core::array::from_fn(|j| [b_pairs[j / 2][2 * (j % 2)], b_pairs[j / 2][2 * (j % 2) + 1]]);
            for (i, a) in a_frags.iter().enumerate() {
                for (j, b) in b_frags.iter().enumerate() {
                    acc[i][j] = mma_tf32_16x8x8(*a, *b, acc[i][j]);
                }
            }
        }
    }
    acc
}

/// x read as NHWC patches: row m of A is output pixel m of the group's GEMM, column k
/// is tap `k / channels` (row-major over the window) and channel `k % channels`.
struct Patches {
    x: *const f32,
    /// Per staged row: the offset of the window's origin pixel (image and position,
    /// group's first channel), and its coordinates (`i32::MIN / 2` past M).
    origins: [(i64, i32, i32); ROWS_PER_THREAD],
    rows: [u32; ROWS_PER_THREAD],
    chunk: u32,
    problem: ConvProblem,
    k: u32,
    div_channels: FastDiv,
}

impl Patches {
    #[inline(always)]
    fn new(x: *const f32, problem: ConvProblem, m0: u32, group: u32) -> Self {
        let p = &problem;
        let (rows, chunk) = staging_slot();
        let m_total = p.batch * p.out_pixels();
        let origins = rows.map(|r| {
            let m = m0 + r;
            if m >= m_total {
                return (0, i32::MIN / 2, i32::MIN / 2);
            }
            let (image, pixel) = p.div_out_pixels.divmod(m);
            let (oy, ox) = p.div_out_w.divmod(pixel);
            let y = (oy * p.stride_h) as i32 - p.pad_h as i32;
            let x = (ox * p.stride_w) as i32 - p.pad_w as i32;
            let offset = ((image as i64 * p.height as i64 + y as i64) * p.width as i64 + x as i64)
                * p.in_channels as i64
                + (group * p.in_per_group()) as i64;
            (offset, y, x)
        });
        Self {
            x,
            origins,
            rows,
            chunk,
            problem,
            k: p.in_per_group() * p.taps(),
            div_channels: FastDiv::new(p.in_per_group()),
        }
    }

    /// The offset of tap element `k` from a window's origin and its displacement.
    #[inline(always)]
    fn tap(&self, k: u32) -> (i64, i32, i32) {
        let p = &self.problem;
        let (tap, channel) = self.div_channels.divmod(k);
        let (r, s) = p.div_kernel_w.divmod(tap);
        let (dy, dx) = ((r * p.dilation_h) as i32, (s * p.dilation_w) as i32);
        (
            (dy as i64 * p.width as i64 + dx as i64) * p.in_channels as i64 + channel as i64,
            dy,
            dx,
        )
    }

    /// Whether the origin displaced by (dy, dx) lies inside the image.
    #[inline(always)]
    fn inside(&self, origin: (i64, i32, i32), dy: i32, dx: i32) -> bool {
        ((origin.1 + dy) as u32) < self.problem.height && ((origin.2 + dx) as u32) < self.problem.width
    }
}

/// Patches whose channels per group are a multiple of 4: one 16-byte copy per chunk.
struct VectorPatches(Patches);

impl Operand for VectorPatches {
    #[inline(always)]
    unsafe fn stage(&self, tile: u32, k0: u32) {
        let p = &self.0;
        let k = k0 + p.chunk * 4;
        let (offset, dy, dx) = p.tap(k);
        let in_k = k < p.k;
        for (i, &origin) in p.origins.iter().enumerate() {
            let valid = in_k && p.inside(origin, dy, dx);
            let source = if valid {
                p.x.wrapping_offset((origin.0 + offset) as isize)
            } else {
                p.x
            };
            // SAFETY: a valid chunk lies inside x (the tap is inside the image, the four
            // channels inside the group) and is 16-byte aligned (channels per group and
            // the image's channels are multiples of 4); else nothing is read.
            unsafe {
                async_copy::<16>(
                    staged(tile, p.rows[i], p.chunk * 4),
                    source as *const u8,
                    if valid { 16 } else { 0 },
                )
            };
        }
    }
}

/// Patches of any channel count: one 4-byte copy per element.
struct ScalarPatches(Patches);

impl Operand for ScalarPatches {
    #[inline(always)]
    unsafe fn stage(&self, tile: u32, k0: u32) {
        let p = &self.0;
        for e in 0..4 {
            let k = k0 + p.chunk * 4 + e;
            let (offset, dy, dx) = p.tap(k);
            let in_k = k < p.k;
            for (i, &origin) in p.origins.iter().enumerate() {
                let valid = in_k && p.inside(origin, dy, dx);
                let source = if valid {
                    p.x.wrapping_offset((origin.0 + offset) as isize)
                } else {
                    p.x
                };
                // SAFETY: a valid element lies inside x; else nothing is read.
                unsafe {
                    async_copy::<4>(
                        staged(tile, p.rows[i], p.chunk * 4 + e),
                        source as *const u8,
                        if valid { 4 } else { 0 },
                    )
                };
            }
        }
    }
}

/// x read as NCHW patches, one element per copy: row m of A is output pixel m of the
/// group's GEMM, column k is channel `k / taps` and tap `k % taps` (the weights' order).
/// Each thread copies `TC_BK / 2` consecutive K of one row, so that a warp's copies of
/// one K are 32 neighbouring output pixels.
struct NchwPatches {
    x: *const f32,
    /// The row: its plane offset (image, group's first channel) and window origin
    /// (`i32::MIN / 2` past M).
    origin: (i64, i32, i32),
    row: u32,
    /// This thread's first K of a slice.
    k_offset: u32,
    problem: ConvProblem,
    k: u32,
}

/// K each thread of [`NchwPatches`] copies per slice.
const NCHW_RUN: u32 = TC_BK * TC_BM / TC_THREADS;

impl NchwPatches {
    #[inline(always)]
    fn new(x: *const f32, problem: ConvProblem, m0: u32, group: u32) -> Self {
        let p = &problem;
        let t = thread_idx_x();
        let row = t % TC_BM;
        let m = m0 + row;
        let origin = if m < p.batch * p.out_pixels() {
            let (image, pixel) = p.div_out_pixels.divmod(m);
            let (oy, ox) = p.div_out_w.divmod(pixel);
            let plane =
                (image as i64 * p.in_channels as i64 + (group * p.in_per_group()) as i64) * p.pixels() as i64;
            (
                plane,
                (oy * p.stride_h) as i32 - p.pad_h as i32,
                (ox * p.stride_w) as i32 - p.pad_w as i32,
            )
        } else {
            (0, i32::MIN / 2, i32::MIN / 2)
        };
        Self {
            x,
            origin,
            row,
            k_offset: t / TC_BM * NCHW_RUN,
            problem,
            k: p.in_per_group() * p.taps(),
        }
    }
}

impl Operand for NchwPatches {
    #[inline(always)]
    unsafe fn stage(&self, tile: u32, k0: u32) {
        let p = &self.problem;
        let first = k0 + self.k_offset;
        let (mut channel, tap) = p.div_taps.divmod(first);
        let (mut r, mut s) = p.div_kernel_w.divmod(tap);
        for e in 0..NCHW_RUN {
            let (iy, ix) = (
                self.origin.1 + (r * p.dilation_h) as i32,
                self.origin.2 + (s * p.dilation_w) as i32,
            );
            let valid = first + e < self.k && (iy as u32) < p.height && (ix as u32) < p.width;
            let source = if valid {
                let at = self.origin.0
                    + channel as i64 * p.pixels() as i64
                    + iy as i64 * p.width as i64
                    + ix as i64;
                self.x.wrapping_offset(at as isize)
            } else {
                self.x
            };
            // SAFETY: a valid element lies inside x (a channel of the group, a pixel of the
            // image); else nothing is read.
            unsafe {
                async_copy::<4>(
                    staged(tile, self.row, self.k_offset + e),
                    source as *const u8,
                    if valid { 4 } else { 0 },
                )
            };
            // The next K: the next tap, the next channel after the window's last.
            s += 1;
            if s == p.kernel_w {
                s = 0;
                r += 1;
                if r == p.kernel_h {
                    r = 0;
                    channel += 1;
                }
            }
        }
    }
}

/// w as B^T: row n is output channel `n` of the group, its weights contiguous along K
/// (`[kh][kw][in / groups]` in NHWC, `[in / groups][kh][kw]` in NCHW).
struct Filters {
    w: *const f32,
    rows: [u32; ROWS_PER_THREAD],
    chunk: u32,
    /// Offset of the tile's first row, and the rows and K of the group.
    base: u64,
    n: u32,
    k: u32,
}

impl Filters {
    #[inline(always)]
    fn new(w: *const f32, problem: &ConvProblem, n0: u32, group: u32) -> Self {
        let (rows, chunk) = staging_slot();
        let k = problem.in_per_group() * problem.taps();
        let n = problem.out_per_group();
        Self {
            w,
            rows,
            chunk,
            base: (group * n + n0) as u64 * k as u64,
            n: n - n0.min(n),
            k,
        }
    }

    /// Copies `BYTES` of row `row` from element `k` (whole copies only).
    ///
    /// # Safety
    /// As [`Operand::stage`].
    #[inline(always)]
    unsafe fn copy<const BYTES: u32>(&self, tile: u32, row: u32, k: u32) {
        let valid = row < self.n && k < self.k;
        let source = if valid {
            self.w
                .wrapping_add((self.base + row as u64 * self.k as u64 + k as u64) as usize)
        } else {
            self.w
        };
        // SAFETY: a valid copy lies inside w (row and k inside the group's filters) and
        // is aligned to its size (K is a multiple of 4 for 16-byte copies); else nothing
        // is read.
        unsafe {
            async_copy::<BYTES>(
                staged(tile, row, k % TC_BK),
                source as *const u8,
                if valid { BYTES } else { 0 },
            )
        };
    }
}

/// Filters whose K is a multiple of 4: 16-byte copies.
struct VectorFilters(Filters);

impl Operand for VectorFilters {
    #[inline(always)]
    unsafe fn stage(&self, tile: u32, k0: u32) {
        let f = &self.0;
        for &row in &f.rows {
            // SAFETY: forwarded.
            unsafe { f.copy::<16>(tile, row, k0 + f.chunk * 4) };
        }
    }
}

/// Filters of any K: 4-byte copies.
struct ScalarFilters(Filters);

impl Operand for ScalarFilters {
    #[inline(always)]
    unsafe fn stage(&self, tile: u32, k0: u32) {
        let f = &self.0;
        for &row in &f.rows {
            for e in 0..4 {
                // SAFETY: forwarded.
                unsafe { f.copy::<4>(tile, row, k0 + f.chunk * 4 + e) };
            }
        }
    }
}

/// y = conv(x, w) + bias over NHWC tensors.
///
/// # Safety
/// x, w and y hold the problem's NHWC tensors (w `[out][kh][kw][in / groups]`), bias
/// null or `out_channels` floats; `plan` is the problem's forward plan in NHWC, the
/// grid `m_tiles x groups x n_tiles` blocks of `TC_THREADS` with `TC_SHARED_BYTES` of
/// dynamic shared memory.
#[inline(always)]
pub unsafe fn forward_nhwc(args: TensorCoreArgs) {
    let (p, plan) = (&args.problem, &args.plan);
    let (m0, group, _) = block_origin();
    let patches = Patches::new(args.x.as_ptr(), *p, m0, group);
    // SAFETY: forwarded from the launch's contract.
    let acc = unsafe {
        if plan.a_vector != 0 {
            with_filters(&args, VectorPatches(patches))
        } else {
            with_filters(&args, ScalarPatches(patches))
        }
    };
    // SAFETY: as above; NHWC: output pixel m's channels are contiguous.
    unsafe {
        store(&args, &acc, |m, channel| {
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
pub unsafe fn forward_nchw(args: TensorCoreArgs) {
    let p = &args.problem;
    let (m0, group, _) = block_origin();
    let patches = NchwPatches::new(args.x.as_ptr(), *p, m0, group);
    // SAFETY: forwarded from the launch's contract.
    let acc = unsafe { with_filters(&args, patches) };
    let store_at = |m: u32, channel: u32| {
        let (image, pixel) = p.div_out_pixels.divmod(m);
        (image as u64 * p.out_channels as u64 + channel as u64) * p.out_pixels() as u64 + pixel as u64
    };
    // SAFETY: as above; NCHW: each channel's plane of output pixels.
    unsafe { store(&args, &acc, store_at) };
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
unsafe fn with_filters<A: Operand>(args: &TensorCoreArgs, patches: A) -> Accumulators {
    let p = &args.problem;
    let (_, group, n0) = block_origin();
    let k_tiles = (p.in_per_group() * p.taps()).div_ceil(TC_BK);
    let filters = Filters::new(args.w.as_ptr(), p, n0, group);
    // SAFETY: forwarded.
    unsafe {
        if args.plan.b_vector != 0 {
            mainloop(&patches, &VectorFilters(filters), k_tiles)
        } else {
            mainloop(&patches, &ScalarFilters(filters), k_tiles)
        }
    }
}

/// Writes the warp's outputs plus the bias: output pixel m and the group's channel c go
/// to `y[store_at(m, channel)]`.
///
/// # Safety
/// `store_at` maps every output pixel and channel of the problem inside y.
#[inline(always)]
unsafe fn store(args: &TensorCoreArgs, acc: &Accumulators, store_at: impl Fn(u32, u32) -> u64) {
    let p = &args.problem;
    let (m0, group, n0) = block_origin();
    let (row0, col0) = warp_origin();
    let lane = lane_id();
    let (g, t) = (lane / 4, lane % 4);
    let m_total = p.batch * p.out_pixels();
    let out_group = p.out_per_group();
    let (y, bias) = (args.y.as_mut_ptr(), args.bias.as_ptr());
    // Constant loop bounds throughout: an index the compiler cannot unroll would move
    // the accumulators to local memory.
    for j in 0..4 {
        let column = n0 + col0 + j as u32 * 8 + 2 * t;
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
        for (i, sums) in acc.iter().enumerate() {
            for half in 0..2 {
                let m = m0 + row0 + i as u32 * 16 + g + 8 * half as u32;
                for (e, &(valid, channel, b)) in channels.iter().enumerate() {
                    if valid && m < m_total {
                        // SAFETY: (m, channel) is an output of the problem, inside y.
                        unsafe { *y.add(store_at(m, channel) as usize) = sums[j][2 * half + e] + b };
                    }
                }
            }
        }
    }
}
