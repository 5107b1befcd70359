//! 2-D convolution in FP32 (NCHW), forward and backward, as in
//! `torch.nn.functional.conv2d`: stride, padding, dilation and groups.
//!
//! Every pass is an implicit GEMM per group, whose operands are gathered from the
//! tensors as the tiles are loaded (no im2col buffer):
//!
//! | pass | M | N | K | A (M x K) | B (K x N) |
//! |---|---|---|---|---|---|
//! | forward | batch * out pixels | out channels | in channels * taps | x patches | w |
//! | input gradient | batch * in pixels | in channels | out channels * taps | dy, scattered back | w |
//! | weight gradient | in channels * taps | out channels | batch * out pixels | x patches | dy |
//!
//! (channels per group; a tap is one (r, s) of the kernel window). The weight
//! gradient splits K over blocks into per-split partials that a second pass adds in a
//! fixed order, so results are deterministic. The bias gradient is a per-channel sum.
//! The GEMM mainloop is shared: block tiles of `TILE_M x TILE_N x TILE_K`, staged in
//! shared memory (two stages), 8 x 8 outputs per thread.
//!
//! 3x3 windows at stride 1 without dilation take Winograd's F(2x2, 3x3) instead: 16
//! multiplies per 2x2 outputs and channel pair instead of 36. In the forward pass and
//! the input gradient (a 3x3 convolution of dy by the flipped, transposed weights,
//! padded by `2 - padding`), a first kernel transforms the weights (`U = G g G^T`, in
//! FP64, rounded once); the main kernel transforms 4x4 input tiles (`V = B^T d B`)
//! into shared memory, multiplies `U` and `V` per tile position as 16 small GEMMs
//! over the input channels, and transforms the products back (`Y = A^T M A`), all in
//! one pass over the input. The weight gradient is the same algorithm's adjoint:
//! `dw = G^T (sum over tiles of (A dy A^T) * (B^T d B)) G`, the sum split over blocks
//! (16 GEMMs over the tiles) and finished by a kernel that adds the splits in FP64 and
//! transforms once. All transform coefficients are 0, 1, -1 or 1/2.

#[cfg(target_arch = "nvptx64")]
mod gemm;
#[cfg(target_arch = "nvptx64")]
mod winograd;

/// Threads of an implicit-GEMM block.
pub const GEMM_THREADS: u32 = 256;
/// Rows of C (along M) per block.
pub const TILE_M: u32 = 128;
/// Columns of C (along N) per block.
pub const TILE_N: u32 = 128;
/// Depth of one staged slice of K.
pub const TILE_K: u32 = 8;
/// Floats per staged k-row of a tile: 4 more than the tile's width, so that the
/// k-contiguous operands' stores fall on distinct banks.
pub const TILE_PITCH: u32 = TILE_M + 4;
/// Shared memory of an implicit-GEMM block: two stages of both operands.
pub const GEMM_SHARED_BYTES: u32 = 2 * 2 * TILE_K * TILE_PITCH * 4;
/// Threads of the bias-gradient and split-sum kernels.
pub const REDUCE_THREADS: u32 = 256;
/// The weight gradient sums at most this many products per split in FP32 before the
/// splits are added in FP64, which bounds its rounding error on long reductions.
pub const WGRAD_MAX_CHUNK: u32 = 16384;
/// Blocks per SM that the weight gradient's split aims at (two blocks fit per SM).
pub const WGRAD_BLOCKS_PER_SM: u32 = 2;

const _: () = assert!(TILE_M == 128 && TILE_N == 128 && TILE_K == 8 && GEMM_THREADS == 256);

/// Division by a run-time divisor as a multiply-high and a shift (round-up method);
/// exact for every 32-bit dividend below 2^31.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FastDiv {
    pub divisor: u32,
    multiplier: u32,
    shift: u32,
}

impl FastDiv {
    /// Prepares division by `divisor` (at least 1).
    pub const fn new(divisor: u32) -> Self {
        assert!(divisor >= 1);
        let shift = 32 - (divisor - 1).leading_zeros();
        let multiplier = ((1u64 << 32) * ((1u64 << shift) - divisor as u64) / divisor as u64 + 1) as u32;
        Self {
            divisor,
            multiplier,
            shift,
        }
    }

