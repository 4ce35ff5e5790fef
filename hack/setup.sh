#!/usr/bin/env bash
# Everything ROSE needs on a fresh machine, idempotent and cheap when already done:
#   - Debian packages (prometheus for the predictor's end-to-end test; buildah, debootstrap and runc
#     for hack/build-image.sh and the image's end-to-end test),
#   - a virtual environment .venv with the Python dependencies,
#   - the Kubernetes binaries, built from their Go modules into the version-keyed cache,
#   - the image's Debian base (hack/build-image.sh base), cached by its package list.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
log() { printf '[setup %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

APT_PACKAGES=(prometheus buildah debootstrap)
APT_PACKAGES+=(runc gcc libc6-dev)  # runc: the image test and the real node (docs/real-node.md); gcc: the static pause binary
missing=()
for p in "${APT_PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  log "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # the package starts a system prometheus on :9090; ROSE's tests start their own
  $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || $SUDO service prometheus stop >/dev/null 2>&1 || true
fi

# The image's base (debootstrap from the Debian mirror: mostly download and unpack) builds while
# the Go builds use the CPUs; cached in $ROSE_CACHE_DIR/image, so a warm run skips it at once.
base_pid=""
if [ "$(id -u)" = 0 ] && command -v buildah >/dev/null 2>&1 && command -v debootstrap >/dev/null 2>&1; then
  base_log="$(mktemp -t rose-image-base.XXXXXX)"
  log "the image's base (cached; cold: debootstrap, a few minutes), beside the Go builds; log: $base_log"
  bash hack/build-image.sh base >"$base_log" 2>&1 & base_pid=$!
fi
log "Kubernetes binaries and the real node's kubelet, containerd, pause (cached by version; cold: two build lanes at once, beside the venv)"
bash hack/build-binaries.sh real-node >/dev/null & go_pid=$!
# a failure below (the venv) stops the builds too, so nothing keeps running unseen
kill_tree() { local c; for c in $(pgrep -P "$1" 2>/dev/null); do kill_tree "$c"; done; kill "$1" 2>/dev/null || true; }
trap 'for p in $go_pid $base_pid; do kill_tree "$p"; done' EXIT

PY="${PYTHON:-python3}"
stamp=".venv/.rose-installed"
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  log "creating .venv and installing the Python dependencies (first run: a few minutes)"
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade "pip>=25.1" "setuptools>=77" wheel
  .venv/bin/python -m pip install -q -e '.[workload,integrations]' --group test --group lint
  echo "$want" > "$stamp"
fi
wait "$go_pid" || { log "error: the Go builds failed (their error is above)"; exit 1; }
if [ -n "$base_pid" ]; then
  wait "$base_pid" || { tail -n 20 "$base_log" >&2; log "error: the image's base did not build (log: $base_log)"; exit 1; }
  rm -f "$base_log"
fi
trap - EXIT
