#!/usr/bin/env bash
# Builds the fuzz binary (src/main.rs: every target, HAMI_FUZZ_TARGET picks one) with
# libFuzzer's coverage instrumentation on the stable toolchain (the flags cargo-fuzz passes,
# minus the nightly-only sanitizer: safe Rust needs none) and runs each target for a bounded
# time against its checked-in corpus (a folder per target under corpus/). Fails on any
# crash, leak of a panic, or timeout; the crashing input is left in
# tests/fuzz/artifacts/<target>/ (replay: HAMI_FUZZ_TARGET=<target> <binary> <input>).
#
#   tests/fuzz/run.sh                every target, FUZZ_SECONDS (default 30) each
#   tests/fuzz/run.sh node_lock ...  only these targets
#   FUZZ_JOBS=2 tests/fuzz/run.sh    targets run this many at a time (default: cores)
#   tests/fuzz/run.sh --build-only   only the build (.ci/run starts it beside the tests)
set -euo pipefail
cd "$(dirname "$0")"

seconds=${FUZZ_SECONDS:-30}
jobs=${FUZZ_JOBS:-$(nproc)}
host=$(rustc -vV | sed -n 's/^host: //p')

export RUSTFLAGS="${RUSTFLAGS:-} -Cpasses=sancov-module \
  -Cllvm-args=-sanitizer-coverage-level=4 \
  -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
  -Cllvm-args=-sanitizer-coverage-pc-table \
  -Cllvm-args=-sanitizer-coverage-trace-compares \
  --cfg fuzzing"
# --target keeps the instrumentation off build scripts and proc macros (and the
# instrumented objects apart from the normal build's in target/<host>/fuzz/).
cargo build --profile fuzz --locked --target "$host" -p hami-fuzz --bin hami-fuzz
if [ "${1:-}" = --build-only ]; then exit 0; fi
bin_dir=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/$host/fuzz

if (($#)); then targets=("$@"); else
  mapfile -t targets < <(ls corpus)
fi

run_one() {
  local target=$1 seconds=$2 bin_dir=$3
  local scratch
  scratch=$(mktemp -d)
  mkdir -p "artifacts/$target"
  # New inputs go to the scratch dir (first corpus); the checked-in corpus is only read.
  if HAMI_FUZZ_TARGET=$target "$bin_dir/hami-fuzz" "$scratch" "corpus/$target" \
      -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
      -print_final_stats=1 -artifact_prefix="artifacts/$target/" \
      >"artifacts/$target/log" 2>&1; then
    stats=$(grep -E '^stat::(number_of_executed_units|new_units_added)' "artifacts/$target/log" |
      awk '{printf "%s ", $2}')
    cov=$(grep -oE 'cov: [0-9]+' "artifacts/$target/log" | tail -1)
    echo "ok   $target: execs,new_units = ${stats:-?} ${cov:-}"
    rm -rf "$scratch"
  else
    echo "FAIL $target: see tests/fuzz/artifacts/$target/log"
    tail -40 "artifacts/$target/log"
    rm -rf "$scratch"
    return 1
  fi
}
export -f run_one

printf '%s\n' "${targets[@]}" |
  xargs -P "$jobs" -I{} bash -c 'run_one "$@"' _ {} "$seconds" "$bin_dir"
