"""A confused deputy, through real RBAC: a user who may only edit namespace A tries to make kubetune
reach what the user may not (issue 33 item 8).

On the real API server: the user ``alice`` holds the built-in ``edit`` role in namespace A and no
more (bound by a RoleBinding there), with what the chart aggregates into it for kubetune's own
resource (its ``<fullname>-edit`` ClusterRole, rendered by helm: every verb on finetunejobs, not their
status); the test acts as that user by impersonation (``kubectl --as``). The operator runs as a
ServiceAccount holding exactly the chart's rules (:mod:`kubetune_operator.rbac`), bound cluster-wide
as the chart does by default: the operator *could* read and create in namespace B, so only
kubetune's own rules keep a job inside its namespace. Registry tenancy is on, as the chart's default
(``namespace-prefix``).

Namespace B holds what the user wants: a Secret ``hf``, a PersistentVolumeClaim ``data`` and a
Succeeded FineTuneJob ``base`` (its model, its checkpoint volume). Each attempt of :data:`ATTEMPTS`
must fail with a message naming the field or the rule: the API server refuses the create (the
structural schema with strict field validation, a CEL rule, a transition rule), or the operator
fails the job before creating any child, with a condition and a Warning event.
Afterwards namespace B is exactly as it was (no object added or changed), no child of a refused job
exists, and the user still cannot read B's Secret directly (the control). :data:`OWN_NAMESPACE` are
the forms that the API admits because they name an object without a namespace: each resolves in
the job's own namespace, never B's. Last, with the chart's shared trainer ServiceAccount (whose token
the user may mint), a refused job whose status the user resets to ``Pending`` is refused again.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.integration.conftest import (
    bind_operator_role,
    condition,
    denials,
    events_for,
    get_job,
    kopf_runner,
    kubeconfig_for_service_account,
    load_example,
    wait_for,
    wait_phase,
)
from tests.support.controlplane import ControlPlane
from tests.support.operator import OperatorProcess
from tests.unit.test_chart import render

pytestmark = [pytest.mark.integration]

USER = "alice@team-a.example"
API = "kubetune.io/v1alpha1"
# Every kind a job's children are, and every kind namespace B holds: compared before and after.
KINDS = [
    ("v1", "PersistentVolumeClaim", "persistentvolumeclaims"),
    ("v1", "ConfigMap", "configmaps"),
    ("v1", "Secret", "secrets"),
    ("v1", "ServiceAccount", "serviceaccounts"),
    ("v1", "Pod", "pods"),
    ("batch/v1", "Job", "jobs"),
    ("kubeflow.org/v1", "PyTorchJob", "pytorchjobs"),
    ("rbac.authorization.k8s.io/v1", "Role", "roles"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings"),
    (API, "FineTuneJob", "finetunejobs"),
]


@dataclass(frozen=True)
class Teams:
    a: str  # the user's namespace
    b: str  # another team's
    system: str  # the operator's
    cp: ControlPlane
    user_role: str  # the ClusterRole alice holds in A (bound there): edit, as the chart aggregates it

    def as_user(self, *args: str, input: str | None = None) -> Any:
        return self.cp.kubectl(f"--as={USER}", *args, input=input, check=False)


Change = Callable[[dict[str, Any], Teams], None]


@dataclass(frozen=True)
class Attempt:
    """One thing the user tries, and the refusal it must meet: ``by`` the API server (``message``
    in kubectl's error) or the operator (``reason`` on the Ready condition, ``message`` in it)."""

    id: str
    goal: str  # one of GOALS
    change: Change
    by: str  # "admission" | "operator"
    message: str  # formatted with a= and b=, the namespaces
    reason: str = ""
    patch: dict[str, Any] | None = None  # an update of an admitted job instead of a create


def _set(path: str, value: Any) -> Change:
    """Set ``path`` (dots; ``{b}`` in a string value is namespace B) in the manifest."""

    def change(doc: dict[str, Any], teams: Teams) -> None:
        *parents, last = path.split(".")
        node = doc
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = _fill(value, teams)

    return change


def _fill(value: Any, teams: Teams) -> Any:
    if isinstance(value, str):
        return value.format(a=teams.a, b=teams.b)
    if isinstance(value, dict):
        return {k: _fill(v, teams) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, teams) for v in value]
    return value


def _both(*changes: Change) -> Change:
    def change(doc: dict[str, Any], teams: Teams) -> None:
        for c in changes:
            c(doc, teams)

    return change


def _env(*entries: dict[str, Any]) -> Change:
    return _set("spec.env", list(entries))


def _unset(path: str) -> Change:
    def change(doc: dict[str, Any], teams: Teams) -> None:
        *parents, last = path.split(".")
        node = doc
        for key in parents:
            node = node[key]
        node.pop(last, None)

    return change


def _unknown(field: str) -> str:
    return f'strict decoding error: unknown field "{field}"'


