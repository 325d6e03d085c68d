# The pause image: PID 1 of every pod sandbox when pods run on containerd + runc (issue 29's
# real-container tests; a cluster uses its runtime's own pause image, so this one is not
# shipped). A static C program (deploy/docker/pause.c): reaps the children it inherits,
# sleeps until SIGTERM or SIGINT, exits 0. Runs as 65535:65535, as registry.k8s.io/pause does.
# Build from the repository root:
#   docker build -f deploy/docker/pause.Dockerfile -t <registry>/hami-rs/hami-pause:<tag> .

FROM docker.io/library/debian:12 AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
COPY deploy/docker/pause.c /src/pause.c
RUN gcc -static -Os -s -Wall -Wextra -Werror -o /pause /src/pause.c

FROM scratch
COPY --from=build --chmod=0755 /pause /pause
USER 65535:65535
ENTRYPOINT ["/pause"]
