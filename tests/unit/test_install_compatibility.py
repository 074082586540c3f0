"""docs/install.md's compatibility table says the versions the project really tests and ships.

Each row is read against where the version is decided: the control-plane build's defaults
(hack/build-control-plane.sh), the lock (uv.lock), the trainer image's base (images/trainer/Dockerfile)
and the chart's in-cluster MLflow image (charts/kubetune/values.yaml).
"""

from __future__ import annotations

import re
import tomllib

import yaml
from tests.support.controlplane import REPO

# the NVIDIA driver each CUDA release of the trainer's base image was released with
DRIVER_FOR_CUDA = {"12.8": 570}


def build_defaults() -> dict[str, str]:
    """NAME -> default of each `NAME_VERSION="${KUBETUNE_..._VERSION:-vX.Y.Z}"` in the build script."""
    script = (REPO / "hack" / "build-control-plane.sh").read_text()
    return dict(re.findall(r'(?m)^(\w+)_VERSION="\$\{KUBETUNE_\w+_VERSION:-(v[0-9.]+)\}"', script))


def locked() -> dict[str, str]:
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    return {p["name"]: p["version"] for p in lock["package"] if "version" in p}


def page() -> str:
    return (REPO / "docs" / "install.md").read_text()


def rows(text: str) -> dict[str, list[str]]:
    """component -> [tested, notes] of the table under "What is tested together"."""
    table = text[text.index("## What is tested together") :].split("\n## ", maxsplit=1)[0]
    out = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 3 and cells[0] not in ("component", "---"):
            out[cells[0]] = cells[1:]
    return out


def expected_versions() -> dict[str, str]:
    d, lock = build_defaults(), locked()
    return {
        "Kubernetes": d["K8S"],
        "Kubeflow Training Operator": d["TRAINING_OPERATOR"],
        "Kueue": d["KUEUE"],
        "Kubeflow Trainer v2 / JobSet": f"{d['TRAINER']} / {d['JOBSET']}",
        "Helm": d["HELM"],
        "MLflow": lock["mlflow"],
        "PyTorch in the trainer image": lock["torch"],
        "kopf / Kubernetes Python client (operator)": f"{lock['kopf']} / {lock['kubernetes']}",
    }


def mismatches(text: str) -> list[str]:
    table = rows(text)
    return [
        f"{component}: the table says {table.get(component, ['no row'])[0]!r}, the project tests {version!r}"
        for component, version in expected_versions().items()
        if table.get(component, [None])[0] != version
    ]


def test_the_build_script_and_the_lock_are_read() -> None:
    defaults = build_defaults()
    assert {"K8S", "TRAINING_OPERATOR", "KUEUE", "HELM", "TRAINER", "JOBSET"} <= set(defaults)
    assert {"mlflow", "torch", "kopf", "kubernetes", "transformers", "trl", "peft", "liger-kernel"} <= set(
        locked()
    )


def test_each_row_says_the_version_that_is_tested() -> None:
    assert mismatches(page()) == []


def test_a_stale_or_missing_row_is_named() -> None:
    kueue = build_defaults()["KUEUE"]
    stale = page().replace(f"| Kueue | {kueue} |", "| Kueue | v0.16.0 |").replace("| Helm |", "| helm |")
    assert mismatches(stale) == [
        f"Kueue: the table says 'v0.16.0', the project tests {kueue!r}",
        f"Helm: the table says 'no row', the project tests {build_defaults()['HELM']!r}",
    ]


def test_the_trainer_libraries_are_the_locked_ones() -> None:
    notes = rows(page())["PyTorch in the trainer image"][1]
    lock = locked()
    for name, shown in (
        ("transformers", "transformers"),
        ("trl", "TRL"),
        ("peft", "PEFT"),
        ("liger-kernel", "liger-kernel"),
    ):
        assert f"{shown} {lock[name]}" in notes, name


def test_the_driver_row_follows_the_trainer_image_s_cuda() -> None:
    dockerfile = (REPO / "images" / "trainer" / "Dockerfile").read_text()
    base = re.search(r"(?m)^FROM (\S+)$", dockerfile)
    assert base
    image = base[1]
    cuda = re.search(r"-cuda(\d+\.\d+)-", image)
    assert cuda, image
    assert cuda[1] in DRIVER_FOR_CUDA, (
        f"add the NVIDIA driver CUDA {cuda[1]} needs to DRIVER_FOR_CUDA and the docs"
    )
    version, notes = rows(page())["NVIDIA driver on GPU nodes"]
    assert version == f"≥ {DRIVER_FOR_CUDA[cuda[1]]}"
    assert f"CUDA {cuda[1]}" in notes and f"`{image}`" in notes
    assert image.startswith(f"pytorch/pytorch:{locked()['torch']}-"), "the base brings the locked torch"


def test_the_chart_s_mlflow_image_and_the_training_operator_install_command() -> None:
    values = yaml.safe_load((REPO / "charts" / "kubetune" / "values.yaml").read_text())
    image = values["mlflow"]["server"]["image"]
    notes = rows(page())["MLflow"][1]
    assert f"`{image['repository']}:{image['tag']}`" in notes
    assert image["tag"] == f"v{locked()['mlflow']}"
    operator = build_defaults()["TRAINING_OPERATOR"]
    command = (
        "kubectl apply --server-side -k \\\n"
        '  "github.com/kubeflow/training-operator.git/manifests/overlays/standalone'
        f'?ref={operator}"'
    )
    assert command in page()
