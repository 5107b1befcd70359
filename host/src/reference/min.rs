//! `min` and `amin` along an axis on the CPU: a sequential scan of each lane in index
//! order, keeping the first minimum, NaN taking precedence.

use ndarray::{ArrayBase, ArrayD, Axis, Data, Dimension, IxDyn, Zip};

use crate::error::Result;
use crate::min::{MinElement, min_problem, reduced_shape};

/// Values and the index of the first minimum along `axis`.
pub fn min<T: MinElement, S: Data<Elem = T>, D: Dimension>(
    x: &ArrayBase<S, D>,
    axis: usize,
    keepdim: bool,
) -> Result<(ArrayD<T>, ArrayD<i64>)> {
    min_problem("min", x.shape(), axis)?;
    let x = x.view().into_dyn();
    let out_shape = IxDyn(&reduced_shape(x.shape(), axis, false));
    let mut values = ArrayD::from_elem(out_shape.clone(), x.first().copied().unwrap_or_default());
    let mut indices = ArrayD::zeros(out_shape);
    Zip::from(&mut values)
        .and(&mut indices)
        .and(x.lanes(Axis(axis)))
        .par_for_each(|value, index, lane| {
            let (mut best, mut at) = (lane[0], 0);
            for (i, &v) in lane.iter().enumerate().skip(1) {
                if best.is_nan() {
                    break;
                }
                if v.is_nan() || v < best {
                    (best, at) = (v, i);
                }
            }
            (*value, *index) = (best, at as i64);
        });
    if keepdim {
        values.insert_axis_inplace(Axis(axis));
        indices.insert_axis_inplace(Axis(axis));
    }
    Ok((values, indices))
}

/// Values of the minimum along `axis`.
pub fn amin<T: MinElement, S: Data<Elem = T>, D: Dimension>(
    x: &ArrayBase<S, D>,
    axis: usize,
    keepdim: bool,
) -> Result<ArrayD<T>> {
    min_problem("amin", x.shape(), axis)?;
    Ok(min(x, axis, keepdim)?.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{ArrayD, array};

    #[test]
    fn first_minimum_and_nan_precedence() {
        let x = array![
            [3.0f32, 1.0, 1.0, 2.0],
            [f32::NAN, 0.0, f32::NAN, -1.0],
            [5.0, -f32::INFINITY, 4.0, -f32::INFINITY]
        ];
        let (v, i) = min(&x, 1, false).unwrap();
        assert_eq!(v[[0]], 1.0);
        assert!(v[[1]].is_nan());
        assert_eq!(v[[2]], f32::NEG_INFINITY);
        assert_eq!(i.as_slice().unwrap(), &[1, 0, 1]);
        let (v, i) = min(&x, 0, true).unwrap();
        assert_eq!(v.shape(), &[1, 4]);
        assert!(v[[0, 0]].is_nan() && v[[0, 2]].is_nan());
        assert_eq!((v[[0, 1]], v[[0, 3]]), (f32::NEG_INFINITY, f32::NEG_INFINITY));
        assert_eq!(i.as_slice().unwrap(), &[1, 2, 1, 2]);
        assert_eq!(i.shape(), &[1, 4]);
    }

    #[test]
    fn integers_and_ranks() {
        let x = ndarray::Array3::from_shape_fn((2, 3, 4), |(a, b, c)| ((a * 7 + b * 5 + c * 3) % 4) as i32);
        let (v, i) = min(&x, 2, false).unwrap();
        assert_eq!(v.shape(), &[2, 3]);
        for ((a, b), &value) in ndarray::indices((2, 3)).into_iter().zip(v.iter()) {
            let lane: Vec<i32> = (0..4).map(|c| x[[a, b, c]]).collect();
            let m = *lane.iter().min().unwrap();
            assert_eq!(value, m);
            assert_eq!(i[[a, b]], lane.iter().position(|&e| e == m).unwrap() as i64);
        }
        assert_eq!(amin(&x, 0, true).unwrap().shape(), &[1, 3, 4]);
        assert_eq!(
            amin(&ArrayD::<i32>::zeros(IxDyn(&[0, 5])), 1, false)
                .unwrap()
                .shape(),
            &[0]
        );
    }
}
