//! Device pieces the matvec kernels share: the element trait and the final
//! `alpha * sum + beta * y`.

use super::GemvArgs;
use crate::device::{Shuffle, VectorElement, Widen, fma_f32, fma_f64};
use crate::element::Summed;

/// What the products sum in (f32 or f64).
pub trait Accumulator:
    Copy + PartialEq + Shuffle + core::ops::Add<Output = Self> + core::ops::Mul<Output = Self>
{
    const ZERO: Self;
    /// `self + a * b`, fused.
    fn mul_add(self, a: Self, b: Self) -> Self;
}

impl Accumulator for f32 {
    const ZERO: Self = 0.0;
    #[inline(always)]
    fn mul_add(self, a: Self, b: Self) -> Self {
        fma_f32(a, b, self)
    }
}

impl Accumulator for f64 {
    const ZERO: Self = 0.0;
    #[inline(always)]
    fn mul_add(self, a: Self, b: Self) -> Self {
        fma_f64(a, b, self)
    }
}

/// A float type the matvec kernels multiply, in its sum type.
pub trait GemvValue: Widen<Sum: Accumulator> + VectorElement {}

impl<T: Widen<Sum: Accumulator> + VectorElement> GemvValue for T {}

/// `y = alpha * sum + beta * y`, in the accumulator type and rounded once, not reading
/// y when beta is zero.
///
/// # Safety
/// `y` is in bounds.
#[inline(always)]
pub unsafe fn finish<T: GemvValue>(sum: T::Sum, alpha: T::Sum, beta: T::Sum, y: *mut T) {
    // SAFETY: the caller guarantees y is in bounds.
    unsafe {
        *y = T::narrow(if beta == T::Sum::ZERO {
            alpha * sum
        } else {
            (alpha * sum).mul_add(beta, (*y).widen())
        })
    };
}

impl<T: Summed> GemvArgs<T> {
    /// A, x, the partials and y, as the kernels address them.
    #[inline(always)]
    pub fn pointers(&self) -> (*const T, *const T, *mut T::Sum, *mut T) {
        (
            self.a.as_ptr(),
            self.x.as_ptr(),
            self.out.as_mut_ptr(),
            self.y.as_mut_ptr(),
        )
    }
}
