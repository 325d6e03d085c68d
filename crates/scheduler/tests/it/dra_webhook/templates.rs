//! The templates' life: several shapes tried smallest first, templates no pod uses
//! swept, reused ones stamped, and one swept meanwhile made again.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_shapes_are_tried_smallest_first_and_unused_templates_are_swept() {
    let settings = Settings {
        template_sweep: SweepTuning {
            interval: Duration::from_millis(100),
            grace: Duration::from_millis(500),
        },
        ..Settings::default()
    };
    let c = start(settings).await;
    dra_node(
        &c.client,
        "mi210-node",
        vec![device(0, "AMD Instinct MI210", "64Gi", 104, 0)],
    )
    .await;
    dra_node(
        &c.client,
        "mi300x-node",
        vec![device(0, "AMD Instinct MI300X", "192Gi", 304, 0)],
    )
    .await;
    // Half the memory and a quarter of the CUs of whichever device: MI210 first (32Gi, 26),
    // else MI300X (96Gi, 76).
    let limits = json!({"amd.com/gpumem-percentage": "50", "amd.com/gpucores": "25"});
    wait("the webhook sees both shapes", || async {
        let p = create(&c, &amd_pod("probe", dra(), limits.clone()))
            .await
            .unwrap();
        let name = p.spec.as_ref().unwrap().resource_claims.as_ref().unwrap()[0]
            .resource_claim_template_name
            .clone()
            .unwrap();
        Api::<Pod>::namespaced(c.client.clone(), "default")
            .delete("probe", &DeleteParams::default())
            .await
            .unwrap();
        let t = Api::<ResourceClaimTemplate>::namespaced(c.client.clone(), "default")
            .get(&name)
            .await
            .unwrap();
        let request = &t.spec.spec.devices.unwrap().requests.unwrap()[0];
        request
            .first_available
            .as_ref()
            .is_some_and(|s| s.len() == 2)
    })
    .await;
    let mut placed = Vec::new();
    for i in 0..3 {
        let name = format!("half-{i}");
        create(&c, &amd_pod(&name, dra(), limits.clone()))
            .await
            .unwrap();
        let (pod, claim) = bound(&c, &name).await;
        let node = pod.spec.unwrap().node_name.unwrap();
        let r = results(&claim);
        assert_eq!(r.len(), 1, "{r:?}");
        let expected = match node.as_str() {
            "mi210-node" => ("gpu/shape-0", "26", "32Gi"),
            "mi300x-node" => ("gpu/shape-1", "76", "96Gi"),
            other => panic!("placed on {other}"),
        };
        assert_eq!(
            (
                r[0].0.as_str(),
                r[0].2["computeUnits"].as_str().unwrap(),
                r[0].2["memory"].as_str().unwrap()
            ),
            expected,
            "{r:?}"
        );
        placed.push(node);
    }
    // Two halves of memory fit one MI210; the third pod can only take the MI300X.
    placed.sort();
    assert_eq!(placed, ["mi210-node", "mi210-node", "mi300x-node"]);

    // More memory than an MI210 has (80000 MiB > 65536): only the MI300X shape, one pinned
    // exactly request; 10 % of 304 CUs = 30.
    create(
        &c,
        &amd_pod(
            "big",
            dra(),
            json!({"amd.com/gpumem": "80000", "amd.com/gpucores": "10"}),
        ),
    )
    .await
    .unwrap();
    let (pod, claim) = bound(&c, "big").await;
    assert_eq!(pod.spec.unwrap().node_name.as_deref(), Some("mi300x-node"));
    let r = results(&claim);
    assert_eq!(
        (r[0].0.as_str(), r[0].2["computeUnits"].as_str()),
        ("gpu", Some("30"))
    );

    // Once no pod references a managed template for the grace period, it is deleted;
    // a referenced one stays.
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let template_of = |name: &'static str| {
        let pods = pods.clone();
        async move {
            pods.get(name)
                .await
                .unwrap()
                .spec
                .unwrap()
                .resource_claims
                .unwrap()[0]
                .resource_claim_template_name
                .clone()
                .unwrap()
        }
    };
    let (half, big) = (template_of("half-0").await, template_of("big").await);
    let names = || async {
        templates(&c)
            .await
            .into_iter()
            .filter_map(|t| t.metadata.name)
            .collect::<Vec<_>>()
    };
    assert!(names().await.contains(&half) && names().await.contains(&big));
    for name in ["half-0", "half-1", "half-2"] {
        pods.delete(name, &DeleteParams::default()).await.unwrap();
    }
    wait("the unused template is swept", || async {
        !names().await.contains(&half)
    })
    .await;
    assert_eq!(names().await, [big], "only the referenced template stays");
}

/// `(verb, status)` of the webhook's requests on resourceclaimtemplates in `c`'s log since
/// `from` (the claim controller's reflector and the sweeper only list and watch or delete).
fn template_calls(c: &Cluster, from: usize) -> Vec<(String, u16)> {
    c.api.request_log()[from..]
        .iter()
        .filter(|r| {
            r.resource == "resourceclaimtemplates"
                && matches!(r.verb.as_str(), "create" | "get" | "patch")
        })
        .map(|r| (r.verb.clone(), r.status))
        .collect()
}

