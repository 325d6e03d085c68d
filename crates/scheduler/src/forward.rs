//! Two or more replicas (issue 13 item 5): kube-scheduler runs as a sidecar of every
//! replica, elects its own leader on its own Lease, and calls only its own pod's extender.
//! The active kube-scheduler therefore often sits beside a follower. A follower forwards
//! `/filter` and `/bind` to the leading extender, whose address it learns from the
//! extender's Lease (holder = pod name, pod → `status.podIP`), over mutual TLS with its
//! own client certificate. Only the leader decides: a forwarded call that reaches a
//! replica which is no longer the leader is answered "not the leader", never forwarded
//! again, and kube-scheduler retries. [`route`] is the decision; [`Forwarder`] the shell.

use std::sync::Mutex;

use axum::body::Bytes;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::Api;

use crate::extender_client::ExtenderClient;

/// The header a forwarded call carries (the forwarding replica's identity): its receiver
/// answers itself or refuses, but never forwards again.
pub const FORWARDED_BY: &str = "x-hami-forwarded-by";

/// Where an extender call goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Decide here (no election, or this replica leads).
    Local,
    /// Forward to the replica named `leader`.
    Forward {
        /// The leader's identity (its pod name).
        leader: String,
    },
    /// Answer "not the leader" (kube-scheduler retries).
    Refuse {
        /// Why this replica cannot answer, for the error text.
        why: String,
    },
}

/// Decides where one extender call goes.
pub fn route(
    elected: bool,
    is_leader: bool,
    holder: Option<&str>,
    me: &str,
    forwarded_by: Option<&str>,
    can_forward: bool,
) -> Route {
    if !elected || is_leader {
        return Route::Local;
    }
    if let Some(from) = forwarded_by {
        return Route::Refuse {
            why: format!("forwarded by {from} to this replica ({me}), which does not lead"),
        };
    }
    if !can_forward {
        return Route::Refuse {
            why: "forwarding to the leader is not configured (--extender-bind with --client-ca-file and --forward-client-cert-file)".into(),
        };
    }
    match holder {
        Some(h) if h != me => Route::Forward {
            leader: h.to_owned(),
        },
        // We hold the Lease but our leadership lapsed (renewal pending), or nobody does.
        _ => Route::Refuse {
            why: "no replica leads at the moment (an election is in progress)".into(),
        },
    }
}

/// Forwards extender calls to the leading replica.
pub struct Forwarder {
    client: Client,
    namespace: String,
    /// The extender listener's port, the same on every replica.
    port: u16,
    http: ExtenderClient,
    /// Last resolved (holder, address).
    resolved: Mutex<Option<(String, String)>>,
}

impl Forwarder {
    /// `http` carries this replica's client certificate and trusts the replicas' CA.
    pub fn new(client: Client, namespace: String, port: u16, http: ExtenderClient) -> Self {
        Forwarder {
            client,
            namespace,
            port,
            http,
            resolved: Mutex::new(None),
        }
    }

    async fn address(&self, leader: &str, fresh: bool) -> Result<String, String> {
        if !fresh
            && let Some((h, a)) = self
                .resolved
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
            && h == leader
        {
            return Ok(a);
        }
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let pod = pods.get(leader).await.map_err(|e| {
            format!(
                "cannot find the leading replica's pod {}/{leader}: {}",
                self.namespace,
                crate::kube_error::text(&e)
            )
        })?;
        let ip = pod
            .status
            .and_then(|s| s.pod_ip)
            .filter(|ip| !ip.is_empty())
            .ok_or_else(|| {
                format!(
                    "the leading replica's pod {}/{leader} has no IP yet",
                    self.namespace
                )
            })?;
        let host = if ip.contains(':') {
            format!("[{ip}]")
        } else {
            ip
        };
        let address = format!("https://{host}:{}", self.port);
        *self.resolved.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((leader.to_owned(), address.clone()));
        Ok(address)
    }

    /// Sends `body` to the leader's `/<verb>`; the leader's answer (status, body).
    pub async fn forward(
        &self,
        leader: &str,
        me: &str,
        verb: &str,
        body: Bytes,
    ) -> Result<(u16, Bytes), String> {
        let mut last = String::new();
        // A cached address may be stale (the leader's pod was replaced): look it up again
        // once before giving up. A call that failed may still have been carried out (its
        // reply lost): sending it again is safe, filter is recomputed and bind is
        // idempotent (`bind_plan`: a pod bound where asked is success, its lock untouched).
        for fresh in [false, true] {
            let base = self.address(leader, fresh).await?;
            match self
                .http
                .post(
                    &format!("{base}/{verb}"),
                    verb,
                    body.to_vec(),
                    &[(FORWARDED_BY, me)],
                )
                .await
            {
                Ok((status, bytes)) => return Ok((status.as_u16(), bytes)),
                Err(e) => last = e,
            }
        }
        Err(format!(
            "this replica ({me}) does not lead and cannot reach the leader {leader}: {last}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(route(false, false, None, "a", None, false), Route::Local);
        assert_eq!(
            route(true, true, Some("a"), "a", Some("b"), true),
            Route::Local
        );
        assert_eq!(
            route(true, false, Some("b"), "a", None, true),
            Route::Forward { leader: "b".into() }
        );
        // Never a second hop: a forwarded call is answered here.
        assert!(matches!(
            route(true, false, Some("c"), "a", Some("b"), true),
            Route::Refuse { why } if why.contains("forwarded by b")
        ));
        // Our own lapsed leadership, or no holder: nobody to forward to.
        assert!(matches!(
            route(true, false, Some("a"), "a", None, true),
            Route::Refuse { .. }
        ));
        assert!(matches!(
            route(true, false, None, "a", None, true),
            Route::Refuse { .. }
        ));
        assert!(matches!(
            route(true, false, Some("b"), "a", None, false),
            Route::Refuse { why } if why.contains("not configured")
        ));
    }
}
