//! The pure parts of `hami defrag apply`: which moves run (stale ones, refused ones, the
//! rest of a step that lost one), the marker's TTL, the reservation, the owners' count.

use super::*;
use hami_defrag_core::{CardSlice, Place};
use serde_json::json;

const REGISTER: &str = r#"[{"id":"G1","index":0,"count":10,"devmem":65536,"devcore":104,"type":"AMD Instinct MI210","health":true},{"id":"G2","index":1,"count":10,"devmem":65536,"devcore":104,"type":"AMD Instinct MI210","health":true}]"#;
const REGISTER_N2: &str = r#"[{"id":"G3","index":0,"count":10,"devmem":65536,"devcore":104,"type":"AMD Instinct MI210","health":true}]"#;

fn pod(name: &str, node: &str, card: &str, mib: u64, phase: &str) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ml", "uid": format!("u-{name}"),
        "labels": {"app": "web", "pod-template-hash": "h1"},
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "rs-web", "controller": true}],
        "annotations": {"hami.io/vgpu-node": node,
            "hami.io/amd-devices-allocated": format!("{card},AMD Instinct MI210,{mib},13:;")}},
        "spec": {"nodeName": node, "schedulerName": "hami-scheduler", "containers": [{"name": "c", "image": "x",
            "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": mib.to_string(), "amd.com/gpucores": "12"}}}]},
        "status": {"phase": phase}}))
    .unwrap()
}

/// n1 (G1, G2) holding web-a on G1 and web-b on G2, 20000 MiB each; n2 (G3) holding 40000.
fn cluster() -> (Cluster, Vec<Pod>) {
    cluster_with(None, None)
}

/// [`cluster`], with `reservation` (a defrag reservation's value) on n2, planned for
/// `pending` at time 0.
fn cluster_with(reservation: Option<&str>, pending: Option<&Pod>) -> (Cluster, Vec<Pod>) {
    let node = |name: &str, reg: &str| -> Node {
        let mut node: Node = serde_json::from_value(
            json!({"metadata": {"name": name, "annotations": {"hami.io/node-amd-register": reg}}}),
        )
        .unwrap();
        if let (Some(value), "n2") = (reservation, name) {
            node.metadata
                .annotations
                .as_mut()
                .unwrap()
                .insert("reservation.defrag.hami.io/u-gone".into(), value.into());
        }
        node
    };
    let nodes = [node("n1", REGISTER), node("n2", REGISTER_N2)];
    let pods = vec![
        pod("web-a", "n1", "G1", 20000, "Running"),
        pod("web-b", "n1", "G2", 20000, "Running"),
        pod("big", "n2", "G3", 40000, "Running"),
    ];
    let mut state = ClusterState::new();
    state.reset_nodes(nodes.iter());
    state.reset_pods(pods.iter());
    let c = defrag_facts::cluster(
        &state,
        &pods,
        &[],
        hami_protocol::selection::GpuPolicy::default(),
        0,
        pending,
    );
    (c, pods)
}

/// What a web pod holds: 13 CUs where it runs (its allocation), 12 where it goes (12 %
/// of 104 CUs, as the fit charges a new pod).
fn slice(card: &str, cores: u64) -> Vec<CardSlice> {
    vec![CardSlice {
        card: card.into(),
        mem_mib: 20000,
        cores,
        slots: 1,
    }]
}

fn mv(step: usize, pod: &str, from: &str, to: (&str, &str)) -> Move {
    Move {
        step,
        pod: format!("ml/{pod}"),
        uid: format!("u-{pod}"),
        from: Place {
            node: "n1".into(),
            cards: slice(from, 13),
        },
        to: Place {
            node: to.0.into(),
            cards: slice(to.1, 12),
        },
        why: String::new(),
        pdb: String::new(),
        gain: String::new(),
        shortfall_after: 0,
    }
}

fn plan(moves: Vec<Move>) -> Plan {
    Plan {
        target: "t".into(),
        shortfall_before: 1,
        shortfall_after: 0,
        reached: true,
        moves,
        pod_fits_on: None,
        blocked: Vec::new(),
        blockers_left_out: 0,
    }
}

#[test]
fn a_move_that_fits_runs_and_a_step_that_loses_a_move_loses_the_rest() {
    let (c, _) = cluster();
    let one = plan(vec![mv(0, "web-a", "G1", ("n2", "G3"))]);
    let (kept, skipped) = select(&c, &one, |_| None);
    assert_eq!((kept.len(), skipped.len()), (1, 0), "{skipped:?}");

    // Both web pods to G3 in one step: the second no longer fits, so neither runs.
    let both = plan(vec![
        mv(0, "web-a", "G1", ("n2", "G3")),
        mv(0, "web-b", "G2", ("n2", "G3")),
    ]);
    let (kept, skipped) = select(&c, &both, |_| None);
    assert!(kept.is_empty(), "{kept:?}");
    assert!(
        skipped[0]
            .reason
            .contains("no longer fits its target on n2"),
        "{skipped:?}"
    );
    assert_eq!(skipped[1].pod, "ml/web-a");
    assert!(
        skipped[1].reason.contains("lost another move"),
        "{skipped:?}"
    );

    // A refused move drops its own step only; a wrong card is stale.
    let two = plan(vec![
        mv(0, "web-a", "G1", ("n2", "G3")),
        mv(1, "web-b", "G2", ("n1", "G1")),
    ]);
    let (kept, skipped) = select(&c, &two, |m| {
        (m.pod == "ml/web-b").then(|| "no".to_string())
    });
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].pod, "ml/web-a");
    assert_eq!((skipped[0].step, skipped[0].reason.as_str()), (1, "no"));
    let stale = plan(vec![mv(0, "web-a", "G2", ("n2", "G3"))]);
    let (kept, skipped) = select(&c, &stale, |_| None);
    assert!(kept.is_empty());
    assert!(
        skipped[0]
            .reason
            .contains("holds other cards or amounts than planned"),
        "{skipped:?}"
    );
}

