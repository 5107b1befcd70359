//! The implicit-GEMM kernels: one mainloop and one epilogue, and a gather per operand
//! that turns GEMM coordinates into tensor addresses (zero outside the tensor).

use super::*;
use crate::device::{
    SharedCarver, block_idx_x, block_idx_y, fma_f32, load_shared_v4_f32, shared_base, store_shared_f32,
    sync_threads, thread_idx_x,
};
use crate::warp;

/// A coordinate that stays out of range whatever tap is added to it.
const OUTSIDE: i32 = i32::MIN / 2;
/// An offset marking a row or column outside the operand.
const NONE: u64 = u64::MAX;

/// One GEMM operand, read from a tensor while the tiles are staged: element (row, k)
/// of A (rows along M) or of B^T (rows along N), zero outside the problem.
trait Gather {
    /// What a thread keeps of one of its rows for the whole K loop.
    type Row: Copy;
    /// What a thread derives from its k of one tile.
    type Col: Copy;
    /// Whether consecutive k are adjacent in memory (else consecutive rows are): picks
    /// the thread-to-element map of the loads, so that a warp's loads coalesce.
    const K_CONTIGUOUS: bool;
    fn row(&self, index: u32) -> Self::Row;
    fn col(&self, k: u32, valid: bool) -> Self::Col;
    /// # Safety
    /// `row` and `col` come from this gather.
    unsafe fn load(&self, row: Self::Row, col: Self::Col) -> f32;
}

/// The origin of an output pixel's window in x: its offset (image, group and origin
/// position) and its coordinates, `OUTSIDE` for a pixel past the problem.
#[derive(Clone, Copy)]
struct Window {
    offset: i64,
    y: i32,
    x: i32,
}

/// One (channel, r, s) of the window: its offset from the origin and its position.
#[derive(Clone, Copy)]
struct Tap {
    offset: i64,
    dy: i32,
    dx: i32,
}

/// x read as patches: element (output pixel, tap) of one group.
struct Patches {
    x: *const f32,
    problem: ConvProblem,
    group: u32,
    windows: u32,
    taps: u32,
}

impl Patches {
    fn new(x: *const f32, problem: ConvProblem, group: u32) -> Self {
        Self {
            x,
            problem,
            group,
            windows: problem.batch * problem.out_pixels(),
            taps: problem.in_per_group() * problem.taps(),
        }
    }

    #[inline(always)]
    fn window(&self, index: u32, valid: bool) -> Window {
        let p = &self.problem;
        if !valid || index >= self.windows {
            return Window {
                offset: 0,
                y: OUTSIDE,
                x: OUTSIDE,
            };
        }
        let (image, pixel) = p.div_out_pixels.divmod(index);
        let (oy, ox) = p.div_out_w.divmod(pixel);
        let y = (oy * p.stride_h) as i32 - p.pad_h as i32;
        let x = (ox * p.stride_w) as i32 - p.pad_w as i32;
        let plane = image as u64 * p.in_channels as u64 + (self.group * p.in_per_group()) as u64;
        Window {
            offset: (plane * p.pixels() as u64) as i64 + y as i64 * p.width as i64 + x as i64,
            y,
            x,
        }
    }

    #[inline(always)]
    fn tap(&self, index: u32, valid: bool) -> Tap {
        let p = &self.problem;
        if !valid || index >= self.taps {
            return Tap {
                offset: 0,
                dy: OUTSIDE,
                dx: OUTSIDE,
            };
        }
        let (channel, tap) = p.div_taps.divmod(index);
        let (r, s) = p.div_kernel_w.divmod(tap);
        let (dy, dx) = ((r * p.dilation_h) as i32, (s * p.dilation_w) as i32);
        Tap {
            offset: channel as i64 * p.pixels() as i64 + dy as i64 * p.width as i64 + dx as i64,
            dy,
            dx,
        }
    }

