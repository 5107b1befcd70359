//! The forward pass of convolutions with few input channels (a network's stem: 3 of
//! them) on the tensor cores, NHWC tensors of 16-bit values (`mma.sync` m16n8k16) or of
//! f32 rounded to TF32 (m16n8k8), sm_80 and up. The implicit GEMM's K of `taps * channels` is small (147 for a 7 x 7
//! window over 3 channels), and the general kernels, whose k-tiles hold 64 channels of
//! one tap, would gather it element by element; this one stages the input patch of a
//! tile of outputs in shared memory once and reads its GEMM rows from there.
//!
//! K runs over the window's rows, each a *segment* of `kernel_w * pitch` elements
//! rounded up to a whole 4-byte word: for one output pixel, the elements of a window
//! row lie consecutive in an NHWC patch (columns, then channels), so each word of K (a
//! pair of 16-bit elements, or one f32) is one 4-byte shared load at the pixel's offset
//! plus the word's (a table of those, one per word of K). Both products take 8 words of
//! K a step. The patch stores `pitch` elements per pixel, the input channels or, in 16
//! bits, one more where an odd count at an odd stride would put some pixels' windows at
//! odd elements; the weights are staged once per block as `[channel][K]`, zero past the
//! window, the channels and K (f32 rounded to TF32 on the way, as the patch). A block takes tiles of 4 x 32 output pixels by 64 output
//! channels in turn (a warp per tile row and half of the channels: 2 x 4 tiles of 16 x
//! 8), staging each tile's patch between two barriers, and writes each output once:
//! its sum plus the bias, through the epilogue (rounded to the 16-bit type).

use super::{ConvEpilogue, ConvLayout, ConvProblem, FastDiv};
use crate::launch::{DeviceLimits, DevicePtr, DevicePtrMut, Kernel, Launch, LaunchGeometry, kernel_args};

/// Threads per block: 8 warps, 4 along the tile's rows by 2 along its channels.
pub const FEW_THREADS: u32 = 256;
/// Output rows of a tile: a warp each.
pub const FEW_TILE_ROWS: u32 = 4;
/// Output columns of a tile: the 32 GEMM rows of a warp (two m16 tiles).
pub const FEW_TILE_COLUMNS: u32 = 32;
/// Output channels of a tile (grid y): 32 per warp (four n8 tiles).
pub const FEW_TILE_CHANNELS: u32 = 64;
/// Input channels up to which the kernel takes a convolution.
pub const FEW_MAX_CHANNELS: u32 = 4;
/// Most of K (window rows times segment, rounded up to a step): 33 KiB of staged 16-bit
/// weights, 66 KiB of f32.
pub const FEW_MAX_K: u32 = 256;
/// Words of K (4 bytes: two 16-bit elements or one f32) of each product.
const WORDS_PER_STEP: u32 = 8;
/// Most bytes of a block's shared memory (weights, offsets and patch), so that
/// `FEW_BLOCKS_PER_SM` blocks fit an SM.
const FEW_MAX_SHARED_BYTES: u32 = 96 * 1024;
/// Blocks per SM: one stages its patch while the other multiplies.
pub const FEW_BLOCKS_PER_SM: u32 = 2;
/// Bytes of padding after each staged weight row: rows 16-byte aligned, and the 8 rows
/// of an `ldmatrix` on distinct banks.
const WEIGHT_ROW_PADDING_BYTES: u32 = 16;

