# The node image: k8s-device-plugin, nvidia-device-plugin, k8s-vgpu-monitor,
# k8s-node-labeller and the hooks libamvgpu.so (HIP, LD_AUDIT) and libvgpu.so (CUDA,
# LD_PRELOAD). Build from the repository root:
#   docker build -f deploy/docker/node.Dockerfile -t <registry>/hami-rs/hami-node:<tag> .
#
# The hooks are loaded into workload containers whatever their distribution, so it
# is built against glibc 2.34 (AlmaLinux 9 ships exactly 2.34): it then loads on every
# glibc >= 2.34 image, and the build fails if a newer symbol version slips in. It cannot be
# musl (it shares ld.so with glibc processes). The node binaries are built in the same
# stage, so they need glibc >= 2.34 at run time; the runtime base (Debian 12) has 2.36 and a
# shell, cp, cmp and mv for the hook installer (the device plugin DaemonSet's init container
# copies the hook beside the installed one and renames it over, never rewriting in place).

FROM docker.io/library/almalinux:9 AS build
RUN dnf install -y gcc binutils findutils && dnf clean all
RUN curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --default-toolchain 1.95.0
ENV PATH=/root/.cargo/bin:$PATH
WORKDIR /src
COPY . .
# `--bin`/`--lib` select targets across all the packages named (cargo refuses a second
# `--lib`), so the hooks' packages share one `--lib`.
RUN cargo build --release --locked \
      -p hami-amd-plugin --bin k8s-device-plugin \
      -p hami-amdgpu-dra-plugin --bin amdgpu-dra-plugin \
      -p hami-nvidia-plugin --bin nvidia-device-plugin \
      -p hami-monitor --bin k8s-vgpu-monitor \
      -p hami-node-labeller --bin k8s-node-labeller \
      -p hami-hip-hook -p hami-cuda-hook --lib
# Symbol baseline: nothing newer than GLIBC_2.34 may be required by either hook.
RUN for lib in target/release/libamvgpu.so target/release/libvgpu.so; do \
      newest=$(objdump -T "$lib" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1) \
   && echo "$lib needs $newest" \
   && test "$(printf '%s\nGLIBC_2.34\n' "$newest" | sort -V | tail -1)" = "GLIBC_2.34" || exit 1; \
    done

FROM docker.io/library/debian:12-slim
COPY --from=build /src/target/release/k8s-device-plugin /usr/bin/k8s-device-plugin
COPY --from=build /src/target/release/amdgpu-dra-plugin /usr/bin/amdgpu-dra-plugin
COPY --from=build /src/target/release/nvidia-device-plugin /usr/bin/nvidia-device-plugin
COPY --from=build /src/target/release/k8s-vgpu-monitor /usr/bin/k8s-vgpu-monitor
COPY --from=build /src/target/release/k8s-node-labeller /usr/bin/k8s-node-labeller
COPY --from=build --chmod=0555 /src/target/release/libamvgpu.so /opt/hami/lib/amd/libamvgpu.so
COPY --from=build --chmod=0555 /src/target/release/libvgpu.so /opt/hami/lib/nvidia/libvgpu.so
ENTRYPOINT ["/usr/bin/k8s-device-plugin"]
