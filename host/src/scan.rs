//! Cumulative sums along an axis: exclusive (`y[0] = 0`, `y[i] = x[0] + ... + x[i-1]`)
//! or inclusive, optionally from the end, in one pass over the data. Integers wrap on
//! overflow, as torch's do.

use gpu_kernels::scan::{self as policy, EXCLUSIVE, LaunchStatus, REVERSE, ScanDType, ScanPlan, ScanProblem};
use ndarray::{ArrayBase, ArrayD, Data, Dimension};

use crate::array::{DeviceArray, Element};
use crate::driver::{LaunchConfig, kernel_args};
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

/// Element types the scan handles.
pub trait ScanElement: Element {
    #[doc(hidden)]
    const SCAN_DTYPE: ScanDType;
    /// The type the CPU reference accumulates in: f64 for floats, the type itself
    /// (wrapping) for integers.
    type Accumulator: Copy + Default + Send + Sync;
    fn widen(self) -> Self::Accumulator;
    fn narrow(sum: Self::Accumulator) -> Self;
    fn accumulate(sum: Self::Accumulator, value: Self::Accumulator) -> Self::Accumulator;
}

macro_rules! scan_element {
    ($($t:ty, $dtype:ident, $acc:ty, $add:expr;)*) => {$(
        impl ScanElement for $t {
            const SCAN_DTYPE: ScanDType = ScanDType::$dtype;
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
    f32, F32, f64, |a: f64, b| a + b;
    f64, F64, f64, |a: f64, b| a + b;
    i32, I32, i32, i32::wrapping_add;
    i64, I64, i64, i64::wrapping_add;
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
        let y_ptr = y.buffer.as_device_ptr().as_raw();
        self.scan(x, y_ptr, axis, kind, reverse)
    }

    /// The cumulative sum of `x` along `axis`, written over `x`: no second buffer.
    pub fn cumsum_in_place<T: ScanElement>(
        &self,
        x: &mut DeviceArray<T>,
        axis: usize,
        kind: ScanKind,
        reverse: bool,
    ) -> Result<()> {
        let x_ptr = x.buffer.as_device_ptr().as_raw();
        self.scan(x, x_ptr, axis, kind, reverse)
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

    /// Scans `x` into the array at device address `y`, which is `x` itself or another
    /// array of its shape.
    fn scan<T: ScanElement>(
        &self,
        x: &DeviceArray<T>,
        y: u64,
        axis: usize,
        kind: ScanKind,
        reverse: bool,
    ) -> Result<()> {
        let problem = scan_problem(x.shape(), axis)?;
        if x.is_empty() {
            return Ok(());
        }
        let info = self.info();
        let plan = policy::plan(&problem, size_of::<T>(), info.max_shared_bytes_per_block);
        log::debug!("cumsum {:?} axis {axis}: {problem:?} -> {plan:?}", x.shape());
        let tiles = plan.tiles();
        // Tile ids come from a 32-bit counter, which persistent blocks draw past the
        // last tile once per stage.
        if tiles >= (u32::MAX / 2) as u64 {
            return Err(Error::TooLarge {
                shape: x.shape().to_vec(),
                detail: format!("{tiles} scan tiles"),
            });
        }
        // The look-back kernels' status, in the scratch buffer, zeroed where a flag
        // lives: [counter, padding, word per tile] when packed (4-byte values, one
        // value per tile), else [counter, flags] then aggregates and inclusives. The
        // rows kernel needs none.
        let null = std::ptr::null_mut::<T>();
        let (_scratch, status) = if plan.status_width() == 0 {
            let none = LaunchStatus::<T> {
                counter_and_flags: null.cast(),
                aggregates: null,
                inclusives: null,
            };
            (None, none)
        } else if plan.status_width() == 1 && policy::packed_status(size_of::<T>()) {
            let bytes = (8 * (tiles + 1)) as usize;
            let (mut scratch, base) = self.scratch(bytes)?;
            scratch.zero(0, bytes, self.stream())?;
            let status = LaunchStatus::<T> {
                counter_and_flags: base as *mut u32,
                aggregates: null,
                inclusives: null,
            };
            (Some(scratch), status)
        } else {
            let flag_bytes = (4 * (tiles + 1)).next_multiple_of(256) as usize;
            let values =
                ((tiles * plan.status_width() as u64) as usize * size_of::<T>()).next_multiple_of(256);
            let (mut scratch, base) = self.scratch(flag_bytes + 2 * values)?;
            scratch.zero(0, flag_bytes, self.stream())?;
            let status = LaunchStatus::<T> {
                counter_and_flags: base as *mut u32,
                aggregates: (base + flag_bytes as u64) as *mut T,
                inclusives: (base + (flag_bytes + values) as u64) as *mut T,
            };
            (Some(scratch), status)
        };
        let options =
            if kind == ScanKind::Exclusive { EXCLUSIVE } else { 0 } | if reverse { REVERSE } else { 0 };
        let x_ptr = x.buffer.as_device_ptr().as_raw();
        let config = LaunchConfig {
            shared_bytes: plan.shared_bytes(),
            ..LaunchConfig::linear(plan.blocks(info.multiprocessors), plan.threads())
        };
        let name = policy::kernel_name(&plan, T::SCAN_DTYPE, reverse);
        let (column_blocks, stages, parts) = match plan {
            ScanPlan::Strided { column_blocks, .. } => (column_blocks, 0, 0),
            ScanPlan::Segments { stages, .. } => (0, stages, 0),
            ScanPlan::Columns { parts, .. } => (0, 0, parts),
            ScanPlan::Rows { .. } | ScanPlan::Contiguous { .. } => (0, 0, 0),
        };
        let mut args = match plan {
            ScanPlan::Rows { .. } => kernel_args![x_ptr, y, problem, options],
            ScanPlan::Columns { .. } => kernel_args![x_ptr, y, problem, options, parts],
            ScanPlan::Contiguous { .. } => kernel_args![x_ptr, y, problem, options, status],
            ScanPlan::Segments { .. } => kernel_args![x_ptr, y, problem, options, status, stages],
            ScanPlan::Strided { .. } => kernel_args![x_ptr, y, problem, options, status, column_blocks],
        };
        // SAFETY: matches rows(x, y, problem, options), columns(..., parts),
        // contiguous(..., status), segments(..., status, stages) and strided(..., status,
        // column_blocks): x and y hold the problem's elements (the same array when in
        // place, which the kernels allow), the plan picks rows only for rows of whole
        // 128-bit runs and vector entries only for aligned rows, the status lies in the
        // scratch buffer (counter and flags zeroed above, values for every tile), the
        // grid is one block per tile (per row for rows; per `BLOCK_THREADS / parts`
        // columns for columns, with `parts` a power of two up to COLUMN_MAX_PARTS; one
        // per SM at most for segments, with stages that fit the device's shared memory)
        // with the plan's threads and shared memory. The scratch stays borrowed until
        // the launch is queued; later users queue after it.
        unsafe { self.launch(name, &config, &mut args) }
    }
}
