//! Every object of an installation, as typed k8s-openapi values (CRD objects — cert-manager,
//! ServiceMonitor — as JSON, since k8s-openapi has no types for them).

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations,
    ServiceReference, WebhookClientConfig,
};
use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy, Deployment, DeploymentSpec,
    DeploymentStrategy, RollingUpdateDaemonSet, RollingUpdateDeployment,
};
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, EnvVarSource,
    HTTPGetAction, HostPathVolumeSource, KeyToPath, Namespace, NodeSelectorRequirement,
    NodeSelectorTerm, ObjectFieldSelector, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    ResourceRequirements, SecretVolumeSource, SecurityContext, Service, ServiceAccount,
    ServicePort, ServiceSpec, Volume, VolumeMount,
};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, DeviceClass, DeviceClassSpec, DeviceSelector,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};

use crate::kube_scheduler_config;
use crate::names::*;
use crate::rbac;
use crate::settings::{PodPlacement, Settings, TlsMode};

/// One object of the installation.
#[derive(Debug, Clone, PartialEq)]
pub enum Object {
    /// The installation's namespace.
    Namespace(Namespace),
    /// A component's identity.
    ServiceAccount(ServiceAccount),
    /// Cluster-wide rights of a component.
    ClusterRole(ClusterRole),
    /// Binds a ClusterRole to its ServiceAccount.
    ClusterRoleBinding(ClusterRoleBinding),
    /// Namespaced rights of a component.
    Role(Role),
    /// Binds a Role to its ServiceAccount.
    RoleBinding(RoleBinding),
    /// The kube-scheduler configuration.
    ConfigMap(ConfigMap),
    /// The scheduler's, the monitor's and the web UI's Services.
    Service(Service),
    /// The scheduler and the web UI.
    Deployment(Deployment),
    /// The node components.
    DaemonSet(DaemonSet),
    /// The certgen Jobs.
    Job(Job),
    /// The webhook and its guard.
    MutatingWebhookConfiguration(MutatingWebhookConfiguration),
    /// The DRA driver's DeviceClass (`draPlugin.enabled`).
    DeviceClass(DeviceClass),
    /// cert-manager Issuer/Certificate, prometheus-operator ServiceMonitor.
    Custom(Value),
}

impl Object {
    /// The object as JSON (apiVersion and kind included).
    pub fn to_value(&self) -> Result<Value, serde_json::Error> {
        match self {
            Object::Namespace(o) => serde_json::to_value(o),
            Object::ServiceAccount(o) => serde_json::to_value(o),
            Object::ClusterRole(o) => serde_json::to_value(o),
            Object::ClusterRoleBinding(o) => serde_json::to_value(o),
            Object::Role(o) => serde_json::to_value(o),
            Object::RoleBinding(o) => serde_json::to_value(o),
            Object::ConfigMap(o) => serde_json::to_value(o),
            Object::Service(o) => serde_json::to_value(o),
            Object::Deployment(o) => serde_json::to_value(o),
            Object::DaemonSet(o) => serde_json::to_value(o),
            Object::Job(o) => serde_json::to_value(o),
            Object::MutatingWebhookConfiguration(o) => serde_json::to_value(o),
            Object::DeviceClass(o) => serde_json::to_value(o),
            Object::Custom(v) => Ok(v.clone()),
        }
    }
}

fn s(v: &str) -> String {
    v.to_string()
}

fn labels(component: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(s(APP_LABEL), s(APP)), (s(COMPONENT_LABEL), s(component))])
}

fn meta(name: &str, namespace: Option<&str>, component: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(s(name)),
        namespace: namespace.map(s),
        labels: Some(labels(component)),
        ..Default::default()
    }
}

fn env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: s(name),
        value: Some(s(value)),
        value_from: None,
    }
}

