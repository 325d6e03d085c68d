//! CREATE admission: mutation by v1 and v1beta1 webhooks, denial, failure policies and
//! timeouts, configuration validation, matchConditions, and dry-run creates.

use super::*;

#[tokio::test]
async fn webhooks_mutate_deny_and_fail_per_policy() {
    let ca = test_ca();
    let hook = start_webhook(&ca).await;
    let server = start().await;
    let c = client(&server);
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");

    register(
        &c,
        "hami",
        vec![
            webhook(
                "v1.hami.io",
                format!("https://{hook}/v1"),
                &ca.ca_pem,
                &["v1"],
                "Fail",
                5,
            ),
            webhook(
                "beta.hami.io",
                format!("https://{hook}/v1beta1"),
                &ca.ca_pem,
                &["v1beta1"],
                "Fail",
                5,
            ),
        ],
    )
    .await;
    let created = pods
        .create(&PostParams::default(), &pod("gpu"))
        .await
        .unwrap();
    assert_eq!(
        created.metadata.labels.as_ref().unwrap()["hami.io/mutated"],
        "v1"
    );
    assert_eq!(
        created.metadata.annotations.as_ref().unwrap()["beta"],
        "yes"
    );
    assert_eq!(
        created.spec.as_ref().unwrap().scheduler_name.as_deref(),
        Some("hami-scheduler")
    );

    // a denial is 403 with the webhook's message; nothing is stored
    let mut denied = pod("denied");
    denied
        .metadata
        .labels
        .get_or_insert_default()
        .insert("deny".into(), "1".into());
    let (code, msg) = status_of(
        pods.create(&PostParams::default(), &denied)
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);
    assert_eq!(
        msg,
        "admission webhook \"v1.hami.io\" denied the request: no GPU memory left on any node"
    );
    assert!(
        server
            .get_object("v1", "pods", "default", "denied")
            .is_none()
    );

    // objectSelector excludes pods labelled skip-webhooks
    let mut skip = pod("skipped");
    skip.metadata
        .labels
        .get_or_insert_default()
        .insert("skip-webhooks".into(), "1".into());
    let s = pods.create(&PostParams::default(), &skip).await.unwrap();
    assert!(!s.metadata.labels.unwrap().contains_key("hami.io/mutated"));
    delete_config(&c, "hami").await;

    // an unreachable webhook: Fail refuses the pod, Ignore lets it through
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    register(
        &c,
        "dead-fail",
        vec![webhook(
            "dead.hami.io",
            format!("https://{dead}/v1"),
            &ca.ca_pem,
            &["v1"],
            "Fail",
            2,
        )],
    )
    .await;
    let (code, msg) = status_of(
        pods.create(&PostParams::default(), &pod("x1"))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 500);
    assert!(
        msg.contains("failed calling webhook \"dead.hami.io\""),
        "{msg}"
    );
    delete_config(&c, "dead-fail").await;
    register(
        &c,
        "dead-ignore",
        vec![webhook(
            "dead.hami.io",
            format!("https://{dead}/v1"),
            &ca.ca_pem,
            &["v1"],
            "Ignore",
            2,
        )],
    )
    .await;
    pods.create(&PostParams::default(), &pod("x2"))
        .await
        .unwrap();
    delete_config(&c, "dead-ignore").await;

    // a slow webhook hits its timeout
    register(
        &c,
        "slow",
        vec![webhook(
            "slow.hami.io",
            format!("https://{hook}/slow"),
            &ca.ca_pem,
            &["v1"],
            "Fail",
            1,
        )],
    )
    .await;
    let t = Instant::now();
    let (code, _) = status_of(
        pods.create(&PostParams::default(), &pod("x3"))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 500);
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "timeoutSeconds=1 took {:?}",
        t.elapsed()
    );
    delete_config(&c, "slow").await;

    // a caBundle that did not sign the webhook's certificate fails TLS verification
    let other = test_ca();
    register(
        &c,
        "wrong-ca",
        vec![webhook(
            "v1.hami.io",
            format!("https://{hook}/v1"),
            &other.ca_pem,
            &["v1"],
            "Fail",
            2,
        )],
    )
    .await;
    let (code, msg) = status_of(
        pods.create(&PostParams::default(), &pod("x4"))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 500);
    assert!(msg.to_lowercase().contains("certificate"), "{msg}");
}

#[tokio::test]
async fn webhook_configuration_validation() {
    let server = start().await;
    let c = client(&server);
    let api: Api<MutatingWebhookConfiguration> = Api::all(c.clone());
    let bad = serde_json::from_value(json!({"metadata": {"name": "bad"}, "webhooks": [{"name": "w.hami.io", "clientConfig": {"url": "http://127.0.0.1:1/x"}, "sideEffects": "None", "admissionReviewVersions": ["v1"]}]})).unwrap();
    let (code, msg) = status_of(api.create(&PostParams::default(), &bad).await.unwrap_err());
    assert_eq!(code, 422);
    assert!(msg.contains("https"), "{msg}");
}

