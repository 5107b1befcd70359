//! The pieces of the Winograd F(2x2, 3x3) kernels: the transforms (all coefficients
//! 0, 1, -1 or 1/2), the operands that stage transformed tiles in shared memory, and
//! [`products`], the one mainloop of the forward, input-gradient and weight-gradient
//! kernels: 16 small GEMMs, one per tile position.

use super::{
    WINOGRAD_CHUNK, WINOGRAD_OUT, WINOGRAD_PART, WINOGRAD_PITCH, WINOGRAD_ROWS, WINOGRAD_THREADS,
    WinogradProblem,
};
use crate::conv::outer_product::{Accumulators, accumulate_outer_product};
use crate::device::{
    async_copy, async_copy_commit, async_copy_wait, shared_base, store_shared_f32, sync_threads, thread_idx_x,
};

/// `G t` for three taps: G = [[1, 0, 0], [1/2, 1/2, 1/2], [1/2, -1/2, 1/2], [0, 0, 1]].
#[inline(always)]
pub fn filter_rows(t: [f64; 3]) -> [f64; 4] {
    [t[0], 0.5 * (t[0] + t[1] + t[2]), 0.5 * (t[0] - t[1] + t[2]), t[2]]
}

/// `G^T m` for four products (the weight gradient's way back to three taps).
#[inline(always)]
pub fn filter_rows_back(m: [f64; 4]) -> [f64; 3] {
    [
        m[0] + 0.5 * (m[1] + m[2]),
        0.5 * (m[1] - m[2]),
        0.5 * (m[1] + m[2]) + m[3],
    ]
}

/// `B^T d` for four inputs: B^T = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0,
/// -1]].
#[inline(always)]
pub fn input_rows(d: [f32; 4]) -> [f32; 4] {
    [d[0] - d[2], d[1] + d[2], d[2] - d[1], d[1] - d[3]]
}

/// `A^T m` for four products: A^T = [[1, 1, 1, 0], [0, 1, -1, -1]].
#[inline(always)]
pub fn output_rows(m: [f32; 4]) -> [f32; 2] {
    [m[0] + m[1] + m[2], m[1] - m[2] - m[3]]
}

/// `A g` for two output gradients (the adjoint of [`output_rows`]).
#[inline(always)]
pub fn gradient_rows(g: [f32; 2]) -> [f32; 4] {
    [g[0], g[0] + g[1], g[0] - g[1], -g[1]]
}

/// `B^T d B` of a 4x4 input tile, by tile position `xi = 4 a + b`.
#[inline(always)]
pub fn transform_input(d: &[[f32; 4]; 4]) -> [f32; 16] {
    let columns = [0, 1, 2, 3].map(|j| input_rows([d[0][j], d[1][j], d[2][j], d[3][j]]));
    let mut v = [0.0f32; 16];
    for a in 0..4 {
        let row = input_rows([columns[0][a], columns[1][a], columns[2][a], columns[3][a]]);
        v[4 * a..4 * a + 4].copy_from_slice(&row);
    }
    v
}

/// `A g A^T` of a 2x2 output-gradient tile, by tile position.
#[inline(always)]
pub fn transform_gradient(g: &[[f32; 2]; 2]) -> [f32; 16] {
    let columns = [0, 1].map(|j| gradient_rows([g[0][j], g[1][j]]));
    let mut v = [0.0f32; 16];
    for a in 0..4 {
        v[4 * a..4 * a + 4].copy_from_slice(&gradient_rows([columns[0][a], columns[1][a]]));
    }
    v
}

/// The shared-memory address of element (xi, k, row) of an operand stage at `part`.
#[inline(always)]
pub fn staged(part: u32, xi: u32, k: u32, row: u32) -> u32 {
    part + ((xi * WINOGRAD_CHUNK + k) * WINOGRAD_PITCH + row) * 4
}

/// One operand of [`products`]: what a thread loads of each chunk, and how it writes
/// it, transformed, into a stage `[16][WINOGRAD_CHUNK][WINOGRAD_PITCH]`.
pub trait Producer {
    type Fetched;
    /// This thread's share of `chunk` (zeros past the operand's end), bound for stage
    /// `part`: an operand that needs no transform may start copying it there.
    ///
    /// # Safety
    /// `part` is a stage of the launch's shared memory that no thread accesses from now
    /// until the [`Self::stash`] of what this returns, and no thread reads before the
    /// barrier after it.
    unsafe fn fetch(&self, chunk: u32, part: u32) -> Self::Fetched;
    /// # Safety
    /// `part` is the stage of the fetch, which no thread reads before the next barrier.
    unsafe fn stash(&self, fetched: &Self::Fetched, part: u32);
}

