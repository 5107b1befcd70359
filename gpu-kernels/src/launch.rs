//! The contract between a kernel and its launch, compiled by both sides: typed device
//! pointers, an argument struct per kernel, the entry points typed by the struct they
//! take, and the [`Launch`] that a plan builds from them with the geometry the kernel
//! body assumes.
//!
//! `kernel_args!` declares a kernel's `#[repr(C)]` argument struct and the entry points
//! that take it: on the device each entry point's parameters are the struct's fields in
//! order (so that device pointers arrive as pointer parameters, which the compiler knows
//! to be global memory), and the host passes the same fields in the same order. One
//! declaration serves both sides, so an argument of the wrong type, or arguments out of
//! order, do not compile; the entry point's name is written once, where it is emitted.

use core::ffi::c_void;
use core::marker::PhantomData;

/// Threads that fill an H100-class SM (2048 resident); plans aim at this many per SM.
pub const THREADS_PER_SM: u64 = 2048;

/// Lanes of a warp.
pub const WARP_LANES: u32 = 32;

/// Lanes that share `items` items, one an item: a power of two, at most a warp.
pub const fn lanes_for(items: u64) -> u32 {
    let lanes = items.next_power_of_two();
    if lanes < WARP_LANES as u64 {
        lanes as u32
    } else {
        WARP_LANES
    }
}

// A device pointer wraps a raw pointer, not a `u64`, although the host never
// dereferences it: as a kernel parameter it is then a pointer, which NVPTX takes to be
// global memory, so the kernel's loads and stores through it are `ld.global` and
// `st.global` rather than generic ones.

/// The chunk `[begin, end)` of an axis of `len` elements that part `part` of `split`
/// covers: chunks of `len / split` rounded up to a multiple of `align`, the last ones
/// shorter or empty.
pub const fn chunk(len: u64, split: u64, part: u64, align: u64) -> (u64, u64) {
    let size = len.div_ceil(split).next_multiple_of(align);
    let begin = if part * size < len { part * size } else { len };
    let end = if begin + size < len { begin + size } else { len };
    (begin, end)
}

/// The device address of `T`s that a kernel reads.
#[repr(transparent)]
pub struct DevicePtr<T> {
    address: *const T,
}

/// The device address of `T`s that a kernel writes (and may read).
#[repr(transparent)]
pub struct DevicePtrMut<T> {
    address: *mut T,
}

macro_rules! device_pointer {
    ($name:ident, $raw:ty, $to_raw:ident) => {
        impl<T> Clone for $name<T> {
            fn clone(&self) -> Self {
                *self
            }
        }
        impl<T> Copy for $name<T> {}

        impl<T> core::fmt::Debug for $name<T> {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                write!(f, "{:#x}", self.address())
            }
        }

        impl<T> $name<T> {
            /// No buffer: for optional arguments, which the kernel tests with
            /// [`Self::is_null`].
            pub const NULL: Self = Self::from_address(0);

            /// The pointer at a device address, as the driver returns it.
            pub const fn from_address(address: u64) -> Self {
                Self {
                    address: core::ptr::without_provenance_mut::<T>(address as usize) as $raw,
                }
            }

            pub fn address(self) -> u64 {
                self.address.addr() as u64
            }

            pub fn is_null(self) -> bool {
                self.address.is_null()
            }

            /// `count` elements further on.
            pub fn offset(self, count: u64) -> Self {
                Self {
                    address: self.address.wrapping_add(count as usize),
                }
            }

            /// The same address as a pointer to `U`.
            pub const fn cast<U>(self) -> $name<U> {
                $name {
                    address: self.address.cast(),
                }
            }

            /// The address as a pointer of the device's generic address space.
            #[cfg(target_arch = "nvptx64")]
            #[inline(always)]
            pub fn $to_raw(self) -> $raw {
                self.address
            }
        }
    };
}

device_pointer!(DevicePtr, *const T, as_ptr);
device_pointer!(DevicePtrMut, *mut T, as_mut_ptr);

impl<T> DevicePtrMut<T> {
    /// The same buffer, read-only: for a kernel that reads and writes one array through
    /// two arguments (in place).
    pub const fn as_const(self) -> DevicePtr<T> {
        DevicePtr {
            address: self.address.cast_const(),
        }
    }
}

/// `__launch_bounds__`: the block size every launch of an entry point uses, and the
/// blocks that must fit on one SM at once, which caps the registers ptxas may give each
/// thread. The PTX build writes them into the entry point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchBounds {
    pub threads: u32,
    pub blocks_per_sm: u32,
}

/// An entry point of the kernel module, typed by the argument struct it takes. Made only
/// by `kernel_args!`, which emits the entry point under the same name.
pub struct Kernel<A> {
    name: &'static str,
    bounds: Option<LaunchBounds>,
    requires: Option<&'static str>,
    arguments: PhantomData<fn(A)>,
}

impl<A> Clone for Kernel<A> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<A> Copy for Kernel<A> {}

impl<A> core::fmt::Debug for Kernel<A> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name)
    }
}

