//! The tensor diff tracker's log block.

pub mod text;
