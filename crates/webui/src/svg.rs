//! Server-rendered SVG: line charts over an hour, allocation meters and the CU map. Each
//! chart carries its data as attributes (`data-points`, `data-owner`) so tests and
//! assistive tools can read what is drawn; each has a `<title>` for screen readers.

use std::fmt::Write;

use hami_protocol::cu_list::CuSet;

use crate::html::esc;
use crate::samples::{HISTORY_SECONDS, Series};

/// Colours of CU owners: dark enough for white text and distinct from each other.
pub const PALETTE: [&str; 10] = [
    "#1f5fa8", "#b3461b", "#2e7d32", "#7b3fa0", "#a8326e", "#00727a", "#8a6d00", "#4e5a68",
    "#c2185b", "#355e3b",
];
/// Colour of free CUs.
pub const FREE: &str = "#e3e7ec";

/// A legend's colour swatch: a one-rect SVG, so the colour is a presentation attribute and
/// the page needs no inline style (the UI's Content-Security-Policy allows none).
pub fn swatch(colour: &str) -> String {
    format!(
        "<svg class=\"swatch\" viewBox=\"0 0 1 1\" aria-hidden=\"true\" focusable=\"false\"><rect width=\"1\" height=\"1\" fill=\"{}\"/></svg>",
        esc(colour)
    )
}

/// The stretches of a series between gaps: a step over three times its shortest step
/// (the scrape interval) is a gap.
fn runs(series: &Series) -> Vec<Vec<&(i64, f64)>> {
    let points: Vec<&(i64, f64)> = series.0.iter().collect();
    let step = points
        .windows(2)
        .map(|w| w[1].0 - w[0].0)
        .filter(|d| *d > 0)
        .min()
        .unwrap_or(0);
    let mut out: Vec<Vec<&(i64, f64)>> = Vec::new();
    for (i, p) in points.iter().enumerate() {
        if i == 0 || p.0 - points[i - 1].0 > 3 * step {
            out.push(Vec::new());
        }
        if let Some(run) = out.last_mut() {
            run.push(p);
        }
    }
    out
}

/// A line chart of the last hour; `None` in place of the chart when nothing was sampled.
pub fn line_chart(
    title: &str,
    unit: &str,
    lines: &[(&str, &Series, &str)],
    now: i64,
    max_hint: f64,
) -> String {
    let points: usize = lines.iter().map(|(_, s, _)| s.0.len()).sum();
    if points == 0 {
        return format!(
            "<figure class=\"chart nodata\"><figcaption>{}</figcaption><p class=\"muted\">No samples yet: the monitor has reported nothing for this in the last hour.</p></figure>",
            esc(title)
        );
    }
    let (w, h, left, bottom) = (480.0, 140.0, 44.0, 18.0);
    let max = lines
        .iter()
        .flat_map(|(_, s, _)| s.0.iter().map(|(_, v)| *v))
        .fold(max_hint, f64::max)
        .max(1e-9);
    let start = now - HISTORY_SECONDS;
    let x = |t: i64| left + (t - start) as f64 / HISTORY_SECONDS as f64 * (w - left - 4.0);
    let y = |v: f64| 4.0 + (1.0 - v / max) * (h - bottom - 8.0);
    let mut out = String::new();
    let _ = write!(
        out,
        "<figure class=\"chart\"><figcaption>{t}</figcaption><svg viewBox=\"0 0 {w} {h}\" width=\"{w}\" height=\"{h}\" role=\"img\" aria-label=\"{t}\" data-points=\"{points}\"><title>{t}</title>",
        t = esc(title)
    );
    let _ = write!(
        out,
        "<line x1=\"{left}\" y1=\"{b}\" x2=\"{w}\" y2=\"{b}\" stroke=\"#888\"/><text x=\"2\" y=\"12\">{}{}</text><text x=\"2\" y=\"{b}\">0</text><text x=\"{left}\" y=\"{h1}\">−60 min</text><text x=\"{r}\" y=\"{h1}\">now</text>",
        fmt_value(max),
        esc(unit),
        b = h - bottom,
        h1 = h - 4.0,
        r = w - 26.0
    );
    for (label, series, colour) in lines {
        // A stretch without points (the API server or the monitors could not be read) is
        // a gap, not a line drawn across it.
        for run in runs(series) {
            let mut path = String::new();
            for (t, v) in &run {
                let _ = write!(path, "{:.1},{:.1} ", x(*t), y(*v));
            }
            let _ = write!(
                out,
                "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" stroke-linecap=\"round\" points=\"{}\" data-series=\"{}\" data-points=\"{}\"/>",
                path.trim_end(),
                esc(label),
                run.len()
            );
        }
    }
    out.push_str("</svg><ul class=\"legend\">");
    for (label, series, colour) in lines {
        let last = series
            .0
            .back()
            .map(|(_, v)| format!("{}{}", fmt_value(*v), unit))
            .unwrap_or_else(|| "no samples".into());
        let _ = write!(
            out,
            "<li>{}{}: {}</li>",
            swatch(colour),
            esc(label),
            esc(&last)
        );
    }
    out.push_str("</ul></figure>");
    out
}

