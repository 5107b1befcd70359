//! conv2d and its gradients on the GPU against the f64 CPU reference: random batch,
//! channels, groups, kernels (square or not), stride, padding, dilation, bias and odd
//! spatial sizes (half the cases on the Winograd path: 3x3, stride 1, no dilation),
//! with outputs poisoned (NaN) before each run. x and dy are integers in [-4, 4], w and
//! the bias such integers times 2^-3: every product, every sum of the GEMMs and every
//! Winograd transform and product of these sizes is exact in FP32, so each result must
//! equal the reference exactly. Two runs of the backward pass are bit-identical; a
//! fixed case per kernel path checks that the plan takes it.

use host::plans::{ConvAlgorithm, ConvPass};
use host::{
    Activation, Conv2dParams, ConvGradients, ConvLayout, ConvPrecision, Error, Gpu, conv2d_problem, reference,
};
use ndarray::{Array1, Array4, ArrayD};
use proptest::prelude::*;
use tests::{gpu_or_skip, portable_gpu_or_skip, random_words, runner};

#[derive(Debug, Clone)]
pub(super) struct Case {
    pub(super) batch: usize,
    pub(super) in_channels: usize,
    pub(super) out_channels: usize,
    pub(super) kernel: [usize; 2],
    pub(super) size: [usize; 2],
    pub(super) params: Conv2dParams,
    pub(super) bias: bool,
    pub(super) seed: u64,
}

pub(super) fn case() -> impl Strategy<Value = Case> {
    let channels = prop_oneof![
        4 => (1..=3usize, 1..=6usize, 1..=6usize),
        1 => (1..=2usize, 20..=70usize, 60..=140usize),
    ];
    let general = (
        [1..=5usize, 1..=5usize],
        [1..=3usize, 1..=3usize],
        [0..=2usize, 0..=2usize],
        [1..=2usize, 1..=2usize],
        [0..=12usize, 0..=12usize],
    );
    // The Winograd path (3x3, stride 1, no dilation), with tiles around its block
    // width; padding 3 takes the implicit GEMM for the input gradient.
    let winograd = (
        Just([3usize, 3]),
        Just([1usize, 1]),
        [0..=3usize, 0..=3usize],
        Just([1usize, 1]),
        [0..=12usize, 50..=80usize],
    );
    let geometry = prop_oneof![general, winograd];
    let mode = (
        prop_oneof![Just(ConvLayout::Nchw), Just(ConvLayout::Nhwc)],
        prop_oneof![Just(ConvPrecision::Fp32), Just(ConvPrecision::Tf32)],
    );
    (1..=3usize, channels, geometry, mode, any::<bool>(), any::<u64>()).prop_map(
        |(
            batch,
            (groups, cin_per_group, cout_per_group),
            (kernel, stride, padding, dilation, extra),
            (layout, precision),
            bias,
            seed,
        )| {
            // The smallest input the dilated window fits, plus some.
            let size = [0, 1].map(|a| {
                (dilation[a] * (kernel[a] - 1) + 1)
                    .saturating_sub(2 * padding[a])
                    .max(1)
                    + extra[a]
            });
            Case {
                batch,
                in_channels: groups * cin_per_group,
                out_channels: groups * cout_per_group,
                kernel,
                size,
                params: Conv2dParams {
                    stride,
                    padding,
                    dilation,
                    groups,
                    layout,
                    precision,
                    activation: Activation::Identity,
                },
                bias,
                seed,
            }
        },
    )
}

/// Integers in [-4, 4] times `unit` (a power of two).
pub(super) fn values(shape: [usize; 4], seed: u64, unit: f32) -> Array4<f32> {
    let mut next = random_words(seed);
    Array4::from_shape_simple_fn(shape, || (((next() >> 40) % 9) as f32 - 4.0) * unit)
}

/// The data tensors' unit, and the weights'.
pub(super) const DATA: f32 = 1.0;
const WEIGHTS: f32 = 0.125;

/// The first element where `got` differs from `want`, with both values.
fn first_difference(got: &ArrayD<f32>, want: &[f64]) -> Option<(usize, f32, f64)> {
    got.iter()
        .zip(want)
        .enumerate()
        .find(|&(_, (&g, &w))| g as f64 != w)
        .map(|(i, (&g, &w))| (i, g, w))
}

/// An NCHW tensor in `layout`, row-major.
fn in_layout(a: Array4<f32>, layout: ConvLayout) -> Array4<f32> {
    match layout {
        ConvLayout::Nchw => a,
        ConvLayout::Nhwc => a.permuted_axes([0, 2, 3, 1]).as_standard_layout().into_owned(),
    }
}

pub(super) struct Tensors {
    pub(super) x: Array4<f32>,
    pub(super) w: Array4<f32>,
    pub(super) b: Array1<f32>,
}

pub(super) fn tensors(c: &Case) -> Tensors {
    let w_shape = [
        c.out_channels,
        c.in_channels / c.params.groups,
        c.kernel[0],
        c.kernel[1],
    ];
    let layout = |a: Array4<f32>| in_layout(a, c.params.layout);
    Tensors {
        x: layout(values(
            [c.batch, c.in_channels, c.size[0], c.size[1]],
            c.seed,
            DATA,
        )),
        w: layout(values(w_shape, c.seed ^ 1, WEIGHTS)),
        b: values([1, 1, 1, c.out_channels], c.seed ^ 2, WEIGHTS)
            .into_shape_with_order(c.out_channels)
            .unwrap(),
    }
}

fn check_forward(gpu: &Gpu, c: Case) -> Result<(), TestCaseError> {
    let t = tensors(&c);
    let bias = c.bias.then_some(t.b.view());
    let want = reference::conv::conv2d(t.x.view(), t.w.view(), bias, &c.params).unwrap();
    let (x, w, b) = (
        gpu.upload(&t.x).unwrap(),
        gpu.upload(&t.w).unwrap(),
        gpu.upload(&t.b).unwrap(),
    );
    let mut y = gpu.alloc::<f32>(want.shape()).unwrap();
    gpu.poison(&mut y).unwrap();
    gpu.conv2d_into(&x, &w, c.bias.then_some(&b), &c.params, &mut y)
        .unwrap();
    let got = gpu.download(&y).unwrap();
    let difference = first_difference(&got, want.as_slice().unwrap());
    prop_assert!(
        difference.is_none(),
        "{c:?}: forward (index, got, want) {difference:?}"
    );
    Ok(())
}

pub(super) fn check_backward(gpu: &Gpu, c: Case) -> Result<(), TestCaseError> {
    let t = tensors(&c);
    let (_, y_shape) = conv2d_problem(t.x.shape(), t.w.shape(), &c.params).unwrap();
    let dy = values([y_shape[0], y_shape[1], y_shape[2], y_shape[3]], c.seed ^ 3, DATA);
    let p = &c.params;
    let want_dx = reference::conv::conv2d_grad_input(dy.view(), t.w.view(), t.x.shape(), p).unwrap();
    let want_dw = reference::conv::conv2d_grad_weight(t.x.view(), dy.view(), t.w.shape(), p).unwrap();
    let want_db = reference::conv::conv2d_grad_bias(dy.view(), p.layout);

    let (x, w, gy) = (
        gpu.upload(&t.x).unwrap(),
        gpu.upload(&t.w).unwrap(),
        gpu.upload(&dy).unwrap(),
    );
    let run = || {
        let mut dx = gpu.alloc::<f32>(t.x.shape()).unwrap();
        let mut dw = gpu.alloc::<f32>(t.w.shape()).unwrap();
        let mut db = gpu.alloc::<f32>(&[c.out_channels]).unwrap();
        for g in [&mut dx, &mut dw, &mut db] {
            gpu.poison(g).unwrap();
        }
        gpu.conv2d_backward_into(&x, &w, &gy, p, (Some(&mut dx), Some(&mut dw), Some(&mut db)))
            .unwrap();
        [dx, dw, db].map(|g| gpu.download(&g).unwrap())
    };
    let first = run();
    let names = ["input", "weight", "bias"];
    let wants = [
        want_dx.as_slice().unwrap(),
        want_dw.as_slice().unwrap(),
        want_db.as_slice().unwrap(),
    ];
    for ((got, want), name) in first.iter().zip(wants).zip(names) {
        let difference = first_difference(got, want);
        prop_assert!(
            difference.is_none(),
            "{c:?}: {name} gradient (index, got, want) {difference:?}"
        );
    }
    let second = run();
    let bits = |a: &ArrayD<f32>| a.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    for ((a, b), name) in first.iter().zip(&second).zip(names) {
        prop_assert!(
            bits(a) == bits(b),
            "{c:?}: two runs of the {name} gradient differ"
        );
    }
    Ok(())
}