/// This thread's place in the products: tile position `xi`, rows `ti * 8..`, columns
/// `ki * 8..` of the block's `WINOGRAD_ROWS x WINOGRAD_OUT` tile.
#[inline(always)]
pub fn product_position() -> (u32, u32, u32) {
    let t = thread_idx_x();
    (t / 16, t % 4, t % 16 / 4)
}

/// For this thread's tile position: `sum over k of a[k][row] * b[k][column]` for its 8
/// x 8 (row, column) pairs, over `chunks` chunks from `first`, through two stages.
///
/// # Safety
/// The launch has `WINOGRAD_THREADS` threads and `WINOGRAD_SHARED_BYTES`; the whole
/// block calls it with the same arguments.
#[inline(always)]
pub unsafe fn products<A: Producer, B: Producer>(a: &A, b: &B, first: u32, chunks: u32) -> Accumulators {
    let stage = |s: u32| shared_base() + s * 2 * WINOGRAD_PART;
    let (xi, ti, ki) = product_position();
    let mut acc: Accumulators = [[0.0; 8]; 8];
    // SAFETY: stage 0 is unread until the barrier, which the whole block reaches.
    unsafe {
        a.stash(&a.fetch(first, stage(0)), stage(0));
        let b_part = stage(0) + WINOGRAD_PART;
        b.stash(&b.fetch(first, b_part), b_part);
        sync_threads();
    }
    for chunk in 0..chunks {
        let s = chunk % 2;
        // SAFETY: the other stage was last read before the previous barrier, and is
        // written only by the stashes below.
        let (next_a, next_b) = unsafe {
            (
                a.fetch(first + chunk + 1, stage(1 - s)),
                b.fetch(first + chunk + 1, stage(1 - s) + WINOGRAD_PART),
            )
        };
        for k in 0..WINOGRAD_CHUNK {
            let (a_at, b_at) = (
                staged(stage(s), xi, k, ti * 8),
                staged(stage(s) + WINOGRAD_PART, xi, k, ki * 8),
            );
            // SAFETY: 16-byte aligned (the pitch is a multiple of 4 floats), inside the
            // stage the barrier published; the second vectors 4 floats on.
            unsafe { accumulate_outer_product(&mut acc, a_at, 16, b_at, 16) };
        }
        // SAFETY: the other stage was last read before the previous barrier; the
        // whole block reaches this one.
        unsafe {
            a.stash(&next_a, stage(1 - s));
            b.stash(&next_b, stage(1 - s) + WINOGRAD_PART);
            sync_threads();
        }
    }
    acc
}

/// A 4x4 window of an image with its bounds.
#[derive(Clone, Copy)]
pub struct Window {
    pub origin: i64,
    /// Bit `4 i + j`: whether row i, column j of the window lie inside the image.
    pub inside: u32,
}

impl Window {
    #[inline(always)]
    pub fn new(p: &WinogradProblem, plane: i64, y0: i32, x0: i32) -> Self {
        let mut inside = 0;
        for i in 0..4 {
            for j in 0..4 {
                let cell = ((y0 + i) as u32) < p.height && ((x0 + j) as u32) < p.width;
                inside |= (cell as u32) << (4 * i + j);
            }
        }
        Self {
            origin: plane * p.height as i64 * p.width as i64 + y0 as i64 * p.width as i64 + x0 as i64,
            inside,
        }
    }

    /// The 4x4 values, zero outside the image.
    ///
    /// # Safety
    /// `input` holds the image the window was made for.
    #[inline(always)]
    pub unsafe fn load(&self, input: *const f32, width: u32) -> [[f32; 4]; 4] {
        let mut d = [[0.0f32; 4]; 4];
        for (i, row) in d.iter_mut().enumerate() {
            for (j, value) in row.iter_mut().enumerate() {
                if self.inside & (1 << (4 * i + j)) != 0 {
                    let at = self.origin + i as i64 * width as i64 + j as i64;
                    // SAFETY: (i, j) is inside the image.
                    *value = unsafe { *input.offset(at as isize) };
                }
            }
        }
        d
    }
}

