//! conv2d and its gradients in bf16 and f16 against the f64 reference rounded once to
//! the type, on the cases and data of the f32 tests (integers in [-4, 4] and such
//! integers times 2^-3, exact in both types): every sum is exact in f32, so the
//! forward pass with bias, ReLU and residual and each gradient must equal the rounded
//! reference bit for bit; SiLU and GELU (approximations within 4e-6) may land on the
//! other side of a rounding, one unit in the last place. Outputs are poisoned first,
//! and two runs of the backward pass are bit-identical.

use host::{Activation, Conv2dParams, ConvElement, ConvGradients, Gpu, bf16, conv2d_problem, f16, reference};
use ndarray::{Array4, ArrayD};
use proptest::prelude::*;
use tests::{gpu_or_skip, runner};

use super::conv::{Case, DATA, case, check_backward, tensors, values};

/// A 16-bit float of the tests.
trait Half: ConvElement {
    /// Mantissa bits (the unit in the last place of a value in [1, 2)).
    const MANTISSA: i32;
    /// The value nearest `v` (to even).
    fn rounded(v: f64) -> Self;
    fn value(self) -> f64;
}

impl Half for bf16 {
    const MANTISSA: i32 = 7;
    fn rounded(v: f64) -> Self {
        bf16::from_f64(v)
    }
    fn value(self) -> f64 {
        self.to_f64()
    }
}

impl Half for f16 {
    const MANTISSA: i32 = 10;
    fn rounded(v: f64) -> Self {
        f16::from_f64(v)
    }
    fn value(self) -> f64 {
        self.to_f64()
    }
}

/// `a` in `T` (exactly, on the test data).
fn narrowed<T: Half>(a: &Array4<f32>) -> Array4<T> {
    a.mapv(|v| T::rounded(v as f64))
}

/// The first element of `got` that is not `want` rounded to `T` (or, with `ulp`, not
/// within a unit in the last place of it), with both values.
fn first_miss<T: Half>(got: &ArrayD<T>, want: &[f64], ulp: bool) -> Option<(usize, f64, f64)> {
    got.iter().zip(want).enumerate().find_map(|(i, (&g, &w))| {
        let (g, rounded) = (g.value(), T::rounded(w).value());
        let allowed = if ulp {
            rounded.abs() * 2f64.powi(-T::MANTISSA) + 4e-6 * w.abs().max(1.0)
        } else {
            0.0
        };
        (g.is_nan() || (g - rounded).abs() > allowed).then_some((i, g, w))
    })
}

