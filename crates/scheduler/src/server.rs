//! Wiring: kube client, informers, leader election, the listeners. Which listener serves
//! what is [`listener_plan`], a pure function of the flags.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tracing::error;

use crate::cert_pin::Pins;
use crate::config::{SchedulerArgs, Settings};
use crate::extender_client::{ClientIdentity, ExtenderClient, Trust};
use crate::forward::Forwarder;
use crate::http::{ClientAuth, ForwardContext};
use crate::leader::{ElectionConfig, Leadership};
use crate::runtime::Scheduler;

/// A kube client from a kubeconfig file, or the usual defaults (plugin-core's, shared with
/// the web UI and `hami status`).
pub use hami_plugin_core::kube_client::client;

fn default_identity() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .map(|h| format!("{h}-{}", std::process::id()))
        .unwrap_or_else(|| format!("hami-scheduler-{}", std::process::id()))
}

/// What the listeners serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerPlan {
    /// `--http-bind` serves `/filter` and `/bind` too (a loopback address, no extender
    /// listener). Otherwise it answers them 403.
    pub main_serves_extender: bool,
    /// The extender listener, if any: its address and how it authenticates callers.
    pub extender: Option<(SocketAddr, Option<CallerAuth>)>,
    /// Followers forward to the leader (election on, mutual TLS, a client certificate).
    pub forwarding: bool,
    /// Said once at start when `/filter` and `/bind` are served nowhere.
    pub warning: Option<String>,
}

/// How the extender listener authenticates its callers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallerAuth {
    /// `--client-ca-file`.
    Ca(PathBuf),
    /// `--client-cert-pin-file`.
    Pin(PathBuf),
}

/// Decides the listeners from the flags (issue 13 item 8: no listener that other pods
/// reach serves `/filter` or `/bind` to a caller without a certificate).
pub fn listener_plan(args: &SchedulerArgs) -> Result<ListenerPlan, String> {
    let tls = args.cert_file.is_some() && args.key_file.is_some();
    let forward_cert = args.forward_client_cert_file.is_some();
    match args.extender_bind {
        Some(addr) => {
            let auth = match (&args.client_ca_file, &args.client_cert_pin_file) {
                (Some(ca), _) => Some(CallerAuth::Ca(ca.clone())),
                (None, Some(pin)) => Some(CallerAuth::Pin(pin.clone())),
                (None, None) => None,
            };
            match &auth {
                Some(_) if !tls => {
                    return Err(
                        "--client-ca-file and --client-cert-pin-file need --cert-file and --key-file: the extender listener authenticates callers over TLS".into(),
                    );
                }
                None if !addr.ip().is_loopback() => {
                    return Err(format!(
                        "--extender-bind {addr} is reachable from other pods: give --client-cert-pin-file (or --client-ca-file) so that every caller must present a client certificate (kube-scheduler's extender tlsConfig certFile), or bind a loopback address"
                    ));
                }
                _ => {}
            }
            if forward_cert && auth.is_none() {
                return Err("--forward-client-cert-file needs --client-cert-pin-file or --client-ca-file: the leader's certificate is checked with it".into());
            }
            Ok(ListenerPlan {
                main_serves_extender: false,
                extender: Some((addr, auth)),
                forwarding: args.leader_elect && forward_cert,
                warning: None,
            })
        }
        None if args.http_bind.ip().is_loopback() => Ok(ListenerPlan {
            main_serves_extender: true,
            extender: None,
            forwarding: false,
            warning: None,
        }),
        None => Ok(ListenerPlan {
            main_serves_extender: false,
            extender: None,
            forwarding: false,
            warning: Some(format!(
                "/filter and /bind are not served: --http-bind {} is reachable from other pods, and no --extender-bind with --client-ca-file is given; kube-scheduler's calls will be refused",
                args.http_bind
            )),
        }),
    }
}