#[test]
fn conv2d_forward_matches_the_reference() {
    let Some(gpu) = gpu_or_skip("conv2d_forward_matches_the_reference") else {
        return;
    };
    runner().run(&case(), |c| check_forward(&gpu, c)).unwrap();
}

/// The fused epilogue, `activation(conv + bias) + residual` in the one pass that writes
/// y, against the reference of the unfused steps (in f64). ReLU and no activation are
/// exact on this data; SiLU and GELU go through `ex2.approx` (2 ulp) and a division, so
/// they are held to 4e-6 of the larger of the value and 1.
fn check_fused(gpu: &Gpu, c: Case, activation: Activation, with_residual: bool) -> Result<(), TestCaseError> {
    let params = Conv2dParams {
        activation,
        ..c.params
    };
    let t = tensors(&c);
    let bias = c.bias.then_some(t.b.view());
    let (_, y_shape) = conv2d_problem(t.x.shape(), t.w.shape(), &params).unwrap();
    let residual = values([y_shape[0], y_shape[1], y_shape[2], y_shape[3]], c.seed ^ 5, DATA);
    let residual = with_residual.then_some(residual);
    let want = reference::conv::conv2d_residual(
        t.x.view(),
        t.w.view(),
        bias,
        residual.as_ref().map(|r| r.view()),
        &params,
    )
    .unwrap();
    let (x, w, b) = (
        gpu.upload(&t.x).unwrap(),
        gpu.upload(&t.w).unwrap(),
        gpu.upload(&t.b).unwrap(),
    );
    let r = residual.as_ref().map(|r| gpu.upload(r).unwrap());
    let mut y = gpu.alloc::<f32>(want.shape()).unwrap();
    gpu.poison(&mut y).unwrap();
    gpu.conv2d_residual_into(&x, &w, c.bias.then_some(&b), r.as_ref(), &params, &mut y)
        .unwrap();
    let got = gpu.download(&y).unwrap();
    let exact = matches!(activation, Activation::Identity | Activation::Relu);
    let off = got.iter().zip(want.iter()).enumerate().find(|&(_, (&g, &w))| {
        let g = g as f64;
        if exact {
            g != w
        } else {
            (g - w).abs() > 4e-6 * w.abs().max(1.0) || g.is_nan()
        }
    });
    prop_assert!(
        off.is_none(),
        "{c:?} {activation:?} residual {with_residual}: (index, (got, want)) {off:?}"
    );
    Ok(())
}

#[test]
fn conv2d_fused_epilogue_matches_the_unfused_reference() {
    let test = "conv2d_fused_epilogue_matches_the_unfused_reference";
    let (Some(gpu), Some(portable)) = (gpu_or_skip(test), portable_gpu_or_skip(test)) else {
        return;
    };
    let activation = prop_oneof![
        Just(Activation::Identity),
        Just(Activation::Relu),
        Just(Activation::Silu),
        Just(Activation::GeluTanh)
    ];
    // Every tensor-core epilogue on Hopper: from registers (`mma.sync`, the portable
    // kernels, and `wgmma` without a residual and with no activation but ReLU) and
    // staged (`wgmma` with the others).
    for gpu in [&gpu, &portable] {
        runner()
            .run(
                &(case(), activation.clone(), any::<bool>()),
                |(c, activation, residual)| check_fused(gpu, c, activation, residual),
            )
            .unwrap();
    }
}

/// The same on the kernels every device of the GPU's architecture has (`mma.sync` for
/// TF32 on Hopper, where the default is `wgmma`).
#[test]
fn conv2d_forward_on_portable_kernels_matches_the_reference() {
    let Some(gpu) = portable_gpu_or_skip("conv2d_forward_on_portable_kernels_matches_the_reference") else {
        return;
    };
    runner().run(&case(), |c| check_forward(&gpu, c)).unwrap();
}

#[test]
fn conv2d_backward_matches_the_reference_and_is_deterministic() {
    let Some(gpu) = gpu_or_skip("conv2d_backward_matches_the_reference_and_is_deterministic") else {
        return;
    };
    runner().run(&case(), |c| check_backward(&gpu, c)).unwrap();
}

