#!/usr/bin/env bash
# Builds Sluice's images: sluice:<version> (every binary) and
# sluice-prometheus:<version> (Debian's Prometheus, for docker-compose.yml).
#
#   deploy/docker/build-images.sh                       # compile in the builder stage, base debian:12
#   deploy/docker/build-images.sh --offline-base        # base made here with debootstrap (no registry)
#   deploy/docker/build-images.sh --offline-base --from-tree build/bin   # reuse the host build (seconds)
#
# --offline-base: a registry-free Debian 12 base. debootstrap builds a
#   minimal root filesystem from the Debian repositories this machine's apt
#   uses (their sources are copied in, so the image gets the same package
#   versions as the host), and `docker import` makes it the local image
#   sluice-debian:12 (made once; --rebuild-base makes it again).
# --from-tree DIR: the binaries of a host build (Debian 12, same packages),
#   stripped of debug info, instead of compiling in the image.
# --json FILE: build seconds and image sizes, for the deployment figures.
#
# Needs a running Docker engine with BuildKit: `docker buildx`, or Debian's
# docker.io client (/usr/bin/docker, 20.10) with DOCKER_BUILDKIT=1. Builds use
# --network host (apt inside the build reaches the repositories directly).
set -euo pipefail
cd "$(dirname "$0")/../.."

version=$(sed -n 's/^project(sluice VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
[[ -n $version ]] || { echo "build-images: cannot read the version from CMakeLists.txt" >&2; exit 1; }
base_image=debian:12
offline_base=0
rebuild_base=0
from_tree=
json=
while (($#)); do
  case $1 in
    --offline-base) offline_base=1 ;;
    --rebuild-base) offline_base=1; rebuild_base=1 ;;
    --base) base_image=$2; shift ;;
    --from-tree) from_tree=$2; shift ;;
    --json) json=$2; shift ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-images: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

# A client that builds with BuildKit (only the stages the target needs).
build_cmd=()
if docker buildx version >/dev/null 2>&1; then
  build_cmd=(docker buildx build --load)
elif [[ -x /usr/bin/docker ]] && /usr/bin/docker build --help 2>/dev/null | grep -q -- '--network'; then
  build_cmd=(env DOCKER_BUILDKIT=1 /usr/bin/docker build)
else
  echo "build-images: need docker buildx, or Debian's docker.io client at /usr/bin/docker" >&2
  exit 1
fi
docker info >/dev/null 2>&1 || { echo "build-images: no Docker engine answers (start dockerd)" >&2; exit 1; }

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
base_seconds=0

if ((offline_base)); then
  base_image=sluice-debian:12
  if ((rebuild_base)) || ! docker image inspect "$base_image" >/dev/null 2>&1; then
    command -v debootstrap >/dev/null || { echo "build-images: debootstrap is not installed (scripts/install-deps.sh)" >&2; exit 1; }
    start=$(now)
    rootfs=$(mktemp -d /tmp/sluice-debootstrap.XXXXXX)
    trap 'rm -rf "$rootfs"' EXIT
    mirror=$(awk '/^URIs:/ && !/security/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    mirror=${mirror:-http://deb.debian.org/debian}
    echo "build-images: debootstrap bookworm from $mirror"
    debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$rootfs.log" 2>&1 ||
      { tail -20 "$rootfs.log" >&2; echo "build-images: debootstrap failed (log above)" >&2; exit 1; }
    rm -f "$rootfs.log"
    if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
      cp /etc/apt/sources.list.d/debian.sources "$rootfs/etc/apt/sources.list.d/debian.sources"
      rm -f "$rootfs/etc/apt/sources.list"
    fi
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | docker import \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'CMD ["/bin/bash"]' \
      --message "Debian 12 (bookworm) minbase by debootstrap, for Sluice" - "$base_image" >/dev/null
    rm -rf "$rootfs"
    trap - EXIT
    base_seconds=$(elapsed "$start")
    echo "build-images: base $base_image made in ${base_seconds}s"
  else
    echo "build-images: base $base_image exists (--rebuild-base makes it again)"
  fi
fi

binaries=source
if [[ -n $from_tree ]]; then
  binaries=tree
  stage=deploy/docker/stage
  rm -rf "$stage/bin"
  mkdir -p "$stage/bin"
  for b in sluice sluice-model sluice-controller sluice-rollout-worker sluice-reward-server \
           sluice-replay-buffer sluice-trainer; do
    [[ -x $from_tree/$b ]] || { echo "build-images: $from_tree/$b is missing (build first: scripts/build.sh)" >&2; exit 1; }
    strip --strip-debug -o "$stage/bin/$b" "$from_tree/$b"
  done
fi

revision=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
start=$(now)
"${build_cmd[@]}" --network host -f deploy/docker/Dockerfile --target runtime \
  --build-arg BASE_IMAGE="$base_image" --build-arg SLUICE_BINARIES="$binaries" \
  --build-arg SLUICE_VERSION="$version" --build-arg SLUICE_REVISION="$revision" \
  -t "sluice:$version" -t sluice:latest .
sluice_seconds=$(elapsed "$start")
start=$(now)
"${build_cmd[@]}" --network host -f deploy/docker/prometheus.Dockerfile \
  --build-arg BASE_IMAGE="$base_image" -t "sluice-prometheus:$version" -t sluice-prometheus:latest \
  deploy/docker
prometheus_seconds=$(elapsed "$start")
# The images these tags replaced (a rebuild from a newer tree), not in use.
docker image prune -f --filter "label=org.opencontainers.image.title=Sluice" >/dev/null || true
docker image prune -f --filter "label=org.opencontainers.image.title=Prometheus for Sluice" >/dev/null || true

size() { docker image inspect -f '{{.Size}}' "$1"; }
echo "build-images: sluice:$version ($binaries binaries) built in ${sluice_seconds}s," \
  "$(( $(size "sluice:$version") / 1048576 )) MiB; sluice-prometheus:$version in ${prometheus_seconds}s," \
  "$(( $(size "sluice-prometheus:$version") / 1048576 )) MiB; base $base_image $(( $(size "$base_image") / 1048576 )) MiB"
if [[ -n $json ]]; then
  cat >"$json" <<EOF
{"version": "$version", "binaries": "$binaries", "base_image": "$base_image",
 "base_build_seconds": $base_seconds, "sluice_build_seconds": $sluice_seconds,
 "prometheus_build_seconds": $prometheus_seconds,
 "sluice_image_bytes": $(size "sluice:$version"), "prometheus_image_bytes": $(size "sluice-prometheus:$version"),
 "base_image_bytes": $(size "$base_image")}
EOF
fi
