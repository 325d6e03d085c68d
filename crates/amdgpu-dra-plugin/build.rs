//! Compiles the vendored kubelet DRA v1 and plugin-registration v1 protos with protox (pure
//! Rust), like crates/deviceplugin-api: no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["dra_v1.proto", "pluginregistration_v1.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .btree_map(".")
        .compile_fds(fds)?;
    Ok(())
}
