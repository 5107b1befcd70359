//! Device pieces the scan kernels share: the element trait, the head-flagged sum of the
//! contiguous kernel's rows, the look-back kernels' shared memory, and the loads,
//! stores and block scan of one thread's run of a tile.

use super::{LaunchStatus, SHARED_BYTES, VECTORS_PER_THREAD, WARPS, packed_status};
use crate::block::{PackedStatus, ScanOp, TileChain, TileStatus, exclusive_scan};
use crate::device::{
    Coherent, Lane, SharedCarver, Shuffle, VectorElement, Widen, atomic_add_u32, load_global_v4,
    store_global_v4, sync_threads, thread_idx_x,
};

/// A sum type of the scans: wrapping for integers.
pub trait ScanSum: ScanOp + Coherent {
    /// The one-value-per-tile chain of a look-back launch, in the layout
    /// [`packed_status`] gives the host.
    type Chain: TileChain<Self>;
    fn chain(status: &LaunchStatus<Self>) -> Self::Chain;
}

/// An element type the scan kernels load and store, summing in its [`ScanSum`] (f32
/// for the 16-bit floats, each output rounded once).
pub trait ScanValue: Widen<Sum: ScanSum> + VectorElement {}

impl<T: Widen<Sum: ScanSum> + VectorElement> ScanValue for T {}

macro_rules! scan_sum {
    ($($t:ty, $add:expr, $chain:ty;)*) => {$(
        impl ScanOp for $t {
            #[inline(always)]
            fn identity() -> Self {
                0 as $t
            }
            #[inline(always)]
            fn combine(self, later: Self) -> Self {
                $add(self, later)
            }
        }
        impl ScanSum for $t {
            type Chain = $chain;
            #[inline(always)]
            fn chain(status: &LaunchStatus<Self>) -> Self::Chain {
                <$chain>::from_status(status)
            }
        }
    )*};
}

scan_sum! {
    f32, |a: f32, b| a + b, PackedStatus<f32>;
    i32, i32::wrapping_add, PackedStatus<i32>;
    f64, |a: f64, b| a + b, TileStatus<f64>;
    i64, i64::wrapping_add, TileStatus<i64>;
}

/// Building a chain from the status the host laid out.
trait FromStatus<T> {
    fn from_status(status: &LaunchStatus<T>) -> Self;
}

impl<T> FromStatus<T> for PackedStatus<T> {
    /// The words right after the counter and its padding, 8-byte aligned.
    #[inline(always)]
    fn from_status(status: &LaunchStatus<T>) -> Self {
        const { assert!(packed_status(1, size_of::<T>())) };
        PackedStatus {
            words: status.counter_and_flags.offset(2).cast::<u64>().as_mut_ptr(),
            value: core::marker::PhantomData,
        }
    }
}

impl<T> FromStatus<T> for TileStatus<T> {
    #[inline(always)]
    fn from_status(status: &LaunchStatus<T>) -> Self {
        const { assert!(!packed_status(1, size_of::<T>())) };
        status.tiles(1)
    }
}

impl<T> LaunchStatus<T> {
    /// The unpacked status of tiles of `width` values each.
    #[inline(always)]
    pub fn tiles(&self, width: u32) -> TileStatus<T> {
        TileStatus {
            flags: self.counter_and_flags.offset(1).as_mut_ptr(),
            aggregates: self.aggregates.as_mut_ptr(),
            inclusives: self.inclusives.as_mut_ptr(),
            width,
        }
    }

    /// The counter that hands out tile ids in launch order.
    #[inline(always)]
    pub fn counter(&self) -> *mut u32 {
        self.counter_and_flags.as_mut_ptr()
    }
}

/// A running sum that restarts at heads: `(head, value)` combined as `(h1 | h2, if h2 {
/// v2 } else { v1 + v2 })`. The contiguous kernel's tiles hold the ends of several
/// rows; a row's first element is a head.
#[derive(Clone, Copy)]
pub struct HeadedSum<T> {
    pub head: u32,
    pub value: T,
}

impl<T: ScanSum> Shuffle for HeadedSum<T> {
    #[inline(always)]
    fn shuffle(self, from: Lane) -> Self {
        HeadedSum {
            head: self.head.shuffle(from),
            value: self.value.shuffle(from),
        }
    }
}

impl<T: ScanSum> ScanOp for HeadedSum<T> {
    #[inline(always)]
    fn identity() -> Self {
        HeadedSum {
            head: 0,
            value: T::identity(),
        }
    }
    #[inline(always)]
    fn combine(self, later: Self) -> Self {
        HeadedSum {
            head: self.head | later.head,
            value: if later.head != 0 {
                later.value
            } else {
                self.value.combine(later.value)
            },
        }
    }
}

/// Shared memory of one look-back block, carved in the order of `SHARED_BYTES`.
pub struct Shared<T> {
    pub tile: *mut u32,
    pub prefix: *mut T,
    pub warp_totals: *mut HeadedSum<T>,
}

impl<T: ScanSum> Shared<T> {
    #[inline(always)]
    pub fn carve() -> Self {
        const { assert!(16 + WARPS * size_of::<HeadedSum<T>>() <= SHARED_BYTES as usize) };
        let mut carver = SharedCarver::new();
        // SAFETY: the launch gives SHARED_BYTES, which covers these regions at their
        // largest (8-byte values, 16-byte head-flagged sums).
        unsafe {
            Shared {
                tile: carver.take(1),
                prefix: carver.take(1),
                warp_totals: carver.take(WARPS),
            }
        }
    }

