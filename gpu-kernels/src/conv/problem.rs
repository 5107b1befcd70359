//! One convolution as both sides see it: the shape the user states, checked once, and
//! the problem derived from it (output size, per-group extents, the divisors the
//! gathers use).

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

/// The place (image, channel, y, x) of element `i` (below 2^31) of an image tensor in
/// NHWC (`channels_last`) or NCHW, by the dividers of its channels, its pixels and its
/// width.
#[cfg(any(target_arch = "nvptx64", test))]
#[inline(always)]
pub const fn element_place(
    i: u32,
    channels_last: bool,
    channels: FastDiv,
    pixels: FastDiv,
    width: FastDiv,
) -> [u32; 4] {
    let (n, c, pixel) = if channels_last {
        let (pixels_before, c) = channels.divmod(i);
        let (n, pixel) = pixels.divmod(pixels_before);
        (n, c, pixel)
    } else {
        let (plane, pixel) = pixels.divmod(i);
        let (n, c) = channels.divmod(plane);
        (n, c, pixel)
    };
    let (y, x) = width.divmod(pixel);
    [n, c, y, x]
}

/// The index of (image, channel, y, x) in an image tensor of `[channels, height,
/// width]` images in NHWC (`channels_last`) or NCHW.
#[cfg(any(target_arch = "nvptx64", test))]
#[inline(always)]
pub const fn element_index(place: [u32; 4], channels_last: bool, extents: [u32; 3]) -> u64 {
    let [n, c, y, x] = [place[0] as u64, place[1] as u64, place[2] as u64, place[3] as u64];
    let [channels, height, width] = [extents[0] as u64, extents[1] as u64, extents[2] as u64];
    if channels_last {
        ((n * height + y) * width + x) * channels + c
    } else {
        ((n * channels + c) * height + y) * width + x
    }
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

/// Why a shape is no convolution the kernels run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvShapeError {
    /// `groups` is 0.
    NoGroups,
    /// A stride (`dilation == false`) or dilation entry is 0.
    ZeroStep { dilation: bool },
    /// x or w has no channel.
    NoChannels,
    /// The in (`input == true`) or out channels are not a multiple of `groups`.
    GroupsDivide { input: bool },
    /// w's in channels are not x's divided by `groups`, or a window extent is 0.
    WeightMismatch,
    /// x has an empty spatial extent.
    EmptyImage,
    /// The dilated window is larger than the padded input.
    WindowTooLarge,
    /// A GEMM extent passes 2^31, or an image extent (padded, with the window) 2^29: the
    /// kernels' 32-bit index arithmetic (and its out-of-range markers) would not cover
    /// it.
    TooLarge,
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

/// A pass of the convolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvPass {
    Forward,
    InputGrad,
    WeightGrad,
}

/// Torch's output extent along one axis, `(in + 2 padding - dilation (kernel - 1) - 1)
/// / stride + 1`, or `None` when the window does not fit (steps and kernel at least 1).
const fn output_extent(input: u32, kernel: u32, stride: u32, padding: u32, dilation: u32) -> Option<u32> {
    let padded = input as u64 + 2 * padding as u64;
    let window = dilation as u64 * (kernel as u64 - 1) + 1;
    if window > padded {
        return None;
    }
    Some(((padded - window) / stride as u64 + 1) as u32)
}

