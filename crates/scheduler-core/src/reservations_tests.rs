//! Defrag reservations through the whole Filter decision (`decide_filter`): charged for
//! others, steered to for the owner, gone once expired or used up, ignored when malformed.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::extender::{FilterConfig, decide_filter};
use hami_protocol::defrag_reservation::{ReservedCard, key};

const NOW: i64 = 10_000;

/// A node of NVIDIA GPUs `ids` (10 shares, `mem` MiB, 100 % each), with `extra` annotations.
fn node(name: &str, ids: &[&str], mem: u64, extra: Value) -> k8s_openapi::api::core::v1::Node {
    let gpus: Vec<Value> = ids
        .iter()
        .map(|id| {
            json!({"id": id, "count": 10, "devmem": mem, "devcore": 100,
            "type": "NVIDIA-A100", "health": true})
        })
        .collect();
    let mut annotations =
        json!({"hami.io/node-nvidia-register": Value::String(json!(gpus).to_string())});
    for (k, v) in extra.as_object().into_iter().flatten() {
        annotations[k] = v.clone();
    }
    serde_json::from_value(json!({"metadata": {"name": name, "annotations": annotations}})).unwrap()
}

fn reservation(
    owner: &str,
    hash: Option<&str>,
    card: &str,
    mem: u64,
    cores: u64,
) -> DefragReservation {
    DefragReservation {
        owner_uid: owner.into(),
        owner: format!("ReplicaSet/{owner}"),
        template_hash: hash.map(String::from),
        cards: vec![ReservedCard {
            uuid: card.into(),
            mem_mib: mem,
            cores,
        }],
        reserved_at: NOW - 10,
        expires_at: NOW + 600,
        plan_step: 0,
    }
}

fn annotated(r: &DefragReservation, evicted: &str) -> Value {
    json!({ key(evicted): r.encode() })
}

/// A pod asking one NVIDIA GPU with `mem` MiB and `cores` %, owned by `owner` (hash `h`),
/// created at `created`.
fn pod(uid: &str, mem: u64, cores: u64, owner: Option<(&str, &str)>, created: i64) -> Pod {
    let mut meta = json!({"name": uid, "namespace": "ns", "uid": uid,
        "creationTimestamp": k8s_openapi::jiff::Timestamp::from_second(created).unwrap().to_string()});
    if let Some((owner, hash)) = owner {
        meta["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "name": owner, "uid": owner, "controller": true}]);
        meta["labels"] = json!({"pod-template-hash": hash});
    }
    serde_json::from_value(
        json!({"metadata": meta, "spec": {"containers": [{"name": "c",
        "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": mem.to_string(),
            "nvidia.com/gpucores": cores.to_string()}}}]}}),
    )
    .unwrap()
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// Where Filter puts the pod: (node, card), or the refusal of each node.
fn place(
    state: &mut ClusterState,
    p: &Pod,
    nodes: &[&str],
    now: i64,
) -> Result<(String, String), String> {
    let d = decide_filter(state, p, &names(nodes), &FilterConfig::default(), now);
    match d.patch {
        Some(patch) => {
            let node = patch.annotations["hami.io/vgpu-node"].clone();
            let list = &patch.annotations["hami.io/vgpu-devices-allocated"];
            let card = list
                .trim_start_matches(';')
                .split(',')
                .next()
                .unwrap()
                .to_owned();
            Ok((node, card))
        }
        None => Err(format!("{:?}", d.result)),
    }
}

