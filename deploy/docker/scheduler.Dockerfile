# hami-scheduler (extender + webhook) and hami-webui (the read-only web UI): static musl
# binaries on distroless, non-root.
# Build from the repository root:
#   docker build -f deploy/docker/scheduler.Dockerfile -t <registry>/hami-rs/hami-scheduler:<tag> .
# The chart runs it as uid 65532 with `command: [/hami-scheduler]` (crates/manifests checks
# that this file installs the binary there).

FROM docker.io/library/rust:1.95-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/*
RUN rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY . .
RUN cargo build --release --locked --target x86_64-unknown-linux-musl \
      -p hami-scheduler --bin hami-scheduler -p hami-webui --bin hami-webui

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /src/target/x86_64-unknown-linux-musl/release/hami-scheduler /hami-scheduler
COPY --from=build /src/target/x86_64-unknown-linux-musl/release/hami-webui /hami-webui
USER 65532:65532
ENTRYPOINT ["/hami-scheduler"]
