//! What the webhook writes for AMD requests and what DRA allocates from it; bad input
//! refused with what to change; more device types than a claim may list.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amd_requests_become_claims_that_dra_allocates() {
    let c = start(Settings::default()).await;
    dra_node(
        &c.client,
        "dra-node",
        (0..2)
            .map(|i| device(i, "AMD Instinct MI210", "64Gi", 104, 0))
            .collect(),
    )
    .await;

    // 25 % of 104 CUs = 26 (floor), 4096 MiB.
    let first = create(&c, &amd_pod("slice-1", dra(), slice_limits()))
        .await
        .unwrap();
    let spec = first.spec.as_ref().unwrap();
    assert_eq!(spec.scheduler_name.as_deref(), Some("hami-scheduler"));
    let text = container_json(&first).to_string();
    assert!(!text.contains("amd.com/"), "amd.com/* left: {text}");
    assert_eq!(
        container_json(&first)["resources"]["claims"],
        json!([{"name": "hami-amd-c"}])
    );
    let entries = spec.resource_claims.as_ref().unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].name, "hami-amd-c");
    let template_name = entries[0].resource_claim_template_name.clone().unwrap();
    assert!(template_name.starts_with("hami-amd-"), "{template_name}");
    let made = templates(&c).await;
    assert_eq!(made.len(), 1);
    assert_eq!(
        made[0].metadata.name.as_deref(),
        Some(template_name.as_str())
    );
    assert_eq!(
        made[0].metadata.labels.as_ref().unwrap()[MANAGED_BY_LABEL],
        MANAGED_BY_WEBHOOK
    );

    let (pod, claim) = bound(&c, "slice-1").await;
    assert_eq!(
        pod.spec.as_ref().unwrap().node_name.as_deref(),
        Some("dra-node")
    );
    let r = results(&claim);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0].0, "gpu");
    assert_eq!(r[0].2["computeUnits"], "26", "{r:?}");
    assert_eq!(r[0].2["memory"], "4Gi", "{r:?}");
    assert_eq!(r[0].2["shares"], "1", "{r:?}");

    // An identical pod shares the template (content-addressed) and gets its own claim.
    let second = create(&c, &amd_pod("slice-2", dra(), slice_limits()))
        .await
        .unwrap();
    assert_eq!(
        second
            .spec
            .as_ref()
            .unwrap()
            .resource_claims
            .as_ref()
            .unwrap()[0]
            .resource_claim_template_name
            .as_deref(),
        Some(template_name.as_str())
    );
    assert_eq!(templates(&c).await.len(), 1);
    let (_, claim2) = bound(&c, "slice-2").await;
    assert_ne!(claim2.metadata.name, claim.metadata.name);
    assert_eq!(results(&claim2)[0].2["computeUnits"], "26");

    // Two GPUs in one container: two distinct devices (distinctAttribute on the uuid).
    create(
        &c,
        &amd_pod(
            "pair",
            dra(),
            json!({"amd.com/gpu": "2", "amd.com/gpumem": "1024", "amd.com/gpucores": "10"}),
        ),
    )
    .await
    .unwrap();
    let (_, pair) = bound(&c, "pair").await;
    let r = results(&pair);
    assert_eq!(r.len(), 2, "{r:?}");
    assert_ne!(r[0].1, r[1].1, "the same device twice: {r:?}");
    assert!(r.iter().all(|x| x.2["computeUnits"] == "10"), "{r:?}");
    assert!(r.iter().all(|x| x.2["memory"] == "1Gi"), "{r:?}");

    // A device-plugin pod is unchanged from today: amd.com/* limits kept, no claims.
    let limits = json!({"amd.com/gpu": "1", "amd.com/gpucores": "25"});
    let plain = create(
        &c,
        &amd_pod(
            "plugin-pod",
            json!({"hami.io/amd-mode": "device-plugin"}),
            limits.clone(),
        ),
    )
    .await
    .unwrap();
    assert!(plain.spec.as_ref().unwrap().resource_claims.is_none());
    assert_eq!(limits_of(&plain), limits);
    let unannotated = create(&c, &amd_pod("default-pod", json!({}), limits.clone()))
        .await
        .unwrap();
    assert!(unannotated.spec.as_ref().unwrap().resource_claims.is_none());
    assert_eq!(limits_of(&unannotated), limits);

    // dryRun (sideEffects: NoneOnDryRun): the same answer, nothing created.
    let review = |dry_run: bool| {
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE", "namespace": "default", "dryRun": dry_run,
            "userInfo": {"username": "alice"},
            "object": amd_pod("dry", dra(), json!({"amd.com/gpu": "1", "amd.com/gpucores": "30"}))}})
    };
    let webhook = ExtenderClient::new(
        &c.front.base,
        Trust::Ca(c.front.ca_pem.clone().into_bytes()),
    )
    .unwrap();
    let before = templates(&c).await.len();
    let answer: Value = webhook.call("webhook", &review(true)).await.unwrap();
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert_eq!(answer["response"]["patchType"], "JSONPatch", "{answer}");
    assert_eq!(
        templates(&c).await.len(),
        before,
        "dryRun created a template"
    );
    let answer: Value = webhook.call("webhook", &review(false)).await.unwrap();
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert_eq!(
        templates(&c).await.len(),
        before + 1,
        "the real request creates it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_inputs_are_refused_with_what_to_change() {
    let c = start(Settings::default()).await;
    let denied = |pod: Pod| {
        let c = &c;
        async move {
            let e = create(c, &pod).await.unwrap_err();
            assert!(
                templates(c).await.is_empty(),
                "a refused pod left a template"
            );
            e
        }
    };
    // No slice of the driver yet: percentages cannot be converted.
    let e = denied(amd_pod("early", dra(), slice_limits())).await;
    assert!(
        e.contains("no ResourceSlice of amdgpu.hami-rs.io yet")
            && e.contains("percentages need the device size"),
        "{e}"
    );
    // ... a fixed size can (the claim waits for a device).
    let fixed = create(
        &c,
        &amd_pod("fixed", dra(), json!({"amd.com/gpumem": "1024"})),
    )
    .await
    .unwrap();
    assert!(fixed.spec.as_ref().unwrap().resource_claims.is_some());
    Api::<Pod>::namespaced(c.client.clone(), "default")
        .delete("fixed", &DeleteParams::default())
        .await
        .unwrap();
    for t in templates(&c).await {
        Api::<ResourceClaimTemplate>::namespaced(c.client.clone(), "default")
            .delete(&t.metadata.name.unwrap(), &DeleteParams::default())
            .await
            .unwrap();
    }

    dra_node(
        &c.client,
        "dra-node",
        vec![device(0, "AMD Instinct MI210", "64Gi", 104, 0)],
    )
    .await;
    for (cores, expected) in [
        ("0", "from 1 to 100"),
        ("101", "from 1 to 100"),
        ("abc", "amd.com/gpucores"),
    ] {
        let e = denied(amd_pod(
            "cores",
            dra(),
            json!({"amd.com/gpu": "1", "amd.com/gpucores": cores}),
        ))
        .await;
        assert!(e.contains(expected), "gpucores {cores}: {e}");
    }
    let e = denied(amd_pod(
        "mode",
        json!({"hami.io/amd-mode": "bogus"}),
        slice_limits(),
    ))
    .await;
    assert!(
        e.contains("hami.io/amd-mode") && e.contains("write device-plugin or dra"),
        "{e}"
    );
    // The slices arrive through the webhook's informer: wait until it has them.
    wait("the webhook sees the slice", || async {
        create(
            &c,
            &amd_pod(
                "probe",
                dra(),
                json!({"amd.com/gpu": "1", "amd.com/gpumem": "70000", "amd.com/gpucores": "5"}),
            ),
        )
        .await
        .unwrap_err()
        .contains("the largest is AMD Instinct MI210 with 65536 MiB")
    })
    .await;
    let e = denied(amd_pod("huge", dra(), json!({"amd.com/gpumem": "70000"}))).await;
    assert!(
        e.contains("70000 MiB") && e.contains("the largest is AMD Instinct MI210 with 65536 MiB"),
        "{e}"
    );

    // A template of the webhook's name with another spec: never overwritten, refused.
    let pod = amd_pod("taken", dra(), slice_limits());
    let requests = pod_requests(&pod, &RequestDefaults::default()).unwrap();
    let slices = Api::<ResourceSlice>::all(c.client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let ours = pod_claims(&pod, &requests, &shapes(&slices)).unwrap();
    let mut foreign = ours[0].template("default");
    foreign
        .spec
        .spec
        .devices
        .as_mut()
        .unwrap()
        .requests
        .as_mut()
        .unwrap()[0]
        .exactly
        .as_mut()
        .unwrap()
        .count = Some(3);
    Api::<ResourceClaimTemplate>::namespaced(c.client.clone(), "default")
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    let e = create(&c, &pod).await.unwrap_err();
    assert!(
        e.contains(&format!(
            "ResourceClaimTemplate default/{}",
            ours[0].template_name
        )) && e.contains("exists with a different spec"),
        "{e}"
    );
    let kept = Api::<ResourceClaimTemplate>::namespaced(c.client.clone(), "default")
        .get(&ours[0].template_name)
        .await
        .unwrap();
    assert_eq!(kept.spec, foreign.spec, "the user's template was changed");
}

/// The webhook's AdmissionReview answer for `pod` (CREATE by alice, dryRun: nothing made).
async fn review(c: &Cluster, pod: &Pod) -> Value {
    let webhook = ExtenderClient::new(
        &c.front.base,
        Trust::Ca(c.front.ca_pem.clone().into_bytes()),
    )
    .unwrap();
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-9", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "operation": "CREATE", "namespace": "default", "dryRun": true,
        "userInfo": {"username": "alice"}, "object": pod}});
    webhook.call("webhook", &review).await.unwrap()
}

