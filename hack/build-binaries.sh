#!/usr/bin/env bash
# Build the real Kubernetes binaries ROSE's local cluster runs, from their Go modules,
# at pinned versions, into a cache outside the repository keyed by version.
#
#   hack/build-binaries.sh            # build what is missing, print the bin dir
#   ROSE_K8S_VERSION=v1.37.2 ...      # override a pinned version
#
# Cache layout: $ROSE_CACHE_DIR/bin/<component>-<version>/<binary> plus a .sha256 stamp.
# An entry whose stamp does not match its binary is treated as corrupt and rebuilt.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/versions.env
source "$HERE/versions.env"

K8S_VERSION="${ROSE_K8S_VERSION:-$K8S_VERSION}"
ETCD_VERSION="${ROSE_ETCD_VERSION:-$ETCD_VERSION}"
KWOK_VERSION="${ROSE_KWOK_VERSION:-$KWOK_VERSION}"
MINIO_VERSION="${ROSE_MINIO_VERSION:-$MINIO_VERSION}"
HELM_VERSION="${ROSE_HELM_VERSION:-$HELM_VERSION}"
CACHE="${ROSE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rose}"
# -trimpath here and -ldflags "-s -w" on every go build: no DWARF or symbol table to write, which
# is most of a link (etcd's link on a loaded 2-core machine: 10.1 s with them, 6.8 s without);
# cached entries built before the flag stay valid (same sources, same behaviour).
export GOFLAGS="${GOFLAGS:--buildvcs=false} -trimpath"
export CGO_ENABLED=0
export GOPROXY="${GOPROXY:-https://proxy.golang.org,direct}"

