//! Arrays in device memory.

use cust::memory::{DeviceBuffer, DeviceCopy};
use gpu_kernels::launch::{DevicePtr, DevicePtrMut};

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

/// A dense, row-major array in device memory: its buffer, dtype and shape.
///
/// Made by [`Gpu::upload`](crate::Gpu::upload) or [`Gpu::alloc`](crate::Gpu::alloc);
/// the buffer starts 256-byte aligned, as every kernel's vector access needs.
pub struct DeviceArray<T: Element> {
    pub(crate) buffer: DeviceBuffer<T::Bits>,
    shape: Vec<usize>,
}

impl<T: Element> DeviceArray<T> {
    pub(crate) fn new(buffer: DeviceBuffer<T::Bits>, shape: Vec<usize>) -> Self {
        debug_assert_eq!(buffer.len(), shape.iter().product::<usize>());
        Self { buffer, shape }
    }

    /// The elements' device address, for a kernel that reads them.
    pub(crate) fn ptr(&self) -> DevicePtr<T> {
        DevicePtr::from_address(self.buffer.as_device_ptr().as_raw())
    }

    /// The elements' device address, for a kernel that writes them.
    pub(crate) fn ptr_mut(&mut self) -> DevicePtrMut<T> {
        DevicePtrMut::from_address(self.buffer.as_device_ptr().as_raw())
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
        self.buffer.len()
    }

    /// Whether the array holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The same elements under another row-major shape with as many elements.
    pub fn reshape(self, shape: &[usize]) -> crate::Result<Self> {
        if shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) != Some(self.len()) {
            return Err(crate::Error::ShapeMismatch {
                what: "reshaped array (element count)",
                expected: self.shape.clone(),
                actual: shape.to_vec(),
            });
        }
        Ok(Self {
            buffer: self.buffer,
            shape: shape.to_vec(),
        })
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
