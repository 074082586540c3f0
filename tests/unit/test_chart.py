"""The Helm chart, rendered by the real helm binary: lint, schema, CRD copy, RBAC, Deployment, values docs.

The API-server side (dry run, install, the operator running as the chart's ServiceAccount, upgrade,
uninstall) is in tests/integration/test_helm.py.
"""

from __future__ import annotations

import json
import re
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.support.controlplane import REPO, find_assets
from tests.unit.test_builders_pss import restricted_violations

from kubetune_operator import rbac as operator_rbac
from kubetune_operator.__main__ import build_parser
from kubetune_operator.settings import Settings

pytestmark = pytest.mark.helm

CHART = REPO / "charts" / "kubetune"
CI_VALUES = CHART / "ci" / "ci-values.yaml"
CRD_SOURCE = REPO / "crds" / "kubetune.io_finetunejobs.yaml"
CRD_COPY = CHART / "files" / "crds" / "kubetune.io_finetunejobs.yaml"
NAMESPACE = "kubetune-system"
VALUE_SETS = {"default": [], "ci": ["-f", str(CI_VALUES)]}

# The documented exception list for Secrets: none. FineTuneJobs reference Secrets by name only
# (secretKeyRef in pod templates), which needs no permission on Secrets.
SECRET_VERBS_ALLOWED: set[str] = set()
# Kept on `helm uninstall`, and never pruned or deleted by Argo CD.
KEEP = {"helm.sh/resource-policy": "keep", "argocd.argoproj.io/sync-options": "Prune=false,Delete=false"}


@cache
def helm_binary() -> str:
    try:
        return str(find_assets("helm") / "helm")
    except (subprocess.CalledProcessError, FileNotFoundError) as e:  # no Go toolchain, no cache
        pytest.skip(f"no helm binary: hack/build-control-plane.sh helm failed ({e})")


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm_binary(), *args], capture_output=True, text=True, check=check, timeout=120)


def render(
    *args: str, release: str = "kubetune", namespace: str = NAMESPACE, chart: Path = CHART
) -> list[dict[str, Any]]:
    """``helm template`` → the rendered objects."""
    out = helm("template", release, str(chart), "--namespace", namespace, *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in by_kind(objs, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, (
        f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in found]}"
    )
    return found[0]


