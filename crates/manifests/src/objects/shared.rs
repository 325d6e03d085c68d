//! The builders every component uses: metadata and labels, env, volumes and mounts, ports,
//! security contexts, service accounts and bindings, placement, DaemonSets, Services, and
//! the hook-install init container.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy, RollingUpdateDaemonSet,
};

use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EnvVar, EnvVarSource, HostPathVolumeSource,
    ObjectFieldSelector, PodSpec, PodTemplateSpec, ResourceRequirements, SecurityContext, Service,
    ServiceAccount, ServicePort, ServiceSpec, Volume, VolumeMount,
};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::names::*;

use crate::settings::{PodPlacement, Settings};

use super::*;

pub(super) fn s(v: &str) -> String {
    v.to_string()
}

pub(super) fn labels(component: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(s(APP_LABEL), s(APP)), (s(COMPONENT_LABEL), s(component))])
}

pub(super) fn meta(name: &str, namespace: Option<&str>, component: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(s(name)),
        namespace: namespace.map(s),
        labels: Some(labels(component)),
        ..Default::default()
    }
}

pub(super) fn env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: s(name),
        value: Some(s(value)),
        value_from: None,
    }
}

pub(super) fn env_field(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: s(name),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: None,
                field_path: s(path),
            }),
            ..Default::default()
        }),
    }
}

pub(super) fn host_path(name: &str, path: &str, kind: Option<&str>) -> Volume {
    Volume {
        name: s(name),
        host_path: Some(HostPathVolumeSource {
            path: s(path),
            type_: kind.map(s),
        }),
        ..Default::default()
    }
}

pub(super) fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: s(name),
        mount_path: s(path),
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

pub(super) fn port(name: &str, number: i32) -> ContainerPort {
    ContainerPort {
        name: Some(s(name)),
        container_port: number,
        protocol: Some(s("TCP")),
        ..Default::default()
    }
}

/// Non-root-capable defaults: no privilege escalation, no capabilities, read-only root.
pub(super) fn restricted(add: &[&str]) -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec![s("ALL")]),
            add: (!add.is_empty()).then(|| add.iter().map(|c| s(c)).collect()),
        }),
        read_only_root_filesystem: Some(true),
        ..Default::default()
    }
}

pub(super) fn sa(name: &str, ns: &str) -> Object {
    Object::ServiceAccount(ServiceAccount {
        metadata: meta(name, Some(ns), name),
        ..Default::default()
    })
}

pub(super) fn sa_subject(name: &str, ns: &str) -> Subject {
    Subject {
        kind: s("ServiceAccount"),
        name: s(name),
        namespace: Some(s(ns)),
        api_group: None,
    }
}

pub(super) fn cluster_role(name: &str, component: &str, rules: Vec<PolicyRule>) -> Object {
    Object::ClusterRole(ClusterRole {
        metadata: meta(name, None, component),
        rules: Some(rules),
        aggregation_rule: None,
    })
}

pub(super) fn role(name: &str, ns: &str, component: &str, rules: Vec<PolicyRule>) -> Object {
    Object::Role(Role {
        metadata: meta(name, Some(ns), component),
        rules: Some(rules),
    })
}

pub(super) fn cluster_binding(name: &str, component: &str, role: &str, subject: Subject) -> Object {
    Object::ClusterRoleBinding(ClusterRoleBinding {
        metadata: meta(name, None, component),
        role_ref: RoleRef {
            api_group: Some(s("rbac.authorization.k8s.io")),
            kind: s("ClusterRole"),
            name: s(role),
        },
        subjects: Some(vec![subject]),
    })
}

pub(super) fn binding(
    name: &str,
    ns: &str,
    component: &str,
    (kind, role): (&str, &str),
    subject: Subject,
) -> Object {
    Object::RoleBinding(RoleBinding {
        metadata: meta(name, Some(ns), component),
        role_ref: RoleRef {
            api_group: Some(s("rbac.authorization.k8s.io")),
            kind: s(kind),
            name: s(role),
        },
        subjects: Some(vec![subject]),
    })
}

