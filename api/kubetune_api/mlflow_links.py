"""Links into the MLflow UI: a run and a registered model version, for ``status.mlflow.runUrl`` and
``status.registeredModel.url``.

Only a tracking server reached over http(s) has a UI at its address; any other tracking URI (a
local ``sqlite:``/``file:`` store, ``databricks``) gives no link. The user information of the URI
(``user:password@``) never reaches a link, nor do its query and fragment.

>>> run_url("http://mlflow.example.com:5000/", "3", "abc123")
'http://mlflow.example.com:5000/#/experiments/3/runs/abc123'
>>> model_version_url("https://bob:s3cret@host/mlflow", "team/assistant v2", "7")
'https://host/mlflow/#/models/team%2Fassistant%20v2/versions/7'
>>> run_url("sqlite:///tmp/mlflow.db", "1", "abc") is None
True
"""

from __future__ import annotations

from urllib.parse import quote, urlsplit, urlunsplit


def ui_base(tracking_uri: str | None) -> str | None:
    """The MLflow UI's address for a tracking URI (without credentials, query or a trailing slash);
    None when the URI is not http(s) or has no host."""
    if not tracking_uri:
        return None
    try:
        parts = urlsplit(tracking_uri.strip())
        host = parts.hostname
        port = parts.port
    except ValueError:  # a malformed port or address
        return None
    if parts.scheme.lower() not in ("http", "https") or not host:
        return None
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    return urlunsplit((parts.scheme.lower(), netloc, parts.path.rstrip("/"), "", ""))


def _segment(value: str) -> str:
    # as the UI's own links encode a name (encodeURIComponent): a slash or a space stays in the segment
    return quote(str(value), safe="")


def run_url(tracking_uri: str | None, experiment_id: str | None, run_id: str | None) -> str | None:
    """``<ui>/#/experiments/<experiment>/runs/<run>``; None without an http(s) server, experiment or run."""
    base = ui_base(tracking_uri)
    if base is None or not experiment_id or not run_id:
        return None
    return f"{base}/#/experiments/{_segment(experiment_id)}/runs/{_segment(run_id)}"


def model_version_url(tracking_uri: str | None, name: str | None, version: str | int | None) -> str | None:
    """``<ui>/#/models/<name>/versions/<version>``; None without an http(s) server, name or version."""
    base = ui_base(tracking_uri)
    if base is None or not name or version is None or str(version) == "":
        return None
    return f"{base}/#/models/{_segment(name)}/versions/{_segment(str(version))}"
