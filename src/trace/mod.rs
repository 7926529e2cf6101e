//! Allocation history: what was alive at the peak, by source line and by module.
//!
//! Data flows one way: a snapshot in torch's schema (from torch's CUDA history or our CPU
//! recorder; a dict read by `py::load`, a pickle streamed by `pickle_stream` after
//! `pickle_guard` checked it, both through `parts`) becomes plain records (`model`); `blocks`
//! gives every allocation its true block size; `peak` finds the live set at the highest
//! moment; `group` turns it into rows by location, tag, keyword and line (files shown as
//! `paths` says); `timeline` samples it for drawing; `report` runs them per device. What
//! crosses to Python is serde data (`result`); `render` turns the report into text, CSV,
//! JSON, HTML and the offline timeline. `py` is the room's Python face, `_core.trace`: a
//! `py/` folder because the dict reader, the trace's collector, reads Python objects.

pub mod blocks;
pub mod error;
pub mod group;
pub mod model;
pub mod parts;
pub mod paths;
pub mod peak;
pub mod pickle_guard;
pub mod pickle_stream;
pub mod py;
pub mod render;
pub mod report;
pub mod result;
pub mod timeline;