    /// # Safety
    /// `x` holds the problem's input.
    #[inline(always)]
    unsafe fn load(&self, window: Window, tap: Tap) -> f32 {
        let (y, x) = (window.y + tap.dy, window.x + tap.dx);
        if (y as u32) < self.problem.height && (x as u32) < self.problem.width {
            // SAFETY: (y, x) is inside the image, so the offset is inside x.
            unsafe { *self.x.offset((window.offset + tap.offset) as isize) }
        } else {
            0.0
        }
    }
}

/// Patches with rows along output pixels (the forward pass's A).
struct PatchesByWindow(Patches);

impl Gather for PatchesByWindow {
    type Row = Window;
    type Col = Tap;
    const K_CONTIGUOUS: bool = false;
    #[inline(always)]
    fn row(&self, index: u32) -> Window {
        self.0.window(index, true)
    }
    #[inline(always)]
    fn col(&self, k: u32, valid: bool) -> Tap {
        self.0.tap(k, valid)
    }
    #[inline(always)]
    unsafe fn load(&self, row: Window, col: Tap) -> f32 {
        // SAFETY: forwarded.
        unsafe { self.0.load(row, col) }
    }
}

/// Patches with rows along taps (the weight gradient's A).
struct PatchesByTap(Patches);

impl Gather for PatchesByTap {
    type Row = Tap;
    type Col = Window;
    const K_CONTIGUOUS: bool = true;
    #[inline(always)]
    fn row(&self, index: u32) -> Tap {
        self.0.tap(index, true)
    }
    #[inline(always)]
    fn col(&self, k: u32, valid: bool) -> Window {
        self.0.window(k, valid)
    }
    #[inline(always)]
    unsafe fn load(&self, row: Tap, col: Window) -> f32 {
        // SAFETY: forwarded.
        unsafe { self.0.load(col, row) }
    }
}

/// A strided matrix: element (row, k) at `base + row * row_stride + (k / div) *
/// outer_stride + k % div` (the weights in both data passes, dy in the weight
/// gradient).
struct Strided {
    ptr: *const f32,
    rows: u32,
    cols: u32,
    base: u64,
    row_stride: u64,
    div: FastDiv,
    outer_stride: u64,
}

impl Gather for Strided {
    type Row = u64;
    type Col = u64;
    const K_CONTIGUOUS: bool = true;
    #[inline(always)]
    fn row(&self, index: u32) -> u64 {
        if index < self.rows {
            self.base + index as u64 * self.row_stride
        } else {
            NONE
        }
    }
    #[inline(always)]
    fn col(&self, k: u32, valid: bool) -> u64 {
        if !valid || k >= self.cols {
            return NONE;
        }
        let (outer, inner) = self.div.divmod(k);
        outer as u64 * self.outer_stride + inner as u64
    }
    #[inline(always)]
    unsafe fn load(&self, row: u64, col: u64) -> f32 {
        if row != NONE && col != NONE {
            // SAFETY: both parts are in range, so the element is inside the tensor.
            unsafe { *self.ptr.add((row + col) as usize) }
        } else {
            0.0
        }
    }
}

/// dy read back onto input pixels (the input gradient's A): element (input pixel,
/// (out channel, tap)) is the dy of the output pixel whose window puts that tap on
/// the input pixel, zero where none does.
struct Scatter {
    dy: *const f32,
    problem: ConvProblem,
    group: u32,
    pixels: u32,
    taps: u32,
}

impl Gather for Scatter {
    /// The pixel's dy planes offset, and its padded coordinates.
    type Row = Window;
    /// The out channel's plane offset and the tap's displacement.
    type Col = Tap;
    const K_CONTIGUOUS: bool = false;

    #[inline(always)]
    fn row(&self, index: u32) -> Window {
        let p = &self.problem;
        if index >= self.pixels {
            return Window {
                offset: 0,
                y: OUTSIDE,
                x: OUTSIDE,
            };
        }
        let (image, pixel) = p.div_pixels.divmod(index);
        let (iy, ix) = p.div_width.divmod(pixel);
        let plane = image as u64 * p.out_channels as u64 + (self.group * p.out_per_group()) as u64;
        Window {
            offset: (plane * p.out_pixels() as u64) as i64,
            y: (iy + p.pad_h) as i32,
            x: (ix + p.pad_w) as i32,
        }
    }

