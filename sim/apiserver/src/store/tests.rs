//! The store's unit tests: metadata, preconditions, subresources, patches, finalizers,
//! dry runs, bindings, history expiry and namespace cascades.

use super::*;
use crate::patch::PatchType;
use crate::resources::lookup;
use proptest::prelude::*;

fn pods() -> &'static ResourceType {
    lookup("", "v1", "pods").unwrap()
}
fn cms() -> &'static ResourceType {
    lookup("", "v1", "configmaps").unwrap()
}

fn store() -> Store {
    let mut s = Store::new(100);
    s.ensure_default_namespaces();
    s.take_events();
    s
}

fn pod(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "x"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}})
}

#[test]
fn create_sets_metadata_and_conflicts() {
    let mut s = store();
    let p = s.create(pods(), Some("default"), pod("a")).unwrap();
    assert_eq!(p["metadata"]["namespace"], "default");
    assert_eq!(p["metadata"]["uid"].as_str().unwrap().len(), 36);
    assert_eq!(p["status"]["phase"], "Pending");
    assert_eq!(
        p["metadata"]["resourceVersion"],
        s.resource_version().to_string()
    );
    assert_eq!(
        s.create(pods(), Some("default"), pod("a"))
            .unwrap_err()
            .code,
        409
    );
    assert_eq!(
        s.create(pods(), Some("nope"), pod("a")).unwrap_err().code,
        404
    );
    assert_eq!(
        s.create(pods(), Some("default"), pod("Bad_Name"))
            .unwrap_err()
            .code,
        422
    );
    let mut wrong = pod("b");
    wrong["kind"] = json!("ConfigMap");
    assert_eq!(
        s.create(pods(), Some("default"), wrong).unwrap_err().code,
        400
    );
    let g = s
        .create(
            cms(),
            Some("default"),
            json!({"metadata": {"generateName": "cm-"}}),
        )
        .unwrap();
    assert!(g["metadata"]["name"].as_str().unwrap().starts_with("cm-"));
    assert_eq!(s.take_events().len(), 2);
}

#[test]
fn update_requires_current_resource_version() {
    let mut s = store();
    let c = s
        .create(
            cms(),
            Some("default"),
            json!({"metadata": {"name": "c"}, "data": {"a": "1"}}),
        )
        .unwrap();
    let mut stale = (*c).clone();
    stale["data"]["a"] = json!("2");
    let u = s
        .update(cms(), "default", "c", stale.clone(), Subresource::Main)
        .unwrap();
    assert_ne!(
        u["metadata"]["resourceVersion"],
        c["metadata"]["resourceVersion"]
    );
    stale["data"]["a"] = json!("3");
    assert_eq!(
        s.update(cms(), "default", "c", stale, Subresource::Main)
            .unwrap_err()
            .reason,
        "Conflict"
    );
    // No-op updates keep the resourceVersion.
    let same = s
        .update(cms(), "default", "c", (*u).clone(), Subresource::Main)
        .unwrap();
    assert_eq!(
        same["metadata"]["resourceVersion"],
        u["metadata"]["resourceVersion"]
    );
}

