//! The tensor cores through `mma.sync` (sm_80 and up), and the per-thread copies from
//! global to shared memory (`cp.async`) that feed them while they work.

use core::arch::asm;

/// `value` rounded to TF32 (10 explicit mantissa bits, to nearest), as the bits of an
/// f32. On sm_90 and up `cvt.rn.tf32.f32` (ties to even), one instruction (`F2FP`);
/// before, `cvt.rna.tf32.f32` (ties away from zero), which ptxas expands to a compare
/// and a predicated add whose predicates serialize long runs of conversions.
#[inline(always)]
pub fn to_tf32(value: f32) -> u32 {
    let bits: u32;
    // SAFETY: a register conversion; no memory is touched.
    unsafe {
        #[cfg(target_feature = "sm_90")]
        asm!(
            "cvt.rn.tf32.f32 {b}, {v};",
            b = out(reg32) bits,
            v = in(reg32) value,
            options(pure, nomem, nostack),
        );
        #[cfg(not(target_feature = "sm_90"))]
        asm!(
            "cvt.rna.tf32.f32 {b}, {v};",
            b = out(reg32) bits,
            v = in(reg32) value,
            options(pure, nomem, nostack),
        );
    }
    bits
}

/// `d = a b + c` for one 16 x 8 x 8 TF32 tile of the warp, FP32 accumulation:
/// `mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32`. With lane `4 g + t`: a holds
/// A (16 x 8) at (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4); b holds B (8 x 8) at
/// (t, g), (t + 4, g); c and d hold C (16 x 8) at (g, 2t), (g, 2t + 1), (g + 8, 2t),
/// (g + 8, 2t + 1). A and B are TF32 bits ([`to_tf32`]).
///
/// All 32 lanes of the warp must call it together (converged).
#[inline(always)]
pub fn mma_tf32_16x8x8(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
    let (d0, d1, d2, d3): (f32, f32, f32, f32);
    // SAFETY: a warp-wide register operation with no memory access; every lane
    // executes it (the caller's contract).
    unsafe {
        asm!(
            "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {{{d0}, {d1}, {d2}, {d3}}}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {{{c0}, {c1}, {c2}, {c3}}};",
            d0 = out(reg32) d0, d1 = out(reg32) d1, d2 = out(reg32) d2, d3 = out(reg32) d3,
            a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
            b0 = in(reg32) b[0], b1 = in(reg32) b[1],
            c0 = in(reg32) c[0], c1 = in(reg32) c[1], c2 = in(reg32) c[2], c3 = in(reg32) c[3],
            options(pure, nomem, nostack),
        )
    };
    [d0, d1, d2, d3]
}

