#!/usr/bin/env bash
# Build the lab's real Kubernetes control plane once per machine: etcd, kube-apiserver,
# kube-controller-manager (from this folder's go.mod) and helm (its own `go install`, so that its
# version selection does not move the Kubernetes dependencies). The binaries go to a cache outside the
# repository keyed by the versions in versions.env; a later run with the same versions reuses them.
# Prints the directory holding the binaries on its last line of stdout. Progress goes to stderr.
#   AUTOHEAL_KUBE_TOOLS_CACHE  the cache root (default ~/.cache/autoheal/kube-tools)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=/dev/null
. "$here/versions.env"
command -v go >/dev/null 2>&1 || {
  echo "kube-tools: Go is not installed: install Go 1.26 or newer (and reach the Go module proxy) to build the control plane" >&2
  exit 3
}
key="k8s-${KUBERNETES_VERSION}_etcd-${ETCD_VERSION}_helm-${HELM_VERSION}"
bin="${AUTOHEAL_KUBE_TOOLS_CACHE:-$HOME/.cache/autoheal/kube-tools}/$key/bin"
want="etcd kube-apiserver kube-controller-manager helm"
have_all=1
for b in $want; do [ -x "$bin/$b" ] || have_all=0; done
if [ "$have_all" = 1 ]; then echo "$bin"; exit 0; fi

mkdir -p "$bin"
# one build at a time per machine: a second caller (another worktree's tests, ./dev) waits for the first
# instead of compiling the same binaries into the same bin.partial (seen: three kube-apiserver builds at
# once on 2 cores, each overwriting the others' output)
exec 9>"$bin.lock"
if ! flock -n 9; then
  echo "kube-tools: another build of these binaries is running; waiting for it" >&2
  flock 9
fi
have_all=1
for b in $want; do [ -x "$bin/$b" ] || have_all=0; done
if [ "$have_all" = 1 ]; then echo "$bin"; exit 0; fi
tmp="$bin.partial"
mkdir -p "$tmp"
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false
major=${KUBERNETES_VERSION#v}; major=${major%%.*}
minor=${KUBERNETES_VERSION#v*.}; minor=${minor%%.*}
stamp=$(date -u +%Y-%m-%dT%H:%M:%SZ)
kver=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kver="$kver -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  kver="$kver -X $pkg.gitTreeState=clean -X $pkg.buildDate=$stamp"
done
echo "kube-tools: building the lab's Kubernetes control plane once for this machine into $bin" >&2
echo "kube-tools: (a cold build on 2 cores takes many minutes; later runs reuse it)" >&2
build() {  # name, then the go command's arguments
  local name=$1 start=$SECONDS
  shift
  [ -x "$bin/$name" ] && { echo "kube-tools: $name already built" >&2; return 0; }
  echo "kube-tools: building $name ..." >&2
  "$@"
  mv "$tmp/$name" "$bin/$name"
  echo "kube-tools: $name built in $((SECONDS - start)) s" >&2
}
cd "$here"
tags="selinux,notest,grpcnotrace"
build etcd go build -o "$tmp/etcd" -trimpath -tags "$tags" go.etcd.io/etcd/server/v3
build kube-apiserver go build -o "$tmp/kube-apiserver" -trimpath -tags "$tags" -ldflags "-s -w $kver" \
  k8s.io/kubernetes/cmd/kube-apiserver
build kube-controller-manager go build -o "$tmp/kube-controller-manager" -trimpath -tags "$tags" \
  -ldflags "-s -w $kver" k8s.io/kubernetes/cmd/kube-controller-manager
# helm outside this module (from a neutral directory), so this go.mod does not take part
(cd "$tmp" && build helm env GOBIN="$tmp" go install -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
  "helm.sh/helm/v3/cmd/helm@$HELM_VERSION")
rmdir "$tmp" 2>/dev/null || true
echo "$bin"
