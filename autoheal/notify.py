"""Posting journal records to webhooks (Slack-compatible ``{"text": ...}`` plus the record).

Healing never waits for a notification (issue 16, finding 6: a hung webhook turned a 0.6 s XID-to-drain
into 10 s). So:

- ``send`` only queues: one daemon worker per webhook URL delivers that URL's queue in order; a full
  queue drops the record (counted, and journalled once by the worker) instead of blocking or growing.
- Each attempt has a *total* deadline (``notify.timeout``): connecting, sending and the whole answer.
  A socket timeout alone is per read, so a server trickling one byte a second kept a sender alive for
  minutes; here a timer shuts the attempt's socket down when the deadline passes.
- ``flush(timeout)`` waits at most ``timeout`` for the queues to drain, and says whether they did.

Uses urllib (stdlib) rather than requests: hooks import this on compute nodes, where start-up time is
the budget. Proxies from the environment still apply; redirects are not followed (a POST redirected
would arrive as an empty GET, or at another scheme). Failures are journalled as ``notify-failed``.
"""

from __future__ import annotations

import http.client
import json
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Deque, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

from autoheal.journal import SEVERITIES, Journal, Record
from autoheal.reasons import sanitize

if TYPE_CHECKING:
    from autoheal.config import Config

    _HandlerBase = urllib.request.AbstractHTTPHandler  # what _DeadlineHandler is mixed into
else:
    _HandlerBase = object

#: Records waiting per webhook before new ones are dropped (a dead endpoint must not eat memory).
QUEUE_MAX = 200
#: Outcomes kept in ``Notifier.results``.
RESULTS_MAX = 1000


def format_text(rec: Record, cluster: str = "") -> str:
    """One human line: ``[cluster] gpu1: drain (xid 79 on GPU 3 of gpu1...) -> drained``."""
    where = f"[{cluster}] " if cluster else ""
    parts = [f"{where}{rec.node or rec.host}: {rec.event}"]
    if rec.check:
        parts.append(f"check {rec.check}")
    if rec.message:
        parts.append(rec.message)
    if rec.job_ids:
        parts.append("jobs " + ",".join(str(j) for j in rec.job_ids))
    if rec.outcome:
        parts.append(f"-> {rec.outcome}")
    return sanitize(" | ".join(parts), 1500)


# ---- one HTTP attempt with a total deadline ---------------------------------------------------------------

class _Deadline:
    """The end of one attempt. Every socket the attempt opens is watched (through a duplicate of its
    descriptor, which stays valid when TLS wraps the socket); ``expire`` shuts them down, which wakes a
    read or write blocked on them at once."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.end = time.monotonic() + seconds
        self.expired = False
        self._lock = threading.Lock()
        self._watched: List[socket.socket] = []

    def remaining(self) -> float:
        return self.end - time.monotonic()

    def create_connection(self, address: Tuple[str, int], timeout: Any = None,
                          source_address: Optional[Tuple[str, int]] = None, *args: Any, **kwargs: Any) -> socket.socket:
        """``socket.create_connection`` bounded by what is left of the deadline, and watched."""
        left = self.remaining()
        if self.expired or left <= 0:
            raise TimeoutError(f"no complete answer within {self.seconds:g}s")
        if isinstance(timeout, (int, float)):
            left = min(left, timeout)
        sock = socket.create_connection(address, left, source_address, *args, **kwargs)
        try:
            dup = sock.dup()
            with self._lock:
                self._watched.append(dup)
                if self.expired:  # the deadline passed while we resolved and connected
                    raise TimeoutError(f"no complete answer within {self.seconds:g}s")
        except BaseException:
            sock.close()
            raise
        return sock

    def expire(self) -> None:
        with self._lock:
            self.expired = True
            for s in self._watched:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        with self._lock:
            for s in self._watched:
                s.close()
            self._watched.clear()


class _DeadlineHandler(_HandlerBase):
    """Mixin for urllib's HTTP(S) handlers: every connection they make goes through the deadline."""

    def __init__(self, deadline: _Deadline):
        super().__init__()
        self._deadline = deadline

    def do_open(self, http_class: Any, req: urllib.request.Request, **kwargs: Any) -> http.client.HTTPResponse:
        deadline = self._deadline

        def connection(host: str, **kw: Any) -> http.client.HTTPConnection:
            conn: http.client.HTTPConnection = http_class(host, **kw)
            # http.client's private connect hook (CPython), not in typeshed
            conn._create_connection = deadline.create_connection  # type: ignore[attr-defined]
            return conn

        return super().do_open(connection, req, **kwargs)