fn fmt_value(v: f64) -> String {
    if v >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// A horizontal meter: granted (solid) and used (hatched overlay) out of a total.
pub fn meter(label: &str, granted: f64, used: Option<f64>, total: f64, unit: &str) -> String {
    let (w, h) = (220.0, 14.0);
    let frac = |v: f64| {
        if total > 0.0 {
            (v / total).clamp(0.0, 1.0)
        } else {
            0.0
        }
    };
    let used_text = used
        .map(|u| format!(", {} used", fmt_value(u)))
        .unwrap_or_default();
    let text = format!(
        "{label}: {} of {} {unit} granted{used_text}",
        fmt_value(granted),
        fmt_value(total)
    );
    let mut out = format!(
        "<svg class=\"meter\" viewBox=\"0 0 {w} {h}\" width=\"{w}\" height=\"{h}\" role=\"img\" aria-label=\"{t}\"><title>{t}</title><rect width=\"{w}\" height=\"{h}\" fill=\"{FREE}\"/><rect width=\"{:.1}\" height=\"{h}\" fill=\"#1f5fa8\"/>",
        frac(granted) * w,
        t = esc(&text)
    );
    if let Some(u) = used {
        let _ = write!(
            out,
            "<rect y=\"4\" width=\"{:.1}\" height=\"6\" fill=\"#f5b942\"/>",
            frac(u) * w
        );
    }
    let _ = write!(out, "</svg> <span class=\"muted\">{}</span>", esc(&text));
    out
}

/// The colours of a card's CU owners, in their order: each pod's own colour, from a hash of
/// its name (so a pod keeps its colour on every card and after every refresh, not its
/// place among a card's owners); where two owners of one card hash alike, the later one
/// takes the next colour not taken on that card. The legend names each owner with its
/// CUs, so no colour has to be told apart to read the map.
pub fn owner_colours(pods: &[&str]) -> Vec<&'static str> {
    let mut taken = [false; PALETTE.len()];
    pods.iter()
        .map(|pod| {
            // FNV-1a: stable across runs and builds (std's hasher is seeded).
            let hash = pod.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            });
            let mut i = (hash % PALETTE.len() as u64) as usize;
            for _ in 0..PALETTE.len() {
                if !taken[i] {
                    break;
                }
                i = (i + 1) % PALETTE.len();
            }
            taken[i] = true;
            PALETTE[i]
        })
        .collect()
}

/// One owner of CUs on a card.
pub struct CuOwner<'a> {
    /// `namespace/name` of the pod.
    pub pod: &'a str,
    /// Its CUs on the card.
    pub cus: &'a CuSet,
}

