"""The one settings object: every knob is a ``TENDON_*`` environment variable.

Read once at process start (``Settings()``) and passed down; nothing reads the
environment at import time.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

_IDENT = r"^[a-z_][a-z0-9_]{0,62}$"


class Settings(BaseSettings):
    """Tendon's configuration. Defaults match docker-compose.yml on this machine's loopback."""

    model_config = SettingsConfigDict(env_prefix="TENDON_", extra="ignore")

    database_url: str = "postgresql://tendon:tendon@127.0.0.1:5432/tendon"
    brain_schema: str = Field(default="tendon_brain", pattern=_IDENT)
    hands_database_url: str | None = Field(
        default=None, description="the Hands ledger's database; defaults to database_url"
    )
    hands_schema: str = Field(default="tendon_hands", pattern=_IDENT)
    amqp_url: str = "amqp://guest:guest@127.0.0.1:5672/"
    queue_prefix: str = Field(default="tendon", pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    delivery_limit: int = Field(default=5, ge=1)

    s3_endpoint_url: str | None = None
    s3_bucket: str = "tendon"
    s3_region: str = "us-east-1"
    offload_threshold: int = Field(default=1024 * 1024, ge=1)

    namespace: str = "default"
    concurrency: int = Field(default=4, ge=1)
    lease_seconds: float = Field(
        default=30.0,
        gt=0,
        description="a Brain or Hands process that has not renewed its lease for this long (frozen, "
        "paused, cut off) is presumed dead and its work taken over; a live one renews every third",
    )
    reconnect_grace: float = Field(
        default=2.0,
        gt=0,
        description="how long a process whose database session ended may take to connect again "
        "before the others presume it dead (a killed process is taken over after this)",
    )
    scan_interval: float = Field(default=0.5, gt=0)
    gap_timeout: float = Field(default=1.0, gt=0)
    stall_seconds: float = Field(
        default=10.0, gt=0, description="after this long without progress, re-send or ask for a replay"
    )
    repair_attempts: int = Field(
        default=8,
        ge=1,
        description="re-sent commands or replay requests that may go unanswered (each waits twice as "
        "long as the one before) before the turn fails with an error naming the silent route",
    )
    binding_wait_seconds: float = Field(
        default=60.0, gt=0, description="how long a new turn waits for its tools to be announced"
    )

    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: str = "INFO"
    kill_at: str = Field(default="", description="kill points to arm, e.g. hands.after_tool_body@call-4")
    ready_file: str | None = None

    @property
    def ledger_database_url(self) -> str:
        return self.hands_database_url or self.database_url
