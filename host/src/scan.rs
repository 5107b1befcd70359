//! Cumulative sums along an axis: exclusive (`y[0] = 0`, `y[i] = x[0] + ... + x[i-1]`)
//! or inclusive, optionally from the end, in one pass over the data. Integers wrap on
//! overflow, as torch's do.

use gpu_kernels::element::Summed;
use gpu_kernels::launch::{DevicePtr, DevicePtrMut};
use gpu_kernels::scan::{self as kernel, EXCLUSIVE, REVERSE, ScanOperands, ScanPlan, ScanProblem, ScanType};
use ndarray::{ArrayBase, ArrayD, Data, Dimension};

use crate::array::{DeviceArray, Element};
use crate::error::{Error, Result};
use crate::gpu::Gpu;

/// Which cumulative sum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanKind {
    /// `y[i] = x[0] + ... + x[i-1]`, `y[0] = 0`.
    Exclusive,
    /// `y[i] = x[0] + ... + x[i]`.
    Inclusive,
}

/// Element types the scan handles; their sums are elements too (a device group's
/// carries).
pub trait ScanElement: Element + ScanType + Summed<Sum: Element> {
    /// The type the CPU reference accumulates in: f64 for floats, the type itself
    /// (wrapping) for integers.
    type Accumulator: Copy + Default + Send + Sync;
    fn widen(self) -> Self::Accumulator;
    fn narrow(sum: Self::Accumulator) -> Self;
    fn accumulate(sum: Self::Accumulator, value: Self::Accumulator) -> Self::Accumulator;
}

macro_rules! scan_element {
    ($($t:ty, $acc:ty, $add:expr;)*) => {$(
        impl ScanElement for $t {
            type Accumulator = $acc;
            fn widen(self) -> $acc {
                self as $acc
            }
            fn narrow(sum: $acc) -> Self {
                sum as $t
            }
            fn accumulate(sum: $acc, value: $acc) -> $acc {
                $add(sum, value)
            }
        }
    )*};
}

scan_element! {
    f32, f64, |a: f64, b| a + b;
    f64, f64, |a: f64, b| a + b;
    i32, i32, i32::wrapping_add;
    i64, i64, i64::wrapping_add;
}

macro_rules! scan_element_16 {
    ($($t:ty),*) => {$(
        impl ScanElement for $t {
            type Accumulator = f64;
            fn widen(self) -> f64 {
                self.to_f64()
            }
            fn narrow(sum: f64) -> Self {
                <$t>::from_f64(sum)
            }
            fn accumulate(sum: f64, value: f64) -> f64 {
                sum + value
            }
        }
    )*};
}

scan_element_16!(half::bf16, half::f16);

/// The scan kernels' option bits of a scan.
pub(crate) fn scan_options(kind: ScanKind, reverse: bool) -> u32 {
    (if kind == ScanKind::Exclusive { EXCLUSIVE } else { 0 }) | if reverse { REVERSE } else { 0 }
}

/// Validates a scan along `axis` of `shape` and views it as `[outer, scan, inner]`.
pub fn scan_problem(shape: &[usize], axis: usize) -> Result<ScanProblem> {
    if shape.is_empty() {
        return Err(Error::ZeroRank { op: "cumsum" });
    }
    if axis >= shape.len() {
        return Err(Error::InvalidAxis {
            axis,
            rank: shape.len(),
        });
    }
    let product = |dims: &[usize]| dims.iter().map(|&d| d as u64).product();
    Ok(ScanProblem {
        outer: product(&shape[..axis]),
        scan: shape[axis] as u64,
        inner: product(&shape[axis + 1..]),
    })
}

impl Gpu {
    /// The cumulative sum of `x` along `axis`, in a new array.
    pub fn cumsum<T: ScanElement>(
        &self,
        x: &DeviceArray<T>,
        axis: usize,
        kind: ScanKind,
        reverse: bool,
    ) -> Result<DeviceArray<T>> {
        scan_problem(x.shape(), axis)?;
        let mut y = self.alloc(x.shape())?;
        self.cumsum_into(x, &mut y, axis, kind, reverse)?;
        Ok(y)
    }

