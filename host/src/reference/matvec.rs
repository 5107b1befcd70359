//! `alpha * op(A) x + beta * y` on the CPU, accumulated in f64.

use ndarray::{Array1, Array2, ArrayView1, ArrayView2, Axis, Zip};
use rayon::prelude::*;

use crate::error::Result;
use crate::matvec::{GemvElement, Op, gemv_problem};

/// `alpha * op(A) x + beta * y` in f64 (`y` ignored when absent or when beta is zero),
/// and beside it `|alpha| * |op(A)| |x| + |beta y|`, the scale of its rounding error.
pub fn gemv<T: GemvElement>(
    alpha: f64,
    op: Op,
    a: ArrayView2<T>,
    x: ArrayView1<T>,
    beta: f64,
    y: Option<ArrayView1<T>>,
) -> Result<(Array1<f64>, Array1<f64>)> {
    gemv_problem(a.shape(), x.shape(), op)?;
    let x: Vec<f64> = x.iter().map(|&v| v.into()).collect();
    let (sums, magnitudes): (Vec<f64>, Vec<f64>) = match op {
        Op::N => a
            .axis_iter(Axis(0))
            .into_par_iter()
            .map(|row| {
                row.iter().zip(&x).fold((0.0, 0.0), |(s, m), (&a, &x)| {
                    (s + a.into() * x, m + (a.into() * x).abs())
                })
            })
            .unzip(),
        Op::T => {
            let cols = a.ncols();
            let (s, m) = a
                .axis_chunks_iter(Axis(0), 256)
                .into_par_iter()
                .enumerate()
                .map(|(chunk, rows)| {
                    let mut s = vec![0.0; cols];
                    let mut m = vec![0.0; cols];
                    for (r, row) in rows.axis_iter(Axis(0)).enumerate() {
                        let xr = x[chunk * 256 + r];
                        for (c, &a) in row.iter().enumerate() {
                            s[c] += a.into() * xr;
                            m[c] += (a.into() * xr).abs();
                        }
                    }
                    (s, m)
                })
                .reduce(
                    || (vec![0.0; cols], vec![0.0; cols]),
                    |(mut s, mut m), (s2, m2)| {
                        s.iter_mut().zip(s2).for_each(|(a, b)| *a += b);
                        m.iter_mut().zip(m2).for_each(|(a, b)| *a += b);
                        (s, m)
                    },
                );
            (s, m)
        }
    };
    let mut out = Array1::from(sums) * alpha;
    let mut scale = Array1::from(magnitudes) * alpha.abs();
    if let Some(y) = y.filter(|_| beta != 0.0) {
        Zip::from(&mut out).and(&mut scale).and(&y).for_each(|o, s, &y| {
            *o += beta * y.into();
            *s += (beta * y.into()).abs();
        });
    }
    Ok((out, scale))
}

/// `alpha * A X + beta * Y` in f64 for X `[k, v]`, a column at a time by [`gemv`], and
/// beside it the scale of its rounding error.
pub fn gemv_vectors<T: GemvElement>(
    alpha: f64,
    a: ArrayView2<T>,
    x: ArrayView2<T>,
    beta: f64,
    y: Option<ArrayView2<T>>,
) -> Result<(Array2<f64>, Array2<f64>)> {
    gemv_problem(a.shape(), x.shape(), Op::N)?;
    let mut out = Array2::zeros((a.nrows(), x.ncols()));
    let mut scale = out.clone();
    for (j, column) in x.axis_iter(Axis(1)).enumerate() {
        let (o, s) = gemv(alpha, Op::N, a, column, beta, y.as_ref().map(|y| y.column(j)))?;
        out.column_mut(j).assign(&o);
        scale.column_mut(j).assign(&s);
    }
    Ok((out, scale))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn both_orientations_with_alpha_and_beta() {
        let a = array![[1.0f64, 2.0, 3.0], [4.0, 5.0, 6.0]];
        let (y, _) = gemv(1.0, Op::N, a.view(), array![1.0, 0.0, -1.0].view(), 0.0, None).unwrap();
        assert_eq!(y, array![-2.0, -2.0]);
        let y0 = array![10.0, 20.0, 30.0];
        let (y, scale) = gemv(
            2.0,
            Op::T,
            a.view(),
            array![1.0, 1.0].view(),
            0.5,
            Some(y0.view()),
        )
        .unwrap();
        assert_eq!(y, array![15.0, 24.0, 33.0]);
        assert_eq!(scale, array![15.0, 24.0, 33.0]);
    }

    #[test]
    fn several_vectors_are_columns() {
        let a = array![[1.0f64, 2.0, 3.0], [4.0, 5.0, 6.0]];
        let x = array![[1.0, 0.0], [0.0, 1.0], [-1.0, 2.0]];
        let y0 = array![[1.0, 1.0], [1.0, 1.0]];
        let (y, _) = gemv_vectors(2.0, a.view(), x.view(), 1.0, Some(y0.view())).unwrap();
        assert_eq!(y, array![[-3.0, 17.0], [-3.0, 35.0]]);
    }
}