log() { printf '[build-binaries %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'build-binaries: error: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null 2>&1 || die "no Go toolchain on PATH. Install Go >= 1.26 (https://go.dev/doc/install) or put it on PATH, then re-run."

semver_re='^v[0-9]+\.[0-9]+\.[0-9]+$'
for pair in "K8S_VERSION=$K8S_VERSION" "ETCD_VERSION=$ETCD_VERSION" "KWOK_VERSION=$KWOK_VERSION" "HELM_VERSION=$HELM_VERSION"; do
  [[ "${pair#*=}" =~ $semver_re ]] || die "${pair%%=*} '${pair#*=}' is not a version like v1.37.2"
done

# MinIO tags releases RELEASE.<date>, not semver: it is pinned by its Go pseudo-version.
[[ "$MINIO_VERSION" =~ ^v0\.0\.0-[0-9]{14}-[0-9a-f]{12}$ ]] \
  || die "MINIO_VERSION '$MINIO_VERSION' is not a Go pseudo-version like v0.0.0-20260212201848-7aac2a2c5b7c (see: go list -m github.com/minio/minio@latest)"

# k8s.io/kubernetes v1.X.Y pairs with staging modules v0.X.Y
STAGING_VERSION="v0.${K8S_VERSION#v1.}"

stamp_ok() { # dir binary...   ($BUILD_KEY, when set, must match the entry's .build-key)
  local dir="$1"; shift
  [ -f "$dir/.sha256" ] || return 1
  if [ -n "${BUILD_KEY:-}" ] && [ "$(cat "$dir/.build-key" 2>/dev/null)" != "$BUILD_KEY" ]; then return 1; fi
  (cd "$dir" && sha256sum --quiet -c .sha256 >/dev/null 2>&1) || return 1
  for b in "$@"; do [ -f "$dir/$b" ] || return 1; done
}

write_stamp() { # dir binary...
  local dir="$1"; shift
  (cd "$dir" && sha256sum "$@" > .sha256.tmp && mv .sha256.tmp .sha256)
}

check_module_version() { # module version
  if ! go list -m -json "$1@$2" >/dev/null 2>&1; then
    local avail
    avail=$(go list -m -versions "$1" 2>/dev/null | tr ' ' '\n' | tail -n 6 | tr '\n' ' ')
    die "unknown version $2 of $1. Available recent versions: ${avail:-none found (is the Go module proxy reachable?)}"
  fi
}

build_one() { # name version binaries... -- go-build-args...
  local name="$1" version="$2"; shift 2
  local bins=() ; while [ "$1" != "--" ]; do bins+=("$1"); shift; done; shift
  local dir="$CACHE/bin/$name-$version"
  if stamp_ok "$dir" "${bins[@]}"; then
    log "$name $version: cached in $dir"
    return 0
  fi
  if [ -d "$dir" ]; then log "$name $version: cache entry incomplete, corrupt or built with other flags, rebuilding"; fi
  # the old entry stays usable until the new one replaces it (other checkouts may be running it)
  local work="$CACHE/src/$name-$version"
  rm -rf "$work" "$dir.tmp"; mkdir -p "$work" "$dir.tmp"
  PROGRESS_NAME="$name $version" "$@" "$work" "$dir.tmp"
  write_stamp "$dir.tmp" "${bins[@]}"
  if [ -n "${BUILD_KEY:-}" ]; then printf '%s\n' "$BUILD_KEY" > "$dir.tmp/.build-key"; fi
  rm -rf "$dir"; mv "$dir.tmp" "$dir"
  log "$name $version: built into $dir"
}

go_mod_init() { # workdir
  (cd "$1" && go mod init rose.local/build >/dev/null 2>&1)
}

write_tools_go() { # workdir pkg...
  local work="$1"; shift
  { echo "//go:build tools"; echo "package tools"; echo "import ("
    for p in "$@"; do echo "  _ \"$p\""; done; echo ")"; } > "$work/tools.go"
}

simple_module_build() { # name module version out work pkg=>binary...
  local name="$1" module="$2" version="$3" work="$4" out="$5"; shift 5
  go_mod_init "$work"
  local pkgs=() pb
  for pb in "$@"; do pkgs+=("${pb%%=>*}"); done
  write_tools_go "$work" "${pkgs[@]}"
  log "$name $version: resolving modules"
  (cd "$work" && go get "$module@$version" >&2 && go mod tidy >&2)
  for pb in "$@"; do
    log "$name $version: compiling ${pb##*=>}"
    (cd "$work" && go build -v -ldflags "-s -w" -o "$out/${pb##*=>}" "${pb%%=>*}" 2>&1 | progress)
  done
}

do_etcd() { simple_module_build etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION" "$1" "$2" "go.etcd.io/etcd/server/v3=>etcd"; }
do_kwok() {
  simple_module_build kwok sigs.k8s.io/kwok "$KWOK_VERSION" "$1" "$2" "sigs.k8s.io/kwok/cmd/kwok=>kwok"
  # kwok needs Stage objects in its config; take the "fast" node/pod stages and the lease
  # heartbeat from the same pinned module, so they always match the binary.
  local st; st="$(go env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK_VERSION/kustomize/stage"
  { for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
             pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
      echo "---"; cat "$st/$f"; done; } > "$2/kwok-stages.yaml"
}

# The S3-compatible server the checkpoint tests run against (local_cluster/s3.py).
do_minio() { simple_module_build minio github.com/minio/minio "$MINIO_VERSION" "$1" "$2" "github.com/minio/minio=>minio"; }

# helm (charts/rose: lint, template, the chart's e2e install), with the version stamp its release sets.
do_helm() { local work="$1" out="$2" major="${HELM_VERSION%%.*}"
  local mod="helm.sh/helm/$major"
  go_mod_init "$work"
  write_tools_go "$work" "$mod/cmd/helm"
  log "helm $HELM_VERSION: resolving modules"
  (cd "$work" && go get "$mod@$HELM_VERSION" >&2 && go mod tidy >&2)
  log "helm $HELM_VERSION: compiling helm (cold: several minutes on 2 cores)"
  (cd "$work" && go build -v -ldflags "-s -w -X $mod/internal/version.version=$HELM_VERSION" \
      -o "$out/helm" "$mod/cmd/helm" 2>&1 | progress)
}

do_k8s() { local work="$1" out="$2"
  go_mod_init "$work"
  local modfile
  modfile="$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/$K8S_VERSION.mod"
  [ -f "$modfile" ] || (cd "$work" && go mod download k8s.io/kubernetes@"$K8S_VERSION")
  # Every staging module the release's own go.mod points at ./staging gets the matching v0.X.Y.
  local replaces
  replaces=$(grep -E '=> \./staging/' "$modfile" | awk '{print $1}' | sort -u)
  [ -n "$replaces" ] || die "could not read the staging modules from $modfile"
  {
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo "replace ("
    for m in $replaces; do echo "  $m => $m $STAGING_VERSION"; done
    echo ")"
  } >> "$work/go.mod"
  log "kubernetes $K8S_VERSION: resolving modules ($(echo "$replaces" | wc -l) staging replaces at $STAGING_VERSION)"
  write_tools_go "$work" k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler
  (cd "$work" && go mod tidy >&2)
  log "kubernetes $K8S_VERSION: compiling kube-apiserver, kube-controller-manager, kube-scheduler (cold: many minutes on 2 cores)"
  (cd "$work" && go build -v -ldflags "$(k8s_ldflags)" -o "$out/" k8s.io/kubernetes/cmd/kube-apiserver \
      k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler 2>&1 | progress)
}

# The version stamp the Kubernetes release build sets (hack/lib/version.sh, kube::version::ldflags):
# without it /version reports v0.0.0-master. The module zip carries no git commit, so gitCommit stays
# unset; buildDate is the release's module time, so the binaries stay reproducible.
k8s_ldflags() {
  local v="${K8S_VERSION#v}" date info
  info="$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/$K8S_VERSION.info"
  date=$(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "$info" 2>/dev/null || true)
  local kv out="-s -w" pkg
  for kv in "gitVersion=$K8S_VERSION" "gitMajor=${v%%.*}" "gitMinor=$(echo "$v" | cut -d. -f2)" \
            "gitTreeState=clean" "buildDate=${date:-1970-01-01T00:00:00Z}"; do
    for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do out+=" -X $pkg.$kv"; done
  done
  echo "$out"
}

# go build -v prints each package as it is compiled: show a running count, not the flood.
progress() {
  local n=0 line what="${PROGRESS_NAME:-}"
  while IFS= read -r line; do
    case "$line" in
      *.go:*|'#'*|go:*|*' '*) printf '%s\n' "$line" >&2 ;;  # compiler messages, not package names
      *) n=$((n+1)); if (( n % 100 == 0 )); then log "$what: ... $n packages compiled"; fi ;;
    esac
  done
  log "$what: ... $n packages compiled"
  return 0
}

