//! `cumsum` on the GPU against the CPU reference: random ranks 1-4, awkward extents
//! around tile sizes, one very long axis, every axis, both kinds, reversed or not, in
//! place or not. Every result must match exactly: integers wrap, and floats are small
//! integers times a power of two, so every prefix sum is exact whatever the order of
//! the additions. Tests meant for one kernel check that the plan picks it.

use host::plans::{ScanPlan, segment_items};
use host::{DeviceArray, Error, Gpu, ScanElement, ScanKind, bf16, f16, reference};
use ndarray::{ArrayD, IxDyn};
use proptest::prelude::*;
use proptest::sample::select;
use tests::{gpu_or_skip, random_words, runner};

/// Extents around warp, vector and tile multiples (tiles hold 2048 or 4096 elements,
/// strided tiles 32 or 64 rows), primes, and random ones.
fn extent() -> impl Strategy<Value = usize> {
    prop_oneof![
        3 => select(vec![1, 2, 3, 4, 5, 7, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 2047, 2049, 4095, 4097]),
        1 => 1..300usize,
    ]
}

/// Shapes of rank 1-4 up to 300k elements, or one very long axis (many segments of a
/// long row; whole 128-bit runs half the time).
fn shape() -> impl Strategy<Value = Vec<usize>> {
    let general = prop::collection::vec(extent(), 1..=4).prop_filter("at most 300k elements", |s| {
        s.iter().product::<usize>() <= 300_000
    });
    let long = (
        100_000..3_000_000usize,
        1..4usize,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(n, k, first, two, aligned)| {
            let n = if aligned { n / 4 * 4 } else { n };
            match (two, first) {
                (false, _) => vec![n],
                (true, true) => vec![n, k],
                (true, false) => vec![k, n],
            }
        });
    prop_oneof![6 => general, 1 => long]
}

#[derive(Debug, Clone)]
struct Case {
    shape: Vec<usize>,
    axis: usize,
    kind: ScanKind,
    reverse: bool,
    in_place: bool,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    shape().prop_flat_map(|shape| {
        let rank = shape.len();
        (
            Just(shape),
            0..rank,
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            any::<u64>(),
        )
            .prop_map(|(shape, axis, exclusive, reverse, in_place, seed)| Case {
                shape,
                axis,
                kind: if exclusive {
                    ScanKind::Exclusive
                } else {
                    ScanKind::Inclusive
                },
                reverse,
                in_place,
                seed,
            })
    })
}

/// Random values whose prefix sums are exact: floats are integers in [-3, 3] times
/// 2^-5 (f32, and bf16 and f16, which sum in f32: every prefix of up to 5.5M elements
/// stays under 2^24 units of 2^-5) or in [-1000, 1000] times 2^-10 (f64), integers span
/// their whole range (so sums wrap). A 16-bit output is its exact sum rounded once, as
/// the reference rounds it: sums beyond 2^8 (bf16) or 2^11 (f16) units round, so a
/// kernel that rounded a running sum to 16 bits would fail.
trait TestValue: ScanElement {
    fn draw(bits: u64) -> Self;
}

impl TestValue for f32 {
    fn draw(bits: u64) -> Self {
        ((bits >> 40) % 7) as f32 / 32.0 - 3.0 / 32.0
    }
}

impl TestValue for f64 {
    fn draw(bits: u64) -> Self {
        ((bits >> 20) % 2001) as f64 / 1024.0 - 1000.0 / 1024.0
    }
}

impl TestValue for i32 {
    fn draw(bits: u64) -> Self {
        bits as i32
    }
}

impl TestValue for i64 {
    fn draw(bits: u64) -> Self {
        bits as i64
    }
}

fn random<T: TestValue>(shape: &[usize], seed: u64) -> ArrayD<T> {
    let mut next = random_words(seed);
    ArrayD::from_shape_fn(IxDyn(shape), |_| T::draw(next()))
}

