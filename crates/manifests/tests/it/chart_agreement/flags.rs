//! The rendered containers against the components themselves: every container's flags parse
//! with that component's own command line, ports line up, and the tables the chart carries
//! (managed resources, split count, the webhook's writer exemption) are the components' own.

use crate::peers::Case;
use clap::Parser;
use hami_manifests::settings::{KubeVersion, Settings, Values};
use hami_manifests::{Object, names, objects};
use serde_json::{Value, json};

use std::path::Path;

use super::*;

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
    let answer = crate::peers::run(
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
        crate::peers::merge(&mut merged, &overrides);
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
    let answer = crate::peers::run(
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