/// How the few-channel kernel runs a forward pass.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FewChannelsPlan {
    /// The convolution.
    pub problem: ConvProblem,
    /// Bytes of an element: 2, or 4 (f32, staged as TF32).
    pub element_bytes: u32,
    /// Elements per pixel of the staged patch.
    pub pitch: u32,
    /// K: window rows times segment, rounded up to a step of `WORDS_PER_STEP` words.
    pub k: u32,
    /// Rows of the patch, and its pixels per row (even).
    pub patch_h: u32,
    pub patch_w: u32,
    /// Divide K by the segment (window row, element), an element of a segment by the
    /// pitch (window column, channel), a staged weight by K (channel, K), and a patch
    /// element by a patch row's elements (row, element).
    pub div_segment: FastDiv,
    pub div_pitch: FastDiv,
    pub div_k: FastDiv,
    pub div_patch_row: FastDiv,
    /// Tiles across the output's columns and down its rows, and in all.
    pub div_column_tiles: FastDiv,
    pub div_row_tiles: FastDiv,
    pub tiles: u32,
    /// Blocks along grid x, each taking every `blocks`-th tile.
    pub blocks: u32,
}

impl FewChannelsPlan {
    /// The plan of `problem`'s forward pass over NHWC tensors of `element_bytes`-byte
    /// elements (2, or 4 for f32 as TF32), when it has at most `FEW_MAX_CHANNELS` input
    /// channels, one group, no dilation, an even number of output channels (stored in
    /// pairs), a K of at most `FEW_MAX_K`, and shared memory and grid that hold it.
    pub const fn new(
        problem: &ConvProblem,
        layout: ConvLayout,
        device: &DeviceLimits,
        element_bytes: u32,
    ) -> Option<Self> {
        let p = problem;
        let fits = matches!(layout, ConvLayout::Nhwc)
            && (element_bytes == 2 || element_bytes == 4)
            && p.groups == 1
            && p.in_channels <= FEW_MAX_CHANNELS
            && p.dilation_h == 1
            && p.dilation_w == 1
            && p.out_channels.is_multiple_of(2)
            && p.batch > 0
            && p.out_h > 0
            && p.out_w > 0;
        if !fits {
            return None;
        }
        // 16-bit windows start `stride_w * pitch` elements apart: even, or the pitch is.
        let per_word = 4 / element_bytes;
        let pitch = if (p.stride_w * p.in_channels).is_multiple_of(per_word) {
            p.in_channels
        } else {
            p.in_channels + 1
        };
        let segment = (p.kernel_w * pitch).next_multiple_of(per_word);
        let k = (p.kernel_h * segment).next_multiple_of(WORDS_PER_STEP * per_word);
        // A tile's windows reach `segment / pitch` pixels past its last column's start.
        let patch_h = (FEW_TILE_ROWS - 1) * p.stride_h + p.kernel_h;
        let patch_w = ((FEW_TILE_COLUMNS - 1) * p.stride_w + segment.div_ceil(pitch)).next_multiple_of(2);
        let column_tiles = p.out_w.div_ceil(FEW_TILE_COLUMNS);
        let row_tiles = p.out_h.div_ceil(FEW_TILE_ROWS);
        let tiles = p.batch as u64 * row_tiles as u64 * column_tiles as u64;
        let patch_elements = patch_h as u64 * patch_w as u64 * pitch as u64;
        if k > FEW_MAX_K || tiles >= 1 << 31 || patch_elements >= 1 << 31 {
            return None;
        }
        let mut plan = Self {
            problem: *p,
            element_bytes,
            pitch,
            k,
            patch_h,
            patch_w,
            div_segment: FastDiv::new(segment),
            div_pitch: FastDiv::new(pitch),
            div_k: FastDiv::new(k),
            div_patch_row: FastDiv::new(patch_w * pitch),
            div_column_tiles: FastDiv::new(column_tiles),
            div_row_tiles: FastDiv::new(row_tiles),
            tiles: tiles as u32,
            blocks: 0,
        };
        let shared = plan.shared_bytes();
        let wanted = device.multiprocessors as u64 * FEW_BLOCKS_PER_SM as u64;
        plan.blocks = if wanted < tiles {
            wanted as u32
        } else {
            tiles as u32
        };
        let channel_tiles = p.out_channels.div_ceil(FEW_TILE_CHANNELS);
        if shared > FEW_MAX_SHARED_BYTES
            || shared > device.max_shared_bytes_per_block
            || channel_tiles > 65535
        {
            return None;
        }
        Some(plan)
    }

