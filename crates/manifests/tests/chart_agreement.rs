//! The Helm chart (`deploy/helm/hami-rs`) and the typed manifests say the same thing.
//!
//! No `helm` binary exists on our machines, so the chart is rendered with
//! `hami_manifests::chart_template` (the Go-template subset the chart is restricted to; an
//! unsupported construct fails this test). Each rendered object must equal the typed one
//! (as parsed YAML, so formatting may differ), for the default values and for variants that
//! flip every conditional. The plain manifests in `deploy/manifests/` must be the typed
//! rendering byte for byte, and the container flags must parse with the components' own
//! command lines.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::Parser;
use hami_manifests::chart_template::{self, Context};
use hami_manifests::settings::{Image, Settings, TlsMode};
use hami_manifests::{Object, names, objects};
use serde_json::{Value, json};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn chart() -> PathBuf {
    repo().join("deploy/helm/hami-rs")
}

fn image_values(i: &Image) -> Value {
    json!({"registry": i.registry, "repository": i.repository, "tag": i.tag})
}

/// The Helm values that mean `s` (the mapping `docs/install.md` documents).
fn values_of(s: &Settings) -> Value {
    assert_eq!(s.scheduler_image.registry, s.node_image.registry);
    assert_eq!(s.scheduler_image.tag, s.node_image.tag);
    let p = &s.device_plugin;
    json!({
        "images": {
            "registry": s.scheduler_image.registry,
            "tag": s.scheduler_image.tag,
            "pullPolicy": s.image_pull_policy,
            "scheduler": {"repository": s.scheduler_image.repository},
            "node": {"repository": s.node_image.repository},
        },
        "scheduler": {
            "replicas": s.scheduler_replicas,
            "schedulerName": s.scheduler_name,
            "gpuSchedulerPolicy": s.gpu_scheduler_policy,
            "nodeSchedulerPolicy": s.node_scheduler_policy,
            "kubeScheduler": {"image": image_values(&s.kube_scheduler_image)},
        },
        "tls": {"mode": s.tls.value(), "certgen": {"image": image_values(&s.certgen_image)}},
        "devicePlugin": {
            "splitCount": p.split_count,
            "deviceMemoryScaling": p.device_memory_scaling,
            "pulse": p.pulse,
            "reportNodeCapacity": p.report_node_capacity,
            "operatingMode": p.operating_mode,
            "hostHookPath": p.host_hook_path,
            "privileged": p.privileged,
        },
        "monitor": {"enabled": s.monitor_enabled},
        "nodeLabeller": {"enabled": s.node_labeller_enabled},
        "serviceMonitor": {"enabled": s.service_monitor_enabled},
    })
}

fn templates() -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = std::fs::read_dir(chart().join("templates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read_to_string(&p).unwrap(),
            )
        })
        .collect();
    out.sort();
    assert!(out.len() >= 7, "chart templates not found");
    out
}

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