/// Aborts a spawned task when dropped: a stopped `run` leaves nothing running (a killed
/// replica stops renewing its Lease).
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts everything and serves until the listeners stop (or the future is dropped).
pub async fn run(args: SchedulerArgs) -> anyhow::Result<()> {
    // One crypto provider for the whole process (ring), set before any TLS use.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let settings = Settings::load(&args)?;
    let plan = listener_plan(&args).map_err(|e| anyhow::anyhow!(e))?;
    if let Some(w) = &plan.warning {
        error!("{w}");
    }
    let client = client(args.kubeconfig.as_deref()).await?;
    let identity = args.identity.clone().unwrap_or_else(default_identity);
    let leadership = Arc::new(if args.leader_elect {
        Leadership::elected()
    } else {
        Leadership::always()
    });
    let _election = if args.leader_elect {
        let config = ElectionConfig {
            namespace: args.lease_namespace.clone(),
            name: args.lease_name.clone(),
            identity: identity.clone(),
            lease_duration: Duration::from_secs(args.leader_elect_lease_duration_seconds.max(1)),
            renew_interval: Duration::from_millis(args.leader_elect_retry_period_millis.max(10)),
        };
        let task = tokio::spawn(crate::leader::run(
            client.clone(),
            config,
            leadership.clone(),
        ));
        Some(AbortOnDrop(task.abort_handle()))
    } else {
        None
    };
    let scheduler = Scheduler::start(client.clone(), settings, leadership);
    let mut metrics = tokio::spawn(crate::http::serve(
        crate::http::metrics_router(scheduler.clone()),
        args.metrics_bind_address,
        None,
    ));
    let _metrics = AbortOnDrop(metrics.abort_handle());
    let tls = args.cert_file.clone().zip(args.key_file.clone());
    let main_router = if plan.main_serves_extender {
        crate::http::router(scheduler.clone())
    } else {
        crate::http::webhook_router(scheduler.clone())
    };
    let main = crate::http::serve(main_router, args.http_bind, tls.clone());
    let extender = async {
        let Some((addr, auth)) = plan.extender.clone() else {
            return std::future::pending::<anyhow::Result<()>>().await;
        };
        let auth = match auth {
            None => None,
            Some(CallerAuth::Ca(ca)) => Some(ClientAuth::Ca(ca)),
            Some(CallerAuth::Pin(file)) => Some(ClientAuth::Pinned {
                pins: Arc::new(std::sync::RwLock::new(Pins::new(crate::http::pin_of(
                    &file,
                )?))),
                file,
            }),
        };
        let forwarder = if plan.forwarding {
            let (trust, server_name) = match auth.as_ref().expect("forwarding implies caller auth")
            {
                ClientAuth::Ca(ca) => (
                    Trust::Ca(
                        std::fs::read(ca)
                            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", ca.display()))?,
                    ),
                    args.forward_server_name.clone(),
                ),
                // The leader presents the pinned certificate, whatever its address.
                ClientAuth::Pinned { pins, .. } => (Trust::Pinned(pins.clone()), None),
            };
            let identity_files = ClientIdentity::from_files(
                args.forward_client_cert_file.as_deref().expect("checked"),
                args.forward_client_key_file.as_deref().expect("checked"),
            )?;
            let http = ExtenderClient::with_tls(
                "https://leader.invalid",
                trust,
                Some(identity_files),
                server_name,
            )?;
            Some(Arc::new(Forwarder::new(
                client.clone(),
                args.lease_namespace.clone(),
                addr.port(),
                http,
            )))
        } else {
            None
        };
        let app = crate::http::extender_router(
            scheduler.clone(),
            ForwardContext {
                identity: identity.clone(),
                forwarder,
            },
        );
        let listener = std::net::TcpListener::bind(addr)
            .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
        match (auth, tls.clone()) {
            (Some(auth), Some((cert, key))) => {
                crate::http::serve_mtls(app, listener, cert, key, auth).await
            }
            // Loopback only (checked by the plan).
            (_, tls) => crate::http::serve_on(app, listener, tls).await,
        }
    };
    tokio::select! {
        r = main => r,
        r = extender => r,
        r = &mut metrics => r.map_err(anyhow::Error::from).and_then(|r| r),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(flags: &[&str]) -> SchedulerArgs {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: SchedulerArgs,
        }
        let mut all = vec!["hami-scheduler"];
        all.extend_from_slice(flags);
        <Cli as clap::Parser>::try_parse_from(all).unwrap().args
    }

    #[test]
    fn no_listener_other_pods_reach_serves_filter_and_bind_unauthenticated() {
        // Loopback, as in the demo: everything on one listener.
        let p = listener_plan(&args(&[])).unwrap();
        assert!(p.main_serves_extender && p.extender.is_none());
        // The Service-reachable listener without an extender listener: refused, loudly.
        let p = listener_plan(&args(&["--http-bind", "0.0.0.0:8443"])).unwrap();
        assert!(!p.main_serves_extender);
        assert!(p.warning.unwrap().contains("not served"));
        // A reachable extender listener needs client authentication.
        let e = listener_plan(&args(&["--extender-bind", "0.0.0.0:8444"])).unwrap_err();
        assert!(e.contains("--client-ca-file"), "{e}");
        let e = listener_plan(&args(&[
            "--extender-bind",
            "0.0.0.0:8444",
            "--client-ca-file",
            "/ca.crt",
        ]))
        .unwrap_err();
        assert!(e.contains("--cert-file"), "{e}");
        let p = listener_plan(&args(&[
            "--http-bind",
            "0.0.0.0:8443",
            "--cert-file",
            "/tls.crt",
            "--key-file",
            "/tls.key",
            "--extender-bind",
            "0.0.0.0:8444",
            "--client-ca-file",
            "/ca.crt",
            "--leader-elect",
            "--forward-client-cert-file",
            "/client.crt",
            "--forward-client-key-file",
            "/client.key",
        ]))
        .unwrap();
        assert!(!p.main_serves_extender && p.forwarding);
        assert_eq!(
            p.extender,
            Some((
                "0.0.0.0:8444".parse().unwrap(),
                Some(CallerAuth::Ca("/ca.crt".into()))
            ))
        );
        // Pinning the serving certificate instead (kube-webhook-certgen's certificates
        // are for server authentication only).
        let p = listener_plan(&args(&[
            "--http-bind",
            "0.0.0.0:8443",
            "--cert-file",
            "/tls/tls.crt",
            "--key-file",
            "/tls/tls.key",
            "--extender-bind",
            "0.0.0.0:8444",
            "--client-cert-pin-file",
            "/tls/tls.crt",
            "--leader-elect",
            "--forward-client-cert-file",
            "/tls/tls.crt",
            "--forward-client-key-file",
            "/tls/tls.key",
        ]))
        .unwrap();
        assert!(p.forwarding);
        assert_eq!(
            p.extender.unwrap().1,
            Some(CallerAuth::Pin("/tls/tls.crt".into()))
        );
        // A loopback extender listener (kube-scheduler beside it) may go without.
        let p = listener_plan(&args(&[
            "--http-bind",
            "0.0.0.0:8443",
            "--extender-bind",
            "127.0.0.1:8444",
        ]))
        .unwrap();
        assert!(!p.main_serves_extender && !p.forwarding);
    }
}