/// Issue 26 item 9: one node publishing 9 device types that sort before "AMD Instinct
/// MI210" (tainted here: nothing can run on them) no longer removes the MI210s from every
/// percentage pod's claim — the landed code cut the name-sorted types at 8, and the pod
/// waited for good. The 8 types with the most devices are listed (the two MI210s first,
/// smallest first), the pod lands on an MI210, and the admission response's warnings (which
/// kubectl prints) name the two types left out.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_device_types_than_a_claim_lists_keep_the_real_gpus_and_say_so() {
    let c = start(Settings::default()).await;
    dra_node(
        &c.client,
        "odd-node",
        (0..9)
            .map(|i| {
                let mut d = device(i, &format!("AMD Aaa {i}"), "128Gi", 104, 0);
                d["taints"] = json!([{"key": "example.com/broken", "effect": "NoSchedule"}]);
                d
            })
            .collect(),
    )
    .await;
    dra_node(
        &c.client,
        "dra-node",
        (0..2)
            .map(|i| device(i, "AMD Instinct MI210", "64Gi", 104, 0))
            .collect(),
    )
    .await;
    let pod = amd_pod("quarter", dra(), slice_limits());
    // The slices arrive through the webhook's informer: wait until it has all ten types.
    wait("the webhook sees every device type", || async {
        review(&c, &pod).await["response"]["warnings"]
            .as_array()
            .is_some_and(|w| {
                w.first()
                    .is_some_and(|w| w.as_str().unwrap().contains(" 10 AMD device types"))
            })
    })
    .await;
    let answer = review(&c, &pod).await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert_eq!(
        answer["response"]["warnings"],
        json!([
            "spec.containers[0] (c): 10 AMD device types can hold the request, more than the 8 a claim may list: kept the 8 with the most devices, left out 2",
            "spec.containers[0] (c): left out AMD Aaa 7 (131072 MiB, 104 CUs, 1 device): the pod cannot land on it",
            "spec.containers[0] (c): left out AMD Aaa 8 (131072 MiB, 104 CUs, 1 device): the pod cannot land on it",
        ]),
        "{answer}"
    );

    // Through the API server: the claim lists the MI210 first, and the pod lands there.
    create(&c, &pod).await.unwrap();
    let (bound_pod, claim) = bound(&c, "quarter").await;
    assert_eq!(
        bound_pod.spec.unwrap().node_name.as_deref(),
        Some("dra-node")
    );
    let r = results(&claim);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0].0, "gpu/shape-0", "{r:?}");
    assert!(r[0].1.starts_with("dra-node/"), "{r:?}");
    assert_eq!(r[0].2["computeUnits"], "26", "{r:?}");
}
