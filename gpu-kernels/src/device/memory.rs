//! 128-bit global memory access.

use core::arch::asm;

/// Loads four 32-bit words through the read-only (non-coherent) cache path:
/// `ld.global.nc.v4.u32`.
///
/// # Safety
/// `ptr` must point to 16 readable, 16-byte-aligned bytes of global memory that no thread
/// writes while the kernel runs.
#[inline(always)]
pub unsafe fn load_global_nc_v4(ptr: *const u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the caller guarantees a valid, aligned, read-only global address.
    unsafe {
        asm!(
            "cvta.to.global.u64 {p}, {p};",
            "ld.global.nc.v4.u32 {{{a}, {b}, {c}, {d}}}, [{p}];",
            p = inout(reg64) ptr as u64 => _,
            a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
            options(pure, readonly, nostack),
        )
    };
    [a, b, c, d]
}

/// Stores four 32-bit words: `st.global.v4.u32`.
///
/// # Safety
/// `ptr` must point to 16 writable, 16-byte-aligned bytes of global memory.
#[inline(always)]
pub unsafe fn store_global_v4(ptr: *mut u32, v: [u32; 4]) {
    // SAFETY: the caller guarantees a valid, aligned, writable global address.
    unsafe {
        asm!(
            "cvta.to.global.u64 {p}, {p};",
            "st.global.v4.u32 [{p}], {{{a}, {b}, {c}, {d}}};",
            p = inout(reg64) ptr as u64 => _,
            a = in(reg32) v[0], b = in(reg32) v[1], c = in(reg32) v[2], d = in(reg32) v[3],
            options(nostack),
        )
    };
}
