//! The carry of a scan cut into shards along its axis (a device group's): each shard is
//! scanned alone, then every element of a shard gets the sum, in order, of the totals
//! of the shards before it (after it, reversed), one `[outer, inner]` carry per total.
//!
//! One thread per run of `ITEMS` consecutive elements (two 128-bit vectors): the run's
//! `(outer, inner)` position is found once by division, then stepped, so the pass runs
//! at the copy's rate rather than at the rate of 64-bit divisions.

use super::ScanProblem;
use crate::launch::{DevicePtr, DevicePtrMut, Kernel, Launch, LaunchGeometry, kernel_args};

/// Threads per block.
pub const BLOCK_THREADS: u32 = 256;
/// Bytes of one thread's run.
pub const RUN_BYTES: u64 = 32;

kernel_args! {
    /// The carry kernel's arguments: `y[o, l, i] += carries[0, o, i] + ... +
    /// carries[terms - 1, o, i]` over the `[outer, scan, inner]` array y.
    pub struct CarryArgs<T> {
        pub y: DevicePtrMut<T>,
        pub carries: DevicePtr<T>,
        pub problem: ScanProblem,
        pub terms: u64,
    }
    impl CarryKernel for f32 {
        const CARRY = "scan_carry_f32" => kernel::carry::<f32, 8>;
    }
    impl CarryKernel for f64 {
        const CARRY = "scan_carry_f64" => kernel::carry::<f64, 4>;
    }
    impl CarryKernel for i32 {
        const CARRY = "scan_carry_i32" => kernel::carry::<i32, 8>;
    }
    impl CarryKernel for i64 {
        const CARRY = "scan_carry_i64" => kernel::carry::<i64, 4>;
    }
    impl CarryKernel for half::bf16 {
        const CARRY = "scan_carry_bf16" => kernel::carry::<half::bf16, 16>;
    }
    impl CarryKernel for half::f16 {
        const CARRY = "scan_carry_f16" => kernel::carry::<half::f16, 16>;
    }
    entry points in ENTRY_POINTS;
}

/// The carry kernel of one element type.
pub trait CarryKernel: Sized {
    const CARRY: Kernel<CarryArgs<Self>>;
}

/// The launch adding `terms` carries to y (16-byte aligned), or `None` when there is
/// nothing to add.
pub fn launch<T: CarryKernel>(args: CarryArgs<T>) -> Option<Launch<CarryArgs<T>>> {
    let runs = (args.problem.elements() * size_of::<T>() as u64).div_ceil(RUN_BYTES);
    (runs > 0 && args.terms > 0)
        .then(|| Launch::new(T::CARRY, LaunchGeometry::per_item(runs, BLOCK_THREADS), args))
}

#[cfg(target_arch = "nvptx64")]
mod kernel {
    use super::*;
    use crate::block::ScanOp;
    use crate::device::{block_dim_x, block_idx_x, thread_idx_x};
    use crate::scan::tile::{ScanValue, load_run, narrow_run, store_run, widen_run};

    /// An element's outer index, its place in its outer slice and its inner index.
    struct Position {
        outer: u64,
        in_row: u64,
        inner: u64,
    }

    impl Position {
        #[inline(always)]
        fn of(element: u64, problem: &ScanProblem) -> Self {
            let row = problem.scan * problem.inner;
            let in_row = element % row;
            Self {
                outer: element / row,
                in_row,
                inner: in_row % problem.inner,
            }
        }

        /// Moves to the next element.
        #[inline(always)]
        fn step(&mut self, row: u64, inner: u64) {
            self.in_row += 1;
            self.inner += 1;
            if self.inner == inner {
                self.inner = 0;
            }
            if self.in_row == row {
                self.in_row = 0;
                self.outer += 1;
            }
        }
    }

    /// Adds the carries to the run of `ITEMS` elements (`RUN_BYTES` bytes) of this
    /// thread.
    ///
    /// # Safety
    /// y holds the problem's elements, 16-byte aligned; `carries` holds `terms * outer *
    /// inner` values; one thread per run.
    #[inline(always)]
    pub unsafe fn carry<T: ScanValue, const ITEMS: usize>(args: CarryArgs<T>) {
        let CarryArgs { problem, terms, .. } = args;
        let (y, carries) = (args.y.as_mut_ptr(), args.carries.as_ptr());
        let (elements, row, columns) = (
            problem.elements(),
            problem.scan * problem.inner,
            problem.columns(),
        );
        let first = (block_idx_x() as u64 * block_dim_x() as u64 + thread_idx_x() as u64) * ITEMS as u64;
        if first >= elements {
            return;
        }
        let mut at = Position::of(first, &problem);
        let carry = |at: &Position| {
            let column = at.outer * problem.inner + at.inner;
            let mut sum = <T::Sum as ScanOp>::identity();
            for term in 0..terms {
                // SAFETY: column < outer * inner and term < terms.
                sum = sum.combine(unsafe { *carries.add((term * columns + column) as usize) }.widen());
            }
            sum
        };
        if first + ITEMS as u64 <= elements {
            // SAFETY: the run lies inside y, 16-byte aligned as y and RUN_BYTES are.
            let words = unsafe { load_run::<T, ITEMS>(y, first) };
            let mut items = widen_run::<T, ITEMS, false>(&words);
            for item in &mut items {
                *item = item.combine(carry(&at));
                at.step(row, problem.inner);
            }
            // SAFETY: as for the load.
            unsafe { store_run::<T, ITEMS>(y, first, &narrow_run::<T, ITEMS, false>(&items)) };
        } else {
            for e in first..elements {
                // SAFETY: e < elements.
                unsafe {
                    let element = y.add(e as usize);
                    *element = T::narrow((*element).widen().combine(carry(&at)));
                }
                at.step(row, problem.inner);
            }
        }
    }
}