impl<A> Kernel<A> {
    pub(crate) const fn new(
        name: &'static str,
        bounds: Option<LaunchBounds>,
        requires: Option<&'static str>,
    ) -> Self {
        Self {
            name,
            bounds,
            requires,
            arguments: PhantomData,
        }
    }

    /// The entry point's name in the module.
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// Its name and launch bounds, without the argument type.
    pub const fn entry(&self) -> EntryPoint {
        EntryPoint {
            name: self.name,
            bounds: self.bounds,
            requires: self.requires,
        }
    }
}

/// The architecture-specific target whose build holds the entry points on warpgroup
/// MMA (`wgmma`, Hopper only): their `requires`.
pub const WARPGROUP_MMA_ARCH: &str = "sm_90a";

/// An entry point as the PTX build and the module loader see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryPoint {
    pub name: &'static str,
    pub bounds: Option<LaunchBounds>,
    /// The architecture-specific target (`sm_90a`) whose build alone holds the entry
    /// point, for instructions that only it has (`wgmma`); `None`: every build.
    pub requires: Option<&'static str>,
}

impl EntryPoint {
    /// Whether the build for `arch` (`sm_80`, `sm_90a`) holds this entry point.
    pub fn built_for(&self, arch: &str) -> bool {
        self.requires.is_none_or(|target| target == arch)
    }
}

/// What plans need to know of the device they launch on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceLimits {
    pub multiprocessors: u32,
    /// The most dynamic shared memory one block can opt in to.
    pub max_shared_bytes_per_block: u32,
    /// Whether the loaded kernels are the `sm_90a` build, which holds the entry points
    /// on warpgroup MMA (`wgmma`).
    pub warpgroup_mma: bool,
    /// Whether the driver encodes tensor maps, for bulk tensor copies (TMA).
    pub tensor_maps: bool,
}

/// An H100's limits, for the plans' tests.
#[cfg(test)]
pub(crate) const H100: DeviceLimits = DeviceLimits {
    multiprocessors: 132,
    max_shared_bytes_per_block: 227 * 1024,
    warpgroup_mma: true,
    tensor_maps: true,
};

/// Grid, block and dynamic shared memory of one launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchGeometry {
    /// Blocks along x, y and z.
    pub grid: [u64; 3],
    /// Threads of a one-dimensional block.
    pub threads: u32,
    /// Bytes of dynamic shared memory per block.
    pub shared_bytes: u32,
}

impl LaunchGeometry {
    /// `blocks` blocks of `threads` along x, no shared memory.
    pub const fn linear(blocks: u64, threads: u32) -> Self {
        Self {
            grid: [blocks, 1, 1],
            threads,
            shared_bytes: 0,
        }
    }

    /// Enough blocks of `threads` for one thread per item.
    pub const fn per_item(items: u64, threads: u32) -> Self {
        Self::linear(items.div_ceil(threads as u64), threads)
    }

    /// The same with `bytes` of dynamic shared memory.
    pub const fn with_shared(self, bytes: u32) -> Self {
        Self {
            shared_bytes: bytes,
            ..self
        }
    }
}

/// The temporary device memory a launch needs: `bytes` in all, of which the first
/// `zeroed` must be zero before it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ScratchLayout {
    pub bytes: u64,
    pub zeroed: u64,
}

/// An argument struct whose fields are an entry point's parameters, in order. Made by
/// `kernel_args!`.
pub trait KernelArgs: Copy {
    /// Calls `launch` with the address of each field, in order: the kernel parameters
    /// as the driver takes them.
    fn with_parameters<R>(&self, launch: impl FnOnce(&mut [*mut c_void]) -> R) -> R;
}

/// One launch: an entry point, its arguments and its geometry, put together by a
/// plan from the constants the kernel body uses. The host launches it as it is.
#[derive(Debug, Clone, Copy)]
pub struct Launch<A> {
    kernel: Kernel<A>,
    geometry: LaunchGeometry,
    arguments: A,
}

impl<A> Launch<A> {
    pub(crate) const fn new(kernel: Kernel<A>, geometry: LaunchGeometry, arguments: A) -> Self {
        Self {
            kernel,
            geometry,
            arguments,
        }
    }

    pub const fn kernel(&self) -> Kernel<A> {
        self.kernel
    }

    pub const fn geometry(&self) -> LaunchGeometry {
        self.geometry
    }

    /// The argument struct, which the entry point takes as its one parameter.
    pub const fn arguments(&self) -> &A {
        &self.arguments
    }
}

