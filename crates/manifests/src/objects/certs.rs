//! The webhook's certificate: the certgen Jobs (Helm hooks) and their RBAC, or cert-manager's
//! objects.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{Container, PodSecurityContext, PodSpec, PodTemplateSpec};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use serde_json::json;

use crate::names::*;
use crate::rbac;
use crate::settings::Settings;

use super::*;

/// Helm runs hooks before it creates ordinary objects, so the certgen Jobs' identity and
/// rights are hooks themselves, created first in each phase (lower weight) and removed
/// when the phase succeeds (as ingress-nginx's certgen does).
pub const CERTGEN_RBAC_HOOK_WEIGHT: &str = "-5";

/// Helm hook weight of the certgen Jobs, after their RBAC.
pub const CERTGEN_JOB_HOOK_WEIGHT: &str = "0";

pub(super) const CERTGEN_HOOKS: &str = "pre-install,pre-upgrade,post-install,post-upgrade";

pub(super) const HOOK_DELETE_POLICY: &str = "before-hook-creation,hook-succeeded";

pub(super) fn hook_annotations(hooks: &str, weight: &str) -> Option<BTreeMap<String, String>> {
    Some(BTreeMap::from([
        (s("helm.sh/hook"), s(hooks)),
        (s("helm.sh/hook-delete-policy"), s(HOOK_DELETE_POLICY)),
        (s("helm.sh/hook-weight"), s(weight)),
    ]))
}

pub(super) fn certgen_rbac(settings: &Settings) -> Vec<Object> {
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
