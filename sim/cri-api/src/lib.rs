//! The Kubernetes Container Runtime Interface, CRI v1 (`runtime.v1`), generated at build
//! time from the vendored `proto/api.proto` with protox (no system `protoc`; see README.md
//! for its origin and the lines removed), plus dialling a runtime's unix socket. The
//! simulated kubelet speaks it to a real containerd (`hami-kubelet-sim`'s `cri_runtime`),
//! so pods run as a kubelet runs them: sandbox, containers, images by CRI, not by a CLI.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// The generated CRI v1 messages and the `RuntimeService`/`ImageService` clients.
#[allow(
    clippy::all,
    missing_docs,
    reason = "prost/tonic output; the .proto carries its docs"
)]
pub mod v1 {
    tonic::include_proto!("runtime.v1");
}

pub use v1::image_service_client::ImageServiceClient;
pub use v1::runtime_service_client::RuntimeServiceClient;

/// containerd's CRI socket on a real node.
pub const CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";

/// The containerd namespace the CRI plugin keeps its images and containers in: an image
/// imported into any other namespace is invisible to CRI.
pub const K8S_NAMESPACE: &str = "k8s.io";

/// A gRPC channel over the runtime's unix socket at `path` (the URI is required by tonic
/// but unused). Dials at once: a missing socket or a runtime that does not listen is an
/// error here, within `timeout`, not at the first call.
pub async fn connect(path: &Path, timeout: Duration) -> Result<Channel, tonic::transport::Error> {
    let path: PathBuf = path.to_owned();
    Endpoint::from_static("http://[::]:50051")
        .connect_timeout(timeout)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
}

/// Both CRI clients over one channel.
#[derive(Debug, Clone)]
pub struct Cri {
    /// Sandboxes and containers.
    pub runtime: RuntimeServiceClient<Channel>,
    /// Images (status only: kubelet-sim never pulls).
    pub images: ImageServiceClient<Channel>,
}

impl Cri {
    /// Dials the runtime at `socket` and checks it speaks CRI v1 (`Version`), as kubelet
    /// does at start. The error says which step failed.
    pub async fn connect(socket: &Path, timeout: Duration) -> Result<Self, String> {
        let channel = connect(socket, timeout)
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", socket.display()))?;
        let mut runtime = RuntimeServiceClient::new(channel.clone());
        let version = tokio::time::timeout(
            timeout,
            runtime.version(v1::VersionRequest {
                version: "v1".into(),
            }),
        )
        .await
        .map_err(|_| format!("{}: no answer to CRI Version", socket.display()))?
        .map_err(|e| {
            format!(
                "{}: CRI v1 Version refused ({:?}: {}); is the CRI plugin enabled?",
                socket.display(),
                e.code(),
                e.message()
            )
        })?;
        let v = version.into_inner();
        if v.runtime_api_version != "v1" {
            return Err(format!(
                "{}: the runtime speaks CRI {:?}, not v1",
                socket.display(),
                v.runtime_api_version
            ));
        }
        Ok(Self {
            runtime,
            images: ImageServiceClient::new(channel),
        })
    }
}
