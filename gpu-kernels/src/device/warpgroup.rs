//! Warpgroup MMA (`wgmma`, sm_90a): four warps multiply A, from their registers or
//! from shared memory, by B, which the tensor cores read from shared memory through a
//! matrix descriptor, asynchronously, into registers.

use core::arch::asm;

/// The descriptor of a K-major operand tile in shared memory whose rows are 128 bytes
/// (32 TF32), stored with the 128-byte swizzle: 16-byte chunk `c` of row `r` at chunk
/// `c ^ (r % 8)`, groups of 8 rows 1024 bytes apart, from a 1024-byte-aligned tile.
/// `address` is the shared-window address of the first row of the operand, plus
/// `4 k` bytes to start at column k (a multiple of 8) of the rows.
#[inline(always)]
pub fn swizzled_k_major_descriptor(address: u32) -> u64 {
    const SWIZZLE_128B: u64 = 1 << 62;
    const ROW_GROUP_BYTES: u64 = 1024;
    // The leading-dimension offset is unused for K-major swizzled operands of one
    // swizzle width; 1 (16 bytes) is the conventional value.
    ((address as u64 & 0x3ffff) >> 4) | (1 << 16) | ((ROW_GROUP_BYTES >> 4) << 32) | SWIZZLE_128B
}

/// The descriptor of an MN-major 16-bit operand tile in shared memory (`wgmma`'s
/// transposed layout): per K a row of 128 bytes holding 64 consecutive M (or N)
/// elements, stored with the 128-byte swizzle as a bulk copy of such rows lands them,
/// groups of 8 rows 1024 bytes apart, from a 1024-byte-aligned tile; further blocks of
/// 64 M (or N) `block_bytes` apart. `address` is the shared-window address of the
/// operand's first row, plus 2048 bytes per step of 16 K.
#[inline(always)]
pub fn swizzled_mn_major_descriptor(address: u32, block_bytes: u32) -> u64 {
    const SWIZZLE_128B: u64 = 1 << 62;
    const ROW_GROUP_BYTES: u64 = 1024;
    ((address as u64 & 0x3ffff) >> 4)
        | ((block_bytes as u64 >> 4) << 16)
        | ((ROW_GROUP_BYTES >> 4) << 32)
        | SWIZZLE_128B
}

/// Orders this thread's earlier generic-proxy writes to shared memory (stores, landed
/// `cp.async` copies) before later reads by the async proxy (`wgmma`):
/// `fence.proxy.async.shared::cta`.
#[inline(always)]
pub fn fence_async_shared() {
    // SAFETY: a memory fence; it accesses nothing.
    unsafe { asm!("fence.proxy.async.shared::cta;", options(nostack)) };
}

/// Orders the warpgroup's register and shared-memory accesses before the `wgmma`s that
/// follow: `wgmma.fence.sync.aligned`. Needed before the first `wgmma` of a batch.
///
/// # Safety
/// All threads of the warpgroup call it together.
#[inline(always)]
pub unsafe fn warpgroup_fence() {
    // SAFETY: the caller guarantees the warpgroup converges here.
    unsafe { asm!("wgmma.fence.sync.aligned;", options(nostack)) };
}

/// Closes the batch of `wgmma`s issued since the last commit.
///
/// # Safety
/// All threads of the warpgroup call it together.
#[inline(always)]
pub unsafe fn warpgroup_commit() {
    // SAFETY: as above.
    unsafe { asm!("wgmma.commit_group.sync.aligned;", options(nostack)) };
}

/// Waits until at most `PENDING` of the warpgroup's committed batches are in flight;
/// the accumulators of the finished ones may then be read and their operands reused.
///
/// # Safety
/// All threads of the warpgroup call it together.
#[inline(always)]
pub unsafe fn warpgroup_wait<const PENDING: u32>() {
    // SAFETY: as above.
    unsafe { asm!("wgmma.wait_group.sync.aligned {n};", n = const PENDING, options(nostack)) };
}

/// Gives the warpgroup `COUNT` registers per thread from here on (a multiple of 8, 24
/// to 256): `setmaxnreg.inc` when `INCREASE` (waits until the block has released
/// enough), else `setmaxnreg.dec`. Warpgroups that need few registers give theirs to
/// those that need many.
///
/// # Safety
/// All threads of the warpgroup call it together; the block's warpgroups together
/// never ask for more registers than the block was launched with.
#[inline(always)]
pub unsafe fn set_max_registers<const INCREASE: bool, const COUNT: u32>() {
    // SAFETY: the caller guarantees the convergence and the register budget.
    unsafe {
        if INCREASE {
            asm!("setmaxnreg.inc.sync.aligned.u32 {n};", n = const COUNT, options(nostack))
        } else {
            asm!("setmaxnreg.dec.sync.aligned.u32 {n};", n = const COUNT, options(nostack))
        }
    };
}

