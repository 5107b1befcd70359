//! Warp-wide collectives built on the device layer's shuffles.

use crate::device::{Shuffle, WARP_SIZE, lane_id};

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

/// Combines each of `N` values (a power of two) over the warp's 32 lanes with `op`, by
/// exchanges that halve the values each lane carries: `N - 1` shuffles for `N <= 32`
/// (against `5 N` for `N` separate reductions), in the same order on every run.
/// Afterwards lane `l` holds the results of indices `reduced_first(N, l) + i` in
/// `values[i]` for `i < reduced_held(N)`; below 32 values, `32 / N` lanes hold each one
/// and [`reduced_writer`] picks one of them. `op` must be associative and commutative.
///
/// All 32 lanes of the warp must call it together.
#[inline(always)]
pub fn reduce_each<T: Shuffle, const N: usize>(values: &mut [T; N], op: impl Fn(T, T) -> T) {
    const { assert!(N.is_power_of_two()) };
    let lane = lane_id();
    // A counted loop, so that it unrolls and every index below is a constant.
    for step in 0..WARP_SIZE.trailing_zeros() {
        let mask = (WARP_SIZE / 2) >> step;
        let carried = N >> step;
        if carried > 1 {
            // The lanes with this bit set keep the upper half, the others the lower half;
            // each sends its partner the half the partner keeps.
            let half = carried / 2;
            let upper = lane & mask != 0;
            for i in 0..half {
                let (keep, give) = if upper {
                    (values[i + half], values[i])
                } else {
                    (values[i], values[i + half])
                };
                values[i] = op(keep, give.shfl_xor(mask));
            }
        } else {
            values[0] = op(values[0], values[0].shfl_xor(mask));
        }
    }
}

/// Halving steps of [`reduce_each`] over `n` values.
const fn halvings(n: usize) -> u32 {
    let steps = n.trailing_zeros();
    if steps < 5 { steps } else { 5 }
}

/// The index of the first result that lane `lane` holds after [`reduce_each`] of `n`
/// values: each halving step puts the upper half in the lanes with the step's bit set.
pub const fn reduced_first(n: usize, lane: u32) -> usize {
    let steps = halvings(n);
    (lane >> (5 - steps)) as usize * (n >> steps)
}

/// How many results each lane holds after [`reduce_each`] of `n` values.
pub const fn reduced_held(n: usize) -> usize {
    n >> halvings(n)
}

/// Whether lane `lane` is the first of the lanes that hold the same results after
/// [`reduce_each`] of `n` values.
pub const fn reduced_writer(n: usize, lane: u32) -> bool {
    lane & ((1 << (5 - halvings(n))) - 1) == 0
}
