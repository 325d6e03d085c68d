//! Allocate latency on the embedded API server: the kubelet's gRPC Allocate on the plugin's
//! unix socket, for pods whose decision the scheduler wrote (device list, bind phase, node
//! lock). Each call reads the node and the node's pods, plans, patches the pod and releases
//! the lock. Run: `cargo bench -p hami-amd-plugin --bench allocate_latency`.

use clap::Parser;
use hami_amd_plugin::cli::Args;
use hami_plugin_harness::{BenchAllocation, allocate_latency, api_with_node};
use hami_protocol::device_list::ContainerDevice;
use hami_protocol::names::AMD;

fn main() {
    hami_plugin_harness::run_bench(bench());
}

async fn bench() {
    let (server, client) = api_with_node("n1").await;
    let tree = hami_sysfs_fixtures::mi300x_cpx().unwrap();
    // Slices of CPX partitions: the opt-in (partitions are whole devices by default).
    let devices = hami_amd_plugin::discover_report::build_report(
        &tree.sysfs_root(),
        &tree.dev_root(),
        &hami_amd_plugin::registration::RegistrationSettings {
            slice_partitions: true,
            ..Default::default()
        },
    )
    .unwrap()
    .registration
    .devices;
    let sockets = tree.sysfs_root().parent().unwrap().join("device-plugins");
    let mut args = Args::parse_from(["k8s-device-plugin"]);
    args.sysfs_root = tree.sysfs_root();
    args.dev_root = tree.dev_root();
    args.device_plugin_dir = sockets.clone();
    args.node_name = Some("n1".into());
    args.cgroup_root = tree.sysfs_root().join("fs/cgroup");
    args.slice_partitions = true;
    args.host_hook_path = tree.sysfs_root().parent().unwrap().join("hook");
    hami_plugin_harness::install_stub_hook(&args.host_hook_path, "libamvgpu.so");
    let settings = args.registration_settings().unwrap();
    let (stop, rx) = tokio::sync::watch::channel(false);
    let plugin = tokio::spawn(hami_amd_plugin::plugin::serve(
        args,
        settings,
        client.clone(),
        rx,
    ));
    let socket = sockets.join(hami_amd_plugin::plugin::ENDPOINT);
    allocate_latency(&server, &client, &AMD, "n1", &socket, "HSA_CU_MASK", |i| {
        let d = &devices[i % devices.len()];
        BenchAllocation {
            device: ContainerDevice {
                uuid: d.info.id.clone(),
                device_type: d.info.device_type.clone(),
                mem_mib: 1024,
                cores: 9,
            },
            device_id: format!("{}#0", d.device_key),
        }
    })
    .await;
    stop.send(true).unwrap();
    let _ = plugin.await;
}
