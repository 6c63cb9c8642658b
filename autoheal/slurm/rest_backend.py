"""Slurm through slurmrestd (for the sync daemon in a pod with no Slurm binaries).

Auth: local (``unix:/path/socket``, slurmrestd's ``rest_auth/local``) or JWT (``X-SLURM-USER-NAME`` and
``X-SLURM-USER-TOKEN`` over TCP). The token is read from a file or env var and never appears in logs,
errors or ``repr``. Redirects are never followed: ``requests`` drops only ``Authorization`` when a
redirect leaves the host, so a 3xx from slurmrestd's address (or from whoever answers there) would
carry ``X-SLURM-USER-TOKEN`` to any host it names. Over ``https://`` the server certificate is
verified (``slurm.rest_ca_file`` for a private CA); plain ``http://`` to another host is refused by the
config unless ``slurm.rest_allow_http`` says the network is trusted.

API versions: reads work on v0.0.38 (Slurm 22.05) and later. v0.0.38 has no node or job update endpoints,
so writes there raise a ``SlurmError`` that says to use the CLI backend; v0.0.40+ (Slurm 23.11+) can drain,
resume, update jobs and signal them. v0.0.45 (Slurm 26.05) adds a job requeue call
(``GET /slurm/v0.0.45/job/{id}/requeue``, ``?Hold=true``), used from that version on; reboot and the running
config as ``scontrol show config`` prints it are not exposed by any version (26.05's ``/conf`` is a JSON
dump of another shape), so those stay with the CLI fallback.
"""

from __future__ import annotations

import json
import os
import socket
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Union
from urllib.parse import quote, urlsplit

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection
from urllib3.connectionpool import HTTPConnectionPool

from autoheal.errors import SlurmError, SlurmNotFound, SlurmNotSupported, SlurmParseError, SlurmUnavailable
from autoheal.slurm import parse
from autoheal.slurm.base import OPERATIONS, SlurmAdapter, filter_jobs, job_outcome, not_found_if, with_retries
from autoheal.slurm.model import Job, JobUpdate, Node, SlurmVersion

if TYPE_CHECKING:
    from autoheal.config.core_sections import SlurmSection

# Newest first: the first one the server answers is used. 26.05 serves v0.0.42 to v0.0.45, 24.11 v0.0.40
# to v0.0.42, 22.05 v0.0.38 (see docs/slurm-versions.md).
KNOWN_VERSIONS = ("v0.0.45", "v0.0.44", "v0.0.43", "v0.0.42", "v0.0.41", "v0.0.40", "v0.0.39", "v0.0.38")
#: The first version with a job requeue call (Slurm 26.05)
REQUEUE_SINCE = "v0.0.45"
UNIX_BASE = "http://slurmrestd.local"


class _UnixConnection(HTTPConnection):
    def __init__(self, socket_path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.socket_path)
        self.sock = sock


class _UnixPool(HTTPConnectionPool):
    def __init__(self, socket_path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = socket_path
        self._timeout = timeout

    def _new_conn(self) -> _UnixConnection:
        return _UnixConnection(self.socket_path, self._timeout)


class UnixSocketAdapter(HTTPAdapter):
    """A requests transport adapter that sends every request to one unix socket."""

    def __init__(self, socket_path: str, timeout: float):
        self.socket_path = socket_path
        self._timeout = timeout
        super().__init__()

    def get_connection_with_tls_context(self, request: Any, verify: Any, proxies: Any = None,
                                        cert: Any = None) -> _UnixPool:  # requests >= 2.32
        return _UnixPool(self.socket_path, self._timeout)

    def get_connection(self, url: Any, proxies: Any = None) -> _UnixPool:  # older requests
        return _UnixPool(self.socket_path, self._timeout)


def _origin(location: str) -> str:
    """scheme://host:port of a redirect target, for the error (its path and query may hold anything)."""
    try:
        parts = urlsplit(location)
    except ValueError:
        return "an unreadable address"
    if not parts.netloc:
        return "a path on the same server"
    return f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}"[:120]


