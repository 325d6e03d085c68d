//! The namespace and every component's service account, roles and bindings.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Namespace;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::names::*;
use crate::rbac;
use crate::settings::{Settings, TlsMode};

use super::*;

/// The namespace object (plain manifests; Helm uses `--create-namespace`).
pub fn namespace(settings: &Settings) -> Object {
    Object::Namespace(Namespace {
        metadata: ObjectMeta {
            name: Some(settings.namespace.clone()),
            // Our own pods never go through our webhook.
            labels: Some(BTreeMap::from([(s(WEBHOOK_IGNORE_LABEL), s("ignore"))])),
            ..Default::default()
        },
        ..Default::default()
    })
}

/// Service accounts, roles and bindings of every enabled component.
pub fn rbac_objects(settings: &Settings) -> Vec<Object> {
    let ns = settings.namespace.as_str();
    let v = &settings.values;
    let mut scheduler_rules = rbac::scheduler_cluster_rules();
    if v.dra_plugin.enabled {
        scheduler_rules.extend(rbac::scheduler_dra_cluster_rules());
    }
    let mut out = vec![
        sa(SCHEDULER, ns),
        cluster_role(SCHEDULER, SCHEDULER, scheduler_rules),
        cluster_binding(SCHEDULER, SCHEDULER, SCHEDULER, sa_subject(SCHEDULER, ns)),
        role(SCHEDULER, ns, SCHEDULER, rbac::scheduler_lease_rules()),
        binding(
            SCHEDULER,
            ns,
            SCHEDULER,
            ("Role", SCHEDULER),
            sa_subject(SCHEDULER, ns),
        ),
        // The kube-scheduler sidecar shares the pod's service account.
        cluster_binding(
            "hami-kube-scheduler",
            SCHEDULER,
            "system:kube-scheduler",
            sa_subject(SCHEDULER, ns),
        ),
        cluster_binding(
            "hami-volume-scheduler",
            SCHEDULER,
            "system:volume-scheduler",
            sa_subject(SCHEDULER, ns),
        ),
        binding(
            "hami-kube-scheduler-auth-reader",
            "kube-system",
            SCHEDULER,
            ("Role", "extension-apiserver-authentication-reader"),
            sa_subject(SCHEDULER, ns),
        ),
        sa(DEVICE_PLUGIN, ns),
        cluster_role(
            DEVICE_PLUGIN,
            DEVICE_PLUGIN,
            rbac::device_plugin_cluster_rules(settings),
        ),
        cluster_binding(
            DEVICE_PLUGIN,
            DEVICE_PLUGIN,
            DEVICE_PLUGIN,
            sa_subject(DEVICE_PLUGIN, ns),
        ),
        role(
            "hami-device-plugin-events",
            "default",
            DEVICE_PLUGIN,
            rbac::device_plugin_event_rules(),
        ),
        binding(
            "hami-device-plugin-events",
            "default",
            DEVICE_PLUGIN,
            ("Role", "hami-device-plugin-events"),
            sa_subject(DEVICE_PLUGIN, ns),
        ),
    ];
    if v.nvidia_device_plugin.enabled {
        out.extend([
            sa(NVIDIA_DEVICE_PLUGIN, ns),
            cluster_role(
                NVIDIA_DEVICE_PLUGIN,
                NVIDIA_DEVICE_PLUGIN,
                rbac::nvidia_device_plugin_cluster_rules(settings),
            ),
            cluster_binding(
                NVIDIA_DEVICE_PLUGIN,
                NVIDIA_DEVICE_PLUGIN,
                NVIDIA_DEVICE_PLUGIN,
                sa_subject(NVIDIA_DEVICE_PLUGIN, ns),
            ),
            role(
                "hami-nvidia-device-plugin-events",
                "default",
                NVIDIA_DEVICE_PLUGIN,
                rbac::nvidia_device_plugin_event_rules(),
            ),
            binding(
                "hami-nvidia-device-plugin-events",
                "default",
                NVIDIA_DEVICE_PLUGIN,
                ("Role", "hami-nvidia-device-plugin-events"),
                sa_subject(NVIDIA_DEVICE_PLUGIN, ns),
            ),
        ]);
    }
    if v.webui.enabled {
        let mut rules = rbac::webui_cluster_rules();
        if v.dra_plugin.enabled {
            rules.extend(rbac::webui_dra_cluster_rules());
        }
        out.extend([
            sa(WEBUI, ns),
            cluster_role(WEBUI, WEBUI, rules),
            cluster_binding(WEBUI, WEBUI, WEBUI, sa_subject(WEBUI, ns)),
        ]);
    }
    if v.monitor.enabled {
        let mut rules = rbac::monitor_cluster_rules();
        if v.dra_plugin.enabled {
            rules.extend(rbac::monitor_dra_cluster_rules());
        }
        out.extend([
            sa(MONITOR, ns),
            cluster_role(MONITOR, MONITOR, rules),
            cluster_binding(MONITOR, MONITOR, MONITOR, sa_subject(MONITOR, ns)),
        ]);
    }
    if v.dra_plugin.enabled {
        out.extend([
            sa(DRA_PLUGIN, ns),
            cluster_role(DRA_PLUGIN, DRA_PLUGIN, rbac::dra_plugin_cluster_rules()),
            cluster_binding(
                DRA_PLUGIN,
                DRA_PLUGIN,
                DRA_PLUGIN,
                sa_subject(DRA_PLUGIN, ns),
            ),
        ]);
    }
    if v.node_labeller.enabled {
        out.extend([
            sa(NODE_LABELLER, ns),
            cluster_role(
                NODE_LABELLER,
                NODE_LABELLER,
                rbac::node_labeller_cluster_rules(),
            ),
            cluster_binding(
                NODE_LABELLER,
                NODE_LABELLER,
                NODE_LABELLER,
                sa_subject(NODE_LABELLER, ns),
            ),
        ]);
    }
    if v.tls.mode == TlsMode::Certgen {
        out.extend(certgen_rbac(settings));
    }
    out
}
