//! The What-if page: a planner scenario (the planner's engine, the scheduler's own filter
//! decision per pod) run under each GPU × node policy pair, with placements and
//! fragmentation per policy. Nothing is written anywhere; the scenario is the form's.
//!
//! The UI is shared and asks for no login, so what one request may cost is bounded before
//! anything is built ([`admit`]: the text's size, node groups, workloads, nodes, GPUs per
//! node and in all, XGMI links, pods, and the planner's work — policy pairs × pods × (nodes +
//! GPUs), what every filter decision walks), and the plan runs under a stop condition
//! ([`plan`]) that the server trips at its deadline, when the client goes and at shutdown
//! (`whatif_run.rs`). Each refusal is a [`Problem`]: an HTTP status and what to change.

use std::fmt::Write;
use std::time::Duration;

use hami_planner::fleet::{NodeDevicesSpec, resolve_groups};
use hami_planner::report::{PlanReport, PolicyReport, preemption_lines};
use hami_planner::scenario::{GpuSource, Scenario, parse_scenario};

use crate::html::{Page, esc, frame, table};
use crate::svg::{PALETTE, swatch};

/// The scenario shown when the form is first opened.
pub const DEFAULT_SCENARIO: &str = include_str!("../../../examples/scenarios/small.yaml");

/// Where larger scenarios go (said in every size refusal).
const ELSEWHERE: &str = "run larger ones with `hami plan --scenario FILE`";

/// What one What-if request may ask of the UI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest scenario text, bytes.
    pub max_scenario_bytes: usize,
    /// Most node groups (`fleet:` entries).
    pub max_node_groups: u64,
    /// Most workloads (`workloads:` entries).
    pub max_workloads: u64,
    /// Most nodes in all.
    pub max_nodes: u64,
    /// Most GPUs (register entries) per node.
    pub max_gpus_per_node: u64,
    /// Most GPUs in all.
    pub max_gpus: u64,
    /// Most XGMI links in all (a GPU's peers, summed over every GPU).
    pub max_xgmi_links: u64,
    /// Most pods in all.
    pub max_pods: u64,
    /// Most planner work: policy pairs × pods × (nodes + GPUs).
    pub max_work: u64,
    /// Time one plan may take; past it the plan stops and the answer says so.
    pub deadline: Duration,
    /// Plans at once; a request past it is answered 429 at once.
    pub max_running: usize,
    /// Time for the form's body to arrive once its head has (408 past it).
    pub body_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_scenario_bytes: 256 * 1024,
            max_node_groups: 64,
            max_workloads: 256,
            max_nodes: 2000,
            max_gpus_per_node: 64,
            max_gpus: 16384,
            max_xgmi_links: 131_072,
            max_pods: 20000,
            max_work: 200_000_000,
            deadline: Duration::from_secs(20),
            max_running: 2,
            body_timeout: Duration::from_secs(10),
        }
    }
}

/// A request the UI does not plan: the HTTP status and what the user should change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// 400 (a bad scenario), 403 (posted from another site), 408 (the body never came),
    /// 413 (too large for the UI), 429 (too many at once), 500, 503 (shutting down).
    pub status: u16,
    /// What is wrong and what to do.
    pub message: String,
}

impl Problem {
    /// A scenario the user must fix (400).
    pub fn bad(message: impl Into<String>) -> Problem {
        Problem {
            status: 400,
            message: message.into(),
        }
    }

    /// A scenario too large for the UI (413).
    pub fn too_large(message: impl Into<String>) -> Problem {
        Problem {
            status: 413,
            message: message.into(),
        }
    }
}

/// What a scenario asks for, counted before anything is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Figures {
    /// Node groups.
    pub node_groups: u64,
    /// Workloads.
    pub workloads: u64,
    /// Nodes in all.
    pub nodes: u64,
    /// The most GPUs one node has.
    pub gpus_per_node: u64,
    /// GPUs in all.
    pub gpus: u64,
    /// XGMI links in all.
    pub xgmi_links: u64,
    /// Pods in all.
    pub pods: u64,
    /// GPU × node policy pairs.
    pub policy_pairs: u64,
    /// policy pairs × pods × (nodes + GPUs).
    pub work: u64,
}

impl Figures {
    /// Whether every figure is within `limits`.
    pub fn within(&self, limits: &Limits) -> bool {
        self.node_groups <= limits.max_node_groups
            && self.workloads <= limits.max_workloads
            && self.nodes <= limits.max_nodes
            && self.gpus_per_node <= limits.max_gpus_per_node
            && self.gpus <= limits.max_gpus
            && self.xgmi_links <= limits.max_xgmi_links
            && self.pods <= limits.max_pods
            && self.work <= limits.max_work
    }
}

