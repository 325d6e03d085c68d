//! The Helm chart (`deploy/helm/hami-rs`) and the typed manifests say the same thing, with
//! real Helm on the chart's side.
//!
//! Helm v4's engine (PyPI helm-python-sdk) renders the chart for every supported Kubernetes
//! version (1.27 … 1.37) with the default values, with variants that flip every conditional
//! and with every `helm install`/`helm upgrade` command in docs/install.md; `helm lint
//! --strict` must find nothing, kubernetes-validate (strict) must accept every object
//! against that version's upstream schema, and Helm's *merged* values, read back through
//! `hami_manifests::Values`, must give the typed manifests object for object. The plain
//! manifests in `deploy/manifests/` must be the typed rendering byte for byte, and the
//! container flags must parse with the components' own command lines.

mod peers;

use std::collections::BTreeMap;
use std::path::Path;

use clap::Parser;
use hami_manifests::settings::{KubeVersion, Settings, Values};
use hami_manifests::{Object, names, objects};
use peers::Case;
use serde_json::{Value, json};

type Key = (String, String, String);

fn key(v: &Value) -> Key {
    let s = |p: &Value| p.as_str().unwrap_or("").to_string();
    (
        s(&v["kind"]),
        s(&v["metadata"]["namespace"]),
        s(&v["metadata"]["name"]),
    )
}

/// YAML embedded in ConfigMaps is compared as data, not as text.
fn normalize(mut v: Value) -> Value {
    if v["kind"] == "ConfigMap"
        && let Some(data) = v.get_mut("data").and_then(Value::as_object_mut)
    {
        for (k, text) in data.iter_mut() {
            if k.ends_with(".yaml") {
                let parsed: Value = serde_saphyr::from_str(text.as_str().unwrap()).unwrap();
                *text = parsed;
            }
        }
    }
    v
}

/// Rust-side variants (user values), flipping every conditional and every placement key.
fn variants() -> Vec<(&'static str, &'static str, Value)> {
    let placement = json!({
        "priorityClassName": "gpu-critical",
        "nodeSelector": {"node-role.example.com/gpu": "true"},
        "tolerations": [{"key": "gpu", "operator": "Equal", "value": "amd", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]}}},
        "resources": {"requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
    });
    let mut other = json!({
        "images": {"registry": "registry.example.com:5000", "tag": "1.2.3", "pullPolicy": "Always"},
        "scheduler": {
            "replicas": 3, "schedulerName": "gpu-scheduler",
            "gpuSchedulerPolicy": "binpack", "nodeSchedulerPolicy": "spread",
            "kubeScheduler": {"image": {"tag": "v1.31.4"}, "resources": {"limits": {"cpu": "1"}}},
        },
        "tls": {"mode": "cert-manager"},
        "devicePlugin": {
            "splitCount": 4, "deviceMemoryScaling": "1.5", "reportNodeCapacity": true,
            "operatingMode": "partition", "hostHookPath": "/opt/hami/", "privileged": true,
            "slicePartitions": true,
            "exporterSocket": "/var/lib/amd-metrics-exporter/amdgpu_device_metrics_exporter_grpc.socket",
            "cdi": {"enabled": true, "specDir": "/etc/cdi"},
        },
        "monitor": {"enabled": false, "legacyMetrics": "none"},
        "webui": {"enabled": true, "prometheusUrl": "http://prometheus.monitoring:9090"},
        "nodeLabeller": {"enabled": false},
        "serviceMonitor": {"enabled": true, "labels": {"release": "kube-prometheus-stack"}, "interval": "30s"},
    });
    for c in ["scheduler", "devicePlugin", "webui"] {
        peers::merge(&mut other[c], &placement);
    }
    let mut nvidia = json!({
        "nvidiaDevicePlugin": {
            "enabled": true, "deviceSplitCount": 4, "deviceMemoryScaling": "2",
            "deviceCoresScaling": "1.5", "reportNodeCapacity": true, "runtimeClassName": "nvidia",
        },
        "webhook": {"failurePolicyWithoutMatchConditions": "Fail"},
        "monitor": {"legacyMetrics": "all"},
        "serviceMonitor": {"enabled": true},
        "tls": {"certgen": {}},
    });
    for c in ["nvidiaDevicePlugin", "monitor", "nodeLabeller"] {
        peers::merge(&mut nvidia[c], &placement);
    }
    peers::merge(&mut nvidia["tls"]["certgen"], &placement);
    // DRA mode (Kubernetes >= 1.34 only, see `cases`): the device plugin's affinity gets
    // the not-DRA requirement added to each of the user's terms, the driver's placement
    // merges the DRA node label into the user's selector.
    let mut dra = json!({
        "draPlugin": {
            "enabled": true, "splitCount": 4, "extendedResourceName": false,
            "publishInterval": 10, "cdiSpecDir": "/etc/cdi",
        },
        // The web UI's DRA rules and its --dra flag.
        "webui": {"enabled": true},
        "devicePlugin": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]},
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-1"]}]},
            ]}}}},
    });
    peers::merge(&mut dra["draPlugin"], &placement);
    vec![
        ("defaults", "hami-system", json!({})),
        ("every-switch-flipped", "gpu-sharing", other),
        ("nvidia", "hami-system", nvidia),
        ("dra", "hami-system", dra),
        (
            "dra-defaults",
            "hami-system",
            json!({"draPlugin": {"enabled": true}}),
        ),
    ]
}