#[test]
fn others_see_the_cards_taken_the_owner_sees_them_free() {
    let r = reservation("rs-web", Some("h1"), "G1", 30_000, 60);
    let mut state = ClusterState::new();
    state.upsert_node(&node("n1", &["G1"], 40_000, annotated(&r, "evicted-1")));
    // 40,000 MiB, 30,000 reserved: 20,000 does not fit for another owner ...
    let other = pod("o", 20_000, 30, Some(("rs-other", "x")), NOW);
    let refused = place(&mut state, &other, &["n1"], NOW).unwrap_err();
    assert!(refused.contains("CardInsufficientMemory"), "{refused}");
    // ... nor for a pod of the same controller but another template, nor an orphan ...
    let stale = pod("s", 20_000, 30, Some(("rs-web", "h0")), NOW);
    assert!(place(&mut state, &stale, &["n1"], NOW).is_err());
    assert!(place(&mut state, &pod("b", 20_000, 30, None, NOW), &["n1"], NOW).is_err());
    // ... but a small one fits beside the reservation (10,000 MiB and 40 % are left).
    let small = pod("sm", 10_000, 40, None, NOW);
    assert_eq!(place(&mut state, &small, &["n1"], NOW).unwrap().1, "G1");
    state.release("sm");
    // The owner's replacement gets the reserved capacity.
    let owner = pod("new", 30_000, 60, Some(("rs-web", "h1")), NOW);
    assert_eq!(
        place(&mut state, &owner, &["n1"], NOW),
        Ok(("n1".into(), "G1".into()))
    );
}

#[test]
fn an_expired_reservation_counts_no_more() {
    let r = reservation("rs-web", None, "G1", 30_000, 60);
    let mut state = ClusterState::new();
    state.upsert_node(&node("n1", &["G1"], 40_000, annotated(&r, "e")));
    let other = pod("o", 20_000, 30, None, NOW);
    assert!(place(&mut state, &other, &["n1"], r.expires_at - 1).is_err());
    assert!(place(&mut state, &other, &["n1"], r.expires_at).is_ok());
}

#[test]
fn a_node_only_others_reservations_keep_the_pod_off_is_unresolvable() {
    // 40,000 MiB: 20,000 held for rs-web, 15,000 by x (the scheduler's), 5,000 free.
    let r = reservation("rs-web", Some("h1"), "G1", 20_000, 50);
    let mut state = ClusterState::new();
    state.upsert_node(&node("n1", &["G1"], 40_000, annotated(&r, "e")));
    assert!(place(&mut state, &pod("x", 15_000, 10, None, NOW), &["n1"], NOW).is_ok());
    let filter = |state: &mut ClusterState, p: &Pod| {
        decide_filter(state, p, &names(&["n1"]), &FilterConfig::default(), NOW).result
    };
    // 15,000 fits once x is evicted: kube-scheduler may preempt there.
    let curable = filter(&mut state, &pod("c", 15_000, 20, None, NOW));
    assert!(curable.failed_nodes.contains_key("n1"), "{curable:?}");
    assert!(curable.failed_and_unresolvable_nodes.is_empty());
    // 26,000 does not even with x gone (the reservation stays): no eviction helps.
    let never = filter(&mut state, &pod("n", 26_000, 20, None, NOW));
    assert!(
        never.failed_and_unresolvable_nodes.contains_key("n1"),
        "a node only a reservation keeps the pod off was offered to preemption: {never:?}"
    );
    assert!(never.failed_nodes.is_empty());
    // Without the reservation (expired), 26,000 fits once x is evicted.
    let later = decide_filter(
        &mut state,
        &pod("n", 26_000, 20, None, NOW),
        &names(&["n1"]),
        &FilterConfig::default(),
        r.expires_at,
    );
    assert!(
        later.result.failed_nodes.contains_key("n1"),
        "{:?}",
        later.result
    );
}

