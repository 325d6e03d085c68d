//! Health from the AMD device-metrics exporter end to end (a fake exporter over HTTP).

use super::*;

mod fake_exporter {
    use hami_amd_plugin::exporter::metricssvc::metrics_service_server::{
        MetricsService, MetricsServiceServer,
    };
    use hami_amd_plugin::exporter::metricssvc::{GpuGetRequest, GpuState, GpuStateResponse};
    use std::sync::{Arc, Mutex};

    /// A stand-in for the AMD device-metrics exporter: serves `List` over its unix socket
    /// with whatever health the test sets.
    #[derive(Clone, Default)]
    pub(super) struct Exporter(pub Arc<Mutex<Vec<(String, String)>>>);

    #[tonic::async_trait]
    impl MetricsService for Exporter {
        async fn get_gpu_state(
            &self,
            _: tonic::Request<GpuGetRequest>,
        ) -> Result<tonic::Response<GpuStateResponse>, tonic::Status> {
            Err(tonic::Status::unimplemented("not used"))
        }
        async fn list(
            &self,
            _: tonic::Request<()>,
        ) -> Result<tonic::Response<GpuStateResponse>, tonic::Status> {
            let gpus = self.0.lock().unwrap().clone();
            Ok(tonic::Response::new(GpuStateResponse {
                gpu_state: gpus
                    .into_iter()
                    .map(|(device, health)| GpuState {
                        id: device.clone(),
                        uuid: String::new(),
                        health,
                        associated_workload: vec![],
                        device,
                    })
                    .collect(),
            }))
        }
    }

    pub(super) fn serve(path: &std::path::Path, exporter: Exporter) -> tokio::task::JoinHandle<()> {
        let incoming = hami_deviceplugin_api::bind_unix(path).unwrap();
        tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(MetricsServiceServer::new(exporter))
                .serve_with_incoming(incoming)
                .await;
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exporter_health_marks_gpus_unhealthy_and_recovered() {
    let tree = hami_sysfs_fixtures::mi210_xgmi().unwrap();
    let socket = tree.sysfs_root().parent().unwrap().join("exporter.socket");
    let exporter = fake_exporter::Exporter::default();
    let server = fake_exporter::serve(&socket, exporter.clone());
    let h = Harness::start_with(
        tree,
        Opts {
            exporter: Some(socket.clone()),
            ..Default::default()
        },
    )
    .await;
    let sick = h.devices[5].clone();
    let all: Vec<(String, String)> = h
        .devices
        .iter()
        .map(|d| (d.device_key.clone(), "healthy".to_owned()))
        .collect();
    *exporter.0.lock().unwrap() = all.clone();
    // The exporter calls one GPU unhealthy: kubelet loses its 10 shares, and an Event says so.
    let mut one_sick = all.clone();
    one_sick[5].1 = "unhealthy".into();
    *exporter.0.lock().unwrap() = one_sick;
    assert!(
        h.sim()
            .wait_for_allocatable("amd.com/gpu", 70, Duration::from_secs(10))
            .await,
        "{}",
        h.sim().allocatable("amd.com/gpu")
    );
    let events: kube::Api<k8s_openapi::api::core::v1::Event> =
        kube::Api::namespaced(h.client.clone(), "default");
    let reasons = || async {
        events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.message.as_deref().unwrap_or("").contains(&sick.info.id))
            .filter_map(|e| e.reason)
            .collect::<Vec<_>>()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !reasons().await.contains(&"AMDGPUUnhealthy".to_owned()) {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            reasons().await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let register = h.node_annotation(AMD.node_register).unwrap();
    let entry = hami_protocol::node_register::decode_node_devices(&register)
        .unwrap()
        .into_iter()
        .find(|d| d.id == sick.info.id)
        .unwrap();
    assert!(!entry.health, "the register annotation says unhealthy too");
    // Healthy again: shares back and AMDGPURecovered.
    *exporter.0.lock().unwrap() = all;
    assert!(
        h.sim()
            .wait_for_allocatable("amd.com/gpu", 80, Duration::from_secs(10))
            .await
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !reasons().await.contains(&"AMDGPURecovered".to_owned()) {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            reasons().await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server.abort();
}