    /// The cumulative sum of `x` along `axis`, written to `y` (same shape).
    pub fn cumsum_into<T: ScanElement>(
        &self,
        x: &DeviceArray<T>,
        y: &mut DeviceArray<T>,
        axis: usize,
        kind: ScanKind,
        reverse: bool,
    ) -> Result<()> {
        if x.shape() != y.shape() {
            return Err(Error::ShapeMismatch {
                what: "cumsum output",
                expected: x.shape().to_vec(),
                actual: y.shape().to_vec(),
            });
        }
        self.scan(x.ptr(), y.ptr_mut(), x.shape(), axis, kind, reverse)
    }

    /// The cumulative sum of `x` along `axis`, written over `x`: no second buffer.
    pub fn cumsum_in_place<T: ScanElement>(
        &self,
        x: &mut DeviceArray<T>,
        axis: usize,
        kind: ScanKind,
        reverse: bool,
    ) -> Result<()> {
        let y = x.ptr_mut();
        self.scan(y.as_const(), y, x.shape(), axis, kind, reverse)
    }

    /// [`Gpu::cumsum`] of a host array or view: uploads, scans in place, downloads.
    pub fn cumsum_of<T: ScanElement, S: Data<Elem = T>, D: Dimension>(
        &self,
        x: &ArrayBase<S, D>,
        axis: usize,
        kind: ScanKind,
        reverse: bool,
    ) -> Result<ArrayD<T>> {
        scan_problem(x.shape(), axis)?;
        let mut device = self.upload(x)?;
        self.cumsum_in_place(&mut device, axis, kind, reverse)?;
        self.download(&device)
    }

    /// The plan of a scan of an array of `shape` along `axis` on this device: which
    /// kernel runs it and how (`None` for an empty array, which launches nothing).
    pub fn cumsum_plan<T: ScanElement>(&self, shape: &[usize], axis: usize) -> Result<Option<ScanPlan>> {
        let problem = scan_problem(shape, axis)?;
        Ok((problem.elements() > 0).then(|| kernel::plan(&problem, size_of::<T>(), &self.limits())))
    }

    /// The problem and plan of a scan along `axis` of an array of `shape` (`None` when
    /// empty), checked against the kernels' limits.
    pub(crate) fn checked_scan_plan<T: ScanElement>(
        &self,
        shape: &[usize],
        axis: usize,
    ) -> Result<Option<(ScanProblem, ScanPlan)>> {
        let problem = scan_problem(shape, axis)?;
        let Some(plan) = self.cumsum_plan::<T>(shape, axis)? else {
            return Ok(None);
        };
        log::debug!("cumsum {shape:?} axis {axis}: {problem:?} -> {plan:?}");
        // Tile ids come from a 32-bit counter, which persistent blocks draw past the
        // last tile once per stage.
        if plan.tiles() >= (u32::MAX / 2) as u64 {
            return Err(Error::TooLarge {
                shape: shape.to_vec(),
                detail: format!("{} scan tiles", plan.tiles()),
            });
        }
        Ok(Some((problem, plan)))
    }

    /// Scans the array of `shape` at `x` into `y`, which is `x` itself or another
    /// array of that shape.
    fn scan<T: ScanElement>(
        &self,
        x: DevicePtr<T>,
        y: DevicePtrMut<T>,
        shape: &[usize],
        axis: usize,
        kind: ScanKind,
        reverse: bool,
    ) -> Result<()> {
        let Some((problem, plan)) = self.checked_scan_plan::<T>(shape, axis)? else {
            return Ok(());
        };
        let operands = ScanOperands {
            x,
            y,
            problem,
            options: scan_options(kind, reverse),
        };
        // The scratch stays reserved until the launch is queued; later users queue after.
        let (_scratch, scratch) = self.scratch(plan.scratch(size_of::<T>()))?;
        match plan {
            ScanPlan::Rows(rows) => self.launch(&rows.launch(operands)),
            ScanPlan::PackedRows(packed) => self.launch(&packed.launch(operands)),
            ScanPlan::Columns(columns) => self.launch(&columns.launch(operands)),
            ScanPlan::Contiguous(contiguous) => self.launch(&contiguous.launch(operands, scratch)),
            ScanPlan::Segments(segments) => self.launch(&segments.launch(operands, scratch)),
            ScanPlan::Strided(strided) => self.launch(&strided.launch(operands, scratch)),
        }
    }
}