#[test]
fn the_owners_replacement_uses_it_up() {
    let r = reservation("rs-web", Some("h1"), "G1", 20_000, 50);
    let mut state = ClusterState::new();
    state.upsert_node(&node("n1", &["G1"], 40_000, annotated(&r, "e")));
    // A pod of the owner created before the reservation does not use it up.
    let older = pod(
        "older",
        5_000,
        10,
        Some(("rs-web", "h1")),
        r.reserved_at - 1,
    );
    assert!(place(&mut state, &older, &["n1"], NOW).is_ok());
    let other = pod("o", 20_000, 40, None, NOW);
    assert!(place(&mut state, &other, &["n1"], NOW).is_err());
    // The replacement (created after it) is placed on the card: the reservation is spent,
    // the replacement's own slice counts instead.
    let new = pod("new", 20_000, 50, Some(("rs-web", "h1")), NOW);
    assert_eq!(place(&mut state, &new, &["n1"], NOW).unwrap().1, "G1");
    let rest = pod("rest", 15_000, 40, None, NOW);
    assert!(place(&mut state, &rest, &["n1"], NOW).is_ok());
    // Its decision voided (a failed patch): the reservation holds again.
    state.release("new");
    state.release("rest");
    assert!(place(&mut state, &other, &["n1"], NOW).is_err());
}

#[test]
fn the_owner_is_steered_to_its_reserved_card_others_away_from_it() {
    // Spread: n1 holds a small slice and the reservation, n2 is empty. Unsteered, any pod
    // would go to n2; the owner's reservation takes it to n1, and the others to n2.
    let spread = |mut p: Pod| {
        let a = p.metadata.annotations.get_or_insert_with(Default::default);
        a.insert("hami.io/node-scheduler-policy".into(), "spread".into());
        p
    };
    let r = reservation("rs-web", Some("h1"), "G1", 10_000, 30);
    let mut state = ClusterState::new();
    state.upsert_node(&node("n1", &["G1"], 40_000, annotated(&r, "e")));
    state.upsert_node(&node("n2", &["G2"], 40_000, json!({})));
    let x = pod("x", 5_000, 10, None, NOW);
    assert_eq!(place(&mut state, &x, &["n1"], NOW).unwrap().0, "n1");
    let nodes = ["n1", "n2"];
    let other = spread(pod("other", 10_000, 20, None, NOW));
    assert_eq!(place(&mut state, &other, &nodes, NOW).unwrap().0, "n2");
    state.release("other");
    let owner = spread(pod("new", 10_000, 30, Some(("rs-web", "h1")), NOW));
    assert_eq!(
        place(&mut state, &owner, &nodes, NOW),
        Ok(("n1".into(), "G1".into()))
    );
    // Too big for the reserved card (35,000 MiB left there for the owner): placed anywhere
    // else it fits.
    state.release("new");
    let big = spread(pod("big", 36_000, 30, Some(("rs-web", "h1")), NOW));
    assert_eq!(place(&mut state, &big, &nodes, NOW).unwrap().0, "n2");
    // A pod that excludes the reserved card is not steered there.
    state.release("big");
    let mut picky = spread(pod("picky", 10_000, 30, Some(("rs-web", "h1")), NOW));
    if let Some(a) = picky.metadata.annotations.as_mut() {
        a.insert("nvidia.com/nouse-gpuuuid".into(), "G1".into());
    }
    assert_eq!(place(&mut state, &picky, &nodes, NOW).unwrap().0, "n2");
}

