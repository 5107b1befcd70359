//! Winograd F(2x2, 3x3) kernels: the weight transform, and the fused transform,
//! multiply and inverse-transform pass (see the module docs).

use super::*;
use crate::device::{
    block_idx_x, block_idx_y, fma_f32, load_global_nc_v4, load_shared_f32, load_shared_v4_f32, shared_base,
    store_shared_f32, store_shared_v4_f32, sync_threads, thread_idx_x,
};

/// `G t` for a column of three taps: G = [[1, 0, 0], [1/2, 1/2, 1/2], [1/2, -1/2, 1/2],
/// [0, 0, 1]].
#[inline(always)]
fn filter_rows(t: [f64; 3]) -> [f64; 4] {
    [t[0], 0.5 * (t[0] + t[1] + t[2]), 0.5 * (t[0] - t[1] + t[2]), t[2]]
}

/// `B^T d` for a column of four inputs: B^T = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1,
/// 0], [0, 1, 0, -1]].
#[inline(always)]
fn input_rows(d: [f32; 4]) -> [f32; 4] {
    [d[0] - d[2], d[1] + d[2], d[2] - d[1], d[1] - d[3]]
}

/// `A^T m` for a column of four products: A^T = [[1, 1, 1, 0], [0, 1, -1, -1]].
#[inline(always)]
fn output_rows(m: [f32; 4]) -> [f32; 2] {
    [m[0] + m[1] + m[2], m[1] - m[2] - m[3]]
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

/// Bytes of one stage of transformed inputs (or weights): `[16][CHUNK][32]` floats.
const STAGE_PART: u32 = 16 * WINOGRAD_CHUNK * WINOGRAD_TILES * 4;

/// The output (plus bias) of a 3x3, stride-1 convolution whose transformed weights are
/// `u`, for one block of `WINOGRAD_TILES` output tiles along a row by `WINOGRAD_OUT`
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
    let chunks = p.channels_padded / WINOGRAD_CHUNK;

    // The input transform: this thread's tile, and its channel within each chunk.
    let (tile, lane_channel) = (t % WINOGRAD_TILES, t / WINOGRAD_TILES);
    let y0 = (2 * tile_row) as i32 - p.pad_h as i32;
    let x0 = (2 * (segment * WINOGRAD_TILES + tile)) as i32 - p.pad_w as i32;
    let plane = p.height as i64 * p.width as i64;
    let first_plane = image as i64 * p.channels as i64 + (group * cg) as i64;
    let origin = first_plane * plane + y0 as i64 * p.width as i64 + x0 as i64;
    let row_inside: [bool; 4] = core::array::from_fn(|i| ((y0 + i as i32) as u32) < p.height);
    let col_inside: [bool; 4] = core::array::from_fn(|j| ((x0 + j as i32) as u32) < p.width);
    let load_tile = |channel: u32| {
        let mut d = [[0.0f32; 4]; 4];
        if channel < cg {
            let at = origin + channel as i64 * plane;
            for (i, row) in d.iter_mut().enumerate() {
                for (j, value) in row.iter_mut().enumerate() {
                    if row_inside[i] && col_inside[j] {
                        // SAFETY: (y0 + i, x0 + j) is inside the image of a valid channel.
                        *value =
                            unsafe { *input.offset((at + (i as i64) * p.width as i64 + j as i64) as isize) };
                    }
                }
            }
        }
        d
    };
    // The weights: four 16-byte pieces of the chunk's `[16][CHUNK][WINOGRAD_OUT]` slice.
    let u_group = u.wrapping_add(group as usize * 16 * p.channels_padded as usize * p.out_padded as usize);
    let filter_piece = |i: u32| {
        let q = t + WINOGRAD_THREADS * i;
        let (row, quad) = (q / (WINOGRAD_OUT / 4), q % (WINOGRAD_OUT / 4));
        (row / WINOGRAD_CHUNK, row % WINOGRAD_CHUNK, quad)
    };
    let load_filter = |chunk: u32| {
        let mut pieces = [[0.0f32; 4]; 4];
        if chunk < chunks {
            for (i, piece) in pieces.iter_mut().enumerate() {
                let (xi, c, quad) = filter_piece(i as u32);
                let at = (xi * p.channels_padded + chunk * WINOGRAD_CHUNK + c) * p.out_padded + k0 + quad * 4;
                // SAFETY: inside this group's padded U, 16-byte aligned (out_padded and
                // k0 are multiples of 32); U is not written during the launch.
                *piece =
                    unsafe { load_global_nc_v4(u_group.add(at as usize) as *const u32) }.map(f32::from_bits);
            }
        }
        pieces
    };
    let stage = |s: u32| shared_base() + s * 2 * STAGE_PART;
    let stash = |s: u32, d: &[[f32; 4]; 4], pieces: &[[f32; 4]; 4]| {
        let columns = [0, 1, 2, 3].map(|j| input_rows([d[0][j], d[1][j], d[2][j], d[3][j]]));
        for a in 0..4 {
            let row = input_rows([columns[0][a], columns[1][a], columns[2][a], columns[3][a]]);
            for (b, value) in row.into_iter().enumerate() {
                let xi = (a * 4 + b) as u32;
                let at = stage(s) + ((xi * WINOGRAD_CHUNK + lane_channel) * WINOGRAD_TILES + tile) * 4;
                // SAFETY: inside the stage; one writer per element, ordered by barriers.
                unsafe { store_shared_f32(at, value) };
            }
        }
        for (i, piece) in pieces.iter().enumerate() {
            let (xi, c, quad) = filter_piece(i as u32);
            let at = stage(s) + STAGE_PART + ((xi * WINOGRAD_CHUNK + c) * WINOGRAD_OUT + quad * 4) * 4;
            // SAFETY: as above, 16-byte aligned.
            unsafe { store_shared_v4_f32(at, *piece) };
        }
    };

    // The products: tile position `xi`, tiles `ti * 8..`, out channels `ki * 8..`.
    let (xi, ti, ki) = (t / 16, t % 4, t % 16 / 4);
    let mut acc = [[0.0f32; 8]; 8];
    stash(0, &load_tile(lane_channel), &load_filter(0));
    // SAFETY: reached by the whole block.
    unsafe { sync_threads() };
    for chunk in 0..chunks {
        let s = chunk % 2;
        let next_tile = load_tile((chunk + 1) * WINOGRAD_CHUNK + lane_channel);
        let next_filter = load_filter(chunk + 1);
        for c in 0..WINOGRAD_CHUNK {
            let v_at = stage(s) + ((xi * WINOGRAD_CHUNK + c) * WINOGRAD_TILES + ti * 8) * 4;
            let u_at = stage(s) + STAGE_PART + ((xi * WINOGRAD_CHUNK + c) * WINOGRAD_OUT + ki * 8) * 4;
            // SAFETY: 16-byte aligned, inside the stage the barrier published.
            let (v_lo, v_hi, u_lo, u_hi) = unsafe {
                (
                    load_shared_v4_f32(v_at),
                    load_shared_v4_f32(v_at + 16),
                    load_shared_v4_f32(u_at),
                    load_shared_v4_f32(u_at + 16),
                )
            };
            let v = [
                v_lo[0], v_lo[1], v_lo[2], v_lo[3], v_hi[0], v_hi[1], v_hi[2], v_hi[3],
            ];
            let w = [
                u_lo[0], u_lo[1], u_lo[2], u_lo[3], u_hi[0], u_hi[1], u_hi[2], u_hi[3],
            ];
            for i in 0..8 {
                for j in 0..8 {
                    acc[i][j] = fma_f32(v[i], w[j], acc[i][j]);
                }
            }
        }
        // The other stage was last read before the previous barrier.
        stash(1 - s, &next_tile, &next_filter);
        // SAFETY: reached by the whole block.
        unsafe { sync_threads() };
    }

    // Products to shared memory as `[16][WINOGRAD_OUT][WINOGRAD_TILES]` (every stage
    // was last read before the final barrier of the loop).
    let product_at =
        |xi: u32, k: u32, tile: u32| shared_base() + ((xi * WINOGRAD_OUT + k) * WINOGRAD_TILES + tile) * 4;
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
    for step in 0..WINOGRAD_TILES * WINOGRAD_OUT / WINOGRAD_THREADS {
        let pair = t + WINOGRAD_THREADS * step;
        let (tile, k) = (pair % WINOGRAD_TILES, pair / WINOGRAD_TILES);
        let (oy, ox) = (2 * tile_row, 2 * (segment * WINOGRAD_TILES + tile));
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
        for i in 0..2u32 {
            let y = output_rows([
                columns[0][i as usize],
                columns[1][i as usize],
                columns[2][i as usize],
                columns[3][i as usize],
            ]);
            for j in 0..2u32 {
                if oy + i < p.out_h && ox + j < p.out_w {
                    let at = plane + (oy + i) as u64 * p.out_w as u64 + (ox + j) as u64;
                    // SAFETY: (oy + i, ox + j) is inside the output plane.
                    unsafe { *output.add(at as usize) = y[j as usize] + offset };
                }
            }
        }
    }
}
