//! Compiles the vendored kubelet protos (device plugin v1beta1, DRA v1, plugin registration
//! v1) with protox (pure Rust), so no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(
        [
            "deviceplugin_v1beta1.proto",
            "dra_v1.proto",
            "pluginregistration_v1.proto",
        ],
        ["proto"],
    )?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .btree_map(".")
        .compile_fds(fds)?;
    Ok(())
}
