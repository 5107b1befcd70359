//! The operands of the tensor-core GEMM and their copies into shared-memory stages.
//!
//! Shared memory per stage: A `[TC_BM][TC_BK]` then B `[TC_BN][TC_BK]`, rows of 128
//! bytes whose eight 16-byte chunks are stored at `chunk ^ (row % 8)` (the 128-byte
//! swizzle that `wgmma` reads), so that the fragment reads of a warp (8 rows by 4
//! columns) hit 32 distinct banks.

use super::*;
use crate::conv::FastDiv;
use crate::device::{async_copy, thread_idx_x};

/// Chunks (16 bytes, four elements) per staged row.
const CHUNKS: u32 = TC_BK / 4;
/// Staged rows each thread fills per operand and stage.
const ROWS_PER_THREAD: usize = (TC_BM * CHUNKS / TC_THREADS) as usize;

const _: () = assert!(TC_THREADS.is_multiple_of(CHUNKS) && ROWS_PER_THREAD == 4);

/// Shared-window address of element `k` of row `row` of an operand tile at `tile`.
#[inline(always)]
pub fn staged(tile: u32, row: u32, k: u32) -> u32 {
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

/// x read as NHWC patches: row m of A is output pixel m of the group's GEMM, column k
/// is tap `k / channels` (row-major over the window) and channel `k % channels`.
pub struct Patches {
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
    pub fn new(x: *const f32, problem: ConvProblem, m0: u32, group: u32) -> Self {
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
pub struct VectorPatches(pub Patches);

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
pub struct ScalarPatches(pub Patches);

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
pub struct NchwPatches {
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
    pub fn new(x: *const f32, problem: ConvProblem, m0: u32, group: u32) -> Self {
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
pub struct Filters {
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
    pub fn new(w: *const f32, problem: &ConvProblem, n0: u32, group: u32) -> Self {
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
pub struct VectorFilters(pub Filters);

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
pub struct ScalarFilters(pub Filters);

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