/// One case per kernel path, so that every kernel runs even with few random cases
/// (the sanitizer runs use few).
#[test]
fn every_conv_kernel_matches_the_reference_on_fixed_cases() {
    let test = "every_conv_kernel_matches_the_reference_on_fixed_cases";
    let (Some(gpu), Some(portable)) = (gpu_or_skip(test), portable_gpu_or_skip(test)) else {
        return;
    };
    // Hopper runs the tensor-core passes on `wgmma` by default, `mma.sync` otherwise.
    let hopper = gpu.info().compute_capability == (9, 0);
    let case = |batch, channels: [usize; 2], kernel, size, params, bias| Case {
        batch,
        in_channels: channels[0],
        out_channels: channels[1],
        kernel,
        size,
        params,
        bias,
        seed: 7,
    };
    let p = Conv2dParams::default();
    // What each pass must take: Winograd, the implicit GEMM with a weight gradient
    // split into partials or not, or the tensor cores with x copied 16 or 4 bytes at a
    // time.
    #[derive(Clone, Copy, PartialEq, Debug)]
    enum Path {
        Winograd,
        Gemm,
        SplitGemm,
        TensorCore,
        TensorCoreScalar,
        /// Bulk tensor copies (TMA), Hopper only: `TensorCore` elsewhere; in tiles of
        /// 128 output channels, or of 64 (`Narrow`) for 64 or fewer.
        TensorCoreBulk,
        TensorCoreBulkNarrow,
        /// NCHW tensors, x and w changed to NHWC for bulk copies, y written in NCHW:
        /// Hopper only, `TensorCoreScalar` elsewhere.
        TensorCoreBulkFromNchw,
        TensorCoreBulkFromNchwNarrow,
        /// NCHW x staged as it lies, by strips of boxes along its rows, y written in
        /// NCHW: Hopper only, `TensorCoreScalar` elsewhere; K split or not.
        TensorCoreBoxes,
        TensorCoreBoxesNarrow,
        SplitTensorCoreBoxesNarrow,
        /// NHWC x (as given, or changed from NCHW) staged by row strips of two boxes,
        /// y in the case's layout: Hopper only, `TensorCore` elsewhere (NCHW:
        /// `TensorCoreScalar`); K split or not.
        TensorCoreStrips,
        SplitTensorCoreStrips,
        /// K split over blocks (`wgmma` only: `TensorCore` and `TensorCoreScalar`
        /// elsewhere), staged by bulk copies or gathered from NCHW.
        SplitTensorCoreBulkNarrow,
        SplitTensorCoreScalar,
        /// The strided input gradient by phases, each a forward pass on the tensor
        /// cores.
        Phases,
        /// The strided input gradient as the phases' one forward pass (NHWC, Hopper
        /// only: over dy upsampled on `mma.sync` elsewhere, `TensorCore`).
        SubPixel,
        /// The direct kernels (depthwise, or the input gradient of few channels).
        Direct,
        /// The input gradient of few channels and one group over staged dy tiles.
        DirectStaged,
        /// The depthwise stencil (forward, and the input gradient at stride 1).
        Stencil,
        /// The TF32 forward pass of few input channels (a stem) over NHWC tensors.
        FewChannels,
        /// The depthwise stencil's column kernels (NHWC, stride 1, 3 x 3 and 5 x 5, every
        /// pass).
        StencilColumns,
        /// The tensor cores' weight gradient, x and dy copied 16 bytes at a time, in
        /// one split or several; or either operand 4 bytes at a time.
        TensorCoreGrad,
        SplitTensorCoreGrad,
        TensorCoreGradScalar,
        /// The weight gradient on `wgmma` (NCHW or NHWC) in one split or several,
        /// Hopper only: `TensorCoreGrad` elsewhere (in one split or several).
        WarpgroupGrad,
        SplitWarpgroupGrad,
    }
    use Path::{
        Direct, DirectStaged, FewChannels, Gemm, Phases, SplitGemm, SplitTensorCoreBoxesNarrow,
        SplitTensorCoreBulkNarrow, SplitTensorCoreGrad, SplitTensorCoreScalar, SplitTensorCoreStrips,
        SplitWarpgroupGrad, Stencil, StencilColumns, SubPixel, TensorCore, TensorCoreBoxes,
        TensorCoreBoxesNarrow, TensorCoreBulk, TensorCoreBulkFromNchw, TensorCoreBulkFromNchwNarrow,
        TensorCoreBulkNarrow, TensorCoreGrad, TensorCoreGradScalar, TensorCoreScalar, TensorCoreStrips,
        WarpgroupGrad, Winograd,
    };
    let tf32 = |layout| Conv2dParams {
        layout,
        precision: ConvPrecision::Tf32,
        ..p
    };
    // 68 input channels (a partial second chunk of 64), 136 output channels (a partial
    // second tile of 128), a 2x2 window dilated along w (4 taps: 8 column blocks, the
    // last tile of three one short), output rows of 40 pixels (in NCHW a partial second
    // k-tile, split three ways; in NHWC 240 pixels of the batch, a partial 8th k-tile),
    // windows past every edge.
    let warpgroup_grad = |layout| {
        case(
            2,
            [68, 136],
            [2, 2],
            [5, 40],
            Conv2dParams {
                padding: [1, 1],
                dilation: [1, 2],
                ..tf32(layout)
            },
            true,
        )
    };
    let stem = |layout| {
        case(
            1,
            [3, 16],
            [7, 7],
            [20, 23],
            Conv2dParams {
                stride: [2, 2],
                padding: [3, 3],
                ..tf32(layout)
            },
            false,
        )
    };
    let cases = [
        // Winograd in all three passes, with a bias.
        (
            case(
                2,
                [5, 40],
                [3, 3],
                [9, 70],
                Conv2dParams { padding: [1, 1], ..p },
                true,
            ),
            [Winograd, Winograd, Winograd],
        ),
        // Winograd on rows of 31 tiles, padded to runs of 32 slots; an odd width, stored
        // a column at a time.
        (
            case(
                2,
                [5, 40],
                [3, 3],
                [5, 61],
                Conv2dParams { padding: [1, 1], ..p },
                true,
            ),
            [Winograd, Winograd, Winograd],
        ),
        // Winograd forward and weight gradient; padding 3 sends dx to the implicit GEMM
        // (6 input channels: more than the direct kernel takes).
        (
            case(
                1,
                [6, 4],
                [3, 3],
                [6, 7],
                Conv2dParams { padding: [3, 3], ..p },
                false,
            ),
            [Winograd, Gemm, Winograd],
        ),
        // The implicit GEMM everywhere, split weight gradient.
        (
            case(
                2,
                [10, 6],
                [2, 3],
                [11, 9],
                Conv2dParams {
                    stride: [2, 1],
                    padding: [1, 2],
                    dilation: [2, 1],
                    groups: 2,
                    ..p
                },
                true,
            ),
            [Gemm, Gemm, SplitGemm],
        ),
        // FP32 by phases: a 1x1 window at strides 2 x 3 over NHWC tensors (the phases
        // on the implicit GEMM over NCHW), one phase of six with a tap.
        (
            case(
                2,
                [8, 12],
                [1, 1],
                [9, 10],
                Conv2dParams {
                    stride: [2, 3],
                    layout: ConvLayout::Nhwc,
                    ..p
                },
                true,
            ),
            [Gemm, Phases, SplitGemm],
        ),
        // FP32 by phases where every phase has taps: 3x3 at stride 2 (phases of 1, 2,
        // 2 and 4 taps; odd extents, so the last row and column phases are one short).
        (
            case(
                2,
                [6, 10],
                [3, 3],
                [9, 11],
                Conv2dParams {
                    stride: [2, 2],
                    padding: [1, 1],
                    ..p
                },
                true,
            ),
            [Gemm, Phases, SplitGemm],
        ),
        // The same with rows of 12: the phases interleaved 4 columns at a time.
        (
            case(
                2,
                [6, 10],
                [3, 3],
                [9, 12],
                Conv2dParams {
                    stride: [2, 2],
                    padding: [1, 1],
                    ..p
                },
                true,
            ),
            [Gemm, Phases, SplitGemm],
        ),
        // A weight gradient short enough for one split (no partials).
        // dx by the direct kernel (2 input channels).
        (
            case(1, [2, 3], [1, 1], [2, 2], p, false),
            [Gemm, DirectStaged, Gemm],
        ),
        // dx over staged dy tiles: 3 input channels, 5x5 at stride 2, phases of 20 rows
        // and 75 columns (two tiles along each axis, the second partial), 10 output
        // channels (a partial second chunk of 8).
        (
            case(
                2,
                [3, 10],
                [5, 5],
                [40, 150],
                Conv2dParams {
                    stride: [2, 2],
                    padding: [2, 2],
                    ..p
                },
                true,
            ),
            [Gemm, DirectStaged, SplitGemm],
        ),
        // TF32 on the tensor cores, channels last, with a bias: bulk tensor copies on
        // Hopper, else 16-byte copies (8 input channels); several blocks of outputs and
        // of output channels (130 > 128). The input gradient is the forward pass of dy
        // (130 channels: copied one at a time, 37 k-tiles split in two on Hopper) by
        // the flipped weights; the weight
        // gradient's dy copied one channel at a time, its pixels split over blocks.
        (
            case(
                2,
                [8, 130],
                [3, 3],
                [11, 70],
                Conv2dParams {
                    padding: [1, 1],
                    ..tf32(ConvLayout::Nhwc)
                },
                true,
            ),
            [TensorCoreBulk, SplitTensorCoreScalar, TensorCoreGradScalar],
        ),
        // The same with 32 output channels: the input gradient's dy by bulk copies too,
        // the weight gradient's operands 16 bytes at a time.
        (
            case(
                2,
                [16, 32],
                [3, 3],
                [9, 12],
                Conv2dParams {
                    padding: [1, 1],
                    ..tf32(ConvLayout::Nhwc)
                },
                false,
            ),
            [TensorCoreBulkNarrow, TensorCoreBulkNarrow, TensorCoreGrad],
        ),
        // 2056 output channels with a bias: the `wgmma` forward reads the first 2048
        // channels' bias from shared memory, the rest from global memory.
        (
            case(1, [8, 2056], [1, 1], [4, 9], tf32(ConvLayout::Nhwc), true),
            [TensorCoreBulk, SplitTensorCoreBulkNarrow, TensorCoreGrad],
        ),
        // NCHW, then NHWC (x transposed in shared memory), in TF32, stride 1: the weight
        // gradient on `wgmma` on Hopper.
        (
            warpgroup_grad(ConvLayout::Nchw),
            [TensorCoreBulkFromNchw, TensorCoreBulkFromNchw, SplitWarpgroupGrad],
        ),
        (
            warpgroup_grad(ConvLayout::Nhwc),
            [TensorCoreBulk, TensorCoreBulk, WarpgroupGrad],
        ),
        // A pointwise NCHW layer of 64 input channels (one column block of three, the
        // other two repeating it unstored): its weight gradient on `wgmma` as the
        // tensors lie, over images of one row of 120 pixels.
        (
            case(2, [64, 40], [1, 1], [6, 20], tf32(ConvLayout::Nchw), true),
            [
                TensorCoreBulkFromNchwNarrow,
                TensorCoreBulkFromNchwNarrow,
                WarpgroupGrad,
            ],
        ),
        // The NHWC weight gradient over im2col boxes at stride 2: 48 input channels
        // (three column blocks of a partial chunk), 136 output channels in two tiles,
        // 540 output pixels of 4 images of 15 x 9 (17 k-tiles across rows and images,
        // the last partial) split in two. The input gradient as the phases' one pass:
        // 192 channels of the phases (a partial second tile), dy's 136 in five chunks
        // (the last partial).
        (
            case(
                4,
                [48, 136],
                [3, 3],
                [29, 17],
                Conv2dParams {
                    stride: [2, 2],
                    padding: [1, 1],
                    ..tf32(ConvLayout::Nhwc)
                },
                true,
            ),
            [TensorCoreBulk, SubPixel, SplitWarpgroupGrad],
        ),
        // NCHW at stride 1, rows of 500 and 250 pixels (tiles of 256: 12 and 6 GEMM
        // rows dropped per row): x and dy staged as they lie, in strips that start at
        // 16-byte multiples (the taps' first columns 2 before, at, and 2 past a tile's;
        // then 0, 1, 2 past). 40 input channels (a chunk of 32 and one of 8), 136
        // output channels (a partial second tile), a window dilated along w and past
        // every edge; the input gradient split in two.
        (
            case(
                1,
                [40, 136],
                [3, 3],
                [3, 500],
                Conv2dParams {
                    padding: [1, 2],
                    dilation: [1, 2],
                    ..tf32(ConvLayout::Nchw)
                },
                true,
            ),
            [TensorCoreBoxes, SplitTensorCoreBoxesNarrow, SplitWarpgroupGrad],
        ),
        // The same over NHWC tensors: x staged by row strips of two boxes of 136
        // pixels (the 256 of a tile and the 4 of the window's width), each serving
        // the three taps of a kernel row; tiles of 64 output channels (the third of
        // 8); the input gradient's K split in two, the second part starting at the
        // last tap of a kernel row (its strip staged there).
        (
            case(
                1,
                [40, 136],
                [3, 3],
                [3, 500],
                Conv2dParams {
                    padding: [1, 2],
                    dilation: [1, 2],
                    ..tf32(ConvLayout::Nhwc)
                },
                true,
            ),
            [TensorCoreStrips, SplitTensorCoreStrips, SplitWarpgroupGrad],
        ),
        (
            case(
                3,
                [16, 24],
                [3, 3],
                [2, 252],
                Conv2dParams {
                    padding: [1, 0],
                    ..tf32(ConvLayout::Nchw)
                },
                true,
            ),
            [TensorCoreBoxesNarrow, TensorCoreStrips, SplitTensorCoreGrad],
        ),
        // Two groups of a whole chunk each.
        (
            case(
                1,
                [64, 64],
                [3, 3],
                [2, 256],
                Conv2dParams {
                    padding: [1, 1],
                    groups: 2,
                    ..tf32(ConvLayout::Nchw)
                },
                true,
            ),
            [TensorCoreBoxesNarrow, TensorCoreBoxesNarrow, SplitTensorCoreGrad],
        ),
        // 7 x 7 maps over NCHW: rows too short for the NCHW `wgmma` weight gradient, so
        // x and dy go to NHWC for its im2col variant.
        (
            case(
                12,
                [64, 40],
                [3, 3],
                [7, 7],
                Conv2dParams {
                    padding: [1, 1],
                    ..tf32(ConvLayout::Nchw)
                },
                true,
            ),
            [
                TensorCoreBulkFromNchwNarrow,
                TensorCoreBulkFromNchwNarrow,
                WarpgroupGrad,
            ],
        ),
        // A weight gradient over 4500 pixels: its sums split over blocks, and the bias
        // gradient's (NHWC).
        (
            case(
                3,
                [8, 32],
                [3, 3],
                [30, 50],
                Conv2dParams {
                    padding: [1, 1],
                    ..tf32(ConvLayout::Nhwc)
                },
                true,
            ),
            [TensorCoreBulkNarrow, TensorCoreBulkNarrow, SplitTensorCoreGrad],
        ),
        // NCHW, dilated, padded unevenly: both data passes on the tensor cores, x
        // gathered from NCHW (5 channels), dy changed to NHWC on Hopper (12 channels).
        (
            case(
                1,
                [5, 12],
                [3, 3],
                [10, 13],
                Conv2dParams {
                    padding: [2, 1],
                    dilation: [1, 2],
                    ..tf32(ConvLayout::Nchw)
                },
                true,
            ),
            [
                TensorCoreScalar,
                TensorCoreBulkFromNchwNarrow,
                TensorCoreGradScalar,
            ],
        ),
        // NCHW with channels in multiples of 4, with a bias: both data passes by bulk
        // copies of NHWC copies on Hopper, y and dx written in NCHW.
        (
            case(
                2,
                [16, 32],
                [3, 3],
                [9, 12],
                Conv2dParams {
                    padding: [1, 1],
                    ..tf32(ConvLayout::Nchw)
                },
                true,
            ),
            [
                TensorCoreBulkFromNchwNarrow,
                TensorCoreBulkFromNchwNarrow,
                TensorCoreGrad,
            ],
        ),
        // The same with 96 output channels: the forward pass in tiles of 128.
        (
            case(
                1,
                [16, 96],
                [3, 3],
                [9, 12],
                Conv2dParams {
                    padding: [1, 1],
                    ..tf32(ConvLayout::Nchw)
                },
                true,
            ),
            [
                TensorCoreBulkFromNchw,
                TensorCoreBulkFromNchwNarrow,
                TensorCoreGrad,
            ],
        ),
        // Small maps of many channels: the forward pass's 72 k-tiles split four ways
        // on Hopper, by bulk copies (NHWC) and gathered from NCHW (258 channels, 73
        // k-tiles: a short last split), with a bias.
        (
            case(
                1,
                [256, 40],
                [3, 3],
                [6, 7],
                Conv2dParams {
                    padding: [1, 1],
                    ..tf32(ConvLayout::Nhwc)
                },
                true,
            ),
            [SplitTensorCoreBulkNarrow, TensorCoreBulk, WarpgroupGrad],
        ),
        (
            case(
                2,
                [258, 24],
                [3, 3],
                [5, 6],
                Conv2dParams {
                    padding: [1, 1],
                    ..tf32(ConvLayout::Nchw)
                },
                true,
            ),
            [
                SplitTensorCoreScalar,
                TensorCoreBulkFromNchw,
                TensorCoreGradScalar,
            ],
        ),
        // Strided input gradients by phases, with a bias: 3x3 at strides 4 and 2 over
        // NCHW (row phases of 1, 1, 0 and 1 taps, the last one's padding negative;
        // column phases of 1 and 2 taps, the second's outputs one short); 1x1 at stride
        // 2 over NHWC, 9 rows (one phase with a tap, its last row alone); a 2x3 window
        // at strides 3 and 2 padded by 2 rows (one row phase without taps, one whose
        // padding goes negative).
        (
            case(
                2,
                [16, 24],
                [3, 3],
                [11, 14],
                Conv2dParams {
                    stride: [4, 2],
                    padding: [1, 1],
                    ..tf32(ConvLayout::Nchw)
                },
                true,
            ),
            [TensorCoreBulkFromNchwNarrow, Phases, TensorCoreGrad],
        ),
        (
            case(
                2,
                [16, 32],
                [1, 1],
                [9, 12],
                Conv2dParams {
                    stride: [2, 2],
                    ..tf32(ConvLayout::Nhwc)
                },
                true,
            ),
            [TensorCoreBulkNarrow, Phases, TensorCoreGrad],
        ),
        (
            case(
                2,
                [12, 20],
                [2, 3],
                [10, 11],
                Conv2dParams {
                    stride: [3, 2],
                    padding: [2, 0],
                    ..tf32(ConvLayout::Nhwc)
                },
                true,
            ),
            [TensorCoreBulkNarrow, Phases, TensorCoreGrad],
        ),
        // A stem: 3 input channels, a 7x7 window at stride 2, NCHW then NHWC: in NCHW x
        // gathered one element at a time, the weights too (K = 147), in NHWC the
        // few-channel kernel; dx over staged dy tiles (over NCHW tensors in either
        // layout).
        (
            stem(ConvLayout::Nchw),
            [TensorCoreScalar, DirectStaged, TensorCoreGradScalar],
        ),
        (
            stem(ConvLayout::Nhwc),
            [FewChannels, DirectStaged, TensorCoreGradScalar],
        ),
        // Groups of 4 channels (the input gradient on the direct kernel), dilation,
        // channels last.
        (
            case(
                3,
                [8, 6],
                [2, 3],
                [9, 10],
                Conv2dParams {
                    dilation: [2, 1],
                    groups: 2,
                    ..tf32(ConvLayout::Nhwc)
                },
                true,
            ),
            [TensorCore, Direct, TensorCoreGradScalar],
        ),
        // Channels last, a strided and dilated window over 12 channels (one partial
        // chunk of 32): bulk tensor copies on Hopper; the input gradient over dy
        // upsampled by the stride.
        (
            case(
                2,
                [12, 20],
                [3, 3],
                [13, 17],
                Conv2dParams {
                    stride: [2, 1],
                    padding: [1, 2],
                    dilation: [1, 2],
                    ..tf32(ConvLayout::Nhwc)
                },
                true,
            ),
            [TensorCoreBulkNarrow, TensorCoreBulkNarrow, TensorCoreGrad],
        ),
        // Channels last, 3x3 at stride 2 over odd extents (7 x 9 outputs): the input
        // gradient as the phases' one pass, 2x2 windows of dy's 20 channels (a partial
        // chunk of 32) into 160 channels of the phases (a partial second tile of 128),
        // its outputs 8 x 10 (the first row and column, and those past x's edge,
        // dropped).
        (
            case(
                2,
                [40, 20],
                [3, 3],
                [13, 17],
                Conv2dParams {
                    stride: [2, 2],
                    padding: [1, 1],
                    ..tf32(ConvLayout::Nhwc)
                },
                true,
            ),
            [TensorCoreBulkNarrow, SubPixel, WarpgroupGrad],
        ),
        // Depthwise, four output channels per input channel (dy read 16 bytes at a time
        // by the input gradient), strided, padded and dilated unevenly, channels last,
        // with a bias: the depthwise kernels in every pass.
        (
            case(
                2,
                [6, 24],
                [3, 3],
                [30, 40],
                Conv2dParams {
                    stride: [2, 1],
                    padding: [1, 2],
                    dilation: [1, 2],
                    groups: 6,
                    layout: ConvLayout::Nhwc,
                    ..p
                },
                true,
            ),
            [Stencil, Direct, Stencil],
        ),
        // Depthwise in TF32 (the depthwise kernels are exact FP32 in every precision),
        // NCHW, with a bias: its gradient split over 9800 pixels.
        (
            case(
                2,
                [5, 5],
                [3, 3],
                [70, 70],
                Conv2dParams {
                    padding: [1, 1],
                    groups: 5,
                    ..tf32(ConvLayout::Nchw)
                },
                true,
            ),
            [Stencil, Stencil, Stencil],
        ),
        // Depthwise, two output channels per input channel, channels last, padded
        // past the window along h (the input gradient's flipped window starts after
        // its output) and dilated along w: the stencil's NHWC tiles and terms.
        (
            case(
                2,
                [6, 12],
                [3, 3],
                [11, 13],
                Conv2dParams {
                    padding: [3, 0],
                    dilation: [1, 2],
                    groups: 6,
                    layout: ConvLayout::Nhwc,
                    ..p
                },
                true,
            ),
            [Stencil, Stencil, Stencil],
        ),
        // Depthwise 3 x 3 and 5 x 5 at stride 1, channels last, eight channels (two
        // vectors of four), with a bias: the column kernels in every pass, runs of 6
        // and 5 output rows (3 x 3) and of 8 (5 x 5: 16 x 9 outputs, a group of 8
        // columns and one of 1).
        (
            case(
                2,
                [8, 8],
                [3, 3],
                [11, 13],
                Conv2dParams {
                    padding: [1, 1],
                    groups: 8,
                    layout: ConvLayout::Nhwc,
                    ..p
                },
                true,
            ),
            [StencilColumns, StencilColumns, StencilColumns],
        ),
        (
            case(
                1,
                [8, 8],
                [5, 5],
                [16, 11],
                Conv2dParams {
                    padding: [2, 1],
                    groups: 8,
                    layout: ConvLayout::Nhwc,
                    ..p
                },
                true,
            ),
            [StencilColumns, StencilColumns, StencilColumns],
        ),
        // Depthwise 7 x 7 over NHWC and 2 x 5 over NCHW (their taps in a loop), 5 x 5
        // strided over NCHW (its taps unrolled; the input gradient on the direct
        // kernel).
        (
            case(
                2,
                [8, 8],
                [7, 7],
                [12, 12],
                Conv2dParams {
                    padding: [3, 3],
                    groups: 8,
                    layout: ConvLayout::Nhwc,
                    ..p
                },
                true,
            ),
            [Stencil, Stencil, Direct],
        ),
        (
            case(
                2,
                [3, 3],
                [5, 5],
                [190, 100],
                Conv2dParams {
                    stride: [2, 2],
                    padding: [2, 1],
                    groups: 3,
                    ..p
                },
                false,
            ),
            [Stencil, Direct, Stencil],
        ),
        (
            case(
                2,
                [4, 4],
                [2, 5],
                [60, 70],
                Conv2dParams {
                    padding: [1, 2],
                    groups: 4,
                    ..p
                },
                true,
            ),
            [Stencil, Stencil, Direct],
        ),
        // A TF32 NHWC stem: the few-channel forward pass, partial tiles of rows, columns
        // and channels.
        (
            case(
                2,
                [3, 72],
                [7, 7],
                [30, 70],
                Conv2dParams {
                    stride: [2, 2],
                    padding: [3, 3],
                    precision: ConvPrecision::Tf32,
                    layout: ConvLayout::Nhwc,
                    ..p
                },
                true,
            ),
            [FewChannels, DirectStaged, TensorCoreGradScalar],
        ),
        // Depthwise with a window too wide to stage: the direct kernels.
        (
            case(
                1,
                [2, 2],
                [3, 3],
                [96, 96],
                Conv2dParams {
                    padding: [300, 300],
                    dilation: [300, 300],
                    groups: 2,
                    ..p
                },
                false,
            ),
            [Direct, Direct, Direct],
        ),
    ];
    let passes = [ConvPass::Forward, ConvPass::InputGrad, ConvPass::WeightGrad];
    for (gpu, warpgroup_mma) in [(&*gpu, hopper as u32), (&*portable, 0)] {
        for (c, paths) in cases.iter().cloned() {
            let t = tensors(&c);
            for (pass, expected) in passes.into_iter().zip(paths) {
                let path = match gpu
                    .conv2d_algorithm(t.x.shape(), t.w.shape(), &c.params, pass)
                    .unwrap()
                {
                    ConvAlgorithm::Winograd(_) => Winograd,
                    ConvAlgorithm::Direct(plan) => {
                        // The input gradient of one group runs over NCHW tensors.
                        let layout = if pass == ConvPass::InputGrad && c.params.groups == 1 {
                            ConvLayout::Nchw
                        } else {
                            c.params.layout
                        };
                        assert_eq!(plan.layout(), layout, "{c:?} {pass:?}");
                        // The depthwise cases have outputs enough to split the weight
                        // gradient's sums.
                        let depthwise = c.in_channels == c.params.groups;
                        assert!(!depthwise || plan.split > 1, "{c:?} {pass:?}");
                        if pass == ConvPass::InputGrad && plan.staged_input_grad == 1 {
                            DirectStaged
                        } else {
                            Direct
                        }
                    }
                    ConvAlgorithm::Stencil(plan) => {
                        assert_eq!(plan.layout(), c.params.layout, "{c:?} {pass:?}");
                        // The arrays are aligned: the columns take what they can.
                        if plan.takes_columns(0, 4) {
                            StencilColumns
                        } else {
                            Stencil
                        }
                    }
                    ConvAlgorithm::FewChannels(plan) => {
                        assert_eq!(plan.element_bytes, 4, "{c:?} {pass:?}");
                        FewChannels
                    }
                    ConvAlgorithm::Phases(plan) => {
                        // FP32 phases run on the CUDA cores' kernels, over NCHW.
                        let layout = match c.params.precision {
                            ConvPrecision::Tf32 => c.params.layout,
                            _ => ConvLayout::Nchw,
                        };
                        assert_eq!(plan.layout(), layout, "{c:?} {pass:?}");
                        assert_eq!(plan.tensor_cores == 1, c.params.precision == ConvPrecision::Tf32);
                        Phases
                    }
                    ConvAlgorithm::SubPixel(plan) => {
                        assert_eq!((plan.forward.splits, plan.forward.row_strips), (1, 0));
                        SubPixel
                    }
                    ConvAlgorithm::ImplicitGemm(plan) if plan.split > 1 => SplitGemm,
                    ConvAlgorithm::ImplicitGemm(_) => Gemm,
                    ConvAlgorithm::WarpgroupWeightGrad(plan) if plan.split > 1 => SplitWarpgroupGrad,
                    ConvAlgorithm::WarpgroupWeightGrad(_) => WarpgroupGrad,
                    ConvAlgorithm::TensorCoreWeightGrad(plan) => {
                        match (plan.a_vector & plan.b_vector, plan.split) {
                            (0, _) => TensorCoreGradScalar,
                            (_, 1) => TensorCoreGrad,
                            _ => SplitTensorCoreGrad,
                        }
                    }
                    ConvAlgorithm::TensorCore(plan) => {
                        assert_eq!(plan.warpgroup_mma, warpgroup_mma, "{c:?} {pass:?}");
                        assert_eq!(plan.output_layout(), c.params.layout, "{c:?} {pass:?}");
                        let narrow = plan.tile_n == 64;
                        let boxes = plan.nchw_boxes();
                        let strips = plan.row_strips == 1 && !boxes;
                        match (plan.bulk_copies, plan.a_vector) {
                            (1, _) if plan.splits > 1 && narrow && boxes => SplitTensorCoreBoxesNarrow,
                            (1, _) if plan.splits > 1 && strips => SplitTensorCoreStrips,
                            (1, _) if plan.splits > 1 && narrow => SplitTensorCoreBulkNarrow,
                            (0, 0) if plan.splits > 1 => SplitTensorCoreScalar,
                            _ if plan.splits > 1 => panic!("{c:?} {pass:?}: {plan:?}"),
                            (1, _) if boxes && narrow => TensorCoreBoxesNarrow,
                            (1, _) if boxes => TensorCoreBoxes,
                            (1, _) if strips => TensorCoreStrips,
                            (1, _) if c.params.layout == ConvLayout::Nchw && narrow => {
                                TensorCoreBulkFromNchwNarrow
                            }
                            (1, _) if c.params.layout == ConvLayout::Nchw => TensorCoreBulkFromNchw,
                            (1, _) if narrow => TensorCoreBulkNarrow,
                            (1, _) => TensorCoreBulk,
                            (_, 1) => TensorCore,
                            _ => TensorCoreScalar,
                        }
                    }
                };
                let (path, expected) = match (path, expected) {
                    (path, TensorCoreBulk | TensorCoreBulkNarrow) if warpgroup_mma == 0 => (path, TensorCore),
                    (
                        path,
                        TensorCoreBulkFromNchw
                        | TensorCoreBulkFromNchwNarrow
                        | TensorCoreBoxes
                        | TensorCoreBoxesNarrow
                        | SplitTensorCoreBoxesNarrow,
                    ) if warpgroup_mma == 0 => (path, TensorCoreScalar),
                    (SplitTensorCoreGrad, WarpgroupGrad | SplitWarpgroupGrad) if warpgroup_mma == 0 => {
                        (TensorCoreGrad, TensorCoreGrad)
                    }
                    (path, WarpgroupGrad | SplitWarpgroupGrad) if warpgroup_mma == 0 => {
                        (path, TensorCoreGrad)
                    }
                    (path, SplitTensorCoreBulkNarrow | SubPixel) if warpgroup_mma == 0 => (path, TensorCore),
                    (path, TensorCoreStrips | SplitTensorCoreStrips) if warpgroup_mma == 0 => {
                        match c.params.layout {
                            ConvLayout::Nhwc => (path, TensorCore),
                            ConvLayout::Nchw => (path, TensorCoreScalar),
                        }
                    }
                    (path, SplitTensorCoreScalar) if warpgroup_mma == 0 => (path, TensorCoreScalar),
                    other => other,
                };
                assert_eq!(path, expected, "{c:?} {pass:?}");
            }
            // The split epilogue, which adds the parts, applies the fused one too.
            if paths[0] == SplitTensorCoreBulkNarrow || paths[0] == SplitTensorCoreScalar {
                check_fused(gpu, c.clone(), Activation::Relu, true).unwrap();
            }
            // The few-channel kernel's epilogue, per stored pair.
            if paths[0] == FewChannels {
                check_fused(gpu, c.clone(), Activation::Silu, true).unwrap();
            }
            // The epilogue through shared memory: in the stages the strips filled, or
            // in each consumer's half of the last A of a tile both share.
            if matches!(
                paths[0],
                TensorCoreBoxes | TensorCoreBoxesNarrow | TensorCoreStrips | TensorCoreBulk
            ) {
                check_fused(gpu, c.clone(), Activation::Silu, true).unwrap();
            }
            check_forward(gpu, c.clone()).unwrap();
            check_backward(gpu, c).unwrap();
        }
    }
}

