//! `min` and `amin` on the GPU against the CPU reference: random ranks 1-4, awkward
//! extents, every axis, keepdim, NaN and infinities, many ties. Values and indices must
//! match exactly. A fixed case per kernel path checks that the plan takes it.

use host::plans::MinPlan;
use host::{Error, Gpu, MinElement, bf16, f16, reference};
use ndarray::{ArrayD, IxDyn};
use proptest::prelude::*;
use proptest::sample::select;
use tests::{gpu_or_skip, random_words, runner};

/// Extents around warp, vector and block multiples, primes, and random ones.
fn extent() -> impl Strategy<Value = usize> {
    prop_oneof![
        3 => select(vec![1, 2, 3, 4, 5, 7, 8, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1023, 1025]),
        1 => 1..300usize,
    ]
}

/// Shapes of rank 1-4 up to 300k elements, or one very long axis (which splits the
/// reduction over blocks) beside short ones.
fn shape() -> impl Strategy<Value = Vec<usize>> {
    let general = prop::collection::vec(extent(), 1..=4).prop_filter("at most 300k elements", |s| {
        s.iter().product::<usize>() <= 300_000
    });
    let long =
        (100_000..2_000_000usize, 1..6usize, any::<bool>(), any::<bool>()).prop_map(|(n, k, first, two)| {
            match (two, first) {
                (false, _) => vec![n],
                (true, true) => vec![n, k],
                (true, false) => vec![k, n],
            }
        });
    prop_oneof![6 => general, 1 => long]
}

/// One case: a shape, an axis into it, keepdim, a seed, and how often NaN appears.
fn case() -> impl Strategy<Value = (Vec<usize>, usize, bool, u64, u32)> {
    shape().prop_flat_map(|s| {
        let rank = s.len();
        (
            Just(s),
            0..rank,
            any::<bool>(),
            any::<u64>(),
            select(vec![0u32, 1, 100]),
        )
    })
}

/// Values on a small integer grid (many ties), with infinities and, per `nan_per_10k`,
/// NaN mixed in.
trait TestValue: MinElement {
    fn draw(bits: u64, nan_per_10k: u32) -> Self;
    /// The element no other beats but NaN.
    const LARGEST: Self;
}

impl TestValue for f32 {
    const LARGEST: Self = f32::INFINITY;

    fn draw(bits: u64, nan_per_10k: u32) -> Self {
        f64::draw(bits, nan_per_10k) as f32
    }
}

impl TestValue for f64 {
    const LARGEST: Self = f64::INFINITY;

    fn draw(bits: u64, nan_per_10k: u32) -> Self {
        match bits % 10_000 {
            r if r < nan_per_10k as u64 => f64::NAN,
            r if r < 50 + nan_per_10k as u64 => f64::INFINITY,
            r if r < 100 + nan_per_10k as u64 => f64::NEG_INFINITY,
            _ => ((bits >> 20) % 33) as f64 - 16.0 + if bits & 1 << 40 != 0 { 0.5 } else { 0.0 },
        }
    }
}

impl TestValue for bf16 {
    const LARGEST: Self = bf16::INFINITY;

    fn draw(bits: u64, nan_per_10k: u32) -> Self {
        bf16::from_f64(f64::draw(bits, nan_per_10k))
    }
}

impl TestValue for f16 {
    const LARGEST: Self = f16::INFINITY;

    fn draw(bits: u64, nan_per_10k: u32) -> Self {
        f16::from_f64(f64::draw(bits, nan_per_10k))
    }
}

impl TestValue for i32 {
    const LARGEST: Self = i32::MAX;

    fn draw(bits: u64, _: u32) -> Self {
        match bits % 1000 {
            0 => i32::MIN,
            1 => i32::MAX,
            _ => ((bits >> 20) % 41) as i32 - 20,
        }
    }
}

fn random<T: TestValue>(shape: &[usize], seed: u64, nan_per_10k: u32) -> ArrayD<T> {
    let mut next = random_words(seed);
    ArrayD::from_shape_fn(IxDyn(shape), |_| T::draw(next(), nan_per_10k))
}

fn same_values<T: MinElement>(a: &ArrayD<T>, b: &ArrayD<T>) -> bool {
    a.shape() == b.shape()
        && a.iter()
            .zip(b)
            .all(|(&x, &y)| x == y || (x.is_nan() && y.is_nan()))
}