fn check_scan<T: TestValue>(gpu: &Gpu, c: Case) -> Result<(), TestCaseError> {
    let x = random::<T>(&c.shape, c.seed);
    let want = reference::scan::cumsum(&x, c.axis, c.kind, c.reverse).unwrap();
    let device_x = gpu.upload(&x).unwrap();
    let got = if c.in_place {
        let mut y = gpu.upload(&x).unwrap();
        gpu.cumsum_in_place(&mut y, c.axis, c.kind, c.reverse).unwrap();
        gpu.download(&y).unwrap()
    } else {
        cumsum_into_poisoned(gpu, &device_x, c.axis, c.kind, c.reverse)
    };
    let first_difference = got.iter().zip(&want).position(|(g, w)| g != w);
    prop_assert!(
        first_difference.is_none(),
        "{:?}: element {} is {:?}, want {:?}",
        c,
        first_difference.unwrap_or_default(),
        got.iter().nth(first_difference.unwrap_or_default()),
        want.iter().nth(first_difference.unwrap_or_default())
    );
    Ok(())
}

/// The scan of x into a new array poisoned first, downloaded: an element the kernel
/// fails to write shows as the poison. (A fresh output would do for the values, but
/// compute-sanitizer's initcheck does not see bulk stores, which the segments kernel
/// leaves long rows by, and would report such an output as read unwritten.)
pub(crate) fn cumsum_into_poisoned<T: ScanElement>(
    gpu: &Gpu,
    x: &DeviceArray<T>,
    axis: usize,
    kind: ScanKind,
    reverse: bool,
) -> ArrayD<T> {
    let mut y = gpu.alloc::<T>(x.shape()).unwrap();
    gpu.poison(&mut y).unwrap();
    gpu.cumsum_into(x, &mut y, axis, kind, reverse).unwrap();
    gpu.download(&y).unwrap()
}

/// Asserts that a scan of `shape` along `axis` takes the kernel `expected` names.
fn assert_plan<T: ScanElement>(gpu: &Gpu, shape: &[usize], axis: usize, expected: fn(&ScanPlan) -> bool) {
    let plan = gpu.cumsum_plan::<T>(shape, axis).unwrap();
    assert!(
        plan.as_ref().is_some_and(expected),
        "{shape:?} axis {axis}: {plan:?}"
    );
}

#[test]
fn cumsum_f32_matches_the_reference_exactly() {
    let Some(gpu) = gpu_or_skip("cumsum_f32_matches_the_reference_exactly") else {
        return;
    };
    runner().run(&case(), |c| check_scan::<f32>(&gpu, c)).unwrap();
}

#[test]
fn cumsum_f64_matches_the_reference_exactly() {
    let Some(gpu) = gpu_or_skip("cumsum_f64_matches_the_reference_exactly") else {
        return;
    };
    runner().run(&case(), |c| check_scan::<f64>(&gpu, c)).unwrap();
}

#[test]
fn cumsum_i32_matches_the_reference_exactly() {
    let Some(gpu) = gpu_or_skip("cumsum_i32_matches_the_reference_exactly") else {
        return;
    };
    runner().run(&case(), |c| check_scan::<i32>(&gpu, c)).unwrap();
}

#[test]
fn cumsum_i64_matches_the_reference_exactly() {
    let Some(gpu) = gpu_or_skip("cumsum_i64_matches_the_reference_exactly") else {
        return;
    };
    runner().run(&case(), |c| check_scan::<i64>(&gpu, c)).unwrap();
}

#[test]
fn cumsum_bf16_matches_the_reference_exactly() {
    let Some(gpu) = gpu_or_skip("cumsum_bf16_matches_the_reference_exactly") else {
        return;
    };
    runner().run(&case(), |c| check_scan::<bf16>(&gpu, c)).unwrap();
}

#[test]
fn cumsum_f16_matches_the_reference_exactly() {
    let Some(gpu) = gpu_or_skip("cumsum_f16_matches_the_reference_exactly") else {
        return;
    };
    runner().run(&case(), |c| check_scan::<f16>(&gpu, c)).unwrap();
}

