"""The Hub stand-in of :mod:`tests.support.hub` against the real ``huggingface_hub``, ``datasets`` and
``transformers``: each client runs in its own process with ``HF_ENDPOINT`` and a fresh ``HF_HOME`` in
its environment, as the trainer's processes do (``huggingface_hub`` reads ``HF_ENDPOINT`` when it is
imported, so setting it in this process would not reach a library already imported).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.hub import HubStandIn

MODEL, DATA, GATED = "kubetune/tiny", "kubetune/chat", "kubetune/tiny-gated"
TOKEN = "hf_stand_in_token_not_a_secret"
ROWS = [
    {
        "messages": [
            {"role": "user", "content": f"question {i}"},
            {"role": "assistant", "content": f"answer {i}"},
        ]
    }
    for i in range(12)
]


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubStandIn]:
    from kubetune_trainer.tiny import build_tiny_model

    model = build_tiny_model(tmp_path_factory.mktemp("model") / "tiny")
    data = tmp_path_factory.mktemp("data")
    (data / "data").mkdir()
    (data / "data" / "train-00000-of-00001.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    server = HubStandIn(tmp_path_factory.mktemp("hub"))
    server.add_model(MODEL, model)
    server.add_model(GATED, model, gated_token=TOKEN)
    server.add_dataset(DATA, data)
    yield server
    server.stop()


def client(hub: HubStandIn, home: Path, code: str, **env: str) -> dict[str, object]:
    """Run ``code`` in a fresh Python with the stand-in as its Hub; it ends by printing one JSON line."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    full |= {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(home), "HF_HUB_DISABLE_TELEMETRY": "1", **env}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


DOWNLOAD = """
    import json, os
    import datasets
    from huggingface_hub import HfApi, snapshot_download
    offline = os.environ.get("HF_HUB_OFFLINE") == "1"
    snap = snapshot_download("kubetune/tiny")
    out = {"snapshot": snap}
    if not offline:  # offline, the info API is refused before any request: it needs the Hub
        from transformers import AutoModelForCausalLM, AutoTokenizer
        tok = AutoTokenizer.from_pretrained(snap)
        model = AutoModelForCausalLM.from_pretrained(snap)
        out |= {
            "model_sha": HfApi().model_info("kubetune/tiny").sha,
            "data_sha": HfApi().dataset_info("kubetune/chat").sha,
            "layers": model.config.num_hidden_layers,
            "vocab": model.config.vocab_size,
            "encoded": tok.decode(tok("hello there")["input_ids"]),
        }
    rows = datasets.load_dataset("kubetune/chat", revision=os.environ.get("DATA_SHA", out.get("data_sha")), split="train")
    print(json.dumps(out | {"rows": rows.to_list()}))
"""


def test_the_libraries_download_a_model_and_load_a_data_set_from_it(hub: HubStandIn, tmp_path: Path) -> None:
    before = hub.request_count()
    out = client(hub, tmp_path / "hf", DOWNLOAD)
    assert out["model_sha"] == hub.sha(MODEL) and out["data_sha"] == hub.sha(DATA)
    assert str(out["snapshot"]).endswith(f"snapshots/{hub.sha(MODEL)}")
    config = json.loads((hub.folder(MODEL) / "config.json").read_text())
    assert out["layers"] == config["num_hidden_layers"] and out["vocab"] == config["vocab_size"]
    assert out["encoded"] == "hello there"
    assert out["rows"] == ROWS
    seen = hub.requests_since(before)
    assert ("GET", f"/api/models/{MODEL}/revision/main") in seen
    assert any(
        m == "GET" and p.startswith(f"/{MODEL}/resolve/") and "model.safetensors" in p for m, p in seen
    )

    # A second process, offline, with the cache filled: not one request.
    before = hub.request_count()
    again = client(hub, tmp_path / "hf", DOWNLOAD, HF_HUB_OFFLINE="1", DATA_SHA=hub.sha(DATA))
    assert again["rows"] == ROWS and again["snapshot"] == out["snapshot"]
    assert hub.requests_since(before) == []


ERRORS = """
    import json, os
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError
    api = HfApi()
    def outcome(call):
        try:
            call()
        except (GatedRepoError, RevisionNotFoundError, RepositoryNotFoundError) as e:
            return type(e).__name__
        return "ok"
    print(json.dumps({
        "gated_info": outcome(lambda: api.model_info("kubetune/tiny-gated")),
        "gated_file": outcome(lambda: hf_hub_download("kubetune/tiny-gated", "config.json")),
        "wrong_token": outcome(lambda: api.model_info("kubetune/tiny-gated", token="hf_wrong")),
        "token_info": outcome(lambda: api.model_info("kubetune/tiny-gated", token=os.environ["TOKEN"])),
        "token_file": outcome(
            lambda: hf_hub_download("kubetune/tiny-gated", "config.json", token=os.environ["TOKEN"])
        ),
        "missing_repo": outcome(lambda: api.model_info("kubetune/nothing")),
        "missing_file_repo": outcome(lambda: hf_hub_download("kubetune/nothing", "config.json")),
        "missing_revision": outcome(lambda: api.model_info("kubetune/tiny", revision="v9")),
        "by_sha": api.model_info("kubetune/tiny", revision=api.model_info("kubetune/tiny").sha).sha,
    }))
"""


def test_gated_missing_and_unknown_revisions_raise_the_librarys_own_errors(
    hub: HubStandIn, tmp_path: Path
) -> None:
    out = client(hub, tmp_path / "hf", ERRORS, TOKEN=TOKEN)
    assert out == {
        "gated_info": "GatedRepoError",
        "gated_file": "GatedRepoError",
        "wrong_token": "GatedRepoError",
        "token_info": "ok",
        "token_file": "ok",
        "missing_repo": "RepositoryNotFoundError",
        "missing_file_repo": "RepositoryNotFoundError",
        "missing_revision": "RevisionNotFoundError",
        "by_sha": hub.sha(MODEL),
    }


def test_the_commit_is_stable_and_follows_the_content(tmp_path: Path) -> None:
    import urllib.request

    folder = tmp_path / "repo"
    folder.mkdir()
    (folder / "a.txt").write_text("one")
    with HubStandIn(tmp_path / "hub") as hub:
        first = hub.add_model("kubetune/changing", folder)
        assert len(first) == 40 and int(first, 16) >= 0
        assert hub.add_model("kubetune/changing", folder) == first
        (folder / "a.txt").write_text("two")
        second = hub.add_model("kubetune/changing", folder)
        assert second != first
        with urllib.request.urlopen(f"{hub.endpoint}/kubetune/changing/resolve/{second}/a.txt") as resp:
            assert resp.read() == b"two" and resp.headers["X-Repo-Commit"] == second


def test_requests_are_counted_and_can_be_reset(hub: HubStandIn) -> None:
    import urllib.error
    import urllib.request

    hub.reset_counts()
    with urllib.request.urlopen(f"{hub.endpoint}/api/models/{MODEL}/revision/main") as resp:
        assert json.load(resp)["sha"] == hub.sha(MODEL)
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{hub.endpoint}/api/models/kubetune/nothing/revision/main")
    assert err.value.code == 404 and err.value.headers["X-Error-Code"] == "RepoNotFound"
    assert hub.requests == [
        ("GET", f"/api/models/{MODEL}/revision/main"),
        ("GET", "/api/models/kubetune/nothing/revision/main"),
    ]
    hub.reset_counts()
    assert hub.request_count() == 0 and hub.requests == []
