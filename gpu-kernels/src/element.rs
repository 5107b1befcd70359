//! The element types of the kernels and the types their sums are kept in, compiled by
//! both sides: f32 for the 16-bit floats (as torch accumulates them), else the type
//! itself.

/// An element type and the type its sums are kept in.
pub trait Summed: Copy {
    type Sum: Copy + core::fmt::Debug;
}

macro_rules! sums_in {
    ($($t:ty => $sum:ty),*) => {$(
        impl Summed for $t {
            type Sum = $sum;
        }
    )*};
}

sums_in!(f32 => f32, f64 => f64, i32 => i32, i64 => i64, half::bf16 => f32, half::f16 => f32);

/// The sum type of element type `T`.
pub type Sum<T> = <T as Summed>::Sum;

/// Bytes of one sum of `element_bytes`-byte elements: f32 for the 16-bit floats.
pub const fn sum_bytes(element_bytes: usize) -> usize {
    if element_bytes < 4 { 4 } else { element_bytes }
}
