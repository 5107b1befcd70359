//! The input gradient of convolutions with few input channels (a network's stem) on the
//! tensor cores, NHWC tensors of 16-bit values (`mma.sync` m16n8k16): `dx = dy` through
//! the window, transposed. The GEMM has an N of the few input channels (padded to 8),
//! and a K of the taps that reach a pixel times the output channels, whose taps depend
//! on the pixel's phase (its remainders by the stride).
//!
//! A block takes tiles of 4 x 32 pixels of every phase (the input's rectangle of `4
//! stride_h x 32 stride_w` pixels), stages once the patch of dy they read (whole pixels
//! of output channels, zero outside dy) and then each phase in turn: a warp takes 16
//! pixels of one row of the phase, and for each tap of the phase and each 16 output
//! channels one product of 16 x 8 x 16, its A (16 pixels of dy) by one `ldmatrix` from
//! the patch, its B (16 output channels of the tap, by 8 input channels) by another
//! from the weights, staged once per block as `[tap][in channel][out channel]`. Each
//! input pixel is summed by one thread in a fixed order (taps, then output channels)
//! and rounded once.

use super::few_channels::{FEW_MAX_CHANNELS, FEW_THREADS, FEW_TILE_COLUMNS, FEW_TILE_ROWS};
use super::{ConvLayout, ConvProblem, FastDiv};
use crate::launch::{DeviceLimits, DevicePtr, DevicePtrMut, Kernel, Launch, LaunchGeometry, kernel_args};

/// Blocks per SM: one stages its patch while the other multiplies.
pub const FEW_INPUT_GRAD_BLOCKS_PER_SM: u32 = 2;
/// Rows of B of a product: the input channels, padded.
const CHANNEL_ROWS: u32 = 8;
/// Elements of padding after each pixel of the patch and each row of the weights: the
/// 8 rows of an `ldmatrix` 16-byte aligned and on distinct banks.
const ROW_PADDING: u32 = 8;

/// How the few-channel input gradient runs.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FewChannelsInputGradPlan {
    /// The convolution.
    pub problem: ConvProblem,
    /// Output channels as staged: a multiple of 16.
    pub channels: u32,
    /// The patch's first dy row and column relative to a tile's first phase row and
    /// column (wrapping: negative where the window reaches above or left of it), and
    /// its rows and columns.
    pub patch_top: u32,
    pub patch_left: u32,
    pub patch_h: u32,
    pub patch_w: u32,
    /// Divide a patch's vectors by the vectors of a pixel, and pixels by the patch's
    /// columns; a weight's slot by the output channels and the input-channel rows.
    pub div_vectors: FastDiv,
    pub div_patch_w: FastDiv,
    pub div_channels: FastDiv,
    pub div_channel_rows: FastDiv,
    /// Tiles across the phases' columns and down their rows, and in all.
    pub div_column_tiles: FastDiv,
    pub div_row_tiles: FastDiv,
    pub tiles: u32,
    /// Blocks along grid x, each taking every `blocks`-th tile.
    pub blocks: u32,
}

/// A phase's taps along one axis: the first tap, how many, and the dy coordinate of
/// the phase's first pixel through the first tap (the others: one less per tap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PhaseTaps {
    pub first: u32,
    pub count: u32,
    pub base: u32,
}

/// The taps of phase `phase` (the remainder by `stride`) along an axis of a window of
/// `kernel` taps padded by `pad`: those at `(phase + pad) % stride`, every `stride`-th.
#[inline(always)]
pub const fn phase_taps(phase: u32, stride: u32, pad: u32, kernel: u32) -> PhaseTaps {
    let first = (phase + pad) % stride;
    let count = if first < kernel {
        (kernel - first).div_ceil(stride)
    } else {
        0
    };
    PhaseTaps {
        first,
        count,
        base: (phase + pad - first) / stride,
    }
}

/// The dy offsets, relative to a tile's first phase row (or column), that the taps of
/// every phase along an axis reach: the least and the greatest of the first pixel's
/// (the tile's other pixels reach up to `tile - 1` further).
const fn reach(stride: u32, pad: u32, kernel: u32) -> (i64, i64) {
    let (mut least, mut greatest) = (i64::MAX, i64::MIN);
    let mut phase = 0;
    while phase < stride {
        let taps = phase_taps(phase, stride, pad, kernel);
        if taps.count > 0 {
            let low = taps.base as i64 - (taps.count as i64 - 1);
            if low < least {
                least = low;
            }
            if (taps.base as i64) > greatest {
                greatest = taps.base as i64;
            }
        }
        phase += 1;
    }
    (least, greatest)
}

