//! Block-wide collectives: a block scan, and the tile status that lets blocks of one
//! launch pass prefixes to each other (decoupled look-back).

mod lookback;
mod scan;

pub use lookback::{AGGREGATE, INCLUSIVE, PackedStatus, PackedValue, TileChain, TileStatus};
pub use scan::{ScanOp, exclusive_scan};
