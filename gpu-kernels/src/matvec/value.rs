//! Device pieces the matvec kernels share: the element trait and the final
//! `alpha * sum + beta * y`.

use super::GemvArgs;
use crate::device::{Shuffle, VectorElement, fma_f32, fma_f64};

/// A float type the matvec kernels multiply.
pub trait GemvValue:
    Copy + PartialEq + Shuffle + VectorElement + core::ops::Add<Output = Self> + core::ops::Mul<Output = Self>
{
    const ZERO: Self;
    /// `self + a * b`, fused.
    fn mul_add(self, a: Self, b: Self) -> Self;
}

impl GemvValue for f32 {
    const ZERO: Self = 0.0;
    #[inline(always)]
    fn mul_add(self, a: Self, b: Self) -> Self {
        fma_f32(a, b, self)
    }
}

impl GemvValue for f64 {
    const ZERO: Self = 0.0;
    #[inline(always)]
    fn mul_add(self, a: Self, b: Self) -> Self {
        fma_f64(a, b, self)
    }
}

/// `alpha * sum + beta * y`, not reading y when beta is zero.
///
/// # Safety
/// `y` is in bounds.
#[inline(always)]
pub unsafe fn finish<T: GemvValue>(sum: T, alpha: T, beta: T, y: *mut T) {
    // SAFETY: the caller guarantees y is in bounds.
    unsafe {
        *y = if beta == T::ZERO {
            alpha * sum
        } else {
            (alpha * sum).mul_add(beta, *y)
        }
    };
}

impl<T> GemvArgs<T> {
    /// A, x, the partials and y, as the kernels address them.
    #[inline(always)]
    pub fn pointers(&self) -> (*const T, *const T, *mut T, *mut T) {
        (
            self.a.as_ptr(),
            self.x.as_ptr(),
            self.out.as_mut_ptr(),
            self.y.as_mut_ptr(),
        )
    }
}