/// `mma.sync` on one 16 x 8 x 16 tile of 16-bit operands of type `$ty`.
macro_rules! mma_16_bit {
    ($(#[$meta:meta])* $name:ident, $ty:literal) => {
        $(#[$meta])*
        #[inline(always)]
        pub fn $name(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
            let (d0, d1, d2, d3): (f32, f32, f32, f32);
            // SAFETY: a warp-wide register operation with no memory access; every lane
            // executes it (the caller's contract).
            unsafe {
                asm!(
                    concat!("mma.sync.aligned.m16n8k16.row.col.f32.", $ty, ".", $ty, ".f32 {{{d0}, {d1}, {d2}, {d3}}}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {{{c0}, {c1}, {c2}, {c3}}};"),
                    d0 = out(reg32) d0, d1 = out(reg32) d1, d2 = out(reg32) d2, d3 = out(reg32) d3,
                    a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
                    b0 = in(reg32) b[0], b1 = in(reg32) b[1],
                    c0 = in(reg32) c[0], c1 = in(reg32) c[1], c2 = in(reg32) c[2], c3 = in(reg32) c[3],
                    options(pure, nomem, nostack),
                )
            };
            [d0, d1, d2, d3]
        }
    };
}

mma_16_bit!(
    /// `d = a b + c` for one 16 x 8 x 16 tile of the warp with bf16 operands, FP32
    /// accumulation: `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32` (sm_80 and
    /// up). Each operand register holds two elements adjacent along K, the first in its
    /// low half. With lane `4 g + t`: a holds A (16 x 16) at rows g, g + 8, g, g + 8 and
    /// columns 2t, 2t, 2t + 8, 2t + 8 (and the column after each); b holds B (16 x 8)
    /// at rows 2t and 2t + 8 (and the row after each), column g; c and d as in
    /// [`mma_tf32_16x8x8`].
    ///
    /// All 32 lanes of the warp must call it together (converged).
    mma_bf16_16x8x16,
    "bf16"
);
mma_16_bit!(
    /// [`mma_bf16_16x8x16`] with f16 operands.
    mma_f16_16x8x16,
    "f16"
);

/// Four 8 x 8 matrices of 16-bit elements (8 rows of 16 bytes each) from shared
/// memory: `ldmatrix.sync.aligned.m8n8.x4.shared.b16`. Lane `i` gives the shared-window
/// address of row `i % 8` of matrix `i / 8`; every lane receives word `lane % 4` of row
/// `lane / 4` of each matrix, which for 32-bit elements (TF32) is the element at (row
/// `lane / 4`, column `lane % 4`) of an 8 x 4 matrix.
///
/// # Safety
/// All 32 lanes of the warp call it together; every address is 16-byte aligned inside
/// the launch's dynamic shared memory, written before a barrier that the warp passed.
#[inline(always)]
pub unsafe fn load_matrix_x4(address: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the caller guarantees the addresses and the convergence.
    unsafe {
        asm!(
            "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{{a}, {b}, {c}, {d}}}, [{p}];",
            p = in(reg32) address,
            a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
            options(readonly, nostack),
        )
    };
    [a, b, c, d]
}

/// [`load_matrix_x4`] transposed: every lane receives, of each matrix, the elements
/// (row `2 (lane % 4)`, column `lane / 4`) and (row `2 (lane % 4) + 1`, the same
/// column) in one word, the first in its low half:
/// `ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16`.
///
/// # Safety
/// As [`load_matrix_x4`].
#[inline(always)]
pub unsafe fn load_matrix_x4_transposed(address: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the caller guarantees the addresses and the convergence.
    unsafe {
        asm!(
            "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{{a}, {b}, {c}, {d}}}, [{p}];",
            p = in(reg32) address,
            a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
            options(readonly, nostack),
        )
    };
    [a, b, c, d]
}

/// Two 8 x 8 matrices of 16-bit elements from shared memory, as
/// [`load_matrix_x4`] with lanes 0 to 15 giving the addresses (the others' are
/// ignored): `ldmatrix.sync.aligned.m8n8.x2.shared.b16`.
///
/// # Safety
/// As [`load_matrix_x4`], for the addresses of lanes 0 to 15.
#[inline(always)]
pub unsafe fn load_matrix_x2(address: u32) -> [u32; 2] {
    let (a, b): (u32, u32);
    // SAFETY: the caller guarantees the addresses and the convergence.
    unsafe {
        asm!(
            "ldmatrix.sync.aligned.m8n8.x2.shared.b16 {{{a}, {b}}}, [{p}];",
            p = in(reg32) address,
            a = out(reg32) a, b = out(reg32) b,
            options(readonly, nostack),
        )
    };
    [a, b]
}

/// Starts copying `bytes` (4, 8 or 16, `BYTES`) from global `source` to the
/// shared-window address `destination`, of which the first `valid` bytes come from the
/// source and the rest are zero (`valid == 0`: zeros, nothing read): `cp.async` (16
/// bytes through L2 only, `.cg`; fewer through L1, `.ca`). The copy lands after
/// [`async_copy_wait`] for its group.
///
/// # Safety
/// `destination` is `BYTES`-aligned dynamic shared memory that no thread touches until
/// the wait; when `valid > 0`, `source` is `BYTES`-aligned and its first `valid` bytes
/// are readable global memory.
#[inline(always)]
pub unsafe fn async_copy<const BYTES: u32>(destination: u32, source: *const u8, valid: u32) {
    // SAFETY: the caller guarantees both ranges; with `valid == 0` nothing is read.
    unsafe {
        if BYTES == 16 {
            asm!(
                "cvta.to.global.u64 {s}, {s};",
                "cp.async.cg.shared.global [{d}], [{s}], 16, {n};",
                d = in(reg32) destination,
                s = inout(reg64) source as u64 => _,
                n = in(reg32) valid,
                options(nostack),
            )
        } else {
            asm!(
                "cvta.to.global.u64 {s}, {s};",
                "cp.async.ca.shared.global [{d}], [{s}], {bytes}, {n};",
                d = in(reg32) destination,
                s = inout(reg64) source as u64 => _,
                bytes = const BYTES,
                n = in(reg32) valid,
                options(nostack),
            )
        }
    };
}

/// [`async_copy`] of 16 bytes kept in L1 too (`cp.async.ca`), for data that
/// neighbouring copies read again soon.
///
/// # Safety
/// As [`async_copy`] with `BYTES == 16`.
#[inline(always)]
pub unsafe fn async_copy_cached(destination: u32, source: *const u8, valid: u32) {
    // SAFETY: the caller guarantees both ranges; with `valid == 0` nothing is read.
    unsafe {
        asm!(
            "cvta.to.global.u64 {s}, {s};",
            "cp.async.ca.shared.global [{d}], [{s}], 16, {n};",
            d = in(reg32) destination,
            s = inout(reg64) source as u64 => _,
            n = in(reg32) valid,
            options(nostack),
        )
    };
}

/// Closes the group of this thread's copies started since the last commit.
#[inline(always)]
pub fn async_copy_commit() {
    // SAFETY: bookkeeping of this thread's own copies.
    unsafe { asm!("cp.async.commit_group;", options(nostack)) };
}

/// Waits until at most `PENDING` of this thread's committed groups are still in flight.
/// A block barrier after it makes every thread's landed copies visible to all.
#[inline(always)]
pub fn async_copy_wait<const PENDING: u32>() {
    // SAFETY: waits on this thread's own copies.
    unsafe { asm!("cp.async.wait_group {n};", n = const PENDING, options(nostack)) };
}