#[test]
fn conv2d_backward_computes_only_what_is_asked() {
    let Some(gpu) = gpu_or_skip("conv2d_backward_computes_only_what_is_asked") else {
        return;
    };
    let x = gpu.upload(&values([2, 3, 9, 7], 1, DATA)).unwrap();
    let w = gpu.upload(&values([4, 3, 3, 3], 2, DATA)).unwrap();
    let dy = gpu.upload(&values([2, 4, 7, 5], 3, DATA)).unwrap();
    let p = Conv2dParams::default();
    let only_weight = ConvGradients {
        input: false,
        weight: true,
        bias: false,
    };
    let (dx, dw, db) = gpu.conv2d_backward(&x, &w, &dy, &p, only_weight).unwrap();
    assert!(dx.is_none() && db.is_none());
    assert_eq!(dw.unwrap().shape(), &[4, 3, 3, 3]);
    let (dx, dw, db) = gpu.conv2d_backward(&x, &w, &dy, &p, ConvGradients::ALL).unwrap();
    assert_eq!(
        (dx.unwrap().shape(), dw.unwrap().shape(), db.unwrap().shape()),
        (&[2, 3, 9, 7][..], &[4, 3, 3, 3][..], &[4][..])
    );
    // An empty batch gives empty outputs and a zero weight gradient.
    let x0 = gpu.upload(&values([0, 3, 9, 7], 4, DATA)).unwrap();
    let dy0 = gpu.upload(&values([0, 4, 7, 5], 5, DATA)).unwrap();
    assert_eq!(gpu.conv2d(&x0, &w, None, &p).unwrap().shape(), &[0, 4, 7, 5]);
    let (_, dw, db) = gpu
        .conv2d_backward(&x0, &w, &dy0, &p, ConvGradients::ALL)
        .unwrap();
    assert!(gpu.download(&dw.unwrap()).unwrap().iter().all(|&v| v == 0.0));
    assert!(gpu.download(&db.unwrap()).unwrap().iter().all(|&v| v == 0.0));
}

