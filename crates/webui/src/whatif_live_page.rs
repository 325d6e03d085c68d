//! `/whatif/live`: the What-if page that starts from the live cluster — the edit form
//! ("+N nodes like X", "remove node Y") with the before/after of the waiting pods, and the
//! defrag form with its plan as a table and the commands that carry it out. Pure
//! rendering; every name, reason and echoed field is escaped.

use std::fmt::Write;

use hami_defrag_core::table::constraint_text;
use hami_defrag_core::{Place, Policy};
use hami_scheduler_core::usage::DeviceCharge;

use crate::defrag_view::Planned;
use crate::html::{Page, esc, frame, table};
use crate::pages::{node_link, pod_link};
use crate::whatif::Problem;
use crate::whatif_live::{
    LiveReport, MAX_ADDED, MAX_REMOVED, Outcome, Snapshot, asks_gpu, is_terminal,
};
use crate::world::{World, is_dra_node, pod_key};
use k8s_openapi::api::core::v1::{Node, Pod};

/// Options offered in the forms' lists.
const LISTED: usize = 500;
/// Rows of the before/after table.
const SHOWN_ROWS: usize = 500;
/// Protected pods listed under a plan.
const SHOWN_PROTECTED: usize = 20;

/// What the forms offer: the nodes and the waiting pods (by name, sorted).
#[derive(Debug, Clone, Default)]
pub struct Choices {
    /// Node names.
    pub nodes: Vec<String>,
    /// `namespace/name` of the pods that wait unbound.
    pub waiting: Vec<String>,
}

impl Choices {
    /// The choices of `snapshot`.
    pub fn of(snapshot: &Snapshot) -> Choices {
        Choices::from_parts(&snapshot.nodes, &snapshot.pods)
    }

    /// The choices of the world's device-plugin nodes and pods, read in place (the form's
    /// GET copies nothing).
    pub fn of_world(world: &World) -> Choices {
        Choices::from_parts(
            world.nodes.values().filter(|n| !is_dra_node(n)),
            world.pods.values(),
        )
    }

    fn from_parts<'a>(
        nodes: impl IntoIterator<Item = &'a Node>,
        pods: impl IntoIterator<Item = &'a Pod>,
    ) -> Choices {
        let mut nodes: Vec<String> = nodes
            .into_iter()
            .filter_map(|n| n.metadata.name.clone())
            .collect();
        nodes.sort();
        // The pods the live What-if plans: unbound, not finished, asking a GPU.
        let mut waiting: Vec<String> = pods
            .into_iter()
            .filter(|p| {
                p.spec.as_ref().is_some_and(|s| s.node_name.is_none())
                    && !is_terminal(p)
                    && asks_gpu(p)
            })
            .map(pod_key)
            .collect();
        waiting.sort();
        Choices { nodes, waiting }
    }
}

/// What the page shows under its forms.
#[derive(Debug, Clone)]
pub enum Shown {
    /// Only the forms.
    Forms,
    /// The edits' before/after, or why they were not planned.
    Live(Result<LiveReport, Problem>),
    /// A defrag plan, or why none was made.
    Defrag(Result<Planned, Problem>),
}

/// The fields as posted, to fill the forms in again.
#[derive(Debug, Clone, Default)]
pub struct Filled(pub Vec<(String, String)>);

impl Filled {
    fn get(&self, key: &str) -> &str {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map_or("", |(_, v)| v.as_str())
    }
}

fn cards(cards: &[DeviceCharge]) -> String {
    cards
        .iter()
        .map(|c| format!("{} ({} MiB, {})", esc(&c.uuid), c.mem_mib, c.cores))
        .collect::<Vec<_>>()
        .join(", ")
}

fn outcome(o: &Outcome) -> String {
    match o {
        Outcome::Placed { node, cards: c } => {
            format!(
                "<strong>placed</strong> on {}: {}",
                node_link(node),
                cards(c)
            )
        }
        Outcome::Waits { reason } => format!("waits: {}", esc(reason)),
    }
}

fn problem(what: &str, p: &Problem) -> String {
    format!(
        "<div class=\"banner\" role=\"alert\">{what}: {}</div>",
        esc(&p.message)
    )
}