    /// `(n / divisor, n % divisor)` for `n < 2^31`.
    #[inline(always)]
    pub const fn divmod(self, n: u32) -> (u32, u32) {
        let high = ((n as u64 * self.multiplier as u64) >> 32) as u32;
        let quotient = ((high as u64 + n as u64) >> self.shift) as u32;
        (quotient, n - quotient * self.divisor)
    }
}

/// One convolution, its derived sizes and the divisors the gathers use; the same on
/// host and device.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvProblem {
    pub batch: u32,
    pub in_channels: u32,
    pub height: u32,
    pub width: u32,
    pub out_channels: u32,
    pub kernel_h: u32,
    pub kernel_w: u32,
    pub stride_h: u32,
    pub stride_w: u32,
    pub pad_h: u32,
    pub pad_w: u32,
    pub dilation_h: u32,
    pub dilation_w: u32,
    pub groups: u32,
    pub out_h: u32,
    pub out_w: u32,
    pub div_out_w: FastDiv,
    pub div_out_pixels: FastDiv,
    pub div_width: FastDiv,
    pub div_pixels: FastDiv,
    pub div_taps: FastDiv,
    pub div_kernel_w: FastDiv,
    pub div_stride_h: FastDiv,
    pub div_stride_w: FastDiv,
}

/// The size of a convolution, as the user states it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvShape {
    /// x: `[batch, in_channels, height, width]`.
    pub input: [u32; 4],
    /// w: `[out_channels, in_channels / groups, kernel_h, kernel_w]`.
    pub weight: [u32; 4],
    pub stride: [u32; 2],
    pub padding: [u32; 2],
    pub dilation: [u32; 2],
    pub groups: u32,
}

impl ConvShape {
    /// Whether the kernels' 32-bit index arithmetic covers this (checked) shape: every
    /// GEMM extent below 2^31, and image extents (padded, with the window) below 2^29
    /// so that coordinates never approach the gathers' out-of-range markers.
    pub const fn fits_index_limits(&self) -> bool {
        let [batch, cin, h, w] = self.input;
        let [cout, _, kh, kw] = self.weight;
        let (Some(oh), Some(ow)) = (
            output_extent(h, kh, self.stride[0], self.padding[0], self.dilation[0]),
            output_extent(w, kw, self.stride[1], self.padding[1], self.dilation[1]),
        ) else {
            return false;
        };
        let (batch, cin, cout, taps) = (batch as u64, cin as u64, cout as u64, kh as u64 * kw as u64);
        let gemm_extents = [
            batch * h as u64 * w as u64,
            batch * oh as u64 * ow as u64 + TILE_K as u64,
            cin * taps + TILE_K as u64,
            cout * taps + TILE_K as u64,
        ];
        let image_extents = [
            h as u64 + 2 * self.padding[0] as u64 + self.dilation[0] as u64 * kh as u64,
            w as u64 + 2 * self.padding[1] as u64 + self.dilation[1] as u64 * kw as u64,
        ];
        let mut i = 0;
        while i < gemm_extents.len() {
            if gemm_extents[i] >= 1 << 31 {
                return false;
            }
            i += 1;
        }
        image_extents[0] < 1 << 29 && image_extents[1] < 1 << 29
    }
}

/// Torch's output extent along one axis, or `None` when the window does not fit.
pub const fn output_extent(input: u32, kernel: u32, stride: u32, padding: u32, dilation: u32) -> Option<u32> {
    let padded = input as u64 + 2 * padding as u64;
    let window = dilation as u64 * (kernel as u64 - 1) + 1;
    if kernel == 0 || stride == 0 || dilation == 0 || window > padded {
        return None;
    }
    Some(((padded - window) / stride as u64 + 1) as u32)
}