/// A scenario within the limits, its GPUs resolved: what [`plan`] plans.
#[derive(Debug, Clone)]
pub struct Admitted {
    /// The parsed scenario.
    pub scenario: Scenario,
    /// One node's devices per node group.
    pub specs: Vec<NodeDevicesSpec>,
    /// What it asks for.
    pub figures: Figures,
}

/// The `scenario` field of an `application/x-www-form-urlencoded` body (the form's). Its
/// absence is an empty scenario (which [`admit`] explains).
pub fn scenario_from_form(body: &[u8]) -> Result<String, Problem> {
    for pair in body.split(|b| *b == b'&') {
        let (key, value) = match pair.iter().position(|b| *b == b'=') {
            Some(i) => (&pair[..i], &pair[i + 1..]),
            None => (pair, &[][..]),
        };
        if form_decode(key).as_deref() == Some(b"scenario".as_slice()) {
            let bytes = form_decode(value).ok_or_else(|| {
                Problem::bad(
                    "the form's scenario field is not valid form encoding (a % without two hex digits); post it from the What-if page",
                )
            })?;
            return String::from_utf8(bytes).map_err(|_| {
                Problem::bad("the scenario is not UTF-8 text; paste YAML text into the form")
            });
        }
    }
    Ok(String::new())
}

/// Form decoding: `+` is a space, `%XX` a byte; `None` for a `%` without two hex digits.
pub(crate) fn form_decode(raw: &[u8]) -> Option<Vec<u8>> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hi = hex(*raw.get(i + 1)?)?;
                let lo = hex(*raw.get(i + 2)?)?;
                out.push(hi << 4 | lo);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    Some(out)
}

/// Parses and bounds a scenario and resolves its GPUs (a capture's are discovered from its
/// sysfs tree, once per capture and settings); every figure is checked before the thing it
/// counts is built, so no request allocates by a number it wrote.
pub fn admit(text: &str, limits: &Limits) -> Result<Admitted, Problem> {
    if text.len() > limits.max_scenario_bytes {
        return Err(Problem::too_large(format!(
            "the scenario is {} bytes; the UI plans at most {} bytes: shorten it, or {ELSEWHERE}",
            text.len(),
            limits.max_scenario_bytes
        )));
    }
    let scenario = parse_scenario(text, "the form").map_err(|e| Problem::bad(e.to_string()))?;
    let over = |what: &str, n: u64, max: u64, change: &str| {
        Err(Problem::too_large(format!(
            "the scenario has {n} {what}; the UI plans at most {max}: {change}, or {ELSEWHERE}"
        )))
    };
    let mut f = Figures {
        node_groups: scenario.fleet.len() as u64,
        workloads: scenario.workloads.len() as u64,
        nodes: scenario.fleet.iter().map(|g| u64::from(g.count)).sum(),
        pods: scenario.workloads.iter().map(|w| u64::from(w.count)).sum(),
        policy_pairs: (scenario.gpu_policies.len() * scenario.node_policies.len()) as u64,
        ..Figures::default()
    };
    if f.node_groups > limits.max_node_groups {
        return over(
            "node groups",
            f.node_groups,
            limits.max_node_groups,
            "merge node groups of the same GPUs",
        );
    }
    if f.workloads > limits.max_workloads {
        return over(
            "workloads",
            f.workloads,
            limits.max_workloads,
            "merge workloads of the same pod template (raise count instead)",
        );
    }
    if f.nodes > limits.max_nodes {
        return over(
            "nodes",
            f.nodes,
            limits.max_nodes,
            "lower the node groups' count",
        );
    }
    if f.pods > limits.max_pods {
        return over(
            "pods",
            f.pods,
            limits.max_pods,
            "lower the workloads' count",
        );
    }
    // Inline GPUs are made one by one from their count: bounded before they are made.
    for (i, group) in scenario.fleet.iter().enumerate() {
        if let GpuSource::Models(models) = &group.gpus {
            let per_node: u64 = models.iter().map(|m| u64::from(m.count)).sum();
            if per_node > limits.max_gpus_per_node {
                return over(
                    &format!("GPUs per node in fleet[{i}] ({})", group.name),
                    per_node,
                    limits.max_gpus_per_node,
                    "lower its gpus' count",
                );
            }
        }
    }
    let specs = resolve_groups(&scenario.fleet).map_err(|e| Problem {
        status: if e.exit_code() == 2 { 400 } else { 500 },
        message: e.to_string(),
    })?;
    for (group, spec) in scenario.fleet.iter().zip(&specs) {
        let count = u64::from(group.count);
        let per_node = (spec.amd.len() + spec.nvidia.len()) as u64;
        let links: u64 = spec
            .amd
            .iter()
            .map(|d| d.custom_info.xgmi_peers.len() as u64)
            .sum();
        f.gpus_per_node = f.gpus_per_node.max(per_node);
        f.gpus = f.gpus.saturating_add(count.saturating_mul(per_node));
        f.xgmi_links = f.xgmi_links.saturating_add(count.saturating_mul(links));
    }
    if f.gpus > limits.max_gpus {
        return over(
            "GPUs",
            f.gpus,
            limits.max_gpus,
            "lower the node groups' count or their GPUs",
        );
    }
    if f.xgmi_links > limits.max_xgmi_links {
        return over(
            "XGMI links",
            f.xgmi_links,
            limits.max_xgmi_links,
            "make fewer nodes with xgmi: true or smaller hives",
        );
    }
    f.work = f
        .policy_pairs
        .saturating_mul(f.pods)
        .saturating_mul(f.nodes.saturating_add(f.gpus));
    if f.work > limits.max_work {
        return Err(Problem::too_large(format!(
            "planning this scenario takes {} pods × {} policy pairs × {} nodes and GPUs = {} steps; the UI plans at most {}: compare fewer policies (policies:), or lower the pods' or nodes' count, or {ELSEWHERE}",
            f.pods,
            f.policy_pairs,
            f.nodes + f.gpus,
            f.work,
            limits.max_work
        )));
    }
    Ok(Admitted {
        scenario,
        specs,
        figures: f,
    })
}