fn live_result(r: &LiveReport) -> String {
    let (before, after) = r.placed();
    let waiting = r.rows.iter().filter(|row| row.from.is_none()).count();
    let mut out = format!(
        "<h2 id=\"live-result\">Before and after</h2><p>{} → {} nodes, {} → {} GPUs. Of {waiting} waiting pod(s), {before} would be placed now and {after} after the edits",
        r.nodes.0, r.nodes.1, r.gpus.0, r.gpus.1
    );
    let moved = r.rows.len() - waiting;
    if moved > 0 {
        let placed = r
            .rows
            .iter()
            .filter(|row| row.from.is_some() && row.after.placed())
            .count();
        let _ = write!(
            out,
            "; {placed} of the {moved} GPU pod(s) of the removed node(s) find room again"
        );
    }
    out.push_str(".</p>");
    if !r.added.is_empty() {
        let _ = write!(out, "<p>Added: {}.</p>", esc(&r.added.join(", ")));
    }
    if r.displaced_without_gpu > 0 {
        let _ = write!(
            out,
            "<p>{} pod(s) of the removed node(s) ask no GPU: kube-scheduler places them, not planned here.</p>",
            r.displaced_without_gpu
        );
    }
    if r.left_out > 0 {
        let _ = write!(
            out,
            "<p>{} more waiting pod(s) were not planned (the UI plans the first {} in queue order).</p>",
            r.left_out,
            crate::whatif_live::MAX_PENDING
        );
    }
    if r.rows.is_empty() {
        out.push_str("<p>No pod waits for a GPU, and no GPU pod leaves a removed node.</p>");
        return out;
    }
    let rows: Vec<Vec<String>> = r
        .rows
        .iter()
        .take(SHOWN_ROWS)
        .map(|row| {
            vec![
                pod_link(&row.pod),
                match &row.from {
                    Some(n) => format!("runs on {} (removed)", node_link(n)),
                    None => "waits".into(),
                },
                row.before.as_ref().map_or_else(
                    || format!("runs on {}", node_link(row.from.as_deref().unwrap_or(""))),
                    outcome,
                ),
                outcome(&row.after),
            ]
        })
        .collect();
    out.push_str(&table(
        &format!(
            "Waiting pods, in the scheduler's queue order (first {SHOWN_ROWS} of {})",
            r.rows.len()
        ),
        &["POD", "NOW", "BEFORE THE EDITS", "AFTER THE EDITS"],
        &rows,
    ));
    out
}

fn place(p: &Place) -> String {
    let cards: Vec<String> = p.cards.iter().map(|c| esc(&c.card)).collect();
    format!("{} / {}", node_link(&p.node), cards.join(" + "))
}

fn defrag_result(planned: &Planned) -> String {
    let plan = &planned.plan;
    let mut out = format!(
        "<h2 id=\"defrag-result\">Defrag plan</h2><p>Target: {} — <strong>{}</strong> ({} move(s), shortfall {} → {}).</p>",
        esc(&plan.target),
        if plan.reached {
            "reached"
        } else {
            "NOT reached"
        },
        plan.moves.len(),
        plan.shortfall_before,
        plan.shortfall_after
    );
    if let Some(node) = &plan.pod_fits_on {
        let _ = write!(out, "<p>The pod then fits on node {}.</p>", node_link(node));
    }
    if let Some(why) = &planned.budgets_unread {
        let _ = write!(
            out,
            "<p>PodDisruptionBudgets were not read ({}): in this preview pods no budget covers may move; the commands below check the budgets.</p>",
            esc(why)
        );
    }
    if !plan.moves.is_empty() {
        let rows: Vec<Vec<String>> = plan
            .moves
            .iter()
            .map(|m| {
                vec![
                    m.step.to_string(),
                    pod_link(&m.pod),
                    place(&m.from),
                    place(&m.to),
                    m.from
                        .cards
                        .iter()
                        .map(|c| c.mem_mib)
                        .sum::<u64>()
                        .to_string(),
                    esc(&m.why),
                    if planned.budgets_unread.is_some() {
                        "not read (the commands below check it)".into()
                    } else {
                        esc(&m.pdb)
                    },
                    esc(&m.gain),
                ]
            })
            .collect();
        out.push_str(&table(
            "Moves, in order (each target is reserved before its pod is evicted)",
            &["STEP", "POD", "FROM", "TO", "MIB", "WHY", "PDB", "GAIN"],
            &rows,
        ));
    }
    if !plan.blocked.is_empty() {
        out.push_str("<h3>Blocked by</h3><ul>");
        for b in &plan.blocked {
            let _ = write!(
                out,
                "<li>{}: {}</li>",
                esc(&b.at),
                esc(&constraint_text(&b.constraint))
            );
        }
        if plan.blockers_left_out > 0 {
            let _ = write!(out, "<li>and {} more</li>", plan.blockers_left_out);
        }
        out.push_str("</ul>");
    }
    if !planned.protected.is_empty() {
        let _ = write!(
            out,
            "<details><summary>Not moved: {} pod(s) the policy keeps in place</summary><ul>",
            planned.protected.len()
        );
        for (pod, why) in planned.protected.iter().take(SHOWN_PROTECTED) {
            let _ = write!(out, "<li>{}: {}</li>", esc(pod), esc(why));
        }
        out.push_str("</ul></details>");
    }
    out.push_str("<h3>To carry it out</h3><p>The UI never evicts. Plan again from the command line, check the dry run, then execute:</p><div class=\"scroll\" role=\"group\" tabindex=\"0\" aria-label=\"Commands\"><pre><code>");
    // Long lines scroll in their own box on a narrow screen, as tables do.
    out.push_str(&esc(&planned.commands.join("\n")));
    out.push_str("</code></pre></div>");
    out
}

fn options(id: &str, names: &[String]) -> String {
    let mut out = format!("<datalist id=\"{id}\">");
    for n in names.iter().take(LISTED) {
        let _ = write!(out, "<option value=\"{}\">", esc(n));
    }
    out.push_str("</datalist>");
    out
}