def _from_volume(kind: str, claim: str) -> Change:
    """The model or the data read from a path on a volume (``claim``)."""
    if kind == "model":
        return _set("spec.model", {"path": "/models/base", "volume": {"claimName": claim}})
    return _set(
        "spec.dataset",
        {
            "path": "/data/train.jsonl",
            "volume": {"claimName": claim},
            "format": "messages",
            "evalFraction": 0.1,
        },
    )


FORCE = "KUBETUNE_REGISTER_FORCE"


def _pattern(field: str, value: str) -> str:
    """The structural schema's refusal of a value outside the field's pattern."""
    return f'{field}: Invalid value: "{value}": {field} in body should match'


CONTROL_ENV = (
    "spec.env[0].name: Invalid value: spec.env[].name must not be a kubetune control variable (KUBETUNE_*)"
)
GATE_IMMUTABLE = "spec.registration.gate: Invalid value: spec.registration.gate is immutable once created"

# fmt: off
ATTEMPTS = [
    # --- 1. another namespace's volume ---
    Attempt("model-volume-of-b", "volume", _from_volume("model", "{b}/data"), "admission",
            _pattern("spec.model.volume.claimName", "{b}/data")),
    Attempt("data-volume-of-b", "volume", _from_volume("dataset", "{b}/data"), "admission",
            _pattern("spec.dataset.volume.claimName", "{b}/data")),
    Attempt("checkpoints-on-b", "volume", _set("spec.storage.existingClaim", "{b}/data"), "admission",
            _pattern("spec.storage.existingClaim", "{b}/data")),
    Attempt("volume-namespace-field", "volume",
            _both(_from_volume("model", "data"), _set("spec.model.volume.namespace", "{b}")), "admission",
            _unknown("spec.model.volume.namespace")),
    # --- 2. another namespace's Secret ---
    Attempt("secret-of-b", "secret", _set("spec.secrets.huggingFaceToken", {"name": "{b}/hf", "key": "token"}),
            "admission", _pattern("spec.secrets.huggingFaceToken.name", "{b}/hf")),
    Attempt("secret-namespace-field", "secret",
            _set("spec.secrets.huggingFaceToken", {"name": "hf", "key": "token", "namespace": "{b}"}),
            "admission", _unknown("spec.secrets.huggingFaceToken.namespace")),
    Attempt("env-secret-of-b", "secret",
            _env({"name": "HUB_TOKEN_B", "valueFrom": {"secretKeyRef": {"name": "{b}/hf", "key": "token"}}}),
            "admission", _pattern("spec.env[0].valueFrom.secretKeyRef.name", "{b}/hf")),
    Attempt("env-secret-namespace-field", "secret",
            _env({"name": "HUB_TOKEN_B",
                  "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token", "namespace": "{b}"}}}),
            "admission", _unknown("spec.env[0].valueFrom.secretKeyRef.namespace")),
    Attempt("env-from-secret", "secret", _set("spec.envFrom", [{"secretRef": {"name": "hf"}}]), "admission",
            _unknown("spec.envFrom")),
    Attempt("env-projected-volume", "secret",
            _set("spec.volumes", [{"name": "b", "secret": {"secretName": "hf"}}]), "admission",
            _unknown("spec.volumes")),
    # --- 3. pods under another ServiceAccount, or privileged ---
    Attempt("service-account", "identity", _set("spec.serviceAccountName", "default"), "admission",
            _unknown("spec.serviceAccountName")),
    Attempt("resources-service-account", "identity", _set("spec.resources.serviceAccountName", "default"),
            "admission", _unknown("spec.resources.serviceAccountName")),
    Attempt("privileged", "identity", _set("spec.securityContext", {"privileged": True, "runAsUser": 0}),
            "admission", _unknown("spec.securityContext")),
    Attempt("resources-privileged", "identity", _set("spec.resources.securityContext", {"privileged": True}),
            "admission", _unknown("spec.resources.securityContext")),
    Attempt("host-path", "identity",
            _set("spec.volumes", [{"name": "root", "hostPath": {"path": "/"}}]), "admission",
            _unknown("spec.volumes")),
    Attempt("host-network", "identity", _set("spec.resources.hostNetwork", True), "admission",
            _unknown("spec.resources.hostNetwork")),
    Attempt("pod-template", "identity",
            _set("spec.podTemplate", {"spec": {"serviceAccountName": "default"}}), "admission",
            _unknown("spec.podTemplate")),
    Attempt("config-redirect", "identity", _env({"name": "KUBETUNE_CONFIG", "value": "/tmp/mine.yaml"}),
            "admission", CONTROL_ENV),
    # --- 4. chain from another namespace's job ---
    Attempt("from-job-of-b", "chain", _set("spec.model", {"fromJob": {"name": "{b}/base"}}), "admission",
            _pattern("spec.model.fromJob.name", "{b}/base")),
    Attempt("from-job-namespace-field", "chain",
            _set("spec.model", {"fromJob": {"name": "base", "namespace": "{b}"}}), "admission",
            _unknown("spec.model.fromJob.namespace")),
    # --- 5. register under another team's model name (registry tenancy) ---
    Attempt("model-name-of-b", "registry", _set("spec.registration.modelName", "{b}.assistant"), "operator",
            "spec.registration.modelName '{b}.assistant' is outside its namespace's names", "ModelNameNotAllowed"),
    Attempt("alias-of-b", "registry",
            _both(_set("spec.registration.modelName", "{b}.base"), _set("spec.registration.alias", "champion")),
            "operator", "spec.registration.modelName '{b}.base' is outside its namespace's names",
            "ModelNameNotAllowed"),
    Attempt("start-from-model-of-b", "registry", _set("spec.model", {"registered": "models:/{b}.base@champion"}),
            "operator", "spec.model.registered '{b}.base' is outside its namespace's names",
            "ModelNameNotAllowed"),
    Attempt("version-of-model-of-b", "registry", _set("spec.model", {"registered": "models:/{b}.base/3"}),
            "operator", "spec.model.registered '{b}.base' is outside its namespace's names",
            "ModelNameNotAllowed"),
    Attempt("experiment-of-b", "registry", _set("spec.registration.experiment", "kubetune/{b}"), "operator",
            "spec.registration.experiment 'kubetune/{b}' is outside its namespace's experiments",
            "ModelNameNotAllowed"),
    Attempt("unprefixed-job-name", "registry", _unset("spec.registration.modelName"), "operator",
            "spec.registration.modelName (unset: the job's name) 'unprefixed-job-name' is outside its "
            "namespace's names", "ModelNameNotAllowed"),
    Attempt("experiment-climbing-to-b", "registry", _set("spec.registration.experiment", "kubetune/{a}/../{b}"),
            "admission", "spec.registration.experiment must not have a '.' or '..' part"),
    # --- 6. skip the evaluation gate ---
    Attempt("force-env", "gate", _env({"name": FORCE, "value": "1"}), "admission", CONTROL_ENV),
    Attempt("force-env-lowercase", "gate", _env({"name": FORCE.lower(), "value": "1"}), "admission",
            CONTROL_ENV),
    Attempt("force-env-from-secret", "gate",
            _env({"name": FORCE, "valueFrom": {"secretKeyRef": {"name": "force", "key": "v"}}}), "admission",
            CONTROL_ENV),
    Attempt("gate-loosened", "gate", _set("spec.registration.gate", {"maxEvalLoss": 1.5}), "admission",
            GATE_IMMUTABLE, patch={"spec": {"registration": {"gate": {"maxEvalLoss": 1000}}}}),
    Attempt("gate-removed", "gate", _set("spec.registration.gate", {"maxEvalLoss": 1.5}), "admission",
            GATE_IMMUTABLE, patch={"spec": {"registration": {"gate": None}}}),
    # --- 7. make the job fail or restart at will: the trainer's test hook, off on this operator ---
    Attempt("fault-injection-hook", "hook", _env({"name": "KUBETUNE_FAULT_INJECT", "value": "cuda-oom:6:4"}),
            "operator", "spec.env[0].name: KUBETUNE_FAULT_INJECT is the trainer's test hook", "InvalidSpec"),
]
# fmt: on


