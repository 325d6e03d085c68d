//! Line charts people can read: a chosen time window (15 min, 1 h, 6 h: `?window=`, offered
//! only as far back as the history reaches), axes with units (MiB, GiB or TiB as the values
//! need; percent), grid lines at round values, horizontal levels (a pod's ask and limit)
//! and a legend that tells lines apart by dash as well as colour. Each chart carries what
//! it draws as attributes (`data-window`, `data-unit`, `data-points`, `data-level`) so
//! tests and tools can read it, and a `<title>` for screen readers. Pure.

use std::fmt::Write;

use crate::html::esc;
use crate::samples::Series;

/// How far back a chart looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Window {
    /// The last 15 minutes.
    Min15,
    /// The last hour (the default).
    Hour1,
    /// The last six hours (the cluster trend only: per-container series keep an hour).
    Hour6,
}

impl Window {
    /// Every window, shortest first.
    pub const ALL: [Window; 3] = [Window::Min15, Window::Hour1, Window::Hour6];

    /// Its length in seconds.
    pub fn seconds(self) -> i64 {
        match self {
            Window::Min15 => 15 * 60,
            Window::Hour1 => 3600,
            Window::Hour6 => 6 * 3600,
        }
    }

    /// Its word in a query (`?window=15m`).
    pub fn word(self) -> &'static str {
        match self {
            Window::Min15 => "15m",
            Window::Hour1 => "1h",
            Window::Hour6 => "6h",
        }
    }

    /// Its words on the page.
    pub fn label(self) -> &'static str {
        match self {
            Window::Min15 => "15 min",
            Window::Hour1 => "1 h",
            Window::Hour6 => "6 h",
        }
    }

    /// Reads `?window=`; anything else is an error naming the words it may be.
    pub fn parse(value: &str) -> Result<Window, String> {
        let words: Vec<&str> = Window::ALL.iter().map(|w| w.word()).collect();
        crate::query::choose("window", value, &words).map(|i| Window::ALL[i])
    }
}

/// The windows worth offering for a history that reaches `reach` seconds back and is kept
/// `kept` seconds at most: the shortest always, each longer one once the history is longer
/// than the window before it (so choosing it shows more), none longer than what is kept.
pub fn offered(reach: i64, kept: i64) -> Vec<Window> {
    let mut out = vec![Window::ALL[0]];
    for pair in Window::ALL.windows(2) {
        if reach > pair[0].seconds() && pair[1].seconds() <= kept {
            out.push(pair[1]);
        }
    }
    out
}

/// The window a page shows: the one asked for where it is offered, else the longest offered
/// up to an hour (the default).
pub fn shown(asked: Option<Window>, offered: &[Window]) -> Window {
    asked
        .filter(|w| offered.contains(w))
        .or_else(|| offered.iter().rev().find(|w| **w <= Window::Hour1).copied())
        .unwrap_or(Window::Min15)
}

/// The window choice as links (`link(window)` gives each one's href, escaped), the shown
/// one marked current; where only one window is offered, a sentence saying why.
pub fn window_nav(
    what: &str,
    offered: &[Window],
    shown: Window,
    link: impl Fn(Window) -> String,
) -> String {
    if offered.len() < 2 {
        return format!(
            "<p class=\"muted window\" data-windows=\"{}\">Showing the last {}: a longer window is offered once the UI has held more history than that.</p>",
            shown.word(),
            shown.label()
        );
    }
    let words: Vec<&str> = offered.iter().map(|w| w.word()).collect();
    let mut out = format!(
        "<nav class=\"window\" aria-label=\"Time window of {}\" data-windows=\"{}\">Window:",
        esc(what),
        words.join(" ")
    );
    for w in offered {
        if *w == shown {
            let _ = write!(out, " <strong aria-current=\"true\">{}</strong>", w.label());
        } else {
            let _ = write!(out, " <a href=\"{}\">{}</a>", link(*w), w.label());
        }
    }
    out.push_str("</nav>");
    out
}

/// What a chart's values are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantity {
    /// Memory in MiB, shown in MiB, GiB or TiB as the largest value needs.
    Mib,
    /// A percentage.
    Percent,
}

/// One drawn series.
pub struct Line<'a> {
    /// The legend's words.
    pub label: &'a str,
    /// The points.
    pub series: &'a Series,
    /// Its colour.
    pub colour: &'a str,
}

