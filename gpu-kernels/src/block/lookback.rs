//! Decoupled look-back (Merrill and Garland, as in CUB's single-pass scan): each tile
//! publishes its aggregate as soon as it has it, then walks back over its predecessors,
//! summing aggregates until it meets a published inclusive prefix. Tiles take their ids
//! in launch order from a counter, so a tile only ever waits for tiles that are already
//! running.
//!
//! The sums are deterministic: only *anchors* (every `span`-th tile of a chain) and the
//! tiles that start a chain publish inclusive prefixes, and a tile's look-back stops at
//! the nearest of them, waiting for the anchor's inclusive prefix if the anchor has only
//! its aggregate out. Where a look-back stops, and so the order of every addition,
//! follows from the tile's index alone, not from which predecessors happen to be done:
//! floating-point scans give the same bits on every run. The anchors' inclusive
//! prefixes chain one span at a time, which keeps ahead of the tiles.
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

/// Tiles between anchors of a chain of column tiles ([`TileStatus::chain_columns`]);
/// warp 0 waits for that many predecessors at most, one per lane.
pub const COLUMN_ANCHOR: u64 = 16;
/// Predecessors' values a column look-back loads at once.
const COLUMN_LOADS: u64 = 4;

/// Whether the tile at `position` in its chain is an anchor: the last of every `span`.
pub const fn is_anchor(position: u64, span: u64) -> bool {
    (position + 1).is_multiple_of(span)
}

/// The position of the last anchor before `position`, or 0 (the chain's start).
const fn last_anchor(position: u64, span: u64) -> u64 {
    if position >= span {
        position / span * span - 1
    } else {
        0
    }
}

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
    /// ... back to the chain's last anchor (its position a multiple of `COLUMN_ANCHOR`,
    /// less one) or its start, whichever is nearer: lanes of warp 0 wait for one
    /// predecessor's flag each (the stop's inclusive prefix), then every thread reads its
    /// values of them all at once and adds them from the stop on.
    ///
    /// # Safety
    /// Every thread of the block calls it; `tile >= step`; the chain starts at a tile
    /// below `step` that publishes its inclusive prefix at once, and anchors publish
    /// theirs after their own look-back.
    #[inline(always)]
    unsafe fn look_back_block(&self, tile: u64, step: u64) -> T {
        let lane = thread_idx_x();
        let position = tile / step;
        let distance = position - last_anchor(position, COLUMN_ANCHOR);
        if (lane as u64) < distance {
            let flag_ptr = self
                .flags
                .wrapping_add((tile - (lane as u64 + 1) * step) as usize);
            let stop = lane as u64 + 1 == distance;
            // SAFETY: the predecessor is a tile of this launch.
            unsafe {
                let mut flag = load_acquire_u32(flag_ptr);
                while flag == 0 || (stop && flag != INCLUSIVE) {
                    flag = load_acquire_u32(flag_ptr);
                }
            }
        }
        // SAFETY: all threads reach it; the flags were acquired before it.
        unsafe { sync_threads() };
        fence_gpu();
        let mut prefix = T::identity();
        if lane < self.width {
            // From the stop on, `COLUMN_LOADS` loads in flight at a time (all of them would
            // take registers from the tile the thread holds).
            for group in 0..COLUMN_ANCHOR / COLUMN_LOADS {
                let values: [T; COLUMN_LOADS as usize] = core::array::from_fn(|i| {
                    let d = COLUMN_ANCHOR - group * COLUMN_LOADS - i as u64;
                    if d <= distance {
                        let source = if d == distance {
                            self.inclusives
                        } else {
                            self.aggregates
                        };
                        // SAFETY: published before the flag that warp 0 acquired.
                        unsafe { T::load_relaxed(self.slot(source, tile - d * step, lane)) }
                    } else {
                        T::identity()
                    }
                });
                for value in values {
                    prefix = prefix.combine(value);
                }
            }
        }
        prefix
    }

    /// Chains a tile of columns (one value per thread) to the tiles `step`, `2 * step`,
    /// ... before it: publishes each column's `total` as the tile's aggregate, looks
    /// back (deterministically, as [`Self::look_back_block`] says), and returns each
    /// thread's prefix; an anchor then publishes each column's inclusive prefix. Tiles
    /// below `step` start their chains: they publish `total` as their inclusive prefix
    /// at once and return the identity.
    ///
    /// # Safety
    /// Every thread of the block calls it; `tile` is in range; every chain of a launch
    /// starts at a tile below `step`, which never waits.
    #[inline(always)]
    pub unsafe fn chain_columns(&self, tile: u64, step: u64, total: T) -> T {
        // SAFETY: forwarded; a chain's first tile publishes without waiting.
        unsafe {
            if tile < step {
                self.publish_each(tile, total, INCLUSIVE);
                T::identity()
            } else {
                self.publish_each(tile, total, AGGREGATE);
                let prefix = self.look_back_block(tile, step);
                if is_anchor(tile / step, COLUMN_ANCHOR) {
                    self.publish_each(tile, prefix.combine(total), INCLUSIVE);
                }
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

    /// The combined values of tiles `tile - 1`, `tile - 2`, ... back to the nearest chain
    /// start or anchor (one per `32 * WINDOW` tiles, so within that many), read by one
    /// warp. Every lane returns the result.
    ///
    /// # Safety
    /// All 32 lanes of one warp call it; tile 0 starts a chain, chain starts publish
    /// their inclusive prefix without waiting, and anchors theirs after their own
    /// look-back.
    unsafe fn look_back<const WINDOW: usize>(&self, tile: u64) -> T;

    /// The step of a tile whose prefix lies with its predecessors, for warp 0 of its
    /// block once the tile's `aggregate` is published: looks back for the prefix, writes
    /// it to `shared_prefix` for the block, and if the tile is an anchor publishes its
    /// inclusive prefix (the prefix, then the aggregate) unless `inclusive_published` (a
    /// tile that holds the start of a new chain published it with its aggregate). The
    /// block reads `shared_prefix` after its next barrier.
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
                if !inclusive_published && is_anchor(tile, (WINDOW as u32 * WARP_SIZE) as u64) {
                    self.publish(tile, prefix.combine(aggregate), INCLUSIVE);
                }
            }
        }
    }
}

