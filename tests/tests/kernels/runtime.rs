//! The runtime's error paths and transfers. The no-device case runs on every machine;
//! the rest needs a GPU and says so when skipped.

use host::plans::ScanPlan;
use host::{DeviceArray, Error, Gpu, ScanKind};
use ndarray::{Array2, Array3, ArrayD, IxDyn};
use tests::gpu_or_skip;

#[test]
fn opening_a_device_succeeds_or_says_why_not() {
    match Gpu::new() {
        Ok(gpu) => {
            let info = gpu.info();
            assert!(info.multiprocessors > 0 && info.max_threads_per_block >= 1024);
            assert!(info.kernel_image.starts_with("sm_"), "{}", info.kernel_image);
        }
        Err(e @ Error::NoDevice { .. }) => {
            assert!(e.to_string().starts_with("no usable CUDA device: "), "{e}");
            eprintln!("no CUDA device here: {e}");
        }
        Err(e) => panic!("opening device 0 failed with an unexpected error: {e}"),
    }
}

#[test]
fn a_missing_device_ordinal_is_an_error() {
    let Some(_gpu) = gpu_or_skip("a_missing_device_ordinal_is_an_error") else {
        return;
    };
    match Gpu::with_device(1000) {
        Err(Error::NoSuchDevice { ordinal: 1000, count }) => assert!(count >= 1),
        other => panic!("expected NoSuchDevice, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn mismatched_copy_shapes_are_rejected_before_any_work() {
    let Some(gpu) = gpu_or_skip("mismatched_copy_shapes_are_rejected_before_any_work") else {
        return;
    };
    let src = gpu.alloc::<f32>(&[3, 4]).unwrap();
    let mut dst = gpu.alloc::<f32>(&[4, 3]).unwrap();
    let err = gpu.copy(&src, &mut dst).unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        "shape mismatch: copy destination has shape [4, 3], expected [3, 4]"
    );
    assert!(matches!(
        gpu.copy_with_driver(&src, &mut dst),
        Err(Error::ShapeMismatch { .. })
    ));
}

#[test]
fn oversized_and_unallocatable_arrays_are_errors() {
    let Some(gpu) = gpu_or_skip("oversized_and_unallocatable_arrays_are_errors") else {
        return;
    };
    let err = gpu.alloc::<f64>(&[usize::MAX / 4, 3]).unwrap_err();
    assert!(matches!(err, Error::TooLarge { .. }), "{err}");
    // 64 TiB: more than any device holds.
    let err = gpu.alloc::<f32>(&[1 << 44]).unwrap_err();
    assert!(
        matches!(err, Error::OutOfMemory { bytes, .. } if bytes == 1 << 46),
        "{err}"
    );
    // The device is still usable afterwards.
    let x = gpu.upload(&ArrayD::<i32>::from_elem(IxDyn(&[5]), 7)).unwrap();
    assert_eq!(gpu.download(&x).unwrap().as_slice().unwrap(), &[7; 5]);
}

#[test]
fn upload_download_round_trips_views_and_empty_arrays() {
    let Some(gpu) = gpu_or_skip("upload_download_round_trips_views_and_empty_arrays") else {
        return;
    };
    let a = Array3::from_shape_fn((3, 5, 7), |(i, j, k)| (i * 100 + j * 10 + k) as f64);
    let permuted = a.view().permuted_axes([2, 0, 1]);
    let d = gpu.upload(&permuted).unwrap();
    assert_eq!(d.shape(), &[7, 3, 5]);
    assert_eq!(gpu.download(&d).unwrap(), permuted.into_dyn().to_owned());

    let empty = gpu.upload(&ArrayD::<f32>::zeros(IxDyn(&[4, 0, 2]))).unwrap();
    assert!(empty.is_empty());
    assert_eq!(gpu.download(&empty).unwrap().shape(), &[4, 0, 2]);
    let mut empty_dst = gpu.alloc::<f32>(&[4, 0, 2]).unwrap();
    gpu.copy(&empty, &mut empty_dst).unwrap();

    let scalar = gpu.upload(&ndarray::arr0(2.5f32)).unwrap();
    assert_eq!(scalar.shape(), &[] as &[usize]);
    assert_eq!(
        gpu.download(&scalar).unwrap().into_iter().collect::<Vec<_>>(),
        vec![2.5]
    );
}

#[test]
fn poison_marks_every_element() {
    let Some(gpu) = gpu_or_skip("poison_marks_every_element") else {
        return;
    };
    let mut x = gpu.upload(&ArrayD::<f32>::from_elem(IxDyn(&[33]), 1.0)).unwrap();
    gpu.poison(&mut x).unwrap();
    assert!(gpu.download(&x).unwrap().iter().all(|v| v.is_nan()));
    let mut y = gpu.upload(&ArrayD::<i64>::from_elem(IxDyn(&[9]), 5)).unwrap();
    gpu.poison(&mut y).unwrap();
    assert!(gpu.download(&y).unwrap().iter().all(|&v| v == -1));
}

#[test]
fn borrowed_memory_and_foreign_streams_run_the_kernels() {
    let Some(gpu) = gpu_or_skip("borrowed_memory_and_foreign_streams_run_the_kernels") else {
        return;
    };
    let owner = gpu
        .upload(&Array2::from_shape_fn((4, 6), |(i, j)| (i * 6 + j) as f32))
        .unwrap();
    let mut out = gpu.alloc::<f32>(&[4, 6]).unwrap();
    // SAFETY: both arrays outlive the views, and the work on them is synchronized
    // before they are dropped.
    let (x, mut y) = unsafe {
        (
            DeviceArray::<f32>::from_raw_parts(&gpu, owner.address(), &[4, 6]).unwrap(),
            DeviceArray::<f32>::from_raw_parts(&gpu, out.address(), &[4, 6]).unwrap(),
        )
    };
    // On the legacy default stream (null), then on the handle's own again.
    // SAFETY: the legacy stream lives as long as the context.
    unsafe {
        gpu.with_stream(std::ptr::null_mut(), |gpu| {
            gpu.cumsum_into(&x, &mut y, 1, ScanKind::Inclusive, false)
        })
    }
    .unwrap();
    let expected = Array2::from_shape_fn((4, 6), |(i, j)| (0..=j).map(|k| (i * 6 + k) as f32).sum::<f32>());
    assert_eq!(gpu.download(&y).unwrap(), expected.into_dyn());
    assert_eq!(gpu.download(&out).unwrap(), gpu.download(&y).unwrap());
    gpu.poison(&mut out).unwrap();

    // SAFETY (each): the calls fail before anything is queued.
    let misaligned = unsafe { DeviceArray::<f32>::from_raw_parts(&gpu, owner.address() + 4, &[2]) };
    assert!(matches!(
        misaligned,
        Err(Error::InvalidParameter {
            parameter: "device address",
            ..
        })
    ));
    let host_memory = [0f32; 8];
    let address = host_memory.as_ptr() as u64 & !15;
    let not_device = unsafe { DeviceArray::<f32>::from_raw_parts(&gpu, address, &[2]) };
    assert!(
        matches!(not_device, Err(Error::InvalidParameter { .. })),
        "{not_device:?}"
    );
    let past_the_end = unsafe { DeviceArray::<f32>::from_raw_parts(&gpu, owner.address(), &[1 << 40]) };
    assert!(
        matches!(past_the_end, Err(Error::InvalidParameter { .. })),
        "{past_the_end:?}"
    );
}

#[test]
fn work_alternating_between_the_own_stream_and_a_borrowed_one_stays_in_order() {
    let Some(gpu) = gpu_or_skip("work_alternating_between_the_own_stream_and_a_borrowed_one_stays_in_order")
    else {
        return;
    };
    // Each step scans the step before down its columns, in the other direction: its
    // first rows are what the step before writes last, so that a step queued without
    // waiting would read unfinished sums. The columns kernel runs 128 blocks that leave
    // room on every SM, so a step that does not wait runs beside the one before it
    // rather than behind it. 16384 x 4096 i32 (wrapping sums, exact); every array is
    // allocated first, so that no allocation orders the steps.
    let (rows, columns) = (1 << 14, 1 << 12);
    let plan = gpu.cumsum_plan::<i32>(&[rows, columns], 0).unwrap();
    assert!(matches!(plan, Some(ScanPlan::Columns(_))), "{plan:?}");
    let mut steps = vec![gpu.upload(&Array2::<i32>::ones((rows, columns))).unwrap()];
    for _ in 0..5 {
        steps.push(gpu.alloc::<i32>(&[rows, columns]).unwrap());
    }
    let reverse = |step: usize| step.is_multiple_of(2);
    let scan = |gpu: &Gpu, steps: &mut [DeviceArray<i32>], step: usize| {
        let (before, after) = steps.split_at_mut(step);
        gpu.cumsum_into(
            &before[step - 1],
            &mut after[0],
            0,
            ScanKind::Inclusive,
            reverse(step),
        )
    };
    let scan_on_legacy_stream = |steps: &mut [DeviceArray<i32>], step: usize| {
        // SAFETY: the legacy stream lives as long as the context.
        unsafe { gpu.with_stream(std::ptr::null_mut(), |gpu| scan(gpu, steps, step)) }.unwrap()
    };
    // Own, borrowed twice in a row (the second waits for nothing of the own stream's),
    // own, borrowed.
    scan(&gpu, &mut steps, 1).unwrap();
    scan_on_legacy_stream(&mut steps, 2);
    scan_on_legacy_stream(&mut steps, 3);
    scan(&gpu, &mut steps, 4).unwrap();
    scan_on_legacy_stream(&mut steps, 5);
    let mut expected = vec![1i32; rows];
    for step in 1..steps.len() {
        let mut sum = 0i32;
        let mut add = |value: &mut i32| {
            sum = sum.wrapping_add(*value);
            *value = sum;
        };
        if reverse(step) {
            expected.iter_mut().rev().for_each(&mut add);
        } else {
            expected.iter_mut().for_each(&mut add);
        }
    }
    let got = gpu.download(&steps[5]).unwrap();
    for column in got.columns() {
        assert!(
            column.iter().eq(expected.iter()),
            "a step overtook the one before it"
        );
    }
}

#[test]
fn unchecked_borrows_still_refuse_misaligned_or_oversized_arrays() {
    // SAFETY (each): the calls fail before an array exists; no device is needed.
    let misaligned = unsafe { DeviceArray::<f32>::from_raw_parts_unchecked(4, &[2]) };
    assert!(
        matches!(
            misaligned,
            Err(Error::InvalidParameter {
                parameter: "device address",
                ..
            })
        ),
        "{misaligned:?}"
    );
    let oversized = unsafe { DeviceArray::<f32>::from_raw_parts_unchecked(256, &[usize::MAX, 2]) };
    assert!(matches!(oversized, Err(Error::TooLarge { .. })), "{oversized:?}");
}
