//! The operands of the tensor-core GEMM and their copies into shared-memory stages.
//!
//! A stage holds an operand tile as rows of `TC_BK` K (128 bytes) whose eight 16-byte
//! chunks are stored at `chunk ^ (row % 8)`: the 128-byte swizzle that `wgmma` reads,
//! under which the fragment reads of a warp (8 rows by 4 columns) hit 32 distinct
//! banks. The threads that copy a tile (all of the block, or a producer warpgroup)
//! split it by rows and chunks.

use super::*;
use crate::conv::FastDiv;
use crate::device::{async_copy, async_copy_cached};
#[cfg(target_feature = "sm_90a")]
use crate::device::{load_shared_v4_f32, store_shared_v4_f32};

/// Chunks (16 bytes, four elements) per staged row.
const CHUNKS: u32 = TC_BK / 4;

/// Shared-window address of element `k` of row `row` of an operand tile at `tile`.
#[inline(always)]
pub fn staged(tile: u32, row: u32, k: u32) -> u32 {
    tile + row * TC_BK * 4 + (((k / 4) ^ (row % 8)) * 16) + (k % 4) * 4
}

/// One operand of the GEMM as a mainloop stages it.
pub trait Operand {
    /// Starts this thread's copies of k-tile `kt` into the operand tile at `tile`
    /// (zeros outside the operand).
    ///
    /// # Safety
    /// `tile` is a stage of the launch's shared memory that no thread reads until the
    /// copies are waited for and published.
    unsafe fn stage(&self, tile: u32, kt: u32);
}

/// The threads that copy an operand tile: `count` of them, this one `index`-th.
#[derive(Clone, Copy)]
pub struct Stagers {
    pub index: u32,
    pub count: u32,
}

/// This thread's `R` rows of a tile of `R * count / CHUNKS` rows (`index / CHUNKS`,
/// then every `count / CHUNKS`), and its chunk of each.
#[inline(always)]
fn staging_slot<const R: usize>(stagers: Stagers) -> ([u32; R], u32) {
    let step = stagers.count / CHUNKS;
    let rows = core::array::from_fn(|i| stagers.index / CHUNKS + step * i as u32);
    (rows, stagers.index % CHUNKS)
}

/// Which K each k-tile covers. In order (`flat`), k-tile `kt` is K `TC_BK kt ..` of the
/// weights' K (tap-major in NHWC, channel-major in NCHW). With channel tiles (NHWC),
/// k-tile `kt` is tap `kt % taps` of channels `TC_BK (kt / taps) ..`: consecutive
/// k-tiles then read the same channels of neighbouring pixels, which L1 still holds.
#[derive(Clone, Copy)]
pub struct KTiles {
    channel_tiles: bool,
    count: u32,
    /// Channels per group, their divider, and the taps' divider.
    channels: u32,
    div_channels: FastDiv,
    div_taps: FastDiv,
    /// The weights' K.
    pub k: u32,
}

impl KTiles {
    #[inline(always)]
    pub fn new(problem: &ConvProblem, plan: &TensorCorePlan) -> Self {
        let channels = problem.in_per_group();
        Self {
            channel_tiles: plan.channel_tiles == 1,
            count: plan.k_tiles,
            channels,
            div_channels: FastDiv::new(channels),
            div_taps: problem.div_taps,
            k: channels * problem.taps(),
        }
    }

    /// The k-tiles of the GEMM.
    #[inline(always)]
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The weights' K of element `e` of k-tile `kt` (`self.k` or more: past the end).
    #[inline(always)]
    fn k_of(&self, kt: u32, e: u32) -> u32 {
        if self.channel_tiles {
            let (chunk, tap) = self.div_taps.divmod(kt);
            tap * self.channels + chunk * TC_BK + e
        } else {
            kt * TC_BK + e
        }
    }

    /// The tap and channel (NHWC) of element `e` of k-tile `kt`.
    #[inline(always)]
    fn tap_channel(&self, kt: u32, e: u32) -> (u32, u32) {
        if self.channel_tiles {
            let (chunk, tap) = self.div_taps.divmod(kt);
            (tap, chunk * TC_BK + e)
        } else {
            self.div_channels.divmod(kt * TC_BK + e)
        }
    }
}

/// A window origin of no output pixel (past M): every tap of it lies outside the image.
const NO_ORIGIN: (i64, i32, i32) = (0, i32::MIN / 2, i32::MIN / 2);