/// `matchConditions` decide whether the webhook is called (all true), skip it (one false),
/// or apply the failure policy (errors): 403 naming the expression under Fail, skipped under
/// Ignore; an expression that does not compile is refused when the configuration is written.
#[tokio::test]
async fn match_conditions_gate_the_call() {
    let ca = test_ca();
    let hook = start_webhook(&ca).await;
    let server = start().await;
    let c = client(&server);
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let with = |conds: Value, url: String, policy: &str| {
        let mut h = webhook("mc.hami.io", url, &ca.ca_pem, &["v1"], policy, 2);
        h["matchConditions"] = conds;
        h
    };
    let labelled = |name: &str, labels: Value| -> Pod {
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]}}))
        .unwrap()
    };
    register(
        &c,
        "gpu-only",
        vec![with(
            json!([
                {"name": "gpu", "expression": "has(object.metadata.labels) && 'gpu' in object.metadata.labels"},
                {"name": "not-nobody", "expression": "request.userInfo.username != 'nobody' && request.operation == 'CREATE'"}
            ]),
            format!("https://{hook}/v1"),
            "Fail",
        )],
    )
    .await;
    let plain = pods
        .create(
            &PostParams::default(),
            &labelled("plain", json!({"app": "a"})),
        )
        .await
        .unwrap();
    assert!(
        !plain.labels().contains_key("hami.io/mutated"),
        "called although a condition is false"
    );
    let gpu = pods
        .create(
            &PostParams::default(),
            &labelled("gpu", json!({"gpu": "1"})),
        )
        .await
        .unwrap();
    assert_eq!(gpu.labels()["hami.io/mutated"], "v1");
    delete_config(&c, "gpu-only").await;

    // An evaluation error and no false condition: the policy decides; nothing listens at the
    // URL, so a call would fail with another message.
    let erring = json!([{"name": "ann", "expression": "object.metadata.annotations['x'] == 'y'"}]);
    register(
        &c,
        "erring",
        vec![with(erring.clone(), "https://127.0.0.1:9/x".into(), "Fail")],
    )
    .await;
    let (code, msg) = status_of(
        pods.create(&PostParams::default(), &labelled("e1", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);
    assert_eq!(
        msg,
        "pods \"e1\" is forbidden: expression 'object.metadata.annotations['x'] == 'y'' resulted in error: no such key: annotations"
    );
    delete_config(&c, "erring").await;
    register(
        &c,
        "erring",
        vec![with(erring, "https://127.0.0.1:9/x".into(), "Ignore")],
    )
    .await;
    pods.create(&PostParams::default(), &labelled("e2", json!({})))
        .await
        .expect("Ignore skips a webhook whose conditions fail");
    delete_config(&c, "erring").await;

    // Compiled at create: unsupported or ill-typed CEL is refused, naming the expression.
    let api: Api<MutatingWebhookConfiguration> = Api::all(c.clone());
    for (expression, why) in [
        (
            "object.metadata.name.matches('^gpu')",
            "the function 'matches' is not supported",
        ),
        ("object.metadata.name", "must evaluate to bool but got dyn"),
        ("request.nope == 'x'", "undefined field 'nope'"),
        ("object.spec.containers.exists(c,", "Syntax error"),
    ] {
        let cfg = serde_json::from_value(json!({"metadata": {"name": "bad-cel"}, "webhooks": [
            with(json!([{"name": "c", "expression": expression}]), format!("https://{hook}/v1"), "Fail")
        ]}))
        .unwrap();
        let (code, msg) = status_of(api.create(&PostParams::default(), &cfg).await.unwrap_err());
        assert_eq!(code, 422, "{msg}");
        assert!(
            msg.contains(&format!(
                "webhooks[].matchConditions[].expression: Invalid value: {expression:?}"
            )) && msg.contains(why),
            "{msg}"
        );
    }
}

/// A dry-run create is admitted as a real server admits it: the webhook is called with
/// `dryRun: true` and its mutation answered, nothing is stored; a matchCondition on
/// `request.dryRun` sees it. v1 allows only sideEffects None or NoneOnDryRun.
#[tokio::test]
async fn dry_run_creates_are_admitted() {
    let ca = test_ca();
    let hook = start_webhook(&ca).await;
    let server = start().await;
    let c = client(&server);
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let mut h = webhook(
        "dry.hami.io",
        format!("https://{hook}/v1"),
        &ca.ca_pem,
        &["v1"],
        "Fail",
        2,
    );
    h["sideEffects"] = json!("NoneOnDryRun");
    register(&c, "dry", vec![h.clone()]).await;
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let answered = pods.create(&dry, &pod("dry1")).await.unwrap();
    assert_eq!(answered.labels()["hami.io/mutated"], "v1");
    assert!(
        pods.get_opt("dry1").await.unwrap().is_none(),
        "a dry run stored the pod"
    );
    let (code, msg) = status_of(
        pods.create(&dry, &{
            let mut p = pod("dry2");
            p.metadata
                .labels
                .as_mut()
                .unwrap()
                .insert("deny".into(), "1".into());
            p
        })
        .await
        .unwrap_err(),
    );
    assert_eq!(code, 403, "{msg}");
    delete_config(&c, "dry").await;
    // A condition skipping dry runs: the webhook is not called for one, called otherwise.
    h["matchConditions"] = json!([{"name": "not-dry", "expression": "!request.dryRun"}]);
    register(&c, "dry", vec![h.clone()]).await;
    let answered = pods.create(&dry, &pod("dry3")).await.unwrap();
    assert!(!answered.labels().contains_key("hami.io/mutated"));
    let stored = pods
        .create(&PostParams::default(), &pod("wet"))
        .await
        .unwrap();
    assert_eq!(stored.labels()["hami.io/mutated"], "v1");
    delete_config(&c, "dry").await;
    let api: Api<MutatingWebhookConfiguration> = Api::all(c.clone());
    h["sideEffects"] = json!("Some");
    let cfg =
        serde_json::from_value(json!({"metadata": {"name": "some"}, "webhooks": [h]})).unwrap();
    let (code, msg) = status_of(api.create(&PostParams::default(), &cfg).await.unwrap_err());
    assert_eq!(code, 422);
    assert!(msg.contains("Unsupported value: \"Some\""), "{msg}");
}
