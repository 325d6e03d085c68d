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

mod flags;

use std::collections::BTreeMap;

use crate::peers::Case;

use hami_manifests::objects;
use hami_manifests::settings::{KubeVersion, Settings, Values};
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
        "webui": {"enabled": true, "prometheusUrl": "http://prometheus.monitoring:9090", "grafanaUrl": "https://grafana.example"},
        "nodeLabeller": {"enabled": false},
        "serviceMonitor": {"enabled": true, "labels": {"release": "kube-prometheus-stack"}, "interval": "30s"},
    });
    for c in ["scheduler", "devicePlugin", "webui"] {
        crate::peers::merge(&mut other[c], &placement);
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
        crate::peers::merge(&mut nvidia[c], &placement);
    }
    crate::peers::merge(&mut nvidia["tls"]["certgen"], &placement);
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
    crate::peers::merge(&mut dra["draPlugin"], &placement);
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
    let docs = crate::peers::documented_helm_commands();
    assert!(
        docs.len() >= 4,
        "docs/install.md documents too few helm commands: {docs:?}"
    );
    let sets: Vec<Vec<(String, String)>> = docs.iter().map(|(_, _, s)| s.clone()).collect();
    let parsed = crate::peers::run(&[], &sets).parsed_sets;
    let mut named: Vec<(String, String, Value)> = variants()
        .into_iter()
        .map(|(n, ns, v)| (n.to_string(), ns.to_string(), v))
        .collect();
    for ((line, ns, _), exprs) in docs.iter().zip(parsed) {
        let mut values = json!({});
        for e in exprs {
            crate::peers::merge(&mut values, &e);
        }
        named.push((format!("docs: {line}"), ns.clone(), values));
    }
    let mut out = Vec::new();
    for kv in crate::peers::kube_versions() {
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
    let answer = crate::peers::run(&cases, &[]);
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
    let answer = crate::peers::run(
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
            json!({"webui": {"grafanaUrl": "grafana:3000"}}),
            "/webui/grafanaUrl",
        ),
        (
            json!({"webui": {"grafanaUrl": "https://g\n- --listen=0.0.0.0:1"}}),
            "/webui/grafanaUrl",
        ),
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
    let answer = crate::peers::run(&cases, &[]);
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
    let answer = crate::peers::run(
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
    let answer = crate::peers::run(&cases, &[]);
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
    for entry in std::fs::read_dir(crate::peers::chart_dir().join("templates")).unwrap() {
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
    let path = crate::peers::repo().join("deploy/manifests/hami-rs.yaml");
    let expected = hami_manifests::render(&Settings::default()).unwrap();
    let actual = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        actual == expected,
        "{} is stale: regenerate with `cargo run -p hami-manifests --example render > deploy/manifests/hami-rs.yaml`",
        path.display()
    );
}
