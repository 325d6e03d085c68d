#!/usr/bin/env bash
# Builds the images of deploy/docker/ as OCI archives without a container daemon (issue 29):
#   target/images/<image>.oci.tar, named localhost/hami-rs/hami-<image>:<tag>
# (`hami manifests --registry localhost --tag dev` runs the scheduler and node images by
# exactly these names; `ctr images import` and containerd's image service take the archives.)
#
# The Dockerfiles are the one description of each image: this script interprets their final
# stage (COPY --from=build, USER, ENTRYPOINT, CMD, ENV; anything else is refused) and builds
# the packages their `cargo build` line names, so the two cannot drift. What differs is where
# the pieces come from:
#   - binaries: this machine's cargo build of --profile (the Dockerfiles build release in
#     their own build stage; the scheduler's there is static musl, here glibc);
#   - bases: root filesystems made by mmdebstrap from Debian bookworm, cached under
#     --cache keyed by their recipe: debian:12-slim -> Debian's essential set (+ libgcc-s1,
#     no apt); distroless/static-debian12:nonroot -> base-files, netbase, libc6, libgcc-s1
#     and distroless's passwd/group (glibc, because this machine cannot build musl);
#     scratch -> nothing;
#   - pause: deploy/docker/pause.c compiled here as its Dockerfile compiles it.
# The hooks (COPY destinations under /opt/hami/lib/) must need nothing newer than
# GLIBC_2.34, checked with objdump as node.Dockerfile checks it.
#
# Needs root (buildah with its own storage under a temporary directory, mmdebstrap
# --mode=root) and the Debian packages buildah, mmdebstrap, binutils, gcc, libc6-dev.
set -euo pipefail
shopt -s inherit_errexit

usage() {
  cat <<'EOF'
usage: scripts/build-images.sh [options] [scheduler|node|pause|workload ...]
  (no image named: all four)
  --profile NAME  cargo profile of the binaries (default release; dev = debug)
  --no-build      take the binaries already built for --profile (tests: CI's
                  `cargo test --workspace` built the dev ones); never runs cargo
  --out DIR       where the archives go (default <cargo target dir>/images)
  --tag TAG       image tag (default dev)
  --cache DIR     base tarball cache (default ${XDG_CACHE_HOME:-~/.cache}/hami-rs/images)
  --mirror URL    Debian mirror (default http://deb.debian.org/debian)
  --bin-dir DIR   take the binaries from DIR (or DIR/deps) instead of the cargo target
                  directory of --profile; never runs cargo (e.g. hooks built on AlmaLinux 9)
EOF
}

die() {
  echo "build-images: $*" >&2
  exit 2
}

repo=$(cd "$(dirname "$0")/.." && pwd)
arguments=("$@")
target=${CARGO_TARGET_DIR:-$repo/target}
profile=release
build=1
out=
tag=dev
cache=${XDG_CACHE_HOME:-$HOME/.cache}/hami-rs/images
mirror=http://deb.debian.org/debian
bin_dir_arg=
images=()
while (($#)); do
  case $1 in
    --profile) profile=${2:?--profile needs a name}; shift 2 ;;
    --no-build) build=0; shift ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --tag) tag=${2:?--tag needs a tag}; shift 2 ;;
    --cache) cache=${2:?--cache needs a directory}; shift 2 ;;
    --mirror) mirror=${2:?--mirror needs a URL}; shift 2 ;;
    --bin-dir) bin_dir_arg=${2:?--bin-dir needs a directory}; build=0; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    -*) usage >&2; die "unknown option $1" ;;
    *) images+=("$1"); shift ;;
  esac
