"""The two forms of a statement's rows (infra/db/rows.py): a lone row as values, more as
arrays, each with the parameters it takes. Their plans are checked where they are used
(tests/test_hands_ledger.py, tests/test_brain_store.py); both forms run in the store suites."""

from __future__ import annotations

import pytest

from infra.db.rows import row_args, rows_from

COLUMNS = [("id", "text"), ("n", "int"), ("facts", "jsonb")]


def test_a_lone_row_is_a_row_of_values_and_takes_each_columns_value() -> None:
    assert (
        rows_from("m", COLUMNS, 3, one=True) == "(VALUES ($3::text, $4::int, $5::jsonb)) AS m(id, n, facts)"
    )
    assert row_args([["a"], [1], [None]], one=True) == ["a", 1, None]


def test_more_rows_are_arrays_unnested_and_take_each_columns_list() -> None:
    assert (
        rows_from("m", COLUMNS, 1, one=False)
        == "unnest($1::text[], $2::int[], $3::jsonb[]) AS m(id, n, facts)"
    )
    assert row_args([["a", "b"], [1, 2], [None, None]], one=False) == [["a", "b"], [1, 2], [None, None]]


def test_a_lone_row_form_refuses_columns_of_several_values() -> None:
    with pytest.raises(AssertionError):
        row_args([["a", "b"], [1, 2]], one=True)
