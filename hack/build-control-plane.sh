#!/usr/bin/env bash
# Builds the test control plane (kube-apiserver, kubectl, etcd) and helm from Go modules
# into a cache outside the repository, envtest-style. Reuses what is already built.
#
#   hack/build-control-plane.sh            # prints the assets directory on its last line
#   KUBETUNE_K8S_VERSION=v1.36.3 hack/build-control-plane.sh
#   hack/build-control-plane.sh cluster    # the controllers a real cluster runs (below); prints
#                                          # their own directory on its last line
#   hack/build-control-plane.sh suite      # both, three builds at once (hack/test.sh); prints the
#                                          # assets directory, then the cluster's
#   hack/build-control-plane.sh trainer-v2 # the Kubeflow Trainer v2 controller manager and the
#                                          # JobSet controller (below); prints their directory
#
# The cluster: kube-controller-manager and kube-scheduler (the same release and wrapper module as
# the API server, so they share its build cache), KWOK (fake nodes and pod status), the Kubeflow
# Training Operator v1 (the PyTorchJob controller; v1.9.3, whose PyTorchJob CRD is byte-identical
# to the one kubetune is written against) and Kueue. Each is a plain wrapper module that requires
# the release; KWOK's k8s.io/* modules are raised to the control plane's release so the build cache
# is shared with it. The Training Operator (k8s.io v0.31, controller-runtime v0.19) and Kueue
# (v0.35, controller-runtime v0.23: tried, it does not compile against client-go v0.37) keep their own.
#
# trainer-v2: Kubeflow Trainer v2 (TrainJob, its runtimes; v2.2.0, the release Kueue v0.17.0
# requires: Kueue v0.17 writes spec.runtimePatches, which older TrainJob CRDs drop) and JobSet (the
# controller the TrainJob's children run on; v0.11.1, the release both Trainer v2.2.0 and Kueue
# v0.17.0 require). Each is its own wrapper: JobSet v0.11.1 is written against controller-runtime
# v0.22, whose webhook builder Trainer v2.2's v0.23 changed. Both raise k8s.io/* to Kueue's
# v0.35.3 so that the three share their build cache. Their CRDs and webhook configurations are
# copied from the module cache next to the binaries.
#
# Why a wrapper module: k8s.io/kubernetes replaces its k8s.io/* staging modules with
# ./staging paths, which `go install pkg@version` cannot follow; a wrapper that requires
# the release and replaces each staging module with its published v0.<minor>.<patch> can.
set -euo pipefail

K8S_VERSION="${KUBETUNE_K8S_VERSION:-v1.37.2}"
ETCD_VERSION="${KUBETUNE_ETCD_VERSION:-v3.6.16}"
HELM_VERSION="${KUBETUNE_HELM_VERSION:-v4.3.1}"
KWOK_VERSION="${KUBETUNE_KWOK_VERSION:-v0.8.0}"
TRAINING_OPERATOR_VERSION="${KUBETUNE_TRAINING_OPERATOR_VERSION:-v1.9.3}"
KUEUE_VERSION="${KUBETUNE_KUEUE_VERSION:-v0.17.0}"
TRAINER_VERSION="${KUBETUNE_TRAINER_VERSION:-v2.2.0}"
JOBSET_VERSION="${KUBETUNE_JOBSET_VERSION:-v0.11.1}"
TRAINER_K8S_VERSION="${KUBETUNE_TRAINER_K8S_VERSION:-v0.35.3}"  # k8s.io/* of the Trainer/JobSet wrappers
CACHE="${KUBETUNE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kubetune}"
ASSETS="$CACHE/assets/k8s-${K8S_VERSION}-etcd-${ETCD_VERSION}-helm-${HELM_VERSION}"
export GOWORK=off CGO_ENABLED=0 GOFLAGS=-mod=mod
export GOPATH="${GOPATH:-$HOME/go}"

CLUSTER="$CACHE/assets/cluster-k8s-${K8S_VERSION}-kwok-${KWOK_VERSION}-to-${TRAINING_OPERATOR_VERSION}-kueue-${KUEUE_VERSION}"
TRAINER_V2="$CACHE/assets/trainer-${TRAINER_VERSION}-jobset-${JOBSET_VERSION}-k8s-${TRAINER_K8S_VERSION}"
GOVERSION_LINE="go $(go env GOVERSION | sed -E 's/^go([0-9]+\.[0-9]+).*/\1/')"
mkdir -p "$ASSETS"
log() { echo "[build-control-plane] $*" >&2; }

