//! Global memory access: 128-bit vectors, and the ordered loads, stores, fences and
//! atomics that blocks use to talk to each other within one launch.

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

/// Loads two 32-bit words through the read-only (non-coherent) cache path:
/// `ld.global.nc.v2.u32`.
///
/// # Safety
/// `ptr` must point to 8 readable, 8-byte-aligned bytes of global memory that no thread
/// writes while the kernel runs.
#[inline(always)]
pub unsafe fn load_global_nc_v2(ptr: *const u32) -> [u32; 2] {
    let (a, b): (u32, u32);
    // SAFETY: the caller guarantees a valid, aligned, read-only global address.
    unsafe {
        asm!(
            "cvta.to.global.u64 {p}, {p};",
            "ld.global.nc.v2.u32 {{{a}, {b}}}, [{p}];",
            p = inout(reg64) ptr as u64 => _,
            a = out(reg32) a, b = out(reg32) b,
            options(pure, readonly, nostack),
        )
    };
    [a, b]
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

/// Stores two `f32`: `st.global.v2.f32`.
///
/// # Safety
/// `ptr` must point to 8 writable, 8-byte-aligned bytes of global memory.
#[inline(always)]
pub unsafe fn store_global_v2_f32(ptr: *mut f32, v: [f32; 2]) {
    // SAFETY: the caller guarantees a valid, aligned, writable global address.
    unsafe {
        asm!(
            "cvta.to.global.u64 {p}, {p};",
            "st.global.v2.f32 [{p}], {{{a}, {b}}};",
            p = inout(reg64) ptr as u64 => _,
            a = in(reg32) v[0], b = in(reg32) v[1],
            options(nostack),
        )
    };
}

/// Loads four 32-bit words through the coherent path: `ld.global.v4.u32`. Use it where
/// the launch may write the same memory (in-place operations).
///
/// # Safety
/// `ptr` must point to 16 readable, 16-byte-aligned bytes of global memory.
#[inline(always)]
pub unsafe fn load_global_v4(ptr: *const u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the caller guarantees a valid, aligned global address.
    unsafe {
        asm!(
            "cvta.to.global.u64 {p}, {p};",
            "ld.global.v4.u32 {{{a}, {b}, {c}, {d}}}, [{p}];",
            p = inout(reg64) ptr as u64 => _,
            a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
            options(readonly, nostack),
        )
    };
    [a, b, c, d]
}

/// `fence.acq_rel.gpu`: orders this thread's earlier memory accesses before its later
/// ones for every thread of the GPU.
#[inline(always)]
pub fn fence_gpu() {
    // SAFETY: a fence has no operands and no preconditions.
    unsafe { asm!("fence.acq_rel.gpu;", options(nostack)) };
}

/// `atom.global.add.u32`, returning the old value.
///
/// # Safety
/// `ptr` must point to a 4-byte-aligned `u32` in global memory.
#[inline(always)]
pub unsafe fn atomic_add_u32(ptr: *mut u32, value: u32) -> u32 {
    let old: u32;
    // SAFETY: the caller guarantees a valid global address.
    unsafe {
        asm!(
            "cvta.to.global.u64 {p}, {p};",
            "atom.global.add.u32 {old}, [{p}], {v};",
            p = inout(reg64) ptr as u64 => _, v = in(reg32) value, old = out(reg32) old,
            options(nostack),
        )
    };
    old
}

/// `ld.acquire.gpu.u32`: later accesses of this thread see what the releasing writer
/// wrote before its release.
///
/// # Safety
/// `ptr` must point to a 4-byte-aligned `u32` in global memory.
#[inline(always)]
pub unsafe fn load_acquire_u32(ptr: *const u32) -> u32 {
    let value: u32;
    // SAFETY: the caller guarantees a valid global address.
    unsafe {
        asm!(
            "cvta.to.global.u64 {p}, {p};",
            "ld.acquire.gpu.global.u32 {v}, [{p}];",
            p = inout(reg64) ptr as u64 => _, v = out(reg32) value,
            options(nostack),
        )
    };
    value
}

/// `st.release.gpu.u32`: every access of this thread before it is visible to a thread
/// that acquires the value.
///
/// # Safety
/// `ptr` must point to a 4-byte-aligned `u32` in global memory.
#[inline(always)]
pub unsafe fn store_release_u32(ptr: *mut u32, value: u32) {
    // SAFETY: the caller guarantees a valid global address.
    unsafe {
        asm!(
            "cvta.to.global.u64 {p}, {p};",
            "st.release.gpu.global.u32 [{p}], {v};",
            p = inout(reg64) ptr as u64 => _, v = in(reg32) value,
            options(nostack),
        )
    };
}

/// A 4- or 8-byte value that blocks exchange through L2 (`ld`/`st.relaxed.gpu`,
/// never a stale L1 line).
pub trait Coherent: Copy {
    /// # Safety
    /// `ptr` must point to an aligned value in global memory.
    unsafe fn load_relaxed(ptr: *const Self) -> Self;
    /// # Safety
    /// `ptr` must point to an aligned value in global memory.
    unsafe fn store_relaxed(ptr: *mut Self, value: Self);
}

macro_rules! coherent {
    ($bits:literal, $reg:ident, $word:ty: $($t:ty => $to:expr, $from:expr;)*) => {$(
        impl Coherent for $t {
            #[inline(always)]
            unsafe fn load_relaxed(ptr: *const Self) -> Self {
                let word: $word;
                // SAFETY: the caller guarantees a valid, aligned global address.
                unsafe {
                    asm!(
                        "cvta.to.global.u64 {p}, {p};",
                        concat!("ld.relaxed.gpu.global.b", $bits, " {v}, [{p}];"),
                        p = inout(reg64) ptr as u64 => _, v = out($reg) word,
                        options(nostack),
                    )
                };
                $from(word)
            }
            #[inline(always)]
            unsafe fn store_relaxed(ptr: *mut Self, value: Self) {
                let word: $word = $to(value);
                // SAFETY: the caller guarantees a valid, aligned global address.
                unsafe {
                    asm!(
                        "cvta.to.global.u64 {p}, {p};",
                        concat!("st.relaxed.gpu.global.b", $bits, " [{p}], {v};"),
                        p = inout(reg64) ptr as u64 => _, v = in($reg) word,
                        options(nostack),
                    )
                };
            }
        }
    )*};
}

coherent!("32", reg32, u32:
    u32 => |v| v, |w| w;
    i32 => |v: i32| v as u32, |w: u32| w as i32;
    f32 => f32::to_bits, f32::from_bits;
);
coherent!("64", reg64, u64:
    u64 => |v| v, |w| w;
    i64 => |v: i64| v as u64, |w: u64| w as i64;
    f64 => f64::to_bits, f64::from_bits;
);