#[test]
fn cumsum_of_views_and_empty_arrays() {
    let Some(gpu) = gpu_or_skip("cumsum_of_views_and_empty_arrays") else {
        return;
    };
    let x = random::<i64>(&[33, 65], 3);
    let view = x.t();
    let got = gpu.cumsum_of(&view, 1, ScanKind::Exclusive, false).unwrap();
    assert_eq!(
        got,
        reference::scan::cumsum(&view, 1, ScanKind::Exclusive, false).unwrap()
    );
    let empty = gpu.alloc::<f32>(&[3, 0, 2]).unwrap();
    assert_eq!(
        gpu.cumsum(&empty, 1, ScanKind::Inclusive, true).unwrap().shape(),
        &[3, 0, 2]
    );
}

#[test]
fn invalid_scans_are_errors() {
    let scalar = ndarray::arr0(1i32);
    assert!(matches!(
        reference::scan::cumsum(&scalar, 0, ScanKind::Exclusive, false),
        Err(Error::ZeroRank { op: "cumsum" })
    ));
    let x = ArrayD::<f64>::zeros(IxDyn(&[2, 3]));
    let err = reference::scan::cumsum(&x, 2, ScanKind::Inclusive, false).unwrap_err();
    assert!(matches!(err, Error::InvalidAxis { axis: 2, rank: 2 }), "{err}");
    let Some(gpu) = gpu_or_skip("invalid_scans_are_errors (GPU part)") else {
        return;
    };
    let x = gpu.alloc::<f64>(&[2, 3]).unwrap();
    assert!(matches!(
        gpu.cumsum(&x, 3, ScanKind::Exclusive, false),
        Err(Error::InvalidAxis { axis: 3, rank: 2 })
    ));
    let mut y = gpu.alloc::<f64>(&[3, 2]).unwrap();
    let err = gpu
        .cumsum_into(&x, &mut y, 0, ScanKind::Exclusive, false)
        .unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { .. }), "{err}");
}

/// Many long rows take the block-per-row kernel (at least 2048 rows of a whole tile);
/// the random shapes above stay under its threshold.
#[test]
fn cumsum_of_many_long_rows() {
    let Some(gpu) = gpu_or_skip("cumsum_of_many_long_rows") else {
        return;
    };
    for (i, (kind, reverse)) in [(ScanKind::Exclusive, false), (ScanKind::Inclusive, true)]
        .into_iter()
        .enumerate()
    {
        let case = |shape: Vec<usize>| Case {
            shape,
            axis: 1,
            kind,
            reverse,
            in_place: i == 1,
            seed: 77 + i as u64,
        };
        let rows = |p: &ScanPlan| matches!(p, ScanPlan::Rows(_));
        assert_plan::<f32>(&gpu, &[2048, 4096 + 16], 1, rows);
        check_scan::<f32>(&gpu, case(vec![2048, 4096 + 16])).unwrap();
        assert_plan::<i32>(&gpu, &[2049, 8192], 1, rows);
        check_scan::<i32>(&gpu, case(vec![2049, 8192])).unwrap();
        assert_plan::<f64>(&gpu, &[2048, 2048 + 8], 1, rows);
        check_scan::<f64>(&gpu, case(vec![2048, 2048 + 8])).unwrap();
        assert_plan::<i64>(&gpu, &[2050, 4096], 1, rows);
        check_scan::<i64>(&gpu, case(vec![2050, 4096])).unwrap();
        assert_plan::<bf16>(&gpu, &[2048, 8192 + 32], 1, rows);
        check_scan::<bf16>(&gpu, case(vec![2048, 8192 + 32])).unwrap();
        assert_plan::<f16>(&gpu, &[2049, 16384], 1, rows);
        check_scan::<f16>(&gpu, case(vec![2049, 16384])).unwrap();
    }
}

