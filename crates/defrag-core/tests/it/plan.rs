//! Plans on real card shapes: each target, the protections, stale plans.

use hami_defrag_core::table::render_plan;
use hami_defrag_core::{Constraint, Policy, Protection, Target, apply, plan};
use hami_protocol::names::Vendor;

use crate::fixtures::{Fleet, MI210, MI300X, movable, slice};

/// Two MI210 nodes, every card half taken by two quarter pods: no card takes 3/4.
fn halves() -> Fleet {
    let mut f = Fleet::new();
    f.node("a", &[MI210, MI210]).node("b", &[MI210]);
    for (node, card) in [("a", "a-0"), ("a", "a-1"), ("b", "b-0")] {
        for i in 0..2 {
            let name = format!("{card}-q{i}");
            assert!(f.place(&name, node, card, slice(Vendor::Amd, 16_384, 25), movable()));
        }
    }
    f
}

fn three_quarters() -> Target {
    Target::FitPod {
        pod: "ns/big".into(),
        request: Box::new(slice(Vendor::Amd, 49_152, 75)),
    }
}

#[test]
fn one_move_makes_room_for_a_three_quarter_pod() {
    let f = halves();
    let target = three_quarters();
    assert_eq!(target.shortfall(&f.cluster), 1);
    let p = plan(&f.cluster, &target, &Policy::default()).unwrap();
    assert!(p.reached, "{}", render_plan(&p));
    assert_eq!(p.moves.len(), 1, "{}", render_plan(&p));
    let m = &p.moves[0];
    assert_eq!(m.pdb, "ns/pdb allows 1");
    assert_ne!(m.to.node, p.pod_fits_on.clone().unwrap());
    assert!(m.why.contains("makes room for ns/big"), "{}", m.why);
    let (after, skipped) = apply(&f.cluster, &p);
    assert!(skipped.is_empty(), "{skipped:?}");
    assert_eq!(target.shortfall(&after), 0);
    // Re-planning after applying finds nothing to do.
    let again = plan(&after, &target, &Policy::default()).unwrap();
    assert!(again.reached && again.moves.is_empty());
    let table = render_plan(&p);
    assert!(
        table.contains(&m.pod) && table.contains("reached"),
        "{table}"
    );
}

#[test]
fn pods_without_a_pdb_stay_and_the_plan_says_so() {
    let mut f = halves();
    for pod in &mut f.cluster.pods {
        pod.safety.pdb = None;
    }
    let p = plan(&f.cluster, &three_quarters(), &Policy::default()).unwrap();
    assert!(!p.reached && p.moves.is_empty());
    assert!(
        p.blocked.iter().any(|b| matches!(
            &b.constraint,
            Constraint::Protected {
                protection: Protection::NoPdb,
                ..
            }
        )),
        "{}",
        render_plan(&p)
    );
    assert!(render_plan(&p).contains("no PodDisruptionBudget"));
    // The policy knob lifts it.
    let relaxed = Policy {
        allow_without_pdb: true,
        ..Policy::default()
    };
    let p = plan(&f.cluster, &three_quarters(), &relaxed).unwrap();
    assert!(p.reached);
    assert_eq!(p.moves[0].pdb, "none (allowed by policy)");
}

#[test]
fn a_pod_too_big_for_any_card_is_blocked_by_the_card_not_by_pods() {
    let f = halves();
    let target = Target::FitPod {
        pod: "ns/huge".into(),
        request: Box::new(slice(Vendor::Amd, 100_000, 50)),
    };
    let p = plan(&f.cluster, &target, &Policy::default()).unwrap();
    assert!(!p.reached && p.moves.is_empty());
    assert!(
        p.blocked
            .iter()
            .all(|b| matches!(&b.constraint, Constraint::NeverFits { reason } if reason.contains("CardInsufficientMemory"))),
        "{}",
        render_plan(&p)
    );
}

/// One node of four MI300X, one small pod on each.
fn scattered() -> Fleet {
    let mut f = Fleet::new();
    f.node("n", &[MI300X, MI300X, MI300X, MI300X]);
    for i in 0..4 {
        let card = format!("n-{i}");
        assert!(f.place(
            &format!("p{i}"),
            "n",
            &card,
            slice(Vendor::Amd, 24_536, 12),
            movable()
        ));
    }
    f
}

