//! The allocation timeline of a trace as ONE self-contained HTML file: allocated bytes over
//! time, the top locations stacked under the total, the peak marked with its exact bytes.
//!
//! It must open offline and years later, so it loads nothing: inline SVG drawn here, inline
//! CSS, and a few lines of inline JavaScript for a hover readout (the picture is complete
//! without it). Every text that reaches the page is escaped: locations come from user code.
//! The view arrives downsampled (at most ~2000 points); a larger one is downsampled again
//! here, keeping the maximum of each bucket, so a browser never has to draw a huge polygon.

use std::fmt::Write;

use crate::results::from_json;
use crate::text::escape::escape;
use crate::text::size::human_bytes;
use crate::trace::result::TimelineView;

/// More samples than this are downsampled before drawing.
const MAX_POINTS: usize = 4000;
/// What a downsampled view keeps, about.
const TARGET_POINTS: usize = 2000;
/// Legend and hover labels longer than this are shortened in the middle.
const LABEL_CHARS: usize = 44;

/// The SVG's coordinate box and the plot area inside it.
const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 500.0;
const LEFT: f64 = 84.0;
const RIGHT: f64 = WIDTH - 24.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = HEIGHT - 54.0;

/// Tableau 10 without its grey, which marks the "other" layer.
const COLORS: [&str; 9] = [
    "#4e79a7", "#f28e2c", "#e15759", "#76b7b2", "#59a14f", "#edc949", "#af7aa1", "#ff9da7",
    "#9c755f",
];
const OTHER_COLOR: &str = "#bab0ab";

const STYLE: &str = "<style>\
body{margin:0;background:#fff;color:#222}\
.memlab-timeline{font-family:system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',Arial,sans-serif;\
font-size:14px;padding:12px 18px;max-width:1400px}\
.memlab-timeline h1{font-size:18px;margin:0 0 4px 0;font-weight:600}\
.memlab-timeline .summary{margin:0 0 8px 0}\
.memlab-timeline .notices{background:#fff6d6;border:1px solid #e8d48a;border-radius:4px;\
padding:6px 10px 6px 28px;margin:0 0 8px 0}\
.memlab-timeline .notices li{margin:2px 0}\
.memlab-timeline .body{display:flex;flex-wrap:wrap;gap:8px 16px;align-items:flex-start}\
.memlab-timeline svg{flex:1 1 640px;min-width:320px;max-width:1100px;height:auto;display:block}\
.memlab-timeline svg text{fill:#333;font-size:14px}\
.memlab-timeline svg .axis-title{font-size:15px;fill:#222}\
.memlab-timeline svg .peak-label{font-size:16px;font-weight:600;fill:#b00020;\
stroke:#fff;stroke-width:4px;paint-order:stroke;stroke-linejoin:round}\
.memlab-timeline svg .layer:hover{fill-opacity:1;stroke:#222;stroke-width:0.6}\
.memlab-timeline .legend{flex:0 1 360px;margin:4px 0 0 0;padding:0;list-style:none;font-size:13px}\
.memlab-timeline .legend li{display:flex;gap:6px;align-items:baseline;margin:0 0 5px 0;cursor:default}\
.memlab-timeline .legend .swatch{flex:none;width:12px;height:12px;border-radius:2px;\
position:relative;top:1px}\
.memlab-timeline .legend .name{font-family:ui-monospace,'DejaVu Sans Mono',Menlo,Consolas,monospace;\
overflow-wrap:anywhere}\
.memlab-timeline .legend .value{color:#666;white-space:nowrap;margin-left:auto;padding-left:6px}\
.memlab-timeline .legend .head{color:#666;font-size:12px;border-bottom:1px solid #ddd;padding-bottom:2px}\
.memlab-timeline .legend .head .name{font-family:inherit}\
.memlab-timeline .legend .total .swatch{height:3px;top:-3px;background:#222}\
.memlab-timeline .readout{font-family:ui-monospace,'DejaVu Sans Mono',Menlo,Consolas,monospace;\
font-size:12px;color:#444;min-height:3.6em;margin:6px 0 0 0;white-space:pre-wrap}\
</style>";

