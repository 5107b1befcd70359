//! The implicit-GEMM passes: forward, input gradient and weight gradient share one
//! mainloop and one epilogue, and differ in the gathers that feed the mainloop.

use super::reduce::{self, SplitSumArgs};
use super::{ConvEpilogue, ConvLayout, ConvPass, ConvProblem, MAIN_BLOCKS_PER_SM};
use crate::launch::{DevicePtr, DevicePtrMut, Launch, LaunchGeometry, ScratchLayout, kernel_args};

/// Threads of an implicit-GEMM block.
pub const GEMM_THREADS: u32 = 256;
/// Rows of C (along M) per block.
pub const TILE_M: u32 = 128;
/// Columns of C (along N) per block.
pub const TILE_N: u32 = 128;
/// Depth of one staged slice of K.
pub const TILE_K: u32 = 8;
/// Floats per staged k-row of a tile: 4 more than the tile's width, so that the
/// k-contiguous operands' stores fall on distinct banks.
pub const TILE_PITCH: u32 = TILE_M + 4;
/// Shared memory of an implicit-GEMM block: two stages of both operands.
pub const GEMM_SHARED_BYTES: u32 = 2 * 2 * TILE_K * TILE_PITCH * 4;
/// The weight gradient sums at most this many products per split in FP32 before the
/// splits are added in FP64, which bounds its rounding error on long reductions.
pub const WGRAD_MAX_CHUNK: u32 = 16384;
/// Blocks per SM that the weight gradient's split aims at (two blocks fit per SM).
pub const WGRAD_BLOCKS_PER_SM: u32 = 2;

const _: () = assert!(TILE_M == 128 && TILE_N == 128 && TILE_K == 8 && GEMM_THREADS == 256);

/// How one GEMM pass is launched: blocks along x are tiles (N fastest, then M, then
/// the split), grid y is the group.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmPlan {
    pub m_tiles: u32,
    pub n_tiles: u32,
    /// Parts of K summed separately (weight gradient only; 1 elsewhere).
    pub split: u32,
    /// K per split, a multiple of `TILE_K`.
    pub k_chunk: u32,
    pub groups: u32,
    /// Whether the forward pass writes y (and reads the residual) channels last
    /// (NHWC), as 1 or 0 (NCHW, and the other passes). x and w are NCHW either way.
    pub y_channels_last: u32,
}

impl GemmPlan {
    /// The forward plan writing y in `layout`.
    pub const fn writing(self, layout: ConvLayout) -> Self {
        Self {
            y_channels_last: matches!(layout, ConvLayout::Nhwc) as u32,
            ..self
        }
    }

    /// The layout of y.
    pub const fn output_layout(&self) -> ConvLayout {
        ConvLayout::of_channels_last(self.y_channels_last)
    }

    pub const fn blocks(&self) -> u64 {
        self.m_tiles as u64 * self.n_tiles as u64 * self.split as u64
    }

    const fn geometry(&self) -> LaunchGeometry {
        LaunchGeometry {
            grid: [self.blocks(), self.groups as u64, 1],
            threads: GEMM_THREADS,
            shared_bytes: GEMM_SHARED_BYTES,
        }
    }

    /// The forward launch: `y = epilogue(conv(x, w))`.
    pub const fn forward(
        &self,
        problem: &ConvProblem,
        x: DevicePtr<f32>,
        w: DevicePtr<f32>,
        epilogue: ConvEpilogue,
        y: DevicePtrMut<f32>,
    ) -> Launch<ForwardArgs> {
        let args = ForwardArgs {
            x,
            w,
            epilogue,
            y,
            problem: *problem,
            plan: *self,
        };
        Launch::new(CONV_FORWARD, self.geometry(), args)
    }

    /// The input-gradient launch: `dx` for the output gradient `dy`.
    pub const fn input_grad(
        &self,
        problem: &ConvProblem,
        dy: DevicePtr<f32>,
        w: DevicePtr<f32>,
        dx: DevicePtrMut<f32>,
    ) -> Launch<InputGradArgs> {
        let args = InputGradArgs {
            dy,
            w,
            dx,
            problem: *problem,
            plan: *self,
        };
        Launch::new(CONV_INPUT_GRAD, self.geometry(), args)
    }

    /// The scratch of the weight gradient's partials: `split` gradients, when split.
    pub const fn weight_grad_scratch(&self, problem: &ConvProblem) -> ScratchLayout {
        reduce::partials_scratch(self.split, problem.weight_count())
    }

