//! The estimate as text, in the style of Pytorch-Memory-Utils' `modelsize`: one line per
//! figure, `Model {name} : {what}: {megabytes}M`, megabytes being 10^6 bytes printed with six
//! decimals as its `{:4f}` prints them. The figures are exact bytes; only the unit is its.

/// One figure: what it is, its bytes, and what follows the number (`"M"`, `" M (with
/// backward)"`, `"M (step 2, backward)"`).
pub type Line = (String, u64, String);

pub fn render(model: &str, lines: &[Line], notes: &[String]) -> String {
    let mut out = String::new();
    for (label, bytes, suffix) in lines {
        out.push_str(&format!(
            "Model {model} : {label}: {:.6}{suffix}\n",
            *bytes as f64 / 1e6
        ));
    }
    for note in notes {
        out.push_str(&format!("Note: {note}\n"));
    }
    out
}

/// The text of an estimate (see `render`).
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn original_style() {
        let lines = vec![
            ("params".to_owned(), 497_759_232, "M".to_owned()),
            (
                "intermedite variables".to_owned(),
                1_500_000,
                " M (without backward)".to_owned(),
            ),
        ];
        let text = render("GPT2", &lines, &["fake".to_owned()]);
        assert_eq!(
            text,
            "Model GPT2 : params: 497.759232M\n\
             Model GPT2 : intermedite variables: 1.500000 M (without backward)\n\
             Note: fake\n"
        );
    }
}
