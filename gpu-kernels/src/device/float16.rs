//! bf16 and f16 (the `half` crate's storage types, the same on both sides) on the
//! device: exact widening to f32 and one rounding back, through PTX `cvt`.

use core::arch::asm;
use half::{bf16, f16};

/// A 16-bit float the kernels store and load, computing in f32.
pub trait Float16: Copy {
    /// The value as f32, exactly.
    fn widen(self) -> f32;
    /// [`widen`](Self::widen) as an instruction that the optimizer keeps where it
    /// stands, for values loaded one by one under a condition and widened after the last
    /// load: moved into each load's branch, the widening would wait for its load, one
    /// load at a time (bf16 strided scans ran at a third of the f16 rate).
    fn widen_apart(self) -> f32;
    /// `x` rounded to nearest even (NaN stays NaN, overflow goes to infinity).
    fn narrow(x: f32) -> Self;
    /// The bits of `low` and `high`, each rounded as by [`narrow`](Self::narrow), in
    /// one word (`low` in its low half: the first of two elements in memory), by one
    /// packed conversion.
    fn narrow_pair(low: f32, high: f32) -> u32;
    /// The value of these bits.
    fn from_bits(bits: u16) -> Self;
    /// The value's bits.
    fn to_bits(self) -> u16;
}

/// The bits of f32 `x` rounded to nearest even in the 16-bit type `$ty` (`cvt.rn`; bf16
/// needs sm_80 or later).
macro_rules! round_to {
    ($ty:literal, $x:expr) => {{
        let bits: u16;
        // SAFETY: a register conversion; no memory is touched.
        unsafe {
            asm!(
                concat!("cvt.rn.", $ty, ".f32 {h}, {x};"),
                h = out(reg16) bits,
                x = in(reg32) $x,
                options(pure, nomem, nostack, preserves_flags),
            )
        };
        bits
    }};
}

/// [`round_to`] of two f32s into the halves of a word (`cvt.rn.<ty>x2.f32`, sm_80 or
/// later), `$low` in the low half.
macro_rules! round_pair_to {
    ($ty:literal, $low:expr, $high:expr) => {{
        let bits: u32;
        // SAFETY: a register conversion; no memory is touched.
        unsafe {
            asm!(
                // The first source fills the upper half.
                concat!("cvt.rn.", $ty, "x2.f32 {d}, {high}, {low};"),
                d = out(reg32) bits,
                high = in(reg32) $high,
                low = in(reg32) $low,
                options(pure, nomem, nostack, preserves_flags),
            )
        };
        bits
    }};
}

impl Float16 for bf16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        // bf16 is the high half of an f32.
        f32::from_bits((self.to_bits() as u32) << 16)
    }

    #[inline(always)]
    fn widen_apart(self) -> f32 {
        let x: f32;
        // SAFETY: a register operation; no memory is touched.
        unsafe {
            asm!(
                "shl.b32 {x}, {h}, 16;",
                x = out(reg32) x,
                h = in(reg32) self.to_bits() as u32,
                options(pure, nomem, nostack, preserves_flags),
            )
        };
        x
    }

    #[inline(always)]
    fn narrow(x: f32) -> Self {
        bf16::from_bits(round_to!("bf16", x))
    }

    #[inline(always)]
    fn narrow_pair(low: f32, high: f32) -> u32 {
        round_pair_to!("bf16", low, high)
    }

    #[inline(always)]
    fn from_bits(bits: u16) -> Self {
        bf16::from_bits(bits)
    }

    #[inline(always)]
    fn to_bits(self) -> u16 {
        bf16::to_bits(self)
    }
}

impl Float16 for f16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        let x: f32;
        // SAFETY: a register conversion; no memory is touched.
        unsafe {
            asm!(
                "cvt.f32.f16 {x}, {h};",
                x = out(reg32) x,
                h = in(reg16) self.to_bits(),
                options(pure, nomem, nostack, preserves_flags),
            )
        };
        x
    }

    #[inline(always)]
    fn widen_apart(self) -> f32 {
        // The conversion is an instruction already.
        self.widen()
    }

    #[inline(always)]
    fn narrow(x: f32) -> Self {
        f16::from_bits(round_to!("f16", x))
    }

    #[inline(always)]
    fn narrow_pair(low: f32, high: f32) -> u32 {
        round_pair_to!("f16", low, high)
    }

    #[inline(always)]
    fn from_bits(bits: u16) -> Self {
        f16::from_bits(bits)
    }

    #[inline(always)]
    fn to_bits(self) -> u16 {
        f16::to_bits(self)
    }
}