impl ConvProblem {
    /// The problem of `shape`, or why the kernels cannot run it. The output size is
    /// computed here, once.
    pub const fn new(shape: &ConvShape) -> Result<Self, ConvShapeError> {
        let [batch, in_channels, height, width] = shape.input;
        let [out_channels, weight_in, kernel_h, kernel_w] = shape.weight;
        let groups = shape.groups;
        if groups == 0 {
            return Err(ConvShapeError::NoGroups);
        }
        if shape.stride[0] == 0 || shape.stride[1] == 0 {
            return Err(ConvShapeError::ZeroStep { dilation: false });
        }
        if shape.dilation[0] == 0 || shape.dilation[1] == 0 {
            return Err(ConvShapeError::ZeroStep { dilation: true });
        }
        if in_channels == 0 || out_channels == 0 {
            return Err(ConvShapeError::NoChannels);
        }
        if !in_channels.is_multiple_of(groups) {
            return Err(ConvShapeError::GroupsDivide { input: true });
        }
        if !out_channels.is_multiple_of(groups) {
            return Err(ConvShapeError::GroupsDivide { input: false });
        }
        if weight_in != in_channels / groups || kernel_h == 0 || kernel_w == 0 {
            return Err(ConvShapeError::WeightMismatch);
        }
        if height == 0 || width == 0 {
            return Err(ConvShapeError::EmptyImage);
        }
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
            return Err(ConvShapeError::WindowTooLarge);
        };
        // Every divisor is at least 1: the extents are, and so are the output's, whose
        // window fits.
        let problem = Self {
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
            groups,
            out_h,
            out_w,
            div_out_w: FastDiv::new(out_w),
            div_out_pixels: FastDiv::new(out_h * out_w),
            div_width: FastDiv::new(width),
            div_pixels: FastDiv::new(height * width),
            div_taps: FastDiv::new(kernel_h * kernel_w),
            div_kernel_w: FastDiv::new(kernel_w),
            div_stride_h: FastDiv::new(shape.stride[0]),
            div_stride_w: FastDiv::new(shape.stride[1]),
        };
        if !problem.fits_index_limits() {
            return Err(ConvShapeError::TooLarge);
        }
        Ok(problem)
    }

    /// Whether the kernels' 32-bit index arithmetic covers the problem: every GEMM
    /// extent below 2^31 (with a tile of slack), and image extents (padded, with the
    /// window) below 2^29 so that coordinates never approach the gathers' out-of-range
    /// markers.
    const fn fits_index_limits(&self) -> bool {
        let (batch, cin, cout, taps) = (
            self.batch as u64,
            self.in_channels as u64,
            self.out_channels as u64,
            self.taps() as u64,
        );
        let slack = super::gemm::TILE_K as u64;
        let gemm_extents = [
            batch * self.height as u64 * self.width as u64,
            batch * self.out_h as u64 * self.out_w as u64 + slack,
            cin * taps + slack,
            cout * taps + slack,
        ];
        let image_extents = [
            self.height as u64 + 2 * self.pad_h as u64 + self.dilation_h as u64 * self.kernel_h as u64,
            self.width as u64 + 2 * self.pad_w as u64 + self.dilation_w as u64 * self.kernel_w as u64,
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

    /// Elements of the weights: `out * in / groups * kh * kw`.
    pub const fn weight_count(&self) -> u64 {
        self.out_channels as u64 * self.in_per_group() as u64 * self.taps() as u64
    }

    /// Elements of x (and of the input gradient).
    pub const fn input_count(&self) -> u64 {
        self.batch as u64 * self.in_channels as u64 * self.pixels() as u64
    }

    /// Elements of y (and of the residual).
    pub const fn output_count(&self) -> u64 {
        self.batch as u64 * self.out_channels as u64 * self.out_pixels() as u64
    }

    /// y's shape: `[batch, out_channels, out_h, out_w]`.
    pub const fn output_shape(&self) -> [u32; 4] {
        [self.batch, self.out_channels, self.out_h, self.out_w]
    }
    /// x's shape: `[batch, in_channels, height, width]`.
    pub const fn input_shape(&self) -> [u32; 4] {
        [self.batch, self.in_channels, self.height, self.width]
    }
    /// This pointwise convolution (a 1 x 1 window at stride 1, no padding) over images
    /// of one row of all their pixels: the same tensors in either layout, whose long
    /// rows suit the kernels that take an output row at a time (NCHW ones then read x
    /// as it lies). `None` for other windows, one-row images and depthwise layers
    /// (whose stencils tile 2-D maps).
    pub const fn pointwise_as_row(&self) -> Option<Self> {
        let pointwise = self.kernel_h == 1
            && self.kernel_w == 1
            && self.stride_h == 1
            && self.stride_w == 1
            && self.pad_h == 0
            && self.pad_w == 0;
        let Some(pixels) = self.height.checked_mul(self.width) else {
            return None;
        };
        if !pointwise || self.height == 1 || self.groups == self.in_channels {
            return None;
        }
        let shape = ConvShape {
            input: [self.batch, self.in_channels, 1, pixels],
            weight: self.weight_shape(),
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: self.groups,
        };
        match Self::new(&shape) {
            Ok(row) => Some(row),
            Err(_) => None,
        }
    }

    /// w's shape: `[out_channels, in_channels / groups, kernel_h, kernel_w]`.
    pub const fn weight_shape(&self) -> [u32; 4] {
        [
            self.out_channels,
            self.in_per_group(),
            self.kernel_h,
            self.kernel_w,
        ]
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

    /// The origin of the window of output pixel `m` of the batch (`image * out_pixels
    /// + pixel`): x's column and row of its first tap before the padding, and the image.
    #[inline(always)]
    pub const fn window_origin(&self, m: u32) -> [i32; 3] {
        let (image, pixel) = self.div_out_pixels.divmod(m);
        let (oy, ox) = self.div_out_w.divmod(pixel);
        [
            (ox * self.stride_w) as i32 - self.pad_w as i32,
            (oy * self.stride_h) as i32 - self.pad_h as i32,
            image as i32,
        ]
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_places_and_indices_are_inverse_in_both_layouts() {
        let [channels, height, width] = [3u32, 5, 7];
        let divs = (
            FastDiv::new(channels),
            FastDiv::new(height * width),
            FastDiv::new(width),
        );
        for channels_last in [false, true] {
            for i in 0..2 * channels * height * width {
                let place = element_place(i, channels_last, divs.0, divs.1, divs.2);
                let [n, c, y, x] = place;
                assert!(n < 2 && c < channels && y < height && x < width, "{place:?}");
                let index = element_index(place, channels_last, [channels, height, width]);
                assert_eq!(index, i as u64, "{place:?} channels last {channels_last}");
            }
        }
        // NHWC keeps the channels of a pixel together, NCHW the pixels of a channel.
        assert_eq!(element_index([0, 1, 0, 0], true, [channels, height, width]), 1);
        assert_eq!(element_index([0, 0, 0, 1], false, [channels, height, width]), 1);
    }

    pub(crate) fn shape(input: [u32; 4], weight: [u32; 4]) -> ConvShape {
        ConvShape {
            input,
            weight,
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
        }
    }

    #[test]
    fn pointwise_problems_run_over_one_row_of_all_pixels() {
        let problem = ConvProblem::new(&shape([32, 64, 56, 56], [256, 64, 1, 1])).unwrap();
        let row = problem.pointwise_as_row().expect("a pointwise problem");
        assert_eq!([row.height, row.width, row.out_h, row.out_w], [1, 3136, 1, 3136]);
        assert_eq!(row.output_shape(), [32, 256, 1, 3136]);
        assert_eq!(row.weight_shape(), problem.weight_shape());
        let grouped = ConvShape {
            groups: 4,
            ..shape([2, 8, 5, 7], [4, 2, 1, 1])
        };
        let grouped = ConvProblem::new(&grouped).unwrap().pointwise_as_row().unwrap();
        assert_eq!([grouped.groups, grouped.width], [4, 35]);
        // Windows, strides and padding that skip or repeat pixels keep their maps, as do
        // depthwise layers and maps of one row already.
        let others = [
            shape([2, 8, 5, 7], [8, 8, 3, 3]),
            ConvShape {
                stride: [2, 2],
                ..shape([2, 8, 5, 7], [8, 8, 1, 1])
            },
            ConvShape {
                padding: [0, 1],
                ..shape([2, 8, 5, 7], [8, 8, 1, 1])
            },
            ConvShape {
                groups: 8,
                ..shape([2, 8, 5, 7], [8, 1, 1, 1])
            },
            shape([2, 8, 1, 7], [8, 8, 1, 1]),
        ];
        for other in others {
            assert_eq!(
                ConvProblem::new(&other).unwrap().pointwise_as_row(),
                None,
                "{other:?}"
            );
        }
    }

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
    fn the_output_size_follows_torch() {
        // floor((in + 2p - d(k - 1) - 1) / s) + 1
        let out = |h: u32, k: u32, s: u32, p: u32, d: u32| {
            let shape = ConvShape {
                stride: [s, 1],
                padding: [p, 0],
                dilation: [d, 1],
                ..shape([1, 1, h, 8], [1, 1, k, 1])
            };
            ConvProblem::new(&shape).map(|p| p.out_h)
        };
        assert_eq!(out(1024, 3, 1, 0, 1), Ok(1022));
        assert_eq!(out(7, 3, 2, 1, 1), Ok(4));
        assert_eq!(out(7, 3, 3, 2, 2), Ok(3));
        assert_eq!(out(2, 3, 1, 0, 1), Err(ConvShapeError::WindowTooLarge));
        assert_eq!(out(2, 3, 1, 1, 1), Ok(2));
        assert_eq!(
            out(5, 3, 0, 0, 1),
            Err(ConvShapeError::ZeroStep { dilation: false })
        );
        assert_eq!(
            out(5, 3, 1, 0, 0),
            Err(ConvShapeError::ZeroStep { dilation: true })
        );
    }

    #[test]
    fn inconsistent_shapes_are_errors_not_panics() {
        let check = |s: ConvShape| ConvProblem::new(&s).err();
        let base = shape([1, 6, 8, 8], [4, 6, 3, 3]);
        assert_eq!(
            check(ConvShape { groups: 0, ..base }),
            Some(ConvShapeError::NoGroups)
        );
        assert_eq!(
            check(ConvShape { groups: 4, ..base }),
            Some(ConvShapeError::GroupsDivide { input: true })
        );
        assert_eq!(
            check(ConvShape {
                groups: 3,
                weight: [5, 2, 3, 3],
                ..base
            }),
            Some(ConvShapeError::GroupsDivide { input: false })
        );
        assert_eq!(
            check(shape([1, 6, 8, 8], [4, 3, 3, 3])),
            Some(ConvShapeError::WeightMismatch)
        );
        assert_eq!(
            check(shape([1, 6, 8, 8], [4, 6, 0, 3])),
            Some(ConvShapeError::WeightMismatch)
        );
        assert_eq!(
            check(shape([1, 0, 8, 8], [4, 0, 3, 3])),
            Some(ConvShapeError::NoChannels)
        );
        assert_eq!(
            check(shape([1, 6, 0, 8], [4, 6, 1, 1])),
            Some(ConvShapeError::EmptyImage)
        );
        assert_eq!(
            check(shape([40_000, 1, 256, 256], [1, 1, 1, 1])),
            Some(ConvShapeError::TooLarge)
        );
        assert_eq!(
            check(shape([1, 1, 1 << 30, 1], [1, 1, 1, 1])),
            Some(ConvShapeError::TooLarge)
        );
        // An empty batch is a problem with empty GEMMs, not an error.
        assert_eq!(
            ConvProblem::new(&shape([0, 6, 8, 8], [4, 6, 3, 3])).map(|p| p.output_shape()),
            Ok([0, 4, 6, 6])
        );
    }
}