#[test]
fn invalid_conv2d_parameters_are_errors_that_name_them() {
    let p = Conv2dParams::default();
    let parameter = |x: &[usize], w: &[usize], p: Conv2dParams| match conv2d_problem(x, w, &p) {
        Err(Error::InvalidParameter { parameter, .. }) => parameter,
        other => panic!("expected InvalidParameter for x {x:?} w {w:?} {p:?}, got {other:?}"),
    };
    let groups = |g| Conv2dParams { groups: g, ..p };
    assert_eq!(parameter(&[1, 6, 8, 8], &[4, 2, 3, 3], groups(4)), "groups");
    assert_eq!(parameter(&[1, 6, 8, 8], &[5, 2, 3, 3], groups(3)), "groups");
    assert_eq!(parameter(&[1, 6, 8, 8], &[6, 6, 3, 3], groups(0)), "groups");
    let stride = Conv2dParams { stride: [1, 0], ..p };
    assert_eq!(parameter(&[1, 1, 8, 8], &[1, 1, 3, 3], stride), "stride");
    let dilation = Conv2dParams {
        dilation: [0, 1],
        ..p
    };
    assert_eq!(parameter(&[1, 1, 8, 8], &[1, 1, 3, 3], dilation), "dilation");
    assert_eq!(parameter(&[1, 1, 2, 8], &[1, 1, 3, 3], p), "kernel");
    // A dilated 3x3 window spans 5: over a 4x4 input, fits once padded by 1.
    let dilated = Conv2dParams {
        dilation: [2, 2],
        ..p
    };
    assert_eq!(parameter(&[1, 1, 4, 4], &[1, 1, 3, 3], dilated), "kernel");
    let padded = Conv2dParams {
        padding: [1, 1],
        ..dilated
    };
    assert_eq!(
        conv2d_problem(&[1, 1, 4, 4], &[1, 1, 3, 3], &padded).unwrap().1,
        vec![1, 1, 2, 2]
    );
    assert_eq!(parameter(&[1, 0, 8, 8], &[1, 0, 3, 3], p), "channels");
    assert_eq!(
        parameter(
            &[1, 1, 0, 8],
            &[1, 1, 1, 1],
            Conv2dParams { padding: [1, 1], ..p }
        ),
        "x"
    );
    let message = conv2d_problem(&[1, 6, 8, 8], &[4, 2, 3, 3], &groups(4))
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("groups") && message.contains('6') && message.contains('4'),
        "{message}"
    );

    assert!(matches!(
        conv2d_problem(&[1, 6, 8], &[4, 6, 3, 3], &p),
        Err(Error::WrongRank { .. })
    ));
    assert!(matches!(
        conv2d_problem(&[1, 6, 8, 8], &[4, 6, 3], &p),
        Err(Error::WrongRank { .. })
    ));
    let mismatch = conv2d_problem(&[1, 6, 8, 8], &[4, 3, 3, 3], &p).unwrap_err();
    assert!(matches!(mismatch, Error::ShapeMismatch { .. }), "{mismatch}");
    assert!(mismatch.to_string().contains("[4, 6, 3, 3]"), "{mismatch}");
    assert!(matches!(
        conv2d_problem(&[1, 1, 8, 8], &[1, 1, 0, 3], &p),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        conv2d_problem(&[40_000, 1, 256, 256], &[1, 1, 1, 1], &p),
        Err(Error::TooLarge { .. })
    ));
    assert!(matches!(
        conv2d_problem(&[1, 1, 1 << 30, 1], &[1, 1, 1, 1], &p),
        Err(Error::TooLarge { .. })
    ));
    assert_eq!(
        conv2d_problem(&[8, 64, 512, 1024], &[128, 64, 3, 3], &p)
            .unwrap()
            .1,
        vec![8, 128, 510, 1022]
    );
    let strided = Conv2dParams {
        stride: [2, 3],
        padding: [1, 2],
        dilation: [2, 1],
        groups: 2,
        ..p
    };
    assert_eq!(
        conv2d_problem(&[2, 4, 9, 10], &[6, 2, 3, 4], &strided).unwrap().1,
        vec![2, 6, 4, 4]
    );

    let Some(gpu) = gpu_or_skip("invalid_conv2d_parameters_are_errors_that_name_them (GPU part)") else {
        return;
    };
    let x = gpu.upload(&values([1, 2, 5, 5], 1, DATA)).unwrap();
    let w = gpu.upload(&values([3, 2, 3, 3], 2, DATA)).unwrap();
    let b = gpu.upload(&Array1::<f32>::zeros(2)).unwrap();
    assert!(matches!(
        gpu.conv2d(&x, &w, Some(&b), &p),
        Err(Error::ShapeMismatch { .. })
    ));
    let dy = gpu.upload(&values([1, 3, 3, 4], 3, DATA)).unwrap();
    assert!(matches!(
        gpu.conv2d_backward(&x, &w, &dy, &p, ConvGradients::ALL),
        Err(Error::ShapeMismatch { .. })
    ));
    // A residual of another shape than y; a backward pass asked through an activation.
    let w = gpu.upload(&values([3, 2, 3, 3], 2, DATA)).unwrap();
    let residual = gpu.upload(&values([1, 3, 3, 4], 4, DATA)).unwrap();
    assert!(matches!(
        gpu.conv2d_residual(&x, &w, None, &residual, &p),
        Err(Error::ShapeMismatch { what, .. }) if what.contains("residual")
    ));
    let dy = gpu.upload(&values([1, 3, 3, 3], 3, DATA)).unwrap();
    let relu = Conv2dParams {
        activation: Activation::Relu,
        ..p
    };
    assert!(matches!(
        gpu.conv2d_backward(&x, &w, &dy, &relu, ConvGradients::ALL),
        Err(Error::InvalidParameter {
            parameter: "activation",
            ..
        })
    ));
}

