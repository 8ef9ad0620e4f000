"""Loading tools for a route, resolving commands to them, and the CLI's error contract."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hands.store import MIGRATIONS as LEDGER_MIGRATIONS
from hands.tools.registry import ToolLoadError, load_tools
from infra.db import create_pool, migrate
from protocol import RoutingError, new_id
from tests import hands_test_tools as lab
from tests.support import REPO, TendonEnv

TOOLS_FILE = Path(lab.__file__)


def test_a_module_name_loads_only_the_tools_of_the_route() -> None:
    registry = load_tools("tests.hands_test_tools", "lab")
    assert registry.names == [
        "big",
        "boom",
        "charge",
        "charge_noquery",
        "echo",
        "gated",
        "gated_charge",
        "gated_effect",
        "nul_result",
        "progress",
        "slow",
        "wait_cancel",
    ]
    assert registry.get("elsewhere") is None


def test_a_file_path_loads_the_same_bindings() -> None:
    by_path = load_tools(str(TOOLS_FILE), "lab")
    by_name = load_tools("tests.hands_test_tools", "lab")
    assert [b.digest for b in by_path.bindings] == [b.digest for b in by_name.bindings]


def test_a_module_that_cannot_be_imported_is_a_clear_error() -> None:
    with pytest.raises(ToolLoadError, match="tools module no.such.tools cannot be imported"):
        load_tools("no.such.tools", "lab")
    with pytest.raises(ToolLoadError, match="does not exist"):
        load_tools("missing/tools.py", "lab")


def test_a_module_that_fails_while_importing_says_why(tmp_path: Path) -> None:
    broken = tmp_path / "broken_tools.py"
    broken.write_text("raise RuntimeError('no config')\n")
    with pytest.raises(ToolLoadError, match="failed to import: RuntimeError: no config"):
        load_tools(str(broken), "lab")


def test_a_module_without_tools_for_the_route_names_the_routes_it_has() -> None:
    with pytest.raises(ToolLoadError, match=r"serves nothing on route email: .*lab, other"):
        load_tools("tests.hands_test_tools", "email")


def test_resolving_names_what_the_route_serves_instead() -> None:
    registry = load_tools("tests.hands_test_tools", "lab")
    assert registry.resolve("echo", lab.echo.binding.digest) is registry.get("echo")
    with pytest.raises(RoutingError, match=r"tool nope is not served by route lab \(served: big"):
        registry.resolve("nope", lab.echo.binding.digest)
    with pytest.raises(RoutingError, match=f"binding digest {'0' * 8}… for tool echo"):
        registry.resolve("echo", "0" * 64)


# ---- the CLI ----------------------------------------------------------------------------


def _hands(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hands", *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_serving_a_module_that_cannot_be_imported_exits_2_with_one_line() -> None:
    done = _hands("serve", "--route", "lab", "--tools", "no.such.tools")
    assert done.returncode == 2
    assert done.stderr.startswith("hands: tools module no.such.tools cannot be imported")
    assert done.stderr.count("\n") == 1


async def test_reconciling_an_execution_that_is_not_in_the_ledger_exits_2(
    tendon: TendonEnv,
) -> None:
    # Given no ledger yet, Then the CLI says where it looked
    missing = _hands("show", "x", env=tendon.env)
    assert missing.returncode == 2 and "no Hands ledger in schema th_" in missing.stderr

    # Given a migrated ledger, When an unknown id is reconciled, Then it says so
    schema = tendon.settings().hands_schema
    pool = await create_pool(tendon.database_url, schema, max_size=1)
    try:
        await migrate(pool, schema, LEDGER_MIGRATIONS)
    finally:
        await pool.close()
    execution_id = new_id()
    args = ("reconcile", execution_id, "--result", "{}", "--evidence", "seen it")
    done = _hands(*args, env=tendon.env)
    assert done.returncode == 2
    assert done.stderr == f"hands: execution {execution_id} is not in the ledger\n"

    # And a result that is not strict JSON is refused before anything is touched
    bad = _hands("reconcile", execution_id, "--result", '{"a":1,"a":2}', "--evidence", "x")
    assert bad.returncode == 2 and "duplicate JSON key 'a'" in bad.stderr


def test_a_pool_serves_two_versions_of_a_tool_each_by_its_own_digest() -> None:
    from tests import greet_tools_v1, greet_tools_v2

    registry = load_tools("tests.greet_tools_v2", "greet")
    v1, v2 = greet_tools_v1.greet_v1, greet_tools_v2.greet_v2
    assert [b.version for b in registry.bindings] == ["1", "2"] and len(registry) == 2
    assert registry.resolve("greet", v1.binding.digest) is v1
    assert registry.resolve("greet", v2.binding.digest) is v2
    assert registry.get("greet") is v2  # the newest
    with pytest.raises(RoutingError, match=r"\(version 1\), .*\(version 2\)"):
        registry.resolve("greet", "0" * 64)


def test_two_tools_of_one_name_and_version_are_refused() -> None:
    from hands.tools.registry import ToolRegistry
    from tests import greet_tools_v1

    twin = greet_tools_v1.greet_v1.__class__(**{**greet_tools_v1.greet_v1.__dict__})
    with pytest.raises(ToolLoadError, match="two tools named greet in version 1"):
        ToolRegistry("greet", [greet_tools_v1.greet_v1, twin])