/// The first minor a variant renders at (DRA needs `resource.k8s.io/v1`).
fn min_minor(values: &Value) -> u32 {
    if values["draPlugin"]["enabled"] == json!(true) {
        hami_manifests::settings::DRA_V1_MINOR
    } else {
        0
    }
}

/// Every case: each variant and each documented command, at each supported version.
fn cases() -> (Vec<Case>, Vec<String>) {
    let docs = peers::documented_helm_commands();
    assert!(
        docs.len() >= 4,
        "docs/install.md documents too few helm commands: {docs:?}"
    );
    let sets: Vec<Vec<(String, String)>> = docs.iter().map(|(_, _, s)| s.clone()).collect();
    let parsed = peers::run(&[], &sets).parsed_sets;
    let mut named: Vec<(String, String, Value)> = variants()
        .into_iter()
        .map(|(n, ns, v)| (n.to_string(), ns.to_string(), v))
        .collect();
    for ((line, ns, _), exprs) in docs.iter().zip(parsed) {
        let mut values = json!({});
        for e in exprs {
            peers::merge(&mut values, &e);
        }
        named.push((format!("docs: {line}"), ns.clone(), values));
    }
    let mut out = Vec::new();
    for kv in peers::kube_versions() {
        let minor = KubeVersion::parse(&kv).unwrap().minor;
        for (n, ns, v) in named.iter().filter(|(_, _, v)| minor >= min_minor(v)) {
            out.push(Case::new(&format!("{n} @ {kv}"), ns, &kv, v.clone()));
        }
    }
    (out, docs.into_iter().map(|(l, _, _)| l).collect())
}

fn typed(s: &Settings) -> BTreeMap<Key, Value> {
    objects::all(s, false)
        .unwrap()
        .iter()
        .map(|o| {
            let v = o.to_value().unwrap();
            (key(&v), normalize(v))
        })
        .collect()
}

