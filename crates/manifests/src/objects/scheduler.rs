//! The scheduler: kube-scheduler's configuration, the extender's arguments, its Deployment
//! and Service.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};

use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, Container, HTTPGetAction, KeyToPath, PodSecurityContext,
    PodSpec, PodTemplateSpec, Probe, SecretVolumeSource, SecurityContext, Volume,
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::kube_scheduler_config;
use crate::names::*;

use crate::settings::Settings;

use super::*;

/// The kube-scheduler configuration ConfigMap.
pub fn kube_scheduler_config_map(settings: &Settings) -> Result<Object, crate::Error> {
    Ok(Object::ConfigMap(ConfigMap {
        metadata: meta(KUBE_SCHEDULER_CONFIG, Some(&settings.namespace), SCHEDULER),
        data: Some(BTreeMap::from([(
            s("config.yaml"),
            kube_scheduler_config::config_yaml(settings)?,
        )])),
        ..Default::default()
    }))
}

/// The flags of the extender container.
pub fn scheduler_args(settings: &Settings) -> Vec<String> {
    let sched = &settings.values.scheduler;
    let mut args = vec![
        // /webhook, /healthz, /readyz (the Service's https port).
        format!("--http-bind=0.0.0.0:{SCHEDULER_HTTPS_PORT}"),
        format!("--cert-file={TLS_MOUNT}/tls.crt"),
        format!("--key-file={TLS_MOUNT}/tls.key"),
    ];
    // /filter, /bind for kube-scheduler and for followers forwarding to the leader: every
    // caller presents a certificate (issue 13 items 5, 8); never in the Service.
    args.push(format!("--extender-bind=0.0.0.0:{EXTENDER_PORT}"));
    if settings.client_ca() {
        args.extend([
            format!("--client-ca-file={TLS_MOUNT}/ca.crt"),
            format!("--forward-client-cert-file={CLIENT_TLS_MOUNT}/tls.crt"),
            format!("--forward-client-key-file={CLIENT_TLS_MOUNT}/tls.key"),
            format!("--forward-server-name={}", settings.service_dns_name()),
        ]);
    } else {
        // certgen: its serverAuth-only serving certificate is pinned and presented back.
        args.extend([
            format!("--client-cert-pin-file={TLS_MOUNT}/tls.crt"),
            format!("--forward-client-cert-file={TLS_MOUNT}/tls.crt"),
            format!("--forward-client-key-file={TLS_MOUNT}/tls.key"),
        ]);
    }
    args.extend([
        format!("--metrics-bind-address=0.0.0.0:{SCHEDULER_METRICS_PORT}"),
        format!("--scheduler-name={}", sched.scheduler_name),
        format!("--gpu-scheduler-policy={}", sched.gpu_scheduler_policy),
        format!("--node-scheduler-policy={}", sched.node_scheduler_policy),
        format!("--amd-mode={}", sched.amd_mode),
        s("--leader-elect"),
        format!("--lease-name={SCHEDULER_LEASE}"),
    ]);
    args
}

/// What kube-scheduler sees of the serving Secret: the CA as `ca.crt` (kube-webhook-certgen
/// names the key `ca`), and with certgen the pinned certificate and its key, which it
/// presents to the extender listener.
pub(super) fn kube_scheduler_tls_items(settings: &Settings) -> Vec<KeyToPath> {
    let item = |key: &str, path: &str| KeyToPath {
        key: s(key),
        path: s(path),
        mode: None,
    };
    if settings.client_ca() {
        vec![item("ca.crt", "ca.crt")]
    } else {
        vec![
            item("ca", "ca.crt"),
            item("tls.crt", "tls.crt"),
            item("tls.key", "tls.key"),
        ]
    }
}

