"""hack/setup.sh gets uv without pip, on a Python that refuses `pip install` (PEP 668).

The first command on a fresh machine (`make run`, `make test`) runs hack/setup.sh, which runs
hack/bootstrap_uv.py. Here it runs with no uv on PATH, a `python3` that answers `-m pip` (and
`-m venv`, `-m ensurepip`) with Debian's externally-managed-environment error and logs every call
(behind it Debian's own /usr/bin/python3 where this machine has one marked EXTERNALLY-MANAGED), and
a package index served on 127.0.0.1 by the test. The index lists uv wheels of the pinned version
for this platform and for others, and of another version; each wheel's `uv` is a shell script that
names the wheel it came from, and the one for this machine records the arguments it is run with.
"""

from __future__ import annotations

import base64
import hashlib
import html
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from tests.support.controlplane import REPO

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="hack/setup.sh's bootstrap test is for Linux"
)

VERSION = "0.13.8"  # hack/setup.sh's UV_VERSION (asserted below)
# hack/setup.sh's sync: the lock exactly, compiled to bytecode (tests/unit/test_step_startup.py says why)
SYNC = "sync --frozen --all-extras --quiet --compile-bytecode"
ARCH = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower(), platform.machine().lower())
FAMILY = "manylinux" if platform.libc_ver()[0] == "glibc" else "musllinux"
# the right wheel for this machine, named as on PyPI
RIGHT = (
    f"uv-{VERSION}-py3-none-manylinux_2_17_{ARCH}.manylinux2014_{ARCH}.whl"
    if FAMILY == "manylinux"
    else f"uv-{VERSION}-py3-none-musllinux_1_1_{ARCH}.whl"
)
# listed before the right one, so a bootstrap that takes the first wheel it sees takes a wrong one
DECOYS = [
    f"uv-{VERSION}-py3-none-win_amd64.whl",
    f"uv-{VERSION}-py3-none-macosx_11_0_{ARCH}.whl",
    f"uv-{VERSION}-py3-none-{FAMILY}_9_99_{ARCH}.whl",  # needs a libc from the future
    f"uv-{VERSION}-py3-none-{FAMILY}_2_17_{'s390x' if ARCH != 's390x' else 'x86_64'}.whl",
    f"uv-0.13.7-py3-none-{FAMILY}_2_17_{ARCH}.whl",
]

REFUSE_PIP = """#!/bin/sh
echo "$*" >> "$PYTHON3_LOG"
case "$1 $2" in
  "-m pip"|"-m venv"|"-m ensurepip")
    echo "error: externally-managed-environment" >&2
    echo "This environment is externally managed (PEP 668)" >&2
    exit 1;;
esac
exec {python} "$@"
"""


def fake_wheel(filename: str) -> bytes:
    """A wheel (a zip) whose `uv` says it is uv of the wheel's version, names the wheel, and logs its arguments."""
    version = filename.split("-")[1]
    script = (
        "#!/bin/sh\n"
        f'if [ "$1" = "--version" ]; then echo "uv {version} (from {filename})"; exit 0; fi\n'
        f'echo "$*" >> "$FAKE_UV_LOG"\n'
    )
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(f"uv-{version}.data/scripts/uv", script)
        z.writestr(f"uv-{version}.data/scripts/uvx", script)
        z.writestr("uv/__init__.py", "")
        z.writestr(f"uv-{version}.dist-info/METADATA", f"Name: uv\nVersion: {version}\n")
    return buf.getvalue()