# ---- the real node (opt-in: `hack/build-binaries.sh real-node`; local_cluster/realnode.py) ----
# kubelet from the same k8s.io/kubernetes module and Go build cache as the control plane;
# containerd 2.x (+ its runc shim and ctr) from its Go module, cgo off (no btrfs/zfs/devmapper);
# a static pause binary (the sandbox image's only file) compiled from the C source below.
# runc comes from Debian (hack/setup.sh). Paths land in $CACHE/bin/realnode.env.
do_kubelet() { local work="$1" out="$2"
  cp "$CACHE/src/kubernetes-$K8S_VERSION/go.mod" "$work/" 2>/dev/null || die "build the control plane first (hack/build-binaries.sh): kubelet reuses its module setup"
  cp "$CACHE/src/kubernetes-$K8S_VERSION/go.sum" "$work/"
  write_tools_go "$work" k8s.io/kubernetes/cmd/kubelet
  (cd "$work" && go mod tidy >&2)
  log "kubelet $K8S_VERSION: compiling (shares the control plane's Go build cache)"
  # the version stamp of a release build (hack/lib/version.sh), so the Node reports v1.X.Y
  local v="${K8S_VERSION#v}" ld="-s -w" pkg kv
  for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    for kv in "gitVersion=$K8S_VERSION" "gitMajor=${v%%.*}" "gitMinor=$(echo "$v" | cut -d. -f2)" "gitTreeState=clean"; do
      ld+=" -X $pkg.$kv"; done; done
  (cd "$work" && go build -v -ldflags "$ld" -o "$out/kubelet" k8s.io/kubernetes/cmd/kubelet 2>&1 | progress)
}
do_containerd() {
  GOFLAGS="$GOFLAGS -tags=no_btrfs,no_zfs,no_devmapper,no_aufs" simple_module_build containerd \
    github.com/containerd/containerd/v2 "$CONTAINERD_VERSION" "$1" "$2" \
    "github.com/containerd/containerd/v2/cmd/containerd=>containerd" \
    "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2=>containerd-shim-runc-v2" \
    "github.com/containerd/containerd/v2/cmd/ctr=>ctr"
}
do_pause() { local work="$1" out="$2"
  command -v gcc >/dev/null 2>&1 || die "no gcc: apt-get install gcc libc6-dev (the pause binary is static C)"
  cat > "$work/pause.c" <<'C'
/* The sandbox's PID 1: sleep until SIGINT/SIGTERM, reap orphans (as registry.k8s.io/pause). */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
static void quit(int s) { (void)s; _exit(0); }
static void reap(int s) { (void)s; while (waitpid(-1, NULL, WNOHANG) > 0) {} }
int main(void) {
  struct sigaction q = {.sa_handler = quit}, r = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
  sigaction(SIGINT, &q, NULL); sigaction(SIGTERM, &q, NULL); sigaction(SIGCHLD, &r, NULL);
  for (;;) pause();
}
C
  gcc -static -Os -s -o "$out/pause" "$work/pause.c"
}
real_node_env() {
  cat > "$CACHE/bin/realnode.env" <<ENV
ROSE_KUBELET_BIN=$CACHE/bin/kubelet-$K8S_VERSION/kubelet
ROSE_CONTAINERD_DIR=$CACHE/bin/containerd-$CONTAINERD_VERSION
ROSE_PAUSE_BIN=$CACHE/bin/pause-$PAUSE_VERSION/pause
ROSE_PAUSE_VERSION=$PAUSE_VERSION
ROSE_RUNC_BIN=$(command -v runc)
ENV
}
CONTAINERD_VERSION="${ROSE_CONTAINERD_VERSION:-$CONTAINERD_VERSION}"

