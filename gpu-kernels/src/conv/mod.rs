//! 2-D convolution of f32 tensors, forward and backward, as in
//! `torch.nn.functional.conv2d`: stride, padding, dilation and groups; exact FP32 on
//! the CUDA cores (below), or TF32 on the tensor cores (`tensor_core`), whose forward
//! kernels also take the input gradient of stride-1 convolutions (`transposed`).
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
//! one pass over the input. A block takes 32 consecutive output tiles in (image, tile
//! row, tile column) order, so that maps narrower than 64 pixels fill it. The weight gradient is the same algorithm's adjoint:
//! `dw = G^T (sum over tiles of (A dy A^T) * (B^T d B)) G`, the sum split over blocks
//! (16 GEMMs over the tiles) and finished by a kernel that adds the splits in FP64 and
//! transforms once. All transform coefficients are 0, 1, -1 or 1/2.

pub mod direct;
pub mod epilogue;
pub mod few_channels;
pub mod few_channels_input_grad;
pub mod few_channels_weight_grad;
#[cfg(target_arch = "nvptx64")]
mod gather;
pub mod gemm;
#[cfg(target_arch = "nvptx64")]
mod outer_product;
pub mod phases;
mod problem;
pub mod reduce;
pub mod staged_input_grad;
pub mod stencil;
pub mod stencil_columns;
pub mod sub_pixel;
pub mod tensor_core;
pub mod transposed;
pub mod winograd;

pub use direct::DirectPlan;
pub use epilogue::{Activation, ConvEpilogue};
pub use few_channels::FewChannelsPlan;
pub use few_channels_input_grad::FewChannelsInputGradPlan;
pub use few_channels_weight_grad::FewChannelsWeightGradPlan;
pub use gemm::GemmPlan;
pub use phases::PhasePlan;
pub use problem::{ConvPass, ConvProblem, ConvShape, ConvShapeError, FastDiv};
pub use stencil::StencilPlan;
pub use sub_pixel::SubPixelPlan;
pub use tensor_core::{TensorCorePlan, WarpgroupWeightGradPlan, WeightGradPlan};
pub use winograd::{WinogradProblem, WinogradSplit};

use crate::launch::{DeviceLimits, EntryPoint};

/// Blocks of the main kernels (implicit GEMM and Winograd) resident per SM: a block's
/// prologue and epilogue then overlap the other's products.
pub const MAIN_BLOCKS_PER_SM: u32 = 2;

/// Every conv entry point.
pub const ENTRY_POINTS: &[&[EntryPoint]] = &[
    gemm::FORWARD_ENTRY_POINTS,
    gemm::INPUT_GRAD_ENTRY_POINTS,
    gemm::WEIGHT_GRAD_ENTRY_POINTS,
    reduce::SPLIT_SUM_ENTRY_POINTS,
    reduce::SPLIT_EPILOGUE_ENTRY_POINTS,
    reduce::BIAS_GRAD_ENTRY_POINTS,
    reduce::BIAS_GRAD_TO_NHWC_ENTRY_POINTS,
    winograd::FILTER_ENTRY_POINTS,
    winograd::WINOGRAD_ENTRY_POINTS,
    winograd::WEIGHT_GRAD_ENTRY_POINTS,
    winograd::FINISH_ENTRY_POINTS,
    tensor_core::ENTRY_POINTS,
    tensor_core::weight_grad::ENTRY_POINTS,
    tensor_core::warpgroup_weight_grad::ENTRY_POINTS,
    transposed::PREPARE_ENTRY_POINTS,
    transposed::FLIP_16_ENTRY_POINTS,
    transposed::UPSAMPLE_ENTRY_POINTS,
    phases::FILTERS_ENTRY_POINTS,
    sub_pixel::FILTERS_ENTRY_POINTS,
    sub_pixel::ENTRY_POINTS,
    phases::INTERLEAVE_ENTRY_POINTS,
    direct::FORWARD_ENTRY_POINTS,
    direct::INPUT_GRAD_ENTRY_POINTS,
    direct::WEIGHT_GRAD_ENTRY_POINTS,
    stencil::ENTRY_POINTS,
    stencil::WEIGHT_GRAD_ENTRY_POINTS,
    few_channels::ENTRY_POINTS,
    few_channels_input_grad::ENTRY_POINTS,
    few_channels_weight_grad::ENTRY_POINTS,
];

