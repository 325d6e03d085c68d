//! Wiring: kube client, informers, leader election, the two listeners.

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::config::{SchedulerArgs, Settings};
use crate::leader::{ElectionConfig, Leadership};
use crate::runtime::Scheduler;

/// A kube client from a kubeconfig file, or the usual defaults.
pub async fn client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .map_err(|e| anyhow::anyhow!("cannot read kubeconfig {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?
        }
        None => kube::Config::infer().await?,
    };
    Ok(Client::try_from(config)?)
}

fn default_identity() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .map(|h| format!("{h}-{}", std::process::id()))
        .unwrap_or_else(|| format!("hami-scheduler-{}", std::process::id()))
}

/// Starts everything and serves until the listeners stop.
pub async fn run(args: SchedulerArgs) -> anyhow::Result<()> {
    // One crypto provider for the whole process (ring), set before any TLS use.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let settings = Settings::load(&args)?;
    let client = client(args.kubeconfig.as_deref()).await?;
    let leadership = Arc::new(if args.leader_elect {
        Leadership::elected()
    } else {
        Leadership::always()
    });
    if args.leader_elect {
        let config = ElectionConfig {
            namespace: args.lease_namespace.clone(),
            name: args.lease_name.clone(),
            identity: args.identity.clone().unwrap_or_else(default_identity),
            lease_duration: Duration::from_secs(15),
            renew_interval: Duration::from_secs(2),
        };
        tokio::spawn(crate::leader::run(
            client.clone(),
            config,
            leadership.clone(),
        ));
    }
    let scheduler = Scheduler::start(client, settings, leadership);
    let metrics = tokio::spawn(crate::http::serve(
        crate::http::metrics_router(scheduler.clone()),
        args.metrics_bind_address,
        None,
    ));
    let tls = args.cert_file.clone().zip(args.key_file.clone());
    let main = crate::http::serve(crate::http::router(scheduler), args.http_bind, tls);
    tokio::select! {
        r = main => r,
        r = metrics => r?,
    }
}
