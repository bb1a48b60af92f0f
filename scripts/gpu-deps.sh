#!/usr/bin/env bash
# Unpacks the libraries gpu/ builds with (absl, nlohmann_json, spdlog, fmt,
# CLI11, zlib, GoogleTest) from Debian 12's packages into .gpu/sysroot, for
# a GPU machine that has PyTorch but none of them (scripts/gpu-check.sh uses
# it as SLUICE_GPU_DEPS). Run on a Debian 12 machine; the folder is ~15 MB
# and is not committed (.gpu/ is ignored).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST=$ROOT/.gpu/sysroot
debs=$(mktemp -d)
trap 'rm -rf "$debs"' EXIT
(cd "$debs" && apt-get download libabsl-dev libabsl20220623 nlohmann-json3-dev libspdlog-dev \
  libspdlog1.10 libfmt-dev libfmt9 libcli11-dev libgtest-dev libgmock-dev zlib1g-dev zlib1g)
rm -rf "$DEST"
mkdir -p "$DEST"
for deb in "$debs"/*.deb; do dpkg -x "$deb" "$DEST"; done
rm -rf "$DEST/usr/share/doc" "$DEST/usr/src"
# zlib1g-dev's libz.so points at /lib/...: keep the library inside.
lib=$DEST/usr/lib/x86_64-linux-gnu
real=$(basename "$(ls "$DEST"/lib/x86_64-linux-gnu/libz.so.1.* "$lib"/libz.so.1.* 2>/dev/null | head -1)")
[ -e "$lib/$real" ] || cp "$DEST/lib/x86_64-linux-gnu/$real" "$lib/"
ln -sfn "$real" "$lib/libz.so"
ln -sfn "$real" "$lib/libz.so.1"
rm -rf "$DEST/lib"
if find "$DEST" -type l -lname '/*' | grep -q .; then
  echo "gpu-deps: absolute links left in $DEST:" >&2
  find "$DEST" -type l -lname '/*' >&2
  exit 1
fi
du -sh "$DEST"