@dataclass
class Index:
    """A simple package index on 127.0.0.1: /simple/uv/ (PEP 691 JSON or PEP 503 HTML) and /files/."""

    wheels: dict[str, bytes]
    html_only: bool = False
    wrong_hash_for: str = ""
    requests: list[str] = field(default_factory=list)
    url: str = ""
    auth: str = ""  # "user:token": every request must carry it as basic auth

    def sha256(self, name: str) -> str:
        digest = hashlib.sha256(self.wheels[name]).hexdigest()
        return "0" * 64 if name == self.wrong_hash_for else digest

    def page(self, accept: str) -> tuple[str, bytes]:
        if "application/vnd.pypi.simple.v1+json" in accept and not self.html_only:
            files = [
                {"filename": n, "url": f"../../files/{n}", "hashes": {"sha256": self.sha256(n)}}
                for n in self.wheels
            ]
            body = {"meta": {"api-version": "1.1"}, "name": "uv", "files": files}
            return "application/vnd.pypi.simple.v1+json", json.dumps(body).encode()
        links = "".join(
            f'<a href="{html.escape(f"/files/{n}#sha256={self.sha256(n)}")}">{html.escape(n)}</a><br/>\n'
            for n in self.wheels
        )
        return "text/html", f"<!DOCTYPE html><html><body>\n{links}</body></html>".encode()


@pytest.fixture
def index() -> Iterator[Index]:
    wheels = {name: fake_wheel(name) for name in [*DECOYS, RIGHT]}
    state = Index(wheels)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.requests.append(self.path)
            wanted = "Basic " + base64.b64encode(state.auth.encode()).decode()
            if state.auth and self.headers.get("Authorization") != wanted:
                self.send_error(401)
                return
            if self.path == "/simple/uv/":
                kind, body = state.page(self.headers.get("Accept", ""))
            elif self.path.startswith("/files/") and self.path[len("/files/") :] in state.wheels:
                kind, body = "application/octet-stream", state.wheels[self.path[len("/files/") :]]
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}/simple/"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


def stock_python() -> str:
    """Debian's own python3 where it is marked EXTERNALLY-MANAGED (as on Debian 12), else this test's."""
    debian = Path("/usr/bin/python3")
    marked = any(Path("/usr/lib").glob("python3*/EXTERNALLY-MANAGED"))
    if marked and debian.exists():
        version = subprocess.run(
            [debian, "-c", "import sys; print(sys.version_info >= (3, 11))"],
            capture_output=True,
            text=True,
            check=False,
        )
        if version.stdout.strip() == "True":
            return str(debian)
    return sys.executable


@dataclass
class Machine:
    """A fresh machine: an empty HOME and cache, PATH with bash and a pip-refusing python3, no uv."""

    root: Path
    index: Index

    def __post_init__(self) -> None:
        self.bin = self.root / "bin"
        self.bin.mkdir(parents=True)
        for tool in ("bash", "dirname", "env"):
            found = shutil.which(tool)
            assert found, tool
            (self.bin / tool).symlink_to(found)
        python3 = self.bin / "python3"
        python3.write_text(REFUSE_PIP.format(python=stock_python()))
        python3.chmod(0o755)
        (self.root / "home").mkdir()
        self.cache = self.root / "cache"
        self.python3_log = self.root / "python3.log"
        self.uv_log = self.root / "uv.log"
        self.python3_log.touch()
        self.uv_log.touch()

    def env(self) -> dict[str, str]:
        return {
            "PATH": str(self.bin),
            "HOME": str(self.root / "home"),
            "KUBETUNE_CACHE": str(self.cache),
            "KUBETUNE_PYPI_URL": self.index.url,
            "PYTHON3_LOG": str(self.python3_log),
            "FAKE_UV_LOG": str(self.uv_log),
            "LANG": "C.UTF-8",
        }

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv), cwd=REPO, env=self.env(), capture_output=True, text=True, timeout=120, check=False
        )


@pytest.fixture
def machine(tmp_path: Path, index: Index) -> Machine:
    return Machine(tmp_path, index)


def test_setup_pins_the_version_this_test_serves() -> None:
    assert f"UV_VERSION={VERSION}\n" in (REPO / "hack" / "setup.sh").read_text()


def test_the_python3_here_refuses_pip_as_debian_does(machine: Machine) -> None:
    result = machine.run("python3", "-m", "pip", "install", f"uv=={VERSION}")
    assert result.returncode == 1 and "externally-managed-environment" in result.stderr
    assert machine.run("bash", "-c", "command -v uv").returncode == 1  # no uv on this PATH


