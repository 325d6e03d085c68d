//! Serving kubelet: bind the plugin socket, register with `kubelet.sock`, and start over
//! when kubelet restarts (it re-creates `kubelet.sock` and wipes the directory) or our
//! socket disappears. Open ListAndWatch streams of an ended session finish cleanly. When to
//! register, start over or stop is [`crate::session_rules`]; this loop looks when the
//! directory changes (inotify, [`crate::dir_watch`]; `stat` polling where that fails) and
//! obeys.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hami_deviceplugin_api::v1beta1::device_plugin_server::{DevicePlugin, DevicePluginServer};
use hami_deviceplugin_api::v1beta1::registration_client::RegistrationClient;
use hami_deviceplugin_api::v1beta1::{DevicePluginOptions, RegisterRequest};
use hami_deviceplugin_api::{KUBELET_SOCKET, VERSION, bind_unix, connect_unix};
use tokio::sync::watch;

use crate::dir_watch::DirWatch;
use crate::session_rules::{Action, Restart, Seen, Session, SocketId, Wake, wake};

/// Where and as what the plugin registers.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// kubelet's device-plugin directory.
    pub dir: PathBuf,
    /// Our socket's file name (the `endpoint`), e.g. `amd.com_gpu`, `nvidia-gpu.sock`.
    pub endpoint: String,
    /// e.g. `amd.com/gpu`, `nvidia.com/gpu`.
    pub resource_name: String,
    /// How often kubelet.sock and our socket are checked when no notification of the
    /// directory's changes is to be had, and how soon a failed registration is retried.
    pub poll: Duration,
    /// The longest sleep between looks while changes are notified (a backstop).
    pub backstop: Duration,
}

impl SessionConfig {
    /// The plugins' sessions: `endpoint` in `dir` serving `resource_name`, the sockets
    /// checked when the directory changes (every 500 ms without notifications), at least
    /// every 30 s.
    pub fn new(dir: PathBuf, endpoint: &str, resource_name: &str) -> SessionConfig {
        SessionConfig {
            dir,
            endpoint: endpoint.into(),
            resource_name: resource_name.into(),
            poll: Duration::from_millis(500),
            backstop: Duration::from_secs(30),
        }
    }
}

/// Identity of a socket file (inode + change time), `None` when absent.
fn socket_identity(path: &Path) -> SocketId {
    std::fs::metadata(path)
        .ok()
        .map(|m| (m.ino(), m.ctime(), m.ctime_nsec()))
}

/// Registers once with kubelet.
pub async fn register_once(config: &SessionConfig) -> Result<(), String> {
    let kubelet = config.dir.join(KUBELET_SOCKET);
    let channel = connect_unix(&kubelet)
        .await
        .map_err(|e| format!("cannot reach kubelet at {}: {e}", kubelet.display()))?;
    RegistrationClient::new(channel)
        .register(RegisterRequest {
            version: VERSION.into(),
            endpoint: config.endpoint.clone(),
            resource_name: config.resource_name.clone(),
            options: Some(DevicePluginOptions {
                pre_start_required: false,
                get_preferred_allocation_available: true,
            }),
        })
        .await
        .map_err(|e| format!("kubelet refused the registration: {}", e.message()))?;
    Ok(())
}

/// Serves until `shutdown` turns true. `make_service(stop)` builds the service of one
/// session; `stop` flips when that session ends.
pub async fn run_sessions<S: DevicePlugin>(
    config: SessionConfig,
    make_service: impl Fn(watch::Receiver<bool>) -> S,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), String> {
    let kubelet = config.dir.join(KUBELET_SOCKET);
    let ours = config.dir.join(&config.endpoint);
    loop {
        if *shutdown.borrow() {
            return Ok(());
        }
        let (stop_tx, stop_rx) = watch::channel(false);
        let incoming =
            bind_unix(&ours).map_err(|e| format!("cannot listen on {}: {e}", ours.display()))?;
        let service = DevicePluginServer::new(make_service(stop_rx.clone()));
        let mut server_stop = stop_rx.clone();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, async move {
                    let _ = server_stop.wait_for(|s| *s).await;
                }),
        );
        let mut session = Session::new(socket_identity(&ours));
        let mut notify = match DirWatch::new(&config.dir) {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(dir = %config.dir.display(), "cannot watch the directory ({e}): checking the sockets every {:?}", config.poll);
                None
            }
        };
        loop {
            let seen = Seen {
                shutdown: *shutdown.borrow(),
                kubelet: socket_identity(&kubelet),
                ours: socket_identity(&ours),
            };
            let action = session.poll(seen);
            match action {
                Action::Stop { remove_socket } => {
                    let _ = stop_tx.send(true);
                    let _ = server.await;
                    if remove_socket {
                        let _ = std::fs::remove_file(&ours);
                    }
                    return Ok(());
                }
                Action::Restart(Restart::KubeletRestarted) => {
                    tracing::info!("kubelet.sock was re-created: serving and registering again");
                    break;
                }
                Action::Restart(Restart::OurSocketGone) => {
                    tracing::info!(
                        "our socket {} disappeared: serving and registering again",
                        ours.display()
                    );
                    break;
                }
                Action::Register => match register_once(&config).await {
                    Ok(()) => {
                        tracing::info!(resource = %config.resource_name, socket = %ours.display(), "registered with kubelet");
                        session.registered(seen);
                    }
                    Err(e) => tracing::warn!("{e}; retrying"),
                },
                Action::Wait => {}
            }
            match (
                wake(action, session.is_registered(), notify.is_some()),
                &notify,
            ) {
                (Wake::OnChange, Some(w)) => {
                    tokio::select! {
                        changed = w.changed() => if let Err(e) = changed {
                            tracing::warn!("the watch of {} ended ({e}): checking the sockets every {:?}", config.dir.display(), config.poll);
                            notify = None;
                        },
                        _ = tokio::time::sleep(config.backstop) => {}
                        _ = shutdown.changed() => {}
                    }
                }
                _ => {
                    tokio::select! {
                        _ = tokio::time::sleep(config.poll) => {}
                        _ = shutdown.changed() => {}
                    }
                }
            }
        }
        let _ = stop_tx.send(true);
        let _ = server.await;
    }
}

/// Serves kubelet a device list with one allocator until `shutdown`: the socket and
/// registration loop of [`run_sessions`] around a [`crate::grpc_server::PluginService`]
/// built anew for every kubelet session; then waits for the plugin's `publisher` task (it
/// stops on the same signal), so no node patch outlives the plugin. Both plugins end
/// `serve` with this.
pub async fn serve_then_join<T: Send + Sync + 'static, P>(
    config: SessionConfig,
    devices: watch::Receiver<T>,
    lister: crate::grpc_server::DeviceLister<T>,
    allocator: std::sync::Arc<dyn crate::grpc_server::Allocator>,
    pulse: Option<Duration>,
    shutdown: watch::Receiver<bool>,
    publisher: tokio::task::JoinHandle<P>,
) -> Result<(), String> {
    let sessions = run_sessions(
        config,
        move |stop| {
            crate::grpc_server::PluginService::new(
                devices.clone(),
                lister,
                allocator.clone(),
                pulse,
                stop,
            )
        },
        shutdown,
    )
    .await;
    let _ = publisher.await;
    sessions
}

/// A shutdown signal that turns true on SIGINT or SIGTERM (what a DaemonSet pod gets).
pub fn shutdown_on_signal() -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        let terminated = async {
            match term.as_mut() {
                Some(t) => {
                    t.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminated => {}
        }
        let _ = tx.send(true);
    });
    rx
}
