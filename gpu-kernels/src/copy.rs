//! Device-to-device copy of 32-bit words: the bandwidth yardstick that the benchmark
//! measures every other kernel against.
//!
//! Each block copies one tile of `TILE_WORDS` words: every thread issues all its 128-bit
//! loads before its first store, so `VECTORS_PER_THREAD` loads per thread are in flight.
//! Words past the last whole vector are copied one by one by the thread whose vector
//! straddles the end.

use crate::launch::{DevicePtr, DevicePtrMut, Launch, LaunchGeometry, kernel_args};

/// Threads per block.
pub const BLOCK_THREADS: u32 = 256;
/// 128-bit vectors each thread moves.
pub const VECTORS_PER_THREAD: usize = 4;
/// Words in one vector.
pub const WORDS_PER_VECTOR: u64 = 4;
/// Words one block copies.
pub const TILE_WORDS: u64 = BLOCK_THREADS as u64 * VECTORS_PER_THREAD as u64 * WORDS_PER_VECTOR;

const _: () = assert!(BLOCK_THREADS.is_multiple_of(32));

kernel_args! {
    /// The copy kernel's arguments: `words` words from `src` to `dst`, both 16-byte
    /// aligned and distinct.
    pub struct CopyArgs {
        pub src: DevicePtr<u32>,
        pub dst: DevicePtrMut<u32>,
        pub words: u64,
    }
    /// The copy kernel.
    pub const COPY = "copy_words" => kernel::copy_words;
    entry points in ENTRY_POINTS;
}

/// The launch that copies `args.words` words, or `None` when there is none to copy.
pub const fn launch(args: CopyArgs) -> Option<Launch<CopyArgs>> {
    let blocks = args.words.div_ceil(TILE_WORDS);
    if blocks == 0 {
        return None;
    }
    Some(Launch::new(
        COPY,
        LaunchGeometry::linear(blocks, BLOCK_THREADS),
        args,
    ))
}

#[cfg(target_arch = "nvptx64")]
mod kernel {
    use super::*;
    use crate::device::{block_idx_x, load_global_nc_v4, store_global_v4, thread_idx_x};

    /// Copies `words` 32-bit words from `src` to `dst`.
    ///
    /// # Safety
    /// `src` and `dst` are 16-byte aligned, hold `words` words each, and do not overlap;
    /// the grid has `words.div_ceil(TILE_WORDS)` blocks of `BLOCK_THREADS` threads.
    #[inline(always)]
    pub unsafe fn copy_words(args: CopyArgs) {
        let (src, dst, words) = (args.src.as_ptr(), args.dst.as_mut_ptr(), args.words);
        let first_vector = block_idx_x() as u64 * (TILE_WORDS / WORDS_PER_VECTOR) + thread_idx_x() as u64;
        let mut held = [[0u32; 4]; VECTORS_PER_THREAD];
        for (i, v) in held.iter_mut().enumerate() {
            let word = (first_vector + (i as u64) * BLOCK_THREADS as u64) * WORDS_PER_VECTOR;
            if word + WORDS_PER_VECTOR <= words {
                // SAFETY: the whole vector lies inside `src`, which is 16-byte aligned.
                *v = unsafe { load_global_nc_v4(src.add(word as usize)) };
            }
        }
        for (i, v) in held.iter().enumerate() {
            let word = (first_vector + (i as u64) * BLOCK_THREADS as u64) * WORDS_PER_VECTOR;
            if word + WORDS_PER_VECTOR <= words {
                // SAFETY: the whole vector lies inside `dst`, which is 16-byte aligned.
                unsafe { store_global_v4(dst.add(word as usize), *v) };
            } else {
                for w in word..words {
                    // SAFETY: `w < words`, inside both buffers.
                    unsafe { *dst.add(w as usize) = *src.add(w as usize) };
                }
            }
        }
    }
}
