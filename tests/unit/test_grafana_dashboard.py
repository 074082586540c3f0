"""deploy/grafana/kubetune.json queries only the metrics kubetune_operator.metrics declares, and shows
every one of them."""

from __future__ import annotations

import json
import re
from typing import Any

from prometheus_client import Histogram
from tests.support.controlplane import REPO

from kubetune_operator import metrics

DASHBOARD = REPO / "deploy" / "grafana" / "kubetune.json"
# the series a histogram exposes beside its name
HISTOGRAM_SERIES = re.compile(r"_(bucket|sum|count)$")


def _exprs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return found + [e for k, v in node.items() if k != "expr" for e in _exprs(v)]
    if isinstance(node, list):
        return [e for v in node for e in _exprs(v)]
    return []


def _metric_names(expr: str) -> set[str]:
    names = set(re.findall(r"\bkubetune_[a-z_]+", expr))
    return {n if n in metrics.NAMES else HISTOGRAM_SERIES.sub("", n) for n in names}


def test_every_query_names_a_declared_metric_and_every_metric_is_shown() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = _exprs(dashboard["panels"])
    assert exprs, "the dashboard has no queries"
    used: set[str] = set()
    for expr in exprs:
        names = _metric_names(expr)
        assert names, f"a query that names no kubetune metric: {expr}"
        unknown = names - set(metrics.NAMES)
        assert not unknown, f"{expr}: not declared in kubetune_operator/metrics.py: {sorted(unknown)}"
        used |= names
    assert used == set(metrics.NAMES), f"declared but not on the dashboard: {set(metrics.NAMES) - used}"


def test_the_histogram_series_belong_to_histograms() -> None:
    """``_bucket`` (and friends) only on the metrics that are histograms."""
    histograms = {v.describe()[0].name for v in vars(metrics).values() if isinstance(v, Histogram)}
    assert histograms == {"kubetune_reconcile_duration_seconds", "kubetune_queue_wait_seconds"}
    dashboard = json.loads(DASHBOARD.read_text())
    for expr in _exprs(dashboard["panels"]):
        for name in re.findall(r"\bkubetune_[a-z_]+", expr):
            if name not in metrics.NAMES:
                assert HISTOGRAM_SERIES.sub("", name) in histograms, f"{name} in {expr}"


def test_the_data_source_is_chosen_on_import() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
