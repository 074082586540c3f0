"""The trainer reads its environment in one place (kubetune_trainer.settings)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kubetune_trainer import settings

TRAINER = Path(__file__).resolve().parents[2] / "trainer" / "kubetune_trainer"


def _environment_reads(source: str) -> list[int]:
    """Lines that read a variable: ``os.environ.get(...)``, ``os.getenv(...)``, ``os.environ[...]``
    read. Writes that configure a library (``os.environ[...] = ``, ``setdefault``, ``pop``) are not
    reads of ours."""
    found = []
    for node in ast.walk(ast.parse(source)):
        called = ast.unparse(node.func) if isinstance(node, ast.Call) else ""
        if called in ("os.environ.get", "os.getenv", "environ.get", "getenv"):
            found.append(node.lineno)
        read = isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)
        if read and ast.unparse(node.value) in ("os.environ", "environ"):
            found.append(node.lineno)
    return found


def test_the_check_finds_a_read() -> None:
    assert _environment_reads("import os\nx = os.environ.get('A')\ny = os.environ['B']\n") == [2, 3]
    assert _environment_reads("import os\nos.environ['A'] = '1'\nos.environ.setdefault('B', '0')\n") == []


@pytest.mark.parametrize(
    "module", sorted(p for p in TRAINER.rglob("*.py") if p.name != "settings.py"), ids=lambda p: p.name
)
def test_no_trainer_module_but_settings_reads_the_environment(module: Path) -> None:
    assert _environment_reads(module.read_text()) == [], (
        f"{module}: read it through kubetune_trainer.settings"
    )


def test_settings_read_what_a_pod_sets() -> None:
    env = {
        "RANK": "1",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "2",
        "HUGGING_FACE_HUB_TOKEN": "hf_abc",
        "MLFLOW_TRACKING_PASSWORD": "pw-1234",
        "KUBETUNE_CPUS": "8",
        "KUBETUNE_SHUTDOWN_GRACE_S": "soon",
        "KUBETUNE_SHARDING": "fsdp2",
    }
    s = settings.from_environ(env)
    assert (s.rank, s.local_rank, s.world_size, s.hf_token, s.cpus_requested) == (1, 1, 2, "hf_abc", 8)
    assert set(s.secrets) == {"hf_abc", "pw-1234"}
    assert s.tuning().sharding == "fsdp2"
    assert s.ignored_control == ("KUBETUNE_SHUTDOWN_GRACE_S",)  # a control setting: named, never read
    assert settings.from_environ({"KUBETUNE_CPUS": "0"}).cpus_requested is None