impl ConvProblem {
    /// The problem of a checked shape: stride, dilation and kernel at least 1, the
    /// window inside the padded input, channels divisible by groups.
    pub const fn new(shape: &ConvShape) -> Self {
        let [batch, in_channels, height, width] = shape.input;
        let [out_channels, _, kernel_h, kernel_w] = shape.weight;
        let (Some(out_h), Some(out_w)) = (
            output_extent(
                height,
                kernel_h,
                shape.stride[0],
                shape.padding[0],
                shape.dilation[0],
            ),
            output_extent(
                width,
                kernel_w,
                shape.stride[1],
                shape.padding[1],
                shape.dilation[1],
            ),
        ) else {
            panic!("the window does not fit the padded input");
        };
        Self {
            batch,
            in_channels,
            height,
            width,
            out_channels,
            kernel_h,
            kernel_w,
            stride_h: shape.stride[0],
            stride_w: shape.stride[1],
            pad_h: shape.padding[0],
            pad_w: shape.padding[1],
            dilation_h: shape.dilation[0],
            dilation_w: shape.dilation[1],
            groups: shape.groups,
            out_h,
            out_w,
            div_out_w: FastDiv::new(max1(out_w)),
            div_out_pixels: FastDiv::new(max1(out_h * out_w)),
            div_width: FastDiv::new(max1(width)),
            div_pixels: FastDiv::new(max1(height * width)),
            div_taps: FastDiv::new(kernel_h * kernel_w),
            div_kernel_w: FastDiv::new(kernel_w),
            div_stride_h: FastDiv::new(shape.stride[0]),
            div_stride_w: FastDiv::new(shape.stride[1]),
        }
    }

    pub const fn in_per_group(&self) -> u32 {
        self.in_channels / self.groups
    }
    pub const fn out_per_group(&self) -> u32 {
        self.out_channels / self.groups
    }
    pub const fn taps(&self) -> u32 {
        self.kernel_h * self.kernel_w
    }
    pub const fn pixels(&self) -> u32 {
        self.height * self.width
    }
    pub const fn out_pixels(&self) -> u32 {
        self.out_h * self.out_w
    }

    /// (M, N, K) of a pass's GEMM, per group.
    pub const fn gemm(&self, pass: ConvPass) -> (u64, u64, u64) {
        let (b, ci, co, taps) = (
            self.batch as u64,
            self.in_per_group() as u64,
            self.out_per_group() as u64,
            self.taps() as u64,
        );
        match pass {
            ConvPass::Forward => (b * self.out_pixels() as u64, co, ci * taps),
            ConvPass::InputGrad => (b * self.pixels() as u64, ci, co * taps),
            ConvPass::WeightGrad => (ci * taps, co, b * self.out_pixels() as u64),
        }
    }
}

const fn max1(v: u32) -> u32 {
    if v == 0 { 1 } else { v }
}

/// A pass of the convolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvPass {
    Forward,
    InputGrad,
    WeightGrad,
}

/// How one GEMM pass is launched: blocks along x are tiles (N fastest, then M, then
/// the split), grid y is the group.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmPlan {
    pub m_tiles: u32,
    pub n_tiles: u32,
    /// Parts of K summed separately (weight gradient only; 1 elsewhere).
    pub split: u32,
    /// K per split, a multiple of `TILE_K`.
    pub k_chunk: u32,
    pub groups: u32,
}

impl GemmPlan {
    pub const fn blocks(&self) -> u64 {
        self.m_tiles as u64 * self.n_tiles as u64 * self.split as u64
    }
}

/// The implicit-GEMM plan of `pass` on `multiprocessors` SMs. Call only on problems
/// that fit the index limits and have no empty GEMM extent.
pub fn gemm_plan(problem: &ConvProblem, pass: ConvPass, multiprocessors: u32) -> GemmPlan {
    let (m, n, k) = problem.gemm(pass);
    let m_tiles = m.div_ceil(TILE_M as u64) as u32;
    let n_tiles = n.div_ceil(TILE_N as u64) as u32;
    let tiles = m_tiles as u64 * n_tiles as u64 * problem.groups as u64;
    let split = if pass == ConvPass::WeightGrad {
        let fill = (multiprocessors as u64 * WGRAD_BLOCKS_PER_SM as u64).div_ceil(tiles);
        let accuracy = k.div_ceil(WGRAD_MAX_CHUNK as u64);
        fill.max(accuracy).min(k.div_ceil(TILE_K as u64)).max(1)
    } else {
        1
    };
    let k_chunk = k.div_ceil(split).next_multiple_of(TILE_K as u64);
    GemmPlan {
        m_tiles,
        n_tiles,
        split: k.div_ceil(k_chunk).max(1) as u32,
        k_chunk: k_chunk as u32,
        groups: problem.groups,
    }
}

