//! The device group (every device of the machine) against one device on whole arrays:
//! random shapes, split axes and uneven shard lengths. The data make every sum exact
//! (small integers, or their multiples by a power of two), so that each result must
//! equal one device's bit for bit whatever the order of the sums; min's values and
//! indices are equal by construction (NaN and ties included). Each test runs on every
//! device of the machine (NCCL; one rank on a one-GPU machine) and on three ranks
//! sharing the first device (device copies for NCCL), so that the splits, exchanges
//! and merges between ranks run on any GPU machine.

use crate::scan::cumsum_into_poisoned;
use host::{
    Conv2dParams, ConvGradients, Error, Gpu, GpuGroup, GroupScanPlan, ScanKind, ShardedArray, Sharding,
    even_lengths,
};
use ndarray::{ArrayD, IxDyn};
use proptest::prelude::*;
use proptest::sample::select;
use std::sync::MutexGuard;
use tests::{gpu_or_skip, group_or_skip, random_words, runner, three_rank_group_or_skip};

fn extent() -> impl Strategy<Value = usize> {
    prop_oneof![
        2 => select(vec![1, 2, 3, 4, 5, 7, 8, 17, 31, 32, 33, 64, 65, 129, 257]),
        1 => 1..300usize,
    ]
}

fn shape() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(extent(), 1..=3).prop_filter("at most 200k elements", |s| {
        s.iter().product::<usize>() <= 200_000
    })
}

/// Shard lengths of `len` over `ranks`: even, or cut at random points (none empty).
fn lengths(len: usize, ranks: usize, seed: u64) -> Vec<usize> {
    if seed.is_multiple_of(2) || len < ranks {
        return even_lengths(len, ranks);
    }
    let mut next = random_words(seed);
    let mut cuts: Vec<usize> = Vec::new();
    while cuts.len() < ranks - 1 {
        let cut = 1 + (next() as usize) % (len - 1);
        if !cuts.contains(&cut) {
            cuts.push(cut);
        }
    }
    cuts.sort();
    cuts.push(len);
    let mut start = 0;
    cuts.into_iter()
        .map(|c| {
            let l = c - start;
            start = c;
            l
        })
        .collect()
}

/// The group of every device (NCCL) and the three ranks on the first device: each test
/// runs on both.
fn groups_or_skip(test: &str) -> Option<(MutexGuard<'static, GpuGroup>, MutexGuard<'static, GpuGroup>)> {
    Some((group_or_skip(test)?, three_rank_group_or_skip(test)?))
}

/// `x` split along `axis` when the axis has a slice for every rank, else replicated.
fn distribute<T: host::Element>(group: &GpuGroup, x: &ArrayD<T>, axis: usize, seed: u64) -> ShardedArray<T> {
    let len = x.shape()[axis];
    if len >= group.len() {
        group
            .upload_split_lengths(x, axis, &lengths(len, group.len(), seed))
            .unwrap()
    } else {
        group.upload_replicated(x).unwrap()
    }
}

/// Integers in [-4, 4].
fn random_f32(shape: &[usize], seed: u64) -> ArrayD<f32> {
    let mut next = random_words(seed);
    ArrayD::from_shape_fn(IxDyn(shape), |_| ((next() >> 40) % 9) as f32 - 4.0)
}

/// Equal element for element (NaN equal to NaN).
fn assert_same<T: PartialEq + std::fmt::Debug>(
    got: &ArrayD<T>,
    want: &ArrayD<T>,
    what: &str,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.shape(), want.shape(), "{}: shape", what);
    let same = |g: &T, w: &T| g == w || format!("{g:?}") == format!("{w:?}");
    let differs = got.iter().zip(want).position(|(g, w)| !same(g, w));
    prop_assert!(
        differs.is_none(),
        "{}: element {} is {:?}, one device gives {:?}",
        what,
        differs.unwrap_or_default(),
        got.iter().nth(differs.unwrap_or_default()),
        want.iter().nth(differs.unwrap_or_default())
    );
    Ok(())
}

/// Asserts that every rank's copy of a replicated array is `want`.
fn assert_replicated<T: host::Element>(
    group: &GpuGroup,
    array: &ShardedArray<T>,
    want: &ArrayD<T>,
    what: &str,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(array.sharding(), &Sharding::Replicated, "{}", what);
    for (gpu, part) in group.gpus().iter().zip(array.parts()) {
        assert_same(&gpu.download(part).unwrap(), want, what)?;
    }
    Ok(())
}

