# The workload image of the real-container tests (issue 29; not shipped): `hami-workload`,
# the demo's GPU-busy program, with the stand-in runtimes where real images have theirs —
# the stand-in HIP runtime as ROCm's /opt/rocm/lib/libamdhip64.so.6 (on LD_LIBRARY_PATH),
# the stand-in CUDA driver and NVML as the NVIDIA container toolkit mounts the driver's
# (/usr/lib/x86_64-linux-gnu/libcuda.so.1, libnvidia-ml.so.1). The hooks are not in it:
# pods get them from the host path the node image's init container installs them to.
# No USER: pods choose theirs (`runAsUser: 1000` in the tests); every file is world-readable.
# Build from the repository root:
#   docker build -f deploy/docker/workload.Dockerfile -t <registry>/hami-rs/hami-workload:<tag> .

FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked \
      -p hami-demo --bin hami-workload \
      -p hami-hip-stand-in -p hami-cuda-stand-in -p hami-nvml-stand-in --lib

FROM docker.io/library/debian:12-slim
COPY --from=build /src/target/release/hami-workload /usr/local/bin/hami-workload
COPY --from=build /src/target/release/libamdhip64.so /opt/rocm/lib/libamdhip64.so.6
COPY --from=build /src/target/release/libcuda.so /usr/lib/x86_64-linux-gnu/libcuda.so.1
COPY --from=build /src/target/release/libnvidia_ml.so /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1
ENV LD_LIBRARY_PATH=/opt/rocm/lib
ENTRYPOINT ["/usr/local/bin/hami-workload"]
