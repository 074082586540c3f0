"""The stand-in for the Hugging Face Hub in tests (the only one): the Hub cannot be reached here.

An HTTP server on 127.0.0.1 (a free port, a background thread) that serves model and data set
repositories from local folders through the part of the Hub's protocol that ``huggingface_hub``
(``snapshot_download``, ``hf_hub_download``, ``HfApi.model_info``/``dataset_info``, ``HfFileSystem``),
``transformers`` and ``datasets.load_dataset`` use to resolve and download:

- ``GET /api/{models,datasets}/<repo>[/revision/<revision>]``: the repository's info (``id``,
  ``sha``, ``siblings`` [{``rfilename``}], ``private``);
- ``GET /api/{models,datasets}/<repo>/tree/<revision>[/<path>]``: files and folders (``recursive``),
  no pagination; ``POST .../paths-info/<revision>`` (form ``paths=``): the same entries for given paths;
- ``HEAD``/``GET /<repo>/resolve/<revision>/<file>`` (``/datasets/<repo>/...`` for data sets):
  the file, with ``X-Repo-Commit``, ``ETag`` (sha256 of the content) and ``Content-Length``; a
  ``Range: bytes=N-`` request answers 206 with ``Content-Range``.

A repository's commit is a 40-hex hash of its files' names and contents (stable; it changes when a
file does; ``add_model`` again to rescan); ``main`` and the commit itself resolve to it. Errors carry
the ``X-Error-Code`` header that ``huggingface_hub.utils.hf_raise_for_status`` maps to its exceptions:
404 ``RepoNotFound`` -> RepositoryNotFoundError, 404 ``RevisionNotFound`` -> RevisionNotFoundError,
404 ``EntryNotFound`` -> RemoteEntryNotFoundError; a gated repository answers 401 ``GatedRepo``
without a token and 403 ``GatedRepo`` with another one (both -> GatedRepoError) and serves only
``Authorization: Bearer <gated_token>``. Every request is recorded as (method, path with query):
:attr:`HubStandIn.requests`, :meth:`request_count`, :meth:`requests_since`, :meth:`reset_counts`,
so a test can tell that a process made none.

Not implemented: uploads and commits, Xet and LFS pointers (no ``X-Linked-Etag``/``X-Xet-*``),
redirects, branches/tags other than ``main``, pagination, ``expand``, the datasets server, and any
other endpoint (404).

Use::

    hub = HubStandIn(tmp); sha = hub.add_model("org/name", folder)  # add_dataset(...), gated_token=
    env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp / "hf")}
    subprocess.run([sys.executable, "-m", ...], env=env)  # then hub.stop()

``huggingface_hub`` reads ``HF_ENDPOINT`` into ``huggingface_hub.constants.ENDPOINT`` (and the URL
templates) when it is imported, so setting the variable in a test process that has already imported it
does nothing: run the client in a new process with the variable in its environment (as the trainer's
pods and the e2e/cluster tests do). Pass no ``HF_TOKEN`` unless the test means to (a gated repository
sees it), and give each process a fresh ``HF_HOME`` unless it should reuse a filled cache.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse


@dataclass
class Repo:
    kind: str  # "model" or "dataset"
    folder: Path
    sha: str
    files: dict[str, tuple[int, str]]  # path in the repo -> (size, sha256)
    gated_token: str | None = None


def _scan(folder: Path) -> tuple[str, dict[str, tuple[int, str]]]:
    files: dict[str, tuple[int, str]] = {}
    commit = hashlib.sha1(usedforsecurity=False)
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        files[rel] = (path.stat().st_size, digest)
        commit.update(f"{rel}\0{digest}\n".encode())
    return commit.hexdigest(), files


class HubStandIn:
    """The server; ``stop()`` when done."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.repos: dict[tuple[str, str], Repo] = {}
        self._requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                hub._answer(self, body=True)

            def do_POST(self) -> None:
                hub._answer(self, body=True)

            def do_HEAD(self) -> None:
                hub._answer(self, body=False)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def add_model(self, repo_id: str, folder: Path, *, gated_token: str | None = None) -> str:
        return self._add("model", repo_id, folder, gated_token)

    def add_dataset(self, repo_id: str, folder: Path, *, gated_token: str | None = None) -> str:
        return self._add("dataset", repo_id, folder, gated_token)

    def _add(self, kind: str, repo_id: str, folder: Path, gated_token: str | None) -> str:
        sha, files = _scan(folder)
        self.repos[(kind, repo_id)] = Repo(kind, folder, sha, files, gated_token)
        return sha

    def sha(self, repo_id: str) -> str:
        return next(r.sha for (_, name), r in self.repos.items() if name == repo_id)

    def folder(self, repo_id: str) -> Path:
        return next(r.folder for (_, name), r in self.repos.items() if name == repo_id)

    @property
    def requests(self) -> list[tuple[str, str]]:
        """Every request so far, as (method, path with query), oldest first (a copy)."""
        with self._lock:
            return list(self._requests)

    def reset_counts(self) -> None:
        with self._lock:
            self._requests.clear()

    def request_count(self) -> int:
        with self._lock:
            return len(self._requests)

    def requests_since(self, n: int) -> list[tuple[str, str]]:
        with self._lock:
            return list(self._requests[n:])

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> HubStandIn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- the protocol -------------------------------------------------------------------------------

    def _answer(self, req: BaseHTTPRequestHandler, *, body: bool) -> None:
        path = unquote(urlparse(req.path).path)
        with self._lock:
            self._requests.append((req.command, req.path))
        try:
            self._route(req, path, body=body)
        except _HubError as e:
            payload = json.dumps({"error": e.message}).encode()
            req.send_response(e.status)
            if e.code:
                req.send_header("X-Error-Code", e.code)
            req.send_header("X-Error-Message", e.message)
            req.send_header("Content-Type", "application/json")
            req.send_header("Content-Length", str(len(payload)))
            req.end_headers()
            if body:
                req.wfile.write(payload)

    def _route(self, req: BaseHTTPRequestHandler, path: str, *, body: bool) -> None:
        parts = path.strip("/").split("/")
        if parts[0] == "api" and len(parts) >= 4 and parts[1] in ("models", "datasets"):
            kind = parts[1][:-1]
            repo = self._repo(req, kind, f"{parts[2]}/{parts[3]}")
            if len(parts) == 4:  # model_info()/dataset_info() without a revision: main
                parts += ["revision", "main"]
            if len(parts) >= 6 and parts[4] == "revision":
                self._revision(repo, "/".join(parts[5:]))
                siblings = [{"rfilename": name} for name in repo.files]
                info = {
                    "id": f"{parts[2]}/{parts[3]}",
                    "sha": repo.sha,
                    "siblings": siblings,
                    "private": False,
                }
                return _json(req, info, body=body)
            if len(parts) >= 6 and parts[4] == "tree":
                self._revision(repo, parts[5])
                recursive = parse_qs(urlparse(req.path).query).get("recursive", [""])[0].lower() == "true"
                return _json(req, _tree(repo, "/".join(parts[6:]), recursive=recursive), body=body)
            if len(parts) == 6 and parts[4] == "paths-info" and req.command == "POST":
                self._revision(repo, parts[5])
                wanted = _form(req).get("paths", [])
                entries = {e["path"]: e for e in _tree(repo, "", recursive=True)}
                return _json(
                    req, [entries[p.strip("/")] for p in wanted if p.strip("/") in entries], body=body
                )
        kind = "model"
        if parts[0] == "datasets":
            kind, parts = "dataset", parts[1:]
        if len(parts) >= 5 and parts[2] == "resolve":
            repo = self._repo(req, kind, f"{parts[0]}/{parts[1]}")
            self._revision(repo, parts[3])
            return self._file(req, repo, "/".join(parts[4:]), body=body)
        raise _HubError(404, "", f"the Hub stand-in does not implement {req.command} {path}")

    def _repo(self, req: BaseHTTPRequestHandler, kind: str, repo_id: str) -> Repo:
        repo = self.repos.get((kind, repo_id))
        if repo is None:
            raise _HubError(404, "RepoNotFound", f"Repository Not Found for url: {repo_id}")
        if repo.gated_token is not None:
            auth = req.headers.get("Authorization") or ""
            if not auth:
                raise _HubError(401, "GatedRepo", f"Access to model {repo_id} is restricted")
            if auth != f"Bearer {repo.gated_token}":
                raise _HubError(403, "GatedRepo", f"Access to model {repo_id} is restricted")
        return repo

    @staticmethod
    def _revision(repo: Repo, revision: str) -> None:
        if revision not in ("main", repo.sha):
            raise _HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")

    @staticmethod
    def _file(req: BaseHTTPRequestHandler, repo: Repo, name: str, *, body: bool) -> None:
        if name not in repo.files:
            raise _HubError(404, "EntryNotFound", f"{name} does not exist")
        size, digest = repo.files[name]
        data = (repo.folder / name).read_bytes()
        start = 0
        ranged = req.headers.get("Range", "")
        if ranged.startswith("bytes=") and body:
            start = int(ranged[6:].split("-")[0] or 0)
        req.send_response(206 if start else 200)
        req.send_header("X-Repo-Commit", repo.sha)
        req.send_header("ETag", f'"{digest}"')
        req.send_header("Content-Length", str(size - start))
        if start:
            req.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        req.send_header("Content-Type", "application/octet-stream")
        req.end_headers()
        if body:
            req.wfile.write(data[start:])


