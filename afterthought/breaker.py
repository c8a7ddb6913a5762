"""The circuit breaker of the turn path's Redis writes and backend reads: after a run of
failures stop calling for a while, then let one call probe."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class CircuitBreaker:
    """Closed until ``failures`` calls in a row fail; then open for ``seconds`` (callers
    skip the call); then half-open: one caller per window probes, and its outcome closes
    or reopens it (a probe that never reports just lets the next window probe). Thread-safe."""

    def __init__(
        self, *, failures: int, seconds: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._threshold = failures
        self._seconds = seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._failures = 0
        self._open_until = 0.0

    @property
    def failures(self) -> int:
        return self._failures

    def allow(self) -> bool:
        """May the caller try now? While half-open only the first caller may."""
        with self._lock:
            if self._failures < self._threshold:
                return True
            now = self._clock()
            if now < self._open_until:
                return False
            self._open_until = now + self._seconds
            return True

    def retry_in(self) -> float:
        """Seconds until a probe is allowed (0 when closed or half-open)."""
        with self._lock:
            if self._failures < self._threshold:
                return 0.0
            return max(0.0, self._open_until - self._clock())

    def succeeded(self) -> None:
        with self._lock:
            self._failures = 0

    def failed(self) -> None:
        with self._lock:
            self._failures += 1
            if self._failures >= self._threshold:
                self._open_until = self._clock() + self._seconds
