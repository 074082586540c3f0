"""docs/getting-started.md's "Bad input" sample is what ``kubetune run --local`` prints.

Each line of the sample is made again here: a manifest (examples/tiny-local.yaml) pointed at a data
file with that line's problem, run through the CLI in this process; the data files live in a folder
that stands for the page's ``/data``. Nothing is built: bad input stops the run first.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.support import docs_samples
from tests.support.controlplane import REPO

from kubetune_cli.main import main

GOOD = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}


def sample_lines() -> list[str]:
    (block,) = [
        b
        for b in docs_samples.code_blocks(docs_samples.GETTING_STARTED)
        if b.text.startswith("kubetune: /data/chat.jsonl")
    ]
    return block.text.splitlines()


def _jsonl(path: Path, lines: list[str]) -> None:
    path.write_text("".join(f"{line}\n" for line in lines))


def _manifest(where: Path, data: Path, **training: Any) -> Path:
    doc = yaml.safe_load((REPO / "examples" / "tiny-local.yaml").read_text())
    # the format detected from the columns
    doc["spec"]["dataset"] = {"path": str(data), "evalFraction": 0.1}
    doc["spec"]["model"] = {"path": str(where / "no-model")}
    doc["spec"]["training"].update(training)
    path = where / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_every_bad_input_line_of_getting_started_is_what_the_cli_prints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    good = json.dumps(GOOD)
    human = {"messages": [{"role": "human", "content": "hi"}, {"role": "gpt", "content": "yo"}]}
    # line 3: a value missing after a comma, at column 49
    broken = '{"messages": [{"role": "user", "content": "a"}, ]}'
    assert broken.index("]}") + 1 == 49
    cases = [  # each in a folder of its own that stands for the page's /data
        ("chat.jsonl", [good] * 4 + [json.dumps({"text": "hello"})]),
        ("chat.jsonl", [json.dumps(human)]),
        ("chat.jsonl", [good, good, broken]),
        ("empty.jsonl", []),
    ]
    monkeypatch.chdir(tmp_path)
    printed = []
    for i, (name, lines) in enumerate(cases):
        data = tmp_path / f"case{i}"
        data.mkdir()
        _jsonl(data / name, lines)
        manifest = _manifest(tmp_path, data / name)
        assert main(["run", str(manifest), "--local", "--output-dir", str(tmp_path / "out")]) == 2
        printed.append(capsys.readouterr().err.strip().replace(str(data), "/data"))
    _manifest(tmp_path, tmp_path / "case0" / "chat.jsonl", learningRat=1.0e-2)
    assert main(["run", "job.yaml", "--local"]) == 2
    printed.append(capsys.readouterr().err.strip())

    assert printed == sample_lines()
    assert not (tmp_path / "out").exists(), "bad input stops the run before anything is written"
