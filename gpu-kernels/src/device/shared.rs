//! Dynamic shared memory, carved into typed regions.
//!
//! The kernel owns one dynamic allocation (its size is the launch's shared-memory byte
//! count) and hands out aligned regions from it; regions of different phases may reuse
//! the same bytes between barriers.

use super::VectorElement;
use core::arch::{asm, global_asm};
use core::mem::{align_of, size_of};

// Aligned for the 128-byte swizzle of `wgmma` operands, whose pattern repeats every
// 1024 bytes of address.
global_asm!(".extern .shared .align 1024 .b8 DYN_SMEM[];");

/// Hands out consecutive, aligned regions of the block's dynamic shared memory.
pub struct SharedCarver {
    next: usize,
}

impl SharedCarver {
    /// Starts at the beginning of the dynamic shared memory.
    #[inline(always)]
    pub fn new() -> Self {
        let base: u64;
        // SAFETY: converts the address of the module's shared symbol to a generic
        // pointer; nothing is read or written.
        unsafe { asm!("cvta.shared.u64 {0}, DYN_SMEM;", out(reg64) base, options(pure, nomem, nostack)) };
        Self { next: base as usize }
    }

    /// The next `len` elements of `T`, aligned for `T`.
    ///
    /// # Safety
    /// The launch must have requested at least the bytes carved so far, and the caller
    /// must order accesses to the region across threads with barriers.
    #[inline(always)]
    pub unsafe fn take<T>(&mut self, len: usize) -> *mut T {
        let start = self.next.next_multiple_of(align_of::<T>());
        self.next = start + len * size_of::<T>();
        start as *mut T
    }
}

impl Default for SharedCarver {
    fn default() -> Self {
        Self::new()
    }
}

/// The `.shared`-window address (32 bits) of the start of the dynamic shared memory.
/// Addresses from it are used with [`load_shared_v4_f32`] and [`store_shared_f32`],
/// which the hardware resolves without the generic-to-shared check.
#[inline(always)]
pub fn shared_base() -> u32 {
    let base: u32;
    // SAFETY: reads the address of the module's shared symbol; nothing is accessed.
    unsafe { asm!("mov.u32 {0}, DYN_SMEM;", out(reg32) base, options(pure, nomem, nostack)) };
    base
}

/// Loads four `f32` from shared memory: `ld.shared.v4.f32`.
///
/// # Safety
/// `address` is 16-byte aligned and inside the launch's dynamic shared memory, and the
/// caller orders the read after the writes it depends on with a barrier.
#[inline(always)]
pub unsafe fn load_shared_v4_f32(address: u32) -> [f32; 4] {
    let (a, b, c, d): (f32, f32, f32, f32);
    // SAFETY: the caller guarantees an aligned address inside the shared allocation.
    unsafe {
        asm!(
            "ld.shared.v4.f32 {{{a}, {b}, {c}, {d}}}, [{p}];",
            p = in(reg32) address,
            a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
            options(pure, readonly, nostack),
        )
    };
    [a, b, c, d]
}

/// Loads one `f32` from shared memory: `ld.shared.f32`.
///
/// # Safety
/// As [`load_shared_v4_f32`], with 4-byte alignment.
#[inline(always)]
pub unsafe fn load_shared_f32(address: u32) -> f32 {
    let value: f32;
    // SAFETY: the caller guarantees an aligned address inside the shared allocation.
    unsafe {
        asm!(
            "ld.shared.f32 {v}, [{p}];",
            p = in(reg32) address,
            v = out(reg32) value,
            options(pure, readonly, nostack),
        )
    };
    value
}

/// Loads one 32-bit word from shared memory: `ld.shared.b32`.
///
/// # Safety
/// As [`load_shared_v4_f32`], with 4-byte alignment.
#[inline(always)]
pub unsafe fn load_shared_u32(address: u32) -> u32 {
    let value: u32;
    // SAFETY: the caller guarantees an aligned address inside the shared allocation.
    unsafe {
        asm!(
            "ld.shared.b32 {v}, [{p}];",
            p = in(reg32) address,
            v = out(reg32) value,
            options(pure, readonly, nostack),
        )
    };
    value
}

