//! The `KubeSchedulerConfiguration` of the kube-scheduler sidecar (SPEC §3): one profile,
//! one extender that filters and binds, managed resources ignored by kube-scheduler's own
//! fit. kube-scheduler's config types are not in k8s-openapi, so they are typed here
//! (field names as `kubescheduler.config.k8s.io/v1` spells them).

use serde::Serialize;

use crate::names;
use crate::settings::Settings;

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeSchedulerConfiguration {
    pub api_version: String,
    pub kind: String,
    pub leader_election: LeaderElection,
    pub profiles: Vec<Profile>,
    pub extenders: Vec<Extender>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaderElection {
    pub leader_elect: bool,
    pub resource_name: String,
    pub resource_namespace: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Profile {
    pub scheduler_name: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Extender {
    pub url_prefix: String,
    pub filter_verb: String,
    pub bind_verb: String,
    pub enable_https: bool,
    pub tls_config: TlsConfig,
    pub node_cache_capable: bool,
    pub weight: i64,
    pub http_timeout: String,
    /// Any extender error fails the scheduling cycle (never schedule GPU pods blind).
    pub ignorable: bool,
    pub managed_resources: Vec<ManagedResource>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TlsConfig {
    /// The sidecar reaches the extender on 127.0.0.1 inside the pod; the webhook
    /// certificate is for the Service name, so verification is skipped (as the reference).
    pub insecure: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ManagedResource {
    pub name: String,
    pub ignored_by_scheduler: bool,
}

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
            scheduler_name: settings.scheduler_name.clone(),
        }],
        extenders: vec![Extender {
            url_prefix: format!("https://127.0.0.1:{}", names::SCHEDULER_HTTPS_PORT),
            filter_verb: "filter".into(),
            bind_verb: "bind".into(),
            enable_https: true,
            tls_config: TlsConfig { insecure: true },
            node_cache_capable: true,
            weight: 1,
            http_timeout: "30s".into(),
            ignorable: false,
            managed_resources: names::MANAGED_RESOURCES
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