    #[inline(always)]
    fn col(&self, k: u32, valid: bool) -> Tap {
        let p = &self.problem;
        if !valid || k >= self.taps {
            return Tap {
                offset: 0,
                dy: -OUTSIDE,
                dx: -OUTSIDE,
            };
        }
        let (channel, tap) = p.div_taps.divmod(k);
        let (r, s) = p.div_kernel_w.divmod(tap);
        Tap {
            offset: channel as i64 * p.out_pixels() as i64,
            dy: (r * p.dilation_h) as i32,
            dx: (s * p.dilation_w) as i32,
        }
    }

    #[inline(always)]
    unsafe fn load(&self, row: Window, col: Tap) -> f32 {
        let p = &self.problem;
        let (sy, sx) = (row.y - col.dy, row.x - col.dx);
        if sy < 0 || sx < 0 {
            return 0.0;
        }
        let (oy, ry) = p.div_stride_h.divmod(sy as u32);
        let (ox, rx) = p.div_stride_w.divmod(sx as u32);
        if ry == 0 && rx == 0 && oy < p.out_h && ox < p.out_w {
            let pixel = (oy * p.out_w + ox) as i64;
            // SAFETY: (oy, ox) is an output pixel of a valid plane.
            unsafe { *self.dy.offset((row.offset + col.offset + pixel) as isize) }
        } else {
            0.0
        }
    }
}

/// Where C goes: element (m, n) at `base + (m / row_div) * image_stride + m % row_div
/// + n * col_stride`, plus `bias[n]` when `bias` is not null.
struct Output {
    ptr: *mut f32,
    rows: u32,
    cols: u32,
    row_div: FastDiv,
    image_stride: u64,
    base: u64,
    col_stride: u64,
    bias: *const f32,
}

/// The thread's position in the compute grid of a tile: 16 x 16 threads, each
/// with 8 rows and 8 columns in two groups of 4, 64 apart.
#[inline(always)]
fn compute_position() -> (u32, u32) {
    let t = thread_idx_x();
    (t % 16, t / 16)
}

/// The tile row (or column) of a thread's `i`th accumulator at position `p`.
#[inline(always)]
const fn tile_offset(p: u32, i: usize) -> u32 {
    (i as u32 / 4) * 64 + p * 4 + i as u32 % 4
}

type Accumulators = [[f32; 8]; 8];

