//! The running minimum every min kernel keeps, with the index of its first occurrence,
//! and the element trait of the min kernels.

use crate::device::{Float16, Lane, Least, Shuffle};
use crate::warp;
use half::{bf16, f16};

/// An element type the min kernels reduce.
pub trait MinValue: Least + Shuffle {
    /// The element as the kernels compare it, exactly: 16-bit floats widen to f32.
    type Key: Copy + PartialOrd;
    fn key(self) -> Self::Key;
    /// The element of the greatest key (no NaN): infinity, or the type's maximum.
    const LARGEST: Self;
}

macro_rules! min_value_is_its_key {
    ($($t:ty: $largest:expr),*) => {$(
        impl MinValue for $t {
            type Key = $t;
            #[inline(always)]
            fn key(self) -> $t {
                self
            }
            const LARGEST: $t = $largest;
        }
    )*};
}

min_value_is_its_key!(f32: f32::INFINITY, f64: f64::INFINITY, i32: i32::MAX);

macro_rules! min_value_widens {
    ($($t:ty),*) => {$(
        impl MinValue for $t {
            type Key = f32;
            #[inline(always)]
            fn key(self) -> f32 {
                self.widen()
            }
            const LARGEST: $t = <$t>::INFINITY;
        }
    )*};
}

min_value_widens!(bf16, f16);

/// Whether a key is NaN (never, for integers).
#[inline(always)]
#[allow(clippy::eq_op)]
fn is_nan<K: PartialOrd>(key: K) -> bool {
    key != key
}

/// Whether two elements are the same to the min kernels: equal keys, or both NaN.
#[inline(always)]
pub fn same_key<T: MinValue>(a: T, b: T) -> bool {
    let (a, b) = (a.key(), b.key());
    a == b || (is_nan(a) && is_nan(b))
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

    /// The state of elements from index `first` on before any is taken, as if the
    /// largest element stood at `first`: the first element that beats it takes its
    /// place, and where none does, every element is the largest, the first at `first`.
    /// So a run pushed into it needs no test for an empty state.
    #[inline(always)]
    pub fn starting_at(first: u64) -> Self {
        Self {
            value: T::LARGEST,
            index: first,
        }
    }

    /// Whether no element was seen.
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.index == u64::MAX
    }

    /// Whether an element after every element seen so far becomes the minimum of a
    /// state that is not empty: a NaN held stays; else NaN or a smaller key wins.
    #[inline(always)]
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    fn beaten_by(&self, value: T) -> bool {
        let (new, held) = (value.key(), self.value.key());
        !is_nan(held) && !(new >= held)
    }

    /// Takes element `index`, which comes after every element seen so far; returns
    /// whether it became the minimum.
    #[inline(always)]
    pub fn push(&mut self, value: T, index: u64) -> bool {
        let wins = self.is_empty() || self.beaten_by(value);
        if wins {
            self.value = value;
            self.index = index;
        }
        wins
    }

    /// Takes a run of elements, `step` apart from index `first` on, all after every
    /// element seen so far, into a state that is not empty ([`Self::starting_at`]): the
    /// run's least (`min.NaN`, packed for 16-bit elements) is compared once, and only a
    /// run holding a new least is searched for where that first is, so that no run's
    /// elements stay in registers.
    #[inline(always)]
    pub fn push_run<const N: usize>(&mut self, run: [T; N], first: u64, step: u64) {
        let least = run[1..].iter().fold(run[0], |least, &value| least.least(value));
        if self.beaten_by(least) {
            let at = if INDEX {
                run.iter().position(|&value| same_key(value, least)).unwrap_or(0)
            } else {
                0
            };
            self.value = least;
            self.index = first + at as u64 * step;
        }
    }

    /// Combines with a state over other elements, in any order: NaN first, then the
    /// smaller value, then (with indices) the smaller index.
    #[inline(always)]
    pub fn merge(self, other: Self) -> Self {
        if other.is_empty() {
            return self;
        }
        if self.is_empty() {
            return other;
        }
        let (a, b) = (self.value.key(), other.value.key());
        let other_wins = if INDEX {
            (is_nan(b) && (!is_nan(a) || other.index < self.index))
                || (!is_nan(a) && (b < a || (b == a && other.index < self.index)))
        } else {
            (is_nan(b) && !is_nan(a)) || b < a
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