#[test]
fn group_matvec_matches_one_device() {
    let (Some((nccl, three)), Some(gpu)) = (
        groups_or_skip("group_matvec_matches_one_device"),
        gpu_or_skip("group_matvec_matches_one_device"),
    ) else {
        return;
    };
    for group in [&*nccl, &*three] {
        let ranks = group.len();
        let case = (
            ranks..400usize,
            1..400usize,
            select(vec![1usize, 3]),
            any::<u64>(),
        );
        runner()
            .run(&case, |(m, k, v, seed)| {
                let a = random_f32(&[m, k], seed);
                let x_shape = if v == 1 { vec![k] } else { vec![k, v] };
                let x = random_f32(&x_shape, seed ^ 1);
                let xt = random_f32(&[m], seed ^ 2);
                let split = lengths(m, ranks, seed);
                let sharded_a = group.upload_split_lengths(&a, 0, &split).unwrap();
                let y = group
                    .matvec(&sharded_a, &group.upload_replicated(&x).unwrap())
                    .unwrap();
                assert_replicated(group, &y, &gpu.matvec_of(&a, &x).unwrap(), "A x")?;
                let sharded_xt = group.upload_split_lengths(&xt, 0, &split).unwrap();
                let yt = group.matvec_t(&sharded_a, &sharded_xt).unwrap();
                let (da, dx) = (gpu.upload(&a).unwrap(), gpu.upload(&xt).unwrap());
                let want = gpu.download(&gpu.matvec_t(&da, &dx).unwrap()).unwrap();
                assert_replicated(group, &yt, &want, "A^T x")?;
                Ok(())
            })
            .unwrap();
    }
}

/// Values on a small grid with ties, infinities and, in half the cases, NaN.
fn min_values(shape: &[usize], seed: u64, nan: bool) -> ArrayD<f32> {
    let mut next = random_words(seed);
    ArrayD::from_shape_fn(IxDyn(shape), |_| match next() % 1000 {
        r if nan && r < 3 => f32::NAN,
        r if r < 8 => f32::NEG_INFINITY,
        r => (r % 17) as f32 - 8.0,
    })
}

#[test]
fn group_min_matches_one_device_exactly() {
    let (Some((nccl, three)), Some(gpu)) = (
        groups_or_skip("group_min_matches_one_device_exactly"),
        gpu_or_skip("group_min_matches_one_device_exactly"),
    ) else {
        return;
    };
    for group in [&*nccl, &*three] {
        let case = shape().prop_flat_map(|s| {
            let rank = s.len();
            (
                Just(s),
                0..rank,
                0..rank,
                any::<bool>(),
                any::<bool>(),
                any::<u64>(),
            )
        });
        runner()
            .run(&case, |(shape, axis, split_axis, keepdim, nan, seed)| {
                let x = min_values(&shape, seed, nan);
                let sharded = distribute(group, &x, split_axis, seed);
                let (values, indices) = group.min(&sharded, axis, keepdim).unwrap();
                let amin = group.amin(&sharded, axis, keepdim).unwrap();
                let (want_values, want_indices) = gpu.min_of(&x, axis, keepdim).unwrap();
                let what = format!("{shape:?} axis {axis} split {:?}", sharded.sharding());
                assert_same(&group.download(&values).unwrap(), &want_values, &what)?;
                assert_same(&group.download(&indices).unwrap(), &want_indices, &what)?;
                assert_same(&group.download(&amin).unwrap(), &want_values, &what)?;
                if sharded.split_axis() == Some(axis) {
                    // Split along the result's first axis (after a kept axis 0), where
                    // it has a slice per device.
                    let first = usize::from(keepdim && axis == 0);
                    match want_values.shape().get(first) {
                        Some(&len) if len >= group.len() => prop_assert_eq!(
                            indices.sharding(),
                            &Sharding::Split {
                                axis: first,
                                lengths: even_lengths(len, group.len())
                            },
                            "{}",
                            what
                        ),
                        _ => assert_replicated(group, &indices, &want_indices, &what)?,
                    }
                }
                // Into the outputs of another array's reduction: every element rewritten.
                let other = distribute(group, &min_values(&shape, !seed, !nan), split_axis, seed);
                let (mut values, mut indices) = group.min(&other, axis, keepdim).unwrap();
                group.min_into(&sharded, axis, &mut values, &mut indices).unwrap();
                assert_same(&group.download(&values).unwrap(), &want_values, &what)?;
                assert_same(&group.download(&indices).unwrap(), &want_indices, &what)?;
                let mut amin = group.amin(&other, axis, keepdim).unwrap();
                group.amin_into(&sharded, axis, &mut amin).unwrap();
                assert_same(&group.download(&amin).unwrap(), &want_values, &what)?;
                Ok(())
            })
            .unwrap();
    }
}

