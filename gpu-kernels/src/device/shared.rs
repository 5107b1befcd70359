//! Dynamic shared memory, carved into typed regions.
//!
//! The kernel owns one dynamic allocation (its size is the launch's shared-memory byte
//! count) and hands out aligned regions from it; regions of different phases may reuse
//! the same bytes between barriers.

use core::arch::{asm, global_asm};
use core::mem::{align_of, size_of};

global_asm!(".extern .shared .align 16 .b8 DYN_SMEM[];");

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