/// At least 2048 columns take the columns kernel: a thread per column from 2^15, else
/// 2 to 16 threads sharing each batch of rows; columns not a multiple of the block,
/// axes of one row, of a batch and more, in place, reversed; leading and middle axes.
/// Integers check the running sums exactly.
#[test]
fn cumsum_down_many_columns() {
    let Some(gpu) = gpu_or_skip("cumsum_down_many_columns") else {
        return;
    };
    use ScanKind::{Exclusive, Inclusive};
    let columns = |p: &ScanPlan| matches!(p, ScanPlan::Columns(_));
    check_cases::<f32>(
        &gpu,
        columns,
        &[
            (&[300, 33_000], 0, Exclusive, false, false),
            (&[5, 301, 2001], 1, Exclusive, true, false),
        ],
    );
    check_cases::<i32>(
        &gpu,
        columns,
        &[
            (&[3, 77, 12_000], 1, Inclusive, true, true),
            (&[1, 32_768], 0, Exclusive, false, true),
            (&[1000, 20_000], 0, Inclusive, false, false),
            (&[3, 4096], 0, Exclusive, true, true),
            (&[700, 2048], 0, Inclusive, true, false),
        ],
    );
    check_cases::<i64>(
        &gpu,
        columns,
        &[
            (&[40, 40_001], 0, Exclusive, true, false),
            (&[517, 4100], 0, Exclusive, false, true),
            (&[2, 1500, 1100], 1, Inclusive, false, false),
        ],
    );
    check_cases::<f64>(
        &gpu,
        columns,
        &[
            (&[2, 33, 20_000], 1, Inclusive, false, true),
            (&[2, 129, 4096], 1, Inclusive, true, false),
        ],
    );
    check_cases::<bf16>(
        &gpu,
        columns,
        &[
            (&[3000, 33_000], 0, Exclusive, false, false),
            (&[3, 77, 12_000], 1, Inclusive, true, true),
        ],
    );
    check_cases::<f16>(
        &gpu,
        columns,
        &[
            (&[1000, 5000], 0, Inclusive, true, false),
            (&[300, 2500], 0, Exclusive, false, true),
        ],
    );
}

/// `check_scan` of each `(shape, axis, kind, reverse, in_place)`, after checking that
/// the plan is the one `expected` names.
fn check_cases<T: TestValue>(
    gpu: &Gpu,
    expected: fn(&ScanPlan) -> bool,
    cases: &[(&[usize], usize, ScanKind, bool, bool)],
) {
    for &(shape, axis, kind, reverse, in_place) in cases {
        assert_plan::<T>(gpu, shape, axis, expected);
        let case = Case {
            shape: shape.to_vec(),
            axis,
            kind,
            reverse,
            in_place,
            seed: 11 + axis as u64,
        };
        check_scan::<T>(gpu, case).unwrap();
    }
}