# What issue 33 item 8 lists: another namespace's volume or Secret, another ServiceAccount or a
# privileged pod, a chain from another namespace's job, another team's model name, the gate skipped;
# and the trainer's test hook, which an operator honours only where its platform turned it on.
GOALS = ("volume", "secret", "identity", "chain", "registry", "gate", "hook")


def test_the_table_tries_every_goal() -> None:
    assert sorted({a.goal for a in ATTEMPTS}) == sorted(GOALS)
    assert len({a.id for a in ATTEMPTS}) == len(ATTEMPTS)


# --- the two teams, the user, the operator -----------------------------------------------------------


def _aggregated_rules(cp: ControlPlane, name: str, seen: set[str] | None = None) -> list[dict[str, Any]]:
    """The rules of ClusterRole ``name`` as the controller manager's aggregation fills them in (none
    runs here): its own, or those of every ClusterRole its selectors match, aggregated in turn
    (``edit`` aggregates ``view``, itself aggregated)."""
    seen = set() if seen is None else seen
    seen.add(name)
    role = json.loads(cp.kubectl("get", "clusterrole", name, "-o", "json").stdout)
    rules: list[dict[str, Any]] = list(role.get("rules") or [])
    for selector in (role.get("aggregationRule") or {}).get("clusterRoleSelectors") or []:
        labels = ",".join(f"{k}={v}" for k, v in selector["matchLabels"].items())
        for found in json.loads(cp.kubectl("get", "clusterrole", "-l", labels, "-o", "json").stdout)["items"]:
            if found["metadata"]["name"] not in seen:
                rules.extend(_aggregated_rules(cp, found["metadata"]["name"], seen))
    return rules


