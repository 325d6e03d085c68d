//! The webhook sees GPU pods only, so a scheduler outage blocks nothing else.
//!
//! - The CEL `matchConditions` expression Helm renders is evaluated by a real CEL
//!   implementation (PyPI cel-python) over a corpus of pods (hand-written and generated:
//!   app/init containers, limits/requests, other extended resources, forged scheduler
//!   annotations) and must agree with the protocol crate's tables: send the pod iff a
//!   container asks for a managed resource or the pod carries a scheduler-owned annotation
//!   (on CREATE), or an UPDATE sets, changes or removes one or the DRA quota charge (D-33),
//!   and the writer is not one of our components (their commits never wait for the
//!   webhook). The D-4 guard webhook (no selectors) is checked the same way: annotated pods
//!   only, and never a CREATE for the charge alone (the main webhook patched it in); it
//!   also sees pods/status writes, which keep their annotations upstream.
//! - Per version: matchConditions + `Fail` from 1.28 on; on 1.27 none, and the operator's
//!   fallback policy (also what certgen writes back). CREATE and UPDATE are both covered.
//! - On our API server with the 1.27 rendering (no matchConditions) and the scheduler
//!   down, a plain pod is created; with the fallback set to Fail it is refused (so the
//!   first half can fail).

use crate::peers::Case;
use hami_protocol::names::pod::DRA_QUOTA_CHARGE;
use hami_protocol::names::{SCHEDULER_OWNED_ANNOTATIONS, managed_resources};
use serde_json::{Value, json};

fn cel_eval(conditions: &[String], bindings: &[Value]) -> Vec<Value> {
    hami_cel_peer::run(
        &hami_cel_peer::script(env!("CARGO_MANIFEST_DIR"), "tests/peers/cel_peer.py"),
        &json!({"conditions": conditions, "bindings": bindings}),
    )
}

fn owned(pod: &Value) -> bool {
    pod["metadata"]["annotations"].as_object().is_some_and(|m| {
        m.keys()
            .any(|k| SCHEDULER_OWNED_ANNOTATIONS.contains(&k.as_str()))
    })
}

fn writer(binding: &Value) -> bool {
    let user = binding["request"]["userInfo"]["username"]
        .as_str()
        .unwrap_or("");
    hami_manifests::objects::ANNOTATION_WRITERS
        .iter()
        .any(|sa| user == format!("system:serviceaccount:hami-system:{sa}"))
}

/// What no UPDATE but our components' may change: D-4's annotations and the DRA quota
/// charge (D-33), which the webhook writes into the creator's own CREATE.
fn update_owned() -> Vec<&'static str> {
    let mut keys = SCHEDULER_OWNED_ANNOTATIONS.to_vec();
    keys.push(DRA_QUOTA_CHARGE);
    keys
}

fn owned_values(pod: &Value) -> Vec<Option<String>> {
    update_owned()
        .iter()
        .map(|k| {
            pod["metadata"]["annotations"][*k]
                .as_str()
                .map(str::to_string)
        })
        .collect()
}

/// An UPDATE that sets, changes or removes a scheduler-owned annotation or the charge.
fn changes_owned(binding: &Value) -> bool {
    binding["request"]["operation"] == "UPDATE"
        && owned_values(&binding["object"]) != owned_values(&binding["oldObject"])
}

fn creating(binding: &Value) -> bool {
    binding["request"]["operation"] != "UPDATE"
}

/// The protocol's answer: does the main webhook need to see this request?
fn must_see(binding: &Value) -> bool {
    let pod = &binding["object"];
    let managed = managed_resources();
    let asks = |c: &Value| {
        ["limits", "requests"].iter().any(|k| {
            c["resources"][k]
                .as_object()
                .is_some_and(|m| m.keys().any(|r| managed.contains(&r.as_str())))
        })
    };
    let containers = ["containers", "initContainers"]
        .iter()
        .flat_map(|k| pod["spec"][k].as_array().cloned().unwrap_or_default())
        .any(|c| asks(&c));
    !writer(binding)
        && ((creating(binding) && (containers || owned(pod))) || changes_owned(binding))
}