fn check_min<T: TestValue>(
    gpu: &Gpu,
    case: (Vec<usize>, usize, bool, u64, u32),
) -> Result<(), TestCaseError> {
    let (shape, axis, keepdim, seed, nan) = case;
    check_min_of(gpu, &random::<T>(&shape, seed, nan), axis, keepdim)
}

/// `min` and `amin` of `x` along `axis` against the reference, into fresh and poisoned
/// outputs.
fn check_min_of<T: TestValue>(
    gpu: &Gpu,
    x: &ArrayD<T>,
    axis: usize,
    keepdim: bool,
) -> Result<(), TestCaseError> {
    let shape = x.shape();
    let (want_values, want_indices) = reference::min::min(x, axis, keepdim).unwrap();
    let device_x = gpu.upload(x).unwrap();
    let (mut values, mut indices) = gpu.min(&device_x, axis, keepdim).unwrap();
    let mut amin = gpu.amin(&device_x, axis, keepdim).unwrap();
    // Poison and run again into the same arrays: every output element must be written
    // by the kernels.
    gpu.poison(&mut values).unwrap();
    gpu.poison(&mut indices).unwrap();
    gpu.poison(&mut amin).unwrap();
    gpu.min_into(&device_x, axis, &mut values, &mut indices).unwrap();
    gpu.amin_into(&device_x, axis, &mut amin).unwrap();
    let (got_values, got_indices) = (gpu.download(&values).unwrap(), gpu.download(&indices).unwrap());
    prop_assert!(
        same_values(&got_values, &want_values),
        "values differ for {shape:?} axis {axis}"
    );
    prop_assert_eq!(
        got_indices,
        want_indices,
        "indices differ for {:?} axis {}",
        shape,
        axis
    );
    let amin = gpu.download(&amin).unwrap();
    prop_assert!(
        same_values(&amin, &want_values),
        "amin differs for {shape:?} axis {axis}"
    );
    Ok(())
}

#[test]
fn min_and_amin_f32_match_the_reference() {
    let Some(gpu) = gpu_or_skip("min_and_amin_f32_match_the_reference") else {
        return;
    };
    runner().run(&case(), |c| check_min::<f32>(&gpu, c)).unwrap();
}

#[test]
fn min_and_amin_f64_match_the_reference() {
    let Some(gpu) = gpu_or_skip("min_and_amin_f64_match_the_reference") else {
        return;
    };
    runner().run(&case(), |c| check_min::<f64>(&gpu, c)).unwrap();
}

#[test]
fn min_and_amin_i32_match_the_reference() {
    let Some(gpu) = gpu_or_skip("min_and_amin_i32_match_the_reference") else {
        return;
    };
    runner().run(&case(), |c| check_min::<i32>(&gpu, c)).unwrap();
}

#[test]
fn min_and_amin_bf16_match_the_reference() {
    let Some(gpu) = gpu_or_skip("min_and_amin_bf16_match_the_reference") else {
        return;
    };
    runner().run(&case(), |c| check_min::<bf16>(&gpu, c)).unwrap();
}

#[test]
fn min_and_amin_f16_match_the_reference() {
    let Some(gpu) = gpu_or_skip("min_and_amin_f16_match_the_reference") else {
        return;
    };
    runner().run(&case(), |c| check_min::<f16>(&gpu, c)).unwrap();
}

#[test]
fn min_of_views_and_nan_rows() {
    let Some(gpu) = gpu_or_skip("min_of_views_and_nan_rows") else {
        return;
    };
    let x = random::<f32>(&[37, 129], 7, 0);
    let view = x.t();
    let (v, i) = gpu.min_of(&view, 1, false).unwrap();
    let (rv, ri) = reference::min::min(&view, 1, false).unwrap();
    assert!(same_values(&v, &rv));
    assert_eq!(i, ri);
    let mut y = random::<f64>(&[4, 1000], 9, 0);
    y[[1, 500]] = f64::NAN;
    y[[1, 700]] = f64::NAN;
    y[[3, 999]] = f64::NAN;
    let (v, i) = gpu.min_of(&y, 1, false).unwrap();
    assert!(v[1].is_nan() && v[3].is_nan() && !v[0].is_nan() && !v[2].is_nan());
    assert_eq!((i[1], i[3]), (500, 999));
    assert!(same_values(
        &gpu.amin_of(&y, 1, true).unwrap(),
        &reference::min::amin(&y, 1, true).unwrap()
    ));
}