/// Rows of any length, enough of them for hundreds of blocks of a tile's work, take the
/// packed-rows kernel: rows aligned or not, spanning tiles or several to a run (one
/// element each: every element a head), a block's rows ending inside a vector, forward
/// and reversed, in place; and every array of one tile (one block). Integers check
/// the running sums exactly.
#[test]
fn cumsum_of_many_rows_of_any_length() {
    let Some(gpu) = gpu_or_skip("cumsum_of_many_rows_of_any_length") else {
        return;
    };
    use ScanKind::{Exclusive, Inclusive};
    let packed = |p: &ScanPlan| matches!(p, ScanPlan::PackedRows(_));
    check_cases::<f32>(
        &gpu,
        packed,
        &[
            (&[2048, 4100], 1, Exclusive, false, false),
            (&[2048, 4095], 1, Inclusive, true, true),
            (&[512, 9001], 1, Exclusive, true, false),
            (&[7, 5], 1, Inclusive, false, false),
            (&[1], 0, Exclusive, false, false),
        ],
    );
    check_cases::<i32>(
        &gpu,
        packed,
        &[
            (&[1 << 21, 3], 1, Exclusive, true, false),
            (&[2, 3, 1365], 2, Inclusive, false, true),
            (&[13], 0, Inclusive, true, false),
        ],
    );
    check_cases::<i64>(
        &gpu,
        packed,
        &[
            (&[4096, 1001], 1, Inclusive, false, false),
            (&[1 << 22, 1], 1, Exclusive, false, true),
            (&[3, 7], 1, Exclusive, true, false),
        ],
    );
    check_cases::<f64>(&gpu, packed, &[(&[1024, 2049], 1, Exclusive, true, true)]);
    check_cases::<bf16>(
        &gpu,
        packed,
        &[
            (&[4096, 4097], 1, Inclusive, false, false),
            (&[4, 5, 3], 2, Exclusive, true, false),
        ],
    );
    check_cases::<f16>(
        &gpu,
        packed,
        &[
            (&[2048, 5000], 1, Exclusive, true, true),
            (&[8192], 0, Inclusive, false, false),
        ],
    );
}

/// One very long axis takes the segments kernel: hundreds of segments chained by
/// look-back, many more than the GPU holds at once; rows aligned and not (rows whose
/// last segment holds no aligned vector among them), forward and reversed, several rows
/// chained separately. Integers check the chaining exactly.
#[test]
fn cumsum_of_very_long_axes() {
    let Some(gpu) = gpu_or_skip("cumsum_of_very_long_axes") else {
        return;
    };
    let case = |shape: Vec<usize>, kind, reverse, in_place| Case {
        shape,
        axis: 1,
        kind,
        reverse,
        in_place,
        seed: 5 + reverse as u64,
    };
    let segments = |p: &ScanPlan| matches!(p, ScanPlan::Segments(_));
    let one_past_segments = 3 * segment_items(4, false) as usize + 1;
    for shape in [
        vec![1, 1 << 24],
        vec![3, (1 << 22) + 3],
        vec![2, one_past_segments],
    ] {
        assert_plan::<i32>(&gpu, &shape, 1, segments);
    }
    for shape in [vec![2, (1 << 22) + 1], vec![1, 1 << 23]] {
        assert_plan::<i64>(&gpu, &shape, 1, segments);
    }
    assert_plan::<f32>(&gpu, &[2, 1 << 22], 1, segments);
    assert_plan::<f64>(&gpu, &[1, (1 << 22) + 7], 1, segments);
    assert_plan::<bf16>(&gpu, &[2, 1 << 22], 1, segments);
    assert_plan::<f16>(&gpu, &[1, (1 << 22) + 3], 1, segments);
    for reverse in [false, true] {
        check_scan::<i32>(&gpu, case(vec![1, 1 << 24], ScanKind::Exclusive, reverse, true)).unwrap();
        check_scan::<i32>(
            &gpu,
            case(vec![3, (1 << 22) + 3], ScanKind::Inclusive, reverse, false),
        )
        .unwrap();
        check_scan::<i32>(
            &gpu,
            case(vec![2, one_past_segments], ScanKind::Inclusive, reverse, false),
        )
        .unwrap();
        check_scan::<i64>(
            &gpu,
            case(vec![2, (1 << 22) + 1], ScanKind::Exclusive, reverse, false),
        )
        .unwrap();
        check_scan::<i64>(&gpu, case(vec![1, 1 << 23], ScanKind::Inclusive, reverse, true)).unwrap();
        check_scan::<f32>(&gpu, case(vec![2, 1 << 22], ScanKind::Exclusive, reverse, false)).unwrap();
        check_scan::<f64>(
            &gpu,
            case(vec![1, (1 << 22) + 7], ScanKind::Inclusive, reverse, true),
        )
        .unwrap();
        check_scan::<bf16>(&gpu, case(vec![2, 1 << 22], ScanKind::Inclusive, reverse, true)).unwrap();
        check_scan::<f16>(
            &gpu,
            case(vec![1, (1 << 22) + 3], ScanKind::Exclusive, reverse, false),
        )
        .unwrap();
    }
}

