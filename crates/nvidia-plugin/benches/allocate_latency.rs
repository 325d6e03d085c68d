//! Allocate latency on the embedded API server with the stand-in NVML: the kubelet's gRPC
//! Allocate on the plugin's unix socket, for pods whose decision the scheduler wrote
//! (device list, bind phase, node lock). Each call reads the node and the node's pods,
//! plans, creates the container's accounting directory, patches the pod and releases the
//! lock. Run: `cargo bench -p hami-nvidia-plugin --bench allocate_latency`.

use std::time::Duration;

use clap::Parser;
use hami_nvidia_plugin::cli::Args;
use hami_plugin_harness::{
    BenchAllocation, allocate_latency, api_with_node, built_stand_in_nvml, wait_node_annotation,
};
use hami_protocol::device_list::ContainerDevice;
use hami_protocol::names::NVIDIA;
use hami_protocol::node_register::decode_node_devices;

fn main() {
    hami_plugin_harness::run_bench(bench());
}

async fn bench() {
    let (server, client) = api_with_node("n1").await;
    let scratch = std::env::temp_dir().join(format!("nv-bench-{}", std::process::id()));
    let sockets = scratch.join("device-plugins");
    std::fs::create_dir_all(&sockets).unwrap();
    let mut args = Args::parse_from(["nvidia-device-plugin"]);
    args.nvml_library = built_stand_in_nvml().display().to_string();
    args.device_plugin_dir = sockets.clone();
    args.hook_path = scratch.join("hook");
    hami_plugin_harness::install_stub_hook(&args.hook_path, "libvgpu.so");
    args.node_name = Some("n1".into());
    let settings = args.settings().unwrap();
    let (stop, rx) = tokio::sync::watch::channel(false);
    let plugin = tokio::spawn(hami_nvidia_plugin::plugin::serve(
        args,
        settings,
        client.clone(),
        rx,
    ));
    let socket = sockets.join(hami_nvidia_plugin::plugin::ENDPOINT);
    let register =
        wait_node_annotation(&server, "n1", NVIDIA.node_register, Duration::from_secs(20)).await;
    let devices = decode_node_devices(&register).unwrap();
    let expect = "CUDA_DEVICE_MEMORY_LIMIT_0";
    allocate_latency(&server, &client, &NVIDIA, "n1", &socket, expect, |i| {
        let d = &devices[i % devices.len()];
        BenchAllocation {
            device: ContainerDevice {
                uuid: d.id.clone(),
                device_type: "NVIDIA".into(),
                mem_mib: 1024,
                cores: 10,
            },
            device_id: format!("{}#0", d.id),
        }
    })
    .await;
    stop.send(true).unwrap();
    let _ = plugin.await;
    let _ = std::fs::remove_dir_all(scratch);
}
