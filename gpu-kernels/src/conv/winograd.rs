//! Winograd F(2x2, 3x3) kernels (see the module docs): the weight transform, the fused
//! pass of the forward and input-gradient convolutions, and the weight gradient with
//! its finishing pass. One mainloop, [`products`], serves both main kernels: it
//! stages two transformed operands per chunk and multiplies them as 16 GEMMs.

use super::*;
use crate::device::{
    block_idx_x, block_idx_y, fma_f32, load_global_nc_v4, load_shared_f32, load_shared_v4_f32, shared_base,
    store_global_v4, store_shared_f32, store_shared_v4_f32, sync_threads, thread_idx_x,
};

/// `G t` for three taps: G = [[1, 0, 0], [1/2, 1/2, 1/2], [1/2, -1/2, 1/2], [0, 0, 1]].
#[inline(always)]
fn filter_rows(t: [f64; 3]) -> [f64; 4] {
    [t[0], 0.5 * (t[0] + t[1] + t[2]), 0.5 * (t[0] - t[1] + t[2]), t[2]]
}

/// `G^T m` for four products (the weight gradient's way back to three taps).
#[inline(always)]
fn filter_rows_back(m: [f64; 4]) -> [f64; 3] {
    [
        m[0] + 0.5 * (m[1] + m[2]),
        0.5 * (m[1] - m[2]),
        0.5 * (m[1] + m[2]) + m[3],
    ]
}

/// `B^T d` for four inputs: B^T = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0,
/// -1]].
#[inline(always)]
fn input_rows(d: [f32; 4]) -> [f32; 4] {
    [d[0] - d[2], d[1] + d[2], d[2] - d[1], d[1] - d[3]]
}

/// `A^T m` for four products: A^T = [[1, 1, 1, 0], [0, 1, -1, -1]].
#[inline(always)]
fn output_rows(m: [f32; 4]) -> [f32; 2] {
    [m[0] + m[1] + m[2], m[1] - m[2] - m[3]]
}

/// `A g` for two output gradients (the adjoint of [`output_rows`]).
#[inline(always)]
fn gradient_rows(g: [f32; 2]) -> [f32; 4] {
    [g[0], g[0] + g[1], g[0] - g[1], -g[1]]
}