/// Calls macro `$m` with `$args` and then the indices 0 to 63 (`wide`), 0 to 95
/// (`n192`), 0 to 127 (`n256`) or 0 to 31 (`narrow`) of the accumulators of an
/// m64n128, m64n192, m64n256 or m64n64 `wgmma` (per thread), so that the lists are
/// written once.
macro_rules! with_accumulator_indices {
    (narrow, $m:ident!($($args:tt)*)) => {
        $m!($($args)* 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31)
    };
    (n192, $m:ident!($($args:tt)*)) => {
        $m!($($args)* 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95)
    };
    (n256, $m:ident!($($args:tt)*)) => {
        $m!($($args)* 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 127)
    };
    (wide, $m:ident!($($args:tt)*)) => {
        $m!($($args)* 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63)
    };
}

/// `asm!` over the accumulators `$acc[i / 4][i % 4]` of the listed indices, bound to
/// `{0}`, `{1}`, .., with the text `$before`, the accumulator list `{{{0}, ..}}` and then
/// `$after`.
macro_rules! asm_on_accumulators {
    ($acc:ident, $before:expr, $after:expr, [$($operands:tt)*], $first:literal $(, $i:literal)*) => {
        asm!(
            concat!($before, "{{", "{", $first, "}" $(, ", {", $i, "}")*, "}}", $after),
            inout(reg32) $acc[$first / 4][$first % 4],
            $( inout(reg32) $acc[$i / 4][$i % 4], )*
            $($operands)*
        )
    };
}

/// The accumulators of one m64nNk8 `wgmma` per thread: `N / 8` tiles of four, for N
/// 128 (`[[f32; 4]; 16]`), 192 (`[[f32; 4]; 24]`), 256 (`[[f32; 4]; 32]`) and 64
/// (`[[f32; 4]; 8]`).
pub trait WarpgroupAccumulators {
    /// Pins the accumulators' values to this point of the program: the compiler may
    /// not move their definitions after it (an empty assembly block that reads and
    /// writes each). Called after the sums are initialized and before the first
    /// [`warpgroup_fence`] of a tile, so that no copy into an accumulator lands among
    /// the `wgmma`s, where ptxas would have to wait for the ones in flight.
    fn pin(&mut self);

    /// `self += A B^T` for the warpgroup, asynchronously: A 64 x 8 from the threads'
    /// registers (TF32 bits, [`to_tf32`](super::to_tf32)) and B N x 8 (TF32, K-major,
    /// from a descriptor), `wgmma.mma_async.sync.aligned.m64nNk8.f32.tf32.tf32`. Warp
    /// `w` of the group holds rows `16 w ..`: with lane `4 g + t`, `a` holds A at
    /// (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4) (as
    /// [`load_matrix_x4`](super::load_matrix_x4) reads them), and `self[j]` holds
    /// (g, 8j + 2t), (g, 8j + 2t + 1), (g + 8, 8j + 2t), (g + 8, 8j + 2t + 1). B's
    /// elements are read as TF32 (the low mantissa bits ignored), so they should be
    /// TF32 values already.
    ///
    /// # Safety
    /// All threads of the warpgroup call it together, after [`warpgroup_fence`]; the
    /// descriptor addresses an operand written before a barrier and
    /// [`fence_async_shared`]; neither it, `a` nor the accumulators are touched until
    /// [`warpgroup_wait`] says the batch is done.
    unsafe fn multiply_tf32(&mut self, a: [u32; 4], b: u64);

    /// `self += A B^T` as [`multiply_tf32`](Self::multiply_tf32), A 64 x 8 also from
    /// shared memory through a descriptor (K-major, as B), read as TF32 as B is (so
    /// both should be TF32 values already: a bulk copy through a
    /// [`TensorMapElement::Tf32`](crate::tensor_map::TensorMapElement::Tf32) map rounds
    /// them on the way).
    ///
    /// # Safety
    /// As [`multiply_tf32`](Self::multiply_tf32), for both descriptors.
    unsafe fn multiply_tf32_shared(&mut self, a: u64, b: u64);

    /// `self += A B^T` as [`multiply_tf32_shared`](Self::multiply_tf32_shared) with A
    /// 64 x 16 and B N x 16 of bf16 (both K-major, through descriptors; the same 32
    /// bytes of each row as a TF32 step), `wgmma...m64nNk16.f32.bf16.bf16`.
    ///
    /// # Safety
    /// As [`multiply_tf32`](Self::multiply_tf32), for both descriptors.
    unsafe fn multiply_bf16_shared(&mut self, a: u64, b: u64);

    /// [`multiply_bf16_shared`](Self::multiply_bf16_shared) of f16 operands.
    ///
    /// # Safety
    /// As [`multiply_tf32`](Self::multiply_tf32), for both descriptors.
    unsafe fn multiply_f16_shared(&mut self, a: u64, b: u64);

    /// [`multiply_bf16_shared`](Self::multiply_bf16_shared) with both operands
    /// MN-major ([`swizzled_mn_major_descriptor`]): A stored by K rows of M, B by K
    /// rows of N.
    ///
    /// # Safety
    /// As [`multiply_tf32`](Self::multiply_tf32), for both descriptors.
    unsafe fn multiply_bf16_shared_mn_major(&mut self, a: u64, b: u64);