fn check<T: Half>(
    gpu: &Gpu,
    c: Case,
    activation: Activation,
    with_residual: bool,
) -> Result<(), TestCaseError> {
    let params = Conv2dParams {
        activation,
        ..c.params
    };
    let t = tensors(&c);
    let (_, y_shape) = conv2d_problem(t.x.shape(), t.w.shape(), &params).unwrap();
    let y_shape = [y_shape[0], y_shape[1], y_shape[2], y_shape[3]];
    let residual = with_residual.then(|| values(y_shape, c.seed ^ 5, DATA));
    let dy = values(y_shape, c.seed ^ 3, DATA);
    let bias = c.bias.then_some(t.b.view());
    let want = reference::conv::conv2d_residual(
        t.x.view(),
        t.w.view(),
        bias,
        residual.as_ref().map(|r| r.view()),
        &params,
    )
    .unwrap();
    let p = &c.params;
    let want_dx = reference::conv::conv2d_grad_input(dy.view(), t.w.view(), t.x.shape(), p).unwrap();
    let want_dw = reference::conv::conv2d_grad_weight(t.x.view(), dy.view(), t.w.shape(), p).unwrap();
    let want_db = reference::conv::conv2d_grad_bias(dy.view(), p.layout);

    let upload = |a: &Array4<f32>| gpu.upload(&narrowed::<T>(a)).unwrap();
    let (x, w, gy) = (upload(&t.x), upload(&t.w), upload(&dy));
    let b = gpu.upload(&t.b.mapv(|v| T::rounded(v as f64))).unwrap();
    let r = residual.as_ref().map(upload);
    let mut y = gpu.alloc::<T>(&y_shape).unwrap();
    gpu.poison(&mut y).unwrap();
    gpu.conv2d_residual_into(&x, &w, c.bias.then_some(&b), r.as_ref(), &params, &mut y)
        .unwrap();
    let exact = matches!(activation, Activation::Identity | Activation::Relu);
    let miss = first_miss(&gpu.download(&y).unwrap(), want.as_slice().unwrap(), !exact);
    prop_assert!(
        miss.is_none(),
        "{c:?} {activation:?} residual {with_residual}: forward (index, got, want) {miss:?}"
    );

    let run = || {
        let (dx, dw, db) = gpu.conv2d_backward(&x, &w, &gy, p, ConvGradients::ALL).unwrap();
        [dx, dw, db].map(|g| gpu.download(&g.unwrap()).unwrap())
    };
    let first = run();
    let names = ["input", "weight", "bias"];
    let wants = [
        want_dx.as_slice().unwrap(),
        want_dw.as_slice().unwrap(),
        want_db.as_slice().unwrap(),
    ];
    for ((got, want), name) in first.iter().zip(wants).zip(names) {
        let miss = first_miss(got, want, false);
        prop_assert!(
            miss.is_none(),
            "{c:?}: {name} gradient (index, got, want) {miss:?}"
        );
    }
    let second = run();
    let bits = |a: &ArrayD<T>| a.iter().map(|v| v.value().to_bits()).collect::<Vec<_>>();
    for ((a, b), name) in first.iter().zip(&second).zip(names) {
        prop_assert!(
            bits(a) == bits(b),
            "{c:?}: two runs of the {name} gradient differ"
        );
    }
    Ok(())
}

fn activation() -> impl Strategy<Value = Activation> {
    prop_oneof![
        2 => Just(Activation::Identity),
        2 => Just(Activation::Relu),
        1 => Just(Activation::Silu),
        1 => Just(Activation::GeluTanh)
    ]
}

#[test]
fn conv2d_bf16_matches_the_rounded_reference() {
    let Some(gpu) = gpu_or_skip("conv2d_bf16_matches_the_rounded_reference") else {
        return;
    };
    runner()
        .run(&(case(), activation(), any::<bool>()), |(c, a, r)| {
            check::<bf16>(&gpu, c, a, r)
        })
        .unwrap();
}

#[test]
fn conv2d_f16_matches_the_rounded_reference() {
    let Some(gpu) = gpu_or_skip("conv2d_f16_matches_the_rounded_reference") else {
        return;
    };
    runner()
        .run(&(case(), activation(), any::<bool>()), |(c, a, r)| {
            check::<f16>(&gpu, c, a, r)
        })
        .unwrap();
}