class RestSlurm(SlurmAdapter):
    """Slurm through slurmrestd."""

    name = "rest"

    #: Calls no slurmrestd version serves: they go through ``fallback`` (the CLI backend) when it is there.
    CLI_ONLY = ("reboot", "show-config", "resize-job", "batch-script", "job-gpus", "job-history")

    def __init__(self, url: str, api_version: str = "auto", user: str = "", token: str = "",
                 timeout: float = 10.0, retries: int = 2, fallback: Optional[SlurmAdapter] = None,
                 ca_file: str = ""):
        self.fallback = fallback  # the CLI backend, for what slurmrestd cannot do (see CLI_ONLY)
        self.timeout = timeout
        self.retries = retries
        self._session = requests.Session()
        self._session.trust_env = False
        verify: Union[bool, str] = ca_file or True
        self._session.verify = verify
        if url.startswith("unix:"):
            path = url[len("unix:"):]
            self.base = UNIX_BASE
            self._session.mount(UNIX_BASE + "/", UnixSocketAdapter(path, timeout))
        else:
            self.base = url.rstrip("/")
        if user:
            self._session.headers["X-SLURM-USER-NAME"] = user
        if token:
            self._session.headers["X-SLURM-USER-TOKEN"] = token
        self._api = None if api_version == "auto" else api_version
        self.url = url

    def __repr__(self) -> str:  # never show the token
        return f"RestSlurm(url={self.url!r}, api={self._api or 'auto'})"

    @classmethod
    def from_config(cls, section: SlurmSection) -> RestSlurm:
        token = ""
        if section.rest_token_file:
            try:
                with open(section.rest_token_file, encoding="utf-8") as fh:
                    token = fh.read().strip()
            except OSError as exc:
                raise SlurmError(f"slurm.rest_token_file {section.rest_token_file}: "
                                 f"cannot read: {exc.strerror}") from None
        elif section.rest_token_env:
            token = os.environ.get(section.rest_token_env, "")
        from autoheal.slurm.binaries import maybe_binary
        from autoheal.slurm.cli_backend import CliSlurm

        # Only where scontrol is installed: a slurmrestd-only host (e.g. a sync pod) has no fallback, and
        # `autoheal config validate` says which calls it then cannot make.
        fallback = CliSlurm.from_config(section) if maybe_binary("scontrol", section.bin_dir) else None
        return cls(section.rest_url, section.rest_api_version, section.rest_user, token, section.timeout,
                   section.retries, fallback=fallback, ca_file=section.rest_ca_file)

    # ---- HTTP plumbing ---------------------------------------------------------------------------
    def _request(self, method: str, path: str, body: Optional[Dict[str, Any]] = None,
                 params: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        url = f"{self.base}{path}"
        try:
            resp = self._session.request(method, url, json=body, params=params, timeout=self.timeout,
                                         allow_redirects=False)
        except requests.exceptions.SSLError:
            raise SlurmError(f"slurmrestd {method} {path}: TLS verification failed (the server's certificate "
                             f"is not signed by a trusted CA: set slurm.rest_ca_file)") from None
        except requests.Timeout:
            raise SlurmUnavailable(f"slurmrestd {method} {path}: no answer within {self.timeout:g}s") from None
        except requests.ConnectionError as exc:
            raise SlurmUnavailable(f"slurmrestd {method} {path}: cannot connect ({type(exc).__name__})") from None
        if 300 <= resp.status_code < 400:
            # Never followed: the token header would go to wherever Location points.
            raise SlurmError(f"slurmrestd {method} {path}: HTTP {resp.status_code} redirect to "
                             f"{_origin(resp.headers.get('Location', ''))} refused (the token is never sent "
                             f"on; point slurm.rest_url at the address that answers)")
        text = resp.text
        data: Dict[str, Any] = {}
        if text.strip():
            try:
                data = json.loads(text)
            except ValueError:
                if resp.status_code < 400:
                    raise SlurmParseError(f"slurmrestd {path}: answer is not JSON: {text.strip()[:60]!r}") from None
        errors = data.get("errors") if isinstance(data, dict) else None
        if resp.status_code in (401, 403):
            raise SlurmError(f"slurmrestd {method} {path}: HTTP {resp.status_code}: authentication refused "
                             f"(check rest_user and the token)")
        if resp.status_code == 404 and not errors:
            raise SlurmNotSupported(f"slurmrestd {method} {path}: HTTP 404 (endpoint not served by this slurmrestd)")
        if resp.status_code >= 500 and not errors:
            raise SlurmUnavailable(f"slurmrestd {method} {path}: HTTP {resp.status_code}")
        if errors:
            first = errors[0] if isinstance(errors[0], dict) else {"error": str(errors[0])}
            msg = first.get("description") or first.get("error") or "error"
            code = first.get("error_number") or first.get("errno")
            low = " ".join(str(first.get(k) or "") for k in ("error", "description")).lower() or str(msg).lower()
            kind = job_outcome(low)
            if kind is not None:
                raise kind(f"slurmrestd {method} {path}: {msg}")
            if not_found_if(low) or code in (2017, 2018):
                raise SlurmNotFound(f"slurmrestd {path}: {msg}")
            if resp.status_code >= 500 and "unable to contact" in low:
                raise SlurmUnavailable(f"slurmrestd {path}: {msg}")
            raise SlurmError(f"slurmrestd {method} {path}: {msg}")
        if resp.status_code >= 400:
            raise SlurmError(f"slurmrestd {method} {path}: HTTP {resp.status_code}")
        return data if isinstance(data, dict) else {}

    def _get(self, path: str, params: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        return with_retries(lambda: self._request("GET", path, params=params), self.retries)

    @property
    def api(self) -> str:
        """The OpenAPI plugin version to use: the configured one, or the newest the server answers."""
        if self._api is None:
            last_err: Optional[Exception] = None
            for candidate in KNOWN_VERSIONS:
                try:
                    self._request("GET", f"/slurm/{candidate}/ping")
                    self._api = candidate
                    break
                except SlurmNotSupported as exc:  # HTTP 404: not this version; unreachable, auth refused... raise
                    last_err = exc
            if self._api is None:
                raise SlurmError(f"slurmrestd at {self.url} serves none of {', '.join(KNOWN_VERSIONS)} ({last_err})")
        return self._api

    @property
    def can_write(self) -> bool:
        return self.api >= "v0.0.40"

    def _require_write(self, what: str) -> None:
        if not self.can_write:
            raise SlurmNotSupported(f"slurmrestd {self.api} (Slurm 22.05/23.02) has no endpoint to {what}; "
                                    f"install scontrol beside autoheal (it is used for such calls) or use "
                                    f"slurm.backend = 'cli'")

    def _via_cli(self, op: str) -> SlurmAdapter:
        """The CLI backend for ``op``, or SlurmNotSupported naming what to install."""
        if self.fallback is None:
            raise SlurmNotSupported(f"slurmrestd has no call to {op} and scontrol is not installed here: "
                                    f"install slurm-client beside autoheal or use slurm.backend = 'cli'")
        return self.fallback

    def _writes_via_cli(self) -> bool:
        """Writes go through the CLI fallback when this slurmrestd serves no write endpoint."""
        try:
            return not self.can_write and self.fallback is not None
        except SlurmError:  # slurmrestd unreachable right now: let the REST call report it
            return False

    def capabilities(self) -> Dict[str, str]:
        """Which calls go to slurmrestd, which to the CLI fallback, and which cannot be made."""
        try:
            writes = "rest" if self.can_write else ("cli" if self.fallback else "")
        except SlurmError:
            writes = "rest"  # unknown until slurmrestd answers; validate says so separately
        caps = dict.fromkeys(OPERATIONS, writes)
        caps["read"] = "rest"
        for op in self.CLI_ONLY:
            caps[op] = "cli" if self.fallback else ""
        if not self._serves_requeue():
            caps["requeue"] = "cli" if self.fallback else ""
        return caps

    def _serves_requeue(self) -> bool:
        """Whether this slurmrestd has the requeue call (v0.0.45+); unknown (unreachable): not assumed."""
        try:
            return self.api >= REQUEUE_SINCE
        except SlurmError:
            return False

    # ---- reads ------------------------------------------------------------------------------------
    def version(self) -> SlurmVersion:
        data = self._get(f"/slurm/{self.api}/ping")
        meta = data.get("meta", {})
        rel = (meta.get("Slurm") or meta.get("slurm") or {}).get("release") or ""
        if not rel:
            v = (meta.get("Slurm") or meta.get("slurm") or {}).get("version") or {}
            rel = f"{v.get('major', 0)}.{v.get('minor', 0)}.{v.get('micro', 0)}"
        return SlurmVersion.parse(str(rel))

    def list_nodes(self) -> List[Node]:
        data = self._get(f"/slurm/{self.api}/nodes")
        return parse.nodes_from_json(json.dumps(data), "slurmrestd nodes")

    def get_node(self, name: str) -> Node:
        data = self._get(f"/slurm/{self.api}/node/{quote(name)}")
        nodes = parse.nodes_from_json(json.dumps(data), f"slurmrestd node {name}")
        for node in nodes:
            if node.name == name:
                return node
        raise SlurmNotFound(f"node {name!r} not found")

    def list_jobs(self, node: Optional[str] = None, states: Optional[List[str]] = None) -> List[Job]:
        # slurmrestd's job list takes no state, node or job filter at any version we know (its query is
        # update_time and flags only, v0.0.38 to v0.0.42): every job of the cluster comes back. Where
        # scontrol/squeue are installed beside us, a filtered listing goes to the CLI backend, which has
        # Slurm filter it; a slurmrestd-only host (the sync pod) filters here.
        if (node or states) and self.fallback is not None:
            return self.fallback.list_jobs(node=node, states=states)
        data = self._get(f"/slurm/{self.api}/jobs")
        jobs = parse.jobs_from_json(json.dumps(data), "slurmrestd jobs")
        return filter_jobs(jobs, node, states)

    def get_job(self, job_id: str) -> Job:
        raw = str(job_id)
        data = self._get(f"/slurm/{self.api}/job/{quote(raw)}")
        jobs = parse.jobs_from_json(json.dumps(data), f"slurmrestd job {raw}")
        for job in jobs:
            if job.job_id == raw or job.raw_id == raw or job.array_job_id == raw:
                return job
        raise SlurmNotFound(f"job {raw} not found")

    def show_config(self) -> Dict[str, str]:
        return self._via_cli("show the running slurm.conf").show_config()

    def batch_script(self, job_id: str) -> str:
        # No slurmrestd version returns a job's script (xid-watch reads its #SBATCH --signal there):
        # `scontrol write batch_script ID -`, as for requeue.
        return self._via_cli("read a job's batch script").batch_script(job_id)

    def job_gpus(self, job_id: str, node: str, timeout: Optional[float] = None) -> List[int]:
        # slurmrestd's job record has the GRES but not the per-node indices (IDX) that -d shows
        return self._via_cli("read a job's GPU indices").job_gpus(job_id, node, timeout=timeout)

    def job_state_history(self, job_id: str) -> Optional[List[str]]:
        # slurmdbd's REST endpoints need their own token and plugin: sacct as for requeue
        return self._via_cli("read job accounting").job_state_history(job_id)

    def ping(self) -> bool:
        try:
            data = self._request("GET", f"/slurm/{self.api}/ping")
        except SlurmError:
            return False
        pings = data.get("pings") or []
        return any(str(p.get("ping", p.get("pinged", ""))).upper() in ("UP", "TRUE") or p.get("responding")
                   for p in pings)

    # ---- writes (v0.0.40+) ------------------------------------------------------------------------
    def _node_update(self, node: str, body: Dict[str, Any], what: str) -> None:
        if self._writes_via_cli():
            fb = self._via_cli(what)
            if body.get("state") == ["RESUME"]:
                return fb.resume(node)
            return fb.drain(node, str(body.get("reason", "")))
        self._require_write(what)
        with_retries(lambda: self._request("POST", f"/slurm/{self.api}/node/{quote(node)}", body), self.retries)

    def drain(self, node: str, reason: str) -> None:
        self._node_update(node, {"state": ["DRAIN"], "reason": reason}, "drain nodes")

    def resume(self, node: str) -> None:
        self._node_update(node, {"state": ["RESUME"]}, "resume nodes")

    def set_reason(self, node: str, reason: str) -> None:
        self._node_update(node, {"state": ["DRAIN"], "reason": reason}, "set node reasons")

    def reboot(self, node: str, reason: str, asap: bool = True, nextstate: str = "resume") -> None:
        self._via_cli("reboot nodes").reboot(node, reason, asap=asap, nextstate=nextstate)

    def requeue(self, job_id: str, hold: bool = False) -> None:
        # v0.0.38 to v0.0.44 have no requeue call: `scontrol requeue[hold]`. Not retried (as in the CLI
        # backend): a requeue whose answer was lost may have happened.
        if not self._serves_requeue():
            return self._via_cli("requeue jobs").requeue(job_id, hold=hold)
        # "Hold=true": an empty value ("?Hold=", what a flag-style query gives) requeues WITHOUT the hold
        # (observed on 26.05.5: Reason=BeginTime, priority kept), and the job could restart on the bad node
        params = {"Hold": "true"} if hold else None
        self._request("GET", f"/slurm/{self.api}/job/{quote(str(job_id))}/requeue", params=params)

    def release(self, job_id: str) -> None:
        if self._writes_via_cli():
            return self._via_cli("release jobs").release(job_id)
        self._post_job(job_id, {"hold": False})

    def update_job(self, job_id: str, update: JobUpdate) -> None:
        if self._writes_via_cli():
            return self._via_cli("update jobs").update_job(job_id, update)
        if update.nodes is not None or update.node_count is not None:
            # resizing a job through slurmrestd's job_desc fields was never tried: scontrol does it
            return self._via_cli("resize jobs").update_job(job_id, update)
        body: Dict[str, Any] = {}
        if update.excluded_nodes is not None:
            body["excluded_nodes"] = [n for n in update.excluded_nodes if n]
        if update.comment is not None:
            body["comment"] = update.comment
        if body:
            self._post_job(job_id, body)

    def _post_job(self, job_id: str, body: Dict[str, Any]) -> None:
        self._require_write("update jobs")
        with_retries(lambda: self._request("POST", f"/slurm/{self.api}/job/{quote(str(job_id))}", body),
                     self.retries)

    def signal_job(self, job_id: str, signal: str, batch: bool = False, full: bool = False) -> None:
        if self._writes_via_cli():
            return self._via_cli("signal jobs").signal_job(job_id, signal, batch=batch, full=full)
        self._require_write("signal jobs")
        flags = "BATCH_JOB" if batch else ("FULL_JOB" if full else "")
        params = {"signal": signal}
        if flags:
            params["flags"] = flags
        self._request("DELETE", f"/slurm/{self.api}/job/{quote(str(job_id))}", params=params)
