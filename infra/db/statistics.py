"""Statistics of young tables: ANALYZE what grew since it was last analyzed, so that prepared
statements are planned for the tables as they are."""

from __future__ import annotations

from typing import Any

from infra.db.postgres import dialect
from infra.process.logging import get_logger
from infra.process.loops import BackgroundLoop

log = get_logger(__name__)


async def analyze_grown(pool: Any, *, floor: int = 100) -> list[str]:
    """ANALYZE the tables of the pool's schema that hold at least ``floor`` rows and at least
    twice as many as their statistics say (so a growing table is analyzed at each doubling).
    Returns the tables analyzed.

    Why: every statement is prepared once per connection, and PostgreSQL may settle on one
    generic plan for a prepared statement after its fifth run. A plan settled while a table
    was nearly empty stays until the table is analyzed again, which autovacuum does only
    after its next nap (a minute by default). A fresh deployment's first burst grows tables
    from nothing to thousands of rows in seconds and meanwhile runs on plans made for ten:
    measured, the Hands relay's scan for due events took 12.5 s per call at 30,000 events
    (20 ms with a fresh plan) and the relay stood still for 40 s. Analyzing a young table
    takes milliseconds and makes PostgreSQL plan its statements again. Once tables are big,
    autovacuum's own threshold (10 % of the rows changed) comes long before a doubling. The
    floor is low because small tables matter too: a plan made for a table of one page reads
    the table whole, which at a few hundred rows cost a lone turn's statements 0.1 ms and more.
    """
    if dialect(pool) != "postgres":
        return []  # SQLite plans each statement with what it knows at the time
    async with pool.acquire() as conn:
        tables = [
            r["relname"]
            for r in await conn.fetch(
                """SELECT s.relname FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
                    WHERE s.schemaname = current_schema()
                      AND s.n_live_tup >= greatest($1::float8, 2 * c.reltuples)
                      AND pg_has_role(c.relowner, 'USAGE')  -- only an owner may analyze""",
                floor,
            )
        ]
        for table in tables:
            await conn.execute(f'ANALYZE "{table}"')
    return tables


async def keep_statistics(pool: Any, interval: float = 5.0, *, floor: int = 100) -> None:
    """Run :func:`analyze_grown` every ``interval`` seconds, forever (the first after one);
    failures are logged."""

    async def analyze() -> None:
        analyzed = await analyze_grown(pool, floor=floor)
        if analyzed:
            log.info("tables_analyzed", tables=analyzed)

    # Only a help to the planner: a failed round waits for the next like any other.
    await BackgroundLoop("statistics", analyze, period=interval, first=interval).run()