/// Rows of the GEMM tile of a Winograd block: output tiles (2x2 pixels each, along a
/// row) in the data passes, input channels in the weight gradient.
pub const WINOGRAD_ROWS: u32 = 32;
/// Output channels of a Winograd block.
pub const WINOGRAD_OUT: u32 = 32;
/// Depth of one staged chunk of a Winograd block's reduction: input channels in the
/// data passes, output tiles in the weight gradient.
pub const WINOGRAD_CHUNK: u32 = 8;
/// Threads of a Winograd block: one per (row, k) of a chunk for the transforms, 16 per
/// tile position for the products, 8 x 8 each.
pub const WINOGRAD_THREADS: u32 = 256;
/// Floats per staged row of a Winograd operand, `[16][CHUNK][PITCH]`: 4 more than the
/// tile's width, so that threads writing one column of a chunk hit distinct banks.
pub const WINOGRAD_PITCH: u32 = WINOGRAD_ROWS + 4;
/// Bytes of one staged operand.
pub const WINOGRAD_PART: u32 = 16 * WINOGRAD_CHUNK * WINOGRAD_PITCH * 4;
/// Shared memory of a Winograd block: two stages of both operands, reused at the end
/// of the data passes for the 16 products of every (tile, out channel).
pub const WINOGRAD_SHARED_BYTES: u32 = 4 * WINOGRAD_PART;
/// Output tiles one split of the Winograd weight gradient sums in FP32, before the
/// splits are added in FP64 (as `WGRAD_MAX_CHUNK` for the implicit GEMM).
pub const WINOGRAD_WGRAD_MAX_TILES: u32 = WGRAD_MAX_CHUNK;
/// Threads of the weight-transform and weight-gradient finishing kernels.
pub const FILTER_THREADS: u32 = 256;

const _: () = assert!(
    WINOGRAD_THREADS == WINOGRAD_ROWS * WINOGRAD_CHUNK
        && WINOGRAD_THREADS == 16 * (WINOGRAD_ROWS / 8) * (WINOGRAD_OUT / 8)
        && WINOGRAD_SHARED_BYTES >= 16 * WINOGRAD_ROWS * WINOGRAD_OUT * 4
        && WINOGRAD_ROWS == WINOGRAD_OUT
);

/// A 3x3, stride-1 convolution as the Winograd kernels see it: `input` `[batch,
/// channels, height, width]` to `output` `[batch, out_channels, out_h, out_w]` (in the
/// weight gradient, x and dy).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WinogradProblem {
    pub batch: u32,
    pub channels: u32,
    pub height: u32,
    pub width: u32,
    pub out_channels: u32,
    pub out_h: u32,
    pub out_w: u32,
    pub pad_h: u32,
    pub pad_w: u32,
    pub groups: u32,
    /// Input channels per group, padded: to a multiple of `WINOGRAD_CHUNK` in U, of
    /// `WINOGRAD_ROWS` in the weight gradient.
    pub channels_padded: u32,
    /// Output channels per group, padded to a multiple of `WINOGRAD_OUT`.
    pub out_padded: u32,
    /// Whether U comes from the flipped, transposed weights (the input gradient).
    pub flip: u32,
}

