#!/usr/bin/env bash
# gpu-check: the CUDA hook on a real NVIDIA GPU (or, with --stand-in, on the workspace's
# stand-in driver, to check this script itself on a machine without a GPU).
#
# Builds libvgpu.so and a small driver-API program (no nvcc or CUDA headers needed; the
# kernel is PTX, JIT-compiled by the driver), then runs it with and without the hook:
#   1. memory info is virtualized to the limit;
#   2. the limit is respected (limit + 1 byte is refused with CUDA_ERROR_OUT_OF_MEMORY);
#   3. a busy kernel's utilization is sampled into the shared region and read back by the
#      monitor's reader;
#   4. the hook's added cost per cuMemAlloc+cuMemFree pair.
# Prints one summary table; finishes in well under 5 minutes after the build.
#   5. with PyTorch (where python3 has it): memory info, the limit, two processes sharing one
#      limit, and the SM limit throttling a matmul loop.
# Usage: gpu-check/run.sh [--stand-in] [--limit 1g] [--prebuilt DIR]
#   --prebuilt DIR: take libvgpu.so, read_region (and probe, if there) from DIR instead of
#   building (a GPU machine without cargo).
set -euo pipefail
cd "$(dirname "$0")/.."

stand_in=0
limit=1g
prebuilt=
while (($#)); do
  case "$1" in
    --stand-in) stand_in=1 ;;
    --limit) limit="$2"; shift ;;
    --prebuilt) prebuilt="$(realpath "$2")"; shift ;;
    *) echo "unknown argument $1 (use --stand-in, --limit SIZE, --prebuilt DIR)" >&2; exit 2 ;;
  esac
  shift
done

work=$(mktemp -d /tmp/gpu-check.XXXXXX)
trap 'rm -rf "$work"' EXIT
if [ -n "$prebuilt" ]; then
  ((stand_in)) && { echo "--prebuilt is for a real GPU machine (no stand-in libraries in it)" >&2; exit 2; }
  hook="$prebuilt/libvgpu.so"
  reader="$prebuilt/read_region"
  for f in "$hook" "$reader"; do [ -f "$f" ] || { echo "--prebuilt: $f is missing" >&2; exit 2; }; done
else
  echo "building (release)..." >&2
  packages=(-p hami-cuda-hook)
  ((stand_in)) && packages+=(-p hami-cuda-stand-in -p hami-nvml-stand-in)
  cargo build --release --quiet "${packages[@]}"
  cargo build --release --quiet -p hami-monitor --example read_region
  target=${CARGO_TARGET_DIR:-target}/release
  hook="$(realpath "$target/libvgpu.so")"
  reader="$target/examples/read_region"
fi

libdir="$work/lib"
mkdir -p "$libdir"
if ((stand_in)); then
  ln -s "$(realpath "$target/libcuda.so")" "$libdir/libcuda.so.1"
  ln -s "$(realpath "$target/libnvidia_ml.so")" "$libdir/libnvidia-ml.so.1"
  export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # One launch of the probe's kernel (1 block) keeps the stand-in device busy for 5 ms.
  export FAKE_CUDA_DEVICE_COUNT=1 FAKE_CUDA_DEVICE_MEMORY=16g FAKE_CUDA_BLOCK_NS=5000000 \
    FAKE_CUDA_SHARED_STATE="$work/fake-cuda.state"
  gpu="stand-in driver (FAKE_CUDA_DEVICE_MEMORY=16g)"
else
  command -v nvidia-smi >/dev/null || { echo "no nvidia-smi: run on a machine with an NVIDIA GPU and driver, or pass --stand-in" >&2; exit 1; }
  gpu="$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
fi
# Built here against the driver's libcuda.so.1; a prebuilt probe where that cannot link.
cc -O2 -o "$work/probe" gpu-check/probe.c -L"$libdir" -l:libcuda.so.1 -ldl -Wl,-rpath,"$libdir" 2>/dev/null \
  || cc -O2 -o "$work/probe" gpu-check/probe.c -l:libcuda.so.1 -ldl 2>/dev/null \
  || { [ -n "$prebuilt" ] && [ -x "$prebuilt/probe" ] && cp "$prebuilt/probe" "$work/probe"; } \
  || { echo "the probe cannot be built (no C compiler or no libcuda.so.1 to link)" >&2; exit 1; }

