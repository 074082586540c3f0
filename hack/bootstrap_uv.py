"""Find or fetch uv of one version, without pip and without touching the system Python.

    python3 hack/bootstrap_uv.py 0.13.8      # prints the path of a uv of that version

hack/setup.sh runs this first, so the first command on a fresh machine needs only Python 3.11+,
even one that refuses `pip install` outside a virtual environment (PEP 668: Debian 12, Ubuntu 24.04)
and has no `venv` module. Standard library only. In order:

1. `uv` on PATH, or pipx's (`~/.local/bin/uv`), when it is that version;
2. the copy fetched before, in `${KUBETUNE_CACHE:-~/.cache/kubetune}/uv-<version>/`;
3. else uv's own wheel for this platform from the package index (`KUBETUNE_PYPI_URL`, else
   `UV_DEFAULT_INDEX`, `UV_INDEX_URL`, `PIP_INDEX_URL`, else https://pypi.org/simple/; its simple API,
   JSON or HTML), checked against the sha256 the index gives, then its `uv` and `uvx` unpacked into
   that folder. A wheel is a zip file: nothing is installed, nothing runs but the unpacked `uv`.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

PYPI = "https://pypi.org/simple/"


class BootstrapError(Exception):
    pass


def version_of(uv: str | Path) -> str | None:
    """The version a uv binary reports (`uv 0.13.8 (...)`), or None when it does not run."""
    try:
        out = subprocess.run([str(uv), "--version"], capture_output=True, text=True, timeout=60, check=False)
    except OSError:
        return None
    words = out.stdout.split()
    return words[1] if out.returncode == 0 and len(words) >= 2 and words[0] == "uv" else None


def cache_dir(version: str) -> Path:
    base = os.environ.get("KUBETUNE_CACHE") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "kubetune"
    )
    return Path(base) / f"uv-{version}"


def index_url() -> str:
    for name in ("KUBETUNE_PYPI_URL", "UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL"):
        if os.environ.get(name):
            return os.environ[name]
    return PYPI


def this_platform() -> tuple[str, tuple[int, int], str]:
    """(wheel platform family, the newest version of it this machine runs, architecture)."""
    machine = platform.machine().lower()
    if sys.platform == "darwin":
        major, minor = ([*map(int, platform.mac_ver()[0].split(".")), 0])[:2]
        return "macosx", (major, minor), "arm64" if machine == "arm64" else "x86_64"
    if not sys.platform.startswith("linux"):
        raise BootstrapError(f"no uv wheel for {sys.platform} here: put uv on PATH yourself")
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    libc, libc_version = platform.libc_ver()
    if libc == "glibc":
        major, minor = map(int, libc_version.split(".")[:2])
        return "manylinux", (major, minor), arch
    return "musllinux", (1, 2), arch


def runs_here(filename: str, version: str, want: tuple[str, tuple[int, int], str]) -> bool:
    """Whether the wheel `uv-<version>-py3-none-<platform tags>.whl` runs on this machine."""
    prefix = f"uv-{version}-py3-none-"
    if not (filename.startswith(prefix) and filename.endswith(".whl")):
        return False
    family, newest, arch = want
    for tag in filename[len(prefix) : -len(".whl")].split("."):
        m = re.fullmatch(
            r"(manylinux|musllinux|macosx)_(\d+)_(\d+)_(.+)", tag.replace("manylinux2014_", "manylinux_2_17_")
        )
        if m and m[1] == family and m[4] == arch and (int(m[2]), int(m[3])) <= newest:
            return True
    return False


def redacted(url: str) -> str:
    """``url`` without its ``user:token@`` (an index's credentials never go to a message or a log)."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))


def _open(url: str, timeout: float, accept: str = "*/*") -> Any:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise BootstrapError(f"{redacted(url)}: not an http(s) URL")
    headers = {"Accept": accept}
    if parts.username is not None:  # basic auth from the URL's userinfo, which urllib does not send
        user = urllib.parse.unquote(parts.username)
        password = urllib.parse.unquote(parts.password or "")
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        url = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 (scheme checked above)
    try:
        return urllib.request.urlopen(request, timeout=timeout)  # noqa: S310 (scheme checked above)
    except urllib.error.HTTPError as e:
        raise BootstrapError(f"{redacted(url)}: HTTP {e.code} {e.reason}") from None


def index_files(index: str) -> list[tuple[str, str, str]]:
    """(filename, url, sha256) of every file of the `uv` project on a simple index (PEP 691 JSON or PEP 503 HTML)."""
    page = urllib.parse.urljoin(index.rstrip("/") + "/", "uv/")
    with _open(page, 60, "application/vnd.pypi.simple.v1+json, text/html;q=0.1") as response:
        kind = response.headers.get_content_type()
        body = response.read().decode()
    if kind == "application/vnd.pypi.simple.v1+json":
        return [
            (f["filename"], urllib.parse.urljoin(page, f["url"]), f.get("hashes", {}).get("sha256", ""))
            for f in json.loads(body)["files"]
        ]
    files = []
    for href, text in re.findall(r"<a\s[^>]*href=\"([^\"]+)\"[^>]*>([^<]+)</a>", body):
        url, _, fragment = html.unescape(href).partition("#")
        sha256 = fragment.removeprefix("sha256=") if fragment.startswith("sha256=") else ""
        files.append((html.unescape(text).strip(), urllib.parse.urljoin(page, url), sha256))
    return files


def fetch(version: str, dest: Path) -> None:
    """Download uv's wheel for this machine, check its sha256, unpack `uv` and `uvx` into dest."""
    index = index_url()
    want = this_platform()
    wheels = [f for f in index_files(index) if runs_here(f[0], version, want)]
    if not wheels:
        raise BootstrapError(f"{redacted(index)} has no uv {version} wheel for {want[0]} {want[2]}")
    filename, url, sha256 = wheels[0]
    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise BootstrapError(f"{redacted(index)} gives no sha256 for {filename}: not using it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}-") as tmp:
        wheel = Path(tmp, filename)
        with _open(url, 600) as response, wheel.open("wb") as out:
            shutil.copyfileobj(response, out)
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if digest != sha256:
            raise BootstrapError(f"{filename} from {redacted(url)}: sha256 {digest}, the index says {sha256}")
        unpacked = Path(tmp, "bin")
        unpacked.mkdir()
        with zipfile.ZipFile(wheel) as z:
            for name in ("uv", "uvx"):
                member = f"uv-{version}.data/scripts/{name}"
                if member not in z.namelist():
                    raise BootstrapError(f"{filename} has no {member}")
                target = unpacked / name
                target.write_bytes(z.read(member))
                target.chmod(0o755)
        if version_of(unpacked / "uv") != version:
            raise BootstrapError(f"the uv in {filename} does not say it is version {version}")
        shutil.rmtree(dest, ignore_errors=True)
        unpacked.rename(dest)


def find_or_fetch(version: str) -> Path:
    pipx = Path(os.environ.get("PIPX_BIN_DIR") or Path.home() / ".local" / "bin", "uv")
    for candidate in (shutil.which("uv"), pipx):
        if candidate and version_of(candidate) == version:
            return Path(candidate)
    dest = cache_dir(version)
    if version_of(dest / "uv") != version:
        print(f"fetching uv {version} from {redacted(index_url())} into {dest}", file=sys.stderr)
        fetch(version, dest)
    return dest / "uv"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        print(find_or_fetch(argv[0]))
    except (BootstrapError, OSError) as e:
        print(f"hack/bootstrap_uv.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