impl WinogradProblem {
    /// The Winograd form of `pass` of `problem`, or `None` when it does not qualify: a
    /// 3x3 window at stride 1 without dilation (and for the input gradient, padding at
    /// most 2).
    pub const fn of(problem: &ConvProblem, pass: ConvPass) -> Option<Self> {
        let p = problem;
        if p.kernel_h != 3 || p.kernel_w != 3 || p.stride_h != 1 || p.stride_w != 1 {
            return None;
        }
        if p.dilation_h != 1 || p.dilation_w != 1 {
            return None;
        }
        let (ci, co) = (p.in_per_group(), p.out_per_group());
        let forward = Self {
            batch: p.batch,
            channels: p.in_channels,
            height: p.height,
            width: p.width,
            out_channels: p.out_channels,
            out_h: p.out_h,
            out_w: p.out_w,
            pad_h: p.pad_h,
            pad_w: p.pad_w,
            groups: p.groups,
            channels_padded: ci.next_multiple_of(WINOGRAD_CHUNK),
            out_padded: co.next_multiple_of(WINOGRAD_OUT),
            flip: 0,
        };
        match pass {
            ConvPass::Forward => Some(forward),
            ConvPass::WeightGrad => Some(Self {
                channels_padded: ci.next_multiple_of(WINOGRAD_ROWS),
                ..forward
            }),
            ConvPass::InputGrad if p.pad_h <= 2 && p.pad_w <= 2 => Some(Self {
                channels: p.out_channels,
                height: p.out_h,
                width: p.out_w,
                out_channels: p.in_channels,
                out_h: p.height,
                out_w: p.width,
                pad_h: 2 - p.pad_h,
                pad_w: 2 - p.pad_w,
                channels_padded: co.next_multiple_of(WINOGRAD_CHUNK),
                out_padded: ci.next_multiple_of(WINOGRAD_OUT),
                flip: 1,
                ..forward
            }),
            ConvPass::InputGrad => None,
        }
    }

    pub const fn in_per_group(&self) -> u32 {
        self.channels / self.groups
    }
    pub const fn out_per_group(&self) -> u32 {
        self.out_channels / self.groups
    }
    /// Output tiles along a row and along a column.
    pub const fn tiles(&self) -> (u32, u32) {
        (self.out_w.div_ceil(2), self.out_h.div_ceil(2))
    }
    /// Blocks along a tile row in the data passes.
    pub const fn segments(&self) -> u32 {
        self.tiles().0.div_ceil(WINOGRAD_ROWS)
    }
    /// Blocks along the output channels of a group.
    pub const fn out_blocks(&self) -> u32 {
        self.out_padded / WINOGRAD_OUT
    }
    /// Blocks per group of the data passes (grid x): out-channel blocks fastest, then
    /// segments, tile rows, images.
    pub const fn blocks(&self) -> u64 {
        self.out_blocks() as u64 * self.segments() as u64 * self.tiles().1 as u64 * self.batch as u64
    }
    /// Floats of the transformed weights, `[groups][16][channels_padded][out_padded]`
    /// (in the weight gradient: of one split's products).
    pub const fn filter_len(&self) -> u64 {
        self.groups as u64 * 16 * self.channels_padded as u64 * self.out_padded as u64
    }
    /// Chunks of the weight gradient's reduction: `WINOGRAD_CHUNK` consecutive tiles
    /// of a tile row each.
    pub const fn tile_chunks(&self) -> u64 {
        let (along, rows) = self.tiles();
        along.div_ceil(WINOGRAD_CHUNK) as u64 * rows as u64 * self.batch as u64
    }
}

/// How the Winograd weight gradient splits its chunks over blocks.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WinogradSplit {
    /// Chunks per split.
    pub chunks: u32,
    pub split: u32,
}

impl WinogradSplit {
    /// Enough splits to give every SM `WGRAD_BLOCKS_PER_SM` blocks, and no split over
    /// `WINOGRAD_WGRAD_MAX_TILES` tiles.
    pub fn new(problem: &WinogradProblem, multiprocessors: u32) -> Self {
        let total = problem.tile_chunks();
        let blocks = (problem.channels_padded / WINOGRAD_ROWS) as u64
            * problem.out_blocks() as u64
            * problem.groups as u64;
        let fill = (multiprocessors as u64 * WGRAD_BLOCKS_PER_SM as u64).div_ceil(blocks);
        let accuracy = total.div_ceil((WINOGRAD_WGRAD_MAX_TILES / WINOGRAD_CHUNK) as u64);
        let chunks = total.div_ceil(fill.max(accuracy).clamp(1, total.max(1)));
        Self {
            chunks: chunks as u32,
            split: total.div_ceil(chunks) as u32,
        }
    }

    /// Blocks per group (grid x): out-channel blocks fastest, then channel blocks, then
    /// splits.
    pub const fn blocks(&self, problem: &WinogradProblem) -> u64 {
        (problem.channels_padded / WINOGRAD_ROWS) as u64 * problem.out_blocks() as u64 * self.split as u64
    }
}

/// How a pass runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvAlgorithm {
    ImplicitGemm(GemmPlan),
    Winograd(WinogradProblem),
}