class _HTTPHandler(_DeadlineHandler, urllib.request.HTTPHandler):
    pass


class _HTTPSHandler(_DeadlineHandler, urllib.request.HTTPSHandler):
    pass


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> None:
        return None  # urllib then raises HTTPError(code): a redirect is an answer, not a delivery


def post_json(url: str, payload: Dict[str, Any], timeout: float) -> int:
    """POST JSON and return the HTTP status; the whole attempt ends within ``timeout`` seconds.

    Transport trouble raises OSError (``TimeoutError`` when the deadline passed); a URL urllib cannot
    use raises ValueError.
    """
    data = json.dumps(payload, default=str).encode()
    req = urllib.request.Request(url, data=data, method="POST",
                                 headers={"Content-Type": "application/json", "User-Agent": "autoheal"})
    deadline = _Deadline(timeout)
    opener = urllib.request.build_opener(_HTTPHandler(deadline), _HTTPSHandler(deadline), _NoRedirect())
    timer = threading.Timer(timeout, deadline.expire)
    timer.daemon = True
    timer.start()
    try:
        with opener.open(req, timeout=timeout) as resp:
            status: int = resp.status
        if deadline.expired:  # the shutdown ended a trickled header block early: not a real answer
            raise TimeoutError(f"no complete answer within {timeout:g}s")
        return status
    except urllib.error.HTTPError as exc:
        exc.close()
        return exc.code
    except (OSError, http.client.HTTPException) as exc:
        # a socket timeout is the deadline too: each socket operation is bounded by what was left of it
        reason = getattr(exc, "reason", exc)
        if deadline.expired or isinstance(exc, TimeoutError) or isinstance(reason, TimeoutError):
            raise TimeoutError(f"no complete answer within {timeout:g}s") from None
        if isinstance(exc, http.client.HTTPException):  # bad status line, header flood...
            raise ConnectionError(f"bad answer ({type(exc).__name__})") from None
        raise
    finally:
        timer.cancel()
        deadline.close()


def _describe(exc: BaseException) -> str:
    """A short reason for the journal that never repeats the URL (webhook URLs carry secrets)."""
    if isinstance(exc, urllib.error.URLError) and not isinstance(exc, urllib.error.HTTPError):
        reason = exc.reason
        return _describe(reason) if isinstance(reason, BaseException) else sanitize(str(reason), 200)
    if isinstance(exc, TimeoutError) and exc.args and isinstance(exc.args[0], str) and "within" in exc.args[0]:
        return exc.args[0]
    if isinstance(exc, OSError) and exc.strerror:
        return sanitize(exc.strerror, 200)
    if isinstance(exc, OSError) and exc.args and isinstance(exc.args[0], str):
        return sanitize(exc.args[0], 200)
    return type(exc).__name__


# ---- the queueing sender ------------------------------------------------------------------------------------