/// The hover readout: finds the nearest sample under the pointer, moves a cursor line there
/// and prints its time, total and layers (text only, through textContent: nothing is parsed).
const SCRIPT: &str = r#"<script>
(function () {
  var root = document.currentScript.closest('.memlab-timeline');
  var svg = root.querySelector('svg');
  var D = JSON.parse(root.querySelector('.memlab-data').textContent);
  var names = Array.prototype.map.call(root.querySelectorAll('.legend li[data-full]'),
    function (li) { return li.getAttribute('data-full'); });
  var cursor = svg.querySelector('.cursor');
  var out = root.querySelector('.readout');
  var idle = out.textContent;
  function human(b) {
    var u = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'], i = 0, v = b;
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return (i ? v.toFixed(1) : String(v)) + ' ' + u[i];
  }
  function nearest(x) {
    var lo = 0, hi = D.x.length - 1;
    while (hi - lo > 1) { var mid = (lo + hi) >> 1; if (D.x[mid] < x) lo = mid; else hi = mid; }
    return Math.abs(D.x[hi] - x) < Math.abs(D.x[lo] - x) ? hi : lo;
  }
  svg.addEventListener('mousemove', function (e) {
    if (!D.x.length) return;
    var p = svg.createSVGPoint(); p.x = e.clientX; p.y = e.clientY;
    var q = p.matrixTransform(svg.getScreenCTM().inverse());
    var i = nearest(q.x);
    cursor.setAttribute('x1', D.x[i]); cursor.setAttribute('x2', D.x[i]);
    cursor.style.display = '';
    var lines = ['t = ' + D.t[i].toFixed(3) + ' ms   total ' + human(D.total[i]) +
      ' (' + D.total[i] + ' bytes)'];
    for (var k = 0; k < D.layers.length; k++) {
      if (D.layers[k][i] > 0) lines.push('  ' + human(D.layers[k][i]).padStart(10) + '  ' + names[k]);
    }
    out.textContent = lines.join('\n');
  });
  svg.addEventListener('mouseleave', function () {
    cursor.style.display = 'none'; out.textContent = idle;
  });
})();
</script>"#;

/// The view made drawable: equal lengths, at most `MAX_POINTS` samples, times in ms.
struct Prepared {
    time_ms: Vec<f64>,
    total: Vec<u64>,
    layers: Vec<(String, Vec<u64>)>,
    peak: Option<usize>,
    notices: Vec<String>,
}

/// Why a view handed in as JSON text cannot be drawn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ViewError {
    /// A key the view must have is missing (Python's ValueError).
    Missing(String),
    /// A value of the wrong type or range (Python's TypeError, as for any argument).
    Type(String),
    /// The lengths or the peak disagree (ValueError).
    Inconsistent(String),
}

impl std::fmt::Display for ViewError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ViewError::Missing(m) | ViewError::Type(m) | ViewError::Inconsistent(m) => {
                f.write_str(m)
            }
        }
    }
}

/// What each key of a view holds, as its messages say it.
fn holds(key: &str) -> &'static str {
    match key {
        "title" => "a str",
        "time_us" => "a list of ints (microseconds)",
        "total" => "a list of byte counts (ints >= 0)",
        "layers" => "a list of (name, byte counts) pairs",
        "peak_index" | "peak_bytes" => "an int >= 0",
        "notices" => "a list of str",
        _ => "what report.timeline(device) gives",
    }
}

/// A view from its JSON text (an object with `TimelineView`'s keys, as
/// `TraceResult.timeline(device)` returns), read by its derive and checked: the field that
/// does not fit is named by its key.
pub fn read(text: &str) -> Result<TimelineView, ViewError> {
    let view: TimelineView = from_json(text).map_err(|e| {
        if let Some(field) = e
            .message
            .strip_prefix("missing field `")
            .and_then(|rest| rest.split('`').next())
        {
            return ViewError::Missing(format!(
                "timeline view has no '{field}'; it needs title, time_us, total, layers, \
                 peak_index, peak_bytes and notices, as report.timeline(device) returns"
            ));
        }
        let key = e.path.split(['[', '.']).next().unwrap_or_default();
        if key.is_empty() {
            return ViewError::Type(format!(
                "the timeline view must be an object ({e}); pass the dict \
                 report.timeline(device) returns"
            ));
        }
        ViewError::Type(format!(
            "timeline view['{key}'] must be {} ({e}); pass the dict report.timeline(device) \
             returns",
            holds(key)
        ))
    })?;
    match check(&view) {
        Some(problem) => Err(ViewError::Inconsistent(format!(
            "timeline view is inconsistent: {problem}"
        ))),
        None => Ok(view),
    }
}