/// The one place that picks a pass's algorithm: Winograd for 3x3, stride-1,
/// undilated windows, the implicit GEMM otherwise. Call only on problems that fit the
/// index limits, with no empty extent.
pub fn algorithm(problem: &ConvProblem, pass: ConvPass, multiprocessors: u32) -> ConvAlgorithm {
    match WinogradProblem::of(problem, pass) {
        Some(winograd) => ConvAlgorithm::Winograd(winograd),
        None => ConvAlgorithm::ImplicitGemm(gemm_plan(problem, pass, multiprocessors)),
    }
}

/// Two blocks per SM for the main kernels: a block's prologue and epilogue then
/// overlap the other's products.
pub const LAUNCH_BOUNDS: [crate::LaunchBounds; 5] = [
    bounds("conv_forward_f32", GEMM_THREADS),
    bounds("conv_input_grad_f32", GEMM_THREADS),
    bounds("conv_weight_grad_f32", GEMM_THREADS),
    bounds("conv_winograd_f32", WINOGRAD_THREADS),
    bounds("conv_winograd_weight_grad_f32", WINOGRAD_THREADS),
];

const fn bounds(kernel: &'static str, threads: u32) -> crate::LaunchBounds {
    crate::LaunchBounds {
        kernel,
        threads,
        blocks_per_sm: 2,
    }
}

/// Which kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvKernel {
    Forward,
    InputGrad,
    WeightGrad,
    SplitSum,
    BiasGrad,
    WinogradFilter,
    Winograd,
    WinogradWeightGrad,
    WinogradWeightGradFinish,
}

/// The entry point of a kernel.
pub const fn kernel_name(kernel: ConvKernel) -> &'static str {
    KERNELS[kernel as usize]
}

/// Every conv entry point.
pub const KERNELS: [&str; 9] = [
    "conv_forward_f32",
    "conv_input_grad_f32",
    "conv_weight_grad_f32",
    "conv_split_sum_f32",
    "conv_bias_grad_f32",
    "conv_winograd_filter_f32",
    "conv_winograd_f32",
    "conv_winograd_weight_grad_f32",
    "conv_winograd_weight_grad_finish_f32",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_division_is_exact() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let divisors = (1..300).chain([510, 1022, 521_220, 65_535, 65_536, (1 << 31) - 1]);
        for d in divisors {
            let div = FastDiv::new(d);
            let edges = [0, 1, d - 1, d, d + 1, (1 << 31) - 1, (1 << 31) - 2];
            for n in edges.into_iter().chain((0..2000).map(|_| (next() as u32) >> 1)) {
                assert_eq!(div.divmod(n), (n / d, n % d), "{n} / {d}");
            }
        }
    }

    #[test]
    fn output_extent_follows_torch() {
        // floor((in + 2p - d(k - 1) - 1) / s) + 1
        assert_eq!(output_extent(1024, 3, 1, 0, 1), Some(1022));
        assert_eq!(output_extent(7, 3, 2, 1, 1), Some(4));
        assert_eq!(output_extent(7, 3, 3, 2, 2), Some(3));
        assert_eq!(output_extent(2, 3, 1, 0, 1), None);
        assert_eq!(output_extent(2, 3, 1, 1, 1), Some(2));
        assert_eq!(output_extent(5, 3, 0, 0, 1), None);
    }

    #[test]
    fn weight_gradient_splits_long_reductions() {
        let problem = ConvProblem::new(&ConvShape {
            input: [8, 64, 512, 1024],
            weight: [128, 64, 3, 3],
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
        });
        let plan = gemm_plan(&problem, ConvPass::WeightGrad, 132);
        let (_, _, k) = problem.gemm(ConvPass::WeightGrad);
        assert!(plan.k_chunk <= WGRAD_MAX_CHUNK && plan.k_chunk.is_multiple_of(TILE_K));
        assert!(plan.split as u64 * plan.k_chunk as u64 >= k);
        assert!((plan.split as u64 - 1) * (plan.k_chunk as u64) < k);
        let forward = gemm_plan(&problem, ConvPass::Forward, 132);
        assert_eq!((forward.n_tiles, forward.split), (1, 1));
    }
}
