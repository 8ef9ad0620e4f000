"""The sandbox rows of a Hands ledger (``sandboxes``, ``sandbox_uses``; migrations in
``hands/store/migrations``, applied with the ledger's): all of their SQL, one backend per
dialect. :func:`rows_for` picks it from the pool."""

from __future__ import annotations

from typing import Any

from hands.sandbox.store.rows import PostgresSandboxRows, SandboxRow, SandboxRows
from infra.db import dialect

__all__ = ["PostgresSandboxRows", "SandboxRow", "SandboxRows", "rows_for"]


def rows_for(pool: Any) -> SandboxRows:
    return PostgresSandboxRows(pool) if dialect(pool) == "postgres" else SandboxRows(pool)
