"""A token bucket: writes beyond the rate are deferred to a later pass, never queued without bound."""

from __future__ import annotations

import threading
import time
from typing import Callable


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` saved up."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic):
        self.rate = float(rate)
        self.burst = max(1, int(burst))
        self.clock = clock
        self.tokens = float(self.burst)
        self.stamp = clock()
        self.lock = threading.Lock()

    def try_take(self, n: float = 1.0) -> bool:
        """Take ``n`` tokens if there are that many; never blocks."""
        with self.lock:
            now = self.clock()
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
            if self.tokens >= n:
                self.tokens -= n
                return True
            return False