/// The tile of `A[m0.., k_begin..k_end] * B[k_begin..k_end, n0..]` this thread owns.
///
/// # Safety
/// The launch has `GEMM_THREADS` threads and `GEMM_SHARED_BYTES` of shared memory;
/// every thread of the block calls it with the same arguments.
#[inline(always)]
unsafe fn mainloop<A: Gather, B: Gather>(
    a: &A,
    b: &B,
    m0: u32,
    n0: u32,
    k_begin: u32,
    k_end: u32,
) -> Accumulators {
    const STAGE: u32 = TILE_K * TILE_PITCH * 4;
    let t = thread_idx_x();
    // Each thread stages 4 rows of each operand, 32 apart, at one k of the tile.
    let slot = |k_contiguous: bool| {
        if k_contiguous {
            (t / 8, t % 8)
        } else {
            (t % 32, t / 32)
        }
    };
    let (a_first, a_k) = slot(A::K_CONTIGUOUS);
    let (b_first, b_k) = slot(B::K_CONTIGUOUS);
    let a_rows: [A::Row; 4] = core::array::from_fn(|i| a.row(m0 + a_first + 32 * i as u32));
    let b_rows: [B::Row; 4] = core::array::from_fn(|i| b.row(n0 + b_first + 32 * i as u32));
    let a_stage = |s: u32| shared_base() + s * 2 * STAGE;
    let b_stage = |s: u32| a_stage(s) + STAGE;
    let fetch = |k0: u32| {
        let (ka, kb) = (k0 + a_k, k0 + b_k);
        let (ca, cb) = (a.col(ka, ka < k_end), b.col(kb, kb < k_end));
        let mut values = [0.0f32; 8];
        for i in 0..4 {
            // SAFETY: rows and columns come from their gathers.
            unsafe {
                values[i] = a.load(a_rows[i], ca);
                values[4 + i] = b.load(b_rows[i], cb);
            }
        }
        values
    };
    let stash = |s: u32, values: &[f32; 8]| {
        for i in 0..4 {
            let a_at = a_stage(s) + (a_k * TILE_PITCH + a_first + 32 * i as u32) * 4;
            let b_at = b_stage(s) + (b_k * TILE_PITCH + b_first + 32 * i as u32) * 4;
            // SAFETY: inside the stage (k < TILE_K, row < TILE_M); each element has
            // one writer, and the barriers order it against the readers.
            unsafe {
                store_shared_f32(a_at, values[i]);
                store_shared_f32(b_at, values[4 + i]);
            }
        }
    };

    let (tx, ty) = compute_position();
    let mut acc: Accumulators = [[0.0; 8]; 8];
    let tiles = (k_end - k_begin).div_ceil(TILE_K);
    stash(0, &fetch(k_begin));
    // SAFETY: reached by the whole block.
    unsafe { sync_threads() };
    for tile in 0..tiles {
        let s = tile % 2;
        // Past the last tile the fetch reads nothing (every k is out of range).
        let next = fetch(k_begin + (tile + 1) * TILE_K);
        for kk in 0..TILE_K {
            let a_at = a_stage(s) + (kk * TILE_PITCH + tx * 4) * 4;
            let b_at = b_stage(s) + (kk * TILE_PITCH + ty * 4) * 4;
            // SAFETY: 16-byte aligned (the pitch and offsets are multiples of 4
            // floats) and inside the stage the barrier published.
            let (a_lo, a_hi, b_lo, b_hi) = unsafe {
                (
                    load_shared_v4_f32(a_at),
                    load_shared_v4_f32(a_at + 256),
                    load_shared_v4_f32(b_at),
                    load_shared_v4_f32(b_at + 256),
                )
            };
            let av = [
                a_lo[0], a_lo[1], a_lo[2], a_lo[3], a_hi[0], a_hi[1], a_hi[2], a_hi[3],
            ];
            let bv = [
                b_lo[0], b_lo[1], b_lo[2], b_lo[3], b_hi[0], b_hi[1], b_hi[2], b_hi[3],
            ];
            for i in 0..8 {
                for j in 0..8 {
                    acc[i][j] = fma_f32(av[i], bv[j], acc[i][j]);
                }
            }
        }
        // The other stage was last read before the previous barrier.
        stash(1 - s, &next);
        // SAFETY: reached by the whole block.
        unsafe { sync_threads() };
    }
    acc
}

impl Output {
    /// Writes this thread's accumulators of the tile at (m0, n0).
    ///
    /// # Safety
    /// `ptr` (and `bias`, when not null) hold every element the problem addresses.
    #[inline(always)]
    unsafe fn store(&self, acc: &Accumulators, m0: u32, n0: u32) {
        let (tx, ty) = compute_position();
        let rows: [u64; 8] = core::array::from_fn(|i| {
            let m = m0 + tile_offset(tx, i);
            if m >= self.rows {
                return NONE;
            }
            let (image, rest) = self.row_div.divmod(m);
            image as u64 * self.image_stride + rest as u64
        });
        for j in 0..8 {
            let n = n0 + tile_offset(ty, j);
            if n >= self.cols {
                continue;
            }
            let col = self.base + n as u64 * self.col_stride;
            // SAFETY: n is a valid column.
            let bias = if self.bias.is_null() {
                0.0
            } else {
                unsafe { *self.bias.add(n as usize) }
            };
            for i in 0..8 {
                if rows[i] != NONE {
                    // SAFETY: (m, n) is inside C.
                    unsafe { *self.ptr.add((rows[i] + col) as usize) = acc[i][j] + bias };
                }
            }
        }
    }
}