fn render_chart(s: &Settings) -> BTreeMap<Key, Value> {
    let values = values_of(s);
    let ctx = Context {
        release_name: "hami-rs",
        release_namespace: &s.namespace,
        values: &values,
    };
    let mut out = BTreeMap::new();
    for (name, text) in templates() {
        let rendered = chart_template::render(&name, &text, &ctx).unwrap();
        let mut doc = String::new();
        let mut flush = |doc: &mut String| {
            if doc
                .lines()
                .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
            {
                let v: Value = serde_saphyr::from_str(doc)
                    .unwrap_or_else(|e| panic!("{name}: rendered YAML does not parse: {e}\n{doc}"));
                assert!(
                    out.insert(key(&v), normalize(v.clone())).is_none(),
                    "{name}: duplicate {:?}",
                    key(&v)
                );
            }
            doc.clear();
        };
        for line in rendered.lines() {
            if line.trim_end() == "---" {
                flush(&mut doc);
            } else {
                doc.push_str(line);
                doc.push('\n');
            }
        }
        flush(&mut doc);
    }
    out
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

fn assert_agree(s: &Settings) {
    let chart = render_chart(s);
    let typed = typed(s);
    let chart_keys: Vec<_> = chart.keys().collect();
    let typed_keys: Vec<_> = typed.keys().collect();
    assert_eq!(
        chart_keys, typed_keys,
        "the chart and the typed manifests hold different objects"
    );
    for (k, t) in &typed {
        let c = &chart[k];
        assert!(
            c == t,
            "{k:?} differs:\nchart: {}\ntyped: {}",
            serde_json::to_string_pretty(c).unwrap(),
            serde_json::to_string_pretty(t).unwrap()
        );
    }
}

fn variants() -> Vec<Settings> {
    let d = Settings::default();
    let mut other = Settings {
        namespace: "gpu-sharing".into(),
        scheduler_replicas: 3,
        scheduler_name: "gpu-scheduler".into(),
        gpu_scheduler_policy: "binpack".into(),
        node_scheduler_policy: "spread".into(),
        tls: TlsMode::CertManager,
        monitor_enabled: false,
        node_labeller_enabled: false,
        service_monitor_enabled: true,
        image_pull_policy: "Always".into(),
        ..d.clone()
    };
    for img in [&mut other.scheduler_image, &mut other.node_image] {
        img.registry = "registry.example.com:5000".into();
        img.tag = "1.2.3".into();
    }
    other.kube_scheduler_image.tag = "v1.31.4".into();
    other.device_plugin.report_node_capacity = true;
    other.device_plugin.privileged = true;
    other.device_plugin.split_count = 4;
    other.device_plugin.device_memory_scaling = "1.5".into();
    other.device_plugin.host_hook_path = "/opt/hami".into();
    other.device_plugin.operating_mode = "partition".into();
    let monitors = Settings {
        service_monitor_enabled: true,
        ..d.clone()
    };
    vec![d, other, monitors]
}

#[test]
fn chart_and_typed_manifests_agree() {
    for s in variants() {
        assert_agree(&s);
    }
}

#[test]
fn values_yaml_defaults_are_the_typed_defaults() {
    let text = std::fs::read_to_string(chart().join("values.yaml")).unwrap();
    let values: Value = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(values, values_of(&Settings::default()));
}

#[test]
fn every_image_comes_from_values() {
    for (name, text) in templates() {
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
                rest.contains("{{ .Values.")
                    && !without_actions.contains(|c: char| c.is_alphanumeric()),
                "{name}: image not taken from values: {line}"
            );
        }
    }
}

#[test]
fn plain_manifests_are_the_typed_rendering() {
    let path = repo().join("deploy/manifests/hami-rs.yaml");
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
fn names_are_the_protocol_names() {
    use hami_protocol::names::{AMD, NVIDIA, pod};
    assert_eq!(names::WEBHOOK_IGNORE_LABEL, pod::WEBHOOK_LABEL);
    let managed: Vec<&str> = names::MANAGED_RESOURCES.to_vec();
    for r in [
        AMD.resource_count,
        AMD.resource_memory,
        AMD.resource_cores,
        NVIDIA.resource_count,
        NVIDIA.resource_memory,
        NVIDIA.resource_memory_percentage,
        NVIDIA.resource_cores,
    ] {
        assert!(
            managed.contains(&r),
            "{r} is not a managed resource of the extender"
        );
    }
}

#[test]
fn flags_parse_with_the_components_command_lines_and_ports_line_up() {
    for s in variants() {
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
        assert_eq!(resolved.scheduler_name, s.scheduler_name);
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
        assert_eq!(cli.args.cert_file.unwrap(), Path::new(&tls).join("tls.crt"));
        // kube-scheduler reaches the extender where it listens.
        let ks = hami_manifests::kube_scheduler_config::config(&s);
        assert_eq!(
            ks.extenders[0].url_prefix,
            format!("https://127.0.0.1:{}", cli.args.http_bind.port())
        );
        assert_eq!(ks.profiles[0].scheduler_name, s.scheduler_name);
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
        // Device plugin flags: accepted by k8s-device-plugin and valid.
        let ds = find("DaemonSet", names::DEVICE_PLUGIN);
        let plugin = container(ds, "device-plugin");
        let argv =
            std::iter::once("k8s-device-plugin".to_string()).chain(plugin.args.clone().unwrap());
        let args = hami_amd_plugin::cli::Args::try_parse_from(argv).unwrap();
        args.registration_settings().unwrap();
        assert_eq!(args.split_count, Some(s.device_plugin.split_count));
        assert_eq!(
            args.report_node_capacity,
            s.device_plugin.report_node_capacity
        );
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
                s.device_plugin.host_hook_path.trim_end_matches('/')
            )
        );
    }
}
