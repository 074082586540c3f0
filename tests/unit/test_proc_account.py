"""The suite's CPU accounting (tests/support/proc_account): a process that exits writes what it was
and its CPU seconds, a process its launcher stops is recorded from /proc, and the summary adds them
up by kind (docs/contributing.md, "Where the time goes")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support import proc_account
from tests.support.proc_account.__main__ import main

FOLDER = Path(proc_account.__file__).parent


def test_an_exiting_python_process_records_its_kind_and_cpu(tmp_path: Path) -> None:
    log = tmp_path / "cpu.jsonl"
    env = {**os.environ, proc_account.ENV: str(log), "PYTHONPATH": str(FOLDER)}
    busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
    subprocess.run([sys.executable, "-c", busy], env=env, check=True, timeout=60)
    (record,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert record["kind"] == "python -c"
    assert record["cpu"] >= 0.3 and record["wall"] >= record["cpu"] * 0.5
    assert record["heavy"] == []
    # a library made unimportable (None in sys.modules) is not counted as imported
    skipped = "import sys\nsys.modules['torch'] = None\n"
    subprocess.run([sys.executable, "-c", skipped], env=env, check=True, timeout=60)
    assert json.loads(log.read_text().splitlines()[-1])["heavy"] == []
    log.write_text(log.read_text().splitlines()[0] + "\n")
    # without the variable nothing is written
    subprocess.run([sys.executable, "-c", "pass"], env={**env, proc_account.ENV: ""}, check=True, timeout=60)
    assert len(log.read_text().splitlines()) == 1


def test_a_process_stopped_by_its_launcher_is_recorded_from_proc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "cpu.jsonl"
    # 0.4 s spent as the process measures it, of which /proc must show at least 0.3: the kernel's
    # utime and stime are kept in clock ticks and sampled, so they can read a tick or two short of
    # the process's own clock (0.29 for 0.3 on a loaded machine)
    busy = (
        "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\n"
        "print('spent', flush=True)\ntime.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", busy], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "spent\n"
        proc_account.record_pid(proc.pid, "busy")  # accounting off: nothing
        assert not log.exists()
        monkeypatch.setenv(proc_account.ENV, str(log))
        proc_account.record_pid(proc.pid, "busy")
        (record,) = [json.loads(line) for line in log.read_text().splitlines()]
        assert record["kind"] == "busy" and record["cpu"] >= 0.3 and record["wall"] >= record["cpu"]
    finally:
        proc.kill()
        proc.wait()
    proc_account.record_pid(proc.pid, "gone")  # a process that is gone: nothing
    assert len(log.read_text().splitlines()) == 1


def test_the_summary_adds_up_by_kind_largest_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "cpu.jsonl"
    rows = [("kubetune_trainer.train", 20.0), ("kubetune_trainer.train", 10.0), ("pytest", 5.0)]
    log.write_text("".join(json.dumps({"kind": k, "cpu": c, "wall": c, "heavy": []}) + "\n" for k, c in rows))
    assert proc_account.summary(log) == [
        ("kubetune_trainer.train", 2, 30.0, 30.0, 15.0),
        ("pytest", 1, 5.0, 5.0, 5.0),
    ]
    assert main([str(log)]) == 0
    out = capsys.readouterr().out
    assert "| kubetune_trainer.train | 2 | 30 | 86% | 15.0 | 30 |" in out
    assert "| all | 3 | 35 | 100% | | |" in out
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main([str(empty)]) == 1
