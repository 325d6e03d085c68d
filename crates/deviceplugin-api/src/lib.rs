//! The kubelet device-plugin API, `deviceplugin/v1beta1`, generated at build time from the
//! vendored `proto/deviceplugin_v1beta1.proto` with protox (no system `protoc`), plus the
//! unix-socket plumbing both sides need: serving a tonic service on a socket file and
//! dialling one. Used by the AMD device plugin and by the simulated kubelet, so both speak
//! exactly the wire format a real kubelet speaks.

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
