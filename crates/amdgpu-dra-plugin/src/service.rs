//! The DRA v1 gRPC service on the plugin socket.

use std::sync::Arc;

use hami_deviceplugin_api::dra_v1::dra_plugin_server::DraPlugin;
use hami_deviceplugin_api::dra_v1::{
    NodePrepareResourceResponse, NodePrepareResourcesRequest, NodePrepareResourcesResponse,
    NodeUnprepareResourceResponse, NodeUnprepareResourcesRequest, NodeUnprepareResourcesResponse,
};
use tonic::{Request, Response, Status};

use crate::claims::ClaimSource;
use crate::driver::Driver;

/// The DRA v1 `DraPlugin` service, handing each request to the driver.
pub struct DraService<C> {
    /// The driver doing the work.
    pub driver: Arc<Driver<C>>,
}

#[tonic::async_trait]
impl<C: ClaimSource> DraPlugin for DraService<C> {
    async fn node_prepare_resources(
        &self,
        request: Request<NodePrepareResourcesRequest>,
    ) -> Result<Response<NodePrepareResourcesResponse>, Status> {
        let claims = request.into_inner().claims;
        // On a task of its own: a prepare kubelet stops waiting for still runs to its end
        // (recorded, or undone: its status entries taken back), never cut off in between.
        let driver = self.driver.clone();
        let claims = tokio::spawn(async move { driver.prepare(&claims).await })
            .await
            .map_err(|e| Status::internal(format!("prepare: {e}")))?
            .into_iter()
            .map(|(uid, r)| {
                let resp = match r {
                    Ok(devices) => NodePrepareResourceResponse {
                        devices,
                        error: String::new(),
                    },
                    Err(error) => NodePrepareResourceResponse {
                        devices: vec![],
                        error,
                    },
                };
                (uid, resp)
            })
            .collect();
        Ok(Response::new(NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<NodeUnprepareResourcesRequest>,
    ) -> Result<Response<NodeUnprepareResourcesResponse>, Status> {
        let claims = request.into_inner().claims;
        let claims = self
            .driver
            .unprepare(&claims)
            .await
            .into_iter()
            .map(|(uid, r)| {
                (
                    uid,
                    NodeUnprepareResourceResponse {
                        error: r.err().unwrap_or_default(),
                    },
                )
            })
            .collect();
        Ok(Response::new(NodeUnprepareResourcesResponse { claims }))
    }
}