done
((${#images[@]})) || images=(scheduler node pause workload)
for image in "${images[@]}"; do
  [ -f "$repo/deploy/docker/$image.Dockerfile" ] ||
    die "no image '$image' (no deploy/docker/$image.Dockerfile); the images: scheduler node pause workload"
done
out=${out:-$target/images}
case $profile in
  dev | debug) cargo_profile=dev; bin_dir=$target/debug ;;
  *) cargo_profile=$profile; bin_dir=$target/$profile ;;
esac
[ -z "$bin_dir_arg" ] || bin_dir=$bin_dir_arg

[ "$(id -u)" -eq 0 ] ||
  die "needs root (buildah and mmdebstrap --mode=root): sudo scripts/build-images.sh ${arguments[*]}"
for tool in buildah mmdebstrap objdump gcc tar sha256sum flock; do
  command -v "$tool" >/dev/null ||
    die "$tool not found: apt-get install buildah mmdebstrap binutils gcc libc6-dev"
done

work=$(mktemp -d "${TMPDIR:-/tmp}/hami-build-images.XXXXXX")
# buildah keeps its containers and images under $work only: nothing shared with other
# buildah or podman users of the machine, and removed with it.
store=(--root "$work/storage" --runroot "$work/run" --storage-driver vfs)
cleanup() {
  buildah "${store[@]}" rm --all >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# --- The Dockerfile's final stage -------------------------------------------------------

# Sets from_image, copies ("mode|source|destination", mode empty without --chmod), user,
# entrypoint, cmd and envs from the instructions after the Dockerfile's last FROM.
parse_final_stage() {
  local file=$1 n=0 line final=()
  while IFS= read -r line || [ -n "$line" ]; do
    n=$((n + 1))
    case $line in
      FROM\ *) final=("$n:$line") ;;
      *) ((${#final[@]})) && final+=("$n:$line") ;;
    esac
  done <"$file"
  from_image= copies=() user= entrypoint= cmd= envs=()
  local entry num text words
  for entry in "${final[@]}"; do
    num=${entry%%:*} text=${entry#*:}
    text=${text%$'\r'}
    [[ $text =~ ^[[:space:]]*(#|$) ]] && continue
    [[ $text == *\\ ]] &&
      die "$file:$num: line continuation in the final stage; build-images.sh reads one instruction per line there"
    read -r -a words <<<"$text"
    case ${words[0]} in
      FROM) [ ${#words[@]} -eq 2 ] || die "$file:$num: FROM <image> expected"; from_image=${words[1]} ;;
      COPY)
        if [ ${#words[@]} -eq 4 ] && [ "${words[1]}" = --from=build ]; then
          copies+=("|${words[2]}|${words[3]}")
        elif [ ${#words[@]} -eq 5 ] && [ "${words[1]}" = --from=build ] &&
          [[ ${words[2]} =~ ^--chmod=(0?[0-7]{3,4})$ ]]; then
          copies+=("${BASH_REMATCH[1]}|${words[3]}|${words[4]}")
        else
          die "$file:$num: '$text': only COPY --from=build [--chmod=<octal>] <file> <absolute path> is understood"
        fi
        [[ ${copies[-1]##*|} == /* && ${copies[-1]##*|} != */ ]] ||
          die "$file:$num: '$text': the destination must be an absolute file path"
        ;;
      USER) user=${text#*USER } ;;
      ENTRYPOINT) entrypoint=${text#*ENTRYPOINT } ;;
      CMD) cmd=${text#*CMD } ;;
      ENV)
        [[ ${text#*ENV } =~ ^[A-Za-z_][A-Za-z0-9_]*=[^[:space:]]*$ ]] ||
          die "$file:$num: '$text': only ENV NAME=value (one, unquoted) is understood"
        envs+=("${text#*ENV }")
        ;;
      *)
        die "$file:$num: '$text': build-images.sh interprets only COPY --from=build, USER, ENTRYPOINT, CMD and ENV in the final stage; teach it the new instruction (parse_final_stage)"
        ;;
    esac
  done
  [ -n "$from_image" ] || die "$file: no FROM"
  for field in "$entrypoint" "$cmd"; do
    [ -z "$field" ] || [[ $field == \[* ]] ||
      die "$file: ENTRYPOINT and CMD must be in exec (JSON) form, as the chart's commands are"
  done
}

# The `-p <package> [--bin <name> | --lib]` words of the Dockerfile's `cargo build` step.
cargo_targets() {
  local joined words i=0
  joined=$(sed -e ':a' -e '/\\$/N; s/\\\n/ /; ta' "$1" | grep -m1 'cargo build' || true)
  read -r -a words <<<"$joined"
  while ((i < ${#words[@]})); do
    case ${words[i]} in
      -p) printf '%s\n' -p "${words[i + 1]}"; i=$((i + 2)) ;;
      --bin) printf '%s\n' --bin "${words[i + 1]}"; i=$((i + 2)) ;;
      --lib) printf '%s\n' --lib; i=$((i + 1)) ;;
      *) i=$((i + 1)) ;;
    esac
  done
}

# --- Bases ------------------------------------------------------------------------------

# Common to every base: no documentation, manual pages or translations (debian:12-slim's
# rule), merged /usr set up by mmdebstrap's hook (not the usrmerge package, which pulls
# perl), retries for a flaky network.
base_common=(
  --dpkgopt='path-exclude=/usr/share/man/*'
  --dpkgopt='path-exclude=/usr/share/doc/*'
  --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/locale/*'
  --dpkgopt='path-exclude=/usr/share/info/*'
  --aptopt='Acquire::Retries "3"'
)
# After mmdebstrap, on the root directory $1: no device nodes and no copy of this machine's
# resolv.conf or hostname (the runtime provides all three), nothing of mmdebstrap's own.
post_common() {
  find "$1/dev" -mindepth 1 -delete
  rm -f "$1/etc/resolv.conf" "$1/etc/hostname" "$1/etc/apt/apt.conf.d/99mmdebstrap"
}
post_debian_essential() {
  post_common "$1"
}
# distroless keeps no package manager state; its users and home are those of
# static-debian12:nonroot; no iconv modules (nothing here uses iconv).
post_glibc_nonroot() {
  post_common "$1"
  rm -rf "$1/etc/apt" "$1/etc/dpkg" "$1/var/lib/dpkg" "$1/var/lib/apt" "$1/var/cache" \
    "$1/var/log" "$1/usr/lib/x86_64-linux-gnu/gconv" "$1/usr/bin/mawk" "$1/usr/share/doc/mawk" \
    "$1/lib32" "$1/libx32"
  printf '%s\n' root:x:0:0:root:/root:/sbin/nologin \
    nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin \
    nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin >"$1/etc/passwd"
  printf '%s\n' root:x:0: nobody:x:65534: nonroot:x:65532: >"$1/etc/group"
  install -d -m 0700 -o 65532 -g 65532 "$1/home/nonroot"
  install -d -m 0700 "$1/root"
  install -d -m 1777 "$1/tmp"
}

# Sets base_name, base_args (mmdebstrap's options), base_post (run on the result) and
# base_env for a FROM image; empty base_name: no base (scratch).
base_for() {
  base_env=()
  case $1 in
    docker.io/library/debian:12-slim)
      base_name=debian-essential base_post=post_debian_essential
      base_args=(--variant=essential --include=libgcc-s1
        --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr "${base_common[@]}")
      base_env=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
      ;;
    gcr.io/distroless/static-debian12:nonroot)
      base_name=glibc-nonroot base_post=post_glibc_nonroot
      base_args=(--variant=extract --include=base-files,netbase,libc6,libgcc-s1
        --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr "${base_common[@]}")
      base_env=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
      ;;
    scratch) base_name= base_args=() base_post= ;;
    *) die "no base for FROM $1: add it to base_for in scripts/build-images.sh" ;;
  esac
}

# Prints the cached tarball of the current base, making it with mmdebstrap when missing.
# Keyed by the recipe (suite, options, post-processing); one maker at a time (flock),
# written whole.
base_tarball() {
  local key tarball
  key=$({
    printf '%s\n' bookworm "${base_args[@]}"
    declare -f post_common "$base_post"
  } | sha256sum | cut -c1-16)
  tarball=$cache/$base_name-$key.tar
  mkdir -p "$cache"
  (
    flock 9
    if [ -f "$tarball" ]; then
      echo "base $base_name: cached $tarball" >&2
    else
      echo "base $base_name: making $tarball with mmdebstrap from $mirror" >&2
      local started=$SECONDS dir=$work/base-$base_name
      if ! mmdebstrap --quiet --mode=root --format=directory "${base_args[@]}" \
        bookworm "$dir" "$mirror" >"$work/mmdebstrap-$base_name.log" 2>&1; then
        cat "$work/mmdebstrap-$base_name.log" >&2
        die "mmdebstrap failed for base $base_name (log above)"
      fi
      "$base_post" "$dir"
      tar --numeric-owner --sort=name -C "$dir" -cf "$tarball.part" .
      rm -rf "$dir"
      mv "$tarball.part" "$tarball"
      echo "base $base_name: made in $((SECONDS - started)) s" >&2
    fi
  ) 9>"$cache/.lock"
  echo "$tarball"
}

# --- Artifacts --------------------------------------------------------------------------

# The built file a COPY source names, by its file name: the pause program compiled here,
# else the newest of <bin dir>/<name> and <bin dir>/deps/<name> (a cdylib that only tests
# built is in deps/).
artifact() {
  local name=${1##*/} candidate newest=
  if [ "$name" = pause ]; then
    echo "$work/pause"
    return
  fi
  for candidate in "$bin_dir/$name" "$bin_dir/deps/$name"; do
    [ -f "$candidate" ] || continue
    if [ -z "$newest" ] || [ "$candidate" -nt "$newest" ]; then newest=$candidate; fi
  done
  [ -n "$newest" ] ||
    die "$name is not built in $bin_dir: run scripts/build-images.sh without --no-build, or cargo build --profile $cargo_profile ${current_targets[*]}"
  echo "$newest"
}

# The newest GLIBC_ version a library needs; refuses one above the hooks' 2.34 baseline.
check_glibc_baseline() {
  local newest
  newest=$(objdump -T "$1" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
  echo "$2 needs $newest (baseline GLIBC_2.34)" >&2
  [ "$(printf '%s\nGLIBC_2.34\n' "$newest" | sort -V | tail -1)" = GLIBC_2.34 ] ||
    die "$2 needs $newest, newer than the hooks' GLIBC_2.34 baseline (built here against $(ldd --version | head -1)); a newer symbol version was linked in: find the call, or build the node image with deploy/docker/node.Dockerfile (AlmaLinux 9, glibc 2.34)"
}

# --- Build ------------------------------------------------------------------------------

# Build what the Dockerfiles' `cargo build` steps name, for --profile, in one cargo run
# (`--lib` once: it selects the libraries of all the packages named, and cargo refuses two).
if ((build)); then
  all_targets=()
  lib=
  for image in "${images[@]}"; do
    mapfile -t targets < <(cargo_targets "$repo/deploy/docker/$image.Dockerfile")
    for word in "${targets[@]}"; do
      if [ "$word" = --lib ]; then lib=--lib; else all_targets+=("$word"); fi
    done
  done
  [ -z "$lib" ] || all_targets+=("$lib")
  if ((${#all_targets[@]})); then
    echo "cargo build --locked --profile $cargo_profile ${all_targets[*]}" >&2
    (cd "$repo" && cargo build --locked --profile "$cargo_profile" "${all_targets[@]}")
  fi
fi

# Every image's pieces are found before any base is made: a missing binary fails at once.
declare -A files=()
for image in "${images[@]}"; do
  dockerfile=$repo/deploy/docker/$image.Dockerfile
  mapfile -t current_targets < <(cargo_targets "$dockerfile")
  parse_final_stage "$dockerfile"
  base_for "$from_image"
  if [ "$image" = pause ] && [ ! -f "$work/pause" ]; then
    # As pause.Dockerfile's build stage compiles it.
    gcc -static -Os -s -Wall -Wextra -Werror -o "$work/pause" "$repo/deploy/docker/pause.c"
  fi
  for copy in "${copies[@]}"; do
    IFS='|' read -r _ source _ <<<"$copy"
    files["$image|$source"]=$(artifact "$source")
  done
done

mkdir -p "$out"
for image in "${images[@]}"; do
  started=$SECONDS
  dockerfile=$repo/deploy/docker/$image.Dockerfile
  name=localhost/hami-rs/hami-$image:$tag
  parse_final_stage "$dockerfile"
  base_for "$from_image"
  tarball=
  [ -z "$base_name" ] || tarball=$(base_tarball)

  ctr=$(buildah "${store[@]}" from scratch)
  root=$(buildah "${store[@]}" mount "$ctr")
  [ -z "$tarball" ] || tar --numeric-owner -xpf "$tarball" -C "$root"
  for copy in "${copies[@]}"; do
    IFS='|' read -r mode source dest <<<"$copy"
    file=${files["$image|$source"]}
    # node.Dockerfile's build stage checks the hooks here too.
    case $dest in /opt/hami/lib/*) check_glibc_baseline "$file" "$dest" ;; esac
    # COPY makes missing parent directories 0755 root:root, and without --chmod keeps the
    # mode the build stage's cargo gave the file (umask 022).
    dir=
    IFS=/ read -r -a parts <<<"${dest%/*}"
    for part in "${parts[@]}"; do
      [ -n "$part" ] || continue
      dir=$dir/$part
      [ -e "$root$dir" ] || [ -L "$root$dir" ] || install -d -m 0755 -o 0 -g 0 "$root$dir"
    done
    [ -n "$mode" ] || mode=$(printf '%o' $((0$(stat -c %a "$file") & ~022)))
    install -m "$mode" -o 0 -g 0 "$file" "$root$dest"
  done
  rootfs_bytes=$(du -sb "$root" | cut -f1)
  buildah "${store[@]}" umount "$ctr" >/dev/null

  config=()
  for env in "${base_env[@]}" "${envs[@]}"; do config+=(--env "$env"); done
  [ -z "$user" ] || config+=(--user "$user")
  [ -z "$entrypoint" ] || config+=(--entrypoint "$entrypoint")
  [ -z "$cmd" ] || config+=(--cmd "$cmd")
  buildah "${store[@]}" config "${config[@]}" "$ctr"
  buildah "${store[@]}" commit --quiet --format oci --rm "$ctr" "$name" >/dev/null
  # Written beside the archive and renamed over it: a reader never sees half an archive.
  part=$(mktemp "$out/.$image.oci.tar.XXXXXX")
  rm -f "$part"
  buildah "${store[@]}" push --quiet "$name" "oci-archive:$part:$name"
  mv "$part" "$out/$image.oci.tar"
  buildah "${store[@]}" rmi "$name" >/dev/null
  echo "image $name: $out/$image.oci.tar ($(stat -c %s "$out/$image.oci.tar") bytes archive, $rootfs_bytes bytes root filesystem, $((SECONDS - started)) s)"
done
