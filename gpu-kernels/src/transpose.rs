//! Batched transpose of 4-byte or 2-byte elements, `[batch][rows][cols]` to `[batch][cols][rows]`:
//! the layout change between channels-first (NCHW, rows = channels, cols = pixels) and
//! channels-last (NHWC) tensors, and of convolution weights between `[out][in][kh][kw]`
//! and `[out][kh][kw][in]`.
//!
//! Each block moves a `TILE x TILE` tile through shared memory (one element of padding
//! per row, so that the column reads hit distinct banks): reads and writes are both
//! along rows of 32 consecutive elements.

use crate::launch::{DevicePtr, DevicePtrMut, Launch, LaunchGeometry, kernel_args};

/// Elements along each side of a tile.
pub const TILE: u32 = 32;
/// Rows of a tile each thread moves: eight loads in flight per thread, so that the
/// blocks loading while others store keep enough bytes in flight for the copy
/// bandwidth.
pub const ROWS_PER_THREAD: u32 = 8;
/// Threads per block: `TILE` columns by `TILE / ROWS_PER_THREAD` rows.
pub const THREADS: u32 = TILE * TILE / ROWS_PER_THREAD;
/// Dynamic shared memory: one padded tile.
pub const SHARED_BYTES: u32 = TILE * (TILE + 1) * 4;

kernel_args! {
    /// `y[b][c][r] = x[b][r][c]` for `batch` matrices of `rows x cols`.
    pub struct TransposeArgs<T> {
        pub x: DevicePtr<T>,
        pub y: DevicePtrMut<T>,
        pub rows: u64,
        pub cols: u64,
    }
    impl TransposeKernel for u32 {
        const TRANSPOSE = "transpose_b32" => kernel::transpose::<u32>;
    }
    impl TransposeKernel for u16 {
        const TRANSPOSE = "transpose_b16" => kernel::transpose::<u16>;
    }
    entry points in ENTRY_POINTS;
}

/// The batched transpose of elements of a size: `u32` or `u16` bits.
pub trait TransposeKernel: Sized {
    const TRANSPOSE: crate::launch::Kernel<TransposeArgs<Self>>;
}

kernel_args! {
    /// The transpose of 2-byte elements in pairs (rows and columns even).
    pub struct TransposePairsArgs {
        pub x: DevicePtr<u32>,
        pub y: DevicePtrMut<u32>,
        pub rows: u64,
        pub cols: u64,
    }
    /// The batched transpose of 2-byte elements, two a thread access.
    pub const TRANSPOSE_B16_PAIRS = "transpose_b16_pairs" => kernel::transpose_pairs;
    entry points in PAIRS_ENTRY_POINTS;
}

/// Elements along each side of a tile of the paired 2-byte transpose: a thread moves
/// two of a row at a time, 32 threads a row of the tile.
pub const PAIRS_TILE: u32 = 64;
/// Dynamic shared memory of the paired transpose: a tile of 2-byte elements, rows two
/// elements longer (33 words: the column reads of a warp hit distinct word banks but
/// for pairs).
pub const PAIRS_SHARED_BYTES: u32 = PAIRS_TILE * (PAIRS_TILE + 2) * 2;

/// The transpose of `batch` matrices of `rows x cols` 2-byte elements from `x` to `y`
/// (distinct buffers, 4-byte aligned) with 4-byte accesses, where rows and columns are
/// even; `None` where they are not, or there is nothing to move.
pub fn launch_pairs(
    x: DevicePtr<u16>,
    y: DevicePtrMut<u16>,
    batch: u64,
    rows: u64,
    cols: u64,
) -> Option<Launch<TransposePairsArgs>> {
    let tile = PAIRS_TILE as u64;
    if batch == 0 || rows == 0 || cols == 0 || !rows.is_multiple_of(2) || !cols.is_multiple_of(2) {
        return None;
    }
    let geometry = LaunchGeometry {
        grid: [cols.div_ceil(tile), rows.div_ceil(tile), batch],
        threads: THREADS,
        shared_bytes: PAIRS_SHARED_BYTES,
    };
    let args = TransposePairsArgs {
        x: x.cast(),
        y: y.cast(),
        rows,
        cols,
    };
    Some(Launch::new(TRANSPOSE_B16_PAIRS, geometry, args))
}

