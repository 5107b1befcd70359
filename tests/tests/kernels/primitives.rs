//! The warp and block collectives alone, each in its own small kernel, at awkward sizes:
//! one element, a warp and one more, a warp and one more again, a thousand (partial last
//! warps and tiles), and long enough for chains of hundreds of look-back tiles. Values
//! span the whole integer range, so sums wrap and must match exactly.

use host::{Element, primitives};
use ndarray::{Array1, Array2, ArrayD, IxDyn};
use tests::{gpu_or_skip, random_words};

/// Lengths around a warp: 1, 17, 33 and 1000 elements.
const AWKWARD: [usize; 4] = [1, 17, 33, 1000];

fn random<T: Element>(shape: &[usize], seed: u64, from_bits: impl Fn(u64) -> T) -> ArrayD<T> {
    let mut next = random_words(seed);
    ArrayD::from_shape_fn(IxDyn(shape), |_| from_bits(next()))
}

/// The wrapping sums of each aligned group of `lanes`, by the definition.
fn group_sums_on_cpu(x: &[i64], lanes: usize, wrap: impl Fn(i64) -> i64) -> Vec<i64> {
    (0..x.len())
        .map(|i| {
            let group = i / lanes * lanes;
            let end = (group + lanes).min(x.len());
            wrap(x[group..end].iter().fold(0i64, |a, &b| a.wrapping_add(b)))
        })
        .collect()
}

#[test]
fn warp_group_sums_at_awkward_sizes() {
    let Some(gpu) = gpu_or_skip("warp_group_sums_at_awkward_sizes") else {
        return;
    };
    for n in AWKWARD {
        for lanes in [1, 2, 4, 8, 16, 32] {
            let x64 = random(&[n], n as u64 + lanes as u64, |b| b as i64);
            let got = gpu
                .download(&primitives::group_sums(&gpu, &gpu.upload(&x64).unwrap(), lanes).unwrap())
                .unwrap();
            let want = group_sums_on_cpu(x64.as_slice().unwrap(), lanes as usize, |v| v);
            assert_eq!(got.as_slice().unwrap(), &want[..], "i64, n {n}, lanes {lanes}");

            let x32 = random(&[n], n as u64 ^ lanes as u64, |b| b as i32);
            let got = gpu
                .download(&primitives::group_sums(&gpu, &gpu.upload(&x32).unwrap(), lanes).unwrap())
                .unwrap();
            let wide: Vec<i64> = x32.iter().map(|&v| v as i64).collect();
            let want = group_sums_on_cpu(&wide, lanes as usize, |v| v as i32 as i64);
            let got: Vec<i64> = got.iter().map(|&v| v as i64).collect();
            assert_eq!(got, want, "i32, n {n}, lanes {lanes}");
        }
    }
    let x = gpu.upload(&Array1::from(vec![1i64; 4])).unwrap();
    assert!(primitives::group_sums(&gpu, &x, 3).is_err());
    assert!(primitives::group_sums(&gpu, &x, 64).is_err());
}

/// The inclusive wrapping scan of each row, by the definition.
fn scan_on_cpu(x: &[i64]) -> Vec<i64> {
    x.iter()
        .scan(0i64, |sum, &v| {
            *sum = sum.wrapping_add(v);
            Some(*sum)
        })
        .collect()
}

#[test]
fn block_scans_of_rows_at_awkward_sizes() {
    let Some(gpu) = gpu_or_skip("block_scans_of_rows_at_awkward_sizes") else {
        return;
    };
    for len in AWKWARD.into_iter().chain([256, 257, 2049]) {
        let rows = 3;
        let x = random(&[rows, len], len as u64, |b| b as i64);
        let want: Vec<i64> = x
            .rows()
            .into_iter()
            .flat_map(|row| scan_on_cpu(&row.to_vec()))
            .collect();
        for wide in [false, true] {
            let got = gpu
                .download(&primitives::row_scan(&gpu, &gpu.upload(&x).unwrap(), wide).unwrap())
                .unwrap();
            assert_eq!(got.as_slice().unwrap(), &want[..], "rows of {len}, wide {wide}");
        }
    }
    let flat = gpu.upload(&Array1::from(vec![1i64; 4])).unwrap();
    assert!(primitives::row_scan(&gpu, &flat, false).is_err());
    let empty = gpu.upload(&Array2::<i64>::zeros((3, 0))).unwrap();
    assert_eq!(primitives::row_scan(&gpu, &empty, true).unwrap().shape(), &[3, 0]);
}

#[test]
fn look_back_chains_at_awkward_sizes() {
    let Some(gpu) = gpu_or_skip("look_back_chains_at_awkward_sizes") else {
        return;
    };
    // Up to 3125 tiles of one warp: chains far longer than the look-back window.
    for n in AWKWARD.into_iter().chain([32 * 128 + 1, 100_000]) {
        let x64 = random(&[n], n as u64, |b| b as i64);
        let got = gpu
            .download(&primitives::chain_scan(&gpu, &gpu.upload(&x64).unwrap()).unwrap())
            .unwrap();
        assert_eq!(
            got.as_slice().unwrap(),
            &scan_on_cpu(x64.as_slice().unwrap())[..],
            "i64 (flags and values apart), n {n}"
        );

        let x32 = random(&[n], !(n as u64), |b| b as i32);
        let got = gpu
            .download(&primitives::chain_scan(&gpu, &gpu.upload(&x32).unwrap()).unwrap())
            .unwrap();
        let wide: Vec<i64> = x32.iter().map(|&v| v as i64).collect();
        let want: Vec<i32> = scan_on_cpu(&wide).into_iter().map(|v| v as i32).collect();
        assert_eq!(got.as_slice().unwrap(), &want[..], "i32 (packed), n {n}");
    }
}