#[test]
fn group_min_of_large_arrays_along_the_split_axis_matches_one_device_exactly() {
    let test = "group_min_of_large_arrays_along_the_split_axis_matches_one_device_exactly";
    let (Some((nccl, three)), Some(gpu)) = (groups_or_skip(test), gpu_or_skip(test)) else {
        return;
    };
    // Each device's part of the result is a run of columns of x (odd rows: the runs
    // start between vectors; aligned rows), or a run of outer indices; a split of 2
    // slices and a result of 3 columns: parts of one column, or replicated.
    let cases: [(&[usize], usize); 5] = [
        (&[7, 1001, 523], 0),
        (&[6, 512, 1024], 0),
        (&[4, 5, 1 << 15], 1),
        (&[5, 3], 0),
        (&[2, 9, 3], 0),
    ];
    for group in [&*nccl, &*three] {
        for (seed, &(shape, axis)) in cases.iter().enumerate() {
            if shape[axis] < group.len() {
                continue;
            }
            let x = min_values(shape, seed as u64, seed != 1);
            let sharded = distribute(group, &x, axis, seed as u64);
            let (want_values, want_indices) = gpu.min_of(&x, axis, false).unwrap();
            let what = format!("{shape:?} axis {axis} split {:?}", sharded.sharding());
            let (values, indices) = group.min(&sharded, axis, false).unwrap();
            assert_same(&group.download(&values).unwrap(), &want_values, &what).unwrap();
            assert_same(&group.download(&indices).unwrap(), &want_indices, &what).unwrap();
            let amin = group.amin(&sharded, axis, false).unwrap();
            assert_same(&group.download(&amin).unwrap(), &want_values, &what).unwrap();
        }
    }
}

fn check_cumsum<T: host::ScanElement>(
    group: &GpuGroup,
    gpu: &Gpu,
    draw: fn(u64) -> T,
    (shape, axis, split_axis, exclusive, reverse, seed): (Vec<usize>, usize, usize, bool, bool, u64),
) -> Result<(), TestCaseError> {
    let mut next = random_words(seed);
    let x = ArrayD::from_shape_fn(IxDyn(&shape), |_| draw(next()));
    let kind = if exclusive {
        ScanKind::Exclusive
    } else {
        ScanKind::Inclusive
    };
    let sharded = distribute(group, &x, split_axis, seed);
    let got = group_cumsum_into_poisoned(group, &sharded, axis, kind, reverse);
    let want = cumsum_into_poisoned(gpu, &gpu.upload(&x).unwrap(), axis, kind, reverse);
    let what = format!(
        "{shape:?} axis {axis} {kind:?} reverse {reverse} split {:?}",
        sharded.sharding()
    );
    assert_same(&got, &want, &what)
}

/// The group's cumsum of x into a poisoned output (see `cumsum_into_poisoned`: the
/// segments kernel's bulk stores are invisible to initcheck), split as x, downloaded.
fn group_cumsum_into_poisoned<T: host::ScanElement>(
    group: &GpuGroup,
    x: &ShardedArray<T>,
    axis: usize,
    kind: ScanKind,
    reverse: bool,
) -> ArrayD<T> {
    let mut y = group.alloc_like(x).unwrap();
    group.poison(&mut y).unwrap();
    group.cumsum_into(x, &mut y, axis, kind, reverse).unwrap();
    assert_eq!(y.sharding(), x.sharding());
    group.download(&y).unwrap()
}