/// The kernels of 16-bit operands on cases they take, the plans asserted: the forward
/// pass and the input gradient on NHWC row strips (channels per group multiples of
/// their k-tiles' 64, output rows of one tile of 256 pixels or of two, 500 with the
/// last partial) or on im2col boxes (rows too short for the strips' tiles: 14, 28 and
/// 100 pixels, a dilated window past them, strided convolutions), K split where few
/// tiles leave multiprocessors idle (f32 partials rounded once by the split
/// epilogue); the weight gradient on `wgmma` (partial tiles of output channels and
/// pixels, 40 input channels in a chunk of 64, two column tiles of 128 channels); two
/// groups, with and without a bias and ReLU; strided input gradients as the phases'
/// one forward pass, over dy upsampled (a dilated window) or, where the window leaves
/// phases without taps (1x1 at strides 2 and 3), by phases; the forward pass of NHWC stems (2 and 3 input channels) on the few-channel
/// kernel; and cases where some passes run over f32 copies (channels not multiples of
/// 64, 1x1 weight gradients, the stems' gradients). In NCHW the forward pass reads copies of x and w in NHWC and writes y
/// channels first; the gradients but the bias's run over f32 copies.
#[test]
fn conv2d_16_bit_kernels_match_the_rounded_reference() {
    use host::plans::{SixteenBitForward, SixteenBitInputGrad, SixteenBitWeightGrad, TensorCoreOperand};
    let Some(gpu) = gpu_or_skip("conv2d_16_bit_kernels_match_the_rounded_reference") else {
        return;
    };
    use host::ConvLayout::{Nchw, Nhwc};
    // batch, in, out, kernel, size, padding, dilation, groups, activation, bias, layout,
    // and whether the forward pass, the input and the weight gradients take their
    // kernels
    #[rustfmt::skip]
    let cases = [
        (2, 64, 64, [3, 3], [4, 256], [1, 1], [1, 1], 1, Activation::Relu, true, Nhwc, [true, true, true]),
        (1, 128, 96, [1, 1], [3, 254], [0, 0], [1, 1], 1, Activation::Identity, false, Nhwc, [true, false, true]),
        (2, 64, 128, [3, 3], [6, 260], [0, 0], [2, 2], 1, Activation::Identity, true, Nhwc, [true, true, true]),
        (2, 64, 64, [5, 5], [20, 500], [2, 2], [1, 1], 1, Activation::Relu, false, Nhwc, [true, true, true]),
        (1, 128, 128, [3, 3], [2, 256], [1, 1], [1, 1], 2, Activation::Identity, true, Nhwc, [true, true, false]),
        (2, 64, 96, [3, 3], [5, 250], [1, 1], [1, 1], 1, Activation::Identity, true, Nhwc, [true, false, true]),
        (1, 128, 64, [3, 3], [3, 256], [1, 1], [1, 1], 1, Activation::Relu, false, Nhwc, [true, true, true]),
        (2, 40, 64, [3, 3], [6, 100], [1, 1], [1, 1], 1, Activation::Identity, true, Nhwc, [false, true, true]),
        // Depthwise, on the stencil: 3 x 3 and 5 x 5 unrolled, 7 x 7 not (its weight
        // gradient over f32 copies), SiLU in the per-output epilogue.
        (2, 64, 64, [3, 3], [14, 14], [1, 1], [1, 1], 64, Activation::Relu, true, Nhwc, [true, true, true]),
        (2, 32, 32, [5, 5], [9, 20], [2, 2], [1, 1], 32, Activation::Identity, false, Nchw, [true, true, true]),
        (1, 48, 48, [7, 7], [12, 12], [3, 3], [1, 1], 48, Activation::Silu, true, Nhwc, [true, true, false]),
        // Depthwise NHWC 5 x 5, on the column kernels, rows of 11 outputs in two runs.
        (2, 40, 40, [5, 5], [11, 13], [2, 2], [1, 1], 40, Activation::Relu, true, Nhwc, [true, true, true]),
        (8, 64, 64, [3, 3], [14, 14], [1, 1], [1, 1], 1, Activation::Relu, true, Nhwc, [true, true, true]),
        (4, 128, 128, [3, 3], [28, 28], [1, 1], [1, 1], 1, Activation::Identity, false, Nhwc, [true, true, true]),
        (2, 64, 64, [3, 3], [4, 256], [1, 1], [1, 1], 1, Activation::Relu, true, Nchw, [true, false, false]),
        (1, 128, 96, [5, 5], [18, 500], [2, 2], [1, 1], 2, Activation::Identity, false, Nchw, [true, false, false]),
        // NCHW rows of 490 pixels on row strips: channel rows starting 0 to 3 words
        // past 16-byte boundaries, a row's second tile 234 pixels long.
        (1, 64, 64, [3, 3], [5, 490], [1, 1], [1, 1], 1, Activation::Relu, true, Nchw, [true, false, false]),
        // Few input channels, on their kernels: 3 at stride 1 staged 4 per pixel (odd
        // windows otherwise), SiLU, rows of 40 (a partial column tile); 2 channels,
        // 1 x 5, no bias, 6 output channels (its gradients over f32 copies: the kernels
        // read dy in 16-byte vectors).
        (2, 3, 8, [3, 3], [9, 40], [1, 1], [1, 1], 1, Activation::Silu, true, Nhwc, [true, true, true]),
        // One tile: the weight gradient in one part.
        (1, 3, 16, [3, 3], [4, 30], [1, 1], [1, 1], 1, Activation::Relu, false, Nhwc, [true, true, true]),
        (1, 2, 6, [1, 5], [6, 33], [0, 2], [1, 1], 1, Activation::Identity, false, Nhwc, [true, false, false]),
    ];
    // Strided: the forward pass on im2col boxes, the input gradient as the phases' one
    // forward pass (3x3, 28 x 28 and 15 x 15 unpadded, 64 input channels: 256 of the
    // phases), over dy upsampled (3x3 dilated) or by phases (1x1).
    #[rustfmt::skip]
    let strided = [
        (4, 64, 128, [3, 3], [28, 28], [1, 1], [2, 2], [1, 1], [true, true, true]),
        (4, 128, 64, [1, 1], [28, 28], [0, 0], [2, 2], [1, 1], [true, true, true]),
        (2, 64, 64, [1, 1], [27, 27], [0, 0], [3, 3], [1, 1], [true, true, true]),
        (2, 64, 64, [3, 3], [15, 15], [0, 0], [2, 2], [1, 1], [true, true, true]),
        (2, 64, 64, [3, 3], [20, 19], [2, 2], [2, 2], [2, 2], [true, true, true]),
        // Stems, on the few-channel kernels. The second with partial tiles of rows (23
        // outputs), columns (35) and of its 66 output channels (its gradients over f32
        // copies, the input gradient on the TF32 path's direct kernel); a third with 4
        // input channels, 5 x 3 at strides 3 and 2 (its input gradient's phases of 2 and
        // 3 tap rows); a fourth of 72 output channels (two channel tiles, 8 in the
        // second).
        (2, 3, 64, [7, 7], [32, 32], [3, 3], [2, 2], [1, 1], [true, true, true]),
        (1, 3, 66, [7, 7], [45, 70], [3, 3], [2, 2], [1, 1], [true, false, false]),
        (1, 4, 16, [5, 3], [10, 70], [1, 0], [3, 2], [1, 1], [true, true, true]),
        (2, 3, 72, [7, 7], [20, 24], [3, 3], [2, 2], [1, 1], [true, true, true]),
    ];
    let strided = strided.map(
        |(batch, input, output, kernel, size, padding, stride, dilation, native)| {
            let case = (
                batch,
                input,
                output,
                kernel,
                size,
                padding,
                dilation,
                1,
                Activation::Identity,
                true,
                Nhwc,
                native,
            );
            (case, stride)
        },
    );
    let all = cases.into_iter().map(|case| (case, [1, 1])).chain(strided);
    // The forward kernels' paths the cases reach: row strips, im2col boxes, K split,
    // y written channels first, by the row strips' kernel of its own (rows of 490).
    let mut paths = [false; 5];
    // And the strided input gradients': over dy upsampled, by phases, as the phases'
    // one forward pass.
    let mut strided_paths = [false; 3];
    // And the depthwise stencil's: forward, input and weight gradients; and the column
    // kernels' 3 x 3 and 5 x 5 windows and weight gradient (aligned tensors).
    let mut stencil_paths = [false; 3];
    let mut column_paths = [false; 3];
    // And a split `wgmma` weight gradient (its sum in vectors of four outputs).
    let mut split_weight_grad = false;
    // And the few-channel kernels': the forward patch's pixels as they are and padded,
    // the input gradient at stride 1 and at a larger one, the weight gradient in one
    // part and in several.
    let mut few_channel_paths = [false; 6];
    for (i, (case, stride)) in all.enumerate() {
        let (
            batch,
            in_channels,
            out_channels,
            kernel,
            size,
            padding,
            dilation,
            groups,
            activation,
            bias,
            layout,
            native,
        ) = case;
        let c = Case {
            batch,
            in_channels,
            out_channels,
            kernel,
            size,
            params: Conv2dParams {
                stride,
                padding,
                dilation,
                groups,
                layout,
                ..Default::default()
            },
            bias,
            seed: 40 + i as u64,
        };
        let (x_shape, w_shape) = match layout {
            Nhwc => (
                [batch, size[0], size[1], in_channels],
                [out_channels, kernel[0], kernel[1], in_channels / groups],
            ),
            Nchw => (
                [batch, in_channels, size[0], size[1]],
                [out_channels, in_channels / groups, kernel[0], kernel[1]],
            ),
        };
        for operand in [TensorCoreOperand::Bf16, TensorCoreOperand::F16] {
            let plans = gpu
                .conv2d_16_bit_plans(&x_shape, &w_shape, &c.params, operand)
                .unwrap();
            let taken = [
                plans.forward.map(|p| p.operand()),
                plans.input_grad.map(|p| p.operand()),
                plans.weight_grad.map(|p| p.operand()),
            ];
            assert_eq!(
                taken,
                native.map(|n| n.then_some(operand)),
                "{c:?} {operand:?}: {plans:?}"
            );
            if let Some(SixteenBitForward::TensorCore(p)) = plans.forward {
                let taken = [
                    p.row_strips == 1,
                    p.row_strips == 0,
                    p.splits > 1,
                    p.y_channels_last == 0,
                    p.y_channels_last == 0 && p.row_strips == 1 && c.size[1] == 490,
                ];
                paths.iter_mut().zip(taken).for_each(|(path, t)| *path |= t);
            }
            split_weight_grad |=
                matches!(plans.weight_grad, Some(SixteenBitWeightGrad::Warpgroup(p)) if p.split > 1);
            if let Some(SixteenBitForward::Stencil(plan, _)) = plans.forward
                && plan.takes_columns(0, 2)
            {
                column_paths[(plan.kernel_h == 5) as usize] = true;
            }
            column_paths[2] |= matches!(plans.weight_grad, Some(SixteenBitWeightGrad::Stencil(plan, _)) if plan.takes_columns(0, 2));
            if let Some(SixteenBitForward::FewChannels(plan, _)) = plans.forward {
                few_channel_paths[(plan.pitch != plan.problem.in_channels) as usize] = true;
            }
            if let Some(SixteenBitInputGrad::FewChannels(plan, _)) = plans.input_grad {
                few_channel_paths[2 + (plan.problem.stride_h > 1) as usize] = true;
            }
            if let Some(SixteenBitWeightGrad::FewChannels(plan, _)) = plans.weight_grad {
                few_channel_paths[4 + (plan.forward.blocks > 1) as usize] = true;
            }
            stencil_paths[0] |= matches!(plans.forward, Some(SixteenBitForward::Stencil(..)));
            stencil_paths[1] |= matches!(plans.input_grad, Some(SixteenBitInputGrad::Stencil(..)));
            stencil_paths[2] |= matches!(plans.weight_grad, Some(SixteenBitWeightGrad::Stencil(..)));
            if stride != [1, 1] {
                use host::plans::SixteenBitInputGrad::{AsForward, Phases, SubPixel};
                strided_paths[0] |= matches!(plans.input_grad, Some(AsForward(_)));
                strided_paths[1] |= matches!(plans.input_grad, Some(Phases(..)));
                strided_paths[2] |= matches!(plans.input_grad, Some(SubPixel(_)));
            }
            let checked = match operand {
                TensorCoreOperand::Bf16 => check::<bf16>(&gpu, c.clone(), activation, false),
                _ => check::<f16>(&gpu, c.clone(), activation, false),
            };
            checked.unwrap_or_else(|e| panic!("{operand:?}: {e}"));
        }
    }
    assert_eq!(paths, [true; 5], "strips, im2col, split, NCHW y, its strips");
    assert_eq!(
        strided_paths, [true; 3],
        "upsampled, phases, the phases' one pass"
    );
    assert!(split_weight_grad, "a split weight gradient");
    assert_eq!(
        stencil_paths, [true; 3],
        "stencil forward, input and weight gradients"
    );
    assert_eq!(
        column_paths, [true; 3],
        "column kernels, 3 x 3 and 5 x 5, the weight gradient"
    );
    assert_eq!(
        few_channel_paths, [true; 6],
        "few channels forward, padded or not; input gradient, strided or not; weight gradient, in parts or not"
    );
}