/// A horizontal level, dashed: a pod's ask or its limit.
pub struct Level<'a> {
    /// The legend's words.
    pub label: &'a str,
    /// What it is, for tools (`data-level`): `asked`, `limit`.
    pub kind: &'a str,
    /// Its value, in the chart's quantity (MiB or percent).
    pub value: f64,
    /// Its colour (the line's it belongs to).
    pub colour: &'a str,
}

/// Dash patterns, so lines differ without their colours (the n-th line takes the n-th).
const DASHES: [&str; 4] = ["", "7 3", "2 3", "9 3 2 3"];
/// The levels' dashes: an ask long, a limit dotted (so the two read apart where they meet).
fn level_dash(kind: &str) -> &'static str {
    if kind == "limit" { "2 3" } else { "6 4" }
}

/// The unit a chart's axis and legend write, and MiB per unit.
fn unit_of(quantity: Quantity, max: f64) -> (&'static str, f64) {
    match quantity {
        Quantity::Percent => ("%", 1.0),
        Quantity::Mib if max >= 1048576.0 => ("TiB", 1048576.0),
        Quantity::Mib if max >= 1024.0 => ("GiB", 1024.0),
        Quantity::Mib => ("MiB", 1.0),
    }
}

/// A round step that divides `top` into about four parts: 1, 2, 2.5 or 5 times a power of ten.
fn nice_step(top: f64) -> f64 {
    let rough = (top / 4.0).max(1e-9);
    let power = 10f64.powf(rough.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * power)
        .find(|s| *s >= rough)
        .unwrap_or(10.0 * power)
}

/// A value in a unit, as short as it reads well.
pub fn number(v: f64) -> String {
    if v == v.trunc() || v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 || (v * 10.0) == (v * 10.0).trunc() {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// `value` (MiB or percent) with the unit it reads best in.
pub fn with_unit(quantity: Quantity, value: f64) -> String {
    let (unit, per) = unit_of(quantity, value);
    match quantity {
        Quantity::Percent => format!("{}%", number(value)),
        Quantity::Mib => format!("{} {unit}", number(value / per)),
    }
}

/// The stretches of a series between gaps: a step over three times the expected one is a
/// gap. The expected step is the series' shortest (the scrape interval), a minute where
/// the trend is thinned (before `thinned_before`).
fn runs<'a>(points: &[&'a (i64, f64)], thinned_before: i64) -> Vec<Vec<&'a (i64, f64)>> {
    let step = points
        .windows(2)
        .map(|w| w[1].0 - w[0].0)
        .filter(|d| *d > 0)
        .min()
        .unwrap_or(0);
    let mut out: Vec<Vec<&(i64, f64)>> = Vec::new();
    for (i, p) in points.iter().enumerate() {
        let expected = if i > 0 && points[i - 1].0 < thinned_before {
            step.max(crate::samples::THINNED_STEP)
        } else {
            step
        };
        if i == 0 || p.0 - points[i - 1].0 > 3 * expected {
            out.push(Vec::new());
        }
        if let Some(run) = out.last_mut() {
            run.push(p);
        }
    }
    out
}