def _chart_roles(suffix: str, component: str, *values: str) -> list[dict[str, Any]]:
    """The chart's ClusterRoles of ``component`` (helm template with ``values``), named for this
    module: ``user-roles``, aggregated into the default roles (rbac.aggregateToDefaultRoles), or
    ``trainer``, the shared trainer identity's (trainer.serviceAccount.name)."""
    objs = render(*values, release=f"deputy-{suffix}")
    return [
        o
        for o in objs
        if o["kind"] == "ClusterRole"
        and o["metadata"]["labels"].get("app.kubernetes.io/component") == component
    ]


def _user_role(cp: ControlPlane, name: str) -> dict[str, Any]:
    """``edit`` as the controller manager's aggregation makes it, with the chart's ClusterRoles applied:
    the built-in rules and the chart's on FineTuneJobs (not their status)."""
    rules = _aggregated_rules(cp, "edit")
    assert any("secrets" in r.get("resources", []) for r in rules), "edit reads its own namespace's Secrets"
    kubetune = [r for r in rules if "kubetune.io" in r.get("apiGroups", [])]
    assert {"create", "patch", "delete"} <= {
        v for r in kubetune if "finetunejobs" in r["resources"] for v in r["verbs"]
    }
    assert not [r for r in kubetune if "finetunejobs/status" in r["resources"] and "patch" in r["verbs"]]
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": rules,
    }


def _team_b(kube: Any, cp: ControlPlane, b: str) -> None:
    """What another team has: a Secret, a volume, and a Succeeded job (its model)."""
    cp.kubectl("create", "secret", "generic", "hf", "-n", b, "--from-literal=token=hf_team_b_secret")
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data", "namespace": b},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        }
    )
    base = load_example("qwen3-4b-full.yaml", b)
    base["metadata"]["name"] = "base"
    base["spec"]["registration"]["modelName"] = f"{b}.base"
    kube.create(base)
    t = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    kube.patch(
        API,
        "FineTuneJob",
        b,
        "base",
        {
            "status": {
                "phase": "Succeeded",
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "Succeeded",
                        "message": "done",
                        "lastTransitionTime": t,
                    }
                ],
            }
        },
        subresource="status",
    )


def snapshot(kube: Any, namespace: str) -> dict[str, str]:
    """Every object of :data:`KINDS` in ``namespace``: kind/name -> resourceVersion."""
    out: dict[str, str] = {}
    for api, kind, plural in KINDS:
        base = f"/api/{api}" if "/" not in api else f"/apis/{api}"
        for item in kube.request("GET", f"{base}/namespaces/{namespace}/{plural}").get("items") or []:
            out[f"{kind}/{item['metadata']['name']}"] = item["metadata"]["resourceVersion"]
    return out


@pytest.fixture(scope="module")
def teams(control_plane: ControlPlane, kube: Any) -> Iterator[Teams]:
    suffix = uuid.uuid4().hex[:5]
    role = f"deputy-edit-{suffix}"
    t = Teams(
        a=f"team-a-{suffix}",
        b=f"team-b-{suffix}",
        system=f"kubetune-system-{suffix}",
        cp=control_plane,
        user_role=role,
    )
    system = t.system
    operator_role = f"deputy-operator-{suffix}"
    chart_roles = _chart_roles(suffix, "user-roles")
    assert len(chart_roles) == 2, chart_roles
    for ns in (t.a, t.b, system):
        control_plane.kubectl("create", "namespace", ns)
    try:
        # the user: edit in A only, with the chart's roles aggregated into it (finetunejobs)
        for chart_role in chart_roles:
            control_plane.kubectl("apply", "-f", "-", input=json.dumps(chart_role))
        control_plane.kubectl("apply", "-f", "-", input=json.dumps(_user_role(control_plane, role)))
        control_plane.kubectl(
            "create", "rolebinding", "alice-edit", "-n", t.a, f"--clusterrole={role}", f"--user={USER}"
        )
        # the operator: the chart's rules, bound cluster-wide (the chart's default)
        bind_operator_role(control_plane, system, operator_role)
        _team_b(kube, control_plane, t.b)
        yield t
    finally:
        control_plane.kubectl("delete", "clusterrolebinding", operator_role, check=False)
        for name in (operator_role, role, *(r["metadata"]["name"] for r in chart_roles)):
            control_plane.kubectl("delete", "clusterrole", name, check=False)
        for ns in (t.a, t.b, system):
            control_plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.fixture(scope="module")
