//! TMA tensor maps (sm_90): how a kernel's plan describes a tensor for the bulk tensor
//! copies, the 128 opaque bytes that the driver encodes from that description, and the
//! kernel that puts them in device memory in stream order (a launch copies its
//! parameters, so no host buffer has to outlive the call).

use crate::launch::{DevicePtrMut, Launch, LaunchGeometry, kernel_args};

/// An encoded tensor map (`CUtensorMap`): 128 bytes, 128-byte aligned (as CUDA 13's
/// header declares it), in device memory where the bulk tensor copies read it.
#[repr(C, align(128))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorMap(pub [u64; 16]);

/// How a bulk tensor copy walks the tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorMapMode {
    /// Boxes of `box_dims` elements (innermost first), out-of-bounds elements zero.
    Tiled { box_dims: [u32; 5] },
    /// im2col over a tensor of `rank` dimensions `[channels, spatial.., batch]`: each
    /// copy reads `pixels` pixels of `channels` channels along the output positions of
    /// a convolution window's origin, whose range along each spatial dimension (innermost
    /// first) starts `lower` elements before the tensor and ends `upper` elements after
    /// it; out-of-bounds pixels are zero.
    Im2col {
        lower: [i32; 3],
        upper: [i32; 3],
        channels: u32,
        pixels: u32,
    },
}

/// How the rows of a box are laid out in shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorMapSwizzle {
    /// As they lie, one after the other. The box's first element along the innermost
    /// dimension must then lie at a 16-byte multiple of the tensor's rows.
    None,
    /// Rows of 128 bytes, 16-byte chunk `c` of row `r` at chunk `c ^ (r % 8)`: the
    /// layout `wgmma` reads operands in, free of bank conflicts.
    Bytes128,
}

/// The tensor's elements, and what the bulk copies put in shared memory for each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorMapElement {
    /// The value as it is.
    F32,
    /// The value rounded to TF32 to nearest (`CU_TENSOR_MAP_DATA_TYPE_TFLOAT32`): what
    /// TF32 `wgmma` needs of an operand it reads from shared memory, since it would
    /// drop the low mantissa bits of an `f32`.
    Tf32,
    /// A bf16 as it is.
    Bf16,
    /// An f16 as it is.
    F16,
}

impl TensorMapElement {
    /// Bytes of one element in the tensor.
    pub const fn bytes(self) -> u64 {
        match self {
            Self::F32 | Self::Tf32 => 4,
            Self::Bf16 | Self::F16 => 2,
        }
    }
}

/// A tensor as a tensor map describes it, and how its boxes land in shared
/// memory. Bulk tensor copies fault unless a box starts at a 16-byte multiple along
/// the innermost dimension (seen on the H100, whatever the swizzle).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorMapSpec {
    /// Device address of the first element, 16-byte aligned.
    pub address: u64,
    pub rank: u32,
    /// Extents, innermost first.
    pub dims: [u64; 5],
    /// Byte strides of dimensions 1 to `rank - 1` (multiples of 16).
    pub strides: [u64; 4],
    /// Steps between the elements copied, per dimension (the convolution's strides in
    /// im2col mode).
    pub element_strides: [u32; 5],
    pub mode: TensorMapMode,
    pub swizzle: TensorMapSwizzle,
    pub element: TensorMapElement,
}

impl TensorMapSpec {
    /// The map of a dense tensor of `f32` at `address` with extents `dims` (innermost
    /// first, at most 5), copied in boxes of `box_dims`.
    pub fn tiled(address: u64, dims: &[u64], box_dims: &[u32], swizzle: TensorMapSwizzle) -> Self {
        Self::tiled_of(TensorMapElement::F32, address, dims, box_dims, swizzle)
    }

    /// [`Self::tiled`] of a tensor of `element`s.
    pub fn tiled_of(
        element: TensorMapElement,
        address: u64,
        dims: &[u64],
        box_dims: &[u32],
        swizzle: TensorMapSwizzle,
    ) -> Self {
        let (mut extents, mut strides, mut boxes, mut element_strides) = ([0; 5], [0; 4], [0; 5], [0; 5]);
        let mut stride = element.bytes();
        for (d, (&extent, &box_extent)) in dims.iter().zip(box_dims).enumerate() {
            (extents[d], boxes[d], element_strides[d]) = (extent, box_extent, 1);
            if let Some(outer) = d.checked_sub(1) {
                strides[outer] = stride;
            }
            stride *= extent;
        }
        Self {
            address,
            rank: dims.len() as u32,
            dims: extents,
            strides,
            element_strides,
            mode: TensorMapMode::Tiled { box_dims: boxes },
            swizzle,
            element,
        }
    }

    /// The same map, its copies rounding each element to TF32.
    pub const fn rounded_to_tf32(self) -> Self {
        Self {
            element: TensorMapElement::Tf32,
            ..self
        }
    }
}

/// Two tensor maps in device memory.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorMapPair(pub [TensorMap; 2]);

/// The words of two tensor maps, as one kernel parameter (parameters are at most
/// 16-byte aligned).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorMapWords(pub [u64; 32]);

impl TensorMapWords {
    pub fn of(maps: &[TensorMap; 2]) -> Self {
        Self(core::array::from_fn(|i| maps[i / 16].0[i % 16]))
    }
}

kernel_args! {
    /// Writes two tensor maps to `dst`.
    pub struct WriteTensorMapsArgs {
        pub dst: DevicePtrMut<TensorMapPair>,
        pub words: TensorMapWords,
    }
    /// The tensor-map writer.
    pub const WRITE_TENSOR_MAPS = "write_tensor_maps" => kernel::write_tensor_maps;
    entry points in ENTRY_POINTS;
}

/// The launch that writes the maps of `words` to `dst` (128-byte aligned).
pub const fn write_launch(
    dst: DevicePtrMut<TensorMapPair>,
    words: TensorMapWords,
) -> Launch<WriteTensorMapsArgs> {
    Launch::new(
        WRITE_TENSOR_MAPS,
        LaunchGeometry::linear(1, 1),
        WriteTensorMapsArgs { dst, words },
    )
}

#[cfg(target_arch = "nvptx64")]
mod kernel {
    use super::*;

    /// Writes the 32 words (one thread: constant indices keep the parameter in the
    /// parameter space).
    ///
    /// # Safety
    /// `dst` holds 256 writable bytes.
    #[inline(always)]
    pub unsafe fn write_tensor_maps(args: WriteTensorMapsArgs) {
        let dst = args.dst.as_mut_ptr();
        for (word, &value) in args.words.0.iter().enumerate() {
            // SAFETY: word `word` of the 32 words at `dst`.
            unsafe { (*dst).0[word / 16].0[word % 16] = value };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tiled_map_strides_over_the_dense_tensor() {
        // x (2, 5, 7, 12) in NHWC: channels, then columns, rows and images.
        let spec = TensorMapSpec::tiled(256, &[12, 7, 5, 2], &[8, 4, 1, 1], TensorMapSwizzle::Bytes128);
        let want = TensorMapSpec {
            address: 256,
            rank: 4,
            dims: [12, 7, 5, 2, 0],
            strides: [4 * 12, 4 * 12 * 7, 4 * 12 * 7 * 5, 0],
            element_strides: [1, 1, 1, 1, 0],
            mode: TensorMapMode::Tiled {
                box_dims: [8, 4, 1, 1, 0],
            },
            swizzle: TensorMapSwizzle::Bytes128,
            element: TensorMapElement::F32,
        };
        assert_eq!(spec, want);
    }
}