#[test]
fn status_subresource_separation() {
    let mut s = store();
    let p = s.create(pods(), Some("default"), pod("a")).unwrap();
    let mut m = (*p).clone();
    m["status"]["phase"] = json!("Running");
    m["metadata"]["labels"]["x"] = json!("y");
    let main = s
        .update(pods(), "default", "a", m.clone(), Subresource::Main)
        .unwrap();
    assert_eq!(main["status"]["phase"], "Pending");
    assert_eq!(main["metadata"]["labels"]["x"], "y");
    m["metadata"]["resourceVersion"] = main["metadata"]["resourceVersion"].clone();
    m["metadata"]["labels"]["x"] = json!("z");
    m["metadata"]["annotations"] = json!({"hami.io/dra-quota-charge": "forged"});
    m["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "o", "uid": "u"}]);
    m["metadata"]["generation"] = json!(7);
    m["spec"]["activeDeadlineSeconds"] = json!(5);
    m["status"].as_object_mut().unwrap().remove("qosClass");
    let st = s
        .update(pods(), "default", "a", m, Subresource::Status)
        .unwrap();
    assert_eq!(st["status"]["phase"], "Running");
    // podStatusStrategy keeps the write's labels and annotations (so admission must see
    // status writes), but resets the spec, the ownerReferences and the generation, and
    // backfills a cleared qosClass.
    assert_eq!(st["metadata"]["labels"]["x"], "z");
    assert_eq!(
        st["metadata"]["annotations"]["hami.io/dra-quota-charge"],
        "forged"
    );
    assert!(st.pointer("/metadata/ownerReferences").is_none());
    assert_eq!(st["metadata"]["generation"], main["metadata"]["generation"]);
    assert!(st.pointer("/spec/activeDeadlineSeconds").is_none());
    assert_eq!(st["status"]["qosClass"], main["status"]["qosClass"]);
    assert_eq!(st["metadata"]["uid"], main["metadata"]["uid"]);
}

#[test]
fn node_status_write_keeps_metadata_but_not_spec() {
    let mut s = store();
    let nodes = lookup("", "v1", "nodes").unwrap();
    let n = s
        .create(
            nodes,
            None,
            json!({"metadata": {"name": "n"}, "spec": {"unschedulable": true}}),
        )
        .unwrap();
    let mut m = (*n).clone();
    m["metadata"]["annotations"] = json!({"a": "b"});
    m["spec"] = json!({});
    m["status"] = json!({"capacity": {"cpu": "4"}});
    let st = s.update(nodes, "", "n", m, Subresource::Status).unwrap();
    assert_eq!(st["metadata"]["annotations"]["a"], "b");
    assert_eq!(st["spec"]["unschedulable"], true);
    assert_eq!(st["status"]["capacity"]["cpu"], "4");
}

#[test]
fn other_status_writes_keep_the_stored_metadata() {
    // Custom resources' and claims' status strategies copy the old object and set only the
    // status; a PDB's keeps its labels too. The stand-in keeps all stored metadata for these.
    let mut s = store();
    let pdbs = lookup("policy", "v1", "poddisruptionbudgets").unwrap();
    let p = s
        .create(
            pdbs,
            Some("default"),
            json!({"metadata": {"name": "p"}, "spec": {"minAvailable": 1}}),
        )
        .unwrap();
    let mut m = (*p).clone();
    m["metadata"]["labels"] = json!({"x": "y"});
    m["status"] = json!({"currentHealthy": 1});
    let st = s
        .update(pdbs, "default", "p", m, Subresource::Status)
        .unwrap();
    assert_eq!(st["status"]["currentHealthy"], 1);
    assert!(st.pointer("/metadata/labels/x").is_none());
}

#[test]
fn patch_precondition_and_apply_create() {
    let mut s = store();
    let c = s
        .create(cms(), Some("default"), json!({"metadata": {"name": "c"}}))
        .unwrap();
    let rv = c["metadata"]["resourceVersion"].clone();
    let ok = s
        .patch(
            cms(),
            "default",
            "c",
            PatchType::Merge,
            &json!({"metadata": {"resourceVersion": rv}, "data": {"k": "v"}}),
            Subresource::Main,
        )
        .unwrap();
    assert_eq!(ok["data"]["k"], "v");
    let err = s
        .patch(
            cms(),
            "default",
            "c",
            PatchType::Merge,
            &json!({"metadata": {"resourceVersion": rv}, "data": {"k": "w"}}),
            Subresource::Main,
        )
        .unwrap_err();
    assert_eq!(err.code, 409);
    let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "n"}, "data": {"a": "b"}});
    let created = s
        .patch(
            cms(),
            "default",
            "n",
            PatchType::Apply,
            &body,
            Subresource::Main,
        )
        .unwrap();
    assert_eq!(created["data"]["a"], "b");
    assert_eq!(
        s.patch(
            cms(),
            "default",
            "zz",
            PatchType::Merge,
            &json!({}),
            Subresource::Main
        )
        .unwrap_err()
        .code,
        404
    );
}

#[test]
fn finalizers_delay_deletion() {
    let mut s = store();
    s.create(
        cms(),
        Some("default"),
        json!({"metadata": {"name": "c", "finalizers": ["a/b"]}}),
    )
    .unwrap();
    let d = s
        .delete(cms(), "default", "c", &DeleteOptions::default())
        .unwrap();
    assert!(d["metadata"]["deletionTimestamp"].is_string());
    assert!(s.get(cms(), "default", "c").is_ok());
    s.patch(
        cms(),
        "default",
        "c",
        PatchType::Merge,
        &json!({"metadata": {"finalizers": null}}),
        Subresource::Main,
    )
    .unwrap();
    assert_eq!(s.get(cms(), "default", "c").unwrap_err().code, 404);
    let evs = s.take_events();
    assert_eq!(
        evs.iter().map(|e| e.event_type).collect::<Vec<_>>(),
        vec![EventType::Added, EventType::Modified, EventType::Deleted]
    );
}