    /// The weight-gradient launches: the products into `dw`, or with a split into
    /// `partials` (the scratch laid out by [`Self::weight_grad_scratch`]), then the sum
    /// of the splits into `dw`.
    pub fn weight_grad(
        &self,
        problem: &ConvProblem,
        x: DevicePtr<f32>,
        dy: DevicePtr<f32>,
        partials: DevicePtrMut<u8>,
        dw: DevicePtrMut<f32>,
    ) -> (Launch<WeightGradArgs>, Option<Launch<SplitSumArgs>>) {
        let (out, sum) = reduce::split_outputs(self.split, problem.weight_count(), partials, dw);
        let args = WeightGradArgs {
            x,
            dy,
            out,
            problem: *problem,
            plan: *self,
        };
        (Launch::new(CONV_WEIGHT_GRAD, self.geometry(), args), sum)
    }
}

/// The implicit-GEMM plan of `pass` on `multiprocessors` SMs. Call only on problems
/// with no empty GEMM extent.
pub fn plan(problem: &ConvProblem, pass: ConvPass, multiprocessors: u32) -> GemmPlan {
    let (m, n, k) = problem.gemm(pass);
    let m_tiles = m.div_ceil(TILE_M as u64) as u32;
    let n_tiles = n.div_ceil(TILE_N as u64) as u32;
    let tiles = m_tiles as u64 * n_tiles as u64 * problem.groups as u64;
    let split = if pass == ConvPass::WeightGrad {
        let fill = (multiprocessors as u64 * WGRAD_BLOCKS_PER_SM as u64).div_ceil(tiles);
        let accuracy = k.div_ceil(WGRAD_MAX_CHUNK as u64);
        fill.max(accuracy).min(k.div_ceil(TILE_K as u64)).max(1)
    } else {
        1
    };
    let k_chunk = k.div_ceil(split).next_multiple_of(TILE_K as u64);
    GemmPlan {
        m_tiles,
        n_tiles,
        split: k.div_ceil(k_chunk).max(1) as u32,
        k_chunk: k_chunk as u32,
        groups: problem.groups,
        y_channels_last: 0,
    }
}

kernel_args! {
    /// The forward pass's arguments: `y = epilogue(conv(x, w))`.
    pub struct ForwardArgs {
        pub x: DevicePtr<f32>,
        pub w: DevicePtr<f32>,
        pub epilogue: ConvEpilogue,
        pub y: DevicePtrMut<f32>,
        pub problem: ConvProblem,
        pub plan: GemmPlan,
    }
    /// The implicit-GEMM forward pass.
    pub const CONV_FORWARD = "conv_forward_f32" => kernel::forward, bounds(GEMM_THREADS, MAIN_BLOCKS_PER_SM);
    entry points in FORWARD_ENTRY_POINTS;
}

kernel_args! {
    /// The input gradient's arguments: `dx` for the output gradient `dy`.
    pub struct InputGradArgs {
        pub dy: DevicePtr<f32>,
        pub w: DevicePtr<f32>,
        pub dx: DevicePtrMut<f32>,
        pub problem: ConvProblem,
        pub plan: GemmPlan,
    }
    /// The implicit-GEMM input gradient.
    pub const CONV_INPUT_GRAD = "conv_input_grad_f32" => kernel::input_grad, bounds(GEMM_THREADS, MAIN_BLOCKS_PER_SM);
    entry points in INPUT_GRAD_ENTRY_POINTS;
}

kernel_args! {
    /// The weight gradient's arguments: the gradient, or with `plan.split > 1` its
    /// `[split][out_channels][in_channels / groups * taps]` partials, in `out`.
    pub struct WeightGradArgs {
        pub x: DevicePtr<f32>,
        pub dy: DevicePtr<f32>,
        pub out: DevicePtrMut<f32>,
        pub problem: ConvProblem,
        pub plan: GemmPlan,
    }
    /// The implicit-GEMM weight gradient.
    pub const CONV_WEIGHT_GRAD = "conv_weight_grad_f32" => kernel::weight_grad, bounds(GEMM_THREADS, MAIN_BLOCKS_PER_SM);
    entry points in WEIGHT_GRAD_ENTRY_POINTS;
}

