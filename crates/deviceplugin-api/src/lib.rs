//! The kubelet's plugin gRPC APIs, generated at build time from the vendored protos with
//! protox (no system `protoc`): the device-plugin API `deviceplugin/v1beta1` ([`v1beta1`]),
//! the DRA plugin API `dra/v1` ([`dra_v1`]) and the plugin-watcher registration API
//! `pluginregistration/v1` ([`pluginregistration`]); plus the unix-socket plumbing both
//! sides need: serving a tonic service on a socket file and dialling one. Used by the AMD
//! device plugin, the AMD DRA plugin and the simulated kubelet, so all of them speak exactly
//! the wire format a real kubelet speaks.

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// The generated messages and the `Registration`/`DevicePlugin` clients and servers.
#[allow(
    clippy::all,
    missing_docs,
    reason = "prost/tonic output; the .proto carries its docs"
)]
pub mod v1beta1 {
    tonic::include_proto!("v1beta1");
}

/// The generated DRA v1 messages and the `DraPlugin` client and server (kubelet
/// `k8s.io/kubelet/pkg/apis/dra/v1`).
#[allow(
    clippy::all,
    missing_docs,
    reason = "prost/tonic output; the .proto carries its docs"
)]
pub mod dra_v1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// The generated plugin-registration v1 messages and the `Registration` client and server a
/// kubelet plugin (DRA, CSI) serves on the plugin-registry socket. The proto package is
/// `pluginregistration` (upstream never versioned it), hence the module name.
#[allow(
    clippy::all,
    missing_docs,
    reason = "prost/tonic output; the .proto carries its docs"
)]
pub mod pluginregistration {
    tonic::include_proto!("pluginregistration");
}

/// Kubelet's plugin-registry directory on a real node (the plugin watcher dials every
/// socket in it).
pub const PLUGINS_REGISTRY: &str = "/var/lib/kubelet/plugins_registry";
/// `PluginInfo.type` of a DRA plugin.
pub const DRA_PLUGIN_TYPE: &str = "DRAPlugin";
/// The DRA v1 service name kubelet looks for in `PluginInfo.supported_versions`.
pub const DRA_V1_SERVICE: &str = "v1.DRAPlugin";

/// API version sent in `RegisterRequest.version`.
pub const VERSION: &str = "v1beta1";
/// Kubelet's device-plugin directory on a real node.
pub const DEVICE_PLUGIN_PATH: &str = "/var/lib/kubelet/device-plugins";
/// Kubelet's registration socket name inside that directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// `Device.health` of a device the kubelet may allocate.
pub const HEALTHY: &str = "Healthy";
/// `Device.health` of a device the kubelet must stop allocating.
pub const UNHEALTHY: &str = "Unhealthy";

/// Binds a unix socket for a gRPC server, removing a stale socket file first.
pub fn bind_unix(path: &Path) -> std::io::Result<UnixListenerStream> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    Ok(UnixListenerStream::new(UnixListener::bind(path)?))
}

/// A gRPC channel over the unix socket at `path` (the URI is required by tonic but unused).
pub async fn connect_unix(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path: PathBuf = path.to_owned();
    Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
}