/// What must hold for any form body, whatever its bytes (the `whatif_scenario` fuzz
/// target's check, replayed over its corpus by `tests/it/whatif_corpus.rs`): decoded and
/// admitted under the default limits, it is a scenario within every limit, or a 400 or 413
/// with a message. Panics otherwise.
pub fn check_form_body(body: &[u8]) {
    let limits = Limits::default();
    match scenario_from_form(body).and_then(|text| admit(&text, &limits)) {
        Ok(admitted) => assert!(
            admitted.figures.within(&limits),
            "admitted past a limit: {:?}",
            admitted.figures
        ),
        Err(p) => assert!(
            matches!(p.status, 400 | 413) && !p.message.trim().is_empty(),
            "{p:?}"
        ),
    }
}

/// Plans an admitted scenario, asking `stop` before each pod of each policy pair: `Ok(None)`
/// once it says stop (the caller knows why).
pub fn plan(
    admitted: &Admitted,
    stop: &(dyn Fn() -> bool + Sync),
) -> Result<Option<PlanReport>, Problem> {
    hami_planner::plan_until(&admitted.scenario, &admitted.specs, stop).map_err(|e| Problem {
        status: if e.exit_code() == 2 { 400 } else { 500 },
        message: e.to_string(),
    })
}

/// Preemptions listed per policy on the page (the JSON of `hami plan` has all of them).
const SHOWN_PREEMPTIONS: usize = 200;

/// Who preempted whom under one policy pair, as `hami plan` prints it; nothing when none.
fn preemptions(p: &PolicyReport) -> String {
    if p.preemptions.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "<section class=\"preemptions\"><h3>Preemptions under {} / {} ({})</h3><ul>",
        esc(&p.gpu_policy),
        esc(&p.node_policy),
        p.preemptions.len()
    );
    for pre in p.preemptions.iter().take(SHOWN_PREEMPTIONS) {
        let lines = preemption_lines(pre);
        let _ = write!(out, "<li>{}<ul>", esc(&lines[0]));
        for line in &lines[1..] {
            let _ = write!(out, "<li>{}</li>", esc(line));
        }
        out.push_str("</ul></li>");
    }
    out.push_str("</ul>");
    if p.preemptions.len() > SHOWN_PREEMPTIONS {
        let _ = write!(
            out,
            "<p>and {} more (<code>hami plan --output json</code> lists every one)</p>",
            p.preemptions.len() - SHOWN_PREEMPTIONS
        );
    }
    out.push_str("</section>");
    out
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
        "</svg><ul class=\"legend\"><li>{}fragmentation %</li><li>{}utilization %</li></ul></figure>",
        swatch(PALETTE[1]),
        swatch(PALETTE[0])
    );
    out
}