/// Bad input is an error on the CPU path, with or without a GPU.
#[test]
fn invalid_reductions_are_errors() {
    let scalar = ndarray::arr0(1.0f32);
    assert!(matches!(
        reference::min::min(&scalar, 0, false),
        Err(Error::ZeroRank { op: "min" })
    ));
    let x = ArrayD::<f32>::zeros(IxDyn(&[2, 3]));
    let err = reference::min::amin(&x, 2, false).unwrap_err();
    assert!(matches!(err, Error::InvalidAxis { axis: 2, rank: 2 }), "{err}");
    assert_eq!(
        err.to_string(),
        "axis 2 is out of range for an array of rank 2 (valid axes: 0..2)"
    );
    let empty = ArrayD::<i32>::zeros(IxDyn(&[4, 0, 3]));
    let err = reference::min::min(&empty, 1, false).unwrap_err();
    assert!(
        matches!(
            err,
            Error::EmptyAxis {
                op: "min",
                axis: 1,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("shape [4, 0, 3]"));
    // Empty elsewhere than the reduced axis is fine: the output is empty.
    assert_eq!(reference::min::amin(&empty, 2, false).unwrap().shape(), &[4, 0]);
}

#[test]
fn invalid_reductions_are_errors_on_the_gpu_too() {
    let Some(gpu) = gpu_or_skip("invalid_reductions_are_errors_on_the_gpu_too") else {
        return;
    };
    let scalar = gpu.upload(&ndarray::arr0(1.0f32)).unwrap();
    assert!(matches!(gpu.min(&scalar, 0, false), Err(Error::ZeroRank { .. })));
    let x = gpu.alloc::<f64>(&[2, 3]).unwrap();
    assert!(matches!(
        gpu.amin(&x, 5, true),
        Err(Error::InvalidAxis { axis: 5, rank: 2 })
    ));
    let empty = gpu.alloc::<i32>(&[4, 0, 3]).unwrap();
    assert!(matches!(gpu.min(&empty, 1, false), Err(Error::EmptyAxis { .. })));
    let (v, i) = gpu.min(&empty, 2, true).unwrap();
    assert_eq!((v.shape(), i.shape()), (&[4, 0, 1][..], &[4, 0, 1][..]));
}

/// The slab kernel reads each span whole, from its first row to the array's last bytes
/// (past its last whole 16-byte vector, which threads copy): every column's least in
/// the first row, then in the last.
#[test]
fn slab_spans_are_read_from_first_to_last_byte() {
    let Some(gpu) = gpu_or_skip("slab_spans_are_read_from_first_to_last_byte") else {
        return;
    };
    check_span_ends::<f32>(&gpu, |v| v);
    check_span_ends::<bf16>(&gpu, bf16::from_f32);
}

fn check_span_ends<T: TestValue>(gpu: &Gpu, from_f32: fn(f32) -> T) {
    // 620_487 elements: the last vector 12 (4-byte) or 14 (2-byte) bytes past the end.
    let (rows, shape) = (201, [3, 201, 1029]);
    let plan = gpu.min_plan::<T>(&shape, 1).unwrap();
    assert!(matches!(plan, Some(MinPlan::Slab(_))), "{plan:?}");
    for descending in [false, true] {
        // Small integers: exact in every element type.
        let x = ArrayD::from_shape_fn(IxDyn(&shape), |i| {
            let row = if descending { rows - i[1] } else { i[1] };
            from_f32((row + i[2] % 7) as f32)
        });
        check_min_of(gpu, &x, 1, false).unwrap();
    }
}

/// One case per kernel path and element width, each checked to take it: the rows
/// kernel with and without a split of the reduced axis, the strided kernel with vector
/// and scalar loads, in narrow blocks (a warp's lanes along a row; split, partials
/// merged by the combine kernel, and not) and wide ones (the block's lanes), and the
/// slab kernel (whole unaligned rows a block) with and without a split.
#[test]
fn every_min_kernel_path_matches_the_reference() {
    let Some(gpu) = gpu_or_skip("every_min_kernel_path_matches_the_reference") else {
        return;
    };
    check_paths::<f32>(&gpu);
    check_paths::<bf16>(&gpu);
}

fn check_paths<T: TestValue>(gpu: &Gpu) {
    let per_vector = 16 / size_of::<T>();
    let wide_outer = 4 * gpu.info().multiprocessors as usize;
    // Unaligned rows past the slab kernel's longest: 5 wide blocks a row.
    let narrow_outer = (2 * wide_outer - 1) / 5;
    type Path = fn(&MinPlan) -> bool;
    let cases: [(Vec<usize>, usize, Path); 14] = [
        (
            vec![1000, 17],
            1,
            |p| matches!(p, MinPlan::Rows(r) if r.split == 1),
        ),
        (
            vec![3, 1_000_003],
            1,
            |p| matches!(p, MinPlan::Rows(r) if r.split > 1),
        ),
        (
            vec![40, 1000, 64],
            1,
            |p| matches!(p, MinPlan::Strided(s) if s.vector && s.split == 1 && s.slices > 1),
        ),
        (
            vec![40, 1000, 33],
            1,
            |p| matches!(p, MinPlan::Strided(s) if !s.vector && s.split == 1 && s.slices > 1),
        ),
        (
            vec![200_003, per_vector],
            0,
            |p| matches!(p, MinPlan::Strided(s) if s.vector && s.split > 1 && s.slices > 1),
        ),
        (
            vec![200_003, 3],
            0,
            |p| matches!(p, MinPlan::Strided(s) if !s.vector && s.split > 1 && s.slices > 1),
        ),
        // Rows of at least 1024 columns (4 a lane) take wide blocks where those fill
        // the GPU twice: 2 blocks a row, 4 an SM. 37 rows: whole runs of rows and a
        // last part run.
        (
            vec![wide_outer, 37, 1032],
            1,
            |p| matches!(p, MinPlan::Strided(s) if s.vector && s.split == 1 && s.slices == 1),
        ),
        (
            vec![(2 * wide_outer).div_ceil(5), 37, 4102],
            1,
            |p| matches!(p, MinPlan::Strided(s) if !s.vector && s.split == 1 && s.slices == 1),
        ),
        // Too few to fill it twice: narrow blocks.
        (
            vec![narrow_outer, 37, 4102],
            1,
            |p| matches!(p, MinPlan::Strided(s) if !s.vector && s.slices > 1),
        ),
        // Unaligned rows of 1025 to 4096 columns: the slab kernel, its rows crossing
        // the ring's stages, the first outer's span starting at a 16-byte boundary and
        // the others not, the array's last 16 bytes partly past its end; split into
        // chunks of a few rows where outer indices are fewer than the SMs.
        (
            vec![70, 10, 1029],
            1,
            |p| matches!(p, MinPlan::Slab(s) if s.split == 1),
        ),
        (
            vec![5, 300, 2047],
            1,
            |p| matches!(p, MinPlan::Slab(s) if s.split > 1),
        ),
        (vec![2, 33, 4095], 1, |p| matches!(p, MinPlan::Slab(_))),
        (
            vec![3, 5000, 1029],
            1,
            |p| matches!(p, MinPlan::Slab(s) if s.split > 1),
        ),
        // A 2-D array reduced along dim 0: outer 1.
        (
            vec![777, 3001],
            0,
            |p| matches!(p, MinPlan::Slab(s) if s.split > 1),
        ),
    ];
    for (shape, axis, expected) in cases {
        let plan = gpu.min_plan::<T>(&shape, axis).unwrap();
        assert!(
            plan.as_ref().is_some_and(expected),
            "{shape:?} axis {axis}: {plan:?}"
        );
        for keepdim in [false, true] {
            check_min::<T>(gpu, (shape.clone(), axis, keepdim, 17, 1)).unwrap();
        }
        // Every element the largest (infinity): each output's first index, 0, in every
        // chunk of a split too.
        check_min_of(gpu, &ArrayD::from_elem(IxDyn(&shape), T::LARGEST), axis, false).unwrap();
    }
}
