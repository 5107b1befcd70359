//! The device layer: thread geometry, barriers, shared memory, warp shuffles and vector
//! memory access, each a thin `#[inline(always)]` wrapper over an NVPTX intrinsic or one
//! PTX instruction, and the staged copies between global and shared memory built on
//! them. All inline assembly of the crate lives below this module.

mod async_copy;
mod float16;
mod least;
mod math;
mod memory;
mod mma;
#[cfg(target_feature = "sm_90")]
mod pipeline;
mod shared;
mod shuffle;
mod thread;
mod vector;
#[cfg(target_feature = "sm_90a")]
mod warpgroup;
mod widen;

pub use async_copy::{STAGE_BARRIER_BYTES, StagedCopy};
pub use float16::Float16;
pub use least::Least;
pub use math::{exp2_approx, fma_f32, fma_f64, reciprocal_approx};
pub use memory::{
    Coherent, atomic_add_u32, fence_gpu, load_acquire_u32, load_global_nc_v2, load_global_nc_v4,
    load_global_v4, store_global_v2_f32, store_global_v4, store_release_u32,
};
pub use mma::{
    async_copy, async_copy_cached, async_copy_commit, async_copy_wait, load_matrix_x2, load_matrix_x4,
    load_matrix_x4_transposed, mma_bf16_16x8x16, mma_f16_16x8x16, mma_tf32_16x8x8, to_tf32,
};
#[cfg(target_feature = "sm_90")]
pub use pipeline::{PIPELINE_BARRIER_BYTES, StagePipeline, StageSignal, fence_tensor_map};
pub use shared::{
    SharedCarver, load_shared_element, load_shared_f32, load_shared_u16, load_shared_u32, load_shared_v4_f32,
    shared_base, store_shared_f32, store_shared_u16, store_shared_v2_f32, store_shared_v4_f32,
};
pub use shuffle::{Lane, Shuffle, WARP_SIZE, ballot};
pub use thread::{
    arrive_group, block_dim_x, block_idx_x, block_idx_y, block_idx_z, grid_dim_x, grid_dim_z, lane_id,
    sync_group, sync_threads, sync_warp, thread_idx_x, trap,
};
pub use vector::VectorElement;
#[cfg(target_feature = "sm_90a")]
pub use warpgroup::{
    WarpgroupAccumulators, fence_async_shared, set_max_registers, swizzled_k_major_descriptor,
    swizzled_mn_major_descriptor, warpgroup_commit, warpgroup_fence, warpgroup_wait,
};
pub use widen::Widen;