#[cfg(target_arch = "nvptx64")]
mod kernel {
    use super::*;
    use crate::conv::FastDiv;
    use crate::conv::gather::{Gather, NONE, Patches, PatchesByTap, PatchesByWindow, Scatter, Strided};
    use crate::conv::outer_product::{Accumulators, accumulate_outer_product};
    use crate::device::{
        block_idx_x, block_idx_y, shared_base, store_shared_f32, sync_threads, thread_idx_x,
    };

    /// Where C goes: element (m, n) at `base + (m / row_div) * image_stride + m % row_div
    /// + n * col_stride`, plus `bias[n]` when `bias` is not null, through `epilogue`.
    struct Output {
        epilogue: ConvEpilogue,
        ptr: *mut f32,
        rows: u32,
        cols: u32,
        row_div: FastDiv,
        image_stride: u64,
        base: u64,
        col_stride: u64,
        bias: *const f32,
    }

    /// The thread's position in the compute grid of a tile: 16 x 16 threads, each
    /// with 8 rows and 8 columns in two groups of 4, 64 apart.
    #[inline(always)]
    fn compute_position() -> (u32, u32) {
        let t = thread_idx_x();
        (t % 16, t / 16)
    }

    /// The tile row (or column) of a thread's `i`th accumulator at position `p`.
    #[inline(always)]
    const fn tile_offset(p: u32, i: usize) -> u32 {
        (i as u32 / 4) * 64 + p * 4 + i as u32 % 4
    }

    /// The tile of `A[m0.., k_begin..k_end] * B[k_begin..k_end, n0..]` this thread owns.
    ///
    /// # Safety
    /// The launch has `GEMM_THREADS` threads and `GEMM_SHARED_BYTES` of shared memory;
    /// every thread of the block calls it with the same arguments.
    #[inline(always)]
    unsafe fn mainloop<A: Gather, B: Gather>(
        a: &A,
        b: &B,
        m0: u32,
        n0: u32,
        k_begin: u32,
        k_end: u32,
    ) -> Accumulators {
        const STAGE: u32 = TILE_K * TILE_PITCH * 4;
        let t = thread_idx_x();
        // Each thread stages 4 rows of each operand, 32 apart, at one k of the tile.
        let slot = |k_contiguous: bool| {
            if k_contiguous {
                (t / 8, t % 8)
            } else {
                (t % 32, t / 32)
            }
        };
        let (a_first, a_k) = slot(A::K_CONTIGUOUS);
        let (b_first, b_k) = slot(B::K_CONTIGUOUS);
        let a_rows: [A::Row; 4] = core::array::from_fn(|i| a.row(m0 + a_first + 32 * i as u32));
        let b_rows: [B::Row; 4] = core::array::from_fn(|i| b.row(n0 + b_first + 32 * i as u32));
        let a_stage = |s: u32| shared_base() + s * 2 * STAGE;
        let b_stage = |s: u32| a_stage(s) + STAGE;
        let fetch = |k0: u32| {
            let (ka, kb) = (k0 + a_k, k0 + b_k);
            let (ca, cb) = (a.col(ka, ka < k_end), b.col(kb, kb < k_end));
            let mut values = [0.0f32; 8];
            for i in 0..4 {
                // SAFETY: rows and columns come from their gathers.
                unsafe {
                    values[i] = a.load(a_rows[i], ca);
                    values[4 + i] = b.load(b_rows[i], cb);
                }
            }
            values
        };
        let stash = |s: u32, values: &[f32; 8]| {
            for i in 0..4 {
                let a_at = a_stage(s) + (a_k * TILE_PITCH + a_first + 32 * i as u32) * 4;
                let b_at = b_stage(s) + (b_k * TILE_PITCH + b_first + 32 * i as u32) * 4;
                // SAFETY: inside the stage (k < TILE_K, row < TILE_M); each element has
                // one writer, and the barriers order it against the readers.
                unsafe {
                    store_shared_f32(a_at, values[i]);
                    store_shared_f32(b_at, values[4 + i]);
                }
            }
        };

        let (tx, ty) = compute_position();
        let mut acc: Accumulators = [[0.0; 8]; 8];
        let tiles = (k_end - k_begin).div_ceil(TILE_K);
        stash(0, &fetch(k_begin));
        // SAFETY: reached by the whole block.
        unsafe { sync_threads() };
        for tile in 0..tiles {
            let s = tile % 2;
            // Past the last tile the fetch reads nothing (every k is out of range).
            let next = fetch(k_begin + (tile + 1) * TILE_K);
            for kk in 0..TILE_K {
                let a_at = a_stage(s) + (kk * TILE_PITCH + tx * 4) * 4;
                let b_at = b_stage(s) + (kk * TILE_PITCH + ty * 4) * 4;
                // SAFETY: 16-byte aligned (the pitch and offsets are multiples of 4 floats),
                // inside the stage the barrier published; the second vectors 64 floats on.
                unsafe { accumulate_outer_product(&mut acc, a_at, 256, b_at, 256) };
            }
            // The other stage was last read before the previous barrier.
            stash(1 - s, &next);
            // SAFETY: reached by the whole block.
            unsafe { sync_threads() };
        }
        acc
    }