fn forms(choices: &Choices, f: &Filled) -> String {
    let mut out = options("live-nodes", &choices.nodes);
    let _ = write!(
        out,
        "<form method=\"post\" action=\"/whatif/live\"><h2>Edit the fleet</h2><p><label>Add <input name=\"add\" inputmode=\"numeric\" size=\"4\" value=\"{add}\"></label> <label>nodes like <input name=\"like\" list=\"live-nodes\" value=\"{like}\"></label> (1 to {MAX_ADDED}: copies of that node's GPUs, empty)</p><p><label>Remove nodes <input name=\"remove\" list=\"live-nodes\" value=\"{remove}\"></label> (names, comma-separated, at most {MAX_REMOVED}: their GPU pods are planned again)</p><p><button type=\"submit\">Show before and after</button></p></form>",
        add = esc(f.get("add")),
        like = esc(f.get("like")),
        remove = esc(f.get("remove")),
    );
    let target = f.get("target");
    let checked = |t: &str| {
        if target == t || (target.is_empty() && t == "pod") {
            " checked"
        } else {
            ""
        }
    };
    let _ = write!(
        out,
        "<form method=\"post\" action=\"/whatif/defrag\"><h2>Defragment</h2><p>The fewest pod moves (<code>hami defrag plan</code>'s planner) that reach one target:</p><fieldset><legend>Target</legend><p><label><input type=\"radio\" name=\"target\" value=\"pod\"{c_pod}> make room for the pending pod</label> <select name=\"pod\" aria-label=\"Pending pod\">",
        c_pod = checked("pod"),
    );
    for p in choices.waiting.iter().take(LISTED) {
        let selected = if f.get("pod") == p { " selected" } else { "" };
        let _ = write!(
            out,
            "<option value=\"{v}\"{selected}>{v}</option>",
            v = esc(p)
        );
    }
    if choices.waiting.is_empty() {
        out.push_str("<option value=\"\">(no pod waits)</option>");
    }
    let _ = write!(
        out,
        "</select></p><p><label><input type=\"radio\" name=\"target\" value=\"cards\"{c_cards}> free</label> <input name=\"count\" inputmode=\"numeric\" size=\"4\" aria-label=\"Cards to free\" value=\"{count}\"> <label>whole cards of type <input name=\"type\" value=\"{ty}\"></label></p><p><label><input type=\"radio\" name=\"target\" value=\"percent\"{c_pct}> every card at least</label> <input name=\"percent\" inputmode=\"numeric\" size=\"4\" aria-label=\"Percent free\" value=\"{pct}\"> % free, or full</p></fieldset><p><label><input type=\"checkbox\" name=\"single\"{single}> also move the only replica of its owner</label> <label>at most <input name=\"max_moves\" inputmode=\"numeric\" size=\"4\" value=\"{moves}\"> moves</label> <label>of pods running at least <input name=\"min_age\" inputmode=\"numeric\" size=\"6\" value=\"{age}\"> s</label></p><p><label><input type=\"checkbox\" name=\"nopdb\"{nopdb}> also move pods no PodDisruptionBudget covers</label> (where the UI may not list the budgets, its preview moves them anyway and says so)</p><p><button type=\"submit\">Plan moves</button></p></form>",
        c_cards = checked("cards"),
        c_pct = checked("percent"),
        count = esc(f.get("count")),
        ty = esc(f.get("type")),
        pct = esc(f.get("percent")),
        nopdb = if f.get("nopdb") == "on" {
            " checked"
        } else {
            ""
        },
        single = if f.get("single") == "on" {
            " checked"
        } else {
            ""
        },
        moves = match f.get("max_moves") {
            "" => Policy::default().max_moves.to_string(),
            m => esc(m),
        },
        age = match f.get("min_age") {
            "" => Policy::default().min_age_seconds.to_string(),
            a => esc(a),
        },
    );
    out
}

/// The page: the result (if any) first, then both forms filled as posted.
pub fn page(choices: &Choices, filled: &Filled, shown: &Shown, banners: &[String]) -> Page {
    let mut body = String::from(
        "<h1>What-if: the live cluster</h1><p>Start from the nodes and pods the UI watches now: add nodes like one you have, remove nodes, and see where the waiting pods would go (the scheduler's own filter, its default policies, in queue order; no preemption); or plan the moves that defragment the cards. Nothing in the cluster changes. <a href=\"/whatif\">Plan a described fleet instead</a>.</p>",
    );
    let mut status = 200;
    match shown {
        Shown::Forms => {}
        Shown::Live(Err(p)) => {
            status = p.status;
            body.push_str(&problem("The edits were not planned", p));
        }
        Shown::Live(Ok(r)) => body.push_str(&live_result(r)),
        Shown::Defrag(Err(p)) => {
            status = p.status;
            body.push_str(&problem("No defrag plan", p));
        }
        Shown::Defrag(Ok(planned)) => body.push_str(&defrag_result(planned)),
    }
    body.push_str(&forms(choices, filled));
    Page {
        status,
        html: frame("What-if: live cluster", banners, false, &body),
    }
}
