//! Every object of an installation, as typed k8s-openapi values (CRD objects — cert-manager,
//! ServiceMonitor — as JSON, since k8s-openapi has no types for them).
//!
//! | module | objects |
//! |---|---|
//! | `shared` | the builders every component uses |
//! | `access` | namespace, service accounts, roles, bindings |
//! | `certs` | the webhook's certificate: certgen Jobs or cert-manager |
//! | `scheduler` | kube-scheduler configuration, the scheduler's Deployment and Service |
//! | `webhook` | the admission webhooks and their match conditions |
//! | `device_plugins` | the AMD and NVIDIA device plugins |
//! | `dra` | the AMD DRA driver |
//! | `monitor` | the monitor and the node labeller |
//! | `webui` | the web UI |

mod access;
mod certs;
mod device_plugins;
mod dra;
mod monitor;
mod scheduler;
mod shared;
mod webhook;
mod webui;

pub use access::*;
pub use certs::*;
pub use device_plugins::*;
pub use dra::*;
pub use monitor::*;
pub use scheduler::*;
use shared::*;
pub use webhook::*;
pub use webui::*;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::api::resource::v1::DeviceClass;

use serde_json::Value;

use crate::settings::{Settings, TlsMode};

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