/// The transpose of `batch` matrices of `rows x cols` elements from `x` to `y`
/// (distinct buffers), or `None` when there is nothing to move. Rows past 2^21 or
/// batches past 65535 pass the grid's limits, which the launch reports.
pub fn launch<T: TransposeKernel>(
    x: DevicePtr<T>,
    y: DevicePtrMut<T>,
    batch: u64,
    rows: u64,
    cols: u64,
) -> Option<Launch<TransposeArgs<T>>> {
    let (row_tiles, col_tiles) = (rows.div_ceil(TILE as u64), cols.div_ceil(TILE as u64));
    if batch == 0 || row_tiles == 0 || col_tiles == 0 {
        return None;
    }
    let geometry = LaunchGeometry {
        grid: [col_tiles, row_tiles, batch],
        threads: THREADS,
        shared_bytes: SHARED_BYTES,
    };
    Some(Launch::new(
        T::TRANSPOSE,
        geometry,
        TransposeArgs { x, y, rows, cols },
    ))
}

/// Moves tile `[row tile, column tile]` of a `rows x cols` matrix of `E`s (4 bytes or
/// fewer) through shared memory: element `(row, col)` is read from `x` at `from(row, col)` and written,
/// through `map`, to `y` at `to(row, col)`, where `to` runs along the rows (a
/// transpose). Each thread passes `map` elements of one row of x: row
/// `TILE * row tile + thread_idx_x % TILE`.
///
/// # Safety
/// Every thread of a block of `THREADS` with `SHARED_BYTES` of dynamic shared memory
/// calls it; `from` and `to` of every element of the matrix lie inside `x` and `y`,
/// which do not overlap.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub(crate) unsafe fn transpose_tile<E: Copy>(
    x: *const E,
    y: *mut E,
    [rows, cols]: [u64; 2],
    [row_tile, col_tile]: [u64; 2],
    from: impl Fn(u64, u64) -> u64,
    to: impl Fn(u64, u64) -> u64,
    mut map: impl FnMut(E) -> E,
) {
    use crate::device::{SharedCarver, sync_threads, thread_idx_x};
    const { assert!(size_of::<E>() <= 4) };
    // SAFETY: the launch gives one padded tile of 4-byte elements, enough for E's.
    let tile: *mut E = unsafe { SharedCarver::new().take((TILE * (TILE + 1)) as usize) };
    let (col0, row0) = (col_tile * TILE as u64, row_tile * TILE as u64);
    let (tx, ty) = (thread_idx_x() % TILE, thread_idx_x() / TILE);
    for i in 0..ROWS_PER_THREAD {
        let (r, c) = (ty + i * (TILE / ROWS_PER_THREAD), tx);
        let (row, col) = (row0 + r as u64, col0 + c as u64);
        if row < rows && col < cols {
            // SAFETY: (row, col) is inside the matrix; the slot is this thread's.
            unsafe { *tile.add((r * (TILE + 1) + c) as usize) = *x.add(from(row, col) as usize) };
        }
    }
    // SAFETY: every thread reaches it; the tile is read after it.
    unsafe { sync_threads() };
    for i in 0..ROWS_PER_THREAD {
        // Output row `c` (a column of x), output column `r` (a row of x).
        let (c, r) = (ty + i * (TILE / ROWS_PER_THREAD), tx);
        let (row, col) = (row0 + r as u64, col0 + c as u64);
        if row < rows && col < cols {
            // SAFETY: (row, col) is inside the matrix; its slot was written before the
            // barrier.
            unsafe { *y.add(to(row, col) as usize) = map(*tile.add((r * (TILE + 1) + c) as usize)) };
        }
    }
}

