//! What a tensor-core mainloop gives the epilogue: each warp's sums as 16 x 8 tiles in
//! the `mma` layout, wherever in the block's tile they lie.

use super::operands::Operand;

/// A warp's sums: `I x J` tiles of 16 x 8 outputs from `origin` (row, column within the
/// block's tile), tile (i, j) at `origin + (16 i, 8 j)`. With lane `4 g + t`, a tile's
/// four sums are at (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1).
pub struct WarpTiles<const I: usize, const J: usize> {
    pub sums: [[[f32; 4]; J]; I],
    pub origin: (u32, u32),
}

/// `A B^T` over K for the block's `TC_BM x TC_BN` tile, the operands staged through
/// shared memory `TC_BK` of K at a time.
pub trait Mainloop {
    /// The sums each warp holds at the end.
    type Sums: Tiles;

    /// Multiplies `k_tiles` slices of K staged by `a` and `b`.
    ///
    /// # Safety
    /// The launch has `TC_THREADS` threads and the mainloop's dynamic shared memory;
    /// every thread of the block calls it with the same `k_tiles`.
    unsafe fn product<A: Operand, B: Operand>(a: &A, b: &B, k_tiles: u32) -> Self::Sums;
}

/// A warp's sums, visited tile by tile.
pub trait Tiles {
    /// Calls `visit(row, column, sums)` for each 16 x 8 tile, with its first row and
    /// column in the block's tile.
    fn for_each(&self, visit: impl FnMut(u32, u32, &[f32; 4]));
}

impl<const I: usize, const J: usize> Tiles for WarpTiles<I, J> {
    #[inline(always)]
    fn for_each(&self, mut visit: impl FnMut(u32, u32, &[f32; 4])) {
        for (i, row) in self.sums.iter().enumerate() {
            for (j, sums) in row.iter().enumerate() {
                visit(self.origin.0 + 16 * i as u32, self.origin.1 + 8 * j as u32, sums);
            }
        }
    }
}
