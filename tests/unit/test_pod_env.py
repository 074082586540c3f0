"""kubetune_operator.pod_env: each pod's environment from one table, by the names kubetune_api.pod_env
declares (the trainer reads its own by them; the rules refuse them in spec.env)."""

from __future__ import annotations

from pathlib import Path

import yaml

from kubetune_api import pod_env as names
from kubetune_api import spec
from kubetune_api.registration import FORCE_ENV
from kubetune_operator import builders
from kubetune_operator.pod_env import TABLE, Context, Pod, SpecEnv, Var, env, names_set
from kubetune_operator.settings import Settings
from kubetune_trainer import settings as trainer_settings

REPO = Path(__file__).resolve().parents[2]
# Set by the operator but not refused in spec.env: a job may name its own Hub mirror, and a forced
# registration is what KUBETUNE_REGISTER_FORCE in spec.env asks for too (kubetune register --force)
NOT_REFUSED = {names.HF_ENDPOINT_ENV, FORCE_ENV}


def _job(**spec_fields: object) -> spec.FineTuneJob:
    doc = yaml.safe_load((REPO / "examples" / "multinode-lora.yaml").read_text())
    doc["metadata"] = {"name": "j", "namespace": "ml", "uid": "u"}
    doc["spec"].update(spec_fields)
    return spec.parse_job(doc)


def test_every_variable_is_one_row_and_its_name_is_declared_in_the_api() -> None:
    rows = [row.name for row in TABLE if isinstance(row, Var)]
    assert len(rows) == len(set(rows)), rows
    declared = (
        set(names.OPERATOR_ENV)
        | set(names.DEFAULTED_ENV)
        | set(names.POD_ENV)
        | {names.HF_ENDPOINT_ENV, FORCE_ENV}
    )
    assert set(rows) <= declared, set(rows) - declared
    # the operator's own variables, refused in spec.env by their own rule, are exactly its KUBETUNE_ rows
    assert {n for n in rows if n.startswith("KUBETUNE_")} - {FORCE_ENV} == set(names.OPERATOR_ENV)
    # everything else the table sets is refused in spec.env, or gives way to it, or is a known exception
    refused = set(names.POD_ENV) | set(names.OPERATOR_ENV)
    assert set(rows) - refused - set(names.DEFAULTED_ENV) == NOT_REFUSED
    assert sum(isinstance(row, SpecEnv) for row in TABLE) == 1


def test_the_trainer_reads_the_names_the_operator_sets() -> None:
    # kubetune_trainer.settings is where the trainer reads its environment
    read = trainer_settings.from_environ(
        {names.IMAGE_ENV: "img:1", names.CPUS_ENV: "6", names.SHUTDOWN_GRACE_ENV: "42"}
    )
    assert (read.image, read.cpus_requested, read.shutdown_grace_s()) == ("img:1", 6, 42)


def test_each_pod_gets_its_rows_in_table_order_with_the_jobs_own_entries_in_place() -> None:
    ref = {"name": "s", "key": "k"}
    job = _job(
        secrets={"huggingFaceToken": ref, "mlflowTrackingPassword": ref},
        env=[{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "HF_HUB_OFFLINE", "value": "0"}],
    )
    job.spec.resources.cpu = "8"
    settings = Settings(hf_endpoint="https://hub.mirror")
    got = {pod: env(Context(job, settings, pod, "img", "c", force=True)) for pod in Pod}
    order = {name: i for i, name in enumerate(row.name if isinstance(row, Var) else "*" for row in TABLE)}
    for pod, entries in got.items():
        own = [e["name"] for e in entries if e["name"] in ("NCCL_DEBUG", "HF_HUB_OFFLINE") and "value" in e]
        assert own == ["NCCL_DEBUG", "HF_HUB_OFFLINE"], pod  # spec.env as written
        ours = [e["name"] for e in entries if e["name"] not in own]
        assert ours == sorted(ours, key=lambda n: order[n]), pod
        assert set(ours) <= set(names_set(pod)), pod
    training = {e["name"]: e for e in got[Pod.TRAINING]}
    assert "PYTHONUNBUFFERED" not in training and FORCE_ENV not in training  # the Training Operator's
    assert training["HF_DATASETS_OFFLINE"]["value"] == "1"  # HF_HUB_OFFLINE: spec.env's, once
    assert [e["name"] for e in got[Pod.TRAINING]].count("HF_HUB_OFFLINE") == 1
    assert training["KUBETUNE_CPUS"]["valueFrom"]["resourceFieldRef"]["containerName"] == "c"
    assert training["HF_ENDPOINT"]["value"] == "https://hub.mirror"
    assert training["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": ref}
    assert "MLFLOW_TRACKING_TOKEN" not in training  # a Secret not referenced: no variable
    registration = [e["name"] for e in got[Pod.REGISTRATION]]
    assert registration[0] == "PYTHONUNBUFFERED" and registration[-1] == FORCE_ENV
    assert FORCE_ENV not in [e["name"] for e in got[Pod.PREPARATION]]


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
    assert reg["env"] == env(
        Context(job, settings, Pod.REGISTRATION, image, builders.REGISTER_CONTAINER, True)
    )