    /// The image of tile `tile` (image, row of tiles, column of tiles, in that
    /// order) and its first output row and column.
    #[inline(always)]
    pub const fn tile_origin(&self, tile: u32) -> [u32; 3] {
        let (rest, column_tile) = self.div_column_tiles.divmod(tile);
        let (image, row_tile) = self.div_row_tiles.divmod(rest);
        [image, row_tile * FEW_TILE_ROWS, column_tile * FEW_TILE_COLUMNS]
    }

    /// Words (4 bytes) of K.
    pub const fn k_words(&self) -> u32 {
        self.k * self.element_bytes / 4
    }

    /// Bytes of a staged weight row: K and its padding.
    const fn weight_row_bytes(&self) -> u32 {
        self.k * self.element_bytes + WEIGHT_ROW_PADDING_BYTES
    }

    /// Shared-memory offsets of the staged weights' end (the word offsets' start) and
    /// of the patch.
    const fn shared_offsets(&self) -> [u32; 2] {
        let offsets = FEW_TILE_CHANNELS * self.weight_row_bytes();
        [offsets, offsets + self.k_words() * 4]
    }

    /// Bytes of shared memory: the weights, a 4-byte offset per word of K, the patch.
    const fn shared_bytes(&self) -> u32 {
        self.shared_offsets()[1] + self.patch_h * self.patch_w * self.pitch * self.element_bytes
    }

    /// The launch: `blocks` along x, the tiles of 64 output channels along y.
    pub const fn geometry(&self) -> LaunchGeometry {
        LaunchGeometry {
            grid: [
                self.blocks as u64,
                self.problem.out_channels.div_ceil(FEW_TILE_CHANNELS) as u64,
                1,
            ],
            threads: FEW_THREADS,
            shared_bytes: self.shared_bytes(),
        }
    }

    /// The forward launch: `y = epilogue(conv(x, w))`, NHWC tensors of `T` (w as
    /// `[out, kh, kw, in]`), the bias f32; a plan for `T`'s size.
    pub fn launch<T: FewChannelsKernel>(
        &self,
        x: DevicePtr<T>,
        w: DevicePtr<T>,
        epilogue: ConvEpilogue,
        y: DevicePtrMut<T>,
    ) -> Launch<FewChannelsArgs<T>> {
        let args = FewChannelsArgs {
            x,
            w,
            epilogue,
            y,
            plan: *self,
        };
        Launch::new(T::FORWARD, self.geometry(), args)
    }
}

kernel_args! {
    /// The few-channel kernel's arguments: `y = epilogue(conv(x, w))`, x, w and y of
    /// `T`, NHWC.
    pub struct FewChannelsArgs<T> {
        pub x: DevicePtr<T>,
        pub w: DevicePtr<T>,
        pub epilogue: ConvEpilogue,
        pub y: DevicePtrMut<T>,
        pub plan: FewChannelsPlan,
    }
    impl FewChannelsKernel for half::bf16 {
        const FORWARD = "conv_few_channels_nhwc_bf16" =>
            kernel::forward::<half::bf16>, bounds(FEW_THREADS, FEW_BLOCKS_PER_SM);
    }
    impl FewChannelsKernel for half::f16 {
        const FORWARD = "conv_few_channels_nhwc_f16" =>
            kernel::forward::<half::f16>, bounds(FEW_THREADS, FEW_BLOCKS_PER_SM);
    }
    impl FewChannelsKernel for f32 {
        const FORWARD = "conv_few_channels_nhwc_tf32" =>
            kernel::forward::<f32>, bounds(FEW_THREADS, FEW_BLOCKS_PER_SM);
    }
    entry points in ENTRY_POINTS;
}

/// The few-channel forward kernel of an element: 16-bit, or f32 as TF32.
pub trait FewChannelsKernel: Sized {
    const FORWARD: Kernel<FewChannelsArgs<Self>>;
}

