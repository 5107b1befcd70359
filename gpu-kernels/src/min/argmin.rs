//! The running minimum every min kernel keeps, with the index of its first occurrence,
//! and the element trait of the min kernels.

use crate::device::{Lane, Shuffle, VectorElement};
use crate::warp;

/// An element type the min kernels reduce.
pub trait MinValue: Copy + PartialOrd + Shuffle + VectorElement {
    fn is_nan(self) -> bool;
}

impl MinValue for f32 {
    #[inline(always)]
    fn is_nan(self) -> bool {
        f32::is_nan(self)
    }
}

impl MinValue for f64 {
    #[inline(always)]
    fn is_nan(self) -> bool {
        f64::is_nan(self)
    }
}

impl MinValue for i32 {
    #[inline(always)]
    fn is_nan(self) -> bool {
        false
    }
}

/// A running minimum and, when `INDEX`, where it is. `index == u64::MAX` marks an
/// empty state (no element seen), which every real element beats.
#[derive(Clone, Copy)]
pub struct ArgMin<T, const INDEX: bool> {
    pub value: T,
    pub index: u64,
}

impl<T: MinValue, const INDEX: bool> Shuffle for ArgMin<T, INDEX> {
    #[inline(always)]
    fn shuffle(self, from: Lane) -> Self {
        Self {
            value: self.value.shuffle(from),
            index: self.index.shuffle(from),
        }
    }
}

impl<T: MinValue, const INDEX: bool> ArgMin<T, INDEX> {
    #[inline(always)]
    pub fn empty(value: T) -> Self {
        Self {
            value,
            index: u64::MAX,
        }
    }

    /// Takes element `index`, which comes after every element seen so far.
    #[inline(always)]
    pub fn push(&mut self, value: T, index: u64) {
        let empty = self.index == u64::MAX;
        let wins = value < self.value || (value.is_nan() && !self.value.is_nan());
        if empty || wins {
            self.value = value;
            self.index = index;
        }
    }

    /// Combines with a state over other elements, in any order: NaN first, then the
    /// smaller value, then (with indices) the smaller index.
    #[inline(always)]
    pub fn merge(self, other: Self) -> Self {
        if other.index == u64::MAX {
            return self;
        }
        if self.index == u64::MAX {
            return other;
        }
        let (a, b) = (self.value, other.value);
        let other_wins = if INDEX {
            (b.is_nan() && (!a.is_nan() || other.index < self.index))
                || (!a.is_nan() && (b < a || (b == a && other.index < self.index)))
        } else {
            (b.is_nan() && !a.is_nan()) || b < a
        };
        if other_wins { other } else { self }
    }

    /// Merges across the `lanes` lanes (a power of two) of an aligned lane group.
    /// All 32 lanes of the warp must call it together.
    #[inline(always)]
    pub fn merge_group(self, lanes: u32) -> Self {
        warp::reduce_groups(self, lanes, Self::merge)
    }

    /// Writes the state at `slot`.
    ///
    /// # Safety
    /// `slot` is in bounds of `values` (and of `indices` when `INDEX`).
    #[inline(always)]
    pub unsafe fn store(self, values: *mut T, indices: *mut i64, slot: u64) {
        // SAFETY: the caller guarantees `slot` is in bounds.
        unsafe {
            *values.add(slot as usize) = self.value;
            if INDEX {
                *indices.add(slot as usize) = self.index as i64;
            }
        }
    }
}
