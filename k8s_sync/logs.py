"""Structured logs: one JSON object per line on stderr (time, level, logger, message, extra fields)."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Optional, TextIO

_STD = set(vars(logging.LogRecord("x", 0, "", 0, "", (), None)).keys()) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) +
                f".{int(record.msecs):03d}Z", "level": record.levelname.lower(), "logger": record.name,
                "message": record.getMessage()}
        for key, value in vars(record).items():
            if key not in _STD and not key.startswith("_"):
                data[key] = value
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str, sort_keys=True)


def setup(level: str = "info", stream: Optional[TextIO] = None) -> logging.Logger:
    """Route the ``autoheal.sync`` logger to JSON lines on stderr (idempotent)."""
    log = logging.getLogger("autoheal.sync")
    for h in list(log.handlers):
        if getattr(h, "_autoheal_json", False):
            log.removeHandler(h)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler._autoheal_json = True  # type: ignore[attr-defined]
    log.addHandler(handler)
    log.setLevel(getattr(logging, level.upper(), logging.INFO))
    log.propagate = False
    return log