/// The arithmetic of a convolution of f32 tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConvPrecision {
    /// Exact FP32 products and sums on the CUDA cores.
    #[default]
    Fp32,
    /// Inputs rounded to TF32 (10-bit mantissa) for the tensor cores, products summed
    /// in FP32: torch's `allow_tf32 = True`. Passes with no tensor-core kernel run in
    /// FP32, which is more exact.
    Tf32,
}

/// The order of the dimensions of x, w and y in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConvLayout {
    /// x `[batch, in, h, w]`, w `[out, in / groups, kh, kw]`, y `[batch, out, oh, ow]`:
    /// torch's default.
    #[default]
    Nchw,
    /// Channels last: x `[batch, h, w, in]`, w `[out, kh, kw, in / groups]`, y
    /// `[batch, oh, ow, out]`: torch's `channels_last`, in dimension order.
    Nhwc,
}

impl ConvLayout {
    /// NHWC for a plan's `channels_last` flag of 1, else NCHW.
    pub const fn of_channels_last(channels_last: u32) -> Self {
        if channels_last == 1 {
            Self::Nhwc
        } else {
            Self::Nchw
        }
    }
}

/// How a pass runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvAlgorithm {
    ImplicitGemm(GemmPlan),
    Winograd(WinogradProblem),
    TensorCore(TensorCorePlan),
    /// The weight gradient on the tensor cores (TF32, NHWC, `mma.sync`).
    TensorCoreWeightGrad(WeightGradPlan),
    /// The weight gradient on warpgroup MMA (TF32, NCHW or NHWC, stride 1).
    WarpgroupWeightGrad(WarpgroupWeightGradPlan),
    Direct(DirectPlan),
    /// The depthwise forward pass and stride-1 input gradient over staged windows.
    Stencil(StencilPlan),
    /// The strided input gradient by phases, each a forward pass on the tensor cores.
    Phases(PhasePlan),
    /// The strided input gradient as the phases' one forward pass on the tensor cores,
    /// their outputs shuffled into dx (NHWC).
    SubPixel(SubPixelPlan),
    /// The TF32 forward pass of a stem (at most 4 input channels, NHWC) on `mma.sync`.
    FewChannels(FewChannelsPlan),
}

/// How a pass runs on the CUDA cores, in FP32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudaCoreAlgorithm {
    ImplicitGemm(GemmPlan),
    Winograd(WinogradProblem),
}

impl From<CudaCoreAlgorithm> for ConvAlgorithm {
    fn from(algorithm: CudaCoreAlgorithm) -> Self {
        match algorithm {
            CudaCoreAlgorithm::ImplicitGemm(plan) => ConvAlgorithm::ImplicitGemm(plan),
            CudaCoreAlgorithm::Winograd(problem) => ConvAlgorithm::Winograd(problem),
        }
    }
}

impl ConvAlgorithm {
    /// The layout the algorithm's kernels read x and w in; other layouts are changed
    /// around them.
    pub const fn layout(&self) -> ConvLayout {
        match self {
            ConvAlgorithm::ImplicitGemm(_) | ConvAlgorithm::Winograd(_) => ConvLayout::Nchw,
            ConvAlgorithm::TensorCore(plan) => plan.layout(),
            ConvAlgorithm::TensorCoreWeightGrad(_) => ConvLayout::Nhwc,
            ConvAlgorithm::WarpgroupWeightGrad(plan) => plan.layout(),
            ConvAlgorithm::Direct(plan) => plan.layout(),
            ConvAlgorithm::Stencil(plan) => plan.layout(),
            ConvAlgorithm::Phases(plan) => plan.layout(),
            ConvAlgorithm::SubPixel(_) | ConvAlgorithm::FewChannels(_) => ConvLayout::Nhwc,
        }
    }

