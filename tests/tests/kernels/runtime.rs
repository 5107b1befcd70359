//! The runtime's error paths and transfers. The no-device case runs on every machine;
//! the rest needs a GPU and says so when skipped.

use host::{Error, Gpu};
use ndarray::{Array3, ArrayD, IxDyn};
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