set -o pipefail
mkdir -p "$CACHE/bin"
# Two lanes at once: Kubernetes (and the kubelet, which reuses its module setup) in one, every
# other component in the other. Go compiles a module's packages in parallel already, but a build
# also spends long single-threaded stretches (module download, go mod tidy, linking), and the
# other lane fills them: cold, on 2 cores, the two lanes finish well before the sum of the builds.
lane_kubernetes() {
  BUILD_KEY="ldflags-v1 $K8S_VERSION" build_one kubernetes "$K8S_VERSION" kube-apiserver kube-controller-manager kube-scheduler -- do_k8s
  if [ "${1:-}" = real-node ]; then build_one kubelet "$K8S_VERSION" kubelet -- do_kubelet; fi
}
lane_others() {
  build_one etcd "$ETCD_VERSION" etcd -- do_etcd
  build_one kwok "$KWOK_VERSION" kwok kwok-stages.yaml -- do_kwok
  build_one helm "$HELM_VERSION" helm -- do_helm
  build_one minio "$MINIO_VERSION" minio -- do_minio
  if [ "${1:-}" = real-node ]; then
    build_one containerd "$CONTAINERD_VERSION" containerd containerd-shim-runc-v2 ctr -- do_containerd
    build_one pause "$PAUSE_VERSION" pause -- do_pause
  fi
}
if [ "${1:-}" = real-node ]; then
  [[ "$CONTAINERD_VERSION" =~ ^v2\.[0-9]+\.[0-9]+$ ]] || die "CONTAINERD_VERSION '$CONTAINERD_VERSION' is not a 2.x version like v2.2.1"
  command -v runc >/dev/null 2>&1 || die "no runc: apt-get install runc (or run hack/setup.sh)"
