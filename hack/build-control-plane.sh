#!/usr/bin/env bash
# Builds the test control plane (kube-apiserver, kubectl, etcd) and helm from Go modules
# into a cache outside the repository, envtest-style. Reuses what is already built.
#
#   hack/build-control-plane.sh            # prints the assets directory on its last line
#   KUBETUNE_K8S_VERSION=v1.36.3 hack/build-control-plane.sh
#
# Why a wrapper module: k8s.io/kubernetes replaces its k8s.io/* staging modules with
# ./staging paths, which `go install pkg@version` cannot follow; a wrapper that requires
# the release and replaces each staging module with its published v0.<minor>.<patch> can.
set -euo pipefail

K8S_VERSION="${KUBETUNE_K8S_VERSION:-v1.37.2}"
ETCD_VERSION="${KUBETUNE_ETCD_VERSION:-v3.6.16}"
HELM_VERSION="${KUBETUNE_HELM_VERSION:-v4.3.1}"
CACHE="${KUBETUNE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kubetune}"
ASSETS="$CACHE/assets/k8s-${K8S_VERSION}-etcd-${ETCD_VERSION}-helm-${HELM_VERSION}"
export GOWORK=off CGO_ENABLED=0 GOFLAGS=-mod=mod
export GOPATH="${GOPATH:-$HOME/go}"

mkdir -p "$ASSETS"
log() { echo "[build-control-plane] $*" >&2; }

staging_minor="v0.${K8S_VERSION#v1.}"   # v1.37.2 -> v0.37.2

build_k8s() {
  local work="$CACHE/src/kubernetes-$K8S_VERSION"
  mkdir -p "$work"
  cd "$work"
  if [ ! -f go.mod ]; then
    local gomod
    gomod=$(cd "$work" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
    {
      echo "module kubetune.local/controlplane"
      echo
      echo "go $(go env GOVERSION | sed -E 's/^go([0-9]+\.[0-9]+).*/\1/')"
      echo
      echo "require k8s.io/kubernetes $K8S_VERSION"
      echo
      # every "k8s.io/X => ./staging/src/k8s.io/X" becomes "k8s.io/X => k8s.io/X v0.<minor>.<patch>"
      grep -E '^\s*k8s\.io/[A-Za-z0-9._-]+ => \./staging/' "$gomod" \
        | awk -v v="$staging_minor" '{print "replace " $1 " => " $1 " " v}'
    } > go.mod
    cat > tools.go <<GO
//go:build tools

package controlplane

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
    go mod tidy >&2
  fi
  local pkg=k8s.io/component-base/version
  local minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  local ld="-s -w -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  ld="$ld -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
  for cmd in "$@"; do
    if [ ! -x "$ASSETS/$cmd" ]; then
      log "building $cmd $K8S_VERSION"
      go build -trimpath -ldflags "$ld" -o "$ASSETS/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd"
      mv "$ASSETS/$cmd.tmp" "$ASSETS/$cmd"
    fi
  done
}

build_etcd() {
  [ -x "$ASSETS/etcd" ] && return
  local work="$CACHE/src/etcd-$ETCD_VERSION"
  mkdir -p "$work"
  cd "$work"
  if [ ! -f go.mod ]; then
    printf 'module kubetune.local/etcd\n\ngo %s\n\nrequire go.etcd.io/etcd/server/v3 %s\n' \
      "$(go env GOVERSION | sed -E 's/^go([0-9]+\.[0-9]+).*/\1/')" "$ETCD_VERSION" > go.mod
    cat > main.go <<GO
// Command etcd is etcd's own server main, built from the go.etcd.io/etcd/server/v3 module.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
    go mod tidy >&2
  fi
  log "building etcd $ETCD_VERSION"
  go build -trimpath -ldflags "-s -w" -o "$ASSETS/etcd.tmp" .
  mv "$ASSETS/etcd.tmp" "$ASSETS/etcd"
}

build_helm() {
  [ -x "$ASSETS/helm" ] && return
  log "building helm $HELM_VERSION"
  local bin="$CACHE/src/helm-$HELM_VERSION"
  mkdir -p "$bin"
  GOBIN="$bin" go install -trimpath -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" "helm.sh/helm/v4/cmd/helm@$HELM_VERSION"
  mv "$bin/helm" "$ASSETS/helm"
}

what="${*:-all}"
case "$what" in
  all) build_etcd; build_k8s kube-apiserver kubectl; build_helm ;;
  *) for w in $what; do case "$w" in
       etcd) build_etcd ;; helm) build_helm ;; *) build_k8s "$w" ;;
     esac; done ;;
esac
echo "$ASSETS"
