"""Small helpers shared by the test modules (the tests folder is on sys.path)."""

from __future__ import annotations

import time


def wait_for(pred, timeout: float = 10.0, what: str = "condition", step: float = 0.1):
    """Poll ``pred`` until it returns something truthy (returned) or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")
