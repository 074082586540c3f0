#!/usr/bin/env bash
# The main job on a fresh machine: set up, then fine-tune the project's tiny model locally
# (CPU, or a GPU if present), register it in a local MLflow store, and say where everything is.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/setup.sh
exec .venv/bin/kubetune run examples/tiny-local.yaml --local "$@"