/// TF32 on data that TF32 does not represent (random floats): the forward pass, the
/// input gradient and the weight gradient on the tensor cores within a relative norm
/// error of 5e-3 of the f64 reference, and the same bits on a second run.
/// cuDNN's TF32 convolution error on data uniform in [-1, 1), relative to the float64
/// result in the L2 norm: measured on the H100 (cuDNN 9, `allow_tf32`), forward and
/// input gradient, NCHW and NHWC, between 2.5e-4 and 2.7e-4 (its weight gradients, where
/// it picks a TF32 kernel, between 2.8e-4 and 1.4e-3). TF32 results must be within
/// twice the smaller (and so within 5e-3).
const CUDNN_TF32_ERROR: f64 = 2.7e-4;

#[test]
fn tf32_passes_are_close_and_deterministic() {
    let test = "tf32_passes_are_close_and_deterministic";
    let (Some(gpu), Some(portable)) = (gpu_or_skip(test), portable_gpu_or_skip(test)) else {
        return;
    };
    let mut next = random_words(99);
    let mut random = |shape: &[usize]| {
        ArrayD::from_shape_simple_fn(shape, || {
            ((next() >> 11) as f64 / (1u64 << 52) as f64 - 1.0) as f32
        })
    };
    let relative_error = |got: &ArrayD<f32>, want: &ArrayD<f64>| {
        let (mut difference, mut norm) = (0.0, 0.0);
        for (&g, &w) in got.iter().zip(want.iter()) {
            difference += (g as f64 - w).powi(2);
            norm += w * w;
        }
        (difference / norm).sqrt()
    };
    let bits = |a: &ArrayD<f32>| a.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let hopper = gpu.info().compute_capability == (9, 0);
    // The first and the last take the weight gradient on `wgmma` on Hopper.
    for (x_shape, w_shape, padding, layout, warpgroup_grad) in [
        ([2, 17, 19, 64], [96, 3, 3, 64], [1, 1], ConvLayout::Nhwc, hopper),
        ([3, 5, 33, 31], [40, 5, 1, 1], [0, 0], ConvLayout::Nchw, false),
        ([2, 64, 9, 36], [48, 64, 3, 3], [1, 1], ConvLayout::Nchw, hopper),
    ] {
        let params = Conv2dParams {
            padding,
            layout,
            precision: ConvPrecision::Tf32,
            ..Conv2dParams::default()
        };
        let (x, w) = (random(&x_shape), random(&w_shape));
        let (_, y_shape) = conv2d_problem(&x_shape, &w_shape, &params).unwrap();
        let dy = random(&y_shape);
        let (x4, w4, dy4) = [&x, &w, &dy]
            .map(|a| a.view().into_dimensionality().unwrap())
            .into();
        let want_y = reference::conv::conv2d(x4, w4, None, &params).unwrap();
        let want_dx = reference::conv::conv2d_grad_input(dy4, w4, &x_shape, &params).unwrap();
        let want_dw = reference::conv::conv2d_grad_weight(x4, dy4, &w_shape, &params).unwrap();
        let mut results = Vec::new();
        for (gpu, warpgroup_grad) in [(&*gpu, warpgroup_grad), (&*portable, false)] {
            for pass in [ConvPass::Forward, ConvPass::InputGrad, ConvPass::WeightGrad] {
                let plan = gpu.conv2d_algorithm(&x_shape, &w_shape, &params, pass).unwrap();
                let tensor_cores = match plan {
                    ConvAlgorithm::TensorCore(_) => pass != ConvPass::WeightGrad,
                    ConvAlgorithm::TensorCoreWeightGrad(_) => pass == ConvPass::WeightGrad && !warpgroup_grad,
                    ConvAlgorithm::WarpgroupWeightGrad(_) => pass == ConvPass::WeightGrad && warpgroup_grad,
                    _ => false,
                };
                assert!(tensor_cores, "{pass:?}: {plan:?}");
            }
            let (dx, dw, ddy) = (
                gpu.upload(&x).unwrap(),
                gpu.upload(&w).unwrap(),
                gpu.upload(&dy).unwrap(),
            );
            let data = ConvGradients {
                input: true,
                weight: true,
                bias: false,
            };
            let run = || {
                let y = gpu.conv2d(&dx, &dw, None, &params).unwrap();
                let (gx, gw, _) = gpu.conv2d_backward(&dx, &dw, &ddy, &params, data).unwrap();
                [y, gx.unwrap(), gw.unwrap()].map(|a| gpu.download(&a).unwrap())
            };
            let (first, second) = (run(), run());
            for ((got, again), (want, pass)) in first.iter().zip(&second).zip([
                (&want_y, "forward"),
                (&want_dx, "input gradient"),
                (&want_dw, "weight gradient"),
            ]) {
                let error = relative_error(got, &want.clone().into_dyn());
                assert!(
                    error <= 2.0 * CUDNN_TF32_ERROR && error.is_finite(),
                    "{x_shape:?} {layout:?} {pass}: relative error {error:e}, over twice cuDNN's"
                );
                assert!(bits(got) == bits(again), "{x_shape:?} {pass}: two runs differ");
                eprintln!(
                    "{test}: {x_shape:?} {layout:?} {pass} on {}: relative error {error:.2e}",
                    gpu.info().kernel_image
                );
            }
            results.push(first);
        }
        // Both kernel images round both operands to nearest, so they differ only by
        // the order of the FP32 sums: far less than a truncated operand would make
        // them differ (about 3e-4).
        if let [one, other] = &results[..] {
            for (a, b) in one.iter().zip(other) {
                let difference = relative_error(a, &b.mapv(f64::from));
                assert!(
                    difference <= 1e-5,
                    "{x_shape:?} {layout:?}: the kernel images differ by {difference:e}"
                );
            }
        }
    }
}

