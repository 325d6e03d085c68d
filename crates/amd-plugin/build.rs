//! Compiles the AMD device-metrics exporter's health proto with protox (no system protoc).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/metricssvc.proto");
    let fds = protox::compile(["metricssvc.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
