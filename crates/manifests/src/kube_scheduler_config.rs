//! The `KubeSchedulerConfiguration` of the kube-scheduler sidecar (SPEC §3): one profile,
//! one extender that filters, binds and chooses preemption victims (issue 30), managed
//! resources ignored by kube-scheduler's own fit. kube-scheduler's config types are not
//! in k8s-openapi, so they are typed here (field names as `kubescheduler.config.k8s.io/v1`
//! spells them; kube-scheduler decodes its config strictly and case-sensitively, so
//! `tests/it/upstream_config_schema.rs` checks every emitted field against an independent
//! copy of the upstream Go types).

use serde::Serialize;

use crate::names;
use crate::settings::Settings;

/// `kubescheduler.config.k8s.io/v1` `KubeSchedulerConfiguration` (the fields we set).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeSchedulerConfiguration {
    /// `kubescheduler.config.k8s.io/v1`.
    pub api_version: String,
    /// `KubeSchedulerConfiguration`.
    pub kind: String,
    /// The sidecars' leader election.
    pub leader_election: LeaderElection,
    /// One profile, named for our scheduler.
    pub profiles: Vec<Profile>,
    /// The HAMi extender.
    pub extenders: Vec<Extender>,
}

/// Upstream `LeaderElectionConfiguration` (the fields we set).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaderElection {
    /// Whether the sidecars elect a leader.
    pub leader_elect: bool,
    /// The Lease's name.
    pub resource_name: String,
    /// The Lease's namespace.
    pub resource_namespace: String,
}

/// Upstream `KubeSchedulerProfile` (the name only).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Profile {
    /// The `schedulerName` the profile serves.
    pub scheduler_name: String,
}

/// Upstream `Extender`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Extender {
    /// Base URL of the extender listener.
    pub url_prefix: String,
    /// `filter`.
    pub filter_verb: String,
    /// `bind`.
    pub bind_verb: String,
    /// `preempt`: kube-scheduler asks the extender which of its proposed victims to evict
    /// (its own dry run cannot see which GPU a slice is on; from 1.38 it also proposes
    /// nodes with no victims for the extender to fill).
    pub preempt_verb: String,
    /// Upstream `EnableHTTPS bool \`json:"enableHTTPS"\``: not camelCase.
    #[serde(rename = "enableHTTPS")]
    pub enable_https: bool,
    /// How kube-scheduler verifies the extender and authenticates to it.
    pub tls_config: TlsConfig,
    /// The extender keeps its own node cache (kube-scheduler sends names only).
    pub node_cache_capable: bool,
    /// Weight of its prioritize scores (no prioritize verb is set).
    pub weight: i64,
    /// Per-call timeout, e.g. `30s`.
    pub http_timeout: String,
    /// Any extender error fails the scheduling cycle (never schedule GPU pods blind).
    pub ignorable: bool,
    /// Resources the extender decides for.
    pub managed_resources: Vec<ManagedResource>,
}

/// How kube-scheduler checks the extender and proves itself: the serving certificate is
/// verified against the CA (it carries `127.0.0.1`), and kube-scheduler presents a
/// certificate the extender listener requires: a client certificate of the same CA
/// (cert-manager) or the pinned serving certificate itself (certgen).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TlsConfig {
    /// Name the extender's certificate must carry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
    /// Client certificate kube-scheduler presents.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<String>,
    /// Its key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_file: Option<String>,
    /// CA that verifies the extender's serving certificate.
    pub ca_file: String,
}

/// Upstream `ExtenderManagedResource`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ManagedResource {
    /// The extended resource, e.g. `amd.com/gpu`.
    pub name: String,
    /// Whether kube-scheduler's own fit skips it.
    pub ignored_by_scheduler: bool,
}

fn tls_config(settings: &Settings) -> TlsConfig {
    let ca_file = format!("{}/ca.crt", names::TLS_MOUNT);
    if settings.client_ca() {
        TlsConfig {
            server_name: Some(settings.service_dns_name()),
            cert_file: Some(format!("{}/tls.crt", names::CLIENT_TLS_MOUNT)),
            key_file: Some(format!("{}/tls.key", names::CLIENT_TLS_MOUNT)),
            ca_file,
        }
    } else {
        // The pinned serving certificate, presented back (127.0.0.1 is in its SANs).
        TlsConfig {
            server_name: None,
            cert_file: Some(format!("{}/tls.crt", names::TLS_MOUNT)),
            key_file: Some(format!("{}/tls.key", names::TLS_MOUNT)),
            ca_file,
        }
    }
}

/// The configuration for `settings`.
pub fn config(settings: &Settings) -> KubeSchedulerConfiguration {
    KubeSchedulerConfiguration {
        api_version: "kubescheduler.config.k8s.io/v1".into(),
        kind: "KubeSchedulerConfiguration".into(),
        leader_election: LeaderElection {
            leader_elect: true,
            resource_name: names::KUBE_SCHEDULER_LEASE.into(),
            resource_namespace: settings.namespace.clone(),
        },
        profiles: vec![Profile {
            scheduler_name: settings.values.scheduler.scheduler_name.clone(),
        }],
        extenders: vec![Extender {
            url_prefix: format!("https://127.0.0.1:{}", names::EXTENDER_PORT),
            filter_verb: "filter".into(),
            bind_verb: "bind".into(),
            preempt_verb: "preempt".into(),
            enable_https: true,
            tls_config: tls_config(settings),
            node_cache_capable: true,
            weight: 1,
            http_timeout: "30s".into(),
            ignorable: false,
            managed_resources: hami_protocol::names::managed_resources()
                .iter()
                .map(|n| ManagedResource {
                    name: n.to_string(),
                    ignored_by_scheduler: true,
                })
                .collect(),
        }],
    }
}

/// The YAML file mounted at `/config/config.yaml`.
pub fn config_yaml(settings: &Settings) -> Result<String, crate::Error> {
    serde_saphyr::to_string(&config(settings))
        .map_err(|e| crate::Error::Yaml(format!("KubeSchedulerConfiguration: {e}")))
}