def operator(teams: Teams, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The operator as its ServiceAccount, watching A, with registry tenancy on (the chart's default)."""
    kubeconfig = kubeconfig_for_service_account(
        teams.cp, teams.system, "kubetune-operator", tmp_path_factory.mktemp("op") / "kc"
    )
    env = {
        "KUBECONFIG": str(kubeconfig),
        "KUBETUNE_TRAINER_IMAGE": "registry.example.com/kubetune/trainer:test",
        "KUBETUNE_MLFLOW_TRACKING_URI": "http://mlflow.mlflow.svc:5000",
        "KUBETUNE_RETRY_SECONDS": "1",
        "KUBETUNE_PREPARATION": "false",
        "KUBETUNE_REGISTRY_TENANCY": "namespace-prefix",
    }
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        with kopf_runner(teams.a) as runner:
            yield runner
    # the operator never asked for what its rules do not grant
    assert not denials(runner.output), "\n".join(denials(runner.output))


@pytest.fixture(scope="module")
def before(teams: Teams, kube: Any) -> dict[str, str]:
    """Namespace B as it was before any attempt."""
    return snapshot(kube, teams.b)


def _manifest(teams: Teams, name: str, change: Change) -> dict[str, Any]:
    doc = load_example("qwen3-4b-full.yaml", teams.a)
    doc["metadata"]["name"] = name
    doc["spec"]["registration"]["modelName"] = f"{teams.a}.assistant"
    change(doc, teams)
    return doc


def _children(kube: Any, namespace: str, job: str) -> list[str]:
    """Objects of :data:`KINDS` in ``namespace`` named after ``job`` (every child's name is
    ``<job>-<suffix>``)."""
    found = []
    for key in snapshot(kube, namespace):
        kind, _, name = key.partition("/")
        if name.startswith(f"{job}-") and kind != "FineTuneJob":
            found.append(key)
    return found


def _create_as_user(teams: Teams, doc: dict[str, Any]) -> Any:
    # JSON: kubectl's YAML would read some strings as numbers. kubectl validates strictly by default
    # (fieldValidation=Strict): an unknown field is refused, not dropped.
    return teams.as_user("create", "-n", teams.a, "-f", "-", input=json.dumps(doc))


@pytest.mark.parametrize("attempt", ATTEMPTS, ids=[a.id for a in ATTEMPTS])
def test_each_attempt_is_refused_naming_the_rule(
    attempt: Attempt, teams: Teams, kube: Any, operator: Any, before: dict[str, str]
) -> None:
    name = attempt.id
    message = attempt.message.format(a=teams.a, b=teams.b)
    doc = _manifest(teams, name, attempt.change)
    if attempt.patch is not None:
        created = _create_as_user(teams, doc)
        assert created.returncode == 0, created.stderr
        out = teams.as_user(
            "patch", "finetunejob", name, "-n", teams.a, "--type=merge", "-p", json.dumps(attempt.patch)
        )
        assert out.returncode != 0, out.stdout
        assert message in out.stderr, out.stderr
        assert "is invalid" in out.stderr, out.stderr
        assert get_job(kube, teams.a, name)["spec"]["registration"]["gate"] == {"maxEvalLoss": 1.5}
    elif attempt.by == "admission":
        out = _create_as_user(teams, doc)
        assert out.returncode != 0, f"admitted: {out.stdout}"
        assert message in out.stderr, out.stderr
        assert out.stderr.count("Invalid value") <= 1, f"refused for more than the attempt: {out.stderr}"
        assert kube.get(API, "FineTuneJob", teams.a, name) is None
        assert _children(kube, teams.a, name) == []
    else:
        out = _create_as_user(teams, doc)
        assert out.returncode == 0, out.stderr
        obj = wait_phase(kube, teams.a, name, "Failed", timeout=30)
        ready = condition(obj, "Ready")
        assert ready["reason"] == attempt.reason, ready
        assert message in ready["message"], ready["message"]
        warnings = wait_for(
            lambda: [e for e in events_for(kube, teams.a, name) if e["type"] == "Warning"], what="a Warning"
        )
        assert [e["reason"] for e in warnings] == [attempt.reason]
        assert message in warnings[0]["message"]
        time.sleep(1)  # more passes: still nothing
        assert _children(kube, teams.a, name) == []
    assert snapshot(kube, teams.b) == before


# --- the forms the API admits: a name without a namespace resolves in the job's own ---------------


def _pod_specs(kube: Any, namespace: str, job: str) -> list[dict[str, Any]]:
    ptj = kube.get("kubeflow.org/v1", "PyTorchJob", namespace, f"{job}-train")
    return [r["template"]["spec"] for r in ptj["spec"]["pytorchReplicaSpecs"].values()]


def _claims(spec: dict[str, Any]) -> set[str]:
    return {v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v}


def _secret_refs(spec: dict[str, Any]) -> set[str]:
    return {
        e["valueFrom"]["secretKeyRef"]["name"]
        for c in spec["containers"]
        for e in c.get("env") or []
        if "secretKeyRef" in (e.get("valueFrom") or {})
    }


def test_a_bare_claim_or_secret_name_is_the_jobs_own_namespaces(
    teams: Teams, kube: Any, operator: Any, before: dict[str, str]
) -> None:
    """``data`` and ``hf`` exist in B only: the job's pods name them in A, under the job's own
    ServiceAccount, unprivileged."""
    name = "bare-names"
    doc = _manifest(
        teams,
        name,
        _both(
            _from_volume("model", "data"),
            _set("spec.secrets.huggingFaceToken", {"name": "hf", "key": "token"}),
        ),
    )
    out = _create_as_user(teams, doc)
    assert out.returncode == 0, out.stderr
    specs = wait_for(
        lambda: kube.get("kubeflow.org/v1", "PyTorchJob", teams.a, f"{name}-train"), what="PyTorchJob"
    )
    assert specs["metadata"]["namespace"] == teams.a
    for spec in _pod_specs(kube, teams.a, name):
        assert _claims(spec) == {"data", f"{name}-ckpt"}
        assert _secret_refs(spec) == {"hf"}
        assert spec["serviceAccountName"] == f"{name}-trainer"
        for c in spec["containers"]:
            assert c["securityContext"]["privileged"] is False
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert not any("hostPath" in v for v in spec["volumes"])
        assert not spec.get("hostNetwork")
    # the trainer's identity: its own ServiceAccount, allowed to patch this job's status and nothing else
    role = kube.get("rbac.authorization.k8s.io/v1", "Role", teams.a, f"{name}-trainer")
    assert role["rules"] == [
        {
            "apiGroups": ["kubetune.io"],
            "resources": ["finetunejobs/status"],
            "resourceNames": [name],
            "verbs": ["patch"],
        }
    ]
    assert snapshot(kube, teams.b) == before


def test_a_bare_parent_name_is_looked_up_in_the_jobs_own_namespace(
    teams: Teams, kube: Any, operator: Any, before: dict[str, str]
) -> None:
    """B's ``base`` Succeeded; A has none: the job waits for A's ``base`` and starts nothing."""
    name = "bare-parent"
    doc = _manifest(teams, name, _set("spec.model", {"fromJob": {"name": "base"}}))
    out = _create_as_user(teams, doc)
    assert out.returncode == 0, out.stderr
    obj = wait_phase(kube, teams.a, name, "Pending", timeout=30)
    ready = condition(obj, "Ready")
    assert "waiting for FineTuneJob base (spec.model.fromJob), which does not exist yet" in ready["message"]
    assert not (obj["status"].get("parent") or {}).get("uid"), obj["status"]
    time.sleep(1)
    assert _children(kube, teams.a, name) == []
    assert snapshot(kube, teams.b) == before


def test_a_client_without_strict_validation_gets_the_field_dropped(
    teams: Teams, kube: Any, operator: Any, before: dict[str, str]
) -> None:
    """A client that does not ask for strict field validation (``--validate=false``; client
    libraries' default is a warning) gets unknown fields pruned by the structural schema: the job
    is stored without them, and its pods run under the job's own identity, unprivileged."""
    name = "lax-client"
    doc = _manifest(
        teams,
        name,
        _both(
            _set("spec.serviceAccountName", "default"),
            _set("spec.securityContext", {"privileged": True}),
            _set("spec.volumes", [{"name": "root", "hostPath": {"path": "/"}}]),
        ),
    )
    out = teams.as_user("create", "--validate=false", "-n", teams.a, "-f", "-", input=json.dumps(doc))
    assert out.returncode == 0, out.stderr
    stored = get_job(kube, teams.a, name)["spec"]
    assert not {"serviceAccountName", "securityContext", "volumes"} & set(stored)
    wait_for(lambda: kube.get("kubeflow.org/v1", "PyTorchJob", teams.a, f"{name}-train"), what="PyTorchJob")
    for spec in _pod_specs(kube, teams.a, name):
        assert spec["serviceAccountName"] == f"{name}-trainer"
        assert not any("hostPath" in v for v in spec["volumes"])
        assert all(c["securityContext"]["privileged"] is False for c in spec["containers"])
    assert snapshot(kube, teams.b) == before


def test_the_user_cannot_read_the_other_namespaces_secret_directly(teams: Teams) -> None:
    """The control: the user's own rights stop at A, so any path to B's Secret is kubetune's."""
    out = teams.as_user("get", "secret", "hf", "-n", teams.b)
    assert out.returncode != 0
    assert "forbidden" in out.stderr.lower(), out.stderr
    for verb, resource, ns, expected in [
        ("get", "secrets", teams.a, "yes"),
        ("create", "finetunejobs.kubetune.io", teams.a, "yes"),
        ("create", "finetunejobs.kubetune.io", teams.b, "no"),
        ("get", "persistentvolumeclaims", teams.b, "no"),
        ("get", "finetunejobs.kubetune.io", teams.b, "no"),
        ("patch", "finetunejobs.kubetune.io", teams.b, "no"),  # e.g. its retry-registration annotation
        ("patch", "finetunejobs.kubetune.io --subresource=status", teams.a, "no"),
    ]:
        can = teams.as_user("auth", "can-i", verb, *resource.split(), "-n", ns)
        assert can.stdout.strip() == expected, (verb, resource, ns, can.stdout, can.stderr)


def test_a_service_account_of_the_trainers_name_that_is_not_the_jobs_is_never_used(
    teams: Teams, kube: Any, operator: Any, before: dict[str, str]
) -> None:
    """A ServiceAccount of A that an admin bound to ``admin`` carries the name the job's trainer
    identity would have (``<job>-trainer``): the operator does not adopt it, bind it or run pods
    under it; the job says which object is in the way."""
    name = "deploy"
    sa = f"{name}-trainer"
    teams.cp.kubectl("create", "serviceaccount", sa, "-n", teams.a)
    teams.cp.kubectl("create", "rolebinding", "deploy-admin", "-n", teams.a, "--clusterrole=admin",
                     f"--serviceaccount={teams.a}:{sa}")  # fmt: skip
    out = _create_as_user(teams, _manifest(teams, name, lambda doc, t: None))
    assert out.returncode == 0, out.stderr
    message = f"ServiceAccount {sa} already exists and is not owned by this FineTuneJob (no owner)"

    def refused() -> dict[str, Any] | None:
        obj = get_job(kube, teams.a, name)
        ready = [c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == "Ready"]
        return obj if ready and message in ready[0]["message"] else None

    obj = wait_for(refused, what="the conflict on the Ready condition")
    assert condition(obj, "Ready")["reason"] == "ChildConflict"
    time.sleep(1)
    assert kube.get("kubeflow.org/v1", "PyTorchJob", teams.a, f"{name}-train") is None
    assert kube.get("rbac.authorization.k8s.io/v1", "RoleBinding", teams.a, sa) is None
    assert kube.get("rbac.authorization.k8s.io/v1", "Role", teams.a, sa) is None
    assert snapshot(kube, teams.b) == before


def test_a_jobs_trainer_identity_cannot_unlock_another_refused_job(
    teams: Teams, kube: Any, operator: Any, before: dict[str, str], tmp_path: Path
) -> None:
    """The user may mint a token for any ServiceAccount of A (``edit`` grants
    ``serviceaccounts/token``), so for a job's trainer identity too; it may patch that one job's
    status. The identity of a job that proceeds cannot write the status of another one, refused for
    its model name, at all, so the refused job stays Failed and gets no child (a shared identity can
    write it, and the job is refused all the same:
    :func:`test_a_shared_trainer_identity_cannot_unlock_a_refused_job`)."""
    from kubernetes import client

    from kubetune_operator.kube import ApiError, Kube

    own, outside = "own-names", "outside-names"
    for name, change in ((own, _set("spec.registration.alias", "staging")),
                         (outside, _set("spec.registration.modelName", "{b}.assistant"))):  # fmt: skip
        out = _create_as_user(teams, _manifest(teams, name, change))
        assert out.returncode == 0, out.stderr
    wait_for(lambda: kube.get("v1", "ServiceAccount", teams.a, f"{own}-trainer"), what="the trainer identity")
    wait_phase(kube, teams.a, outside, "Failed")
    minted = teams.as_user("create", "token", f"{own}-trainer", "-n", teams.a, "--duration=10m")
    assert minted.returncode == 0, minted.stderr
    cfg = _token_config(teams, minted.stdout.strip(), tmp_path / "trainer-kc")
    forged = {"status": {"phase": "Pending", "conditions": []}}
    with client.ApiClient(cfg) as api:
        trainer = Kube(api)
        # its own job's status: allowed (the trainer reports progress there)
        trainer.patch(API, "FineTuneJob", teams.a, own, {}, subresource="status")
        with pytest.raises(ApiError) as refused:
            trainer.patch(API, "FineTuneJob", teams.a, outside, forged, subresource="status")
    assert refused.value.status == 403, refused.value
    teams.as_user("annotate", "finetunejob", outside, "-n", teams.a, "touch=1")  # another pass
    time.sleep(1)
    obj = wait_phase(kube, teams.a, outside, "Failed")
    assert condition(obj, "Ready")["reason"] == "ModelNameNotAllowed"
    assert _children(kube, teams.a, outside) == []
    assert snapshot(kube, teams.b) == before


def _token_config(teams: Teams, token: str, path: Path) -> Any:
    """A client configuration that acts with ``token`` (a ServiceAccount's, as the user minted it)."""
    from kubernetes import client, config

    admin = yaml.safe_load(teams.cp.kubeconfig.read_text())
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": admin["clusters"],
                "users": [{"name": "t", "user": {"token": token}}],
                "contexts": [
                    {"name": "t", "context": {"cluster": admin["clusters"][0]["name"], "user": "t"}}
                ],
                "current-context": "t",
            }
        )
    )
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(path), client_configuration=cfg)
    return cfg