/// The (m, n, split) tile of this block.
#[inline(always)]
fn block_tile(plan: &GemmPlan) -> (u32, u32, u32) {
    let b = block_idx_x();
    let (rest, n_tile) = (b / plan.n_tiles, b % plan.n_tiles);
    (rest % plan.m_tiles * TILE_M, n_tile * TILE_N, rest / plan.m_tiles)
}

/// y = conv(x, w) + bias.
///
/// # Safety
/// x, w, y (and bias, when not null) hold the problem's tensors; the grid is `plan`'s
/// blocks by `groups`, with `GEMM_THREADS` threads and `GEMM_SHARED_BYTES`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn conv_forward_f32(
    x: *const f32,
    w: *const f32,
    bias: *const f32,
    y: *mut f32,
    problem: ConvProblem,
    plan: GemmPlan,
) {
    let group = block_idx_y();
    let (m, n, k) = problem.gemm(ConvPass::Forward);
    let (m, n, k) = (m as u32, n as u32, k as u32);
    let (m0, n0, _) = block_tile(&plan);
    let a = PatchesByWindow(Patches::new(x, problem, group));
    let b = Strided {
        ptr: w,
        rows: n,
        cols: k,
        base: (group * n) as u64 * k as u64,
        row_stride: k as u64,
        div: FastDiv::new(k),
        outer_stride: 0,
    };
    let out = Output {
        ptr: y,
        rows: m,
        cols: n,
        row_div: problem.div_out_pixels,
        image_stride: problem.out_channels as u64 * problem.out_pixels() as u64,
        base: (group * n) as u64 * problem.out_pixels() as u64,
        col_stride: problem.out_pixels() as u64,
        bias: if bias.is_null() {
            bias
        } else {
            bias.wrapping_add((group * n) as usize)
        },
    };
    // SAFETY: forwarded from the launch's contract.
    unsafe { out.store(&mainloop(&a, &b, m0, n0, 0, k), m0, n0) };
}

/// dx = the input gradient of conv for dy.
///
/// # Safety
/// dy, w, dx hold the problem's tensors; the grid and block are as the forward's.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn conv_input_grad_f32(
    dy: *const f32,
    w: *const f32,
    dx: *mut f32,
    problem: ConvProblem,
    plan: GemmPlan,
) {
    let group = block_idx_y();
    let (m, n, k) = problem.gemm(ConvPass::InputGrad);
    let (m, n, k) = (m as u32, n as u32, k as u32);
    let (m0, n0, _) = block_tile(&plan);
    let a = Scatter {
        dy,
        problem,
        group,
        pixels: m,
        taps: k,
    };
    let taps = problem.taps() as u64;
    let b = Strided {
        ptr: w,
        rows: n,
        cols: k,
        base: (group * problem.out_per_group()) as u64 * n as u64 * taps,
        row_stride: taps,
        div: problem.div_taps,
        outer_stride: n as u64 * taps,
    };
    let out = Output {
        ptr: dx,
        rows: m,
        cols: n,
        row_div: problem.div_pixels,
        image_stride: problem.in_channels as u64 * problem.pixels() as u64,
        base: (group * n) as u64 * problem.pixels() as u64,
        col_stride: problem.pixels() as u64,
        bias: core::ptr::null(),
    };
    // SAFETY: forwarded from the launch's contract.
    unsafe { out.store(&mainloop(&a, &b, m0, n0, 0, k), m0, n0) };
}

