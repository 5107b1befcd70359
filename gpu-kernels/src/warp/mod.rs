//! Warp-wide collectives built on the device layer's shuffles.

use crate::device::{Shuffle, WARP_SIZE};

/// Combines the 32 lanes' values with `op` by a butterfly (xor) exchange; every lane
/// returns the result. `op` must be associative and commutative; five shuffles.
///
/// All 32 lanes of the warp must call it together.
#[inline(always)]
pub fn reduce<T: Shuffle>(value: T, op: impl Fn(T, T) -> T) -> T {
    reduce_groups(value, WARP_SIZE, op)
}

/// Combines the values of each aligned group of `lanes` lanes (a power of two up to
/// 32) with `op` by a butterfly exchange, in the same order on every run; every lane
/// returns its group's result. `op` must be associative and commutative.
///
/// All 32 lanes of the warp must call it together, with the same `lanes`.
#[inline(always)]
pub fn reduce_groups<T: Shuffle>(mut value: T, lanes: u32, op: impl Fn(T, T) -> T) -> T {
    let mut mask = WARP_SIZE / 2;
    while mask > 0 {
        if mask < lanes {
            value = op(value, value.shfl_xor(mask));
        }
        mask /= 2;
    }
    value
}
