//! CPU references, one module per kernel family: the plain algorithm on `ndarray`,
//! parallel over independent outputs with rayon, with the same validation and
//! semantics as the GPU operation.

pub mod conv;
pub mod matvec;
pub mod min;
pub mod scan;