fn scan_case() -> impl Strategy<Value = (Vec<usize>, usize, usize, bool, bool, u64)> {
    // Half the cases scan along the split axis.
    shape().prop_flat_map(|s| {
        let rank = s.len();
        (0..rank, 0..rank, any::<bool>()).prop_flat_map(move |(axis, other, same)| {
            let split = if same { axis } else { other };
            (
                Just(s.clone()),
                Just(axis),
                Just(split),
                any::<bool>(),
                any::<bool>(),
                any::<u64>(),
            )
        })
    })
}

#[test]
fn group_cumsum_matches_one_device_exactly() {
    let (Some((nccl, three)), Some(gpu)) = (
        groups_or_skip("group_cumsum_matches_one_device_exactly"),
        gpu_or_skip("group_cumsum_matches_one_device_exactly"),
    ) else {
        return;
    };
    for group in [&*nccl, &*three] {
        // Multiples of 2^-5 whose sums stay exact in f32; integers over their whole range
        // (the sums wrap alike).
        runner()
            .run(&scan_case(), |c| {
                check_cumsum(group, &gpu, |b| ((b >> 40) % 7) as f32 / 32.0 - 3.0 / 32.0, c)
            })
            .unwrap();
        runner()
            .run(&scan_case(), |c| check_cumsum(group, &gpu, |b| b as i32, c))
            .unwrap();
        runner()
            .run(&scan_case(), |c| check_cumsum(group, &gpu, |b| b as i64, c))
            .unwrap();
    }
}

/// Scans along the split axis of `cases` (shape, axis), in every kind and direction,
/// against one device, on even shards: each takes the path that `expected` accepts.
fn check_split_axis_scans(test: &str, cases: &[(&[usize], usize)], expected: fn(&GroupScanPlan) -> bool) {
    let (Some((nccl, three)), Some(gpu)) = (groups_or_skip(test), gpu_or_skip(test)) else {
        return;
    };
    for group in [&*nccl, &*three] {
        for (seed, &(shape, axis)) in cases.iter().enumerate() {
            let split = group.upload_split(&random_f32(shape, seed as u64), axis).unwrap();
            let plan = group.cumsum_plan(&split, axis).unwrap();
            if group.len() == 1 {
                assert_eq!(plan, GroupScanPlan::CarryPass, "one rank: nothing to exchange");
                continue;
            }
            assert!(expected(&plan), "{shape:?} axis {axis}: {plan:?}");
            for (case, (exclusive, reverse)) in [(false, false), (true, false), (false, true), (true, true)]
                .into_iter()
                .enumerate()
            {
                // Even seeds: even shards, each long enough for its path. f32, and the
                // 16-bit and 64-bit paths of the carries (bf16 sums of small integers stay
                // exact).
                let c = (
                    shape.to_vec(),
                    axis,
                    axis,
                    exclusive,
                    reverse,
                    2 * (seed + case) as u64,
                );
                check_cumsum(
                    group,
                    &gpu,
                    |b| ((b >> 40) % 7) as f32 / 32.0 - 3.0 / 32.0,
                    c.clone(),
                )
                .unwrap();
                check_cumsum(
                    group,
                    &gpu,
                    |b| host::bf16::from_f32(((b >> 40) % 5) as f32 - 2.0),
                    c.clone(),
                )
                .unwrap();
                check_cumsum(group, &gpu, |b| b as i64, c).unwrap();
            }
        }
    }
}

#[test]
fn group_cumsum_along_the_split_axis_pipelines_chunks_of_columns() {
    // Chunks of whole warps and a narrower last one (4 of 2080, the last 1960); outer
    // slices in the lanes (3 x 1500 lanes: 2 chunks of 768 columns).
    check_split_axis_scans(
        "group_cumsum_along_the_split_axis_pipelines_chunks_of_columns",
        &[(&[64, 8200], 0), (&[3, 50, 1500], 1)],
        |plan| matches!(plan, GroupScanPlan::Pipelined { chunks, .. } if *chunks > 1),
    );
}

#[test]
fn group_cumsum_of_long_rows_along_the_split_axis_sums_the_shards_first() {
    // One row (odd shard lengths: unaligned segments), and two rows.
    check_split_axis_scans(
        "group_cumsum_of_long_rows_along_the_split_axis_sums_the_shards_first",
        &[(&[200_003], 0), (&[2, 120_000], 1)],
        |plan| matches!(plan, GroupScanPlan::ReduceThenScan { .. }),
    );
}

