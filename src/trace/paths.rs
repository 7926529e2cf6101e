//! How a source file is shown in a trace's rows and stacks. Short by default, as the peak
//! tracer shows it: an installed package's file from its package down
//! (`.../transformers/models/llama/modeling_llama.py`), a file under the working directory
//! relative to it (`train.py`, `models/gpt.py`), any other file in full. Full paths on
//! request. Only the display changes: grouping by the shown text merges two files only
//! when their shown paths are equal (the same package in two environments).

use std::borrow::Cow;

/// Where installed packages live; the shown path starts after the last of them.
const PACKAGE_DIRS: [&str; 2] = ["/site-packages/", "/dist-packages/"];

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Paths {
    /// Every path as recorded.
    Full,
    /// Shortened; relative to `cwd` (the recording's working directory) where under it.
    Short { cwd: Option<String> },
}

impl Default for Paths {
    fn default() -> Self {
        Paths::Short { cwd: None }
    }
}

impl Paths {
    /// `path` as shown.
    pub fn show<'a>(&self, path: &'a str) -> Cow<'a, str> {
        let Paths::Short { cwd } = self else {
            return Cow::Borrowed(path);
        };
        let package = PACKAGE_DIRS
            .iter()
            .filter_map(|dir| path.rfind(dir).map(|at| at + dir.len()))
            .max();
        if let Some(start) = package {
            if start < path.len() {
                return Cow::Owned(format!(".../{}", &path[start..]));
            }
        }
        if let Some(cwd) = cwd.as_deref() {
            let root = cwd.trim_end_matches('/');
            // The root directory is under nothing: every path would lose its leading '/'.
            if !root.is_empty() {
                if let Some(rest) = path.strip_prefix(root).and_then(|r| r.strip_prefix('/')) {
                    if !rest.is_empty() {
                        return Cow::Borrowed(rest);
                    }
                }
            }
        }
        Cow::Borrowed(path)
    }

    /// The same style for a recording made in `recorded` (the working directory the
    /// Tracer saved): files are shown relative to it rather than to the reader's.
    pub fn recorded_in(self, recorded: Option<&str>) -> Paths {
        match (self, recorded) {
            (Paths::Short { .. }, Some(cwd)) => Paths::Short {
                cwd: Some(cwd.to_owned()),
            },
            (other, _) => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Paths;

    fn short(cwd: &str, path: &str) -> String {
        Paths::Short {
            cwd: Some(cwd.to_owned()),
        }
        .show(path)
        .into_owned()
    }

    #[test]
    fn packages_from_their_directory_files_here_relative_others_in_full() {
        let site = "/opt/venv/lib/python3.12/site-packages/transformers/models/llama/x.py";
        assert_eq!(short("/work", site), ".../transformers/models/llama/x.py");
        let dist = "/usr/lib/python3/dist-packages/numpy/core/a.py";
        assert_eq!(short("/work", dist), ".../numpy/core/a.py");
        // An environment inside the project is still a package.
        assert_eq!(
            short(
                "/work",
                "/home/ana/.venv/lib/python3.11/site-packages/torch/nn/f.py"
            ),
            ".../torch/nn/f.py"
        );
        assert_eq!(
            short("/home/ana/proj", "/home/ana/proj/models/gpt.py"),
            "models/gpt.py"
        );
        assert_eq!(
            short("/home/ana/proj/", "/home/ana/proj/train.py"),
            "train.py"
        );
        assert_eq!(
            short("/home/ana/proj", "/home/ana/project/train.py"),
            "/home/ana/project/train.py"
        );
        assert_eq!(short("/home/ana/proj", "/home/ana/proj"), "/home/ana/proj");
        assert_eq!(short("/", "/app/train.py"), "/app/train.py");
        assert_eq!(
            short("/work", "<frozen importlib._bootstrap>"),
            "<frozen importlib._bootstrap>"
        );
        assert_eq!(short("/work", "/x/site-packages/"), "/x/site-packages/");
        assert_eq!(Paths::Full.show(site), site);
    }

    #[test]
    fn the_recordings_working_directory_wins_over_the_readers() {
        let reader = Paths::Short {
            cwd: Some("/here".to_owned()),
        };
        let recorded = Paths::Short {
            cwd: Some("/rec".to_owned()),
        };
        assert_eq!(reader.clone().recorded_in(Some("/rec")), recorded);
        assert_eq!(reader.clone().recorded_in(None), reader);
        assert_eq!(Paths::Full.recorded_in(Some("/rec")), Paths::Full);
    }
}
