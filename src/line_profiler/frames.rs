//! Per-frame line accounting: one open line per profiled frame, kept on a stack per
//! thread, closed into a per-line table of maxima when the frame moves to another line,
//! returns, yields or unwinds.
//!
//! Why per frame: recursion, generators and threads run the same code object in several
//! frames at once, and each frame's line must be charged only with what happened while
//! that line ran (including everything the functions it called did).

use std::collections::BTreeMap;

use crate::sources::layout::{Layout, StatKind};

/// What a line has done, as the maximum over every time it ran.
#[derive(Clone, Debug, Default)]
pub struct Row {
    pub hits: u64,
    pub values: Vec<i64>,
}

/// One running frame of a profiled code object.
#[derive(Debug)]
pub struct Frame {
    pub code: u32,
    pub line: u32,
    /// The collector's cumulative counters when the line started.
    start: Vec<i64>,
    /// The highest value of each statistic since the line started.
    line_peak: Vec<i64>,
    /// The highest value of each statistic since the frame (re)started: handed to the
    /// caller's open line when this frame leaves the stack.
    frame_peak: Vec<i64>,
}

impl Frame {
    pub fn new(code: u32, line: u32, cumulative: &[i64]) -> Self {
        let n = cumulative.len();
        Self {
            code,
            line,
            start: cumulative.to_vec(),
            line_peak: vec![0; n],
            frame_peak: vec![0; n],
        }
    }

    /// Grow to a layout learned after this frame started (CUDA initialised mid-line):
    /// everything before read zero.
    fn fit(&mut self, n: usize) {
        if self.start.len() < n {
            self.start.resize(n, 0);
            self.line_peak.resize(n, 0);
            self.frame_peak.resize(n, 0);
        }
    }

    /// Fold a sample's values into the open line's peaks.
    pub fn see(&mut self, layout: &Layout, sample: &[i64]) {
        self.fit(layout.len());
        for &i in &layout.peaks {
            self.line_peak[i] = self.line_peak[i].max(sample[i]);
        }
    }

    /// Fold a returning callee's peaks into this frame's open line.
    pub fn absorb(&mut self, callee: &Frame) {
        self.fit(callee.frame_peak.len());
        for (mine, theirs) in self.line_peak.iter_mut().zip(&callee.frame_peak) {
            *mine = (*mine).max(*theirs);
        }
    }

    /// Close the open line into `rows` and start `next_line` (if the frame goes on).
    pub fn close_line(
        &mut self,
        layout: &Layout,
        sample: &[i64],
        cumulative: &[i64],
        rows: &mut BTreeMap<u32, Row>,
        next_line: Option<u32>,
    ) {
        let n = layout.len();
        self.fit(n);
        let row = rows.entry(self.line).or_default();
        if row.values.len() < n {
            row.values.resize(n, 0);
        }
        row.hits += 1;
        for i in 0..n {
            let value = match layout.kinds[i] {
                StatKind::Peak => self.line_peak[i],
                StatKind::Delta => cumulative[i] - self.start[i],
                StatKind::Current => sample[i],
            };
            row.values[i] = row.values[i].max(value);
        }
        for &i in &layout.peaks {
            self.frame_peak[i] = self.frame_peak[i].max(self.line_peak[i]);
        }
        if let Some(line) = next_line {
            self.line = line;
            self.start[..n].copy_from_slice(&cumulative[..n]);
            self.line_peak.iter_mut().for_each(|v| *v = 0);
        }
    }
}

/// The profiled frames running on one thread, innermost last.
#[derive(Debug)]
pub struct ThreadStack {
    pub thread: u64,
    pub frames: Vec<Frame>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout::new(
            ["bytes.current", "bytes.peak", "bytes.allocated"]
                .map(String::from)
                .to_vec(),
        )
    }

    #[test]
    fn a_line_gets_its_peak_growth_and_final_value() {
        let layout = layout();
        let mut rows = BTreeMap::new();
        let mut frame = Frame::new(0, 10, &[0, 0, 100]);
        frame.see(&layout, &[50, 80, 0]);
        frame.close_line(&layout, &[50, 80, 0], &[0, 0, 130], &mut rows, Some(11));
        assert_eq!(rows[&10].values, vec![50, 80, 30]);
        assert_eq!(frame.line, 11);
        // The next line starts from the counters at the close.
        frame.see(&layout, &[20, 50, 0]);
        frame.close_line(&layout, &[20, 50, 0], &[0, 0, 130], &mut rows, None);
        assert_eq!(rows[&11].values, vec![20, 50, 0]);
    }

    #[test]
    fn a_callee_peak_reaches_the_callers_line() {
        let layout = layout();
        let mut rows = BTreeMap::new();
        let mut caller = Frame::new(0, 5, &[0, 0, 0]);
        let mut callee = Frame::new(1, 20, &[0, 0, 0]);
        callee.see(&layout, &[10, 900, 0]);
        callee.close_line(&layout, &[10, 900, 0], &[0, 0, 0], &mut rows, None);
        caller.absorb(&callee);
        caller.see(&layout, &[10, 10, 0]);
        caller.close_line(&layout, &[10, 10, 0], &[0, 0, 0], &mut rows, None);
        assert_eq!(rows[&5].values[1], 900);
    }

    #[test]
    fn values_are_the_maximum_over_runs() {
        let layout = layout();
        let mut rows = BTreeMap::new();
        for peak in [30, 70, 40] {
            let mut frame = Frame::new(0, 1, &[0, 0, 0]);
            frame.see(&layout, &[0, peak, 0]);
            frame.close_line(&layout, &[0, peak, 0], &[0, 0, 0], &mut rows, None);
        }
        assert_eq!(rows[&1].values[1], 70);
        assert_eq!(rows[&1].hits, 3);
    }
}
