//! The weight gradient of convolutions with few input channels (a network's stem) on
//! the tensor cores, NHWC tensors of 16-bit values (`mma.sync` m16n8k16): `dw = dy^T
//! im2col(x)` over the batch's output pixels, with the forward kernel's K (window rows
//! of segments, `few_channels.rs`) as N and 64 output channels a block as M.
//!
//! A block takes the forward kernel's tiles of 4 x 32 output pixels in turn, staging
//! each tile's dy (its 64 channels, 16 bytes at a time) and the patch of x it reads;
//! each k-step multiplies 16 of the tile's pixels: A (16 output channels by 16 pixels)
//! by `ldmatrix.trans` from the staged dy, B (16 pixels by 8 columns of K) from the
//! patch, one 2-byte load per element at the pixel's offset plus the column's (the
//! forward kernel's table). A warp holds the products of every output channel of the
//! block and its share of K's columns over all its tiles, and writes them into the
//! block's part of the gradient (columns of K past the window or the channels
//! skipped); the parts are added in order by the split sum.

use super::few_channels::{FEW_THREADS, FEW_TILE_CHANNELS, FEW_TILE_COLUMNS, FEW_TILE_ROWS, FewChannelsPlan};
use super::reduce::{self, SplitSumArgs};
use super::{ConvLayout, ConvProblem};
use crate::launch::{
    DeviceLimits, DevicePtr, DevicePtrMut, Kernel, Launch, LaunchGeometry, ScratchLayout, kernel_args,
};

/// Pixels of a tile: the 16-pixel k-steps of a block's products.
const TILE_PIXELS: u32 = FEW_TILE_ROWS * FEW_TILE_COLUMNS;
/// Elements of a staged dy pixel: the block's 64 channels and 8 of padding, so that the
/// 8 rows of an `ldmatrix` fall on distinct banks.
const DY_ROW: u32 = FEW_TILE_CHANNELS + 8;

/// How the few-channel weight gradient runs: the forward plan's tiles and K, over
/// its `blocks` (one an SM at most) parts of the batch's tiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FewChannelsWeightGradPlan {
    pub forward: FewChannelsPlan,
}

impl FewChannelsWeightGradPlan {
    /// The plan of `problem`'s weight gradient over NHWC tensors, where the forward
    /// kernel takes the problem and the output channels come in whole 16-byte vectors.
    pub const fn new(problem: &ConvProblem, layout: ConvLayout, device: &DeviceLimits) -> Option<Self> {
        let Some(mut forward) = FewChannelsPlan::new(problem, layout, device, 2) else {
            return None;
        };
        if !problem.out_channels.is_multiple_of(8) {
            return None;
        }
        // A block an SM: its sums of 64 channels by up to 256 columns of K take 167
        // registers a thread.
        if forward.blocks > device.multiprocessors {
            forward.blocks = device.multiprocessors;
        }
        Some(Self { forward })
    }

    /// Elements of the weights, `[out, kh, kw, in]`.
    const fn weights(&self) -> u64 {
        let p = &self.forward.problem;
        p.out_channels as u64 * (p.kernel_h * p.kernel_w * p.in_channels) as u64
    }

    /// The scratch: a gradient per block along x, when there is more than one.
    pub const fn scratch(&self) -> ScratchLayout {
        reduce::partials_scratch(self.forward.blocks, self.weights())
    }

    /// The launch's geometry: the forward kernel's grid; the staged dy, the table of
    /// K's pairs, then the patch in shared memory.
    pub const fn geometry(&self) -> LaunchGeometry {
        let patch = self.shared_offsets()[1];
        let p = &self.forward;
        LaunchGeometry {
            grid: p.geometry().grid,
            threads: FEW_THREADS,
            shared_bytes: patch + p.patch_h * p.patch_w * p.pitch * 2,
        }
    }

    /// Shared-memory offsets of the table of K's pairs and of the patch.
    const fn shared_offsets(&self) -> [u32; 2] {
        let offsets = TILE_PIXELS * DY_ROW * 2;
        [offsets, offsets + self.forward.k_words() * 4]
    }

    /// The launches over x and dy of `T`: a gradient per block into `partials` (laid out
    /// by [`Self::scratch`]), or `dw` itself for one block, then their sum into `dw` in
    /// order. dy 16-byte aligned.
    pub fn launches<T: FewChannelsWeightGradKernel>(
        &self,
        x: DevicePtr<T>,
        dy: DevicePtr<T>,
        partials: DevicePtrMut<u8>,
        dw: DevicePtrMut<f32>,
    ) -> (Launch<FewChannelsWeightGradArgs<T>>, Option<Launch<SplitSumArgs>>) {
        let (out, sum) = reduce::split_outputs(self.forward.blocks, self.weights(), partials, dw);
        let args = FewChannelsWeightGradArgs {
            x,
            dy,
            out,
            plan: self.forward,
        };
        (Launch::new(T::WEIGHT_GRAD, self.geometry(), args), sum)
    }
}

