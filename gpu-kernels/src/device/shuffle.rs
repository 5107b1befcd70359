//! Warp shuffles (`shfl.sync`) over the full warp, for 32- and 64-bit values and for
//! structs of them.

use core::arch::asm;

/// Threads in a warp.
pub const WARP_SIZE: u32 = crate::launch::WARP_LANES;

/// Which lane a shuffle reads from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// Lane `lane_id ^ mask`.
    Xor(u32),
    /// Lane `lane_id + delta`; lanes past 31 keep their own.
    Down(u32),
    /// Lane `lane_id - delta`; lanes below `delta` keep their own.
    Up(u32),
    /// Lane `src`.
    Index(u32),
}

/// One full-warp `shfl.sync.<mode>.b32`; the clamp is 31, or 0 for `up`.
macro_rules! shfl_b32 {
    ($mode:literal, $value:expr, $operand:expr, $clamp:literal) => {{
        let out: u32;
        // SAFETY: every lane of the warp executes the shuffle together (the contract of
        // `Shuffle`), and it touches no memory.
        unsafe {
            asm!(
                concat!("shfl.sync.", $mode, ".b32 {0}, {1}, {2}, ", stringify!($clamp), ", 0xffffffff;"),
                out(reg32) out,
                in(reg32) $value,
                in(reg32) $operand,
                options(nomem, nostack, preserves_flags),
            )
        };
        out
    }};
}

/// A value that can move between the lanes of a warp: a struct shuffles field by
/// field, so it implements [`Shuffle::shuffle`] alone.
///
/// Every method is a collective: all 32 lanes of the warp must call it together
/// (converged), or the result is undefined.
pub trait Shuffle: Copy {
    /// The value of the lane `from` names.
    fn shuffle(self, from: Lane) -> Self;

    /// The value of lane `lane_id ^ mask`.
    #[inline(always)]
    fn shfl_xor(self, mask: u32) -> Self {
        self.shuffle(Lane::Xor(mask))
    }
    /// The value of lane `lane_id + delta`; lanes past 31 keep their own.
    #[inline(always)]
    fn shfl_down(self, delta: u32) -> Self {
        self.shuffle(Lane::Down(delta))
    }
    /// The value of lane `lane_id - delta`; lanes below `delta` keep their own.
    #[inline(always)]
    fn shfl_up(self, delta: u32) -> Self {
        self.shuffle(Lane::Up(delta))
    }
    /// The value of lane `src`.
    #[inline(always)]
    fn shfl_idx(self, src: u32) -> Self {
        self.shuffle(Lane::Index(src))
    }
}

impl Shuffle for u32 {
    #[inline(always)]
    fn shuffle(self, from: Lane) -> Self {
        match from {
            Lane::Xor(mask) => shfl_b32!("bfly", self, mask, 0x1f),
            Lane::Down(delta) => shfl_b32!("down", self, delta, 0x1f),
            Lane::Up(delta) => shfl_b32!("up", self, delta, 0),
            Lane::Index(src) => shfl_b32!("idx", self, src, 0x1f),
        }
    }
}

impl Shuffle for u64 {
    #[inline(always)]
    fn shuffle(self, from: Lane) -> Self {
        let [lo, hi] = [self as u32, (self >> 32) as u32].map(|w| w.shuffle(from));
        lo as u64 | (hi as u64) << 32
    }
}

/// Types that shuffle as the bits of `u32` or `u64`.
macro_rules! shuffle_as_bits {
    ($($t:ty => $bits:ty, $to:expr, $from:expr;)*) => {$(
        impl Shuffle for $t {
            #[inline(always)]
            fn shuffle(self, from: Lane) -> Self {
                $from(<$bits>::shuffle($to(self), from))
            }
        }
    )*};
}

shuffle_as_bits! {
    i32 => u32, |v: i32| v as u32, |b: u32| b as i32;
    f32 => u32, f32::to_bits, f32::from_bits;
    i64 => u64, |v: i64| v as u64, |b: u64| b as i64;
    f64 => u64, f64::to_bits, f64::from_bits;
    half::bf16 => u32, |v: half::bf16| v.to_bits() as u32, |b: u32| half::bf16::from_bits(b as u16);
    half::f16 => u32, |v: half::f16| v.to_bits() as u32, |b: u32| half::f16::from_bits(b as u16);
}

/// The lanes of the warp whose `predicate` holds, as a bit mask (`vote.sync.ballot`).
/// All 32 lanes must call it together.
#[inline(always)]
pub fn ballot(predicate: bool) -> u32 {
    let mask: u32;
    // SAFETY: a full-warp vote with no memory access; every lane executes it (the
    // caller's contract).
    unsafe {
        asm!(
            "{{ .reg .pred p; setp.ne.u32 p, {x}, 0; vote.sync.ballot.b32 {m}, p, 0xffffffff; }}",
            x = in(reg32) predicate as u32,
            m = out(reg32) mask,
            options(nomem, nostack, preserves_flags),
        )
    };
    mask
}
