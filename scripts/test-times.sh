#!/usr/bin/env bash
# Summarises a `cargo test -- -Z unstable-options --report-time` log (scripts/test.sh
# writes one to target/test-times.log): the slowest tests and the slowest test binaries,
# with the totals. Usage: scripts/test-times.sh [LOG] [N]   (default target/test-times.log, 10)
set -euo pipefail
log=${1:-target/test-times.log}
n=${2:-10}
[ -r "$log" ] || { echo "test-times: no log at $log (run scripts/test.sh first)" >&2; exit 1; }
awk -v n="$n" '
  # "Running tests/it/main.rs (target/debug/deps/it-0123abcd)", then the line of the runner
  # "Package hami-scheduler" (scripts/test-runner.sh) names the binary.
  /^ *Running / { target = $2; if ($2 == "unittests") target = "unit " $3; bin = target }
  /^ *Package / { bin = $2 " " target }
  /^ *Doc-tests / { bin = "doc-tests " $2 }
  /^test .* \.\.\. (ok|FAILED|ignored) <[0-9.]+s>$/ {
    t = $NF; gsub(/[<>s]/, "", t); name = $0; sub(/^test /, "", name); sub(/ \.\.\. .*$/, "", name)
    printf "%10.3f  %s  [%s]\n", t, name, bin > "/dev/stderr"
    tests++
  }
  /^test result: / {
    for (i = 1; i <= NF; i++) if ($i == "in") { t = $(i + 1); sub(/s$/, "", t) }
    printf "%10.3f  %s\n", t, bin > "/dev/stdout"; total += t; binaries++
    for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed;/) p += $i; if ($(i+1) ~ /^failed;/) f += $i }
  }
  END { printf "TOTALS %d binaries, %d tests timed, %d passed, %d failed, %.1f s inside test binaries\n", binaries, tests, p, f, total > "/dev/stderr" }
' "$log" 2> >(sort -rn > "$log.tests") | sort -rn > "$log.binaries"
sleep 0.2 # the process substitution writes the per-test file
# awk, not head: reading to the end keeps pipefail from failing on a closed pipe.
echo "== slowest $n tests (seconds, test, binary)"
awk -v n="$n" '!/^TOTALS/ && ++k <= n' "$log.tests"
echo "== slowest $n test binaries (seconds inside the binary)"
awk -v n="$n" 'NR <= n' "$log.binaries"
awk '/^TOTALS/ { sub(/^TOTALS/, "== totals:"); print }' "$log.tests"