#[test]
fn real_helm_renders_lints_validates_and_agrees_with_the_typed_manifests() {
    let (cases, _) = cases();
    let answer = peers::run(&cases, &[]);
    assert!(
        answer.helm_sdk_version.starts_with("v4."),
        "not Helm v4: {}",
        answer.helm_sdk_version
    );
    for (case, rendered) in cases.iter().zip(&answer.cases) {
        rendered.assert_clean();
        // The schema version used is the cluster's own (kubernetes-validate ships 1.27+).
        let minor = &case.kube_version[..case.kube_version.rfind('.').unwrap()];
        assert_eq!(
            rendered.schema_version.as_deref().map(|v| format!("v{v}")),
            Some(format!("{minor}.0")),
            "{}",
            case.name
        );
        let values = Values::from_json(rendered.merged_values.clone())
            .unwrap_or_else(|e| panic!("{}: Helm's merged values: {e}", case.name));
        let settings = Settings {
            namespace: case.namespace.clone(),
            kube_version: KubeVersion::parse(&case.kube_version).unwrap(),
            values,
        };
        let mut chart = BTreeMap::new();
        for (path, v) in rendered.objects() {
            assert!(
                chart.insert(key(&v), normalize(v.clone())).is_none(),
                "{}: {path}: duplicate {:?}",
                case.name,
                key(&v)
            );
        }
        let typed = typed(&settings);
        assert_eq!(
            chart.keys().collect::<Vec<_>>(),
            typed.keys().collect::<Vec<_>>(),
            "{}: the chart and the typed manifests hold different objects",
            case.name
        );
        for (k, t) in &typed {
            let c = &chart[k];
            assert!(
                c == t,
                "{}: {k:?} differs:\nchart: {}\ntyped: {}",
                case.name,
                serde_json::to_string_pretty(c).unwrap(),
                serde_json::to_string_pretty(t).unwrap()
            );
        }
    }
}

#[test]
fn helms_default_values_are_the_typed_defaults() {
    let answer = peers::run(
        &[Case::new("defaults", "hami-system", "v1.33.0", json!({}))],
        &[],
    );
    let merged = &answer.cases[0].merged_values;
    assert_eq!(
        Values::from_json(merged.clone()).unwrap(),
        Values::default()
    );
}

#[test]
fn bad_values_fail_at_render_with_a_message_naming_the_value() {
    let bad = [
        (json!({"tls": {"mode": "bogus"}}), "/tls/mode"),
        (json!({"scheduler": {"replicas": 0}}), "/scheduler/replicas"),
        (
            json!({"devicePlugin": {"splitCount": 0}}),
            "/devicePlugin/splitCount",
        ),
        (
            json!({"devicePlugin": {"hostHookPath": "usr/local"}}),
            "/devicePlugin/hostHookPath",
        ),
        (
            json!({"scheduler": {"gpuSchedulerPolicy": "random"}}),
            "/scheduler/gpuSchedulerPolicy",
        ),
        (
            json!({"webhook": {"failurePolicyWithoutMatchConditions": "Maybe"}}),
            "failurePolicyWithoutMatchConditions",
        ),
        (json!({"devicePlugin": {"splitCuont": 2}}), "splitCuont"),
        (
            json!({"devicePlugin": {"exporterSocket": "exporter.sock"}}),
            "/devicePlugin/exporterSocket",
        ),
        (
            json!({"devicePlugin": {"cdi": {"enabled": true, "specDir": "cdi"}}}),
            "/devicePlugin/cdi/specDir",
        ),
        (json!({"monitor": {"enabled": "yes"}}), "/monitor/enabled"),
        (
            json!({"monitor": {"legacyMetrics": "some"}}),
            "/monitor/legacyMetrics",
        ),
        (
            json!({"draPlugin": {"enabled": true, "cdiSpecDir": "cdi"}}),
            "/draPlugin/cdiSpecDir",
        ),
        (
            json!({"draPlugin": {"enabled": true, "publishInterval": 0}}),
            "/draPlugin/publishInterval",
        ),
        (
            json!({"draPlugin": {"splitCount": 0}}),
            "/draPlugin/splitCount",
        ),
        (
            json!({"scheduler": {"amdMode": "both"}}),
            "/scheduler/amdMode",
        ),
        // The webhook's DRA mode without the DRA driver (and the scheduler's DRA rights).
        (
            json!({"scheduler": {"amdMode": "dra"}}),
            "scheduler.amdMode dra needs draPlugin.enabled",
        ),
    ];
    let mut cases: Vec<Case> = bad
        .iter()
        .map(|(v, _)| Case::new("bad", "hami-system", "v1.33.0", v.clone()))
        .collect();
    cases.push(Case::new(
        "old cluster",
        "hami-system",
        "v1.26.15",
        json!({}),
    ));
    cases.push(Case::new(
        "split hook dirs",
        "hami-system",
        "v1.33.0",
        json!({"nvidiaDevicePlugin": {"enabled": true, "hostHookPath": "/opt/nv"}}),
    ));
    // DRA on a cluster without resource.k8s.io/v1.
    cases.push(Case::new(
        "dra on 1.33",
        "hami-system",
        "v1.33.0",
        json!({"draPlugin": {"enabled": true}}),
    ));
    let answer = peers::run(&cases, &[]);
    for (i, (values, needle)) in bad.iter().enumerate() {
        let e = answer.cases[i]
            .error
            .as_deref()
            .unwrap_or_else(|| panic!("{values}: Helm rendered a bad value without complaint"));
        assert!(e.contains(needle), "{values}: {e}");
    }
    let old = answer.cases[bad.len()].error.as_deref().unwrap_or("");
    assert!(old.contains("1.27 to 1.37"), "{old}");
    let split = answer.cases[bad.len() + 1].error.as_deref().unwrap_or("");
    assert!(split.contains("one hook directory"), "{split}");
    let dra = answer.cases[bad.len() + 2].error.as_deref().unwrap_or("");
    assert!(
        dra.contains("draPlugin.enabled needs resource.k8s.io/v1 (Kubernetes 1.34"),
        "{dra}"
    );
    // The typed manifests refuse the same, with the same advice.
    let mut typed = Settings {
        kube_version: KubeVersion::parse("v1.33.0").unwrap(),
        ..Settings::default()
    };
    typed.values.dra_plugin.enabled = true;
    let e = objects::all(&typed, false).unwrap_err().to_string();
    assert!(
        e.contains("draPlugin.enabled needs resource.k8s.io/v1") && e.contains("device plugin"),
        "{e}"
    );
    let mut typed = Settings::default();
    typed.values.scheduler.amd_mode = "dra".into();
    let e = objects::all(&typed, false).unwrap_err().to_string();
    assert!(
        e.contains("scheduler.amdMode dra needs draPlugin.enabled"),
        "{e}"
    );
    typed.values.scheduler.amd_mode = "both".into();
    let e = objects::all(&typed, false).unwrap_err().to_string();
    assert!(e.contains("scheduler.amdMode"), "{e}");
}

