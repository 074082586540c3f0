"""Argo CD's Lua sandbox for tests: ``luahealth`` (``hack/lua``) runs a health script in gopher-lua, the
Lua VM Argo CD embeds, with the libraries Argo CD opens (or all of them: ``open_libs``, which is
``resource.customizations.useOpenLibs.<group>_<kind>: "true"``), the object converted as Argo CD
converts it. Built from its Go module by ``hack/build-lua.sh`` into a cache outside the repository.
"""

from __future__ import annotations

import functools
import json
import math
import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


class LuaError(Exception):
    """The script raised a Lua error (or returned something Argo CD refuses); the message is Argo CD's."""


@functools.cache
def find_luahealth() -> Path:
    """The luahealth binary, building it when needed (hack/build-lua.sh reuses a finished build)."""
    build = subprocess.run(
        [str(REPO / "hack" / "build-lua.sh")], check=True, stdout=subprocess.PIPE, text=True
    )
    return Path(build.stdout.strip().splitlines()[-1])


def _has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_has_non_finite(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_non_finite(v) for v in value)
    return False


def run_health(script: Path, obj: Any, *, open_libs: bool = False) -> dict[str, str]:
    """Argo CD's verdict on ``obj``: ``{"status", "message"}``; LuaError when the script fails.

    A NaN or infinite float in ``obj`` (which no API server serves) is passed with ``--allow-nan``;
    everything else is plain JSON, read as Argo CD reads the API server's.
    """
    args = [str(find_luahealth())]
    if open_libs:
        args.append("--open-libs")
    if _has_non_finite(obj):
        args.append("--allow-nan")
    args.append(str(script))
    result = subprocess.run(
        args, input=json.dumps(obj), capture_output=True, text=True, timeout=30, check=False
    )
    if result.returncode != 0:
        raise LuaError(result.stderr.strip())
    out: dict[str, str] = json.loads(result.stdout)
    return out