fi
# A version the module proxy does not know is refused before either lane starts building.
needs_check() { # name version module binaries...   (checked only where the cache lacks the entry)
  local name="$1" version="$2" module="$3"; shift 3
  stamp_ok "$CACHE/bin/$name-$version" "$@" || check_module_version "$module" "$version"
}
BUILD_KEY="ldflags-v1 $K8S_VERSION" needs_check kubernetes "$K8S_VERSION" k8s.io/kubernetes kube-apiserver kube-controller-manager kube-scheduler
needs_check etcd "$ETCD_VERSION" go.etcd.io/etcd/server/v3 etcd
needs_check kwok "$KWOK_VERSION" sigs.k8s.io/kwok kwok kwok-stages.yaml
needs_check helm "$HELM_VERSION" "helm.sh/helm/${HELM_VERSION%%.*}" helm
needs_check minio "$MINIO_VERSION" github.com/minio/minio minio
if [ "${1:-}" = real-node ]; then
  needs_check containerd "$CONTAINERD_VERSION" github.com/containerd/containerd/v2 containerd containerd-shim-runc-v2 ctr
fi

kill_tree() { local c; for c in $(pgrep -P "$1" 2>/dev/null); do kill_tree "$c"; done; kill "$1" 2>/dev/null || true; }
( lane_kubernetes "${1:-}" ) & k8s_lane=$!
( lane_others "${1:-}" ) & other_lane=$!
lanes=("$k8s_lane" "$other_lane")
while [ ${#lanes[@]} -gt 0 ]; do
  set +e; wait -n -p finished "${lanes[@]}"; rc=$?; set -e
  if [ "$rc" -ne 0 ]; then  # one lane failed: stop the other, so nothing keeps building unseen
    for p in "${lanes[@]}"; do [ "$p" = "$finished" ] || kill_tree "$p"; done
    lane=kubernetes; [ "$finished" = "$k8s_lane" ] || lane="etcd/kwok/helm/minio/containerd"
    die "the $lane build failed (exit $rc; its error is above)"
  fi
  rest=(); for p in "${lanes[@]}"; do [ "$p" = "$finished" ] || rest+=("$p"); done
  lanes=("${rest[@]+"${rest[@]}"}")
done

cat > "$CACHE/bin/current.env" <<ENV
ROSE_ETCD_BIN=$CACHE/bin/etcd-$ETCD_VERSION/etcd
ROSE_KWOK_BIN=$CACHE/bin/kwok-$KWOK_VERSION/kwok
ROSE_KWOK_STAGES=$CACHE/bin/kwok-$KWOK_VERSION/kwok-stages.yaml
ROSE_HELM_BIN=$CACHE/bin/helm-$HELM_VERSION/helm
ROSE_KUBE_APISERVER_BIN=$CACHE/bin/kubernetes-$K8S_VERSION/kube-apiserver
ROSE_KUBE_CONTROLLER_MANAGER_BIN=$CACHE/bin/kubernetes-$K8S_VERSION/kube-controller-manager
ROSE_KUBE_SCHEDULER_BIN=$CACHE/bin/kubernetes-$K8S_VERSION/kube-scheduler
ROSE_MINIO_BIN=$CACHE/bin/minio-$MINIO_VERSION/minio
ENV
if [ "${1:-}" = real-node ]; then real_node_env; fi
echo "$CACHE/bin"
