//! The web UI: arguments, Deployment, Service.

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};

use k8s_openapi::api::core::v1::{
    Container, HTTPGetAction, PodSpec, PodTemplateSpec, Probe, SecurityContext,
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::names::*;

use crate::settings::Settings;

use super::*;

/// The web UI's arguments (the chart's `webui.yaml` writes the same): `--dra` exactly when
/// its role has the DRA rules ([`rbac::webui_dra_cluster_rules`]), else `--dra=off` (not its
/// default, `auto`, which would watch them once a node is in DRA mode), so it watches what
/// it may read.
pub fn webui_args(settings: &Settings) -> Vec<String> {
    let mut args = vec![format!("--listen=0.0.0.0:{WEBUI_PORT}")];
    let url = &settings.values.webui.prometheus_url;
    if !url.is_empty() {
        args.push(format!("--prometheus={url}"));
    }
    let grafana = &settings.values.webui.grafana_url;
    if !grafana.is_empty() {
        args.push(format!("--grafana-url={grafana}"));
    }
    args.push(s(if settings.values.dra_plugin.enabled {
        "--dra"
    } else {
        "--dra=off"
    }));
    args
}

/// The read-only web UI: one replica, non-root, no capabilities, read-only root; in-cluster
/// credentials of its ServiceAccount (list/watch nodes, pods, events; in the DRA mode also
/// ResourceSlices and ResourceClaims).
pub fn webui_deployment(settings: &Settings) -> Object {
    let v = &settings.values;
    let probe = Probe {
        http_get: Some(HTTPGetAction {
            path: Some(s("/healthz")),
            port: IntOrString::String(s("http")),
            ..Default::default()
        }),
        period_seconds: Some(10),
        ..Default::default()
    };
    let ui = Container {
        name: s("webui"),
        image: Some(v.scheduler_image().reference()),
        image_pull_policy: Some(v.images.pull_policy.clone()),
        resources: resources(&v.webui.pod.resources),
        command: Some(vec![s("/hami-webui")]),
        args: Some(webui_args(settings)),
        ports: Some(vec![port("http", WEBUI_PORT)]),
        liveness_probe: Some(probe.clone()),
        readiness_probe: Some(probe),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(65532),
            ..restricted(&[])
        }),
        ..Default::default()
    };
    Object::Deployment(Deployment {
        metadata: meta(WEBUI, Some(&settings.namespace), WEBUI),
        spec: Some(DeploymentSpec {
            replicas: Some(1),
            selector: selector(WEBUI),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels(WEBUI)),
                    ..Default::default()
                }),
                spec: Some(placed(
                    PodSpec {
                        service_account_name: Some(s(WEBUI)),
                        containers: vec![ui],
                        ..Default::default()
                    },
                    &v.webui.pod,
                )),
            },
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The web UI's Service (port 80 → the pod's `http`).
pub fn webui_service(settings: &Settings) -> Object {
    cluster_ip_service(WEBUI, &settings.namespace, &[("http", 80)])
}