#[test]
fn the_schema_validator_is_not_a_rubber_stamp() {
    // A misspelt field in a rendered object must be caught by the same path the agreement
    // test relies on (an extra template dropped into a scratch copy of the chart would be
    // the alternative; a value that reaches a free-form field does the same with less).
    let answer = peers::run(
        &[Case::new(
            "misspelt toleration",
            "hami-system",
            "v1.33.0",
            json!({"monitor": {"tolerations": [{"key": "a", "operater": "Exists"}]}}),
        )],
        &[],
    );
    let r = &answer.cases[0];
    assert!(r.error.is_none(), "{:?}", r.error);
    assert!(
        r.validation.iter().any(|p| p.error.contains("operater")),
        "kubernetes-validate --strict let an unknown field through: {:?}",
        r.validation
    );
}

#[test]
fn the_kube_scheduler_image_follows_the_cluster() {
    let cases: Vec<Case> = ["v1.27.16", "v1.30.4-eks-a737599", "v1.37.1+k3s1"]
        .iter()
        .map(|v| Case::new(v, "hami-system", v, json!({})))
        .collect();
    let answer = peers::run(&cases, &[]);
    for (case, want) in cases.iter().zip(["v1.27.16", "v1.30.4", "v1.37.1"]) {
        let r = answer.cases.iter().find(|r| r.name == case.name).unwrap();
        r.assert_clean();
        let image = r
            .objects()
            .into_iter()
            .find(|(_, v)| v["kind"] == "Deployment")
            .map(|(_, v)| v["spec"]["template"]["spec"]["containers"][0]["image"].clone())
            .unwrap();
        assert_eq!(image, format!("registry.k8s.io/kube-scheduler:{want}"));
        let typed = Settings {
            kube_version: KubeVersion::parse(&case.kube_version).unwrap(),
            ..Settings::default()
        };
        assert_eq!(image, typed.kube_scheduler_image().reference());
    }
}

