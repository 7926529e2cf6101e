//! The Python view of a line report: text, HTML and plain records from one analysis.

use pyo3::prelude::*;

use crate::line_profiler::report::LineReport;
use crate::render::line_report::{html as line_html, text as line_text};

/// One source line as Python sees it: (qualname, line, hits, code, values or None).
type LineRecord = (String, u32, u64, String, Option<Vec<i64>>);

/// A built line report (see `LineProfiler.display`).
#[pyclass(module = "memlab_rs._core", frozen)]
pub struct LineReportView {
    report: LineReport,
}

impl From<LineReport> for LineReportView {
    fn from(report: LineReport) -> Self {
        Self { report }
    }
}

#[pymethods]
impl LineReportView {
    /// pytorch_memlab's text layout.
    fn text(&self) -> String {
        line_text::render(&self.report)
    }

    /// A self-contained HTML rendering for notebooks.
    fn html(&self) -> String {
        line_html::render(&self.report)
    }

    #[getter]
    fn columns(&self) -> Vec<String> {
        self.report.columns.clone()
    }

    /// Why the numbers may be incomplete, one line each (empty when nothing is to be said).
    #[getter]
    fn notices(&self) -> Vec<String> {
        self.report.notices.clone()
    }

    /// One record per source line: (qualname, line, hits, code, values or None).
    fn records(&self) -> Vec<LineRecord> {
        let mut out = Vec::new();
        for block in &self.report.blocks {
            for entry in &block.lines {
                out.push((
                    block.qualname.clone(),
                    entry.line,
                    entry.hits,
                    entry.code.trim_end_matches(['\n', '\r']).to_string(),
                    entry.values.clone(),
                ));
            }
        }
        out
    }
}