#[test]
fn group_conv2d_matches_one_device_exactly() {
    let (Some((nccl, three)), Some(gpu)) = (
        groups_or_skip("group_conv2d_matches_one_device_exactly"),
        gpu_or_skip("group_conv2d_matches_one_device_exactly"),
    ) else {
        return;
    };
    for group in [&*nccl, &*three] {
        let ranks = group.len();
        let case = (
            ranks..=ranks + 4,
            1..=8usize,
            1..=8usize,
            select(vec![1usize, 3]),
            3..=20usize,
            any::<u64>(),
        );
        runner()
            .run(&case, |(batch, cin, cout, k, size, seed)| {
                // x and dy integers in [-4, 4], w and the bias such integers times 2^-3: every
                // sum exact in FP32, whichever algorithm and order.
                let x = random_f32(&[batch, cin, size, size + 3], seed);
                let w = random_f32(&[cout, cin, k, k], seed ^ 1).mapv(|v| v / 8.0);
                let b = random_f32(&[cout], seed ^ 2).mapv(|v| v / 8.0);
                let params = Conv2dParams {
                    padding: [k / 2, k / 2],
                    ..Conv2dParams::default()
                };
                let split = lengths(batch, ranks, seed);
                let (sx, sw, sb) = (
                    group.upload_split_lengths(&x, 0, &split).unwrap(),
                    group.upload_replicated(&w).unwrap(),
                    group.upload_replicated(&b).unwrap(),
                );
                let y = group.conv2d(&sx, &sw, Some(&sb), &params).unwrap();
                let (dx, dw, db) = (
                    gpu.upload(&x).unwrap(),
                    gpu.upload(&w).unwrap(),
                    gpu.upload(&b).unwrap(),
                );
                let want_y = gpu
                    .download(&gpu.conv2d(&dx, &dw, Some(&db), &params).unwrap())
                    .unwrap();
                assert_same(&group.download(&y).unwrap(), &want_y, "conv2d")?;

                let grad_y = random_f32(want_y.shape(), seed ^ 3);
                let sg = group.upload_split_lengths(&grad_y, 0, &split).unwrap();
                let got = group
                    .conv2d_backward(&sx, &sw, &sg, &params, ConvGradients::ALL)
                    .unwrap();
                let dg = gpu.upload(&grad_y).unwrap();
                let want = gpu
                    .conv2d_backward(&dx, &dw, &dg, &params, ConvGradients::ALL)
                    .unwrap();
                let want_input = gpu.download(want.0.as_ref().unwrap()).unwrap();
                assert_same(
                    &group.download(got.0.as_ref().unwrap()).unwrap(),
                    &want_input,
                    "input gradient",
                )?;
                let want_weight = gpu.download(want.1.as_ref().unwrap()).unwrap();
                assert_replicated(group, got.1.as_ref().unwrap(), &want_weight, "weight gradient")?;
                let want_bias = gpu.download(want.2.as_ref().unwrap()).unwrap();
                assert_replicated(group, got.2.as_ref().unwrap(), &want_bias, "bias gradient")?;
                Ok(())
            })
            .unwrap();
    }
}

#[test]
fn group_results_are_the_same_on_every_run() {
    let Some((nccl, three)) = groups_or_skip("group_results_are_the_same_on_every_run") else {
        return;
    };
    // Values whose sums round: the order of the sums shows.
    let mut next = random_words(7);
    let mut draw = || (next() >> 11) as f32 / (1u64 << 53) as f32 - 0.5;
    let (m, k) = (1000, 777);
    let a = ArrayD::from_shape_fn(IxDyn(&[m, k]), |_| draw());
    let x = ArrayD::from_shape_fn(IxDyn(&[m]), |_| draw());
    // Wide enough for the scan along the split axis to pipeline chunks of columns, and
    // long enough to sum the shards first.
    let wide = ArrayD::from_shape_fn(IxDyn(&[200, 5000]), |_| draw());
    let long = ArrayD::from_shape_fn(IxDyn(&[300_000]), |_| draw());
    for group in [&*nccl, &*three] {
        let sa = group.upload_split(&a, 0).unwrap();
        let sx = group.upload_split(&x, 0).unwrap();
        let sw = group.upload_split(&wide, 0).unwrap();
        let sl = group.upload_split(&long, 0).unwrap();
        let product = || group.download(&group.matvec_t(&sa, &sx).unwrap()).unwrap();
        let scan =
            |x: &ShardedArray<f32>| group_cumsum_into_poisoned(group, x, 0, ScanKind::Inclusive, false);
        let (first_product, first_scan) = (product(), scan(&sa));
        let (first_wide, first_long) = (scan(&sw), scan(&sl));
        for _ in 0..3 {
            let same =
                |p: &ArrayD<f32>, q: &ArrayD<f32>| p.iter().zip(q).all(|(p, q)| p.to_bits() == q.to_bits());
            assert!(same(&first_product, &product()), "A^T x differs from run to run");
            assert!(same(&first_scan, &scan(&sa)), "cumsum differs from run to run");
            assert!(same(&first_wide, &scan(&sw)), "pipelined cumsum differs");
            assert!(same(&first_long, &scan(&sl)), "cumsum of summed shards differs");
        }
    }
}

