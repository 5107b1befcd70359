//! Layout changes of 4-D arrays between channels first (`[n, c, h, w]`, NCHW) and
//! channels last (`[n, h, w, c]`, NHWC), by the batched transpose kernel.

use gpu_kernels::conv::ConvLayout;
use gpu_kernels::transpose;

use crate::array::{DeviceArray, Element};
use crate::driver::Temporary;
use crate::error::{Error, Result};
use crate::gpu::Gpu;

impl Gpu {
    /// `[n, c, h, w]` as `[n, h, w, c]`, in a new array (the elements' bits moved
    /// unchanged; 4-byte or 2-byte elements).
    pub fn to_channels_last<T: Element>(&self, x: &DeviceArray<T>) -> Result<DeviceArray<T>> {
        let [n, c, h, w] = rank4(x)?;
        let mut y = self.alloc(&[n, h, w, c])?;
        self.change_layout(x, &mut y, ConvLayout::Nchw)?;
        Ok(y)
    }

    /// `[n, h, w, c]` as `[n, c, h, w]`, in a new array (the elements' bits moved
    /// unchanged; 4-byte or 2-byte elements).
    pub fn to_channels_first<T: Element>(&self, x: &DeviceArray<T>) -> Result<DeviceArray<T>> {
        let [n, h, w, c] = rank4(x)?;
        let mut y = self.alloc(&[n, c, h, w])?;
        self.change_layout(x, &mut y, ConvLayout::Nhwc)?;
        Ok(y)
    }

    /// `x`, in layout `from`, in the other layout, in a temporary of the operation.
    pub(crate) fn relayout<T: Element>(
        &self,
        x: &DeviceArray<T>,
        from: ConvLayout,
    ) -> Result<Temporary<'_, T>> {
        let [n, a, b, c] = rank4(x)?;
        let shape = match from {
            ConvLayout::Nchw => [n, b, c, a],
            ConvLayout::Nhwc => [n, c, a, b],
        };
        let mut y = self.temporary(&shape)?;
        self.change_layout(x, &mut y, from)?;
        Ok(y)
    }

    /// `x`, in layout `from`, written to `y` in the other layout (`y`'s shape is the
    /// caller's to get right).
    pub(crate) fn change_layout<T: Element>(
        &self,
        x: &DeviceArray<T>,
        y: &mut DeviceArray<T>,
        from: ConvLayout,
    ) -> Result<()> {
        let [n, a, b, c] = rank4(x)?;
        match from {
            ConvLayout::Nchw => self.transpose(x, y, n, a, b * c),
            ConvLayout::Nhwc => self.transpose(x, y, n, a * b, c),
        }
    }

    /// `y[b][j][i] = x[b][i][j]` for `batch` matrices of `rows x cols`.
    fn transpose<T: Element>(
        &self,
        x: &DeviceArray<T>,
        y: &mut DeviceArray<T>,
        batch: usize,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        let [batch, rows, cols] = [batch, rows, cols].map(|d| d as u64);
        let launched = match size_of::<T>() {
            4 => transpose::launch::<u32>(x.ptr().cast(), y.ptr_mut().cast(), batch, rows, cols)
                .map(|launch| self.launch(&launch)),
            2 => match transpose::launch_pairs(x.ptr().cast(), y.ptr_mut().cast(), batch, rows, cols) {
                Some(pairs) => Some(self.launch(&pairs)),
                None => transpose::launch::<u16>(x.ptr().cast(), y.ptr_mut().cast(), batch, rows, cols)
                    .map(|launch| self.launch(&launch)),
            },
            _ => {
                return Err(Error::InvalidParameter {
                    parameter: "dtype",
                    detail: format!(
                        "layout changes move 4-byte or 2-byte elements; {:?} is neither",
                        T::DTYPE
                    ),
                });
            }
        };
        launched.unwrap_or(Ok(()))
    }
}

fn rank4<T: Element>(x: &DeviceArray<T>) -> Result<[usize; 4]> {
    <[usize; 4]>::try_from(x.shape()).map_err(|_| Error::WrongRank {
        what: "the array to relayout",
        expected: "rank 4",
        shape: x.shape().to_vec(),
    })
}