/// Moves tile `[row tile, column tile]` (`PAIRS_TILE` square) of a `rows x cols`
/// matrix of 2-byte elements through shared memory in 4-byte pairs: element `(row,
/// col)` is read from `x` at `from(row, col)` and written to `y` at `to(row, col)`,
/// where `from` runs along the columns and `to` along the rows (a transpose). Thread
/// `(tx, ty)` (32 x 8) reads the pairs of columns `2 tx, 2 tx + 1` of rows `ty + 8 i`
/// and writes the pairs of rows `2 tx, 2 tx + 1` of columns `ty + 8 i`.
///
/// # Safety
/// Every thread of a block of `THREADS` with `PAIRS_SHARED_BYTES` of dynamic shared
/// memory calls it; rows and columns are even, `from` of every even column and `to` of
/// every even row even (with x and y 4-byte aligned: the pairs are), `from(row, col +
/// 1) = from(row, col) + 1` and `to(row + 1, col) = to(row, col) + 1`, every element's
/// places inside `x` and `y`, which do not overlap.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub(crate) unsafe fn transpose_pairs_tile(
    x: *const u16,
    y: *mut u16,
    [rows, cols]: [u64; 2],
    [row_tile, col_tile]: [u64; 2],
    from: impl Fn(u64, u64) -> u64,
    to: impl Fn(u64, u64) -> u64,
) {
    use crate::device::{SharedCarver, sync_threads, thread_idx_x};
    const PITCH: u32 = PAIRS_TILE + 2;
    // SAFETY: the launch gives one tile.
    let tile: *mut u16 = unsafe { SharedCarver::new().take((PAIRS_TILE * PITCH) as usize) };
    let (row0, col0) = (row_tile * PAIRS_TILE as u64, col_tile * PAIRS_TILE as u64);
    let (tx, ty) = (thread_idx_x() % 32, thread_idx_x() / 32);
    let rows_per_pass = THREADS / 32;
    for i in 0..PAIRS_TILE / rows_per_pass {
        let (r, c) = (ty + i * rows_per_pass, 2 * tx);
        let (row, col) = (row0 + r as u64, col0 + c as u64);
        if row < rows && col < cols {
            // SAFETY: the pair (row, col..col + 2) lies inside x (columns even), 4-byte
            // aligned; the slots are this thread's.
            unsafe {
                let pair = *x.add(from(row, col) as usize).cast::<u32>();
                *tile.add((r * PITCH + c) as usize) = pair as u16;
                *tile.add((r * PITCH + c + 1) as usize) = (pair >> 16) as u16;
            }
        }
    }
    // SAFETY: every thread reaches it; the tile is read after it.
    unsafe { sync_threads() };
    for i in 0..PAIRS_TILE / rows_per_pass {
        // Output row `c` (a column of x), output columns `r, r + 1` (rows of x).
        let (c, r) = (ty + i * rows_per_pass, 2 * tx);
        let (row, col) = (row0 + r as u64, col0 + c as u64);
        if row < rows && col < cols {
            // SAFETY: the pair (row..row + 2, col) lies inside y (rows even), 4-byte
            // aligned; both slots were written before the barrier.
            unsafe {
                let low = *tile.add((r * PITCH + c) as usize) as u32;
                let high = *tile.add(((r + 1) * PITCH + c) as usize) as u32;
                *y.add(to(row, col) as usize).cast::<u32>() = low | high << 16;
            }
        }
    }
}

#[cfg(target_arch = "nvptx64")]
mod kernel {
    use super::*;
    use crate::device::{block_idx_x, block_idx_y, block_idx_z};

    /// Tile `(block y, block x)` of matrix `block z`, through [`transpose_pairs_tile`].
    ///
    /// # Safety
    /// x and y hold `batch * rows * cols` 2-byte elements (rows and columns even, so
    /// every pair is 4-byte aligned), do not overlap; the grid is [`launch_pairs`]'.
    #[inline(always)]
    pub unsafe fn transpose_pairs(args: TransposePairsArgs) {
        let TransposePairsArgs { rows, cols, .. } = args;
        let matrix = block_idx_z() as u64 * rows * cols;
        // SAFETY: every element of matrix `block_idx_z` lies inside x and y; rows and
        // columns even keep the pairs 4-byte aligned.
        unsafe {
            transpose_pairs_tile(
                args.x.as_ptr().cast(),
                args.y.as_mut_ptr().cast(),
                [rows, cols],
                [block_idx_y() as u64, block_idx_x() as u64],
                |row, col| matrix + row * cols + col,
                |row, col| matrix + col * rows + row,
            )
        };
    }

    /// # Safety
    /// x and y hold `batch * rows * cols` elements and do not overlap; the grid is
    /// `(cols / TILE, rows / TILE, batch)` tiles, rounded up, of `THREADS` threads with
    /// `SHARED_BYTES` of dynamic shared memory.
    #[inline(always)]
    pub unsafe fn transpose<T: Copy>(args: TransposeArgs<T>) {
        let TransposeArgs { rows, cols, .. } = args;
        let matrix = block_idx_z() as u64 * rows * cols;
        // SAFETY: the caller's contract: every element of matrix `block_idx_z` lies
        // inside x and y.
        unsafe {
            transpose_tile(
                args.x.as_ptr(),
                args.y.as_mut_ptr(),
                [rows, cols],
                [block_idx_y() as u64, block_idx_x() as u64],
                |row, col| matrix + row * cols + col,
                |row, col| matrix + col * rows + row,
                |value| value,
            )
        };
    }
}