kernel_args! {
    /// The few-channel weight gradient's arguments: a gradient per block into `out`
    /// (f32, `[out, kh, kw, in]` each), from x and dy of `T`, NHWC.
    pub struct FewChannelsWeightGradArgs<T> {
        pub x: DevicePtr<T>,
        pub dy: DevicePtr<T>,
        pub out: DevicePtrMut<f32>,
        pub plan: FewChannelsPlan,
    }
    impl FewChannelsWeightGradKernel for half::bf16 {
        const WEIGHT_GRAD = "conv_few_channels_weight_grad_nhwc_bf16" =>
            kernel::weight_grad::<half::bf16>, bounds(FEW_THREADS, 1);
    }
    impl FewChannelsWeightGradKernel for half::f16 {
        const WEIGHT_GRAD = "conv_few_channels_weight_grad_nhwc_f16" =>
            kernel::weight_grad::<half::f16>, bounds(FEW_THREADS, 1);
    }
    entry points in ENTRY_POINTS;
}

/// The few-channel weight-gradient kernel of a 16-bit element.
pub trait FewChannelsWeightGradKernel: Sized {
    const WEIGHT_GRAD: Kernel<FewChannelsWeightGradArgs<Self>>;
}

#[cfg(target_arch = "nvptx64")]
mod kernel {
    use super::*;
    use crate::conv::few_channels::FEW_MAX_K;
    use crate::conv::few_channels::kernel::{FewChannelsElement, stage_patch, stage_word_offsets};
    use crate::device::{
        block_idx_x, block_idx_y, grid_dim_x, load_global_nc_v4, load_matrix_x4_transposed, load_shared_u16,
        load_shared_u32, shared_base, store_shared_v4_f32, sync_threads, thread_idx_x,
    };

    /// Column tiles of K (8 columns each) a warp takes at most: every 8th.
    const MOST_COLUMN_TILES: usize = (FEW_MAX_K / 8 / 8) as usize;

