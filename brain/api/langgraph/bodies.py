"""The LangGraph routes' bodies, checked before anything is read or written: a field of the wrong
type is a 422 naming it. Fields LangGraph's clients send that Tendon has no use for
(``durability``, ``langsmith_tracer``...) are let through; those Tendon refuses are refused by
name where they are read (``common.refuse``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Json = dict[str, Any]
MAX_PAGE = 1000


class Loose(BaseModel):
    model_config = ConfigDict(extra="allow")


class AssistantBody(Loose):
    graph_id: str | None = Field(default=None, min_length=1, max_length=200)
    assistant_id: str | None = None
    if_exists: Literal["raise", "do_nothing"] | None = None
    name: str | None = None
    description: str | None = None
    config: Json | None = None
    context: Json | None = None
    metadata: Json | None = None


class Page(Loose):
    limit: int = Field(default=10, ge=1, le=MAX_PAGE)
    offset: int = Field(default=0, ge=0)
    metadata: Json | None = None
    sort_by: str | None = None
    sort_order: Literal["asc", "desc"] | None = None


class AssistantSearch(Page):
    graph_id: str | None = None
    name: str | None = None


class Latest(Loose):
    version: int = Field(ge=1)


class ThreadBody(Loose):
    thread_id: str | None = Field(default=None, min_length=1)
    metadata: Json | None = None
    if_exists: Literal["raise", "do_nothing"] | None = None


class ThreadSearch(Page):
    ids: list[str] | None = None
    status: Literal["idle", "busy", "interrupted", "error"] | None = None


class Checkpoint(Loose):
    checkpoint_id: str | None = None


class HistoryBody(Loose):
    limit: int = Field(default=10, ge=1, le=MAX_PAGE)
    before: Checkpoint | None = None
    metadata: Json | None = None


class RunBody(Loose):
    assistant_id: str | None = Field(default=None, min_length=1)
    input: Json | None = None
    command: Json | None = None
    stream_mode: str | list[str] | None = None
    metadata: Json | None = None
    config: Json | None = None
    context: Json | None = None
    multitask_strategy: Literal["reject", "enqueue", "interrupt", "rollback"] | None = None
    if_not_exists: Literal["create", "reject"] | None = None
    on_disconnect: Literal["cancel", "continue"] | None = None
    on_completion: Literal["delete", "keep"] | None = None
    after_seconds: float | None = Field(default=None, ge=0, le=366 * 86400)


class CronBody(RunBody):
    schedule: str | None = Field(default=None, min_length=1, max_length=200)
    timezone: str | None = None
    enabled: bool | None = None


class CronSearch(Page):
    assistant_id: str | None = None
    thread_id: str | None = None
    enabled: bool | None = None


class CancelMany(Loose):
    thread_id: str | None = None
    run_ids: list[str] | None = None
    status: str | None = None