#[test]
fn dry_run_changes_nothing() {
    let mut s = store();
    let rv = s.resource_version();
    s.ctx.dry_run = true;
    let p = s.create(pods(), Some("default"), pod("a")).unwrap();
    assert_eq!(p["metadata"]["uid"].as_str().unwrap().len(), 36);
    assert_eq!(
        s.create(pods(), Some("default"), pod("Bad"))
            .unwrap_err()
            .code,
        422
    );
    s.ctx.dry_run = false;
    assert!(s.get(pods(), "default", "a").is_err());
    assert_eq!(s.resource_version(), rv);
    assert!(s.take_events().is_empty());
}

#[test]
fn binding_once() {
    let mut s = store();
    s.create(pods(), Some("default"), pod("a")).unwrap();
    let b = json!({"target": {"kind": "Node", "name": "n1"}});
    let p = s.bind("default", "a", &b).unwrap();
    assert_eq!(p["spec"]["nodeName"], "n1");
    assert_eq!(s.bind("default", "a", &b).unwrap_err().code, 409);
}

#[test]
fn history_expiry() {
    let mut s = Store::new(3);
    s.ensure_default_namespaces();
    assert!(s.events_since(cms(), 0).is_err());
    let rv = s.resource_version();
    s.create(cms(), Some("default"), json!({"metadata": {"name": "c"}}))
        .unwrap();
    assert_eq!(s.events_since(cms(), rv).unwrap().len(), 1);
    s.expire_history();
    assert_eq!(s.events_since(cms(), rv).unwrap_err().code, 410);
    assert!(
        s.events_since(cms(), s.resource_version())
            .unwrap()
            .is_empty()
    );
}

#[test]
fn namespace_delete_cascades() {
    let mut s = store();
    let nsr = lookup("", "v1", "namespaces").unwrap();
    s.create(nsr, None, json!({"metadata": {"name": "t"}}))
        .unwrap();
    s.create(cms(), Some("t"), json!({"metadata": {"name": "c"}}))
        .unwrap();
    s.delete(nsr, "", "t", &DeleteOptions::default()).unwrap();
    assert_eq!(
        s.delete(nsr, "", "kube-system", &DeleteOptions::default())
            .unwrap_err()
            .code,
        403
    );
    assert!(s.get(cms(), "t", "c").is_err());
}

proptest! {
    // Paging with any limit returns every matching object exactly once, in order.
    #[test]
    fn pagination_is_complete(n in 0usize..40, limit in 1usize..10, labelled in proptest::collection::vec(any::<bool>(), 40)) {
        let mut s = store();
        for (i, l) in labelled.iter().enumerate().take(n) {
            let ns = if i % 2 == 0 { "default" } else { "kube-system" };
            let mut c = json!({"metadata": {"name": format!("c{i:02}")}});
            if *l { c["metadata"]["labels"] = json!({"l": "y"}); }
            s.create(cms(), Some(ns), c).unwrap();
        }
        let opts = ListOptions { labels: LabelSelector::parse("l=y").unwrap(), ..Default::default() };
        let all = s.list(cms(), None, &opts).unwrap().items;
        let mut paged = Vec::new();
        let mut token = None;
        loop {
            let o = ListOptions { limit: Some(limit), continue_token: token.clone(), ..opts.clone() };
            let page = s.list(cms(), None, &o).unwrap();
            prop_assert!(page.items.len() <= limit);
            paged.extend(page.items);
            token = page.continue_token;
            if token.is_none() { break; }
        }
        let json = |v: &[Arc<StoredObject>]| v.iter().map(|o| o.json.to_string()).collect::<Vec<_>>();
        prop_assert_eq!(json(&paged), json(&all));
        prop_assert_eq!(all.len(), (0..n).filter(|i| labelled[*i]).count());
        let one_ns = s.list(cms(), Some("default"), &opts).unwrap().items;
        prop_assert!(one_ns.iter().all(|o| o.namespace() == "default"));
    }
}
