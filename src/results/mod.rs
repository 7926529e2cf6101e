//! The floor every result kind stands on. A result is a plain struct with serde's derive
//! (`<room>/result.rs`); it crosses the Rust/Python boundary, and reaches the disk, as the
//! JSON text that derive writes: once out (`to_json`, Python keeps the text and parses it only
//! when asked for data), once back (`from_json`, for rendering, merging, diffing, and checking
//! a loaded file). The derive is the schema: a document that does not fit it is a `DataError`
//! naming the field that broke it, which is how a damaged or foreign file is refused.
//! `count` bounds the counts and byte sizes a result holds to what an i64 holds.

pub mod categories;
pub mod check;
pub mod count;
pub mod json;
pub mod nullable;
pub mod py;

pub use json::{from_json, to_json, DataError};
pub use nullable::nullable;