/// A line chart of the `window` before `now`; a sentence in place of the chart when
/// nothing was sampled in it. `max_hint` is the least top of the value axis (100 for
/// percentages).
pub fn line_chart(
    title: &str,
    quantity: Quantity,
    lines: &[Line<'_>],
    levels: &[Level<'_>],
    window: Window,
    now: i64,
    max_hint: f64,
) -> String {
    let start = now - window.seconds();
    let shown: Vec<Vec<&(i64, f64)>> = lines
        .iter()
        .map(|l| l.series.0.iter().filter(|(t, _)| *t >= start).collect())
        .collect();
    let points: usize = shown.iter().map(Vec::len).sum();
    if points == 0 {
        let any = lines.iter().any(|l| !l.series.0.is_empty());
        let why = if any {
            format!(
                "No samples in the last {}: the monitors reported nothing for this since.",
                window.label()
            )
        } else {
            "No samples yet: the monitor has reported nothing for this in the last hour.".into()
        };
        return format!(
            "<figure class=\"chart nodata\"><figcaption>{}</figcaption><p class=\"muted\">{why}</p></figure>",
            esc(title)
        );
    }
    let max = shown
        .iter()
        .flatten()
        .map(|(_, v)| *v)
        .chain(levels.iter().map(|l| l.value))
        .fold(max_hint, f64::max)
        .max(1e-9);
    let (unit, per) = unit_of(quantity, max);
    let step = nice_step(max / per);
    let top = (max / per / step).ceil().max(1.0) * step;
    let (w, h, left, right, topm, bottom) = (480.0, 160.0, 56.0, 10.0, 8.0, 22.0);
    let plot_w = w - left - right;
    let plot_h = h - topm - bottom;
    let x = |t: i64| left + (t - start) as f64 / window.seconds() as f64 * plot_w;
    let y = |v: f64| topm + (1.0 - (v / per / top).clamp(0.0, 1.05)) * plot_h;
    let t = esc(title);
    let mut out = String::with_capacity(2048 + points * 12);
    let _ = write!(
        out,
        "<figure class=\"chart\"><figcaption>{t}</figcaption><svg viewBox=\"0 0 {w} {h}\" width=\"{w}\" height=\"{h}\" role=\"img\" aria-label=\"{t}, last {wl}, in {unit}\" data-points=\"{points}\" data-window=\"{ww}\" data-unit=\"{unit}\"><title>{t}, last {wl}, in {unit}</title>",
        wl = window.label(),
        ww = window.word(),
    );
    // Value axis: a grid line and a label at each round value, the unit on every label.
    let ticks = (top / step).round() as usize;
    for i in 0..=ticks {
        let v = i as f64 * step;
        let yy = topm + (1.0 - v / top) * plot_h;
        let label = match quantity {
            Quantity::Percent => format!("{}%", number(v)),
            Quantity::Mib => format!("{} {unit}", number(v)),
        };
        let _ = write!(
            out,
            "<line class=\"grid\" x1=\"{left}\" y1=\"{yy:.1}\" x2=\"{:.1}\" y2=\"{yy:.1}\"/><text class=\"tick y\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{label}</text>",
            w - right,
            left - 4.0,
            yy + 4.0
        );
    }
    // Time axis: minutes (or hours) before now.
    let (marks, per_mark, word): (&[i64], i64, &str) = match window {
        Window::Min15 => (&[15, 10, 5], 60, "min"),
        Window::Hour1 => (&[60, 45, 30, 15], 60, "min"),
        Window::Hour6 => (&[6, 4, 2], 3600, "h"),
    };
    let base = h - bottom;
    let _ = write!(
        out,
        "<line class=\"axis\" x1=\"{left}\" y1=\"{base}\" x2=\"{:.1}\" y2=\"{base}\"/><line class=\"axis\" x1=\"{left}\" y1=\"{topm}\" x2=\"{left}\" y2=\"{base}\"/>",
        w - right
    );
    for m in marks {
        let xx = x(now - m * per_mark);
        let _ = write!(
            out,
            "<line class=\"axis\" x1=\"{xx:.1}\" y1=\"{base}\" x2=\"{xx:.1}\" y2=\"{:.1}\"/><text class=\"tick x\" x=\"{xx:.1}\" y=\"{:.1}\" text-anchor=\"middle\">−{m} {word}</text>",
            base + 4.0,
            base + 15.0
        );
    }
    let _ = write!(
        out,
        "<text class=\"tick x\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">now</text>",
        w - right,
        base + 15.0,
    );
    for level in levels {
        let yy = y(level.value);
        let _ = write!(
            out,
            "<line class=\"level\" x1=\"{left}\" y1=\"{yy:.1}\" x2=\"{:.1}\" y2=\"{yy:.1}\" stroke=\"{}\" stroke-width=\"1.5\" stroke-dasharray=\"{}\" data-level=\"{}\" data-value=\"{}\"/>",
            w - right,
            esc(level.colour),
            level_dash(level.kind),
            esc(level.kind),
            level.value
        );
    }
    let thinned_before = now - crate::samples::HISTORY_SECONDS;
    for (i, (line, points)) in lines.iter().zip(&shown).enumerate() {
        let dash = DASHES[i % DASHES.len()];
        // A stretch without points (the API server or the monitors could not be read) is
        // a gap, not a line drawn across it.
        for run in runs(points, thinned_before) {
            let mut path = String::with_capacity(run.len() * 12);
            for (t, v) in &run {
                let _ = write!(path, "{:.1},{:.1} ", x(*t), y(*v));
            }
            let _ = write!(
                out,
                "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" stroke-linecap=\"round\"{} points=\"{}\" data-series=\"{}\" data-points=\"{}\"/>",
                esc(line.colour),
                if dash.is_empty() {
                    String::new()
                } else {
                    format!(" stroke-dasharray=\"{dash}\"")
                },
                path.trim_end(),
                esc(line.label),
                run.len()
            );
        }
    }
    out.push_str("</svg><ul class=\"legend\">");
    for (i, line) in lines.iter().enumerate() {
        let last = line
            .series
            .0
            .back()
            .map(|(_, v)| with_unit(quantity, *v))
            .unwrap_or_else(|| "no samples".into());
        let _ = write!(
            out,
            "<li>{}{}: {}</li>",
            line_swatch(line.colour, DASHES[i % DASHES.len()]),
            esc(line.label),
            esc(&last)
        );
    }
    for level in levels {
        let _ = write!(
            out,
            "<li>{}{}: {}</li>",
            line_swatch(level.colour, level_dash(level.kind)),
            esc(level.label),
            esc(&with_unit(quantity, level.value))
        );
    }
    out.push_str("</ul></figure>");
    out
}

/// A legend's line sample, in the line's colour and dash.
fn line_swatch(colour: &str, dash: &str) -> String {
    format!(
        "<svg class=\"swatch line\" viewBox=\"0 0 18 6\" aria-hidden=\"true\" focusable=\"false\"><line x1=\"0\" y1=\"3\" x2=\"18\" y2=\"3\" stroke=\"{}\" stroke-width=\"2\"{}/></svg>",
        esc(colour),
        if dash.is_empty() {
            String::new()
        } else {
            format!(" stroke-dasharray=\"{dash}\"")
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(haystack: &str, needle: &str) -> usize {
        haystack.matches(needle).count()
    }

    fn series(points: impl IntoIterator<Item = (i64, f64)>) -> Series {
        Series(points.into_iter().collect())
    }

    #[test]
    fn charts_say_when_there_is_nothing() {
        let empty = Series::default();
        let line = |s| Line {
            label: "c",
            series: s,
            colour: "#000",
        };
        let html = line_chart(
            "Utilization",
            Quantity::Percent,
            &[line(&empty)],
            &[],
            Window::Hour1,
            1000,
            100.0,
        );
        assert!(html.contains("No samples yet"));
        assert!(!html.contains("<svg"));
        let s = series([(900, 50.0), (1000, 70.0)]);
        let html = line_chart(
            "Utilization",
            Quantity::Percent,
            &[line(&s)],
            &[],
            Window::Hour1,
            1000,
            100.0,
        );
        assert!(html.contains("data-points=\"2\""));
        assert!(html.contains("c: 70%"));
        // Points, but none in the window: it says so instead of an empty frame.
        let old = series([(0, 5.0)]);
        let html = line_chart(
            "Utilization",
            Quantity::Percent,
            &[line(&old)],
            &[],
            Window::Min15,
            3000,
            100.0,
        );
        assert!(html.contains("No samples in the last 15 min"), "{html}");
    }

    #[test]
    fn a_stretch_without_points_is_a_gap() {
        let s = series([900, 905, 910, 990, 995].map(|t| (t, 1.0)));
        let html = line_chart(
            "Memory",
            Quantity::Mib,
            &[Line {
                label: "used",
                series: &s,
                colour: "#000",
            }],
            &[],
            Window::Hour1,
            1000,
            0.0,
        );
        assert_eq!(count(&html, "<polyline"), 2, "{html}");
        assert!(html.contains("data-points=\"3\"/>") && html.contains("data-points=\"2\"/>"));
        // A thinned stretch (one point a minute, older than the hour) is not a gap.
        let now = 10_000;
        let mut points: Vec<(i64, f64)> = (0..20).map(|i| (now - 7000 + i * 60, 1.0)).collect();
        points.extend((0..20).map(|i| (now - 3590 + i * 5, 1.0)));
        let s = series(points);
        let html = line_chart(
            "Memory",
            Quantity::Mib,
            &[Line {
                label: "used",
                series: &s,
                colour: "#000",
            }],
            &[],
            Window::Hour6,
            now,
            0.0,
        );
        assert_eq!(count(&html, "<polyline"), 2, "{html}");
    }

    #[test]
    fn axes_carry_units_that_fit_the_values() {
        fn line(s: &Series) -> Line<'_> {
            Line {
                label: "used",
                series: s,
                colour: "#000",
            }
        }
        let chart = |s: &Series, q, hint| {
            line_chart("Memory", q, &[line(s)], &[], Window::Hour1, 1000, hint)
        };
        let small = series([(990, 300.0)]);
        let html = chart(&small, Quantity::Mib, 0.0);
        assert!(html.contains("data-unit=\"MiB\""), "{html}");
        assert!(html.contains(">300 MiB</text>"), "{html}");
        let gib = series([(990, 6.0 * 1024.0), (995, 12.5 * 1024.0)]);
        let html = chart(&gib, Quantity::Mib, 0.0);
        assert!(html.contains("data-unit=\"GiB\""), "{html}");
        // Round ticks: 0, 5, 10, 15 GiB; the legend in GiB too.
        for tick in ["0 GiB", "5 GiB", "10 GiB", "15 GiB"] {
            assert!(html.contains(&format!(">{tick}</text>")), "{tick}: {html}");
        }
        assert!(html.contains("used: 12.5 GiB"), "{html}");
        let tib = series([(990, 3.0 * 1048576.0)]);
        let html = chart(&tib, Quantity::Mib, 0.0);
        assert!(html.contains("data-unit=\"TiB\"") && html.contains(">3 TiB</text>"));
        let pct = series([(990, 42.0)]);
        let html = chart(&pct, Quantity::Percent, 100.0);
        for tick in ["0%", "25%", "50%", "75%", "100%"] {
            assert!(html.contains(&format!(">{tick}</text>")), "{tick}: {html}");
        }
        // The time axis says how long before now.
        assert!(html.contains(">−60 min</text>") && html.contains(">now</text>"));
        let html = line_chart(
            "x",
            Quantity::Percent,
            &[line(&pct)],
            &[],
            Window::Min15,
            1000,
            100.0,
        );
        assert!(html.contains(">−15 min</text>") && !html.contains("−60 min"));
    }

    #[test]
    fn levels_are_drawn_and_named_and_raise_the_axis() {
        let s = series([(990, 1024.0)]);
        let html = line_chart(
            "Memory",
            Quantity::Mib,
            &[Line {
                label: "main on G",
                series: &s,
                colour: "#0072B2",
            }],
            &[
                Level {
                    label: "asked",
                    kind: "asked",
                    value: 4096.0,
                    colour: "#0072B2",
                },
                Level {
                    label: "limit",
                    kind: "limit",
                    value: 8192.0,
                    colour: "#D55E00",
                },
            ],
            Window::Hour1,
            1000,
            0.0,
        );
        assert_eq!(count(&html, "class=\"level\""), 2, "{html}");
        assert!(html.contains("data-level=\"asked\" data-value=\"4096\""));
        assert!(html.contains("data-level=\"limit\" data-value=\"8192\""));
        assert!(html.contains("asked: 4 GiB") && html.contains("limit: 8 GiB"));
        // An ask and a limit read apart where they meet: dashed and dotted.
        assert!(html.contains("stroke-dasharray=\"6 4\" data-level=\"asked\""));
        assert!(html.contains("stroke-dasharray=\"2 3\" data-level=\"limit\""));
        // The axis reaches the limit (8 GiB), not only the 1 GiB used.
        assert!(html.contains(">8 GiB</text>"), "{html}");
    }

    #[test]
    fn windows_are_offered_as_far_as_history_reaches() {
        assert_eq!(offered(0, 3600), vec![Window::Min15]);
        assert_eq!(offered(900, 3600), vec![Window::Min15]);
        assert_eq!(offered(901, 3600), vec![Window::Min15, Window::Hour1]);
        assert_eq!(offered(3601, 3600), vec![Window::Min15, Window::Hour1]);
        assert_eq!(offered(3601, 6 * 3600), Window::ALL.to_vec());
        assert_eq!(shown(None, &[Window::Min15]), Window::Min15);
        assert_eq!(shown(None, &Window::ALL), Window::Hour1);
        assert_eq!(shown(Some(Window::Hour6), &[Window::Min15]), Window::Min15);
        assert_eq!(Window::parse("6h"), Ok(Window::Hour6));
        assert!(Window::parse("2h").unwrap_err().contains("15m, 1h, 6h"));
        let one = window_nav("x", &[Window::Min15], Window::Min15, |_| String::new());
        assert!(!one.contains("<a ") && one.contains("data-windows=\"15m\""));
        let all = window_nav("x", &Window::ALL, Window::Hour1, |w| {
            format!("?window={}", w.word())
        });
        assert!(all.contains("<a href=\"?window=15m\">15 min</a>"));
        assert!(all.contains("<strong aria-current=\"true\">1 h</strong>"));
        assert!(all.contains("<a href=\"?window=6h\">6 h</a>"));
    }
}
