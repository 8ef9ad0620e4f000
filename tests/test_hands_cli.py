"""The ``hands`` CLI when a service is unreachable or refuses: one clear line, exit code 2,
no traceback. Real processes; the database URLs point at a closed loopback port or name a
role PostgreSQL does not have."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.support import run_cli


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _one_clear_line(code: int, err: str) -> str:
    assert code == 2, err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(
    "verb",
    [
        ["show", "some-execution"],
        ["reconcile", "some-execution", "--failed", "no", "--evidence", "checked"],
        ["serve", "--route", "lab", "--tools", "tests.hands_test_tools"],
    ],
    ids=["show", "reconcile", "serve"],
)
async def test_an_unreachable_ledger_database_is_one_clear_line_and_exit_code_2(verb: list[str]) -> None:
    # Given a ledger database URL pointing at a closed loopback port (and `serve` told not to
    # wait for it: tests/test_startup.py has the wait)
    port = _closed_port()
    env = {
        "TENDON_HANDS_DATABASE_URL": f"postgresql://tendon@127.0.0.1:{port}/tendon",
        "TENDON_LOG_FORMAT": "json",
        "TENDON_SERVICE_WAIT_SECONDS": "0",
    }

    # When a hands verb needs the ledger
    code, _, err = await run_cli(["-m", "hands", *verb], env)

    # Then it says so in one line, naming the database and its address, and exits 2
    assert _one_clear_line(code, err).startswith(f"hands: cannot reach PostgreSQL at 127.0.0.1:{port}: ")


async def test_a_ledger_login_the_database_refuses_is_one_clear_line_and_exit_code_2(pg_url: str) -> None:
    # Given a ledger database URL naming a role the database does not have
    parts = urlsplit(pg_url)
    host = parts.netloc.rsplit("@", 1)[-1]
    url = urlunsplit(parts._replace(netloc=f"no_such_tendon_role@{host}"))

    # When `hands show` runs
    code, _, err = await run_cli(["-m", "hands", "show", "x"], {"TENDON_HANDS_DATABASE_URL": url})

    # Then it says the database refused the login, in one line, exit 2
    line = _one_clear_line(code, err)
    assert line.startswith("hands: the database refused the login:") and "no_such_tendon_role" in line