#[cfg(target_arch = "nvptx64")]
pub(super) mod kernel {
    use super::*;
    use crate::conv::tensor_core::Output;
    use crate::device::{
        block_idx_x, block_idx_y, grid_dim_x, load_matrix_x4, load_shared_u32, mma_bf16_16x8x16,
        mma_f16_16x8x16, mma_tf32_16x8x8, shared_base, store_shared_f32, store_shared_u16, sync_threads,
        thread_idx_x, to_tf32,
    };

    /// The element types of the kernel: how they are staged, and their tensor-core
    /// product of 8 words of K (16 16-bit elements, or 8 TF32).
    pub trait FewChannelsElement: Output {
        /// Bytes of an element, staged.
        const BYTES: u32;
        /// The element as the tensor cores take it (TF32 for f32), in its low bits.
        fn staged_bits(self) -> u32;
        /// Stores staged bits at a shared address aligned to `BYTES`.
        ///
        /// # Safety
        /// `address` is inside the launch's shared memory, and no other thread
        /// accesses it before the next barrier.
        unsafe fn store_staged(address: u32, bits: u32);
        fn mma(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4];
    }

    macro_rules! sixteen_bit_element {
        ($($t:ty => $mma:ident;)*) => {$(
            impl FewChannelsElement for $t {
                const BYTES: u32 = 2;
                #[inline(always)]
                fn staged_bits(self) -> u32 {
                    self.to_bits() as u32
                }
                #[inline(always)]
                unsafe fn store_staged(address: u32, bits: u32) {
                    // SAFETY: the caller's contract.
                    unsafe { store_shared_u16(address, bits as u16) };
                }
                #[inline(always)]
                fn mma(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
                    $mma(a, b, c)
                }
            }
        )*};
    }

    sixteen_bit_element! {
        half::bf16 => mma_bf16_16x8x16;
        half::f16 => mma_f16_16x8x16;
    }

    impl FewChannelsElement for f32 {
        const BYTES: u32 = 4;
        #[inline(always)]
        fn staged_bits(self) -> u32 {
            to_tf32(self)
        }
        #[inline(always)]
        unsafe fn store_staged(address: u32, bits: u32) {
            // SAFETY: the caller's contract.
            unsafe { store_shared_f32(address, f32::from_bits(bits)) };
        }
        #[inline(always)]
        fn mma(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
            mma_tf32_16x8x8(a, b, c)
        }
    }

    /// Stores the patch offset (bytes) of each word of K at `offsets`, by the block's
    /// threads in turn: 0 for K's padding, whose weights (or products) are unused.
    ///
    /// # Safety
    /// `offsets` is the shared-memory table of the plan's `k_words` words, which no
    /// other thread accesses before the next barrier; the plan is for `T`'s size.
    #[inline(always)]
    pub unsafe fn stage_word_offsets<T: FewChannelsElement>(plan: &FewChannelsPlan, offsets: u32) {
        let per_word = 4 / T::BYTES;
        let mut e = thread_idx_x();
        while e < plan.k_words() {
            let (r, j) = plan.div_segment.divmod(per_word * e);
            let offset = if r < plan.problem.kernel_h {
                r * plan.patch_w * plan.pitch + j
            } else {
                0
            };
            // SAFETY: slot e of the table, this thread's alone.
            unsafe { store_shared_f32(offsets + e * 4, f32::from_bits(offset * T::BYTES)) };
            e += FEW_THREADS;
        }
    }