impl FewChannelsInputGradPlan {
    /// The plan of `problem`'s input gradient over NHWC tensors, when it has at most
    /// `FEW_MAX_CHANNELS` input channels, one group, no dilation, output channels in
    /// whole 16-byte vectors, and shared memory and grid that hold it.
    pub const fn new(problem: &ConvProblem, layout: ConvLayout, device: &DeviceLimits) -> Option<Self> {
        let p = problem;
        let fits = matches!(layout, ConvLayout::Nhwc)
            && p.groups == 1
            && p.in_channels <= FEW_MAX_CHANNELS
            && p.dilation_h == 1
            && p.dilation_w == 1
            && p.out_channels.is_multiple_of(8)
            && p.batch > 0;
        if !fits {
            return None;
        }
        let (top, bottom) = reach(p.stride_h, p.pad_h, p.kernel_h);
        let (left, right) = reach(p.stride_w, p.pad_w, p.kernel_w);
        let patch_h = (bottom - top) as u64 + FEW_TILE_ROWS as u64;
        let patch_w = (right - left) as u64 + FEW_TILE_COLUMNS as u64;
        let phase_rows = p.height.div_ceil(p.stride_h);
        let phase_columns = p.width.div_ceil(p.stride_w);
        let column_tiles = phase_columns.div_ceil(FEW_TILE_COLUMNS);
        let row_tiles = phase_rows.div_ceil(FEW_TILE_ROWS);
        let tiles = p.batch as u64 * row_tiles as u64 * column_tiles as u64;
        let channels = p.out_channels.next_multiple_of(16);
        if tiles >= 1 << 31 || patch_h * patch_w * (channels / 8) as u64 >= 1 << 31 {
            return None;
        }
        let mut plan = Self {
            problem: *p,
            channels,
            patch_top: top as u32,
            patch_left: left as u32,
            patch_h: patch_h as u32,
            patch_w: patch_w as u32,
            div_vectors: FastDiv::new(channels / 8),
            div_patch_w: FastDiv::new(patch_w as u32),
            div_channels: FastDiv::new(channels),
            div_channel_rows: FastDiv::new(CHANNEL_ROWS),
            div_column_tiles: FastDiv::new(column_tiles),
            div_row_tiles: FastDiv::new(row_tiles),
            tiles: tiles as u32,
            blocks: 0,
        };
        let wanted = device.multiprocessors as u64 * FEW_INPUT_GRAD_BLOCKS_PER_SM as u64;
        plan.blocks = if wanted < tiles {
            wanted as u32
        } else {
            tiles as u32
        };
        let shared = plan.shared_offset() as u64 + patch_h * patch_w * plan.row() as u64 * 2;
        if shared > device.max_shared_bytes_per_block as u64 {
            return None;
        }
        Some(plan)
    }

    /// Elements of a staged pixel of dy, or of a staged weight row (one input channel
    /// of a tap): the output channels and their padding.
    const fn row(&self) -> u32 {
        self.channels + ROW_PADDING
    }

    /// The patch's offset in shared memory: after the weights, a row per tap and
    /// input-channel row.
    const fn shared_offset(&self) -> u32 {
        self.problem.kernel_h * self.problem.kernel_w * CHANNEL_ROWS * self.row() * 2
    }

    /// The launch: `blocks` along x; the weights, then the patch in shared memory.
    pub const fn geometry(&self) -> LaunchGeometry {
        LaunchGeometry {
            grid: [self.blocks as u64, 1, 1],
            threads: FEW_THREADS,
            shared_bytes: self.shared_offset() + self.patch_h * self.patch_w * self.row() * 2,
        }
    }

    /// The input-gradient launch: `dx` from dy and w, NHWC tensors of `T` (w as `[out,
    /// kh, kw, in]`), dy 16-byte aligned.
    pub fn launch<T: FewChannelsInputGradKernel>(
        &self,
        dy: DevicePtr<T>,
        w: DevicePtr<T>,
        dx: DevicePtrMut<T>,
    ) -> Launch<FewChannelsInputGradArgs<T>> {
        let args = FewChannelsInputGradArgs {
            dy,
            w,
            dx,
            plan: *self,
        };
        Launch::new(T::INPUT_GRAD, self.geometry(), args)
    }
}

kernel_args! {
    /// The few-channel input gradient's arguments: dx from dy and w, all of `T`, NHWC.
    pub struct FewChannelsInputGradArgs<T> {
        pub dy: DevicePtr<T>,
        pub w: DevicePtr<T>,
        pub dx: DevicePtrMut<T>,
        pub plan: FewChannelsInputGradPlan,
    }
    impl FewChannelsInputGradKernel for half::bf16 {
        const INPUT_GRAD = "conv_few_channels_input_grad_nhwc_bf16" =>
            kernel::input_grad::<half::bf16>, bounds(FEW_THREADS, FEW_INPUT_GRAD_BLOCKS_PER_SM);
    }
    impl FewChannelsInputGradKernel for half::f16 {
        const INPUT_GRAD = "conv_few_channels_input_grad_nhwc_f16" =>
            kernel::input_grad::<half::f16>, bounds(FEW_THREADS, FEW_INPUT_GRAD_BLOCKS_PER_SM);
    }
    entry points in ENTRY_POINTS;
}

