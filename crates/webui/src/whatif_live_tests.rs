//! What-if from the live cluster (issue 31 item 8) and the defrag plan in the UI (issue 32
//! item 2): the edits' before/after, the plan, and every bad input refused with what to
//! change, over a small fleet of MI210 nodes shaped like the demo's.

use hami_protocol::names::Vendor;
use hami_protocol::node_register::DeviceInfo;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use crate::defrag_view::{self, DefragForm, Goal};
use crate::fixtures::*;
use crate::whatif::Limits;
use crate::whatif_live::{self, Edits, Outcome, Snapshot};
use crate::whatif_live_page::{Choices, Filled, Shown, page};
use crate::world::World;

/// One MI210 (64 GiB, 104 CUs) named `id`.
fn card(id: &str) -> DeviceInfo {
    let (node, _) = captures();
    let mut c = amd_entries(&node)[0].clone();
    c.id = id.into();
    c.index = 0;
    c
}

/// A pod of ReplicaSet `rs` holding `mib` of node `node`'s card.
fn running(name: &str, node: &str, mib: u64, rs: &str) -> Pod {
    let c = card(&format!("{node}-card"));
    let mut pod = plugin_pod(
        "default",
        name,
        node,
        Vendor::Amd,
        (&c.id, &c.device_type),
        (mib, 26),
    );
    // A quarter of the card's compute (26 of 104 CUs), as granted: without a compute
    // limit a pod asks for the whole card's.
    let limits = &mut pod.spec.as_mut().unwrap().containers[0]
        .resources
        .as_mut()
        .unwrap()
        .limits;
    limits.as_mut().unwrap().insert(
        Vendor::Amd.names().resource_cores.into(),
        k8s_openapi::apimachinery::pkg::api::resource::Quantity("25".into()),
    );
    pod.metadata.owner_references = Some(vec![
        serde_json::from_value(json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "name": rs, "uid": format!("uid-{rs}"), "controller": true}))
        .unwrap(),
    ]);
    pod
}

/// A pod waiting unbound for `mib` of one AMD GPU.
fn waiting(name: &str, mib: u64, priority: i32, created: &str) -> Pod {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
            "creationTimestamp": created},
        "spec": {"schedulerName": "hami-scheduler", "priority": priority,
            "containers": [{"name": "c", "image": "app", "resources": {"limits": {
                "amd.com/gpu": "1", "amd.com/gpumem": mib.to_string()}}}]},
        "status": {"phase": "Pending"}}))
    .unwrap()
}

/// n1 and n2, one MI210 each, 32 GiB taken on each by two replicas of `web`; a DRA node;
/// `wait` (48 GiB) waits.
fn fleet() -> World {
    let mut w = World::default();
    for n in ["n1", "n2"] {
        w.upsert_node(plugin_node(n, Vendor::Amd, &[card(&format!("{n}-card"))]));
    }
    w.upsert_node(dra_node("dra-1"));
    w.upsert_pod(running("web-a", "n1", 32768, "web"));
    w.upsert_pod(running("web-b", "n2", 32768, "web"));
    w.upsert_pod(waiting("wait", 49152, 0, "2026-01-01T00:00:00Z"));
    w
}

fn snap(w: &World) -> Snapshot {
    Snapshot::of(w, 1_800_000_000)
}

fn edits(body: &str, s: &Snapshot) -> Result<Edits, crate::whatif::Problem> {
    whatif_live::edits_from_form(body.as_bytes(), s, &Limits::default())
}

fn run(s: &Snapshot, e: &Edits) -> whatif_live::LiveReport {
    whatif_live::run(s, e, &Limits::default(), &|| false)
        .unwrap()
        .unwrap()
}