#[test]
fn a_malformed_reservation_is_ignored_and_reported_once() {
    let mut state = ClusterState::new();
    let bad = json!({"reservation.defrag.hami.io/e": "{not json"});
    state.upsert_node(&node("n1", &["G1"], 40_000, bad.clone()));
    let problems = state.reservations.take_problems();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("node n1") && problems[0].contains("reservation.defrag.hami.io/e"),
        "{}",
        problems[0]
    );
    // Seen again unchanged (every node update): not reported again, and the node is usable.
    state.upsert_node(&node("n1", &["G1"], 40_000, bad));
    assert!(state.reservations.take_problems().is_empty());
    assert!(place(&mut state, &pod("p", 40_000, 100, None, NOW), &["n1"], NOW).is_ok());
    // Rewritten wrong another way: reported again.
    let empty = json!({"reservation.defrag.hami.io/e": r#"{"owner_uid":"o","owner":"","cards":[],"reserved_at":1,"expires_at":2}"#});
    state.upsert_node(&node("n1", &["G1"], 40_000, empty));
    assert_eq!(state.reservations.take_problems().len(), 1);
    // Removed: the node's entry goes.
    state.upsert_node(&node("n1", &["G1"], 40_000, json!({})));
    assert!(state.reservations.is_empty());
}

#[test]
fn nodes_without_reservations_cost_nothing() {
    let mut state = ClusterState::new();
    state.upsert_node(&node("n1", &["G1"], 40_000, json!({})));
    assert!(state.reservations.is_empty());
    let p = pod("p", 1, 1, Some(("rs", "h")), NOW);
    let out = for_filter(&state, &p, &names(&["n1"]), |n| state.node(n), NOW);
    // Nothing was allocated: an empty map and vector have no capacity.
    assert_eq!((out.charged.capacity(), out.steer.capacity()), (0, 0));
    // A placement records no owner while no node carries a reservation.
    assert!(place(&mut state, &p, &["n1"], NOW).is_ok());
    assert_eq!(state.reservations.uids().count(), 0);
}

#[test]
fn a_deleted_node_or_pod_is_forgotten() {
    let r = reservation("rs-web", None, "G1", 1, 1);
    let mut state = ClusterState::new();
    state.upsert_node(&node("n1", &["G1"], 40_000, annotated(&r, "e")));
    let p = pod("new", 1, 1, Some(("rs-web", "h")), NOW);
    assert!(place(&mut state, &p, &["n1"], NOW).is_ok());
    assert_eq!(state.reservations.uids().count(), 1);
    state.remove_pod("new");
    assert_eq!(state.reservations.uids().count(), 0);
    state.remove_node("n1");
    assert!(state.reservations.is_empty());
}

proptest! {
    /// A non-owner never gets a reserved card's capacity, the owner does: on one card with
    /// `used` MiB/% taken and a reservation in force, a pod fits exactly when its request
    /// fits in what is left — net of the reservation for everyone but the owner.
    #[test]
    fn only_the_owner_gets_the_reserved_capacity(
        used_mem in 0u64..40_000, used_cores in 1u64..100,
        res_mem in 1u64..40_000, res_cores in 0u64..100,
        want_mem in 1u64..40_000, want_cores in 1u64..=100,
        owner in any::<bool>(), expired in any::<bool>(),
    ) {
        let r = reservation("rs-web", Some("h1"), "G1", res_mem, res_cores);
        let mut state = ClusterState::new();
        state.upsert_node(&node("n1", &["G1"], 40_000, annotated(&r, "e")));
        if used_mem > 0 {
            // Another pod's slice, placed by Filter (before the reservation counted for it).
            let filler = pod("filler", used_mem, used_cores, None, NOW);
            prop_assume!(place(&mut state, &filler, &["n1"], r.expires_at).is_ok());
        }
        let now = if expired { r.expires_at } else { NOW };
        let p = if owner {
            pod("p", want_mem, want_cores, Some(("rs-web", "h1")), NOW)
        } else {
            pod("p", want_mem, want_cores, Some(("rs-other", "h1")), NOW)
        };
        let (held_mem, held_cores, shares) = if owner || expired { (0, 0, 0) } else { (res_mem, res_cores, 1) };
        let taken_cores = if used_mem > 0 { used_cores } else { 0 };
        let taken_shares = u32::from(used_mem > 0) + shares;
        // NVIDIA rules (`fit::check`): memory, then cores; 100 % wants the card alone.
        let mem_ok = used_mem + held_mem + want_mem <= 40_000;
        let cores_ok = if want_cores >= 100 {
            taken_shares == 0
        } else {
            taken_cores + held_cores + want_cores <= 100
        };
        let fits = place(&mut state, &p, &["n1"], now).is_ok();
        prop_assert_eq!(fits, mem_ok && cores_ok && taken_shares < 10,
            "owner {} expired {} used {}/{} held {}/{}", owner, expired, used_mem, used_cores, held_mem, held_cores);
    }
}