    /// The layout the algorithm's kernels write y (and read the residual) in.
    pub const fn output_layout(&self) -> ConvLayout {
        match self {
            ConvAlgorithm::TensorCore(plan) => plan.output_layout(),
            ConvAlgorithm::ImplicitGemm(plan) => plan.output_layout(),
            _ => self.layout(),
        }
    }
}

/// The one place that picks a pass's algorithm: the depthwise stencil for the forward
/// pass, the stride-1 input gradient and the weight gradient (3x3 and 5x5 windows) of
/// one input channel per group where its window fits, in every precision; the direct
/// kernels for the other passes of one input channel per group, and for the input
/// gradient of few input channels per group; the strided input gradient by phases where
/// [`PhasePlan::of`] takes it (on the tensor cores in TF32, over NCHW tensors in FP32),
/// else in TF32 over NHWC tensors as the phases' one forward pass where
/// [`SubPixelPlan::of`] takes it; in TF32, the tensor cores: the few-channel kernel for
/// the forward pass of a stem over NHWC tensors, else the tensors' layout for the
/// forward pass, and for the input gradient where it is the forward pass of
/// [`ConvProblem::input_grad_as_forward`] (the plan is that problem's), for the weight
/// gradient on `wgmma` in the tensors' layout where it suits the problem, else on
/// `mma.sync` in NHWC; else [`cuda_core_algorithm`]. Call only on problems that fit the
/// index limits, with no empty extent.
pub fn algorithm(
    problem: &ConvProblem,
    pass: ConvPass,
    precision: ConvPrecision,
    layout: ConvLayout,
    device: &DeviceLimits,
) -> ConvAlgorithm {
    let multiprocessors = device.multiprocessors;
    let stencil = match pass {
        ConvPass::Forward => StencilPlan::forward(problem, layout),
        ConvPass::InputGrad => StencilPlan::input_grad(problem, layout),
        ConvPass::WeightGrad => StencilPlan::weight_grad(problem, layout),
    };
    if let Some(plan) = stencil {
        return ConvAlgorithm::Stencil(plan);
    }
    if let Some(plan) = DirectPlan::of_depthwise(problem, layout, multiprocessors) {
        return ConvAlgorithm::Direct(plan);
    }
    if pass == ConvPass::InputGrad
        && let Some(plan) = DirectPlan::of_input_grad(problem, layout, multiprocessors)
    {
        return ConvAlgorithm::Direct(plan);
    }
    // The CUDA cores' kernels read NCHW.
    let tensor_cores = precision == ConvPrecision::Tf32;
    let native = if tensor_cores { layout } else { ConvLayout::Nchw };
    if pass == ConvPass::InputGrad
        && let Some(plan) = PhasePlan::of(problem, native, tensor_cores)
    {
        return ConvAlgorithm::Phases(plan);
    }
    if pass == ConvPass::InputGrad
        && tensor_cores
        && let Some(plan) = SubPixelPlan::of(problem, layout, tensor_core::TensorCoreOperand::Tf32, device)
    {
        return ConvAlgorithm::SubPixel(plan);
    }
    if precision == ConvPrecision::Tf32 {
        let forward = match pass {
            ConvPass::Forward => Some(*problem),
            ConvPass::InputGrad => problem.input_grad_as_forward(),
            ConvPass::WeightGrad => {
                // NCHW tensors the `wgmma` kernel cannot read in place are transposed
                // for its NHWC variant.
                let warpgroup = WarpgroupWeightGradPlan::of(problem, layout, device)
                    .or_else(|| WarpgroupWeightGradPlan::of(problem, ConvLayout::Nhwc, device));
                return match warpgroup {
                    Some(plan) => ConvAlgorithm::WarpgroupWeightGrad(plan),
                    None => {
                        ConvAlgorithm::TensorCoreWeightGrad(WeightGradPlan::new(problem, multiprocessors))
                    }
                };
            }
        };
        if pass == ConvPass::Forward
            && let Some(plan) = FewChannelsPlan::new(problem, layout, device, 4)
        {
            return ConvAlgorithm::FewChannels(plan);
        }
        if let Some(forward) = forward {
            return ConvAlgorithm::TensorCore(TensorCorePlan::forward(&forward, layout, device));
        }
    }
    match cuda_core_algorithm(problem, pass, multiprocessors) {
        // The implicit GEMM's forward pass writes y in the tensors' layout.
        CudaCoreAlgorithm::ImplicitGemm(plan) if pass == ConvPass::Forward => {
            ConvAlgorithm::ImplicitGemm(plan.writing(layout))
        }
        other => other.into(),
    }
}