/// `B^T d B` of a 4x4 input tile, by tile position `xi = 4 a + b`.
#[inline(always)]
fn transform_input(d: &[[f32; 4]; 4]) -> [f32; 16] {
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
fn transform_gradient(g: &[[f32; 2]; 2]) -> [f32; 16] {
    let columns = [0, 1].map(|j| gradient_rows([g[0][j], g[1][j]]));
    let mut v = [0.0f32; 16];
    for a in 0..4 {
        v[4 * a..4 * a + 4].copy_from_slice(&gradient_rows([columns[0][a], columns[1][a]]));
    }
    v
}

/// The shared-memory address of element (xi, k, row) of an operand stage at `part`.
#[inline(always)]
fn staged(part: u32, xi: u32, k: u32, row: u32) -> u32 {
    part + ((xi * WINOGRAD_CHUNK + k) * WINOGRAD_PITCH + row) * 4
}

/// One operand of [`products`]: what a thread loads of each chunk, and how it writes
/// it, transformed, into a stage `[16][WINOGRAD_CHUNK][WINOGRAD_PITCH]`.
trait Producer {
    type Fetched;
    /// This thread's share of `chunk` (zeros past the operand's end).
    fn fetch(&self, chunk: u32) -> Self::Fetched;
    /// # Safety
    /// `part` is a stage of the launch's shared memory that no thread reads before the
    /// next barrier.
    unsafe fn stash(&self, fetched: &Self::Fetched, part: u32);
}

/// This thread's place in the products: tile position `xi`, rows `ti * 8..`, columns
/// `ki * 8..` of the block's `WINOGRAD_ROWS x WINOGRAD_OUT` tile.
#[inline(always)]
fn product_position() -> (u32, u32, u32) {
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
unsafe fn products<A: Producer, B: Producer>(a: &A, b: &B, first: u32, chunks: u32) -> [[f32; 8]; 8] {
    let stage = |s: u32| shared_base() + s * 2 * WINOGRAD_PART;
    let (xi, ti, ki) = product_position();
    let mut acc = [[0.0f32; 8]; 8];
    // SAFETY: stage 0 is unread until the barrier, which the whole block reaches.
    unsafe {
        a.stash(&a.fetch(first), stage(0));
        b.stash(&b.fetch(first), stage(0) + WINOGRAD_PART);
        sync_threads();
    }
    for chunk in 0..chunks {
        let s = chunk % 2;
        let (next_a, next_b) = (a.fetch(first + chunk + 1), b.fetch(first + chunk + 1));
        for k in 0..WINOGRAD_CHUNK {
            let (a_at, b_at) = (
                staged(stage(s), xi, k, ti * 8),
                staged(stage(s) + WINOGRAD_PART, xi, k, ki * 8),
            );
            // SAFETY: 16-byte aligned (the pitch is a multiple of 4 floats), inside the
            // stage the barrier published.
            let (a_lo, a_hi, b_lo, b_hi) = unsafe {
                (
                    load_shared_v4_f32(a_at),
                    load_shared_v4_f32(a_at + 16),
                    load_shared_v4_f32(b_at),
                    load_shared_v4_f32(b_at + 16),
                )
            };
            let u = [
                a_lo[0], a_lo[1], a_lo[2], a_lo[3], a_hi[0], a_hi[1], a_hi[2], a_hi[3],
            ];
            let v = [
                b_lo[0], b_lo[1], b_lo[2], b_lo[3], b_hi[0], b_hi[1], b_hi[2], b_hi[3],
            ];
            for i in 0..8 {
                for j in 0..8 {
                    acc[i][j] = fma_f32(u[i], v[j], acc[i][j]);
                }
            }
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

/// A 4x4 window of an image with its bounds: rows and columns inside it.
struct Window {
    origin: i64,
    row_inside: [bool; 4],
    col_inside: [bool; 4],
}

impl Window {
    #[inline(always)]
    fn new(p: &WinogradProblem, plane: i64, y0: i32, x0: i32) -> Self {
        Self {
            origin: plane * p.height as i64 * p.width as i64 + y0 as i64 * p.width as i64 + x0 as i64,
            row_inside: core::array::from_fn(|i| ((y0 + i as i32) as u32) < p.height),
            col_inside: core::array::from_fn(|j| ((x0 + j as i32) as u32) < p.width),
        }
    }

    /// The 4x4 values, zero outside the image.
    ///
    /// # Safety
    /// `input` holds the image the window was made for.
    #[inline(always)]
    unsafe fn load(&self, input: *const f32, width: u32) -> [[f32; 4]; 4] {
        let mut d = [[0.0f32; 4]; 4];
        for (i, row) in d.iter_mut().enumerate() {
            for (j, value) in row.iter_mut().enumerate() {
                if self.row_inside[i] && self.col_inside[j] {
                    let at = self.origin + i as i64 * width as i64 + j as i64;
                    // SAFETY: (i, j) is inside the image.
                    *value = unsafe { *input.offset(at as isize) };
                }
            }
        }
        d
    }
}

/// The data passes' first operand: input tiles along a tile row, one per (tile `t %
/// 32`, channel `t / 32` of each chunk).
struct RowTiles {
    input: *const f32,
    problem: WinogradProblem,
    first_plane: i64,
    y0: i32,
    x0: i32,
    channel: u32,
    tile: u32,
}

impl Producer for RowTiles {
    type Fetched = [[f32; 4]; 4];
    #[inline(always)]
    fn fetch(&self, chunk: u32) -> Self::Fetched {
        let channel = chunk * WINOGRAD_CHUNK + self.channel;
        if channel >= self.problem.in_per_group() {
            return [[0.0; 4]; 4];
        }
        let window = Window::new(&self.problem, self.first_plane + channel as i64, self.y0, self.x0);
        // SAFETY: the window is of a valid channel of the input.
        unsafe { window.load(self.input, self.problem.width) }
    }
    #[inline(always)]
    unsafe fn stash(&self, d: &Self::Fetched, part: u32) {
        for (xi, value) in transform_input(d).into_iter().enumerate() {
            // SAFETY: inside the stage; one writer per element.
            unsafe { store_shared_f32(staged(part, xi as u32, self.channel, self.tile), value) };
        }
    }
}

/// The data passes' second operand: the transformed weights, four 16-byte pieces of
/// each chunk's `[16][WINOGRAD_CHUNK][WINOGRAD_OUT]` slice per thread.
struct FilterSlices {
    u: *const f32,
    problem: WinogradProblem,
    k0: u32,
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
    type Fetched = [[f32; 4]; 4];
    #[inline(always)]
    fn fetch(&self, chunk: u32) -> Self::Fetched {
        let p = &self.problem;
        let mut pieces = [[0.0f32; 4]; 4];
        if chunk < p.channels_padded / WINOGRAD_CHUNK {
            for (i, piece) in pieces.iter_mut().enumerate() {
                let (xi, c, quad) = Self::piece(i as u32);
                let at =
                    (xi * p.channels_padded + chunk * WINOGRAD_CHUNK + c) * p.out_padded + self.k0 + quad * 4;
                // SAFETY: inside this group's padded U, 16-byte aligned (out_padded and k0
                // are multiples of 32); U is not written during the launch.
                *piece =
                    unsafe { load_global_nc_v4(self.u.add(at as usize) as *const u32) }.map(f32::from_bits);
            }
        }
        pieces
    }
    #[inline(always)]
    unsafe fn stash(&self, pieces: &Self::Fetched, part: u32) {
        for (i, piece) in pieces.iter().enumerate() {
            let (xi, c, quad) = Self::piece(i as u32);
            // SAFETY: inside the stage, 16-byte aligned; one writer per element.
            unsafe { store_shared_v4_f32(staged(part, xi, c, quad * 4), *piece) };
        }
    }
}

/// `U[group][xi][c][k] = (G g G^T)[xi]` for every (group, c, k) of the padded layout,
/// zero in the padding; g is `w[k][c]` (forward) or `w[c][k]` rotated by 180 degrees
/// (input gradient, `flip`). Computed in FP64 and rounded once.
///
/// # Safety
/// `w` holds the convolution's weights, `u` `problem.filter_len()` floats; the grid
/// covers `filter_len / 16` threads of `FILTER_THREADS`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn conv_winograd_filter_f32(
    w: *const f32,
    u: *mut f32,
    problem: WinogradProblem,
) {
    let p = &problem;
    let i = block_idx_x() as u64 * FILTER_THREADS as u64 + thread_idx_x() as u64;
    let (cp, op) = (p.channels_padded as u64, p.out_padded as u64);
    if i >= p.groups as u64 * cp * op {
        return;
    }
    let (group, c, k) = (i / (cp * op), i / op % cp, i % op);
    let (cg, kg) = (p.in_per_group() as u64, p.out_per_group() as u64);
    let mut taps = [[0.0f64; 3]; 3];
    if c < cg && k < kg {
        for (r, row) in taps.iter_mut().enumerate() {
            for (s, tap) in row.iter_mut().enumerate() {
                let at = if p.flip == 0 {
                    ((group * kg + k) * cg + c) * 9 + (r * 3 + s) as u64
                } else {
                    ((group * cg + c) * kg + k) * 9 + ((2 - r) * 3 + (2 - s)) as u64
                };
                // SAFETY: (c, k) lie inside the group, so `at` is inside w.
                *tap = unsafe { *w.add(at as usize) } as f64;
            }
        }
    }
    let columns = [0, 1, 2].map(|s| filter_rows([taps[0][s], taps[1][s], taps[2][s]]));
    for a in 0..4 {
        let row = filter_rows([columns[0][a], columns[1][a], columns[2][a]]);
        for (b, value) in row.into_iter().enumerate() {
            let xi = (a * 4 + b) as u64;
            // SAFETY: inside the padded layout of `filter_len` floats.
            unsafe { *u.add((((group * 16 + xi) * cp + c) * op + k) as usize) = value as f32 };
        }
    }
}

/// The output (plus bias) of a 3x3, stride-1 convolution whose transformed weights are
/// `u`, for one block of `WINOGRAD_ROWS` output tiles along a row by `WINOGRAD_OUT`
/// output channels, over all input channels of the group.
///
/// # Safety
/// `input` and `output` hold the problem's tensors, `u` the transformed weights of
/// [`conv_winograd_filter_f32`] (16-byte aligned), `bias` null or `out_channels`
/// floats; the grid is `problem.blocks()` by `groups` blocks of `WINOGRAD_THREADS`,
/// with `WINOGRAD_SHARED_BYTES`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn conv_winograd_f32(
    input: *const f32,
    u: *const f32,
    bias: *const f32,
    output: *mut f32,
    problem: WinogradProblem,
) {
    let p = &problem;
    let t = thread_idx_x();
    let group = block_idx_y();
    let (_, tiles_h) = p.tiles();
    let (rest, out_block) = (block_idx_x() / p.out_blocks(), block_idx_x() % p.out_blocks());
    let (rest, segment) = (rest / p.segments(), rest % p.segments());
    let (image, tile_row) = (rest / tiles_h, rest % tiles_h);
    let (cg, kg) = (p.in_per_group(), p.out_per_group());
    let k0 = out_block * WINOGRAD_OUT;

    let (tile, channel) = (t % WINOGRAD_ROWS, t / WINOGRAD_ROWS);
    let tiles = RowTiles {
        input,
        problem,
        first_plane: image as i64 * p.channels as i64 + (group * cg) as i64,
        y0: (2 * tile_row) as i32 - p.pad_h as i32,
        x0: (2 * (segment * WINOGRAD_ROWS + tile)) as i32 - p.pad_w as i32,
        channel,
        tile,
    };
    let filter = FilterSlices {
        u: u.wrapping_add(group as usize * 16 * p.channels_padded as usize * p.out_padded as usize),
        problem,
        k0,
    };
    // SAFETY: forwarded from the launch's contract.
    let acc = unsafe { products(&tiles, &filter, 0, p.channels_padded / WINOGRAD_CHUNK) };

    // Products to shared memory as `[16][WINOGRAD_OUT][WINOGRAD_ROWS]` (every stage was
    // last read before the final barrier of the mainloop).
    let (xi, ti, ki) = product_position();
    let product_at =
        |xi: u32, k: u32, tile: u32| shared_base() + ((xi * WINOGRAD_OUT + k) * WINOGRAD_ROWS + tile) * 4;
    for j in 0..8 {
        let at = product_at(xi, ki * 8 + j as u32, ti * 8);
        // SAFETY: 16-byte aligned, inside the shared memory; one writer each.
        unsafe {
            store_shared_v4_f32(at, [acc[0][j], acc[1][j], acc[2][j], acc[3][j]]);
            store_shared_v4_f32(at + 16, [acc[4][j], acc[5][j], acc[6][j], acc[7][j]]);
        }
    }
    // SAFETY: reached by the whole block.
    unsafe { sync_threads() };

    // The inverse transform, one (tile, out channel) per thread and step.
    for step in 0..WINOGRAD_ROWS * WINOGRAD_OUT / WINOGRAD_THREADS {
        let pair = t + WINOGRAD_THREADS * step;
        let (tile, k) = (pair % WINOGRAD_ROWS, pair / WINOGRAD_ROWS);
        let (oy, ox) = (2 * tile_row, 2 * (segment * WINOGRAD_ROWS + tile));
        if k0 + k >= kg || ox >= p.out_w {
            continue;
        }
        // SAFETY: written before the barrier, inside the shared memory.
        let m: [f32; 16] =
            core::array::from_fn(|xi| unsafe { load_shared_f32(product_at(xi as u32, k, tile)) });
        let columns = [0, 1, 2, 3].map(|b| output_rows([m[b], m[4 + b], m[8 + b], m[12 + b]]));
        let channel = group * kg + k0 + k;
        // SAFETY: null or out_channels floats.
        let offset = if bias.is_null() {
            0.0
        } else {
            unsafe { *bias.add(channel as usize) }
        };
        let plane =
            (image as u64 * p.out_channels as u64 + channel as u64) * (p.out_h as u64 * p.out_w as u64);
        for i in 0..2 {
            let y = output_rows([columns[0][i], columns[1][i], columns[2][i], columns[3][i]]);
            for (j, value) in y.into_iter().enumerate() {
                let (row, col) = (oy + i as u32, ox + j as u32);
                if row < p.out_h && col < p.out_w {
                    let at = plane + row as u64 * p.out_w as u64 + col as u64;
                    // SAFETY: (row, col) is inside the output plane.
                    unsafe { *output.add(at as usize) = value + offset };
                }
            }
        }
    }
}

/// The place of chunk `chunk` of the weight gradient: (image, tile row, first tile).
#[inline(always)]
fn chunk_place(chunk: u32, along: FastDiv, rows: FastDiv) -> (u32, u32, u32) {
    let (rest, column_chunk) = along.divmod(chunk);
    let (image, row) = rows.divmod(rest);
    (image, row, column_chunk * WINOGRAD_CHUNK)
}

/// The weight gradient's operands: per (tile `t % 8` of each chunk, channel `t / 8` of
/// the block's 32), the transformed x tile (`GRADIENT == false`, channels of x) or dy
/// tile (`GRADIENT == true`, channels of dy).
struct ChunkTiles<const GRADIENT: bool> {
    tensor: *const f32,
    problem: WinogradProblem,
    /// The channel's plane in image 0, or `None` past the group's channels.
    plane: Option<u64>,
    end: u32,
    along: FastDiv,
    rows: FastDiv,
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
        if chunk >= self.end {
            return None;
        }
        let (image, row, first) = chunk_place(chunk, self.along, self.rows);
        let column = first + Self::lanes().0;
        let channels = if GRADIENT {
            self.problem.out_channels
        } else {
            self.problem.channels
        };
        (column < self.problem.tiles().0).then_some((image as u64 * channels as u64 + plane, row, column))
    }
}

impl Producer for ChunkTiles<false> {
    type Fetched = [[f32; 4]; 4];
    #[inline(always)]
    fn fetch(&self, chunk: u32) -> Self::Fetched {
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
    fn fetch(&self, chunk: u32) -> Self::Fetched {
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

/// One split's sums over its tiles of `(B^T x B) * (A dy A^T)`, for a block of
/// `WINOGRAD_ROWS` input channels by `WINOGRAD_OUT` output channels, written to
/// `partials[split][group][16][channels_padded][out_padded]`.
///
/// # Safety
/// `x` and `dy` hold the problem's tensors, `partials` `split.split *
/// problem.filter_len()` floats (16-byte aligned); the grid is `split.blocks(problem)`
/// by `groups` blocks of `WINOGRAD_THREADS`, with `WINOGRAD_SHARED_BYTES`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn conv_winograd_weight_grad_f32(
    x: *const f32,
    dy: *const f32,
    partials: *mut f32,
    problem: WinogradProblem,
    split: WinogradSplit,
) {
    let p = &problem;
    let group = block_idx_y();
    let channel_blocks = p.channels_padded / WINOGRAD_ROWS;
    let (rest, out_block) = (block_idx_x() / p.out_blocks(), block_idx_x() % p.out_blocks());
    let (part, channel_block) = (rest / channel_blocks, rest % channel_blocks);
    let (c0, k0) = (channel_block * WINOGRAD_ROWS, out_block * WINOGRAD_OUT);
    let (cg, kg) = (p.in_per_group(), p.out_per_group());
    let total = p.tile_chunks() as u32;
    let first = part * split.chunks;
    let end = (first + split.chunks).min(total);
    let (along, rows) = (
        FastDiv::new(p.tiles().0.div_ceil(WINOGRAD_CHUNK)),
        FastDiv::new(p.tiles().1),
    );
    let lane = thread_idx_x() / WINOGRAD_CHUNK;
    let plane = |channel: u32, count: u32, first_of_group: u32| {
        (channel < count).then_some((first_of_group + channel) as u64)
    };
    let inputs = ChunkTiles::<false> {
        tensor: x,
        problem,
        plane: plane(c0 + lane, cg, group * cg),
        end,
        along,
        rows,
    };
    let gradients = ChunkTiles::<true> {
        tensor: dy,
        problem,
        plane: plane(k0 + lane, kg, group * kg),
        end,
        along,
        rows,
    };
    // SAFETY: forwarded from the launch's contract.
    let acc = unsafe { products(&inputs, &gradients, first, end - first) };
    let (xi, ti, ki) = product_position();
    let (cp, op) = (p.channels_padded as usize, p.out_padded as usize);
    let base = ((part * p.groups + group) as usize * 16 + xi as usize) * cp * op;
    for (i, row) in acc.iter().enumerate() {
        let at = base + (c0 + ti * 8) as usize * op + i * op + (k0 + ki * 8) as usize;
        // SAFETY: inside this split's padded products, 16-byte aligned (out_padded and
        // k0 are multiples of 32).
        unsafe {
            let ptr = partials.add(at) as *mut u32;
            store_global_v4(ptr, [row[0], row[1], row[2], row[3]].map(f32::to_bits));
            store_global_v4(ptr.add(4), [row[4], row[5], row[6], row[7]].map(f32::to_bits));
        }
    }
}

/// `dw[k][c] = G^T (sum over splits of the products) G`, the splits added in order in
/// FP64, one thread per (group, out channel, in channel).
///
/// # Safety
/// `partials` holds what [`conv_winograd_weight_grad_f32`] wrote for `split` splits,
/// `dw` the weight gradient; the grid covers `out_channels * in_per_group` threads of
/// `FILTER_THREADS`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn conv_winograd_weight_grad_finish_f32(
    partials: *const f32,
    dw: *mut f32,
    problem: WinogradProblem,
    split: u32,
) {
    let p = &problem;
    let (cg, kg) = (p.in_per_group() as u64, p.out_per_group() as u64);
    let i = block_idx_x() as u64 * FILTER_THREADS as u64 + thread_idx_x() as u64;
    if i >= p.out_channels as u64 * cg {
        return;
    }
    let (out_channel, c) = (i / cg, i % cg);
    let (group, k) = (out_channel / kg, out_channel % kg);
    let (cp, op) = (p.channels_padded as u64, p.out_padded as u64);
    let mut m = [0.0f64; 16];
    for s in 0..split as u64 {
        for (xi, sum) in m.iter_mut().enumerate() {
            let at = ((s * p.groups as u64 + group) * 16 + xi as u64) * cp * op + c * op + k;
            // SAFETY: inside the split's padded products.
            *sum += unsafe { *partials.add(at as usize) } as f64;
        }
    }
    let columns = [0, 1, 2, 3].map(|b| filter_rows_back([m[b], m[4 + b], m[8 + b], m[12 + b]]));
    for r in 0..3 {
        let taps = filter_rows_back([columns[0][r], columns[1][r], columns[2][r], columns[3][r]]);
        for (s, value) in taps.into_iter().enumerate() {
            // SAFETY: (out_channel, c, r, s) is inside dw.
            unsafe { *dw.add((i * 9) as usize + r * 3 + s) = value as f32 };
        }
    }
}
