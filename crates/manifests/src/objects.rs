//! Every object of an installation, as typed k8s-openapi values (CRD objects — cert-manager,
//! ServiceMonitor — as JSON, since k8s-openapi has no types for them).

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
    WebhookClientConfig,
};
use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy, Deployment, DeploymentSpec,
    RollingUpdateDaemonSet,
};
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, EnvVarSource,
    HTTPGetAction, HostPathVolumeSource, Namespace, ObjectFieldSelector, PodSecurityContext,
    PodSpec, PodTemplateSpec, Probe, SecretVolumeSource, SecurityContext, Service, ServiceAccount,
    ServicePort, ServiceSpec, Toleration, Volume, VolumeMount,
};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};

use crate::kube_scheduler_config;
use crate::names::*;
use crate::rbac;
use crate::settings::{Settings, TlsMode};

/// One object of the installation.
#[derive(Debug, Clone, PartialEq)]
pub enum Object {
    Namespace(Namespace),
    ServiceAccount(ServiceAccount),
    ClusterRole(ClusterRole),
    ClusterRoleBinding(ClusterRoleBinding),
    Role(Role),
    RoleBinding(RoleBinding),
    ConfigMap(ConfigMap),
    Service(Service),
    Deployment(Deployment),
    DaemonSet(DaemonSet),
    Job(Job),
    MutatingWebhookConfiguration(MutatingWebhookConfiguration),
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
            api_group: s("rbac.authorization.k8s.io"),
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
            api_group: s("rbac.authorization.k8s.io"),
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

fn critical_tolerations() -> Vec<Toleration> {
    vec![Toleration {
        key: Some(s("CriticalAddonsOnly")),
        operator: Some(s("Exists")),
        ..Default::default()
    }]
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
    let mut out = vec![
        sa(SCHEDULER, ns),
        cluster_role(SCHEDULER, SCHEDULER, rbac::scheduler_cluster_rules()),
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
    if settings.monitor_enabled {
        out.extend([
            sa(MONITOR, ns),
            cluster_role(MONITOR, MONITOR, rbac::monitor_cluster_rules()),
            cluster_binding(MONITOR, MONITOR, MONITOR, sa_subject(MONITOR, ns)),
        ]);
    }
    if settings.node_labeller_enabled {
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
    if settings.tls == TlsMode::Certgen {
        out.extend([
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
        ]);
    }
    out
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
    vec![
        format!("--http-bind=0.0.0.0:{SCHEDULER_HTTPS_PORT}"),
        format!("--cert-file={TLS_MOUNT}/tls.crt"),
        format!("--key-file={TLS_MOUNT}/tls.key"),
        format!("--metrics-bind-address=0.0.0.0:{SCHEDULER_METRICS_PORT}"),
        format!("--scheduler-name={}", settings.scheduler_name),
        format!("--gpu-scheduler-policy={}", settings.gpu_scheduler_policy),
        format!("--node-scheduler-policy={}", settings.node_scheduler_policy),
        s("--leader-elect"),
        format!("--lease-name={SCHEDULER_LEASE}"),
    ]
}

/// Scheduler Deployment: kube-scheduler sidecar + extender/webhook.
pub fn scheduler_deployment(settings: &Settings) -> Object {
    let ns = settings.namespace.as_str();
    let kube_scheduler = Container {
        name: s("kube-scheduler"),
        image: Some(settings.kube_scheduler_image.reference()),
        image_pull_policy: Some(settings.image_pull_policy.clone()),
        command: Some(vec![
            s("kube-scheduler"),
            format!("--config={KUBE_SCHEDULER_CONFIG_MOUNT}/config.yaml"),
        ]),
        volume_mounts: Some(vec![mount(
            "scheduler-config",
            KUBE_SCHEDULER_CONFIG_MOUNT,
            true,
        )]),
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
        image: Some(settings.scheduler_image.reference()),
        image_pull_policy: Some(settings.image_pull_policy.clone()),
        command: Some(vec![s("/hami-scheduler")]),
        args: Some(scheduler_args(settings)),
        env: Some(vec![
            env_field("POD_NAME", "metadata.name"),
            env_field("POD_NAMESPACE", "metadata.namespace"),
        ]),
        ports: Some(vec![
            port("https", SCHEDULER_HTTPS_PORT),
            port("metrics", SCHEDULER_METRICS_PORT),
        ]),
        liveness_probe: Some(probe("/healthz")),
        readiness_probe: Some(probe("/readyz")),
        volume_mounts: Some(vec![mount("tls", TLS_MOUNT, true)]),
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
            replicas: Some(settings.scheduler_replicas),
            selector: selector(SCHEDULER),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels(SCHEDULER)),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(s(SCHEDULER)),
                    priority_class_name: Some(s("system-cluster-critical")),
                    containers: vec![kube_scheduler, extender],
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        run_as_user: Some(65532),
                        ..Default::default()
                    }),
                    volumes: Some(vec![
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
                    ]),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The scheduler Service: the webhook target and the metrics endpoint. Only ready pods
/// (i.e. the leader: `/readyz` is ready only when synced and leader) get traffic.
pub fn scheduler_service(settings: &Settings) -> Object {
    let svc_port = |name: &str, number: i32| ServicePort {
        name: Some(s(name)),
        port: number,
        target_port: Some(IntOrString::String(s(name))),
        protocol: Some(s("TCP")),
        ..Default::default()
    };
    Object::Service(Service {
        metadata: meta(SCHEDULER, Some(&settings.namespace), SCHEDULER),
        spec: Some(ServiceSpec {
            type_: Some(s("ClusterIP")),
            selector: Some(labels(SCHEDULER)),
            ports: Some(vec![
                svc_port("https", SERVICE_HTTPS_PORT),
                svc_port("metrics", SCHEDULER_METRICS_PORT),
            ]),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The mutating webhook (SPEC §3, D-4): `failurePolicy: Fail`, pods and namespaces labelled
/// `hami.io/webhook=ignore` are left alone.
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
    let annotations = match settings.tls {
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
        webhooks: Some(vec![MutatingWebhook {
            name: s(WEBHOOK_NAME),
            client_config: WebhookClientConfig {
                service: Some(ServiceReference {
                    name: s(SCHEDULER),
                    namespace: settings.namespace.clone(),
                    path: Some(s(WEBHOOK_PATH)),
                    port: Some(SERVICE_HTTPS_PORT),
                }),
                ..Default::default()
            },
            rules: Some(vec![RuleWithOperations {
                api_groups: Some(vec![s("")]),
                api_versions: Some(vec![s("v1")]),
                operations: Some(vec![s("CREATE")]),
                resources: Some(vec![s("pods")]),
                scope: Some(s("*")),
            }]),
            failure_policy: Some(s("Fail")),
            match_policy: Some(s("Equivalent")),
            side_effects: s("None"),
            timeout_seconds: Some(10),
            reinvocation_policy: Some(s("Never")),
            admission_review_versions: vec![s("v1"), s("v1beta1")],
            namespace_selector: Some(namespaces),
            object_selector: Some(pods),
            ..Default::default()
        }]),
    })
}

/// TLS by kube-webhook-certgen: one Job creates the Secret, one patches the caBundle.
pub fn certgen_jobs(settings: &Settings) -> Vec<Object> {
    let ns = settings.namespace.as_str();
    let job = |name: &str, hook: &str, args: Vec<String>| {
        Object::Job(Job {
            metadata: ObjectMeta {
                annotations: Some(BTreeMap::from([
                    (s("helm.sh/hook"), s(hook)),
                    (
                        s("helm.sh/hook-delete-policy"),
                        s("before-hook-creation,hook-succeeded"),
                    ),
                ])),
                ..meta(name, Some(ns), CERTGEN)
            },
            spec: Some(JobSpec {
                backoff_limit: Some(6),
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(pod_labels(CERTGEN)),
                        ..Default::default()
                    }),
                    spec: Some(PodSpec {
                        service_account_name: Some(s(CERTGEN)),
                        restart_policy: Some(s("OnFailure")),
                        security_context: Some(PodSecurityContext {
                            run_as_non_root: Some(true),
                            run_as_user: Some(65532),
                            ..Default::default()
                        }),
                        containers: vec![Container {
                            name: s(name),
                            image: Some(settings.certgen_image.reference()),
                            image_pull_policy: Some(settings.image_pull_policy.clone()),
                            args: Some(args),
                            security_context: Some(restricted(&[])),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
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
                s("--patch-failure-policy=Fail"),
            ],
        ),
    ]
}

/// TLS by cert-manager: a self-signed Issuer and the serving Certificate.
pub fn cert_manager_objects(settings: &Settings) -> Vec<Object> {
    let ns = settings.namespace.as_str();
    vec![
        Object::Custom(json!({
            "apiVersion": "cert-manager.io/v1",
            "kind": "Issuer",
            "metadata": {"name": SCHEDULER, "namespace": ns, "labels": labels(SCHEDULER)},
            "spec": {"selfSigned": {}}
        })),
        Object::Custom(json!({
            "apiVersion": "cert-manager.io/v1",
            "kind": "Certificate",
            "metadata": {"name": SCHEDULER, "namespace": ns, "labels": labels(SCHEDULER)},
            "spec": {
                "secretName": TLS_SECRET,
                "dnsNames": [SCHEDULER, format!("{SCHEDULER}.{ns}.svc")],
                "ipAddresses": ["127.0.0.1"],
                "issuerRef": {"name": SCHEDULER, "kind": "Issuer"}
            }
        })),
    ]
}

/// The AMD device plugin flags.
pub fn device_plugin_args(settings: &Settings) -> Vec<String> {
    let p = &settings.device_plugin;
    let mut args = vec![
        format!("--pulse={}", p.pulse),
        format!("--split_count={}", p.split_count),
        format!("--device_memory_scaling={}", p.device_memory_scaling),
    ];
    if p.report_node_capacity {
        args.push(s("--report_node_capacity"));
    }
    args
}

/// The hook directory on the host (`$HOST_HOOK_PATH/vgpu`).
pub fn host_hook_dir(settings: &Settings) -> String {
    format!(
        "{}/vgpu",
        settings.device_plugin.host_hook_path.trim_end_matches('/')
    )
}

/// The init container that installs the hook: copy beside, then rename over, so a process
/// that maps the old file keeps its inode and a new one never sees a half-written file.
pub fn hook_install_script() -> String {
    format!(
        "set -eu; dst=\"$HOOK_DIR/libamvgpu.so\"; src={HOOK_IN_IMAGE}; \
         if cmp -s \"$src\" \"$dst\"; then exit 0; fi; \
         tmp=\"$HOOK_DIR/.libamvgpu.so.$$\"; cp \"$src\" \"$tmp\"; chmod 0555 \"$tmp\"; \
         mv -f \"$tmp\" \"$dst\""
    )
}

fn daemon_set(name: &str, ns: &str, spec: PodSpec) -> Object {
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
                spec: Some(PodSpec {
                    service_account_name: Some(s(name)),
                    priority_class_name: Some(s("system-node-critical")),
                    tolerations: Some(critical_tolerations()),
                    ..spec
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The AMD device plugin DaemonSet (hook installed atomically by an init container).
pub fn device_plugin_daemon_set(settings: &Settings) -> Object {
    let p = &settings.device_plugin;
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
    let node_image = settings.node_image.reference();
    daemon_set(
        DEVICE_PLUGIN,
        &settings.namespace,
        PodSpec {
            init_containers: Some(vec![Container {
                name: s("install-hook"),
                image: Some(node_image.clone()),
                image_pull_policy: Some(settings.image_pull_policy.clone()),
                command: Some(vec![s("/bin/sh"), s("-c"), hook_install_script()]),
                env: Some(vec![env("HOOK_DIR", &hook_dir)]),
                volume_mounts: Some(vec![mount("hook", &hook_dir, false)]),
                security_context: Some(SecurityContext {
                    run_as_user: Some(0),
                    ..restricted(&[])
                }),
                ..Default::default()
            }]),
            containers: vec![Container {
                name: s("device-plugin"),
                image: Some(node_image),
                image_pull_policy: Some(settings.image_pull_policy.clone()),
                command: Some(vec![s("/usr/bin/k8s-device-plugin")]),
                args: Some(device_plugin_args(settings)),
                env: Some(vec![
                    env_field("NODE_NAME", "spec.nodeName"),
                    env("HOST_HOOK_PATH", &p.host_hook_path),
                    env("OPERATING_MODE", &p.operating_mode),
                ]),
                volume_mounts: Some(vec![
                    mount("device-plugins", DEVICE_PLUGIN_DIR, false),
                    mount("sys", "/sys", true),
                    mount("cgroup", "/sys/fs/cgroup", false),
                    mount("hook", &hook_dir, false),
                ]),
                security_context: Some(plugin_security),
                ..Default::default()
            }],
            volumes: Some(vec![
                host_path("device-plugins", DEVICE_PLUGIN_DIR, Some("Directory")),
                host_path("sys", "/sys", Some("Directory")),
                host_path("cgroup", "/sys/fs/cgroup", Some("Directory")),
                host_path("hook", &hook_dir, Some("DirectoryOrCreate")),
            ]),
            ..Default::default()
        },
    )
}

/// The monitor DaemonSet: reads the hook's shared regions and the host's /proc (hostPID).
pub fn monitor_daemon_set(settings: &Settings) -> Object {
    let hook_dir = host_hook_dir(settings);
    daemon_set(
        MONITOR,
        &settings.namespace,
        PodSpec {
            host_pid: Some(true),
            containers: vec![Container {
                name: s("monitor"),
                image: Some(settings.node_image.reference()),
                image_pull_policy: Some(settings.image_pull_policy.clone()),
                command: Some(vec![s("/usr/bin/k8s-vgpu-monitor")]),
                args: Some(vec![format!(
                    "--metrics-bind-address=:{MONITOR_METRICS_PORT}"
                )]),
                env: Some(vec![
                    env_field("NODE_NAME", "spec.nodeName"),
                    env("HOOK_PATH", &hook_dir),
                    env("HAMI_SYS_ROOT", "/host/sys"),
                ]),
                ports: Some(vec![port("metrics", MONITOR_METRICS_PORT)]),
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
    )
}

/// The monitor's metrics Service (scraped by the ServiceMonitor, or by annotation).
pub fn monitor_service(settings: &Settings) -> Object {
    Object::Service(Service {
        metadata: meta(MONITOR, Some(&settings.namespace), MONITOR),
        spec: Some(ServiceSpec {
            type_: Some(s("ClusterIP")),
            selector: Some(labels(MONITOR)),
            ports: Some(vec![ServicePort {
                name: Some(s("metrics")),
                port: MONITOR_METRICS_PORT,
                target_port: Some(IntOrString::String(s("metrics"))),
                protocol: Some(s("TCP")),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The node labeller DaemonSet (reads sysfs, labels its Node).
pub fn node_labeller_daemon_set(settings: &Settings) -> Object {
    daemon_set(
        NODE_LABELLER,
        &settings.namespace,
        PodSpec {
            containers: vec![Container {
                name: s("node-labeller"),
                image: Some(settings.node_image.reference()),
                image_pull_policy: Some(settings.image_pull_policy.clone()),
                command: Some(vec![s("/usr/bin/k8s-node-labeller")]),
                args: Some(vec![s("--sysfs-root=/host/sys")]),
                env: Some(vec![env_field("DS_NODE_NAME", "spec.nodeName")]),
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
    )
}

/// prometheus-operator ServiceMonitors for the scheduler and the monitor.
pub fn service_monitors(settings: &Settings) -> Vec<Object> {
    let one = |component: &str| {
        Object::Custom(json!({
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": {"name": component, "namespace": settings.namespace, "labels": labels(component)},
            "spec": {
                "selector": {"matchLabels": labels(component)},
                "endpoints": [{"port": "metrics", "interval": "15s"}]
            }
        }))
    };
    let mut out = vec![one(SCHEDULER)];
    if settings.monitor_enabled {
        out.push(one(MONITOR));
    }
    out
}

/// Every object, in apply order: namespace and RBAC first, the webhook last (its backend
/// exists before pods are sent to it).
pub fn all(settings: &Settings, with_namespace: bool) -> Result<Vec<Object>, crate::Error> {
    settings.validate().map_err(crate::Error::Invalid)?;
    let mut out = Vec::new();
    if with_namespace {
        out.push(namespace(settings));
    }
    out.extend(rbac_objects(settings));
    out.push(kube_scheduler_config_map(settings)?);
    match settings.tls {
        TlsMode::Certgen => out.extend(certgen_jobs(settings)),
        TlsMode::CertManager => out.extend(cert_manager_objects(settings)),
    }
    out.push(scheduler_service(settings));
    out.push(scheduler_deployment(settings));
    out.push(device_plugin_daemon_set(settings));
    if settings.monitor_enabled {
        out.push(monitor_service(settings));
        out.push(monitor_daemon_set(settings));
    }
    if settings.node_labeller_enabled {
        out.push(node_labeller_daemon_set(settings));
    }
    if settings.service_monitor_enabled {
        out.extend(service_monitors(settings));
    }
    out.push(webhook(settings));
    Ok(out)
}