/// The NHWC window of output pixel `m` of the group's GEMM: the offset of its origin
/// pixel (image and position, the group's first channel), and its coordinates.
#[inline(always)]
pub(super) fn window_origin(p: &ConvProblem, m: u32, group: u32) -> (i64, i32, i32) {
    if m >= p.batch * p.out_pixels() {
        return NO_ORIGIN;
    }
    let (image, pixel) = p.div_out_pixels.divmod(m);
    let (oy, ox) = p.div_out_w.divmod(pixel);
    let y = (oy * p.stride_h) as i32 - p.pad_h as i32;
    let x = (ox * p.stride_w) as i32 - p.pad_w as i32;
    let offset = ((image as i64 * p.height as i64 + y as i64) * p.width as i64 + x as i64)
        * p.in_channels as i64
        + (group * p.in_per_group()) as i64;
    (offset, y, x)
}

/// Where the window origins of a thread's staged rows are kept.
pub trait Origins {
    /// The origin of the thread's `i`-th row, row `row` of the tile.
    fn get(&self, i: usize, row: u32) -> (i64, i32, i32);
}

/// In registers, one per staged row.
pub struct RegisterOrigins<const R: usize>([(i64, i32, i32); R]);

impl<const R: usize> Origins for RegisterOrigins<R> {
    #[inline(always)]
    fn get(&self, i: usize, _: u32) -> (i64, i32, i32) {
        self.0[i]
    }
}

#[cfg(target_feature = "sm_90a")]
/// In a table in shared memory, 16 bytes per row of the tile, which the threads that
/// stage the tile write together ([`SharedOrigins::write`]): for many rows per thread.
pub struct SharedOrigins {
    table: u32,
}

#[cfg(target_feature = "sm_90a")]
impl SharedOrigins {
    /// Fills the table at the shared-window address `table` for the `tile_rows` rows of
    /// the tile from output pixel `m0`, each of `stagers` writing every `count`-th row.
    ///
    /// # Safety
    /// `table` is `16 tile_rows` bytes of the launch's shared memory,
    /// 16-byte aligned, that no thread reads until the stagers pass a barrier.
    #[inline(always)]
    pub unsafe fn write(
        table: u32,
        p: &ConvProblem,
        m0: u32,
        group: u32,
        tile_rows: u32,
        stagers: Stagers,
    ) -> Self {
        let mut row = stagers.index;
        while row < tile_rows {
            let (offset, y, x) = window_origin(p, m0 + row, group);
            let words = [offset as u32, (offset >> 32) as u32, y as u32, x as u32];
            // SAFETY: row `row` of the table, inside it and aligned (the caller's).
            unsafe { store_shared_v4_f32(table + 16 * row, words.map(f32::from_bits)) };
            row += stagers.count;
        }
        Self { table }
    }
}

#[cfg(target_feature = "sm_90a")]
impl Origins for SharedOrigins {
    #[inline(always)]
    fn get(&self, _: usize, row: u32) -> (i64, i32, i32) {
        // SAFETY: a row of the table, written before the barrier that the caller of
        // `write` passed.
        let words = unsafe { load_shared_v4_f32(self.table + 16 * row) }.map(f32::to_bits);
        (
            (words[0] as u64 | (words[1] as u64) << 32) as i64,
            words[2] as i32,
            words[3] as i32,
        )
    }
}

/// x read as NHWC patches, `R` staged rows per thread whose origins `O` keeps: row m
/// of A is output pixel m of the group's GEMM, its K the taps and channels as
/// [`KTiles`] orders them.
pub struct Patches<const R: usize, O> {
    x: *const f32,
    origins: O,
    rows: [u32; R],
    chunk: u32,
    problem: ConvProblem,
    k_tiles: KTiles,
}

impl<const R: usize> Patches<R, RegisterOrigins<R>> {
    /// The patches of the tile from output pixel `m0`, origins in registers.
    #[inline(always)]
    pub fn new(
        x: *const f32,
        problem: &ConvProblem,
        k_tiles: KTiles,
        m0: u32,
        group: u32,
        stagers: Stagers,
    ) -> Self {
        let (rows, chunk) = staging_slot::<R>(stagers);
        let origins = RegisterOrigins(rows.map(|r| window_origin(problem, m0 + r, group)));
        Self {
            x,
            origins,
            rows,
            chunk,
            problem: *problem,
            k_tiles,
        }
    }
}

#[cfg(target_feature = "sm_90a")]
impl<const R: usize> Patches<R, SharedOrigins> {
    /// The patches of a tile whose origins `table` holds.
    #[inline(always)]
    pub fn with_table(
        x: *const f32,
        problem: &ConvProblem,
        k_tiles: KTiles,
        table: SharedOrigins,
        stagers: Stagers,
    ) -> Self {
        let (rows, chunk) = staging_slot::<R>(stagers);
        Self {
            x,
            origins: table,
            rows,
            chunk,
            problem: *problem,
            k_tiles,
        }
    }
}