    /// Stores at `patch`, by the block's threads in turn, the input patch of the tile
    /// of `image` whose first output is (`first_row`, `first_column`): `patch_h` rows of
    /// `patch_w` pixels of `pitch` elements, zero outside x and past its channels.
    ///
    /// # Safety
    /// `x` holds the plan's input, NHWC; `patch` is the plan's patch in shared memory,
    /// which no other thread accesses before the next barrier.
    #[inline(always)]
    pub unsafe fn stage_patch<T: FewChannelsElement>(
        plan: &FewChannelsPlan,
        x: *const T,
        image: u32,
        first_row: u32,
        first_column: u32,
        patch: u32,
    ) {
        let problem = &plan.problem;
        let top = (first_row * problem.stride_h).wrapping_sub(problem.pad_h);
        let left = (first_column * problem.stride_w).wrapping_sub(problem.pad_w);
        let mut e = thread_idx_x();
        while e < plan.patch_h * plan.div_patch_row.divisor {
            let (r, element) = plan.div_patch_row.divmod(e);
            let (column, i) = plan.div_pitch.divmod(element);
            let (ih, iw) = (top.wrapping_add(r), left.wrapping_add(column));
            let bits = if ih < problem.height && iw < problem.width && i < problem.in_channels {
                let pixel = (image as usize * problem.height as usize + ih as usize) * problem.width as usize
                    + iw as usize;
                // SAFETY: an element of x inside the image.
                unsafe { (*x.add(pixel * problem.in_channels as usize + i as usize)).staged_bits() }
            } else {
                0
            };
            // SAFETY: element e of the patch, this thread's alone.
            unsafe { T::store_staged(patch + e * T::BYTES, bits) };
            e += FEW_THREADS;
        }
    }

