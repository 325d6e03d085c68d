//! A device plugin for the containerd tests whose Allocate answers a fixed response: the
//! env, mounts and device nodes a test wants to see inside a real container.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use hami_deviceplugin_api::v1beta1::device_plugin_server::{DevicePlugin, DevicePluginServer};
use hami_deviceplugin_api::v1beta1::registration_client::RegistrationClient;
use hami_deviceplugin_api::v1beta1::{
    AllocateRequest, AllocateResponse, ContainerAllocateResponse, Device, DevicePluginOptions,
    Empty, ListAndWatchResponse, PreStartContainerRequest, PreStartContainerResponse,
    PreferredAllocationRequest, PreferredAllocationResponse, RegisterRequest,
};
use hami_deviceplugin_api::{HEALTHY, VERSION, bind_unix, connect_unix};
use tonic::{Request, Response, Status};

/// The resource every test's plugin serves.
pub(crate) const RESOURCE: &str = "example.com/gpu";

struct Plugin {
    response: ContainerAllocateResponse,
    devices: usize,
    allocated: Arc<Mutex<Vec<Vec<String>>>>,
}

#[tonic::async_trait]
impl DevicePlugin for Plugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(DevicePluginOptions::default()))
    }

    type ListAndWatchStream =
        tokio_stream::wrappers::ReceiverStream<Result<ListAndWatchResponse, Status>>;

    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let devices = (0..self.devices)
            .map(|i| Device {
                id: format!("dev-{i}"),
                health: HEALTHY.into(),
                topology: None,
            })
            .collect();
        tokio::spawn(async move {
            let _ = tx.send(Ok(ListAndWatchResponse { devices })).await;
            // Held open, as a plugin's stream is.
            tx.closed().await;
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
            rx,
        )))
    }

    async fn get_preferred_allocation(
        &self,
        _: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        Err(Status::unimplemented("no preference"))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let r = request.into_inner();
        let mut allocated = self.allocated.lock().unwrap();
        let container_responses = r
            .container_requests
            .iter()
            .map(|c| {
                allocated.push(c.devices_ids.clone());
                self.response.clone()
            })
            .collect();
        Ok(Response::new(AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

/// A running plugin: serves `devices` healthy devices of [`RESOURCE`] on a socket in
/// `socket_dir` and registers with the kubelet there.
pub(crate) struct FakePlugin {
    /// The device ids of each Allocate, in order.
    pub(crate) allocated: Arc<Mutex<Vec<Vec<String>>>>,
    _server: tokio::task::JoinHandle<()>,
}

impl FakePlugin {
    pub(crate) async fn start(
        socket_dir: &Path,
        devices: usize,
        response: ContainerAllocateResponse,
    ) -> Self {
        let endpoint = "fake-gpu.sock";
        let path: PathBuf = socket_dir.join(endpoint);
        let incoming = bind_unix(&path).unwrap();
        let allocated = Arc::new(Mutex::new(Vec::new()));
        let plugin = Plugin {
            response,
            devices,
            allocated: allocated.clone(),
        };
        let server = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(DevicePluginServer::new(plugin))
                .serve_with_incoming(incoming)
                .await;
        });
        let mut reg = RegistrationClient::new(
            connect_unix(&socket_dir.join("kubelet.sock"))
                .await
                .unwrap(),
        );
        reg.register(RegisterRequest {
            version: VERSION.into(),
            endpoint: endpoint.into(),
            resource_name: RESOURCE.into(),
            options: None,
        })
        .await
        .unwrap();
        Self {
            allocated,
            _server: server,
        }
    }
}
