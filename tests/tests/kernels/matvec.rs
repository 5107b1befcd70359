//! `gemv` on the GPU against the f64 CPU reference: random shapes (1, primes, tails
//! around the vector width, wide and tall), both orientations, alpha and beta (beta 0
//! with y full of NaN, which must not be read), f32, f64, bf16 and f16, x as `[k]` or
//! `[k, 1]`. A and x are small integers times 2^-1, so every partial sum is exact
//! whatever the order of the additions (in f32 for the 16-bit types): each element must
//! equal the reference rounded once to the element type, and two runs must be
//! bit-identical. A fixed case per kernel path checks that the plan takes it.
//! `A X` with X of 2 to 16 columns is checked the same way, column by column against
//! the reference.

use host::plans::GemvPlan;
use host::{Error, GemvElement, Gpu, Op, bf16, f16, reference};
use ndarray::{Array1, Array2, ArrayD, Ix2, IxDyn};
use proptest::prelude::*;
use proptest::sample::select;
use tests::{gpu_or_skip, random_words, runner};

fn extent() -> impl Strategy<Value = usize> {
    prop_oneof![
        2 => select(vec![1, 2, 3, 4, 5, 7, 8, 9, 31, 32, 33, 127, 128, 129, 1023, 4097]),
        1 => 1..2000usize,
    ]
}