/// The scheduler Deployment: the extender and webhook beside a kube-scheduler sidecar.
pub fn scheduler_deployment(settings: &Settings) -> Object {
    let ns = settings.namespace.as_str();
    let v = &settings.values;
    let pull = || Some(v.images.pull_policy.clone());
    let kube_scheduler = Container {
        name: s("kube-scheduler"),
        image: Some(settings.kube_scheduler_image().reference()),
        image_pull_policy: pull(),
        resources: resources(&v.scheduler.kube_scheduler.resources),
        command: Some(vec![
            s("kube-scheduler"),
            format!("--config={KUBE_SCHEDULER_CONFIG_MOUNT}/config.yaml"),
        ]),
        volume_mounts: Some(
            [
                mount("scheduler-config", KUBE_SCHEDULER_CONFIG_MOUNT, true),
                mount("tls-ca", TLS_MOUNT, true),
            ]
            .into_iter()
            .chain(
                settings
                    .client_ca()
                    .then(|| mount("tls-client", CLIENT_TLS_MOUNT, true)),
            )
            .collect(),
        ),
        security_context: Some(restricted(&[])),
        ..Default::default()
    };
    let probe = |path: &str| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(s(path)),
            port: IntOrString::String(s("https")),
            scheme: Some(s("HTTPS")),
            ..Default::default()
        }),
        period_seconds: Some(10),
        ..Default::default()
    };
    let extender = Container {
        name: s("extender"),
        image: Some(v.scheduler_image().reference()),
        image_pull_policy: pull(),
        resources: resources(&v.scheduler.pod.resources),
        command: Some(vec![s("/hami-scheduler")]),
        args: Some(scheduler_args(settings)),
        env: Some(vec![
            env_field("POD_NAME", "metadata.name"),
            env_field("POD_NAMESPACE", "metadata.namespace"),
        ]),
        ports: Some(vec![
            port("https", SCHEDULER_HTTPS_PORT),
            port("extender", EXTENDER_PORT),
            port("metrics", SCHEDULER_METRICS_PORT),
        ]),
        liveness_probe: Some(probe("/healthz")),
        readiness_probe: Some(probe("/readyz")),
        volume_mounts: Some(
            std::iter::once(mount("tls", TLS_MOUNT, true))
                .chain(
                    settings
                        .client_ca()
                        .then(|| mount("tls-client", CLIENT_TLS_MOUNT, true)),
                )
                .collect(),
        ),
        // An unprivileged port: no NET_BIND_SERVICE (which no_new_privs would void anyway).
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(65532),
            ..restricted(&[])
        }),
        ..Default::default()
    };
    Object::Deployment(Deployment {
        metadata: meta(SCHEDULER, Some(ns), SCHEDULER),
        spec: Some(DeploymentSpec {
            replicas: Some(v.scheduler.replicas),
            // A new pod is Ready before an old one goes (followers are Ready too).
            strategy: Some(DeploymentStrategy {
                type_: Some(s("RollingUpdate")),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::Int(1)),
                    max_unavailable: Some(IntOrString::Int(0)),
                }),
            }),
            selector: selector(SCHEDULER),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels(SCHEDULER)),
                    ..Default::default()
                }),
                spec: Some(placed(
                    PodSpec {
                        service_account_name: Some(s(SCHEDULER)),
                        containers: vec![kube_scheduler, extender],
                        security_context: Some(PodSecurityContext {
                            run_as_non_root: Some(true),
                            run_as_user: Some(65532),
                            ..Default::default()
                        }),
                        volumes: Some(
                            [
                                Volume {
                                    name: s("scheduler-config"),
                                    config_map: Some(ConfigMapVolumeSource {
                                        name: s(KUBE_SCHEDULER_CONFIG),
                                        ..Default::default()
                                    }),
                                    ..Default::default()
                                },
                                Volume {
                                    name: s("tls"),
                                    secret: Some(SecretVolumeSource {
                                        secret_name: Some(s(TLS_SECRET)),
                                        ..Default::default()
                                    }),
                                    ..Default::default()
                                },
                                // kube-scheduler: the CA (and, pinned, the certificate it presents).
                                Volume {
                                    name: s("tls-ca"),
                                    secret: Some(SecretVolumeSource {
                                        secret_name: Some(s(TLS_SECRET)),
                                        items: Some(kube_scheduler_tls_items(settings)),
                                        ..Default::default()
                                    }),
                                    ..Default::default()
                                },
                            ]
                            .into_iter()
                            .chain(settings.client_ca().then(|| Volume {
                                name: s("tls-client"),
                                secret: Some(SecretVolumeSource {
                                    secret_name: Some(s(CLIENT_TLS_SECRET)),
                                    ..Default::default()
                                }),
                                ..Default::default()
                            }))
                            .collect(),
                        ),
                        ..Default::default()
                    },
                    &v.scheduler.pod,
                )),
            },
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The scheduler Service: the webhook target and the metrics endpoint. Every replica whose
/// watches are live is Ready (leader or not), so the webhook keeps endpoints across a
/// handover; `/filter` and `/bind` are not here (the extender listener is pod-only).
pub fn scheduler_service(settings: &Settings) -> Object {
    cluster_ip_service(
        SCHEDULER,
        &settings.namespace,
        &[
            ("https", SERVICE_HTTPS_PORT),
            ("metrics", SCHEDULER_METRICS_PORT),
        ],
    )
}
