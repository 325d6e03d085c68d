//! The What-if page: a planner scenario (the planner's engine, the scheduler's own filter
//! decision per pod) run under each GPU × node policy pair, with placements and
//! fragmentation per policy. Nothing is written anywhere; the scenario is the form's.

use std::fmt::Write;

use hami_planner::report::PlanReport;
use hami_planner::scenario::parse_scenario;

use crate::html::{Page, esc, frame, table};
use crate::svg::PALETTE;

/// The scenario shown when the form is first opened.
pub const DEFAULT_SCENARIO: &str = include_str!("../../../examples/scenarios/small.yaml");

/// Bounds on what one request may plan (the UI is shared; a plan holds a CPU).
pub const MAX_NODES: u64 = 2000;
/// Most pods one plan may create.
pub const MAX_PODS: u64 = 20000;
/// Largest scenario accepted, bytes.
pub const MAX_SCENARIO_BYTES: usize = 256 * 1024;

/// Parses, bounds and plans a scenario; errors are for the user to fix.
pub fn plan(text: &str) -> Result<PlanReport, String> {
    if text.len() > MAX_SCENARIO_BYTES {
        return Err(format!(
            "the scenario is {} bytes; the UI plans at most {MAX_SCENARIO_BYTES} (use `hami plan` for larger ones)",
            text.len()
        ));
    }
    let scenario = parse_scenario(text, "the form").map_err(|e| e.to_string())?;
    let nodes: u64 = scenario.fleet.iter().map(|g| u64::from(g.count)).sum();
    let pods: u64 = scenario.workloads.iter().map(|w| u64::from(w.count)).sum();
    if nodes > MAX_NODES || pods > MAX_PODS {
        return Err(format!(
            "the scenario has {nodes} nodes and {pods} pods; the UI plans at most {MAX_NODES} nodes and {MAX_PODS} pods (use `hami plan` for larger ones)"
        ));
    }
    hami_planner::plan(&scenario).map_err(|e| e.to_string())
}

fn bar_chart(report: &PlanReport) -> String {
    let rows = report.policies.len();
    let (w, row_h) = (520.0, 34.0);
    let h = rows as f64 * row_h + 24.0;
    let mut out = format!(
        "<figure class=\"chart\"><figcaption>Memory fragmentation (stranded free memory, % of free) and utilization per policy</figcaption><svg viewBox=\"0 0 {w} {h}\" width=\"{w}\" height=\"{h}\" role=\"img\" aria-label=\"Fragmentation and utilization per policy\" data-points=\"{}\"><title>Fragmentation and utilization per policy</title>",
        rows * 2
    );
    for (i, p) in report.policies.iter().enumerate() {
        let y = i as f64 * row_h + 4.0;
        let scale = (w - 180.0) / 100.0;
        let _ = write!(
            out,
            "<text x=\"0\" y=\"{:.0}\">{} / {}</text><rect x=\"170\" y=\"{y:.0}\" width=\"{:.1}\" height=\"12\" fill=\"{}\" data-policy=\"{}\"/><rect x=\"170\" y=\"{:.0}\" width=\"{:.1}\" height=\"12\" fill=\"{}\"/>",
            y + 16.0,
            esc(&p.gpu_policy),
            esc(&p.node_policy),
            p.memory.fragmentation_pct * scale,
            PALETTE[1],
            esc(&format!("{}/{}", p.gpu_policy, p.node_policy)),
            y + 14.0,
            p.memory.utilization_pct * scale,
            PALETTE[0]
        );
    }
    let _ = write!(
        out,
        "</svg><ul class=\"legend\"><li><span class=\"swatch\" style=\"background:{}\"></span>fragmentation %</li><li><span class=\"swatch\" style=\"background:{}\"></span>utilization %</li></ul></figure>",
        PALETTE[1], PALETTE[0]
    );
    out
}

