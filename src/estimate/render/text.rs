//! The estimate as text, in the style of Pytorch-Memory-Utils' `modelsize`: one line per
//! figure, `Model {name} : {what}: {megabytes}M`, megabytes being 10^6 bytes printed with six
//! decimals as its `{:4f}` prints them. The figures are exact bytes; only the unit is its.
//! Then the notes, and the device the estimate modelled.

use crate::estimate::result::Estimate;

pub fn render(e: &Estimate) -> String {
    let mut out = String::new();
    for (label, bytes, suffix) in e.lines() {
        out.push_str(&format!(
            "Model {} : {label}: {:.6}{suffix}\n",
            e.model,
            bytes as f64 / 1e6
        ));
    }
    if let Some(precision) = e.precision() {
        out.push_str(&format!("Note: precision: {precision}\n"));
    }
    if let Some(parallelism) = e.parallelism() {
        out.push_str(&format!("Note: per rank: {parallelism}\n"));
    }
    for note in &e.notes {
        out.push_str(&format!("Note: {note}\n"));
    }
    out.push_str(&format!(
        "Note: on {}; every figure is in docs/guide.md\n",
        e.device
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimate::result::tests::estimate;

    #[test]
    fn original_style() {
        let text = render(&estimate());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "Model Linear : params: 4.004000M");
        assert_eq!(
            lines[1],
            "Model Linear : intermedite variables: 0.032000 M (without backward)"
        );
        assert_eq!(
            lines[6],
            "Model Linear : peak allocated: 8.072000M (step 1, backward)"
        );
        assert_eq!(
            &lines[8..],
            [
                "Note: a note",
                "Note: on cpu; every figure is in docs/guide.md"
            ]
        );
    }

    #[test]
    fn mixed_precision_is_said_before_the_notes() {
        let mut e = estimate();
        e.autocast = Some("float16".into());
        e.grad_scaler = true;
        let text = render(&e);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[8],
            "Note: precision: torch.autocast(float16), a GradScaler"
        );
        assert_eq!(lines[9], "Note: a note");
    }
}