#[derive(Debug, Clone)]
struct Case {
    rows: usize,
    cols: usize,
    op: Op,
    alpha: f64,
    beta: f64,
    column_vector: bool,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    let shape = prop_oneof![
        4 => (extent(), extent()),
        1 => (1..8usize, 100_000..400_000usize),
        1 => (100_000..400_000usize, 1..8usize),
    ]
    .prop_filter("at most 1M elements", |(r, c)| r * c <= 1 << 20);
    (
        shape,
        any::<bool>(),
        select(vec![1.0, -0.5, 2.0]),
        select(vec![0.0, 1.0, -3.0]),
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(|((rows, cols), t, alpha, beta, column_vector, seed)| Case {
            rows,
            cols,
            op: if t { Op::T } else { Op::N },
            alpha,
            beta,
            column_vector,
            seed,
        })
}

trait TestValue: GemvElement {
    fn from_f64(v: f64) -> Self;
}
impl TestValue for f32 {
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}
impl TestValue for f64 {
    fn from_f64(v: f64) -> Self {
        v
    }
}
impl TestValue for bf16 {
    fn from_f64(v: f64) -> Self {
        bf16::from_f64(v)
    }
}
impl TestValue for f16 {
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
}

/// alpha or beta in the sum type (all test values are exact in f32).
fn scalar<T: GemvElement>(v: f64) -> T::Sum {
    T::Sum::from(v as f32)
}

/// Whether an output equals the f64 reference rounded once to the element type.
fn rounded_once<T: TestValue>(got: T, want: f64) -> bool {
    got.into().to_bits() == T::from_f64(want).into().to_bits()
}

/// Integers in [-2, 2] times 2^-1: products are multiples of 2^-2 of at most 1, so a
/// sum of 400k of them, times alpha, plus beta y, stays under 2^24 units (f32) of the
/// smallest power of two in it: exact.
fn values<T: TestValue>(n: usize, seed: u64) -> Vec<T> {
    let mut next = random_words(seed);
    (0..n)
        .map(|_| T::from_f64(((next() >> 40) % 5) as f64 / 2.0 - 1.0))
        .collect()
}

fn check<T: TestValue>(gpu: &Gpu, c: Case) -> Result<(), TestCaseError> {
    let a = Array2::from_shape_vec((c.rows, c.cols), values::<T>(c.rows * c.cols, c.seed)).unwrap();
    let (n_in, n_out) = if c.op == Op::N {
        (c.cols, c.rows)
    } else {
        (c.rows, c.cols)
    };
    let x = Array1::from(values::<T>(n_in, c.seed ^ 1));
    let y0 = Array1::from(values::<T>(n_out, c.seed ^ 2));
    let (want, _) =
        reference::matvec::gemv(c.alpha, c.op, a.view(), x.view(), c.beta, Some(y0.view())).unwrap();

    let shape_of = |n: usize| if c.column_vector { vec![n, 1] } else { vec![n] };
    let da = gpu.upload(&a).unwrap();
    let dx = gpu
        .upload(&x.clone().into_shape_with_order(IxDyn(&shape_of(n_in))).unwrap())
        .unwrap();
    let run = || {
        let mut dy = gpu
            .upload(&y0.clone().into_shape_with_order(IxDyn(&shape_of(n_out))).unwrap())
            .unwrap();
        if c.beta == 0.0 {
            gpu.poison(&mut dy).unwrap(); // NaN: must not leak into y
        }
        gpu.gemv(scalar::<T>(c.alpha), c.op, &da, &dx, scalar::<T>(c.beta), &mut dy)
            .unwrap();
        gpu.download(&dy).unwrap()
    };
    let (first, second) = (run(), run());
    prop_assert_eq!(first.shape(), &shape_of(n_out)[..]);
    let bits = |v: &ArrayD<T>| v.iter().map(|&e| e.into().to_bits()).collect::<Vec<_>>();
    prop_assert!(bits(&first) == bits(&second), "two runs differ: {:?}", c);
    for (i, (&got, &w)) in first.iter().zip(want.iter()).enumerate() {
        prop_assert!(rounded_once(got, w), "{c:?}: y[{i}] = {}, want {w}", got.into());
    }
    Ok(())
}

#[test]
fn gemv_f32_matches_the_reference_and_is_deterministic() {
    let Some(gpu) = gpu_or_skip("gemv_f32_matches_the_reference_and_is_deterministic") else {
        return;
    };
    runner().run(&case(), |c| check::<f32>(&gpu, c)).unwrap();
}

#[test]
fn gemv_f64_matches_the_reference_and_is_deterministic() {
    let Some(gpu) = gpu_or_skip("gemv_f64_matches_the_reference_and_is_deterministic") else {
        return;
    };
    runner().run(&case(), |c| check::<f64>(&gpu, c)).unwrap();
}

#[test]
fn gemv_bf16_matches_the_reference_and_is_deterministic() {
    let Some(gpu) = gpu_or_skip("gemv_bf16_matches_the_reference_and_is_deterministic") else {
        return;
    };
    runner().run(&case(), |c| check::<bf16>(&gpu, c)).unwrap();
}

#[test]
fn gemv_f16_matches_the_reference_and_is_deterministic() {
    let Some(gpu) = gpu_or_skip("gemv_f16_matches_the_reference_and_is_deterministic") else {
        return;
    };
    runner().run(&case(), |c| check::<f16>(&gpu, c)).unwrap();
}

#[test]
fn matvec_shapes_follow_x_and_views_are_read_logically() {
    let Some(gpu) = gpu_or_skip("matvec_shapes_follow_x_and_views_are_read_logically") else {
        return;
    };
    let a = Array2::from_shape_fn((6, 5), |(i, j)| (i * 5 + j) as f32);
    let x = Array1::from(vec![1.0f32, -1.0, 2.0, 0.0, 1.0]);
    let (da, dx) = (gpu.upload(&a).unwrap(), gpu.upload(&x).unwrap());
    assert_eq!(gpu.matvec(&da, &dx).unwrap().shape(), &[6]);
    let dx_col = gpu
        .upload(&x.clone().into_shape_with_order((5, 1)).unwrap())
        .unwrap();
    let y = gpu.download(&gpu.matvec(&da, &dx_col).unwrap()).unwrap();
    assert_eq!(y.shape(), &[6, 1]);
    assert_eq!(y.iter().copied().collect::<Vec<_>>(), a.dot(&x).to_vec());
    // A transposed view is read as the logical matrix, not as its memory.
    let at = a.t();
    let ones = Array1::from(vec![1.0f32; 6]);
    assert_eq!(
        gpu.matvec_of(&at, &ones)
            .unwrap()
            .iter()
            .copied()
            .collect::<Vec<_>>(),
        at.dot(&ones).to_vec()
    );
    let y = gpu
        .download(&gpu.matvec_t(&da, &gpu.upload(&ones).unwrap()).unwrap())
        .unwrap();
    assert_eq!(y.iter().copied().collect::<Vec<_>>(), at.dot(&ones).to_vec());
}

#[test]
fn mismatched_gemv_shapes_are_errors() {
    use host::gemv_problem;
    let err = gemv_problem(&[3, 4], &[3], Op::N).unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { .. }), "{err}");
    assert!(
        err.to_string().contains("[3]") && err.to_string().contains("[4]"),
        "{err}"
    );
    assert!(gemv_problem(&[3, 4], &[3], Op::T).is_ok());
    assert!(matches!(
        gemv_problem(&[3, 4, 1], &[4], Op::N),
        Err(Error::WrongRank { .. })
    ));
    assert_eq!(gemv_problem(&[3, 4], &[4, 2], Op::N).unwrap().1, vec![3, 2]);
    assert_eq!(gemv_problem(&[3, 4], &[4, 16], Op::N).unwrap().1, vec![3, 16]);
    // More vectors than the kernels take, several vectors with A^T, or a rank-3 X.
    for (x, op) in [(&[4, 17][..], Op::N), (&[3, 2], Op::T), (&[4, 2, 1], Op::N)] {
        let err = gemv_problem(&[3, 4], x, op).unwrap_err();
        assert!(matches!(err, Error::WrongRank { .. }), "{x:?} {op:?}: {err}");
    }
    let err = gemv_problem(&[3, 4], &[5, 3], Op::N).unwrap_err();
    assert!(err.to_string().contains("[4, 3]"), "{err}");
    assert_eq!(gemv_problem(&[3, 4], &[4, 1], Op::N).unwrap().1, vec![3, 1]);
    assert_eq!(gemv_problem(&[0, 4], &[4], Op::N).unwrap().1, vec![0]);
    let Some(gpu) = gpu_or_skip("mismatched_gemv_shapes_are_errors (GPU part)") else {
        return;
    };
    let a = gpu.alloc::<f64>(&[3, 4]).unwrap();
    let x = gpu.upload(&Array1::from(vec![1.0f64; 4])).unwrap();
    let mut y = gpu.alloc::<f64>(&[4]).unwrap();
    assert!(matches!(
        gpu.gemv(1.0, Op::N, &a, &x, 0.0, &mut y),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(gpu.matvec_t(&a, &x), Err(Error::ShapeMismatch { .. })));
    // Y of several vectors must be [m, v] exactly.
    let xs = gpu.alloc::<f64>(&[4, 3]).unwrap();
    let mut y = gpu.alloc::<f64>(&[3, 2]).unwrap();
    assert!(matches!(
        gpu.gemv(1.0, Op::N, &a, &xs, 0.0, &mut y),
        Err(Error::ShapeMismatch { .. })
    ));
}

