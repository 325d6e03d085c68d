//! Compiles the vendored CRI v1 `api.proto` with protox (pure Rust), so no system `protoc`
//! is needed. Client only: kubelet-sim is the CRI client; containerd is the server.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["api.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        .btree_map(".")
        .compile_fds(fds)?;
    Ok(())
}
