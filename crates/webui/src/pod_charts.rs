//! A pod page's charts: each container's use of each device against what it asked and the
//! limit it runs under, over a chosen window (`?window=15m|1h`; the UI keeps an hour per
//! container, Grafana the rest). Memory: used, with the grant (`asked`, the scheduler's
//! charge for that container on that device) and the monitor's enforced limit
//! (`hami_vgpu_memory_limit_bytes`) as levels. Utilization: percent busy, with the compute
//! share asked where it is a percent (NVIDIA); an AMD ask is CUs, and AMD utilization is
//! engine busy time, not a share of the CUs, so none is drawn and the page says why. Pure.

use std::collections::BTreeMap;
use std::fmt::Write;

use hami_report::PodReport;

use crate::charts::{Level, Line, Quantity, Window, line_chart, offered, shown, window_nav};
use crate::grafana::{Dashboard, VGPU_DASHBOARD, longer_ranges};
use crate::html::url_segment;
use crate::samples::{HISTORY_SECONDS, Metrics, Series, SeriesKey};
use crate::svg::PALETTE;

/// Reads a pod page's query: `window` only; a bad value is an error naming it.
pub fn parse_window(raw: &str) -> Result<Option<Window>, String> {
    let mut out = None;
    for (key, value) in crate::query::fields(raw)? {
        if key == "window" {
            out = Some(Window::parse(&value)?);
        }
    }
    Ok(out)
}

/// What a container got on a device: MiB, and the compute share as a percent where the
/// ask is one.
struct Grant {
    mib: f64,
    percent: Option<f64>,
}

/// The levels of a chart: (legend words, kind, value, colour).
fn levels<'a>(v: &'a [(String, &'a str, f64, &'a str)]) -> Vec<Level<'a>> {
    v.iter()
        .map(|(label, kind, value, colour)| Level {
            label,
            kind,
            value: *value,
            colour,
        })
        .collect()
}

/// The charts of pod `namespace/name` (its report, where it reads).
pub fn section(
    metrics: &Metrics,
    report: Option<&PodReport>,
    namespace: &str,
    name: &str,
    asked: Option<Window>,
    now: i64,
) -> String {
    let grants: BTreeMap<(&str, &str), Grant> = report
        .iter()
        .flat_map(|r| r.containers.iter())
        .flat_map(|c| {
            c.got.iter().map(move |g| {
                (
                    (c.name.as_str(), g.uuid.as_str()),
                    Grant {
                        mib: g.memory_mib as f64,
                        percent: (g.cores_unit == "%").then_some(f64::from(g.cores)),
                    },
                )
            })
        })
        .collect();
    let amd = report.is_some_and(|r| {
        r.containers
            .iter()
            .flat_map(|c| &c.got)
            .any(|g| g.cores_unit != "%")
    });
    let mine = |m: &BTreeMap<SeriesKey, Series>| -> Vec<(SeriesKey, Series)> {
        m.iter()
            .filter(|((ns, p, _, _), _)| ns == namespace && p == name)
            .map(|(k, s)| (k.clone(), s.clone()))
            .collect()
    };
    let util = mine(&metrics.utilization);
    let memory: Vec<(SeriesKey, Series)> = mine(&metrics.memory)
        .into_iter()
        .map(|(k, s)| {
            (
                k,
                Series(s.0.iter().map(|(t, v)| (*t, v / 1048576.0)).collect()),
            )
        })
        .collect();
    let reach = util
        .iter()
        .chain(&memory)
        .map(|(_, s)| s.reach(now))
        .max()
        .unwrap_or(0);
    let windows = offered(reach, HISTORY_SECONDS);
    let window = shown(asked, &windows);
    let mut out = window_nav("this pod's charts", &windows, window, |w| {
        format!(
            "/pods/{}/{}?window={}#live",
            url_segment(namespace),
            url_segment(name),
            w.word()
        )
    });
    let label = |k: &SeriesKey| format!("{} on {}", k.2, k.3);
    let labels_m: Vec<String> = memory.iter().map(|(k, _)| label(k)).collect();
    let labels_u: Vec<String> = util.iter().map(|(k, _)| label(k)).collect();
    let colour = |i: usize| PALETTE[i % PALETTE.len()];
    let mut memory_lines = Vec::new();
    let mut memory_levels: Vec<(String, &str, f64, &str)> = Vec::new();
    for (i, ((k, s), l)) in memory.iter().zip(&labels_m).enumerate() {
        memory_lines.push(Line {
            label: l,
            series: s,
            colour: colour(i),
        });
        if let Some(g) = grants.get(&(k.2.as_str(), k.3.as_str())) {
            memory_levels.push((format!("{l}: asked"), "asked", g.mib, colour(i)));
        }
        let limit = metrics.latest.get(k).and_then(|u| u.limit_bytes);
        if let Some(limit) = limit {
            memory_levels.push((format!("{l}: limit"), "limit", limit / 1048576.0, colour(i)));
        }
    }
    let mut util_lines = Vec::new();
    let mut util_levels: Vec<(String, &str, f64, &str)> = Vec::new();
    for (i, ((k, s), l)) in util.iter().zip(&labels_u).enumerate() {
        util_lines.push(Line {
            label: l,
            series: s,
            colour: colour(i),
        });
        if let Some(p) = grants
            .get(&(k.2.as_str(), k.3.as_str()))
            .and_then(|g| g.percent)
        {
            util_levels.push((format!("{l}: asked"), "asked", p, colour(i)));
        }
    }
    out.push_str("<div class=\"cards\">");
    out.push_str(&line_chart(
        "Device memory used per container and device, against its grant and limit",
        Quantity::Mib,
        &memory_lines,
        &levels(&memory_levels),
        window,
        now,
        0.0,
    ));
    out.push_str(&line_chart(
        "Utilization per container and device, against its compute ask",
        Quantity::Percent,
        &util_lines,
        &levels(&util_levels),
        window,
        now,
        100.0,
    ));
    out.push_str("</div>");
    if amd && !util.is_empty() {
        out.push_str("<p class=\"muted\">AMD: utilization is the time the card's engines are busy with the container's work, not a share of its CUs, so the CU ask is not drawn as a level (the CUs it holds are on the node's CU map).</p>");
    }
    let _ = write!(
        out,
        "{}",
        longer_ranges(
            metrics.grafana.as_deref(),
            &[Dashboard {
                label: "this pod in the hami-rs vGPU dashboard",
                uid: VGPU_DASHBOARD,
                vars: vec![("namespace", namespace), ("pod", name)],
            }],
        )
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_is_read_and_a_bad_one_named() {
        assert_eq!(parse_window(""), Ok(None));
        assert_eq!(parse_window("window=15m"), Ok(Some(Window::Min15)));
        assert!(parse_window("window=1d").unwrap_err().contains("window"));
    }
}