    impl Output {
        /// Writes this thread's accumulators of the tile at (m0, n0).
        ///
        /// # Safety
        /// `ptr` (and `bias`, when not null) hold every element the problem addresses.
        #[inline(always)]
        unsafe fn store(&self, acc: &Accumulators, m0: u32, n0: u32) {
            let (tx, ty) = compute_position();
            let rows: [u64; 8] = core::array::from_fn(|i| {
                let m = m0 + tile_offset(tx, i);
                if m >= self.rows {
                    return NONE;
                }
                let (image, rest) = self.row_div.divmod(m);
                image as u64 * self.image_stride + rest as u64
            });
            let columns: [u32; 8] = core::array::from_fn(|j| n0 + tile_offset(ty, j));
            let bias = columns.map(|n| {
                if self.bias.is_null() || n >= self.cols {
                    0.0
                } else {
                    // SAFETY: n is a valid column.
                    unsafe { *self.bias.add(n as usize) }
                }
            });
            let mut values = acc.map(|sums| core::array::from_fn::<f32, 8, _>(|j| sums[j] + bias[j]));
            let fused = !self.epilogue.is_plain();
            // The activation apart from the stores, whose loops then stay short enough
            // to unroll.
            if fused {
                self.epilogue.activate_all(values.as_flattened_mut());
            }
            for (j, &n) in columns.iter().enumerate() {
                if n >= self.cols {
                    continue;
                }
                let col = self.base + n as u64 * self.col_stride;
                for (&row, values) in rows.iter().zip(&values) {
                    if row != NONE {
                        let at = (row + col) as usize;
                        // SAFETY: (m, n) is inside C, and so inside the residual.
                        let value = if fused {
                            unsafe { self.epilogue.add_residual(values[j], at) }
                        } else {
                            values[j]
                        };
                        // SAFETY: as above.
                        unsafe { *self.ptr.add(at) = value };
                    }
                }
            }
        }
    }

    /// Division by 1: rows of one element.
    const ONE: FastDiv = FastDiv::new(1);

    /// The (m, n, split) tile of this block.
    #[inline(always)]
    fn block_tile(plan: &GemmPlan) -> (u32, u32, u32) {
        let b = block_idx_x();
        let (rest, n_tile) = (b / plan.n_tiles, b % plan.n_tiles);
        (rest % plan.m_tiles * TILE_M, n_tile * TILE_N, rest / plan.m_tiles)
    }

    /// y = conv(x, w) + bias.
    ///
    /// # Safety
    /// x, w, y (and bias, when not null) hold the problem's tensors; the grid is `plan`'s
    /// blocks by `groups`, with `GEMM_THREADS` threads and `GEMM_SHARED_BYTES`.
    #[inline(always)]
    pub unsafe fn forward(args: ForwardArgs) {
        let ForwardArgs { problem, plan, .. } = args;
        let (x, w, bias, y) = (
            args.x.as_ptr(),
            args.w.as_ptr(),
            args.epilogue.bias.as_ptr(),
            args.y.as_mut_ptr(),
        );
        let group = block_idx_y();
        let (m, n, k) = problem.gemm(ConvPass::Forward);
        let (m, n, k) = (m as u32, n as u32, k as u32);
        let (m0, n0, _) = block_tile(&plan);
        let a = PatchesByWindow(Patches::new(x, problem, group));
        let b = Strided {
            ptr: w,
            rows: n,
            cols: k,
            base: (group * n) as u64 * k as u64,
            row_stride: k as u64,
            div: FastDiv::new(k),
            outer_stride: 0,
        };
        // Row m is output pixel m of the batch: in NHWC its channels lie together.
        let (row_div, image_stride, base, col_stride) = if plan.y_channels_last == 1 {
            (ONE, problem.out_channels as u64, (group * n) as u64, 1)
        } else {
            let plane = problem.out_pixels() as u64;
            (
                problem.div_out_pixels,
                problem.out_channels as u64 * plane,
                (group * n) as u64 * plane,
                plane,
            )
        };
        let out = Output {
            epilogue: args.epilogue,
            ptr: y,
            rows: m,
            cols: n,
            row_div,
            image_stride,
            base,
            col_stride,
            bias: if bias.is_null() {
                bias
            } else {
                bias.wrapping_add((group * n) as usize)
            },
        };
        // SAFETY: forwarded from the launch's contract.
        unsafe { out.store(&mainloop(&a, &b, m0, n0, 0, k), m0, n0) };
    }

