//! The plan and the measurements as text tables, for people (pure: returns a String).

use std::fmt::Write;

use crate::measure::FleetMeasure;
use crate::plan::{Place, Plan};

fn place(p: &Place) -> String {
    let cards: Vec<&str> = p.cards.iter().map(|c| c.card.as_str()).collect();
    format!("{}/{}", p.node, cards.join("+"))
}

/// Left-aligned columns, two spaces apart.
fn columns(rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..rows.first().map_or(0, Vec::len))
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    out
}

/// The plan: its target and outcome, one row per move, then what blocks the rest.
pub fn render_plan(plan: &Plan) -> String {
    let mut out = String::new();
    let verdict = if plan.reached {
        "reached"
    } else {
        "NOT reached"
    };
    let _ = writeln!(
        out,
        "Target: {} -- {verdict} ({} move(s), shortfall {} -> {})",
        plan.target,
        plan.moves.len(),
        plan.shortfall_before,
        plan.shortfall_after
    );
    if let Some(node) = &plan.pod_fits_on {
        let _ = writeln!(out, "The pod then fits on node {node}.");
    }
    if !plan.moves.is_empty() {
        let mut rows = vec![
            ["STEP", "POD", "FROM", "TO", "MiB", "PDB", "WHY", "GAIN"]
                .map(String::from)
                .to_vec(),
        ];
        for m in &plan.moves {
            let mib: u64 = m.from.cards.iter().map(|c| c.mem_mib).sum();
            rows.push(vec![
                m.step.to_string(),
                m.pod.clone(),
                place(&m.from),
                place(&m.to),
                mib.to_string(),
                m.pdb.clone(),
                m.why.clone(),
                m.gain.clone(),
            ]);
        }
        out.push_str(&columns(&rows));
    }
    if !plan.blocked.is_empty() {
        let _ = writeln!(out, "Blocked by:");
        for b in &plan.blocked {
            let _ = writeln!(out, "  {}: {}", b.at, constraint_text(&b.constraint));
        }
        if plan.blockers_left_out > 0 {
            let _ = writeln!(out, "  ... and {} more", plan.blockers_left_out);
        }
    }
    out
}

/// A constraint in words.
pub fn constraint_text(c: &crate::plan::Constraint) -> String {
    use crate::plan::Constraint::*;
    match c {
        Protected { pod, protection } => format!("pod {pod} stays: {protection}"),
        NoRoomElsewhere { pod } => format!("pod {pod} fits nowhere else"),
        MoveLimit { max_moves } => format!("needs more than {max_moves} moves (max_moves)"),
        UnknownHolders => {
            "slices held by pods the planner was not told about, or reserved for a moved pod's replacement".into()
        }
        NeverFits { reason } => format!("the pod does not fit even on the empty node: {reason}"),
        NoImprovement => "moving its pods would not bring the target closer".into(),
        NotEnoughCards { exist } => format!("only {exist} healthy card(s) of this type exist"),
        SearchBudget { budget } => {
            format!("search stopped after {budget} candidate sets (search_budget)")
        }
    }
}

/// Per node: free MiB and cores, stranded, the largest slice that fits, fragmentation;
/// the `top` most fragmented nodes only (all of them with `top == 0`).
pub fn render_measure(fleet: &FleetMeasure, top: usize) -> String {
    let mut out = String::new();
    for (vendor, t) in [("AMD", &fleet.amd), ("NVIDIA", &fleet.nvidia)] {
        if t.cards == 0 {
            continue;
        }
        let _ = writeln!(
            out,
            "{vendor}: {} cards ({} idle), free {} MiB / {} cores, stranded {} MiB / {} cores, fragmentation {:.1} %",
            t.cards,
            t.idle_cards,
            t.free_mib,
            t.free_cores,
            t.stranded_mib,
            t.stranded_cores,
            t.fragmentation * 100.0
        );
    }
    let nodes = if top == 0 {
        fleet.nodes.iter().collect()
    } else {
        fleet.top_fragmented(top)
    };
    let mut rows = vec![
        [
            "NODE",
            "FREE MiB",
            "FREE CORES",
            "STRANDED MiB",
            "STRANDED CORES",
            "LARGEST",
            "FRAG",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for n in nodes {
        let t = &n.totals;
        rows.push(vec![
            n.node.clone(),
            t.free_mib.to_string(),
            t.free_cores.to_string(),
            t.stranded_mib.to_string(),
            t.stranded_cores.to_string(),
            n.largest.map_or("-", |s| s.as_str()).to_owned(),
            format!("{:.1} %", t.fragmentation * 100.0),
        ]);
    }
    out.push_str(&columns(&rows));
    out
}
