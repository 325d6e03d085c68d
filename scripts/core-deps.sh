#!/usr/bin/env bash
# The pure cores stay pure (issue 28): each core crate's normal (non-dev) dependency tree,
# transitively, may hold only the packages its line in scripts/core-deps.allow names. A
# core that gains an I/O dependency (tokio, kube, tonic, axum, hyper…) fails CI here, with
# the package and the path that brought it in. To allow a package, add it to the core's
# line — and say in the commit why a core needs it.
#
#   scripts/core-deps.sh                   check every core in the allow-list
#   scripts/core-deps.sh hami-amd-core     check one
set -euo pipefail
cd "$(dirname "$0")/.."
allow_file=scripts/core-deps.allow

declare -A allowed
while IFS= read -r line; do
  line=${line%%#*}
  [[ $line =~ ^[[:space:]]*$ ]] && continue
  core=${line%%:*}
  allowed[$core]=" ${line#*:} "
done <"$allow_file"

cores=("$@")
((${#cores[@]})) || mapfile -t cores < <(printf '%s\n' "${!allowed[@]}" | sort)

failed=0
for core in "${cores[@]}"; do
  [[ -v allowed[$core] ]] || { echo "core-deps: $core has no line in $allow_file" >&2; failed=1; continue; }
  mapfile -t packages < <(cargo tree -p "$core" -e normal --prefix none --locked \
    --format '{p}' | awk '{print $1}' | sort -u)
  # The tree lists the core itself; nothing at all means cargo tree failed (its error is above).
  if ((${#packages[@]} == 0)); then
    echo "core-deps: cargo tree gave nothing for $core" >&2
    failed=1
    continue
  fi
  extra=()
  for pkg in "${packages[@]}"; do
    [[ $pkg == "$core" ]] && continue
    [[ ${allowed[$core]} == *" $pkg "* ]] || extra+=("$pkg")
  done
  if ((${#extra[@]})); then
    failed=1
    echo "core-deps: $core (a pure core) depends on packages outside its allow-list:" >&2
    for pkg in "${extra[@]}"; do
      echo "  $pkg, brought in by:" >&2
      cargo tree -p "$core" -e normal --locked -i "$pkg" 2>/dev/null | sed 's/^/      /' >&2
    done
    echo "  Remove the dependency (a core has no I/O: move the code using it to a shell crate)," >&2
    echo "  or, if it is pure, add it to the $core line of $allow_file." >&2
  else
    echo "core-deps: $core ok (${#packages[@]} packages, all allowed)"
  fi
done
exit "$failed"