#[test]
fn freeing_two_whole_cards_moves_two_pods_onto_the_others() {
    let f = scattered();
    let target = Target::FreeWholeCards {
        device_type: "mi300x".into(),
        count: 2,
    };
    assert_eq!(target.shortfall(&f.cluster), 2);
    let p = plan(&f.cluster, &target, &Policy::default()).unwrap();
    assert!(p.reached, "{}", render_plan(&p));
    assert_eq!(p.moves.len(), 2);
    assert_eq!(p.moves.iter().map(|m| m.step).collect::<Vec<_>>(), [0, 1]);
    assert!(p.moves.iter().all(|m| m.gain.contains("emptied")));
    // Both pods are under one budget allowing 1: the second move waits for the first.
    assert_eq!(p.moves[0].pdb, "ns/pdb allows 1");
    assert!(
        p.moves[1].pdb.contains("move 2 under it waits"),
        "{}",
        p.moves[1].pdb
    );
    let (after, skipped) = apply(&f.cluster, &p);
    assert!(skipped.is_empty());
    assert_eq!(target.shortfall(&after), 0);
    assert!(
        plan(&after, &target, &Policy::default())
            .unwrap()
            .moves
            .is_empty()
    );
}

#[test]
fn more_cards_than_exist_is_blocked_by_the_card_count() {
    let f = scattered();
    let target = Target::FreeWholeCards {
        device_type: "MI300X".into(),
        count: 5,
    };
    let p = plan(&f.cluster, &target, &Policy::default()).unwrap();
    assert!(!p.reached);
    assert!(
        p.blocked
            .iter()
            .any(|b| b.constraint == Constraint::NotEnoughCards { exist: 4 }),
        "{}",
        render_plan(&p)
    );
    // It still frees what it can: three cards, all pods on the fourth.
    assert_eq!(p.shortfall_after, 2, "{}", render_plan(&p));
}

#[test]
fn every_card_half_free_or_full() {
    // Four MI300X with one 1/8 pod each: every card 7/8 free, fine at 50 %.
    let f = scattered();
    let half = Target::MinFreeOrFull { percent: 50 };
    assert_eq!(half.shortfall(&f.cluster), 0);
    assert!(
        plan(&f.cluster, &half, &Policy::default())
            .unwrap()
            .moves
            .is_empty()
    );
    // At 90 %, all four miss it: emptying three onto the fourth leaves three idle cards
    // and one 4/8 taken; that one still misses, and nothing is left to improve it.
    let ninety = Target::MinFreeOrFull { percent: 90 };
    assert_eq!(ninety.shortfall(&f.cluster), 4);
    let p = plan(&f.cluster, &ninety, &Policy::default()).unwrap();
    assert_eq!(p.shortfall_after, 1, "{}", render_plan(&p));
    assert_eq!(p.moves.len(), 3);
    let (after, skipped) = apply(&f.cluster, &p);
    assert!(skipped.is_empty());
    assert_eq!(ninety.shortfall(&after), 1);
    assert!(
        plan(&after, &ninety, &Policy::default())
            .unwrap()
            .moves
            .is_empty()
    );
}

#[test]
fn a_stale_plan_skips_the_moves_that_no_longer_match() {
    let f = scattered();
    let target = Target::FreeWholeCards {
        device_type: "MI300X".into(),
        count: 2,
    };
    let p = plan(&f.cluster, &target, &Policy::default()).unwrap();
    // The first moved pod is gone; the second moved already.
    let mut stale = f.cluster.clone();
    stale.pods.retain(|pod| pod.uid != p.moves[0].uid);
    let second = stale
        .pods
        .iter_mut()
        .find(|pod| pod.uid == p.moves[1].uid)
        .unwrap();
    second.node = "elsewhere".into();
    let (_, skipped) = apply(&stale, &p);
    assert_eq!(skipped.len(), 2);
    assert!(
        skipped[0].reason.contains("is gone"),
        "{}",
        skipped[0].reason
    );
    assert!(
        skipped[1].reason.contains("no longer on node n"),
        "{}",
        skipped[1].reason
    );
}

