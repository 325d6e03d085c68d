//! The figures the pages show from the monitors, per node and device (a uuid alone names
//! a card only within its node), with where a missing figure's reason lies:
//! - a card's use is the larger of its card-level (host) series and the sum of its pods'
//!   (a host series can be missing, or lower than what the pods on it report);
//! - a figure carries its age ([`crate::html::age`]);
//! - a figure missing where no monitor covers the node says so, instead of waiting for
//!   ever.

use crate::html::age;
use crate::samples::{CardSample, Metrics};

const MIB: f64 = 1048576.0;

/// What the monitors say a card on a node uses.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CardUse {
    /// Memory in use, MiB.
    pub memory_mib: Option<f64>,
    /// Percent busy.
    pub utilization: Option<f64>,
    /// When the oldest figure used was sampled.
    pub at: Option<i64>,
}

fn larger(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// The card `uuid` of node `node`: its host series, or its pods' sum where that is larger
/// or the host series is missing.
pub fn card_use(metrics: &Metrics, node: &str, uuid: &str) -> CardUse {
    let key = (node.to_owned(), uuid.to_owned());
    let host = metrics.cards.get(&key);
    let pods = metrics.pods_on_cards.get(&key);
    let both = [host, pods];
    let pick = |f: fn(&CardSample) -> Option<f64>| {
        both.iter().flatten().fold(None, |acc, c| larger(acc, f(c)))
    };
    CardUse {
        memory_mib: pick(|c| c.memory_bytes).map(|b| b / MIB),
        utilization: pick(|c| c.utilization),
        at: both.iter().flatten().map(|c| c.at).min(),
    }
}

/// Whether a node's figures can come from a monitor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Coverage {
    /// No monitor is configured that reports on it.
    Unconfigured,
    /// A monitor that never answered cannot be read: it may be this node's.
    Unreadable,
    /// A monitor has not answered yet: it may be this node's.
    Waiting,
    /// A monitor reports on it (its host series or its pods' containers), or its URL names it.
    Covered,
}

/// Whether node `node`'s figures can come from a monitor.
pub fn coverage(metrics: &Metrics, node: &str) -> Coverage {
    let c = &metrics.covered;
    if c.nodes.contains(node) {
        Coverage::Covered
    } else if c.waiting {
        Coverage::Waiting
    } else if c.unreadable {
        Coverage::Unreadable
    } else {
        Coverage::Unconfigured
    }
}

/// What a figure of a node with no sample says instead.
pub fn not_sampled(coverage: Coverage) -> &'static str {
    match coverage {
        Coverage::Covered | Coverage::Waiting => "no samples yet",
        Coverage::Unreadable => {
            "not reported: the monitors that may cover this node cannot be read"
        }
        Coverage::Unconfigured => "not reported: no monitor configured for this node",
    }
}

/// [`not_sampled`] for a figure over `nodes` nodes (a row of the overview's GPUs by type),
/// `coverage` the best among them: "this node" would be wrong where there are several.
pub fn not_sampled_on(coverage: Coverage, nodes: usize) -> String {
    if nodes <= 1 {
        return not_sampled(coverage).to_owned();
    }
    match coverage {
        Coverage::Covered | Coverage::Waiting => "no samples yet".to_owned(),
        Coverage::Unreadable => {
            format!("not reported: the monitors that may cover its {nodes} nodes cannot be read")
        }
        Coverage::Unconfigured => {
            format!("not reported: no monitor configured for any of its {nodes} nodes")
        }
    }
}

/// A figure with its age, or what stands in for it on a node of `coverage`.
pub fn figure(value: Option<(String, Option<i64>)>, now: i64, coverage: Coverage) -> String {
    figure_on(value, now, coverage, 1)
}

/// [`figure`] over `nodes` nodes, `coverage` the best among them.
pub fn figure_on(
    value: Option<(String, Option<i64>)>,
    now: i64,
    coverage: Coverage,
    nodes: usize,
) -> String {
    match value {
        Some((text, Some(at))) => format!("{text} {}", age(at, now)),
        Some((text, None)) => text,
        None => not_sampled_on(coverage, nodes),
    }
}

/// Under a card's meters: how old their used figures are, or why there are none.
pub fn sampled_note(at: Option<i64>, now: i64, coverage: Coverage) -> String {
    match at {
        Some(at) => format!("<span class=\"muted\">Used: {}</span>", age(at, now)),
        None => format!(
            "<span class=\"muted\">Used: {}</span>",
            not_sampled(coverage)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coverage_from_what_monitors_said_or_their_urls() {
        let w = crate::world::World::default();
        let mut m = Metrics::with_endpoints(&[
            "http://gpu-1:9394/metrics".into(),
            "http://prometheus:9090/federate".into(),
        ]);
        assert_eq!(coverage(&m, "gpu-1"), Coverage::Covered);
        assert_eq!(coverage(&m, "gpu-2"), Coverage::Waiting);
        m.ingest(1, vec![Err("refused".into()), Err("refused".into())], &w);
        assert_eq!(coverage(&m, "gpu-2"), Coverage::Unreadable);
        let host = "hami_host_gpu_memory_used_bytes{node=\"gpu-3\",device_index=\"0\",device_uuid=\"G\",device_type=\"T\"} 1\n";
        let body = hami_protocol::scrape::parse_samples(host);
        m.ingest(2, vec![Ok((vec![], 0)), Ok(body)], &w);
        assert_eq!(coverage(&m, "gpu-3"), Coverage::Covered);
        assert_eq!(coverage(&m, "gpu-2"), Coverage::Unconfigured);
        assert_eq!(
            figure(None, 10, Coverage::Unconfigured),
            "not reported: no monitor configured for this node"
        );
        assert_eq!(
            figure_on(None, 10, Coverage::Unconfigured, 2),
            "not reported: no monitor configured for any of its 2 nodes"
        );
        assert_eq!(
            figure_on(None, 10, Coverage::Unreadable, 3),
            "not reported: the monitors that may cover its 3 nodes cannot be read"
        );
        assert!(
            figure(Some(("1 GiB".into(), Some(0))), 130, Coverage::Covered)
                .contains("as of 2 min ago")
        );
    }
}