/// The TF32 passes round their inputs to TF32 to nearest, as cuDNN does. One tensor of
/// each run holds 1 + 3 2^-12 (between the TF32 neighbours 1 and 1 + 2^-10, nearer the
/// second), the others 1: its products must be 1 + 2^-10, truncation would give 1.
/// Every sum of such products is exact in FP32, so each result must equal the f64
/// reference on the rounded tensors exactly, on the `wgmma` paths (im2col tiles and
/// NHWC row strips read by the tensor cores from shared memory as their bulk copies
/// rounded them, NCHW boxes through registers) and on the portable ones.
#[test]
fn tf32_passes_round_inputs_to_nearest() {
    let test = "tf32_passes_round_inputs_to_nearest";
    let (Some(gpu), Some(portable)) = (gpu_or_skip(test), portable_gpu_or_skip(test)) else {
        return;
    };
    const BETWEEN: f32 = 1.0 + 3.0 / 4096.0;
    const ROUNDED: f32 = 1.0 + 4.0 / 4096.0;
    let hopper = gpu.info().compute_capability == (9, 0);
    // The forward's staging of x on `wgmma`: (bulk copies, row strips, channels last).
    for (x_shape, w_shape, layout, staging) in [
        ([2, 6, 10, 64], [32, 3, 3, 64], ConvLayout::Nhwc, (1, 0, 1)),
        ([2, 5, 256, 64], [32, 3, 3, 64], ConvLayout::Nhwc, (1, 1, 1)),
        ([1, 32, 3, 256], [16, 32, 3, 3], ConvLayout::Nchw, (1, 1, 0)),
        ([2, 64, 9, 36], [48, 64, 3, 3], ConvLayout::Nchw, (1, 0, 1)),
    ] {
        let params = Conv2dParams {
            padding: [1, 1],
            layout,
            precision: ConvPrecision::Tf32,
            ..Conv2dParams::default()
        };
        let (_, y_shape) = conv2d_problem(&x_shape, &w_shape, &params).unwrap();
        for (gpu, wgmma) in [(&*gpu, hopper), (&*portable, false)] {
            match gpu
                .conv2d_algorithm(&x_shape, &w_shape, &params, ConvPass::Forward)
                .unwrap()
            {
                ConvAlgorithm::TensorCore(plan) => assert!(
                    !wgmma
                        || (
                            plan.warpgroup_mma,
                            plan.bulk_copies,
                            plan.row_strips,
                            plan.channels_last
                        ) == (1, staging.0, staging.1, staging.2),
                    "{x_shape:?} {layout:?}: {plan:?}"
                ),
                other => panic!("{x_shape:?} {layout:?}: {other:?}, not on the tensor cores"),
            }
        }
        for between in 0..3 {
            let tensors = |value: f32| {
                [&x_shape[..], &w_shape[..], &y_shape[..]]
                    .iter()
                    .enumerate()
                    .map(|(i, shape)| {
                        Array4::from_elem(
                            <[usize; 4]>::try_from(*shape).unwrap(),
                            if i == between { value } else { 1.0 },
                        )
                    })
                    .collect::<Vec<_>>()
            };
            let (given, rounded) = (tensors(BETWEEN), tensors(ROUNDED));
            let [x, w, dy] = [0, 1, 2].map(|i| rounded[i].view());
            let want = [
                reference::conv::conv2d(x, w, None, &params).unwrap().into_dyn(),
                reference::conv::conv2d_grad_input(dy, w, &x_shape, &params)
                    .unwrap()
                    .into_dyn(),
                reference::conv::conv2d_grad_weight(x, dy, &w_shape, &params)
                    .unwrap()
                    .into_dyn(),
            ];
            for gpu in [&*gpu, &*portable] {
                let [x, w, dy] = [0, 1, 2].map(|i| gpu.upload(&given[i]).unwrap());
                let gradients = ConvGradients {
                    input: true,
                    weight: true,
                    bias: false,
                };
                let y = gpu.conv2d(&x, &w, None, &params).unwrap();
                let (dx, dw, _) = gpu.conv2d_backward(&x, &w, &dy, &params, gradients).unwrap();
                let got = [y, dx.unwrap(), dw.unwrap()].map(|a| gpu.download(&a).unwrap().into_dyn());
                for ((got, want), pass) in
                    got.iter()
                        .zip(&want)
                        .zip(["forward", "input gradient", "weight gradient"])
                {
                    let difference = first_difference(got, want.as_slice().unwrap());
                    assert!(
                        difference.is_none(),
                        "{x_shape:?} {layout:?} {pass} on {}, tensor {between} between TF32 values: \
                         (index, got, rounded) {difference:?}",
                        gpu.info().kernel_image,
                    );
                }
            }
        }
    }
}