fn template_name_of(pod: &Pod) -> String {
    pod.spec.as_ref().unwrap().resource_claims.as_ref().unwrap()[0]
        .resource_claim_template_name
        .clone()
        .unwrap()
}

fn stamp_of(t: &ResourceClaimTemplate) -> i64 {
    let value = &t.metadata.annotations.as_ref().unwrap()[LAST_USED_ANNOTATION];
    hami_protocol::rfc3339::parse(value).unwrap()
}

/// The sweeper race (dra_sweep.rs): a reused template is stamped before the pod is
/// answered, a stamp that loses to another write is retried at the new version, a
/// template deleted between the webhook's 409 and its read is made again (the pod then
/// gets its claim and runs), and a refused stamp denies the pod, saying why.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reused_templates_are_stamped_and_one_swept_meanwhile_is_made_again() {
    let c = start(Settings::default()).await;
    dra_node(
        &c.client,
        "mi210-node",
        vec![device(0, "AMD Instinct MI210", "64Gi", 104, 0)],
    )
    .await;
    let api: Api<ResourceClaimTemplate> = Api::namespaced(c.client.clone(), "default");
    let before = hami_plugin_core::node_lock_client::unix_now();
    let first = create(&c, &amd_pod("first", dra(), slice_limits()))
        .await
        .unwrap();
    let name = template_name_of(&first);
    let made = api.get(&name).await.unwrap();
    assert!(stamp_of(&made) >= before, "created without a fresh stamp");

    // Reused: 409, read, stamped at the version read.
    let from = c.api.request_log().len();
    create(&c, &amd_pod("second", dra(), slice_limits()))
        .await
        .unwrap();
    let calls = template_calls(&c, from);
    assert_eq!(
        calls,
        [
            ("create".into(), 409),
            ("get".into(), 200),
            ("patch".into(), 200)
        ],
        "{calls:?}"
    );
    let stamped = api.get(&name).await.unwrap();
    // (Within the same second the stamp is unchanged and the write a no-op, as upstream
    // makes it: such a stamp is fresh to every sweeper anyway.)
    assert!(stamp_of(&stamped) >= stamp_of(&made));
    let log = c.api.request_log();
    let patch = log[from..]
        .iter()
        .find(|r| r.resource == "resourceclaimtemplates" && r.verb == "patch")
        .unwrap();
    let body: Value = serde_json::from_str(&patch.body).unwrap();
    assert_eq!(
        body["metadata"]["resourceVersion"].as_str(),
        made.metadata.resource_version.as_deref(),
        "the stamp is not conditional on the version read: {body}"
    );

    // The stamp loses to another write (409 Conflict): read again, stamped again.
    c.api
        .faults()
        .fail_next(Some("patch"), Some("resourceclaimtemplates"), 1, 409);
    let from = c.api.request_log().len();
    create(&c, &amd_pod("third", dra(), slice_limits()))
        .await
        .unwrap();
    let calls = template_calls(&c, from);
    assert_eq!(
        calls,
        [
            ("create".into(), 409),
            ("get".into(), 200),
            ("patch".into(), 409),
            ("get".into(), 200),
            ("patch".into(), 200)
        ],
        "{calls:?}"
    );

    // Swept between the webhook's 409 and its read: the GET finds it gone, the webhook
    // creates it again before answering, and the pod's claim is made from it.
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    for p in ["first", "second", "third"] {
        pods.delete(p, &DeleteParams::default()).await.unwrap();
    }
    api.delete(&name, &DeleteParams::default()).await.unwrap();
    c.api
        .faults()
        .fail_next(Some("create"), Some("resourceclaimtemplates"), 1, 409);
    let from = c.api.request_log().len();
    let fourth = create(&c, &amd_pod("fourth", dra(), slice_limits()))
        .await
        .unwrap();
    assert_eq!(template_name_of(&fourth), name);
    let calls = template_calls(&c, from);
    assert_eq!(
        calls[..3],
        [
            ("create".into(), 409),
            ("get".into(), 404),
            ("create".into(), 201)
        ],
        "{calls:?}"
    );
    let again = api.get(&name).await.unwrap();
    assert_ne!(again.metadata.uid, made.metadata.uid);
    let (_, claim) = bound(&c, "fourth").await;
    assert_eq!(results(&claim).len(), 1);

    // A refused stamp denies the pod, naming the template, the annotation and the error.
    c.api
        .faults()
        .fail_next(Some("patch"), Some("resourceclaimtemplates"), 1, 403);
    let denied = create(&c, &amd_pod("fifth", dra(), slice_limits()))
        .await
        .unwrap_err();
    assert!(
        denied.contains(&format!("cannot mark ResourceClaimTemplate default/{name}"))
            && denied.contains(LAST_USED_ANNOTATION)
            && denied.contains("403"),
        "{denied}"
    );
}
