"""kubetune_operator.pod_env: each pod's environment from one table, by the names kubetune_api.pod_env
declares (the trainer reads its own by them; the rules refuse them in spec.env)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kubetune_api import pod_env as names
from kubetune_api import spec
from kubetune_api.registration import FORCE_ENV, FORCE_FLAG
from kubetune_api.tuning import TUNING_ENV
from kubetune_operator import builders
from kubetune_operator.pod_env import TABLE, Context, Pod, SpecEnv, Var, env, names_set
from kubetune_operator.settings import Settings
from kubetune_trainer import settings as trainer_settings

REPO = Path(__file__).resolve().parents[2]
# What the trainer reads from its environment that a spec may set: the tuning variables, the test
# hook, and the libraries' own settings that kubetune only looks at before setting its default.
USER_SETTABLE = {
    *TUNING_ENV,
    names.FAULT_INJECT_ENV,
    trainer_settings.COMPILE_THREADS_ENV,
    trainer_settings.OMP_THREADS_ENV,
}


def _job(*, started: bool = False, **spec_fields: object) -> spec.FineTuneJob:
    """multinode-lora.yaml with ``spec_fields``; ``started``: a job the API server admitted under
    earlier rules (the operator does not check it again)."""
    doc = yaml.safe_load((REPO / "examples" / "multinode-lora.yaml").read_text())
    doc["metadata"] = {"name": "j", "namespace": "ml", "uid": "u"}
    doc["spec"].update(spec_fields)
    if started:
        doc["status"] = {"phase": "Training"}
    return spec.parse_job(doc)


class _Reads(dict[str, str]):
    """An environment that records every name read from it."""

    def __init__(self) -> None:
        super().__init__()
        self.read: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> str:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.read.add(str(key))
        return super().__contains__(key)


def test_every_variable_is_one_row_and_its_name_is_declared_in_the_api() -> None:
    rows = [row.name for row in TABLE if isinstance(row, Var)]
    assert len(rows) == len(set(rows)), rows
    declared = (
        set(names.OPERATOR_ENV) | set(names.DEFAULTED_ENV) | set(names.POD_ENV) | {names.HF_ENDPOINT_ENV}
    )
    assert set(rows) <= declared, set(rows) - declared
    assert {n for n in rows if n.startswith("KUBETUNE_")} == set(names.OPERATOR_ENV)
    # no control setting travels in the environment: the commands carry them (test_control_settings)
    assert not set(rows) & set(trainer_settings.IGNORED_CONTROL_ENV)
    assert sum(isinstance(row, SpecEnv) for row in TABLE) == 1


def test_every_name_the_operator_sets_is_refused_in_spec_env_in_any_case() -> None:
    for name in [row.name for row in TABLE if isinstance(row, Var)] + list(names.TRAINING_OPERATOR_ENV):
        for variant in (name, name.lower(), name.capitalize()):
            assert names.reserved(variant) is not None, variant


def test_every_control_name_the_trainer_reads_is_refused_in_spec_env() -> None:
    env = _Reads()
    read = trainer_settings.from_environ(env)
    read.tuning()
    # the former control variables are looked at (to say they are ignored), never used
    assert FORCE_ENV in env.read and names.CONFIG_ENV not in env.read  # the config: a path, below
    control = env.read - USER_SETTABLE
    assert {FORCE_ENV, "RANK", "HF_TOKEN", "MLFLOW_TRACKING_TOKEN", "TORCHELASTIC_RUN_ID"} <= control
    assert not [n for n in control if names.reserved(n) is None]
    # what a spec may set stays settable: the tuning variables are checked value by value instead
    assert not [n for n in USER_SETTABLE if names.reserved(n) is not None]
    # ... and exactly as written: a lowercase twin of a tuning variable is a typo, refused
    assert names.reserved("kubetune_sharding") is names.KUBETUNE_CONTROL
    # and the trainer finds its config where the operator mounts it, named by the operator's variable
    assert names.reserved(names.CONFIG_ENV) is names.KUBETUNE_CONTROL


def test_a_spec_env_entry_never_replaces_what_the_operator_sets() -> None:
    """A job admitted before the rules refused these (the operator does not check a started job
    again): none of its entries reaches a pod, in any case; its ordinary entries do."""
    ref = {"secretKeyRef": {"name": "s", "key": "k"}}
    attack = [
        {"name": FORCE_ENV, "value": "1"},
        {"name": "kubetune_register_force", "value": "yes"},
        {"name": names.CONFIG_ENV, "value": "/tmp/mine.yaml"},
        {"name": "KUBETUNE_REGISTER_CLAIM_WAIT_S", "value": "0"},
        {"name": names.HF_ENDPOINT_ENV, "value": "https://evil.example.com"},
        {"name": "HF_HUB_OFFLINE", "value": "0"},
        {"name": "MLFLOW_TRACKING_URI", "value": "https://evil.example.com"},
        {"name": "MLFLOW_RUN_ID", "value": "0123"},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
        {"name": "home", "value": "/root"},
        {"name": "RANK", "valueFrom": ref},
        {"name": "NCCL_DEBUG", "value": "INFO"},
    ]
    job = _job(started=True, env=attack)
    settings = Settings(hf_endpoint="https://hub.mirror")
    for pod in Pod:
        got = env(Context(job, settings, pod, "img", "c"))
        from_spec = [e for e in got if e["name"].upper() in {a["name"].upper() for a in attack}]
        assert [e["name"] for e in from_spec if e["name"] not in names_set(pod)] == ["NCCL_DEBUG"]
        by_name = {e["name"]: e for e in got}
        assert len(by_name) == len(got), pod  # each name once
        assert by_name["HOME"]["value"] != "/root" and by_name["HF_ENDPOINT"]["value"] == "https://hub.mirror"
        assert "home" not in by_name and "kubetune_register_force" not in by_name
        assert not [e for e in got if e["name"].upper() == FORCE_ENV]
    # forced only where the operator forces it, and on the command line: the registration retried
    # past its gate; the trainer ignores the variable whatever its value (test_control_settings)
    for force in (False, True):
        reg = builders.build_registration_job(job, settings, force=force)["spec"]["template"]["spec"]
        (container,) = reg["containers"]
        assert (FORCE_FLAG in container["command"]) is force
        assert FORCE_ENV not in {e["name"].upper() for e in container["env"]}


def test_the_trainer_reads_the_names_the_operator_sets() -> None:
    # kubetune_trainer.settings is where the trainer reads its environment
    read = trainer_settings.from_environ({names.IMAGE_ENV: "img:1", names.CPUS_ENV: "6"})
    assert (read.image, read.cpus_requested, read.ignored_control) == ("img:1", 6, ())


def test_each_pod_gets_its_rows_in_table_order_with_the_jobs_own_entries_in_place() -> None:
    ref = {"name": "s", "key": "k"}
    job = _job(
        secrets={"huggingFaceToken": ref, "mlflowTrackingPassword": ref},
        env=[{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "HF_HUB_DOWNLOAD_TIMEOUT", "value": "60"}],
    )
    job.spec.resources.cpu = "8"
    settings = Settings(hf_endpoint="https://hub.mirror")
    got = {pod: env(Context(job, settings, pod, "img", "c")) for pod in Pod}
    order = {name: i for i, name in enumerate(row.name if isinstance(row, Var) else "*" for row in TABLE)}
    for pod, entries in got.items():
        own = [e["name"] for e in entries if e["name"] in ("NCCL_DEBUG", "HF_HUB_DOWNLOAD_TIMEOUT")]
        assert own == ["NCCL_DEBUG", "HF_HUB_DOWNLOAD_TIMEOUT"], pod  # spec.env as written
        ours = [e["name"] for e in entries if e["name"] not in own]
        assert ours == sorted(ours, key=lambda n: order[n]), pod
        assert set(ours) <= set(names_set(pod)), pod
    training = {e["name"]: e for e in got[Pod.TRAINING]}
    assert "PYTHONUNBUFFERED" not in training and FORCE_ENV not in training  # the Training Operator's
    assert training["HF_DATASETS_OFFLINE"]["value"] == training["HF_HUB_OFFLINE"]["value"] == "1"
    assert training["KUBETUNE_CPUS"]["valueFrom"]["resourceFieldRef"]["containerName"] == "c"
    assert training["HF_ENDPOINT"]["value"] == "https://hub.mirror"
    assert training["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": ref}
    assert "MLFLOW_TRACKING_TOKEN" not in training  # a Secret not referenced: no variable
    registration = [e["name"] for e in got[Pod.REGISTRATION]]
    assert registration[0] == "PYTHONUNBUFFERED"
    assert not [e for pod in Pod for e in got[pod] if e["name"] in trainer_settings.IGNORED_CONTROL_ENV]


def test_the_builders_take_each_pods_env_from_the_table() -> None:
    job, settings = _job(), Settings()
    image = job.spec.image or settings.trainer_image
    ptj = builders.build_pytorchjob(job, settings)
    master = ptj["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert master["env"] == env(Context(job, settings, Pod.TRAINING, image, builders.TRAIN_CONTAINER))
    prep = builders.build_preparation_job(job, settings)["spec"]["template"]["spec"]["containers"][0]
    assert prep["env"] == env(Context(job, settings, Pod.PREPARATION, image, builders.PREPARE_CONTAINER))
    forced = builders.build_registration_job(job, settings, force=True)
    reg = forced["spec"]["template"]["spec"]["containers"][0]
    assert reg["env"] == env(Context(job, settings, Pod.REGISTRATION, image, builders.REGISTER_CONTAINER))
    assert reg["command"] == builders.register_command(force=True) and reg["command"][-1] == FORCE_FLAG


@pytest.mark.parametrize(
    "name",
    [
        "HUGGINGFACE_CO_STAGING",
        "HUGGINGFACE_ASSETS_CACHE",
        "HF_MODULES_CACHE",
        "HF_DATASETS_DOWNLOADED_DATASETS_PATH",
        "HF_DATASETS_EXTRACTED_DATASETS_PATH",
        "NCCL_NET_PLUGIN",
        "NCCL_TUNER_PLUGIN",
        "NCCL_PROFILER_PLUGIN",
        "TRITON_CACHE_MANAGER",
        "OPENSSL_CONF",
        "OPENSSL_MODULES",
        "PYTHONWARNINGS",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
        "HTTP_PROXY",
        "https_proxy",
        "No_Proxy",
        "all_proxy",
        "REQUESTS_CA_BUNDLE",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "CURL_CA_BUNDLE",
    ],
)
def test_hub_code_loading_and_traffic_variables_are_refused_in_spec_env(name: str) -> None:
    assert names.reserved(name) is not None
    # tuning stays the spec's
    assert names.reserved("NCCL_DEBUG") is None and names.reserved("HF_HUB_DOWNLOAD_TIMEOUT") is None