impl<const R: usize, O: Origins> Patches<R, O> {
    /// For element `e` of k-tile `kt`: its offset from a window's origin, its tap's
    /// displacement, and whether it lies inside K.
    #[inline(always)]
    fn tap(&self, kt: u32, e: u32) -> (i64, i32, i32, bool) {
        let p = &self.problem;
        let (tap, channel) = self.k_tiles.tap_channel(kt, e);
        let (r, s) = p.div_kernel_w.divmod(tap);
        let (dy, dx) = ((r * p.dilation_h) as i32, (s * p.dilation_w) as i32);
        (
            (dy as i64 * p.width as i64 + dx as i64) * p.in_channels as i64 + channel as i64,
            dy,
            dx,
            tap < p.taps(),
        )
    }

    /// Where row `i`'s element at `element` (from [`Self::tap`]) lies in x, and whether
    /// it is to be read (inside K and the image); x itself when it is not.
    #[inline(always)]
    fn source(&self, i: usize, element: (i64, i32, i32, bool)) -> (*const u8, bool) {
        let (offset, dy, dx, in_k) = element;
        let origin = self.origins.get(i, self.rows[i]);
        let inside =
            ((origin.1 + dy) as u32) < self.problem.height && ((origin.2 + dx) as u32) < self.problem.width;
        if in_k && inside {
            (
                self.x.wrapping_offset((origin.0 + offset) as isize) as *const u8,
                true,
            )
        } else {
            (self.x as *const u8, false)
        }
    }
}

/// Patches whose channels per group are a multiple of 4: one 16-byte copy per chunk,
/// through L1 (the next taps read the same pixels).
pub struct VectorPatches<const R: usize, O>(pub Patches<R, O>);

impl<const R: usize, O: Origins> Operand for VectorPatches<R, O> {
    #[inline(always)]
    unsafe fn stage(&self, tile: u32, kt: u32) {
        let p = &self.0;
        let element = p.tap(kt, p.chunk * 4);
        for i in 0..R {
            let (source, valid) = p.source(i, element);
            // SAFETY: a valid chunk lies inside x (the tap is inside the image, the four
            // channels inside the group) and is 16-byte aligned (channels per group and
            // the image's channels are multiples of 4); else nothing is read.
            unsafe {
                async_copy_cached(
                    staged(tile, p.rows[i], p.chunk * 4),
                    source,
                    if valid { 16 } else { 0 },
                )
            };
        }
    }
}

/// Patches of any channel count: one 4-byte copy per element.
pub struct ScalarPatches<const R: usize, O>(pub Patches<R, O>);

impl<const R: usize, O: Origins> Operand for ScalarPatches<R, O> {
    #[inline(always)]
    unsafe fn stage(&self, tile: u32, kt: u32) {
        let p = &self.0;
        for e in 0..4 {
            let element = p.tap(kt, p.chunk * 4 + e);
            for i in 0..R {
                let (source, valid) = p.source(i, element);
                // SAFETY: a valid element lies inside x; else nothing is read.
                unsafe {
                    async_copy::<4>(
                        staged(tile, p.rows[i], p.chunk * 4 + e),
                        source,
                        if valid { 4 } else { 0 },
                    )
                };
            }
        }
    }
}

/// x read as NCHW patches, one element per copy: row m of A is output pixel m of the
/// group's GEMM, column k is channel `k / taps` and tap `k % taps` (the weights' order,
/// k-tiles in order). Each thread copies a run of consecutive K of `R` rows (`index %
/// (tile rows / R)`, then every `tile rows / R`), so that a warp's copies of one K are
/// 32 neighbouring output pixels.
pub struct NchwPatches<const R: usize> {
    x: *const f32,
    /// Per row: its plane offset (image, group's first channel) and window origin.
    origins: [(i64, i32, i32); R],
    rows: [u32; R],
    /// This thread's first K of a k-tile, and how many it copies.
    k_offset: u32,
    run: u32,
    problem: ConvProblem,
    k: u32,
}

impl<const R: usize> NchwPatches<R> {
    /// The rows of a tile of `tile_rows` output pixels from `m0`.
    #[inline(always)]
    pub fn new(
        x: *const f32,
        problem: &ConvProblem,
        m0: u32,
        group: u32,
        tile_rows: u32,
        stagers: Stagers,
    ) -> Self {
        let p = problem;
        let row_threads = tile_rows / R as u32;
        let rows = core::array::from_fn(|i| stagers.index % row_threads + row_threads * i as u32);
        let run = TC_BK * row_threads / stagers.count;
        let origins = rows.map(|row| {
            let m = m0 + row;
            if m >= p.batch * p.out_pixels() {
                return NO_ORIGIN;
            }
            let (image, pixel) = p.div_out_pixels.divmod(m);
            let (oy, ox) = p.div_out_w.divmod(pixel);
            let plane =
                (image as i64 * p.in_channels as i64 + (group * p.in_per_group()) as i64) * p.pixels() as i64;
            (
                plane,
                (oy * p.stride_h) as i32 - p.pad_h as i32,
                (ox * p.stride_w) as i32 - p.pad_w as i32,
            )
        });
        Self {
            x,
            origins,
            rows,
            k_offset: stagers.index / row_threads * run,
            run,
            problem: *p,
            k: p.in_per_group() * p.taps(),
        }
    }
}

