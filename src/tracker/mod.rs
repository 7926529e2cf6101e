//! The tensor diff tracker (MemTracker): which tensors appeared and vanished between two
//! calls. `py/` holds its collector (the resuming gc walk over live tensors) -> `diff`
//! groups them by (type, shape, dtype) and compares with the last call -> `result` is one
//! `track()`, saved and loaded -> `render` writes the original's log and HTML.

pub mod diff;
pub mod py;
pub mod render;
pub mod result;
