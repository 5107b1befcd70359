//! Warp-wide collectives built on the device layer's shuffles.

use crate::device::{Shuffle, WARP_SIZE};

/// Combines the 32 lanes' values with `op` by a butterfly (xor) exchange; every lane
/// returns the result. `op` must be associative and commutative; five shuffles.
///
/// All 32 lanes of the warp must call it together.
#[inline(always)]
pub fn reduce<T: Shuffle>(mut value: T, op: impl Fn(T, T) -> T) -> T {
    let mut mask = WARP_SIZE / 2;
    while mask > 0 {
        value = op(value, value.shfl_xor(mask));
        mask /= 2;
    }
    value
}
