//! Device pieces the matvec kernels share: the element trait and the final
//! `alpha * sum + beta * y`.

use super::{GemvArgs, GemvScalar};
use crate::device::{Float16, Shuffle, VectorElement, fma_f32, fma_f64};
use half::{bf16, f16};

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

/// A float type the matvec kernels multiply, in its accumulator type.
pub trait GemvValue: GemvScalar<Acc: Accumulator> + VectorElement {
    /// The element as a sum, exactly.
    fn widen(self) -> Self::Acc;
    /// A sum rounded once to the element type.
    fn narrow(sum: Self::Acc) -> Self;
}

macro_rules! gemv_value_sums_in_itself {
    ($($t:ty),*) => {$(
        impl GemvValue for $t {
            #[inline(always)]
            fn widen(self) -> $t {
                self
            }
            #[inline(always)]
            fn narrow(sum: $t) -> $t {
                sum
            }
        }
    )*};
}

gemv_value_sums_in_itself!(f32, f64);

macro_rules! gemv_value_sums_in_f32 {
    ($($t:ty),*) => {$(
        impl GemvValue for $t {
            #[inline(always)]
            fn widen(self) -> f32 {
                Float16::widen(self)
            }
            #[inline(always)]
            fn narrow(sum: f32) -> $t {
                <$t as Float16>::narrow(sum)
            }
        }
    )*};
}

gemv_value_sums_in_f32!(bf16, f16);

/// `y = alpha * sum + beta * y`, in the accumulator type and rounded once, not reading
/// y when beta is zero.
///
/// # Safety
/// `y` is in bounds.
#[inline(always)]
pub unsafe fn finish<T: GemvValue>(sum: T::Acc, alpha: T::Acc, beta: T::Acc, y: *mut T) {
    // SAFETY: the caller guarantees y is in bounds.
    unsafe {
        *y = T::narrow(if beta == T::Acc::ZERO {
            alpha * sum
        } else {
            (alpha * sum).mul_add(beta, (*y).widen())
        })
    };
}

impl<T: GemvScalar> GemvArgs<T> {
    /// A, x, the partials and y, as the kernels address them.
    #[inline(always)]
    pub fn pointers(&self) -> (*const T, *const T, *mut T::Acc, *mut T) {
        (
            self.a.as_ptr(),
            self.x.as_ptr(),
            self.out.as_mut_ptr(),
            self.y.as_mut_ptr(),
        )
    }
}
