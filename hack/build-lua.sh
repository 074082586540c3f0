#!/usr/bin/env bash
# Builds hack/lua (luahealth: an Argo CD health script run in gopher-lua with Argo CD's sandbox)
# into a cache outside the repository. Reuses what is already built.
#
#   hack/build-lua.sh      # prints the binary's path on its last line
#
# The gopher-lua version is pinned in hack/lua/go.mod (the one Argo CD's current release builds
# with); the cache folder is named after it and after a hash of hack/lua's sources, so an edit to
# main.go or a new pin builds anew. Needs only the Go toolchain (and the module proxy the first time).
set -euo pipefail

SRC="$(cd "$(dirname "$0")/lua" && pwd)"
CACHE="${KUBETUNE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kubetune}"
GOPHER_LUA_VERSION=$(awk '$1 == "require" && $2 == "github.com/yuin/gopher-lua" {print $3}' "$SRC/go.mod")
if [ -z "$GOPHER_LUA_VERSION" ]; then
  echo "[build-lua] hack/lua/go.mod does not require github.com/yuin/gopher-lua" >&2
  exit 1
fi
SOURCES_HASH=$(cat "$SRC/go.mod" "$SRC/go.sum" "$SRC/main.go" | sha256sum | cut -c1-12)
ASSETS="$CACHE/assets/luahealth-gopher-lua-${GOPHER_LUA_VERSION}-${SOURCES_HASH}"
BIN="$ASSETS/luahealth"
export GOWORK=off CGO_ENABLED=0 GOFLAGS=-mod=readonly
export GOPATH="${GOPATH:-$HOME/go}"

if [ ! -x "$BIN" ]; then
  echo "[build-lua] building luahealth with gopher-lua $GOPHER_LUA_VERSION into $ASSETS" >&2
  mkdir -p "$ASSETS"
  # a build of its own name, then renamed: one cut short never leaves a binary that looks finished,
  # and two test processes building at once do not write the same file
  (cd "$SRC" && go build -trimpath -ldflags "-s -w" -o "$BIN.$$" .)
  mv -f "$BIN.$$" "$BIN"
fi
echo "$BIN"
