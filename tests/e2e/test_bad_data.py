"""Bad data and bad manifests end the run before any model is loaded, with one message and exit 2.

Each case runs the real commands as a user would: ``kubetune run job.yaml --local`` and the trainer
pod's ``python -m kubetune_trainer.train --config``. The model path does not exist, so a run that
got as far as loading the model would fail differently (exit 1, a traceback); and nothing may be
written: no run folder locally, no checkpoint, no MLflow run in the trainer's output folder.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.e2e.conftest import REPO, TINY_DATA, trainer_config, trainer_env

pytestmark = [pytest.mark.e2e]

NO_MODEL = "/nonexistent/kubetune-test-model"
ROLES = "'system', 'user', 'assistant', 'tool'"
SHAREGPT_HINT = (
    "; these are ShareGPT's role names: map them in spec.dataset.roles (human: user, gpt: assistant), "
    "or set spec.dataset.layout: sharegpt for ShareGPT's own columns (conversations, from, value)"
)
MESSAGES = 'a list of messages, each {"role": ..., "content": "..."}'


def _chat(n: int) -> list[str]:
    return TINY_DATA.read_text().splitlines()[:n]


def _human_bot() -> str:
    row = {"messages": [{"role": "human", "content": "hot?"}, {"role": "bot", "content": "cold"}]}
    return json.dumps(row)


# name -> (file name, content, format declared or None, the message after "<file>")
CASES: dict[str, tuple[str, str, str | None, str]] = {
    "empty file": ("empty.jsonl", "", None, ": the file has no rows; expected one JSON object per line"),
    "malformed line": (
        "broken.jsonl",
        "\n".join([*_chat(2), '{"messages": [{"role": "user", "content": "hi"},]}']) + "\n",
        None,
        " line 3 column 49: not valid JSON (Expecting value); expected one JSON object per line",
    ),
    "text rows among chat rows": (
        "mixed.jsonl",
        "\n".join([*_chat(4), '{"text": "a plain row"}', *_chat(2)]) + "\n",
        None,
        f" line 5: column 'messages' is missing; expected {MESSAGES} "
        "(format messages, detected from the columns ['messages', 'text'])",
    ),
    "roles human and bot": (
        "sharegpt.jsonl",
        _human_bot() + "\n",
        "messages",
        f" line 1: messages[0] has role 'human'; expected one of {ROLES}{SHAREGPT_HINT} (format messages, "
        "as spec.dataset.format says)",
    ),
    "ShareGPT's columns without its layout": (
        "conversations.jsonl",
        json.dumps({"conversations": [{"from": "human", "value": "hot?"}, {"from": "gpt", "value": "cold"}]})
        + "\n",
        None,
        ": cannot tell the dataset format from its columns ['conversations']: expected 'messages', "
        "'prompt' + 'completion', or 'text' (or set spec.dataset.format); the columns are ShareGPT's: set "
        "spec.dataset.layout: sharegpt",
    ),
    "an unknown role deep in the file": (
        "late.jsonl",
        "\n".join([*_chat(6), _human_bot().replace('"human"', '"user"')]) + "\n",
        None,
        f" line 7: messages[1] has role 'bot'; expected one of {ROLES}; map it onto one of them in "
        "spec.dataset.roles (e.g. bot: assistant) (format messages, detected from the columns ['messages'])",
    ),
    "a row that is not an object": (
        "list.jsonl",
        "\n".join([*_chat(1), "[1, 2]"]) + "\n",
        None,
        " line 2: a list, not an object; expected one JSON object per line",
    ),
    "content that is not a string": (
        "content.jsonl",
        json.dumps({"messages": [{"role": "user", "content": ["hi"]}]}) + "\n",
        None,
        " line 1: messages[0] (role 'user') content is a list; expected a string "
        "(format messages, detected from the columns ['messages'])",
    ),
    "text that is a number": (
        "text.jsonl",
        '{"text": "fine"}\n\n{"text": 42}\n',
        None,
        " line 3: column 'text' is a number; expected a string (format text, detected from the columns ['text'])",
    ),
}


def _manifest(tmp_path: Path, data: Path, fmt: str | None, **spec: Any) -> Path:
    dataset: dict[str, Any] = {"path": str(data)}
    if fmt:
        dataset["format"] = fmt
    doc = {
        "apiVersion": "kubetune.io/v1alpha1",
        "kind": "FineTuneJob",
        "metadata": {"name": "bad-data"},
        "spec": {
            "model": {"path": NO_MODEL},
            "dataset": dataset,
            "method": "full",
            "training": {"maxSteps": 2},
            **spec,
        },
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def kubetune_run(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kubetune_cli", "run", *args],
        check=False,
        cwd=tmp_path,
        env=env or trainer_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _assert_refused_before_anything(proc: subprocess.CompletedProcess[str], message: str, out: Path) -> None:
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"kubetune: {message}\n"
    assert proc.stdout == ""
    assert not out.exists(), sorted(out.rglob("*"))


@pytest.mark.parametrize("case", list(CASES))
def test_local_run_refuses_bad_data_before_anything(tmp_path: Path, case: str) -> None:
    name, content, fmt, tail = CASES[case]
    data = tmp_path / name
    data.write_text(content)
    out = tmp_path / "run"
    proc = kubetune_run(tmp_path, str(_manifest(tmp_path, data, fmt)), "--local", "--output-dir", str(out))
    _assert_refused_before_anything(proc, f"{data}{tail}", out)


@pytest.mark.parametrize("case", ["malformed line", "text rows among chat rows", "roles human and bot"])
def test_the_trainer_pod_refuses_bad_data_with_the_same_message(tmp_path: Path, case: str) -> None:
    name, content, fmt, tail = CASES[case]
    data = tmp_path / name
    data.write_text(content)
    out = tmp_path / "run"
    dataset: dict[str, Any] = {"path": str(data), **({"format": fmt} if fmt else {})}
    config = trainer_config(out, Path(NO_MODEL), dataset=dataset)
    proc = subprocess.run(
        [sys.executable, "-m", "kubetune_trainer.train", "--config", str(config)],
        check=False,
        cwd=REPO,
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].endswith(f"ERROR kubetune_trainer.train: {data}{tail}"), proc.stderr
    assert "Traceback" not in proc.stderr
    # nothing written: no checkpoint, no MLflow run file, no result
    assert list(out.iterdir()) == []


def test_debug_adds_the_traceback(tmp_path: Path) -> None:
    name, content, fmt, tail = CASES["roles human and bot"]
    data = tmp_path / name
    data.write_text(content)
    out = tmp_path / "run"
    manifest = str(_manifest(tmp_path, data, fmt))
    proc = kubetune_run(tmp_path, manifest, "--local", "--output-dir", str(out), "--debug")
    assert proc.returncode == 2
    assert "Traceback (most recent call last)" in proc.stderr
    assert proc.stderr.endswith(f"kubetune: {data}{tail}\n")
    assert not out.exists()


def test_data_errors_in_a_folder_name_the_file_and_the_split(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "train.jsonl").write_text("\n".join(_chat(8)) + "\n")
    (folder / "test.jsonl").write_text("\n".join([*_chat(2), '{"messages": []}']) + "\n")
    out = tmp_path / "run"
    manifest = _manifest(tmp_path, folder, None)
    doc = yaml.safe_load(manifest.read_text())
    doc["spec"]["dataset"]["evalSplit"] = "test"
    manifest.write_text(yaml.safe_dump(doc))
    proc = kubetune_run(tmp_path, str(manifest), "--local", "--output-dir", str(out))
    message = (
        f"{folder / 'test.jsonl'} line 3: column 'messages' is an empty list; expected {MESSAGES} "
        "(format messages, detected from the columns ['messages'])"
    )
    _assert_refused_before_anything(proc, message, out)

    doc["spec"]["dataset"]["evalSplit"] = "validation"
    manifest.write_text(yaml.safe_dump(doc))
    proc = kubetune_run(tmp_path, str(manifest), "--local", "--output-dir", str(out))
    message = f"{folder}: dataset has no eval split 'validation' (it has ['test', 'train'])"
    _assert_refused_before_anything(proc, message, out)


def test_assistant_only_loss_needs_an_assistant_message_in_every_row(tmp_path: Path) -> None:
    data = tmp_path / "chat.jsonl"
    no_answer = json.dumps(
        {"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}]}
    )
    data.write_text("\n".join([*_chat(3), no_answer]) + "\n")
    out = tmp_path / "run"
    manifest = _manifest(tmp_path, data, "messages")
    doc = yaml.safe_load(manifest.read_text())
    doc["spec"]["training"]["assistantOnlyLoss"] = True
    manifest.write_text(yaml.safe_dump(doc))
    proc = kubetune_run(tmp_path, str(manifest), "--local", "--output-dir", str(out))
    message = (
        f"{data} line 4: column 'messages' has no 'assistant' message; expected at least one "
        "(spec.training.assistantOnlyLoss trains on assistant messages only) "
        "(format messages, as spec.dataset.format says)"
    )
    _assert_refused_before_anything(proc, message, out)


@pytest.mark.parametrize(
    ("edit", "lines"),
    [
        (
            lambda doc: doc["spec"]["training"].update(learningRat=0.1),
            ["spec.training.learningRat: unknown field"],
        ),
        (
            lambda doc: doc["spec"]["training"].update(maxSteps="ten"),
            [
                "spec.training.maxSteps: Input should be a valid integer, unable to parse string as an "
                "integer (got 'ten')"
            ],
        ),
        (
            lambda doc: doc["spec"].update(methd="full"),
            ["spec.methd: unknown field"],
        ),
    ],
    ids=["unknown field", "wrong type", "misspelt section"],
)
def test_a_manifest_typo_is_one_line_naming_the_field(tmp_path: Path, edit: Any, lines: list[str]) -> None:
    data = tmp_path / "chat.jsonl"
    data.write_text("\n".join(_chat(4)) + "\n")
    manifest = _manifest(tmp_path, data, None)
    doc = yaml.safe_load(manifest.read_text())
    edit(doc)
    manifest.write_text(yaml.safe_dump(doc))
    out = tmp_path / "run"
    proc = kubetune_run(tmp_path, str(manifest), "--local", "--output-dir", str(out))
    assert proc.returncode == 2
    assert proc.stderr == "kubetune: " + "".join(f"{manifest}: {line}\n" for line in lines)
    assert not out.exists()


def test_a_manifest_that_is_not_yaml_names_the_line(tmp_path: Path) -> None:
    manifest = tmp_path / "job.yaml"
    manifest.write_text("kind: FineTuneJob\nspec:\n  model: [a\n")
    proc = kubetune_run(tmp_path, str(manifest), "--local", "--output-dir", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert proc.stderr == (
        f"kubetune: {manifest} line 4 column 1: not valid YAML (expected ',' or ']', but got '<stream end>')\n"
    )