/// The strided input gradient as the phases' one forward pass in bf16, f16 and TF32,
/// each plan asserted, every gradient exact (integer data), outputs poisoned: 3x3 at
/// stride 2 over odd extents (the last row and column of phase 0 alone), 5x5 at
/// stride 2 (3x3 windows of dy), 3x3 at strides 2 and 1, 4x4 at stride 3 (phases of 1,
/// 1 and 2 taps in a window of 2). Small enough for the sanitizers.
#[test]
fn strided_input_gradients_as_the_phases_one_pass() {
    use host::plans::{ConvAlgorithm, ConvPass, SixteenBitInputGrad, TensorCoreOperand};
    let Some(gpu) = gpu_or_skip("strided_input_gradients_as_the_phases_one_pass") else {
        return;
    };
    let hopper = gpu.info().compute_capability == (9, 0);
    for (i, (kernel, size, padding, stride)) in [
        ([3, 3], [15, 13], [1, 1], [2, 2]),
        ([5, 5], [12, 11], [2, 2], [2, 2]),
        ([3, 3], [10, 9], [1, 1], [2, 1]),
        ([4, 4], [13, 14], [1, 1], [3, 3]),
    ]
    .into_iter()
    .enumerate()
    {
        let c = Case {
            batch: 2,
            in_channels: 64,
            out_channels: 64,
            kernel,
            size,
            params: Conv2dParams {
                stride,
                padding,
                layout: host::ConvLayout::Nhwc,
                ..Default::default()
            },
            bias: false,
            seed: 90 + i as u64,
        };
        let x_shape = [c.batch, size[0], size[1], c.in_channels];
        let w_shape = [c.out_channels, kernel[0], kernel[1], c.in_channels];
        for operand in [TensorCoreOperand::Bf16, TensorCoreOperand::F16] {
            let plans = gpu
                .conv2d_16_bit_plans(&x_shape, &w_shape, &c.params, operand)
                .unwrap();
            let sub_pixel = matches!(plans.input_grad, Some(SixteenBitInputGrad::SubPixel(_)));
            assert_eq!(sub_pixel, hopper, "{c:?} {operand:?}: {plans:?}");
            match operand {
                TensorCoreOperand::Bf16 => check::<bf16>(&gpu, c.clone(), Activation::Identity, false),
                _ => check::<f16>(&gpu, c.clone(), Activation::Identity, false),
            }
            .unwrap_or_else(|e| panic!("{operand:?}: {e}"));
        }
        let tf32 = Case {
            params: Conv2dParams {
                precision: host::ConvPrecision::Tf32,
                ..c.params
            },
            ..c
        };
        let algorithm = gpu
            .conv2d_algorithm(&x_shape, &w_shape, &tf32.params, ConvPass::InputGrad)
            .unwrap();
        assert_eq!(
            matches!(algorithm, ConvAlgorithm::SubPixel(_)),
            hopper,
            "{tf32:?}: {algorithm:?}"
        );
        check_backward(&gpu, tf32).unwrap();
    }
}

