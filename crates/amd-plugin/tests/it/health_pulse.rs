//! Health is re-sent to kubelet every `-pulse` seconds (SPEC §4), not only on change, and
//! a change reaches kubelet at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::future::BoxFuture;
use hami_amd_plugin::discover_report::build_report;
use hami_amd_plugin::grpc_server::{Allocator, PluginService, kubelet_devices};
use hami_amd_plugin::registration::RegistrationSettings;
use hami_deviceplugin_api::v1beta1::Empty;
use hami_deviceplugin_api::v1beta1::device_plugin_server::DevicePlugin;
use hami_plugin_core::container_plan::ContainerPlan;
use tokio::sync::watch;

struct NoAllocate;

impl Allocator for NoAllocate {
    fn allocate(&self, _: Vec<String>) -> BoxFuture<'_, Result<ContainerPlan, String>> {
        Box::pin(async { Err("not in this test".to_owned()) })
    }
}

#[tokio::test]
async fn list_and_watch_resends_every_pulse_and_reports_changes() {
    let tree = hami_sysfs_fixtures::mi210_xgmi().unwrap();
    let devices = build_report(
        &tree.sysfs_root(),
        &tree.dev_root(),
        &RegistrationSettings::default(),
    )
    .unwrap()
    .registration
    .devices;
    let (tx, rx) = watch::channel(devices.clone());
    let (_stop_tx, stop_rx) = watch::channel(false);
    let pulse = Duration::from_millis(200);
    let service = PluginService::new(
        rx,
        |d: &Vec<_>| kubelet_devices(d),
        Arc::new(NoAllocate),
        Some(pulse),
        stop_rx,
    );
    let mut stream = service
        .list_and_watch(tonic::Request::new(Empty {}))
        .await
        .unwrap()
        .into_inner();
    let started = Instant::now();
    // The first list at once, then one per pulse with nothing changed.
    let mut times = Vec::new();
    for _ in 0..4 {
        let msg = tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .expect("a list within 5 s")
            .unwrap()
            .unwrap();
        assert_eq!(msg.devices.len(), 80);
        assert!(msg.devices.iter().all(|d| d.health == "Healthy"));
        times.push(started.elapsed());
    }
    assert!(times[0] < pulse, "first list without waiting: {times:?}");
    for pair in times.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(
            gap >= pulse / 2 && gap < pulse * 5,
            "re-sent about every pulse: {times:?}"
        );
    }
    // A health change is sent without waiting for the next pulse.
    let mut sick = devices.clone();
    sick[0].info.health = false;
    let changed_at = Instant::now();
    tx.send(sick).unwrap();
    let msg = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let m = stream.next().await.unwrap().unwrap();
            if m.devices.iter().any(|d| d.health == "Unhealthy") {
                return m;
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(
        msg.devices
            .iter()
            .filter(|d| d.health == "Unhealthy")
            .count(),
        10,
        "all shares of the card"
    );
    assert!(changed_at.elapsed() < pulse * 3);
}