/// Declares a kernel's argument struct and the entry points that take it.
///
/// ```text
/// kernel_args! {
///     /// What the kernel computes.
///     pub struct RowsArgs<T> {
///         pub x: DevicePtr<T>,
///         pub rows: u64,
///     }
///     impl RowsKernel for f32 {
///         const ROWS = "rows_f32" => rows::<f32>, bounds(256, 2);
///     }
///     entry points in ROWS_ENTRY_POINTS;
/// }
/// ```
///
/// gives the `#[repr(C)]` struct, its [`KernelArgs`] impl, `impl RowsKernel for f32 {
/// const ROWS: Kernel<RowsArgs<f32>> }` (the trait is the caller's), and on nvptx64 the
/// exported `extern "ptx-kernel"` function `rows_f32` whose parameters are the fields
/// (with `T = f32`) and whose body calls the `unsafe fn` `rows::<f32>(RowsArgs { .. })`;
/// `ROWS_ENTRY_POINTS` lists every entry point declared. A struct without a type
/// parameter takes `pub const NAME = "symbol" => body;` items instead of impl blocks;
/// these may end in `requires("sm_90a")` for an entry point that only the build for
/// that architecture-specific target holds (its body compiled there alone).
///
/// Fields must be 4- or 8-byte scalars, device pointers, or `#[repr(C)]` structs of
/// them, so that each is one kernel parameter of the same size on both sides.
macro_rules! kernel_args {
    (
        $(#[$meta:meta])*
        pub struct $args:ident<$t:ident $(: $bound:path)?> $fields:tt
        $(
            impl $kernels:ident for $elem:ty {
                $( const $kernel:ident = $name:literal => $body:path $(, bounds($threads:expr, $blocks:expr))?; )*
            }
        )*
        entry points in $list:ident;
    ) => {
        $crate::launch::kernel_args!(@struct $(#[$meta])* $args [$t $(: $bound)?] $fields);
        $(
            impl $kernels for $elem {
                $(
                    const $kernel: $crate::launch::Kernel<$args<$elem>> = {
                        #[cfg(target_arch = "nvptx64")]
                        const _: () = {
                            type $t = $elem;
                            $crate::launch::kernel_args!(@entry $name, $body, $args [$t] $fields);
                        };
                        $crate::launch::Kernel::new($name, $crate::launch::kernel_args!(@bounds $($threads, $blocks)?), None)
                    };
                )*
            }
        )*
        /// Every entry point that takes these arguments.
        pub const $list: &[$crate::launch::EntryPoint] = &[
            $( $( <$elem as $kernels>::$kernel.entry(), )* )*
        ];
    };
    (
        $(#[$meta:meta])*
        pub struct $args:ident $fields:tt
        $(
            $(#[$kernel_meta:meta])*
            pub const $kernel:ident = $name:literal => $body:path
                $(, bounds($threads:expr, $blocks:expr))? $(, requires($target:literal))?;
        )*
        entry points in $list:ident;
    ) => {
        $crate::launch::kernel_args!(@struct $(#[$meta])* $args [] $fields);
        $(
            $(#[$kernel_meta])*
            pub const $kernel: $crate::launch::Kernel<$args> = {
                #[cfg(target_arch = "nvptx64")]
                $( #[cfg(target_feature = $target)] )?
                const _: () = {
                    $crate::launch::kernel_args!(@entry $name, $body, $args [] $fields);
                };
                $crate::launch::Kernel::new(
                    $name,
                    $crate::launch::kernel_args!(@bounds $($threads, $blocks)?),
                    $crate::launch::kernel_args!(@requires $($target)?),
                )
            };
        )*
        /// Every entry point that takes these arguments.
        pub const $list: &[$crate::launch::EntryPoint] = &[ $( $kernel.entry(), )* ];
    };
    (@struct $(#[$meta:meta])* $args:ident [$($t:ident $(: $bound:path)?)?] {
        $( $(#[$field_meta:meta])* pub $field:ident: $field_ty:ty, )*
    }) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Debug, Clone, Copy)]
        pub struct $args $(<$t $(: $bound)?>)? {
            $( $(#[$field_meta])* pub $field: $field_ty, )*
        }

        impl $(<$t: Copy $(+ $bound)?>)? $crate::launch::KernelArgs for $args $(<$t>)? {
            fn with_parameters<R>(&self, launch: impl FnOnce(&mut [*mut core::ffi::c_void]) -> R) -> R {
                launch(&mut [ $( &self.$field as *const $field_ty as *mut core::ffi::c_void, )* ])
            }
        }
    };
    (@entry $name:literal, $body:path, $args:ident [$($t:ident)?] {
        $( $(#[$field_meta:meta])* pub $field:ident: $field_ty:ty, )*
    }) => {
        #[unsafe(export_name = $name)]
        unsafe extern "ptx-kernel" fn entry($( $field: $field_ty, )*) {
            // SAFETY: the host launches this entry point only through the `Launch` that
            // the kernel's plan builds, with the geometry and the arguments that the
            // body's contract asks for.
            unsafe { $body($args $(::<$t>)? { $( $field, )* }) }
        }
    };
    (@bounds) => {
        None
    };
    (@requires) => {
        None
    };
    (@requires $target:literal) => {
        Some($target)
    };
    (@bounds $threads:expr, $blocks:expr) => {
        Some($crate::launch::LaunchBounds {
            threads: $threads,
            blocks_per_sm: $blocks,
        })
    };
}
pub(crate) use kernel_args;
