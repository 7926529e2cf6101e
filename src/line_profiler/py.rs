//! The Python view of a line report: text, HTML and plain records from one analysis.

use pyo3::prelude::*;

use super::render::{html as line_html, text as line_text};
use crate::line_profiler::report::{FunctionBlock, LineEntry, LineReport};

/// One source line as Python sees it: (qualname, line, hits, code, values or None).
type LineRecord = (String, u32, u64, String, Option<Vec<i64>>);

/// One source line in a saved result: (line, code as written, hits, values or None).
type SavedLine = (u32, String, u64, Option<Vec<i64>>);

/// One function in a saved result: (qualname, its lines).
type SavedBlock = (String, Vec<SavedLine>);

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
    /// A report from plain data (a saved result): the columns, one (qualname, lines) block
    /// per function, each line (line, code, hits, values or None), and the notices.
    #[staticmethod]
    fn from_data(
        columns: Vec<String>,
        blocks: Vec<SavedBlock>,
        notices: Vec<String>,
    ) -> PyResult<Self> {
        let width = columns.len();
        let mut out = Vec::with_capacity(blocks.len());
        for (qualname, lines) in blocks {
            let mut entries = Vec::with_capacity(lines.len());
            for (line, code, hits, values) in lines {
                if values.as_ref().is_some_and(|v| v.len() != width) {
                    return Err(pyo3::exceptions::PyValueError::new_err(format!(
                        "line {line} of {qualname}: {} values for {width} columns",
                        values.as_ref().map_or(0, Vec::len)
                    )));
                }
                entries.push(LineEntry {
                    line,
                    code,
                    values,
                    hits,
                });
            }
            out.push(FunctionBlock {
                qualname,
                lines: entries,
            });
        }
        Ok(Self {
            report: LineReport {
                columns,
                blocks: out,
                notices,
            },
        })
    }

    /// The report as plain data, the inverse of `from_data`: (columns, blocks, notices).
    fn data(&self) -> (Vec<String>, Vec<SavedBlock>, Vec<String>) {
        let blocks = self
            .report
            .blocks
            .iter()
            .map(|b| {
                let lines = b
                    .lines
                    .iter()
                    .map(|e| (e.line, e.code.clone(), e.hits, e.values.clone()))
                    .collect();
                (b.qualname.clone(), lines)
            })
            .collect();
        (
            self.report.columns.clone(),
            blocks,
            self.report.notices.clone(),
        )
    }

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
