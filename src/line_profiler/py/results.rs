//! The line profiler's results as Python reaches them: each crosses as the JSON text its
//! serde derive writes, checked (`validate`), viewed and rendered (`render`, `records`,
//! `LineReportView`), merged (`merge`, `merged_*`) and compared (`diff`, `diff_render`);
//! and the column catalogue and checks (`catalogue`, `check_columns`).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::line_profiler::columns;
use crate::line_profiler::diff::{diff as compare, LineDiff};
use crate::line_profiler::merge::{merge as merge_profiles, MergedLineProfile};
use crate::line_profiler::render::{
    csv, diff_text, html, merged, merged_html, merged_text, records as table, text,
};
use crate::line_profiler::result::LineProfile;
use crate::line_profiler::view::{apply, View};
use crate::results::{from_json, to_json};

fn value_error(message: String) -> PyErr {
    PyValueError::new_err(message)
}

fn line_profile(data: &str) -> PyResult<LineProfile> {
    let profile: LineProfile = from_json(data)?;
    profile.check()?;
    Ok(profile)
}

fn merged_profile(data: &str) -> PyResult<MergedLineProfile> {
    let profile: MergedLineProfile = from_json(data)?;
    profile.check()?;
    Ok(profile)
}

fn unknown_format(format: &str, what: &str, have: &str) -> PyErr {
    value_error(format!("format={format:?}: a {what} renders as {have}"))
}

/// A `line_profile` result's data as its derive reads it (a ValueError naming the field
/// that does not fit), in canonical form.
#[pyfunction]
pub fn validate(data: &str) -> PyResult<String> {
    Ok(to_json(&line_profile(data)?))
}

/// What a display shows of a line profile (the view applied once: functions, columns),
/// rendered as often as asked. `LineRecordsDisplay` holds one.
#[pyclass(module = "memlab_rs._core", frozen)]
pub struct LineReportView {
    shown: LineProfile,
}

#[pymethods]
impl LineReportView {
    /// The line profile `data` with the `view` (a JSON object: `func`, `columns`, `device`)
    /// applied; a ValueError naming a function or column it does not have.
    #[new]
    fn new(data: &str, view: &str) -> PyResult<Self> {
        let view: View = from_json(view)?;
        let shown = apply(&line_profile(data)?, &view).map_err(value_error)?;
        Ok(Self { shown })
    }

    /// pytorch_memlab's text (`"text"`), the HTML (`"html"`), the records' CSV (`"csv"`) or
    /// the shown part's data (`"json"`).
    fn render(&self, format: &str) -> PyResult<String> {
        let shown = &self.shown;
        Ok(match format {
            "text" => text::render(shown),
            "html" => html::render(shown),
            "csv" => csv::render(&table::line_profile(shown), true),
            "json" => to_json(shown),
            other => {
                return Err(unknown_format(
                    other,
                    "line_profile result",
                    "text, html, csv, json",
                ))
            }
        })
    }

    /// The records as JSON: `{"names": [...], "rows": [[...], ...]}`.
    fn records(&self) -> String {
        to_json(&table::line_profile(&self.shown))
    }

    /// The columns shown.
    #[getter]
    fn columns(&self) -> Vec<String> {
        self.shown.columns.clone()
    }

    /// Why the numbers may be incomplete, one line each.
    #[getter]
    fn notices(&self) -> Vec<String> {
        self.shown.notices.clone()
    }
}

/// A line profile (`data`) in `format` with `view` applied (see `LineReportView`).
#[pyfunction]
pub fn render(data: &str, format: &str, view: &str) -> PyResult<String> {
    LineReportView::new(data, view)?.render(format)
}

/// A line profile's records with `view` applied, as JSON (`{"names", "rows"}`).
#[pyfunction]
pub fn records(data: &str, view: &str) -> PyResult<String> {
    Ok(LineReportView::new(data, view)?.records())
}