@pytest.mark.parametrize("html_only", [False, True], ids=["pep691-json", "html"])
def test_setup_fetches_uv_into_the_cache_without_pip_then_syncs(machine: Machine, html_only: bool) -> None:
    machine.index.html_only = html_only
    result = machine.run("bash", "hack/setup.sh")
    assert result.returncode == 0, result.stderr

    uv = machine.cache / f"uv-{VERSION}" / "uv"
    assert os.access(uv, os.X_OK) and os.access(uv.with_name("uvx"), os.X_OK)
    assert subprocess.run([uv, "--version"], capture_output=True, text=True, check=True).stdout.strip() == (
        f"uv {VERSION} (from {RIGHT})"
    )
    assert machine.index.requests == ["/simple/uv/", f"/files/{RIGHT}"]
    calls = machine.python3_log.read_text().splitlines()
    assert calls == [f"hack/bootstrap_uv.py {VERSION}"]  # python3 ran the bootstrap, never pip
    assert machine.uv_log.read_text().splitlines() == [SYNC]

    # the second time, the uv in the cache: no request to the index
    result = machine.run("bash", "hack/setup.sh")
    assert result.returncode == 0, result.stderr
    assert machine.index.requests == ["/simple/uv/", f"/files/{RIGHT}"]
    assert machine.uv_log.read_text().splitlines() == [SYNC] * 2


def test_a_wheel_whose_sha256_is_not_the_index_s_is_refused_and_nothing_is_kept(machine: Machine) -> None:
    machine.index.wrong_hash_for = RIGHT
    result = machine.run("bash", "hack/setup.sh")
    assert result.returncode != 0
    assert f"{RIGHT} from {machine.index.url.removesuffix('/simple/')}/files/{RIGHT}: sha256" in result.stderr
    assert "the index says " + "0" * 64 in result.stderr
    assert not (machine.cache / f"uv-{VERSION}").exists()
    assert list(machine.cache.iterdir()) == []  # the download's temporary folder is gone too
    assert machine.uv_log.read_text() == ""


def test_a_uv_of_the_pinned_version_on_path_is_used_and_another_version_is_not(machine: Machine) -> None:
    def put_uv_on_path(version: str) -> Path:
        uv = machine.bin / "uv"
        uv.write_text(f'#!/bin/sh\necho "uv {version} (on PATH)"\n')
        uv.chmod(0o755)
        return uv

    on_path = put_uv_on_path(VERSION)
    result = machine.run("python3", "hack/bootstrap_uv.py", VERSION)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(on_path)
    assert machine.index.requests == []

    put_uv_on_path("0.4.0")
    result = machine.run("python3", "hack/bootstrap_uv.py", VERSION)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(machine.cache / f"uv-{VERSION}" / "uv")
    assert machine.index.requests == ["/simple/uv/", f"/files/{RIGHT}"]


TOKEN = "s3cr3t-index-token"


@pytest.mark.parametrize("wrong_hash", [False, True], ids=["fetched", "refused"])
def test_an_index_url_with_credentials_is_used_with_basic_auth_and_never_printed(
    machine: Machine, wrong_hash: bool
) -> None:
    machine.index.auth = f"ci:{TOKEN}"
    machine.index.url = machine.index.url.replace("http://", f"http://ci:{TOKEN}@")
    if wrong_hash:
        machine.index.wrong_hash_for = RIGHT  # an error message that names the wheel's URL
    result = machine.run("python3", "hack/bootstrap_uv.py", VERSION)
    assert (result.returncode != 0) is wrong_hash, result.stderr
    assert machine.index.requests == ["/simple/uv/", f"/files/{RIGHT}"]  # both sent the credentials
    assert "fetching uv" in result.stderr and "http://***@127.0.0.1:" in result.stderr
    assert TOKEN not in result.stdout + result.stderr


def test_a_refused_request_names_the_index_without_its_credentials(machine: Machine) -> None:
    machine.index.auth = "ci:right"
    machine.index.url = machine.index.url.replace("http://", f"http://ci:{TOKEN}@")
    result = machine.run("python3", "hack/bootstrap_uv.py", VERSION)
    assert result.returncode == 1 and "HTTP 401" in result.stderr, result.stderr
    assert TOKEN not in result.stdout + result.stderr