/// The guard webhook: a CREATE carrying a scheduler-owned annotation, or an UPDATE changing
/// one or the charge.
fn guard_must_see(binding: &Value) -> bool {
    !writer(binding) && ((creating(binding) && owned(&binding["object"])) || changes_owned(binding))
}

fn container(name: &str, limits: Option<Value>, requests: Option<Value>) -> Value {
    let mut c = json!({"name": name, "image": "busybox"});
    if limits.is_some() || requests.is_some() {
        c["resources"] = json!({});
        if let Some(l) = limits {
            c["resources"]["limits"] = l;
        }
        if let Some(r) = requests {
            c["resources"]["requests"] = r;
        }
    }
    c
}

fn pod(containers: Vec<Value>, init: Vec<Value>, annotations: Option<Value>) -> Value {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": containers}});
    if !init.is_empty() {
        p["spec"]["initContainers"] = Value::Array(init);
    }
    if let Some(a) = annotations {
        p["metadata"]["annotations"] = a;
    }
    p
}

fn pods() -> Vec<Value> {
    let mut out = vec![
        // Plain pods: nginx, a CNI-like pod with cpu/memory, another vendor's resource.
        pod(vec![container("nginx", None, None)], vec![], None),
        pod(
            vec![container(
                "cni",
                Some(json!({"cpu": "100m", "memory": "50Mi"})),
                Some(json!({"cpu": "10m"})),
            )],
            vec![],
            Some(json!({"prometheus.io/scrape": "true"})),
        ),
        pod(
            vec![container(
                "fpga",
                Some(json!({"example.com/fpga": "1"})),
                None,
            )],
            vec![],
            None,
        ),
        // GPU pods in every position.
        pod(
            vec![container("a", Some(json!({"amd.com/gpu": "1"})), None)],
            vec![],
            None,
        ),
        pod(
            vec![container(
                "a",
                None,
                Some(json!({"amd.com/gpumem-percentage": "50"})),
            )],
            vec![],
            None,
        ),
        pod(
            vec![container("a", None, None)],
            vec![container(
                "init",
                Some(json!({"nvidia.com/gpu": "1"})),
                None,
            )],
            None,
        ),
        pod(
            vec![
                container("a", None, None),
                container("b", Some(json!({"nvidia.com/priority": "1"})), None),
            ],
            vec![],
            None,
        ),
        // A plain pod forging a scheduler-owned annotation: D-4 must still see it.
        pod(
            vec![container("a", None, None)],
            vec![],
            Some(json!({"hami.io/amd-devices-allocated": "GPU-x,AMD,1024,10:;"})),
        ),
    ];
    // Generated: a small linear congruential generator, reproducible run to run.
    let mut seed: u64 = 0x5eed;
    let mut next = |n: usize| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((seed >> 33) as usize) % n
    };
    let managed: Vec<String> = managed_resources().iter().map(|s| s.to_string()).collect();
    let others: Vec<String> = [
        "cpu",
        "memory",
        "ephemeral-storage",
        "example.com/fpga",
        "amd.com/gpux",
        "nvidia.com/gpu.shared",
    ]
    .map(String::from)
    .to_vec();
    let mut annotations: Vec<String> = SCHEDULER_OWNED_ANNOTATIONS
        .iter()
        .map(|s| s.to_string())
        .collect();
    annotations.extend(
        [
            "hami.io/webhook",
            "amd.com/use-gputype",
            "example.com/x",
            DRA_QUOTA_CHARGE,
        ]
        .map(String::from),
    );
    for _ in 0..120 {
        let make = |prefix: &str, next: &mut dyn FnMut(usize) -> usize| {
            (0..next(3) + usize::from(prefix == "c"))
                .map(|i| {
                    let section = |next: &mut dyn FnMut(usize) -> usize| {
                        if next(3) == 0 {
                            return None;
                        }
                        let m: serde_json::Map<String, Value> = (0..next(3))
                            .map(|_| {
                                // Mostly other resources, so both answers are common.
                                let k = if next(6) == 0 {
                                    &managed[next(managed.len())]
                                } else {
                                    &others[next(others.len())]
                                };
                                (k.clone(), json!("1"))
                            })
                            .collect();
                        Some(Value::Object(m))
                    };
                    let l = section(next);
                    let r = section(next);
                    container(&format!("{prefix}{i}"), l, r)
                })
                .collect::<Vec<_>>()
        };
        let c = make("c", &mut next);
        let init = make("i", &mut next);
        let ann = (next(5) == 0).then(|| {
            let m: serde_json::Map<String, Value> = (0..next(3) + 1)
                .map(|_| (annotations[next(annotations.len())].clone(), json!("v")))
                .collect();
            Value::Object(m)
        });
        out.push(pod(c, init, ann));
    }
    out
}