SHARED_TRAINER = "kubetune-trainer"


def test_a_shared_trainer_identity_cannot_unlock_a_refused_job(
    teams: Teams, kube: Any, before: dict[str, str], tmp_path: Path
) -> None:
    """With one trainer ServiceAccount for every job (the chart's ``trainer.serviceAccount.name``, bound
    to its trainer ClusterRole: ``patch`` on every FineTuneJob's status in the namespace), the user
    mints its token (``edit`` grants ``serviceaccounts/token``) and resets a job refused for its model
    name to ``Pending``, then touches the job: the status is no proof that the job started, so the
    operator refuses it again and creates nothing."""
    from kubernetes import client

    from kubetune_operator.kube import Kube

    ns = f"{teams.a}-shared"
    suffix = teams.a.removeprefix("team-a-")
    trainer_roles = _chart_roles(suffix, "trainer", "--set", f"trainer.serviceAccount.name={SHARED_TRAINER}")
    assert len(trainer_roles) == 1, trainer_roles
    trainer_role = trainer_roles[0]["metadata"]["name"]
    cp = teams.cp
    cp.kubectl("create", "namespace", ns)
    proc = OperatorProcess(ns, {}, tmp_path / "operator.log")
    try:
        cp.kubectl("create", "rolebinding", "alice-edit", "-n", ns, f"--clusterrole={teams.user_role}",
                   f"--user={USER}")  # fmt: skip
        cp.kubectl("create", "serviceaccount", SHARED_TRAINER, "-n", ns)
        cp.kubectl("apply", "-f", "-", input=json.dumps(trainer_roles[0]))
        cp.kubectl("create", "rolebinding", SHARED_TRAINER, "-n", ns, f"--clusterrole={trainer_role}",
                   f"--serviceaccount={ns}:{SHARED_TRAINER}")  # fmt: skip
        proc.env.update(
            {
                "KUBECONFIG": str(
                    kubeconfig_for_service_account(cp, teams.system, "kubetune-operator", tmp_path / "op-kc")
                ),
                "KUBETUNE_TRAINER_IMAGE": "registry.example.com/kubetune/trainer:test",
                "KUBETUNE_MLFLOW_TRACKING_URI": "http://mlflow.mlflow.svc:5000",
                "KUBETUNE_RETRY_SECONDS": "1",
                "KUBETUNE_PREPARATION": "false",
                "KUBETUNE_REGISTRY_TENANCY": "namespace-prefix",
                "KUBETUNE_TRAINER_SERVICE_ACCOUNT": SHARED_TRAINER,
            }
        )
        proc.start()
        name = "forged"
        doc = _manifest(teams, name, _set("spec.registration.modelName", "{b}.assistant"))
        doc["metadata"]["namespace"] = ns
        out = teams.as_user("create", "-n", ns, "-f", "-", input=json.dumps(doc))
        assert out.returncode == 0, out.stderr
        refused = f"spec.registration.modelName '{teams.b}.assistant' is outside its namespace's names"
        obj = wait_phase(kube, ns, name, "Failed", timeout=60)
        assert condition(obj, "Ready")["reason"] == "ModelNameNotAllowed"
        minted = teams.as_user("create", "token", SHARED_TRAINER, "-n", ns, "--duration=10m")
        assert minted.returncode == 0, minted.stderr
        cfg = _token_config(teams, minted.stdout.strip(), tmp_path / "trainer-kc")
        with client.ApiClient(cfg) as api:  # allowed: the shared identity patches every job's status
            Kube(api).patch(API, "FineTuneJob", ns, name, {"status": {"phase": "Pending", "conditions": []}},
                            subresource="status")  # fmt: skip
        touched = teams.as_user("annotate", "finetunejob", name, "-n", ns, "touch=1")
        assert touched.returncode == 0, touched.stderr
        obj = wait_phase(kube, ns, name, "Failed", timeout=60)
        ready = condition(obj, "Ready")
        assert ready["reason"] == "ModelNameNotAllowed" and refused in ready["message"], ready
        time.sleep(2)  # more passes: still nothing
        assert _children(kube, ns, name) == []
        assert kube.get("kubeflow.org/v1", "PyTorchJob", ns, f"{name}-train") is None
    finally:
        proc.kill()
        cp.kubectl("delete", "clusterrole", trainer_role, check=False)
        cp.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    log = (tmp_path / "operator.log").read_text()
    assert not denials(log), "\n".join(denials(log))
    assert snapshot(kube, teams.b) == before