/// Loads one 16-bit value from shared memory: `ld.shared.b16`.
///
/// # Safety
/// As [`load_shared_v4_f32`], with 2-byte alignment.
#[inline(always)]
pub unsafe fn load_shared_u16(address: u32) -> u16 {
    let value: u16;
    // SAFETY: the caller guarantees an aligned address inside the shared allocation.
    unsafe {
        asm!(
            "ld.shared.b16 {v}, [{p}];",
            p = in(reg32) address,
            v = out(reg16) value,
            options(pure, readonly, nostack),
        )
    };
    value
}

/// Loads one 2-, 4- or 8-byte element from shared memory (`ld.shared.b16`, `.b32`, or
/// two `.b32` for 8 bytes, which need only 4-byte alignment that way).
///
/// # Safety
/// As [`load_shared_v4_f32`], with the element's alignment.
#[inline(always)]
pub unsafe fn load_shared_element<T: VectorElement>(address: u32) -> T {
    // SAFETY: forwarded from the caller.
    let words = unsafe {
        match T::PER_VECTOR {
            8 => [load_shared_u16(address) as u32, 0, 0, 0],
            4 => [load_shared_u32(address), 0, 0, 0],
            _ => [load_shared_u32(address), load_shared_u32(address + 4), 0, 0],
        }
    };
    T::from_words(words, 0)
}

/// Stores one 16-bit value to shared memory: `st.shared.b16`.
///
/// # Safety
/// `address` is 2-byte aligned and inside the launch's dynamic shared memory, and no
/// other thread accesses it before the next barrier.
#[inline(always)]
pub unsafe fn store_shared_u16(address: u32, value: u16) {
    // SAFETY: the caller guarantees an aligned address inside the shared allocation.
    unsafe {
        asm!("st.shared.b16 [{p}], {v};", p = in(reg32) address, v = in(reg16) value, options(nostack))
    };
}

/// Stores one `f32` to shared memory: `st.shared.f32`.
///
/// # Safety
/// `address` is 4-byte aligned and inside the launch's dynamic shared memory, and no
/// other thread accesses it before the next barrier.
#[inline(always)]
pub unsafe fn store_shared_f32(address: u32, value: f32) {
    // SAFETY: the caller guarantees an aligned address inside the shared allocation.
    unsafe {
        asm!("st.shared.f32 [{p}], {v};", p = in(reg32) address, v = in(reg32) value, options(nostack))
    };
}

/// Stores two `f32` to shared memory: `st.shared.v2.f32`.
///
/// # Safety
/// As [`store_shared_f32`], with 8-byte alignment.
#[inline(always)]
pub unsafe fn store_shared_v2_f32(address: u32, v: [f32; 2]) {
    // SAFETY: the caller guarantees an aligned address inside the shared allocation.
    unsafe {
        asm!(
            "st.shared.v2.f32 [{p}], {{{a}, {b}}};",
            p = in(reg32) address,
            a = in(reg32) v[0], b = in(reg32) v[1],
            options(nostack),
        )
    };
}

/// Stores four `f32` to shared memory: `st.shared.v4.f32`.
///
/// # Safety
/// As [`store_shared_f32`], with 16-byte alignment.
#[inline(always)]
pub unsafe fn store_shared_v4_f32(address: u32, v: [f32; 4]) {
    // SAFETY: the caller guarantees an aligned address inside the shared allocation.
    unsafe {
        asm!(
            "st.shared.v4.f32 [{p}], {{{a}, {b}, {c}, {d}}};",
            p = in(reg32) address,
            a = in(reg32) v[0], b = in(reg32) v[1], c = in(reg32) v[2], d = in(reg32) v[3],
            options(nostack),
        )
    };
}
