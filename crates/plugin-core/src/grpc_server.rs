//! The kubelet-facing gRPC service (`deviceplugin/v1beta1` `DevicePlugin`): a thin shell
//! over a device list (a watch channel fed by discovery and health, of any vendor's device
//! type, turned into kubelet devices by a lister) and an allocator.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use hami_deviceplugin_api::v1beta1::{
    AllocateRequest, AllocateResponse, ContainerAllocateResponse,
    ContainerPreferredAllocationResponse, DevicePluginOptions, DeviceSpec, Empty,
    ListAndWatchResponse, Mount, PreStartContainerRequest, PreStartContainerResponse,
    PreferredAllocationRequest, PreferredAllocationResponse, device_plugin_server::DevicePlugin,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::container_plan::ContainerPlan;

/// What turns one container request (kubelet device ids) into a container response.
pub trait Allocator: Send + Sync + 'static {
    /// Plans the container for kubelet ids `<key>#<share>`; the error becomes the Allocate gRPC error.
    fn allocate(&self, kubelet_ids: Vec<String>) -> BoxFuture<'_, Result<ContainerPlan, String>>;

    /// Device keys (kubelet ids are `<key>#<share>`) that GetPreferredAllocation should
    /// pick last, e.g. GPUs holding slices, which a whole-card hand-over may not take.
    fn avoid_keys(&self) -> BoxFuture<'_, Vec<String>> {
        Box::pin(async { Vec::new() })
    }
}

/// Turns the vendor's device list into kubelet's (one entry per share).
pub type DeviceLister<T> = fn(&T) -> Vec<hami_deviceplugin_api::v1beta1::Device>;

/// The `DevicePlugin` service over a device list of type `T`.
pub struct PluginService<T> {
    devices: watch::Receiver<T>,
    lister: DeviceLister<T>,
    allocator: Arc<dyn Allocator>,
    pulse: Option<Duration>,
    /// Flips to true when this serving session ends (kubelet restarted, plugin stopping):
    /// open ListAndWatch streams then end cleanly.
    stop: watch::Receiver<bool>,
}

impl<T> Clone for PluginService<T> {
    fn clone(&self) -> Self {
        Self {
            devices: self.devices.clone(),
            lister: self.lister,
            allocator: self.allocator.clone(),
            pulse: self.pulse,
            stop: self.stop.clone(),
        }
    }
}

impl<T> PluginService<T> {
    /// A service serving `devices` through `lister`, planning Allocate with `allocator`.
    /// `pulse` re-sends the list at that interval; `stop` ends open ListAndWatch streams.
    pub fn new(
        devices: watch::Receiver<T>,
        lister: DeviceLister<T>,
        allocator: Arc<dyn Allocator>,
        pulse: Option<Duration>,
        stop: watch::Receiver<bool>,
    ) -> Self {
        Self {
            devices,
            lister,
            allocator,
            pulse,
            stop,
        }
    }
}

/// The protobuf form of a container plan.
pub fn container_response(plan: ContainerPlan) -> ContainerAllocateResponse {
    ContainerAllocateResponse {
        envs: plan.envs,
        mounts: plan
            .mounts
            .into_iter()
            .map(|m| Mount {
                container_path: m.container_path,
                host_path: m.host_path,
                read_only: m.read_only,
            })
            .collect(),
        devices: plan
            .devices
            .into_iter()
            .map(|d| DeviceSpec {
                container_path: d.path.clone(),
                host_path: d.path,
                permissions: d.permissions,
            })
            .collect(),
        annotations: Default::default(),
        cdi_devices: plan
            .cdi_devices
            .into_iter()
            .map(|name| hami_deviceplugin_api::v1beta1::CdiDevice { name })
            .collect(),
    }
}

/// Preferred ids: the required ones, then one share of each GPU not chosen yet (ids are
/// `<device key>#<share>`), then the rest in kubelet's order; never a duplicate. Spreading
/// over GPUs lets a pod the scheduler did not place get as many whole cards as it asks
/// for (a pod it did place is mapped by its annotations, whatever the ids).
pub fn preferred_ids(available: &[String], must_include: &[String], size: usize) -> Vec<String> {
    preferred_ids_avoiding(available, must_include, size, &[])
}

/// [`preferred_ids`], taking GPUs whose key is in `avoid` only after all others.
pub fn preferred_ids_avoiding(
    available: &[String],
    must_include: &[String],
    size: usize,
    avoid: &[String],
) -> Vec<String> {
    let key = |id: &str| id.rsplit_once('#').map_or(id, |(k, _)| k).to_owned();
    let mut out: Vec<String> = Vec::new();
    for id in must_include {
        if out.len() < size && !out.contains(id) {
            out.push(id.clone());
        }
    }
    for pass_avoided in [false, true] {
        for id in available {
            if out.len() < size
                && avoid.contains(&key(id)) == pass_avoided
                && !out.iter().any(|o| key(o) == key(id))
            {
                out.push(id.clone());
            }
        }
    }
    for id in available {
        if out.len() < size && !out.contains(id) {
            out.push(id.clone());
        }
    }
    out
}

type LawStream = Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl<T: Send + Sync + 'static> DevicePlugin for PluginService<T> {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }))
    }

    type ListAndWatchStream = LawStream;

    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        let mut devices = self.devices.clone();
        let mut stop = self.stop.clone();
        let pulse = self.pulse;
        let lister = self.lister;
        tokio::spawn(async move {
            let mut ticker = pulse.map(tokio::time::interval);
            if let Some(t) = ticker.as_mut() {
                t.tick().await;
            }
            loop {
                let list = lister(&devices.borrow_and_update());
                if tx
                    .send(Ok(ListAndWatchResponse { devices: list }))
                    .await
                    .is_err()
                {
                    return; // kubelet went away
                }
                let tick = async {
                    match ticker.as_mut() {
                        Some(t) => {
                            t.tick().await;
                        }
                        None => std::future::pending::<()>().await,
                    }
                };
                tokio::select! {
                    changed = devices.changed() => if changed.is_err() { return },
                    _ = tick => {}
                    _ = stop.wait_for(|s| *s) => return,
                    _ = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let avoid = self.allocator.avoid_keys().await;
        let container_responses = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|c| ContainerPreferredAllocationResponse {
                device_i_ds: preferred_ids_avoiding(
                    &c.available_device_i_ds,
                    &c.must_include_device_i_ds,
                    usize::try_from(c.allocation_size).unwrap_or(0),
                    &avoid,
                ),
            })
            .collect();
        Ok(Response::new(PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let mut container_responses = Vec::new();
        // One container at a time, each seeing the annotations the previous one wrote.
        for container in request.into_inner().container_requests {
            let plan = self
                .allocator
                .allocate(container.devices_ids)
                .await
                .map_err(Status::failed_precondition)?;
            container_responses.push(container_response(plan));
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preferred_ids_are_unique_and_sized() {
        let avail: Vec<String> = ["a#0", "a#1", "b#0"].map(String::from).to_vec();
        assert_eq!(
            preferred_ids(&avail, &["b#0".into()], 2),
            vec!["b#0", "a#0"]
        );
        assert_eq!(preferred_ids(&avail, &[], 5).len(), 3);
        // One share per GPU first, so 2 ids name 2 GPUs; avoided GPUs last.
        assert_eq!(preferred_ids(&avail, &[], 2), vec!["a#0", "b#0"]);
        assert_eq!(
            preferred_ids_avoiding(&avail, &[], 2, &["a".into()]),
            vec!["b#0", "a#0"]
        );
    }
}