/// One case per kernel path, each checked to take it: the rows kernel (`A x`) with and
/// without a split of the rows, 128-bit or scalar loads; the columns kernel (`A^T x`)
/// with and without a split.
/// One case per kernel path, in f32 and in bf16 (8 elements per 16-byte load), each
/// checked to take it.
#[test]
fn every_gemv_kernel_path_matches_the_reference() {
    let Some(gpu) = gpu_or_skip("every_gemv_kernel_path_matches_the_reference") else {
        return;
    };
    gemv_paths::<f32>(&gpu);
    gemv_paths::<bf16>(&gpu);
}

fn gemv_paths<T: TestValue>(gpu: &Gpu) {
    let per_vector = 16 / size_of::<T>();
    type Path = fn(&GemvPlan) -> bool;
    let cases: [(usize, usize, Op, Path); 6] = [
        (
            2048,
            1000,
            Op::N,
            |p| matches!(p, GemvPlan::Rows(r) if r.split == 1 && r.vector),
        ),
        (
            2000,
            1001,
            Op::N,
            |p| matches!(p, GemvPlan::Rows(r) if r.split == 1 && !r.vector),
        ),
        (
            4,
            300_001,
            Op::N,
            |p| matches!(p, GemvPlan::Rows(r) if r.split > 1 && !r.vector),
        ),
        (
            8,
            140_000,
            Op::T,
            |p| matches!(p, GemvPlan::Columns(c) if c.split == 1),
        ),
        (
            300_000,
            3,
            Op::T,
            |p| matches!(p, GemvPlan::Columns(c) if c.split > 1 && !c.vector),
        ),
        (
            300_000,
            per_vector,
            Op::T,
            |p| matches!(p, GemvPlan::Columns(c) if c.split > 1 && c.vector),
        ),
    ];
    for (rows, cols, op, expected) in cases {
        let x_len = if op == Op::N { cols } else { rows };
        let plan = gpu.gemv_plan::<T>(&[rows, cols], &[x_len], op).unwrap();
        assert!(
            plan.as_ref().is_some_and(expected),
            "{rows}x{cols} {op:?}: {plan:?}"
        );
        let case = Case {
            rows,
            cols,
            op,
            alpha: -0.5,
            beta: 1.0,
            column_vector: false,
            seed: 5,
        };
        check::<T>(gpu, case).unwrap();
    }
}

