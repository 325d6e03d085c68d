//! kubelet's `Registration` service: a plugin registers, the kubelet dials back the
//! plugin's socket and follows its ListAndWatch stream.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use hami_deviceplugin_api::v1beta1::device_plugin_client::DevicePluginClient;
use hami_deviceplugin_api::v1beta1::registration_server::Registration;
use hami_deviceplugin_api::v1beta1::{Empty, RegisterRequest};
use hami_deviceplugin_api::{VERSION, connect_unix};
use tokio::sync::Notify;
use tonic::{Request, Response, Status};

use crate::device_state::DeviceState;

/// The Registration service of the simulated kubelet.
#[derive(Clone)]
pub struct RegistrationService {
    /// The device-plugin directory: registered endpoints are socket names inside it.
    pub dir: PathBuf,
    /// Shared with the admission worker: registered resources and their devices.
    pub state: Arc<Mutex<DeviceState>>,
    /// Notified whenever a device list changes.
    pub changed: Arc<Notify>,
}

fn lock(state: &Mutex<DeviceState>) -> std::sync::MutexGuard<'_, DeviceState> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let req = request.into_inner();
        if req.version != VERSION {
            return Err(Status::invalid_argument(format!(
                "unsupported device plugin API version {:?}: this kubelet speaks {VERSION}",
                req.version
            )));
        }
        if req
            .resource_name
            .split_once('/')
            .is_none_or(|(d, n)| d.is_empty() || n.is_empty())
        {
            return Err(Status::invalid_argument(format!(
                "resource name {:?} must be <vendor domain>/<name>, e.g. amd.com/gpu",
                req.resource_name
            )));
        }
        if req.endpoint.is_empty() || req.endpoint.contains('/') {
            return Err(Status::invalid_argument(format!(
                "endpoint {:?} must be a socket file name inside {}",
                req.endpoint,
                self.dir.display()
            )));
        }
        let preferred = req
            .options
            .as_ref()
            .is_some_and(|o| o.get_preferred_allocation_available);
        let generation = {
            let mut s = lock(&self.state);
            s.registrations += 1;
            let entry = s.resources.entry(req.resource_name.clone()).or_default();
            entry.endpoint = req.endpoint.clone();
            entry.preferred_allocation = preferred;
            entry.generation += 1;
            entry.generation
        };
        tracing::info!(resource = %req.resource_name, endpoint = %req.endpoint, "device plugin registered");
        let this = self.clone();
        tokio::spawn(async move {
            this.follow(req.resource_name, req.endpoint, generation)
                .await
        });
        Ok(Response::new(Empty {}))
    }
}

impl RegistrationService {
    /// Dials the plugin and mirrors its ListAndWatch stream until it ends.
    async fn follow(&self, resource: String, endpoint: String, generation: u64) {
        let socket = self.dir.join(&endpoint);
        let result: Result<(), String> = async {
            let channel = connect_unix(&socket)
                .await
                .map_err(|e| format!("cannot dial plugin {}: {e}", socket.display()))?;
            let mut client = DevicePluginClient::new(channel);
            let mut stream = client
                .list_and_watch(Empty {})
                .await
                .map_err(|e| format!("ListAndWatch refused: {}", e.message()))?
                .into_inner();
            loop {
                match stream.message().await {
                    Ok(Some(list)) => {
                        let mut s = lock(&self.state);
                        let entry = s.resources.entry(resource.clone()).or_default();
                        if entry.generation != generation {
                            return Ok(()); // a newer registration replaced this one
                        }
                        entry.devices = list.devices;
                        entry.updates += 1;
                        entry.connected = true;
                        drop(s);
                        self.changed.notify_waiters();
                    }
                    Ok(None) => return Ok(()),
                    Err(e) => return Err(format!("ListAndWatch ended: {}", e.message())),
                }
            }
        }
        .await;
        if let Err(e) = result {
            tracing::warn!(%resource, "{e}");
        }
        let mut s = lock(&self.state);
        if let Some(entry) = s.resources.get_mut(&resource)
            && entry.generation == generation
        {
            // The plugin is gone: its devices are no longer allocatable (ids are kept so
            // a re-registering plugin's ids still match the checkpoint).
            entry.connected = false;
            entry.devices.clear();
        }
        drop(s);
        self.changed.notify_waiters();
    }
}