class Notifier:
    """Sends records to every configured webhook in the background; ``send`` never blocks."""

    def __init__(self, urls: List[str], timeout: float = 3.0, retries: int = 2, min_severity: str = "action",
                 cluster: str = "", journal: Optional[Journal] = None,
                 sleep: Callable[[float], None] = time.sleep, queue_max: int = QUEUE_MAX):
        self.urls = [u for u in urls if _is_http(u)]
        self.timeout = timeout
        self.retries = retries
        self.min_level = SEVERITIES.index(min_severity) if min_severity in SEVERITIES else 1
        self.cluster = cluster
        self.journal = journal
        self.queue_max = queue_max
        self._sleep = sleep
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pending = 0
        self._queues: Dict[str, Deque[Tuple[Dict[str, Any], Record]]] = {}
        self._workers: Dict[str, threading.Thread] = {}
        self._dropped: Dict[str, int] = {}
        self.results: List[Dict[str, Any]] = []

    @classmethod
    def from_config(cls, config: Config, journal: Optional[Journal] = None) -> Notifier:
        n = config.notify
        return cls(n.webhooks, n.timeout, n.retries, n.min_severity, n.cluster_name or "", journal)

    def wants(self, rec: Record) -> bool:
        level = SEVERITIES.index(rec.severity) if rec.severity in SEVERITIES else 0
        return bool(self.urls) and level >= self.min_level

    def send(self, rec: Record, extra_urls: Optional[List[str]] = None, force: bool = False) -> None:
        """Queue ``rec`` for delivery (returns at once, whatever the endpoints do)."""
        urls = list(self.urls) + [u for u in (extra_urls or []) if _is_http(u)]
        if not urls or not (force or self.wants(rec) or extra_urls):
            return
        payload = {"text": format_text(rec, self.cluster), "autoheal": json.loads(rec.to_json())}
        for url in dict.fromkeys(urls):
            self._enqueue(url, payload, rec)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait up to ``timeout`` seconds in total for queued deliveries; True when all finished."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
            return True

    # ---- workers --------------------------------------------------------------------------------------------
    def _note(self, result: Dict[str, Any], locked: bool = False) -> None:
        """Keep the outcome (for callers and tests), only the newest RESULTS_MAX: the sync daemon runs
        for months."""
        if not locked:
            with self._lock:
                self._note(result, locked=True)
            return
        self.results.append(result)
        if len(self.results) > RESULTS_MAX:
            del self.results[: len(self.results) - RESULTS_MAX]

    def _enqueue(self, url: str, payload: Dict[str, Any], rec: Record) -> None:
        with self._lock:
            queue = self._queues.setdefault(url, deque())
            if len(queue) >= self.queue_max:
                self._dropped[url] = self._dropped.get(url, 0) + 1
                self._note({"url": url, "ok": False, "attempts": 0, "error": "queue full"}, locked=True)
                return
            queue.append((payload, rec))
            self._pending += 1
            if url not in self._workers:
                worker = threading.Thread(target=self._work, args=(url,), daemon=True, name="autoheal-notify")
                self._workers[url] = worker
                worker.start()

    def _work(self, url: str) -> None:
        """Deliver ``url``'s queue in order; end when it is empty (the next send starts a new worker)."""
        while True:
            with self._lock:
                queue = self._queues[url]
                if not queue:
                    del self._workers[url]
                    return
                payload, rec = queue.popleft()
            try:
                self._deliver(url, payload, rec)
                self._report_drops(url)
            except Exception as exc:  # never let one record kill the worker (the queue would stall)
                print(f"autoheal: warning: notify {_redact(url)}: {type(exc).__name__}", file=sys.stderr)
            finally:
                with self._lock:
                    self._pending -= 1
                    self._idle.notify_all()

    def _report_drops(self, url: str) -> None:
        """One journal record for the records dropped since the last report (a queue is only full while
        deliveries are still ahead of it, so every drop is reported by one of them)."""
        with self._lock:
            dropped = self._dropped.pop(url, 0)
        if dropped and self.journal is not None:
            self.journal.record("notify-failed", severity="error", source="notify",
                                message=f"webhook {_redact(url)}: {dropped} records dropped, queue full "
                                        f"({self.queue_max} waiting)")

    def _deliver(self, url: str, payload: Dict[str, Any], rec: Record) -> None:
        error = ""
        for attempt in range(self.retries + 1):
            try:
                status = post_json(url, payload, self.timeout)
                if 200 <= status < 300:
                    self._note({"url": url, "ok": True, "attempts": attempt + 1})
                    return
                error = f"HTTP {status}" + (" (redirects are not followed)" if 300 <= status < 400 else "")
                if 300 <= status < 500 and status != 429:
                    break  # the endpoint refuses this payload or sends it elsewhere; retrying will not help
            except (OSError, ValueError) as exc:
                error = _describe(exc)
            if attempt < self.retries:
                self._sleep(min(4.0, 0.5 * (2 ** attempt)))
        self._note({"url": url, "ok": False, "attempts": attempt + 1, "error": error})
        if self.journal is not None:
            self.journal.record("notify-failed", node=rec.node, job_ids=rec.job_ids, severity="error",
                                message=f"webhook {_redact(url)} failed after {attempt + 1} attempts: {error}",
                                source="notify")


def _is_http(url: Any) -> bool:
    return isinstance(url, str) and url.startswith(("http://", "https://"))


def _redact(url: str) -> str:
    """Webhook URLs carry secrets in their path (Slack) and maybe user:password: keep scheme and host."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        port = parts.port
    except ValueError:
        return "<webhook>"
    if not parts.scheme or not host:
        return "<webhook>"
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}{f':{port}' if port else ''}/..."
