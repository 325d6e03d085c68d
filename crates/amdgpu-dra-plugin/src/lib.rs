//! The kubelet DRA plugin for AMD GPU slices (issue 20): the shell around `hami-dra-core`.
//! `registration` serves the plugin-registry socket (pluginregistration v1), `service` the
//! DRA v1 `NodePrepareResources`/`NodeUnprepareResources` on the plugin socket, `driver`
//! does the work (idempotent, serialised, checkpointed in `checkpoint`), `claims` reads
//! ResourceClaims from the API server, `slice_publisher` keeps the node's ResourceSlices.

#[allow(clippy::all, missing_docs)]
pub mod dra_v1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

#[allow(clippy::all, missing_docs)]
pub mod pluginregistration {
    tonic::include_proto!("pluginregistration");
}

pub mod checkpoint;
pub mod claims;
pub mod driver;
pub mod files;
pub mod registration;
pub mod service;
pub mod slice_publisher;

/// Kubelet's plugin-registry directory on a real node.
pub const PLUGINS_REGISTRY: &str = "/var/lib/kubelet/plugins_registry";
/// The service name kubelet matches in `supported_versions`.
pub const DRA_V1_SERVICE: &str = "v1.DRAPlugin";
/// `PluginInfo.type` of a DRA driver.
pub const DRA_PLUGIN_TYPE: &str = "DRAPlugin";