/// Why a view cannot be drawn as given, or None (`read` refuses it; the renderer itself
/// draws what it can and says what it repaired).
pub fn check(view: &TimelineView) -> Option<String> {
    let n = view.time_us.len();
    if view.total.len() != n {
        return Some(format!(
            "time_us has {n} samples but total has {}: both need one value per sample",
            view.total.len()
        ));
    }
    for (name, values) in &view.layers {
        if values.len() != n {
            return Some(format!(
                "layer {name:?} has {} values but there are {n} samples",
                values.len()
            ));
        }
    }
    if n > 0 && view.peak_index >= n {
        return Some(format!(
            "peak_index {} is past the last sample ({})",
            view.peak_index,
            n - 1
        ));
    }
    None
}

fn prepare(view: &TimelineView) -> Prepared {
    let mut notices = view.notices.clone();
    if let Some(problem) = check(view) {
        notices.push(format!(
            "The timeline data was inconsistent ({problem}); drawn as far as it goes."
        ));
    }
    let n = view.time_us.len().min(view.total.len());
    let fit = |values: &[u64]| -> Vec<u64> {
        let mut v: Vec<u64> = values.iter().copied().take(n).collect();
        v.resize(n, 0);
        v
    };
    let total = fit(&view.total);
    let layers: Vec<(String, Vec<u64>)> = view
        .layers
        .iter()
        .map(|(name, values)| (name.clone(), fit(values)))
        .collect();
    let peak = if n == 0 {
        None
    } else if view.peak_index < n {
        Some(view.peak_index)
    } else {
        // The largest total stands in for a peak index that points nowhere.
        (0..n).max_by_key(|&i| (total[i], std::cmp::Reverse(i)))
    };
    let t0 = view.time_us.first().copied().unwrap_or(0);
    let time_ms: Vec<f64> = view.time_us[..n]
        .iter()
        .map(|&t| (t.saturating_sub(t0)) as f64 / 1000.0)
        .collect();
    let mut prepared = Prepared {
        time_ms,
        total,
        layers,
        peak,
        notices,
    };
    if n > MAX_POINTS {
        downsample(&mut prepared);
    }
    prepared
}

/// Keep one sample per bucket: the one with the largest total (the peak's own sample in the
/// peak's bucket), so no maximum disappears and the layers still add up at every sample.
fn downsample(p: &mut Prepared) {
    let n = p.total.len();
    // TARGET_POINTS buckets of consecutive samples, their sizes differing by one at most.
    let keep: Vec<usize> = (0..TARGET_POINTS)
        .map(|k| {
            let (start, end) = (k * n / TARGET_POINTS, (k + 1) * n / TARGET_POINTS);
            match p.peak {
                Some(peak) if (start..end).contains(&peak) => peak,
                _ => (start..end)
                    .max_by_key(|&i| (p.total[i], std::cmp::Reverse(i)))
                    .unwrap_or(start),
            }
        })
        .collect();
    let pick = |values: &[u64]| keep.iter().map(|&i| values[i]).collect::<Vec<u64>>();
    p.peak = p.peak.and_then(|peak| keep.iter().position(|&i| i == peak));
    p.time_ms = keep.iter().map(|&i| p.time_ms[i]).collect();
    p.total = pick(&p.total);
    for (_, values) in &mut p.layers {
        *values = pick(values);
    }
    p.notices.push(format!(
        "Downsampled from {n} to {} samples for drawing (each is the sample with the largest \
         total among about {:.1} consecutive ones).",
        keep.len(),
        n as f64 / TARGET_POINTS as f64
    ));
}

/// A location as a legend shows it: the file name without its folders, shortened in the
/// middle when still long ("/a/b/model.py:42 (forward)" -> "model.py:42 (forward)").
pub fn short_label(full: &str) -> String {
    let head_end = full.find(" (").unwrap_or(full.len());
    let start = full[..head_end].rfind(['/', '\\']).map_or(0, |i| i + 1);
    let short = full[start..].trim();
    let short = if short.is_empty() { full } else { short };
    let chars: Vec<char> = short.chars().collect();
    if chars.len() <= LABEL_CHARS {
        return short.to_string();
    }
    let head = (LABEL_CHARS - 1) / 2;
    let tail = LABEL_CHARS - 1 - head;
    let mut out: String = chars[..head].iter().collect();
    out.push('…');
    out.extend(&chars[chars.len() - tail..]);
    out
}

