//! Cumulative sums on the CPU: each lane summed in order, floats in f64.

use ndarray::{ArrayBase, ArrayD, Axis, Data, Dimension, Zip};

use crate::error::Result;
use crate::scan::{ScanElement, ScanKind, scan_problem};

/// The cumulative sum along `axis`, rounded once from an f64 sum for floats, wrapping
/// for integers.
pub fn cumsum<T: ScanElement, S: Data<Elem = T>, D: Dimension>(
    x: &ArrayBase<S, D>,
    axis: usize,
    kind: ScanKind,
    reverse: bool,
) -> Result<ArrayD<T>> {
    scan_problem(x.shape(), axis)?;
    let x = x.view().into_dyn();
    let mut y = ArrayD::from_elem(x.raw_dim(), T::default());
    Zip::from(y.lanes_mut(Axis(axis)))
        .and(x.lanes(Axis(axis)))
        .par_for_each(|mut out, lane| {
            let n = lane.len();
            let mut sum = T::Accumulator::default();
            for step in 0..n {
                let i = if reverse { n - 1 - step } else { step };
                let before = sum;
                sum = T::accumulate(sum, lane[i].widen());
                out[i] = T::narrow(if kind == ScanKind::Exclusive { before } else { sum });
            }
        });
    Ok(y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn exclusive_inclusive_and_reversed() {
        let x = array![[1i32, 2, 3, 4], [10, 20, 30, 40]];
        let y = |axis, kind, reverse| {
            cumsum(&x, axis, kind, reverse)
                .unwrap()
                .into_dimensionality()
                .unwrap()
        };
        assert_eq!(
            y(1, ScanKind::Exclusive, false),
            array![[0, 1, 3, 6], [0, 10, 30, 60]]
        );
        assert_eq!(
            y(1, ScanKind::Inclusive, false),
            array![[1, 3, 6, 10], [10, 30, 60, 100]]
        );
        assert_eq!(
            y(1, ScanKind::Exclusive, true),
            array![[9, 7, 4, 0], [90, 70, 40, 0]]
        );
        assert_eq!(
            y(0, ScanKind::Exclusive, false),
            array![[0, 0, 0, 0], [1, 2, 3, 4]]
        );
        assert_eq!(
            y(0, ScanKind::Inclusive, true),
            array![[11, 22, 33, 44], [10, 20, 30, 40]]
        );
    }

    #[test]
    fn integers_wrap_and_floats_round_once() {
        let x = array![i32::MAX, 1, 1];
        assert_eq!(
            cumsum(&x, 0, ScanKind::Inclusive, false)
                .unwrap()
                .as_slice()
                .unwrap(),
            &[i32::MAX, i32::MIN, i32::MIN + 1]
        );
        // 1e8 + 1 + ... is not representable in f32 step by step, but is in f64.
        let x = array![1.0e8f32, 1.0, 1.0, 1.0, 1.0];
        let y = cumsum(&x, 0, ScanKind::Inclusive, false).unwrap();
        assert_eq!(y[4], (1.0e8f64 + 4.0) as f32);
    }
}
