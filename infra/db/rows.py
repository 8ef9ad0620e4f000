"""How a PostgreSQL statement that writes many rows at once reads them from its parameters.

A batch passes one array per column and unnests them. Tendon's statements run with generic
plans (``infra.db.create_pool``), in which PostgreSQL cannot see an array's length and takes an
unnest for ten rows: joined to a table of a few hundred rows by its key, ten index probes cost
the planner more than reading the whole table, so it reads it all, on every commit (0.1 ms and
more per table on the latency scenario's tables, growing with them). Yet most commits of a lone
turn carry one row. So a statement is made in two forms from one text: for one row, its values
as a ``VALUES`` row, which the planner knows is one and finds by its key; for more, the arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Columns = Sequence[tuple[str, str]]  # (name, PostgreSQL type) of each column


def rows_from(alias: str, columns: Columns, first: int, *, one: bool) -> str:
    """A FROM item named ``alias`` with ``columns``, read from parameters ``$first``.. (one per
    column): a single row's values when ``one``, else arrays unnested."""
    names = ", ".join(name for name, _ in columns)
    params = [f"${i}::{kind}" for i, (_, kind) in enumerate(columns, start=first)]
    if one:
        return f"(VALUES ({', '.join(params)})) AS {alias}({names})"
    return f"unnest({', '.join(p + '[]' for p in params)}) AS {alias}({names})"


def row_args(columns: Sequence[list[Any]], *, one: bool) -> list[Any]:
    """The parameters of :func:`rows_from` for the column lists ``columns``: each column's only
    value when ``one``, else the lists as arrays."""
    if one:
        assert all(len(col) == 1 for col in columns), "a single row's columns hold one value each"
        return [col[0] for col in columns]
    return list(columns)
