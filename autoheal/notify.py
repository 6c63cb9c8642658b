"""Posting journal records to webhooks (Slack-compatible ``{"text": ...}`` plus the record).

Healing never waits for a notification (issue 16, finding 6: a hung webhook turned a 0.6 s XID-to-drain
into 10 s). So:

- ``send`` only queues: one daemon worker per webhook URL delivers that URL's queue in order; a full
  queue drops the record (counted, and journalled once by the worker) instead of blocking or growing.
- Each attempt has a *total* deadline (``notify.timeout``): connecting, sending and the whole answer.
  A socket timeout alone is per read, so a server trickling one byte a second kept a sender alive for
  minutes; here a timer shuts the attempt's socket down when the deadline passes.
- ``flush(timeout)`` waits at most ``timeout`` for the queues to drain, and says whether they did.

Text from users (job comments, job names, the records a job's runner leaves for the epilog) reaches these
messages, so every field of the human text goes through ``escape_markup`` (issue 25, item 7): no Slack
``<!channel>``/``<!here>``/``<@U..>``, no ``@channel``/``@here``/``@everyone`` for Mattermost, Discord or
Teams, no HTML and no Markdown link. And one job cannot flood the on-call: a long-running sender (the
guard, xid-watch) sends the first ``job_burst`` records of each (job, event) per ``job_window`` seconds
and then one summary of what it held back (``JobRateLimit``).

Uses urllib (stdlib) rather than requests: hooks import this on compute nodes, where start-up time is
the budget. Proxies from the environment still apply; redirects are not followed (a POST redirected
would arrive as an empty GET, or at another scheme). Failures are journalled as ``notify-failed``.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import OrderedDict, deque
from dataclasses import dataclass, field
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


#: ``@`` starting a word: ``@channel``, ``@here``, ``@everyone``, ``@all``, ``@user`` (not ``a@b.c``).
_AT_WORD = re.compile(r"(?<![\w.])@(?=\w)")
_ZWSP = "\u200b"


def escape_markup(text: str) -> str:
    """``text`` that no chat service reads as a mention, a link or markup, and that still reads the same.

    ``& < >`` become ``&amp; &lt; &gt;`` (Slack's own escaping, which it shows as the characters: no
    ``<!channel>``, ``<!here>``, ``<@U123>``, ``<#C1>``, ``<!subteam^..>``, ``<http://x|click>``; and no HTML
    tag for Teams); a zero-width space after an ``@`` that starts a word keeps ``@channel``, ``@here``,
    ``@everyone`` from notifying anyone (Mattermost, Discord, Teams); and one between ``](`` breaks a
    Markdown link ``[text](url)``. Apply it to text already through ``sanitize`` (which would turn the
    zero-width space into a plain space).
    """
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = _AT_WORD.sub("@" + _ZWSP, text)
    return text.replace("](", "]" + _ZWSP + "(")


def _field(text: Any, limit: int) -> str:
    return escape_markup(sanitize("" if text is None else str(text), limit))


def format_text(rec: Record, cluster: str = "") -> str:
    """One human line: ``[cluster] gpu1: drain (xid 79 on GPU 3 of gpu1...) -> drained``; every field
    sanitised and escaped (:func:`escape_markup`), the separators kept as they are."""
    where = f"[{_field(cluster, 100)}] " if cluster else ""
    parts = [f"{where}{_field(rec.node or rec.host, 100)}: {_field(rec.event, 100)}"]
    if rec.check:
        parts.append(f"check {_field(rec.check, 100)}")
    if rec.message:
        parts.append(_field(rec.message, 1200))
    if rec.job_ids:
        parts.append("jobs " + _field(",".join(str(j) for j in rec.job_ids), 200))
    if rec.outcome:
        parts.append(f"-> {_field(rec.outcome, 100)}")
    return " | ".join(parts)


# ---- at most a few notifications per job ---------------------------------------------------------------------

#: Defaults of ``notify.job_burst``, ``notify.job_window`` and ``notify.job_tracked``.
JOB_BURST, JOB_WINDOW, JOB_TRACKED = 1, 600.0, 1000


@dataclass
class _Held:
    """One (job, event): when its window began, how many were sent and held back in it."""

    start: float
    sent: int = 0
    held: int = 0
    last: Optional[Record] = None
    extra_urls: List[str] = field(default_factory=list)


class JobRateLimit:
    """Per (job, event): the first ``burst`` records of a ``window`` are sent, the rest held back and
    counted; one summary record says how many once the window ends (or the sender stops). A user who
    loops ``scontrol requeuehold`` on their own job gets one guard-release notification and a summary,
    not one a pass. Only records about exactly one job count (a node's drain naming several jobs is
    never held back), each event on its own (a job's first requeue is never hidden behind its releases).
    At most ``tracked`` keys are kept (the oldest goes first, its summary sent): bounded memory.
    ``burst`` 0: no limit."""

    def __init__(self, burst: int = JOB_BURST, window: float = JOB_WINDOW, tracked: int = JOB_TRACKED,
                 clock: Callable[[], float] = time.monotonic):
        self.burst = burst
        self.window = window
        self.tracked = max(1, tracked)
        self.clock = clock
        self._keys: OrderedDict[Tuple[str, str], _Held] = OrderedDict()

    @staticmethod
    def key(rec: Record) -> Optional[Tuple[str, str]]:
        if len(rec.job_ids) != 1:
            return None
        return (str(rec.job_ids[0]), rec.event)

    def admit(self, rec: Record, extra_urls: List[str]) -> Tuple[bool, List[Tuple[Record, List[str]]]]:
        """(send ``rec`` now?, summaries due now). Caller holds the notifier's lock."""
        now = self.clock()
        due = self.due(now)
        key = self.key(rec)
        if not self.burst or key is None:
            return True, due
        held = self._keys.get(key)
        if held is None:
            held = self._keys[key] = _Held(start=now)
            while len(self._keys) > self.tracked:
                _, old = self._keys.popitem(last=False)
                due.extend(self._summary(old))
        self._keys.move_to_end(key)
        if held.sent < self.burst:
            held.sent += 1
            return True, due
        held.held += 1
        held.last, held.extra_urls = rec, list(extra_urls)
        return False, due

    def due(self, now: Optional[float] = None, everything: bool = False) -> List[Tuple[Record, List[str]]]:
        """Summaries of windows that ended (all of them with ``everything``); ended windows are forgotten."""
        now = self.clock() if now is None else now
        out: List[Tuple[Record, List[str]]] = []
        for key in [k for k, h in self._keys.items() if everything or now - h.start >= self.window]:
            out.extend(self._summary(self._keys.pop(key), now))
        return out

    def _summary(self, held: _Held, now: Optional[float] = None) -> List[Tuple[Record, List[str]]]:
        if not held.held or held.last is None:
            return []
        last = held.last
        job = last.job_ids[0]
        span = (self.clock() if now is None else now) - held.start
        rec = Record(event="notify-summary", node=last.node, job_ids=[job], severity=last.severity,
                     source="notify", time=time.time(),
                     message=f"{held.held} more '{last.event}' record(s) about job {job} in {span:.0f}s were not "
                             f"posted (at most {self.burst} per job and event every {self.window:g}s: "
                             f"notify.job_burst, notify.job_window); the last: {last.message}; all are in the "
                             f"journal: autoheal events --job {job}")
        return [(rec, held.extra_urls)]


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
                 sleep: Callable[[float], None] = time.sleep, queue_max: int = QUEUE_MAX,
                 job_limit: Optional[JobRateLimit] = None):
        #: None: no per-job limit (``from_config`` sets the configured one)
        self.job_limit = job_limit
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
        limit = JobRateLimit(n.job_burst, n.job_window, n.job_tracked) if n.job_burst else None
        return cls(n.webhooks, n.timeout, n.retries, n.min_severity, n.cluster_name or "", journal,
                   job_limit=limit)

    def wants(self, rec: Record) -> bool:
        level = SEVERITIES.index(rec.severity) if rec.severity in SEVERITIES else 0
        return bool(self.urls) and level >= self.min_level

    def send(self, rec: Record, extra_urls: Optional[List[str]] = None, force: bool = False) -> None:
        """Queue ``rec`` for delivery (returns at once, whatever the endpoints do)."""
        urls = list(self.urls) + [u for u in (extra_urls or []) if _is_http(u)]
        if not urls or not (force or self.wants(rec) or extra_urls):
            return
        admitted = True
        due: List[Tuple[Record, List[str]]] = []
        if self.job_limit is not None and not force:
            with self._lock:
                admitted, due = self.job_limit.admit(rec, list(extra_urls or []))
        for summary, summary_urls in due:
            self._post(summary, list(self.urls) + [u for u in summary_urls if _is_http(u)])
        if admitted:
            self._post(rec, urls)

    def _post(self, rec: Record, urls: List[str]) -> None:
        payload = {"text": format_text(rec, self.cluster), "autoheal": json.loads(rec.to_json())}
        for url in dict.fromkeys(urls):
            self._enqueue(url, payload, rec)

    def send_summaries(self, everything: bool = True) -> None:
        """Post the summaries of records the per-job limit held back (all of them: the sender is stopping;
        else those whose window ended)."""
        if self.job_limit is None:
            return
        with self._lock:
            due = self.job_limit.due(everything=everything)
        for summary, summary_urls in due:
            self._post(summary, list(self.urls) + [u for u in summary_urls if _is_http(u)])

    def flush(self, timeout: float = 5.0, summaries: Optional[bool] = None) -> bool:
        """Wait up to ``timeout`` seconds in total for queued deliveries; True when all finished.

        ``summaries`` (default: when ``timeout`` > 0, i.e. the sender is about to stop; ``flush(0)`` only
        forgets finished deliveries): first post every summary of records the per-job limit held back."""
        if summaries if summaries is not None else timeout > 0:
            self.send_summaries()
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
