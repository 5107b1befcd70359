//! Elements as their sums: exact widening to the sum type and one rounding back.

use super::Float16;
use crate::element::Summed;
use half::{bf16, f16};

/// An element type that the kernels sum in its [`Summed::Sum`] type.
pub trait Widen: Summed {
    /// The element as a sum, exactly.
    fn widen(self) -> Self::Sum;
    /// [`widen`](Self::widen), kept apart from the load of the element (see
    /// [`Float16::widen_apart`]).
    #[inline(always)]
    fn widen_apart(self) -> Self::Sum {
        self.widen()
    }
    /// A sum rounded once to the element type.
    fn narrow(sum: Self::Sum) -> Self;
}

macro_rules! sums_in_itself {
    ($($t:ty),*) => {$(
        impl Widen for $t {
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

sums_in_itself!(f32, f64, i32, i64);

macro_rules! sums_in_f32 {
    ($($t:ty),*) => {$(
        impl Widen for $t {
            #[inline(always)]
            fn widen(self) -> f32 {
                Float16::widen(self)
            }
            #[inline(always)]
            fn widen_apart(self) -> f32 {
                Float16::widen_apart(self)
            }
            #[inline(always)]
            fn narrow(sum: f32) -> $t {
                <$t as Float16>::narrow(sum)
            }
        }
    )*};
}

sums_in_f32!(bf16, f16);
