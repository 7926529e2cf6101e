//! Renderers: plain results in, text out. One module per format; none of them collects.

pub mod estimate_html;
pub mod estimate_text;
pub mod html;
pub mod json;
pub mod line;
pub mod line_html;
pub mod line_text;
pub mod memlab_text;
pub mod monitor_html;
pub mod monitor_text;
pub mod trace_data;
pub mod trace_html;
pub mod trace_text;
pub mod trace_timeline;
pub mod tracker_text;