/// The page: the form (with `scenario` in it) and, when planned, the results.
pub fn page(
    scenario: &str,
    result: Option<Result<PlanReport, Problem>>,
    banners: &[String],
) -> Page {
    let mut body = String::from(
        "<h1>What-if</h1><p>Plan a described fleet and workload list with the scheduler's own engine, under each GPU and node policy. Nothing in the cluster changes. <a href=\"/whatif/live\">Start from the live cluster instead</a>: add or remove nodes and see where the waiting pods go, or plan the moves that defragment the cards.</p>",
    );
    let mut status = 200;
    match &result {
        None => {}
        Some(Err(p)) => {
            status = p.status;
            let _ = write!(
                body,
                "<div class=\"banner\" role=\"alert\">The scenario {}: {}</div>",
                if p.status == 400 {
                    "cannot be planned"
                } else {
                    "was not planned"
                },
                esc(&p.message)
            );
        }
        Some(Ok(r)) => {
            let _ = write!(
                body,
                "<h2>Results: {} nodes, {} GPUs, {} pods</h2>",
                r.nodes, r.gpus, r.pods
            );
            // The EVICTED column only where a pod preempted, as `hami plan` prints it.
            let preempting = r.policies.iter().any(|p| !p.preemptions.is_empty());
            let rows: Vec<Vec<String>> = r
                .policies
                .iter()
                .map(|p| {
                    let mut row = vec![
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
                    ];
                    if preempting {
                        row.insert(4, p.evicted.to_string());
                    }
                    row
                })
                .collect();
            let mut headers = vec![
                "GPU POLICY",
                "NODE POLICY",
                "PLACED",
                "UNPLACEABLE",
                "NODES USED",
                "GPUS",
                "MEMORY",
                "AMD CUS",
                "NVIDIA CORES",
            ];
            if preempting {
                headers.insert(4, "EVICTED");
            }
            body.push_str(&table(
                "Per policy (utilization / fragmentation)",
                &headers,
                &rows,
            ));
            body.push_str(&bar_chart(r));
            for p in &r.policies {
                body.push_str(&preemptions(p));
            }
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
                let groups = (p.reasons.iter().map(|g| ("unplaceable", g))).chain(
                    p.evicted_reasons
                        .iter()
                        .map(|g| ("unplaceable after preemption", g)),
                );
                for (what, g) in groups {
                    let _ = write!(
                        body,
                        "<p>{} {what}: {} (e.g. {})</p>",
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

    const ONE_POD: &str = "workloads:\n- count: 1\n  pod:\n    metadata: {name: p}\n    spec:\n      containers:\n      - name: c\n        resources: {limits: {amd.com/gpu: 1}}\n";

    fn inline_fleet(nodes: u64, gpus: u64) -> String {
        format!(
            "fleet:\n- name: n\n  count: {nodes}\n  gpus:\n  - {{type: AMD Instinct MI300X, count: {gpus}, memory_mib: 1024, cus: 304}}\n{ONE_POD}"
        )
    }

    fn refused(text: &str) -> Problem {
        admit(text, &Limits::default()).unwrap_err()
    }

    #[test]
    fn default_scenario_plans_and_renders() {
        let admitted = admit(DEFAULT_SCENARIO, &Limits::default()).unwrap();
        assert!(admitted.figures.within(&Limits::default()));
        let report = plan(&admitted, &|| false).unwrap().unwrap();
        assert!(!report.policies.is_empty());
        let page = page(DEFAULT_SCENARIO, Some(Ok(report.clone())), &[]);
        assert_eq!(page.status, 200);
        assert_eq!(
            page.html.matches("<details>").count(),
            report.policies.len()
        );
        assert!(page.html.contains("binpack"));
        assert!(
            page.html.contains("<a href=\"/whatif/live\">"),
            "the live cluster's What-if is linked"
        );
        // A stop asked for before the first pod: no report.
        assert_eq!(plan(&admitted, &|| true).unwrap(), None);
    }

    /// Issue 30 item 4: a scenario with priorities shows who preempts whom, the evicted
    /// count and the victims unplaceable after preemption; one without shows none of it.
    #[test]
    fn preemptions_are_shown() {
        let text = include_str!("../../../examples/scenarios/priorities.yaml");
        let admitted = admit(text, &Limits::default()).unwrap();
        let report = plan(&admitted, &|| false).unwrap().unwrap();
        let html = page(text, Some(Ok(report)), &[]).html;
        assert!(
            html.contains("<h3>Preemptions under binpack / binpack (2)</h3>"),
            "{html}"
        );
        assert!(
            html.contains("<li>pod default/inference-0 (priority 1000) preempts default/batch-"),
            "{html}"
        );
        assert!(
            html.contains("(priority 0) unplaceable after preemption</li>"),
            "{html}"
        );
        assert!(html.contains("<th scope=\"col\">EVICTED</th>"), "{html}");
        assert!(
            html.contains("<p>2 unplaceable after preemption: no available node"),
            "{html}"
        );
        assert!(
            !html.contains("pinned-0 (priority"),
            "a pinned pod was evicted: {html}"
        );
        let admitted = admit(DEFAULT_SCENARIO, &Limits::default()).unwrap();
        let report = plan(&admitted, &|| false).unwrap().unwrap();
        let html = page(DEFAULT_SCENARIO, Some(Ok(report)), &[]).html;
        assert!(
            !html.contains("Preemptions") && !html.contains("EVICTED"),
            "{html}"
        );
    }

    #[test]
    fn bad_and_huge_scenarios_are_explained() {
        let err = refused("fleet: 3");
        assert_eq!(err.status, 400);
        let p = page("fleet: 3", Some(Err(err)), &[]);
        assert_eq!(p.status, 400);
        assert!(p.html.contains("cannot be planned"), "{}", p.html);
        let huge = format!("fleet:\n- name: n\n  count: 100000\n  capture: one-gpu\n{ONE_POD}");
        let err = refused(&huge);
        assert_eq!(err.status, 413);
        assert!(err.message.contains("at most 2000"), "{err:?}");
        let err = refused(&"#".repeat(Limits::default().max_scenario_bytes + 1));
        assert_eq!(err.status, 413);
        assert!(err.message.contains("at most"), "{err:?}");
        let p = page("", Some(Err(err)), &[]);
        assert_eq!(p.status, 413);
        assert!(p.html.contains("was not planned"), "{}", p.html);
    }

    /// Issue 27: a model count in the billions passed the node and pod limits, and the UI
    /// died allocating its GPUs. Each figure is refused before it is built, naming it.
    #[test]
    fn every_figure_is_bounded_before_it_is_built() {
        let err = refused(&inline_fleet(1, 4_000_000_000));
        assert_eq!(err.status, 413, "{err:?}");
        assert!(
            err.message
                .contains("4000000000 GPUs per node in fleet[0] (n)")
                && err.message.contains("at most 64")
                && err.message.contains("hami plan"),
            "{err:?}"
        );
        let err = refused(&inline_fleet(2000, 64));
        assert!(
            err.status == 413 && err.message.contains("128000 GPUs"),
            "{err:?}"
        );
        let xgmi = "fleet:\n- name: n\n  count: 100\n  gpus:\n  - {type: AMD X, count: 64, memory_mib: 1024, cus: 8, xgmi: true}\n";
        let err = refused(&format!("{xgmi}{ONE_POD}"));
        assert!(
            err.status == 413 && err.message.contains("403200 XGMI links"),
            "{err:?}"
        );
        let many_pods = inline_fleet(1000, 8).replace("- count: 1\n", "- count: 20000\n");
        let err = refused(&many_pods);
        assert!(
            err.status == 413 && err.message.contains("steps") && err.message.contains("policies"),
            "{err:?}"
        );
        let groups: String = (0..65)
            .map(|i| format!("- {{name: g{i}, count: 1, capture: one-gpu}}\n"))
            .collect();
        let err = refused(&format!("fleet:\n{groups}{ONE_POD}"));
        assert!(
            err.status == 413 && err.message.contains("65 node groups"),
            "{err:?}"
        );
        // Within every limit: admitted, with the figures it was judged by.
        let ok = admit(&inline_fleet(10, 8), &Limits::default()).unwrap();
        assert_eq!(
            (
                ok.figures.nodes,
                ok.figures.gpus,
                ok.figures.pods,
                ok.figures.policy_pairs
            ),
            (10, 80, 1, 4)
        );
        assert_eq!(ok.figures.work, 4 * 90);
    }

    #[test]
    fn form_bodies_decode() {
        assert_eq!(
            scenario_from_form(b"a=1&scenario=fleet%3A+%5B%5D%0A&x").unwrap(),
            "fleet: []\n"
        );
        assert_eq!(scenario_from_form(b"").unwrap(), "");
        assert_eq!(scenario_from_form(b"scenario").unwrap(), "");
        assert_eq!(scenario_from_form(b"scenario=%4").unwrap_err().status, 400);
        assert_eq!(scenario_from_form(b"scenario=%ff").unwrap_err().status, 400);
    }
}
