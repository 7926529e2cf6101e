//! What a display shows of a result: some of its functions (`func`), some of its columns
//! (`columns`), applied once, here, to the result itself. The view's options arrive as one
//! JSON object from Python, whose argument checks (types) ran before.

use serde::Deserialize;

use super::columns::{self, repr, DEFAULT};
use super::result::{Function, Line, LineProfile};

/// A view's options: None shows everything.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct View {
    /// The qualified names of the functions to show, in any order (shown in report order).
    #[serde(default)]
    pub func: Option<Vec<String>>,
    /// The columns to show, in this order.
    #[serde(default)]
    pub columns: Option<Vec<String>>,
    /// The device the result was made on (its meta's), for what a column error says.
    #[serde(default)]
    pub device: Option<String>,
}

impl View {
    /// Whether the columns asked for are the defaults, which a merged profile or a diff
    /// narrow to those it has (a result made elsewhere may lack one).
    pub fn default_columns(&self) -> bool {
        self.columns
            .as_deref()
            .is_some_and(|c| c.iter().eq(DEFAULT.iter()))
    }

    /// The columns to show of `have`: every one for None; otherwise those asked for, each
    /// checked against `have`. With `lenient`, the defaults show those of them `have` has
    /// (else its first column).
    pub fn pick_columns(&self, have: &[String], lenient: bool) -> Result<Vec<String>, String> {
        let Some(asked) = &self.columns else {
            return Ok(have.to_vec());
        };
        if lenient && self.default_columns() {
            let present: Vec<String> = asked.iter().filter(|c| have.contains(c)).cloned().collect();
            return Ok(if present.is_empty() {
                have.iter().take(1).cloned().collect()
            } else {
                present
            });
        }
        columns::check_saved(asked, have, self.device.as_deref())?;
        Ok(asked.clone())
    }
}

/// The indexes of `picked` in `have` (each is there: `pick_columns` checked them).
pub fn indexes(picked: &[String], have: &[String]) -> Vec<usize> {
    picked
        .iter()
        .map(|c| have.iter().position(|h| h == c).unwrap_or(0))
        .collect()
}

/// The functions of `names` (every one for None) that `have` lists, in its order; an error
/// naming the first one it does not have, as `what` (`"line profile"`).
pub fn pick_functions(
    names: Option<&[String]>,
    have: &[&str],
    what: &str,
) -> Result<Vec<bool>, String> {
    let Some(names) = names else {
        return Ok(vec![true; have.len()]);
    };
    let mut chosen = vec![false; have.len()];
    for name in names {
        let mut found = false;
        for (i, qualname) in have.iter().enumerate() {
            if qualname == name {
                chosen[i] = true;
                found = true;
            }
        }
        if !found {
            let listed = if have.is_empty() {
                "none".to_string()
            } else {
                have.join(", ")
            };
            return Err(format!(
                "no function {} in this {what} (it has: {listed})",
                repr(name)
            ));
        }
    }
    Ok(chosen)
}

/// The line profile `view` shows: its functions and columns (the values of those columns).
pub fn apply(profile: &LineProfile, view: &View) -> Result<LineProfile, String> {
    let columns = view.pick_columns(&profile.columns, false)?;
    let picks = indexes(&columns, &profile.columns);
    let chosen = pick_functions(view.func.as_deref(), &profile.names(), "line profile")?;
    let functions = profile
        .functions
        .iter()
        .zip(chosen)
        .filter(|(_, chosen)| *chosen)
        .map(|(function, _)| Function {
            qualname: function.qualname.clone(),
            filename: function.filename.clone(),
            lines: function
                .lines
                .iter()
                .map(|line| {
                    let values = line.values().map(|v| picks.iter().map(|&i| v[i]).collect());
                    Line(line.0, line.1.clone(), line.2, values)
                })
                .collect(),
        })
        .collect();
    Ok(LineProfile {
        columns,
        functions,
        notices: profile.notices.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::from_json;

    fn profile() -> LineProfile {
        from_json(
            r#"{"columns":["a","b"],"functions":[
                {"qualname":"f","filename":"m.py","lines":[[1,"x\n",1,[1,2]],[2,"y\n",0,null]]},
                {"qualname":"g","filename":"m.py","lines":[[5,"z\n",2,[3,4]]]}],"notices":["n"]}"#,
        )
        .unwrap()
    }

    #[test]
    fn a_view_picks_functions_and_columns() {
        let view: View = from_json(r#"{"func":["g"],"columns":["b"]}"#).unwrap();
        let shown = apply(&profile(), &view).unwrap();
        assert_eq!(shown.columns, vec!["b"]);
        assert_eq!(shown.names(), vec!["g"]);
        assert_eq!(shown.functions[0].lines[0].values(), Some(&[4][..]));
        assert_eq!(shown.notices, vec!["n"]);
        assert_eq!(apply(&profile(), &View::default()).unwrap(), profile());
    }

    #[test]
    fn what_a_result_lacks_is_named() {
        let view: View = from_json(r#"{"func":["h"]}"#).unwrap();
        assert_eq!(
            apply(&profile(), &view).unwrap_err(),
            "no function 'h' in this line profile (it has: f, g)"
        );
        let view: View = from_json(r#"{"columns":["c"],"device":"cpu"}"#).unwrap();
        assert!(apply(&profile(), &view)
            .unwrap_err()
            .starts_with("unknown column 'c' for the CPU source"));
        let view: View =
            from_json(r#"{"columns":["active_bytes.all.peak","reserved_bytes.all.peak"]}"#)
                .unwrap();
        assert!(
            apply(&profile(), &view).is_err(),
            "a line profile's defaults are strict"
        );
        assert_eq!(
            view.pick_columns(&profile().columns, true).unwrap(),
            vec!["a"]
        );
        assert!(from_json::<View>(r#"{"colums":null}"#).is_err());
    }
}
