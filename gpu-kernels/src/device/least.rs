//! The least of several elements with NaN winning (PTX `min.NaN`, sm_80 and later):
//! the min kernels find the least of a run in a few instructions, two 16-bit elements
//! per instruction, and search for where it is only in the run that holds it.

use super::VectorElement;
use core::arch::asm;
use half::{bf16, f16};

/// An element type with a NaN-propagating minimum.
pub trait Least: VectorElement {
    /// The lesser of two elements, NaN if either is NaN. Of two equal values (`-0.0` and
    /// `0.0`) either may come back.
    fn least(self, other: Self) -> Self;

    /// [`least`](Self::least) of each pair of elements of two vectors.
    #[inline(always)]
    fn least_of_vectors(a: [u32; 4], b: [u32; 4]) -> [u32; 4] {
        let mut out = a;
        for i in 0..Self::PER_VECTOR {
            Self::from_words(a, i)
                .least(Self::from_words(b, i))
                .into_words(&mut out, i);
        }
        out
    }

    /// The least element of a vector, NaN if any is NaN.
    #[inline(always)]
    fn least_in_vector(words: [u32; 4]) -> Self {
        (1..Self::PER_VECTOR).fold(Self::from_words(words, 0), |least, i| {
            least.least(Self::from_words(words, i))
        })
    }
}

impl Least for i32 {
    #[inline(always)]
    fn least(self, other: i32) -> i32 {
        self.min(other)
    }
}

impl Least for f64 {
    #[inline(always)]
    #[allow(clippy::eq_op)]
    fn least(self, other: f64) -> f64 {
        // PTX has no NaN-propagating f64 minimum: NaN `self` wins, NaN `other` loses
        // the comparison.
        if self < other || self != self { self } else { other }
    }
}

/// `min.NaN.$ty` of two registers of class `$reg`.
macro_rules! min_nan {
    ($ty:expr, $reg:ident, $a:expr, $b:expr) => {{
        let out;
        // SAFETY: a register operation; no memory is touched.
        unsafe {
            asm!(
                concat!("min.NaN.", $ty, " {o}, {a}, {b};"),
                o = out($reg) out,
                a = in($reg) $a,
                b = in($reg) $b,
                options(pure, nomem, nostack, preserves_flags),
            )
        };
        out
    }};
}

impl Least for f32 {
    #[inline(always)]
    fn least(self, other: f32) -> f32 {
        min_nan!("f32", reg32, self, other)
    }
}

/// The least of 16-bit float type `$t`: two packed elements per instruction
/// (`$pair`), or one (`$single`).
macro_rules! least_16 {
    ($t:ty, $pair:literal, $single:literal) => {
        impl Least for $t {
            #[inline(always)]
            fn least(self, other: $t) -> $t {
                <$t>::from_bits(min_nan!($single, reg16, self.to_bits(), other.to_bits()))
            }

            #[inline(always)]
            fn least_of_vectors(a: [u32; 4], b: [u32; 4]) -> [u32; 4] {
                core::array::from_fn(|i| min_nan!($pair, reg32, a[i], b[i]))
            }

            #[inline(always)]
            fn least_in_vector(words: [u32; 4]) -> $t {
                let [a, b, c, d] = words;
                let (ab, cd): (u32, u32) = (min_nan!($pair, reg32, a, b), min_nan!($pair, reg32, c, d));
                let pair: u32 = min_nan!($pair, reg32, ab, cd);
                <$t>::from_bits(pair as u16).least(<$t>::from_bits((pair >> 16) as u16))
            }
        }
    };
}

least_16!(bf16, "bf16x2", "bf16");
least_16!(f16, "f16x2", "f16");
