//! Allocation history: what was alive at the peak, by source line and by module.
//!
//! Data flows one way: a snapshot dict in torch's schema (`load`, from torch's CUDA history
//! or our CPU recorder) becomes plain records (`model`); `blocks` gives every allocation its
//! true block size; `peak` finds the live set at the highest moment; `group` turns it into
//! rows by location, tag, keyword and line (files shown as `paths` says); `timeline` samples
//! it for drawing; `report` runs them per device. The binding (`binding`) hands the results
//! to Python; `render::trace` turn them into text, CSV, JSON and HTML.

pub mod blocks;
pub mod group;
pub mod load;
pub mod model;
pub mod parts;
pub mod paths;
pub mod peak;
pub mod pickle_guard;
pub mod pickle_stream;
pub mod py;
pub mod render;
pub mod report;
pub mod timeline;
