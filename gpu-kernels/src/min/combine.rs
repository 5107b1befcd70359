//! The combine kernel of a split min reduction: each output's `split` partials merged
//! in a fixed order. The partials lie `[output][split]` (one device's split) or
//! `[split][output]` (the shards of a device group, gathered rank after rank, their
//! indices local to each shard until the shard's offset is added). A group of lanes
//! takes each output (up to a warp, as many as the split needs): lane `g` merges
//! partials `g`, `g + lanes`, ..., and the group merges its lanes by shuffles, so that
//! an output's partials are loaded side by side rather than one after another (each
//! load waiting for the last: 132 partials of a split slab reduction, an index and a
//! value each, at the L2's latency).

use super::{BLOCK_THREADS, MinOutputs};
use crate::launch::{DevicePtr, DevicePtrMut, Kernel, Launch, LaunchGeometry, kernel_args, lanes_for};

kernel_args! {
    /// The combine kernel's arguments: the partial values and indices (the indices
    /// unused for `amin`) of output `m`, split `s` at slot `m * output_stride + s *
    /// split_stride`, merged into `outputs` values and indices; `index_offsets` (null:
    /// none) holds what each split adds to its indices.
    pub struct CombineArgs<T> {
        pub partial_values: DevicePtr<T>,
        pub partial_indices: DevicePtr<i64>,
        pub index_offsets: DevicePtr<i64>,
        pub values: DevicePtrMut<T>,
        pub indices: DevicePtrMut<i64>,
        pub outputs: u64,
        pub split: u64,
        pub output_stride: u64,
        pub split_stride: u64,
        /// Lanes merging each output: a power of two up to a warp.
        pub lanes: u32,
    }
    impl CombineKernel for f32 {
        const MIN_COMBINE = "min_combine_f32" => kernel::combine::<f32, true>;
        const AMIN_COMBINE = "amin_combine_f32" => kernel::combine::<f32, false>;
    }
    impl CombineKernel for f64 {
        const MIN_COMBINE = "min_combine_f64" => kernel::combine::<f64, true>;
        const AMIN_COMBINE = "amin_combine_f64" => kernel::combine::<f64, false>;
    }
    impl CombineKernel for i32 {
        const MIN_COMBINE = "min_combine_i32" => kernel::combine::<i32, true>;
        const AMIN_COMBINE = "amin_combine_i32" => kernel::combine::<i32, false>;
    }
    impl CombineKernel for half::bf16 {
        const MIN_COMBINE = "min_combine_bf16" => kernel::combine::<half::bf16, true>;
        const AMIN_COMBINE = "amin_combine_bf16" => kernel::combine::<half::bf16, false>;
    }
    impl CombineKernel for half::f16 {
        const MIN_COMBINE = "min_combine_f16" => kernel::combine::<half::f16, true>;
        const AMIN_COMBINE = "amin_combine_f16" => kernel::combine::<half::f16, false>;
    }
    entry points in ENTRY_POINTS;
}

/// The combine kernel of one element type, with indices (`min`) and without (`amin`).
pub trait CombineKernel: Sized {
    const MIN_COMBINE: Kernel<CombineArgs<Self>>;
    const AMIN_COMBINE: Kernel<CombineArgs<Self>>;
}

/// The launch merging `split` partials per output, `[output][split]`, into `to`.
pub fn launch<T: CombineKernel>(
    outputs: u64,
    split: u64,
    partials: MinOutputs<T>,
    to: MinOutputs<T>,
) -> Launch<CombineArgs<T>> {
    launch_strided(outputs, split, (split, 1), partials, DevicePtr::NULL, to)
}

/// The launch merging the partials of `shards` shards, `[shard][output]`, their indices
/// offset by `index_offsets[shard]`, into `to`.
pub fn launch_shards<T: CombineKernel>(
    outputs: u64,
    shards: u64,
    partials: MinOutputs<T>,
    index_offsets: DevicePtr<i64>,
    to: MinOutputs<T>,
) -> Launch<CombineArgs<T>> {
    launch_strided(outputs, shards, (1, outputs), partials, index_offsets, to)
}