/// The look-back walk of both layouts. Lane `i` polls predecessors `i`, `i + 32`, ...
/// of the `32 * WINDOW` before `tile` (all loads in flight at once) with `poll`, which
/// returns a flag (0 while nothing is published) and what was read. Once every flag is
/// set and the window's anchor (every `32 * WINDOW`-th tile, so one per window) shows
/// its inclusive prefix, ballots find the nearest inclusive predecessor: that anchor or
/// a nearer chain start, a tile that the index of `tile` alone decides. `value` turns
/// each slot up to it into its value, and a warp reduction sums them in a fixed order.
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
    // Slot j of lane i is tile `tile - 1 - (i + 32 j)`; slots past tile 0 count as
    // published and are never the stop.
    let distance = |j: usize| lane + (j as u32 * WARP_SIZE) as u64;
    let exists: [bool; WINDOW] = core::array::from_fn(|j| tile > distance(j));
    let anchor: [bool; WINDOW] =
        core::array::from_fn(|j| exists[j] && is_anchor(tile - 1 - distance(j), span));
    let mut flags = exists.map(|e| if e { 0 } else { INCLUSIVE });
    let mut read = [W::default(); WINDOW];
    let pending = |flags: &[u32; WINDOW], j: usize| flags[j] == 0 || (anchor[j] && flags[j] != INCLUSIVE);
    loop {
        for j in 0..WINDOW {
            if pending(&flags, j) {
                (flags[j], read[j]) = poll(tile - 1 - distance(j));
            }
        }
        if ballot((0..WINDOW).any(|j| pending(&flags, j))) == 0 {
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
            sum = value(tile - 1 - d, flag, read[j]).combine(sum);
        }
    }
    warp::reduce(sum, T::combine)
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