/// Rows laid end to end in look-back tiles (contiguous: rows too few for a block each,
/// too short for segments), and down-axis scans of few columns chained by look-back
/// (strided): short rows ending inside tiles, partial last tiles, aligned or not.
#[test]
fn cumsum_of_look_back_tiles() {
    let Some(gpu) = gpu_or_skip("cumsum_of_look_back_tiles") else {
        return;
    };
    use ScanKind::{Exclusive, Inclusive};
    // 128-bit runs wherever the flat length is a multiple of a vector, whatever the
    // rows' length; scalar runs otherwise.
    let vector = |p: &ScanPlan| matches!(p, ScanPlan::Contiguous(c) if c.vector);
    let scalar = |p: &ScanPlan| matches!(p, ScanPlan::Contiguous(c) if !c.vector);
    check_cases::<f32>(
        &gpu,
        vector,
        &[
            (&[3, 16000], 1, Exclusive, false, false),
            (&[1000, 17], 1, Inclusive, true, true),
            (&[8, 4095], 1, Exclusive, true, false),
            (&[12, 4095], 1, Inclusive, false, true),
        ],
    );
    check_cases::<f32>(
        &gpu,
        scalar,
        &[
            (&[5, 4099], 1, Exclusive, true, false),
            (&[7, 4095], 1, Inclusive, false, false),
        ],
    );
    check_cases::<i64>(
        &gpu,
        vector,
        &[
            (&[34, 1001], 1, Inclusive, true, true),
            (&[33, 1000], 1, Inclusive, false, true),
        ],
    );
    check_cases::<i64>(
        &gpu,
        scalar,
        &[
            (&[33, 1001], 1, Exclusive, true, false),
            (&[3, 1667], 1, Exclusive, false, false),
        ],
    );
    check_cases::<bf16>(
        &gpu,
        vector,
        &[
            (&[3, 16000], 1, Exclusive, false, false),
            (&[1000, 17], 1, Inclusive, true, true),
        ],
    );
    check_cases::<f16>(
        &gpu,
        scalar,
        &[
            (&[5, 4099], 1, Exclusive, true, false),
            (&[7, 9001], 1, Inclusive, false, true),
        ],
    );
    let strided = |p: &ScanPlan| matches!(p, ScanPlan::Strided(_));
    check_cases::<f64>(&gpu, strided, &[(&[7, 1000, 33], 1, Exclusive, false, false)]);
    check_cases::<bf16>(&gpu, strided, &[(&[4000, 17], 0, Inclusive, true, true)]);
    check_cases::<f16>(&gpu, strided, &[(&[2, 65, 300], 1, Exclusive, false, false)]);
    check_cases::<i32>(
        &gpu,
        strided,
        &[
            (&[4000, 17], 0, Inclusive, true, true),
            (&[2, 65, 300], 1, Exclusive, true, false),
        ],
    );
}

/// Floats with full mantissas, so that the order of the additions shows in the bits.
trait NoisyFloat: TestValue + Copy + PartialEq {
    fn noisy(bits: u64) -> Self;
    fn to_bits64(self) -> u64;
}

