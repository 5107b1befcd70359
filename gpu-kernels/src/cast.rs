//! Element-wise conversions between f32 and the 16-bit floats: exact widening, and one
//! rounding to nearest even back. The 16-bit convolutions run their passes in f32
//! between them.
//!
//! A thread converts `ELEMENTS_PER_THREAD` consecutive elements: one 16-byte access on
//! the 16-bit side and two on the f32 side (arrays are 16-byte aligned), the last
//! partial group element by element.

use crate::launch::{DevicePtr, DevicePtrMut, Launch, LaunchGeometry, kernel_args};

/// Threads per block.
pub const THREADS: u32 = 256;
/// Elements one thread converts: 16 bytes of 16-bit values.
pub const ELEMENTS_PER_THREAD: u64 = 8;

kernel_args! {
    /// `y[i] = x[i]` as f32 (exactly) for `n` elements.
    pub struct WidenArgs<T> {
        pub x: DevicePtr<T>,
        pub y: DevicePtrMut<f32>,
        pub n: u64,
    }
    impl WidenKernel for half::bf16 {
        const WIDEN = "widen_bf16" => kernel::widen::<half::bf16>;
    }
    impl WidenKernel for half::f16 {
        const WIDEN = "widen_f16" => kernel::widen::<half::f16>;
    }
    entry points in WIDEN_ENTRY_POINTS;
}

kernel_args! {
    /// `y[i] = x[i]` rounded to nearest even in `T`, for `n` elements.
    pub struct NarrowArgs<T> {
        pub x: DevicePtr<f32>,
        pub y: DevicePtrMut<T>,
        pub n: u64,
    }
    impl NarrowKernel for half::bf16 {
        const NARROW = "narrow_bf16" => kernel::narrow::<half::bf16>;
    }
    impl NarrowKernel for half::f16 {
        const NARROW = "narrow_f16" => kernel::narrow::<half::f16>;
    }
    entry points in NARROW_ENTRY_POINTS;
}

/// The widening kernel of a 16-bit float.
pub trait WidenKernel: Sized {
    const WIDEN: crate::launch::Kernel<WidenArgs<Self>>;
}

/// The narrowing kernel of a 16-bit float.
pub trait NarrowKernel: Sized {
    const NARROW: crate::launch::Kernel<NarrowArgs<Self>>;
}

/// Every conversion's entry point.
pub const ENTRY_POINTS: &[&[crate::launch::EntryPoint]] = &[WIDEN_ENTRY_POINTS, NARROW_ENTRY_POINTS];

/// Enough threads for `n` elements.
const fn geometry(n: u64) -> LaunchGeometry {
    LaunchGeometry::per_item(n.div_ceil(ELEMENTS_PER_THREAD), THREADS)
}

/// The widening of `args.n` elements, or `None` when there are none. Both arrays are
/// 16-byte aligned and distinct.
pub const fn widen<T: WidenKernel>(args: WidenArgs<T>) -> Option<Launch<WidenArgs<T>>> {
    if args.n == 0 {
        return None;
    }
    Some(Launch::new(T::WIDEN, geometry(args.n), args))
}

/// The narrowing of `args.n` elements, or `None` when there are none. Both arrays are
/// 16-byte aligned and distinct.
pub const fn narrow<T: NarrowKernel>(args: NarrowArgs<T>) -> Option<Launch<NarrowArgs<T>>> {
    if args.n == 0 {
        return None;
    }
    Some(Launch::new(T::NARROW, geometry(args.n), args))
}

#[cfg(target_arch = "nvptx64")]
mod kernel {
    use super::*;
    use crate::device::{
        Float16, block_dim_x, block_idx_x, load_global_nc_v4, store_global_v4, thread_idx_x,
    };

    const GROUP: usize = ELEMENTS_PER_THREAD as usize;

    /// The first element of this thread's group.
    #[inline(always)]
    fn first() -> usize {
        (block_idx_x() as u64 * block_dim_x() as u64 + thread_idx_x() as u64) as usize * GROUP
    }

    /// # Safety
    /// `x` and `y` hold `n` elements each, are 16-byte aligned and do not overlap; the
    /// grid covers `n.div_ceil(ELEMENTS_PER_THREAD)` threads.
    #[inline(always)]
    pub unsafe fn widen<T: Float16>(args: WidenArgs<T>) {
        let (x, y, n, first) = (args.x.as_ptr(), args.y.as_mut_ptr(), args.n as usize, first());
        if first + GROUP <= n {
            // SAFETY: the group lies inside both arrays, 16 bytes of x and 32 of y from
            // 16-byte aligned starts (a multiple of 8 elements from aligned bases).
            unsafe {
                let words = load_global_nc_v4(x.add(first).cast());
                let halves = words.map(|w| [T::from_bits(w as u16), T::from_bits((w >> 16) as u16)]);
                let wide = |k: usize| {
                    let [a, b] = halves[k];
                    [a.widen().to_bits(), b.widen().to_bits()]
                };
                let ([a, b], [c, d], [e, f], [g, h]) = (wide(0), wide(1), wide(2), wide(3));
                store_global_v4(y.add(first).cast(), [a, b, c, d]);
                store_global_v4(y.add(first + 4).cast(), [e, f, g, h]);
            }
        } else {
            for i in first..n {
                // SAFETY: i < n.
                unsafe { *y.add(i) = (*x.add(i)).widen() };
            }
        }
    }

    /// # Safety
    /// As [`widen`].
    #[inline(always)]
    pub unsafe fn narrow<T: Float16>(args: NarrowArgs<T>) {
        let (x, y, n, first) = (args.x.as_ptr(), args.y.as_mut_ptr(), args.n as usize, first());
        if first + GROUP <= n {
            // SAFETY: as in `widen`, 32 bytes of x and 16 of y.
            unsafe {
                let low = load_global_nc_v4(x.add(first).cast());
                let high = load_global_nc_v4(x.add(first + 4).cast());
                let pair = |a: u32, b: u32| T::narrow_pair(f32::from_bits(a), f32::from_bits(b));
                let words = [
                    pair(low[0], low[1]),
                    pair(low[2], low[3]),
                    pair(high[0], high[1]),
                    pair(high[2], high[3]),
                ];
                store_global_v4(y.add(first).cast(), words);
            }
        } else {
            for i in first..n {
                // SAFETY: i < n.
                unsafe { *y.add(i) = T::narrow(*x.add(i)) };
            }
        }
    }
}