/// The exact peak as the label and summary print it: "1.5 GiB (1610612736 bytes)".
pub fn peak_text(bytes: u64) -> String {
    format!("{} ({bytes} bytes)", human_bytes(bytes as i128))
}

fn is_other(index: usize, count: usize, name: &str) -> bool {
    let bare = name.trim_matches(|c: char| "<>()[] ".contains(c));
    index + 1 == count && bare.eq_ignore_ascii_case("other")
}

fn layer_color(index: usize, count: usize, name: &str) -> &'static str {
    if is_other(index, count, name) {
        OTHER_COLOR
    } else {
        COLORS[index % COLORS.len()]
    }
}

/// The round step (1, 2, 2.5 or 5 times a power of ten) nearest to `raw`, by ratio.
fn nice_step(raw: f64) -> f64 {
    if raw.is_nan() || raw <= 0.0 || raw.is_infinite() {
        return 1.0;
    }
    let magnitude = 10f64.powf(raw.log10().floor());
    let f = raw / magnitude;
    let n = [1.0, 2.0, 2.5, 5.0, 10.0]
        .into_iter()
        .min_by(|a: &f64, b: &f64| (f / a).ln().abs().total_cmp(&(f / b).ln().abs()))
        .unwrap_or(1.0);
    n * magnitude
}

/// A number with at most three decimals, trailing zeros dropped ("1.25", "2", "0.5").
fn trim_number(value: f64) -> String {
    let text = format!("{value:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text == "-0" {
        "0".to_string()
    } else {
        text.to_string()
    }
}

/// Ticks of the memory axis: (top of the axis in bytes, [(bytes, label)]).
fn memory_ticks(max_bytes: u64) -> (f64, Vec<(f64, String)>) {
    const UNITS: [(f64, &str); 5] = [
        (1099511627776.0, "TiB"),
        (1073741824.0, "GiB"),
        (1048576.0, "MiB"),
        (1024.0, "KiB"),
        (1.0, "B"),
    ];
    // Headroom above the peak for its label.
    let top = (max_bytes as f64 * 1.12).max(1.0);
    let (factor, unit) = UNITS
        .iter()
        .copied()
        .find(|(factor, _)| top >= *factor)
        .unwrap_or((1.0, "B"));
    let mut step = nice_step(top / factor / 6.0);
    if unit == "B" {
        step = step.max(1.0);
    }
    let count = (top / factor / step).ceil().max(1.0) as usize;
    let ticks = (0..=count)
        .map(|k| {
            let units = k as f64 * step;
            (units * factor, format!("{} {unit}", trim_number(units)))
        })
        .collect();
    (count as f64 * step * factor, ticks)
}

/// Ticks of the time axis, in ms: (end of the axis, [ms]). The axis ends with the data.
fn time_ticks(span_ms: f64) -> (f64, Vec<f64>) {
    let span = if span_ms > 0.0 { span_ms } else { 1.0 };
    let step = nice_step(span / 7.0);
    let count = (span / step + 1e-9).floor() as usize;
    (span, (0..=count).map(|k| k as f64 * step).collect())
}

/// A time in ms with as many decimals as its size deserves ("737.7", "1019", "0.125").
fn format_ms(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{ms:.0}")
    } else if ms >= 10.0 {
        trim_number((ms * 10.0).round() / 10.0)
    } else {
        trim_number(ms)
    }
}

struct Scale {
    x_end: f64,
    y_top: f64,
}

impl Scale {
    fn x(&self, ms: f64) -> f64 {
        LEFT + (ms / self.x_end) * (RIGHT - LEFT)
    }
    fn y(&self, bytes: f64) -> f64 {
        BOTTOM - (bytes / self.y_top) * (BOTTOM - TOP)
    }
}

