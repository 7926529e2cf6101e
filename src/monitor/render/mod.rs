//! The training monitor's record rendered: the original's block of one iteration and its
//! CSV (`text`), the per-iteration plot (`html`). A record in, a string out; `render` picks
//! the form and the view (which iteration, the CSV's header alone).

pub mod html;
pub mod text;

use serde::Deserialize;

use super::result::MonitorRecord;

/// What a rendering shows of the record.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct View {
    /// The step (1, 2, ... over the monitor's life) of the row to render: the text's block
    /// (None: the latest), the CSV's one row (None: the whole file).
    #[serde(default)]
    pub iteration: Option<usize>,
    /// The CSV's header line alone.
    #[serde(default)]
    pub header: bool,
}

/// `record` as `format` (`text`, `csv` or `html`) with `view`; the error says why not (an
/// unknown format, an option the format does not take, a step not recorded).
pub fn render(record: &MonitorRecord, format: &str, view: &View) -> Result<String, String> {
    match format {
        "text" => {
            if view.header {
                return Err("the text takes no header option (it is the CSV's)".into());
            }
            let index = row_index(record, view.iteration)?;
            text::block_of(record, index)
                .map(|b| text::block(&b))
                .ok_or_else(|| incomplete(index))
        }
        "csv" => {
            if view.header {
                if view.iteration.is_some() {
                    return Err("header=true renders the header alone: give no iteration".into());
                }
                return Ok(text::csv_header(&record.csv_names));
            }
            match view.iteration {
                None => text::csv_file(record).ok_or_else(|| "a row is incomplete".into()),
                Some(step) => {
                    let index = row_index(record, Some(step))?;
                    text::block_of(record, index)
                        .map(|b| text::csv_row(&b))
                        .ok_or_else(|| incomplete(index))
                }
            }
        }
        "html" => {
            if view.header || view.iteration.is_some() {
                return Err("the plot takes no view options (it shows every iteration)".into());
            }
            Ok(html::plot(record))
        }
        other => Err(format!(
            "format={other:?}: a monitor result renders as text, csv or html"
        )),
    }
}

/// The index of the row of `step` (None: the latest).
fn row_index(record: &MonitorRecord, step: Option<usize>) -> Result<usize, String> {
    let count = record.rows.len();
    if count == 0 {
        return Err("nothing recorded yet; call record_stats() first".into());
    }
    match step {
        None => Ok(count - 1),
        Some(step) if (1..=count).contains(&step) => Ok(step - 1),
        Some(step) => Err(format!("iteration={step}: steps recorded are 1 to {count}")),
    }
}

fn incomplete(index: usize) -> String {
    format!("row {index} of the record is incomplete (its details or layout are missing)")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::monitor::result::{Details, Layout, Row};

    fn record(iterations: &[i64]) -> MonitorRecord {
        let rows: Vec<Row> = iterations
            .iter()
            .enumerate()
            .map(|(i, &iteration)| Row {
                step: i as i64 + 1,
                epoch: 1,
                iteration,
                peak_cached: 3_000_000,
                current_cached: 0,
                feature_maps: Some(0),
                feature_maps_from: Some(i as i64 + 1),
                weight_usage: 2_000_000,
                weight_gradient_usage: 2_000_000,
                intermediate_gradients: Some(0),
                optimizer_state_usage: None,
                peak_allocated: 3,
                peak_window: "forward".into(),
                backward_passes: 1,
                parameter: 1,
                buffer: 0,
                gradient: 1,
                activation: 0,
                temporary: 1,
                optimizer_state: 0,
                other: 0,
                notice: None,
            })
            .collect();
        MonitorRecord {
            device: "cpu".into(),
            verbose: false,
            print_period: 2,
            csv_names: vec!["a.weight".into()],
            details: vec![
                Details {
                    modules: vec![("m".into(), 5)],
                    layout: 0,
                    grads: vec![2_000_000],
                };
                rows.len()
            ],
            rows,
            layouts: vec![Layout {
                names: vec!["a.weight".into()],
                bytes: vec![2_000_000],
            }],
        }
    }

    fn view(iteration: Option<usize>, header: bool) -> View {
        View { iteration, header }
    }

    #[test]
    fn text_is_one_block_and_csv_the_printed_iterations() {
        let r = record(&[1, 2, 3, 4]);
        let latest = render(&r, "text", &View::default()).unwrap();
        assert!(latest.starts_with(&"*".repeat(43)));
        assert!(latest.contains("Memory Usage for Iteration 4 of Epoch 1"));
        let first = render(&r, "text", &view(Some(1), false)).unwrap();
        assert!(first.contains("Iteration 1 of Epoch 1") && !first.contains("  m...."));
        let file = render(&r, "csv", &View::default()).unwrap();
        assert_eq!(file.lines().count(), 3); // the header, iterations 2 and 4
        assert!(file.starts_with("epoch,iteration,"));
        assert_eq!(
            render(&r, "csv", &view(Some(3), false)).unwrap(),
            "1,3,3,0,0,2,2,2,2,0\n"
        );
        assert_eq!(
            render(&r, "csv", &view(None, true)).unwrap(),
            text::csv_header(&r.csv_names)
        );
        assert!(render(&r, "html", &View::default())
            .unwrap()
            .contains("<svg"));
    }

    #[test]
    fn a_verbose_record_lists_its_modules() {
        let mut r = record(&[1]);
        r.verbose = true;
        let block = render(&r, "text", &View::default()).unwrap();
        assert!(
            block.contains(&format!("\n  m{}0 MB\n", ".".repeat(36))),
            "{block}"
        );
    }

    #[test]
    fn what_cannot_be_rendered_says_why() {
        let r = record(&[1, 2]);
        assert_eq!(
            render(&r, "text", &view(Some(3), false)).unwrap_err(),
            "iteration=3: steps recorded are 1 to 2"
        );
        assert_eq!(
            render(&record(&[]), "text", &View::default()).unwrap_err(),
            "nothing recorded yet; call record_stats() first"
        );
        assert!(render(&r, "pdf", &View::default())
            .unwrap_err()
            .contains("renders as text, csv or html"));
        assert!(render(&r, "html", &view(Some(1), false)).is_err());
        let mut broken = r.clone();
        broken.details[1].layout = 5;
        assert!(render(&broken, "text", &View::default())
            .unwrap_err()
            .contains("incomplete"));
        assert!(render(&broken, "csv", &View::default()).is_err());
    }

    #[test]
    fn negative_iterations_print_as_python_reads_them() {
        assert!(text::printed(-2, 2) && !text::printed(-1, 2) && text::printed(3, 1));
        assert!(text::printed(5, 0) && text::printed(0, 3));
    }
}