fn request(operation: &str, user: &str) -> Value {
    json!({"operation": operation, "userInfo": {"username": user}})
}

/// Every pod created by a user; updated by a user from another pod (so annotations appear
/// and disappear), and with its annotations removed; written by each of our components.
fn bindings() -> Vec<Value> {
    let pods = pods();
    let user = "system:serviceaccount:default:deployer";
    let mut out: Vec<Value> = pods
        .iter()
        .map(|p| json!({"object": p, "oldObject": null, "request": request("CREATE", user)}))
        .collect();
    for (i, p) in pods.iter().enumerate() {
        let old = &pods[(i * 7 + 3) % pods.len()];
        out.push(json!({"object": p, "oldObject": old, "request": request("UPDATE", user)}));
        let mut stripped = old.clone();
        stripped["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("annotations");
        out.push(json!({"object": stripped, "oldObject": old, "request": request("UPDATE", user)}));
    }
    let charged = |p: &Value| p["metadata"]["annotations"][DRA_QUOTA_CHARGE].is_string();
    for p in pods.iter().filter(|p| owned(p) || charged(p)) {
        // A label added to an annotated GPU pod: nothing for D-4, never sent.
        let mut labelled = p.clone();
        labelled["metadata"]["labels"] = json!({"team": "a"});
        out.push(json!({"object": labelled, "oldObject": p, "request": request("UPDATE", user)}));
        // The same annotation, another value: sent.
        let mut forged = p.clone();
        for (_, v) in forged["metadata"]["annotations"]
            .as_object_mut()
            .unwrap()
            .iter_mut()
        {
            *v = json!("forged");
        }
        out.push(json!({"object": forged, "oldObject": p, "request": request("UPDATE", user)}));
    }
    for sa in hami_manifests::objects::ANNOTATION_WRITERS {
        let me = format!("system:serviceaccount:hami-system:{sa}");
        for p in pods.iter().take(20) {
            out.push(json!({"object": p, "oldObject": p, "request": request("UPDATE", &me)}));
        }
    }
    out
}

fn webhooks(r: &crate::peers::Rendered) -> Vec<Value> {
    r.objects()
        .into_iter()
        .map(|(_, v)| v)
        .find(|v| v["kind"] == "MutatingWebhookConfiguration")
        .expect("the webhook")["webhooks"]
        .as_array()
        .unwrap()
        .clone()
}

fn webhook(r: &crate::peers::Rendered) -> Value {
    webhooks(r)[0].clone()
}

fn expressions(hook: &Value) -> Vec<String> {
    hook["matchConditions"]
        .as_array()
        .expect("matchConditions")
        .iter()
        .map(|c| c["expression"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn match_conditions_send_exactly_the_pods_the_protocol_says() {
    let answer = crate::peers::run(
        &[Case::new("defaults", "hami-system", "v1.33.0", json!({}))],
        &[],
    );
    let hooks = webhooks(&answer.cases[0]);
    assert_eq!(hooks.len(), 2, "the main webhook and the D-4 guard");
    let settings = hami_manifests::Settings::default();
    assert_eq!(
        expressions(&hooks[0]),
        [
            hami_manifests::objects::not_a_writer_expression(&settings),
            hami_manifests::objects::webhook_match_expression()
        ]
    );
    assert_eq!(
        hooks[1]["name"],
        hami_manifests::objects::GUARD_WEBHOOK_NAME
    );
    assert!(hooks[1]["namespaceSelector"].is_null() && hooks[1]["objectSelector"].is_null());
    // A pod's status write keeps its annotations (upstream's podStatusStrategy), so the
    // guard sees those writes too; the main webhook, also rendered without matchConditions
    // (1.27), never does (it would be sent every kubelet status update there).
    assert_eq!(
        hooks[1]["rules"][0]["resources"],
        json!(["pods", "pods/status"])
    );
    assert_eq!(hooks[0]["rules"][0]["resources"], json!(["pods"]));
    assert_eq!(hooks[1]["failurePolicy"], "Fail");
    let bindings = bindings();
    for (hook, oracle) in [
        (&hooks[0], must_see as fn(&Value) -> bool),
        (&hooks[1], guard_must_see),
    ] {
        let results = cel_eval(&expressions(hook), &bindings);
        let (mut sent, mut skipped) = (0, 0);
        for (b, got) in bindings.iter().zip(&results) {
            let want = oracle(b);
            assert_eq!(
                got,
                &json!(want),
                "{}: CEL said {got} for {b}",
                hook["name"]
            );
            if want { sent += 1 } else { skipped += 1 }
        }
        // The corpus exercises both answers substantially.
        assert!(
            sent > 40 && skipped > 40,
            "{}: sent {sent}, skipped {skipped}",
            hook["name"]
        );
    }
}

#[test]
fn a_change_of_the_dra_quota_charge_is_sent_on_update_only() {
    let answer = crate::peers::run(
        &[Case::new("defaults", "hami-system", "v1.33.0", json!({}))],
        &[],
    );
    let hooks = webhooks(&answer.cases[0]);
    let charge = "amd.com/gpu=1,amd.com/gpumem=4096,amd.com/gpucores=25";
    let limits = json!({"amd.com/gpu": "1", "amd.com/gpumem": "4096"});
    let admitted = pod(
        vec![container("c", Some(limits.clone()), None)],
        vec![],
        Some(json!({DRA_QUOTA_CHARGE: charge, "hami.io/amd-mode": "dra"})),
    );
    let with = |value: Option<&str>| {
        let mut p = admitted.clone();
        let map = p["metadata"]["annotations"].as_object_mut().unwrap();
        match value {
            Some(v) => map.insert(DRA_QUOTA_CHARGE.into(), json!(v)),
            None => map.remove(DRA_QUOTA_CHARGE),
        };
        p
    };
    let mut relabelled = admitted.clone();
    relabelled["metadata"]["labels"] = json!({"team": "a"});
    relabelled["metadata"]["annotations"]["example.com/note"] = json!("x");
    let tenant = "system:serviceaccount:team-a:deployer";
    let scheduler = "system:serviceaccount:hami-system:hami-scheduler";
    let update = |object: &Value, user: &str| json!({"object": object, "oldObject": admitted, "request": request("UPDATE", user)});
    // (what, binding, main webhook sent, guard sent)
    let cases = [
        // What the guard sees of a DRA pod's CREATE once the main webhook patched the
        // charge in: not sent (it would refuse every DRA-mode pod).
        (
            "create, charge patched in",
            json!({"object": admitted, "oldObject": null, "request": request("CREATE", tenant)}),
            true,
            false,
        ),
        (
            "lowered",
            update(&with(Some("amd.com/gpu=1,amd.com/gpumem=1")), tenant),
            true,
            true,
        ),
        (
            "raised",
            update(&with(Some("amd.com/gpu=1,amd.com/gpumem=65536")), tenant),
            true,
            true,
        ),
        ("garbage", update(&with(Some("x=,=")), tenant), true, true),
        ("emptied", update(&with(Some("")), tenant), true, true),
        ("removed", update(&with(None), tenant), true, true),
        ("labels only", update(&relabelled, tenant), false, false),
        (
            "by the scheduler",
            update(&with(Some("amd.com/gpu=1")), scheduler),
            false,
            false,
        ),
    ];
    let bindings: Vec<Value> = cases.iter().map(|c| c.1.clone()).collect();
    let main = cel_eval(&expressions(&hooks[0]), &bindings);
    let guard = cel_eval(&expressions(&hooks[1]), &bindings);
    for (i, (what, _, want_main, want_guard)) in cases.iter().enumerate() {
        assert_eq!(main[i], json!(want_main), "main webhook, {what}");
        assert_eq!(guard[i], json!(want_guard), "guard, {what}");
    }
}

#[test]
fn webhook_per_kube_version() {
    let cases: Vec<Case> = crate::peers::kube_versions()
        .iter()
        .map(|kv| Case::new(kv, "hami-system", kv, json!({})))
        .chain([Case::new(
            "1.27 strict",
            "hami-system",
            "v1.27.0",
            json!({"webhook": {"failurePolicyWithoutMatchConditions": "Fail"}}),
        )])
        .collect();
    let answer = crate::peers::run(&cases, &[]);
    for (case, r) in cases.iter().zip(&answer.cases) {
        assert!(r.error.is_none(), "{:?}", r.error);
        let hook = webhook(r);
        assert_eq!(
            hook["rules"][0]["operations"],
            json!(["CREATE", "UPDATE"]),
            "{}",
            case.name
        );
        let old = case.kube_version.starts_with("v1.27.");
        let want_policy = if case.name == "1.27 strict" || !old {
            "Fail"
        } else {
            "Ignore"
        };
        assert_eq!(hook["failurePolicy"], want_policy, "{}", case.name);
        assert_eq!(hook["matchConditions"].is_null(), old, "{}", case.name);
        // The D-4 guard exists only where matchConditions keep it to annotated pods.
        assert_eq!(webhooks(r).len(), if old { 1 } else { 2 }, "{}", case.name);
        // certgen's patch Job writes the same policy back.
        let patch = r
            .objects()
            .into_iter()
            .map(|(_, v)| v)
            .find(|v| v["kind"] == "Job" && v["metadata"]["name"] == "hami-certgen-patch")
            .unwrap();
        let args = patch["spec"]["template"]["spec"]["containers"][0]["args"].clone();
        assert!(
            args.as_array()
                .unwrap()
                .contains(&json!(format!("--patch-failure-policy={want_policy}"))),
            "{}: {args}",
            case.name
        );
    }
}

async fn create_plain_pod_with_scheduler_down(fallback: &str) -> Result<(), String> {
    let server = hami_apiserver::ApiServer::start(hami_apiserver::Config::default())
        .await
        .unwrap();
    let kc = kube::config::Kubeconfig::from_yaml(&server.kubeconfig_yaml()).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(cfg).unwrap();
    // Helm's rendering for a server without matchConditions; the Service it points at has
    // no scheduler behind it (nothing listens at hami-scheduler.hami-system.svc).
    let answer = crate::peers::run(
        &[Case::new(
            "1.27",
            "hami-system",
            "v1.27.0",
            json!({"webhook": {"failurePolicyWithoutMatchConditions": fallback}}),
        )],
        &[],
    );
    let config = answer.cases[0]
        .objects()
        .into_iter()
        .map(|(_, v)| v)
        .find(|v| v["kind"] == "MutatingWebhookConfiguration")
        .unwrap();
    let whc: k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration =
        serde_json::from_value(config).unwrap();
    kube::Api::all(client.clone())
        .create(&Default::default(), &whc)
        .await
        .unwrap();
    let plain: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "coredns-like", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {"limits": {"cpu": "100m"}}}]}
    }))
    .unwrap();
    let res = kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client, "default")
        .create(&Default::default(), &plain)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string());
    server.shutdown().await;
    res
}

#[tokio::test]
async fn a_plain_pod_is_created_while_the_scheduler_is_down() {
    create_plain_pod_with_scheduler_down("Ignore")
        .await
        .expect("plain pod refused while the scheduler is down");
    let refused = create_plain_pod_with_scheduler_down("Fail").await;
    let e = refused.expect_err("with Fail and no matchConditions the webhook blocks every pod");
    assert!(e.contains("vgpu.hami.io"), "{e}");
}