#[test]
fn every_image_comes_from_values() {
    for entry in std::fs::read_dir(peers::chart_dir().join("templates")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        for line in text
            .lines()
            .filter(|l| l.trim_start().starts_with("image:"))
        {
            let rest = line.trim_start().trim_start_matches("image:").trim();
            let without_actions = rest
                .split("{{")
                .map(|part| part.split_once("}}").map_or(part, |(_, after)| after))
                .collect::<String>();
            assert!(
                (rest.contains("{{ .Values.")
                    || rest.contains("{{ include \"hami.kubeSchedulerImage\""))
                    && !without_actions.contains(|c: char| c.is_alphanumeric()),
                "{}: image not taken from values: {line}",
                path.display()
            );
        }
    }
}

#[test]
fn plain_manifests_are_the_typed_rendering() {
    let path = peers::repo().join("deploy/manifests/hami-rs.yaml");
    let expected = hami_manifests::render(&Settings::default()).unwrap();
    let actual = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        actual == expected,
        "{} is stale: regenerate with `cargo run -p hami-manifests --example render > deploy/manifests/hami-rs.yaml`",
        path.display()
    );
}

#[derive(Parser)]
struct SchedulerCli {
    #[command(flatten)]
    args: hami_scheduler::config::SchedulerArgs,
}

fn container<'a>(obj: &'a Object, name: &str) -> &'a k8s_openapi::api::core::v1::Container {
    let spec = match obj {
        Object::Deployment(d) => d.spec.as_ref().unwrap().template.spec.as_ref().unwrap(),
        Object::DaemonSet(d) => d.spec.as_ref().unwrap().template.spec.as_ref().unwrap(),
        _ => panic!("no pod template"),
    };
    spec.containers.iter().find(|c| c.name == name).unwrap()
}

