//! Device pieces the scan kernels share: the element trait, the head-flagged sum of the
//! contiguous kernel's rows, the look-back kernels' shared memory, and the loads,
//! stores and block scan of one thread's run of a tile.

use super::{LaunchStatus, SHARED_BYTES, VECTORS_PER_THREAD, WARPS, packed_status};
use crate::block::{PackedStatus, ScanOp, TileChain, TileStatus, exclusive_scan};
use crate::device::{
    Coherent, Lane, SharedCarver, Shuffle, VectorElement, Widen, atomic_add_u32, lane_id, load_global_v4,
    load_shared_v4_f32, store_global_v4, store_shared_v4_f32, sync_threads, sync_warp, thread_idx_x,
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

/// Each warp's 32 runs of a tile travel between memory and registers as 128-bit
/// vectors consecutive across the lanes (vector `j` of lane `l` is the warp's vector
/// `32 j + l`: one 512-byte request a warp instruction), and pass through the warp's
/// buffer in shared memory to and from the lanes that scan them, a run each. Loaded
/// a run a lane, each warp instruction touched every sector twice: on the H200 the L2
/// ran at 95% of its throughput with the memory at 70% of its own.
pub(crate) struct WarpRuns {
    /// The warp's buffer in shared memory, `32 * vectors` vectors.
    pub(crate) buffer: u32,
    /// 128-bit vectors a run.
    pub(crate) vectors: u32,
    /// Physical position of the warp's first element (wrapping: a reversed tile that
    /// passes the row's start begins before it).
    pub(crate) start: u64,
}

/// The runs of a warp, in physical order, that lie inside a row: `0..32` for a tile
/// within the row, fewer at its end.
#[derive(Clone, Copy)]
pub(crate) struct ValidRuns {
    pub(crate) first: u32,
    pub(crate) end: u32,
}

impl WarpRuns {
    /// The shared address of vector `v` of the buffer. A lane reading its run takes
    /// vectors `vectors * lane + j`; the XOR spreads each 8 lanes' vectors over all
    /// 32 banks, and keeps the vectors of a striped access on distinct ones.
    #[inline(always)]
    fn slot(&self, v: u32) -> u32 {
        self.buffer + (v ^ ((v >> 3) & (self.vectors - 1))) * 16
    }

    /// Whether the warp's vector `v` lies in a run of `valid`.
    #[inline(always)]
    fn holds(&self, valid: ValidRuns, v: u32) -> bool {
        let run = v / self.vectors;
        valid.first <= run && run < valid.end
    }

    /// The lane's striped vectors of the runs `valid` names (zero elsewhere).
    ///
    /// # Safety
    /// `x` holds the valid runs' elements, 16-byte aligned.
    #[inline(always)]
    pub(crate) unsafe fn load<T: ScanValue>(&self, x: *const T, valid: ValidRuns) -> RunWords {
        let mut words = ZERO_RUN;
        for (j, vector) in words.iter_mut().enumerate().take(self.vectors as usize) {
            let v = 32 * j as u32 + lane_id();
            if self.holds(valid, v) {
                let at = self.position::<T>(v);
                // SAFETY: a valid run's vector, inside the row and aligned.
                *vector = unsafe { load_global_v4(x.add(at as usize) as *const u32) };
            }
        }
        words
    }

    /// Stores the lane's striped vectors of the runs `valid` names.
    ///
    /// # Safety
    /// As [`WarpRuns::load`], writable.
    #[inline(always)]
    pub(crate) unsafe fn store<T: ScanValue>(&self, y: *mut T, valid: ValidRuns, words: &RunWords) {
        for (j, &vector) in words.iter().enumerate().take(self.vectors as usize) {
            let v = 32 * j as u32 + lane_id();
            if self.holds(valid, v) {
                let at = self.position::<T>(v);
                // SAFETY: a valid run's vector, inside the row and aligned.
                unsafe { store_global_v4(y.add(at as usize) as *mut u32, vector) };
            }
        }
    }

    /// The lane's striped vectors of the elements inside `span`, zero elsewhere: whole
    /// vectors by 128-bit loads, the ones that the span's unaligned ends cut element by
    /// element (the runs `valid` names play no part).
    ///
    /// # Safety
    /// `x` holds the span's elements; `start` is 16-byte aligned.
    #[inline(always)]
    pub(crate) unsafe fn load_span<T: ScanValue>(&self, x: *const T, span: Span) -> RunWords {
        let mut words = ZERO_RUN;
        for (j, vector) in words.iter_mut().enumerate().take(self.vectors as usize) {
            let at = self.position::<T>(32 * j as u32 + lane_id());
            let inside = span.mask(at, T::PER_VECTOR as u32);
            if inside == full_mask::<T>() {
                // SAFETY: a vector inside the span, aligned.
                *vector = unsafe { load_global_v4(x.add(at as usize) as *const u32) };
            } else if inside != 0 {
                for i in 0..T::PER_VECTOR {
                    if inside & (1 << i) != 0 {
                        // SAFETY: an element of the span.
                        unsafe { *x.add(at as usize + i) }.into_words(vector, i);
                    }
                }
            }
        }
        words
    }

    /// Stores the elements of the lane's striped vectors that lie inside `span`, as
    /// [`WarpRuns::load_span`] loads them.
    ///
    /// # Safety
    /// As [`WarpRuns::load_span`], writable.
    #[inline(always)]
    pub(crate) unsafe fn store_span<T: ScanValue>(&self, y: *mut T, span: Span, words: &RunWords) {
        for (j, &vector) in words.iter().enumerate().take(self.vectors as usize) {
            let at = self.position::<T>(32 * j as u32 + lane_id());
            let inside = span.mask(at, T::PER_VECTOR as u32);
            if inside == full_mask::<T>() {
                // SAFETY: a vector inside the span, aligned.
                unsafe { store_global_v4(y.add(at as usize) as *mut u32, vector) };
            } else if inside != 0 {
                for i in 0..T::PER_VECTOR {
                    if inside & (1 << i) != 0 {
                        // SAFETY: an element of the span.
                        unsafe { *y.add(at as usize + i) = T::from_words(vector, i) };
                    }
                }
            }
        }
    }

    /// The physical position of the warp's vector `v` (wrapping, as `start`).
    #[inline(always)]
    fn position<T: ScanValue>(&self, v: u32) -> u64 {
        self.start.wrapping_add(v as u64 * T::PER_VECTOR as u64)
    }

    /// Passes the lane's vectors through the warp's buffer: vector `j` goes to slot
    /// `written(j)`, and vector `j` returned comes from slot `read(j)`.
    ///
    /// # Safety
    /// Every lane of the warp calls it, and nothing else uses the buffer meanwhile.
    #[inline(always)]
    unsafe fn exchange(
        &self,
        words: &RunWords,
        written: impl Fn(u32) -> u32,
        read: impl Fn(u32) -> u32,
    ) -> RunWords {
        let mut exchanged = ZERO_RUN;
        // SAFETY: the buffer is this warp's; the warp barriers order its lanes'
        // writes after the previous use's reads, and the reads after the writes.
        unsafe {
            sync_warp();
            for (j, &vector) in words.iter().enumerate().take(self.vectors as usize) {
                store_shared_v4_f32(self.slot(written(j as u32)), vector.map(f32::from_bits));
            }
            sync_warp();
            for (j, vector) in exchanged.iter_mut().enumerate().take(self.vectors as usize) {
                *vector = load_shared_v4_f32(self.slot(read(j as u32))).map(f32::to_bits);
            }
        }
        exchanged
    }

    /// Run `run` (in physical order) of the warp's striped vectors.
    ///
    /// # Safety
    /// As [`WarpRuns::exchange`].
    #[inline(always)]
    pub(crate) unsafe fn gather(&self, striped: &RunWords, run: u32) -> RunWords {
        // SAFETY: forwarded.
        unsafe { self.exchange(striped, |j| 32 * j + lane_id(), |j| self.vectors * run + j) }
    }

    /// The inverse of [`WarpRuns::gather`]: the lane's striped vectors, of the runs
    /// each lane holds.
    ///
    /// # Safety
    /// As [`WarpRuns::exchange`].
    #[inline(always)]
    pub(crate) unsafe fn scatter(&self, run_words: &RunWords, run: u32) -> RunWords {
        // SAFETY: forwarded.
        unsafe { self.exchange(run_words, |j| self.vectors * run + j, |j| 32 * j + lane_id()) }
    }
}

/// Physical positions `[low, low + len)`, compared wrapping: a reversed tile may begin
/// before position 0.
#[derive(Clone, Copy)]
pub(crate) struct Span {
    pub(crate) low: u64,
    pub(crate) len: u64,
}

impl Span {
    /// Bit `i` set where position `at + i` lies inside, for `i < n` (at most 32).
    #[inline(always)]
    fn mask(&self, at: u64, n: u32) -> u32 {
        // Positions are far below 2^63: offsets from `low` fit an i64.
        let offset = at.wrapping_sub(self.low) as i64;
        let first = (-offset).clamp(0, n as i64) as u32;
        let end = (self.len as i64 - offset).clamp(0, n as i64) as u32;
        bits_below(end) & !bits_below(first)
    }
}

/// The low `n` bits set (`n <= 32`).
#[inline(always)]
fn bits_below(n: u32) -> u32 {
    if n >= 32 { u32::MAX } else { (1 << n) - 1 }
}

/// Bits of a vector's elements, all set.
#[inline(always)]
fn full_mask<T: ScanValue>() -> u32 {
    bits_below(T::PER_VECTOR as u32)
}
