//! The copy kernel against its input, on random sizes, dtypes and layouts.

use host::{DeviceArray, Element, Gpu};
use ndarray::{ArrayD, IxDyn};
use proptest::prelude::*;
use tests::{gpu_or_skip, random_words, runner};

/// Lengths that exercise every path: empty, single, not a multiple of the 4-word
/// vector, around one block's tile (4096 words), and many tiles.
fn length() -> impl Strategy<Value = usize> {
    prop_oneof![
        0..=9usize,
        (4090..=4102usize),
        (2040..=2056usize),
        1..100_000usize,
        Just(1 << 20),
        ((1usize << 20) - 3..(1 << 20) + 3),
    ]
}

fn random_array<T: Element>(len: usize, seed: u64, from_bits: impl Fn(u64) -> T) -> ArrayD<T> {
    let mut next = random_words(seed);
    ArrayD::from_shape_fn(IxDyn(&[len]), |_| from_bits(next()))
}

fn check_copy<T: Element + Bits>(gpu: &Gpu, host: &ArrayD<T>) -> Result<(), TestCaseError> {
    let src = gpu.upload(host).unwrap();
    let mut dst: DeviceArray<T> = gpu.alloc(src.shape()).unwrap();
    gpu.poison(&mut dst).unwrap();
    gpu.copy(&src, &mut dst).unwrap();
    let out = gpu.download(&dst).unwrap();
    prop_assert_eq!(out.shape(), host.shape());
    prop_assert!(
        out.iter().zip(host.iter()).all(|(a, b)| a.bits() == b.bits()),
        "copy differs"
    );
    Ok(())
}

/// The bit pattern of an element, so that NaN payloads compare too.
trait Bits {
    fn bits(&self) -> u64;
}
impl Bits for f32 {
    fn bits(&self) -> u64 {
        self.to_bits().into()
    }
}
impl Bits for f64 {
    fn bits(&self) -> u64 {
        self.to_bits()
    }
}
impl Bits for i32 {
    fn bits(&self) -> u64 {
        *self as u32 as u64
    }
}
impl Bits for i64 {
    fn bits(&self) -> u64 {
        *self as u64
    }
}

#[test]
fn copy_reproduces_input_for_every_dtype_and_length() {
    let Some(gpu) = gpu_or_skip("copy_reproduces_input_for_every_dtype_and_length") else {
        return;
    };
    runner()
        .run(
            &(length(), any::<u64>(), 0..4u8),
            |(len, seed, dtype)| match dtype {
                0 => check_copy(&gpu, &random_array(len, seed, |b| f32::from_bits(b as u32))),
                1 => check_copy(&gpu, &random_array(len, seed, f64::from_bits)),
                2 => check_copy(&gpu, &random_array(len, seed, |b| b as i32)),
                _ => check_copy(&gpu, &random_array(len, seed, |b| b as i64)),
            },
        )
        .unwrap();
}

#[test]
fn copy_of_non_contiguous_views_keeps_logical_order() {
    let Some(gpu) = gpu_or_skip("copy_of_non_contiguous_views_keeps_logical_order") else {
        return;
    };
    runner()
        .run(
            &(1..40usize, 1..40usize, 1..4usize, any::<u64>()),
            |(rows, cols, step, seed)| {
                let base = random_array(rows * cols, seed, |b| (b >> 40) as i32)
                    .into_shape_with_order(IxDyn(&[rows, cols]))
                    .unwrap();
                let view = base.t();
                let strided = base.slice(ndarray::s![..;step, ..]);
                for host in [view.into_dyn(), strided.into_dyn()] {
                    let src = gpu.upload(&host).unwrap();
                    prop_assert_eq!(src.shape(), host.shape());
                    let mut dst = gpu.alloc::<i32>(src.shape()).unwrap();
                    gpu.poison(&mut dst).unwrap();
                    gpu.copy(&src, &mut dst).unwrap();
                    prop_assert_eq!(gpu.download(&dst).unwrap(), host.to_owned());
                }
                Ok(())
            },
        )
        .unwrap();
}

#[test]
fn kernel_copy_equals_driver_copy() {
    let Some(gpu) = gpu_or_skip("kernel_copy_equals_driver_copy") else {
        return;
    };
    // 7 x 1757 = 3 tiles of 4096 words and 7 more.
    let host = random_array(7 * 1757, 42, |b| b as i32)
        .into_shape_with_order(IxDyn(&[7, 1757]))
        .unwrap();
    let src = gpu.upload(&host).unwrap();
    let (mut a, mut b) = (
        gpu.alloc::<i32>(src.shape()).unwrap(),
        gpu.alloc::<i32>(src.shape()).unwrap(),
    );
    gpu.poison(&mut a).unwrap();
    gpu.poison(&mut b).unwrap();
    gpu.copy(&src, &mut a).unwrap();
    gpu.copy_with_driver(&src, &mut b).unwrap();
    assert_eq!(gpu.download(&a).unwrap(), gpu.download(&b).unwrap());
    assert_eq!(gpu.download(&a).unwrap(), host);
}