/// Render the timeline as one self-contained HTML document (no network, no external file).
pub fn timeline_html(view: &TimelineView) -> String {
    let p = prepare(view);
    let mut out = String::with_capacity(64 * 1024 + p.total.len() * (p.layers.len() + 1) * 48);
    let title = if view.title.is_empty() {
        "memory timeline".to_string()
    } else {
        view.title.clone()
    };
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>Allocated memory over time: {}</title>{STYLE}</head><body>\n\
         <div class=\"memlab-timeline\"><h1>Allocated memory over time: {}</h1>",
        escape(&title),
        escape(&title)
    );
    if !p.notices.is_empty() {
        out.push_str("<ul class=\"notices\">");
        for notice in &p.notices {
            let _ = write!(out, "<li>{}</li>", escape(notice));
        }
        out.push_str("</ul>");
    }
    match p.peak {
        None => {
            out.push_str(
                "<p class=\"summary\">No samples: nothing was allocated while tracing.</p>",
            );
        }
        Some(peak) => {
            let span = p.time_ms.iter().copied().fold(0.0, f64::max);
            let _ = write!(
                out,
                "<p class=\"summary\">Peak <b>{}</b> at {} ms; {} samples over {} ms.</p>",
                escape(&peak_text(view.peak_bytes)),
                format_ms(p.time_ms[peak]),
                p.total.len(),
                format_ms(span)
            );
            plot(&mut out, &p, peak, view.peak_bytes);
        }
    }
    out.push_str("</div></body></html>\n");
    out
}

fn plot(out: &mut String, p: &Prepared, peak: usize, peak_bytes: u64) {
    let n = p.total.len();
    let stacked_max = (0..n)
        .map(|i| p.layers.iter().map(|(_, v)| v[i]).sum::<u64>())
        .max()
        .unwrap_or(0);
    let max_total = p.total.iter().copied().max().unwrap_or(0);
    let (y_top, y_ticks) = memory_ticks(max_total.max(peak_bytes).max(stacked_max));
    let span = p.time_ms.iter().copied().fold(0.0, f64::max);
    let (x_end, x_ticks) = time_ticks(span);
    let s = Scale { x_end, y_top };
    let xs: Vec<f64> = p.time_ms.iter().map(|&t| s.x(t)).collect();

    out.push_str("<div class=\"body\">");
    let _ = write!(
        out,
        "<svg viewBox=\"0 0 {WIDTH} {HEIGHT}\" role=\"img\" aria-label=\"allocated memory over time\">"
    );
    // Grid and tick labels first, so the areas lie on top of the grid lines.
    out.push_str("<g class=\"grid\" stroke=\"#e4e4e4\" stroke-width=\"1\">");
    for (bytes, _) in &y_ticks {
        let y = s.y(*bytes);
        let _ = write!(
            out,
            "<line x1=\"{LEFT}\" x2=\"{RIGHT}\" y1=\"{y:.1}\" y2=\"{y:.1}\"/>"
        );
    }
    for ms in &x_ticks {
        let x = s.x(*ms);
        let _ = write!(
            out,
            "<line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{TOP}\" y2=\"{BOTTOM}\"/>"
        );
    }
    out.push_str("</g>");

    // The layers, stacked from the biggest at the bottom.
    let mut lower = vec![0u64; n];
    out.push_str("<g class=\"layers\">");
    let count = p.layers.len();
    for (k, (name, values)) in p.layers.iter().enumerate() {
        let upper: Vec<u64> = lower
            .iter()
            .zip(values)
            .map(|(a, b)| a.saturating_add(*b))
            .collect();
        let _ = write!(
            out,
            "<polygon class=\"layer\" data-layer=\"{k}\" fill=\"{}\" fill-opacity=\"0.85\" points=\"",
            layer_color(k, count, name)
        );
        // Along the top of the layer, then back along its bottom.
        points(out, xs.iter().zip(&upper), &s);
        out.push(' ');
        points(out, xs.iter().zip(&lower).rev(), &s);
        let _ = write!(
            out,
            "\"><title>{}\n{} at the peak</title></polygon>",
            escape(name),
            escape(&peak_text(values[peak]))
        );
        lower = upper;
    }
    out.push_str("</g>");

    // The total, as a line over the stack.
    out.push_str("<polyline class=\"total\" fill=\"none\" stroke=\"#222\" stroke-width=\"1.6\" stroke-linejoin=\"round\" points=\"");
    points(out, xs.iter().zip(&p.total), &s);
    out.push_str("\"><title>total allocated</title></polyline>");

    // Axes with their ticks and labels.
    let _ = write!(
        out,
        "<g class=\"axes\" stroke=\"#555\" stroke-width=\"1\">\
         <line x1=\"{LEFT}\" x2=\"{LEFT}\" y1=\"{TOP}\" y2=\"{BOTTOM}\"/>\
         <line x1=\"{LEFT}\" x2=\"{RIGHT}\" y1=\"{BOTTOM}\" y2=\"{BOTTOM}\"/></g>"
    );
    out.push_str("<g class=\"y-ticks\" text-anchor=\"end\">");
    for (bytes, label) in &y_ticks {
        let y = s.y(*bytes);
        let _ = write!(
            out,
            "<line x1=\"{}\" x2=\"{LEFT}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#555\"/>\
             <text x=\"{}\" y=\"{:.1}\">{}</text>",
            LEFT - 5.0,
            LEFT - 8.0,
            y + 4.0,
            escape(label)
        );
    }
    out.push_str("</g><g class=\"x-ticks\" text-anchor=\"middle\">");
    for ms in &x_ticks {
        let x = s.x(*ms);
        let _ = write!(
            out,
            "<line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{BOTTOM}\" y2=\"{}\" stroke=\"#555\"/>\
             <text x=\"{x:.1}\" y=\"{}\">{}</text>",
            BOTTOM + 5.0,
            BOTTOM + 21.0,
            trim_number(*ms)
        );
    }
    let _ = write!(
        out,
        "</g><text class=\"axis-title\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">time since the first sample (ms)</text>\
         <text class=\"axis-title\" transform=\"translate(16 {}) rotate(-90)\" text-anchor=\"middle\">allocated memory</text>",
        (LEFT + RIGHT) / 2.0,
        HEIGHT - 12.0,
        (TOP + BOTTOM) / 2.0
    );

    // The peak: a dashed vertical line, a dot on the exact Max mem, and its label.
    let px = xs[peak];
    let py = s.y(peak_bytes as f64);
    let (anchor, lx) = if px < LEFT + 0.6 * (RIGHT - LEFT) {
        ("start", px + 6.0)
    } else {
        ("end", px - 6.0)
    };
    let _ = write!(
        out,
        "<g class=\"peak\"><line x1=\"{px:.1}\" x2=\"{px:.1}\" y1=\"{TOP}\" y2=\"{BOTTOM}\" \
         stroke=\"#b00020\" stroke-width=\"1.4\" stroke-dasharray=\"5 3\"/>\
         <circle cx=\"{px:.1}\" cy=\"{py:.1}\" r=\"3.5\" fill=\"#b00020\"/>\
         <text class=\"peak-label\" data-bytes=\"{peak_bytes}\" x=\"{lx:.1}\" y=\"{}\" text-anchor=\"{anchor}\">\
         peak {}</text></g>",
        TOP + 16.0,
        escape(&peak_text(peak_bytes))
    );
    // The hover cursor, hidden until the pointer is over the plot.
    let _ = write!(
        out,
        "<line class=\"cursor\" x1=\"0\" x2=\"0\" y1=\"{TOP}\" y2=\"{BOTTOM}\" stroke=\"#444\" \
         stroke-width=\"1\" style=\"display:none\" pointer-events=\"none\"/>"
    );
    out.push_str("</svg>");

    legend(out, p, peak);
    out.push_str("</div>");
    // Room for every line the readout may print, so the page does not jump on hover.
    let _ = write!(
        out,
        "<div class=\"readout\" style=\"min-height:{:.1}em\">Hover over the plot to read the \
         memory at a moment; hover over a legend entry for its full location.</div>",
        (p.layers.len() + 1) as f64 * 1.3
    );
    data_block(out, p, &xs);
    out.push_str(SCRIPT);
}

