//! Arrays in device memory.

use cust::memory::{DeviceBuffer, DeviceCopy};
use gpu_kernels::launch::{DevicePtr, DevicePtrMut};

use crate::driver::{self, Memory};
use crate::error::{Error, Result};
use crate::gpu::{Gpu, element_count};

/// Element types the kernels handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    F32,
    F64,
    I32,
    I64,
    BF16,
    F16,
}

/// A type that can live in a [`DeviceArray`].
pub trait Element: Copy + Default + PartialEq + Send + Sync + std::fmt::Debug + 'static {
    const DTYPE: DType;
    /// What the driver copies: the element itself, or the bits of a `half` type (which
    /// `cust` does not know).
    type Bits: DeviceCopy + Default;
    /// The elements as their bits, without a copy.
    fn as_bits(elements: &[Self]) -> &[Self::Bits];
    /// The bits as elements, without a copy.
    fn from_bits(bits: Vec<Self::Bits>) -> Vec<Self>;
}

macro_rules! element_is_its_bits {
    ($($t:ty => $dtype:ident),*) => {$(
        impl Element for $t {
            const DTYPE: DType = DType::$dtype;
            type Bits = $t;
            fn as_bits(elements: &[Self]) -> &[Self] {
                elements
            }
            fn from_bits(bits: Vec<Self>) -> Vec<Self> {
                bits
            }
        }
    )*};
}

element_is_its_bits!(f32 => F32, f64 => F64, i32 => I32, i64 => I64);

macro_rules! element_of_half {
    ($($t:ty => $dtype:ident),*) => {$(
        impl Element for $t {
            const DTYPE: DType = DType::$dtype;
            type Bits = u16;
            fn as_bits(elements: &[Self]) -> &[u16] {
                use half::slice::HalfFloatSliceExt;
                elements.reinterpret_cast()
            }
            fn from_bits(bits: Vec<u16>) -> Vec<Self> {
                use half::vec::HalfBitsVecExt;
                bits.reinterpret_into()
            }
        }
    )*};
}

element_of_half!(half::bf16 => BF16, half::f16 => F16);

/// The alignment the kernels' vector and bulk accesses need of an array's start.
pub const ARRAY_ALIGNMENT: usize = 16;

/// A dense, row-major array in device memory: its memory, dtype and shape.
///
/// Made by [`Gpu::upload`](crate::Gpu::upload) or [`Gpu::alloc`](crate::Gpu::alloc),
/// which allocate (256-byte aligned), or by [`DeviceArray::from_raw_parts`] over memory
/// that another library owns.
pub struct DeviceArray<T: Element> {
    pub(crate) memory: Memory<T::Bits>,
    shape: Vec<usize>,
}

impl<T: Element> DeviceArray<T> {
    pub(crate) fn new(buffer: DeviceBuffer<T::Bits>, shape: Vec<usize>) -> Self {
        debug_assert_eq!(buffer.len(), shape.iter().product::<usize>());
        Self {
            memory: Memory::Owned(buffer),
            shape,
        }
    }

    /// An array over device memory that another owner keeps (a PyTorch tensor's, say),
    /// without a copy: `shape`'s elements, row-major, from `address`. Checks that the
    /// address is aligned to [`ARRAY_ALIGNMENT`] and that the range is memory of `gpu`'s
    /// device (one allocation, or first and last bytes on it). Dropping the array
    /// leaves the memory to its owner.
    ///
    /// # Safety
    /// The memory holds `shape`'s elements and stays allocated while the array lives and
    /// until the work queued with it on `gpu`'s stream is done; nothing else writes it
    /// (or, if the array is written, reads it) unordered with that work, and an array
    /// written by an operation overlaps none of that operation's other arrays.
    pub unsafe fn from_raw_parts(gpu: &Gpu, address: u64, shape: &[usize]) -> Result<Self> {
        let array = Self::borrowed(address, shape)?;
        if !array.is_empty() {
            gpu.bind()?;
            driver::check_device_range(address, array.len() * size_of::<T::Bits>(), gpu.info().ordinal)?;
        }
        Ok(array)
    }

    /// [`DeviceArray::from_raw_parts`] without asking the driver whether the range is
    /// the device's memory (about a microsecond a call): for memory whose owner
    /// guarantees that, such as a CUDA tensor of the device. Checks the alignment.
    ///
    /// # Safety
    /// As [`DeviceArray::from_raw_parts`], and the range is memory of the device of the
    /// [`Gpu`] the array is used with.
    pub unsafe fn from_raw_parts_unchecked(address: u64, shape: &[usize]) -> Result<Self> {
        Self::borrowed(address, shape)
    }

    /// The array of `shape` at `address`, once the address is found aligned.
    fn borrowed(address: u64, shape: &[usize]) -> Result<Self> {
        let len = element_count::<T::Bits>(shape)?;
        if !(address as usize).is_multiple_of(ARRAY_ALIGNMENT) {
            return Err(Error::InvalidParameter {
                parameter: "device address",
                detail: format!("{address:#x} is not {ARRAY_ALIGNMENT}-byte aligned"),
            });
        }
        Ok(Self {
            memory: Memory::Borrowed { address, len },
            shape: shape.to_vec(),
        })
    }

    /// The elements' device address, for a kernel that reads them.
    pub(crate) fn ptr(&self) -> DevicePtr<T> {
        DevicePtr::from_address(self.memory.address())
    }

    /// The elements' device address, for a kernel that writes them.
    pub(crate) fn ptr_mut(&mut self) -> DevicePtrMut<T> {
        DevicePtrMut::from_address(self.memory.address())
    }

    /// The device address of the first element, for handing the array to another
    /// library (it stays owned by this array).
    pub fn address(&self) -> u64 {
        self.memory.address()
    }

    /// The extent of each axis, outermost first.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The number of axes.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.memory.len()
    }

    /// Whether the array holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The same elements under another row-major shape with as many elements.
    pub fn reshape(self, shape: &[usize]) -> Result<Self> {
        if shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) != Some(self.len()) {
            return Err(Error::ShapeMismatch {
                what: "reshaped array (element count)",
                expected: self.shape.clone(),
                actual: shape.to_vec(),
            });
        }
        Ok(Self {
            memory: self.memory,
            shape: shape.to_vec(),
        })
    }

    /// Views the same elements under `shape` (as many elements), in place.
    pub(crate) fn set_shape(&mut self, shape: &[usize]) {
        assert_eq!(
            shape.iter().product::<usize>(),
            self.len(),
            "set_shape keeps the element count"
        );
        self.shape = shape.to_vec();
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        T::DTYPE
    }

    /// Bytes of device memory the elements take.
    pub fn bytes(&self) -> usize {
        self.len() * size_of::<T>()
    }
}

impl<T: Element> std::fmt::Debug for DeviceArray<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceArray<{:?}>{:?}", T::DTYPE, self.shape)
    }
}