#[test]
fn a_plan_round_trips_through_json_and_yaml() {
    let f = halves();
    let p = plan(&f.cluster, &three_quarters(), &Policy::default()).unwrap();
    let json = serde_json::to_string(&p).unwrap();
    assert_eq!(
        serde_json::from_str::<hami_defrag_core::Plan>(&json).unwrap(),
        p
    );
    let yaml = serde_saphyr::to_string(&p).unwrap();
    assert_eq!(
        serde_saphyr::from_str::<hami_defrag_core::Plan>(&yaml).unwrap(),
        p
    );
    let policy: Policy = serde_json::from_str(r#"{"min_age_seconds": 0}"#).unwrap();
    assert_eq!(policy.max_moves, Policy::default().max_moves);
}

#[test]
fn a_target_or_policy_that_makes_no_sense_says_what_to_write() {
    let f = halves();
    let cases = [
        (
            Target::MinFreeOrFull { percent: 0 },
            Policy::default(),
            "target.percent",
        ),
        (
            Target::MinFreeOrFull { percent: 101 },
            Policy::default(),
            "target.percent",
        ),
        (
            Target::FreeWholeCards {
                device_type: " ".into(),
                count: 1,
            },
            Policy::default(),
            "target.device_type",
        ),
        (
            Target::FreeWholeCards {
                device_type: "MI210".into(),
                count: 0,
            },
            Policy::default(),
            "target.count",
        ),
        (
            Target::FitPod {
                pod: "ns/cpu".into(),
                request: Box::new(crate::fixtures::request(serde_json::json!({"cpu": "1"}))),
            },
            Policy::default(),
            "target.pod",
        ),
        (
            three_quarters(),
            Policy {
                max_moves: 0,
                ..Policy::default()
            },
            "policy.max_moves",
        ),
        (
            three_quarters(),
            Policy {
                search_budget: 0,
                ..Policy::default()
            },
            "policy.search_budget",
        ),
    ];
    for (target, policy, field) in cases {
        let err = plan(&f.cluster, &target, &policy).unwrap_err();
        assert_eq!(err.field, field);
        assert!(err.to_string().contains("write"), "{err}");
    }
}

#[test]
fn an_empty_snapshot_says_why_nothing_fits() {
    let f = Fleet::new();
    let p = plan(&f.cluster, &three_quarters(), &Policy::default()).unwrap();
    assert!(!p.reached);
    assert!(render_plan(&p).contains("the snapshot holds no node"));
}

#[test]
fn a_whole_card_pod_takes_the_card_with_the_fewest_moves() {
    // a-0: three 1/8 pods (3 moves to empty), a-1: two 1/4 pods (2), b-0: one 1/8 (1).
    let mut f = Fleet::new();
    f.node("a", &[MI210, MI210]).node("b", &[MI210]);
    let eighth = || slice(Vendor::Amd, 8192, 12);
    for i in 0..3 {
        assert!(f.place(&format!("e{i}"), "a", "a-0", eighth(), movable()));
    }
    for i in 0..2 {
        let quarter = slice(Vendor::Amd, 16_384, 25);
        assert!(f.place(&format!("q{i}"), "a", "a-1", quarter, movable()));
    }
    assert!(f.place("b", "b", "b-0", eighth(), movable()));
    let target = Target::FitPod {
        pod: "ns/whole".into(),
        request: Box::new(slice(Vendor::Amd, 65_536, 100)),
    };
    let p = plan(&f.cluster, &target, &Policy::default()).unwrap();
    assert!(p.reached, "{}", render_plan(&p));
    assert_eq!(p.moves.len(), 1, "{}", render_plan(&p));
    assert_eq!(p.moves[0].pod, "ns/b");
    assert_eq!(p.pod_fits_on.as_deref(), Some("b"));
    // With b's pod protected, a-1's two pods go, not a-0's three.
    f.cluster
        .pods
        .iter_mut()
        .find(|q| q.name == "b")
        .unwrap()
        .safety
        .gang_member = true;
    let p = plan(&f.cluster, &target, &Policy::default()).unwrap();
    assert_eq!(p.moves.len(), 2, "{}", render_plan(&p));
    assert!(
        p.moves.iter().all(|m| m.from.cards[0].card == "a-1"),
        "{}",
        render_plan(&p)
    );
}
