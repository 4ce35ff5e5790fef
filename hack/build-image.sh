#!/usr/bin/env bash
# Build ROSE's image from the Dockerfile without a Docker engine: buildah with vfs storage, no
# daemon, into an OCI archive.
#
#   hack/build-image.sh                  # dist/rose-image.tar (target rose), prints its path
#   ROSE_IMAGE_TARGET=driver hack/build-image.sh   # dist/rose-driver-image.tar
#   ROSE_IMAGE_BASE=python:3.11-slim-bookworm hack/build-image.sh   # a base you can pull
#   hack/build-image.sh base             # only the Debian base (hack/setup.sh, beside the Go builds)
#
# Without ROSE_IMAGE_BASE no registry is needed: the base (Debian bookworm minbase + python3 +
# python3-venv) is built with debootstrap from the Debian mirror and kept as an image in the
# buildah storage under $ROSE_CACHE_DIR/image (outside the repository), keyed by its package list.
# Python dependencies come from PyPI as wheels. Needs root (buildah vfs + debootstrap) and the
# Debian packages buildah and debootstrap (hack/setup.sh installs them).
# kind:  kind load image-archive dist/rose-image.tar --name rose
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${ROSE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rose}/image"
TARGET="${ROSE_IMAGE_TARGET:-rose}"
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/pyproject.toml" | head -n1)"
case "$TARGET" in
  rose) NAME="ghcr.io/rose-project/rose:$VERSION"; OUT="${ROSE_IMAGE_OUT:-$ROOT/dist/rose-image.tar}" ;;
  driver) NAME="ghcr.io/rose-project/rose-driver:$VERSION"; OUT="${ROSE_IMAGE_OUT:-$ROOT/dist/rose-driver-image.tar}" ;;
  *) echo "build-image: error: ROSE_IMAGE_TARGET '$TARGET' is not rose or driver" >&2; exit 2 ;;
esac
BASE_PACKAGES="python3,python3-venv,ca-certificates"
BASE_TAG="localhost/rose-base:bookworm-$(printf '%s' "$BASE_PACKAGES" | sha256sum | cut -c1-12)"

log() { printf '[build-image %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'build-image: error: %s\n' "$*" >&2; exit 1; }

command -v buildah >/dev/null 2>&1 || die "buildah is not installed: apt-get install buildah (or run hack/setup.sh)"
[ "$(id -u)" = 0 ] || die "run as root: vfs storage and debootstrap need it (or build with docker/podman: see Dockerfile)"
bh() { buildah --root "$CACHE/storage" --runroot "$CACHE/run" --storage-driver vfs "$@"; }

build_base() {
  if bh inspect --type image "$BASE_TAG" >/dev/null 2>&1; then log "base $BASE_TAG: cached"; return; fi
  command -v debootstrap >/dev/null 2>&1 || die "debootstrap is not installed: apt-get install debootstrap"
  local rootfs="$CACHE/rootfs.tmp"
  rm -rf "$rootfs"
  log "base $BASE_TAG: debootstrap bookworm minbase + $BASE_PACKAGES"
  debootstrap --variant=minbase --include="$BASE_PACKAGES" bookworm "$rootfs" \
    "${ROSE_DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$CACHE/debootstrap.log" 2>&1 \
    || die "debootstrap failed; see $CACHE/debootstrap.log"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/doc "$rootfs"/usr/share/man
  local ctr mnt
  ctr=$(bh from scratch)
  mnt=$(bh mount "$ctr")
  cp -a "$rootfs/." "$mnt/"
  bh umount "$ctr" >/dev/null
  bh config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd /bin/bash "$ctr"
  bh commit --quiet "$ctr" "$BASE_TAG" >/dev/null
  bh rm "$ctr" >/dev/null
  rm -rf "$rootfs"
}

mkdir -p "$CACHE"
if [ "${1:-}" = base ]; then build_base; exit 0; fi
[ $# -eq 0 ] || die "unknown argument '$1': run hack/build-image.sh (the image) or hack/build-image.sh base (only the Debian base)"
mkdir -p "$(dirname "$OUT")"
if [ -n "${ROSE_IMAGE_BASE:-}" ]; then BASE="$ROSE_IMAGE_BASE"; else build_base; BASE="$BASE_TAG"; fi
# pip in the build trusts what this machine trusts (a proxy's CA): a build secret, in no layer.
CA="${ROSE_IMAGE_CA_BUNDLE:-${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}}"
secret=(); if [ -s "$CA" ]; then secret=(--secret "id=ca-bundle,src=$CA"); fi
# Cached layers (the dependency installs, keyed by pyproject.toml) pile up as it changes: past
# ROSE_IMAGE_CACHE_MIB of storage the untagged ones go (the base stays; the next build re-fills).
if [ "$(du -sm "$CACHE/storage" 2>/dev/null | cut -f1)" -gt "${ROSE_IMAGE_CACHE_MIB:-12288}" ]; then
  log "the layer cache in $CACHE/storage is over ${ROSE_IMAGE_CACHE_MIB:-12288} MiB: pruning untagged layers"
  bh rmi --prune >/dev/null 2>&1 || true
fi
log "building $NAME (target $TARGET) FROM $BASE"
bh bud --quiet --isolation chroot --layers --pull=never --build-arg "BASE=$BASE" --target "$TARGET" \
  "${secret[@]}" -t "$NAME" -f "$ROOT/Dockerfile" "$ROOT" >"$CACHE/bud.log" 2>&1 \
  || { tail -n 30 "$CACHE/bud.log" >&2; die "the image build failed; full log: $CACHE/bud.log"; }
rm -f "$OUT"
bh push --quiet "$NAME" "oci-archive:$OUT:$NAME"
bh rmi --force "$NAME" >/dev/null 2>&1 || true  # the archive is the product; the storage keeps the base and cached layers
log "wrote $OUT ($(du -h "$OUT" | cut -f1))"
echo "$OUT"