    /// dx = the input gradient of conv for dy.
    ///
    /// # Safety
    /// dy, w, dx hold the problem's tensors; the grid and block are as the forward's.
    #[inline(always)]
    pub unsafe fn input_grad(args: InputGradArgs) {
        let InputGradArgs { problem, plan, .. } = args;
        let (dy, w, dx) = (args.dy.as_ptr(), args.w.as_ptr(), args.dx.as_mut_ptr());
        let group = block_idx_y();
        let (m, n, k) = problem.gemm(ConvPass::InputGrad);
        let (m, n, k) = (m as u32, n as u32, k as u32);
        let (m0, n0, _) = block_tile(&plan);
        let a = Scatter {
            dy,
            problem,
            group,
            pixels: m,
            taps: k,
        };
        let taps = problem.taps() as u64;
        let b = Strided {
            ptr: w,
            rows: n,
            cols: k,
            base: (group * problem.out_per_group()) as u64 * n as u64 * taps,
            row_stride: taps,
            div: problem.div_taps,
            outer_stride: n as u64 * taps,
        };
        let out = Output {
            epilogue: ConvEpilogue::NONE,
            ptr: dx,
            rows: m,
            cols: n,
            row_div: problem.div_pixels,
            image_stride: problem.in_channels as u64 * problem.pixels() as u64,
            base: (group * n) as u64 * problem.pixels() as u64,
            col_stride: problem.pixels() as u64,
            bias: core::ptr::null(),
        };
        // SAFETY: forwarded from the launch's contract.
        unsafe { out.store(&mainloop(&a, &b, m0, n0, 0, k), m0, n0) };
    }

    /// The weight gradient of conv for dy, or with `plan.split > 1` its per-split partials
    /// `[split][out_channels][in_channels / groups * taps]`.
    ///
    /// # Safety
    /// x, dy hold the problem's tensors and `out` the gradient (times `split`); the grid
    /// and block are as the forward's.
    #[inline(always)]
    pub unsafe fn weight_grad(args: WeightGradArgs) {
        let WeightGradArgs { problem, plan, .. } = args;
        let (x, dy, out) = (args.x.as_ptr(), args.dy.as_ptr(), args.out.as_mut_ptr());
        let group = block_idx_y();
        let (m, n, k) = problem.gemm(ConvPass::WeightGrad);
        let (m, n, k) = (m as u32, n as u32, k as u32);
        let (m0, n0, split) = block_tile(&plan);
        let k_begin = split * plan.k_chunk;
        let k_end = (k_begin + plan.k_chunk).min(k);
        let a = PatchesByTap(Patches::new(x, problem, group));
        let b = Strided {
            ptr: dy,
            rows: n,
            cols: k,
            base: (group * n) as u64 * problem.out_pixels() as u64,
            row_stride: problem.out_pixels() as u64,
            div: problem.div_out_pixels,
            outer_stride: problem.out_channels as u64 * problem.out_pixels() as u64,
        };
        let gradient = problem.out_channels as u64 * m as u64;
        let out = Output {
            epilogue: ConvEpilogue::NONE,
            ptr: out,
            rows: m,
            cols: n,
            row_div: FastDiv::new(m),
            image_stride: 0,
            base: split as u64 * gradient + (group * n) as u64 * m as u64,
            col_stride: m as u64,
            bias: core::ptr::null(),
        };
        // SAFETY: forwarded from the launch's contract.
        unsafe { out.store(&mainloop(&a, &b, m0, n0, k_begin, k_end), m0, n0) };
    }
}
