"""Versioned SQL migrations per dialect, applied at start, idempotently and safely from several
processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infra.db.postgres import dialect, lock_class


def migration_files(directory: Path, kind: str) -> list[tuple[int, Path]]:
    """The migrations of one dialect: ``<directory>/<kind>/NNNN_name.sql``, by version."""
    found = []
    for path in sorted((directory / kind).glob("*.sql")):
        version, _, _ = path.name.partition("_")
        if not version.isdigit():
            raise ValueError(f"migration {path} does not start with its version number")
        found.append((int(version), path))
    versions = [v for v, _ in found]
    if len(set(versions)) != len(versions):
        raise ValueError(f"two migrations of {directory / kind} share a version")
    return found


async def migrate(pool: Any, schema: str, directory: Path) -> int:
    """Apply the versioned SQL migrations of the pool's dialect in order, idempotently and
    safely from several processes; returns how many were applied now.

    Each migration runs in its own transaction together with its bookkeeping row; on
    PostgreSQL a transaction-level advisory lock serialises concurrent starts (SQLite's write
    lock does the same there).
    """
    kind = dialect(pool)
    steps = migration_files(directory, kind)
    postgres = kind == "postgres"
    table = f'"{schema}".schema_migrations' if postgres else "schema_migrations"
    applied = 0
    async with pool.acquire() as conn:
        async with conn.transaction():
            if postgres:
                await conn.execute("SELECT pg_advisory_xact_lock($1, 0)", lock_class(schema))
                await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
            await conn.execute(
                f"CREATE TABLE IF NOT EXISTS {table} ("
                " version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
                if postgres
                else f"CREATE TABLE IF NOT EXISTS {table} (version int PRIMARY KEY)"
            )
        for version, path in steps:
            async with conn.transaction():
                if postgres:
                    await conn.execute("SELECT pg_advisory_xact_lock($1, 0)", lock_class(schema))
                if await conn.fetchval(f"SELECT 1 FROM {table} WHERE version = $1", version):
                    continue
                await conn.execute(path.read_text())
                await conn.execute(f"INSERT INTO {table} (version) VALUES ($1)", version)
                applied += 1
    return applied
