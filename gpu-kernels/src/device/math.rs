//! Arithmetic the kernels need beyond `core`'s operators.

/// `a * b + c` with one rounding (`fma.rn.f32`).
#[inline(always)]
pub fn fma_f32(a: f32, b: f32, c: f32) -> f32 {
    core::intrinsics::fmaf32(a, b, c)
}

/// `a * b + c` with one rounding (`fma.rn.f64`).
#[inline(always)]
pub fn fma_f64(a: f64, b: f64, c: f64) -> f64 {
    core::intrinsics::fmaf64(a, b, c)
}

/// `2^x`, to about 2 ulp (`ex2.approx.f32`).
#[inline(always)]
pub fn exp2_approx(x: f32) -> f32 {
    let y: f32;
    // SAFETY: a register operation; no memory is touched.
    unsafe {
        core::arch::asm!(
            "ex2.approx.f32 {y}, {x};",
            y = out(reg32) y,
            x = in(reg32) x,
            options(pure, nomem, nostack),
        )
    };
    y
}

/// `1 / x`, to about 1 ulp (`rcp.approx.f32`): one instruction, where `/` is a long
/// sequence with a slow path.
#[inline(always)]
pub fn reciprocal_approx(x: f32) -> f32 {
    let y: f32;
    // SAFETY: a register operation; no memory is touched.
    unsafe {
        core::arch::asm!(
            "rcp.approx.f32 {y}, {x};",
            y = out(reg32) y,
            x = in(reg32) x,
            options(pure, nomem, nostack),
        )
    };
    y
}