#[test]
fn invalid_group_inputs_are_errors() {
    let Some(group) = three_rank_group_or_skip("invalid_group_inputs_are_errors") else {
        return;
    };
    let a = random_f32(&[8, 6], 1);
    let by_columns = group.upload_split(&a, 1).unwrap();
    let x = group.upload_replicated(&random_f32(&[6], 2)).unwrap();
    assert!(matches!(
        group.matvec(&by_columns, &x),
        Err(Error::InvalidParameter { .. })
    ));
    assert!(matches!(
        group.upload_split_lengths(&a, 0, &[0, 4, 4]),
        Err(Error::InvalidParameter { .. })
    ));
    assert!(matches!(
        group.upload_split_lengths(&a, 0, &[2, 2, 2, 2]),
        Err(Error::InvalidParameter { .. })
    ));
    assert!(matches!(
        group.upload_split(&a, 2),
        Err(Error::InvalidAxis { .. })
    ));
    let split = group.upload_split(&a, 0).unwrap();
    assert!(matches!(
        group.min(&split, 2, false),
        Err(Error::InvalidAxis { .. })
    ));
    let mut replicated_rows = group.upload_replicated(&random_f32(&[8], 8)).unwrap();
    assert!(matches!(
        group.amin_into(&split, 1, &mut replicated_rows),
        Err(Error::InvalidParameter { .. })
    ));
    assert!(matches!(
        group.cumsum(&split, 5, ScanKind::Inclusive, false),
        Err(Error::InvalidAxis { .. })
    ));
    let (x2, y2) = (
        group.upload_split(&a, 0).unwrap(),
        group.upload_split(&random_f32(&[8, 6], 3), 1).unwrap(),
    );
    let mut y2 = y2;
    assert!(matches!(
        group.cumsum_into(&x2, &mut y2, 0, ScanKind::Inclusive, false),
        Err(Error::InvalidParameter { .. })
    ));
    let conv_x = group.upload_split(&random_f32(&[3, 2, 5, 5], 4), 0).unwrap();
    let conv_w = group.upload_replicated(&random_f32(&[4, 2, 3, 3], 5)).unwrap();
    let conv_dy = group.upload_split(&random_f32(&[3, 4, 3, 3], 6), 0).unwrap();
    let mut wrong_dw = group.upload_replicated(&random_f32(&[4, 2, 3, 1], 7)).unwrap();
    let params = Conv2dParams::default();
    assert!(matches!(
        group.conv2d_backward_into(
            &conv_x,
            &conv_w,
            &conv_dy,
            &params,
            (None, Some(&mut wrong_dw), None)
        ),
        Err(Error::ShapeMismatch { .. })
    ));
    let mut split_dw = group.upload_split(&random_f32(&[4, 2, 3, 3], 8), 0).unwrap();
    assert!(matches!(
        group.conv2d_backward_into(
            &conv_x,
            &conv_w,
            &conv_dy,
            &params,
            (None, Some(&mut split_dw), None)
        ),
        Err(Error::InvalidParameter { .. })
    ));
    assert!(matches!(GpuGroup::new(&[]), Err(Error::InvalidParameter { .. })));
    assert!(matches!(
        GpuGroup::new(&[0, 0]),
        Err(Error::InvalidParameter { .. })
    ));
}
