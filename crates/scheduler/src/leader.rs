//! Leader election on a `coordination.k8s.io/v1` Lease, with optimistic concurrency
//! (update carrying the resourceVersion) so that exactly one replica wins a contested
//! lease on any conforming API server. A replica considers itself leader only until its
//! last successful renewal plus the lease duration minus a safety margin, measured on its
//! own monotonic clock: a replica that cannot renew stops deciding before another one may
//! take over, so a follower never serves a stale decision.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use tracing::{info, warn};

/// Whether this replica may decide now.
#[derive(Debug)]
pub struct Leadership {
    elected: bool,
    valid_until: Mutex<Option<Instant>>,
}

impl Leadership {
    /// No election: always the leader.
    pub fn always() -> Self {
        Self {
            elected: false,
            valid_until: Mutex::new(None),
        }
    }

    /// Elected: leader only while the lease is held.
    pub fn elected() -> Self {
        Self {
            elected: true,
            valid_until: Mutex::new(None),
        }
    }

    pub fn is_leader(&self) -> bool {
        if !self.elected {
            return true;
        }
        let until = *self.valid_until.lock().unwrap_or_else(|p| p.into_inner());
        until.is_some_and(|t| Instant::now() < t)
    }

    fn hold_until(&self, until: Option<Instant>) {
        *self.valid_until.lock().unwrap_or_else(|p| p.into_inner()) = until;
    }
}

/// What to do with the lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseStep {
    /// Ours: renew it.
    Renew,
    /// Free or expired: take it.
    TakeOver,
    /// Held by someone else.
    Follow { holder: String },
}

/// Decides from the lease as read, at `now`.
pub fn lease_step(spec: Option<&LeaseSpec>, me: &str, now: Timestamp) -> LeaseStep {
    let Some(spec) = spec else {
        return LeaseStep::TakeOver;
    };
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if holder == me {
        return LeaseStep::Renew;
    }
    if holder.is_empty() {
        return LeaseStep::TakeOver;
    }
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(15));
    let renewed = spec
        .renew_time
        .as_ref()
        .or(spec.acquire_time.as_ref())
        .map(|t| t.0);
    match renewed {
        Some(renewed) if now.as_second() <= renewed.as_second() + duration => {
            LeaseStep::Follow { holder }
        }
        _ => LeaseStep::TakeOver,
    }
}

/// Settings of the election.
#[derive(Debug, Clone)]
pub struct ElectionConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_interval: Duration,
}

/// Runs the election forever, updating `leadership`.
pub async fn run(client: Client, config: ElectionConfig, leadership: std::sync::Arc<Leadership>) {
    let api: Api<Lease> = Api::namespaced(client, &config.namespace);
    let margin = config.lease_duration / 5;
    let mut was_leader = false;
    loop {
        let attempt_started = Instant::now();
        match try_once(&api, &config).await {
            Ok(true) => {
                leadership.hold_until(Some(attempt_started + config.lease_duration - margin));
                if !was_leader {
                    info!(identity = %config.identity, "became the leader");
                }
                was_leader = true;
            }
            Ok(false) => {
                leadership.hold_until(None);
                if was_leader {
                    warn!(identity = %config.identity, "lost the lease");
                }
                was_leader = false;
            }
            Err(e) => {
                warn!(error = %e, "lease update failed; leadership lapses unless renewed in time")
            }
        }
        tokio::time::sleep(config.renew_interval).await;
    }
}

async fn try_once(api: &Api<Lease>, config: &ElectionConfig) -> Result<bool, kube::Error> {
    let now = Timestamp::now();
    let current = match api.get_opt(&config.name).await? {
        Some(lease) => lease,
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(config.name.clone()),
                    ..Default::default()
                },
                spec: Some(new_spec(config, now, None, 0)),
            };
            return match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        }
    };
    let step = lease_step(current.spec.as_ref(), &config.identity, now);
    let spec = current.spec.clone().unwrap_or_default();
    let next = match step {
        LeaseStep::Follow { .. } => return Ok(false),
        LeaseStep::Renew => LeaseSpec {
            renew_time: Some(MicroTime(now)),
            ..spec
        },
        LeaseStep::TakeOver => new_spec(
            config,
            now,
            Some(&spec),
            spec.lease_transitions.unwrap_or(0) + 1,
        ),
    };
    let updated = Lease {
        metadata: current.metadata.clone(),
        spec: Some(next),
    };
    match api
        .replace(&config.name, &PostParams::default(), &updated)
        .await
    {
        Ok(_) => Ok(true),
        // Another replica wrote first (the update carried our resourceVersion).
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

fn new_spec(
    config: &ElectionConfig,
    now: Timestamp,
    _old: Option<&LeaseSpec>,
    transitions: i32,
) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(config.identity.clone()),
        lease_duration_seconds: Some(config.lease_duration.as_secs() as i32),
        acquire_time: Some(MicroTime(now)),
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(transitions),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: &str, renewed: i64, duration: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            renew_time: Some(MicroTime(Timestamp::from_second(renewed).unwrap())),
            lease_duration_seconds: Some(duration),
            ..Default::default()
        }
    }

    #[test]
    fn steps() {
        let now = Timestamp::from_second(1000).unwrap();
        assert_eq!(lease_step(None, "a", now), LeaseStep::TakeOver);
        assert_eq!(
            lease_step(Some(&spec("a", 990, 15)), "a", now),
            LeaseStep::Renew
        );
        assert_eq!(
            lease_step(Some(&spec("b", 990, 15)), "a", now),
            LeaseStep::Follow { holder: "b".into() }
        );
        assert_eq!(
            lease_step(Some(&spec("b", 980, 15)), "a", now),
            LeaseStep::TakeOver
        );
        assert_eq!(
            lease_step(Some(&spec("", 999, 15)), "a", now),
            LeaseStep::TakeOver
        );
    }

    #[test]
    fn leadership_lapses() {
        let l = Leadership::elected();
        assert!(!l.is_leader());
        l.hold_until(Some(Instant::now() + Duration::from_secs(5)));
        assert!(l.is_leader());
        l.hold_until(Some(Instant::now() - Duration::from_millis(1)));
        assert!(!l.is_leader());
        assert!(Leadership::always().is_leader());
    }
}