/// The few-channel input-gradient kernel of a 16-bit element.
pub trait FewChannelsInputGradKernel: Sized {
    const INPUT_GRAD: Kernel<FewChannelsInputGradArgs<Self>>;
}

#[cfg(target_arch = "nvptx64")]
mod kernel {
    use super::*;
    use crate::conv::few_channels::kernel::FewChannelsElement;
    use crate::device::{
        Float16, block_idx_x, grid_dim_x, load_global_nc_v4, load_matrix_x2, load_matrix_x4, shared_base,
        store_shared_u16, store_shared_v4_f32, sync_threads, thread_idx_x,
    };

    /// The block stages the weights once, then takes its tiles: the patch of dy staged
    /// between two barriers, then each phase's products and stores.
    ///
    /// # Safety
    /// dy, w and dx hold the plan's tensors, NHWC, dy 16-byte aligned; the launch is
    /// [`FewChannelsInputGradPlan::launch`]'s.
    #[inline(always)]
    pub unsafe fn input_grad<T: FewChannelsElement + Float16>(args: FewChannelsInputGradArgs<T>) {
        let plan = args.plan;
        let problem = &plan.problem;
        let t = thread_idx_x();
        let (lane, warp) = (t % 32, t / 32);
        let (g, q) = (lane / 4, lane % 4);
        // A warp's 16 pixels: a row of the phase's tile, and its half of the columns.
        let (warp_row, warp_column) = (warp % FEW_TILE_ROWS, warp / FEW_TILE_ROWS * 16);
        let row = plan.row();
        let weights = shared_base();
        let patch = weights + plan.shared_offset();
        let taps = problem.kernel_h * problem.kernel_w;

        // Weight (tap, input channel, output channel), zero past the channels.
        let w = args.w.as_ptr();
        let mut e = t;
        while e < taps * CHANNEL_ROWS * plan.channels {
            let (slot, o) = plan.div_channels.divmod(e);
            let (tap, i) = plan.div_channel_rows.divmod(slot);
            let bits = if i < problem.in_channels && o < problem.out_channels {
                // SAFETY: an element of the filter, `[out, kh, kw, in]`.
                unsafe {
                    (*w.add((o * taps + tap) as usize * problem.in_channels as usize + i as usize)).to_bits()
                }
            } else {
                0
            };
            // SAFETY: weight slot (tap, i, o), this thread's alone.
            unsafe { store_shared_u16(weights + (slot * row + o) * 2, bits) };
            e += FEW_THREADS;
        }

        let (dy, dx) = (args.dy.as_ptr(), args.dx.as_mut_ptr());
        let vectors = plan.div_vectors.divisor;
        let patch_vectors = plan.patch_h * plan.patch_w * vectors;
        let mut tile = block_idx_x();
        while tile < plan.tiles {
            let (rest, column_tile) = plan.div_column_tiles.divmod(tile);
            let (image, row_tile) = plan.div_row_tiles.divmod(rest);
            let (first_row, first_column) = (row_tile * FEW_TILE_ROWS, column_tile * FEW_TILE_COLUMNS);
            let top = first_row.wrapping_add(plan.patch_top);
            let left = first_column.wrapping_add(plan.patch_left);
            // SAFETY: the whole block; the last tile's patch (or the weights) were read
            // or written before it.
            unsafe { sync_threads() };
            // The patch of dy, 8 output channels a vector, zero outside dy and past its
            // channels.
            let mut e = t;
            while e < patch_vectors {
                let (pixel, v) = plan.div_vectors.divmod(e);
                let (r, c) = plan.div_patch_w.divmod(pixel);
                let (oh, ow) = (top.wrapping_add(r), left.wrapping_add(c));
                let bits = if oh < problem.out_h && ow < problem.out_w && v * 8 < problem.out_channels {
                    let at = ((image as usize * problem.out_h as usize + oh as usize)
                        * problem.out_w as usize
                        + ow as usize)
                        * problem.out_channels as usize
                        + v as usize * 8;
                    // SAFETY: 8 elements of a pixel of dy (out_channels a multiple of 8),
                    // 16-byte aligned.
                    unsafe { load_global_nc_v4(dy.add(at).cast()) }
                } else {
                    [0; 4]
                };
                // SAFETY: vector v of patch pixel (r, c), this thread's alone; rows of
                // `row` elements keep it 16-byte aligned.
                unsafe { store_shared_v4_f32(patch + (pixel * row + v * 8) * 2, bits.map(f32::from_bits)) };
                e += FEW_THREADS;
            }
            // SAFETY: the whole block; the patch is read after it.
            unsafe { sync_threads() };
            for phase_h in 0..problem.stride_h {
                let rows = phase_taps(phase_h, problem.stride_h, problem.pad_h, problem.kernel_h);
                for phase_w in 0..problem.stride_w {
                    let columns = phase_taps(phase_w, problem.stride_w, problem.pad_w, problem.kernel_w);
                    // This lane's `ldmatrix` row of A: pixel `lane % 16` of the warp's,
                    // channels `8 (lane / 16)` on; at tap (u, v) of the phase, dy pixel
                    // (base - u, base - v) from it.
                    let pixel_row = rows.base + first_row + warp_row - top;
                    let pixel_column = columns.base + first_column + warp_column + lane % 16 - left;
                    let a_lane =
                        patch + ((pixel_row * plan.patch_w + pixel_column) * row + lane / 16 * 8) * 2;
                    // And of B: input channel `lane % 8`, output channels `8 (lane / 8 %
                    // 2)` on (lanes 16 and up give unused addresses of the same rows).
                    let b_lane = weights + ((lane % 8) * row + lane / 8 % 2 * 8) * 2;
                    let mut sum = [0.0f32; 4];
                    for u in 0..rows.count {
                        for v in 0..columns.count {
                            let tap = (rows.first + u * problem.stride_h) * problem.kernel_w
                                + columns.first
                                + v * problem.stride_w;
                            let a_tap = a_lane - ((u * plan.patch_w + v) * row) * 2;
                            let b_tap = b_lane + tap * CHANNEL_ROWS * row * 2;
                            for chunk in 0..plan.channels / 16 {
                                // SAFETY: rows of the patch and of the weights, staged
                                // before the barrier, 16-byte aligned.
                                let (a, b) = unsafe {
                                    (
                                        load_matrix_x4(a_tap + chunk * 32),
                                        load_matrix_x2(b_tap + chunk * 32),
                                    )
                                };
                                sum = T::mma(a, b, sum);
                            }
                        }
                    }
                    // Rows g and g + 8 of the warp's pixels, input channels 2q and 2q + 1.
                    let ih = phase_h + (first_row + warp_row) * problem.stride_h;
                    for half in 0..2 {
                        let iw = phase_w + (first_column + warp_column + g + half * 8) * problem.stride_w;
                        if ih >= problem.height || iw >= problem.width {
                            continue;
                        }
                        let pixel = (image as usize * problem.height as usize + ih as usize)
                            * problem.width as usize
                            + iw as usize;
                        for k in 0..2 {
                            let channel = 2 * q + k;
                            if channel < problem.in_channels {
                                let at = pixel * problem.in_channels as usize + channel as usize;
                                // SAFETY: an element of dx, this thread's alone.
                                unsafe { *dx.add(at) = T::from_f32(sum[2 * half as usize + k as usize]) };
                            }
                        }
                    }
                }
            }
            tile += grid_dim_x();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv::stem_problem;

    use crate::launch::H100;

    #[test]
    fn phases_take_every_stride_th_tap() {
        // A 7-tap window padded by 3 at stride 2: even pixels take taps 1, 3, 5 (the
        // first from dy pixel 1 on), odd ones 0, 2, 4, 6 (from pixel 2 on).
        assert_eq!(
            phase_taps(0, 2, 3, 7),
            PhaseTaps {
                first: 1,
                count: 3,
                base: 1
            }
        );
        assert_eq!(
            phase_taps(1, 2, 3, 7),
            PhaseTaps {
                first: 0,
                count: 4,
                base: 2
            }
        );
        // A 1-tap window at stride 2: odd pixels take none.
        assert_eq!(phase_taps(1, 2, 0, 1).count, 0);
        assert_eq!(reach(2, 3, 7), (-1, 2));
    }

    #[test]
    fn a_stem_stages_a_patch_of_dy_for_every_phase() {
        let stem = stem_problem(64);
        let plan = FewChannelsInputGradPlan::new(&stem, ConvLayout::Nhwc, &H100).expect("the stem's");
        // dy rows from one above the tile's first phase row to two below its last.
        assert_eq!((plan.patch_top as i32, plan.patch_h, plan.patch_w), (-1, 7, 35));
        assert_eq!((plan.channels, plan.tiles, plan.blocks), (64, 32 * 28 * 4, 264));
        assert_eq!(plan.geometry().shared_bytes, (49 * 8 + 7 * 35) * 72 * 2);
        assert_eq!(
            FewChannelsInputGradPlan::new(&stem, ConvLayout::Nchw, &H100),
            None
        );
    }
}