/// The data passes' first operand: input tiles, one per (tile `slot = t % 32` of the
/// block's run, channel `t / 32` of each chunk). What the mainloop keeps of it is
/// small (a window, its step per chunk, a count): more would spill in its loop.
pub struct InputTiles {
    input: *const f32,
    /// The window in this thread's channel of chunk 0.
    window: Window,
    /// Floats from one chunk's channel to the next's.
    chunk_step: i64,
    width: u32,
    /// Chunks in which this thread's channel lies in the group (none for a slot past
    /// the last tile).
    chunks: u32,
}

impl InputTiles {
    /// This thread's tiles: of output tile `tile` (zeros past the last), channels
    /// `channel + WINOGRAD_CHUNK n` of group `group`.
    #[inline(always)]
    pub fn new(input: *const f32, p: &WinogradProblem, group: u32, tile: u32, channel: u32) -> Self {
        let cg = p.in_per_group();
        let place = p.tile_place(tile);
        let (image, tile_row, tile_column) = place.unwrap_or((0, 0, 0));
        let plane = image as i64 * p.channels as i64 + (group * cg + channel) as i64;
        let y0 = (2 * tile_row) as i32 - p.pad_h as i32;
        let x0 = (2 * tile_column) as i32 - p.pad_w as i32;
        let chunks = if place.is_some() && channel < cg {
            (cg - channel).div_ceil(WINOGRAD_CHUNK)
        } else {
            0
        };
        Self {
            input,
            window: Window::new(p, plane, y0, x0),
            chunk_step: WINOGRAD_CHUNK as i64 * p.height as i64 * p.width as i64,
            width: p.width,
            chunks,
        }
    }
}

impl Producer for InputTiles {
    type Fetched = [[f32; 4]; 4];
    #[inline(always)]
    unsafe fn fetch(&self, chunk: u32, _part: u32) -> Self::Fetched {
        if chunk >= self.chunks {
            return [[0.0; 4]; 4];
        }
        let window = Window {
            origin: self.window.origin + chunk as i64 * self.chunk_step,
            ..self.window
        };
        // SAFETY: the window is of a valid channel of the input.
        unsafe { window.load(self.input, self.width) }
    }
    #[inline(always)]
    unsafe fn stash(&self, d: &Self::Fetched, part: u32) {
        let t = thread_idx_x();
        let (slot, channel) = (t % WINOGRAD_ROWS, t / WINOGRAD_ROWS);
        for (xi, value) in transform_input(d).into_iter().enumerate() {
            // SAFETY: inside the stage; one writer per element.
            unsafe { store_shared_f32(staged(part, xi as u32, channel, slot), value) };
        }
    }
}

/// The data passes' second operand: the transformed weights, four 16-byte pieces of
/// each chunk's `[16][WINOGRAD_CHUNK][WINOGRAD_OUT]` slice per thread.
pub struct FilterSlices {
    pub u: *const f32,
    pub problem: WinogradProblem,
    pub k0: u32,
}

impl FilterSlices {
    /// (xi, channel in chunk, 4-float piece) of piece `i` of this thread.
    #[inline(always)]
    fn piece(i: u32) -> (u32, u32, u32) {
        let q = thread_idx_x() + WINOGRAD_THREADS * i;
        let (row, quad) = (q / (WINOGRAD_OUT / 4), q % (WINOGRAD_OUT / 4));
        (row / WINOGRAD_CHUNK, row % WINOGRAD_CHUNK, quad)
    }
}

impl Producer for FilterSlices {
    /// Nothing: the slices need no transform, so they are copied straight into the
    /// stage (`cp.async`), holding no registers while the mainloop runs.
    type Fetched = ();
    #[inline(always)]
    unsafe fn fetch(&self, chunk: u32, part: u32) {
        let p = &self.problem;
        if chunk >= p.channels_padded / WINOGRAD_CHUNK {
            return;
        }
        for i in 0..4 {
            let (xi, c, quad) = Self::piece(i);
            let at =
                (xi * p.channels_padded + chunk * WINOGRAD_CHUNK + c) * p.out_padded + self.k0 + quad * 4;
            // SAFETY: inside this group's padded U, 16-byte aligned (out_padded and k0
            // are multiples of 32), U not written during the launch; into the stage,
            // 16-byte aligned, which no thread touches until the stash's wait.
            unsafe {
                async_copy::<16>(
                    staged(part, xi, c, quad * 4),
                    self.u.add(at as usize) as *const u8,
                    16,
                )
            };
        }
    }
    #[inline(always)]
    unsafe fn stash(&self, _: &(), _part: u32) {
        // This thread's copies landed; the barrier after publishes them.
        async_copy_commit();
        async_copy_wait::<0>();
    }
}