impl NoisyFloat for f32 {
    fn noisy(bits: u64) -> Self {
        (bits >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    fn to_bits64(self) -> u64 {
        self.to_bits() as u64
    }
}

impl NoisyFloat for f64 {
    fn noisy(bits: u64) -> Self {
        (bits >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
    fn to_bits64(self) -> u64 {
        self.to_bits()
    }
}

/// The 16-bit floats draw what f32 draws, rounded: the test values exactly, the noisy
/// ones to 8 or 11 bits.
macro_rules! rounded_from_f32 {
    ($($t:ty),*) => {$(
        impl TestValue for $t {
            fn draw(bits: u64) -> Self {
                <$t>::from_f32(f32::draw(bits))
            }
        }
        impl NoisyFloat for $t {
            fn noisy(bits: u64) -> Self {
                <$t>::from_f32(f32::noisy(bits))
            }
            fn to_bits64(self) -> u64 {
                self.to_bits() as u64
            }
        }
    )*};
}

rounded_from_f32!(bf16, f16);

/// Two scans into another array and one in place, of data whose sums round, must
/// give the same bits on every look-back path (`expected`), forward and reversed.
fn check_deterministic<T: NoisyFloat>(
    gpu: &Gpu,
    shape: &[usize],
    axis: usize,
    expected: fn(&ScanPlan) -> bool,
) {
    assert_plan::<T>(gpu, shape, axis, expected);
    let mut next = random_words(shape.iter().product::<usize>() as u64);
    let x = ArrayD::from_shape_fn(IxDyn(shape), |_| T::noisy(next()));
    let device_x = gpu.upload(&x).unwrap();
    for reverse in [false, true] {
        let bits = |a: &ArrayD<T>| a.iter().map(|v| v.to_bits64()).collect::<Vec<_>>();
        let runs: Vec<Vec<u64>> = (0..2)
            .map(|_| {
                bits(&cumsum_into_poisoned(
                    gpu,
                    &device_x,
                    axis,
                    ScanKind::Inclusive,
                    reverse,
                ))
            })
            .collect();
        let mut in_place = gpu.upload(&x).unwrap();
        gpu.cumsum_in_place(&mut in_place, axis, ScanKind::Inclusive, reverse)
            .unwrap();
        let in_place = bits(&gpu.download(&in_place).unwrap());
        assert!(
            runs[0] == runs[1],
            "{shape:?} axis {axis} reverse {reverse}: two runs differ"
        );
        assert!(
            runs[0] == in_place,
            "{shape:?} axis {axis} reverse {reverse}: in place differs"
        );
    }
}

/// Float scans give the same bits on every run and in place or not, on every path that
/// chains tiles by look-back: long rows (segments, past many anchors), rows laid end to
/// end (contiguous, 128-bit and scalar), and few columns (strided, past many anchors);
/// and on packed rows, whose blocks chain nothing.
#[test]
fn float_scans_are_deterministic() {
    let Some(gpu) = gpu_or_skip("float_scans_are_deterministic") else {
        return;
    };
    let segments = |p: &ScanPlan| matches!(p, ScanPlan::Segments(_));
    let vector = |p: &ScanPlan| matches!(p, ScanPlan::Contiguous(c) if c.vector);
    let scalar = |p: &ScanPlan| matches!(p, ScanPlan::Contiguous(c) if !c.vector);
    let strided = |p: &ScanPlan| matches!(p, ScanPlan::Strided(_));
    let packed = |p: &ScanPlan| matches!(p, ScanPlan::PackedRows(_));
    check_deterministic::<f32>(&gpu, &[2, 1 << 22], 1, segments);
    check_deterministic::<f64>(&gpu, &[1, (1 << 22) + 7], 1, segments);
    check_deterministic::<f32>(&gpu, &[64, 15001], 1, vector);
    check_deterministic::<f32>(&gpu, &[63, 15001], 1, scalar);
    check_deterministic::<f64>(&gpu, &[64, 8000], 1, vector);
    check_deterministic::<f32>(&gpu, &[2048, 4095], 1, packed);
    check_deterministic::<f32>(&gpu, &[65536, 33], 0, strided);
    check_deterministic::<f64>(&gpu, &[3, 20000, 100], 1, strided);
    check_deterministic::<bf16>(&gpu, &[2, 1 << 22], 1, segments);
    check_deterministic::<f16>(&gpu, &[64, 15001], 1, vector);
    check_deterministic::<bf16>(&gpu, &[63, 15001], 1, scalar);
    check_deterministic::<f16>(&gpu, &[65536, 33], 0, strided);
}
