//! The line profiler's results as text, HTML, records and CSV: a result in (a view applied
//! already), a string out. A line profile as pytorch_memlab prints it (`text`) and as HTML
//! (`html`); a merged profile (`merged`: what a view shows of it and the cells both forms
//! share; `merged_text`, `merged_html`); a diff (`diff_text`); the records of either
//! profile (`records`) and their CSV (`csv`).

pub mod csv;
pub mod diff_text;
pub mod html;
pub mod merged;
pub mod merged_html;
pub mod merged_text;
pub mod records;
pub mod text;
