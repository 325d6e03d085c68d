//! The plugin-registry side: kubelet's plugin watcher finds `<driver>-reg.sock`, calls
//! `GetInfo` and tells the result with `NotifyRegistrationStatus`. Also `serve`, which
//! runs both sockets.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::watch;
use tonic::{Request, Response, Status};

use hami_deviceplugin_api::dra_v1::dra_plugin_server::DraPluginServer;
use hami_deviceplugin_api::pluginregistration::registration_server::{
    Registration, RegistrationServer,
};
use hami_deviceplugin_api::pluginregistration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use hami_deviceplugin_api::{DRA_PLUGIN_TYPE, DRA_V1_SERVICE};

use crate::claims::ClaimSource;
use crate::driver::Driver;
use crate::service::DraService;

/// What kubelet last said about the registration (`None` until it said something).
pub type RegistrationState = watch::Receiver<Option<Result<(), String>>>;

/// The kubelet plugin-registration service (`GetInfo`, `NotifyRegistrationStatus`).
pub struct RegistrationService {
    /// The DRA driver name kubelet registers.
    pub driver_name: String,
    /// The DRA socket kubelet is told to dial.
    pub endpoint: String,
    status: watch::Sender<Option<Result<(), String>>>,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: DRA_PLUGIN_TYPE.into(),
            name: self.driver_name.clone(),
            endpoint: self.endpoint.clone(),
            supported_versions: vec![DRA_V1_SERVICE.into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let s = request.into_inner();
        let state = if s.plugin_registered {
            tracing::info!("registered with kubelet");
            Ok(())
        } else {
            tracing::error!("kubelet refused the registration: {}", s.error);
            Err(s.error)
        };
        let _ = self.status.send(Some(state));
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// Socket paths.
#[derive(Debug, Clone)]
pub struct Sockets {
    /// `<plugins_registry>/<driver>-reg.sock`.
    pub registration: PathBuf,
    /// `<plugins>/<driver>/dra.sock`.
    pub dra: PathBuf,
}

impl Sockets {
    /// The sockets of `driver` under kubelet's plugin registry and plugins directories.
    pub fn new(registry_dir: &Path, plugin_dir: &Path, driver: &str) -> Self {
        Self {
            registration: registry_dir.join(format!("{driver}-reg.sock")),
            dra: plugin_dir.join("dra.sock"),
        }
    }
}

/// Serves the DRA service and then the registration socket (kubelet may dial the endpoint
/// as soon as it sees the registration socket). Runs until `shutdown` resolves.
pub async fn serve<C: ClaimSource>(
    driver: Arc<Driver<C>>,
    driver_name: &str,
    sockets: &Sockets,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<(RegistrationState, tokio::task::JoinHandle<()>)> {
    let dra = hami_deviceplugin_api::bind_unix(&sockets.dra)?;
    let reg = hami_deviceplugin_api::bind_unix(&sockets.registration)?;
    let (tx, rx) = watch::channel(None);
    let registration = RegistrationService {
        driver_name: driver_name.into(),
        endpoint: sockets.dra.display().to_string(),
        status: tx,
    };
    let (stop_tx, _) = tokio::sync::broadcast::channel::<()>(1);
    let mut s1 = stop_tx.subscribe();
    let mut s2 = stop_tx.subscribe();
    let dra_task = tonic::transport::Server::builder()
        .add_service(DraPluginServer::new(DraService { driver }))
        .serve_with_incoming_shutdown(dra, async move {
            let _ = s1.recv().await;
        });
    let reg_task = tonic::transport::Server::builder()
        .add_service(RegistrationServer::new(registration))
        .serve_with_incoming_shutdown(reg, async move {
            let _ = s2.recv().await;
        });
    let sockets = sockets.clone();
    let handle = tokio::spawn(async move {
        let stopper = async move {
            shutdown.await;
            let _ = stop_tx.send(());
        };
        let (a, b, ()) = tokio::join!(dra_task, reg_task, stopper);
        for r in [a, b] {
            if let Err(e) = r {
                tracing::error!("gRPC server: {e}");
            }
        }
        let _ = std::fs::remove_file(&sockets.registration);
        let _ = std::fs::remove_file(&sockets.dra);
    });
    Ok((rx, handle))
}