fn env_field(name: &str, path: &str) -> EnvVar {
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

fn host_path(name: &str, path: &str, kind: Option<&str>) -> Volume {
    Volume {
        name: s(name),
        host_path: Some(HostPathVolumeSource {
            path: s(path),
            type_: kind.map(s),
        }),
        ..Default::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: s(name),
        mount_path: s(path),
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

fn port(name: &str, number: i32) -> ContainerPort {
    ContainerPort {
        name: Some(s(name)),
        container_port: number,
        protocol: Some(s("TCP")),
        ..Default::default()
    }
}

/// Non-root-capable defaults: no privilege escalation, no capabilities, read-only root.
fn restricted(add: &[&str]) -> SecurityContext {
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

fn sa(name: &str, ns: &str) -> Object {
    Object::ServiceAccount(ServiceAccount {
        metadata: meta(name, Some(ns), name),
        ..Default::default()
    })
}

fn sa_subject(name: &str, ns: &str) -> Subject {
    Subject {
        kind: s("ServiceAccount"),
        name: s(name),
        namespace: Some(s(ns)),
        api_group: None,
    }
}

fn cluster_role(name: &str, component: &str, rules: Vec<PolicyRule>) -> Object {
    Object::ClusterRole(ClusterRole {
        metadata: meta(name, None, component),
        rules: Some(rules),
        aggregation_rule: None,
    })
}

fn role(name: &str, ns: &str, component: &str, rules: Vec<PolicyRule>) -> Object {
    Object::Role(Role {
        metadata: meta(name, Some(ns), component),
        rules: Some(rules),
    })
}

fn cluster_binding(name: &str, component: &str, role: &str, subject: Subject) -> Object {
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

fn binding(
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
fn pod_labels(component: &str) -> BTreeMap<String, String> {
    let mut l = labels(component);
    l.insert(s(WEBHOOK_IGNORE_LABEL), s("ignore"));
    l
}

fn selector(component: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels(component)),
        match_expressions: None,
    }
}

/// The operator's placement values on a pod spec (empty values leave the field out, as the
/// chart's `with` blocks do).
fn placed(spec: PodSpec, p: &PodPlacement) -> PodSpec {
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
fn resources(r: &ResourceRequirements) -> Option<ResourceRequirements> {
    (r != &ResourceRequirements::default()).then(|| r.clone())
}

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

/// Helm runs hooks before it creates ordinary objects, so the certgen Jobs' identity and
/// rights are hooks themselves, created first in each phase (lower weight) and removed
/// when the phase succeeds (as ingress-nginx's certgen does).
pub const CERTGEN_RBAC_HOOK_WEIGHT: &str = "-5";
/// Helm hook weight of the certgen Jobs, after their RBAC.
pub const CERTGEN_JOB_HOOK_WEIGHT: &str = "0";
const CERTGEN_HOOKS: &str = "pre-install,pre-upgrade,post-install,post-upgrade";
const HOOK_DELETE_POLICY: &str = "before-hook-creation,hook-succeeded";

fn hook_annotations(hooks: &str, weight: &str) -> Option<BTreeMap<String, String>> {
    Some(BTreeMap::from([
        (s("helm.sh/hook"), s(hooks)),
        (s("helm.sh/hook-delete-policy"), s(HOOK_DELETE_POLICY)),
        (s("helm.sh/hook-weight"), s(weight)),
    ]))
}

fn certgen_rbac(settings: &Settings) -> Vec<Object> {
    let ns = settings.namespace.as_str();
    let mut objs = vec![
        sa(CERTGEN, ns),
        role(CERTGEN, ns, CERTGEN, rbac::certgen_namespace_rules()),
        binding(
            CERTGEN,
            ns,
            CERTGEN,
            ("Role", CERTGEN),
            sa_subject(CERTGEN, ns),
        ),
        cluster_role(CERTGEN, CERTGEN, rbac::certgen_cluster_rules()),
        cluster_binding(CERTGEN, CERTGEN, CERTGEN, sa_subject(CERTGEN, ns)),
    ];
    for o in &mut objs {
        let m = match o {
            Object::ServiceAccount(x) => &mut x.metadata,
            Object::Role(x) => &mut x.metadata,
            Object::RoleBinding(x) => &mut x.metadata,
            Object::ClusterRole(x) => &mut x.metadata,
            Object::ClusterRoleBinding(x) => &mut x.metadata,
            _ => unreachable!("certgen RBAC holds RBAC kinds only"),
        };
        m.annotations = hook_annotations(CERTGEN_HOOKS, CERTGEN_RBAC_HOOK_WEIGHT);
    }
    objs
}

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
fn kube_scheduler_tls_items(settings: &Settings) -> Vec<KeyToPath> {
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

/// A ClusterIP Service named and selecting `app`, each port (name, number) targeting the
/// pod's port of the same name over TCP: the shape of every Service the chart renders.
fn cluster_ip_service(app: &str, namespace: &str, ports: &[(&str, i32)]) -> Object {
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

/// Name of the webhook's match condition: a GPU pod, or one carrying a scheduler-owned annotation.
pub const WEBHOOK_MATCH_CONDITION: &str = "gpu-pod-or-scheduler-annotation";
/// Name of the guard webhook's match condition: the pod carries a scheduler-owned annotation.
pub const GUARD_MATCH_CONDITION: &str = "carries-scheduler-annotation";
/// Name of the condition that lets the scheduler's and plugins' own writes through.
pub const NOT_A_WRITER_CONDITION: &str = "not-a-hami-writer";
/// The second webhook: D-4 everywhere, selectors or not.
pub const GUARD_WEBHOOK_NAME: &str = "guard.vgpu.hami.io";

/// The ServiceAccounts allowed to write scheduler-owned annotations (the scheduler's
/// default `annotationWriters`, `hami_scheduler::admission::ANNOTATION_WRITER_SERVICE_ACCOUNTS`).
pub const ANNOTATION_WRITERS: [&str; 3] = [SCHEDULER, DEVICE_PLUGIN, NVIDIA_DEVICE_PLUGIN];

fn cel_list(items: &[&str]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("'{i}'")).collect();
    format!("[{}]", quoted.join(", "))
}

fn carries_owned(var: &str) -> String {
    format!(
        "(has({var}.metadata.annotations) && {}.exists(a, a in {var}.metadata.annotations))",
        cel_list(hami_protocol::names::SCHEDULER_OWNED_ANNOTATIONS)
    )
}

/// An UPDATE that sets, changes or removes a scheduler-owned annotation (D-4 on update);
/// other updates (labels, finalizers, a controller's bookkeeping) never wait for the
/// scheduler. `oldObject` is null on CREATE, hence the operation test first.
fn changes_owned() -> String {
    let value = |var: &str| {
        format!(
            "(has({var}.metadata.annotations) && a in {var}.metadata.annotations ? {var}.metadata.annotations[a] : '')"
        )
    };
    format!(
        "(request.operation == 'UPDATE' && {}.exists(a, {} != {}))",
        cel_list(hami_protocol::names::SCHEDULER_OWNED_ANNOTATIONS),
        value("object"),
        value("oldObject")
    )
}

/// The CEL `matchConditions` expression of the main webhook: a CREATE of a pod that
/// requests (limits or requests, app or init containers) a resource of the protocol's
/// table or carries an annotation only the scheduler may set (D-4 must still see those on
/// plain pods), or an UPDATE that changes such an annotation.
pub fn webhook_match_expression() -> String {
    let resources = cel_list(&hami_protocol::names::managed_resources());
    let asks = "(has(c.resources) && ((has(c.resources.limits) && r in c.resources.limits) || (has(c.resources.requests) && r in c.resources.requests)))";
    format!(
        "(request.operation != 'UPDATE' && ({resources}.exists(r, object.spec.containers.exists(c, {asks}) || (has(object.spec.initContainers) && object.spec.initContainers.exists(c, {asks}))) || {})) || {}",
        carries_owned("object"),
        changes_owned()
    )
}

/// The guard webhook's expression: a CREATE carrying, or an UPDATE changing, a
/// scheduler-owned annotation.
pub fn guard_match_expression() -> String {
    format!(
        "(request.operation != 'UPDATE' && {}) || {}",
        carries_owned("object"),
        changes_owned()
    )
}

/// Our own components' writes never wait for the webhook (a scheduler outage must not
/// block the plugins' Allocate commits); the scheduler allows them anyway (D-4 writers).
pub fn not_a_writer_expression(settings: &Settings) -> String {
    let writers: Vec<String> = ANNOTATION_WRITERS
        .iter()
        .map(|sa| format!("system:serviceaccount:{}:{sa}", settings.namespace))
        .collect();
    let refs: Vec<&str> = writers.iter().map(String::as_str).collect();
    format!("!(request.userInfo.username in {})", cel_list(&refs))
}

fn conditions(settings: &Settings, name: &str, expression: String) -> Option<Vec<MatchCondition>> {
    settings.kube_version.has_match_conditions().then(|| {
        vec![
            MatchCondition {
                name: s(NOT_A_WRITER_CONDITION),
                expression: not_a_writer_expression(settings),
            },
            MatchCondition {
                name: s(name),
                expression,
            },
        ]
    })
}

/// Fail where matchConditions narrow the webhook to GPU pods; elsewhere every pod would be
/// sent, and the operator's fallback applies.
pub fn webhook_failure_policy(settings: &Settings) -> String {
    if settings.kube_version.has_match_conditions() {
        s("Fail")
    } else {
        settings
            .values
            .webhook
            .failure_policy_without_match_conditions
            .clone()
    }
}

/// The mutating webhook (SPEC §3, D-4): GPU pods only (matchConditions) with `failurePolicy:
/// Fail`; pods and namespaces labelled `hami.io/webhook=ignore` are left alone.
pub fn webhook(settings: &Settings) -> Object {
    let ignore = LabelSelectorRequirement {
        key: s(WEBHOOK_IGNORE_LABEL),
        operator: s("NotIn"),
        values: Some(vec![s("ignore")]),
    };
    // With failurePolicy Fail, a scheduler outage must not block the control plane's own
    // pods (kube-system) nor ours (which the webhook would need to come back up).
    let namespaces = LabelSelector {
        match_labels: None,
        match_expressions: Some(vec![
            ignore.clone(),
            LabelSelectorRequirement {
                key: s("kubernetes.io/metadata.name"),
                operator: s("NotIn"),
                values: Some(vec![s("kube-system"), settings.namespace.clone()]),
            },
        ]),
    };
    let pods = LabelSelector {
        match_labels: None,
        match_expressions: Some(vec![ignore]),
    };
    let annotations = match settings.values.tls.mode {
        TlsMode::CertManager => Some(BTreeMap::from([(
            s("cert-manager.io/inject-ca-from"),
            format!("{}/{SCHEDULER}", settings.namespace),
        )])),
        TlsMode::Certgen => None,
    };
    Object::MutatingWebhookConfiguration(MutatingWebhookConfiguration {
        metadata: ObjectMeta {
            annotations,
            ..meta(WEBHOOK, None, SCHEDULER)
        },
        webhooks: Some(webhooks(settings, namespaces, pods)),
    })
}

/// The shipped [`webhook`] configuration with every webhook's `clientConfig` pointed at the
/// scheduler listening at `base_url` (`https://host:port`; the webhook path is appended) and
/// trusting `ca_pem`, instead of the in-cluster Service: how tests and the demo register the
/// webhook of a scheduler they run themselves, so that they exercise what ships.
pub fn webhook_at(settings: &Settings, base_url: &str, ca_pem: &[u8]) -> Object {
    let mut object = webhook(settings);
    if let Object::MutatingWebhookConfiguration(config) = &mut object {
        for hook in config.webhooks.iter_mut().flatten() {
            hook.client_config = WebhookClientConfig {
                url: Some(format!("{base_url}{WEBHOOK_PATH}")),
                ca_bundle: Some(k8s_openapi::ByteString(ca_pem.to_vec())),
                service: None,
            };
        }
    }
    object
}

fn webhooks(
    settings: &Settings,
    namespaces: LabelSelector,
    pods: LabelSelector,
) -> Vec<MutatingWebhook> {
    let client_config = WebhookClientConfig {
        service: Some(ServiceReference {
            name: s(SCHEDULER),
            namespace: settings.namespace.clone(),
            path: Some(s(WEBHOOK_PATH)),
            port: Some(SERVICE_HTTPS_PORT),
        }),
        ..Default::default()
    };
    let main = MutatingWebhook {
        name: s(WEBHOOK_NAME),
        client_config: client_config.clone(),
        // UPDATE too: a scheduler-owned annotation added later is denied like one set
        // at creation (D-4).
        rules: Some(vec![RuleWithOperations {
            api_groups: Some(vec![s("")]),
            api_versions: Some(vec![s("v1")]),
            operations: Some(vec![s("CREATE"), s("UPDATE")]),
            resources: Some(vec![s("pods")]),
            scope: Some(s("*")),
        }]),
        match_conditions: conditions(
            settings,
            WEBHOOK_MATCH_CONDITION,
            webhook_match_expression(),
        ),
        failure_policy: Some(webhook_failure_policy(settings)),
        match_policy: Some(s("Equivalent")),
        // DRA mode: the webhook creates ResourceClaimTemplates, but never on a dryRun.
        side_effects: s("NoneOnDryRun"),
        timeout_seconds: Some(10),
        reinvocation_policy: Some(s("Never")),
        admission_review_versions: vec![s("v1"), s("v1beta1")],
        namespace_selector: Some(namespaces),
        object_selector: Some(pods),
    };
    let mut out = vec![main.clone()];
    // D-4 beyond the selectors: pods and namespaces labelled ignore, kube-system and ours
    // are not sent to the main webhook, but a scheduler-owned annotation on them must be
    // refused too. Only pods carrying one match (so Fail blocks nothing else); only where
    // matchConditions exist (without them this would send every pod of the cluster).
    if settings.kube_version.has_match_conditions() {
        out.push(MutatingWebhook {
            name: s(GUARD_WEBHOOK_NAME),
            client_config,
            match_conditions: conditions(settings, GUARD_MATCH_CONDITION, guard_match_expression()),
            failure_policy: Some(s("Fail")),
            namespace_selector: None,
            object_selector: None,
            ..main
        });
    }
    out
}

/// TLS by kube-webhook-certgen: one Job creates the Secret, one patches the caBundle.
pub fn certgen_jobs(settings: &Settings) -> Vec<Object> {
    let ns = settings.namespace.as_str();
    let certgen = &settings.values.tls.certgen;
    let job = |name: &str, hook: &str, args: Vec<String>| {
        Object::Job(Job {
            metadata: ObjectMeta {
                annotations: hook_annotations(hook, CERTGEN_JOB_HOOK_WEIGHT),
                ..meta(name, Some(ns), CERTGEN)
            },
            spec: Some(JobSpec {
                backoff_limit: Some(6),
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(pod_labels(CERTGEN)),
                        ..Default::default()
                    }),
                    spec: Some(placed(
                        PodSpec {
                            service_account_name: Some(s(CERTGEN)),
                            restart_policy: Some(s("OnFailure")),
                            security_context: Some(PodSecurityContext {
                                run_as_non_root: Some(true),
                                run_as_user: Some(65532),
                                ..Default::default()
                            }),
                            containers: vec![Container {
                                name: s(name),
                                image: Some(certgen.image.reference()),
                                image_pull_policy: Some(settings.values.images.pull_policy.clone()),
                                args: Some(args),
                                resources: resources(&certgen.pod.resources),
                                security_context: Some(restricted(&[])),
                                ..Default::default()
                            }],
                            ..Default::default()
                        },
                        &certgen.pod,
                    )),
                },
                ..Default::default()
            }),
            ..Default::default()
        })
    };
    vec![
        job(
            "hami-certgen-create",
            "pre-install,pre-upgrade",
            vec![
                s("create"),
                format!("--host={SCHEDULER},{SCHEDULER}.{ns}.svc,127.0.0.1"),
                format!("--namespace={ns}"),
                format!("--secret-name={TLS_SECRET}"),
                // certgen's own key names are `cert`/`key`; the extender reads tls.crt and
                // tls.key (cert-manager's names), so the Secret works in both modes.
                s("--cert-name=tls.crt"),
                s("--key-name=tls.key"),
            ],
        ),
        job(
            "hami-certgen-patch",
            "post-install,post-upgrade",
            vec![
                s("patch"),
                format!("--webhook-name={WEBHOOK}"),
                format!("--namespace={ns}"),
                format!("--secret-name={TLS_SECRET}"),
                s("--patch-validating=false"),
                // certgen rewrites failurePolicy: keep the webhook's own.
                format!(
                    "--patch-failure-policy={}",
                    webhook_failure_policy(settings)
                ),
            ],
        ),
    ]
}

/// TLS by cert-manager: a self-signed root issues the CA, the CA issues the serving
/// certificate (webhook and extender listeners) and the client certificate (kube-scheduler's
/// extender tlsConfig, forwarding replicas); cainjector puts the CA in the webhook.
pub fn cert_manager_objects(settings: &Settings) -> Vec<Object> {
    let ns = settings.namespace.as_str();
    let meta = |name: &str| json!({"name": name, "namespace": ns, "labels": labels(SCHEDULER)});
    let root = format!("{SCHEDULER}-selfsigned");
    vec![
        Object::Custom(json!({
            "apiVersion": "cert-manager.io/v1", "kind": "Issuer",
            "metadata": meta(&root),
            "spec": {"selfSigned": {}}
        })),
        Object::Custom(json!({
            "apiVersion": "cert-manager.io/v1", "kind": "Certificate",
            "metadata": meta(CA_SECRET),
            "spec": {
                "isCA": true,
                "commonName": CA_SECRET,
                "secretName": CA_SECRET,
                "privateKey": {"algorithm": "ECDSA", "size": 256},
                "issuerRef": {"name": root, "kind": "Issuer"}
            }
        })),
        Object::Custom(json!({
            "apiVersion": "cert-manager.io/v1", "kind": "Issuer",
            "metadata": meta(SCHEDULER),
            "spec": {"ca": {"secretName": CA_SECRET}}
        })),
        Object::Custom(json!({
            "apiVersion": "cert-manager.io/v1", "kind": "Certificate",
            "metadata": meta(SCHEDULER),
            "spec": {
                "secretName": TLS_SECRET,
                "dnsNames": [SCHEDULER, settings.service_dns_name()],
                "ipAddresses": ["127.0.0.1"],
                "usages": ["digital signature", "key encipherment", "server auth"],
                "issuerRef": {"name": SCHEDULER, "kind": "Issuer"}
            }
        })),
        Object::Custom(json!({
            "apiVersion": "cert-manager.io/v1", "kind": "Certificate",
            "metadata": meta(CLIENT_TLS_SECRET),
            "spec": {
                "secretName": CLIENT_TLS_SECRET,
                "commonName": "system:hami-kube-scheduler",
                "usages": ["digital signature", "key encipherment", "client auth"],
                "issuerRef": {"name": SCHEDULER, "kind": "Issuer"}
            }
        })),
    ]
}

/// The AMD device plugin flags. `-split_count` only when the operator sets it, so the
/// plugin's per-architecture default (2 on gfx12) applies otherwise.
pub fn device_plugin_args(settings: &Settings) -> Vec<String> {
    let p = &settings.values.device_plugin;
    let mut args = vec![format!("--pulse={}", p.pulse)];
    if let Some(n) = p.split_count {
        args.push(format!("--split_count={n}"));
    }
    args.push(format!(
        "--device_memory_scaling={}",
        p.device_memory_scaling
    ));
    if p.report_node_capacity {
        args.push(s("--report_node_capacity"));
    }
    args.push(format!("--dev-root={HOST_DEV_MOUNT}"));
    if p.slice_partitions {
        args.push(s("--slice-partitions"));
    }
    if !p.exporter_socket.is_empty() {
        args.push(format!("--exporter-socket={}", p.exporter_socket));
    }
    if p.cdi.enabled {
        args.push(s("--cdi"));
        args.push(format!("--cdi-spec-dir={}", p.cdi.spec_dir));
    }
    args
}

/// The directory of the exporter's socket (mounted read-only at the same path), if used.
pub fn exporter_socket_dir(settings: &Settings) -> Option<String> {
    let socket = &settings.values.device_plugin.exporter_socket;
    let (dir, _) = socket.rsplit_once('/')?;
    Some(if dir.is_empty() {
        s("/")
    } else {
        dir.to_owned()
    })
}

/// The host's `/dev`, read-only, where the AMD plugin opens `dri/renderD<N>` for health.
pub const HOST_DEV_MOUNT: &str = "/host/dev";

fn hook_dir_of(host_hook_path: &str) -> String {
    format!("{}/vgpu", host_hook_path.trim_end_matches('/'))
}

/// The AMD hook directory on the host (`$HOST_HOOK_PATH/vgpu`).
pub fn host_hook_dir(settings: &Settings) -> String {
    hook_dir_of(&settings.values.device_plugin.host_hook_path)
}

/// The init container that installs a hook: copy beside, then rename over, so a process
/// that maps the old file keeps its inode and a new one never sees a half-written file.
fn install_script(src: &str, file: &str) -> String {
    format!(
        "set -eu; dst=\"$HOOK_DIR/{file}\"; src={src}; \
         if cmp -s \"$src\" \"$dst\"; then exit 0; fi; \
         tmp=\"$HOOK_DIR/.{file}.$$\"; cp \"$src\" \"$tmp\"; chmod 0555 \"$tmp\"; \
         mv -f \"$tmp\" \"$dst\""
    )
}

/// The init-container script that installs the AMD hook atomically.
pub fn hook_install_script() -> String {
    install_script(HOOK_IN_IMAGE, "libamvgpu.so")
}

/// The init-container script that installs the NVIDIA hook atomically.
pub fn nvidia_hook_install_script() -> String {
    install_script(NVIDIA_HOOK_IN_IMAGE, "libvgpu.so")
}

fn install_container(settings: &Settings, script: String, hook_dir: &str) -> Container {
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

fn daemon_set(name: &str, ns: &str, spec: PodSpec, p: &PodPlacement) -> Object {
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

/// The AMD device plugin DaemonSet (hook installed atomically by an init container).
pub fn device_plugin_daemon_set(settings: &Settings) -> Object {
    let p = &settings.values.device_plugin;
    let hook_dir = host_hook_dir(settings);
    let plugin_security = if p.privileged {
        SecurityContext {
            privileged: Some(true),
            ..Default::default()
        }
    } else {
        // uid 0 owns kubelet's socket directory, the cgroup files and the hook directory;
        // no capability is needed on top of that (discovery reads sysfs only).
        SecurityContext {
            run_as_user: Some(0),
            ..restricted(&[])
        }
    };
    let mut mounts = vec![
        mount("device-plugins", DEVICE_PLUGIN_DIR, false),
        mount("sys", "/sys", true),
        mount("cgroup", "/sys/fs/cgroup", false),
        mount("dev", HOST_DEV_MOUNT, true),
        mount("hook", &hook_dir, false),
    ];
    let mut volumes = vec![
        host_path("device-plugins", DEVICE_PLUGIN_DIR, Some("Directory")),
        host_path("sys", "/sys", Some("Directory")),
        host_path("cgroup", "/sys/fs/cgroup", Some("Directory")),
        host_path("dev", "/dev", Some("Directory")),
        host_path("hook", &hook_dir, Some("DirectoryOrCreate")),
    ];
    // The exporter's socket: connect() works through a read-only mount (sockets are not
    // subject to it), and the directory may appear after the plugin starts.
    if let Some(dir) = exporter_socket_dir(settings) {
        mounts.push(mount("exporter", &dir, true));
        volumes.push(host_path("exporter", &dir, Some("DirectoryOrCreate")));
    }
    // The CDI spec directory, writable only when the plugin writes a spec there.
    if p.cdi.enabled {
        mounts.push(mount("cdi", &p.cdi.spec_dir, false));
        volumes.push(host_path("cdi", &p.cdi.spec_dir, Some("DirectoryOrCreate")));
    }
    daemon_set(
        DEVICE_PLUGIN,
        &settings.namespace,
        PodSpec {
            init_containers: Some(vec![install_container(
                settings,
                hook_install_script(),
                &hook_dir,
            )]),
            containers: vec![Container {
                name: s("device-plugin"),
                image: Some(settings.values.node_image().reference()),
                image_pull_policy: Some(settings.values.images.pull_policy.clone()),
                command: Some(vec![s("/usr/bin/k8s-device-plugin")]),
                args: Some(device_plugin_args(settings)),
                env: Some(vec![
                    env_field("NODE_NAME", "spec.nodeName"),
                    env("HOST_HOOK_PATH", &p.host_hook_path),
                    env("OPERATING_MODE", &p.operating_mode),
                ]),
                resources: resources(&p.pod.resources),
                volume_mounts: Some(mounts),
                security_context: Some(plugin_security),
                ..Default::default()
            }],
            volumes: Some(volumes),
            ..Default::default()
        },
        &device_plugin_placement(settings),
    )
}

/// The device plugin's placement: its values, and with `draPlugin.enabled` never on a node
/// labelled for DRA (the requirement is added to every required node-selector term, since
/// terms are ORed).
pub fn device_plugin_placement(settings: &Settings) -> PodPlacement {
    let mut placement = settings.values.device_plugin.pod.clone();
    if !settings.values.dra_plugin.enabled {
        return placement;
    }
    let not_dra = NodeSelectorRequirement {
        key: s(AMD_MODE_LABEL),
        operator: s("NotIn"),
        values: Some(vec![s(AMD_MODE_DRA)]),
    };
    let node_affinity = placement
        .affinity
        .node_affinity
        .get_or_insert_with(Default::default);
    let required = node_affinity
        .required_during_scheduling_ignored_during_execution
        .get_or_insert_with(Default::default);
    if required.node_selector_terms.is_empty() {
        required
            .node_selector_terms
            .push(NodeSelectorTerm::default());
    }
    for term in &mut required.node_selector_terms {
        term.match_expressions
            .get_or_insert_with(Vec::new)
            .push(not_dra.clone());
    }
    placement
}

/// The DRA driver's flags (the chart's `dra-plugin.yaml` writes the same). The hook and the
/// per-claim files live under the hook directory, mounted at its host path, so the paths
/// the CDI specs name are host paths.
pub fn dra_plugin_args(settings: &Settings) -> Vec<String> {
    let d = &settings.values.dra_plugin;
    let hook_dir = host_hook_dir(settings);
    let mut args = vec![format!("--dev-root={HOST_DEV_MOUNT}")];
    if let Some(n) = d.split_count {
        args.push(format!("--split_count={n}"));
    }
    args.extend([
        format!("--cdi-dir={}", d.cdi_spec_dir),
        format!("--hook-host-path={hook_dir}/libamvgpu.so"),
        format!("--cache-root={hook_dir}/dra"),
        format!("--publish-interval={}", d.publish_interval),
    ]);
    args
}

/// The DeviceClass of the DRA driver's devices; with `draPlugin.extendedResourceName` it
/// also serves `amd.com/gpu` counts (KEP-5004).
pub fn device_class(settings: &Settings) -> Object {
    let d = &settings.values.dra_plugin;
    Object::DeviceClass(DeviceClass {
        metadata: meta(DRA_DRIVER, None, DRA_PLUGIN),
        spec: DeviceClassSpec {
            selectors: Some(vec![DeviceSelector {
                cel: Some(CELDeviceSelector {
                    expression: format!("device.driver == \"{DRA_DRIVER}\""),
                }),
            }]),
            extended_resource_name: d
                .extended_resource_name
                .then(|| s(hami_protocol::names::AMD.resource_count)),
            ..Default::default()
        },
    })
}

/// The AMD DRA driver DaemonSet, on the nodes labelled for DRA (hook installed atomically
/// by an init container, as the device plugin does on its nodes).
pub fn dra_plugin_daemon_set(settings: &Settings) -> Object {
    let d = &settings.values.dra_plugin;
    let hook_dir = host_hook_dir(settings);
    let plugin_dir = format!("{KUBELET_PLUGINS_DIR}/{DRA_DRIVER}");
    let mut placement = d.pod.clone();
    placement
        .node_selector
        .insert(s(AMD_MODE_LABEL), s(AMD_MODE_DRA));
    daemon_set(
        DRA_PLUGIN,
        &settings.namespace,
        PodSpec {
            init_containers: Some(vec![install_container(
                settings,
                hook_install_script(),
                &hook_dir,
            )]),
            containers: vec![Container {
                name: s("dra-plugin"),
                image: Some(settings.values.node_image().reference()),
                image_pull_policy: Some(settings.values.images.pull_policy.clone()),
                command: Some(vec![s("/usr/bin/amdgpu-dra-plugin")]),
                args: Some(dra_plugin_args(settings)),
                env: Some(vec![env_field("NODE_NAME", "spec.nodeName")]),
                resources: resources(&d.pod.resources),
                volume_mounts: Some(vec![
                    mount("plugins-registry", PLUGINS_REGISTRY_DIR, false),
                    mount("plugin", &plugin_dir, false),
                    mount("sys", "/sys", true),
                    mount("cgroup", "/sys/fs/cgroup", false),
                    mount("dev", HOST_DEV_MOUNT, true),
                    mount("cdi", &d.cdi_spec_dir, false),
                    mount("hook", &hook_dir, false),
                ]),
                // uid 0 owns kubelet's plugin directories, the cgroup files (dmem limits)
                // and the hook directory; no capability on top of that.
                security_context: Some(SecurityContext {
                    run_as_user: Some(0),
                    ..restricted(&[])
                }),
                ..Default::default()
            }],
            volumes: Some(vec![
                host_path("plugins-registry", PLUGINS_REGISTRY_DIR, Some("Directory")),
                host_path("plugin", &plugin_dir, Some("DirectoryOrCreate")),
                host_path("sys", "/sys", Some("Directory")),
                host_path("cgroup", "/sys/fs/cgroup", Some("Directory")),
                host_path("dev", "/dev", Some("Directory")),
                host_path("cdi", &d.cdi_spec_dir, Some("DirectoryOrCreate")),
                host_path("hook", &hook_dir, Some("DirectoryOrCreate")),
            ]),
            ..Default::default()
        },
        &placement,
    )
}

/// The NVIDIA device plugin flags.
pub fn nvidia_device_plugin_args(settings: &Settings) -> Vec<String> {
    let p = &settings.values.nvidia_device_plugin;
    let mut args = vec![
        format!("--device-split-count={}", p.device_split_count),
        format!("--device-memory-scaling={}", p.device_memory_scaling),
        format!("--device-cores-scaling={}", p.device_cores_scaling),
    ];
    if p.report_node_capacity {
        args.push(s("--report-node-capacity"));
    }
    args
}

/// The NVIDIA device plugin DaemonSet: NVML from the driver the runtime exposes, the CUDA
/// hook installed like the AMD one; the plugin writes `vgpu/ld.so.preload` and the
/// per-container cache directories under the hook directory (which the monitor reads).
pub fn nvidia_device_plugin_daemon_set(settings: &Settings) -> Object {
    let p = &settings.values.nvidia_device_plugin;
    let hook_dir = hook_dir_of(&p.host_hook_path);
    daemon_set(
        NVIDIA_DEVICE_PLUGIN,
        &settings.namespace,
        PodSpec {
            runtime_class_name: (!p.runtime_class_name.is_empty())
                .then(|| p.runtime_class_name.clone()),
            init_containers: Some(vec![install_container(
                settings,
                nvidia_hook_install_script(),
                &hook_dir,
            )]),
            containers: vec![Container {
                name: s("device-plugin"),
                image: Some(settings.values.node_image().reference()),
                image_pull_policy: Some(settings.values.images.pull_policy.clone()),
                command: Some(vec![s("/usr/bin/nvidia-device-plugin")]),
                args: Some(nvidia_device_plugin_args(settings)),
                env: Some(vec![
                    env_field("NODE_NAME", "spec.nodeName"),
                    env("HOOK_PATH", &p.host_hook_path),
                    // The NVIDIA Container Toolkit mounts the driver's libraries (NVML) and
                    // device nodes into containers that ask for them.
                    env("NVIDIA_VISIBLE_DEVICES", "all"),
                    env("NVIDIA_DRIVER_CAPABILITIES", "utility"),
                ]),
                resources: resources(&p.pod.resources),
                volume_mounts: Some(vec![
                    mount("device-plugins", DEVICE_PLUGIN_DIR, false),
                    mount("hook", &hook_dir, false),
                ]),
                security_context: Some(SecurityContext {
                    run_as_user: Some(0),
                    ..restricted(&[])
                }),
                ..Default::default()
            }],
            volumes: Some(vec![
                host_path("device-plugins", DEVICE_PLUGIN_DIR, Some("Directory")),
                host_path("hook", &hook_dir, Some("DirectoryOrCreate")),
            ]),
            ..Default::default()
        },
        &p.pod,
    )
}

/// The monitor DaemonSet: reads the hooks' shared regions and the host's /proc (hostPID).
/// Both plugins keep their cache directories under the same hook directory (validated), so
/// one `HOOK_PATH` covers AMD and NVIDIA containers.
pub fn monitor_daemon_set(settings: &Settings) -> Object {
    let hook_dir = host_hook_dir(settings);
    let m = &settings.values.monitor;
    daemon_set(
        MONITOR,
        &settings.namespace,
        PodSpec {
            host_pid: Some(true),
            containers: vec![Container {
                name: s("monitor"),
                image: Some(settings.values.node_image().reference()),
                image_pull_policy: Some(settings.values.images.pull_policy.clone()),
                command: Some(vec![s("/usr/bin/k8s-vgpu-monitor")]),
                args: Some(vec![
                    format!("--metrics-bind-address=:{MONITOR_METRICS_PORT}"),
                    format!("--legacy-metrics={}", m.legacy_metrics),
                ]),
                env: Some(vec![
                    env_field("NODE_NAME", "spec.nodeName"),
                    env("HOOK_PATH", &hook_dir),
                    env("HAMI_SYS_ROOT", "/host/sys"),
                    // The monitor reports only pods this scheduler placed.
                    env(
                        "HAMI_SCHEDULER_NAME",
                        &settings.values.scheduler.scheduler_name,
                    ),
                ]),
                ports: Some(vec![port("metrics", MONITOR_METRICS_PORT)]),
                resources: resources(&m.pod.resources),
                volume_mounts: Some(vec![
                    mount("hook", &hook_dir, false),
                    mount("sys", "/host/sys", true),
                ]),
                // fdinfo of other users' processes needs ptrace read access.
                security_context: Some(SecurityContext {
                    run_as_user: Some(0),
                    ..restricted(&["SYS_PTRACE"])
                }),
                ..Default::default()
            }],
            volumes: Some(vec![
                host_path("hook", &hook_dir, Some("DirectoryOrCreate")),
                host_path("sys", "/sys", Some("Directory")),
            ]),
            ..Default::default()
        },
        &m.pod,
    )
}

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

/// The monitor's metrics Service (scraped by the ServiceMonitor, or by annotation).
pub fn monitor_service(settings: &Settings) -> Object {
    cluster_ip_service(
        MONITOR,
        &settings.namespace,
        &[("metrics", MONITOR_METRICS_PORT)],
    )
}

/// The node labeller DaemonSet (reads sysfs, labels its Node).
pub fn node_labeller_daemon_set(settings: &Settings) -> Object {
    let l = &settings.values.node_labeller;
    daemon_set(
        NODE_LABELLER,
        &settings.namespace,
        PodSpec {
            containers: vec![Container {
                name: s("node-labeller"),
                image: Some(settings.values.node_image().reference()),
                image_pull_policy: Some(settings.values.images.pull_policy.clone()),
                command: Some(vec![s("/usr/bin/k8s-node-labeller")]),
                args: Some(vec![s("--sysfs-root=/host/sys")]),
                env: Some(vec![env_field("DS_NODE_NAME", "spec.nodeName")]),
                resources: resources(&l.pod.resources),
                volume_mounts: Some(vec![mount("sys", "/host/sys", true)]),
                security_context: Some(SecurityContext {
                    run_as_non_root: Some(true),
                    run_as_user: Some(65532),
                    ..restricted(&[])
                }),
                ..Default::default()
            }],
            volumes: Some(vec![host_path("sys", "/sys", Some("Directory"))]),
            ..Default::default()
        },
        &l.pod,
    )
}

/// prometheus-operator ServiceMonitors for the scheduler and the monitor.
pub fn service_monitors(settings: &Settings) -> Vec<Object> {
    let sm = &settings.values.service_monitor;
    let one = |component: &str| {
        let mut meta_labels = labels(component);
        meta_labels.extend(sm.labels.clone());
        Object::Custom(json!({
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": {"name": component, "namespace": settings.namespace, "labels": meta_labels},
            "spec": {
                "selector": {"matchLabels": labels(component)},
                "endpoints": [{"port": "metrics", "interval": sm.interval}]
            }
        }))
    };
    let mut out = vec![one(SCHEDULER)];
    if settings.values.monitor.enabled {
        out.push(one(MONITOR));
    }
    out
}

/// Every object, in apply order: namespace and RBAC first, the webhook last (its backend
/// exists before pods are sent to it).
pub fn all(settings: &Settings, with_namespace: bool) -> Result<Vec<Object>, crate::Error> {
    settings.validate().map_err(crate::Error::Invalid)?;
    let v = &settings.values;
    let mut out = Vec::new();
    if with_namespace {
        out.push(namespace(settings));
    }
    out.extend(rbac_objects(settings));
    out.push(kube_scheduler_config_map(settings)?);
    match v.tls.mode {
        TlsMode::Certgen => out.extend(certgen_jobs(settings)),
        TlsMode::CertManager => out.extend(cert_manager_objects(settings)),
    }
    out.push(scheduler_service(settings));
    out.push(scheduler_deployment(settings));
    out.push(device_plugin_daemon_set(settings));
    if v.dra_plugin.enabled {
        out.push(device_class(settings));
        out.push(dra_plugin_daemon_set(settings));
    }
    if v.nvidia_device_plugin.enabled {
        out.push(nvidia_device_plugin_daemon_set(settings));
    }
    if v.webui.enabled {
        out.push(webui_service(settings));
        out.push(webui_deployment(settings));
    }
    if v.monitor.enabled {
        out.push(monitor_service(settings));
        out.push(monitor_daemon_set(settings));
    }
    if v.node_labeller.enabled {
        out.push(node_labeller_daemon_set(settings));
    }
    if v.service_monitor.enabled {
        out.extend(service_monitors(settings));
    }
    out.push(webhook(settings));
    Ok(out)
}
