"""The project's main job: ``kubetune run examples/tiny-local.yaml --local`` on a fresh machine.

From nothing (an empty cache, no network: ``HF_HUB_OFFLINE=1``) it builds the tiny model, trains it
on the CPU, keeps checkpoints in the run folder, tracks in a local MLflow store, registers the model
there, and says where everything is. The loss must fall clearly, and the registered model must load
back from MLflow and generate text.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.e2e.conftest import REPO, trainer_env
from tests.support import proc_account

from kubetune_api.trainer_config import COMPLETE_MARKER, REGISTER_RESULT_FILE, TRAIN_RESULT_FILE

pytestmark = [pytest.mark.e2e, pytest.mark.training]
PROC_ACCOUNT_DIR = Path(proc_account.__file__).parent


def test_local_run_trains_registers_and_says_where_everything_is(tmp_path: Path) -> None:
    out = tmp_path / "runs" / "tiny-local"
    env = trainer_env()
    env["HF_HUB_OFFLINE"] = "1"  # proves nothing is downloaded
    env["HF_DATASETS_OFFLINE"] = "1"
    env["KUBETUNE_CACHE"] = str(tmp_path / "cache")
    # the run's own CPU accounting (tests/support/proc_account): what the process imported
    accounting = tmp_path / "cpu.jsonl"
    env[proc_account.ENV] = str(accounting)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROC_ACCOUNT_DIR), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "kubetune_cli", "run", str(REPO / "examples" / "tiny-local.yaml"), "--local"],
        check=False,
        cwd=tmp_path,  # the default run folder is ./runs/<name>
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    # one process trained and registered; it never imported what no step uses (scikit-learn, and
    # torchao without KUBETUNE_FP8, which transformers imports when it finds them:
    # kubetune_trainer.process.skip_unused_libraries)
    (record,) = [json.loads(line) for line in accounting.read_text().splitlines()]
    assert record["kind"] == "kubetune run" and record["cpu"] > 1, record
    assert {"torch", "transformers", "mlflow"} <= set(record["heavy"]), record
    assert not {"sklearn", "torchao"} & set(record["heavy"]), record

    assert (tmp_path / "cache" / "tiny" / "model" / "config.json").is_file()
    result = json.loads((out / TRAIN_RESULT_FILE).read_text())
    first, final = result["first_loss"], result["final_loss"]
    assert result["global_step"] == 60
    # Well below the first: the tiny model really learns the tiny data.
    assert final < 0.5 * first, (first, final)
    assert result["eval_losses"][-1][1] < result["eval_losses"][0][1]
    assert result["mlflow_ok"] is True
    assert (out / "final" / COMPLETE_MARKER).is_file()
    assert len(list((out / "checkpoints").glob("checkpoint-*/COMPLETE"))) == 2

    registered = json.loads((out / REGISTER_RESULT_FILE).read_text())
    assert registered["name"] == "tiny-local" and registered["version"] == "1"
    tracking_uri = f"sqlite:///{out.resolve() / 'mlflow.db'}"
    for where in (str(out), "mlflow ui --backend-store-uri " + tracking_uri, registered["uri"]):
        assert where in proc.stdout, proc.stdout
    assert f"{first:.3f} -> {final:.3f}" in proc.stdout

    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    components = mlflow.transformers.load_model(registered["uri"], return_type="components")
    model, tokenizer = components["model"], components["tokenizer"]
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the opposite of hot?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    generated = model.generate(**prompt, max_new_tokens=12, do_sample=False)
    text = tokenizer.decode(generated[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    assert text.strip(), "the registered model generated nothing"