#[test]
fn nodes_like_one_you_have_place_the_waiting_pod() {
    let w = fleet();
    let s = snap(&w);
    assert_eq!(s.nodes.len(), 2, "the DRA node is not planned on");
    let e = edits("add=2&like=n1", &s).unwrap();
    assert_eq!(e.add, Some((2, "n1".to_owned())));
    let r = run(&s, &e);
    assert_eq!((r.nodes, r.gpus), ((2, 4), (2, 4)));
    assert_eq!(r.added, ["n1-whatif-1", "n1-whatif-2"]);
    assert_eq!(r.rows.len(), 1);
    let row = &r.rows[0];
    assert_eq!(row.pod, "default/wait");
    assert!(
        matches!(&row.before, Some(Outcome::Waits { reason }) if !reason.is_empty()),
        "{row:?}"
    );
    match &row.after {
        Outcome::Placed { node, cards } => {
            assert!(node.starts_with("n1-whatif-"), "{node}");
            assert_eq!(cards[0].mem_mib, 49152);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(r.placed(), (0, 1));
    let html = page(
        &Choices::of(&s),
        &Filled::default(),
        &Shown::Live(Ok(r)),
        &[],
    )
    .html;
    assert!(
        html.contains("Of 1 waiting pod(s), 0 would be placed now and 1 after the edits"),
        "{html}"
    );
    assert!(
        html.contains("<strong>placed</strong> on <a href=\"/nodes/n1-whatif-1\">"),
        "{html}"
    );
}

#[test]
fn a_removed_nodes_gpu_pods_are_planned_again_in_queue_order() {
    let mut w = fleet();
    // A more urgent pod, created later (and named after `wait`): planned first, so it
    // takes the new node.
    w.upsert_pod(waiting("z-urgent", 49152, 1000, "2026-02-01T00:00:00Z"));
    let s = snap(&w);
    let r = run(&s, &edits("remove=n2&add=1&like=n2", &s).unwrap());
    assert_eq!(r.nodes, (2, 2));
    assert_eq!(r.removed, ["n2"]);
    let names: Vec<(&str, Option<&str>)> = r
        .rows
        .iter()
        .map(|row| (row.pod.as_str(), row.from.as_deref()))
        .collect();
    assert_eq!(
        names,
        [
            ("default/z-urgent", None),
            ("default/wait", None),
            ("default/web-b", Some("n2"))
        ]
    );
    assert!(
        matches!(&r.rows[0].after, Outcome::Placed { node, .. } if node == "n2-whatif-1"),
        "{:?}",
        r.rows
    );
    // web-b's 32 GiB no longer fits n2-whatif-1 (48 GiB taken) nor n1 (32 GiB free, yes).
    assert!(
        matches!(&r.rows[2].after, Outcome::Placed { node, .. } if node == "n1"),
        "{:?}",
        r.rows[2]
    );
    assert!(!r.rows[1].after.placed(), "{:?}", r.rows[1]);
    assert_eq!(r.rows[2].before, None);

    // A removed node's pod of higher priority than those waiting is planned before them:
    // web-b (40 GiB, priority 2000; n1 has 32 GiB free) takes the new node.
    let mut b = running("web-b", "n2", 40960, "web");
    b.spec.as_mut().unwrap().priority = Some(2000);
    w.upsert_pod(b);
    let s = snap(&w);
    let r = run(&s, &edits("remove=n2&add=1&like=n2", &s).unwrap());
    assert!(
        matches!(&r.rows[2].after, Outcome::Placed { node, .. } if node == "n2-whatif-1"),
        "{:?}",
        r.rows
    );
    assert!(!r.rows[0].after.placed(), "{:?}", r.rows[0]);
    // Asked to stop: nothing.
    let e = edits("remove=n2", &s).unwrap();
    assert_eq!(
        whatif_live::run(&s, &e, &Limits::default(), &|| true).unwrap(),
        None
    );
}

#[test]
fn bad_edits_say_what_to_change() {
    let w = fleet();
    let s = snap(&w);
    let refused = |body: &str| edits(body, &s).unwrap_err();
    let cases: [(&str, u16, &str); 13] = [
        (
            "add=1&like=n9",
            400,
            "like=\"n9\": the cluster has no node of that name",
        ),
        ("add=0&like=n1", 400, "add=0 adds no node: write 1 to 100"),
        ("add=-3&like=n1", 400, "cannot be negative"),
        ("add=abc&like=n1", 400, "is not a whole number"),
        ("add=1.5&like=n1", 400, "is not a whole number"),
        (
            "add=101&like=n1",
            413,
            "the UI adds at most 100 nodes at once",
        ),
        (
            "add=99999999999999999999999&like=n1",
            413,
            "at most 100 nodes",
        ),
        ("like=n1", 400, "say how many nodes like it to add"),
        ("add=2", 400, "say which node the new ones are like"),
        (
            "remove=gone",
            400,
            "remove=\"gone\": the cluster has no node",
        ),
        ("remove=dra-1", 400, "runs the AMD DRA driver"),
        ("add=1&like=dra-1", 400, "runs the AMD DRA driver"),
        ("add=%ZZ", 400, "not valid form encoding"),
    ];
    for (body, status, text) in cases {
        let p = refused(body);
        assert_eq!(p.status, status, "{body}: {p:?}");
        assert!(p.message.contains(text), "{body}: {p:?}");
    }
    let many: String = (0..40).map(|i| format!("x{i},")).collect();
    let p = refused(&format!("remove={many}"));
    assert!(p.status == 413 && p.message.contains("at most 32"), "{p:?}");
    let p = whatif_live::edits_from_form(&vec![b'a'; 20_000], &s, &Limits::default()).unwrap_err();
    assert_eq!(p.status, 413, "{p:?}");
    let p = whatif_live::edits_from_form(b"like=\xff", &s, &Limits::default()).unwrap_err();
    assert!(p.message.contains("UTF-8"), "{p:?}");
    // The node cap of the What-if limits holds for the fleet after the edits.
    let small = Limits {
        max_nodes: 3,
        ..Limits::default()
    };
    let p = whatif_live::edits_from_form(b"add=2&like=n1", &s, &small).unwrap_err();
    assert!(p.status == 413 && p.message.contains("4 nodes"), "{p:?}");
    // Names are listed once; a comma list is several nodes.
    assert_eq!(
        edits("remove=n1,n2&remove=n1", &s).unwrap().remove,
        ["n1", "n2"]
    );
    // Every echoed field and message is escaped.
    let body = "add=1&like=%3Cscript%3Ealert(1)%3C%2Fscript%3E";
    let p = edits(body, &s).unwrap_err();
    let filled = Filled(crate::whatif_live::form_fields(body.as_bytes()).unwrap());
    let html = page(&Choices::of(&s), &filled, &Shown::Live(Err(p)), &[]).html;
    assert!(!html.contains("<script>alert"), "{html}");
    assert!(html.contains("&lt;script&gt;alert(1)"), "{html}");
}

/// Budgets the UI could not list.
fn unread() -> defrag_view::Budgets {
    defrag_view::Budgets::Unread("not listed in this test".into())
}

fn defrag(s: &Snapshot, body: &str) -> Result<defrag_view::Planned, crate::whatif::Problem> {
    let form = defrag_view::form_from_body(body.as_bytes())?;
    defrag_view::plan(s, &unread(), &form, &Limits::default())
}

#[test]
fn a_defrag_plan_makes_room_for_the_pending_pod() {
    let w = fleet();
    let s = snap(&w);
    let planned = defrag(&s, "target=pod&pod=default%2Fwait").unwrap();
    let plan = &planned.plan;
    assert!(plan.reached, "{plan:?}");
    assert_eq!(plan.moves.len(), 1, "{plan:?}");
    let m = &plan.moves[0];
    assert!(
        m.pod == "default/web-a" || m.pod == "default/web-b",
        "{m:?}"
    );
    assert_ne!(m.from.node, m.to.node);
    assert_eq!(plan.pod_fits_on.as_deref(), Some(m.from.node.as_str()));
    assert_eq!(
        planned.commands,
        [
            "hami defrag plan --pending-pod default/wait -o yaml > defrag-plan.yaml",
            "hami defrag apply defrag-plan.yaml",
            "hami defrag apply defrag-plan.yaml --execute"
        ]
    );
    let html = page(
        &Choices::of(&s),
        &Filled::default(),
        &Shown::Defrag(Ok(planned)),
        &[],
    )
    .html;
    assert!(
        html.contains("<strong>reached</strong> (1 move(s), shortfall 1 → 0)"),
        "{html}"
    );
    assert!(html.contains("<th scope=\"col\">PDB</th>"), "{html}");
    assert!(
        html.contains("-o yaml &gt; defrag-plan.yaml\nhami defrag apply"),
        "{html}"
    );
    assert!(html.contains("<option value=\"default/wait\">"), "{html}");

    // The only replica of its owner stays unless allowed; the plan says which pod blocks.
    let mut w = fleet();
    w.upsert_pod(running("web-a", "n1", 32768, "solo-a"));
    w.upsert_pod(running("web-b", "n2", 32768, "solo-b"));
    let s = snap(&w);
    let planned = defrag(&s, "target=pod&pod=default%2Fwait").unwrap();
    assert!(!planned.plan.reached);
    assert!(
        planned.plan.blocked.iter().any(|b| matches!(
            &b.constraint,
            hami_defrag_core::Constraint::Protected { .. }
        )),
        "{:?}",
        planned.plan
    );
    assert_eq!(planned.protected.len(), 2, "{:?}", planned.protected);
    let planned = defrag(
        &s,
        "target=pod&pod=default%2Fwait&single=on&max_moves=4&min_age=60",
    )
    .unwrap();
    assert!(planned.plan.reached, "{:?}", planned.plan);
    assert_eq!(
        planned.commands[0],
        "hami defrag plan --pending-pod default/wait --max-moves 4 --allow-single-replica --min-age-seconds 60 -o yaml > defrag-plan.yaml"
    );
    assert_eq!(
        planned.commands[2],
        "hami defrag apply defrag-plan.yaml --allow-single-replica --min-age-seconds 60 --execute"
    );
}

#[test]
fn an_unreachable_target_names_the_constraint() {
    let mut w = fleet();
    w.upsert_pod(waiting("huge", 200_000, 0, "2026-01-01T00:00:00Z"));
    let s = snap(&w);
    let planned = defrag(&s, "target=pod&pod=default%2Fhuge").unwrap();
    assert!(!planned.plan.reached);
    let html = page(
        &Choices::of(&s),
        &Filled::default(),
        &Shown::Defrag(Ok(planned)),
        &[],
    )
    .html;
    assert!(html.contains("<strong>NOT reached</strong>"), "{html}");
    assert!(
        html.contains("the pod does not fit even on the empty node"),
        "{html}"
    );
    // More whole cards than exist.
    let planned = defrag(&s, "target=cards&type=MI210&count=3").unwrap();
    assert!(!planned.plan.reached);
    assert!(
        planned.plan.blocked.iter().any(|b| matches!(
            b.constraint,
            hami_defrag_core::Constraint::NotEnoughCards { exist: 2 }
        )),
        "{:?}",
        planned.plan
    );
    assert_eq!(
        planned.commands[0],
        "hami defrag plan --free-cards 3 --type MI210 -o yaml > defrag-plan.yaml"
    );
    let planned = defrag(&s, "target=percent&percent=50%25").unwrap();
    assert!(planned.plan.target.contains("50 %"), "{:?}", planned.plan);
}

#[test]
fn bad_defrag_targets_say_what_to_change() {
    let mut w = fleet();
    w.upsert_pod(running("placed", "n1", 1024, "web"));
    let s = snap(&w);
    let cases: [(&str, u16, &str); 15] = [
        (
            "target=pod&pod=default%2Fgone",
            400,
            "pod default/gone is no longer in the cluster",
        ),
        (
            "target=pod&pod=default%2Fplaced",
            400,
            "no longer waits: it runs on node n1",
        ),
        ("target=pod&pod=nonamespace", 400, "as NAMESPACE/NAME"),
        ("target=pod", 400, "pick the pending pod"),
        (
            "target=cards&type=MI210&count=0",
            400,
            "count=0: write how many",
        ),
        (
            "target=cards&type=MI210&count=-1",
            400,
            "cannot be negative",
        ),
        (
            "target=cards&type=MI210&count=lots",
            400,
            "is not a whole number",
        ),
        ("target=cards&type=MI210&count=5000", 413, "at most 4096"),
        (
            "target=cards&count=2",
            400,
            "type: write part of the registered card type",
        ),
        ("target=percent&percent=0", 400, "1 to 100"),
        ("target=percent&percent=101", 400, "at most 100"),
        ("target=percent&percent=50&max_moves=0", 400, "max_moves=0"),
        (
            "target=percent&percent=50&min_age=soon",
            400,
            "min_age=\"soon\"",
        ),
        (
            "target=everything",
            400,
            "choose one of pod, cards, percent",
        ),
        ("", 400, "choose one of pod, cards, percent"),
    ];
    for (body, status, text) in cases {
        let p = defrag(&s, body).unwrap_err();
        assert_eq!(p.status, status, "{body}: {p:?}");
        assert!(p.message.contains(text), "{body}: {p:?}");
    }
    // A type that needs quoting is quoted for the shell, then escaped for the page.
    let form = DefragForm {
        goal: Goal::Cards {
            device_type: "MI'<b>".into(),
            count: 1,
        },
        allow_single_replica: false,
        allow_without_pdb: false,
        max_moves: 32,
        min_age_seconds: 600,
    };
    let planned = defrag_view::plan(&s, &unread(), &form, &Limits::default()).unwrap();
    assert_eq!(
        planned.commands[0],
        "hami defrag plan --free-cards 1 --type 'MI'\\''<b>' -o yaml > defrag-plan.yaml"
    );
    let html = page(
        &Choices::of(&s),
        &Filled::default(),
        &Shown::Defrag(Ok(planned)),
        &[],
    )
    .html;
    assert!(!html.contains("<b>'"), "{html}");
}

/// The live plans run on the What-if runner (a blocking thread, one of its slots) under its
/// deadline: past it, the answer says so and what to change; the runtime stays free.
#[tokio::test]
async fn live_plans_run_under_the_runners_deadline() {
    use crate::whatif_run::Runner;
    let w = fleet();
    let s = snap(&w);
    let e = edits("add=1&like=n1", &s).unwrap();
    let runner = Runner::new(Limits::default());
    let (snap2, e2) = (s.clone(), e.clone());
    let report = runner
        .run(move |stop, limits| whatif_live::job(&snap2, &e2, limits, stop))
        .await
        .unwrap();
    assert_eq!(report.placed(), (0, 1));
    let late = Runner::new(Limits {
        deadline: std::time::Duration::ZERO,
        ..Limits::default()
    });
    let (snap2, e2) = (s.clone(), e.clone());
    let p = late
        .run(move |stop, limits| whatif_live::job(&snap2, &e2, limits, stop))
        .await
        .unwrap_err();
    assert!(
        p.status == 413 && p.message.contains("stopped after 0 s"),
        "{p:?}"
    );
    let form = defrag_view::form_from_body(b"target=percent&percent=50").unwrap();
    let p = late
        .run(move |stop, limits| defrag_view::job(&s, &unread(), &form, limits, stop))
        .await
        .unwrap_err();
    assert!(
        p.status == 413 && p.message.contains("did not start within 0 s"),
        "{p:?}"
    );
}

proptest::proptest! {
    /// Any form body, whatever its bytes: the edits and the defrag form are read within
    /// their bounds, or refused (400 or 413) with a message; nothing panics.
    #[test]
    fn any_form_body_is_read_or_refused(
        body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256),
        fields in proptest::collection::vec(
            (
                proptest::sample::select(vec![
                    "add", "like", "remove", "target", "pod", "type", "count", "percent",
                    "single", "max_moves", "min_age",
                ]),
                "[-0-9a-z%/,+ ]{0,24}",
            ),
            0..8,
        ),
    ) {
        let w = fleet();
        let s = snap(&w);
        let form: String = fields
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("&");
        for body in [body.as_slice(), form.as_bytes()] {
            match whatif_live::edits_from_form(body, &s, &Limits::default()) {
                Ok(e) => {
                    proptest::prop_assert!(e.add.as_ref().is_none_or(|(n, _)| (1..=whatif_live::MAX_ADDED).contains(n)));
                    proptest::prop_assert!(e.remove.len() <= whatif_live::MAX_REMOVED);
                }
                Err(p) => proptest::prop_assert!(
                    matches!(p.status, 400 | 413) && !p.message.trim().is_empty(),
                    "{p:?}"
                ),
            }
            match defrag_view::form_from_body(body) {
                Ok(f) => {
                    proptest::prop_assert!((1..=defrag_view::MAX_MOVES).contains(&f.max_moves));
                    proptest::prop_assert!(f.min_age_seconds <= defrag_view::MAX_MIN_AGE);
                }
                Err(p) => proptest::prop_assert!(
                    matches!(p.status, 400 | 413) && !p.message.trim().is_empty(),
                    "{p:?}"
                ),
            }
        }
    }
}

/// The forms offer the device-plugin nodes and the pods waiting for a GPU only: not a DRA
/// node, not a waiting pod that asks no GPU, not a finished one.
#[test]
fn the_forms_offer_plugin_nodes_and_gpu_pods_that_wait() {
    let mut w = fleet();
    let mut cpu = waiting("cpu-only", 1, 0, "2026-01-01T00:00:00Z");
    cpu.spec.as_mut().unwrap().containers[0].resources = None;
    w.upsert_pod(cpu);
    let mut done = waiting("done", 1024, 0, "2026-01-01T00:00:00Z");
    done.status.as_mut().unwrap().phase = Some("Succeeded".into());
    w.upsert_pod(done);
    let choices = Choices::of_world(&w);
    assert_eq!(choices.nodes, ["n1", "n2"]);
    assert_eq!(choices.waiting, ["default/wait"]);
    let from_snapshot = Choices::of(&snap(&w));
    assert_eq!(
        (from_snapshot.nodes, from_snapshot.waiting),
        (choices.nodes, choices.waiting)
    );
}

/// With the budgets listed, each move shows its budget, and a pod no budget covers stays
/// unless the form allows it (`--allow-without-pdb`); without them the page says so.
#[test]
fn budgets_decide_the_moves_and_are_shown() {
    let mut w = fleet();
    for name in ["web-a", "web-b"] {
        let mut p = running(
            name,
            if name == "web-a" { "n1" } else { "n2" },
            32768,
            "web",
        );
        p.metadata.labels = Some([("app".to_owned(), "web".to_owned())].into());
        w.upsert_pod(p);
    }
    let s = snap(&w);
    let budget = |allowed: i32| -> k8s_openapi::api::policy::v1::PodDisruptionBudget {
        serde_json::from_value(
            json!({"metadata": {"name": "web-pdb", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "web"}}},
            "status": {"disruptionsAllowed": allowed, "currentHealthy": 2, "desiredHealthy": 1,
                "expectedPods": 2}}),
        )
        .unwrap()
    };
    let plan_with = |budgets: Vec<_>, body: &str| {
        let form = defrag_view::form_from_body(body.as_bytes()).unwrap();
        defrag_view::plan(
            &s,
            &defrag_view::Budgets::Read(budgets),
            &form,
            &Limits::default(),
        )
        .unwrap()
    };
    let body = "target=pod&pod=default%2Fwait";
    let planned = plan_with(vec![budget(1)], body);
    assert!(planned.plan.reached, "{:?}", planned.plan);
    assert_eq!(planned.plan.moves[0].pdb, "default/web-pdb allows 1");
    let html = page(
        &Choices::of(&s),
        &Filled::default(),
        &Shown::Defrag(Ok(planned)),
        &[],
    )
    .html;
    assert!(html.contains("<td>default/web-pdb allows 1</td>"), "{html}");
    assert!(!html.contains("were not read"), "{html}");
    // A budget that allows no disruption now: the pods stay, and the plan says why.
    let planned = plan_with(vec![budget(0)], body);
    assert!(!planned.plan.reached);
    assert!(
        planned
            .protected
            .values()
            .all(|why| why.contains("web-pdb")),
        "{:?}",
        planned.protected
    );
    // No budget: they stay unless allowed, as `hami defrag plan` decides.
    assert!(!plan_with(vec![], body).plan.reached);
    let planned = plan_with(vec![], &format!("{body}&nopdb=on"));
    assert!(planned.plan.reached, "{:?}", planned.plan);
    assert_eq!(
        planned.commands[0],
        "hami defrag plan --pending-pod default/wait --allow-without-pdb -o yaml > defrag-plan.yaml"
    );
    // Not listed: the preview moves them and says so.
    let planned = defrag(&s, body).unwrap();
    assert!(planned.plan.reached);
    let html = page(
        &Choices::of(&s),
        &Filled::default(),
        &Shown::Defrag(Ok(planned)),
        &[],
    )
    .html;
    assert!(
        html.contains("PodDisruptionBudgets were not read (not listed in this test)")
            && html.contains("<td>not read (the commands below check it)</td>"),
        "{html}"
    );
}
