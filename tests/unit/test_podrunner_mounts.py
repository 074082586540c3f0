"""The pod runner makes a pod's missing mount points inside the pod's mount namespace, not on this
machine: after a pod has run, the machine's folders are as they were (no empty
``/var/run/secrets/kubernetes.io`` left behind, which makes Kubernetes clients believe they run in a
pod). A mount point whose first missing folder is at the machine's root is the one exception: that
folder is made here, empty, and removed when the runner stops."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from tests.support.podrunner import PodRunner

pytestmark = [
    pytest.mark.slow,  # namespaces and mounts, in a process of their own
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("unshare") is None, reason="mount namespaces need root and unshare"
    ),
]


def _runner(tmp_path: Path) -> PodRunner:
    (tmp_path / "volumes").mkdir()  # what start() makes, which stop() looks through
    return PodRunner(api=None, api_host="127.0.0.1", api_port=6443, ca_file=tmp_path / "ca", workdir=tmp_path)


def _in_namespace(commands: list[str], check: str) -> subprocess.CompletedProcess[str]:
    script = "set -e; " + "; ".join(commands) + "; " + check
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_missing_mount_points_are_made_inside_the_namespace_only(tmp_path: Path) -> None:
    tag = f"kubetune-layer-test-{os.getpid()}"
    folders = [
        Path(f"/etc/{tag}/conf"),  # under an existing folder with files a pod reads
        Path(f"/var/run/{tag}/serviceaccount"),  # through a symbolic link (/var/run -> /run)
        Path(f"/opt/{tag}/tiny/model"),
        Path(f"/{tag}-top/deep"),  # its first missing folder is at the root
    ]
    files = [Path(f"/dev/{tag}-termination-log")]  # beside device files and the mounts in /dev
    runner = _runner(tmp_path)
    root = tmp_path / "pod"
    root.mkdir()
    commands = runner._mount_point_layers(root, [(f, True) for f in folders] + [(f, False) for f in files])
    make = [f"mkdir -p {shlex.quote(str(f))}" for f in folders] + [
        f"touch {shlex.quote(str(f))}" for f in files
    ]
    # inside: every mount point is there, and the folders' own contents and mounts still are
    inside = " && ".join(
        [f"test -d {shlex.quote(str(f))}" for f in folders]
        + [f"test -f {shlex.quote(str(f))}" for f in files]
        + [
            "grep -q root /etc/passwd",  # /etc's files
            "echo x > /dev/null",  # a device file through the layer
            "test -d /dev/pts && grep -q ' /dev/shm ' /proc/self/mounts",  # /dev's own mounts, put back
            f"test -d {shlex.quote(str(tmp_path))}",
        ]
    )
    result = _in_namespace(commands + make, inside + " && echo inside-ok")
    assert result.returncode == 0 and "inside-ok" in result.stdout, result.stderr[-2000:]

    # outside: nothing of it, but the empty top folder the layer needed, until the runner stops
    top = Path(f"/{tag}-top")
    try:
        for path in [*folders, *files]:
            first = next(Path(*path.parts[: i + 1]) for i, part in enumerate(path.parts) if tag in part)
            assert first == top or not first.exists(), first
        assert top.is_dir() and not any(top.iterdir())
    finally:
        runner.stop()
    assert not top.exists()


def test_a_missing_file_at_the_root_is_made_as_a_file_and_removed_at_stop(tmp_path: Path) -> None:
    path = Path(f"/kubetune-layer-test-{os.getpid()}-file")
    runner = _runner(tmp_path)
    (tmp_path / "pod").mkdir()
    try:
        assert runner._mount_point_layers(tmp_path / "pod", [(path, False)]) == []  # nothing to layer
        assert path.is_file()
    finally:
        runner.stop()
    assert not path.exists()


def test_mount_points_that_exist_need_nothing(tmp_path: Path) -> None:
    runner = _runner(tmp_path)
    (tmp_path / "pod").mkdir()
    assert (
        runner._mount_point_layers(tmp_path / "pod", [(Path("/tmp"), True), (Path("/etc/hosts"), False)])
        == []
    )
