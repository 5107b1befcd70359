//! The Winograd kernels: the weight transform, the fused pass of the forward and
//! input-gradient convolutions, and the weight gradient with its finishing pass.

use super::transform::{
    ChunkTiles, FilterSlices, InputTiles, filter_rows, filter_rows_back, output_rows, product_position,
    products,
};
use super::*;
use crate::device::{
    block_idx_x, block_idx_y, load_shared_f32, shared_base, store_global_v2_f32, store_global_v4,
    store_shared_v4_f32, sync_threads, thread_idx_x,
};

/// `U[group][xi][c][k] = (G g G^T)[xi]` for every (group, c, k) of the padded layout,
/// zero in the padding; g is `w[k][c]` (forward) or `w[c][k]` rotated by 180 degrees
/// (input gradient, `flip`). Computed in FP64 and rounded once.
///
/// # Safety
/// `w` holds the convolution's weights, `u` `problem.filter_len()` floats; the grid
/// covers `filter_len / 16` threads of `FILTER_THREADS`.
#[inline(always)]
pub unsafe fn filter(args: FilterArgs) {
    let (w, u, problem) = (args.w.as_ptr(), args.u.as_mut_ptr(), args.problem);
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
        let row = filter_rows(columns.map(|column| column[a]));
        for (b, value) in row.into_iter().enumerate() {
            let xi = (a * 4 + b) as u64;
            // SAFETY: inside the padded layout of `filter_len` floats.
            unsafe { *u.add((((group * 16 + xi) * cp + c) * op + k) as usize) = value as f32 };
        }
    }
}

/// The output (plus bias) of a 3x3, stride-1 convolution whose transformed weights are
/// `u`, for one block of `WINOGRAD_ROWS` consecutive output tiles by `WINOGRAD_OUT`
/// output channels, over all input channels of the group.
///
/// # Safety
/// `input` and `output` hold the problem's tensors, `u` the transformed weights of
/// [`filter`] (16-byte aligned), `bias` null or `out_channels`
/// floats; the grid is `problem.blocks()` by `groups` blocks of `WINOGRAD_THREADS`,
/// with `WINOGRAD_SHARED_BYTES`.
#[inline(always)]
pub unsafe fn winograd(args: WinogradArgs) {
    let problem = args.problem;
    let (input, u) = (args.input.as_ptr(), args.u.as_ptr());
    let p = &problem;
    let t = thread_idx_x();
    let group = block_idx_y();
    let (tile_block, out_block) = (block_idx_x() / p.out_blocks(), block_idx_x() % p.out_blocks());
    let k0 = out_block * WINOGRAD_OUT;

    let (slot, channel) = (t % WINOGRAD_ROWS, t / WINOGRAD_ROWS);
    let tiles = InputTiles::new(input, p, group, tile_block * WINOGRAD_ROWS + slot, channel);
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
        let [a, b, c, d, e, f, g, h] = acc.map(|row| row[j]);
        // SAFETY: 16-byte aligned, inside the shared memory; one writer each.
        unsafe {
            store_shared_v4_f32(at, [a, b, c, d]);
            store_shared_v4_f32(at + 16, [e, f, g, h]);
        }
    }
    // SAFETY: reached by the whole block.
    unsafe { sync_threads() };

    let block = (tile_block, group, k0);
    // SAFETY: the products are in shared memory, published by the barrier.
    unsafe {
        if args.epilogue.is_plain() {
            write_outputs::<false>(&args, product_at, block)
        } else {
            write_outputs::<true>(&args, product_at, block)
        }
    };
}