#[test]
fn managed_resources_are_the_protocol_table_in_the_rendered_config() {
    use hami_protocol::names::pod;
    assert_eq!(names::WEBHOOK_IGNORE_LABEL, pod::WEBHOOK_LABEL);
    let want: Vec<String> = hami_protocol::names::managed_resources()
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert!(want.contains(&"amd.com/gpumem-percentage".to_string()));
    // Helm's rendering of the chart, not our own serializer.
    let answer = peers::run(
        &[Case::new("defaults", "hami-system", "v1.33.0", json!({}))],
        &[],
    );
    let cm = answer.cases[0]
        .objects()
        .into_iter()
        .find(|(_, v)| v["kind"] == "ConfigMap")
        .map(|(_, v)| v)
        .unwrap();
    let config: Value =
        serde_saphyr::from_str(cm["data"]["config.yaml"].as_str().unwrap()).unwrap();
    let got: Vec<String> = config["extenders"][0]["managedResources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert_eq!(r["ignoredByScheduler"], true);
            r["name"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(got, want);
}

#[test]
fn flags_parse_with_the_components_command_lines_and_ports_line_up() {
    for (_, ns, overrides) in variants() {
        let mut merged = serde_json::to_value(Values::default()).unwrap();
        peers::merge(&mut merged, &overrides);
        let mut s = Settings {
            namespace: ns.into(),
            values: Values::from_json(merged).unwrap(),
            ..Settings::default()
        };
        if min_minor(&overrides) > s.kube_version.minor {
            s.kube_version =
                KubeVersion::parse(&format!("v1.{}.0", min_minor(&overrides))).unwrap();
        }
        let objs = objects::all(&s, true).unwrap();
        let find = |kind: &str, name: &str| {
            objs.iter()
                .find(|o| {
                    let v = o.to_value().unwrap();
                    v["kind"] == kind && v["metadata"]["name"] == name
                })
                .unwrap_or_else(|| panic!("{kind} {name} missing"))
        };
        // Extender flags: accepted by hami-scheduler and resolved without error.
        let deployment = find("Deployment", names::SCHEDULER);
        let extender = container(deployment, "extender");
        let argv =
            std::iter::once("hami-scheduler".to_string()).chain(extender.args.clone().unwrap());
        let cli = SchedulerCli::try_parse_from(argv).unwrap();
        let resolved = hami_scheduler::config::Settings::load(&cli.args).unwrap();
        assert_eq!(resolved.scheduler_name, s.values.scheduler.scheduler_name);
        assert_eq!(
            cli.args.http_bind.port() as i32,
            names::SCHEDULER_HTTPS_PORT
        );
        assert_eq!(
            cli.args.metrics_bind_address.port() as i32,
            names::SCHEDULER_METRICS_PORT
        );
        assert!(cli.args.leader_elect);
        assert_eq!(cli.args.lease_name, names::SCHEDULER_LEASE);
        let tls = extender.volume_mounts.as_ref().unwrap()[0]
            .mount_path
            .clone();
        assert_eq!(
            cli.args.cert_file.clone().unwrap(),
            Path::new(&tls).join("tls.crt")
        );
        // The files the extender reads are keys the TLS source writes into the Secret:
        // kube-webhook-certgen writes `ca`, `--cert-name` (default `cert`) and `--key-name`
        // (default `key`); cert-manager writes `tls.crt`, `tls.key`, `ca.crt`.
        let written: Vec<String> = match objs.iter().find_map(|o| match o {
            Object::Job(j) if j.metadata.name.as_deref() == Some("hami-certgen-create") => {
                Some(j.clone())
            }
            _ => None,
        }) {
            Some(job) => {
                let args = job.spec.unwrap().template.spec.unwrap().containers[0]
                    .args
                    .clone()
                    .unwrap();
                let flag = |name: &str, default: &str| {
                    args.iter()
                        .find_map(|a| a.strip_prefix(&format!("--{name}=")))
                        .unwrap_or(default)
                        .to_string()
                };
                vec![
                    "ca".into(),
                    flag("cert-name", "cert"),
                    flag("key-name", "key"),
                ]
            }
            None => vec!["tls.crt".into(), "tls.key".into(), "ca.crt".into()],
        };
        let mut read_from_tls = vec![
            cli.args.cert_file.clone().unwrap(),
            cli.args.key_file.clone().unwrap(),
        ];
        read_from_tls.extend(cli.args.client_ca_file.clone());
        // kube-scheduler's copy of the CA: the key its volume projects as ca.crt.
        let Object::Deployment(d) = deployment else {
            panic!()
        };
        let pod = d.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
        let ca_vol = pod
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == "tls-ca")
            .unwrap();
        let items = ca_vol.secret.as_ref().unwrap().items.as_ref().unwrap();
        assert!(items.iter().any(|i| i.path == "ca.crt"));
        for item in items {
            read_from_tls.push(Path::new(&tls).join(&item.key));
        }
        for file in read_from_tls {
            let key = file
                .strip_prefix(&tls)
                .unwrap()
                .to_str()
                .unwrap()
                .to_string();
            assert!(
                written.contains(&key),
                "the extender reads {key} from the Secret, which holds {written:?}"
            );
        }
        // kube-scheduler reaches the extender where /filter and /bind are served: the
        // scheduler's own listener plan serves them on the extender listener, warns of
        // nothing, and forwards to the leader whenever there are several replicas.
        let plan = hami_scheduler::server::listener_plan(&cli.args).unwrap();
        assert_eq!(plan.warning, None);
        assert!(!plan.main_serves_extender);
        let (extender_addr, auth) = plan.extender.clone().expect("an extender listener");
        // Followers reach the leader on its pod IP: not loopback, so callers authenticate,
        // by the CA (cert-manager) or the pinned serving certificate (certgen).
        assert!(!extender_addr.ip().is_loopback());
        use hami_scheduler::server::CallerAuth;
        match (&auth, s.client_ca()) {
            (Some(CallerAuth::Ca(ca)), true) => {
                assert_eq!(ca, &Path::new(&tls).join("ca.crt"))
            }
            (Some(CallerAuth::Pin(pin)), false) => {
                assert_eq!(Some(pin), cli.args.cert_file.as_ref())
            }
            other => panic!(
                "extender listener authentication {other:?} for {:?}",
                s.values.tls.mode
            ),
        }
        assert!(plan.forwarding, "followers must forward to the leader");
        let ks = hami_manifests::kube_scheduler_config::config(&s);
        assert_eq!(
            ks.extenders[0].url_prefix,
            format!("https://127.0.0.1:{}", extender_addr.port())
        );
        // kube-scheduler presents what the listener accepts: the client certificate of the
        // CA, or the pinned serving certificate (the same Secret key the extender serves).
        let presented = ks.extenders[0]
            .tls_config
            .cert_file
            .clone()
            .expect("a client certificate");
        if s.client_ca() {
            assert_eq!(presented, format!("{}/tls.crt", names::CLIENT_TLS_MOUNT));
        } else {
            assert_eq!(Path::new(&presented), cli.args.cert_file.as_ref().unwrap());
        }
        assert_eq!(
            ks.profiles[0].scheduler_name,
            s.values.scheduler.scheduler_name
        );
        // The webhook calls the Service, whose https port targets the extender's port.
        let Object::MutatingWebhookConfiguration(wh) =
            find("MutatingWebhookConfiguration", names::WEBHOOK)
        else {
            panic!()
        };
        let svc_ref = wh.webhooks.as_ref().unwrap()[0]
            .client_config
            .service
            .clone()
            .unwrap();
        assert_eq!(svc_ref.path.as_deref(), Some("/webhook"));
        let Object::Service(svc) = find("Service", &svc_ref.name) else {
            panic!()
        };
        let ports = svc.spec.as_ref().unwrap().ports.clone().unwrap();
        assert!(
            ports.iter().all(|p| p.port != names::EXTENDER_PORT
                && p.target_port
                    != Some(
                        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(
                            "extender".into()
                        )
                    )),
            "the extender listener is not in the Service"
        );
        let https = ports.iter().find(|p| Some(p.port) == svc_ref.port).unwrap();
        let target = match https.target_port.clone().unwrap() {
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(n) => n,
            other => panic!("{other:?}"),
        };
        let cport = extender
            .ports
            .as_ref()
            .unwrap()
            .iter()
            .find(|p| p.name.as_deref() == Some(&target))
            .unwrap();
        assert_eq!(cport.container_port as u16, cli.args.http_bind.port());
        // Device plugin flags: accepted by k8s-device-plugin and valid; the split count
        // reaches the plugin only when the operator set one (else its gfx12 default holds).
        let ds = find("DaemonSet", names::DEVICE_PLUGIN);
        let plugin = container(ds, "device-plugin");
        let argv =
            std::iter::once("k8s-device-plugin".to_string()).chain(plugin.args.clone().unwrap());
        let args = hami_amd_plugin::cli::Args::try_parse_from(argv).unwrap();
        args.registration_settings().unwrap();
        assert_eq!(args.split_count, s.values.device_plugin.split_count);
        assert_eq!(
            args.report_node_capacity,
            s.values.device_plugin.report_node_capacity
        );
        // Partition slicing, the exporter socket and CDI reach the plugin as set; the
        // exporter's directory is mounted read-only, the CDI directory writable, and only
        // when on.
        let dp = &s.values.device_plugin;
        assert_eq!(args.slice_partitions, dp.slice_partitions);
        assert_eq!(args.cdi, dp.cdi.enabled);
        let mounts = plugin.volume_mounts.as_ref().unwrap();
        let mount_at = |path: &std::path::Path| {
            mounts
                .iter()
                .find(|m| path.starts_with(&m.mount_path) && m.mount_path != "/")
        };
        if dp.cdi.enabled {
            assert_eq!(args.cdi_spec_dir, std::path::Path::new(&dp.cdi.spec_dir));
            let m = mount_at(&args.cdi_spec_dir).expect("the CDI spec directory is mounted");
            assert_ne!(m.read_only, Some(true), "the plugin writes its CDI spec");
        } else {
            assert!(
                mounts.iter().all(|m| m.name != "cdi"),
                "CDI mount while off"
            );
        }
        if dp.exporter_socket.is_empty() {
            assert!(mounts.iter().all(|m| m.name != "exporter"));
            assert!(
                mount_at(&args.exporter_socket).is_none(),
                "no exporter socket mounted"
            );
        } else {
            assert_eq!(
                args.exporter_socket,
                std::path::Path::new(&dp.exporter_socket)
            );
            let m = mount_at(&args.exporter_socket).expect("the exporter socket is mounted");
            assert_eq!((m.name.as_str(), m.read_only), ("exporter", Some(true)));
        }
        // The hook is mounted where the plugin will point containers at it.
        let hook_mount = plugin
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.name == "hook")
            .unwrap();
        assert_eq!(
            format!("{}/libamvgpu.so", hook_mount.mount_path),
            format!(
                "{}/vgpu/libamvgpu.so",
                s.values.device_plugin.host_hook_path.trim_end_matches('/')
            )
        );
        // Monitor flags: the legacy-metrics choice is one the monitor knows.
        if s.values.monitor.enabled {
            let ds = find("DaemonSet", names::MONITOR);
            let monitor = container(ds, "monitor");
            let legacy = monitor
                .args
                .as_ref()
                .unwrap()
                .iter()
                .find_map(|a| a.strip_prefix("--legacy-metrics="))
                .expect("--legacy-metrics=<value>");
            <hami_monitor::metrics::LegacyMetrics as clap::ValueEnum>::from_str(legacy, false)
                .unwrap();
        }
        // NVIDIA plugin flags: accepted by nvidia-device-plugin and valid.
        if s.values.nvidia_device_plugin.enabled {
            let ds = find("DaemonSet", names::NVIDIA_DEVICE_PLUGIN);
            let plugin = container(ds, "device-plugin");
            let argv = std::iter::once("nvidia-device-plugin".to_string())
                .chain(plugin.args.clone().unwrap());
            let args = hami_nvidia_plugin::cli::Args::try_parse_from(argv).unwrap();
            args.settings().unwrap();
            assert_eq!(
                args.device_split_count,
                s.values.nvidia_device_plugin.device_split_count
            );
            let hook_env = plugin
                .env
                .as_ref()
                .unwrap()
                .iter()
                .find(|e| e.name == "HOOK_PATH")
                .unwrap();
            let hook_mount = &plugin.volume_mounts.as_ref().unwrap()[1];
            assert_eq!(
                format!(
                    "{}/vgpu",
                    hook_env.value.as_deref().unwrap().trim_end_matches('/')
                ),
                hook_mount.mount_path
            );
        }
    }
}

