//! Decoupled look-back (Merrill and Garland, as in CUB's single-pass scan): each tile
//! publishes its aggregate as soon as it has it, then walks back over its predecessors,
//! summing aggregates until it meets a published inclusive prefix; it then publishes
//! its own inclusive prefix. Tiles take their ids in launch order from a counter, so a
//! tile only ever waits for tiles that are already running.
//!
//! Status layouts:
//! - one value per tile, chained through [`TileChain`] (one thread publishes, one warp
//!   looks back over a window of predecessors at a time): [`PackedStatus`] holds the
//!   flag and a 4-byte value in one 64-bit word, so a predecessor's status is one
//!   relaxed load; [`TileStatus`] (width 1) keeps flags and values apart for 8-byte
//!   values, published with release and read with acquire order;
//! - one value per thread of the block, for one running sum per column
//!   ([`TileStatus::chain_columns`]).
//!
//! The step every look-back kernel takes once its tile's aggregate is out is written
//! once here: [`TileChain::look_back_and_share`] for chains of one value per tile,
//! [`TileStatus::chain_columns`] for one value per column.

use core::marker::PhantomData;

use crate::device::{
    Coherent, WARP_SIZE, ballot, fence_gpu, lane_id, load_acquire_u32, store_release_u32, sync_threads,
    thread_idx_x,
};
use crate::warp;

use super::ScanOp;

/// Flag: the tile's aggregate is published.
pub const AGGREGATE: u32 = 1;
/// Flag: the tile's inclusive prefix is published.
pub const INCLUSIVE: u32 = 2;

/// The status of every tile of a launch, in global memory.
pub struct TileStatus<T> {
    /// One flag per tile, zero (nothing published) before the launch.
    pub flags: *mut u32,
    /// `width` values per tile.
    pub aggregates: *mut T,
    /// `width` values per tile.
    pub inclusives: *mut T,
    pub width: u32,
}

impl<T: ScanOp + Coherent> TileStatus<T> {
    /// Slot of value `lane` of `tile` in `values`.
    #[inline(always)]
    fn slot(&self, values: *mut T, tile: u64, lane: u32) -> *mut T {
        // SAFETY (of the callers' dereference): tile and lane are in range.
        values.wrapping_add((tile * self.width as u64 + lane as u64) as usize)
    }

    /// Publishes `tile`'s single value under `flag`: the value, then the flag with
    /// release order. Called by one thread.
    ///
    /// # Safety
    /// `width` is 1 and `tile` is in range.
    #[inline(always)]
    unsafe fn publish_one(&self, tile: u64, value: T, flag: u32) {
        let target = if flag == INCLUSIVE {
            self.inclusives
        } else {
            self.aggregates
        };
        // SAFETY: the slot and flag are this tile's; release orders the value first.
        unsafe {
            T::store_relaxed(self.slot(target, tile, 0), value);
            store_release_u32(self.flags.add(tile as usize), flag);
        }
    }

    /// Publishes each thread's value (threads below `width`) for `tile` under `flag`:
    /// every thread writes and fences; after a barrier, thread 0 releases the flag.
    ///
    /// # Safety
    /// Every thread of the block calls it; `tile` is in range.
    #[inline(always)]
    unsafe fn publish_each(&self, tile: u64, value: T, flag: u32) {
        let lane = thread_idx_x();
        if lane < self.width {
            let target = if flag == INCLUSIVE {
                self.inclusives
            } else {
                self.aggregates
            };
            // SAFETY: the slot is this tile's and this thread's.
            unsafe { T::store_relaxed(self.slot(target, tile, lane), value) };
        }
        fence_gpu();
        // SAFETY: all threads reach the barrier; thread 0 writes the tile's own flag.
        unsafe {
            sync_threads();
            if lane == 0 {
                store_release_u32(self.flags.add(tile as usize), flag);
            }
        }
    }