    /// The block stages its 64 channels' weights and the offset of each word of K,
    /// then takes its tiles: the patch staged, 2 x 4 products of 16 x 8 per warp and
    /// k-step, each output stored once.
    ///
    /// # Safety
    /// x, w and y (and the epilogue's bias and residual) hold the plan's tensors, NHWC,
    /// y aligned to two elements; the plan is for `T`'s size and the launch is
    /// [`FewChannelsPlan::launch`]'s.
    #[inline(always)]
    pub unsafe fn forward<T: FewChannelsElement>(args: FewChannelsArgs<T>) {
        let plan = args.plan;
        let problem = &plan.problem;
        let t = thread_idx_x();
        let (lane, warp) = (t % 32, t / 32);
        let (g, q) = (lane / 4, lane % 4);
        let (warp_row, warp_channels) = (warp % FEW_TILE_ROWS, warp / FEW_TILE_ROWS);
        let first_channel = block_idx_y() * FEW_TILE_CHANNELS;
        let weight_row_bytes = plan.weight_row_bytes();
        let weights = shared_base();
        let [offsets, patch] = plan.shared_offsets().map(|offset| weights + offset);

        // Weight (channel, K element): window row, then column and channel of the
        // segment; zero past the window, the channels and K.
        let w = args.w.as_ptr();
        let mut e = t;
        while e < FEW_TILE_CHANNELS * plan.k {
            let (c, element) = plan.div_k.divmod(e);
            let (r, j) = plan.div_segment.divmod(element);
            let (s, i) = plan.div_pitch.divmod(j);
            let channel = first_channel + c;
            let inside = channel < problem.out_channels && r < problem.kernel_h && s < problem.kernel_w;
            let bits = if inside && i < problem.in_channels {
                let at = ((channel * problem.kernel_h + r) * problem.kernel_w + s) * problem.in_channels + i;
                // SAFETY: an element of the filter, `[out, kh, kw, in]`.
                unsafe { (*w.add(at as usize)).staged_bits() }
            } else {
                0
            };
            // SAFETY: slot (c, element) of the staged weights, this thread's alone.
            unsafe { T::store_staged(weights + c * weight_row_bytes + element * T::BYTES, bits) };
            e += FEW_THREADS;
        }
        // SAFETY: the table's slots, each this thread's alone; read after the barrier at
        // the first tile.
        unsafe { stage_word_offsets::<T>(&plan, offsets) };
        // This thread's GEMM rows in the patch (bytes): the warp's tile row, columns g
        // and g + 8 of each m16 tile.
        let pixel_bytes = plan.pitch * T::BYTES;
        let row_bytes = plan.patch_w * pixel_bytes;
        let rows: [[u32; 2]; 2] = core::array::from_fn(|m| {
            core::array::from_fn(|half| {
                let column = m as u32 * 16 + half as u32 * 8 + g;
                warp_row * problem.stride_h * row_bytes + column * problem.stride_w * pixel_bytes
            })
        });
        // The bias of this thread's output channels (two per n8 tile).
        let bias = args.epilogue.bias.as_ptr();
        let channel_of = |n: usize| first_channel + warp_channels * 32 + n as u32 * 8 + 2 * q;
        let biases: [[f32; 2]; 4] = core::array::from_fn(|n| {
            core::array::from_fn(|k| {
                let channel = channel_of(n) + k as u32;
                if bias.is_null() || channel >= problem.out_channels {
                    0.0
                } else {
                    // SAFETY: the bias holds out_channels values.
                    unsafe { *bias.add(channel as usize) }
                }
            })
        });
        let (x, y) = (args.x.as_ptr(), args.y.as_mut_ptr());
        let mut tile = block_idx_x();
        while tile < plan.tiles {
            let [image, first_row, first_column] = plan.tile_origin(tile);
            // SAFETY: the whole block; the last tile's patch (or the weights and
            // offsets) were read or written before it.
            unsafe { sync_threads() };
            // SAFETY: the patch's elements, each this thread's alone.
            unsafe { stage_patch(&plan, x, image, first_row, first_column, patch) };
            // SAFETY: the whole block; the patch is read after it.
            unsafe { sync_threads() };
            let mut sums = [[[0.0f32; 4]; 4]; 2];
            for step in 0..plan.k_words() / WORDS_PER_STEP {
                let word = step * WORDS_PER_STEP + q;
                // SAFETY (all shared loads): offsets written before the first barrier,
                // patch elements inside it (the offsets keep every window inside), and
                // weight rows of the block's channels; `ldmatrix` rows 16-byte aligned.
                let (low, high) = unsafe {
                    (
                        load_shared_u32(offsets + word * 4),
                        load_shared_u32(offsets + (word + 4) * 4),
                    )
                };
                let a: [[u32; 4]; 2] = core::array::from_fn(|m| {
                    let [top_row, bottom_row] = rows[m].map(|row| patch + row);
                    unsafe {
                        [
                            load_shared_u32(top_row + low),
                            load_shared_u32(bottom_row + low),
                            load_shared_u32(top_row + high),
                            load_shared_u32(bottom_row + high),
                        ]
                    }
                });
                let mut b = [[0u32; 2]; 4];
                for pair_of_tiles in 0..2 {
                    // Matrices of 8 channels by 16 bytes of K: the step's first half, then
                    // its second.
                    let matrix = lane / 8;
                    let channel = warp_channels * 32 + (pair_of_tiles * 2 + matrix / 2) * 8 + lane % 8;
                    let at = channel * weight_row_bytes + step * WORDS_PER_STEP * 4 + (matrix % 2) * 16;
                    let [b0, b1, b2, b3] = unsafe { load_matrix_x4(weights + at) };
                    b[pair_of_tiles as usize * 2] = [b0, b1];
                    b[pair_of_tiles as usize * 2 + 1] = [b2, b3];
                }
                for (m, sums) in sums.iter_mut().enumerate() {
                    for (n, sum) in sums.iter_mut().enumerate() {
                        *sum = T::mma(a[m], b[n], *sum);
                    }
                }
            }
            let oh = first_row + warp_row;
            for (m, sums) in sums.iter().enumerate() {
                for half in 0..2 {
                    let ow = first_column + m as u32 * 16 + half * 8 + g;
                    if oh >= problem.out_h || ow >= problem.out_w {
                        continue;
                    }
                    let pixel = (image as usize * problem.out_h as usize + oh as usize)
                        * problem.out_w as usize
                        + ow as usize;
                    for (n, sum) in sums.iter().enumerate() {
                        let channel = channel_of(n);
                        if channel >= problem.out_channels {
                            continue;
                        }
                        let at = pixel * problem.out_channels as usize + channel as usize;
                        let h = 2 * half as usize;
                        // SAFETY: two outputs of y (the channel even, below the even
                        // out_channels), aligned to two elements.
                        unsafe {
                            let value = |k: usize| args.epilogue.apply(sum[h + k] + biases[n][k], at + k);
                            T::store_pair(y.add(at), [value(0), value(1)]);
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
    use crate::conv::ConvShape;

    use crate::launch::H100;

    fn problem(input: [u32; 4], weight: [u32; 4], stride: u32, padding: u32, dilation: u32) -> ConvProblem {
        ConvProblem::new(&ConvShape {
            input,
            weight,
            stride: [stride; 2],
            padding: [padding; 2],
            dilation: [dilation; 2],
            groups: 1,
        })
        .expect("a valid problem")
    }

    #[test]
    fn a_stem_takes_segments_of_its_three_channels() {
        // R7: x 32 x 3 x 224 x 224, w 64 x 3 x 7 x 7, stride 2, padding 3.
        let stem = problem([32, 3, 224, 224], [64, 3, 7, 7], 2, 3, 1);
        let plan = FewChannelsPlan::new(&stem, ConvLayout::Nhwc, &H100, 2).expect("the stem's");
        // Segments of 7 x 3 = 21 elements, padded to 22; K = 7 x 22 = 154, padded to 160.
        assert_eq!((plan.pitch, plan.div_segment.divisor, plan.k), (3, 22, 160));
        // 3 x 2 + 7 rows; 31 x 2 + 8 columns (22 elements reach 8 pixels).
        assert_eq!((plan.patch_h, plan.patch_w), (13, 70));
        // 112 x 112 outputs: 28 row tiles by 4 column tiles an image; two blocks an SM.
        assert_eq!((plan.tiles, plan.blocks), (32 * 28 * 4, 264));
        assert_eq!(plan.shared_bytes(), 64 * 168 * 2 + 80 * 4 + 13 * 70 * 3 * 2);
        assert_eq!(plan.geometry().grid, [264, 1, 1]);
        assert_eq!(FewChannelsPlan::new(&stem, ConvLayout::Nchw, &H100, 2), None);
    }

    #[test]
    fn odd_channels_at_odd_strides_are_staged_one_wider() {
        let odd = problem([2, 3, 9, 40], [8, 3, 3, 3], 1, 1, 1);
        let plan = FewChannelsPlan::new(&odd, ConvLayout::Nhwc, &H100, 2).expect("3 channels");
        // Pixels of 4 elements: windows at even elements; segments of 12, K of 48.
        assert_eq!((plan.pitch, plan.div_segment.divisor, plan.k), (4, 12, 48));
        let even = problem([1, 2, 6, 33], [6, 2, 1, 5], 1, 0, 1);
        let plan = FewChannelsPlan::new(&even, ConvLayout::Nhwc, &H100, 2).expect("2 channels");
        assert_eq!((plan.pitch, plan.div_segment.divisor, plan.k), (2, 10, 16));
    }

    #[test]
    fn other_problems_are_not_taken() {
        let nhwc = |p: &ConvProblem| FewChannelsPlan::new(p, ConvLayout::Nhwc, &H100, 2);
        // Five channels, dilation, an odd number of output channels, a K past 256.
        assert_eq!(nhwc(&problem([1, 5, 16, 16], [8, 5, 3, 3], 1, 1, 1)), None);
        assert_eq!(nhwc(&problem([1, 3, 16, 16], [8, 3, 3, 3], 1, 2, 2)), None);
        assert_eq!(nhwc(&problem([1, 3, 16, 16], [7, 3, 3, 3], 1, 1, 1)), None);
        assert_eq!(nhwc(&problem([1, 3, 64, 64], [8, 3, 11, 11], 4, 2, 1)), None);
        let grouped = ConvProblem::new(&ConvShape {
            input: [1, 4, 16, 16],
            weight: [8, 2, 3, 3],
            stride: [1, 1],
            padding: [1, 1],
            dilation: [1, 1],
            groups: 2,
        })
        .expect("two groups");
        assert_eq!(nhwc(&grouped), None);
    }
}