fn launch_strided<T: CombineKernel>(
    outputs: u64,
    split: u64,
    (output_stride, split_stride): (u64, u64),
    partials: MinOutputs<T>,
    index_offsets: DevicePtr<i64>,
    to: MinOutputs<T>,
) -> Launch<CombineArgs<T>> {
    let kernel = to.pick(T::MIN_COMBINE, T::AMIN_COMBINE);
    let lanes = lanes_for(split);
    let args = CombineArgs {
        partial_values: partials.values.as_const(),
        partial_indices: partials.indices.as_const(),
        index_offsets,
        values: to.values,
        indices: to.indices,
        outputs,
        split,
        output_stride,
        split_stride,
        lanes,
    };
    Launch::new(
        kernel,
        LaunchGeometry::per_item(outputs * lanes as u64, BLOCK_THREADS),
        args,
    )
}

#[cfg(target_arch = "nvptx64")]
mod kernel {
    use super::*;
    use crate::device::{block_dim_x, block_idx_x, thread_idx_x};
    use crate::min::argmin::{ArgMin, MinValue};

    /// Merges the `split` partials of each output, `lanes` lanes an output.
    ///
    /// # Safety
    /// The partials hold `outputs * split` slots (`partial_indices` too when `INDEX`),
    /// laid out one to one by the strides; `index_offsets` is null or holds `split`
    /// offsets; the outputs hold `outputs`; `lanes` is a power of two up to 32 and the
    /// block a whole number of warps.
    #[inline(always)]
    pub unsafe fn combine<T: MinValue, const INDEX: bool>(args: CombineArgs<T>) {
        let CombineArgs {
            outputs,
            split,
            output_stride,
            split_stride,
            index_offsets,
            ..
        } = args;
        let (partial_values, partial_indices) = (args.partial_values.as_ptr(), args.partial_indices.as_ptr());
        let (values, indices) = (args.values.as_mut_ptr(), args.indices.as_mut_ptr());
        let thread = block_idx_x() as u64 * block_dim_x() as u64 + thread_idx_x() as u64;
        let shift = args.lanes.trailing_zeros();
        let (m, first) = (thread >> shift, thread & (args.lanes as u64 - 1));
        let read = |s: u64| {
            let slot = (m * output_stride + s * split_stride) as usize;
            // SAFETY: the strides lay the `outputs * split` slots out one to one, and
            // `index_offsets`, when not null, holds `split` offsets.
            unsafe {
                let offset = if index_offsets.is_null() {
                    0
                } else {
                    *index_offsets.as_ptr().add(s as usize)
                };
                ArgMin::<T, INDEX> {
                    value: *partial_values.add(slot),
                    index: if INDEX {
                        (*partial_indices.add(slot) + offset) as u64
                    } else {
                        s
                    },
                }
            }
        };
        // Lanes past the last output hold nothing, and shuffle with the others.
        let mut merged = ArgMin::empty(T::LARGEST);
        if m < outputs {
            for s in (first..split).step_by(args.lanes as usize) {
                merged = merged.merge(read(s));
            }
        }
        let merged = merged.merge_group(args.lanes);
        if m < outputs && first == 0 {
            // SAFETY: m < outputs.
            unsafe { merged.store(values, indices, m) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_output_takes_a_lane_a_partial_up_to_a_warp() {
        let outputs = |address| MinOutputs::<f32> {
            values: DevicePtrMut::from_address(address),
            indices: DevicePtrMut::from_address(address + 4096),
        };
        for (split, lanes) in [(2, 2), (3, 4), (8, 8), (15, 16), (32, 32), (132, 32)] {
            let combine = launch(1030, split, outputs(1 << 20), outputs(1 << 24));
            assert_eq!(combine.arguments().lanes, lanes, "split {split}");
            assert_eq!(combine.geometry().grid[0], (1030 * lanes as u64).div_ceil(256));
            assert_eq!(combine.geometry().threads, BLOCK_THREADS);
        }
    }
}