#[test]
fn default_split_count_is_the_plugins_own() {
    // Today's manifests forced --split_count=10, overriding gfx12's default of 2.
    let answer = peers::run(
        &[Case::new("defaults", "hami-system", "v1.33.0", json!({}))],
        &[],
    );
    let ds = answer.cases[0]
        .objects()
        .into_iter()
        .find(|(_, v)| v["kind"] == "DaemonSet" && v["metadata"]["name"] == names::DEVICE_PLUGIN)
        .map(|(_, v)| v)
        .unwrap();
    let args: Vec<String> =
        serde_json::from_value(ds["spec"]["template"]["spec"]["containers"][0]["args"].clone())
            .unwrap();
    assert!(!args.iter().any(|a| a.contains("split_count")), "{args:?}");
    let cli = hami_amd_plugin::cli::Args::try_parse_from(
        std::iter::once("k8s-device-plugin".to_string()).chain(args),
    )
    .unwrap();
    assert_eq!(cli.split_count, None);
}

#[test]
fn the_webhooks_writer_exemption_is_the_schedulers_d4_writers() {
    // The webhook lets our components' writes through without a call (matchConditions);
    // the scheduler's D-4 allows exactly the same accounts to write its annotations.
    assert_eq!(
        hami_scheduler::admission::ANNOTATION_WRITER_SERVICE_ACCOUNTS,
        objects::ANNOTATION_WRITERS
    );
    let s = Settings::default();
    let expr = objects::not_a_writer_expression(&s);
    for sa in objects::ANNOTATION_WRITERS {
        assert!(expr.contains(&format!("'system:serviceaccount:{}:{sa}'", s.namespace)));
    }
}
