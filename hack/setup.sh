#!/usr/bin/env bash
# Installs what kubetune needs on a fresh machine: uv, then the locked Python environment (.venv).
# Idempotent and quick when everything is already there (uv's cache lives outside the repository).
set -euo pipefail
cd "$(dirname "$0")/.."
UV_VERSION=0.13.8
# uv of that version: the one on PATH (or pipx's), else one fetched once from PyPI into
# ~/.cache/kubetune/uv-$UV_VERSION (sha256-checked). No pip: a Python that refuses system-wide
# installs (PEP 668, Debian 12, Ubuntu 24.04) and has no venv module is enough.
uv=$(python3 hack/bootstrap_uv.py "$UV_VERSION")
# Everything from uv.lock, exactly (the one lock for what CI installs), compiled to bytecode: uv
# installs none, and where PYTHONDONTWRITEBYTECODE is set (CI, this project's machines) Python never
# writes it, so every process compiled torch, transformers, TRL and MLflow from source again: a tiny
# training took about twice the CPU (docs/contributing.md, "Where the CPU goes"). Once for a new
# environment (about a minute of CPU on two cores), then under 2 s when nothing changed.
"$uv" sync --frozen --all-extras --quiet --compile-bytecode
