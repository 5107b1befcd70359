//! The inner step of both convolution mainloops: an 8 x 8 block of FP32 products per
//! thread, from operands staged in shared memory.

use crate::device::{fma_f32, load_shared_v4_f32};

/// A thread's 8 x 8 accumulators.
pub type Accumulators = [[f32; 8]; 8];

/// Adds to `acc` the outer product of 8 values of A and 8 of B, each read from shared
/// memory as two 128-bit vectors: A's at the shared-window addresses `a` and `a +
/// second_a`, B's at `b` and `b + second_b`.
///
/// # Safety
/// The four vectors are 16-byte aligned and inside the launch's dynamic shared memory,
/// and a barrier published them.
#[inline(always)]
pub unsafe fn accumulate_outer_product(acc: &mut Accumulators, a: u32, second_a: u32, b: u32, second_b: u32) {
    // SAFETY: forwarded from the caller.
    let (a_lo, a_hi, b_lo, b_hi) = unsafe {
        (
            load_shared_v4_f32(a),
            load_shared_v4_f32(a + second_a),
            load_shared_v4_f32(b),
            load_shared_v4_f32(b + second_b),
        )
    };
    let av = [
        a_lo[0], a_lo[1], a_lo[2], a_lo[3], a_hi[0], a_hi[1], a_hi[2], a_hi[3],
    ];
    let bv = [
        b_lo[0], b_lo[1], b_lo[2], b_lo[3], b_hi[0], b_hi[1], b_hi[2], b_hi[3],
    ];
    for i in 0..8 {
        for j in 0..8 {
            acc[i][j] = fma_f32(av[i], bv[j], acc[i][j]);
        }
    }
}
