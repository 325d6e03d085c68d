//! The scheduler's HTTPS front as a cluster wires it, for tests and harnesses that run the
//! real scheduler in-process: a fresh self-signed serving certificate, the scheduler's
//! router (extender + webhook) on a local TLS listener, the webhook configuration that
//! ships (`hami_manifests::objects::webhook_at`: the chart's objects, pointed at this
//! listener instead of the Service) created through the API, and the simulated
//! kube-scheduler calling the extender with that certificate as its CA — what kube-scheduler
//! does with the chart's `KubeSchedulerConfiguration`.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use hami_scheduler::extender_client::{ExtenderClient, Trust};
use hami_scheduler::runtime::Scheduler;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::Client;
use kube::api::{Api, PostParams};

use crate::SimKubeScheduler;

/// A scheduler served over TLS with its webhook registered.
pub struct SchedulerFront {
    /// `https://127.0.0.1:<port>`.
    pub base: String,
    /// The serving certificate (PEM), the CA its clients trust.
    pub ca_pem: String,
}

impl SchedulerFront {
    /// Serves `scheduler` on a free local port with a certificate written under `tls_dir`
    /// (`tls.crt`, `tls.key`), then creates the shipped webhook configuration of `settings`
    /// pointed at it, with `admin` (a client allowed to create it).
    pub async fn start(
        scheduler: &Arc<Scheduler>,
        tls_dir: &Path,
        settings: &hami_manifests::Settings,
        admin: &Client,
    ) -> anyhow::Result<SchedulerFront> {
        let cert = rcgen::generate_simple_self_signed(vec![
            "127.0.0.1".to_string(),
            "localhost".to_string(),
        ])?;
        std::fs::create_dir_all(tls_dir)?;
        let (crt, key) = (tls_dir.join("tls.crt"), tls_dir.join("tls.key"));
        std::fs::write(&crt, cert.cert.pem())?;
        std::fs::write(&key, cert.signing_key.serialize_pem())?;
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let base = format!("https://127.0.0.1:{}", listener.local_addr()?.port());
        tokio::spawn(hami_scheduler::http::serve_on(
            hami_scheduler::http::router(scheduler.clone()),
            listener,
            Some((crt, key)),
        ));
        let ca_pem = cert.cert.pem();
        let hami_manifests::Object::MutatingWebhookConfiguration(webhook) =
            hami_manifests::objects::webhook_at(settings, &base, ca_pem.as_bytes())
        else {
            anyhow::bail!("the manifests' webhook is not a MutatingWebhookConfiguration");
        };
        Api::<MutatingWebhookConfiguration>::all(admin.clone())
            .create(&PostParams::default(), &webhook)
            .await
            .context("creating the webhook configuration")?;
        Ok(SchedulerFront { base, ca_pem })
    }

    /// A simulated kube-scheduler for `scheduler_name`, acting with `client`, calling this
    /// extender over TLS (run it with `tokio::spawn(sim.run())`).
    pub fn kube_scheduler(
        &self,
        client: Client,
        scheduler_name: impl Into<String>,
    ) -> anyhow::Result<SimKubeScheduler> {
        let extender =
            ExtenderClient::new(&self.base, Trust::Ca(self.ca_pem.clone().into_bytes()))?;
        Ok(SimKubeScheduler::new(client, scheduler_name, extender))
    }
}

/// The username of the ServiceAccount `service_account` where `settings` installs: one of
/// the shipped webhook's annotation writers for the scheduler's and the plugins' accounts.
pub fn component_user(settings: &hami_manifests::Settings, service_account: &str) -> String {
    format!(
        "system:serviceaccount:{}:{service_account}",
        settings.namespace
    )
}

/// A client of the unauthenticated API server at `api_url` (`http://127.0.0.1:<port>`)
/// that acts as `user` by impersonation (kubeconfig's `as:`; the admin may).
///
/// Why stacks need it: without authentication every request is the admin, users and
/// components alike, and D-4's guard (scheduler-owned annotations written only by the
/// scheduler's and the plugins' accounts, on CREATE and UPDATE, which the API server now
/// admits) could not tell the scheduler's own annotation patches from a user's forgery.
/// So the scheduler and the device plugins run as their ServiceAccounts, as they do in a
/// cluster, and users stay the admin.
///
/// # Errors
/// If `api_url` is not a URL.
pub fn client_as(api_url: &str, user: &str) -> anyhow::Result<Client> {
    let mut config = kube::Config::new(api_url.parse().context("the API server URL")?);
    config.auth_info.impersonate = Some(user.to_string());
    Ok(Client::try_from(config)?)
}

/// The shipped install's ServiceAccounts that write scheduler-owned annotations.
pub mod accounts {
    pub use hami_manifests::names::{DEVICE_PLUGIN, NVIDIA_DEVICE_PLUGIN, SCHEDULER};
}

/// [`client_as`] the ServiceAccount `service_account` of the default install
/// ([`component_user`] of the default settings): see [`accounts`].
///
/// # Errors
/// If `api_url` is not a URL.
pub fn component_client(api_url: &str, service_account: &str) -> anyhow::Result<Client> {
    client_as(
        api_url,
        &component_user(&hami_manifests::Settings::default(), service_account),
    )
}
