#!/usr/bin/env bash
# Installs what kubetune needs on a fresh machine: uv, then the locked Python environment (.venv).
# Idempotent and quick when everything is already there (uv's cache lives outside the repository).
set -euo pipefail
cd "$(dirname "$0")/.."
UV_VERSION=0.13.8
if ! command -v uv >/dev/null 2>&1 || [ "$(uv --version | awk '{print $2}')" != "$UV_VERSION" ]; then
  python3 -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION"
fi
# Everything from uv.lock, exactly (the one lock for what CI installs).
uv sync --frozen --all-extras --quiet