/// The page: the form (with `scenario` in it) and, when planned, the results.
pub fn page(
    scenario: &str,
    result: Option<Result<PlanReport, String>>,
    banners: &[String],
) -> Page {
    let mut body = String::from(
        "<h1>What-if</h1><p>Plan a described fleet and workload list with the scheduler's own engine, under each GPU and node policy. Nothing in the cluster changes.</p>",
    );
    let mut status = 200;
    match &result {
        None => {}
        Some(Err(e)) => {
            status = 400;
            let _ = write!(
                body,
                "<div class=\"banner\" role=\"alert\">The scenario cannot be planned: {}</div>",
                esc(e)
            );
        }
        Some(Ok(r)) => {
            let _ = write!(
                body,
                "<h2>Results: {} nodes, {} GPUs, {} pods</h2>",
                r.nodes, r.gpus, r.pods
            );
            let rows: Vec<Vec<String>> = r
                .policies
                .iter()
                .map(|p| {
                    vec![
                        esc(&p.gpu_policy),
                        esc(&p.node_policy),
                        p.placed.to_string(),
                        p.unplaceable.to_string(),
                        p.nodes_used.to_string(),
                        format!("{} busy, {} partial", p.gpus_busy, p.gpus_partial),
                        format!(
                            "{:.1}% / {:.1}%",
                            p.memory.utilization_pct, p.memory.fragmentation_pct
                        ),
                        format!(
                            "{:.1}% / {:.1}%",
                            p.amd_cus.utilization_pct, p.amd_cus.fragmentation_pct
                        ),
                        format!(
                            "{:.1}% / {:.1}%",
                            p.nvidia_cores.utilization_pct, p.nvidia_cores.fragmentation_pct
                        ),
                    ]
                })
                .collect();
            body.push_str(&table(
                "Per policy (utilization / fragmentation)",
                &[
                    "GPU POLICY",
                    "NODE POLICY",
                    "PLACED",
                    "UNPLACEABLE",
                    "NODES USED",
                    "GPUS",
                    "MEMORY",
                    "AMD CUS",
                    "NVIDIA CORES",
                ],
                &rows,
            ));
            body.push_str(&bar_chart(r));
            for p in &r.policies {
                let _ = write!(
                    body,
                    "<details><summary>Placements under {} / {} ({} placed)</summary>",
                    esc(&p.gpu_policy),
                    esc(&p.node_policy),
                    p.placements.len()
                );
                let rows: Vec<Vec<String>> = p
                    .placements
                    .iter()
                    .take(500)
                    .map(|pl| {
                        vec![
                            esc(&pl.pod),
                            esc(&pl.node),
                            esc(&pl
                                .devices
                                .iter()
                                .map(|d| format!("{} ({} MiB, {})", d.id, d.mem_mib, d.cores))
                                .collect::<Vec<_>>()
                                .join(", ")),
                        ]
                    })
                    .collect();
                body.push_str(&table(
                    "Placements (first 500)",
                    &["POD", "NODE", "DEVICES"],
                    &rows,
                ));
                for g in &p.reasons {
                    let _ = write!(
                        body,
                        "<p>{} unplaceable: {} (e.g. {})</p>",
                        g.count,
                        esc(&g.reason),
                        esc(&g.pods.join(", "))
                    );
                }
                body.push_str("</details>");
            }
        }
    }
    let _ = write!(
        body,
        "<form method=\"post\" action=\"/whatif\"><label for=\"scenario\">Scenario (YAML, as for <code>hami plan --scenario</code>)</label><textarea id=\"scenario\" name=\"scenario\" rows=\"24\">{}</textarea><p><button type=\"submit\">Plan</button></p></form>",
        esc(scenario)
    );
    Page {
        status,
        html: frame("What-if", banners, false, &body),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_scenario_plans_and_renders() {
        let report = plan(DEFAULT_SCENARIO).unwrap();
        assert!(!report.policies.is_empty());
        let page = page(DEFAULT_SCENARIO, Some(Ok(report.clone())), &[]);
        assert_eq!(page.status, 200);
        assert_eq!(
            page.html.matches("<details>").count(),
            report.policies.len()
        );
        assert!(page.html.contains("binpack"));
    }

    #[test]
    fn bad_and_huge_scenarios_are_explained() {
        let err = plan("fleet: 3").unwrap_err();
        let p = page("fleet: 3", Some(Err(err.clone())), &[]);
        assert_eq!(p.status, 400);
        assert!(p.html.contains("cannot be planned"), "{}", p.html);
        let huge = "fleet:\n- name: n\n  count: 100000\n  capture: one-gpu\nworkloads:\n- count: 1\n  pod:\n    metadata: {name: p}\n    spec:\n      containers:\n      - name: c\n        resources: {limits: {amd.com/gpu: 1}}\n";
        assert!(plan(huge).unwrap_err().contains("at most 2000 nodes"));
        assert!(
            plan(&"#".repeat(MAX_SCENARIO_BYTES + 1))
                .unwrap_err()
                .contains("at most")
        );
    }
}