#[test]
fn a_move_onto_capacity_a_defrag_reservation_holds_is_stale() {
    // 20000 MiB of G3 held for another owner's replacement: web-a no longer fits there.
    let held = |expires_at: i64, owner: &str| {
        format!(
            r#"{{"owner_uid":"{owner}","owner":"ReplicaSet/{owner}","cards":[["G3",20000,12]],"reserved_at":0,"expires_at":{expires_at}}}"#
        )
    };
    let one = plan(vec![mv(0, "web-a", "G1", ("n2", "G3"))]);
    let (c, _) = cluster_with(Some(&held(600, "rs-db")), None);
    let (kept, skipped) = select(&c, &one, |_| None);
    assert!(kept.is_empty(), "{kept:?}");
    assert!(
        skipped[0]
            .reason
            .contains("no longer fits its target on n2"),
        "{skipped:?}"
    );
    // Expired: it holds nothing.
    let (c, _) = cluster_with(Some(&held(-1, "rs-db")), None);
    assert_eq!(select(&c, &one, |_| None).0.len(), 1);
    // Planned for the reserving owner's pending pod: its owner's reservation is free.
    let replacement = pod("db-0", "", "", 20000, "Pending");
    let mut replacement = replacement;
    replacement.metadata.owner_references.as_mut().unwrap()[0].uid = "rs-db".into();
    let (c, _) = cluster_with(Some(&held(600, "rs-db")), Some(&replacement));
    assert_eq!(select(&c, &one, |_| None).0.len(), 1);
}

#[test]
fn the_marker_protects_for_its_ttl_only() {
    let mut p = pod("web-a", "n1", "G1", 20000, "Running");
    assert_eq!(fresh_marker(&p, 1000, 600), None);
    p.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(MOVED_AT.into(), "900".into());
    assert!(fresh_marker(&p, 1000, 600).is_some_and(|w| w.starts_with("moved by defrag 100s ago")));
    assert_eq!(fresh_marker(&p, 1000, 100), None);
    p.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(MOVED_AT.into(), "not-a-time".into());
    assert_eq!(fresh_marker(&p, 1000, 600), None);
}

#[test]
fn the_reservation_names_the_owner_template_cards_and_expiry() {
    let p = pod("web-a", "n1", "G1", 20000, "Running");
    let r = reservation(&mv(3, "web-a", "G1", ("n2", "G3")), &p, 1000, 600).unwrap();
    assert_eq!(
        r,
        Reservation {
            owner_uid: "rs-web".into(),
            owner: "ReplicaSet/web".into(),
            template_hash: Some("h1".into()),
            cards: vec![hami_protocol::defrag_reservation::ReservedCard {
                uuid: "G3".into(),
                mem_mib: 20000,
                cores: 12
            }],
            reserved_at: 1000,
            expires_at: 1600,
            plan_step: 3,
        }
    );
    let mut bare = p.clone();
    bare.metadata.owner_references = None;
    assert_eq!(
        reservation(&mv(0, "web-a", "G1", ("n2", "G3")), &bare, 0, 1),
        None
    );
}

#[test]
fn owners_count_running_pods_not_pending_or_deleting_ones() {
    let mut deleting = pod("c", "n1", "G1", 1, "Running");
    deleting.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
    let pods = [
        pod("a", "n1", "G1", 1, "Running"),
        pod("b", "n1", "G1", 1, "Pending"),
        deleting,
    ];
    let by = running_by_owner(&pods);
    assert_eq!(by.get("rs-web"), Some(&vec!["u-a".to_string()]));
}

#[test]
fn the_summary_counts_each_outcome_and_lists_skips() {
    let s = Summary {
        executed: true,
        steps: vec![
            StepReport {
                step: 0,
                from_node: "n1".into(),
                moves: vec![("ml/a".into(), "n2 G3".into())],
                outcome: Outcome::Moved,
                detail: String::new(),
            },
            StepReport {
                step: 1,
                from_node: "n1\nforged".into(),
                moves: vec![("ml/b".into(), "n2 G3".into())],
                outcome: Outcome::BlockedByPdb,
                detail: "refused".into(),
            },
        ],
        skipped: vec![SkippedMove {
            step: 2,
            pod: "ml/c".into(),
            reason: "gone".into(),
        }],
    };
    let text = render(&s);
    assert!(text.contains("Summary: 1 pod(s) moved, 1 skipped, 1 step(s) blocked by a PodDisruptionBudget, 0 aborted"), "{text}");
    assert!(
        text.contains("step 1 from n1\\nforged: blocked by pdb: refused"),
        "{text}"
    );
    assert!(text.contains("skipped (step 2) ml/c: gone"), "{text}");
    assert!(!s.clean());
}