#[derive(Debug, Clone)]
struct VectorsCase {
    rows: usize,
    cols: usize,
    vectors: usize,
    alpha: f64,
    beta: f64,
    seed: u64,
}

fn vectors_case() -> impl Strategy<Value = VectorsCase> {
    let shape = prop_oneof![
        4 => (extent(), extent()),
        1 => (1..8usize, 20_000..120_000usize),
        1 => (20_000..120_000usize, 1..8usize),
    ]
    .prop_filter("at most 256k elements", |(r, c)| r * c <= 1 << 18);
    (
        shape,
        2..=16usize,
        select(vec![1.0, -0.5, 2.0]),
        select(vec![0.0, 1.0, -3.0]),
        any::<u64>(),
    )
        .prop_map(|((rows, cols), vectors, alpha, beta, seed)| VectorsCase {
            rows,
            cols,
            vectors,
            alpha,
            beta,
            seed,
        })
}

/// `alpha * A X + beta * Y` against the reference, exactly, and two runs bit-identical.
fn check_vectors<T: TestValue>(gpu: &Gpu, c: &VectorsCase) -> Result<(), TestCaseError> {
    let a = Array2::from_shape_vec((c.rows, c.cols), values::<T>(c.rows * c.cols, c.seed)).unwrap();
    let x = Array2::from_shape_vec((c.cols, c.vectors), values::<T>(c.cols * c.vectors, c.seed ^ 1)).unwrap();
    let y0 =
        Array2::from_shape_vec((c.rows, c.vectors), values::<T>(c.rows * c.vectors, c.seed ^ 2)).unwrap();
    let (want, _) =
        reference::matvec::gemv_vectors(c.alpha, a.view(), x.view(), c.beta, Some(y0.view())).unwrap();
    let (da, dx) = (gpu.upload(&a).unwrap(), gpu.upload(&x).unwrap());
    let run = || {
        let mut dy = gpu.upload(&y0).unwrap();
        if c.beta == 0.0 {
            gpu.poison(&mut dy).unwrap(); // NaN: must not leak into Y
        }
        gpu.gemv(
            scalar::<T>(c.alpha),
            Op::N,
            &da,
            &dx,
            scalar::<T>(c.beta),
            &mut dy,
        )
        .unwrap();
        gpu.download(&dy).unwrap().into_dimensionality::<Ix2>().unwrap()
    };
    let (first, second) = (run(), run());
    let bits = |v: &Array2<T>| v.iter().map(|&e| e.into().to_bits()).collect::<Vec<_>>();
    prop_assert!(bits(&first) == bits(&second), "two runs differ: {:?}", c);
    for ((i, j), &got) in first.indexed_iter() {
        let w = want[[i, j]];
        prop_assert!(
            rounded_once(got, w),
            "{c:?}: y[{i}, {j}] = {}, want {w}",
            got.into()
        );
    }
    Ok(())
}