/// SVG `points` text: "x,y x,y ..." with one decimal.
fn points<'a>(out: &mut String, samples: impl Iterator<Item = (&'a f64, &'a u64)>, s: &Scale) {
    for (i, (x, bytes)) in samples.enumerate() {
        if i > 0 {
            out.push(' ');
        }
        let _ = write!(out, "{x:.1},{:.1}", s.y(*bytes as f64));
    }
}

fn legend(out: &mut String, p: &Prepared, peak: usize) {
    out.push_str(
        "<ul class=\"legend\"><li class=\"head\"><span class=\"name\">top locations</span>\
         <span class=\"value\">at the peak</span></li>\
         <li class=\"total\"><span class=\"swatch\"></span>\
         <span class=\"name\">total allocated</span></li>",
    );
    let count = p.layers.len();
    for (k, (name, values)) in p.layers.iter().enumerate() {
        let full = escape(name);
        let _ = write!(
            out,
            "<li data-layer=\"{k}\" data-full=\"{full}\" title=\"{full}\">\
             <span class=\"swatch\" style=\"background:{}\"></span>\
             <span class=\"name\">{}</span><span class=\"value\" title=\"{} bytes at the peak\">{}</span></li>",
            layer_color(k, count, name),
            escape(&short_label(name)),
            values[peak],
            escape(&human_bytes(values[peak] as i128))
        );
    }
    out.push_str("</ul>");
}

