//! The implicit GEMM's operands: a gather per operand that turns GEMM coordinates
//! into tensor addresses (zero outside the tensor), one per role in the three passes.

use super::{ConvProblem, FastDiv};

/// A coordinate that stays out of range whatever tap is added to it.
const OUTSIDE: i32 = i32::MIN / 2;
/// An offset marking a row or column outside the operand.
pub const NONE: u64 = u64::MAX;

/// One GEMM operand, read from a tensor while the tiles are staged: element (row, k)
/// of A (rows along M) or of B^T (rows along N), zero outside the problem.
pub trait Gather {
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
pub struct Window {
    offset: i64,
    y: i32,
    x: i32,
}

/// One (channel, r, s) of the window: its offset from the origin and its position.
#[derive(Clone, Copy)]
pub struct Tap {
    offset: i64,
    dy: i32,
    dx: i32,
}

/// x read as patches: element (output pixel, tap) of one group.
pub struct Patches {
    x: *const f32,
    problem: ConvProblem,
    group: u32,
    windows: u32,
    taps: u32,
}

impl Patches {
    pub fn new(x: *const f32, problem: ConvProblem, group: u32) -> Self {
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
pub struct PatchesByWindow(pub Patches);

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
pub struct PatchesByTap(pub Patches);

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
pub struct Strided {
    pub ptr: *const f32,
    pub rows: u32,
    pub cols: u32,
    pub base: u64,
    pub row_stride: u64,
    pub div: FastDiv,
    pub outer_stride: u64,
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
pub struct Scatter {
    pub dy: *const f32,
    pub problem: ConvProblem,
    pub group: u32,
    pub pixels: u32,
    pub taps: u32,
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
