"""Retry policy for turns whose run hit a passing fault: a small value object, pure math."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff, persisted as the turn's ``wake_at`` so no process has to wait."""

    initial: float = 0.5
    multiplier: float = 2.0
    maximum: float = 30.0
    max_retries: int = 20

    def delay(self, retries: int) -> float:
        """Seconds to wait before retry number ``retries`` (1-based)."""
        return min(self.maximum, self.initial * self.multiplier ** max(0, retries - 1))

    def exhausted(self, retries: int) -> bool:
        return retries > self.max_retries