/// The FP32 algorithm of a pass: Winograd for 3x3, stride-1, undilated windows, the
/// implicit GEMM otherwise (NCHW). The input gradients that are no forward pass take
/// it in every precision.
pub fn cuda_core_algorithm(problem: &ConvProblem, pass: ConvPass, multiprocessors: u32) -> CudaCoreAlgorithm {
    match WinogradProblem::of(problem, pass) {
        Some(winograd) => CudaCoreAlgorithm::Winograd(winograd),
        None => CudaCoreAlgorithm::ImplicitGemm(gemm::plan(problem, pass, multiprocessors)),
    }
}

/// The layer suite's stem (R7) with `out_channels`: x 32 x 3 x 224 x 224, a 7 x 7
/// window at stride 2, padding 3; for the plans' tests.
#[cfg(test)]
pub(crate) fn stem_problem(out_channels: u32) -> ConvProblem {
    ConvProblem::new(&ConvShape {
        input: [32, 3, 224, 224],
        weight: [out_channels, 3, 7, 7],
        stride: [2, 2],
        padding: [3, 3],
        dilation: [1, 1],
        groups: 1,
    })
    .expect("a stem is a valid problem")
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::launch::H100;

    /// An A100's limits: no `wgmma`, no tensor maps.
    const A100: DeviceLimits = DeviceLimits {
        multiprocessors: 108,
        max_shared_bytes_per_block: 163 * 1024,
        warpgroup_mma: false,
        tensor_maps: false,
    };

    /// The headline problem: x 8 x 64 x 512 x 1024, w 128 x 64 x 3 x 3, no padding.
    fn headline() -> ConvProblem {
        ConvProblem::new(&ConvShape {
            input: [8, 64, 512, 1024],
            weight: [128, 64, 3, 3],
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
        })
        .expect("the headline is a valid problem")
    }

    /// The TF32 forward plan of `problem` over tensors in `layout` on `device`.
    fn tf32_forward(problem: &ConvProblem, layout: ConvLayout, device: &DeviceLimits) -> TensorCorePlan {
        match algorithm(problem, ConvPass::Forward, ConvPrecision::Tf32, layout, device) {
            ConvAlgorithm::TensorCore(plan) => plan,
            other => panic!("TF32 forward took {other:?}"),
        }
    }

    #[test]
    fn sixteen_bit_forward_plans_take_nhwc_strips_of_64_channel_k_tiles() {
        use tensor_core::TensorCoreOperand::{Bf16, F16};
        let headline = headline();
        for operand in [Bf16, F16] {
            let plan = TensorCorePlan::forward_16_bit(&headline, operand, ConvLayout::Nhwc, &H100)
                .expect("the headline's");
            let tf32 = tf32_forward(&headline, ConvLayout::Nhwc, &H100);
            assert_eq!((plan.operand, plan.k_tiles, plan.split_k_tiles), (operand, 9, 9));
            assert_eq!(plan.k_tiles * 2, tf32.k_tiles);
            assert_eq!((plan.row_strips, plan.channels_last, plan.splits), (1, 1, 1));
            // NCHW y: the same plan, storing channels first.
            let nchw = TensorCorePlan::forward_16_bit(&headline, operand, ConvLayout::Nchw, &H100);
            assert_eq!(
                nchw,
                Some(TensorCorePlan {
                    y_channels_last: 0,
                    ..plan
                })
            );
            // 32 channels: not a whole k-tile; no `wgmma`: none either.
            let thin = ConvProblem::new(&ConvShape {
                input: [8, 32, 512, 1024],
                weight: [128, 32, 3, 3],
                stride: [1, 1],
                padding: [0, 0],
                dilation: [1, 1],
                groups: 1,
            })
            .unwrap();
            assert_eq!(
                TensorCorePlan::forward_16_bit(&thin, operand, ConvLayout::Nhwc, &H100),
                None
            );
            assert_eq!(
                TensorCorePlan::forward_16_bit(&headline, operand, ConvLayout::Nhwc, &A100),
                None
            );
        }
    }

    #[test]
    fn sixteen_bit_gradients_take_the_strips_and_the_weight_gradient_of_their_operands() {
        use tensor_core::TensorCoreOperand::{Bf16, F16, Tf32};
        let headline = headline();
        let transposed = headline.input_grad_as_forward().expect("stride 1");
        for operand in [Bf16, F16] {
            // The input gradient: the strips over dy's 128 channels, 2 k-tiles a tap.
            let input = TensorCorePlan::forward_16_bit(&transposed, operand, ConvLayout::Nhwc, &H100)
                .expect("the strips");
            assert_eq!((input.k_tiles, input.splits, input.operand), (18, 1, operand));
            // The weight gradient: k-tiles of 64 of the batch's 8 x 510 x 1022 pixels.
            let weight = WarpgroupWeightGradPlan::of_16_bit(&headline, operand, &H100).expect("the weight's");
            assert_eq!(weight.total_k_tiles, (8 * 510 * 1022u32).div_ceil(64));
            assert_eq!(
                (weight.operand, weight.channels_last, weight.n_tiles),
                (operand, 1, 3)
            );
            assert_eq!(
                WarpgroupWeightGradPlan::of_16_bit(&headline, operand, &A100),
                None
            );
        }
        assert_eq!(WarpgroupWeightGradPlan::of_16_bit(&headline, Tf32, &H100), None);
        let tf32 = WarpgroupWeightGradPlan::of(&headline, ConvLayout::Nhwc, &H100).expect("TF32's");
        assert_eq!(
            (tf32.operand, tf32.total_k_tiles),
            (Tf32, (8 * 510 * 1022u32).div_ceil(32))
        );
    }

    #[test]
    fn tensor_core_forward_splits_k_where_tiles_leave_multiprocessors_idle() {
        let h100 = H100;
        let plan = |input, weight| {
            let problem = ConvProblem::new(&ConvShape {
                input,
                weight,
                stride: [1, 1],
                padding: [1, 1],
                dilation: [1, 1],
                groups: 1,
            })
            .expect("a valid problem");
            tf32_forward(&problem, ConvLayout::Nhwc, &h100)
        };
        // 7x7 maps of 512 channels (im2col, tiles of 256 pixels): 28 tiles of 144
        // k-tiles for 132 blocks, in four splits of 36.
        let small_maps = plan([32, 512, 7, 7], [512, 512, 3, 3]);
        assert_eq!(
            (small_maps.splits, small_maps.split_k_tiles, small_maps.units()),
            (4, 36, 112)
        );
        assert_eq!(small_maps.blocks, 112);
        // Tiles enough for every SM: no split.
        let headline = plan([8, 64, 512, 1024], [128, 64, 3, 3]);
        assert_eq!((headline.splits, headline.split_k_tiles), (1, headline.k_tiles));
        // Splits keep at least MIN_SPLIT_K_TILES k-tiles each; none is empty.
        let short = plan([1, 64, 5, 5], [32, 64, 3, 3]);
        assert_eq!((short.k_tiles, short.splits), (18, 1));
        for (input, weight) in [
            ([1, 256, 6, 7], [40, 256, 3, 3]),
            ([1, 200, 3, 3], [8, 200, 3, 3]),
        ] {
            let p = plan(input, weight);
            assert!(
                p.splits > 1 && p.split_k_tiles >= tensor_core::MIN_SPLIT_K_TILES,
                "{p:?}"
            );
            assert!((p.splits - 1) * p.split_k_tiles < p.k_tiles && p.splits * p.split_k_tiles >= p.k_tiles);
        }
    }

    #[test]
    fn nchw_tf32_forward_stages_x_in_boxes_where_rows_are_long() {
        let problem = |input: [u32; 4], weight: [u32; 4], stride, groups| {
            ConvProblem::new(&ConvShape {
                input,
                weight,
                stride: [stride, stride],
                padding: [1, 1],
                dilation: [1, 1],
                groups,
            })
            .expect("a valid problem")
        };
        let plan = |p: &ConvProblem, layout| tf32_forward(p, layout, &H100);
        // The headline (no padding): rows of 1022 pixels padded to 1024.
        let headline = headline();
        let boxes = plan(&headline, ConvLayout::Nchw);
        assert_eq!(
            (boxes.nchw_boxes(), boxes.bulk_copies, boxes.channel_tiles),
            (true, 1, 1)
        );
        assert_eq!(
            (boxes.layout(), boxes.output_layout()),
            (ConvLayout::Nchw, ConvLayout::Nchw)
        );
        assert_eq!((boxes.row_pitch.divisor, boxes.k_tiles), (1024, 9 * 2));
        // Tiles of 256 pixels that both consumers share (NHWC strips: 128 in turns).
        assert_eq!(boxes.m_tiles, 8 * 510 * 4);
        // A row's last tile has 1022 - 768 pixels; the next row's first follows.
        assert_eq!(boxes.tile_pixels(&headline, 0), (0, 1022));
        assert_eq!(boxes.tile_pixels(&headline, 768), (768, 254));
        assert_eq!(boxes.tile_pixels(&headline, 1024 + 256), (1022 + 256, 766));
        assert_eq!(boxes.tile_pixels(&headline, 8 * 510 * 1024).1, 0);
        // NHWC: row strips, tiles of 64 output channels by 256 pixels.
        let strips = plan(&headline, ConvLayout::Nhwc);
        assert_eq!((strips.nchw_boxes(), strips.row_strips), (false, 1));
        assert_eq!(
            (strips.layout(), strips.tile_n, strips.n_tiles, strips.m_tiles),
            (ConvLayout::Nhwc, 64, 2, 8 * 510 * 4)
        );
        assert_eq!(strips.tile_pixels(&headline, 768), (768, 254));
        // Without `wgmma` and tensor maps: the `mma.sync` kernel over NCHW, no strips.
        let portable = tf32_forward(&headline, ConvLayout::Nchw, &A100);
        assert_eq!((portable.row_strips, portable.bulk_copies), (0, 0));
        assert_eq!(portable.tile_pixels(&headline, 256), (256, 8 * 510 * 1022 - 256));
        // Rows 1/16 short of whole tiles at most.
        assert!(plan(&problem([2, 64, 4, 244], [16, 64, 3, 3], 1, 1), ConvLayout::Nchw).nchw_boxes());
        // Rows more than 1/16 short of whole tiles, a stride: x goes to NHWC for the
        // im2col copies; chunks that would cross into the next group: gathered.
        for (p, layout) in [
            (problem([2, 64, 4, 240], [16, 64, 3, 3], 1, 1), ConvLayout::Nhwc),
            (problem([2, 64, 4, 64], [16, 64, 3, 3], 1, 1), ConvLayout::Nhwc),
            (problem([2, 64, 4, 512], [16, 64, 3, 3], 2, 1), ConvLayout::Nhwc),
            (problem([2, 32, 4, 256], [16, 16, 3, 3], 1, 2), ConvLayout::Nchw),
        ] {
            let fallback = plan(&p, ConvLayout::Nchw);
            assert_eq!((fallback.row_strips, fallback.layout()), (0, layout), "{p:?}");
            let pixels = p.batch * p.out_pixels();
            assert_eq!(fallback.tile_pixels(&p, 256), (256, pixels - 256));
        }
        // Channels not in eights: NHWC row strips; a window too wide for a strip's
        // margin: im2col.
        let nhwc = plan(&problem([2, 12, 4, 256], [16, 12, 3, 3], 1, 1), ConvLayout::Nchw);
        assert_eq!((nhwc.row_strips, nhwc.layout()), (1, ConvLayout::Nhwc));
        let wide = ConvProblem::new(&ConvShape {
            input: [2, 64, 4, 512],
            weight: [16, 64, 1, 16],
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 2],
            groups: 1,
        })
        .expect("a valid problem");
        assert_eq!(plan(&wide, ConvLayout::Nhwc).row_strips, 0);
        // Channels in eights past the last whole chunk, and groups of whole chunks.
        assert!(plan(&problem([2, 40, 4, 256], [16, 40, 3, 3], 1, 1), ConvLayout::Nchw).nchw_boxes());
        assert!(plan(&problem([2, 64, 4, 256], [16, 32, 3, 3], 1, 2), ConvLayout::Nchw).nchw_boxes());
    }

    #[test]
    fn box_order_interleaves_each_eight_channels_of_a_tap() {
        for in_group in [8, 12, 40] {
            let p = ConvProblem::new(&ConvShape {
                input: [1, 2 * in_group, 4, 4],
                weight: [6, in_group, 3, 2],
                stride: [1, 1],
                padding: [0, 0],
                dilation: [1, 1],
                groups: 2,
            })
            .expect("a valid problem");
            let (taps, in_group) = (6, in_group as u64);
            let mut seen = [false; 6 * 40 * 6];
            for i in 0..p.weight_count() {
                let j = tensor_core::box_filter_index(&p, i);
                assert!(!seen[j as usize], "{in_group} {i}");
                seen[j as usize] = true;
                let (out, channel, tap) = (i / (in_group * taps), i / taps % in_group, i % taps);
                assert_eq!(j / in_group, out * taps + tap);
                // Channels 2k and 2k + 1 of a whole eight at places k and k + 4; a
                // partial last eight in its order.
                let place = j % in_group;
                let expected = match channel % 8 {
                    _ if channel / 8 * 8 + 8 > in_group => channel,
                    c => channel / 8 * 8 + [0, 4, 1, 5, 2, 6, 3, 7][c as usize],
                };
                assert_eq!(place, expected, "{in_group} {i}");
            }
        }
    }

    #[test]
    fn the_implicit_gemm_forward_writes_the_tensors_layout() {
        let problem = stem_problem(64);
        let h100 = H100;
        for layout in [ConvLayout::Nchw, ConvLayout::Nhwc] {
            let forward = algorithm(&problem, ConvPass::Forward, ConvPrecision::Fp32, layout, &h100);
            assert!(matches!(forward, ConvAlgorithm::ImplicitGemm(_)), "{forward:?}");
            assert_eq!(
                (forward.layout(), forward.output_layout()),
                (ConvLayout::Nchw, layout)
            );
        }
        let weight_grad = algorithm(
            &problem,
            ConvPass::WeightGrad,
            ConvPrecision::Fp32,
            ConvLayout::Nhwc,
            &h100,
        );
        assert_eq!(weight_grad.output_layout(), ConvLayout::Nchw);
    }

    #[test]
    fn weight_gradient_splits_long_reductions() {
        let problem = headline();
        let plan = gemm::plan(&problem, ConvPass::WeightGrad, 132);
        let (_, _, k) = problem.gemm(ConvPass::WeightGrad);
        assert!(plan.k_chunk <= gemm::WGRAD_MAX_CHUNK && plan.k_chunk.is_multiple_of(gemm::TILE_K));
        assert!(plan.split as u64 * plan.k_chunk as u64 >= k);
        assert!((plan.split as u64 - 1) * (plan.k_chunk as u64) < k);
        let forward = gemm::plan(&problem, ConvPass::Forward, 132);
        assert_eq!((forward.n_tiles, forward.split), (1, 1));
        let h100 = H100;
        // The headline's 3x3 stride-1 window takes Winograd in every pass.
        for pass in [ConvPass::Forward, ConvPass::InputGrad, ConvPass::WeightGrad] {
            assert!(matches!(
                algorithm(&problem, pass, ConvPrecision::Fp32, ConvLayout::Nchw, &h100),
                ConvAlgorithm::Winograd(_)
            ));
        }
        // TF32 forward takes wgmma where the kernels have it, mma.sync elsewhere.
        let tf32 = |device: &DeviceLimits| tf32_forward(&problem, ConvLayout::Nhwc, device).warpgroup_mma;
        let a100 = A100;
        assert_eq!((tf32(&h100), tf32(&a100)), (1, 0));
        // The TF32 weight gradient on wgmma in either layout on Hopper.
        for layout in [ConvLayout::Nchw, ConvLayout::Nhwc] {
            let grad = |device: &DeviceLimits| {
                algorithm(
                    &problem,
                    ConvPass::WeightGrad,
                    ConvPrecision::Tf32,
                    layout,
                    device,
                )
            };
            assert!(
                matches!(grad(&h100), ConvAlgorithm::WarpgroupWeightGrad(plan) if plan.layout() == layout),
                "{layout:?}"
            );
            assert!(matches!(grad(&a100), ConvAlgorithm::TensorCoreWeightGrad(_)));
        }
    }

    #[test]
    fn tf32_stems_take_the_few_channel_forward_over_nhwc() {
        let stem = stem_problem(64);
        let forward = |precision, layout| algorithm(&stem, ConvPass::Forward, precision, layout, &H100);
        let ConvAlgorithm::FewChannels(plan) = forward(ConvPrecision::Tf32, ConvLayout::Nhwc) else {
            panic!(
                "the TF32 NHWC stem took {:?}",
                forward(ConvPrecision::Tf32, ConvLayout::Nhwc)
            );
        };
        // f32 elements: no pair alignment, segments of 7 x 3 = 21, K = 147 padded to 152.
        assert_eq!(
            (plan.element_bytes, plan.pitch, plan.k, plan.k_words()),
            (4, 3, 152, 152)
        );
        assert!(matches!(
            forward(ConvPrecision::Tf32, ConvLayout::Nchw),
            ConvAlgorithm::TensorCore(_)
        ));
        assert!(!matches!(
            forward(ConvPrecision::Fp32, ConvLayout::Nhwc),
            ConvAlgorithm::FewChannels(_)
        ));
        for pass in [ConvPass::InputGrad, ConvPass::WeightGrad] {
            let other = algorithm(&stem, pass, ConvPrecision::Tf32, ConvLayout::Nhwc, &H100);
            assert!(
                !matches!(other, ConvAlgorithm::FewChannels(_)),
                "{pass:?}: {other:?}"
            );
        }
    }
}
