"""A stand-in for the Hugging Face Hub, for tests: the Hub cannot be reached here.

An HTTP server on 127.0.0.1 that serves model and data set repositories from local folders through
the part of the Hub's protocol that ``huggingface_hub`` uses to resolve and download
(``HF_ENDPOINT=<endpoint>``):

- ``GET /api/{models,datasets}/<repo>/revision/<revision>``: the repository's info (``sha``,
  ``siblings``);
- ``GET /api/{models,datasets}/<repo>/tree/<revision>``: its files (``recursive``, no pagination);
- ``HEAD``/``GET /<repo>/resolve/<revision>/<file>`` (``/datasets/<repo>/...`` for data sets):
  the file, with ``X-Repo-Commit``, ``ETag`` and ``Content-Length`` (a ``Range`` request resumes).

A repository's commit is a hash of its files' names and contents; ``main`` and the commit itself
resolve to it. Errors carry the ``X-Error-Code`` header the library maps to its exceptions: 404
``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``; a gated repository answers 401
``GatedRepo`` without its token and 403 with another one. Every request is counted
(:meth:`HubStandIn.request_count`), so a test can tell that a process made none.

Not implemented: uploads, Xet and LFS pointers, pagination, ``expand``, the datasets server, and
any other endpoint (they answer 404).

Use: ``hub = HubStandIn(tmp); hub.add_model("org/name", folder)``; then a process started with
``HF_ENDPOINT=hub.endpoint`` (``huggingface_hub`` reads it when it is imported: set it in the
environment of a new process, as the pods and the trainer processes of the tests are).
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse


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
            req.send_header("X-Error-Code", e.code)
            req.send_header("X-Error-Message", e.message)
            req.send_header("Content-Type", "application/json")
            req.send_header("Content-Length", str(len(payload)))
            req.end_headers()
            if body:
                req.wfile.write(payload)

    def _route(self, req: BaseHTTPRequestHandler, path: str, *, body: bool) -> None:
        parts = path.strip("/").split("/")
        if parts[0] == "api" and len(parts) >= 6 and parts[1] in ("models", "datasets"):
            kind = parts[1][:-1]
            repo = self._repo(req, kind, f"{parts[2]}/{parts[3]}")
            if parts[4] == "revision":
                self._revision(repo, parts[5])
                siblings = [{"rfilename": name} for name in repo.files]
                info = {
                    "id": f"{parts[2]}/{parts[3]}",
                    "sha": repo.sha,
                    "siblings": siblings,
                    "private": False,
                }
                return _json(req, info, body=body)
            if parts[4] == "tree":
                self._revision(repo, parts[5])
                prefix = "/".join(parts[6:])
                tree = [
                    {"type": "file", "path": name, "size": size, "oid": digest[:40]}
                    for name, (size, digest) in repo.files.items()
                    if name.startswith(prefix)
                ]
                return _json(req, tree, body=body)
        kind = "model"
        if parts[0] == "datasets":
            kind, parts = "dataset", parts[1:]
        if len(parts) >= 5 and parts[2] == "resolve":
            repo = self._repo(req, kind, f"{parts[0]}/{parts[1]}")
            self._revision(repo, parts[3])
            return self._file(req, repo, "/".join(parts[4:]), body=body)
        raise _HubError(404, "EntryNotFound", f"no such endpoint {path}")

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