/// The weight gradient of conv for dy, or with `plan.split > 1` its per-split partials
/// `[split][out_channels][in_channels / groups * taps]`.
///
/// # Safety
/// x, dy hold the problem's tensors and `out` the gradient (times `split`); the grid
/// and block are as the forward's.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn conv_weight_grad_f32(
    x: *const f32,
    dy: *const f32,
    out: *mut f32,
    problem: ConvProblem,
    plan: GemmPlan,
) {
    let group = block_idx_y();
    let (m, n, k) = problem.gemm(ConvPass::WeightGrad);
    let (m, n, k) = (m as u32, n as u32, k as u32);
    let (m0, n0, split) = block_tile(&plan);
    let k_begin = split * plan.k_chunk;
    let k_end = (k_begin + plan.k_chunk).min(k);
    let a = PatchesByTap(Patches::new(x, problem, group));
    let b = Strided {
        ptr: dy,
        rows: n,
        cols: k,
        base: (group * n) as u64 * problem.out_pixels() as u64,
        row_stride: problem.out_pixels() as u64,
        div: problem.div_out_pixels,
        outer_stride: problem.out_channels as u64 * problem.out_pixels() as u64,
    };
    let gradient = problem.out_channels as u64 * m as u64;
    let out = Output {
        ptr: out,
        rows: m,
        cols: n,
        row_div: FastDiv::new(m),
        image_stride: 0,
        base: split as u64 * gradient + (group * n) as u64 * m as u64,
        col_stride: m as u64,
        bias: core::ptr::null(),
    };
    // SAFETY: forwarded from the launch's contract.
    unsafe { out.store(&mainloop(&a, &b, m0, n0, k_begin, k_end), m0, n0) };
}

/// `out[i] = sum over s of partials[s * count + i]`, added in order in FP64.
///
/// # Safety
/// `partials` holds `split * count` values, `out` `count`; the grid covers `count`
/// threads.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn conv_split_sum_f32(
    partials: *const f32,
    out: *mut f32,
    count: u64,
    split: u32,
) {
    let i = block_idx_x() as u64 * REDUCE_THREADS as u64 + thread_idx_x() as u64;
    if i >= count {
        return;
    }
    let mut sum = 0.0f64;
    for s in 0..split as u64 {
        // SAFETY: s * count + i < split * count.
        sum += unsafe { *partials.add((s * count + i) as usize) } as f64;
    }
    // SAFETY: i < count.
    unsafe { *out.add(i as usize) = sum as f32 };
}

/// `db[c] = sum of dy[.., c, .., ..]`, one block per channel, in FP64 in a fixed order.
///
/// # Safety
/// dy holds the problem's output gradient, `db` `out_channels` values; the grid is
/// `out_channels` blocks of `REDUCE_THREADS`, with `REDUCE_THREADS / 32` f64 of shared
/// memory.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn conv_bias_grad_f32(dy: *const f32, db: *mut f32, problem: ConvProblem) {
    let channel = block_idx_x() as u64;
    let t = thread_idx_x();
    let pixels = problem.out_pixels() as u64;
    let mut sum = 0.0f64;
    for image in 0..problem.batch as u64 {
        let plane = (image * problem.out_channels as u64 + channel) * pixels;
        let mut p = t as u64;
        while p < pixels {
            // SAFETY: p < pixels of a valid plane.
            sum += unsafe { *dy.add((plane + p) as usize) } as f64;
            p += REDUCE_THREADS as u64;
        }
    }
    let sum = warp::reduce(sum, |a, b| a + b);
    // SAFETY: the launch provides REDUCE_THREADS / 32 f64.
    let warp_sums: *mut f64 = unsafe { SharedCarver::new().take(REDUCE_THREADS as usize / 32) };
    if t % 32 == 0 {
        // SAFETY: one writer per warp, inside the region.
        unsafe { *warp_sums.add(t as usize / 32) = sum };
    }
    // SAFETY: reached by the whole block.
    unsafe { sync_threads() };
    if t == 0 {
        let mut total = 0.0f64;
        for w in 0..REDUCE_THREADS as usize / 32 {
            // SAFETY: written before the barrier.
            total += unsafe { *warp_sums.add(w) };
        }
        // SAFETY: channel < out_channels.
        unsafe { *db.add(channel as usize) = total as f32 };
    }
}
