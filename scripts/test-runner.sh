#!/usr/bin/env bash
# Cargo's runner for the test binaries of scripts/test.sh: each reports every test's time
# (libtest's own `--report-time`). The flag is unstable; RUSTC_BOOTSTRAP lets the stable
# harness accept it. Set here, in the test process only, never for cargo: build scripts
# that probe for nightly features would otherwise see it and rebuild differently.
# The "Package" line names the binary's package for scripts/test-times.sh (every crate's
# integration binary is called `it`).
echo "     Package ${CARGO_PKG_NAME:-unknown}"
RUSTC_BOOTSTRAP=1 exec "$@" -Z unstable-options --report-time
