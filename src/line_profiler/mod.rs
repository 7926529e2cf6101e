//! The line profiler: what each line of the profiled functions did to memory.
//!
//! The flow, one way:
//! - collect (`py/`: the collector is itself interpreter hooks, so it is the room's binding
//!   folder): the hooks (`sys.monitoring` on 3.12+, a C trace function on 3.9-3.11) hand the
//!   events of profiled code objects to one engine, which samples each memory source once per
//!   event and keeps per-frame line accounts (`frames`);
//! - analyse: a collector's rows become a line profile (`report`), the result (`result`,
//!   kind `line_profile`); several ranks' profiles merge line by line (`merge`, kind
//!   `merged_line_profile`), two profiles compare line by line (`diff`);
//! - render: what a display shows of a result (`view`: functions, `columns` checked
//!   against what the source has) as text, HTML, records and CSV (`render`).
//!
//! Results cross to Python and back as the JSON text their serde derive writes (`py::results`).

pub mod columns;
pub mod diff;
pub mod frames;
pub mod merge;
pub mod py;
pub mod render;
pub mod report;
pub mod result;
pub mod view;