impl<const R: usize> Operand for NchwPatches<R> {
    #[inline(always)]
    unsafe fn stage(&self, tile: u32, kt: u32) {
        let p = &self.problem;
        let first = kt * TC_BK + self.k_offset;
        let (mut channel, tap) = p.div_taps.divmod(first);
        let (mut r, mut s) = p.div_kernel_w.divmod(tap);
        for e in 0..self.run {
            let (dy, dx) = ((r * p.dilation_h) as i32, (s * p.dilation_w) as i32);
            for (i, &origin) in self.origins.iter().enumerate() {
                let (iy, ix) = (origin.1 + dy, origin.2 + dx);
                let valid = first + e < self.k && (iy as u32) < p.height && (ix as u32) < p.width;
                let source = if valid {
                    let at = origin.0
                        + channel as i64 * p.pixels() as i64
                        + iy as i64 * p.width as i64
                        + ix as i64;
                    self.x.wrapping_offset(at as isize)
                } else {
                    self.x
                };
                // SAFETY: a valid element lies inside x (a channel of the group, a pixel
                // of the image); else nothing is read.
                unsafe {
                    async_copy::<4>(
                        staged(tile, self.rows[i], self.k_offset + e),
                        source as *const u8,
                        if valid { 4 } else { 0 },
                    )
                };
            }
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

/// w as B^T, `R` staged rows per thread: row n is output channel `n` of the group, its
/// weights contiguous along K (`[kh][kw][in / groups]` in NHWC, `[in / groups][kh][kw]`
/// in NCHW).
pub struct Filters<const R: usize> {
    w: *const f32,
    rows: [u32; R],
    chunk: u32,
    /// Offset of the tile's first row, and the rows of the group from it.
    base: u64,
    n: u32,
    k_tiles: KTiles,
}

impl<const R: usize> Filters<R> {
    #[inline(always)]
    pub fn new(
        w: *const f32,
        problem: &ConvProblem,
        k_tiles: KTiles,
        n0: u32,
        group: u32,
        stagers: Stagers,
    ) -> Self {
        let (rows, chunk) = staging_slot::<R>(stagers);
        let n = problem.out_per_group();
        Self {
            w,
            rows,
            chunk,
            base: (group * n + n0) as u64 * k_tiles.k as u64,
            n: n - n0.min(n),
            k_tiles,
        }
    }

    /// Copies `BYTES` of row `row` from element `e` of k-tile `kt` (whole copies only).
    ///
    /// # Safety
    /// As [`Operand::stage`].
    #[inline(always)]
    unsafe fn copy<const BYTES: u32>(&self, tile: u32, row: u32, kt: u32, e: u32) {
        let k = self.k_tiles.k_of(kt, e);
        let valid = row < self.n && k < self.k_tiles.k;
        let source = if valid {
            self.w
                .wrapping_add((self.base + row as u64 * self.k_tiles.k as u64 + k as u64) as usize)
        } else {
            self.w
        };
        // SAFETY: a valid copy lies inside w (row and k inside the group's filters) and
        // is aligned to its size (K is a multiple of 4 for 16-byte copies); else nothing
        // is read.
        unsafe {
            async_copy::<BYTES>(
                staged(tile, row, e),
                source as *const u8,
                if valid { BYTES } else { 0 },
            )
        };
    }
}

/// Filters whose K is a multiple of 4: 16-byte copies.
pub struct VectorFilters<const R: usize>(pub Filters<R>);

impl<const R: usize> Operand for VectorFilters<R> {
    #[inline(always)]
    unsafe fn stage(&self, tile: u32, kt: u32) {
        let f = &self.0;
        for &row in &f.rows {
            // SAFETY: forwarded.
            unsafe { f.copy::<16>(tile, row, kt, f.chunk * 4) };
        }
    }
}

/// Filters of any K: 4-byte copies.
pub struct ScalarFilters<const R: usize>(pub Filters<R>);

impl<const R: usize> Operand for ScalarFilters<R> {
    #[inline(always)]
    unsafe fn stage(&self, tile: u32, kt: u32) {
        let f = &self.0;
        for &row in &f.rows {
            for e in 0..4 {
                // SAFETY: forwarded.
                unsafe { f.copy::<4>(tile, row, kt, f.chunk * 4 + e) };
            }
        }
    }
}
