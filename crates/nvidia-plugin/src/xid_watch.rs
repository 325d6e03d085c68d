//! The shell of `xid_health`: a thread waits on NVML's event set (`nvmlEventSetWait_v2`,
//! one second at a time so it notices the end), and each critical XID marks its GPU
//! unhealthy at once in the device list ListAndWatch serves and is recorded as a Node Event;
//! each publication applies the marks to the rediscovered GPUs and reports recoveries.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, PostParams};
use serde_json::json;
use tokio::sync::watch;

use crate::nvml::{EVENT_XID_CRITICAL, Nvml, NvmlEvent};
use crate::registration::RegisteredGpu;
use crate::xid_health::{HealthEvent, XidHealth, XidOutcome, unhealthy_event};

/// The XID marks, shared by the watcher and the publisher.
pub type SharedXidHealth = Arc<Mutex<XidHealth>>;

fn lock(health: &SharedXidHealth) -> std::sync::MutexGuard<'_, XidHealth> {
    health.lock().unwrap_or_else(|p| p.into_inner())
}

/// Records a Node Event (core v1, namespace `default`, as kubelet does for nodes) and logs it.
pub async fn record_node_event(client: &kube::Client, node: &str, event: &HealthEvent) {
    tracing::warn!(reason = event.reason, "{}", event.message);
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let now =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    let ev: Result<Event, _> = serde_json::from_value(json!({
        "metadata": {"generateName": format!("{node}.")},
        "involvedObject": {"kind": "Node", "name": node, "apiVersion": "v1"},
        "reason": event.reason,
        "message": event.message,
        "type": event.kind,
        "source": {"component": "nvidia-device-plugin", "host": node},
        "count": 1,
    }));
    let Ok(mut ev) = ev else { return };
    ev.first_timestamp = Some(now.clone());
    ev.last_timestamp = Some(now);
    if let Err(e) = events.create(&PostParams::default(), &ev).await {
        tracing::warn!("cannot record event {}: {e}", event.reason);
    }
}

/// What a publication does with freshly discovered GPUs: reports the GPUs whose recovery
/// time passed, then marks the still unhealthy ones.
pub async fn apply_to_discovery(
    health: &SharedXidHealth,
    devices: &mut [RegisteredGpu],
    client: &kube::Client,
    node: &str,
) {
    let now = Instant::now();
    let recovered = {
        let mut h = lock(health);
        let events = h.recoveries(devices, now);
        h.apply(devices, now);
        events
    };
    for event in &recovered {
        record_node_event(client, node, event).await;
    }
}

/// Watches XID events until `shutdown` turns true. Without NVML's event API, or when the
/// event set cannot be made, it says so once and health stays as discovery reports it.
pub async fn watch_xids(
    nvml: Nvml,
    health: SharedXidHealth,
    recovery: Option<Duration>,
    devices: watch::Sender<Vec<RegisteredGpu>>,
    client: kube::Client,
    node: String,
    mut shutdown: watch::Receiver<bool>,
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<NvmlEvent>();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<Result<Vec<String>, String>>();
    // NVML's wait blocks its thread: a thread of its own, ending when the receiver is gone.
    std::thread::spawn(move || {
        let watch = match nvml.watch_xids() {
            Ok(w) => {
                let _ = ready_tx.send(Ok(w.unwatched.clone()));
                w
            }
            Err(e) => {
                let _ = ready_tx.send(Err(e.to_string()));
                return;
            }
        };
        while !tx.is_closed() {
            match watch.wait(1000) {
                Ok(Some(event)) => {
                    if tx.send(event).is_err() {
                        return;
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!("waiting for NVML events failed: {e}; retrying in 1 s");
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
    });
    match ready_rx.await {
        Ok(Ok(unwatched)) => {
            for w in unwatched {
                tracing::warn!("{w}");
            }
            tracing::info!("watching NVML XID events");
        }
        Ok(Err(e)) => {
            tracing::warn!("XID health checks are off: {e}");
            return;
        }
        Err(_) => return,
    }
    loop {
        let event = tokio::select! {
            e = rx.recv() => match e { Some(e) => e, None => return },
            _ = shutdown.wait_for(|s| *s) => return,
        };
        if event.event_type & EVENT_XID_CRITICAL == 0 {
            continue;
        }
        let Some(uuid) = event.uuid else {
            tracing::warn!(
                "XID {} on a GPU NVML cannot name: not attributed",
                event.data
            );
            continue;
        };
        let now = Instant::now();
        let outcome = lock(&health).record(&uuid, event.data, now);
        match outcome {
            XidOutcome::Ignored => {
                tracing::info!(
                    "XID {} on {uuid} is an application error: the GPU stays healthy",
                    event.data
                );
            }
            XidOutcome::StillUnhealthy => {
                tracing::warn!("critical XID {} on {uuid}, already unhealthy", event.data);
            }
            XidOutcome::BecameUnhealthy => {
                // At once, not at the next publication: kubelet stops handing it out now.
                let marks = lock(&health).clone();
                devices.send_if_modified(|list| {
                    let before = list.clone();
                    marks.apply(list, now);
                    *list != before
                });
                record_node_event(
                    &client,
                    &node,
                    &unhealthy_event(&uuid, event.data, recovery),
                )
                .await;
            }
        }
    }
}