probe() { timeout 60 "$work/probe" "$@"; }
hooked() { timeout 60 env LD_PRELOAD="$hook" CUDA_DEVICE_MEMORY_LIMIT_0="$limit" \
  CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/region/cudevshr.cache" "$work/probe" "$@"; }
field() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p" | head -1; }
mkdir -p "$work/region"

limit_bytes=$(python3 -c "import sys;s=sys.argv[1].lower();m={'k':1<<10,'m':1<<20,'g':1<<30};print(int(s[:-1])*m[s[-1]] if s[-1] in m else int(s))" "$limit")
results=()
row() { results+=("$(printf '%-42s %-28s %s' "$1" "$2" "$3")"); }

base_total=$(probe meminfo | field total || true)
hook_total=$(hooked meminfo | field total || true)
[ "$hook_total" = "$limit_bytes" ] && ok=PASS || ok=FAIL
row "memory info virtualized" "total $base_total -> $hook_total" "$ok (want $limit_bytes)"

at=$(hooked alloc "$limit_bytes" | field rc || true)
over=$(hooked alloc "$((limit_bytes + 1))" | field rc || true)
[ "$at" = 0 ] && [ "$over" = 2 ] && ok=PASS || ok=FAIL
row "limit respected" "limit rc=$at, limit+1 rc=$over" "$ok (want 0 and 2)"

hooked busy 6 > "$work/busy.out" &
busy=$!
sleep 4
reading=$("$reader" "$work/region/cudevshr.cache" 2>&1 || true)
wait "$busy" || true
util=$(echo "$reading" | field sm_util_sum)
launches=$(field launches < "$work/busy.out")
[ "${util:-0}" -gt 0 ] && ok=PASS || ok=FAIL
row "utilization sampled, read by the monitor" "sm_util=${util:-none}, launches=${launches:-0}" "$ok (want > 0)"

plain=$(probe pairs 20000 4096 | field ns_per_pair || true)
with=$(hooked pairs 20000 4096 | field ns_per_pair || true)
row "cost per cuMemAlloc+cuMemFree pair" "${plain:-none} ns -> ${with:-none} ns" "+$((${with:-0} - ${plain:-0})) ns"

# PyTorch: the runtime API and a caching allocator in front of the same hook.
if ((!stand_in)) && python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  tp() { timeout 120 python3 gpu-check/torch_probe.py "$@" 2>>"$work/torch.err"; }
  # thooked REGION ARGS...: the probe under the hook, with the limit, on region file REGION.
  thooked() { local region=$1; shift; timeout 120 env LD_PRELOAD="$hook" CUDA_DEVICE_MEMORY_LIMIT_0="$limit" \
    CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/region/$region.cache" python3 gpu-check/torch_probe.py "$@" 2>>"$work/torch.err"; }
  limit_mib=$((limit_bytes >> 20))
  t_total=$(thooked meminfo meminfo | field total || true)
  [ "$t_total" = "$limit_bytes" ] && ok=PASS || ok=FAIL
  row "torch: mem_get_info virtualized" "total ${t_total:-none}" "$ok (want $limit_bytes)"
  half=$(thooked half alloc $((limit_mib / 2)) | field alloc || true)
  twice=$(thooked twice alloc $((limit_mib * 2)) | field alloc || true)
  [ "$half" = ok ] && [ "$twice" = oom ] && ok=PASS || ok=FAIL
  row "torch: limit respected" "limit/2 ${half:-none}, 2x limit ${twice:-none}" "$ok (want ok, oom)"
  # Two processes of one container (one region): 60 % each of one limit; the first holds
  # its tensor while the second asks.
  share=$((limit_mib * 6 / 10))
  thooked pair alloc "$share" 8 > "$work/first.out" &
  first=$!
  for _ in $(seq 1 100); do grep -q alloc= "$work/first.out" 2>/dev/null && break; sleep 0.1; done
  second=$(thooked pair alloc "$share" | field alloc || true)
  wait "$first" || true
  first=$(field alloc < "$work/first.out")
  [ "$first" = ok ] && [ "$second" = oom ] && ok=PASS || ok=FAIL
  row "torch: two processes share one limit" "first ${first:-none}, second ${second:-none}" "$ok (want ok, oom)"
  free_rate=$(tp matmul 8 | field matmuls_per_s || true)
  sm_rate=$(timeout 120 env LD_PRELOAD="$hook" CUDA_DEVICE_SM_LIMIT=25 \
    CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/region/sm.cache" python3 gpu-check/torch_probe.py matmul 8 2>>"$work/torch.err" | field matmuls_per_s || true)
  ratio=$(python3 -c "import sys; a,b=sys.argv[1:]; print(f'{float(b)/float(a):.2f}')" "${free_rate:-0}" "${sm_rate:-0}" 2>/dev/null || echo none)
  python3 -c "import sys; r=float(sys.argv[1]); sys.exit(0 if 0 < r <= 0.5 else 1)" "$ratio" 2>/dev/null && ok=PASS || ok=FAIL
  row "torch: SM limit 25 % throttles matmuls" "${free_rate:-none}/s -> ${sm_rate:-none}/s (x$ratio)" "$ok (want x <= 0.5)"
fi

echo
echo "gpu-check on $gpu, hook $(basename "$hook"), limit $limit"
printf '%-42s %-28s %s\n' "CHECK" "MEASURED" "RESULT"
printf '%s\n' "${results[@]}"
if printf '%s\n' "${results[@]}" | grep -q FAIL; then
  [ -s "$work/torch.err" ] && { echo; echo "PyTorch probes' stderr (last 40 lines):"; tail -40 "$work/torch.err"; }
  exit 1
fi