def operator_container(objs: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = one(objs, "Deployment", "kubetune")
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


# the component of the ClusterRoles aggregated into the default user roles (rbac.aggregateToDefaultRoles):
# rights for people, not kubetune's own identities
USER_ROLES = "user-roles"


def rbac_rules(objs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """The rules of kubetune's own identities (the operator's, the trainer's), not the users'."""
    return [
        (f"{o['kind']}/{o['metadata']['name']}", rule)
        for o in objs
        if o["kind"] in ("ClusterRole", "Role") and not _for_users(o)
        for rule in o.get("rules") or []
    ]


def _for_users(obj: dict[str, Any]) -> bool:
    return bool(obj["metadata"]["labels"].get("app.kubernetes.io/component") == USER_ROLES)


# --- helm lint / template / schema --------------------------------------------------------------------


@pytest.mark.parametrize("values", VALUE_SETS, ids=list(VALUE_SETS))
def test_helm_lint_passes(values: str) -> None:
    result = helm("lint", "--strict", str(CHART), *VALUE_SETS[values], check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("values", VALUE_SETS, ids=list(VALUE_SETS))
def test_helm_template_renders_the_expected_objects(values: str) -> None:
    objs = render(*VALUE_SETS[values])
    kinds = sorted({o["kind"] for o in objs})
    expected = {
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "Deployment",
        "ServiceAccount",
    }
    assert expected <= set(kinds)
    for o in objs:
        labels = o["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "kubetune"
        assert labels["app.kubernetes.io/instance"] == "kubetune"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["helm.sh/chart"] == "kubetune-0.1.0"
    if values == "ci":
        assert {"PersistentVolumeClaim", "Service", "RoleBinding"} <= set(kinds)
        assert all(o["metadata"]["labels"]["team"] == "ml-platform" for o in objs)


@pytest.mark.parametrize(
    "bad",
    [
        ["--set", "unknownKey=1"],
        ["--set", "operator.replicas=0"],
        ["--set", "operator.podAntiAffinity=sometimes"],
        ["--set", "operator.leaderElection.leaseDurationSeconds=1"],
        ["--set", "operator.podDisruptionBudget.maxUnavailable=0"],
        ["--set", "operator.logFormat=xml"],
        ["--set", "operator.image.pullPolicy=Sometimes"],
        ["--set", "operator.image.digest=latest"],
        ["--set", "trainer.runAsUser=0"],
        ["--set", "mlflow.server.persistence.size=lots"],
        ["--set", "operator.watchNamespaces[0]=Not_A_Namespace"],
        ["--set", "mlflow.trackingUri=mlflow.example.com"],
        ["--set", "mlflow.trackingUri=https://user:secret@mlflow.example.com"],
        ["--set", "mlflow.registryUri=mlflow.example.com"],
        ["--set", "mlflow.registryUri=https://user:secret@mlflow.example.com"],
        ["--set", "registry.tenancy=true"],
        ["--set", "registry.tenancy=namespace"],
        ["--set", "metrics.port=80"],
        ["--set", "metrics.serviceMonitor.interval=often"],
    ],
    ids=lambda a: a[1],
)
def test_schema_refuses_bad_values(bad: list[str]) -> None:
    result = helm("template", "kubetune", str(CHART), *bad, check=False)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr, result.stderr


def test_shared_trainer_account_creation_needs_watched_namespaces() -> None:
    result = helm(
        "template",
        "kubetune",
        str(CHART),
        "--set",
        "trainer.serviceAccount.name=trainer",
        "--set",
        "trainer.serviceAccount.create=true",
        check=False,
    )
    assert result.returncode != 0
    assert "trainer.serviceAccount.create needs operator.watchNamespaces" in result.stderr


def _leaf_paths(node: Any, prefix: str = "") -> set[str]:
    if isinstance(node, dict) and node:
        return {p for k, v in node.items() for p in _leaf_paths(v, f"{prefix}.{k}" if prefix else k)}
    return {prefix}


def _schema_paths(node: dict[str, Any], defs: dict[str, Any], prefix: str = "") -> set[str]:
    if "$ref" in node:
        node = defs[node["$ref"].split("/")[-1]]
    props = node.get("properties")
    if node.get("type") == "object" and props and node.get("additionalProperties") is False:
        return {p for k, v in props.items() for p in _schema_paths(v, defs, f"{prefix}.{k}" if prefix else k)}
    return {prefix}


def test_schema_is_strict_and_matches_values() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def strict(node: dict[str, Any], where: str) -> None:
        if node.get("type") == "object" and "properties" in node:
            assert node.get("additionalProperties") is False, f"{where} accepts unknown keys"
        for k, v in (node.get("properties") or {}).items():
            strict(v, f"{where}.{k}")
        for k, v in (node.get("$defs") or {}).items():
            strict(v, f"$defs.{k}")

    strict(schema, "values")
    in_schema = _schema_paths(schema, schema["$defs"]) - {"global"}
    in_values = _leaf_paths(values)
    # Every schema leaf is a documented value, and every value (leaf or free-form map) is in the schema.
    free_form = {s for s in in_schema if not any(p == s or p.startswith(s + ".") for p in in_values)}
    assert not free_form, f"in the schema but not in values.yaml: {sorted(free_form)}"
    for path in in_values:
        assert any(path == s or path.startswith(s + ".") for s in in_schema), f"{path} is not in the schema"


def test_every_value_is_documented() -> None:
    """Each key either has a ``# --`` comment, is documented with its parent, or is a map of keys."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    key_re = re.compile(r"^(\s*)([A-Za-z][A-Za-z0-9]*):(.*)$")
    documented_parents: list[tuple[int, bool]] = []  # (indent, documented)
    missing = []
    for i, line in enumerate(lines):
        m = key_re.match(line)
        if not m:
            continue
        indent = len(m.group(1))
        while documented_parents and documented_parents[-1][0] >= indent:
            documented_parents.pop()
        j = i - 1
        doc = False
        while j >= 0 and lines[j].strip().startswith("#"):
            doc = doc or lines[j].strip().startswith("# --")
            j -= 1
        nxt = next((x for x in lines[i + 1 :] if x.strip() and not x.strip().startswith("#")), "")
        is_parent = not m.group(3).strip() and len(nxt) - len(nxt.lstrip()) > indent
        inherited = any(d for _, d in documented_parents)
        if not (doc or inherited or is_parent):
            missing.append(m.group(2) + f" (line {i + 1})")
        documented_parents.append((indent, doc or inherited))
    assert not missing, f"values without a '# --' comment: {missing}"


# --- the CRD ------------------------------------------------------------------------------------------


def test_chart_crd_copy_is_identical_to_crds_folder() -> None:
    assert CRD_COPY.read_bytes() == CRD_SOURCE.read_bytes(), (
        f"the chart's CRD copy is stale: cp {CRD_SOURCE.relative_to(REPO)} {CRD_COPY.relative_to(REPO)}"
    )


def test_rendered_crd_equals_crds_folder_and_is_kept_on_uninstall() -> None:
    source = yaml.safe_load(CRD_SOURCE.read_text())
    crd = one(render(), "CustomResourceDefinition")
    assert crd["metadata"]["name"] == source["metadata"]["name"]
    assert crd["spec"] == source["spec"]
    assert crd["metadata"]["annotations"] == KEEP
    assert source["metadata"]["labels"].items() <= crd["metadata"]["labels"].items()


def test_crd_can_be_left_out_or_not_kept() -> None:
    assert not by_kind(render("--set", "crds.install=false"), "CustomResourceDefinition")
    crd = one(render("--set", "crds.keep=false"), "CustomResourceDefinition")
    assert "annotations" not in crd["metadata"]


# --- RBAC ---------------------------------------------------------------------------------------------

RBAC_VARIANTS = {
    "default": [],
    "ci": ["-f", str(CI_VALUES)],
    "shared-trainer": ["--set", "trainer.serviceAccount.name=trainer"],
    "namespaced": ["--set", "operator.watchNamespaces={team-a,team-b}"],
}


@pytest.mark.parametrize("variant", RBAC_VARIANTS, ids=list(RBAC_VARIANTS))
def test_rbac_has_no_wildcards_and_no_secret_verbs(variant: str) -> None:
    rules = rbac_rules(render(*RBAC_VARIANTS[variant]))
    assert rules
    for where, rule in rules:
        for key in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
            assert "*" not in (rule.get(key) or []), f"{where}: wildcard in {key}: {rule}"
        assert not rule.get("nonResourceURLs"), f"{where}: {rule}"
        # No privilege-escalation verbs, nothing updated or deleted in bulk, and the only delete is
        # of Jobs (a failed registration Job, by uid, when the retry annotation asks); the only update
        # is of the leader election's one Lease, by name (a replace that carries its resourceVersion)
        assert not {"escalate", "bind", "impersonate", "deletecollection"} & set(rule["verbs"])
        if "update" in rule["verbs"]:
            assert rule["resources"] == ["leases"] and rule.get("resourceNames"), f"{where}: {rule}"
        if "delete" in rule["verbs"]:
            assert rule["apiGroups"] == ["batch"] and rule["resources"] == ["jobs"], f"{where}: {rule}"
        if "secrets" in rule["resources"]:
            assert set(rule["verbs"]) <= SECRET_VERBS_ALLOWED, f"{where}: verbs on Secrets: {rule}"


def _allowed(rules: list[tuple[str, dict[str, Any]]], group: str, resource: str) -> set[str]:
    return {
        verb
        for _, rule in rules
        if group in rule["apiGroups"] and resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_kopf_framework_rules_come_first_in_their_own_block() -> None:
    objs = render()
    framework = one(objs, "ClusterRole", "kubetune-framework")
    assert framework["rules"] == [
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "verbs": ["list", "watch"],
        }
    ]
    operator_rules = one(objs, "ClusterRole", "kubetune-operator")["rules"]
    assert operator_rules[0] == {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}
    # kopf lists namespaces only when it watches a given set of them.
    namespaced = one(render(*RBAC_VARIANTS["namespaced"]), "ClusterRole", "kubetune-framework")
    assert {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]} in namespaced["rules"]


def _grants(rules: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


@pytest.mark.parametrize("variant", ["default", "namespaced", "shared-trainer"])
def test_operator_rbac_is_exactly_what_the_operator_declares(variant: str) -> None:
    """The chart grants kubetune_operator.rbac's rules (what the operator's own least-privilege flow test
    proves sufficient), nothing more; cluster-wide, kopf needs no namespaces; with a shared trainer
    account, the operator needs no per-job identity rules."""
    objs = render(*RBAC_VARIANTS[variant])
    chart = _grants(
        [
            r
            for o in objs
            if o["kind"] == "ClusterRole"
            and o["metadata"]["name"] != "kubetune-trainer"
            and not _for_users(o)
            for r in o["rules"]
        ]
    )
    declared = _grants(operator_rbac.KOPF_FRAMEWORK_RULES + operator_rbac.OPERATOR_RULES)
    # leader election: a Role in the release namespace, on the one Lease the Deployment names
    roles = [o for o in objs if o["kind"] == "Role" and not _for_users(o)]
    env = {e["name"]: e.get("value") for e in operator_container(objs)["env"]}
    assert [(r["metadata"]["namespace"], r["metadata"]["name"]) for r in roles] == [
        (env["KUBETUNE_LEADER_ELECTION_NAMESPACE"], "kubetune-leader-election")
    ]
    assert roles[0]["rules"] == operator_rbac.leader_election_rules(env["KUBETUNE_LEADER_ELECTION_LEASE"])
    if variant != "namespaced":
        declared.pop(("", "namespaces"))
    if variant == "shared-trainer":
        for key in [
            ("", "serviceaccounts"),
            ("rbac.authorization.k8s.io", "roles"),
            ("rbac.authorization.k8s.io", "rolebindings"),
        ]:
            declared.pop(key)
    assert chart == declared


def test_watched_child_resources_match_the_kopf_handlers() -> None:
    """Every resource a kopf handler watches is listable and watchable by the chart's ClusterRole."""
    source = (REPO / "operator" / "kubetune_operator" / "handlers.py").read_text()
    watched = re.findall(r'@kopf\.on\.event\(\s*(?:"([^"]*)",\s*)?"(v1)",\s*"([a-z]+)"', source)
    watched += re.findall(r'@kopf\.on\.event\(\s*"([^"]+)",\s*"(v[^"]+)",\s*"([a-z]+)"', source)
    assert watched, "no kopf event handlers found: has handlers.py moved?"
    rules = rbac_rules(render())
    for group, version, plural in watched:
        api_group = "" if group == "v1" or (not group and version == "v1") else group
        assert {"list", "watch"} <= _allowed(rules, api_group, plural), (api_group, plural)


@pytest.mark.parametrize("variant", RBAC_VARIANTS, ids=list(RBAC_VARIANTS))
def test_operator_reads_training_pods_and_pytorchjob_events_and_writes_no_event_but_its_own(
    variant: str,
) -> None:
    """Why the training pods cannot start: the operator watches and lists pods and lists events (the
    Training Operator's FailedCreatePod); on events it may only create (its own) and list."""
    rules = [
        r for r in rbac_rules(render(*RBAC_VARIANTS[variant])) if r[0] == "ClusterRole/kubetune-operator"
    ]
    assert _allowed(rules, "", "pods") == {"list", "watch"}
    assert _allowed(rules, "", "events") == {"create", "list"}


def test_shared_trainer_identity_drops_the_operators_rbac_powers() -> None:
    objs = render("--set", "trainer.serviceAccount.name=trainer")
    rules = rbac_rules(objs)
    operator_rules = [r for r in rules if r[0] == "ClusterRole/kubetune-operator"]
    assert not _allowed(operator_rules, "", "serviceaccounts")
    assert not _allowed(operator_rules, "rbac.authorization.k8s.io", "roles")
    trainer = one(objs, "ClusterRole", "kubetune-trainer")
    assert trainer["rules"] == [
        {"apiGroups": ["kubetune.io"], "resources": ["finetunejobs/status"], "verbs": ["patch"]}
    ]
    env = {e["name"]: e.get("value") for e in operator_container(objs)["env"]}
    assert env["KUBETUNE_TRAINER_SERVICE_ACCOUNT"] == "trainer"


def test_namespaced_mode_binds_the_operator_role_per_namespace_only() -> None:
    objs = render(*RBAC_VARIANTS["namespaced"])
    assert [b["metadata"]["name"] for b in by_kind(objs, "ClusterRoleBinding")] == ["kubetune-framework"]
    # the operator's role in each watched namespace (the leader election's, in the release's, apart)
    bindings = [b for b in by_kind(objs, "RoleBinding") if b["roleRef"]["kind"] == "ClusterRole"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for b in bindings:
        assert b["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "kubetune-operator",
        }
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": "kubetune", "namespace": NAMESPACE}]


AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"
ALL_VERBS = ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]


def _aggregated_to(role: dict[str, Any]) -> set[str]:
    labels = role["metadata"]["labels"]
    return {k.removeprefix(AGGREGATE) for k, v in labels.items() if k.startswith(AGGREGATE) and v == "true"}


@pytest.mark.parametrize(
    ("args", "fullname"),
    [
        ([], "kubetune"),
        (["--set", "fullnameOverride=ml-tune"], "ml-tune"),
        (["-f", str(CI_VALUES)], "kubetune"),
    ],
    ids=["default", "fullname", "ci"],
)
def test_the_default_user_roles_get_finetunejobs_by_aggregation(args: list[str], fullname: str) -> None:
    """``edit`` (and ``admin``) gain every verb on FineTuneJobs but none on their status; ``view`` reads
    both. Only these two ClusterRoles carry the aggregation labels."""
    objs = render(*args)
    roles = {o["metadata"]["name"]: o for o in by_kind(objs, "ClusterRole") if _for_users(o)}
    assert sorted(roles) == [f"{fullname}-edit", f"{fullname}-view"]
    edit, view = roles[f"{fullname}-edit"], roles[f"{fullname}-view"]
    assert _aggregated_to(edit) == {"edit", "admin"}
    assert edit["rules"] == [
        {"apiGroups": ["kubetune.io"], "resources": ["finetunejobs"], "verbs": ALL_VERBS}
    ]
    assert _aggregated_to(view) == {"view"}
    assert view["rules"] == [
        {
            "apiGroups": ["kubetune.io"],
            "resources": ["finetunejobs", "finetunejobs/status"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    others = [o for o in objs if o not in (edit, view)]
    assert not [o["metadata"]["name"] for o in others if _aggregated_to(o)]
    bindings = [o for o in objs if o["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    assert not [b for b in bindings if b["roleRef"]["name"] in roles]  # bound by the default roles only


def test_the_user_roles_can_be_left_out_and_are_independent_of_rbac_create() -> None:
    off = render("--set", "rbac.aggregateToDefaultRoles=false")
    assert not [o for o in off if _for_users(o) or _aggregated_to(o)]
    assert rbac_rules(off) == rbac_rules(render())  # the operator's rights are unchanged
    without_operator_rbac = render("--set", "rbac.create=false")
    assert sorted(o["metadata"]["name"] for o in without_operator_rbac if _for_users(o)) == [
        "kubetune-edit",
        "kubetune-view",
    ]


def test_rbac_create_is_independent_of_the_service_account() -> None:
    objs = render("--set", "rbac.create=false")
    assert not rbac_rules(objs) and not by_kind(objs, "ClusterRoleBinding")
    assert by_kind(objs, "ServiceAccount")
    objs = render("--set", "serviceAccount.create=false", "--set", "serviceAccount.name=existing")
    assert not by_kind(objs, "ServiceAccount")
    subjects = [s for b in by_kind(objs, "ClusterRoleBinding") for s in b["subjects"]]
    assert subjects and all(s["name"] == "existing" for s in subjects)
    result = helm("template", "kubetune", str(CHART), "--set", "serviceAccount.create=false", check=False)
    assert result.returncode != 0 and "serviceAccount.name is required" in result.stderr


# --- the operator Deployment --------------------------------------------------------------------------


def test_operator_deployment_shape() -> None:
    deployment = one(render(), "Deployment", "kubetune")
    spec = deployment["spec"]
    # two replicas, one leading (tests/unit/test_chart_ha.py); a rollout never stops the last one
    assert spec["replicas"] == 2
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == "kubetune"
    assert restricted_violations(pod) == []
    container = pod["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert container["image"] == "ghcr.io/kubetune/operator:0.1.0"
    probe = container["livenessProbe"]["httpGet"]
    assert probe == {"path": "/healthz", "port": "health"}
    port = next(p["containerPort"] for p in container["ports"] if p["name"] == "health")
    assert f"--liveness=http://0.0.0.0:{port}/healthz" in container["args"]


@pytest.mark.parametrize("values", VALUE_SETS, ids=list(VALUE_SETS))
def test_operator_args_and_env_are_what_the_operator_reads(values: str) -> None:
    objs = render(*VALUE_SETS[values])
    container = operator_container(objs)
    args = build_parser().parse_args(container["args"])
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    read_by_settings = set(
        re.findall(
            r'get\("([A-Z_]+)"\)', (REPO / "operator" / "kubetune_operator" / "settings.py").read_text()
        )
    )
    chart_vars = {k.removeprefix("KUBETUNE_") for k in env if k.startswith("KUBETUNE_")}
    extra = {
        e["name"].removeprefix("KUBETUNE_")
        for e in yaml.safe_load(CI_VALUES.read_text())["operator"]["extraEnv"]
    }
    assert chart_vars - extra <= read_by_settings, (
        f"set by the chart, read by nobody: {chart_vars - extra - read_by_settings}"
    )
    settings = Settings.from_env(env)
    if values == "default":
        assert args.all_namespaces and not args.namespace
        assert settings.namespaces == ()
        assert settings.trainer_image == "ghcr.io/kubetune/trainer:0.1.0"
        assert settings.default_tracking_uri is None
        assert settings.default_registry_uri is None
        assert settings.trainer_service_account is None
        assert settings.default_storage_class is None
    else:
        assert args.namespace == ["kubetune-ci-a", "kubetune-ci-b"]
        assert settings.namespaces == ("kubetune-ci-a", "kubetune-ci-b")
        assert settings.trainer_image == "ghcr.io/kubetune/trainer:0.1.0-ci"
        assert settings.default_tracking_uri == "http://kubetune-mlflow.kubetune-system.svc:5000"
        assert settings.default_registry_uri == "databricks-uc"
        assert settings.trainer_service_account == "kubetune-trainer"
        assert settings.default_storage_class == "fast-ssd"
    assert settings.run_as_user == 1000
    assert settings.termination_grace_seconds == 600
    assert args.log_format in ("plain", "full", "json")


def test_every_operator_setting_is_set_by_the_chart() -> None:
    read_by_settings = set(
        re.findall(
            r'get\("([A-Z_]+)"\)', (REPO / "operator" / "kubetune_operator" / "settings.py").read_text()
        )
    )
    env = {e["name"] for e in operator_container(render("-f", str(CI_VALUES)))["env"]}
    missing = {f"KUBETUNE_{name}" for name in read_by_settings} - env
    assert not missing, f"operator settings the chart cannot set: {sorted(missing)}"


def test_registry_tenancy_is_on_by_default_and_the_values_reach_the_operator() -> None:
    """registry.tenancy binds namespaces to model names unless turned off; registry.modelNames grants
    more; a release upgraded with --reuse-values (no registry values at all) gets the defaults."""
    env = {e["name"]: e.get("value") for e in operator_container(render())["env"]}
    settings = Settings.from_env(env)
    assert (settings.registry_tenancy, settings.registry_model_names) == ("namespace-prefix", ())
    objs = render(
        "--set", "registry.tenancy=off", "--set-json", 'registry.modelNames={"team-a":["shared-*"]}'
    )
    settings = Settings.from_env({e["name"]: e.get("value") for e in operator_container(objs)["env"]})
    assert (settings.registry_tenancy, settings.registry_model_names) == ("off", (("team-a", ("shared-*",)),))
    reused = Settings.from_env(
        {e["name"]: e.get("value") for e in operator_container(render("--set", "registry=null"))["env"]}
    )
    assert reused.registry_tenancy == "namespace-prefix"
    refused = helm("template", "k", str(CHART), "--set", "registry.tenancy=on", check=False)
    assert refused.returncode != 0 and "registry/tenancy" in refused.stderr


def test_the_default_engine_reaches_the_operator() -> None:
    """engine (auto unless set) becomes KUBETUNE_ENGINE; a misspelt engine is refused by the schema; a
    release upgraded with --reuse-values (no engine value) gets auto (issue 31 item 1)."""

    def engine(*args: str) -> Any:
        env = {e["name"]: e.get("value") for e in operator_container(render(*args))["env"]}
        return Settings.from_env(env).engine

    assert engine() == "auto"
    assert engine("--set", "engine=TrainJob") == "TrainJob"
    assert engine("--set", "engine=null") == "auto"
    refused = helm("template", "k", str(CHART), "--set", "engine=trainjob", check=False)
    assert refused.returncode != 0 and "engine" in refused.stderr


def test_external_tracking_uri_wins_over_the_in_cluster_server() -> None:
    objs = render(
        "--set", "mlflow.server.enabled=true", "--set", "mlflow.trackingUri=https://mlflow.example.com"
    )
    env = {e["name"]: e.get("value") for e in operator_container(objs)["env"]}
    assert env["KUBETUNE_MLFLOW_TRACKING_URI"] == "https://mlflow.example.com"


# --- the optional MLflow server -----------------------------------------------------------------------


def test_mlflow_server_is_off_by_default() -> None:
    objs = render()
    assert not [o for o in objs if o["metadata"]["labels"].get("app.kubernetes.io/component") == "mlflow"]


def test_mlflow_server_shape() -> None:
    objs = render("-f", str(CI_VALUES))
    deployment = one(objs, "Deployment", "kubetune-mlflow")
    pod = deployment["spec"]["template"]["spec"]
    assert restricted_violations(pod) == []
    container = pod["containers"][0]
    image = container["image"]
    assert re.fullmatch(r"ghcr\.io/mlflow/mlflow:v\d+\.\d+\.\d+", image), image
    hosts = (
        next(a for a in container["command"] if a.startswith("--allowed-hosts=")).split("=", 1)[1].split(",")
    )
    assert "kubetune-mlflow.kubetune-system.svc:5000" in hosts and "mlflow.example.com" in hosts
    service = one(objs, "Service", "kubetune-mlflow")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    pvc = one(objs, "PersistentVolumeClaim", "kubetune-mlflow")
    assert pvc["metadata"]["annotations"] == KEEP
    claim = next(v for v in pod["volumes"] if v["name"] == "store")["persistentVolumeClaim"]["claimName"]
    assert claim == "kubetune-mlflow"
    existing = render("-f", str(CI_VALUES), "--set", "mlflow.server.persistence.existingClaim=mine")
    assert not by_kind(existing, "PersistentVolumeClaim")


@pytest.mark.parametrize(
    ("values", "mode"),
    [
        ("", "namespace-prefix"),
        ("registry:\n  tenancy: off\n", "off"),  # YAML 1.1: unquoted off is boolean false
        ("registry:\n  tenancy: false\n", "off"),
        ('registry:\n  tenancy: "off"\n', "off"),
        ("registry:\n  tenancy: namespace-prefix\n", "namespace-prefix"),
    ],
    ids=["default", "unquoted-off", "false", "quoted-off", "namespace-prefix"],
)
def test_registry_tenancy_off_is_accepted_quoted_or_not(tmp_path: Path, values: str, mode: str) -> None:
    file = tmp_path / "values.yaml"
    file.write_text(values or "{}\n")
    env = {e["name"]: e.get("value") for e in operator_container(render("-f", str(file)))["env"]}
    assert env["KUBETUNE_REGISTRY_TENANCY"] == mode


# --- metrics ------------------------------------------------------------------------------------------


def test_metrics_are_on_by_default_with_a_port_a_service_and_no_service_monitor() -> None:
    """The operator serves /metrics on its own port (not kopf's liveness port), a Service selects
    exactly the operator pod's port, and the ServiceMonitor waits for metrics.serviceMonitor.enabled."""
    objs = render()
    container = operator_container(objs)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == 8081 and ports["metrics"] != ports["health"]
    settings = Settings.from_env({e["name"]: e.get("value") for e in container["env"]})
    assert (settings.metrics_port, settings.metrics_address) == (8081, "0.0.0.0")
    service = one(objs, "Service", "kubetune-metrics")
    pod_labels = one(objs, "Deployment", "kubetune")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 8081, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert by_kind(objs, "ServiceMonitor") == []


def test_service_monitor_scrapes_the_metrics_service() -> None:
    objs = render(
        "--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.serviceMonitor.labels.release=prom"
    )
    monitor = one(objs, "ServiceMonitor", "kubetune")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    service = one(objs, "Service", "kubetune-metrics")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    # the selector picks the metrics Service only, never the MLflow server's
    mlflow = render("--set", "mlflow.server.enabled=true", "--set", "metrics.serviceMonitor.enabled=true")
    matched = [
        s["metadata"]["name"]
        for s in by_kind(mlflow, "Service")
        if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
    ]
    assert matched == ["kubetune-metrics"]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert monitor["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "30s"}]


def test_metrics_turned_off_leave_no_port_service_or_monitor() -> None:
    objs = render("--set", "metrics.enabled=false", "--set", "metrics.serviceMonitor.enabled=true")
    container = operator_container(objs)
    assert [p["name"] for p in container["ports"]] == ["health"]
    settings = Settings.from_env({e["name"]: e.get("value") for e in container["env"]})
    assert settings.metrics_port == 0
    assert by_kind(objs, "ServiceMonitor") == []
    assert "kubetune-metrics" not in [s["metadata"]["name"] for s in by_kind(objs, "Service")]


def test_metrics_port_must_differ_from_the_liveness_port() -> None:
    result = helm("template", "kubetune", str(CHART), "--set", "metrics.port=8080", check=False)
    assert result.returncode != 0
    assert "metrics.port must differ from operator.healthPort" in result.stderr


def test_a_release_reusing_values_from_before_metrics_gets_them_on() -> None:
    """``helm upgrade --reuse-values`` from a release without the metrics values: metrics on, 8081."""
    objs = render("--set", "metrics=null")
    env = {e["name"]: e.get("value") for e in operator_container(objs)["env"]}
    assert Settings.from_env(env).metrics_port == 8081
    assert one(objs, "Service", "kubetune-metrics")["spec"]["ports"][0]["port"] == 8081
