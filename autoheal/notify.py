"""Posting journal records to webhooks (Slack-compatible ``{"text": ...}`` plus the record).

Uses urllib (stdlib) rather than requests: hooks import this on compute nodes, where start-up time is
the budget. Delivery runs in a daemon thread with bounded retries and timeouts; ``flush`` waits at most
the time it is given, so a slow or dead endpoint never blocks the caller for long. Failures are
journalled as ``notify-failed``.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from typing import Callable, List, Optional

from autoheal.journal import SEVERITIES, Journal, Record
from autoheal.reasons import sanitize


def format_text(rec: Record, cluster: str = "") -> str:
    """One human line: ``[cluster] gpu1: drain (xid 79 gpu 3...) -> drained``."""
    where = f"[{cluster}] " if cluster else ""
    parts = [f"{where}{rec.node or rec.host}: {rec.event}"]
    if rec.check:
        parts.append(f"check {rec.check}")
    if rec.message:
        parts.append(rec.message)
    if rec.job_ids:
        parts.append("jobs " + ",".join(rec.job_ids))
    if rec.outcome:
        parts.append(f"-> {rec.outcome}")
    return sanitize(" | ".join(parts), 1500)


def post_json(url: str, payload: dict, timeout: float) -> int:
    """POST JSON; returns the HTTP status (raises OSError family on transport errors)."""
    data = json.dumps(payload, default=str).encode()
    req = urllib.request.Request(url, data=data, method="POST",
                                 headers={"Content-Type": "application/json", "User-Agent": "autoheal"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (http(s) only, checked)
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


class Notifier:
    """Sends records to every configured webhook in the background."""

    def __init__(self, urls: List[str], timeout: float = 3.0, retries: int = 2, min_severity: str = "action",
                 cluster: str = "", journal: Optional[Journal] = None,
                 sleep: Callable[[float], None] = time.sleep):
        self.urls = [u for u in urls if u.startswith(("http://", "https://"))]
        self.timeout = timeout
        self.retries = retries
        self.min_level = SEVERITIES.index(min_severity) if min_severity in SEVERITIES else 1
        self.cluster = cluster
        self.journal = journal
        self._sleep = sleep
        self._threads: List[threading.Thread] = []
        self.results: List[dict] = []

    @classmethod
    def from_config(cls, config, journal: Optional[Journal] = None) -> "Notifier":
        n = config.notify
        return cls(n.webhooks, n.timeout, n.retries, n.min_severity, n.cluster_name or "", journal)

    def wants(self, rec: Record) -> bool:
        level = SEVERITIES.index(rec.severity) if rec.severity in SEVERITIES else 0
        return bool(self.urls) and level >= self.min_level

    def send(self, rec: Record, extra_urls: Optional[List[str]] = None, force: bool = False) -> None:
        """Queue ``rec`` for delivery (returns at once)."""
        urls = list(self.urls) + [u for u in (extra_urls or []) if u.startswith(("http://", "https://"))]
        if not urls or not (force or self.wants(rec) or extra_urls):
            return
        payload = {"text": format_text(rec, self.cluster), "autoheal": json.loads(rec.to_json())}
        for url in urls:
            t = threading.Thread(target=self._deliver, args=(url, payload, rec), daemon=True)
            t.start()
            self._threads.append(t)

    def _deliver(self, url: str, payload: dict, rec: Record) -> None:
        error = ""
        for attempt in range(self.retries + 1):
            try:
                status = post_json(url, payload, self.timeout)
                if 200 <= status < 300:
                    self.results.append({"url": url, "ok": True, "attempts": attempt + 1})
                    return
                error = f"HTTP {status}"
                if 400 <= status < 500 and status != 429:
                    break  # the endpoint refuses this payload; retrying will not help
            except (OSError, ValueError) as exc:
                error = sanitize(str(getattr(exc, "reason", exc)), 200)
            if attempt < self.retries:
                self._sleep(min(4.0, 0.5 * (2 ** attempt)))
        self.results.append({"url": url, "ok": False, "attempts": attempt + 1, "error": error})
        if self.journal is not None:
            self.journal.record("notify-failed", node=rec.node, job_ids=rec.job_ids, severity="error",
                                message=f"webhook {_redact(url)} failed after {attempt + 1} attempts: {error}",
                                source="notify")

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait up to ``timeout`` seconds in total for queued deliveries; True when all finished."""
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self._threads = [t for t in self._threads if t.is_alive()]
        return not self._threads


def _redact(url: str) -> str:
    """Webhook URLs carry secrets in their path (Slack): keep scheme and host only."""
    try:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://{rest.split('/', 1)[0]}/..."
    except ValueError:
        return "<webhook>"