class _HubError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _json(req: BaseHTTPRequestHandler, data: Any, *, body: bool) -> None:
    payload = json.dumps(data).encode()
    req.send_response(200)
    req.send_header("Content-Type", "application/json")
    req.send_header("Content-Length", str(len(payload)))
    req.end_headers()
    if body:
        req.wfile.write(payload)


def _tree(repo: Repo, prefix: str, *, recursive: bool) -> list[dict[str, Any]]:
    """The files and folders under ``prefix`` (its children, or all below it), as the tree API lists them."""
    entries: dict[str, dict[str, Any]] = {}
    for name, (size, digest) in repo.files.items():
        entries[name] = {"type": "file", "path": name, "size": size, "oid": digest[:40]}
        folders = name.split("/")[:-1]
        for i in range(1, len(folders) + 1):
            folder = "/".join(folders[:i])
            entries.setdefault(folder, {"type": "directory", "path": folder, "oid": "0" * 40, "size": 0})
    prefix = prefix.strip("/")
    base = f"{prefix}/" if prefix else ""
    if prefix in repo.files:
        return [entries[prefix]]
    if prefix and prefix not in entries:
        raise _HubError(404, "EntryNotFound", f"{prefix} does not exist")
    below = [e for path, e in sorted(entries.items()) if path.startswith(base)]
    return below if recursive else [e for e in below if "/" not in e["path"][len(base) :]]


def _form(req: BaseHTTPRequestHandler) -> dict[str, list[str]]:
    """The body of a POST: form-encoded (as ``huggingface_hub`` sends it) or JSON."""
    raw = req.rfile.read(int(req.headers.get("Content-Length") or 0)).decode()
    if (req.headers.get("Content-Type") or "").startswith("application/json"):
        data = json.loads(raw or "{}")
        return {k: v if isinstance(v, list) else [str(v)] for k, v in data.items()}
    return parse_qs(raw)
