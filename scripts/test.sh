#!/usr/bin/env bash
# The test command of README.md: installs what the tests need on a fresh Debian machine
# (packages by name, nothing downloaded by hand; idempotent), then runs every test of the
# workspace with the committed Cargo.lock. `.ci/run` runs it after fmt and clippy.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the tests use (by name; nothing downloaded by hand).
#   binutils:   objdump/readelf for the hooks' glibc symbol-baseline test
#   util-linux: unshare for the PID-namespace hook test
#   gcc, libc6-dev: cdylib linking and the C test programs of the hooks
#   libamdhip64-dev, hipcc: the real ROCm HIP runtime (5.2.3) the HIP hook is tested against
#   prometheus: promtool, which checks every metrics endpoint of a running `hami demo`
#   chromium, chromium-driver: the web UI's browser test (tests/system/tests/it/browser.rs)
#   containerd, runc, buildah, busybox-static: kubelet-sim's containerd runtime tests and
#     sim/containerd-host (a private containerd; test images built from the static busybox)
#   mmdebstrap (+ buildah): scripts/build-images.sh's Debian bases (image_archives test)
#   podman: a real CDI consumer reading the AMD plugin's and the DRA driver's CDI specs
#     (tests/system/tests/it/containerd/podman.rs)
packages=(binutils util-linux gcc libc6-dev libamdhip64-dev hipcc prometheus chromium chromium-driver containerd runc buildah busybox-static mmdebstrap podman)
missing=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if ((${#missing[@]})); then
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# PyPI peers of the chart tests (crates/manifests/tests/peers): Helm v4's engine
# (helm-python-sdk bundles libhelm_c.so), the upstream OpenAPI schemas (kubernetes-validate)
# and a CEL implementation for the webhook's matchConditions (cel-python).
pip_packages=(helm-python-sdk kubernetes-validate cel-python)
python3 -m pip show -q "${pip_packages[@]}" >/dev/null 2>&1 \
  || python3 -m pip install -q --disable-pip-version-check "${pip_packages[@]}"

# axe-core for the web UI's accessibility checks, from its lock file (npm registry).
npm ci --prefix crates/webui/tests/axe --no-audit --no-fund --silent

# kubectl is on every machine (Google Cloud SDK); the API-server tests drive it.
command -v kubectl >/dev/null || echo "warning: kubectl not on PATH; tests that drive it will fail" >&2

# Every test binary reports each test's time (libtest's own `--report-time`, through the
# runner scripts/test-runner.sh; doc-tests don't). The log stays in target/test-times.log;
# the slowest tests and test binaries are printed at the end, also when a test failed.
log=target/test-times.log
mkdir -p target
status=0
cargo test --workspace --locked --config "target.'cfg(all())'.runner = ['$PWD/scripts/test-runner.sh']" 2>&1 |
  tee "$log" || status=$?
scripts/test-times.sh "$log" || true
exit "$status"