/// Labels of our pod templates: the component's, plus the webhook escape (our pods never
/// request GPUs, and must start while the webhook is down).
pub(super) fn pod_labels(component: &str) -> BTreeMap<String, String> {
    let mut l = labels(component);
    l.insert(s(WEBHOOK_IGNORE_LABEL), s("ignore"));
    l
}

pub(super) fn selector(component: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels(component)),
        match_expressions: None,
    }
}

/// The operator's placement values on a pod spec (empty values leave the field out, as the
/// chart's `with` blocks do).
pub(super) fn placed(spec: PodSpec, p: &PodPlacement) -> PodSpec {
    let affinity = p.affinity.clone();
    let no_affinity = affinity == Default::default();
    PodSpec {
        priority_class_name: (!p.priority_class_name.is_empty())
            .then(|| p.priority_class_name.clone()),
        node_selector: (!p.node_selector.is_empty()).then(|| p.node_selector.clone()),
        tolerations: (!p.tolerations.is_empty()).then(|| p.tolerations.clone()),
        affinity: (!no_affinity).then_some(affinity),
        ..spec
    }
}

/// A container's resources from values (`{}` leaves the field out).
pub(super) fn resources(r: &ResourceRequirements) -> Option<ResourceRequirements> {
    (r != &ResourceRequirements::default()).then(|| r.clone())
}

/// A ClusterIP Service named and selecting `app`, each port (name, number) targeting the
/// pod's port of the same name over TCP: the shape of every Service the chart renders.
pub(super) fn cluster_ip_service(app: &str, namespace: &str, ports: &[(&str, i32)]) -> Object {
    Object::Service(Service {
        metadata: meta(app, Some(namespace), app),
        spec: Some(ServiceSpec {
            type_: Some(s("ClusterIP")),
            selector: Some(labels(app)),
            ports: Some(
                ports
                    .iter()
                    .map(|&(name, number)| ServicePort {
                        name: Some(s(name)),
                        port: number,
                        target_port: Some(IntOrString::String(s(name))),
                        protocol: Some(s("TCP")),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    })
}

pub(super) fn daemon_set(name: &str, ns: &str, spec: PodSpec, p: &PodPlacement) -> Object {
    Object::DaemonSet(DaemonSet {
        metadata: meta(name, Some(ns), name),
        spec: Some(DaemonSetSpec {
            selector: selector(name),
            update_strategy: Some(DaemonSetUpdateStrategy {
                type_: Some(s("RollingUpdate")),
                rolling_update: Some(RollingUpdateDaemonSet {
                    max_unavailable: Some(IntOrString::Int(1)),
                    ..Default::default()
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels(name)),
                    ..Default::default()
                }),
                spec: Some(placed(
                    PodSpec {
                        service_account_name: Some(s(name)),
                        ..spec
                    },
                    p,
                )),
            },
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The init container that installs a hook: copy beside, then rename over, so a process
/// that maps the old file keeps its inode and a new one never sees a half-written file.
pub(super) fn install_script(src: &str, file: &str) -> String {
    format!(
        "set -eu; dst=\"$HOOK_DIR/{file}\"; src={src}; \
         if cmp -s \"$src\" \"$dst\"; then exit 0; fi; \
         tmp=\"$HOOK_DIR/.{file}.$$\"; cp \"$src\" \"$tmp\"; chmod 0555 \"$tmp\"; \
         mv -f \"$tmp\" \"$dst\""
    )
}

pub(super) fn install_container(settings: &Settings, script: String, hook_dir: &str) -> Container {
    Container {
        name: s("install-hook"),
        image: Some(settings.values.node_image().reference()),
        image_pull_policy: Some(settings.values.images.pull_policy.clone()),
        command: Some(vec![s("/bin/sh"), s("-c"), script]),
        env: Some(vec![env("HOOK_DIR", hook_dir)]),
        volume_mounts: Some(vec![mount("hook", hook_dir, false)]),
        security_context: Some(SecurityContext {
            run_as_user: Some(0),
            ..restricted(&[])
        }),
        ..Default::default()
    }
}

pub(super) fn hook_dir_of(host_hook_path: &str) -> String {
    format!("{}/vgpu", host_hook_path.trim_end_matches('/'))
}