    /// Each thread's combined values of the tiles at `tile - step`, `tile - 2 * step`,
    /// ... back to the nearest one with a published inclusive prefix. Thread 0 waits for
    /// each predecessor's flag and shares it through `shared_flag`; every thread then
    /// reads its own value. Two barriers per step.
    ///
    /// # Safety
    /// Every thread of the block calls it; some predecessor at a multiple of `step`
    /// publishes an inclusive prefix without waiting on this tile; `shared_flag` is a
    /// shared `u32` no other code uses meanwhile.
    #[inline(always)]
    unsafe fn look_back_block(&self, tile: u64, step: u64, shared_flag: *mut u32) -> T {
        let lane = thread_idx_x();
        let mut prefix = T::identity();
        let mut predecessor = tile;
        loop {
            predecessor -= step;
            // SAFETY: `predecessor` is a tile of this launch; the shared slot is ours.
            let flag = unsafe {
                if lane == 0 {
                    let flag_ptr = self.flags.add(predecessor as usize);
                    let mut flag = load_acquire_u32(flag_ptr);
                    while flag == 0 {
                        flag = load_acquire_u32(flag_ptr);
                    }
                    *shared_flag = flag;
                }
                sync_threads();
                *shared_flag
            };
            fence_gpu();
            if lane < self.width {
                let source = if flag == INCLUSIVE {
                    self.inclusives
                } else {
                    self.aggregates
                };
                // SAFETY: published before the flag that thread 0 acquired.
                prefix = unsafe { T::load_relaxed(self.slot(source, predecessor, lane)) }.combine(prefix);
            }
            // SAFETY: all threads reach it; the shared flag is free again after it.
            unsafe { sync_threads() };
            if flag == INCLUSIVE {
                return prefix;
            }
        }
    }

    /// Chains a tile of columns (one value per thread) to the tiles `step`, `2 * step`,
    /// ... before it: publishes each column's `total` as the tile's aggregate, looks
    /// back to the nearest inclusive prefix, publishes each column's inclusive prefix,
    /// and returns each thread's prefix. Tiles below `step` start their chains: they
    /// publish `total` as their inclusive prefix at once and return the identity.
    ///
    /// # Safety
    /// Every thread of the block calls it; `tile` is in range; every chain of a launch
    /// starts at a tile below `step`, which never waits; `shared_flag` is a shared `u32`
    /// no other code uses meanwhile.
    #[inline(always)]
    pub unsafe fn chain_columns(&self, tile: u64, step: u64, total: T, shared_flag: *mut u32) -> T {
        // SAFETY: forwarded; a chain's first tile publishes without waiting.
        unsafe {
            if tile < step {
                self.publish_each(tile, total, INCLUSIVE);
                T::identity()
            } else {
                self.publish_each(tile, total, AGGREGATE);
                let prefix = self.look_back_block(tile, step, shared_flag);
                self.publish_each(tile, prefix.combine(total), INCLUSIVE);
                prefix
            }
        }
    }
}

/// A chain of tiles with one value each: publish, and look back.
pub trait TileChain<T: ScanOp> {
    /// Publishes `tile`'s value under `flag`. Called by one thread.
    ///
    /// # Safety
    /// `tile` is in range.
    unsafe fn publish(&self, tile: u64, value: T, flag: u32);

    /// The combined values of tiles `tile - 1`, `tile - 2`, ... back to the nearest one
    /// with a published inclusive prefix, read by one warp `32 * WINDOW` tiles at a
    /// time. Every lane returns the result.
    ///
    /// # Safety
    /// All 32 lanes of one warp call it; a predecessor of `tile` publishes an inclusive
    /// prefix without waiting on `tile`, and tile 0 publishes one.
    unsafe fn look_back<const WINDOW: usize>(&self, tile: u64) -> T;

    /// The step of a tile whose prefix lies with its predecessors, for warp 0 of its
    /// block once the tile's `aggregate` is published: looks back for the prefix, writes
    /// it to `shared_prefix` for the block, and publishes the tile's inclusive prefix
    /// (the prefix, then the aggregate) unless `inclusive_published` (a tile that
    /// holds the start of a new chain published it with its aggregate). The block
    /// reads `shared_prefix` after its next barrier.
    ///
    /// # Safety
    /// Warp 0 entire calls it, as for [`Self::look_back`]; `shared_prefix` is shared
    /// memory that no thread touches between this call and the block's next barrier.
    #[inline(always)]
    unsafe fn look_back_and_share<const WINDOW: usize>(
        &self,
        tile: u64,
        aggregate: T,
        inclusive_published: bool,
        shared_prefix: *mut T,
    ) {
        // SAFETY: forwarded from the caller.
        let prefix = unsafe { self.look_back::<WINDOW>(tile) };
        if thread_idx_x() == 0 {
            // SAFETY: thread 0 alone writes the shared prefix before the barrier; this
            // tile's status.
            unsafe {
                *shared_prefix = prefix;
                if !inclusive_published {
                    self.publish(tile, prefix.combine(aggregate), INCLUSIVE);
                }
            }
        }
    }
}

