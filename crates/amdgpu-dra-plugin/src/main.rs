//! `amdgpu-dra-plugin`: the kubelet DRA plugin for AMD GPU slices. `slices` prints the
//! node's ResourceSlices (JSON) from discovery; without a subcommand it serves kubelet and
//! keeps the node's ResourceSlices published (`slice_publisher`, every `--publish-interval`).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use hami_amdgpu_dra_plugin::args::{Args, Cmd};
use hami_amdgpu_dra_plugin::claims::KubeClaims;
use hami_amdgpu_dra_plugin::driver::{Driver, DriverConfig};
use hami_amdgpu_dra_plugin::registration::{Sockets, serve};
use hami_amdgpu_dra_plugin::slice_publisher::SlicePublisher;
use hami_dra_core::prepare::PrepareSettings;
use hami_dra_core::slice::{self, NodeRef};

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let Some(node) = args.node_name.clone() else {
        eprintln!(
            "error: the node name is unknown: pass --node-name or set NODE_NAME (the DaemonSet sets it from spec.nodeName)"
        );
        return ExitCode::from(2);
    };
    let settings = args.registration_settings();
    let report = match hami_amd_plugin::discover_report::build_report(
        &args.sysfs_root,
        &args.dev_root,
        &settings,
    ) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: discovery under {}: {e}", args.sysfs_root.display());
            return ExitCode::from(1);
        }
    };
    if let Some(Cmd::Slices) = args.command {
        let devices = match slice::devices(
            &report.discovery,
            &report.registration,
            &[],
            "1970-01-01T00:00:00Z",
        ) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(1);
            }
        };
        let slices = slice::build_slices(
            &args.driver_name,
            &NodeRef {
                name: node,
                uid: String::new(),
            },
            devices,
            &[],
        );
        match serde_json::to_string_pretty(&slices) {
            Ok(t) => println!("{t}"),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(1);
            }
        }
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(args, node, report)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

async fn run(
    args: Args,
    node: String,
    report: hami_amd_plugin::discover_report::Report,
) -> anyhow::Result<()> {
    let client = kube::Client::try_default().await?;
    let plugin_dir = args.plugin_dir();
    let devices = slice::registered_by_name(&report.discovery, &report.registration)
        .into_iter()
        .map(|(k, v)| (k, v.clone()))
        .collect();
    let dmem = hami_amd_plugin::dmem::dmem_available(&args.cgroup_root).then(|| {
        hami_amd_plugin::dmem::spawn_writer(args.cgroup_root.clone(), Duration::from_secs(30))
    });
    if dmem.is_none() {
        tracing::warn!(
            "{}",
            hami_amd_plugin::dmem::absent_message(&args.cgroup_root)
        );
    }
    let config = DriverConfig {
        settings: PrepareSettings {
            driver: args.driver_name.clone(),
            node: node.clone(),
            hook_host_path: args.hook_host_path.clone(),
            hook_container_path: hami_amd_plugin::allocate_plan::HOOK_CONTAINER_PATH.into(),
            cache_host_root: args.cache_root.clone(),
        },
        devices,
        cdi_dir: args.cdi_dir.clone(),
        checkpoint: plugin_dir.join("checkpoint.json"),
        dmem,
    };
    let publisher = SlicePublisher {
        client: client.clone(),
        driver: args.driver_name.clone(),
        node: node.clone(),
        sysfs_root: args.sysfs_root.clone(),
        dev_root: args.dev_root.clone(),
        settings: args.registration_settings(),
    };
    let publishing = tokio::spawn(publisher.run(
        Duration::from_secs(args.publish_interval),
        async {
            let _ = tokio::signal::ctrl_c().await;
        },
    ));
    let driver = Arc::new(Driver::new(config, KubeClaims { client })?);
    let sockets = Sockets::new(&args.registry_dir, &plugin_dir, &args.driver_name);
    let (_state, handle) = serve(driver, &args.driver_name, &sockets, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    tracing::info!(registration = %sockets.registration.display(), dra = %sockets.dra.display(), "serving kubelet");
    handle.await?;
    publishing.abort();
    Ok(())
}