staging_minor="v0.${K8S_VERSION#v1.}"   # v1.37.2 -> v0.37.2

build_k8s() {
  local work="$CACHE/src/kubernetes-$K8S_VERSION"
  mkdir -p "$work"
  cd "$work"
  if [ -f go.mod ] && ! grep -q kube-scheduler tools.go 2>/dev/null; then
    rm -f go.mod go.sum  # made before the controllers were part of it: made again below
  fi
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
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
    go mod tidy >&2
  fi
  local pkg=k8s.io/component-base/version
  local minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  local ld="-s -w -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  ld="$ld -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
  # every binary asked for that is missing, in one `go build`: the go command compiles their shared
  # packages once and links them side by side
  local dest pkgs=() missing=()
  for dest in "$@"; do
    if [ ! -x "$dest" ]; then
      missing+=("$dest")
      pkgs+=("k8s.io/kubernetes/cmd/$(basename "$dest")")
    fi
  done
  [ "${#missing[@]}" -eq 0 ] && return
  log "building ${pkgs[*]##*/} $K8S_VERSION"
  local tmp="$work/bin.$$"
  rm -rf "$tmp" && mkdir -p "$tmp"
  go build -trimpath -ldflags "$ld" -o "$tmp/" "${pkgs[@]}"
  for dest in "${missing[@]}"; do
    mkdir -p "$(dirname "$dest")"
    mv "$tmp/$(basename "$dest")" "$dest"
  done
  rm -rf "$tmp"
}

# build_wrapper NAME MODULE VERSION PACKAGE [k8s.io modules to raise to the control plane's release,
# or MODULE@VERSION to require that version]; into $OUT (default: the cluster's folder)
build_wrapper() {
  local name="$1" module="$2" version="$3" pkg="$4"; shift 4
  local out="${OUT:-$CLUSTER}"
  [ -x "$out/$name" ] && return
  local work="$CACHE/src/$name-$version"
  mkdir -p "$work"
  cd "$work"
  if [ ! -f go.mod ]; then
    {
      printf 'module kubetune.local/%s\n\n%s\n\nrequire %s %s\n' "$name" "$GOVERSION_LINE" "$module" "$version"
      for m in "$@"; do
        case "$m" in
          *@*) printf 'require %s %s\n' "${m%@*}" "${m#*@}" ;;
          *) printf 'require %s %s\n' "$m" "$staging_minor" ;;
        esac
      done
    } > go.mod
    printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "$pkg" > tools.go
    go mod tidy >&2
  fi
  log "building $name $version"
  go build -trimpath -ldflags "-s -w" -o "$out/$name.tmp" "$pkg"
  mv "$out/$name.tmp" "$out/$name"
}