/// The look-back walk of both layouts. Lane `i` polls predecessors `i`, `i + 32`, ...
/// of each window (all loads in flight at once) with `poll`, which returns a flag (0
/// while nothing is published) and what was read; once every flag of the window is
/// set, ballots find the nearest inclusive predecessor, `value` turns each slot up to
/// it into its value, and a warp reduction sums them. A tile's look-back reaches back
/// about as far as the tiles in flight, so a wide window keeps the steps few.
///
/// # Safety
/// As [`TileChain::look_back`]; `poll` and `value` read only tiles below `tile`.
#[inline(always)]
unsafe fn walk_back<T: ScanOp, W: Copy + Default, const WINDOW: usize>(
    tile: u64,
    poll: impl Fn(u64) -> (u32, W),
    value: impl Fn(u64, u32, W) -> T,
) -> T {
    let lane = lane_id() as u64;
    let span = (WINDOW as u32 * WARP_SIZE) as u64;
    let mut prefix = T::identity();
    let mut window_end = tile;
    loop {
        // Slot j of lane i is tile window_end - 1 - (i + 32 j); slots past tile 0 count
        // as published and are never the stop.
        let distance = |j: usize| lane + (j as u32 * WARP_SIZE) as u64;
        let exists: [bool; WINDOW] = core::array::from_fn(|j| window_end > distance(j));
        let mut flags = exists.map(|e| if e { 0 } else { INCLUSIVE });
        let mut read = [W::default(); WINDOW];
        loop {
            for j in 0..WINDOW {
                if flags[j] == 0 {
                    (flags[j], read[j]) = poll(window_end - 1 - distance(j));
                }
            }
            if ballot(flags.contains(&0)) == 0 {
                break;
            }
        }
        let mut stop = span;
        for j in (0..WINDOW).rev() {
            let inclusive = ballot(flags[j] == INCLUSIVE && exists[j]);
            if inclusive != 0 {
                stop = (j as u32 * WARP_SIZE + inclusive.trailing_zeros()) as u64;
            }
        }
        let mut sum = T::identity();
        for j in 0..WINDOW {
            let d = distance(j);
            if exists[j] && d <= stop {
                let flag = if d == stop { INCLUSIVE } else { AGGREGATE };
                sum = value(window_end - 1 - d, flag, read[j]).combine(sum);
            }
        }
        prefix = warp::reduce(sum, T::combine).combine(prefix);
        if stop < span || window_end <= span {
            return prefix;
        }
        window_end -= span;
    }
}

impl<T: ScanOp + Coherent> TileChain<T> for TileStatus<T> {
    #[inline(always)]
    unsafe fn publish(&self, tile: u64, value: T, flag: u32) {
        // SAFETY: forwarded; a chain's status has width 1.
        unsafe { self.publish_one(tile, value, flag) }
    }

    #[inline(always)]
    unsafe fn look_back<const WINDOW: usize>(&self, tile: u64) -> T {
        // SAFETY: predecessors are tiles of the launch; a value is read only after its
        // flag was acquired.
        unsafe {
            walk_back::<T, (), WINDOW>(
                tile,
                |predecessor| (load_acquire_u32(self.flags.add(predecessor as usize)), ()),
                |predecessor, flag, ()| {
                    let source = if flag == INCLUSIVE {
                        self.inclusives
                    } else {
                        self.aggregates
                    };
                    T::load_relaxed(self.slot(source, predecessor, 0))
                },
            )
        }
    }
}

/// A 4-byte value that travels in the low half of a status word.
pub trait PackedValue: ScanOp {
    fn to_word(self) -> u32;
    fn from_word(word: u32) -> Self;
}

impl PackedValue for f32 {
    #[inline(always)]
    fn to_word(self) -> u32 {
        self.to_bits()
    }
    #[inline(always)]
    fn from_word(word: u32) -> Self {
        f32::from_bits(word)
    }
}

impl PackedValue for i32 {
    #[inline(always)]
    fn to_word(self) -> u32 {
        self as u32
    }
    #[inline(always)]
    fn from_word(word: u32) -> Self {
        word as i32
    }
}

/// One 64-bit word per tile, `flag << 32 | value`, zero before the launch: one store
/// publishes, one relaxed load reads flag and value together (no fence, no second
/// round trip).
pub struct PackedStatus<T> {
    pub words: *mut u64,
    pub value: PhantomData<T>,
}

impl<T: PackedValue> TileChain<T> for PackedStatus<T> {
    #[inline(always)]
    unsafe fn publish(&self, tile: u64, value: T, flag: u32) {
        // SAFETY: the word is this tile's.
        unsafe {
            u64::store_relaxed(
                self.words.add(tile as usize),
                (flag as u64) << 32 | value.to_word() as u64,
            )
        };
    }

    #[inline(always)]
    unsafe fn look_back<const WINDOW: usize>(&self, tile: u64) -> T {
        // SAFETY: predecessors are tiles of the launch.
        unsafe {
            walk_back::<T, u64, WINDOW>(
                tile,
                |predecessor| {
                    let word = u64::load_relaxed(self.words.add(predecessor as usize));
                    ((word >> 32) as u32, word)
                },
                |_, _, word| T::from_word(word as u32),
            )
        }
    }
}
