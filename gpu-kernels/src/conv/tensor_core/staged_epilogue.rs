//! The epilogue of the `wgmma` kernel with a residual or an activation past ReLU (the
//! others store from registers): the consumer warpgroup's sums (128 rows of 128 or
//! 64 columns) go out through shared memory, 32 columns at a time, so that every store to y (and every
//! read of the residual) is coalesced in either layout, and the fused epilogue runs in
//! loops over shared memory rather than over the registers (a loop over the registers
//! must unroll whole, or the sums move to local memory; with the activation and the
//! residual inside it is too long for that).
//!
//! The staging buffer is one that only this warpgroup's reads could still touch, and
//! they are done once it waits for its `wgmma`s: the consumer's part of the tile's last
//! stage of A. The stage goes back to the producer after the epilogue.

use super::epilogue::TileOrigin;
use super::*;
use crate::device::{
    lane_id, load_global_v4, load_shared_f32, load_shared_v4_f32, store_global_v4, store_shared_v2_f32,
    sync_group, thread_idx_x,
};

/// Rows of the consumer warpgroup's tile and of the buffer.
const ROWS: u32 = WGMMA_BM;
/// Columns staged per pass: one 128-byte row of A per row of the tile.
const COLUMNS: u32 = TC_BK;
/// Tiles of 8 columns per pass.
const TILES_PER_PASS: usize = (COLUMNS / 8) as usize;
/// Threads of a warpgroup.
const THREADS: u32 = 128;

const _: () = assert!(TC_BN == 4 * COLUMNS && WGMMA_NARROW_BN == 2 * COLUMNS && ROWS == 2 * 64);
/// The buffer fits a stage of B.
const _: () = assert!(ROWS * COLUMNS * 4 <= tile_bytes(TC_BN));

/// A consumer's sums: its two 64-row blocks of `J` tiles of 8 columns; in block b, warp
/// w's lane `4 g + t` holds rows `64 b + 16 w + g (+ 8)` and columns `8 j + 2 t (+ 1)`.
pub type ConsumerSums<const J: usize> = [[[f32; 4]; J]; 2];

/// The 16-byte chunk `chunk` of row `row` of the buffer, XOR-swizzled by the row so
/// that eight rows' chunks at one column fall in different banks.
#[inline(always)]
fn chunk_address(buffer: u32, row: u32, chunk: u32) -> u32 {
    buffer + row * COLUMNS * 4 + ((chunk ^ (row % 8)) * 16)
}

/// Writes the consumer's sums of `tile` through the fused epilogue to y, staged
/// in `buffer` (`ROWS` x `COLUMNS` floats of shared memory).
///
/// # Safety
/// The consumer warpgroup calls it together, its `wgmma`s done; nothing else accesses
/// `buffer` until it returns; `args` are the launch's, `tile` a tile of its GEMM.
#[inline(always)]
pub unsafe fn store_staged<const J: usize>(
    args: &TensorCoreArgs,
    tile: TileOrigin,
    sums: &ConsumerSums<J>,
    buffer: u32,
    consumer: u32,
) {
    // A loop the compiler keeps rolled (the code of four passes would not fit the
    // instruction cache beside the mainloop), the pass's sums picked by selects.
    for pass in 0..8 * J as u32 / COLUMNS {
        // SAFETY: forwarded; after the first barrier the warpgroup's reads of the
        // buffer are done: the previous pass's.
        unsafe {
            sync_consumer(consumer);
            stage(sums, buffer, pass);
            sync_consumer(consumer);
            if args.plan.y_channels_last == 1 {
                write_nhwc(args, tile, buffer, pass);
            } else {
                write_nchw(args, tile, buffer, pass);
            }
        }
    }
}

/// The warpgroup's barrier: named barrier 2 or 3 (1 is the producer's).
///
/// # Safety
/// The consumer warpgroup reaches it together.
#[inline(always)]
unsafe fn sync_consumer(consumer: u32) {
    // SAFETY: forwarded; the consumer's own barrier.
    unsafe {
        if consumer == 0 {
            sync_group::<2>(THREADS)
        } else {
            sync_group::<3>(THREADS)
        }
    }
}

/// Puts this thread's sums of columns `COLUMNS pass ..` in the buffer.
///
/// # Safety
/// The buffer is the warpgroup's and free.
#[inline(always)]
unsafe fn stage<const J: usize>(sums: &ConsumerSums<J>, buffer: u32, pass: u32) {
    let (warp, lane) = (thread_idx_x() / 32 % 4, lane_id());
    let (g, t) = (lane / 4, lane % 4);
    for (block, tiles) in sums.iter().enumerate() {
        for j in 0..TILES_PER_PASS {
            let tile = pick(pass, tiles, j);
            let column = 8 * j as u32 + 2 * t;
            for half in 0..2 {
                let row = 64 * block as u32 + 16 * warp + g + 8 * half as u32;
                let at = chunk_address(buffer, row, column / 4) + column % 4 * 4;
                // SAFETY: 8-byte aligned, inside the buffer; one writer each.
                unsafe { store_shared_v2_f32(at, [tile[2 * half], tile[2 * half + 1]]) };
            }
        }
    }
}