    /// Takes the next tile id from the launch's counter and shares it (one barrier).
    ///
    /// # Safety
    /// Every thread of the block calls it; `counter` is the launch's zeroed counter.
    #[inline(always)]
    pub unsafe fn next_tile(&self, counter: *mut u32) -> u64 {
        // SAFETY: thread 0 alone writes the shared slot before the barrier.
        unsafe {
            if thread_idx_x() == 0 {
                *self.tile = atomic_add_u32(counter, 1);
            }
            sync_threads();
            *self.tile as u64
        }
    }
}

/// The element of zero bits: zero in every element type, so its sum is the identity.
/// Kernels that load elements one by one under a condition keep them in the element
/// type, zero where nothing was loaded, and widen them apart after the last load
/// (`Widen::widen_apart`): a widening next to its load would wait for it, one load at a
/// time (16-bit strided scans ran at a third of the f32 rate).
#[inline(always)]
pub fn zero<T: VectorElement>() -> T {
    T::from_words([0; 4], 0)
}

/// One thread's run of a rows or contiguous tile as it travels: up to
/// `VECTORS_PER_THREAD` 128-bit vectors in physical order, the first `ITEMS /
/// PER_VECTOR` used (16-bit elements stay packed two to a register until they are
/// summed).
pub type RunWords = [[u32; 4]; VECTORS_PER_THREAD];

/// A run of zero bits: the identity of every sum type.
pub const ZERO_RUN: RunWords = [[0; 4]; VECTORS_PER_THREAD];

/// The run of `ITEMS` elements from physical position `start`, by 128-bit loads.
///
/// # Safety
/// `x[start..start + ITEMS]` is readable and 16-byte aligned.
#[inline(always)]
pub unsafe fn load_run<T: ScanValue, const ITEMS: usize>(x: *const T, start: u64) -> RunWords {
    let mut words = ZERO_RUN;
    for (v, vector) in words.iter_mut().enumerate().take(ITEMS / T::PER_VECTOR) {
        // SAFETY: inside the run, which the caller guarantees.
        *vector = unsafe { load_global_v4(x.add(start as usize + v * T::PER_VECTOR) as *const u32) };
    }
    words
}

/// Writes a run of `ITEMS` elements to physical positions from `start` by 128-bit
/// stores.
///
/// # Safety
/// `y[start..start + ITEMS]` is writable and 16-byte aligned.
#[inline(always)]
pub unsafe fn store_run<T: ScanValue, const ITEMS: usize>(y: *mut T, start: u64, words: &RunWords) {
    for (v, &vector) in words.iter().enumerate().take(ITEMS / T::PER_VECTOR) {
        // SAFETY: inside the run, which the caller guarantees.
        unsafe { store_global_v4(y.add(start as usize + v * T::PER_VECTOR) as *mut u32, vector) };
    }
}

/// The `ITEMS` elements of a run as sums, in logical order (reversed when
/// `REVERSE_ORDER`).
#[inline(always)]
pub fn widen_run<T: ScanValue, const ITEMS: usize, const REVERSE_ORDER: bool>(
    words: &RunWords,
) -> [T::Sum; ITEMS] {
    const { assert!(ITEMS.is_multiple_of(T::PER_VECTOR) && ITEMS <= VECTORS_PER_THREAD * T::PER_VECTOR) };
    core::array::from_fn(|k| {
        let k = if REVERSE_ORDER { ITEMS - 1 - k } else { k };
        T::from_words(words[k / T::PER_VECTOR], k % T::PER_VECTOR).widen()
    })
}

/// `ITEMS` sums in logical order, each rounded once, as a run: the inverse of
/// [`widen_run`].
#[inline(always)]
pub fn narrow_run<T: ScanValue, const ITEMS: usize, const REVERSE_ORDER: bool>(
    items: &[T::Sum; ITEMS],
) -> RunWords {
    const { assert!(ITEMS.is_multiple_of(T::PER_VECTOR) && ITEMS <= VECTORS_PER_THREAD * T::PER_VECTOR) };
    let mut words = ZERO_RUN;
    for (k, &item) in items.iter().enumerate() {
        let k = if REVERSE_ORDER { ITEMS - 1 - k } else { k };
        T::narrow(item).into_words(&mut words[k / T::PER_VECTOR], k % T::PER_VECTOR);
    }
    words
}

/// Scans one tile (`ITEMS` consecutive sums per thread, `WARPS` warps) after `carry`:
/// each item becomes its exclusive or inclusive prefix; returns the tile's total.
///
/// # Safety
/// Every thread of the block calls it; `warp_totals` holds `WARPS` values in shared
/// memory that nothing else uses until the caller's next barrier.
#[inline(always)]
pub unsafe fn scan_tile<S: ScanSum, const ITEMS: usize, const WARPS: usize>(
    items: &mut [S; ITEMS],
    carry: S,
    exclusive: bool,
    warp_totals: *mut S,
) -> S {
    let mut own = S::identity();
    for &item in items.iter() {
        own = own.combine(item);
    }
    // SAFETY: forwarded from the caller.
    let (before, total) = unsafe { exclusive_scan::<_, WARPS>(own, warp_totals) };
    let mut running = carry.combine(before);
    for item in items.iter_mut() {
        let next = running.combine(*item);
        *item = if exclusive { running } else { next };
        running = next;
    }
    total
}