    /// This block's part of the gradient: the table of K's pairs once, then per tile dy
    /// and the patch staged between two barriers and 8 k-steps of products; the sums
    /// stored once at the end.
    ///
    /// # Safety
    /// x and dy hold the plan's input and output tensors, NHWC, dy 16-byte aligned, the
    /// output channels a multiple of 8; `out` holds a gradient per block along x (or is
    /// the gradient for one); the launch is [`FewChannelsWeightGradPlan::launches`]'.
    #[inline(always)]
    pub unsafe fn weight_grad<T: FewChannelsElement>(args: FewChannelsWeightGradArgs<T>) {
        let plan = args.plan;
        let problem = &plan.problem;
        let t = thread_idx_x();
        let (lane, warp) = (t % 32, t / 32);
        let (g, q) = (lane / 4, lane % 4);
        let first_channel = block_idx_y() * FEW_TILE_CHANNELS;
        let dy_tile = shared_base();
        let offsets = dy_tile + TILE_PIXELS * DY_ROW * 2;
        let patch = offsets + plan.k_words() * 4;
        // SAFETY: the table's slots, each this thread's alone; read after the barrier
        // at the first tile.
        unsafe { stage_word_offsets::<T>(&plan, offsets) };
        // The warp's columns of K: tiles of 8, every 8th from the warp's.
        let column_tiles = plan.k / 8;
        let row_bytes = plan.patch_w * plan.pitch * 2;
        // The patch offset (bytes) of a tile's pixel `p` (row-major in the tile).
        let pixel_offset = |p: u32| {
            let (row, column) = (p / FEW_TILE_COLUMNS, p % FEW_TILE_COLUMNS);
            row * problem.stride_h * row_bytes + column * problem.stride_w * plan.pitch * 2
        };
        let (x, dy) = (args.x.as_ptr(), args.dy.as_ptr());
        let mut sums = [[[0.0f32; 4]; MOST_COLUMN_TILES]; 4];
        let mut tile = block_idx_x();
        while tile < plan.tiles {
            let [image, first_row, first_column] = plan.tile_origin(tile);
            // SAFETY: the whole block; the last tile's dy and patch were read before it.
            unsafe { sync_threads() };
            // dy of the tile's pixels, 8 channels a vector, zero past dy and its channels.
            let mut e = t;
            while e < TILE_PIXELS * FEW_TILE_CHANNELS / 8 {
                let (p, v) = (e / (FEW_TILE_CHANNELS / 8), e % (FEW_TILE_CHANNELS / 8));
                let (oh, ow) = (
                    first_row + p / FEW_TILE_COLUMNS,
                    first_column + p % FEW_TILE_COLUMNS,
                );
                let channel = first_channel + v * 8;
                let bits = if oh < problem.out_h && ow < problem.out_w && channel < problem.out_channels {
                    let pixel = (image as usize * problem.out_h as usize + oh as usize)
                        * problem.out_w as usize
                        + ow as usize;
                    // SAFETY: 8 channels of a pixel of dy (out_channels a multiple of
                    // 8), 16-byte aligned.
                    unsafe {
                        load_global_nc_v4(
                            dy.add(pixel * problem.out_channels as usize + channel as usize)
                                .cast(),
                        )
                    }
                } else {
                    [0; 4]
                };
                // SAFETY: vector v of staged pixel p, this thread's alone, 16-byte
                // aligned (rows of 144 bytes).
                unsafe { store_shared_v4_f32(dy_tile + (p * DY_ROW + v * 8) * 2, bits.map(f32::from_bits)) };
                e += FEW_THREADS;
            }
            // SAFETY: the patch's elements, each this thread's alone.
            unsafe { stage_patch(&plan, x, image, first_row, first_column, patch) };
            // SAFETY: the whole block; dy, the patch and the table are read after it.
            unsafe { sync_threads() };
            for step in 0..TILE_PIXELS / 16 {
                // A: output channels 16m.. by pixels 16 step..; lane l gives row l % 8 of
                // matrix l / 8: pixels 8 (l / 16) on, channels 8 (l / 8 % 2) on.
                let a: [[u32; 4]; 4] = core::array::from_fn(|m| {
                    let p = step * 16 + lane / 16 * 8 + lane % 8;
                    let element = p * DY_ROW + m as u32 * 16 + lane / 8 % 2 * 8;
                    // SAFETY: rows of the staged dy, 16-byte aligned, staged before the
                    // barrier.
                    unsafe { load_matrix_x4_transposed(dy_tile + element * 2) }
                });
                // B: pixels 2q, 2q + 1, 2q + 8, 2q + 9 of the step, column g of each of
                // the warp's column tiles.
                let pixels = [0, 1, 8, 9].map(|i| pixel_offset(step * 16 + 2 * q + i));
                for n in 0..MOST_COLUMN_TILES {
                    let column_tile = warp + 8 * n as u32;
                    if column_tile >= column_tiles {
                        break;
                    }
                    // SAFETY: a slot of the table, staged before the barrier.
                    let column =
                        unsafe { load_shared_u32(offsets + (column_tile * 4 + g / 2) * 4) } + (g % 2) * 2;
                    // SAFETY: patch elements inside it (the table keeps every window
                    // inside), staged before the barrier.
                    let element = |i: usize| unsafe { load_shared_u16(patch + pixels[i] + column) } as u32;
                    let b = [element(0) | element(1) << 16, element(2) | element(3) << 16];
                    for (m, sums) in sums.iter_mut().enumerate() {
                        sums[n] = T::mma(a[m], b, sums[n]);
                    }
                }
            }
            tile += grid_dim_x();
        }
        // Output channel 16m + g (+ 8) by columns 2q, 2q + 1 of each column tile: the
        // window's weights among them.
        let weights = problem.out_channels as usize
            * (problem.kernel_h * problem.kernel_w * problem.in_channels) as usize;
        let part = args
            .out
            .as_mut_ptr()
            .wrapping_add(block_idx_x() as usize * weights);
        for (m, sums) in sums.iter().enumerate() {
            for (n, sum) in sums.iter().enumerate() {
                let column_tile = warp + 8 * n as u32;
                if column_tile >= column_tiles {
                    break;
                }
                for (i, value) in sum.iter().enumerate() {
                    let channel = first_channel + m as u32 * 16 + g + (i as u32 / 2) * 8;
                    let column = column_tile * 8 + 2 * q + i as u32 % 2;
                    let (r, j) = plan.div_segment.divmod(column);
                    let (s, c) = plan.div_pitch.divmod(j);
                    if channel < problem.out_channels
                        && r < problem.kernel_h
                        && s < problem.kernel_w
                        && c < problem.in_channels
                    {
                        let at = ((channel * problem.kernel_h + r) * problem.kernel_w + s) as usize
                            * problem.in_channels as usize
                            + c as usize;
                        // SAFETY: weight `at` of this block's gradient, this thread's alone.
                        unsafe { *part.add(at) = *value };
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv::stem_problem;

    use crate::launch::H100;

    #[test]
    fn a_stem_sums_a_part_per_sm() {
        let plan =
            FewChannelsWeightGradPlan::new(&stem_problem(64), ConvLayout::Nhwc, &H100).expect("the stem's");
        assert_eq!((plan.forward.k, plan.forward.blocks), (160, 132));
        // 132 parts of 64 x 7 x 7 x 3 weights.
        assert_eq!(plan.scratch().bytes, 132 * 9408 * 4);
        // dy's 128 pixels of 72 elements, the table of 80 pairs, the 13 x 70 x 3 patch.
        assert_eq!(
            plan.geometry().shared_bytes,
            128 * 72 * 2 + 80 * 4 + 13 * 70 * 3 * 2
        );
        // dy is read 8 channels at a time.
        assert_eq!(
            FewChannelsWeightGradPlan::new(&stem_problem(66), ConvLayout::Nhwc, &H100),
            None
        );
    }
}