/// Merge one line profile's data per rank (`profiles`, ordered by rank; `ranks` theirs) of
/// a job of `world_size` processes: the `merged_line_profile` data.
#[pyfunction]
pub fn merge(profiles: Vec<String>, ranks: Vec<u32>, world_size: u32) -> PyResult<String> {
    if profiles.len() != ranks.len() {
        return Err(value_error(format!(
            "merge_results: {} ranks for {} line profiles",
            ranks.len(),
            profiles.len()
        )));
    }
    let profiles = profiles
        .iter()
        .enumerate()
        .map(|(i, data)| line_profile(data).map_err(|e| value_error(format!("profiles[{i}]: {e}"))))
        .collect::<PyResult<Vec<_>>>()?;
    let merged = merge_profiles(&profiles, &ranks, world_size).map_err(value_error)?;
    Ok(to_json(&merged))
}

/// A `merged_line_profile` result's data as its derive reads it, in canonical form.
#[pyfunction]
pub fn merged_validate(data: &str) -> PyResult<String> {
    Ok(to_json(&merged_profile(data)?))
}

/// A merged line profile in `format` (`text`, `html`, `csv`, `json`) with `view`
/// (`func`, `columns`, `device`) applied: the defaults narrow to those it has, except in the
/// records (`csv`), where every column is shown unless named.
#[pyfunction]
pub fn merged_render(data: &str, format: &str, view: &str) -> PyResult<String> {
    let profile = merged_profile(data)?;
    let view: View = from_json(view)?;
    let every = matches!(format, "csv" | "json");
    let shown = merged::shown(&profile, &view, every).map_err(value_error)?;
    Ok(match format {
        "text" => merged_text::render(&shown),
        "html" => merged_html::render(&shown),
        "csv" => csv::render(&merged::records(&shown), false),
        "json" => to_json(&profile),
        other => {
            return Err(unknown_format(
                other,
                "merged_line_profile result",
                "text, html, csv, json",
            ))
        }
    })
}

/// A merged line profile's records with `view` applied, as JSON (`{"names", "rows"}`).
#[pyfunction]
pub fn merged_records(data: &str, view: &str) -> PyResult<String> {
    let profile = merged_profile(data)?;
    let view: View = from_json(view)?;
    let shown = merged::shown(&profile, &view, true).map_err(value_error)?;
    Ok(to_json(&merged::records(&shown)))
}

/// What changed from line profile `a` to `b` (their data), named `names`, in the columns
/// `view` asks for (`columns`, `device`: A's): the diff's data (`kind`, `names`, `rows`,
/// `totals`).
#[pyfunction]
pub fn diff(a: &str, b: &str, names: Vec<String>, view: &str) -> PyResult<String> {
    let view: View = from_json(view)?;
    let changed =
        compare(&line_profile(a)?, &line_profile(b)?, names, &view).map_err(value_error)?;
    Ok(to_json(&changed))
}

/// A line-profile diff (its data) as text.
#[pyfunction]
pub fn diff_render(diff: &str, format: &str) -> PyResult<String> {
    let diff: LineDiff = from_json(diff)?;
    match format {
        "text" => Ok(diff_text::render(&diff)),
        other => Err(unknown_format(other, "line-profile diff", "text")),
    }
}

/// The columns the source of `device` (`"cpu"` or `"cuda:N"`) can have.
#[pyfunction]
pub fn catalogue(device: &str) -> Vec<String> {
    columns::catalogue(device)
}

/// Check `columns` against what the source of `device` has: `known` (the names it reported)
/// when it reported some, else its catalogue; a ValueError naming the first unknown one,
/// the closest valid name and every valid one.
#[pyfunction]
#[pyo3(signature = (columns, device, known=Vec::new()))]
pub fn check_columns(columns: Vec<String>, device: &str, known: Vec<String>) -> PyResult<()> {
    columns::check(&columns, device, &known).map_err(value_error)
}

/// The names of the default columns.
pub fn default_columns() -> Vec<&'static str> {
    columns::DEFAULT.to_vec()
}
