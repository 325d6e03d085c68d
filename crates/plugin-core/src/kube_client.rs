//! A Kubernetes client from a kubeconfig file, or kube's usual defaults (in-cluster
//! service account, `$KUBECONFIG`, `~/.kube/config`): the one way the scheduler, the web UI
//! and `hami status` build theirs, so the front ends need no scheduler shell for it.

use std::path::Path;

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

/// Why no client could be built; the message names the file or the source to fix.
#[derive(Debug, thiserror::Error)]
pub enum KubeClientError {
    /// The kubeconfig file given could not be read or parsed.
    #[error("cannot read kubeconfig {path}: {source}")]
    Read {
        /// The file named by the user.
        path: String,
        /// What went wrong reading it.
        source: kube::config::KubeconfigError,
    },
    /// The kubeconfig was read but names no usable cluster, user or context.
    #[error("kubeconfig {path}: {source}")]
    Use {
        /// The file named by the user.
        path: String,
        /// What is missing or wrong in it.
        source: kube::config::KubeconfigError,
    },
    /// Neither in-cluster settings nor a default kubeconfig were found or usable.
    #[error(
        "no Kubernetes configuration (pass --kubeconfig, set KUBECONFIG or run in a cluster): {0}"
    )]
    Infer(#[from] kube::config::InferConfigError),
    /// The configuration could not become a client (TLS settings, proxy, …).
    #[error("cannot build a Kubernetes client: {0}")]
    Build(#[from] kube::Error),
}

/// A client from `kubeconfig` when given, else kube's inferred configuration.
pub async fn client(kubeconfig: Option<&Path>) -> Result<Client, KubeClientError> {
    let config = match kubeconfig {
        Some(path) => {
            let shown = path.display().to_string();
            let kc = Kubeconfig::read_from(path).map_err(|source| KubeClientError::Read {
                path: shown.clone(),
                source,
            })?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|source| KubeClientError::Use {
                    path: shown,
                    source,
                })?
        }
        None => kube::Config::infer().await?,
    };
    Ok(Client::try_from(config)?)
}