/// The inverse transform of the block's products (`product_at` their shared-memory
/// addresses): each thread takes one tile (slot `t % WINOGRAD_ROWS`) for every step's
/// out channel, through the epilogue when `FUSED` (else plus the bias alone).
///
/// # Safety
/// As [`winograd`], after its products were written and published; `block` is its
/// (run of tiles, group, first output channel).
#[inline(always)]
unsafe fn write_outputs<const FUSED: bool>(
    args: &WinogradArgs,
    product_at: impl Fn(u32, u32, u32) -> u32,
    block: (u32, u32, u32),
) {
    const CHANNELS_PER_STEP: u32 = WINOGRAD_THREADS / WINOGRAD_ROWS;
    let (tile_block, group, k0) = block;
    let p = &args.problem;
    let (bias, output) = (args.epilogue.bias.as_ptr(), args.output.as_mut_ptr());
    let kg = p.out_per_group();
    let t = thread_idx_x();
    let slot = t % WINOGRAD_ROWS;
    let tile = tile_block * WINOGRAD_ROWS + slot;
    let Some((image, tile_row, tile_column)) = p.tile_place(tile) else {
        return;
    };
    let (oy, ox) = (2 * tile_row, 2 * tile_column);
    // Both columns of a tile row at once where they are 8-byte aligned: an even row
    // length (and an aligned y) keeps every tile's first column so.
    let pairs = ox + 1 < p.out_w && p.out_w.is_multiple_of(2) && output.addr().is_multiple_of(8);
    for step in 0..WINOGRAD_OUT / CHANNELS_PER_STEP {
        let k = t / WINOGRAD_ROWS + CHANNELS_PER_STEP * step;
        if k0 + k >= kg {
            break;
        }
        // SAFETY: written before the barrier, inside the shared memory.
        let m: [f32; 16] =
            core::array::from_fn(|xi| unsafe { load_shared_f32(product_at(xi as u32, k, slot)) });
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
            let row = oy + i as u32;
            if row >= p.out_h {
                break;
            }
            let first = (plane + row as u64 * p.out_w as u64 + ox as u64) as usize;
            // Column j of the row, `first + j`, is an output wherever it is stored.
            let value = |j: usize, sum: f32| {
                if FUSED {
                    // SAFETY: an element of y (above).
                    unsafe { args.epilogue.apply(sum + offset, first + j) }
                } else {
                    sum + offset
                }
            };
            let y = output_rows(columns.map(|column| column[i]));
            // SAFETY: (row, ox) and, where written, (row, ox + 1) are inside the output
            // plane, and so inside the residual; paired, 8-byte aligned (above).
            unsafe {
                if pairs {
                    store_global_v2_f32(output.add(first), [value(0, y[0]), value(1, y[1])]);
                } else {
                    *output.add(first) = value(0, y[0]);
                    if ox + 1 < p.out_w {
                        *output.add(first + 1) = value(1, y[1]);
                    }
                }
            }
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
#[inline(always)]
pub unsafe fn weight_grad(args: WeightGradArgs) {
    let WeightGradArgs { problem, split, .. } = args;
    let (x, dy, partials) = (args.x.as_ptr(), args.dy.as_ptr(), args.partials.as_mut_ptr());
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
    let lane = thread_idx_x() / WINOGRAD_CHUNK;
    let plane = |channel: u32, count: u32, first_of_group: u32| {
        (channel < count).then_some((first_of_group + channel) as u64)
    };
    let inputs = ChunkTiles::<false> {
        tensor: x,
        problem,
        plane: plane(c0 + lane, cg, group * cg),
        end,
    };
    let gradients = ChunkTiles::<true> {
        tensor: dy,
        problem,
        plane: plane(k0 + lane, kg, group * kg),
        end,
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

/// `dw[k][c] = G^T (the products) G`, one thread per (group, out channel, in channel).
///
/// # Safety
/// `products` holds the sum of what [`weight_grad`] wrote for its splits (one split's
/// layout), `dw` the weight gradient; the grid covers `out_channels * in_per_group`
/// threads of `FILTER_THREADS`.
#[inline(always)]
pub unsafe fn weight_grad_finish(args: FinishArgs) {
    let problem = args.problem;
    let (products, dw) = (args.products.as_ptr(), args.dw.as_mut_ptr());
    let p = &problem;
    let (cg, kg) = (p.in_per_group() as u64, p.out_per_group() as u64);
    let i = block_idx_x() as u64 * FILTER_THREADS as u64 + thread_idx_x() as u64;
    if i >= p.out_channels as u64 * cg {
        return;
    }
    let (out_channel, c) = (i / cg, i % cg);
    let (group, k) = (out_channel / kg, out_channel % kg);
    let (cp, op) = (p.channels_padded as u64, p.out_padded as u64);
    let m: [f64; 16] = core::array::from_fn(|xi| {
        let at = (group * 16 + xi as u64) * cp * op + c * op + k;
        // SAFETY: inside the padded products.
        (unsafe { *products.add(at as usize) }) as f64
    });
    let columns = [0, 1, 2, 3].map(|b| filter_rows_back([m[b], m[4 + b], m[8 + b], m[12 + b]]));
    for r in 0..3 {
        let taps = filter_rows_back(columns.map(|column| column[r]));
        for (s, value) in taps.into_iter().enumerate() {
            // SAFETY: (out_channel, c, r, s) is inside dw.
            unsafe { *dw.add((i * 9) as usize + r * 3 + s) = value as f32 };
        }
    }
}
