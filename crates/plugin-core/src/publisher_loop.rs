//! The publisher loop of both plugins, a thin driver of [`crate::refresh_schedule`]: sleep
//! as the schedule says, re-check health and publish when due, until `stop` turns true.

use std::future::Future;

use tokio::sync::watch;

use crate::refresh_schedule::{RefreshPolicy, RefreshSchedule};

/// What a plugin's node publisher does when the schedule says so.
pub trait Publisher: Send + 'static {
    /// Re-discovers the devices, serves them to kubelet and publishes the node.
    fn refresh(&mut self) -> impl Future<Output = Result<(), String>> + Send;

    /// Re-checks device health between publications (called only with a health period).
    fn recheck_health(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// Runs `publisher` on `policy` until `stop` turns true; a failed publication is logged
/// (and retried as the policy says).
pub async fn run_publisher(
    mut publisher: impl Publisher,
    policy: RefreshPolicy,
    mut stop: watch::Receiver<bool>,
) {
    let now = || tokio::time::Instant::now().into_std();
    let mut schedule = RefreshSchedule::new(policy, now());
    loop {
        tokio::select! {
            _ = tokio::time::sleep(schedule.sleep(now())) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let due = schedule.tick(now());
        if due.health {
            publisher.recheck_health().await;
        }
        if due.publish {
            let ok = match publisher.refresh().await {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!("{e}");
                    false
                }
            };
            schedule.published(now(), ok);
        }
    }
}
