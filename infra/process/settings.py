"""The one settings object: every knob is a ``TENDON_*`` environment variable.

Read once at process start (``Settings()``) and passed down; nothing reads the environment at
import time. ``python -m infra.process.settings`` prints every setting as the table README.md carries
(a test fails when the two drift apart).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from typing import Literal

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from protocol import SchemaError

_IDENT = r"^[a-z_][a-z0-9_]{0,62}$"


class Settings(BaseSettings):
    """Tendon's configuration. Defaults match docker-compose.yml on this machine's loopback."""

    model_config = SettingsConfigDict(env_prefix="TENDON_", extra="ignore")

    database_url: str = Field(
        default="postgresql://tendon:tendon@127.0.0.1:5432/tendon",
        description="the Brain's PostgreSQL (and the Hands ledger's, unless `TENDON_HANDS_DATABASE_URL`)",
    )
    brain_schema: str = Field(default="tendon_brain", pattern=_IDENT, description="the Brain's schema")
    hands_database_url: str | None = Field(
        default=None, description="the Hands ledger's database; defaults to `TENDON_DATABASE_URL`"
    )
    hands_schema: str = Field(default="tendon_hands", pattern=_IDENT, description="the Hands ledger's schema")
    db_pool_size: int = Field(
        default=16,
        ge=2,
        description="database connections a Brain or Hands process opens at most (its runs take one "
        "per transaction, not per turn or execution); size PostgreSQL's `max_connections` for the "
        "sum over all processes",
    )
    amqp_url: str = Field(default="amqp://guest:guest@127.0.0.1:5672/", description="RabbitMQ")
    queue_prefix: str = Field(
        default="tendon",
        pattern=r"^[a-z0-9][a-z0-9_.-]*$",
        description="the first part of every queue name: a deployment of its own on a shared broker",
    )
    delivery_limit: int = Field(
        default=5, ge=1, description="deliveries of a message before the broker parks it (`brain parked`)"
    )

    s3_endpoint_url: str | None = Field(
        default=None,
        description="an S3 API (MinIO, moto, AWS) for payloads over the offload threshold; "
        "credentials as boto3 reads them (`AWS_ACCESS_KEY_ID`...)",
    )
    s3_bucket: str = Field(default="tendon", description="the bucket (created if missing)")
    s3_region: str = Field(default="us-east-1", description="the bucket's region")
    offload_threshold: int = Field(
        default=1024 * 1024, ge=1, description="bytes: a bigger message body travels through S3 by reference"
    )

    namespace: str = Field(
        default="default",
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="the tenant `brain submit` submits into (letters, digits, `_`, `.` or `-`)",
    )
    # 128: a backlog drains in bigger batches than at 32 (10,000 turns: about 1,040 against 880
    # turns/s, docs/benchmarks twenty-first round); a tool body that waits on I/O costs a task.
    concurrency: int = Field(
        default=128,
        ge=1,
        description="turns a Brain drives, or executions a Hands worker runs, at once (more in flight "
        "lets their commits and messages share batches; lower it for tools that each need much "
        "memory or CPU, or an API that allows few calls at once)",
    )
    lease_seconds: float = Field(
        default=30.0,
        gt=0,
        description="a Brain or Hands process that has not renewed its lease for this long (frozen, "
        "paused, cut off) is presumed dead and its work taken over; a live one renews every third",
    )
    reconnect_grace: float = Field(
        default=1.0,
        gt=0,
        description="how long a process whose database session ended, but which the broker still "
        "sees, may take to connect again before the others presume it dead",
    )
    scan_interval: float = Field(
        default=0.5, gt=0, description="seconds between the periodic scans that repair lost wake-ups"
    )
    gap_timeout: float = Field(
        default=1.0,
        gt=0,
        description="how long events held behind a missing one wait before a replay request",
    )
    event_linger: float = Field(
        default=0.02,
        ge=0,
        description="how long a Hands worker may hold events that end nothing (accepted, started, output "
        "pages) for an outcome to take them along (fewer messages and applies); 0: at once",
    )
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
    agent_modules: str = Field(
        default="",
        description="the modules (comma-separated, each with its submodules) a Brain may import the agents "
        "of Pydantic AI or the OpenAI Agents SDK from, as an agent definition names them (`myapp.agents`); "
        "empty: any module the Brain can import",
    )
    service_wait_seconds: float = Field(
        default=math.inf,
        ge=0,
        description="how long `brain serve` and `hands serve` wait at start for PostgreSQL, RabbitMQ "
        "and S3 to answer (saying what they wait for every few seconds) before exiting; `inf`: forever",
    )
    mcp_park_after: float = Field(
        default=5.0,
        ge=0,
        description="seconds a Hands worker follows a working MCP task (polling `tasks/get`) before it "
        "parks it in the ledger and frees its slot (a task that waits for a person is parked at once); "
        "`inf`: never",
    )
    mcp_check_seconds: float = Field(
        default=60.0,
        gt=0,
        description="the longest a parked MCP task goes unlooked at (an answer or a cancel takes it up "
        "at once; a working one is looked at after 1 s, then twice as long each time up to this)",
    )
    drain_seconds: float = Field(
        default=10.0,
        ge=0,
        description="on SIGTERM, how long a Hands worker lets running tools finish (the rest are handed "
        "back) and a Brain lets its runs reach their next commit, before they exit",
    )
    retain_journal_days: float = Field(
        default=30.0,
        ge=0,
        description="the journal (conversation, history, events) of a session closed this long ago is "
        "pruned; open sessions keep theirs; 0: keep everything",
    )
    retain_ledger_days: float = Field(
        default=7.0,
        ge=0,
        description="a Hands pool prunes executions finished (never UNKNOWN ones) this long ago, with "
        "their output; a command older than nine tenths of this is not run blindly; 0: keep everything",
    )
    retain_parked_days: float = Field(
        default=30.0, ge=0, description="parked messages recorded this long ago are pruned; 0: keep them"
    )

    sandbox: str = Field(
        default="",
        description="what `hands serve` makes sandboxes with (`--sandbox`): `local:DIRECTORY` (no "
        "isolation) or `docker`; empty: no sandbox tools",
    )
    sandbox_image: str = Field(default="python:3.11-slim", description="the image of a Docker sandbox")
    sandbox_network: str = Field(
        default="none", description="the Docker network a sandbox container joins (`none`: no network)"
    )
    sandbox_keepalive_seconds: float = Field(
        default=300.0, gt=0, description="how often a ready sandbox is checked and started again if stopped"
    )

    http: str = Field(
        default="127.0.0.1:8080",
        description="where `brain serve` serves its HTTP API (HOST:PORT), or `off`; a default address "
        "in use is skipped with a warning",
    )
    api_tokens: str = Field(
        default="",
        description="who may use the HTTP API: `NAMESPACE:SHA256,...` (`brain token NAMESPACE` makes "
        "one); none: every request acts in `TENDON_NAMESPACE` (a development server on loopback)",
    )
    operator_tokens: str = Field(
        default="",
        description="SHA256 hashes (comma-separated) of the tokens of operators (reconcile, parked, "
        "`/metrics`)",
    )
    mcp_agents: str = Field(
        default="",
        description="agent definition files (comma-separated) the HTTP API also serves as MCP tools at "
        "`/mcp` (the `mcp` extra); none: no `/mcp`",
    )
    max_request_bytes: int = Field(
        default=10 * 1024 * 1024,
        ge=1024,
        description="the largest request body the HTTP API takes, in bytes: a bigger one is refused "
        "(413) and never kept in memory",
    )
    webhook_private: bool = Field(
        default=False,
        description="whether a LangGraph run's webhook may name a loopback, private or link-local address "
        "(or `localhost`) by itself: off, such a URL is refused",
    )
    url: str = Field(
        default="",
        description="the HTTP API the `brain` verbs (submit, show, wait, controls...) use instead of the "
        "database, e.g. `http://127.0.0.1:8080` (`--url`)",
    )
    token: str = Field(default="", description="the bearer token the `brain` verbs send to `TENDON_URL`")
    otlp_endpoint: str = Field(
        default="",
        description="where Brain and Hands send OpenTelemetry traces (OTLP over HTTP, e.g. "
        "`http://127.0.0.1:4318`); empty: no traces",
    )
    log_format: Literal["auto", "json", "console"] = Field(
        default="auto", description="`console` on a terminal, `json` otherwise (with `auto`)"
    )
    log_level: str = Field(default="INFO", description="`DEBUG`, `INFO`, `WARNING` or `ERROR`")
    kill_at: str = Field(default="", description="kill points to arm, e.g. `hands.after_tool_body@call-4`")
    ready_file: str | None = Field(
        default=None,
        description="a file that says a server is ready (its worker id in it) while it serves with its "
        "database and broker: removed at start, while either is lost, and at exit",
    )

    @property
    def ledger_database_url(self) -> str:
        return self.hands_database_url or self.database_url


def http_address(value: str) -> tuple[str, int] | None:
    """``HOST:PORT`` (or ``off``: None) of ``TENDON_HTTP`` / ``--http``."""
    if value.strip().lower() in ("off", "", "none"):
        return None
    host, _, port = value.strip().rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise SchemaError(f"the HTTP address takes HOST:PORT (or off), not {value!r}")
    return host.strip("[]"), int(port)


# TENDON_* variables that are no setting but are read by something else: never reported as unknown.
OTHER_VARIABLES = {
    "TENDON_MAILBOX_URL": "the example tools' mail service (examples/email_tools.py)",
    "TENDON_IMAGE": "the image docker-compose.yml runs",
    "TENDON_HTTP_PORT": "the host port docker-compose.yml publishes the API on",
    "TENDON_COMPOSE_FIGURES": "where tests/test_compose_live.py writes its figures",
}
OTHER_PREFIXES = ("TENDON_TEST_",)  # the test suite's own (tests/conftest.py)


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """A line for each ``TENDON_*`` variable in ``environ`` that is no setting (nor one of
    ``OTHER_VARIABLES``): a typo would otherwise be silently ignored. Names the setting it was
    probably meant to be, when one is close."""
    known = {f"TENDON_{name.upper()}" for name in Settings.model_fields}
    lines = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith("TENDON_") or upper in known or upper in OTHER_VARIABLES:
            continue
        if upper.startswith(OTHER_PREFIXES):
            continue
        close = difflib.get_close_matches(upper, sorted(known), n=1, cutoff=0.8)
        meant = f" (did you mean {close[0]}?)" if close else ""
        lines.append(f"{name} is not a Tendon setting{meant}: it is ignored")
    return lines


def bad_setting(exc: ValueError) -> str:
    """One line for a setting that does not validate: which variable, and what is wrong."""
    if not isinstance(exc, ValidationError):  # pydantic-settings' own, e.g. a value it cannot parse
        return "bad TENDON_* setting: " + " ".join(str(exc).split())
    first = exc.errors()[0]
    where = str(first["loc"][0]).upper() if first["loc"] else "*"
    return f"bad setting TENDON_{where}: {first['msg']}"


def settings_table() -> str:
    """Every setting as a Markdown table: variable, default, what it is."""
    rows = ["| variable | default | what it is |", "| --- | --- | --- |"]
    for name, field in Settings.model_fields.items():
        default = "" if field.default in (None, "") else f"`{field.default}`"
        rows.append(f"| `TENDON_{name.upper()}` | {default} | {field.description or ''} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(settings_table())