/// The weight gradient's operands: per (tile `t % 8` of each chunk, channel `t / 8` of
/// the block's 32), the transformed x tile (`GRADIENT == false`, channels of x) or dy
/// tile (`GRADIENT == true`, channels of dy).
pub struct ChunkTiles<const GRADIENT: bool> {
    pub tensor: *const f32,
    pub problem: WinogradProblem,
    /// The channel's plane in image 0, or `None` past the group's channels.
    pub plane: Option<u64>,
    pub end: u32,
}

impl<const GRADIENT: bool> ChunkTiles<GRADIENT> {
    #[inline(always)]
    fn lanes() -> (u32, u32) {
        let t = thread_idx_x();
        (t % WINOGRAD_CHUNK, t / WINOGRAD_CHUNK)
    }

    /// The tile's place (image plane offset, tile row, tile column), or `None`.
    #[inline(always)]
    fn place(&self, chunk: u32) -> Option<(u64, u32, u32)> {
        let plane = self.plane?;
        let tile = chunk * WINOGRAD_CHUNK + Self::lanes().0;
        if chunk >= self.end {
            return None;
        }
        let (image, row, column) = self.problem.tile_place(tile)?;
        let channels = if GRADIENT {
            self.problem.out_channels
        } else {
            self.problem.channels
        };
        Some((image as u64 * channels as u64 + plane, row, column))
    }
}

impl Producer for ChunkTiles<false> {
    type Fetched = [[f32; 4]; 4];
    #[inline(always)]
    unsafe fn fetch(&self, chunk: u32, _part: u32) -> Self::Fetched {
        let p = &self.problem;
        let Some((plane, row, column)) = self.place(chunk) else {
            return [[0.0; 4]; 4];
        };
        let y0 = (2 * row) as i32 - p.pad_h as i32;
        let x0 = (2 * column) as i32 - p.pad_w as i32;
        // SAFETY: the window is of a valid channel and image of x.
        unsafe { Window::new(p, plane as i64, y0, x0).load(self.tensor, p.width) }
    }
    #[inline(always)]
    unsafe fn stash(&self, d: &Self::Fetched, part: u32) {
        let (tile, channel) = Self::lanes();
        for (xi, value) in transform_input(d).into_iter().enumerate() {
            // SAFETY: inside the stage; one writer per element.
            unsafe { store_shared_f32(staged(part, xi as u32, tile, channel), value) };
        }
    }
}

impl Producer for ChunkTiles<true> {
    type Fetched = [[f32; 2]; 2];
    #[inline(always)]
    unsafe fn fetch(&self, chunk: u32, _part: u32) -> Self::Fetched {
        let p = &self.problem;
        let mut g = [[0.0f32; 2]; 2];
        let Some((plane, row, column)) = self.place(chunk) else {
            return g;
        };
        let origin = plane * p.out_h as u64 * p.out_w as u64;
        for (i, values) in g.iter_mut().enumerate() {
            for (j, value) in values.iter_mut().enumerate() {
                let (y, x) = (2 * row + i as u32, 2 * column + j as u32);
                if y < p.out_h && x < p.out_w {
                    let at = origin + y as u64 * p.out_w as u64 + x as u64;
                    // SAFETY: (y, x) is inside a valid plane of dy.
                    *value = unsafe { *self.tensor.add(at as usize) };
                }
            }
        }
        g
    }
    #[inline(always)]
    unsafe fn stash(&self, g: &Self::Fetched, part: u32) {
        let (tile, channel) = Self::lanes();
        for (xi, value) in transform_gradient(g).into_iter().enumerate() {
            // SAFETY: inside the stage; one writer per element.
            unsafe { store_shared_f32(staged(part, xi as u32, tile, channel), value) };
        }
    }
}