/// Layout changes of 2-byte elements move every element's bits: in pairs where the
/// matrices' rows and columns are even (partial tiles included), one at a time where
/// not, both ways.
#[test]
fn layout_changes_move_16_bit_elements() {
    let Some(gpu) = gpu_or_skip("layout_changes_move_16_bit_elements") else {
        return;
    };
    for shape in [[2, 6, 10, 66], [3, 5, 7, 9], [1, 64, 3, 130]] {
        let x = Array4::from_shape_fn(shape, |(n, c, h, w)| {
            bf16::from_bits((((n * shape[1] + c) * shape[2] + h) * shape[3] + w) as u16)
        });
        let bits = |a: ArrayD<bf16>| a.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        let last = gpu.to_channels_last(&gpu.upload(&x).unwrap()).unwrap();
        let want = x
            .view()
            .permuted_axes([0, 2, 3, 1])
            .as_standard_layout()
            .into_owned()
            .into_dyn();
        assert_eq!(
            bits(gpu.download(&last).unwrap()),
            bits(want),
            "{shape:?} to NHWC"
        );
        let first = gpu.to_channels_first(&last).unwrap();
        assert_eq!(
            bits(gpu.download(&first).unwrap()),
            bits(x.into_dyn()),
            "{shape:?} back"
        );
    }
}