/// Tile `j` of pass `pass`, `tiles[TILES_PER_PASS pass + j]`, by selects (an index
/// into registers would move them to local memory).
#[inline(always)]
fn pick<const J: usize>(pass: u32, tiles: &[[f32; 4]; J], j: usize) -> [f32; 4] {
    let mut picked = tiles[j];
    for p in 1..J / TILES_PER_PASS {
        if pass == p as u32 {
            picked = tiles[p * TILES_PER_PASS + j];
        }
    }
    picked
}

/// NHWC: each row of the pass is 32 channels of one pixel, 128 contiguous bytes of y;
/// eight threads store a row, 16 bytes each where the channels allow.
///
/// # Safety
/// As [`store_staged`], the pass staged and published.
#[inline(always)]
unsafe fn write_nhwc(args: &TensorCoreArgs, tile: TileOrigin, buffer: u32, pass: u32) {
    let p = &args.problem;
    let (pixel0, live) = args.plan.tile_pixels(p, tile.m0);
    let out_group = p.out_per_group();
    let (y, residual) = (args.y.as_mut_ptr(), args.epilogue.residual.as_ptr());
    // 16-byte runs of y where every pixel's and group's first channel is aligned.
    let vectors = p.out_channels.is_multiple_of(4) && out_group.is_multiple_of(4);
    let chunk = thread_idx_x() % 8;
    let first = tile.n0 + COLUMNS * pass + 4 * chunk;
    if first >= out_group {
        return;
    }
    // Rows past the problem's end skipped by the bound (a bound the compiler cannot
    // see keeps the loop rolled, and the code small).
    let live_rows = ROWS.min(live);
    for row in (thread_idx_x() % THREADS / 8..live_rows).step_by((THREADS / 8) as usize) {
        let m = pixel0 + row;
        // SAFETY: inside the buffer, published by the barrier.
        let sums = unsafe { load_shared_v4_f32(chunk_address(buffer, row, chunk)) };
        let at = m as usize * p.out_channels as usize + (tile.group * out_group + first) as usize;
        if vectors {
            // SAFETY: four channels of pixel m (out_group a multiple of 4), 16-byte
            // aligned, inside y and the residual.
            unsafe {
                let mut values = sums.map(|sum| args.epilogue.activate(sum));
                if !residual.is_null() {
                    let added = load_global_v4(residual.add(at) as *const u32);
                    values = core::array::from_fn(|e| values[e] + f32::from_bits(added[e]));
                }
                store_global_v4(y.add(at) as *mut u32, values.map(f32::to_bits));
            }
            continue;
        }
        for (e, &sum) in sums.iter().enumerate() {
            if first + (e as u32) < out_group {
                // SAFETY: channel first + e of pixel m is an output, inside y and the
                // residual.
                unsafe { *y.add(at + e) = args.epilogue.apply(sum, at + e) };
            }
        }
    }
}

/// NCHW: each column of the pass is one channel, whose consecutive pixels are
/// contiguous in y; each thread stores one row (pixel) of every column.
///
/// # Safety
/// As [`store_staged`], the pass staged and published.
#[inline(always)]
unsafe fn write_nchw(args: &TensorCoreArgs, tile: TileOrigin, buffer: u32, pass: u32) {
    let p = &args.problem;
    let row = thread_idx_x() % THREADS;
    let (pixel0, live) = args.plan.tile_pixels(p, tile.m0);
    if row >= live {
        return;
    }
    let m = pixel0 + row;
    let out_group = p.out_per_group();
    let y = args.y.as_mut_ptr();
    let (image, pixel) = p.div_out_pixels.divmod(m);
    let pixels = p.out_pixels() as usize;
    let first = tile.n0 + COLUMNS * pass;
    let at = (image as usize * p.out_channels as usize + (tile.group * out_group + first) as usize) * pixels
        + pixel as usize;
    for column in 0..COLUMNS.min(out_group.saturating_sub(first)) {
        let address = chunk_address(buffer, row, column / 4) + column % 4 * 4;
        let at = at + column as usize * pixels;
        // SAFETY: inside the buffer, published by the barrier; (m, first + column) is
        // an output, inside y and the residual.
        unsafe { *y.add(at) = args.epilogue.apply(load_shared_f32(address), at) };
    }
}