#[test]
fn several_vectors_f32_match_the_reference_and_are_deterministic() {
    let Some(gpu) = gpu_or_skip("several_vectors_f32_match_the_reference_and_are_deterministic") else {
        return;
    };
    runner()
        .run(&vectors_case(), |c| check_vectors::<f32>(&gpu, &c))
        .unwrap();
}

#[test]
fn several_vectors_f64_match_the_reference_and_are_deterministic() {
    let Some(gpu) = gpu_or_skip("several_vectors_f64_match_the_reference_and_are_deterministic") else {
        return;
    };
    runner()
        .run(&vectors_case(), |c| check_vectors::<f64>(&gpu, &c))
        .unwrap();
}

#[test]
fn several_vectors_bf16_match_the_reference_and_are_deterministic() {
    let Some(gpu) = gpu_or_skip("several_vectors_bf16_match_the_reference_and_are_deterministic") else {
        return;
    };
    runner()
        .run(&vectors_case(), |c| check_vectors::<bf16>(&gpu, &c))
        .unwrap();
}

#[test]
fn several_vectors_f16_match_the_reference_and_are_deterministic() {
    let Some(gpu) = gpu_or_skip("several_vectors_f16_match_the_reference_and_are_deterministic") else {
        return;
    };
    runner()
        .run(&vectors_case(), |c| check_vectors::<f16>(&gpu, &c))
        .unwrap();
}

/// Each padded vector count (2, 4, 8, 16) in f32, f64 and bf16, with one chunk of
/// columns (Y written directly) and with several (partials added by the combine pass),
/// with 128-bit and with scalar loads, each checked to take that path; and `matvec`
/// itself on X of several columns.
#[test]
fn every_several_vectors_path_matches_the_reference() {
    let Some(gpu) = gpu_or_skip("every_several_vectors_path_matches_the_reference") else {
        return;
    };
    vectors_paths::<f32>(&gpu);
    vectors_paths::<f64>(&gpu);
    vectors_paths::<bf16>(&gpu);
    let a = Array2::from_shape_fn((5, 7), |(i, j)| (i * 7 + j) as f32);
    let x = Array2::from_shape_fn((7, 3), |(i, j)| i as f32 - j as f32);
    let y = gpu
        .download(
            &gpu.matvec(&gpu.upload(&a).unwrap(), &gpu.upload(&x).unwrap())
                .unwrap(),
        )
        .unwrap();
    assert_eq!(y.shape(), &[5, 3]);
    assert_eq!(y.into_dimensionality::<Ix2>().unwrap(), a.dot(&x));
}

fn vectors_paths<T: TestValue>(gpu: &Gpu) {
    for vectors in [2, 3, 4, 5, 8, 9, 16] {
        for (rows, cols, chunks_above_one, vector) in [
            (300, 96, false, true),
            (77, 40_001, true, false),
            (40, 40_000, true, true),
        ] {
            let case = VectorsCase {
                rows,
                cols,
                vectors,
                alpha: -0.5,
                beta: 1.0,
                seed: (rows * cols + vectors) as u64,
            };
            let plan = gpu
                .gemv_plan::<T>(&[rows, cols], &[cols, vectors], Op::N)
                .unwrap();
            let k = vectors.next_power_of_two() as u64;
            assert!(
                matches!(plan, Some(GemvPlan::Vectors(p))
                    if p.k == k && (p.chunks > 1) == chunks_above_one && p.vector == vector),
                "{case:?} ({}-byte): {plan:?}",
                size_of::<T>()
            );
            check_vectors::<T>(gpu, &case).unwrap();
        }
    }
}