/// The CU map of a card: one cell per CU, coloured by the pod holding it; on RDNA
/// (`cu_per_wgp` = 2) the CUs of one WGP sit together in an outlined pair. A CU two pods
/// claim (which the scheduler never writes) is drawn in the first owner's colour and
/// listed as a conflict.
pub fn cu_map(total: u32, owners: &[CuOwner<'_>], cu_per_wgp: Option<u32>, label: &str) -> String {
    let per_wgp = cu_per_wgp.filter(|n| *n > 1).unwrap_or(1);
    let cell = 9.0;
    let gap = if per_wgp > 1 { 3.0 } else { 1.0 };
    let per_row = 64u32.div_ceil(per_wgp) * per_wgp;
    let rows = total.div_ceil(per_row).max(1);
    let x_of = |cu: u32| {
        let col = cu % per_row;
        col as f64 * cell + (col / per_wgp) as f64 * gap
    };
    let w = x_of(per_row - 1) + cell + 1.0;
    let h = rows as f64 * (cell + 3.0);
    let colours = owner_colours(&owners.iter().map(|o| o.pod).collect::<Vec<_>>());
    let mut out = String::with_capacity(total as usize * 90 + 512);
    let _ = write!(
        out,
        "<svg class=\"cumap\" viewBox=\"0 0 {w:.0} {h:.0}\" width=\"{w:.0}\" height=\"{h:.0}\" role=\"img\" aria-label=\"{t}\" data-cus=\"{total}\" data-cu-per-wgp=\"{per_wgp}\"><title>{t}</title>",
        t = esc(label)
    );
    for cu in 0..total {
        let owner = owners.iter().position(|o| o.cus.contains(cu));
        let (fill, who) = match owner {
            Some(i) => (colours[i], owners[i].pod),
            None => (FREE, ""),
        };
        let y = (cu / per_row) as f64 * (cell + 3.0);
        let _ = write!(
            out,
            "<rect class=\"cu\" x=\"{:.0}\" y=\"{y:.0}\" width=\"{}\" height=\"{}\" fill=\"{fill}\" data-cu=\"{cu}\" data-owner=\"{}\"><title>CU {cu}: {}</title></rect>",
            x_of(cu),
            cell - 1.0,
            cell,
            esc(who),
            if who.is_empty() {
                "free".to_owned()
            } else {
                esc(who)
            }
        );
    }
    if per_wgp > 1 {
        for wgp in 0..total.div_ceil(per_wgp) {
            let first = wgp * per_wgp;
            let y = (first / per_row) as f64 * (cell + 3.0);
            let _ = write!(
                out,
                "<rect class=\"wgp\" x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"none\" stroke=\"#1b1f24\" stroke-width=\"0.8\" data-wgp=\"{wgp}\"/>",
                x_of(first) - 0.5,
                y - 0.5,
                per_wgp as f64 * cell,
                cell + 1.0
            );
        }
    }
    out.push_str("</svg><ul class=\"legend\">");
    for (i, o) in owners.iter().enumerate() {
        let _ = write!(
            out,
            "<li>{}{} ({} CUs: {})</li>",
            swatch(colours[i]),
            esc(o.pod),
            o.cus.len(),
            esc(&o.cus.to_string())
        );
    }
    let free = (0..total)
        .filter(|cu| !owners.iter().any(|o| o.cus.contains(*cu)))
        .count();
    let _ = write!(out, "<li>{}free ({free} CUs)</li></ul>", swatch(FREE));
    let conflicts: Vec<u32> = (0..total)
        .filter(|cu| owners.iter().filter(|o| o.cus.contains(*cu)).count() > 1)
        .collect();
    if !conflicts.is_empty() {
        let _ = write!(
            out,
            "<p class=\"bad\">{} CUs are claimed by more than one pod (first: CU {}).</p>",
            conflicts.len(),
            conflicts[0]
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(haystack: &str, needle: &str) -> usize {
        haystack.matches(needle).count()
    }

    #[test]
    fn cu_map_cells_match_owners() {
        let a = CuSet::parse("0-9", 38).unwrap();
        let b = CuSet::parse("10,12,37", 38).unwrap();
        let svg = cu_map(
            38,
            &[
                CuOwner {
                    pod: "ns/a",
                    cus: &a,
                },
                CuOwner {
                    pod: "ns/<b>",
                    cus: &b,
                },
            ],
            None,
            "card",
        );
        assert_eq!(count(&svg, "class=\"cu\""), 38);
        assert_eq!(count(&svg, "data-owner=\"ns/a\""), 10);
        assert_eq!(count(&svg, "data-owner=\"ns/&lt;b&gt;\""), 3);
        assert_eq!(count(&svg, "data-owner=\"\""), 25);
        assert_eq!(count(&svg, "class=\"wgp\""), 0);
        assert!(svg.contains("free (25 CUs)"));
        assert!(!svg.contains("more than one pod"));
    }

    #[test]
    fn rdna_shows_wgp_pairs_and_conflicts() {
        let a = CuSet::parse("0-3", 96).unwrap();
        let b = CuSet::parse("3-5", 96).unwrap();
        let svg = cu_map(
            96,
            &[CuOwner { pod: "a", cus: &a }, CuOwner { pod: "b", cus: &b }],
            Some(2),
            "rdna",
        );
        assert_eq!(count(&svg, "class=\"wgp\""), 48);
        assert!(svg.contains("data-cu-per-wgp=\"2\""));
        assert!(svg.contains("1 CUs are claimed by more than one pod (first: CU 3)"));
    }

    #[test]
    fn charts_say_when_there_is_nothing() {
        let empty = Series::default();
        let html = line_chart("Utilization", "%", &[("c", &empty, "#000")], 1000, 100.0);
        assert!(html.contains("No samples yet"));
        assert!(!html.contains("<svg"));
        let mut s = Series::default();
        s.push(900, 50.0);
        s.push(1000, 70.0);
        let html = line_chart("Utilization", "%", &[("c", &s, "#000")], 1000, 100.0);
        assert!(html.contains("data-points=\"2\""));
        assert!(html.contains("c: 70%"));
    }

    #[test]
    fn a_stretch_without_points_is_a_gap() {
        let mut s = Series::default();
        for t in [900, 905, 910, 990, 995] {
            s.push(t, 1.0);
        }
        let html = line_chart("Memory", " MiB", &[("used", &s, "#000")], 1000, 0.0);
        assert_eq!(count(&html, "<polyline"), 2, "{html}");
        assert!(html.contains("data-points=\"3\"/>") && html.contains("data-points=\"2\"/>"));
    }

    #[test]
    fn a_pod_keeps_its_colour_on_every_card_and_owners_of_one_card_differ() {
        let alone = owner_colours(&["ml/train"]);
        let shared = owner_colours(&["default/infer", "ml/train", "team/near"]);
        assert_eq!(alone[0], shared[1], "the same colour beside other pods");
        let mut distinct = shared.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 3);
        // More owners than colours: every colour once before any repeats.
        let many: Vec<String> = (0..PALETTE.len()).map(|i| format!("ns/p-{i}")).collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        let mut all = owner_colours(&refs);
        all.sort();
        all.dedup();
        assert_eq!(all.len(), PALETTE.len());
        // The map draws each owner's cells and its legend swatch in that colour.
        let set = CuSet::parse("0-3", 8).unwrap();
        let map = cu_map(
            8,
            &[CuOwner {
                pod: "ml/train",
                cus: &set,
            }],
            None,
            "map",
        );
        assert!(map.contains(&format!(
            "fill=\"{}\" data-cu=\"0\" data-owner=\"ml/train\"",
            alone[0]
        )));
        assert!(map.contains(&swatch(alone[0])));
    }
}