/// The numbers the hover readout needs, as JSON in an inert script element: numbers only,
/// so nothing in it can close the element or run.
fn data_block(out: &mut String, p: &Prepared, xs: &[f64]) {
    fn list<T>(out: &mut String, values: &[T], item: impl Fn(&mut String, &T)) {
        out.push('[');
        for (i, v) in values.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            item(out, v);
        }
        out.push(']');
    }
    out.push_str("<script type=\"application/json\" class=\"memlab-data\">{\"x\":");
    list(out, xs, |o, v| {
        let _ = write!(o, "{v:.1}");
    });
    out.push_str(",\"t\":");
    list(out, &p.time_ms, |o, v| {
        let _ = write!(o, "{v:.3}");
    });
    out.push_str(",\"total\":");
    list(out, &p.total, |o, v| {
        let _ = write!(o, "{v}");
    });
    out.push_str(",\"layers\":");
    list(out, &p.layers, |o, (_, values)| {
        list(o, values, |o, v| {
            let _ = write!(o, "{v}");
        })
    });
    out.push_str("}</script>");
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn view() -> TimelineView {
        TimelineView {
            title: "cpu — traced region".into(),
            time_us: vec![1_000_000, 1_001_000, 1_002_500, 1_004_000],
            total: vec![MIB, 3 * MIB, 5 * MIB + 123, 2 * MIB],
            layers: vec![
                (
                    "/home/u/model.py:42 (forward)".into(),
                    vec![0, 2 * MIB, 4 * MIB, MIB],
                ),
                ("other".into(), vec![MIB, MIB, MIB + 123, MIB]),
            ],
            peak_index: 2,
            peak_bytes: 5 * MIB + 123,
            notices: vec![],
        }
    }

    fn between<'a>(text: &'a str, start: &str, end: &str) -> &'a str {
        let from = text.find(start).expect(start) + start.len();
        &text[from..from + text[from..].find(end).expect(end)]
    }

    #[test]
    fn a_view_read_from_json_names_the_key_that_does_not_fit() {
        let good = r#"{"time_us":[0,1],"total":[0,5],"layers":[["a",[0,5]]],"peak_index":1,
            "peak_bytes":5}"#;
        assert_eq!(read(good).unwrap().peak_bytes, 5);
        let missing = read(r#"{"time_us":[0],"layers":[],"peak_index":0,"peak_bytes":0}"#);
        assert!(
            matches!(&missing, Err(ViewError::Missing(m)) if m.contains("has no 'total'")),
            "{missing:?}"
        );
        let negative = read(&good.replace("[0,5],\"layers", "[0,-5],\"layers"));
        assert!(
            matches!(&negative, Err(ViewError::Type(m))
                if m.starts_with("timeline view['total'] must be a list of byte counts")
                    && m.contains("total[1]")),
            "{negative:?}"
        );
        let short = read(&good.replace("[0,5],\"layers", "[0],\"layers"));
        assert!(
            matches!(&short, Err(ViewError::Inconsistent(m))
                if m.contains("time_us has 2 samples but total has 1")),
            "{short:?}"
        );
        assert!(matches!(read("[1]"), Err(ViewError::Type(_))));
    }

    #[test]
    fn the_peak_label_has_the_exact_bytes() {
        let html = timeline_html(&view());
        let label = between(&html, "class=\"peak-label\"", "</text>");
        assert!(label.contains("data-bytes=\"5243003\""), "{label}");
        assert!(label.ends_with(">peak 5.0 MiB (5243003 bytes)"), "{label}");
        assert!(html.contains("Peak <b>5.0 MiB (5243003 bytes)</b> at 2.5 ms"));
    }

    #[test]
    fn user_text_is_escaped_everywhere() {
        let mut v = view();
        let evil = "<script>alert(\"x\")</script>&'";
        v.title = evil.into();
        v.layers[0].0 = format!("/tmp/{evil}.py:1 (f)");
        v.notices = vec![evil.into()];
        let html = timeline_html(&v);
        assert!(!html.contains("<script>alert"), "raw user text in the page");
        assert!(!html.contains("alert(\"x\")"));
        let escaped = "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&#39;";
        // the title twice, the notice, the layer's <title>, data-full, title= and its label
        assert!(html.matches(escaped).count() >= 6, "{html}");
        // two scripts of ours: the inert data and the readout
        assert_eq!(html.matches("<script").count(), 2);
    }

    #[test]
    fn nothing_is_fetched() {
        let html = timeline_html(&view());
        assert!(!html.contains("http://") && !html.contains("https://"));
        assert!(!html.contains(" src=") && !html.contains("<link") && !html.contains("url("));
        assert!(!html.contains("xmlns"));
    }

    #[test]
    fn one_polygon_per_layer_and_a_legend_entry_each() {
        let html = timeline_html(&view());
        assert_eq!(html.matches("<polygon class=\"layer\"").count(), 2);
        assert!(html.contains("<span class=\"name\">model.py:42 (forward)</span>"));
        assert!(html.contains("data-full=\"/home/u/model.py:42 (forward)\""));
        assert!(html.contains(&format!("background:{OTHER_COLOR}")));
        assert_eq!(html.matches("<svg").count(), 1);
    }

    #[test]
    fn short_labels_drop_folders_and_shorten_in_the_middle() {
        assert_eq!(
            short_label("/a/b/model.py:42 (forward)"),
            "model.py:42 (forward)"
        );
        assert_eq!(short_label("C:\\x\\m.py:1 (f)"), "m.py:1 (f)");
        assert_eq!(
            short_label("forward:transformer.h.3.attn"),
            "forward:transformer.h.3.attn"
        );
        assert_eq!(short_label("<untraced>"), "<untraced>");
        let long = format!("/x/{}.py:7 (g)", "a".repeat(80));
        let short = short_label(&long);
        assert_eq!(short.chars().count(), LABEL_CHARS);
        assert!(short.starts_with("aaaa") && short.ends_with(".py:7 (g)") && short.contains('…'));
    }

    #[test]
    fn long_views_are_downsampled_keeping_the_peak_and_maxima() {
        let n: usize = 10_001;
        let total: Vec<u64> = (0..n as u64).map(|i| (i * 7919) % 1000 * 1024).collect();
        let mut v = TimelineView {
            title: "big".into(),
            time_us: (0..n as i64).collect(),
            layers: vec![("other".into(), total.clone())],
            total,
            peak_index: 4321,
            peak_bytes: 0,
            notices: vec![],
        };
        v.total[4321] = 5000 * 1024;
        v.layers[0].1[4321] = 5000 * 1024;
        v.peak_bytes = 5000 * 1024;
        let p = prepare(&v);
        assert_eq!(p.total.len(), TARGET_POINTS);
        assert_eq!(p.total[p.peak.unwrap()], 5000 * 1024);
        assert_eq!(p.total, p.layers[0].1);
        // each kept sample is the maximum of its bucket
        for (k, kept) in p.total.iter().enumerate() {
            let chunk = &v.total[k * n / TARGET_POINTS..(k + 1) * n / TARGET_POINTS];
            assert_eq!(kept, chunk.iter().max().unwrap());
        }
        assert!(p.notices[0].starts_with("Downsampled from 10001 to"));
        let html = timeline_html(&v);
        assert!(html.contains("peak 4.9 MiB (5120000 bytes)"));
    }

    #[test]
    fn empty_and_inconsistent_views_render_without_panic() {
        let empty = timeline_html(&TimelineView::default());
        assert!(empty.contains("No samples") && !empty.contains("<svg"));
        let mut v = view();
        v.total.pop();
        v.layers[1].1.push(9);
        v.peak_index = 99;
        assert!(check(&v).is_some());
        let html = timeline_html(&v);
        assert!(html.contains("inconsistent"));
        assert!(html.contains("<svg"));
        let one = TimelineView {
            time_us: vec![5],
            total: vec![10],
            peak_bytes: 10,
            ..TimelineView::default()
        };
        assert!(timeline_html(&one).contains("peak 10 B (10 bytes)"));
    }

    #[test]
    fn memory_ticks_are_round_in_a_binary_unit() {
        let (top, ticks) = memory_ticks(1_300_000_000);
        assert!(top >= 1_300_000_000.0 * 1.12);
        assert_eq!(ticks[1].1, "0.25 GiB");
        let (_, ticks) = memory_ticks(700 * MIB);
        assert_eq!(ticks[1].1, "100 MiB");
        let (_, ticks) = memory_ticks(0);
        assert_eq!(ticks[0].1, "0 B");
    }
}