    /// [`multiply_bf16_shared_mn_major`](Self::multiply_bf16_shared_mn_major) of f16
    /// operands.
    ///
    /// # Safety
    /// As [`multiply_tf32`](Self::multiply_tf32), for both descriptors.
    unsafe fn multiply_f16_shared_mn_major(&mut self, a: u64, b: u64);
}

/// The text of a TF32 `wgmma` of shape `$shape` (as "m64n128k8") up to its list of
/// accumulators: a scope whose `accumulate` predicate is set (the sums are added to).
macro_rules! wgmma_tf32_opening {
    ($shape:literal) => {
        concat!(
            "{{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, 1, 0;\nwgmma.mma_async.sync.aligned.",
            $shape,
            ".f32.tf32.tf32 "
        )
    };
}

/// The text of a 16-bit `wgmma` of shape `$shape` (as "m64n128k16") on `$kind`
/// operands, up to its list of accumulators, as [`wgmma_tf32_opening`].
macro_rules! wgmma_16_bit_opening {
    ($shape:literal, $kind:literal) => {
        concat!(
            "{{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, 1, 0;\nwgmma.mma_async.sync.aligned.",
            $shape,
            ".f32.",
            $kind,
            ".",
            $kind,
            " "
        )
    };
}

/// The method `$method` of the accumulators of width `$width`: a `wgmma` of both
/// operands through descriptors, its text `$opening` up to the accumulators' list and
/// `$tail` after it.
macro_rules! multiply_shared {
    ($width:ident, $method:ident, $opening:expr, $tail:literal) => {
        #[inline(always)]
        unsafe fn $method(&mut self, a: u64, b: u64) {
            let acc = self;
            // SAFETY: the caller guarantees the convergence, the operands and the
            // accumulators.
            unsafe {
                with_accumulator_indices!($width, asm_on_accumulators!(
                    acc,
                    $opening,
                    $tail,
                    [a = in(reg64) a, b = in(reg64) b, options(nostack),],
                ))
            };
        }
    };
}

/// The trait for the accumulators of one width, its `wgmma` shapes (K 8 and 16) and
/// index list.
macro_rules! warpgroup_accumulators {
    ($tiles:literal, $width:ident, $shape:literal, $shape16:literal) => {
        impl WarpgroupAccumulators for [[f32; 4]; $tiles] {
            #[inline(always)]
            fn pin(&mut self) {
                let acc = self;
                // SAFETY: a comment naming the registers; no instruction.
                unsafe {
                    with_accumulator_indices!($width, asm_on_accumulators!(acc, "// pinned ", "", [options(nostack),],))
                };
            }

            #[inline(always)]
            unsafe fn multiply_tf32(&mut self, a: [u32; 4], b: u64) {
                let acc = self;
                // SAFETY: the caller guarantees the convergence, the operands and the
                // accumulators.
                unsafe {
                    with_accumulator_indices!($width, asm_on_accumulators!(
                        acc,
                        wgmma_tf32_opening!($shape),
                        ", {{{a0}, {a1}, {a2}, {a3}}}, {b}, accumulate, 1, 1;\n}}",
                        [
                            a0 = in(reg32) a[0],
                            a1 = in(reg32) a[1],
                            a2 = in(reg32) a[2],
                            a3 = in(reg32) a[3],
                            b = in(reg64) b,
                            options(nostack),
                        ],
                    ))
                };
            }

            multiply_shared!($width, multiply_tf32_shared, wgmma_tf32_opening!($shape), ", {a}, {b}, accumulate, 1, 1;\n}}");
            // Both operands K-major (no transpose).
            multiply_shared!(
                $width,
                multiply_bf16_shared,
                wgmma_16_bit_opening!($shape16, "bf16"),
                ", {a}, {b}, accumulate, 1, 1, 0, 0;\n}}"
            );
            multiply_shared!(
                $width,
                multiply_f16_shared,
                wgmma_16_bit_opening!($shape16, "f16"),
                ", {a}, {b}, accumulate, 1, 1, 0, 0;\n}}"
            );
            // Both operands MN-major (transposed).
            multiply_shared!(
                $width,
                multiply_bf16_shared_mn_major,
                wgmma_16_bit_opening!($shape16, "bf16"),
                ", {a}, {b}, accumulate, 1, 1, 1, 1;\n}}"
            );
            multiply_shared!(
                $width,
                multiply_f16_shared_mn_major,
                wgmma_16_bit_opening!($shape16, "f16"),
                ", {a}, {b}, accumulate, 1, 1, 1, 1;\n}}"
            );
        }
    };
}

warpgroup_accumulators!(16, wide, "m64n128k8", "m64n128k16");
warpgroup_accumulators!(8, narrow, "m64n64k8", "m64n64k16");
warpgroup_accumulators!(24, n192, "m64n192k8", "m64n192k16");
warpgroup_accumulators!(32, n256, "m64n256k8", "m64n256k16");
