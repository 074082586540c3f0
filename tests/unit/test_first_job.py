"""The trainer image carries the tiny assets where the manifests and the cluster tests find them:
``kubetune_trainer.tiny.TINY_ROOT``, the one place that path is written in code."""

from __future__ import annotations

import shlex

from tests.support.controlplane import REPO

from kubetune_trainer.tiny import TINY_ROOT

DOCKERFILE = REPO / "images" / "trainer" / "Dockerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """The Dockerfile's instructions (keyword, arguments), continuation lines joined, comments out."""
    out: list[tuple[str, str]] = []
    current = ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        keyword, _, args = current.strip().partition(" ")
        out.append((keyword.upper(), " ".join(args.split())))
        current = ""
    return out


def test_the_trainer_image_builds_the_tiny_assets_where_the_manifests_name_them() -> None:
    steps = instructions(DOCKERFILE.read_text())
    build = [
        i
        for i, (kw, args) in enumerate(steps)
        if kw == "RUN" and "python -m kubetune_trainer.tiny --assets" in args
    ]
    assert len(build) == 1, "the trainer image must build the tiny assets with kubetune_trainer.tiny"
    (at,) = build
    command = steps[at][1]
    words = shlex.split(command)
    assert words[words.index("--assets") + 1] == TINY_ROOT
    # readable by the pods' non-root user, whatever the build's umask
    assert f"chmod -R a+rX {TINY_ROOT}" in command
    # after the trainer's code is in the image, before the image drops to the non-root user
    copies = [i for i, (kw, args) in enumerate(steps) if kw == "COPY" and "trainer/kubetune_trainer" in args]
    user = [i for i, (kw, _) in enumerate(steps) if kw == "USER"]
    assert copies and copies[0] < at < user[0]
    assert "PYTHONPATH=/opt/kubetune" in DOCKERFILE.read_text()


def test_the_cluster_tests_and_the_local_run_use_the_image_path() -> None:
    from tests.cluster import conftest

    from kubetune_cli import run

    assert conftest.TINY_IMAGE_DIR == TINY_ROOT
    assert run.TINY_ROOT == TINY_ROOT
