"""The retry policy of turns whose model call (or run) met a passing fault: a small frozen value
that an agent definition may set, and pure math.

The budget is the turn's: ``turns.retries`` counts every retry of every model call of the turn,
is persisted with the retry itself, and nothing resets it (not a restart, a takeover, a pause or
a control). Once it is spent the turn fails saying why, and no new model call is made.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class RetryPolicy(BaseModel):
    """Exponential backoff, persisted as the turn's ``wake_at`` so no process has to wait."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_retries: int = Field(default=3, ge=0, description="retries a turn may make in all")
    initial: float = Field(default=1.0, gt=0, description="seconds before the first retry")
    multiplier: float = Field(default=2.0, ge=1)
    maximum: float = Field(default=30.0, gt=0, description="seconds between retries at most")

    def delay(self, retries: int, asked: float | None = None) -> float:
        """Seconds to wait before retry number ``retries`` (1-based); at least what the failed
        call asked for (a 429's Retry-After), even past ``maximum``."""
        backoff = min(self.maximum, self.initial * self.multiplier ** max(0, retries - 1))
        return max(backoff, asked or 0.0)

    def exhausted(self, retries: int) -> bool:
        """Whether retry number ``retries`` is one too many."""
        return retries > self.max_retries