# What the tests take from the modules' own sources: Kueue's CRDs and webhook configurations, and
# the KWOK Stages that keep fake nodes Ready and mark bound pods Running (pods end, and are
# deleted, through the test's pod runner instead: it runs their commands).
copy_manifests() {
  local mods kueue stage
  mods="$(go env GOMODCACHE)"
  kueue="$mods/sigs.k8s.io/kueue@$KUEUE_VERSION"
  stage="$mods/sigs.k8s.io/kwok@$KWOK_VERSION/kustomize/stage"
  mkdir -p "$CLUSTER/kueue-crds" "$CLUSTER/kwok-stages"
  cp "$kueue"/config/components/crd/bases/*.yaml "$CLUSTER/kueue-crds/"
  cp "$kueue/config/components/webhook/manifests.yaml" "$CLUSTER/kueue-webhooks.yaml"
  cp "$stage/node/fast/node-initialize.yaml" "$stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml" \
    "$stage/pod/fast/pod-ready.yaml" "$CLUSTER/kwok-stages/"
  chmod -R u+w "$CLUSTER/kueue-crds" "$CLUSTER/kwok-stages" "$CLUSTER/kueue-webhooks.yaml"
}

build_cluster() {
  mkdir -p "$CLUSTER"
  build_k8s "$CLUSTER/kube-controller-manager" "$CLUSTER/kube-scheduler"
  build_cluster_wrappers
}

# The cluster's controllers from modules of their own (not the control plane's wrapper)
build_cluster_wrappers() {
  mkdir -p "$CLUSTER"
  local k8s_mods="k8s.io/api k8s.io/apimachinery k8s.io/apiserver k8s.io/client-go k8s.io/component-base"
  # shellcheck disable=SC2086
  build_wrapper kwok sigs.k8s.io/kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok \
    $k8s_mods k8s.io/cri-api k8s.io/cri-client k8s.io/cri-streaming
  build_wrapper training-operator github.com/kubeflow/training-operator "$TRAINING_OPERATOR_VERSION" \
    github.com/kubeflow/training-operator/cmd/training-operator.v1
  build_wrapper kueue sigs.k8s.io/kueue "$KUEUE_VERSION" sigs.k8s.io/kueue/cmd/kueue
  [ -f "$CLUSTER/kueue-webhooks.yaml" ] || copy_manifests
}

# Trainer v2 and JobSet, with what their tests read from the modules' sources: the CRDs, and the
# webhook configurations (JobSet's pod webhooks get their objectSelector from its kustomize patches,
# copied too: without it they would intercept every pod of the cluster).
build_trainer_v2() {
  mkdir -p "$TRAINER_V2"
  local k8s_mods="" m
  for m in api apimachinery apiserver client-go component-base apiextensions-apiserver; do
    k8s_mods="$k8s_mods k8s.io/$m@$TRAINER_K8S_VERSION"
  done
  # shellcheck disable=SC2086
  OUT="$TRAINER_V2" build_wrapper jobset sigs.k8s.io/jobset "$JOBSET_VERSION" sigs.k8s.io/jobset $k8s_mods
  # shellcheck disable=SC2086
  OUT="$TRAINER_V2" build_wrapper trainer-controller-manager github.com/kubeflow/trainer/v2 "$TRAINER_VERSION" \
    github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager $k8s_mods "sigs.k8s.io/jobset@$JOBSET_VERSION"
  [ -f "$TRAINER_V2/jobset-webhooks.yaml" ] && return
  local mods trainer jobset
  mods="$(go env GOMODCACHE)"
  trainer="$mods/github.com/kubeflow/trainer/v2@$TRAINER_VERSION"
  jobset="$mods/sigs.k8s.io/jobset@$JOBSET_VERSION"
  mkdir -p "$TRAINER_V2/trainer-crds" "$TRAINER_V2/jobset-crds" "$TRAINER_V2/jobset-webhook-patches"
  cp "$trainer"/manifests/base/crds/trainer.kubeflow.org_*.yaml "$TRAINER_V2/trainer-crds/"
  cp "$trainer/manifests/base/webhook/manifests.yaml" "$TRAINER_V2/trainer-webhooks.yaml"
  cp "$jobset"/config/components/crd/bases/*.yaml "$TRAINER_V2/jobset-crds/"
  cp "$jobset"/config/components/webhook/patches/*.yaml "$TRAINER_V2/jobset-webhook-patches/"
  cp "$jobset/config/components/webhook/manifests.yaml" "$TRAINER_V2/jobset-webhooks.tmp"
  chmod -R u+w "$TRAINER_V2"
  mv "$TRAINER_V2/jobset-webhooks.tmp" "$TRAINER_V2/jobset-webhooks.yaml"
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

# suite: what hack/test.sh needs (the control plane and the cluster), as three builds at once: etcd
# and helm; the four Kubernetes binaries in one go build; KWOK, the Training Operator and Kueue. A
# build waits on downloads and on single-threaded links; side by side the others use the cores.
build_suite() {
  local pids=() pid failed=0
  ( build_etcd; build_helm ) & pids+=($!)
  ( build_k8s "$ASSETS/kube-apiserver" "$ASSETS/kubectl" "$CLUSTER/kube-controller-manager" \
      "$CLUSTER/kube-scheduler" ) & pids+=($!)
  ( build_cluster_wrappers ) & pids+=($!)
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  if [ "$failed" -ne 0 ]; then
    log "a build failed (its output is above)"
    exit 1
  fi
}

what="${*:-all}"
case "$what" in
  all) build_etcd; build_k8s "$ASSETS/kube-apiserver" "$ASSETS/kubectl"; build_helm ;;
  cluster) build_cluster; echo "$CLUSTER"; exit 0 ;;
  suite) build_suite; echo "$ASSETS"; echo "$CLUSTER"; exit 0 ;;
  trainer-v2) build_trainer_v2; echo "$TRAINER_V2"; exit 0 ;;
  *) for w in $what; do case "$w" in
       etcd) build_etcd ;; helm) build_helm ;; *) build_k8s "$ASSETS/$w" ;;
     esac; done ;;
esac
echo "$ASSETS"
